/* Tree Reduce: partial results flow up the binomial tree of Tree Broadcast (pof2.c), chunk by chunk.
 * Per chunk a rank reduces what its sources send (the extra rank it serves first, then its children,
 * smallest subtree first, as those finish first) into an accumulator and hands the result to its
 * parent with the last of them (recvReduceSend); the root applies the post-op instead. The
 * accumulator is recvbuff at the root and otherwise a step of scratch (op->tmp): ranks other than
 * the root may pass no recvbuff. A rank with no source sends premul(its input). An extra rank that is
 * the root first hands its input to the rank it folds into, then receives the total (post-op then). */
#include "algo.h"

/* The extra rank whose input this participant takes first: the one it serves, or the root if the
 * root is an extra rank folded into it (which then gets the total back); -1: none. */
static int fold_source(const struct algo_binom* b, int root) {
  if (b->is_extra) return -1;
  return b->extra >= 0 ? b->extra : (b->fold >= 0 && b->fold == root ? b->fold : -1);
}

/* The i-th source: that extra rank, then children from the smallest subtree; -1 past them. */
static int source(const struct algo_binom* b, int root, int i) {
  int ex = fold_source(b, root);
  if (ex >= 0 && i-- == 0) return ex;
  return i < b->nchild ? b->child[b->nchild - 1 - i] : -1;
}

static int nsources(const struct algo_binom* b, int root) { return b->nchild + (fold_source(b, root) >= 0); }

static int per_chunk(const struct algo_binom* b, int is_root, int root) {
  if (b->is_extra) return is_root ? 2 : 1;
  int k = nsources(b, root);
  return k ? k : 1;
}

uint64_t tree_reduce_nsteps(const struct ch_op* op) {
  struct algo_binom b = algo_binom_of(op->rank, op->nranks, op->root);
  return (uint64_t)((op->part_count + op->chunk - 1) / op->chunk) *
         (uint64_t)per_chunk(&b, op->rank == op->root, op->root);
}

void tree_reduce_step(const struct ch_op* op, uint64_t idx, struct prim* p) {
  int root = op->rank == op->root;
  struct algo_binom b = algo_binom_of(op->rank, op->nranks, op->root);
  uint64_t per = (uint64_t)per_chunk(&b, root, op->root), j = idx / per;
  int s = (int)(idx % per);
  size_t o = op->part_off + (size_t)j * op->chunk;
  p->nelem = algo_min(op->chunk, op->part_off + op->part_count - o);
  const char* in = op->sendbuff + o * op->esize;
  char* acc = root ? op->recvbuff + o * op->esize : op->tmp;
  p->peers = 1;
  if (b.is_extra) { /* hand over the input; the root then takes back the total */
    if (s == 0) p->send = 1, p->premul = 1, p->src = in, p->out_peer = b.fold;
    else p->recv = 1, p->postop = 1, p->dst = acc, p->in_peer = b.fold;
    return;
  }
  int k = nsources(&b, op->root);
  if (k == 0) { /* a leaf */
    p->send = 1, p->premul = 1, p->src = in, p->out_peer = b.parent;
    return;
  }
  p->recv = 1, p->reduce = 1, p->in_peer = source(&b, op->root, s);
  p->premul = s == 0;
  p->src = s == 0 ? in : acc;
  if (s < k - 1) {
    p->dst = acc;
  } else if (b.parent >= 0) { /* an extra root's partner sends the total back to it, post-op undone */
    p->send = 1, p->out_peer = b.parent;
  } else {
    p->dst = acc, p->postop = 1;
  }
}
