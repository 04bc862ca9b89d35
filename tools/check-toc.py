#!/usr/bin/env python3
"""A long doc's table of contents stays true: every `## ` heading of FILE is linked from the list under
its title, in order, and every link there names a heading (GitHub's anchors).

    tools/check-toc.py docs/ERRORS.md      # prints each problem; exit 1 if any
    tools/check-toc.py --print FILE        # prints the list to paste
"""
import re
import sys


def anchor(title):
    """GitHub's: lower case, punctuation but - and _ dropped, spaces to -."""
    return re.sub(r"[^\w\- ]", "", title.strip().lower()).replace(" ", "-")


def headings(text):
    out, fence = [], False
    for line in text.splitlines():
        if line.startswith("```"):
            fence = not fence
        elif not fence and line.startswith("## "):
            out.append(line[3:].strip())
    return out


def main(argv):
    show = argv[:1] == ["--print"]
    path = argv[-1] if argv else None
    if not path:
        print(__doc__)
        return 2
    text = open(path, encoding="utf-8").read()
    want = headings(text)
    if show:
        for h in want:
            print(f"- [{h}](#{anchor(h)})")
        return 0
    before = text.split("\n## ", 1)[0]  # the TOC sits above the first section
    links = re.findall(r"^\s*[-*] \[[^\]]*\]\(#([^)]+)\)", before, re.M)
    problems = []
    if links != [anchor(h) for h in want]:
        known = {anchor(h) for h in want}
        problems += [f"{path}: TOC link #{a} names no heading" for a in links if a not in known]
        problems += [f"{path}: heading '{h}' is not in the TOC" for h in want if anchor(h) not in links]
        if not problems:
            problems.append(f"{path}: the TOC's order differs from the headings' (run {sys.argv[0]} --print {path})")
    for p in problems:
        print(p)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
