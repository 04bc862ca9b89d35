/* NCCL's binary tree over n nodes (nccl-anchor.md section 8), shared by the Tree algorithms and the
 * communicator's tree builder (core/topo_tree.c). Node 0 is the root and has one child, the largest
 * power of two below n; node r links to (r without its lowest set bit) with the next bit set, or, if
 * that is out of range, to r without its lowest set bit; its children are r -/+ half its lowest bit
 * (the upper one moved down until it exists). */
#include "algo.h"

void algo_btree(int n, int r, int* up, int* d0, int* d1) {
  *up = *d0 = *d1 = -1;
  if (n <= 1 || r < 0 || r >= n) return;
  if (r == 0) {
    int b = 1;
    while (b * 2 < n) b *= 2;
    *d0 = b;
    return;
  }
  int bit = r & -r;
  int p = (r ^ bit) | (bit << 1);
  *up = p < n ? p : r ^ bit;
  int half = bit >> 1;
  if (!half) return;
  *d0 = r - half;
  while (half && r + half >= n) half >>= 1;
  if (half) *d1 = r + half;
}

