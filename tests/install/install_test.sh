#!/usr/bin/env bash
# make install works: headers, libraries, pkg-config and find_package(Chorus) are usable.
set -euo pipefail
build=$1; src=$2
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
cmake --install "$build" --prefix "$tmp/prefix" >/dev/null
for f in include/nccl.h include/chorus.h lib/libchorus.a lib/pkgconfig/chorus.pc lib/cmake/Chorus/ChorusConfig.cmake; do
  [ -e "$tmp/prefix/$f" ] || { echo "missing $f"; exit 1; }
done
ls "$tmp/prefix/lib/"libchorus.so.0* >/dev/null
# pkg-config consumer
cc "$src/examples/allreduce.c" $(PKG_CONFIG_PATH="$tmp/prefix/lib/pkgconfig" pkg-config --cflags --libs chorus) \
  -Wl,-rpath,"$tmp/prefix/lib" -o "$tmp/pc_consumer"
RANK=0 WORLD_SIZE=1 "$tmp/pc_consumer"
# CMake consumer
cmake -S "$src/tests/install" -B "$tmp/cm" -DCMAKE_PREFIX_PATH="$tmp/prefix" >/dev/null
cmake --build "$tmp/cm" >/dev/null
RANK=0 WORLD_SIZE=1 LD_LIBRARY_PATH="$tmp/prefix/lib" "$tmp/cm/consumer"
echo "install test passed"
