/* The pool of per-peer connections (core/pool.c, issue 44 item 2): under CHORUS_P2P_PEERS=K a pattern
 * that meets more than K peers gives exact results, never holds more than K peers' FIFOs (read through
 * chorusCommGetMemory), releases and re-makes connections, still catches mismatched calls, and a
 * re-made connection whose peer never comes is ended by an abort. */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "chorus.h"
#include "misc/param.h"
#include "coll_util.h"
#include "runner.h"

#define K 2
#define COUNT (300 * 1024) /* floats: 1.2 MB, more than a per-peer FIFO holds */

/* Round r: every rank sends to rank + r and receives from rank - r (one group), checking the data. */
static void shift(ncclComm_t comm, int rank, int n, int r, uint32_t seed, float* sb, float* rb) {
  int to = (rank + r) % n, from = (rank - r + n) % n;
  cu_fill_pattern(sb, ncclFloat32, COUNT, rank, to, seed);
  memset(rb, 0xee, COUNT * sizeof(float));
  NCCL_OK(ncclGroupStart());
  NCCL_OK(ncclSend(sb, COUNT, ncclFloat32, to, comm, NULL));
  NCCL_OK(ncclRecv(rb, COUNT, ncclFloat32, from, comm, NULL));
  NCCL_OK(ncclGroupEnd());
  long at = cu_check_pattern(rb, ncclFloat32, COUNT, from, rank, seed);
  if (at >= 0) cu_failf("round %d: data from rank %d wrong from element %ld", r, from, at);
}

/* arg non-NULL: every peer is over the network (pool.network_peers_give_back_pages). */
static void budget_body(int rank, int n, ncclUniqueId id, void* arg) {
  int net = arg != NULL;
  ncclComm_t comm = cu_comm_init(rank, n, id);
  float* sb = malloc(COUNT * sizeof(float) * (size_t)n);
  float* rb = malloc(COUNT * sizeof(float) * (size_t)n);
  ASSERT(sb && rb);
  for (int sweep = 0; sweep < 2; sweep++)
    for (int r = 1; r < n; r++) {
      /* Over the network, every rank past the previous round first: a peer that runs ahead fills our
       * FIFO from it with data we take later, and such a FIFO cannot give its pages back until we have
       * (docs/SCALE.md). A local connection it would have to make again with us, so none runs ahead. */
      if (net) NCCL_OK(ncclAllReduce(sb, rb, 1, ncclFloat32, ncclSum, comm, NULL));
      shift(comm, rank, n, r, (uint32_t)(sweep * 100 + r), sb, rb);
      chorusMemory_t m = cu_memory(comm);
      if (m.p2pPeers > K || m.p2pPeersMax > K || m.netPeersResident > K)
        cu_failf("round %d: %llu peers hold memory (most %llu, network %llu), the budget is %d", r,
                 (unsigned long long)m.p2pPeers, (unsigned long long)m.p2pPeersMax,
                 (unsigned long long)m.netPeersResident, K);
      EXPECT_EQ((long long)m.p2pRecvBytes, (long long)(m.p2pFifoBytes * (m.p2pRecvBytes / m.p2pFifoBytes)));
    }
  chorusMemory_t m = cu_memory(comm);
  EXPECT_EQ((long long)m.p2pPeersCap, (long long)K);
  EXPECT(m.procThreads >= 1 && m.procFds >= 1);
  if (net) {
    EXPECT(m.netTrimmed > 0);                 /* pages were given back ... */
    EXPECT_EQ((long long)m.p2pReleased, 0LL); /* ... no connection closed: the sockets stay */
    EXPECT_EQ((long long)m.p2pPeers, (long long)m.netPeersResident);
  } else {
    EXPECT(m.p2pReleased > 0);                 /* peers were let go ... */
    EXPECT(m.p2pMade > 2 * (uint64_t)(n - 1)); /* ... and made again in the second sweep */
  }
  /* An AlltoAll meets every peer: it runs in waves within the budget (core/group.c). */
  size_t per = 4096;
  for (int p = 0; p < n; p++) cu_fill_pattern(sb + p * per, ncclFloat32, per, rank, p, 77);
  NCCL_OK(ncclAlltoAll(sb, rb, per, ncclFloat32, comm, NULL));
  for (int p = 0; p < n; p++) {
    long at = cu_check_pattern(rb + p * per, ncclFloat32, per, p, rank, 77);
    if (at >= 0) cu_failf("AlltoAll: block of rank %d wrong from element %ld", p, at);
  }
  m = cu_memory(comm);
  if (m.p2pPeersMax > K)
    cu_failf("the AlltoAll held %llu peers live, the budget is %d", (unsigned long long)m.p2pPeersMax, K);
  /* ... and the next round stays within it. */
  NCCL_OK(ncclAllReduce(sb, rb, 1, ncclFloat32, ncclSum, comm, NULL)); /* every rank past its AlltoAll */
  shift(comm, rank, n, 1, 999, sb, rb);
  /* No rank destroys its communicator before every rank is past the shift: a peer's goodbye arriving
   * in an idle network FIFO keeps it from giving its pages back at that boundary. */
  NCCL_OK(ncclAllReduce(sb, rb, 1, ncclFloat32, ncclSum, comm, NULL));
  m = cu_memory(comm);
  if (m.p2pPeers > K || m.netPeersResident > K)
    cu_failf("after the AlltoAll: %llu peers hold memory (network %llu), the budget is %d",
             (unsigned long long)m.p2pPeers, (unsigned long long)m.netPeersResident, K);
  free(sb);
  free(rb);
  NCCL_OK(ncclCommDestroy(comm));
  cu_finish();
}

