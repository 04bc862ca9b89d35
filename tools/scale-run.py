#!/usr/bin/env python3
"""Run a job of N ranks and report what each rank held (docs/SCALE.md's tables).

    tools/scale-run.py [options] N -- CMD [ARGS...]

Starts CMD as N process ranks, with build/bin/chorusrun on this host, or with --netns H across the H
network-namespace hosts of tools/netns-cluster.sh (bring them up first: `netns-cluster.sh up H`; the
ranks are blocked, N/H per host). While it runs it samples, every --interval seconds, every process of
the job whose name is CMD's: Rss and Pss (/proc/PID/smaps_rollup), open descriptors (/proc/PID/fd),
threads (/proc/PID/status), and the machine's Shmem (/proc/meminfo). It prints one row: ranks, the
library's own init time per rank ("init done in T ms", min / median / max), each figure per rank
(median and max over the ranks of each one's largest sample), the peak growth of Shmem, the wall time
and the exit status. The job's output goes to --log (default scale-run.log).

Options: --netns H, --interval S (default 0.5), --log FILE, --repeat K (run K times, a row each),
--csv (rows as CSV). Environment passes through; CHORUS_INIT_TIMEOUT defaults to 900 and NCCL_DEBUG
to INFO with NCCL_DEBUG_SUBSYS=INIT (for the init times). A tool, not a test: nothing here fails on a
figure.
"""
import argparse
import os
import re
import statistics
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def read(path):
    try:
        with open(path, "rb") as f:
            return f.read().decode("utf-8", "replace")
    except OSError:
        return ""


def shmem_kib():
    m = re.search(r"^Shmem:\s+(\d+) kB", read("/proc/meminfo"), re.M)
    return int(m.group(1)) if m else 0


def job_pids(name, top):
    """Processes named `name` (as /proc/PID/comm shows it, 15 characters) below pid `top`."""
    parent, comm = {}, {}
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        st = read(f"/proc/{d}/stat")
        r = st.rfind(")")
        if r < 0:
            continue
        fields = st[r + 2:].split()
        parent[int(d)] = int(fields[1])
        comm[int(d)] = st[st.find("(") + 1:r]
    out = []
    for pid, c in comm.items():
        if c != name[:15]:
            continue
        p, hops = pid, 0
        while p in parent and p != top and hops < 64:
            p, hops = parent[p], hops + 1
        if p == top:
            out.append(pid)
    return out


def sample(pid):
    roll = read(f"/proc/{pid}/smaps_rollup")
    rss = re.search(r"^Rss:\s+(\d+) kB", roll, re.M)
    pss = re.search(r"^Pss:\s+(\d+) kB", roll, re.M)
    thr = re.search(r"^Threads:\s+(\d+)", read(f"/proc/{pid}/status"), re.M)
    try:
        fds = len(os.listdir(f"/proc/{pid}/fd"))
    except OSError:
        fds = None
    if not rss or not thr or fds is None:
        return None
    return (int(rss.group(1)), int(pss.group(1)) if pss else 0, fds, int(thr.group(1)))


def stats(vals, fmt):
    if not vals:
        return "-"
    return f"{fmt(statistics.median(vals))} / {fmt(max(vals))}"


def mib(k):
    return f"{k / 1024:.1f} MiB"


def run_once(a, cmd):
    env = dict(os.environ)
    env.setdefault("CHORUS_INIT_TIMEOUT", "900")
    if "NCCL_DEBUG" not in env:
        env["NCCL_DEBUG"], env["NCCL_DEBUG_SUBSYS"] = "INFO", "INIT"
    if a.netns:
        launcher = [os.path.join(ROOT, "tools/netns-cluster.sh"), "run", str(a.n), "--blocked"] + cmd
    else:
        launcher = [os.path.join(ROOT, "build/bin/chorusrun"), "-n", str(a.n)] + cmd
    name = os.path.basename(cmd[0])
    shm0 = shmem_kib()
    shm_peak = shm0
    per = {}  # pid -> [rss, pss, fds, threads] maxima
    t0 = time.time()
    with open(a.log, "w") as log:
        job = subprocess.Popen(launcher, stdout=log, stderr=subprocess.STDOUT, env=env)
        while job.poll() is None:
            shm_peak = max(shm_peak, shmem_kib())
            for pid in job_pids(name, job.pid):
                s = sample(pid)
                if s:
                    m = per.setdefault(pid, list(s))
                    per[pid] = [max(x, y) for x, y in zip(m, s)]
            time.sleep(a.interval)
        rc = job.returncode
    wall = time.time() - t0
    text = read(a.log)
    inits = [float(x) for x in re.findall(r"init done in ([0-9.]+) ms", text)]
    warns = len(re.findall(r"NCCL WARN", text))
    cols = [str(a.n), str(len(per)),
            f"{min(inits):.0f} / {statistics.median(inits):.0f} / {max(inits):.0f} ms" if inits else "-",
            stats([v[0] for v in per.values()], mib), stats([v[1] for v in per.values()], mib),
            f"+{(shm_peak - shm0) / 1024:.0f} MiB ({(shm_peak - shm0) / 1024 / a.n:.2f} a rank)",
            stats([v[2] for v in per.values()], lambda x: f"{x:.0f}"),
            stats([v[3] for v in per.values()], lambda x: f"{x:.0f}"),
            f"{wall:.1f} s", str(rc), str(warns)]
    return cols


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("n", type=int)
    p.add_argument("cmd", nargs=argparse.REMAINDER)
    p.add_argument("--netns", type=int, default=0)
    p.add_argument("--interval", type=float, default=0.5)
    p.add_argument("--log", default="scale-run.log")
    p.add_argument("--repeat", type=int, default=1)
    p.add_argument("--csv", action="store_true")
    a = p.parse_args()
    cmd = a.cmd[1:] if a.cmd and a.cmd[0] == "--" else a.cmd
    if not cmd:
        p.error("no command (give it after --)")
    head = ["ranks", "sampled", "init per rank (min / median / max)", "Rss per rank (median / max)",
            "Pss per rank (median / max)", "Shmem peak growth", "fds per rank (median / max)",
            "threads per rank (median / max)", "wall", "exit", "WARNs"]
    if a.csv:
        print(",".join(head))
    else:
        print("| " + " | ".join(head) + " |")
        print("|" + "---|" * len(head))
    bad = 0
    for _ in range(a.repeat):
        cols = run_once(a, cmd)
        bad += cols[9] != "0"
        print((",".join(cols)) if a.csv else "| " + " | ".join(cols) + " |", flush=True)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
