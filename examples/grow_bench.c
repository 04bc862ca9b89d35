/* Time of ncclCommGrow (3 process ranks grow to 4) against a fresh ncclCommInitRank of 4, on this host:
 * the slowest member's time in each, per repetition (docs/PERFORMANCE.md).
 *   build/bin/grow_bench [repetitions] */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include <stdatomic.h>
#include "nccl.h"
#include "chorus.h"
struct box {
  _Atomic int ready, go;
  ncclUniqueId id, gid;
  double t[8];
};
static double now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec + t.tv_nsec * 1e-9;
}
int main(int argc, char** argv) {
  int reps = argc > 1 ? atoi(argv[1]) : 10;
  for (int rep = 0; rep < reps; rep++) {
    struct box* b = mmap(NULL, sizeof *b, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    memset(b, 0, sizeof *b);
    ncclGetUniqueId(&b->id);
    for (int r = 0; r < 4; r++)
      if (fork() == 0) {
        ncclComm_t c = NULL, g = NULL;
        if (r < 3) {
          ncclCommInitRank(&c, 3, b->id, r);
          int v = 1;
          ncclAllReduce(&v, &v, 1, ncclInt32, ncclSum, c, NULL);
          if (r == 0) {
            ncclCommGetUniqueId(c, &b->gid);
            atomic_store(&b->ready, 1);
          }
          double t0 = now();
          ncclCommGrow(c, 4, r == 0 ? &b->gid : NULL, -1, &g, NULL);
          b->t[r] = now() - t0;
        } else {
          while (!atomic_load(&b->ready)) usleep(100);
          double t0 = now();
          ncclCommGrow(NULL, 4, &b->gid, 3, &g, NULL);
          b->t[r] = now() - t0;
        }
        int v = 1;
        ncclAllReduce(&v, &v, 1, ncclInt32, ncclSum, g, NULL);
        if (v != 4) printf("bad\n");
        ncclCommDestroy(g);
        if (c) ncclCommDestroy(c);
        _exit(0);
      }
    for (int r = 0; r < 4; r++) wait(NULL);
    double gmax = 0;
    for (int r = 0; r < 4; r++)
      if (b->t[r] > gmax) gmax = b->t[r];
    ncclGetUniqueId(&b->id);
    for (int r = 0; r < 4; r++)
      if (fork() == 0) {
        ncclComm_t c;
        double t0 = now();
        ncclCommInitRank(&c, 4, b->id, r);
        b->t[4 + r] = now() - t0;
        int v = 1;
        ncclAllReduce(&v, &v, 1, ncclInt32, ncclSum, c, NULL);
        ncclCommDestroy(c);
        _exit(0);
      }
    for (int r = 0; r < 4; r++) wait(NULL);
    double imax = 0;
    for (int r = 4; r < 8; r++)
      if (b->t[r] > imax) imax = b->t[r];
    printf("grow 3->4: %.1f ms   fresh init of 4: %.1f ms\n", gmax * 1e3, imax * 1e3);
    munmap(b, sizeof *b);
  }
  return 0;
}
