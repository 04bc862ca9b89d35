/* scatter_perf: ncclScatter of b elements per rank from -r. busbw = algbw * (n-1)/n. */
#include "common.h"

static void init(const perf_buf* b) {
  if (b->rank == b->root) {
    perf_fill(b->send, b->lay.send_count, b->type, PERF_COPY, b->seed, 0, b->root, b->nranks);
  } else if (b->in_place) {
    perf_zero(b->send, b->lay.send_count, b->type); /* our receive slice lies inside */
  }
  if (!b->in_place) perf_zero(b->recv, b->count, b->type);
}

static int64_t check(const perf_buf* b) {
  return perf_check_fill(b->recv, b->count, b->type, PERF_COPY, b->seed, (size_t)b->rank * b->count, b->root,
                         b->nranks);
}

static ncclResult_t run(const perf_buf* b, ncclRedOp_t op, ncclComm_t comm, cudaStream_t s, int round) {
  (void)op, (void)round;
  return ncclScatter(b->send, b->recv, b->count, b->type, b->root, comm, s);
}

static const perf_coll coll = {"scatter", PERF_USES_ROOT, perf_layout_scatter, perf_bytes_ranks, perf_factor_ring, init,
                               check, run, NULL};

int main(int argc, char** argv) { return perf_main(argc, argv, &coll); }
