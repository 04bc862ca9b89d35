#!/usr/bin/env bash
# make install works: headers, libraries, pkg-config and find_package(Chorus) are usable, and the programs
# built with either RUN from the installed tree with no LD_LIBRARY_PATH (the .pc file's rpath, CMake's).
set -euo pipefail
build=$1; src=$2
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
cmake --install "$build" --prefix "$tmp/prefix" >/dev/null
for f in include/nccl.h include/chorus.h lib/libchorus.a lib/pkgconfig/chorus.pc lib/cmake/Chorus/ChorusConfig.cmake; do
  [ -e "$tmp/prefix/$f" ] || { echo "missing $f"; exit 1; }
done
ls "$tmp/prefix/lib/"libchorus.so.0* >/dev/null
unset LD_LIBRARY_PATH
runs_installed() { # program: runs as one rank, and loads the installed libchorus
  RANK=0 WORLD_SIZE=1 "$1" || { echo "FAIL: $1 does not run"; exit 1; }
  loaded=$(ldd "$1" | awk '/libchorus.so.0 =>/ {print $3}')
  [ "$(readlink -f "$loaded")" = "$(readlink -f "$tmp/prefix/lib/libchorus.so.0")" ] ||
    { echo "FAIL: $1 loads libchorus.so.0 from '$loaded', not the installed tree"; exit 1; }
}
# pkg-config consumer: its flags alone, as a user types them
if command -v pkg-config >/dev/null; then
  cc "$src/examples/allreduce.c" $(PKG_CONFIG_PATH="$tmp/prefix/lib/pkgconfig" pkg-config --cflags --libs chorus) \
    -o "$tmp/pc_consumer"
  runs_installed "$tmp/pc_consumer"
else
  echo "    skipped: the pkg-config consumer: pkg-config is not installed; to run it: apt-get install pkg-config"
fi
# CMake consumer
cmake -S "$src/tests/install" -B "$tmp/cm" -DCMAKE_PREFIX_PATH="$tmp/prefix" >/dev/null
cmake --build "$tmp/cm" >/dev/null
runs_installed "$tmp/cm/consumer"
echo "install test passed"
