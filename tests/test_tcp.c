/* The network transport (TCP through the per-process proxy), forced between local ranks with
 * NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1: the collective matrix as threads and processes, split
 * communicators, the transport's handshake against an impostor, a peer killed mid-AllReduce, and the
 * CPU an idle communicator's proxy uses. */
#define _GNU_SOURCE
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "coll_util.h"
#include "comm/comm.h"
#include "misc/param.h"
#include "runner.h"
#include "transport/tcp.h"

static void force_net(void) {
  setenv("NCCL_P2P_DISABLE", "1", 1);
  setenv("NCCL_SHM_DISABLE", "1", 1);
  param_reset();
}

static uint64_t now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* ---- the collective matrix over the network ---- */

static const int net_types[] = {ncclFloat32, ncclInt8, ncclBfloat16};
static const int net_ops[] = {CU_SUM, CU_MAX, CU_AVG, CU_PREMUL_HOST};

#define NET_SWEEP(n)                                                                            \
  TEST_T(net_threads, all_colls_##n, 240) {                                                     \
    force_net();                                                                                \
    struct cu_sweep sw = {.types = net_types, .ntypes = 3, .ops = net_ops, .nops = 4,           \
                          .big = {300000, 0}};                                                  \
    rt_run_threads(n, cu_sweep_body, &sw);                                                      \
  }                                                                                             \
  TEST_T(net_procs, all_colls_##n, 240) {                                                       \
    force_net();                                                                                \
    struct cu_sweep sw = {.types = net_types, .ntypes = 1, .ops = net_ops, .nops = 2,           \
                          .big = {1 << 20, 0}};                                                 \
    rt_run_procs(n, cu_sweep_body, &sw);                                                        \
  }
NET_SWEEP(2)
NET_SWEEP(3)
NET_SWEEP(4)

/* Several channels: each ring has its own sockets. */
TEST_T(net_procs, four_channels, 120) {
  force_net();
  setenv("NCCL_MIN_NCHANNELS", "4", 1);
  setenv("NCCL_MAX_NCHANNELS", "4", 1);
  param_reset();
  struct cu_sweep sw = {.colls = (1u << CU_ALLREDUCE) | (1u << CU_ALLGATHER) | (1u << CU_REDUCESCATTER),
                        .types = net_types, .ntypes = 1, .ops = net_ops, .nops = 1, .big = {3 << 20, 0}};
  rt_run_procs(3, cu_sweep_body, &sw);
}

/* ---- split ---- */

static void split_body(int rank, int nranks, ncclUniqueId id, void* arg) {
  (void)arg;
  ncclComm_t comm, sub;
  NCCL_OK(ncclCommInitRank(&comm, nranks, id, rank));
  NCCL_OK(ncclCommSplit(comm, rank % 2, rank, &sub, NULL));
  int sn, sr;
  NCCL_OK(ncclCommCount(sub, &sn));
  NCCL_OK(ncclCommUserRank(sub, &sr));
  const size_t count = 100003;
  float* buf = malloc(count * sizeof(float));
  ASSERT(buf);
  for (size_t i = 0; i < count; i++) buf[i] = (float)(rank + (int)(i % 7));
  NCCL_OK(ncclAllReduce(buf, buf, count, ncclFloat32, ncclSum, sub, NULL));
  /* members of my color: ranks rank%2, rank%2+2, ... */
  float base = 0;
  for (int r = rank % 2; r < nranks; r += 2) base += (float)r;
  for (size_t i = 0; i < count; i++)
    if (buf[i] != base + (float)(sn * (int)(i % 7))) {
      rt_fail(__FILE__, __LINE__, "rank %d: split AllReduce element %zu = %g", rank, i, buf[i]);
      break;
    }
  free(buf);
  NCCL_OK(ncclCommDestroy(sub));
  NCCL_OK(ncclCommDestroy(comm));
}

TEST_T(tcp, split, 120) {
  force_net();
  rt_run_both(4, split_body, NULL);
}

/* ---- the handshake: an impostor without the key is refused, the real sender gets through ---- */

static _Atomic int dummy_err;
static volatile int no_abort;

