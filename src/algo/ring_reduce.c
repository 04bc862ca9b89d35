/* Ring Reduce: a pipeline that starts after the root and ends at it; every rank adds its share. */
#include "algo.h"

uint64_t ring_reduce_nsteps(const struct ch_op* op) {
  return (uint64_t)((op->part_count + op->chunk - 1) / op->chunk);
}

void ring_reduce_step(const struct ch_op* op, uint64_t idx, struct prim* p) {
  int n = op->nranks;
  size_t o = op->part_off + (size_t)idx * op->chunk;
  p->nelem = algo_min(op->chunk, op->part_off + op->part_count - o);
  p->src = op->sendbuff + o * op->esize;
  p->premul = 1;
  int prev = op->ring[algo_mod(op->ring_index - 1, n)];
  if (op->rank == op->root) {
    p->recv = 1, p->reduce = 1, p->postop = 1;
    p->dst = op->recvbuff + o * op->esize;
  } else if (prev == op->root) {
    p->send = 1;
  } else {
    p->recv = 1, p->reduce = 1, p->send = 1;
  }
}