TEST_T(pool, budget_holds_and_peers_are_remade, 240) {
  setenv("CHORUS_P2P_PEERS", "2", 1);
  param_reset();
  rt_run_both(5, budget_body, NULL);
  unsetenv("CHORUS_P2P_PEERS");
  param_reset();
}

/* Groups that meet more peers than the pool holds run in waves (core/group.c) as wide as the smallest
 * budget of any rank (rank 0's, when process ranks differ): exact, an AlltoAll within each rank's own
 * budget, whatever the group
 * holds: an AlltoAll, a Gather and a Scatter, a collective beside an AlltoAll, every rank's sends
 * and receives to all others in one group of several sizes. */
#define WAVE_N 9
static void check_blocks(const float* rb, int n, size_t per, int rank, uint32_t seed, const char* what, int only) {
  for (int p = 0; p < n; p++) {
    if (only >= 0 && p != only) continue;
    long at = cu_check_pattern(rb + p * per, ncclFloat32, per, p, rank, seed);
    if (at >= 0) cu_failf("%s: block from rank %d wrong from element %ld", what, p, at);
  }
}

static void waves_body(int rank, int n, ncclUniqueId id, void* arg) {
  int procs = arg != NULL;
  if (procs) { /* a process of its own: its own budget; the smallest (rank 0's) sizes the waves */
    setenv("CHORUS_P2P_PEERS", rank == 0 ? "2" : "3", 1);
    param_reset();
  }
  ncclComm_t comm = cu_comm_init(rank, n, id);
  size_t per = 70 * 1024; /* floats: several FIFO steps per block */
  float* sb = malloc(per * sizeof(float) * (size_t)n);
  float* rb = malloc(per * sizeof(float) * (size_t)n);
  float* one = malloc(per * sizeof(float));
  ASSERT(sb && rb && one);
  for (int round = 0; round < 2; round++) {
    uint32_t seed = 100u + (uint32_t)round;
    for (int p = 0; p < n; p++) cu_fill_pattern(sb + p * per, ncclFloat32, per, rank, p, seed);
    NCCL_OK(ncclAlltoAll(sb, rb, per, ncclFloat32, comm, NULL));
    check_blocks(rb, n, per, rank, seed, "AlltoAll", -1);
    chorusMemory_t m = cu_memory(comm);
    if (round == 0 && m.p2pPeersMax > m.p2pPeersCap)
      cu_failf("rank %d: the AlltoAll held %llu peers live at once, its budget is %llu", rank,
               (unsigned long long)m.p2pPeersMax, (unsigned long long)m.p2pPeersCap);
    /* Gather to rank 3: rank 3 meets every peer, the others one */
    cu_fill_pattern(one, ncclFloat32, per, rank, 3, seed + 10);
    NCCL_OK(ncclGather(one, rb, per, ncclFloat32, 3, comm, NULL));
    if (rank == 3)
      for (int p = 0; p < n; p++) {
        long at = cu_check_pattern(rb + p * per, ncclFloat32, per, p, 3, seed + 10);
        if (at >= 0) cu_failf("Gather: block from rank %d wrong from element %ld", p, at);
      }
    /* Scatter from rank 5 */
    for (int p = 0; p < n; p++) cu_fill_pattern(sb + p * per, ncclFloat32, per, rank, p, seed + 20);
    NCCL_OK(ncclScatter(sb, one, per, ncclFloat32, 5, comm, NULL));
    long at = cu_check_pattern(one, ncclFloat32, per, 5, rank, seed + 20);
    if (at >= 0) cu_failf("Scatter: wrong from element %ld", at);
    /* An AllReduce and an AlltoAll in one group */
    float x = (float)(rank + 1), sum = 0;
    for (int p = 0; p < n; p++) cu_fill_pattern(sb + p * per, ncclFloat32, per, rank, p, seed + 30);
    NCCL_OK(ncclGroupStart());
    NCCL_OK(ncclAllReduce(&x, &sum, 1, ncclFloat32, ncclSum, comm, NULL));
    NCCL_OK(ncclAlltoAll(sb, rb, per, ncclFloat32, comm, NULL));
    NCCL_OK(ncclGroupEnd());
    EXPECT_EQ((long long)sum, (long long)n * (n + 1) / 2);
    check_blocks(rb, n, per, rank, seed + 30, "AlltoAll beside an AllReduce", -1);
    /* Sends and receives of a size per pair, to every other rank, in one group */
    for (int p = 0; p < n; p++) cu_fill_pattern(sb + p * per, ncclFloat32, per, rank, p, seed + 40);
    memset(rb, 0xee, per * sizeof(float) * (size_t)n);
    NCCL_OK(ncclGroupStart());
    for (int k = 1; k < n; k++) {
      int to = (rank + k) % n, from = (rank - k + n) % n;
      NCCL_OK(ncclSend(sb + to * per, per / (size_t)(1 + (rank + to) % 3), ncclFloat32, to, comm, NULL));
      NCCL_OK(ncclRecv(rb + from * per, per / (size_t)(1 + (rank + from) % 3), ncclFloat32, from, comm, NULL));
    }
    NCCL_OK(ncclGroupEnd());
    for (int p = 0; p < n; p++) {
      if (p == rank) continue;
      size_t cnt = per / (size_t)(1 + (rank + p) % 3);
      at = cu_check_pattern(rb + p * per, ncclFloat32, cnt, p, rank, seed + 40);
      if (at >= 0) cu_failf("send/recv group: data from rank %d wrong from element %ld", p, at);
    }
  }
  /* A connection may carry a message that a later wave of the next group takes (a Gather's sender,
   * which runs no waves, sends before its root gets there): it cannot be released before, so a wave
   * may find up to the budget's worth of such peers beside its own. */
  chorusMemory_t m = cu_memory(comm);
  if (m.p2pPeersMax > 2 * m.p2pPeersCap)
    cu_failf("rank %d: %llu peers were live at once, its budget is %llu", rank, (unsigned long long)m.p2pPeersMax,
             (unsigned long long)m.p2pPeersCap);
  EXPECT(m.p2pReleased > 0);
  free(sb);
  free(rb);
  free(one);
  NCCL_OK(ncclCommDestroy(comm));
  cu_finish();
}

