/* sendrecv_perf: every rank sends N elements to rank+1 and receives from rank-1 in one group.
 * busbw = algbw. In place is timed but not checked (N/A), as in nccl-tests. */
#include "common.h"

static void init(const perf_buf* b) {
  if (!b->in_place) perf_zero(b->recv, b->count, b->type);
  perf_fill(b->send, b->count, b->type, PERF_COPY, b->seed, 0, b->rank, b->nranks);
}

static int64_t check(const perf_buf* b) {
  if (b->in_place) return -1;
  int from = (b->rank - 1 + b->nranks) % b->nranks;
  return perf_check_fill(b->recv, b->count, b->type, PERF_COPY, b->seed, 0, from, b->nranks);
}

static ncclResult_t run(const perf_buf* b, ncclRedOp_t op, ncclComm_t comm, cudaStream_t s, int round) {
  (void)op, (void)round;
  ncclResult_t r, e;
  if ((r = ncclGroupStart()) != ncclSuccess) return r;
  r = ncclSend(b->send, b->count, b->type, (b->rank + 1) % b->nranks, comm, s);
  if (r == ncclSuccess) r = ncclRecv(b->recv, b->count, b->type, (b->rank - 1 + b->nranks) % b->nranks, comm, s);
  e = ncclGroupEnd();
  return r != ncclSuccess ? r : e;
}

static const perf_coll coll = {"sendrecv", PERF_USES_OP, perf_layout_flat, perf_bytes_flat, perf_factor_one, init,
                               check, run, NULL};

int main(int argc, char** argv) { return perf_main(argc, argv, &coll); }
