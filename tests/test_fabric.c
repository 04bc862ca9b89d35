/* The fabric transport over libfabric (NCCL_NET=OFI, FI_PROVIDER=tcp;ofi_rxm on loopback), forced
 * between local ranks with NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1: the collective matrix as threads
 * and as processes, several channels, Chorus's own net plugin loaded through NCCL_NET_PLUGIN (the
 * path an external plugin takes), mismatched calls named across the fabric, a killed peer, and the
 * errors of a network that cannot start. Each test says SKIP when libfabric cannot be loaded. */
#define _GNU_SOURCE
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "coll_util.h"
#include "misc/param.h"
#include "net/net.h"
#include "runner.h"
#include "transport/transport.h"

#ifndef CHORUS_BUILD_DIR
#define CHORUS_BUILD_DIR "."
#endif

/* The network the fabric transport drives in this test: OFI, or Socket behind the net interface
 * (CHORUS_SOCKET_NET=1, the _socknet variants below). */
static int fab_socknet;

/* 1 when the OFI network can run here; else prints why the test is skipped. */
static int force_fabric(void) {
  setenv("NCCL_P2P_DISABLE", "1", 1);
  setenv("NCCL_SHM_DISABLE", "1", 1);
  setenv("NCCL_NET", fab_socknet ? "Socket" : "OFI", 1);
  setenv("NCCL_NET_PLUGIN", "none", 1);
  setenv("FI_PROVIDER", "tcp;ofi_rxm", 1);
  setenv("FI_TCP_IFACE", "lo", 1);
  if (fab_socknet) {
    setenv("CHORUS_SOCKET_NET", "1", 1);
    setenv("NCCL_SOCKET_IFNAME", "lo", 1);
  }
  param_reset();
  if (fab_socknet) return 1;
  const char* why = NULL;
  if (ch_ofi_available(&why) != 0) {
    printf("    SKIP: the OFI network cannot start here: %s\n", why ? why : "?");
    return 0;
  }
  return 1;
}

static uint64_t now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* ---- the collective matrix ---- */

static const int fab_types[] = {ncclFloat32, ncclInt8, ncclBfloat16};
static const int fab_ops[] = {CU_SUM, CU_MAX, CU_AVG, CU_PREMUL_HOST};

#define FAB_SWEEP(n)                                                                            \
  TEST_T(fabric_threads, all_colls_##n, 240) {                                                  \
    if (!force_fabric()) return;                                                                \
    struct cu_sweep sw = {.types = fab_types, .ntypes = 3, .ops = fab_ops, .nops = 4,           \
                          .big = {300000, 0}};                                                  \
    rt_run_threads(n, cu_sweep_body, &sw);                                                      \
  }                                                                                             \
  TEST_T(fabric_procs, all_colls_##n, 240) {                                                    \
    if (!force_fabric()) return;                                                                \
    struct cu_sweep sw = {.types = fab_types, .ntypes = 1, .ops = fab_ops, .nops = 2,           \
                          .big = {1 << 20, 0}};                                                 \
    rt_run_procs(n, cu_sweep_body, &sw);                                                        \
  }
FAB_SWEEP(2)
FAB_SWEEP(3)
FAB_SWEEP(4)

/* Several channels: each ring has its own fabric connections. */
TEST_T(fabric_procs, four_channels, 120) {
  if (!force_fabric()) return;
  setenv("NCCL_MIN_NCHANNELS", "4", 1);
  setenv("NCCL_MAX_NCHANNELS", "4", 1);
  param_reset();
  struct cu_sweep sw = {.colls = (1u << CU_ALLREDUCE) | (1u << CU_ALLGATHER) | (1u << CU_REDUCESCATTER),
                        .types = fab_types, .ntypes = 1, .ops = fab_ops, .nops = 1, .big = {3 << 20, 0}};
  rt_run_procs(3, cu_sweep_body, &sw);
}