TEST_T(tcp, impostor_rejected, 60) {
  union sock_addr lo;
  ASSERT(sock_parse_addr("127.0.0.1:0", &lo) == CH_OK);
  unsigned char key[32], bad[32];
  memset(key, 7, sizeof(key));
  memset(bad, 8, sizeof(bad));
  union sock_addr other;
  ASSERT(sock_parse_addr("127.0.0.2:1", &other) == CH_OK);
  struct tp_ctx rx = {0, &lo, &lo, 0, key, 0, &dummy_err, &no_abort, NULL, 0, NULL, NULL, NULL};
  struct tp_ctx tx = {1, &lo, &lo, 0, key, 0, &dummy_err, &no_abort, NULL, 0, NULL, NULL, NULL};
  struct tp_ctx evil = {1, &lo, &lo, 0, bad, 0, &dummy_err, &no_abort, NULL, 0, NULL, NULL, NULL};
  struct tp_ctx elsewhere = {1, &lo, &other, 0, key, 0, &dummy_err, &no_abort, NULL, 0, NULL, NULL, NULL};
  struct tp_sizes sz = {{CH_STEPS * 4096, CH_STEPS * 4096, CH_STEPS * 4096}};
  struct conn rc = {0}, sc = {0}, ic = {0};
  struct tp_handle h;
  rc.peer = 1, sc.peer = 0, ic.peer = 0;
  ASSERT(tp_tcp_recv_setup(&rc, &sz, &h, &rx) == CH_OK);
  /* Wrong key, right token: the sender side cannot tell (one flight), the receiver refuses it. */
  ASSERT(tp_tcp_send_connect(&ic, &sz, &h, &evil) == CH_OK);
  /* An offer on another IP than the peer joined from is refused before connecting. */
  struct conn oc = {0};
  oc.peer = 0;
  EXPECT(tp_tcp_send_connect(&oc, &sz, &h, &elsewhere) != CH_OK);
  usleep(200000);
  EXPECT_EQ(tp_tcp_state(&rc), 0);
  EXPECT_EQ(atomic_load(&rc.tcp->state), TCP_PENDING);
  /* The impostor's socket was closed on it: its side fails. */
  for (int i = 0; i < 100 && tp_tcp_state(&ic) != 2; i++) usleep(10000);
  EXPECT_EQ(tp_tcp_state(&ic), 2);
  atomic_store(&dummy_err, 0);
  /* The real sender. */
  ASSERT(tp_tcp_send_connect(&sc, &sz, &h, &tx) == CH_OK);
  ASSERT(tp_tcp_wait_bound(&rc, &rx) == CH_OK);
  /* One step across: payload, size and header arrive, tail published after them. */
  char* slot = sc.buff[PROTO_SIMPLE];
  for (int i = 0; i < 1000; i++) slot[i] = (char)(i * 7);
  sc.ctrl->size[0] = 1000;
  sc.ctrl->hdr[0].seq = 42;
  atomic_store(&sc.ctrl->tail, 1);
  tp_wake(&sc.ctrl->tail, &sc.ctrl->recv_sleeping);
  uint64_t t0 = now_ns();
  while (atomic_load(&rc.ctrl->tail) < 1 && now_ns() - t0 < 5000000000ull) usleep(100);
  ASSERT_EQ(atomic_load(&rc.ctrl->tail), 1);
  EXPECT_EQ(rc.ctrl->size[0], 1000);
  EXPECT_EQ(rc.ctrl->hdr[0].seq, 42);
  EXPECT(memcmp(rc.buff[PROTO_SIMPLE], slot, 1000) == 0);
  while (atomic_load(&sc.ctrl->head) < 1 && now_ns() - t0 < 5000000000ull) usleep(100);
  EXPECT_EQ(atomic_load(&sc.ctrl->head), 1);
  EXPECT_EQ(atomic_load(&dummy_err), 0);
  tp_conn_free(&sc);
  for (int i = 0; i < 100 && tp_tcp_state(&rc) != 1; i++) usleep(10000);
  EXPECT_EQ(tp_tcp_state(&rc), 1); /* an orderly goodbye, not a failure */
  EXPECT_EQ(atomic_load(&dummy_err), 0);
  tp_conn_free(&rc);
  tp_conn_free(&ic);
}

/* One network connection on the loopback, rank 1 -> rank 0, set up by hand (the receiving end first,
 * then the sender, as the tests below need), with the job key of these tests. */
