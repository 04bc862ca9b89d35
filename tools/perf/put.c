/* put_perf: one-sided puts (docs/ONE_SIDED.md). Every rank puts N elements into rank+1's receive
 * window with ncclPutSignal once rank+1 has signalled that its window is free, and waits for rank-1's
 * put (ncclWaitSignal): the pattern of sendrecv_perf, where the receiver posts no receive but says
 * when its buffer may be written. Windows are the tool's receive allocations
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
  /* Flow control, as a real pipeline needs it: my window is free (prev may put), then next's is; a put
   * into a window its owner is still filling or checking would be lost. The ready signal of a rank
   * always comes before its put, so one signal index serves both, also when next == prev. */
  ncclWaitSignalDesc_t from_next = {.opCnt = 1, .peer = next, .sigIdx = 0, .ctx = 0};
  ncclWaitSignalDesc_t from_prev = {.opCnt = 1, .peer = prev, .sigIdx = 0, .ctx = 0};
  ncclResult_t r = ncclSignal(prev, 0, 0, 0, comm, s);
  if (r == ncclSuccess) r = ncclWaitSignal(1, &from_next, comm, s);
  if (r == ncclSuccess)
    r = ncclPutSignal(b->send, b->count, b->type, next, (ncclWindow_t)b->recv_win, b->recv_off, 0, 0, 0, comm, s);
  return r != ncclSuccess ? r : ncclWaitSignal(1, &from_prev, comm, s);
}

static const perf_coll coll = {
    "put", PERF_NO_INPLACE, perf_layout_flat, perf_bytes_flat, perf_factor_one, init, check, run, NULL};

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
