/* Ring ReduceScatter: block b (destined for rank b) starts at the rank after b and is reduced by
 * every rank on its way round; rank b adds its own share last and keeps the result.
 * Per piece: send, (n-2) x recvReduceSend, recvReduceCopy. */
#include "algo.h"

uint64_t ring_reducescatter_nsteps(const struct ch_op* op) {
  return (uint64_t)((op->part_count + op->chunk - 1) / op->chunk) * (uint64_t)op->nranks;
}

void ring_reducescatter_step(const struct ch_op* op, uint64_t idx, struct prim* p) {
  int n = op->nranks, pos = op->ring_index;
  uint64_t l = idx / (uint64_t)n;
  int s = (int)(idx % (uint64_t)n);
  size_t o = op->part_off + (size_t)l * op->chunk;
  p->nelem = algo_min(op->chunk, op->part_off + op->part_count - o);
  int owner = op->ring[algo_mod(pos - 1 - s, n)];
  p->src = op->sendbuff + ((size_t)owner * op->count + o) * op->esize;
  p->premul = 1;
  if (s == 0) {
    p->send = 1;
  } else if (s < n - 1) {
    p->recv = 1, p->reduce = 1, p->send = 1;
  } else {
    p->recv = 1, p->reduce = 1, p->postop = 1;
    p->dst = op->recvbuff + o * op->esize;
  }
}