struct net_pair {
  union sock_addr lo;
  unsigned char key[32];
  struct tp_ctx rx, tx;
  struct tp_sizes sz;
  struct conn rc, sc;
  struct tp_handle h;
};
static void pair_listen(struct net_pair* p) {
  memset(p, 0, sizeof(*p));
  ASSERT(sock_parse_addr("127.0.0.1:0", &p->lo) == CH_OK);
  memset(p->key, 7, sizeof(p->key));
  p->rx = (struct tp_ctx){0, &p->lo, &p->lo, 0, p->key, 0, &dummy_err, &no_abort, NULL, 0, NULL, NULL, NULL};
  p->tx = (struct tp_ctx){1, &p->lo, &p->lo, 0, p->key, 0, &dummy_err, &no_abort, NULL, 0, NULL, NULL, NULL};
  p->sz = (struct tp_sizes){{CH_STEPS * 4096, CH_STEPS * 4096, CH_STEPS * 4096}};
  p->rc.peer = 1, p->sc.peer = 0;
  ASSERT(tp_tcp_recv_setup(&p->rc, &p->sz, &p->h, &p->rx) == CH_OK);
}
static ch_status pair_connect(struct net_pair* p) { return tp_tcp_send_connect(&p->sc, &p->sz, &p->h, &p->tx); }
static void pair_free(struct net_pair* p) {
  tp_conn_free(&p->sc);
  tp_conn_free(&p->rc);
  atomic_store(&dummy_err, 0);
}

/* A step header that announces more than the slot, read by the waiting rank (direct reads), goes back
 * to the proxy, which fails the link: only the proxy walks its records (conn_fail), so the rank thread
 * must not (it did, racing the proxy's list). */
TEST_T(tcp, oversized_step_is_failed_by_the_proxy, 60) {
  static struct net_pair p;
  pair_listen(&p);
  ASSERT(pair_connect(&p) == CH_OK);
  ASSERT(tp_tcp_wait_bound(&p.rc, &p.rx) == CH_OK);
  ASSERT(p.rc.tcp->slot_bytes < 8192 && p.rc.tcp->direct_max >= 8192);
  tp_tcp_poll(&p.rc); /* the rank takes the socket, as a waiting engine does */
  struct tcp_step bad = {.bytes = 8192};
  ASSERT(send(p.sc.tcp->fd, &bad, sizeof(bad), MSG_NOSIGNAL) == (ssize_t)sizeof(bad)); /* as a broken sender */
  for (int i = 0; i < 500 && tp_tcp_state(&p.rc) == 0; i++) tp_tcp_poll(&p.rc), usleep(2000);
  EXPECT_EQ(tp_tcp_state(&p.rc), 2);
  EXPECT_EQ(atomic_load(&p.rc.tcp->rank_reads), 0); /* handed back: the proxy failed it */
  EXPECT_EQ(atomic_load(&dummy_err), (int)CH_REMOTE);
  pair_free(&p);
}

/* A fork child that inherits communicators over the network: using one is refused (its threads and
 * sockets are the parent's), destroying or aborting one only lets go (it waited for ever for a proxy
 * thread the child does not have); the parent's comms go on. Not in a TSan suite: a fork after threads. */
TEST_T(tcp, fork_child_lets_inherited_comms_go, 60) {
  force_net();
  ncclComm_t comms[2];
  NCCL_OK(ncclCommInitAll(comms, 2, NULL));
  float v[2] = {1, 2};
  NCCL_OK(ncclGroupStart());
  for (int r = 0; r < 2; r++) NCCL_OK(ncclAllReduce(&v[r], &v[r], 1, ncclFloat32, ncclSum, comms[r], NULL));
  NCCL_OK(ncclGroupEnd());
  EXPECT(v[0] == 3.0f && v[1] == 3.0f);
  pid_t pid = fork();
  ASSERT(pid >= 0);
  if (pid == 0) {
    alarm(20);
    float x = 1;
    int bad = ncclAllReduce(&x, &x, 1, ncclFloat32, ncclSum, comms[0], NULL) != ncclInvalidUsage;
    bad |= ncclCommDestroy(comms[0]) != ncclSuccess;
    bad |= ncclCommAbort(comms[1]) != ncclSuccess;
    _exit(bad);
  }
  int st = 0;
  ASSERT(waitpid(pid, &st, 0) == pid);
  EXPECT(WIFEXITED(st) && WEXITSTATUS(st) == 0);
  NCCL_OK(ncclGroupStart());
  for (int r = 0; r < 2; r++) NCCL_OK(ncclAllReduce(&v[r], &v[r], 1, ncclFloat32, ncclSum, comms[r], NULL));
  NCCL_OK(ncclGroupEnd());
  EXPECT(v[0] == 6.0f && v[1] == 6.0f);
  for (int r = 0; r < 2; r++) NCCL_OK(ncclCommDestroy(comms[r]));
}

