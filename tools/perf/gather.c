/* gather_perf: ncclGather of b elements per rank to -r. busbw = algbw * (n-1)/n. Ranks other than
 * the root must find their receive buffer untouched. */
#include "common.h"

static int64_t check(const perf_buf* b) {
  size_t n = b->count, r = (size_t)b->rank;
  int64_t wrong = 0;
  if (b->rank == b->root) return perf_check_gathered(b);
  if (!b->in_place) return perf_check_zero(b->recv, b->lay.recv_count, b->type);
  /* In place on a non-root rank: zeros around our own input. */
  wrong += perf_check_zero(b->recv, r * n, b->type);
  wrong += perf_check_fill(perf_at(b->recv, r * n, b->type), n, b->type, PERF_COPY, b->seed, r * n, b->rank, b->nranks);
  wrong += perf_check_zero(perf_at(b->recv, (r + 1) * n, b->type), b->lay.recv_count - (r + 1) * n, b->type);
  return wrong;
}

static ncclResult_t run(const perf_buf* b, ncclRedOp_t op, ncclComm_t comm, cudaStream_t s, int round) {
  (void)op, (void)round;
  return ncclGather(b->send, b->recv, b->count, b->type, b->root, comm, s);
}

static const perf_coll coll = {"gather", PERF_USES_ROOT, perf_layout_gather, perf_bytes_ranks, perf_factor_ring,
                               perf_init_gathered, check, run, NULL};

int main(int argc, char** argv) { return perf_main(argc, argv, &coll); }