/* Chorus's libfabric network as an external plugin: the loader's path (dlopen, ncclNetPlugin_v12). */
TEST_T(fabric_procs, own_plugin_through_nccl_net_plugin, 120) {
  if (!force_fabric()) return;
  char path[512];
  snprintf(path, sizeof(path), "%s/lib/libnccl-net-chorus.so", CHORUS_BUILD_DIR);
  if (access(path, R_OK) != 0) {
    printf("    SKIP: %s not built\n", path);
    return;
  }
  setenv("NCCL_NET_PLUGIN", path, 1);
  setenv("NCCL_NET", "Chorus-OFI", 1);
  param_reset();
  struct cu_sweep sw = {.colls = (1u << CU_ALLREDUCE) | (1u << CU_BROADCAST) | (1u << CU_ALLGATHER),
                        .types = fab_types, .ntypes = 1, .ops = fab_ops, .nops = 1, .big = {1 << 20, 0}};
  rt_run_procs(3, cu_sweep_body, &sw);
}

/* The socket network as an external plugin (libnccl-net-chorus-socket.so, table Chorus-Socket): the
 * loader's path with no libfabric at all. */
TEST_T(fabric_procs, socket_plugin_through_nccl_net_plugin, 120) {
  fab_socknet = 1;
  force_fabric();
  char path[512];
  snprintf(path, sizeof(path), "%s/lib/libnccl-net-chorus-socket.so", CHORUS_BUILD_DIR);
  if (access(path, R_OK) != 0) {
    printf("    SKIP: %s not built\n", path);
    return;
  }
  unsetenv("CHORUS_SOCKET_NET");
  setenv("NCCL_NET_PLUGIN", path, 1);
  setenv("NCCL_NET", "Chorus-Socket", 1);
  param_reset();
  struct cu_sweep sw = {.colls = (1u << CU_ALLREDUCE) | (1u << CU_BROADCAST) | (1u << CU_ALLGATHER),
                        .types = fab_types, .ntypes = 1, .ops = fab_ops, .nops = 1, .big = {1 << 20, 0}};
  rt_run_procs(3, cu_sweep_body, &sw);
}

/* ---- calls that differ: named across the fabric as across sockets ---- */

static void mismatch_body(int rank, int nranks, ncclUniqueId id, void* arg) {
  (void)arg;
  ncclComm_t comm;
  NCCL_OK(ncclCommInitRank(&comm, nranks, id, rank));
  size_t count = rank == nranks - 1 ? 2048 : 1024; /* the last rank's count differs */
  float* buf = calloc(2048, sizeof(float));
  ASSERT(buf);
  ncclResult_t r = ncclAllReduce(buf, buf, count, ncclFloat32, ncclSum, comm, NULL);
  EXPECT(r == ncclInvalidUsage || r == ncclRemoteError);
  const char* last = ncclGetLastError(comm);
  EXPECT(last && strstr(last, "2048")); /* every rank names the differing call, wherever it learned of it */
  free(buf);
  ncclCommAbort(comm);
}

TEST_T(fabric_procs, mismatch_is_named, 120) {
  if (!force_fabric()) return;
  rt_run_procs(3, mismatch_body, NULL);
}

/* A receiver that finds the sender's call differs tells the sender over the way back: a sender that
 * waits for credits fails at once, naming the difference, instead of at its timeout. */
#define BACK_COUNT ((size_t)4 << 20) /* 16 MiB of floats: many more steps than the FIFO's 8 slots */

static void back_body(int rank, int nranks, ncclUniqueId id, void* arg) {
  (void)arg;
  ncclComm_t comm;
  NCCL_OK(ncclCommInitRank(&comm, nranks, id, rank));
  float* buf = calloc(BACK_COUNT + 1, sizeof(float));
  ASSERT(buf);
  uint64_t t0 = now_ns();
  ncclResult_t r = rank == 0 ? ncclSend(buf, BACK_COUNT, ncclFloat32, 1, comm, NULL)
                             : ncclRecv(buf, BACK_COUNT + 1, ncclFloat32, 0, comm, NULL);
  double s = (double)(now_ns() - t0) / 1e9;
  printf("    rank %d: %s after %.2f s\n", rank, ncclGetErrorString(r), s);
  EXPECT(r == ncclInvalidUsage || r == ncclRemoteError);
  EXPECT(s < 20.0);
  if (rank == 0) {
    const char* last = ncclGetLastError(comm);
    EXPECT(last && strstr(last, "rank 1"));
  }
  free(buf);
  ncclCommAbort(comm);
}