/* The proxy runs out of descriptors as a sender's connection arrives (accept4: EMFILE): it tries again
 * shortly and says why. The listener is edge-triggered, so the connection used to wait in the backlog
 * until another one arrived, and its receiver timed out blaming the sender. */
TEST_T(tcp, accept_retried_after_running_out_of_descriptors, 60) {
  static struct net_pair p;
  pair_listen(&p);
  usleep(100000); /* the proxy sleeps in epoll_wait */
  struct rlimit was, rl = {256, 256};
  ASSERT(getrlimit(RLIMIT_NOFILE, &was) == 0 && setrlimit(RLIMIT_NOFILE, &rl) == 0);
  static int fill[300];
  int nf = 0, fd;
  while (nf < 300 && (fd = open("/dev/null", O_RDONLY)) >= 0) fill[nf++] = fd;
  ASSERT(nf > 0);
  close(fill[--nf]); /* one left: the sender's socket takes it, the proxy's accept finds none */
  EXPECT(pair_connect(&p) == CH_OK);
  usleep(200000);
  while (nf) close(fill[--nf]);
  uint64_t t0 = now_ns();
  while (atomic_load(&p.rc.tcp->state) != TCP_BOUND && now_ns() - t0 < 3000000000ull) usleep(10000);
  EXPECT_EQ(atomic_load(&p.rc.tcp->state), TCP_BOUND);
  pair_free(&p);
  setrlimit(RLIMIT_NOFILE, &was); /* for a run without fork (--no-fork) */
}

/* 300 connections that never authenticate (a flood, or a scanner) do not keep a real sender out: once
 * all 256 places are taken, the oldest that has been silent for 1 s makes room for a newer one (it used
 * to wait in the backlog until the flood's sockets expired, 10 s). */
TEST_T(tcp, listener_flood_drops_the_oldest, 60) {
  static struct net_pair p;
  pair_listen(&p);
  enum { FLOOD = 300 };
  static struct sock junk[FLOOD];
  int n = 0;
  for (int k = 0; k < FLOOD; k++) {
    struct sock_wait w = {NULL, 0};
    if (sock_connect(&p.h.addr, &junk[n], &w) == CH_OK) n++;
  }
  EXPECT(n > 256);
  usleep(200000); /* the proxy has taken them in */
  ASSERT(pair_connect(&p) == CH_OK);
  uint64_t t0 = now_ns();
  while (atomic_load(&p.rc.tcp->state) != TCP_BOUND && now_ns() - t0 < 4000000000ull) usleep(10000);
  EXPECT_EQ(atomic_load(&p.rc.tcp->state), TCP_BOUND);
  for (int k = 0; k < n; k++) sock_close(&junk[k]);
  pair_free(&p);
}

/* Garbage sent to a running job's listener does not disturb it. */
static void garbage_body(int rank, int nranks, ncclUniqueId id, void* arg) {
  (void)arg;
  ncclComm_t comm;
  NCCL_OK(ncclCommInitRank(&comm, nranks, id, rank));
  float v = 1;
  NCCL_OK(ncclAllReduce(&v, &v, 1, ncclFloat32, ncclSum, comm, NULL));
  if (rank == 0) {
    union sock_addr a;
    ASSERT(proxy_listener_addr(&a));
    for (int k = 0; k < 3; k++) {
      struct sock s;
      struct sock_wait w = {NULL, 0};
      if (sock_connect(&a, &s, &w) != CH_OK) continue;
      char junk[sizeof(struct tcp_hello)];
      memset(junk, k == 0 ? 0 : 0x41, sizeof(junk));
      if (k == 1) { /* right magic, made-up token */
        uint64_t m = TCP_MAGIC;
        memcpy(junk, &m, sizeof(m));
      }
      if (k < 2) sock_send_all(&s, junk, sizeof(junk), &w);
      sock_close(&s);
    }
  }
  for (int i = 0; i < 20; i++) {
    v = (float)rank;
    NCCL_OK(ncclAllReduce(&v, &v, 1, ncclFloat32, ncclSum, comm, NULL));
    EXPECT(v == (float)(nranks * (nranks - 1) / 2));
  }
  ncclResult_t async;
  NCCL_OK(ncclCommGetAsyncError(comm, &async));
  EXPECT_EQ(async, ncclSuccess);
  NCCL_OK(ncclCommDestroy(comm));
}

