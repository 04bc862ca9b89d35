/* Communicator setup time: forks N process ranks, each calls ncclCommInitRank, and reports the time
 * from the fork to the moment the slowest rank's communicator is ready (and usable: one AllReduce).
 * Usage: init_bench [nranks=8] [repeats=5] */
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "nccl.h"

static double now_ms(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec * 1e3 + t.tv_nsec / 1e6;
}

int main(int argc, char** argv) {
  int n = argc > 1 ? atoi(argv[1]) : 8, reps = argc > 2 ? atoi(argv[2]) : 5;
  double* done = mmap(NULL, sizeof(double) * 2 * (size_t)n, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  if (n < 1 || done == MAP_FAILED) return 2;
  printf("# init_bench: %d process ranks, %d repeats (ms from fork until every rank is ready)\n", n, reps);
  double best = 1e9;
  for (int r = 0; r < reps; r++) {
    ncclUniqueId id;
    double t0 = now_ms();
    if (ncclGetUniqueId(&id) != ncclSuccess) return 1;
    for (int k = 0; k < n; k++) {
      if (fork() == 0) {
        ncclComm_t comm;
        float x = 1;
        if (ncclCommInitRank(&comm, n, id, k) != ncclSuccess) _exit(1);
        done[2 * k] = now_ms();
        if (ncclAllReduce(&x, &x, 1, ncclFloat, ncclSum, comm, NULL) != ncclSuccess || x != n) _exit(1);
        done[2 * k + 1] = now_ms();
        ncclCommDestroy(comm);
        _exit(0);
      }
    }
    int st, bad = 0;
    while (wait(&st) > 0) bad |= !WIFEXITED(st) || WEXITSTATUS(st);
    double init = 0, first = 0;
    for (int k = 0; k < n; k++) {
      if (done[2 * k] - t0 > init) init = done[2 * k] - t0;
      if (done[2 * k + 1] - t0 > first) first = done[2 * k + 1] - t0;
    }
    if (bad) {
      printf("run %d: a rank failed\n", r);
      return 1;
    }
    printf("run %d: init %.2f ms, init + first AllReduce (connects) %.2f ms\n", r, init, first);
    if (init < best) best = init;
  }
  printf("# best init: %.2f ms\n", best);
  return 0;
}
