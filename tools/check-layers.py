#!/usr/bin/env python3
"""Check the layer rule of src/ (docs/ARCHITECTURE.md, "Layers"): a folder includes only folders below
it in the order written there, so there is no cycle between folders. Every source file at any depth is
checked, and a folder at any depth (src/gpu/staging/ is the folder "gpu/staging", a layer of its own)
must be listed; a source file directly in src/ belongs to no layer and is refused. Also refuses include
cycles between files. Prints each violation as FILE:LINE and exits 1; exit 0 when the tree keeps the
rule.

Usage: tools/check-layers.py [--graph]   (from anywhere; --graph prints the folder graph too)"""
import os
import re
import sys

ROOT = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
SRC = os.path.join(ROOT, "src")
DOC = os.path.join(ROOT, "docs", "ARCHITECTURE.md")
INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"')


def layer_order():
    """The folders of the first code block under '## Layers', top (highest) first."""
    order, in_section, in_block = [], False, False
    with open(DOC) as f:
        for line in f:
            if line.startswith("## "):
                in_section = line.strip() == "## Layers"
                continue
            if not in_section:
                continue
            if line.startswith("```"):
                if in_block:
                    break
                in_block = True
                continue
            m = re.match(r"^\s*([a-z_]+(?:/[a-z_]+)*)/\s", line)
            if in_block and m:
                order.append(m.group(1))
    if not order:
        sys.exit(f"check-layers: no layer list found under '## Layers' in {DOC}")
    return list(reversed(order))  # lowest first


def sources():
    for dirpath, _, files in os.walk(SRC):
        for name in sorted(files):
            if name.endswith((".c", ".h", ".cu")):
                yield os.path.join(dirpath, name)


def main():
    order = layer_order()
    rank = {d: i for i, d in enumerate(order)}
    errors, edges, graph = [], {}, {}
    def folder(path):  # "gpu/staging" for src/gpu/staging/x.c; "" for a file directly in src/
        return os.path.dirname(os.path.relpath(path, SRC)).replace(os.sep, "/")

    for d in sorted({folder(p) for p in sources()}):
        if d == "":
            errors.append("src/: source files directly in src/ belong to no layer: move them into a folder")
        elif d not in rank:
            errors.append(f"src/{d}/: folder not placed in the layer order of docs/ARCHITECTURE.md")
    for path in sources():
        rel = os.path.relpath(path, ROOT)
        here = folder(path)
        graph.setdefault(rel, [])
        with open(path, errors="replace") as f:
            for lineno, line in enumerate(f, 1):
                m = INCLUDE.match(line)
                if not m:
                    continue
                target = os.path.normpath(os.path.join(os.path.dirname(path), m.group(1)))
                if not os.path.exists(target):
                    continue  # public headers (include/), found through -I
                if os.path.relpath(target, SRC).split(os.sep)[0] == "..":
                    errors.append(f"{rel}:{lineno}: includes {m.group(1)}, outside src/")
                    continue
                graph[rel].append(os.path.relpath(target, ROOT))
                there = folder(target)
                if there == here:
                    continue
                edges.setdefault((here, there), f"{rel}:{lineno}")
                if here in rank and there in rank and rank[there] > rank[here]:
                    errors.append(f"{rel}:{lineno}: {here}/ includes {m.group(1)}, a layer above it "
                                  f"(order, lowest first: {' < '.join(order)})")
    # File-level include cycles (depth-first search; each cycle reported once).
    state, stack, seen_cycles = {}, [], set()

    def visit(node):
        state[node] = 1
        stack.append(node)
        for nxt in graph.get(node, []):
            if state.get(nxt) == 1:
                cycle = stack[stack.index(nxt):]
                key = frozenset(cycle)
                if key not in seen_cycles:
                    seen_cycles.add(key)
                    errors.append(f"{node}: include cycle: {' -> '.join(cycle + [nxt])}")
            elif nxt in graph and not state.get(nxt):
                visit(nxt)
        stack.pop()
        state[node] = 2

    sys.setrecursionlimit(10000)
    for node in sorted(graph):
        if not state.get(node):
            visit(node)
    if "--graph" in sys.argv:
        for (a, b), where in sorted(edges.items(), key=lambda e: (rank.get(e[0][0], -1), e[0][1])):
            print(f"{a:>10} -> {b:<10} (first: {where})")
    for e in errors:
        print(e)
    if errors:
        print(f"check-layers: {len(errors)} violation(s) of the layer rule (docs/ARCHITECTURE.md, Layers)")
        return 1
    print(f"check-layers: {len(graph)} files keep the layer order {' < '.join(order)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