TEST_T(fabric_procs, mismatch_reaches_a_waiting_sender, 120) {
  if (!force_fabric()) return;
  setenv("CHORUS_TIMEOUT", "60", 1);
  param_reset();
  rt_run_procs(2, back_body, NULL);
}

/* ---- a network that cannot start fails init, saying why ---- */

static void init_fails_body(int rank, int nranks, ncclUniqueId id, void* arg) {
  (void)arg;
  ncclComm_t comm = NULL;
  ncclResult_t r = ncclCommInitRank(&comm, nranks, id, rank);
  EXPECT_EQ(r, ncclInvalidUsage);
  if (r == ncclSuccess) ncclCommDestroy(comm);
}

TEST_T(fabric, named_network_without_libfabric_fails_init, 60) {
  setenv("CHORUS_FABRIC_LIBRARY", "/nonexistent/libfabric.so.1", 1); /* before anything loads it */
  setenv("NCCL_NET", "OFI", 1);
  setenv("NCCL_NET_PLUGIN", "none", 1);
  param_reset();
  const char* why = NULL;
  EXPECT(ch_ofi_available(&why) != 0);
  EXPECT(why && strstr(why, "libfabric"));
  rt_run_threads(2, init_fails_body, NULL);
}

TEST_T(fabric, unknown_network_name_fails_init, 60) {
  setenv("NCCL_NET", "NoSuchNet", 1);
  setenv("NCCL_NET_PLUGIN", "none", 1);
  param_reset();
  rt_run_threads(2, init_fails_body, NULL);
}

TEST_T(fabric, socket_by_name_keeps_the_socket_transport, 60) {
  setenv("NCCL_NET", "Socket", 1);
  setenv("NCCL_NET_PLUGIN", "none", 1);
  param_reset();
  const struct ch_net* net = (const struct ch_net*)1;
  EXPECT_EQ(ch_net_get(&net), CH_OK);
  EXPECT(net == NULL);
  struct tp_peer remote = {0};
  const char* why = NULL;
  EXPECT_EQ(tp_choose(&remote, &why), TP_TCP);
}

TEST_T(fabric, ofi_by_name_takes_remote_peers, 60) {
  if (!force_fabric()) return;
  const struct ch_net* net = NULL;
  ASSERT(ch_net_get(&net) == CH_OK && net);
  EXPECT(!strcmp(net->name, "OFI"));
  EXPECT(net->ndev >= 1);
  struct tp_peer remote = {0}, proc = {.same_host = 1};
  const char* why = NULL;
  EXPECT_EQ(tp_choose(&remote, &why), TP_FAB);
  EXPECT(why && strstr(why, "OFI"));
  EXPECT_EQ(tp_choose(&proc, &why), TP_FAB); /* NCCL_SHM_DISABLE: the fabric, not sockets */
  EXPECT(tp_flags(TP_FAB) & TP_F_NETWORK);
}

/* ---- an idle communicator costs next to no CPU ---- */

static void idle_body(int rank, int nranks, ncclUniqueId id, void* arg) {
  (void)arg;
  ncclComm_t comm;
  NCCL_OK(ncclCommInitRank(&comm, nranks, id, rank));
  float v[256] = {0};
  for (int i = 0; i < 10; i++) NCCL_OK(ncclAllReduce(v, v, 256, ncclFloat32, ncclSum, comm, NULL));
  usleep(300000); /* let everyone's spinning end */
  double t0 = cu_proc_cpu_s();
  uint64_t w0 = now_ns();
  sleep(2);
  double used = cu_proc_cpu_s() - t0, wall = (double)(now_ns() - w0) / 1e9;
  if (rank == 0) {
    printf("    idle, %d ranks as %s over the fabric: rank 0's process used %.1f%% of a core over %.1f s\n", nranks,
           rt_mode(), 100 * used / wall, wall);
    EXPECT(used < 0.2 * wall); /* generous: only a spinning progress thread fails this */
  }
  NCCL_OK(ncclAllReduce(v, v, 256, ncclFloat32, ncclSum, comm, NULL)); /* wakes up fine */
  NCCL_OK(ncclCommDestroy(comm));
}

TEST_T(fabric, idle_cpu, 60) {
  if (!force_fabric()) return;
  rt_run_procs(2, idle_body, NULL); /* first: a child of a process whose OFI devices are open inherits them */
  rt_run_threads(2, idle_body, NULL);
}

