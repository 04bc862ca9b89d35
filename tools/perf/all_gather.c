/* all_gather_perf: ncclAllGather of b elements per rank (b = size/n, rounded down to 16 bytes).
 * Size and algbw count the gathered n*b elements; busbw = algbw * (n-1)/n. */
#include "common.h"

static void layout(size_t count, int n, int elt, perf_layout* l) {
  size_t b = perf_per_rank_count(count, n, elt);
  l->send_count = l->param_count = b;
  l->recv_count = b * (size_t)n;
  l->send_inplace = b; /* in place: send = recv + rank*b */
  l->recv_inplace = 0;
}

static void init(const perf_buf* b) {
  perf_zero(b->recv_base, b->lay.recv_count, b->type); /* first: in place the input lies inside */
  perf_fill(b->send, b->count, b->type, PERF_COPY, b->seed, (size_t)b->rank * b->count, b->rank, b->nranks);
}

static int64_t check(const perf_buf* b) {
  int64_t wrong = 0;
  for (int q = 0; q < b->nranks; q++)
    wrong += perf_check_fill(perf_at(b->recv, (size_t)q * b->count, b->type), b->count, b->type, PERF_COPY, b->seed,
                             (size_t)q * b->count, q, b->nranks);
  return wrong;
}

static ncclResult_t run(const perf_buf* b, ncclRedOp_t op, ncclComm_t comm, cudaStream_t s, int round) {
  (void)op, (void)round;
  return ncclAllGather(b->send, b->recv, b->count, b->type, comm, s);
}

static const perf_coll coll = {"all_gather", 0, layout, perf_bytes_ranks, perf_factor_ring, init, check, run, NULL};

int main(int argc, char** argv) { return perf_main(argc, argv, &coll); }
