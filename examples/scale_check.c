/* One rank of a job that checks the calls issue 44 asks of every job size: init from the environment
 * (chorusrun, tools/netns-cluster.sh, or any launcher that sets NCCL_COMM_ID, RANK and WORLD_SIZE),
 * then an AllReduce, an AllGather, an AlltoAll and a Send/Recv ring, each checked element by element
 * against its closed form, then teardown. Rank 0 prints one line per call and the time each took.
 *
 *   chorusrun -n 1024 build/bin/scale_check [COUNT=256] [ROUNDS=1] [CALLS=ar,ag,a2a,ring]
 *   tools/scale-run.py 1024 -- build/bin/scale_check        (with memory, descriptors and threads)
 *
 * COUNT is the elements per rank (AlltoAll: per pair); CALLS picks among the four. Exit status 0 only
 * when every value was right. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "chorus.h"
#include "nccl.h"

static double now_ms(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec * 1e3 + t.tv_nsec / 1e6;
}

#define CALL(what, expr)                                                               \
  do {                                                                                 \
    ncclResult_t r_ = (expr);                                                          \
    if (r_ != ncclSuccess) {                                                           \
      fprintf(stderr, "rank %d: %s failed: %s\n", rank, what, ncclGetErrorString(r_)); \
      return 1;                                                                        \
    }                                                                                  \
  } while (0)

/* Values stay exact in float: small integers. */
static float val(int from, int to, size_t i) { return (float)((from * 7 + to * 3 + (int)(i % 61)) % 1024); }

static int bad(int rank, const char* what, size_t at, float got, float want) {
  fprintf(stderr, "rank %d: %s: element %zu is %g, expected %g\n", rank, what, at, (double)got, (double)want);
  return 1;
}

int main(int argc, char** argv) {
  size_t count = argc > 1 ? (size_t)atol(argv[1]) : 256;
  int rounds = argc > 2 ? atoi(argv[2]) : 1, rank = -1, n = 0;
  const char* calls = argc > 3 ? argv[3] : "ar,ag,a2a,ring";
  int do_ar = strstr(calls, "ar") != NULL, do_ag = strstr(calls, "ag") != NULL, do_a2a = strstr(calls, "a2a") != NULL,
      do_ring = strstr(calls, "ring") != NULL;
  ncclComm_t comm;
  double t0 = now_ms();
  CALL("init (chorusInitFromEnv)", chorusInitFromEnv(&comm));
  CALL("ncclCommUserRank", ncclCommUserRank(comm, &rank));
  CALL("ncclCommCount", ncclCommCount(comm, &n));
  double t_init = now_ms() - t0;
  size_t big = count * (size_t)n;
  float *a = malloc(big * sizeof(float)), *b = malloc(big * sizeof(float));
  if (!a || !b || count == 0 || rounds < 1) return 2;
  if (rank == 0)
    printf("# scale_check: %d ranks, %zu elements, %d rounds; init %.0f ms (rank 0)\n", n, count, rounds, t_init);
  for (int r = 0; r < rounds; r++) {
    double t = now_ms(), t_ar = 0, t_ag = 0, t_a2a = 0, t_ring = 0;
    if (do_ar) {
      for (size_t i = 0; i < count; i++) a[i] = val(rank, 0, i);
      CALL("AllReduce", ncclAllReduce(a, b, count, ncclFloat32, ncclSum, comm, NULL));
      for (size_t i = 0; i < count; i++) { /* sum over ranks q of val(q, 0, i): exact below 2^24 */
        double want = 0;
        for (int q = 0; q < n; q++) want += val(q, 0, i);
        if (b[i] != (float)want) return bad(rank, "AllReduce", i, b[i], (float)want);
      }
      t_ar = now_ms() - t;
    }
    if (do_ag) {
      t = now_ms();
      for (size_t i = 0; i < count; i++) a[i] = val(rank, 1, i);
      CALL("AllGather", ncclAllGather(a, b, count, ncclFloat32, comm, NULL));
      for (int q = 0; q < n; q++)
        for (size_t i = 0; i < count; i++)
          if (b[(size_t)q * count + i] != val(q, 1, i))
            return bad(rank, "AllGather", (size_t)q * count + i, b[(size_t)q * count + i], val(q, 1, i));
      t_ag = now_ms() - t;
    }
    if (do_a2a) {
      t = now_ms();
      for (int q = 0; q < n; q++)
        for (size_t i = 0; i < count; i++) a[(size_t)q * count + i] = val(rank, q, i);
      CALL("AlltoAll", ncclAlltoAll(a, b, count, ncclFloat32, comm, NULL));
      for (int q = 0; q < n; q++)
        for (size_t i = 0; i < count; i++)
          if (b[(size_t)q * count + i] != val(q, rank, i))
            return bad(rank, "AlltoAll", (size_t)q * count + i, b[(size_t)q * count + i], val(q, rank, i));
      t_a2a = now_ms() - t;
    }
    if (do_ring) {
      t = now_ms();
      int next = (rank + 1) % n, prev = (rank + n - 1) % n;
      for (size_t i = 0; i < count; i++) a[i] = val(rank, next, i);
      memset(b, 0, count * sizeof(float));
      CALL("ncclGroupStart", ncclGroupStart());
      CALL("Send", ncclSend(a, count, ncclFloat32, next, comm, NULL));
      CALL("Recv", ncclRecv(b, count, ncclFloat32, prev, comm, NULL));
      CALL("ncclGroupEnd (Send/Recv ring)", ncclGroupEnd());
      for (size_t i = 0; i < count; i++)
        if (b[i] != val(prev, rank, i)) return bad(rank, "Send/Recv ring", i, b[i], val(prev, rank, i));
      t_ring = now_ms() - t;
    }
    if (rank == 0)
      printf("round %d: AllReduce %.1f ms, AllGather %.1f ms, AlltoAll %.1f ms, Send/Recv ring %.1f ms: all values "
             "right\n",
             r, t_ar, t_ag, t_a2a, t_ring);
  }
  CALL("ncclCommDestroy", ncclCommDestroy(comm));
  if (rank == 0) printf("scale_check: %d ranks passed\n", n);
  free(a);
  free(b);
  return 0;
}