/* A fork child of a process whose OFI devices are open opens its own (the parent's endpoints are not
 * shared): threads first, then processes forked from this one. */
static void sum_body(int rank, int nranks, ncclUniqueId id, void* arg) {
  (void)arg;
  ncclComm_t comm;
  NCCL_OK(ncclCommInitRank(&comm, nranks, id, rank));
  float v[1024];
  for (int i = 0; i < 1024; i++) v[i] = (float)(rank + i);
  NCCL_OK(ncclAllReduce(v, v, 1024, ncclFloat32, ncclSum, comm, NULL));
  for (int i = 0; i < 1024; i++) EXPECT_EQ(v[i], (float)(nranks * i + nranks * (nranks - 1) / 2));
  NCCL_OK(ncclCommDestroy(comm));
}

TEST_T(fabric, fork_child_opens_its_own_devices, 120) {
#if defined(__SANITIZE_THREAD__)
  printf("    skipped under ThreadSanitizer (fork after threads)\n");
  return;
#endif
  if (!force_fabric()) return;
  rt_run_threads(2, sum_body, NULL);
  rt_run_procs(2, sum_body, NULL);
}

/* ---- a peer killed in the middle of an AllReduce ---- */

#define KILL_COUNT ((size_t)1 << 20)
#define KILL_RANKS 3

static void* survivor(void* arg) {
  void** a = arg;
  int rank = (int)(intptr_t)a[0];
  ncclUniqueId* id = a[1];
  ncclComm_t comm;
  NCCL_OK(ncclCommInitRank(&comm, KILL_RANKS, *id, rank));
  float* buf = calloc(KILL_COUNT, sizeof(float));
  ASSERT(buf);
  ncclResult_t r = ncclSuccess;
  uint64_t t0 = now_ns();
  for (int i = 0; i < 1000 && r == ncclSuccess; i++)
    r = ncclAllReduce(buf, buf, KILL_COUNT, ncclFloat32, ncclSum, comm, NULL);
  uint64_t t_err = now_ns();
  EXPECT(r == ncclRemoteError || r == ncclTimeout);
  printf("    rank %d: %s after %.2f s\n", rank, ncclGetErrorString(r), (double)(t_err - t0) / 1e9);
  free(buf);
  ncclCommAbort(comm);
  return NULL;
}

TEST_T(fabric, peer_killed, 120) {
#if defined(__SANITIZE_THREAD__)
  printf("    skipped under ThreadSanitizer (fork after threads)\n");
  return;
#endif
  if (!force_fabric()) return;
  setenv("CHORUS_TIMEOUT", "40", 1); /* the bound for a survivor that hears of it from nobody */
  param_reset();
  int idpipe[2];
  ASSERT(pipe(idpipe) == 0);
  fflush(stdout);
  pid_t victim = fork();
  ASSERT(victim >= 0);
  if (victim == 0) {
    ncclUniqueId id;
    close(idpipe[1]);
    if (read(idpipe[0], &id, sizeof(id)) != (ssize_t)sizeof(id)) _exit(3);
    ncclComm_t comm;
    if (ncclCommInitRank(&comm, KILL_RANKS, id, KILL_RANKS - 1) != ncclSuccess) _exit(3);
    float* buf = calloc(KILL_COUNT, sizeof(float));
    for (int i = 0; i < 2; i++)
      if (ncclAllReduce(buf, buf, KILL_COUNT, ncclFloat32, ncclSum, comm, NULL) != ncclSuccess) _exit(3);
    pid_t me = getpid();
    if (fork() == 0) {
      usleep(20000);
      kill(me, SIGKILL);
      _exit(0);
    }
    ncclAllReduce(buf, buf, KILL_COUNT, ncclFloat32, ncclSum, comm, NULL);
    sleep(60);
    _exit(4);
  }
  close(idpipe[0]);
  ncclUniqueId id;
  NCCL_OK(ncclGetUniqueId(&id));
  ASSERT(write(idpipe[1], &id, sizeof(id)) == (ssize_t)sizeof(id));
  close(idpipe[1]);
  pthread_t th[KILL_RANKS - 1];
  void* args[KILL_RANKS - 1][2];
  for (int r = 0; r < KILL_RANKS - 1; r++) {
    args[r][0] = (void*)(intptr_t)r, args[r][1] = &id;
    ASSERT(pthread_create(&th[r], NULL, survivor, args[r]) == 0);
  }
  for (int r = 0; r < KILL_RANKS - 1; r++) pthread_join(th[r], NULL);
  int st;
  ASSERT(waitpid(victim, &st, 0) == victim);
  EXPECT(WIFSIGNALED(st) && WTERMSIG(st) == SIGKILL);
}

