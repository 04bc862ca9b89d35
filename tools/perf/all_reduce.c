/* all_reduce_perf: ncclAllReduce. busbw = algbw * 2(n-1)/n: each element crosses 2(n-1) of n links. */
#include "common.h"

static double factor(int n) { return 2.0 * (n - 1) / n; }

static void init(const perf_buf* b) {
  if (!b->in_place) perf_zero(b->recv, b->count, b->type);
  perf_fill(b->send, b->count, b->type, b->op, b->seed, 0, b->rank, b->nranks);
}

static int64_t check(const perf_buf* b) {
  return perf_check_reduced(b->recv, b->count, b->type, b->op, b->seed, 0, b->nranks);
}

static ncclResult_t run(const perf_buf* b, ncclRedOp_t op, ncclComm_t comm, cudaStream_t s, int round) {
  (void)round;
  return ncclAllReduce(b->send, b->recv, b->count, b->type, op, comm, s);
}

static const perf_coll coll = {"all_reduce", PERF_USES_OP, perf_layout_flat, perf_bytes_flat, factor,
                               init, check, run, NULL};

int main(int argc, char** argv) { return perf_main(argc, argv, &coll); }
