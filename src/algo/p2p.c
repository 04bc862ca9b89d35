/* Send/Recv: the data crosses the peer connection one step at a time. AlltoAll, Gather and Scatter are
 * groups of these (built by the enqueue layer). A rank alone does its collective as one local copy. */
#include "algo.h"

uint64_t p2p_nsteps(const struct ch_op* op) {
  uint64_t n = (op->part_count + op->chunk - 1) / op->chunk;
  return n ? n : 1; /* a zero-byte message still takes one step so both sides agree */
}

void p2p_step(const struct ch_op* op, uint64_t idx, struct prim* p) {
  size_t o = op->part_off + (size_t)idx * op->chunk;
  p->nelem = o < op->part_off + op->part_count ? algo_min(op->chunk, op->part_off + op->part_count - o) : 0;
  if (op->func == FUNC_SEND) {
    p->send = 1;
    p->src = op->sendbuff + o * op->esize;
  } else {
    p->recv = 1;
    p->dst = op->recvbuff + o * op->esize;
  }
}

uint64_t local_nsteps(const struct ch_op* op) { return op->part_count ? 1 : 0; }

void local_step(const struct ch_op* op, uint64_t idx, struct prim* p) {
  (void)idx;
  int reduces = op->func == FUNC_ALLREDUCE || op->func == FUNC_REDUCE || op->func == FUNC_REDUCESCATTER;
  p->nelem = op->part_count;
  p->src = op->sendbuff + op->part_off * op->esize;
  p->dst = op->recvbuff + op->part_off * op->esize;
  p->premul = reduces;
  p->postop = reduces;
}