TEST_T(pool, wide_groups_run_in_waves_threads, 240) {
  setenv("CHORUS_P2P_PEERS", "2", 1);
  param_reset();
  rt_run_threads(WAVE_N, waves_body, NULL);
  unsetenv("CHORUS_P2P_PEERS");
  param_reset();
}

TEST_T(pool, wide_groups_run_in_waves_procs, 240) {
  rt_run_procs(WAVE_N, waves_body, (void*)1);
}

/* Network peers (every peer here: NCCL_P2P_DISABLE and NCCL_SHM_DISABLE leave only TCP) keep their
 * connections; past the budget their idle FIFOs give their pages back (core/pool.c's trim) and take
 * fresh zero pages at the next use: budget_body over TCP. */
TEST_T(pool, network_peers_give_back_pages, 240) {
  setenv("CHORUS_P2P_PEERS", "2", 1);
  setenv("NCCL_P2P_DISABLE", "1", 1);
  setenv("NCCL_SHM_DISABLE", "1", 1);
  param_reset();
  rt_run_both(5, budget_body, (void*)1);
  unsetenv("CHORUS_P2P_PEERS");
  unsetenv("NCCL_P2P_DISABLE");
  unsetenv("NCCL_SHM_DISABLE");
  param_reset();
}

/* The Prometheus text has the memory gauges. */
static void metrics_body(int rank, int n, ncclUniqueId id, void* arg) {
  (void)arg;
  ncclComm_t comm = cu_comm_init(rank, n, id);
  size_t need = 0;
  NCCL_OK(chorusCommMetrics(comm, NULL, 0, &need));
  char* text = malloc(need + 1);
  ASSERT(text);
  NCCL_OK(chorusCommMetrics(comm, text, need + 1, &need));
  EXPECT(strstr(text, "# TYPE chorus_memory_p2p_peers gauge") != NULL);
  EXPECT(strstr(text, "chorus_memory_process_threads{") != NULL);
  free(text);
  chorusMemory_t m;
  m.size = 3; /* too small for a field */
  EXPECT_EQ((int)chorusCommGetMemory(comm, &m), (int)ncclInvalidArgument);
  NCCL_OK(ncclCommDestroy(comm));
  cu_finish();
}

