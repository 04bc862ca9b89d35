/* Topology-aware rings (src/tune/rings.c): ranks of one host are contiguous in the ring whatever the
 * rank numbering, every rank computes the same ring, and every ring algorithm is correct on a ring
 * that is not in rank order (CHORUS_RING_ORDER permutes it on one host: ranks there stay on
 * shared memory, so the whole collective matrix runs on permuted rings without the network). */
#define _GNU_SOURCE
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "coll_util.h"
#include "comm/comm.h"
#include "tune/topo.h"
#include "misc/param.h"
#include "runner.h"

static void set(const char* name, const char* value) {
  if (value) setenv(name, value, 1);
  else unsetenv(name);
  param_reset();
}

/* Whether order is a permutation of 0..n-1 with each host's ranks contiguous and in rank order, and
 * hosts in order of their lowest rank; returns the number of host boundaries crossed going round. */
static int check_grouped(int n, const uint64_t* host, const int* order) {
  int* seen = calloc((size_t)n, sizeof(int));
  ASSERT(seen);
  for (int i = 0; i < n; i++) {
    ASSERT(order[i] >= 0 && order[i] < n && !seen[order[i]]);
    seen[order[i]] = 1;
  }
  free(seen);
  int crossings = 0;
  for (int i = 0; i < n; i++) {
    int a = order[i], b = order[(i + 1) % n];
    if (host[a] != host[b]) crossings++;
    else if (i + 1 < n) EXPECT(a < b); /* within a host: by rank */
  }
  /* A host's ranks contiguous <=> every host is entered exactly once. */
  int hosts = 0;
  for (int r = 0; r < n; r++) {
    int first = 1;
    for (int q = 0; q < r && first; q++) first = host[q] != host[r];
    hosts += first;
  }
  EXPECT_EQ(crossings, hosts > 1 ? hosts : 0);
  return crossings;
}

TEST(topo, interleaved_hosts_are_grouped) {
  /* rank i on host i mod 3 (a launcher that deals ranks round-robin) */
  uint64_t host[6];
  for (int r = 0; r < 6; r++) host[r] = 1000 + (uint64_t)(r % 3);
  int order[6];
  topo_ring_order_fill(6, host, TOPO_ORDER_HOSTS, order);
  static const int want[6] = {0, 3, 1, 4, 2, 5};
  for (int i = 0; i < 6; i++) EXPECT_EQ(order[i], want[i]);
  EXPECT_EQ(check_grouped(6, host, order), 3);
}

TEST(topo, blocked_and_single_host_keep_rank_order) {
  uint64_t host[8];
  int order[8];
  for (int r = 0; r < 8; r++) host[r] = (uint64_t)(r / 4) * 77;
  topo_ring_order_fill(8, host, TOPO_ORDER_HOSTS, order);
  for (int i = 0; i < 8; i++) EXPECT_EQ(order[i], i);
  for (int r = 0; r < 8; r++) host[r] = 5;
  topo_ring_order_fill(8, host, TOPO_ORDER_HOSTS, order);
  for (int i = 0; i < 8; i++) EXPECT_EQ(order[i], i);
  topo_ring_order_fill(1, host, TOPO_ORDER_HOSTS, order);
  EXPECT_EQ(order[0], 0);
}

TEST(topo, hosts_in_order_of_lowest_rank) {
  /* hosts B A B C A: B holds rank 0, A rank 1, C rank 3 */
  uint64_t host[5] = {'B', 'A', 'B', 'C', 'A'};
  int order[5];
  topo_ring_order_fill(5, host, TOPO_ORDER_HOSTS, order);
  static const int want[5] = {0, 2, 1, 4, 3};
  for (int i = 0; i < 5; i++) EXPECT_EQ(order[i], want[i]);
}

