/* reduce_perf: ncclReduce to -r. Only the root's receive buffer may change: the others must find
 * theirs untouched (zeros out of place, their own input in place). busbw = algbw. */
#include "common.h"

static void init(const perf_buf* b) {
  if (!b->in_place) perf_zero(b->recv, b->count, b->type);
  perf_fill(b->send, b->count, b->type, b->op, b->seed, 0, b->rank, b->nranks);
}

static int64_t check(const perf_buf* b) {
  if (b->rank == b->root) return perf_check_reduced(b->recv, b->count, b->type, b->op, b->seed, 0, b->nranks);
  if (b->in_place) return perf_check_fill(b->recv, b->count, b->type, b->op, b->seed, 0, b->rank, b->nranks);
  return perf_check_zero(b->recv, b->count, b->type);
}

static ncclResult_t run(const perf_buf* b, ncclRedOp_t op, ncclComm_t comm, cudaStream_t s, int round) {
  (void)round;
  return ncclReduce(b->send, b->recv, b->count, b->type, op, b->root, comm, s);
}

static const perf_coll coll = {"reduce", PERF_USES_OP | PERF_USES_ROOT, perf_layout_flat, perf_bytes_flat,
                               perf_factor_one, init, check, run, NULL};

int main(int argc, char** argv) { return perf_main(argc, argv, &coll); }
