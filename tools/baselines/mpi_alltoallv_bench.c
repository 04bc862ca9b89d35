/* Open MPI's MPI_Alltoallv with alltoallv_perf's split (tools/perf/zipf_split.h: the same seeded Zipf
 * blocks by ring distance, or uniform), so the two tables compare one exchange. Not built by CMake (it
 * needs mpicc); docs/PERFORMANCE.md gives the commands:
 *   mpicc -O2 -o /tmp/mpi_a2av tools/baselines/mpi_alltoallv_bench.c
 *   mpirun -np 8 --mca btl vader,self /tmp/mpi_a2av MINBYTES MAXBYTES [zipf|uniform] [seed]
 * Sizes are each rank's total send bytes (float elements), as alltoallv_perf's size column. Prints
 * size, time (us, median of the timed runs) and algbw/busbw (GB/s) as rccl-tests count them. */
#include <mpi.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../perf/zipf_split.h"

static int cmp(const void* a, const void* b) {
  double x = *(const double*)a, y = *(const double*)b;
  return x < y ? -1 : x > y;
}

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int rank, n;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &n);
  size_t minb = argc > 1 ? strtoull(argv[1], NULL, 0) : 1 << 20, maxb = argc > 2 ? strtoull(argv[2], NULL, 0) : 64 << 20;
  int zipf = argc > 3 ? strcmp(argv[3], "uniform") != 0 : 1;
  unsigned seed = argc > 4 ? (unsigned)atoi(argv[4]) : 1;
  size_t* by = malloc(sizeof(size_t) * (size_t)n);
  int *sc = malloc(sizeof(int) * (size_t)n), *sd = malloc(sizeof(int) * (size_t)n);
  int *rc = malloc(sizeof(int) * (size_t)n), *rd = malloc(sizeof(int) * (size_t)n);
  float *s = malloc(maxb), *r = malloc(maxb);
  memset(s, 1, maxb), memset(r, 0, maxb);
  if (!rank) printf("# MPI_Alltoallv, %d ranks, %s split (seed %u)\n#%11s %12s %8s %8s\n", n, zipf ? "zipf" : "uniform",
                    seed, "size(B)", "time(us)", "algbw", "busbw");
  for (size_t b = minb; b <= maxb; b *= 2) {
    size_t total = b / sizeof(float);
    split_blocks(total, n, zipf, seed, by);
    for (int p = 0; p < n; p++) {
      sc[p] = (int)by[(p - rank + n) % n], rc[p] = (int)by[(rank - p + n) % n];
      sd[p] = p ? sd[p - 1] + sc[p - 1] : 0, rd[p] = p ? rd[p - 1] + rc[p - 1] : 0;
    }
    int iters = b >= (16 << 20) ? 10 : 40;
    double t[64];
    for (int w = 0; w < 3; w++) MPI_Alltoallv(s, sc, sd, MPI_FLOAT, r, rc, rd, MPI_FLOAT, MPI_COMM_WORLD);
    for (int i = 0; i < iters; i++) {
      MPI_Barrier(MPI_COMM_WORLD);
      double t0 = MPI_Wtime();
      MPI_Alltoallv(s, sc, sd, MPI_FLOAT, r, rc, rd, MPI_FLOAT, MPI_COMM_WORLD);
      double dt = MPI_Wtime() - t0, mx;
      MPI_Allreduce(&dt, &mx, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
      t[i] = mx;
    }
    qsort(t, (size_t)iters, sizeof(double), cmp);
    double us = t[iters / 2] * 1e6, alg = (double)b / (us * 1e3);
    if (!rank) printf("%12zu %12.1f %8.2f %8.2f\n", b, us, alg, alg * (n - 1) / n);
  }
  MPI_Finalize();
  return 0;
}