TEST(pool, memory_in_metrics) { rt_run_threads(2, metrics_body, NULL); }

/* A mismatched send/recv after the pool released and re-made the connection is still caught. */
static void mismatch_body(int rank, int n, ncclUniqueId id, void* arg) {
  (void)arg;
  ncclComm_t comm = cu_comm_init(rank, n, id);
  float* sb = malloc(COUNT * sizeof(float));
  float* rb = malloc(COUNT * sizeof(float));
  ASSERT(sb && rb);
  for (int r = 1; r < n; r++) shift(comm, rank, n, r, (uint32_t)r, sb, rb);
  for (int r = 1; r < n; r++) shift(comm, rank, n, r, (uint32_t)r + 50, sb, rb);
  if (rank <= 1) {
    int peer = 1 - rank;
    size_t cnt = rank == 1 ? 1000 : 1001;
    NCCL_OK(ncclGroupStart());
    ncclSend(sb, cnt, ncclFloat32, peer, comm, NULL);
    ncclRecv(rb, cnt, ncclFloat32, peer, comm, NULL);
    ncclResult_t res = ncclGroupEnd();
    if (res != ncclInvalidUsage) cu_failf("rank %d: the mismatched send/recv returned %d, expected ncclInvalidUsage", rank, (int)res);
  }
  ncclCommDestroy(comm);
  free(sb);
  free(rb);
  cu_finish();
}

TEST_T(pool, mismatch_after_release_is_caught, 180) {
  setenv("CHORUS_P2P_PEERS", "1", 1);
  setenv("CHORUS_TIMEOUT", "30", 1);
  param_reset();
  rt_run_both(3, mismatch_body, NULL);
  unsetenv("CHORUS_P2P_PEERS");
  unsetenv("CHORUS_TIMEOUT");
  param_reset();
}

/* Rank 0 releases its connection with rank 1 (budget 1, it moves on to rank 2); rank 1 then receives
 * from rank 0, finds the connection closed and waits to make it again, for a rank 0 that never comes:
 * an abort from another thread ends the wait. */
static ncclComm_t abort_comms[3];
static pthread_barrier_t abort_bar;

