#!/usr/bin/env bash
# libchorus.a exports only the API (the global: patterns of src/chorus.map): a program defining its own
# plan_build, log_init, stream_create and sha256_init links against it and runs (tests/static/clash.c).
# Usage: clash_test.sh LIBCHORUS_A BUILD_DIR SOURCE_DIR CC NM [SANITIZERS]
set -euo pipefail
lib=$1; build=$2; src=$3; cc=$4; nm=$5; sanitize=${6:-}
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT

# 1. Every global symbol the archive defines is a public name.
"$nm" --defined-only "$lib" | awk 'NF == 3 && $2 ~ /^[A-Z]$/ { print $3 }' | sort -u >"$tmp/globals"
echo "libchorus.a: $(wc -l <"$tmp/globals") global symbols defined"
if grep -Ev '^p?(nccl|chorus)[A-Z]' "$tmp/globals" >"$tmp/extra"; then
  echo "libchorus.a defines global symbols outside the API:"; head -n 40 "$tmp/extra"; exit 1
fi

# 2. A program with its own functions of the library's internal names links and runs.
flags=()
[ -n "$sanitize" ] && flags+=("-fsanitize=$sanitize" -fno-omit-frame-pointer)
"$cc" -std=gnu11 -O2 -g -Wall -Wextra ${flags[@]+"${flags[@]}"} -I"$build/include" "$src/tests/static/clash.c" \
  "$lib" -lpthread -lrt -lm -ldl -o "$tmp/clash"
"$tmp/clash"
