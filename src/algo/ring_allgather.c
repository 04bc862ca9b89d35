/* Ring AllGather: every rank's block travels once around the ring.
 * Per piece: copySend (own block), (n-2) x recvCopySend, recv. Blocks are placed by owner rank. */
#include "algo.h"

uint64_t ring_allgather_nsteps(const struct ch_op* op) {
  return (uint64_t)((op->part_count + op->chunk - 1) / op->chunk) * (uint64_t)op->nranks;
}

void ring_allgather_step(const struct ch_op* op, uint64_t idx, struct prim* p) {
  int n = op->nranks, pos = op->ring_index;
  uint64_t l = idx / (uint64_t)n;
  int s = (int)(idx % (uint64_t)n);
  size_t o = op->part_off + (size_t)l * op->chunk;
  p->nelem = algo_min(op->chunk, op->part_off + op->part_count - o);
  int owner = op->ring[algo_mod(pos - s, n)];
  p->dst = op->recvbuff + ((size_t)owner * op->count + o) * op->esize;
  if (s == 0) {
    p->src = op->sendbuff + o * op->esize;
    p->send = 1;
  } else {
    p->recv = 1;
    p->send = s < n - 1;
  }
}
