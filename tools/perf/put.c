/* put_perf: one-sided puts (docs/ONE_SIDED.md). Every rank puts N elements into rank+1's receive
 * window with ncclPutSignal, then waits for rank-1's signal (ncclWaitSignal): the pattern of
 * sendrecv_perf, without the receiver posting anything. Windows are the tool's receive allocations
 * (-R 2, the default here: ncclMemAlloc + ncclCommWindowRegister). busbw = algbw; no in-place form. */
#include <stdlib.h>
#include <string.h>

#include "common.h"

static void init(const perf_buf* b) {
  perf_zero(b->recv, b->count, b->type);
  perf_fill(b->send, b->count, b->type, PERF_COPY, b->seed, 0, b->rank, b->nranks);
}

static int64_t check(const perf_buf* b) {
  int from = (b->rank - 1 + b->nranks) % b->nranks;
  return perf_check_fill(b->recv, b->count, b->type, PERF_COPY, b->seed, 0, from, b->nranks);
}

static ncclResult_t run(const perf_buf* b, ncclRedOp_t op, ncclComm_t comm, cudaStream_t s, int round) {
  (void)op, (void)round;
  if (!b->recv_win) return ncclInvalidUsage; /* main asks for -R 2 */
  int next = (b->rank + 1) % b->nranks, prev = (b->rank - 1 + b->nranks) % b->nranks;
  ncclResult_t r = ncclPutSignal(b->send, b->count, b->type, next, (ncclWindow_t)b->recv_win, b->recv_off, 0, 0, 0,
                                 comm, s);
  ncclWaitSignalDesc_t d = {.opCnt = 1, .peer = prev, .sigIdx = 0, .ctx = 0};
  return r != ncclSuccess ? r : ncclWaitSignal(1, &d, comm, s);
}

static const perf_coll coll = {"put", PERF_NO_INPLACE, perf_layout_flat, perf_bytes_flat, perf_factor_one, init,
                               check, run, NULL};

/* -R 2 unless the command line chooses -R itself. */
int main(int argc, char** argv) {
  for (int i = 1; i < argc; i++)
    if (!strcmp(argv[i], "-R") || !strncmp(argv[i], "--local_register", 16)) return perf_main(argc, argv, &coll);
  char** v = calloc((size_t)argc + 3, sizeof(char*));
  if (!v) return 1;
  v[0] = argv[0], v[1] = "-R", v[2] = "2";
  for (int i = 1; i < argc; i++) v[i + 2] = argv[i];
  int rc = perf_main(argc + 2, v, &coll);
  free(v);
  return rc;
}
