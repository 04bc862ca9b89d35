/* Tree Broadcast: the data flows down a binary tree rooted at the root, chunk by chunk: about
 * log2(n) hops where the ring takes n-1, for the same bytes per rank (each rank forwards to at most
 * two children). The tree is NCCL's binary tree (btree.c) over ring positions counted from the root,
 * (algo_rtree_of), so a subtree is a run of consecutive ring positions: mostly ranks of one host, as
 * the ring groups them. Per chunk: the root sends to each child (its first send also copies into recvbuff); another
 * rank receives from its parent into recvbuff, passing it on to its first child in the same step,
 * then sends it to its second child. */
#include "algo.h"

static int tb_per_chunk(const struct algo_rtree* t) {
  if (t->up < 0) return t->ndown ? t->ndown : 1;
  return t->ndown > 1 ? t->ndown : 1;
}

uint64_t tree_broadcast_nsteps(const struct ch_op* op) {
  struct algo_rtree t = algo_rtree_of(op);
  return (uint64_t)((op->part_count + op->chunk - 1) / op->chunk) * (uint64_t)tb_per_chunk(&t);
}

void tree_broadcast_step(const struct ch_op* op, uint64_t idx, struct prim* p) {
  struct algo_rtree t = algo_rtree_of(op);
  uint64_t per = (uint64_t)tb_per_chunk(&t), j = idx / per;
  int s = (int)(idx % per);
  size_t o = op->part_off + (size_t)j * op->chunk;
  p->nelem = algo_min(op->chunk, op->part_off + op->part_count - o);
  char* dst = op->recvbuff + o * op->esize;
  p->peers = 1;
  if (t.up < 0) { /* root: its first send also fills its own recvbuff */
    p->src = op->sendbuff + o * op->esize;
    if (s == 0) p->dst = dst;
    else p->src = dst;
    if (t.ndown) p->send = 1, p->out_peer = t.down[s];
    return;
  }
  if (s == 0) {
    p->recv = 1, p->dst = dst, p->in_peer = t.up;
    if (t.ndown) p->send = 1, p->out_peer = t.down[0];
    return;
  }
  p->send = 1, p->src = dst, p->out_peer = t.down[s];
}

void tree_broadcast_peers(const struct ch_op* op, char* send, char* recv) {
  struct algo_rtree t = algo_rtree_of(op);
  if (t.up >= 0) recv[t.up] = 1;
  for (int c = 0; c < t.ndown; c++) send[t.down[c]] = 1;
}