/* ---- the RMA path (CHORUS_OFI_RMA=1): rendezvous by RMA write with remote CQ data, forced on
 * tcp;ofi_rxm (which grants FI_RMA). The tests above run once more with it; then the table itself:
 * data at offsets inside registrations, sends before their clear-to-send, truncation, close with
 * clear-to-sends pending. ---- */

/* 1 when the OFI network runs here with the RMA path on (maxP2pBytes shows it: capped at 2^32-1). */
static int force_rma(void) {
  setenv("CHORUS_OFI_RMA", "1", 1); /* before force_fabric loads libfabric: read once per process */
  if (!force_fabric()) return 0;
  ncclNetProperties_v12_t props;
  ASSERT(ch_ofi_net.getProperties(0, &props) == ncclSuccess);
  ASSERT(props.maxP2pBytes <= 0xffffffffull);
  return 1;
}

/* One line with the #define: tests/CMakeLists.txt registers suites by scanning lines that start with
 * TEST_T( (the suites used here are registered by the tests above). */
#define FAB_RMA(suite, name, timeout) TEST_T(suite, name##_rma, timeout) { \
    if (!force_rma()) return;                                               \
    test_##suite##_##name();                                                \
  }
FAB_RMA(fabric_threads, all_colls_2, 240)
FAB_RMA(fabric_procs, all_colls_2, 240)
FAB_RMA(fabric_threads, all_colls_3, 240)
FAB_RMA(fabric_procs, all_colls_3, 240)
FAB_RMA(fabric_procs, mismatch_is_named, 120)
FAB_RMA(fabric_procs, mismatch_reaches_a_waiting_sender, 120)
FAB_RMA(fabric, peer_killed, 120)

/* The same over the Socket network behind the net interface (net/sock_net.c), so that every path of
 * the fabric transport is also exercised without libfabric. */
#define FAB_SOCK(suite, name, timeout) TEST_T(suite, name##_socknet, timeout) { \
    fab_socknet = 1;                                                               \
    test_##suite##_##name();                                                       \
  }
FAB_SOCK(fabric_threads, all_colls_2, 240)
FAB_SOCK(fabric_procs, all_colls_3, 240)
FAB_SOCK(fabric_procs, four_channels, 120)
FAB_SOCK(fabric_procs, mismatch_is_named, 120)
FAB_SOCK(fabric_procs, mismatch_reaches_a_waiting_sender, 120)
FAB_SOCK(fabric, idle_cpu, 60)
FAB_SOCK(fabric, peer_killed, 120)

/* One connection of the table to this process's own endpoint, with a registered buffer each side. */
struct rma_pair {
  void *ctx, *lc, *sc, *rc, *smh, *rmh;
  char *sbuf, *rbuf;
  size_t len;
};

static void rma_open(struct rma_pair* p, size_t len) {
  const ncclNet_v12_t* n = &ch_ofi_net;
  char handle[NCCL_NET_HANDLE_MAXSIZE];
  memset(p, 0, sizeof(*p));
  p->len = len;
  ASSERT(n->init(&p->ctx, 0, NULL, NULL, NULL) == ncclSuccess);
  ASSERT(n->listen(p->ctx, 0, handle, &p->lc) == ncclSuccess && p->lc);
  uint64_t end = now_ns() + 20000000000ull;
  while (!p->sc || !p->rc) {
    if (!p->sc) ASSERT(n->connect(p->ctx, 0, handle, &p->sc, NULL) == ncclSuccess);
    if (!p->rc) ASSERT(n->accept(p->lc, &p->rc, NULL) == ncclSuccess);
    ASSERT(now_ns() < end);
  }
  p->sbuf = malloc(len);
  p->rbuf = malloc(len);
  ASSERT(p->sbuf && p->rbuf);
  ASSERT(n->regMr(p->sc, p->sbuf, len, NCCL_PTR_HOST, &p->smh) == ncclSuccess);
  ASSERT(n->regMr(p->rc, p->rbuf, len, NCCL_PTR_HOST, &p->rmh) == ncclSuccess);
}

