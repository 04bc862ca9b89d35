/* Ranks of a power-of-two algorithm (recdbl_allreduce.c, raben_allreduce.c) when n is not a power of
 * two: with p the largest power of two <= n and r = n - p, each even rank below 2r folds into the
 * odd rank above it (hands it its vector, gets the result back) and sits out; the odd ones and the
 * ranks from 2r up take part as virtual ranks 0..p-1. */
#include "algo.h"

struct algo_pof2 algo_pof2_of(int rank, int n) {
  struct algo_pof2 r = {1, 0, -1, -1};
  while (r.p * 2 <= n) r.p *= 2, r.log++;
  int extra = n - r.p;
  if (rank < 2 * extra) {
    r.fold = rank ^ 1;
    r.vrank = rank & 1 ? rank / 2 : -1;
  } else {
    r.vrank = rank - extra;
  }
  return r;
}

int algo_pof2_rank(int vrank, int n, int p) {
  int extra = n - p;
  return vrank < extra ? 2 * vrank + 1 : vrank + extra;
}

/* Binomial tree over the participants, rooted at `root` (Tree Broadcast and Reduce). In u = v ^ s
 * space, s the virtual rank of the root (or of the participant an extra root folds into), a node's
 * parent clears u's highest set bit and its children set each bit above it: every link joins two
 * virtual ranks that differ in one bit, the pairs recursive doubling links. */
struct algo_binom algo_binom_of(int rank, int n, int root) {
  struct algo_pof2 me = algo_pof2_of(rank, n), rt = algo_pof2_of(root, n);
  struct algo_binom b = {.parent = -1, .nchild = 0, .extra = -1, .fold = me.fold, .is_extra = me.vrank < 0};
  int root_extra = rt.vrank < 0;
  if (b.is_extra) { /* the root hands its data to the rank it folds into; others get theirs from it */
    if (rank == root) b.child[b.nchild++] = me.fold;
    else b.parent = me.fold;
    return b;
  }
  int s = root_extra ? algo_pof2_of(rt.fold, n).vrank : rt.vrank, u = me.vrank ^ s, hb = -1;
  for (int k = 0; k < me.log; k++)
    if (u >> k & 1) hb = k;
  if (u) b.parent = algo_pof2_rank((u & ~(1 << hb)) ^ s, n, me.p);
  else if (root_extra) b.parent = root; /* the extra root hands its data to us first */
  for (int k = me.log - 1; k > hb; k--) b.child[b.nchild++] = algo_pof2_rank((u | 1 << k) ^ s, n, me.p);
  if (me.fold >= 0 && me.fold != root) b.extra = me.fold;
  return b;
}
