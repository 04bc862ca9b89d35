/* The hosts as the cost model sees them (tune/choose.c): which hops of each algorithm cross hosts,
 * and how many ranks of one host cross at once, so share its NIC. Computed at init from the rank
 * table every rank holds, so every rank gets the same values and makes the same choice. chorus-sim
 * (docs/SCALE.md) found the model wrong at scale without them: Rabenseifner's rounds between hosts
 * put all of a host's ranks on its NIC, and a ring laid out by host crosses hosts on one hop in
 * ranks-per-host. O(n log n): chorus-sim builds communicators of up to a million ranks. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "../misc/log.h"
#include "../misc/param.h"
#include "../misc/utils.h"
#include "../comm/comm.h"
#include "../algo/algo.h"
#include "tune.h"

struct hr {
  uint64_t host;
  int rank;
};

static int by_host(const void* a, const void* b) {
  const struct hr *x = a, *y = b;
  if (x->host != y->host) return x->host < y->host ? -1 : 1;
  return x->rank - y->rank;
}

/* Most ranks of one host whose partner (peer[] of the ranks listed) is on another host. */
static int share_of(const int* hid, int* count, int nhosts, const int* from, const int* to, int npairs) {
  memset(count, 0, sizeof(int) * (size_t)nhosts);
  int most = 0;
  for (int i = 0; i < npairs; i++) {
    int a = hid[from[i]], b = hid[to[i]];
    if (a == b) continue;
    if (++count[a] > most) most = count[a];
  }
  return most;
}

static void shape_simple(struct ncclComm* comm) { /* one host, as far as the model knows: its old form */
  comm->tune_hosts = comm->tune_ppn = 1;
  comm->tune_local_net = 0, comm->tune_ring_cross = 0, comm->tune_tree_net = 0, comm->tune_fold_share = 0;
  memset(comm->tune_pof2_share, 0, sizeof(comm->tune_pof2_share));
}

void tune_shape(struct ncclComm* comm) {
  int n = comm->nranks;
  shape_simple(comm);
  if (n < 2) return;
  struct hr* hr = malloc(sizeof(*hr) * (size_t)n);
  int* buf = malloc(sizeof(int) * 4 * (size_t)n);
  if (!hr || !buf) { /* only the model's accuracy is at stake: no WARN */
    free(hr), free(buf);
    return;
  }
  int *hid = buf, *count = buf + n, *from = buf + 2 * n, *to = buf + 3 * n;
  for (int r = 0; r < n; r++) hr[r].host = comm->peers[r].host_hash, hr[r].rank = r;
  qsort(hr, (size_t)n, sizeof(*hr), by_host);
  int nh = 0, run = 0, ppn = 0;
  for (int i = 0; i < n; i++) {
    int same = i > 0 && hr[i].host == hr[i - 1].host;
    if (!same) nh++, run = 0;
    hid[hr[i].rank] = nh - 1;
    if (++run > ppn) ppn = run;
    if (same && !comm->tune_local_net) { /* two ranks of one host: does their transport use the network? */
      const struct boot_rank_info *a = &comm->peers[hr[i - 1].rank], *b = &comm->peers[hr[i].rank];
      struct tp_peer tp = {.same_host = 1, .same_proc = a->proc_nonce == b->proc_nonce};
      const char* why;
      comm->tune_local_net = (tp_flags(tp_choose(&tp, &why)) & TP_F_NETWORK) != 0;
    }
  }
  comm->tune_hosts = nh, comm->tune_ppn = ppn;

  /* The ring: comm_build_rings's order where it has been built, else (chorus-sim's communicators)
   * the host order it builds by default, which crosses each host boundary once. */
  const int* ring = comm->channels[0].ring;
  if (ring) {
    for (int i = 0; i < n; i++) comm->tune_ring_cross += hid[ring[i]] != hid[ring[(i + 1) % n]];
  } else {
    comm->tune_ring_cross = nh > 1 ? nh : 0;
  }

  /* Tree AllReduce: 1 + log2(largest power of two below the hosts) levels between hosts (trees.c),
   * every level with CHORUS_TREE_PER_RANK (nodes are ranks, which may be anywhere). */
  int b = 1, d = 0;
  while (nh > 1 && b * 2 < nh) b *= 2, d++;
  comm->tune_tree_net =
      param_int(PARAM_TREE_PER_RANK) ? comm->tree_depth : UT_MIN(comm->tree_depth, nh > 1 ? 1 + d : 0);

  /* RecDbl and Rabenseifner (algo/pof2.c): the folds, then each round's pairs. */
  struct algo_pof2 p = algo_pof2_of(0, n);
  int nf = 0;
  for (int e = 0; e < n - p.p; e++) from[nf] = 2 * e, to[nf++] = 2 * e + 1; /* the even rank hands over */
  comm->tune_fold_share = share_of(hid, count, nh, from, to, nf);
  for (int k = 0; k < p.log && k < 32; k++) {
    for (int v = 0; v < p.p; v++) from[v] = algo_pof2_rank(v, n, p.p), to[v] = algo_pof2_rank(v ^ (1 << k), n, p.p);
    comm->tune_pof2_share[k] = share_of(hid, count, nh, from, to, p.p);
  }
  free(hr), free(buf);
  if (comm->rank == 0 && nh > 1) {
    int first = -1;
    for (int k = 0; k < p.log && first < 0; k++)
      if (comm->tune_pof2_share[k]) first = k;
    INFO(LOG_TUNING,
         "comm %p: cost model over %d hosts of up to %d ranks: the ring crosses hosts on %d of %d hops; "
         "RecDbl/Rabenseifner cross from distance %d with up to %d ranks on a NIC; Tree has %d of %d levels between "
         "hosts%s",
         (void*)comm, nh, ppn, comm->tune_ring_cross, n, first < 0 ? 0 : 1 << first,
         first < 0 ? 0 : comm->tune_pof2_share[p.log - 1], comm->tune_tree_net, comm->tree_depth,
         comm->tune_local_net ? "; ranks of a host also use the network" : "");
  }
}
