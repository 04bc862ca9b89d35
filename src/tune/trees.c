/* The two trees of Tree AllReduce, built as NCCL builds them (NCCL's src/graph/trees.cc): binary trees
 * over hosts, a chain over the ranks inside each host. The first tree numbers hosts 0..H-1 and links
 * each to the host that differs in the next bit above its lowest set bit; the second mirrors it (H even)
 * or shifts it by one (H odd), so that most hosts forwarding in one tree are leaves in the other.
 * Every rank computes the same trees from the host table exchanged at init. */
#include <stdint.h>
#include <stdlib.h>

#include "../misc/log.h"
#include "../misc/param.h"
#include "../comm/comm.h"
#include "topo.h"

void topo_btree(int n, int r, int* up, int* d0, int* d1) {
  *up = *d0 = *d1 = -1;
  if (n <= 1 || r < 0 || r >= n) return;
  if (r == 0) { /* the root's only child: the largest power of two below n */
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
  while (half && r + half >= n) half >>= 1; /* the upper child moves down until it exists */
  if (half) *d1 = r + half;
}

void topo_dtree(int n, int r, int t, int* up, int* d0, int* d1) {
  if (t == 0 || n <= 1) return topo_btree(n, r, up, d0, d1);
  int m = n % 2 == 0 ? n - 1 - r : (r - 1 + n) % n;
  topo_btree(n, m, up, d0, d1);
  int* v[3] = {up, d0, d1};
  for (int i = 0; i < 3; i++)
    if (*v[i] >= 0) *v[i] = n % 2 == 0 ? n - 1 - *v[i] : (*v[i] + 1) % n;
}

/* Ranks grouped by host as the rings group them (topo_ring_order_fill: hosts by lowest rank, ranks
 * ascending), or each rank alone with CHORUS_TREE_PER_RANK: the node of each rank, the first rank of
 * each node, and each rank's next rank in its node's chain (-1 at the end). */
static int nodes_of(const struct ncclComm* comm, int per_rank, uint64_t* host, int* order, int* node, int* head,
                    int* next) {
  int n = comm->nranks, nn = 0;
  for (int r = 0; r < n; r++) host[r] = per_rank ? (uint64_t)r : comm->peers[r].host_hash;
  topo_ring_order_fill(n, host, TOPO_ORDER_HOSTS, order);
  for (int i = 0; i < n; i++) {
    int r = order[i], prev = i > 0 ? order[i - 1] : -1;
    next[r] = -1;
    if (prev >= 0 && host[prev] == host[r]) {
      node[r] = node[prev];
      next[prev] = r;
    } else {
      node[r] = nn, head[nn++] = r;
    }
  }
  return nn;
}

ch_status comm_build_trees(struct ncclComm* comm) {
  int n = comm->nranks, me = comm->rank;
  uint64_t* host = malloc(sizeof(uint64_t) * (size_t)n);
  int* buf = malloc(sizeof(int) * 4 * (size_t)n);
  if (!host || !buf) {
    free(host), free(buf);
    WARN("rank %d: out of memory building the trees", me);
    return CH_SYSTEM;
  }
  int *node = buf, *head = buf + n, *next = buf + 2 * n, *order = buf + 3 * n;
  int nn = nodes_of(comm, param_int(PARAM_TREE_PER_RANK) != 0, host, order, node, head, next);
  int prev = -1;
  for (int q = 0; q < n; q++)
    if (next[q] == me) prev = q;
  /* Hops from the root to the deepest leaf: 1 + log2(largest power of two below nn) between nodes,
   * then the longest chain (the cost model's latency). */
  int ppn = 0, b = 1, depth = 0;
  for (int h = 0; h < nn; h++) {
    int len = 0;
    for (int q = head[h]; q >= 0; q = next[q]) len++;
    if (len > ppn) ppn = len;
  }
  while (nn > 1 && b * 2 < nn) b *= 2, depth++;
  comm->tree_depth = (nn > 1 ? 1 + depth : 0) + ppn - 1;
  /* One host: both trees would be the same chain; one tree carries all the data. */
  comm->ntrees = nn > 1 ? 2 : 1;
  for (int t = 0; t < comm->ntrees; t++) {
    struct algo_tree* tr = &comm->trees[t];
    tr->ndown = 0;
    tr->up = prev;
    if (prev < 0) { /* first rank of its node: the links between nodes are its */
      int up, d0, d1;
      topo_dtree(nn, node[me], t, &up, &d0, &d1);
      tr->up = up >= 0 ? head[up] : -1;
      if (d0 >= 0) tr->down[tr->ndown++] = head[d0];
      if (d1 >= 0) tr->down[tr->ndown++] = head[d1];
    }
    if (next[me] >= 0) tr->down[tr->ndown++] = next[me];
  }
  if (me == 0)
    INFO(LOG_INIT, "comm %p: %d tree(s) over %d node(s)%s; rank 0: up %d, %d child(ren)", (void*)comm, comm->ntrees,
         nn, nn > 1 ? " (binary between nodes, a chain inside each)" : " (a chain)", comm->trees[0].up,
         comm->trees[0].ndown);
  free(buf);
  free(host);
  return CH_OK;
}
