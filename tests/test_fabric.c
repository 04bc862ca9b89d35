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

/* 1 when the OFI network can run here; else prints why the test is skipped. */
static int force_fabric(void) {
  setenv("NCCL_P2P_DISABLE", "1", 1);
  setenv("NCCL_SHM_DISABLE", "1", 1);
  setenv("NCCL_NET", "OFI", 1);
  setenv("NCCL_NET_PLUGIN", "none", 1);
  setenv("FI_PROVIDER", "tcp;ofi_rxm", 1);
  setenv("FI_TCP_IFACE", "lo", 1);
  param_reset();
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
  EXPECT(last && (strstr(last, "count") || strstr(last, "differ") || strstr(last, "rank")));
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
  EXPECT_EQ(tp_choose(&remote, &why), TP_NET);
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