/* Closes everything; each close returns within a few seconds even with operations pending. */
static void rma_close(struct rma_pair* p) {
  const ncclNet_v12_t* n = &ch_ofi_net;
  uint64_t t0 = now_ns();
  EXPECT(n->deregMr(p->sc, p->smh) == ncclSuccess);
  EXPECT(n->deregMr(p->rc, p->rmh) == ncclSuccess);
  EXPECT(n->closeSend(p->sc) == ncclSuccess);
  EXPECT(n->closeRecv(p->rc) == ncclSuccess);
  EXPECT(n->closeListen(p->lc) == ncclSuccess);
  double s = (double)(now_ns() - t0) / 1e9;
  EXPECT(s < 6.0);
  if (s >= 6.0) printf("    closing took %.1f s\n", s);
  free(p->sbuf);
  free(p->rbuf);
}

/* Tests req until done or an error; returns test's last result, *size the size it reported. */
static ncclResult_t rma_wait(void* req, int* size) {
  int done = 0;
  uint64_t end = now_ns() + 10000000000ull;
  while (!done) {
    ncclResult_t r = ch_ofi_net.test(req, &done, size);
    if (r != ncclSuccess) return r;
    if (now_ns() > end) return ncclInProgress;
  }
  return ncclSuccess;
}

/* A receive and its send, tested in turn (one thread is both peers here: a send's write goes out when
 * the sender's side is called after its CTS arrived). Returns the receive's result. */
static ncclResult_t rma_wait2(void* rreq, int* size, void* sreq, ncclResult_t* sres) {
  int rdone = 0, sdone = 0;
  ncclResult_t rr = ncclSuccess, sr = ncclSuccess;
  uint64_t end = now_ns() + 10000000000ull;
  while ((!rdone && rr == ncclSuccess) || (!sdone && sr == ncclSuccess)) {
    if (!rdone && rr == ncclSuccess) rr = ch_ofi_net.test(rreq, &rdone, size);
    if (!sdone && sr == ncclSuccess) sr = ch_ofi_net.test(sreq, &sdone, NULL);
    if (now_ns() > end) {
      if (!rdone && rr == ncclSuccess) rr = ncclInProgress;
      if (!sdone && sr == ncclSuccess) sr = ncclInProgress;
    }
  }
  *sres = sr;
  return rr;
}

static void* rma_isend(struct rma_pair* p, size_t off, size_t size) {
  void* req = NULL;
  uint64_t end = now_ns() + 10000000000ull;
  while (!req && now_ns() < end)
    EXPECT_EQ(ch_ofi_net.isend(p->sc, p->sbuf + off, size, 0, p->smh, NULL, &req), ncclSuccess);
  ASSERT(req);
  return req;
}

static void* rma_irecv(struct rma_pair* p, size_t off, size_t size) {
  void* req = NULL;
  void* data = p->rbuf + off;
  int tag = 0;
  uint64_t end = now_ns() + 10000000000ull;
  while (!req && now_ns() < end)
    EXPECT_EQ(ch_ofi_net.irecv(p->rc, 1, &data, &size, &tag, &p->rmh, NULL, &req), ncclSuccess);
  ASSERT(req);
  return req;
}

#define RMA_MSGS 24
#define RMA_SLOT ((size_t)1 << 20)

