/* Ring Broadcast: a pipeline from the root along the ring; the rank before the root only receives. */
#include "algo.h"

uint64_t ring_broadcast_nsteps(const struct ch_op* op) {
  return (uint64_t)((op->part_count + op->chunk - 1) / op->chunk);
}

void ring_broadcast_step(const struct ch_op* op, uint64_t idx, struct prim* p) {
  int n = op->nranks;
  size_t o = op->part_off + (size_t)idx * op->chunk;
  p->nelem = algo_min(op->chunk, op->part_off + op->part_count - o);
  p->dst = op->recvbuff + o * op->esize;
  int next = op->ring[(op->ring_index + 1) % n];
  if (op->rank == op->root) {
    p->src = op->sendbuff + o * op->esize;
    p->send = 1;
  } else {
    p->recv = 1;
    p->send = next != op->root;
  }
}