static void abort_body(int rank, int n, ncclUniqueId id, void* arg) {
  (void)arg, (void)n;
  ncclComm_t comm = cu_comm_init(rank, n, id);
  abort_comms[rank] = comm;
  float* b = malloc(COUNT * sizeof(float));
  ASSERT(b);
  memset(b, 0, COUNT * sizeof(float));
  if (rank == 0) NCCL_OK(ncclSend(b, COUNT, ncclFloat32, 1, comm, NULL));
  if (rank == 1) NCCL_OK(ncclRecv(b, COUNT, ncclFloat32, 0, comm, NULL));
  pthread_barrier_wait(&abort_bar);
  if (rank == 0) NCCL_OK(ncclSend(b, COUNT, ncclFloat32, 2, comm, NULL)); /* releases rank 1 */
  if (rank == 2) NCCL_OK(ncclRecv(b, COUNT, ncclFloat32, 0, comm, NULL));
  pthread_barrier_wait(&abort_bar);
  if (rank == 0) EXPECT_EQ((long long)cu_memory(comm).p2pReleased, 1LL);
  if (rank == 1) {
    ncclResult_t r = ncclRecv(b, COUNT, ncclFloat32, 0, comm, NULL);
    EXPECT(r != ncclSuccess);
  } else if (rank == 0) {
    usleep(300 * 1000);
    NCCL_OK(ncclCommAbort(abort_comms[1]));
  }
  pthread_barrier_wait(&abort_bar);
  if (rank != 1) ncclCommAbort(comm);
  free(b);
  cu_finish();
}

TEST_T(pool, abort_while_remaking_a_released_connection, 120) {
  setenv("CHORUS_P2P_PEERS", "1", 1);
  param_reset();
  pthread_barrier_init(&abort_bar, NULL, 3);
  rt_run_threads(3, abort_body, NULL);
  pthread_barrier_destroy(&abort_bar);
  unsetenv("CHORUS_P2P_PEERS");
  param_reset();
}

/* Many process ranks, the pool far smaller than the job: every call of a job (tests/test_scale.c's
 * list) exact, the AlltoAll in waves. The size CI's time allows; tools/scale-run.py with
 * examples/scale_check.c goes further (docs/SCALE.md). */
static void many_rank(int rank, int nranks, ncclUniqueId id, void* arg) {
  (void)arg;
  ncclComm_t comm = cu_comm_init(rank, nranks, id);
  size_t per = 64;
  int32_t* all = malloc((size_t)nranks * per * sizeof(*all));
  int32_t* out = malloc((size_t)nranks * per * sizeof(*out));
  ASSERT(all && out);
  int bad = 0;
  for (int round = 0; round < 2; round++) {
    int64_t s = rank + 1, sum = 0;
    NCCL_OK(ncclAllReduce(&s, &sum, 1, ncclInt64, ncclSum, comm, NULL));
    EXPECT_EQ(sum, (int64_t)nranks * (nranks + 1) / 2);
    int32_t mine = rank * 3 + round;
    NCCL_OK(ncclAllGather(&mine, all, 1, ncclInt32, comm, NULL));
    for (int r = 0; r < nranks; r++) bad += all[r] != r * 3 + round;
    for (int r = 0; r < nranks; r++)
      for (size_t i = 0; i < per; i++) all[(size_t)r * per + i] = rank * 100000 + r * 10 + (int)i % 7 + round;
    NCCL_OK(ncclAlltoAll(all, out, per, ncclInt32, comm, NULL));
    for (int r = 0; r < nranks; r++)
      for (size_t i = 0; i < per; i++) bad += out[(size_t)r * per + i] != r * 100000 + rank * 10 + (int)i % 7 + round;
    int32_t got = -1, next = (rank + 1) % nranks, prev = (rank + nranks - 1) % nranks;
    NCCL_OK(ncclGroupStart());
    NCCL_OK(ncclSend(&mine, 1, ncclInt32, next, comm, NULL));
    NCCL_OK(ncclRecv(&got, 1, ncclInt32, prev, comm, NULL));
    NCCL_OK(ncclGroupEnd());
    EXPECT_EQ(got, prev * 3 + round);
  }
  EXPECT_EQ(bad, 0);
  chorusMemory_t m = cu_memory(comm);
  if (m.p2pPeersMax > 8) cu_failf("rank %d: %llu peers live at once, the budget is 8", rank, (unsigned long long)m.p2pPeersMax);
  free(all);
  free(out);
  NCCL_OK(ncclCommDestroy(comm));
  cu_finish();
}

/* 128 ranks (32 under the sanitizers, whose processes are slower and larger: still 4 waves). */
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define MANY_PROCS 32
#else
#define MANY_PROCS 128
#endif
TEST_T(pool, many_procs_all_calls_in_waves, 240) {
  setenv("CHORUS_P2P_PEERS", "8", 1);
  param_reset();
  rt_run_procs(MANY_PROCS, many_rank, NULL);
  unsetenv("CHORUS_P2P_PEERS");
  param_reset();
}
