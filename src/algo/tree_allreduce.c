/* Tree AllReduce (NCCL's double binary tree): the data is split in two halves, each reduced up one
 * tree to its root and broadcast back down it. The trees (tune/trees.c) are binary across hosts
 * with a chain inside each host; the second tree mirrors or shifts the first, so a rank that forwards
 * a lot in one tree is a leaf in the other and both halves move at once. Latency grows with the depth,
 * 2 log2(hosts) + 2 (ranks per host - 1) hops, where the ring takes 2(n-1).
 *
 * Schedule: all up steps (chunk by chunk, tree 0 then tree 1 within a chunk), then all down steps in
 * the same order. Every rank sorts its steps by that same key, so on any connection the two ends meet
 * the steps in one order, even where both trees link the same pair.
 *
 * Up, for tree t and chunk j, with children c0..ck-1:
 *   leaf:      send premul(in) to the parent
 *   otherwise: recvReduceCopy from c0 into acc (with premul(in)), then from c1.. (acc is a partial
 *              result: no premul); the last child's step sends to the parent instead of copying, or
 *              at the root applies the post-op (acc then holds the result).
 * Down: the root sends acc to each child; others receive acc from the parent, passing it to their
 * first child in the same step (recvCopySend) and sending it to the others after. */
#include "algo.h"

/* Trees in use: a vector that fits one step goes up and down one tree (the second would only add
 * messages to every rank's path; bandwidth is not what limits it). All ranks decide alike. */
static int ntrees(const struct ch_op* op) { return op->part_count > op->chunk ? op->ntrees : 1; }

/* Tree 0 carries the first half (rounded up to 8 elements), tree 1 the rest. */
static size_t tree_half(const struct ch_op* op) {
  if (ntrees(op) == 1) return op->part_count;
  return algo_min(op->part_count, ((op->part_count + 1) / 2 + 7) & ~(size_t)7);
}

/* Chunks per tree: both trees take the same number of steps (tree 1's last ones may be empty). */
static uint64_t tree_chunks(const struct ch_op* op) {
  return (uint64_t)((tree_half(op) + op->chunk - 1) / op->chunk);
}

/* First element and length of tree t's chunk j. */
static void tree_part(const struct ch_op* op, int t, uint64_t j, size_t* off, size_t* nelem) {
  size_t half = tree_half(op);
  size_t base = t == 0 ? 0 : half, len = t == 0 ? half : op->part_count - half;
  size_t o = algo_min((size_t)j * op->chunk, len);
  *off = op->part_off + base + o;
  *nelem = algo_min(op->chunk, len - o);
}

static int up_steps(const struct algo_tree* tr) { return tr->ndown ? tr->ndown : 1; }
static int down_steps(const struct algo_tree* tr) { return tr->up < 0 ? tr->ndown : (tr->ndown ? tr->ndown : 1); }

static int phase_steps(const struct ch_op* op, int down) {
  int s = 0;
  for (int t = 0; t < ntrees(op); t++) s += down ? down_steps(&op->trees[t]) : up_steps(&op->trees[t]);
  return s;
}

uint64_t tree_allreduce_nsteps(const struct ch_op* op) {
  if (op->part_count == 0) return 0;
  return tree_chunks(op) * (uint64_t)(phase_steps(op, 0) + phase_steps(op, 1));
}

static void up_step(const struct algo_tree* tr, int s, const char* in, char* acc, struct prim* p) {
  if (tr->ndown == 0) { /* leaf */
    p->send = 1, p->premul = 1, p->src = in, p->out_peer = tr->up;
    return;
  }
  p->recv = 1, p->reduce = 1, p->in_peer = tr->down[s];
  p->premul = s == 0;
  p->src = s == 0 ? in : acc;
  if (s < tr->ndown - 1) {
    p->dst = acc;
  } else if (tr->up >= 0) {
    p->send = 1, p->out_peer = tr->up;
  } else {
    p->dst = acc, p->postop = 1, p->final_dst = 1; /* what the down phase sends */
  }
}

static void down_step(const struct algo_tree* tr, int s, char* acc, struct prim* p) {
  if (tr->up < 0) { /* root: acc holds the result */
    p->send = 1, p->src = acc, p->out_peer = tr->down[s];
    return;
  }
  if (s == 0) {
    p->recv = 1, p->dst = acc, p->in_peer = tr->up;
    if (tr->ndown) p->send = 1, p->out_peer = tr->down[0];
    return;
  }
  p->send = 1, p->src = acc, p->out_peer = tr->down[s];
}

void tree_allreduce_step(const struct ch_op* op, uint64_t idx, struct prim* p) {
  int up = phase_steps(op, 0), down = phase_steps(op, 1);
  uint64_t nup = tree_chunks(op) * (uint64_t)up;
  int is_down = idx >= nup;
  uint64_t k = is_down ? idx - nup : idx;
  int per = is_down ? down : up;
  uint64_t j = k / (uint64_t)per;
  int s = (int)(k % (uint64_t)per), t = 0;
  for (; t < ntrees(op); t++) {
    const struct algo_tree* tr = &op->trees[t];
    int n = is_down ? down_steps(tr) : up_steps(tr);
    if (s < n) break;
    s -= n;
  }
  const struct algo_tree* tr = &op->trees[t];
  size_t off;
  tree_part(op, t, j, &off, &p->nelem);
  const char* in = op->sendbuff + off * op->esize;
  char* acc = op->recvbuff + off * op->esize;
  p->peers = 1;
  if (is_down) down_step(tr, s, acc, p);
  else up_step(tr, s, in, acc, p);
}
