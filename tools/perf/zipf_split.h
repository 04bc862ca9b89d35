/* The blocks of alltoallv_perf's exchange (tools/perf/alltoallv.c), shared with the Open MPI baseline
 * (tools/baselines/mpi_alltoallv_bench.c) so both time one exchange: a rank's `total` elements split
 * over ring distances 0..n-1, by a Zipf weight 1/(k+1) for the k that a seeded shuffle gives each
 * distance (zipf), or alike (total/n each). The sum is exactly total. Header-only: the baseline is built
 * by hand with mpicc. */
#ifndef CHORUS_PERF_ZIPF_SPLIT_H
#define CHORUS_PERF_ZIPF_SPLIT_H

#include <stdint.h>
#include <stdlib.h>

static inline uint64_t split_mix(uint64_t x) { /* splitmix64's finalizer: a seeded shuffle with no libc state */
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

static inline void split_blocks(size_t total, int n, int zipf, unsigned seed, size_t* by_dist) {
  if (!zipf) {
    for (int d = 0; d < n; d++) by_dist[d] = total / (size_t)n;
    by_dist[0] += total % (size_t)n;
    return;
  }
  int* rank_of = malloc(sizeof(int) * (size_t)n); /* the Zipf rank of each distance */
  if (!rank_of) abort();
  for (int d = 0; d < n; d++) rank_of[d] = d;
  for (int d = n - 1; d > 0; d--) { /* Fisher-Yates */
    int k = (int)(split_mix(((uint64_t)seed << 32) | (uint64_t)d) % (uint64_t)(d + 1));
    int t = rank_of[d];
    rank_of[d] = rank_of[k], rank_of[k] = t;
  }
  double wsum = 0;
  for (int k = 0; k < n; k++) wsum += 1.0 / (k + 1);
  size_t given = 0;
  int heavy = 0;
  for (int d = 0; d < n; d++) {
    by_dist[d] = (size_t)((double)total / ((rank_of[d] + 1) * wsum));
    given += by_dist[d];
    if (rank_of[d] == 0) heavy = d;
  }
  by_dist[heavy] += total - given; /* rounding: the sum is exactly total */
  free(rank_of);
}

#endif
