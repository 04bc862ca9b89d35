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
