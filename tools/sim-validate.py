#!/usr/bin/env python3
"""Compare chorus-sim's predictions with the forced-algorithm AllReduce times measured on the 16-core
machine (docs/PERFORMANCE.md, "16 cores: the issue's table", 2026-11-26; process ranks on one host).
Prints measured / simulated per cell and a summary per rank count and algorithm (docs/SCALE.md).

  tools/sim-validate.py [build/bin/chorus-sim] [-- extra chorus-sim options, e.g. --intra-lat 0.49]
"""
import subprocess
import sys

SIZES = [8, 32, 128, 512, 2048, 8192, 32768, 131072, 524288, 2 << 20, 4 << 20, 16 << 20, 64 << 20, 256 << 20]
ALGOS = ["Ring", "RecDbl", "Rabenseifner", "Tree"]
# us, columns ALGOS, rows SIZES (None: not measured)
M = {
    4: [(1.79, 1.00, 1.74, 2.02), (1.77, 1.17, 1.83, 1.80), (2.38, 1.28, 2.32, 2.96), (2.43, 1.52, 2.42, 3.27),
        (3.14, 2.52, 3.06, 5.86), (5.87, 5.12, 5.94, 11.59), (13.21, 12.49, 13.14, 32.36),
        (46.06, 41.57, 35.69, 78.20), (192.08, 162.57, 136.68, 202.65), (790.13, 679.84, 572.32, 660.60),
        (1938.32, 1849.05, 1612.02, 1693.92), (7389.91, 8070.12, 6530.45, 6704.10),
        (29967.00, 31079.90, 27473.00, 27077.40), (118761.00, 127034.00, 107349.00, 110358.00)],
    8: [(4.90, 1.48, 2.59, 3.40), (4.78, 1.43, 2.75, 3.64), (7.59, 2.12, 3.31, 6.14), (8.03, 2.07, 3.50, 7.77),
        (8.10, 3.54, 4.19, 12.33), (10.43, 6.74, 6.75, 24.25), (21.39, 17.13, 15.04, 66.63),
        (67.19, 61.37, 39.89, 156.21), (255.21, 237.84, 154.31, 284.62), (1019.29, 1000.16, 701.25, 704.69),
        (1573.75, 2541.16, 1654.01, 1808.21), (5887.81, 11054.90, 6995.65, 6656.21),
        (23619.30, 42086.10, 28985.60, 26593.60), (93182.90, 163290.00, 148588.00, 102724.00)],
    16: [(8.79, 2.43, 3.70, 7.28), (10.90, 2.10, 4.32, 7.36), (16.41, 2.92, 5.03, 13.67), (17.98, 3.36, 6.32, 15.95),
         (18.73, 5.98, 6.51, 27.24), (23.06, 13.08, 9.65, 64.93), (38.38, 39.36, 22.83, 175.22),
         (93.96, 151.79, 74.21, 309.42), (313.35, 623.22, 295.02, 456.71), (1239.87, 2431.72, 1279.15, 1115.68),
         (2826.97, 5389.23, 2758.26, 3318.09), (11528.90, 22329.30, 10450.70, 11653.10),
         (47986.20, 89541.70, 46708.50, 51830.60), (188088.00, None, 216129.00, 177366.00)],
}


def main():
    args = sys.argv[1:]
    sim = "build/bin/chorus-sim"
    if args and not args[0].startswith("-"):
        sim = args.pop(0)
    if args and args[0] == "--":
        args.pop(0)
    out = subprocess.run([sim, "--csv", "--ranks", "4,8,16", "--per-host", "16", "--sizes",
                          ",".join(map(str, SIZES)), "--algos", "ring,recdbl,rabenseifner,tree"] + args,
                         check=True, capture_output=True, text=True).stdout
    sim_us = {}
    for line in out.splitlines()[1:]:
        f = line.split(",")
        if f[4] != "auto":
            sim_us[(int(f[1]), int(f[3]), f[4])] = float(f[5])
    print("ranks  size       " + "".join("%22s" % a for a in ALGOS) + "   (measured us / simulated us = ratio)")
    ratios = {}
    for n in sorted(M):
        for i, size in enumerate(SIZES):
            cells = []
            for j, a in enumerate(ALGOS):
                m, s = M[n][i][j], sim_us.get((n, size, a))
                if m is None or s is None:
                    cells.append("%22s" % "-")
                    continue
                r = m / s
                ratios.setdefault((n, a), []).append((size, r))
                cells.append("%9.1f/%8.1f=%4.2f" % (m, s, r))
            print("%5d %10d %s" % (n, size, "".join(cells)))
    print("\nWithin 25% (0.8 <= measured/simulated <= 1.25), by rank count and algorithm, small (<= 8 KiB) "
          "and large (>= 128 KiB) sizes:")
    for (n, a), rs in sorted(ratios.items()):
        small = [r for s, r in rs if s <= 8192]
        large = [r for s, r in rs if s >= 131072]
        ok = lambda v: sum(1 for r in v if 0.8 <= r <= 1.25)
        print("  %2d ranks %-13s small %d/%d (%.2f-%.2f)  large %d/%d (%.2f-%.2f)" %
              (n, a, ok(small), len(small), min(small), max(small), ok(large), len(large), min(large), max(large)))


if __name__ == "__main__":
    main()