TEST(topo, random_layouts_cross_each_host_once) {
  uint32_t x = 12345;
  for (int t = 0; t < 200; t++) {
    int n = 1 + t % 37;
    uint64_t host[37];
    int order[37];
    for (int r = 0; r < n; r++) {
      x = x * 1103515245u + 12345u;
      host[r] = (x >> 16) % (uint32_t)(1 + t % 6);
    }
    topo_ring_order_fill(n, host, TOPO_ORDER_HOSTS, order);
    check_grouped(n, host, order);
  }
}

TEST(topo, test_orders) {
  uint64_t host[5] = {0, 0, 0, 0, 0};
  int order[5];
  topo_ring_order_fill(5, host, TOPO_ORDER_REVERSE, order);
  for (int i = 0; i < 5; i++) EXPECT_EQ(order[i], 4 - i);
  topo_ring_order_fill(5, host, TOPO_ORDER_INTERLEAVE, order);
  static const int want[5] = {0, 2, 4, 1, 3};
  for (int i = 0; i < 5; i++) EXPECT_EQ(order[i], want[i]);
  set("CHORUS_RING_ORDER", "reverse");
  EXPECT_EQ(topo_ring_order(), TOPO_ORDER_REVERSE);
  set("CHORUS_RING_ORDER", "sideways");
  EXPECT_EQ(topo_ring_order(), TOPO_ORDER_INVALID);
  set("CHORUS_RING_ORDER", NULL);
  EXPECT_EQ(topo_ring_order(), TOPO_ORDER_HOSTS);
}

/* ---- on communicators ---- */

struct ring_want {
  int ring[8];
};

/* Every channel's ring, position, prev and next as wanted, after a real init. */
static void ring_body(int rank, int nranks, ncclUniqueId id, void* arg) {
  const struct ring_want* w = arg;
  ncclComm_t comm = cu_comm_init(rank, nranks, id);
  for (int c = 0; c < comm->nchannels; c++) {
    const struct ch_channel* ch = &comm->channels[c];
    int pos = -1;
    for (int i = 0; i < nranks; i++) {
      EXPECT_EQ(ch->ring[i], w->ring[i]);
      if (w->ring[i] == rank) pos = i;
    }
    EXPECT_EQ(ch->ring_index, pos);
    EXPECT_EQ(ch->prev, w->ring[(pos + nranks - 1) % nranks]);
    EXPECT_EQ(ch->next, w->ring[(pos + 1) % nranks]);
  }
  NCCL_OK(ncclCommDestroy(comm));
}

TEST(topo, comm_ring_reverse_threads_and_procs) {
  set("CHORUS_RING_ORDER", "reverse");
  set("NCCL_MIN_NCHANNELS", "2");
  set("NCCL_MAX_NCHANNELS", "2");
  struct ring_want w = {{3, 2, 1, 0}};
  rt_run_both(4, ring_body, &w);
}

/* Processes claiming different hosts (NCCL_HOSTID): the ring groups them. Init alone makes no
 * connection, so this needs no network transport. */
static void hosts_body(int rank, int nranks, ncclUniqueId id, void* arg) {
  char h[32];
  snprintf(h, sizeof(h), "topo-test-host-%d", rank % 2);
  set("NCCL_HOSTID", h);
  ring_body(rank, nranks, id, arg);
}

TEST(topo, comm_ring_groups_hosts_procs) {
  struct ring_want w = {{0, 2, 4, 1, 3}};
  rt_run_procs(5, hosts_body, &w);
}

static void bad_order_body(int rank, int nranks, ncclUniqueId id, void* arg) {
  (void)arg;
  ncclComm_t comm = NULL;
  ncclResult_t r = ncclCommInitRank(&comm, nranks, id, rank);
  EXPECT(r != ncclSuccess);
  if (comm) ncclCommDestroy(comm);
}

TEST(topo, invalid_ring_order_fails_init) {
  set("CHORUS_RING_ORDER", "sideways");
  rt_run_threads(3, bad_order_body, NULL);
}