TEST_T(tcp, garbage_to_listener, 60) {
  force_net();
  rt_run_threads(2, garbage_body, NULL);
}

/* ---- idle CPU ---- */

static void idle_body(int rank, int nranks, ncclUniqueId id, void* arg) {
  (void)arg;
  ncclComm_t comm;
  NCCL_OK(ncclCommInitRank(&comm, nranks, id, rank));
  float v[256] = {0};
  for (int i = 0; i < 10; i++) NCCL_OK(ncclAllReduce(v, v, 256, ncclFloat32, ncclSum, comm, NULL));
  usleep(300000); /* let everyone's spinning end */
  double t0 = cu_proc_cpu_s();
  uint64_t w0 = now_ns();
  const char* secs = getenv("CHORUS_TEST_IDLE_S"); /* a longer look by hand */
  sleep(secs && atoi(secs) > 0 ? (unsigned)atoi(secs) : 2);
  double used = cu_proc_cpu_s() - t0, wall = (double)(now_ns() - w0) / 1e9;
  if (rank == 0) {
    printf("    idle, %d ranks as %s over the network: rank 0's process used %.1f%% of a core over %.1f s\n", nranks,
           rt_mode(), 100 * used / wall, wall);
    EXPECT(used < 0.2 * wall); /* generous: only a spinning proxy fails this */
  }
  NCCL_OK(ncclAllReduce(v, v, 256, ncclFloat32, ncclSum, comm, NULL)); /* wakes up fine */
  NCCL_OK(ncclCommDestroy(comm));
}

TEST_T(tcp, idle_cpu, 60) {
  force_net();
  rt_run_threads(2, idle_body, NULL);
  rt_run_procs(2, idle_body, NULL);
}

/* ---- a peer killed in the middle of an AllReduce ---- */

#define KILL_COUNT ((size_t)4 << 20)
/* Rank 1 is no ring neighbour of the victim (3): it learns of the death only through the others. */
#define KILL_RANKS 4

static void* survivor(void* arg) {
  void** a = arg;
  int rank = (int)(intptr_t)a[0];
  ncclUniqueId* id = a[1];
  ncclComm_t comm;
  NCCL_OK(ncclCommInitRank(&comm, KILL_RANKS, *id, rank));
  float* buf = calloc(KILL_COUNT, sizeof(float));
  ASSERT(buf);
  ncclResult_t r = ncclSuccess;
  uint64_t t0 = now_ns(), t_err = 0;
  for (int i = 0; i < 1000 && r == ncclSuccess; i++)
    r = ncclAllReduce(buf, buf, KILL_COUNT, ncclFloat32, ncclSum, comm, NULL);
  t_err = now_ns();
  ncclResult_t async = ncclSuccess;
  NCCL_OK(ncclCommGetAsyncError(comm, &async));
  EXPECT_EQ(r, ncclRemoteError);
  EXPECT_EQ(async, ncclRemoteError);
  EXPECT(t_err - t0 < 30000000000ull);
  free(buf);
  ncclCommAbort(comm);
  return NULL;
}