TEST_T(fabric, rma_table, 120) {
  if (!force_rma()) return;
  struct rma_pair p;
  rma_open(&p, RMA_SLOT * 8 + 4096);
  /* Data: sizes up to a full slot, receives at odd offsets inside the region (the CTS carries an
   * offset on tcp, where a virtual address would be lost silently), 8 bytes larger than the send;
   * even messages' sends are posted before their receive (held until the CTS arrives). */
  for (int round = 0; round < 2; round++) {
    void* sreq[RMA_MSGS];
    void* rreq[RMA_MSGS];
    size_t size[RMA_MSGS];
    for (int i = 0; i < RMA_MSGS; i++) {
      size_t slot = (size_t)(i % 8) * RMA_SLOT + 8;
      size[i] = i == 0 ? 0 : i == 1 ? 1 : ((size_t)i * 40503u * (round + 1)) % (RMA_SLOT - 16);
      for (size_t j = 0; j < size[i]; j++) p.sbuf[slot + j] = (char)(i * 7 + j * 13 + round);
      memset(p.rbuf + slot, 0xee, size[i] + 8);
      if (i % 2 == 0) sreq[i] = rma_isend(&p, slot, size[i]), rreq[i] = rma_irecv(&p, slot + 1, size[i] + 8);
      else rreq[i] = rma_irecv(&p, slot + 1, size[i] + 8), sreq[i] = rma_isend(&p, slot, size[i]);
      int got = -1;
      ncclResult_t sres;
      EXPECT_EQ(rma_wait2(rreq[i], &got, sreq[i], &sres), ncclSuccess);
      EXPECT_EQ(sres, ncclSuccess);
      EXPECT_EQ(got, (int)size[i]);
      int bad = 0;
      for (size_t j = 0; j < size[i] && !bad; j++) bad = p.rbuf[slot + 1 + j] != (char)(i * 7 + j * 13 + round);
      EXPECT(!bad);
      EXPECT((unsigned char)p.rbuf[slot] == 0xee && (unsigned char)p.rbuf[slot + 1 + size[i]] == 0xee);
    }
  }
  /* Many in flight: 8 receives posted, then 8 sends, completions tested in order. */
  void* rq[8];
  void* sq[8];
  for (int i = 0; i < 8; i++) rq[i] = rma_irecv(&p, (size_t)i * RMA_SLOT, RMA_SLOT);
  for (int i = 0; i < 8; i++) sq[i] = rma_isend(&p, (size_t)i * RMA_SLOT, 1000 + (size_t)i);
  for (int i = 0; i < 8; i++) {
    int got = -1;
    ncclResult_t sres;
    EXPECT_EQ(rma_wait2(rq[i], &got, sq[i], &sres), ncclSuccess);
    EXPECT_EQ(sres, ncclSuccess);
    EXPECT_EQ(got, 1000 + i);
  }
  /* Truncation: a send larger than the receive it is matched with fails at the sender, with a WARN;
   * the connection is then unusable (the next send fails too), and closes with the receive pending. */
  void* r1 = rma_irecv(&p, 0, 100);
  void* s1 = rma_isend(&p, 0, 200);
  EXPECT_EQ(rma_wait(s1, NULL), ncclSystemError);
  void* s2 = NULL;
  EXPECT(ch_ofi_net.isend(p.sc, p.sbuf, 10, 0, p.smh, NULL, &s2) != ncclSuccess || (s2 && rma_wait(s2, NULL) != ncclSuccess));
  int done = 1;
  EXPECT_EQ(ch_ofi_net.test(r1, &done, NULL), ncclSuccess);
  EXPECT_EQ(done, 0);
  rma_close(&p);
}

/* Close while clear-to-sends are pending: receives whose sends never came (their CTSs wait at the
 * sender, unconsumed), and sends whose receives never came (held for a CTS). */
TEST_T(fabric, rma_close_pending, 60) {
  if (!force_rma()) return;
  struct rma_pair p;
  rma_open(&p, 1 << 20);
  for (int i = 0; i < 6; i++) (void)rma_irecv(&p, (size_t)i * 4096, 4096);
  usleep(100000);
  (void)ch_ofi_net.test(rma_isend(&p, 0, 10), &(int){0}, NULL); /* consumes one CTS; the rest stay */
  rma_close(&p);
  rma_open(&p, 1 << 20);
  for (int i = 0; i < 6; i++) (void)rma_isend(&p, (size_t)i * 4096, 4096);
  rma_close(&p);
  /* The device still works: a new connection moves data. */
  rma_open(&p, 1 << 20);
  void* r = rma_irecv(&p, 0, 4096);
  void* s = rma_isend(&p, 0, 4000);
  int got = -1;
  ncclResult_t sres;
  EXPECT_EQ(rma_wait2(r, &got, s, &sres), ncclSuccess);
  EXPECT_EQ(sres, ncclSuccess);
  EXPECT_EQ(got, 4000);
  rma_close(&p);
}
