/* alltoall_perf: ncclAlltoAll, b elements from every rank to every rank. busbw = algbw * (n-1)/n.
 * In place is timed but not checked (N/A), as in nccl-tests. */
#include "common.h"

static void layout(size_t count, int n, int elt, perf_layout* l) {
  size_t b = perf_per_rank_count(count, n, elt);
  l->param_count = b;
  l->send_count = l->recv_count = b * (size_t)n;
  l->send_inplace = l->recv_inplace = 0;
}

/* The block rank r sends to peer p is generated from (index p*b + i, rank r). */
static void init(const perf_buf* b) {
  if (!b->in_place) perf_zero(b->recv, b->lay.recv_count, b->type);
  for (int p = 0; p < b->nranks; p++)
    perf_fill(perf_at(b->send, (size_t)p * b->count, b->type), b->count, b->type, PERF_COPY, b->seed,
              (size_t)p * b->count, b->rank, b->nranks);
}

static int64_t check(const perf_buf* b) {
  if (b->in_place) return -1;
  int64_t wrong = 0;
  for (int q = 0; q < b->nranks; q++)
    wrong += perf_check_fill(perf_at(b->recv, (size_t)q * b->count, b->type), b->count, b->type, PERF_COPY, b->seed,
                             (size_t)b->rank * b->count, q, b->nranks);
  return wrong;
}

static ncclResult_t run(const perf_buf* b, ncclRedOp_t op, ncclComm_t comm, cudaStream_t s, int round) {
  (void)op, (void)round;
  return ncclAlltoAll(b->send, b->recv, b->count, b->type, comm, s);
}

static const perf_coll coll = {"alltoall", 0, layout, perf_bytes_ranks, perf_factor_ring, init, check, run, NULL};

int main(int argc, char** argv) { return perf_main(argc, argv, &coll); }