TEST_T(tcp, peer_killed, 90) {
#if defined(__SANITIZE_THREAD__)
  printf("    skipped under ThreadSanitizer (fork after threads)\n");
  return;
#endif
  force_net();
  /* The victim is forked before the unique id exists and reads it from a pipe: ncclGetUniqueId may
   * start the bootstrap root's thread, and under AddressSanitizer a fork while that thread holds the
   * allocator's lock left the victim deadlocked in its first malloc, its peers waiting in init (a
   * timeout in 3 of 6 runs). */
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
    if (fork() == 0) { /* kill the rank while it is inside the next call */
      usleep(20000);
      kill(me, SIGKILL);
      _exit(0);
    }
    ncclAllReduce(buf, buf, KILL_COUNT, ncclFloat32, ncclSum, comm, NULL);
    sleep(30);
    _exit(4);
  }
  close(idpipe[0]);
  ncclUniqueId id;
  NCCL_OK(ncclGetUniqueId(&id));
  ASSERT(write(idpipe[1], &id, sizeof(id)) == (ssize_t)sizeof(id));
  close(idpipe[1]);
  pthread_t th[KILL_RANKS - 1];
  void* args[KILL_RANKS - 1][2];
  uint64_t t0 = now_ns();
  for (int r = 0; r < KILL_RANKS - 1; r++) {
    args[r][0] = (void*)(intptr_t)r, args[r][1] = &id;
    ASSERT(pthread_create(&th[r], NULL, survivor, args[r]) == 0);
  }
  for (int r = 0; r < KILL_RANKS - 1; r++) pthread_join(th[r], NULL);
  int st;
  ASSERT(waitpid(victim, &st, 0) == victim);
  EXPECT(WIFSIGNALED(st) && WTERMSIG(st) == SIGKILL);
  printf("    survivors returned %.2f s after starting\n", (double)(now_ns() - t0) / 1e9);
}

/* NCCL_P2P_DISABLE=1 alone: threads of one process talk through shared memory, as in NCCL. */
TEST_T(net_threads, p2p_disable_uses_shm, 120) {
  setenv("NCCL_P2P_DISABLE", "1", 1);
  param_reset();
  struct cu_sweep sw = {.types = net_types, .ntypes = 1, .ops = net_ops, .nops = 1, .big = {300000, 0}};
  rt_run_threads(3, cu_sweep_body, &sw);
}

/* The rank's own send and receive path (CHORUS_NET_DIRECT_MAX_BYTES): small steps skip the proxy,
 * large ones still go through it, on the same connections. */
static void direct_sweep(int nranks, int procs) {
  force_net();
  setenv("CHORUS_NET_DIRECT_MAX_BYTES", "4096", 1);
  param_reset();
  struct cu_sweep sw = {.types = net_types, .ntypes = 1, .ops = net_ops, .nops = 2, .big = {1 << 20, 0}};
  if (procs) rt_run_procs(nranks, cu_sweep_body, &sw);
  else rt_run_threads(nranks, cu_sweep_body, &sw);
}
TEST_T(net_threads, direct_3, 240) { direct_sweep(3, 0); }
TEST_T(net_procs, direct_2, 240) { direct_sweep(2, 1); }

/* With the rank reading its sockets: small and large calls alternate (the socket moves between the
 * rank and the proxy, tp_tcp_poll / the `big` rule), the proxy of an idle process still sleeps, and
 * a peer that exits while the survivor is in no call is still reported (the proxy takes the socket
 * back on the hang-up: ncclCommGetAsyncError turns to ncclRemoteError without a call). */
static void direct_mixed_body(int rank, int nranks, ncclUniqueId id, void* arg) {
  (void)arg;
  ncclComm_t comm;
  NCCL_OK(ncclCommInitRank(&comm, nranks, id, rank));
  const size_t big = (size_t)1 << 20;
  float* v = malloc(big * sizeof(float));
  ASSERT(v);
  for (int i = 0; i < 60; i++) {
    size_t n = i % 3 == 2 ? big : (size_t)(1 + i % 7);
    for (size_t k = 0; k < n; k++) v[k] = (float)(rank + 1) * (float)(1 + (k + (size_t)i) % 5);
    NCCL_OK(ncclAllReduce(v, v, n, ncclFloat32, ncclSum, comm, NULL));
    float tot = (float)(nranks * (nranks + 1) / 2);
    int bad = 0;
    for (size_t k = 0; k < n && !bad; k++) bad = v[k] != tot * (float)(1 + (k + (size_t)i) % 5);
    EXPECT(!bad);
  }
  NCCL_OK(ncclAllReduce(v, v, 2, ncclFloat32, ncclSum, comm, NULL)); /* last wait: a small step */
  free(v);
  if (rank == 1) _exit(0); /* gone without a goodbye: its sockets just close */
  uint64_t t0 = now_ns();
  ncclResult_t async = ncclSuccess;
  while (async == ncclSuccess && now_ns() - t0 < 10000000000ull) {
    NCCL_OK(ncclCommGetAsyncError(comm, &async));
    usleep(10000);
  }
  printf("    async error %d %.2f s after the last call\n", (int)async, (double)(now_ns() - t0) / 1e9);
  EXPECT_EQ(async, ncclRemoteError);
  ncclCommAbort(comm);
}

