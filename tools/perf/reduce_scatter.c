/* reduce_scatter_perf: ncclReduceScatter; each rank gets b reduced elements of the n*b input.
 * Size and algbw count the n*b elements; busbw = algbw * (n-1)/n. */
#include "common.h"

static void init(const perf_buf* b) {
  if (!b->in_place) perf_zero(b->recv, b->count, b->type);
  perf_fill(b->send, b->lay.send_count, b->type, b->op, b->seed, 0, b->rank, b->nranks);
}

static int64_t check(const perf_buf* b) {
  return perf_check_reduced(b->recv, b->count, b->type, b->op, b->seed, (size_t)b->rank * b->count, b->nranks);
}

static ncclResult_t run(const perf_buf* b, ncclRedOp_t op, ncclComm_t comm, cudaStream_t s, int round) {
  (void)round;
  return ncclReduceScatter(b->send, b->recv, b->count, b->type, op, comm, s);
}

static const perf_coll coll = {"reduce_scatter", PERF_USES_OP, perf_layout_scatter, perf_bytes_ranks, perf_factor_ring,
                               init, check, run, NULL};

int main(int argc, char** argv) { return perf_main(argc, argv, &coll); }
