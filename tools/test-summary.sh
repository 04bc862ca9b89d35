#!/usr/bin/env bash
# The end of `make test`: what was skipped on this machine, why, and the command that enables it.
# Reads ctest's log of a build tree: a ctest entry whose output has "SKIP: <why>" (the torch tests,
# the net plugin harness, ...) and a runner test that printed "skipped: <why>" are listed, grouped by
# reason. Prints nothing when nothing was skipped. Never fails: `make test`'s status is ctest's.
# usage: tools/test-summary.sh BUILD_DIR
log=${1:?usage: test-summary.sh BUILD_DIR}/Testing/Temporary/LastTest.log
[ -f "$log" ] || exit 0
awk '
  /^[0-9]+\/[0-9]+ Test: / { entry = $3; test = entry; next }
  /^\[ RUN  \] / { test = $4; next }
  {
    why = ""
    # "SKIP: <why>" opening a line (after indentation or a "tool: " prefix), not quoted inside one
    if (match($0, /^ *([a-z-]+: )?SKIP: .*/)) { why = $0; sub(/^ *([a-z-]+: )?SKIP: /, "", why) }
    else if (match($0, /^ +skipped[:]? .*/)) { why = $0; sub(/^ +skipped[:]? */, "", why) }
    if (why == "") next
    if ((why, test) in seen) next
    seen[why, test] = 1
    if (!(why in names)) { order[++n] = why; names[why] = test; count[why] = 1; next }
    count[why]++
    if (count[why] <= 3) names[why] = names[why] ", " test
  }
  END {
    if (!n) exit 0
    printf "\nSkipped on this machine (the tests that ran above passed or failed on their own):\n"
    for (i = 1; i <= n; i++) {
      w = order[i]; more = count[w] > 3 ? sprintf(" and %d more", count[w] - 3) : ""
      printf "  - %s%s:\n      %s\n", names[w], more, w
    }
  }' "$log"
exit 0
