/* all_gather_perf: ncclAllGather of b elements per rank (b = size/n, rounded down to 16 bytes).
 * Size and algbw count the gathered n*b elements; busbw = algbw * (n-1)/n. */
#include "common.h"

static ncclResult_t run(const perf_buf* b, ncclRedOp_t op, ncclComm_t comm, cudaStream_t s, int round) {
  (void)op, (void)round;
  return ncclAllGather(b->send, b->recv, b->count, b->type, comm, s);
}

static const perf_coll coll = {"all_gather", 0, perf_layout_gather, perf_bytes_ranks, perf_factor_ring,
                               perf_init_gathered, perf_check_gathered, run, NULL};

int main(int argc, char** argv) { return perf_main(argc, argv, &coll); }