/* A rank with another CHORUS_RING_ORDER would walk another ring: init must refuse on every rank. */
static void mixed_order_body(int rank, int nranks, ncclUniqueId id, void* arg) {
  set("CHORUS_RING_ORDER", rank == 1 ? "reverse" : NULL);
  bad_order_body(rank, nranks, id, arg);
}

TEST(topo, ring_order_must_agree) { rt_run_procs(3, mixed_order_body, NULL); }

/* Waiting ranks spin only when this host's ranks have a CPU each: counted over the union of their
 * processes' affinity, so ranks bound one per CPU (chorusrun --bind core, mpirun's default) spin,
 * and ranks whose processes all share one CPU do not. Needs 2 CPUs. */
struct affinity_case {
  int cpu[3];  /* per rank: the CPU it is bound to, -1: unbound */
  int want[3]; /* per rank: oversubscribed */
};
static void affinity_body(int rank, int nranks, ncclUniqueId id, void* arg) {
  const struct affinity_case* c = arg;
  if (c->cpu[rank] >= 0) {
    cpu_set_t set;
    CPU_ZERO(&set);
    CPU_SET(c->cpu[rank], &set);
    ASSERT(sched_setaffinity(0, sizeof(set), &set) == 0);
  }
  ncclComm_t comm;
  NCCL_OK(ncclCommInitRank(&comm, nranks, id, rank));
  EXPECT_EQ(comm->oversubscribed, c->want[rank]);
  NCCL_OK(ncclCommDestroy(comm));
}

TEST(topo, bound_ranks_spin_when_each_has_a_cpu) {
  cpu_set_t set;
  if (sched_getaffinity(0, sizeof(set), &set) != 0 || !CPU_ISSET(0, &set) || !CPU_ISSET(1, &set)) {
    printf("    SKIP: needs CPUs 0 and 1\n");
    return;
  }
  struct affinity_case distinct = {{0, 1, -1}, {0, 0, 0}}, shared = {{0, 0, -1}, {1, 1, 1}};
  rt_run_procs(2, affinity_body, &distinct); /* one CPU each */
  rt_run_procs(2, affinity_body, &shared);   /* both on CPU 0 */
  if (CPU_COUNT(&set) >= 3) { /* (with 2 CPUs, 3 ranks are oversubscribed anyway) */
    /* two on CPU 0 beside an unbound one: the two yield, the unbound one has room */
    struct affinity_case crowded = {{0, 0, -1}, {1, 1, 0}};
    rt_run_procs(3, affinity_body, &crowded);
  }
}

/* ---- every collective on permuted rings ---- */

static const int perm_types[] = {ncclFloat32, ncclInt8, ncclBfloat16, ncclUint64};

static void perm_setup(const char* order, int nchannels) {
  set("CHORUS_RING_ORDER", order);
  set("CHORUS_DIRECT_MIN_BYTES", "-1"); /* threads would take Direct for AllReduce: keep the ring */
  char c[8];
  snprintf(c, sizeof(c), "%d", nchannels);
  set("NCCL_MIN_NCHANNELS", c);
  set("NCCL_MAX_NCHANNELS", c);
}

#define PERM_SWEEP(mode, n, order, nch)                                                        \
  TEST_T(topo_ring, mode##_##n##_##order##_##nch##ch, 120) {                                   \
    perm_setup(#order, nch);                                                                   \
    struct cu_sweep sw = {.types = perm_types, .ntypes = 4, .big = {70001}};                   \
    rt_run_##mode(n, cu_sweep_body, &sw);                                                      \
  }
PERM_SWEEP(threads, 3, reverse, 1)
PERM_SWEEP(threads, 4, interleave, 1)
PERM_SWEEP(threads, 4, reverse, 2)
PERM_SWEEP(procs, 3, reverse, 1)
PERM_SWEEP(procs, 4, interleave, 2)
PERM_SWEEP(procs, 4, reverse, 1)
