/* Open MPI's one-sided put with a signal, the pattern of put_perf (tools/perf/put.c): each rank puts N
 * bytes into rank+1's window and then adds one to a counter in it (MPI_Accumulate after the put's
 * MPI_Win_flush: passive target, one MPI_Win_lock_all epoch), and waits until its own counter counts
 * rank-1's put. Not built by CMake (it needs mpicc):
 *   mpicc -O2 -o /tmp/mpi_put tools/baselines/mpi_put_bench.c
 *   mpirun -np 2 --mca btl vader,self /tmp/mpi_put MINBYTES MAXBYTES
 * Prints size, time per put + signal + wait (us, median) and GB/s, as put_perf's algbw. */
#include <mpi.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int cmp(const void* a, const void* b) {
  double x = *(const double*)a, y = *(const double*)b;
  return x < y ? -1 : x > y;
}

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int rank, n;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &n);
  size_t minb = argc > 1 ? strtoull(argv[1], NULL, 0) : 8, maxb = argc > 2 ? strtoull(argv[2], NULL, 0) : 64 << 20;
  size_t winb = maxb + 64; /* the data, then the counter */
  char *win_mem, *src = malloc(maxb);
  memset(src, 1, maxb);
  MPI_Win win;
  MPI_Win_allocate((MPI_Aint)winb, 1, MPI_INFO_NULL, MPI_COMM_WORLD, &win_mem, &win);
  memset(win_mem, 0, winb);
  volatile int64_t* counter = (volatile int64_t*)(win_mem + maxb);
  int next = (rank + 1) % n;
  int64_t one = 1, seen = 0;
  MPI_Barrier(MPI_COMM_WORLD);
  MPI_Win_lock_all(0, win);
  if (!rank) printf("# MPI_Put + MPI_Accumulate signal + wait, %d ranks\n#%11s %12s %8s\n", n, "size(B)", "time(us)", "GB/s");
  for (size_t b = minb; b <= maxb; b *= 2) {
    int iters = b >= (16 << 20) ? 10 : b >= (1 << 20) ? 40 : 2000;
    double* t = malloc(sizeof(double) * (size_t)iters);
    for (int i = -5; i < iters; i++) {
      MPI_Barrier(MPI_COMM_WORLD);
      double t0 = MPI_Wtime();
      MPI_Put(src, (int)b, MPI_BYTE, next, 0, (int)b, MPI_BYTE, win);
      MPI_Win_flush(next, win);
      MPI_Accumulate(&one, 1, MPI_INT64_T, next, (MPI_Aint)maxb, 1, MPI_INT64_T, MPI_SUM, win);
      MPI_Win_flush(next, win);
      seen++;
      while (1) {
        MPI_Win_sync(win);
        if (*counter >= seen) break;
        MPI_Iprobe(MPI_ANY_SOURCE, MPI_ANY_TAG, MPI_COMM_WORLD, &(int){0}, MPI_STATUS_IGNORE); /* progress */
      }
      if (i >= 0) t[i] = MPI_Wtime() - t0;
    }
    qsort(t, (size_t)iters, sizeof(double), cmp);
    double us = t[iters / 2] * 1e6;
    if (!rank) printf("%12zu %12.2f %8.2f\n", b, us, (double)b / (us * 1e3));
    free(t);
  }
  MPI_Win_unlock_all(win);
  MPI_Win_free(&win);
  free(src);
  MPI_Finalize();
  return 0;
}
