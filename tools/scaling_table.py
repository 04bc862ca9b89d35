#!/usr/bin/env python3
"""Markdown tables from tools/device-session.sh's scaling log: per rank count, AllReduce time (us,
out of place) of the automatic choice (default constants, and "tuned": this machine's from chorus-info
--calibrate), every forced algorithm (NCCL_ALGO) and protocol (NCCL_PROTO,
the model's algorithm) and Open MPI, by size; then auto over the best forced variant and Open MPI
over auto (the issue's two ratios).

    python3 tools/scaling_table.py scaling.txt
"""
import re
import sys
from collections import defaultdict


def parse(lines):
    # times[np][variant][bytes] = us; a variant measured twice keeps its best
    times = defaultdict(lambda: defaultdict(dict))
    cur = None
    for line in lines:
        if line.startswith("$ "):
            cur = None
            m = re.search(r"chorusrun (?:--bind \w+ )?-n (\d+) .*all_reduce_perf", line)
            if m:
                a = re.search(r"NCCL_ALGO=allreduce:(\w+)", line)
                p = re.search(r"NCCL_PROTO=(\w+)", line)
                name = (a.group(1) if a else p.group(1) if p else "tuned" if "CHORUS_TUNE_FILE" in line
                        else "CMA" if "CHORUS_CMA=1" in line else "auto")
                cur = (int(m.group(1)), name, 5)  # column of the out-of-place time
            m = re.search(r"mpirun .*-np (\d+) .*mpi_coll_bench allreduce", line)
            if m:
                cur = (int(m.group(1)), "Open MPI", 1)
            continue
        f = line.split()
        if cur is None or len(f) <= cur[2] or not f[0].isdigit():
            continue
        try:
            b, t = int(f[0]), float(f[cur[2]])
        except ValueError:
            continue
        d = times[cur[0]][cur[1]]
        d[b] = min(t, d.get(b, t))
    return times


def size(b):
    for unit, k in (("Mi", 20), ("Ki", 10)):
        if b >= 1 << k and b % (1 << k) == 0:
            return f"{b >> k} {unit}"
    return str(b)


def table(np, v):
    choices = [a for a in ("auto", "tuned") if a in v]  # the model's choice: default and calibrated constants
    forced = [a for a in v if a not in ("auto", "tuned", "Open MPI")]
    cols = choices + forced
    sizes = sorted(set().union(*(v[c].keys() for c in cols)))
    out = [f"**{np} process ranks**, time in us (best forced in bold)", ""]
    head = ["bytes"] + cols + ["auto / best forced", "Open MPI", "Open MPI / auto"]
    out += ["| " + " | ".join(head) + " |", "|" + "---:|" * len(head)]
    for b in sizes:
        best = min((v[a][b] for a in forced if b in v[a]), default=None)
        row = [size(b)]
        for c in cols:
            t = v[c].get(b)
            row.append("-" if t is None else (f"**{t:.2f}**" if c in forced and t == best else f"{t:.2f}"))
        auto, mpi = v.get("auto", {}).get(b), v.get("Open MPI", {}).get(b)
        row.append(f"{auto / best:.2f}" if auto and best else "-")
        row.append(f"{mpi:.2f}" if mpi else "-")
        row.append(f"{mpi / auto:.2f}" if mpi and auto else "-")
        out.append("| " + " | ".join(row) + " |")
    return "\n".join(out)


def main():
    with open(sys.argv[1]) as fh:
        times = parse(fh)
    print("\n\n".join(table(np, times[np]) for np in sorted(times)))


if __name__ == "__main__":
    main()
