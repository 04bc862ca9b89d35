/* Exchange AllReduce for two ranks: each rank sends its whole buffer to the other and reduces what
 * it receives with its own data. One hop instead of the ring's two, so half the latency for small
 * messages, and the same bytes on the wire as the ring for large ones. Both ranks compute a (+) b
 * with two operands, which is commutative, so they get bit-identical results.
 * Step order sends one chunk ahead: S0, S1, R0, S2, R1, ..., R(c-1). A chunk is always sent before
 * it is overwritten, so in-place works. */
#include "algo.h"

uint64_t exchange_allreduce_nsteps(const struct ch_op* op) {
  return 2 * (uint64_t)((op->part_count + op->chunk - 1) / op->chunk);
}

void exchange_allreduce_step(const struct ch_op* op, uint64_t idx, struct prim* p) {
  uint64_t c = (op->part_count + op->chunk - 1) / op->chunk, j;
  int send;
  if (idx == 0) {
    send = 1, j = 0;
  } else {
    uint64_t m = (idx - 1) / 2;
    send = (idx - 1) % 2 == 0 && m + 1 < c;
    j = send ? m + 1 : m;
  }
  size_t o = op->part_off + (size_t)j * op->chunk;
  p->nelem = algo_min(op->chunk, op->part_off + op->part_count - o);
  p->src = op->sendbuff + o * op->esize;
  p->premul = 1;
  if (send) {
    p->send = 1;
  } else {
    p->recv = 1, p->reduce = 1, p->postop = 1;
    p->dst = op->recvbuff + o * op->esize;
  }
}
