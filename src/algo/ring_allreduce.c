/* Ring AllReduce: reduce-scatter around the ring, then all-gather the reduced blocks.
 * Each loop moves nranks blocks of up to `chunk` elements in 2*nranks-1 primitive steps:
 *   send, (n-2) x recvReduceSend, recvReduceCopySend (block done, post-op), (n-2) x recvCopySend, recv. */
#include "algo.h"

uint64_t ring_allreduce_nsteps(const struct ch_op* op) {
  size_t loop = (size_t)op->nranks * op->chunk;
  return (uint64_t)((op->part_count + loop - 1) / loop) * (uint64_t)(2 * op->nranks - 1);
}

void ring_allreduce_step(const struct ch_op* op, uint64_t idx, struct prim* p) {
  int n = op->nranks, per = 2 * n - 1, pos = op->ring_index;
  uint64_t l = idx / (uint64_t)per;
  int s = (int)(idx % (uint64_t)per);
  size_t loop = (size_t)n * op->chunk;
  size_t base = (size_t)l * loop, rem = algo_min(loop, op->part_count - base);
  size_t blk = (rem + n - 1) / n;
  blk = algo_min(op->chunk, (blk + 7) & ~(size_t)7);

  int b; /* block index (by ring position) this step works on */
  if (s == 0) {
    b = pos - 1;
    p->send = 1, p->premul = 1;
  } else if (s < n - 1) {
    b = pos - 1 - s;
    p->recv = 1, p->reduce = 1, p->premul = 1, p->send = 1;
  } else if (s == n - 1) {
    b = pos;
    p->recv = 1, p->reduce = 1, p->premul = 1, p->postop = 1, p->send = 1;
  } else if (s < 2 * n - 2) {
    b = pos - (s - n + 1);
    p->recv = 1, p->send = 1;
  } else {
    b = pos + 1;
    p->recv = 1;
  }
  b = algo_mod(b, n);
  size_t off = (size_t)b * blk;
  p->nelem = off < rem ? algo_min(blk, rem - off) : 0;
  size_t at = (op->part_off + base + (off < rem ? off : rem)) * op->esize;
  p->src = op->sendbuff + at;
  /* Reduce-scatter steps before the block is final only forward data; they write nothing locally. */
  p->dst = (s >= n - 1) ? op->recvbuff + at : NULL;
}
