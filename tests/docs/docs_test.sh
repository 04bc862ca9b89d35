#!/usr/bin/env bash
# ctest docs: the docs say what the code does, and their commands run as written.
#  1. The README's program is examples/allreduce.c, byte for byte.
#  2. The README's build-and-run block for it runs as written from the repository root (in a scratch
#     folder laid out like it: build/ and examples/ linked), and every rank prints the expected sum.
#  3. Every relative Markdown link in README.md, CONTRIBUTING.md and docs/*.md names a file that exists.
#  4. No tracked file cites a path outside the repository (../shared, /work/).
# usage: docs_test.sh SOURCE_DIR BUILD_DIR
set -u
src=${1:?usage: docs_test.sh SOURCE_DIR BUILD_DIR}
build=${2:?usage: docs_test.sh SOURCE_DIR BUILD_DIR}
fail=0
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

# 1.
awk '/^## Using it/ { on = 1 } on && /^```c$/ { grab = 1; next } grab && /^```$/ { exit } grab { print }' \
  "$src/README.md" >"$tmp/listing.c"
if ! cmp -s "$tmp/listing.c" "$src/examples/allreduce.c"; then
  echo "FAIL: README.md's program under 'Using it' differs from examples/allreduce.c:"
  diff "$tmp/listing.c" "$src/examples/allreduce.c" | head -20
  fail=1
else
  echo "ok: README.md's program is examples/allreduce.c"
fi

# 2.
awk '/^From the repository root, after `make`:/ { on = 1; next } on && /^```sh$/ { grab = 1; next }
     grab && /^```$/ { exit } grab { print }' "$src/README.md" >"$tmp/block.sh"
if [ ! -s "$tmp/block.sh" ]; then
  echo "FAIL: README.md has no sh block after 'From the repository root, after \`make\`:'"
  fail=1
else
  mkdir "$tmp/root"
  ln -s "$(cd "$build" && pwd)" "$tmp/root/build"
  ln -s "$(cd "$src" && pwd)/examples" "$tmp/root/examples"
  if out=$(cd "$tmp/root" && NCCL_COMM_ID= timeout 120 bash -e "$tmp/block.sh" 2>&1) &&
     [ "$(grep -c 'buf\[0\] = 10 (expected 10)' <<<"$out")" -eq 4 ]; then
    echo "ok: README.md's build-and-run block runs as written ($(wc -l <"$tmp/block.sh") commands)"
  else
    echo "FAIL: README.md's build-and-run block, run from a copy of the repository root:"
    sed 's/^/    /' "$tmp/block.sh"
    echo "  printed:"
    sed 's/^/    /' <<<"$out" | head -20
    fail=1
  fi
fi

# 3.
for md in "$src/README.md" "$src/CONTRIBUTING.md" "$src"/docs/*.md "$src/tests/README.md" "$src/tools/README.md"; do
  [ -f "$md" ] || continue
  dir=$(dirname "$md")
  while IFS= read -r link; do
    target=${link%%#*}
    [ -n "$target" ] || continue
    case $target in http:* | https:* | mailto:*) continue ;; esac
    if [ ! -e "$dir/$target" ]; then
      echo "FAIL: ${md#"$src"/} links to $target, which does not exist"
      fail=1
    fi
  done < <(grep -o '\](\([^)]*\))' "$md" | sed 's/^](\(.*\))$/\1/')
done
[ $fail -eq 0 ] && echo "ok: every relative link in the docs resolves"

# 4.
if command -v git >/dev/null && git -C "$src" rev-parse >/dev/null 2>&1; then
  hits=$(git -C "$src" grep -n -I -E '\.\./shared/|/work/(shared|main)' -- . ':!tests/docs/docs_test.sh' || true)
  if [ -n "$hits" ]; then
    echo "FAIL: files cite paths outside the repository:"
    echo "$hits" | head -20
    fail=1
  else
    echo "ok: no tracked file cites a path outside the repository"
  fi
fi
exit $fail
