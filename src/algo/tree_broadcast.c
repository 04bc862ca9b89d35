/* Tree Broadcast: the data flows down a binomial tree from the root (pof2.c), chunk by chunk:
 * log2(n) hops where the ring takes n-1 (two more when n is not a power of two and an extra rank is
 * the root or gets served last). Its links are the pairs recursive doubling uses, connected with the
 * rings (algo_peer_set), so the root, which every rank may name differently, never decides which
 * connections exist.
 * Per chunk, a rank receives from its parent into recvbuff (passing it to its first child in the
 * same step), then sends it to its other children, largest subtree first, then to the extra rank it
 * serves. The root sends from sendbuff, its first send also filling its own recvbuff. */
#include "algo.h"

/* The i-th destination of this rank's sends per chunk: children, then the extra rank; -1 past them. */
static int dest(const struct algo_binom* b, int i) {
  if (i < b->nchild) return b->child[i];
  return i == b->nchild ? b->extra : -1;
}

static int ndest(const struct algo_binom* b) { return b->nchild + (b->extra >= 0); }

/* Steps per chunk: the receive shares a step with the first send. */
static int per_chunk(const struct algo_binom* b) {
  int k = ndest(b);
  return k ? k : 1;
}

uint64_t tree_broadcast_nsteps(const struct ch_op* op) {
  struct algo_binom b = algo_binom_of(op->rank, op->nranks, op->root);
  return (uint64_t)((op->part_count + op->chunk - 1) / op->chunk) * (uint64_t)per_chunk(&b);
}

void tree_broadcast_step(const struct ch_op* op, uint64_t idx, struct prim* p) {
  struct algo_binom b = algo_binom_of(op->rank, op->nranks, op->root);
  uint64_t per = (uint64_t)per_chunk(&b), j = idx / per;
  int s = (int)(idx % per);
  size_t o = op->part_off + (size_t)j * op->chunk;
  p->nelem = algo_min(op->chunk, op->part_off + op->part_count - o);
  char* dst = op->recvbuff + o * op->esize;
  p->peers = 1;
  int to = dest(&b, s);
  if (to >= 0) p->send = 1, p->out_peer = to;
  if (s > 0) {
    p->src = dst;
  } else if (b.parent >= 0) {
    p->recv = 1, p->in_peer = b.parent, p->dst = dst;
  } else { /* the root: its first send also fills its recvbuff */
    p->src = op->sendbuff + o * op->esize, p->dst = dst;
  }
}
