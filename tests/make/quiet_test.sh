#!/usr/bin/env bash
# The top Makefile's children print no "Entering/Leaving directory" chatter: its `all` target, copied
# into a throwaway project of two directories (so that CMake's makefiles recurse), builds and says only
# CMake's own progress lines.
set -euo pipefail
src=$1
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
cp "$src/Makefile" "$tmp/"
mkdir -p "$tmp/sub"
printf 'cmake_minimum_required(VERSION 3.16)\nproject(q C)\nadd_subdirectory(sub)\n' >"$tmp/CMakeLists.txt"
printf 'add_executable(q q.c)\n' >"$tmp/sub/CMakeLists.txt"
printf 'int main(void) { return 0; }\n' >"$tmp/sub/q.c"
out=$(cd "$tmp" && env -u MAKEFLAGS -u MAKELEVEL -u MFLAGS make all JOBS=2 2>&1) || { echo "$out"; echo "FAIL: make all"; exit 1; }
if grep -E "(Entering|Leaving) directory" <<<"$out"; then
  echo "FAIL: the Makefile's children print directory lines"; exit 1
fi
echo "quiet make: ok"
