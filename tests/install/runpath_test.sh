#!/usr/bin/env bash
# ctest runpath: no program or library Chorus builds may search a relative or empty path for its
# libraries. An empty RUNPATH entry (CMake pads a build path for a longer install path with ':') or a
# relative one is resolved against the current directory, so a library planted in the folder where
# someone runs a benchmark would run with their rights. Checks the build tree and an installed tree.
# usage: runpath_test.sh BUILD_DIR
set -u
build=${1:?usage: runpath_test.sh BUILD_DIR}
command -v readelf >/dev/null || { echo "SKIP: readelf is not installed (Debian: binutils)"; exit 0; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
cmake --install "$build" --prefix "$tmp/prefix" >/dev/null || { echo "FAIL: cmake --install"; exit 1; }
bad=0 checked=0
while IFS= read -r -d '' f; do
  head -c 4 "$f" 2>/dev/null | grep -q 'ELF' || continue
  checked=$((checked + 1))
  paths=$(readelf -d "$f" 2>/dev/null | sed -n 's/.*(R\(UN\)\{0,1\}PATH).*\[\(.*\)\]$/\2/p')
  [ -n "$paths" ] || continue
  # Split on ':' keeping empty fields (a leading, trailing or doubled ':').
  IFS=: read -r -a entries <<<"$paths:"
  for e in "${entries[@]}"; do
    case $e in
      /* | '$ORIGIN' | '$ORIGIN/'* | '${ORIGIN}' | '${ORIGIN}/'*) ;;
      *) echo "FAIL: $f: search path [$paths] has the entry '$e' (empty or relative: the current directory)"; bad=1 ;;
    esac
  done
done < <(find "$build/bin" "$build/lib" "$tmp/prefix" -type f -print0 2>/dev/null)
[ $checked -gt 0 ] || { echo "FAIL: no ELF file found under $build"; exit 1; }
[ $bad -eq 0 ] && echo "runpath: $checked ELF files checked, no empty or relative search path"
exit $bad
