/* Tree Reduce: partial results flow up a binary tree rooted at the root, chunk by chunk: about
 * log2(n) hops where the ring takes n-1. The tree is the one Tree Broadcast uses (algo_rtree_of).
 * Per chunk, with children c0, c1:
 *   leaf:        send premul(in) to the parent
 *   one child:   recvReduceSend from c0 with premul(in) to the parent (root: recvReduceCopy, post-op)
 *   two:         recvReduceCopy from c0 with premul(in) into a step of scratch (op->tmp: a non-root rank
 *                may pass no recvbuff), then recvReduceSend from c1 with it to the parent (root: both
 *                into recvbuff, post-op on the second). */
#include "algo.h"

static int tr_per_chunk(const struct algo_rtree* t) { return t->ndown > 1 ? t->ndown : 1; }

uint64_t tree_reduce_nsteps(const struct ch_op* op) {
  struct algo_rtree t = algo_rtree_of(op);
  return (uint64_t)((op->part_count + op->chunk - 1) / op->chunk) * (uint64_t)tr_per_chunk(&t);
}

void tree_reduce_step(const struct ch_op* op, uint64_t idx, struct prim* p) {
  struct algo_rtree t = algo_rtree_of(op);
  uint64_t per = (uint64_t)tr_per_chunk(&t), j = idx / per;
  int s = (int)(idx % per);
  size_t o = op->part_off + (size_t)j * op->chunk;
  p->nelem = algo_min(op->chunk, op->part_off + op->part_count - o);
  const char* in = op->sendbuff + o * op->esize;
  char* acc = t.up < 0 ? op->recvbuff + o * op->esize : op->tmp; /* the root reduces in place */
  p->peers = 1;
  if (t.ndown == 0) { /* leaf */
    p->send = 1, p->premul = 1, p->src = in, p->out_peer = t.up;
    return;
  }
  p->recv = 1, p->reduce = 1, p->in_peer = t.down[s];
  p->premul = s == 0;
  p->src = s == 0 ? in : acc;
  if (s < t.ndown - 1) {
    p->dst = acc;
  } else if (t.up >= 0) {
    p->send = 1, p->out_peer = t.up;
  } else {
    p->dst = acc, p->postop = 1;
  }
}

void tree_reduce_peers(const struct ch_op* op, char* send, char* recv) {
  struct algo_rtree t = algo_rtree_of(op);
  if (t.up >= 0) send[t.up] = 1;
  for (int c = 0; c < t.ndown; c++) recv[t.down[c]] = 1;
}