TEST_T(net_procs, direct_mixed_then_peer_exits, 120) {
  force_net();
  setenv("CHORUS_NET_DIRECT_MAX_BYTES", "4096", 1);
  param_reset();
  rt_run_procs(2, direct_mixed_body, NULL);
}

TEST_T(tcp, direct_idle_cpu, 60) {
  force_net();
  setenv("CHORUS_NET_DIRECT_MAX_BYTES", "4096", 1);
  param_reset();
  rt_run_procs(2, idle_body, NULL);
}

/* NCCL_SOCKET_NTHREADS x NCCL_NSOCKS_PERTHREAD: a communicator over the network gets that many
 * channels (a socket each per peer) and large calls spread over them; results as on one socket. */
static void striped_body(int rank, int nranks, ncclUniqueId id, void* arg) {
  (void)arg;
  ncclComm_t comm;
  NCCL_OK(ncclCommInitRank(&comm, nranks, id, rank));
  EXPECT_EQ(comm->nchannels, 4);
  EXPECT_EQ(comm->max_nchannels, 4);
  NCCL_OK(ncclCommDestroy(comm));
}

TEST_T(net_procs, striped_sockets_3, 240) {
  force_net();
  setenv("NCCL_SOCKET_NTHREADS", "2", 1);
  setenv("NCCL_NSOCKS_PERTHREAD", "2", 1);
  param_reset();
  rt_run_procs(3, striped_body, NULL);
  struct cu_sweep sw = {.types = net_types, .ntypes = 1, .ops = net_ops, .nops = 2, .big = {(size_t)3 << 20, 0}};
  rt_run_procs(3, cu_sweep_body, &sw);
}

/* Transports are one priority list (tp_table): a peer gets the first whose probe accepts it, with
 * NCCL's rules for NCCL_P2P_DISABLE / NCCL_SHM_DISABLE, and the layers above read only flags. */
TEST(tcp, transport_priority_list) {
  for (int k = 0; k < TP_COUNT; k++) {
    ASSERT(tp_table[k] != NULL && tp_table[k]->name && tp_table[k]->recv_setup && tp_table[k]->send_connect);
    EXPECT(!strcmp(tp_name(k), tp_table[k]->name));
  }
  EXPECT(tp_table[TP_COUNT - 1]->can_connect == NULL); /* the last row takes any peer */
  struct tp_peer self = {.self = 1, .same_host = 1, .same_proc = 1}, thread = {.same_host = 1, .same_proc = 1};
  struct tp_peer proc = {.same_host = 1}, remote = {0};
  const char* why = NULL;
  EXPECT_EQ(tp_choose(&self, &why), TP_LOCAL);
  EXPECT_EQ(tp_choose(&thread, &why), TP_LOCAL);
  EXPECT_EQ(tp_choose(&proc, &why), TP_SHM);
  EXPECT_EQ(tp_choose(&remote, &why), TP_TCP);
  EXPECT(why && strstr(why, "host"));
  setenv("NCCL_P2P_DISABLE", "1", 1);
  param_reset();
  EXPECT_EQ(tp_choose(&self, &why), TP_LOCAL); /* a rank always reaches itself */
  EXPECT_EQ(tp_choose(&thread, &why), TP_SHM);
  setenv("NCCL_SHM_DISABLE", "1", 1);
  param_reset();
  EXPECT_EQ(tp_choose(&thread, &why), TP_TCP);
  EXPECT_EQ(tp_choose(&proc, &why), TP_TCP);
  unsetenv("NCCL_P2P_DISABLE");
  unsetenv("NCCL_SHM_DISABLE");
  param_reset();
  EXPECT(tp_flags(TP_LOCAL) & TP_F_SAME_PROC);
  EXPECT((tp_flags(TP_SHM) & (TP_F_SAME_HOST | TP_F_PID_WATCH)) == (TP_F_SAME_HOST | TP_F_PID_WATCH));
  EXPECT((tp_flags(TP_TCP) & (TP_F_NETWORK | TP_F_SAME_HOST)) == TP_F_NETWORK);
}
