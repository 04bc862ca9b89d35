/* hypercube_perf: an allgather built from lg(n) rounds of grouped ncclSend/ncclRecv with the peer
 * rank^mask, each round exchanging everything gathered so far (power-of-two rank counts only).
 * algbw counts the (n-1)*b elements received; busbw = algbw. */
#include <string.h>

#include "common.h"

static double alg_bytes(size_t count, int elt, int n) { return (double)count * elt * (n - 1); }

static int nrounds(int n) {
  int r = 0;
  while ((1 << r) < n) r++;
  return r ? r : 1;
}

/* Round r exchanges the 2^r blocks we hold with the 2^r blocks of rank^2^r. The harness puts each
 * round in its own group, so a round only sends what earlier rounds received. */
static ncclResult_t run(const perf_buf* b, ncclRedOp_t op, ncclComm_t comm, cudaStream_t s, int round) {
  (void)op;
  size_t bytes = b->count * (size_t)perf_type_size(b->type);
  ncclResult_t r, e;
  if (round == 0) {
    char* mine = perf_at(b->recv, (size_t)b->rank * b->count, b->type);
    if (mine != b->send && (r = perf_copy(mine, b->send, bytes, s)) != ncclSuccess) return r;
  }
  int mask = 1 << round;
  if (mask >= b->nranks) return ncclSuccess;
  int peer = b->rank ^ mask, lo = b->rank & ~(mask - 1), plo = lo ^ mask;
  size_t n = b->count * (size_t)mask;
  if ((r = ncclGroupStart()) != ncclSuccess) return r;
  r = ncclSend(perf_at(b->recv, (size_t)lo * b->count, b->type), n, b->type, peer, comm, s);
  if (r == ncclSuccess) r = ncclRecv(perf_at(b->recv, (size_t)plo * b->count, b->type), n, b->type, peer, comm, s);
  e = ncclGroupEnd();
  return r != ncclSuccess ? r : e;
}

static const perf_coll coll = {"hypercube", PERF_POW2_ONLY | PERF_OP_BLANK, perf_layout_gather, alg_bytes,
                               perf_factor_one, perf_init_gathered, perf_check_gathered, run, nrounds};

int main(int argc, char** argv) { return perf_main(argc, argv, &coll); }
