/* Several hosts on one machine (tools/netns-cluster.sh: network namespaces on one bridge). Suite
 * "cluster" brings the hosts up, runs this same binary as the ranks (suite "cluster_rank", whose
 * bodies do nothing unless started by the script) and always tears the hosts down; suite
 * "cluster_fabric" does the same over the OFI network (libfabric's tcp;ofi_rxm), in its own ctest
 * entry so that each keeps within its time limit.
 *
 * Without root, without `ip`, or where namespaces are not permitted, the cluster tests print SKIP and
 * pass. Tests that move data between hosts need the network transport: they first try one AllReduce
 * between two hosts and skip when the build says it has none (CHORUS_TEST_NET=1 runs them without
 * asking, =0 skips them). The fabric_* tests run the same over NCCL_NET=OFI (libfabric's tcp;ofi_rxm)
 * and skip where libfabric cannot be loaded. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "bootstrap/bootstrap.h"
#include "chorus.h"
#include "coll_util.h"
#include "elastic_util.h"
#include "comm/comm.h"
#include "misc/param.h"
#include "net/net.h"
#include "netns_util.h"
#include "runner.h"


/* The collective matrix over the network. Under a sanitizer (6 ranks on 2 CPUs, each 3-10x slower)
 * every type would take too long: four types that cover the kernels' families, and no large count.
 * Otherwise every type, with a count of 100003 elements in 32 KiB steps (NCCL_BUFFSIZE 256 KiB, set
 * by the caller): 3 to 25 steps, so the 8-slot FIFOs wrap as with 1M elements in the default 256 KiB
 * steps, at a tenth of the data (the matrix took 4 minutes per layout with 1M). */
static struct cu_sweep matrix_sweep(void) {
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
  static const int types[] = {ncclFloat32, ncclInt8, ncclBfloat16, ncclUint64};
  struct cu_sweep sw = {.types = types, .ntypes = 4};
#else
  struct cu_sweep sw = {.big = {100003}};
#endif
  return sw;
}

/* ---- the test side: hosts up, ranks run, hosts down (netns_util.c) ---- */

static int net_said_absent(const char* path) {
  int absent = access(path, F_OK) == 0;
  unlink(path);
  if (absent) printf("    SKIP: this build has no network transport between hosts (CHORUS_TEST_NET=1 forces the test)\n");
  return absent;
}

/* Ranks log their WARNs (a failure names its cause in the test output). */
static int cl_up(int hosts) {
  setenv("NCCL_DEBUG", "WARN", 1);
  return nn_up("ct", hosts);
}

static void wait_files(const char* stem, int n, int seconds) {
  for (int i = 0; i < seconds * 10 && nn_count(stem, n, 0) < n; i++) usleep(100000);
  ASSERT_EQ(nn_count(stem, n, 0), n);
}

TEST_T(cluster, init_barrier_3x2_interleaved, 240) {
  if (!cl_up(3)) return;
  setenv("CHORUS_CLUSTER_LAYOUT", "interleaved", 1);
  EXPECT_EQ(nn_run("", 6, 200, "cluster_rank.init_barrier"), 0);
  setenv("CHORUS_CLUSTER_LAYOUT", "blocked", 1);
  EXPECT_EQ(nn_run("--blocked", 6, 200, "cluster_rank.init_barrier"), 0);
  setenv("CHORUS_CLUSTER_LAYOUT", "interleaved", 1);
  setenv("CHORUS_CLUSTER_FAMILY", "6", 1);
  EXPECT_EQ(nn_run("--ipv6", 6, 200, "cluster_rank.init_barrier"), 0); /* NCCL_COMM_ID=[fd77::1]:port */
  nn_down();
}

TEST_T(cluster, wrong_socket_ifname, 240) {
  if (!cl_up(3)) return;
  setenv("NCCL_SOCKET_IFNAME", "=chorus-no-such-if", 1);
  EXPECT_EQ(nn_run("", 6, 200, "cluster_rank.init_fails"), 0);
  unsetenv("NCCL_SOCKET_IFNAME");
  nn_down();
}

/* The full collective x type x op matrix, 3 hosts x 2 ranks, ranks interleaved over hosts. */
TEST_T(cluster, coll_matrix_3x2_interleaved, 900) {
  if (!cl_up(3)) return;
  if (!nn_net_enabled("cluster_rank.net_probe")) {
    nn_down();
    return;
  }
  EXPECT_EQ(nn_run("", 6, 800, "cluster_rank.coll_matrix"), 0); /* 6 ranks on few cores: minutes */
  nn_down();
}

/* On 3 hosts x 2 ranks interleaved, runs the rank suite `body` once per value of the variable `var`
 * (the script passes the environment to the ranks), then unsets it. */
static void each_value_3x2(const char* var, const char* const* values, int nvalues, const char* body) {
  if (!cl_up(3)) return;
  if (!nn_net_enabled("cluster_rank.net_probe")) {
    nn_down();
    return;
  }
  for (int v = 0; v < nvalues; v++) {
    setenv(var, values[v], 1);
    printf("    %s=%s\n", var, values[v]);
    EXPECT_EQ(nn_run("", 6, 400, body), 0);
  }
  unsetenv(var);
  nn_down();
}

/* Each algorithm that talks to other ranks than its ring neighbours (RecDbl, Rabenseifner, Tree),
 * forced, across 3 hosts x 2 ranks interleaved: the double binary tree between hosts with a chain
 * inside each, folds and recursive-doubling pairs crossing hosts, over the network transport. */
TEST_T(cluster, peer_algorithms_3x2_interleaved, 900) {
  static const char* const algos[] = {"allreduce:RecDbl", "allreduce:Rabenseifner",
                                      "allreduce:Tree;broadcast:Tree;reduce:Tree"};
  each_value_3x2("NCCL_ALGO", algos, 3, "cluster_rank.algo_matrix");
}

/* Reproducible reductions across hosts (Owner over the network transport, shared memory inside a
 * host): each rank checks the definition's bits (tests/test_repro.c), at both levels. */
TEST_T(cluster, reproducible_3x2_interleaved, 900) {
  static const char* const levels[] = {"order", "exact"};
  each_value_3x2("CHORUS_REPRODUCIBLE", levels, 2, "cluster_rank.repro_matrix");
}

/* Host 2's link goes down in the middle of an AllReduce loop: every rank returns an error naming a
 * peer within the timeout. */
TEST_T(cluster, link_cut_mid_allreduce, 400) {
  if (!cl_up(3)) return;
  if (!nn_net_enabled("cluster_rank.net_probe")) {
    nn_down();
    return;
  }
  pid_t run = nn_start("", 6, 200, "cluster_rank.allreduce_until_error");
  wait_files("looping", 6, 120);
  sleep(1);
  EXPECT_EQ(nn_sh("%s link 2 down", nn_script()), 0);
  EXPECT_EQ(nn_wait(run), 0);
  nn_down();
}

/* A rank on host 2 dies by SIGKILL mid-loop: the others return an error naming a peer. */
TEST_T(cluster, sigkill_rank_on_other_host, 400) {
  if (!cl_up(3)) return;
  if (!nn_net_enabled("cluster_rank.net_probe")) {
    nn_down();
    return;
  }
  setenv("CHORUS_CLUSTER_KILL_RANK", "5", 1); /* host 5 mod 3 = 2 */
  pid_t run = nn_start("", 6, 200, "cluster_rank.allreduce_until_error");
  EXPECT(nn_wait(run) != 0); /* rank 5 was killed */
  EXPECT_EQ(nn_count("ok", 6, 0), 5);
  nn_down();
}

/* The elastic loop of grow.elastic_kill_shrink_grow_twice across hosts (issue 46): 4 ranks and 2 spares
 * on 2 hosts, process i on host i mod 2. Round 0's victim (process 3) is on host 1 and its replacement
 * (spare 4) on host 0 with rank 0, which hands out the grow ids; round 1's victim is that spare and its
 * replacement (spare 5) is on host 1. So each grow joins a process across the network. The ids travel
 * as files in the cluster directory; the two victims end their processes mid-call, the 4 others finish. */
TEST_T(cluster, elastic_grow_across_hosts, 400) {
  if (!cl_up(2)) return;
  if (!nn_net_enabled("cluster_rank.net_probe")) {
    nn_down();
    return;
  }
  EXPECT_EQ(nn_run("", ELASTIC_N + ELASTIC_ROUNDS, 300, "cluster_rank.elastic"), 0);
  EXPECT_EQ(nn_count("elastic_ok", ELASTIC_N + ELASTIC_ROUNDS, 0), ELASTIC_N);
  nn_down();
}

/* ---- the same over the fabric transport: NCCL_NET=OFI, Chorus's libfabric network on tcp;ofi_rxm ----
 * Each rank logs INIT and NET at INFO to its own file in the cluster directory (log.<pid>); the test
 * reads them to check that the fabric carried the data between hosts ("transports: ... fabric" in the
 * INIT line) and prints their WARN lines. */

/* 1 when libfabric loads here with the tcp;ofi_rxm provider (else SKIP printed); sets the ranks'
 * network. iface: FI_TCP_IFACE for the ranks (NULL: unset, every interface of the host). Call before
 * the hosts are up, so that a skipped test makes none. */
static const char* fab_net = "OFI"; /* the network the logs must name: OFI, or Socket (_socknet tests) */

static int fab_setup(const char* iface) {
  const char* e = getenv("CHORUS_TEST_NET");
  if (e && *e == '0') {
    printf("    SKIP: CHORUS_TEST_NET=0\n");
    return 0;
  }
  if (!strcmp(fab_net, "Socket")) { /* the socket network behind the net interface: no libfabric */
    setenv("NCCL_NET", "Socket", 1);
    setenv("CHORUS_SOCKET_NET", "1", 1);
    setenv("NCCL_NET_PLUGIN", "none", 1);
    param_reset();
    return 1;
  }
  setenv("NCCL_NET", "OFI", 1);
  setenv("NCCL_NET_PLUGIN", "none", 1);
  setenv("FI_PROVIDER", "tcp;ofi_rxm", 1);
  unsetenv("FI_TCP_IFACE"); /* this process's probe runs outside the hosts, where eth0 may not exist */
  param_reset();
  const char* why = NULL;
  if (ch_ofi_available(&why) != 0) {
    printf("    SKIP: the OFI network cannot start here: %s\n", why ? why : "?");
    return 0;
  }
  if (iface) setenv("FI_TCP_IFACE", iface, 1); /* libfabric 1.17 still lists lo too; the OFI network drops it */
  return 1;
}

/* After cl_up: the ranks log INIT and NET at INFO, each to <dir>/log.<pid>. */
static void fab_logs_on(void) {
  char path[256];
  snprintf(path, sizeof(path), "%s/log.%%p", nn_dir());
  setenv("NCCL_DEBUG", "INFO", 1);
  setenv("NCCL_DEBUG_SUBSYS", "INIT,NET", 1);
  setenv("NCCL_DEBUG_FILE", path, 1);
}

/* How many rank logs have a line matching the extended regex. */
static int fab_logs(const char* ere) {
  char cmd[512];
  snprintf(cmd, sizeof(cmd), "grep -l -E -e '%s' %s/log.* 2>/dev/null | wc -l", ere, nn_dir());
  fflush(stdout);
  FILE* p = popen(cmd, "r");
  int c = 0;
  if (p) {
    if (fscanf(p, "%d", &c) != 1) c = 0;
    pclose(p);
  }
  return c;
}

/* Print the rank logs' lines matching ere (at most max), indented. */
static void fab_logs_show(const char* ere, int max) {
  nn_sh("grep -h -E -e '%s' %s/log.* 2>/dev/null | head -n %d | sed 's/^/    /'", ere, nn_dir(), max);
}

/* Every one of the n ranks' logs says the OFI network served and its communicator used exactly the
 * transports `want` ("fabric", or "shm fabric" where ranks share a host), never the socket transport
 * ("tcp"). Clears the logs. */
static void fab_check_logs(int n, const char* want) {
  char ere[128];
  snprintf(ere, sizeof(ere), "transports: %s$", want);
  int got = fab_logs(ere);
  if (got != n) {
    rt_fail(__FILE__, __LINE__, "%d of %d rank logs say \"transports: %s\"", got, n, want);
    fab_logs_show("transports:|WARN", 20);
  }
  EXPECT_EQ(fab_logs("transports:.* tcp( |$)"), 0);
  char using[64];
  snprintf(using, sizeof(using), "NET: using %s", fab_net);
  EXPECT_EQ(fab_logs(using), n);
  nn_sh("rm -f %s/log.*", nn_dir());
}

/* The collective matrix, 2 hosts x 2 ranks blocked: shm inside each host, the fabric between them. */
TEST_T(cluster_fabric, coll_matrix_2x2_blocked, 900) {
  if (!fab_setup("eth0") || !cl_up(2)) return;
  fab_logs_on();
  EXPECT_EQ(nn_run("--blocked", 4, 800, "cluster_rank.coll_matrix"), 0);
  fab_logs_show("WARN", 10);
  fab_check_logs(4, "shm fabric");
  nn_down();
}

/* The collective matrix, 4 hosts x 1 rank: every peer over the fabric. */
TEST_T(cluster_fabric, coll_matrix_4x1, 900) {
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
  printf("    SKIP under a sanitizer: the 2x2 matrix covers the fabric paths; 4 hosts of ranks 3-10x slower would not fit\n");
  return;
#endif
  if (!fab_setup("eth0") || !cl_up(4)) return;
  fab_logs_on();
  EXPECT_EQ(nn_run("", 4, 800, "cluster_rank.coll_matrix"), 0);
  fab_logs_show("WARN", 10);
  fab_check_logs(4, "fabric");
  nn_down();
}

/* link_cut_mid_allreduce over the fabric: host 2's link goes down mid-loop (3 hosts x 2 ranks,
 * interleaved); every rank returns ncclRemoteError naming a peer within 60 s of its last success. */
TEST_T(cluster_fabric, link_cut_mid_allreduce, 400) {
  if (!fab_setup("eth0") || !cl_up(3)) return;
  fab_logs_on();
  pid_t run = nn_start("", 6, 200, "cluster_rank.allreduce_until_error");
  wait_files("looping", 6, 120);
  sleep(1);
  EXPECT_EQ(nn_sh("%s link 2 down", nn_script()), 0);
  EXPECT_EQ(nn_wait(run), 0);
  EXPECT_EQ(nn_count("ok", 6, 0), 6); /* host 2's ranks 2 and 5 too: cut off, they must fail as well */
  fab_logs_show("WARN", 12);
  fab_check_logs(6, "shm fabric");
  nn_down();
}

/* sigkill_rank_on_other_host over the fabric: rank 5 (host 2) dies by SIGKILL mid-loop; the other five
 * return ncclRemoteError naming a peer. */
TEST_T(cluster_fabric, sigkill_rank_on_other_host, 400) {
  if (!fab_setup("eth0") || !cl_up(3)) return;
  fab_logs_on();
  setenv("CHORUS_CLUSTER_KILL_RANK", "5", 1); /* host 5 mod 3 = 2 */
  pid_t run = nn_start("", 6, 200, "cluster_rank.allreduce_until_error");
  EXPECT(nn_wait(run) != 0); /* rank 5 was killed */
  EXPECT_EQ(nn_count("ok", 6, 0), 5);
  fab_logs_show("WARN", 12);
  fab_check_logs(6, "shm fabric"); /* rank 5's log too: it logs its init before dying */
  nn_down();
}

/* Two rails: 2 hosts x 1 rank, each host with eth0 and eth1 (two bridges, each link shaped to
 * 1 Gbit/s), FI_TCP_IFACE unset so libfabric lists both (and lo, which the OFI network drops). Two
 * channels: the four fabric connections of each rank take devices 0 and 1 in turn. A 64 MiB
 * AllReduce, checked; the logs must show both devices in use. Not timed (a shared machine). */
TEST_T(cluster_fabric, two_rails_2x1, 300) {
  if (!fab_setup(NULL) || !nn_up_opts("ct", 2, "--rails 2 --rate 1gbit")) return;
  fab_logs_on();
  setenv("NCCL_MIN_NCHANNELS", "2", 1);
  setenv("NCCL_MAX_NCHANNELS", "2", 1);
  EXPECT_EQ(nn_run("", 2, 240, "cluster_rank.allreduce_64m"), 0);
  EXPECT_EQ(nn_count("ok", 2, 0), 2);
  fab_logs_show("WARN", 10);
  fab_logs_show("NET/OFI: provider", 2);
  for (int dev = 0; dev < 2; dev++) {
    char ere[96];
    snprintf(ere, sizeof(ere), "fabric connection .* up on %s device %d$", fab_net, dev);
    int got = fab_logs(ere);
    if (got != 2) {
      rt_fail(__FILE__, __LINE__, "%d of 2 rank logs show a fabric connection on device %d", got, dev);
      fab_logs_show("fabric connection|NET/OFI: provider", 20);
    }
  }
  char both[96];
  snprintf(both, sizeof(both), "NET: using %s .*, 2 devices: 0:eth[01] .* 1:eth[01] ", fab_net);
  EXPECT_EQ(fab_logs(both), 2); /* both rails, no lo */
  fab_check_logs(2, "fabric");
  nn_down();
}

/* The same over the socket network behind the net interface (CHORUS_SOCKET_NET=1): between hosts,
 * a cut link, and one device per interface carrying the rails. One line with its #define: the suite
 * scan registers lines that start with TEST_T( (the suite is registered above). */
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define FAB_SOCK_SANITIZED 1 /* the OFI runs above and fabric_*_socknet cover these paths there */
#else
#define FAB_SOCK_SANITIZED 0
#endif
#define FAB_SOCK(name, timeout) TEST_T(cluster_fabric, name##_socknet, timeout) { \
    if (FAB_SOCK_SANITIZED) { printf("    SKIP under a sanitizer (CI time)\n"); return; } \
    fab_net = "Socket";                                                           \
    test_cluster_fabric_##name();                                                 \
  }
FAB_SOCK(coll_matrix_2x2_blocked, 900)
FAB_SOCK(link_cut_mid_allreduce, 400)
FAB_SOCK(two_rails_2x1, 300)

/* Every collective with the network forced between ranks of one host (NCCL's NCCL_SHM_DISABLE=1 with
 * NCCL_P2P_DISABLE=1); no namespaces needed. */
static void local_probe(int rank, int nranks, ncclUniqueId id, void* arg) {
  ncclComm_t comm = cu_comm_init(rank, nranks, id);
  float x = 1;
  if (ncclAllReduce(&x, &x, 1, ncclFloat, ncclSum, comm, NULL) != ncclSuccess &&
      strstr(ncclGetLastError(comm), "not available in this version")) {
    int fd = open((const char*)arg, O_CREAT | O_WRONLY | O_CLOEXEC, 0600);
    if (fd >= 0) close(fd);
  }
  ncclCommAbort(comm);
}

TEST_T(cluster, net_forced_between_local_procs, 600) {
  setenv("NCCL_SHM_DISABLE", "1", 1);
  setenv("NCCL_P2P_DISABLE", "1", 1);
  setenv("NCCL_BUFFSIZE", "262144", 1); /* small steps (matrix_sweep) */
  param_reset();
  const char* e = getenv("CHORUS_TEST_NET");
  if (e && *e == '0') return;
  if (!e || *e != '1') {
    char path[128];
    snprintf(path, sizeof(path), "/tmp/chorus-nonet-%d", (int)getpid());
    rt_run_procs(2, local_probe, path);
    if (net_said_absent(path)) return;
  }
  struct cu_sweep sw = matrix_sweep();
  rt_run_procs(4, cu_sweep_body, &sw);
}

/* ---- the rank side: run by the script inside a host; nothing to do elsewhere ---- */

static int cl_rank(int* rank, int* nranks, int* host) { return nn_rank("cluster", rank, nranks, host); }
static void mark(const char* stem, int rank) { nn_file(stem, rank, NULL); }

TEST_T(cluster_rank, init_barrier, 120) {
  int rank, n, host;
  if (!cl_rank(&rank, &n, &host)) return;
  ncclComm_t comm;
  NCCL_OK(chorusInitFromEnv(&comm));
  int lr = atoi(getenv("LOCAL_RANK"));
  EXPECT_EQ(comm->local_rank, lr);
  EXPECT_EQ(comm->local_nranks, atoi(getenv("LOCAL_WORLD_SIZE")));
  int32_t* hosts = calloc((size_t)n, sizeof(int32_t));
  ASSERT(hosts);
  hosts[rank] = host;
  ASSERT_EQ(boot_allgather(comm->boot, hosts, sizeof(int32_t)), CH_OK);
  int nhosts = 0;
  for (int r = 0; r < n; r++) nhosts = hosts[r] + 1 > nhosts ? hosts[r] + 1 : nhosts;
  EXPECT_EQ(comm->nnodes, nhosts);
  int interleaved = !strcmp(getenv("CHORUS_CLUSTER_LAYOUT"), "interleaved");
  for (int r = 0; r < n; r++) EXPECT_EQ(hosts[r], interleaved ? r % nhosts : r / ((n + nhosts - 1) / nhosts));
  /* the ring crosses each host boundary once: as many crossings as hosts, whatever the numbering */
  const struct ch_channel* ch = &comm->channels[0];
  int crossings = 0;
  for (int i = 0; i < n; i++) crossings += hosts[ch->ring[i]] != hosts[ch->ring[(i + 1) % n]];
  EXPECT_EQ(crossings, nhosts);
  EXPECT_EQ(ch->ring[ch->ring_index], rank);
  /* what each rank advertises is its own host's address on the cluster, never loopback */
  const char* fam = getenv("CHORUS_CLUSTER_FAMILY");
  for (int r = 0; r < n; r++) {
    const union sock_addr* a = &comm->peers[r].listen_addr;
    char s[64];
    sock_addr_str(a, s, sizeof(s));
    if (fam && !strcmp(fam, "6")) {
      char want[32];
      snprintf(want, sizeof(want), "[fd77::%x]:", hosts[r] + 1);
      if (strncmp(s, want, strlen(want))) rt_fail(__FILE__, __LINE__, "rank %d advertises %s, want %s*", r, s, want);
    } else {
      char want[32];
      snprintf(want, sizeof(want), "10.77.0.%d:", hosts[r] + 1);
      if (strncmp(s, want, strlen(want))) rt_fail(__FILE__, __LINE__, "rank %d advertises %s, want %s*", r, s, want);
    }
  }
  ASSERT_EQ(boot_barrier(comm->boot), CH_OK);
  free(hosts);
  NCCL_OK(ncclCommDestroy(comm));
}

/* Ids as files: hex text, so that nn_file's text interface carries them. */
static void id_put(void* ctx, int k, const ncclUniqueId* id) {
  char hex[2 * NCCL_UNIQUE_ID_BYTES + 1];
  for (int i = 0; i < NCCL_UNIQUE_ID_BYTES; i++) snprintf(hex + 2 * i, 3, "%02x", (unsigned char)id->internal[i]);
  nn_file((const char*)ctx, k, hex);
}
static ncclUniqueId id_get(void* ctx, int k) {
  char hex[2 * NCCL_UNIQUE_ID_BYTES + 2] = "";
  /* up to 4 minutes (the rounds before it run first); a file is whole once it has every digit */
  for (int t = 0; t < 2400 && !(nn_read((const char*)ctx, k, hex, sizeof hex) && strlen(hex) == 2 * NCCL_UNIQUE_ID_BYTES);
       t++)
    usleep(100000);
  ncclUniqueId id;
  ASSERT(strlen(hex) == 2 * NCCL_UNIQUE_ID_BYTES);
  for (int i = 0; i < NCCL_UNIQUE_ID_BYTES; i++) {
    unsigned v = 0;
    ASSERT(sscanf(hex + 2 * i, "%2x", &v) == 1);
    id.internal[i] = (char)v;
  }
  return id;
}

TEST_T(cluster_rank, elastic, 300) {
  int proc, n, host;
  if (!cl_rank(&proc, &n, &host)) return;
  ASSERT_EQ(n, ELASTIC_N + ELASTIC_ROUNDS);
  ncclComm_t comm = NULL;
  if (proc < ELASTIC_N) {
    ncclUniqueId id;
    if (proc == 0) {
      NCCL_OK(ncclGetUniqueId(&id));
      id_put("eid", 0, &id);
    } else {
      id = id_get("eid", 0);
    }
    NCCL_OK(ncclCommInitRank(&comm, ELASTIC_N, id, proc));
  }
  struct elastic_ids ids = {id_put, id_get, "gid"};
  if (elastic_run(comm, proc, &ids)) mark("elastic_ok", proc);
}

TEST_T(cluster_rank, init_fails, 120) {
  int rank, n, host;
  if (!cl_rank(&rank, &n, &host)) return;
  ncclComm_t comm = NULL;
  ncclResult_t r = chorusInitFromEnv(&comm);
  EXPECT_EQ(r, ncclInvalidUsage);
  const char* e = ncclGetLastError(NULL);
  if (!strstr(e, "interfaces that are up") || !strstr(e, "eth0:"))
    rt_fail(__FILE__, __LINE__, "rank %d: the error does not list the interfaces: %s", rank, e);
  if (comm) ncclCommDestroy(comm);
}

/* A rank started by the cluster script, with the job's id from NCCL_COMM_ID; 0: not such a rank. */
static int cl_rank_id(int* rank, int* n, ncclUniqueId* id) {
  int host;
  if (!cl_rank(rank, n, &host)) return 0;
  memset(id, 0, sizeof(*id));
  ASSERT_EQ(boot_id_from_addr(getenv("NCCL_COMM_ID"), id->internal), CH_OK);
  return 1;
}

TEST_T(cluster_rank, coll_matrix, 800) {
  int rank, n;
  ncclUniqueId id;
  if (!cl_rank_id(&rank, &n, &id)) return;
  setenv("NCCL_BUFFSIZE", "262144", 1); /* every rank alike: small steps (matrix_sweep) */
  param_reset();
  struct cu_sweep sw = matrix_sweep();
  cu_sweep_body(rank, n, id, &sw);
}

/* AllReduce, Broadcast and Reduce under the NCCL_ALGO the test side set: a few types and ops, counts
 * up to 70001 elements (several FIFO steps). */
TEST_T(cluster_rank, algo_matrix, 400) {
  int rank, n;
  ncclUniqueId id;
  if (!cl_rank_id(&rank, &n, &id)) return;
  static const int types[] = {ncclFloat32, ncclInt8, ncclBfloat16};
  static const int ops[] = {CU_SUM, CU_AVG, CU_PREMUL_DEV};
  struct cu_sweep sw = {.colls = 1u << CU_ALLREDUCE | 1u << CU_BROADCAST | 1u << CU_REDUCE, .types = types,
                        .ntypes = 3, .ops = ops, .nops = 3, .big = {70001}};
  cu_sweep_body(rank, n, id, &sw);
}

void repro_cluster_cases(int rank, int n, ncclUniqueId id, int level); /* tests/test_repro.c */
TEST_T(cluster_rank, repro_matrix, 400) {
  int rank, n;
  ncclUniqueId id;
  if (!cl_rank_id(&rank, &n, &id)) return;
  const char* v = getenv("CHORUS_REPRODUCIBLE");
  repro_cluster_cases(rank, n, id, v && !strcmp(v, "exact") ? 2 : 1);
}

/* AllReduce in a loop until a call fails (a cut link or a dead peer): the failure must come within
 * 60 s of the last success and name a peer rank. Writes ok<rank> when it did. */
TEST_T(cluster_rank, allreduce_until_error, 180) {
  int rank, n, host;
  if (!cl_rank(&rank, &n, &host)) return;
  const char* kill_rank = getenv("CHORUS_CLUSTER_KILL_RANK");
  ncclComm_t comm;
  NCCL_OK(chorusInitFromEnv(&comm));
  size_t count = 1 << 18;
  float* v = malloc(count * sizeof(float));
  ASSERT(v);
  for (size_t i = 0; i < count; i++) v[i] = 1.0f;
  mark("looping", rank);
  ncclResult_t r = ncclSuccess;
  time_t last_ok = time(NULL);
  for (int it = 0; r == ncclSuccess && time(NULL) - last_ok < 60; it++) {
    if (kill_rank && atoi(kill_rank) == rank && it == 20) raise(SIGKILL);
    r = ncclAllReduce(v, v, count, ncclFloat, ncclMax, comm, NULL);
    if (r == ncclSuccess) last_ok = time(NULL);
  }
  if (r == ncclSuccess) {
    rt_fail(__FILE__, __LINE__, "rank %d: no error within 60 s of the failure", rank);
  } else {
    const char* e = ncclGetLastError(comm);
    ncclResult_t as = ncclSuccess;
    ncclCommGetAsyncError(comm, &as);
    printf("rank %d: %s; async error %s; last error: %s\n", rank, ncclGetErrorString(r), ncclGetErrorString(as), e);
    EXPECT(strstr(e, "rank") != NULL);
    EXPECT_EQ(r, ncclRemoteError);
    if (!rt_failures()) mark("ok", rank);
  }
  free(v);
  ncclCommAbort(comm);
}

/* One 64 MiB AllReduce (sum of floats whose sums are exact), checked element by element. Writes
 * ok<rank> when it passed. */
TEST_T(cluster_rank, allreduce_64m, 240) {
  int rank, n, host;
  if (!cl_rank(&rank, &n, &host)) return;
  ncclComm_t comm;
  NCCL_OK(chorusInitFromEnv(&comm));
  size_t count = (64u << 20) / sizeof(float);
  float* v = malloc(count * sizeof(float));
  ASSERT(v);
  for (size_t i = 0; i < count; i++) v[i] = (float)((rank + 1) * (int)(i % 1021));
  NCCL_OK(ncclAllReduce(v, v, count, ncclFloat, ncclSum, comm, NULL));
  size_t bad = 0, first = 0;
  float want_sum = (float)(n * (n + 1) / 2);
  for (size_t i = 0; i < count; i++) {
    if (v[i] != want_sum * (float)(int)(i % 1021) && bad++ == 0) first = i;
  }
  if (bad)
    rt_fail(__FILE__, __LINE__, "rank %d: %zu wrong elements, the first at %zu: %g, want %g", rank, bad, first,
            (double)v[first], (double)(want_sum * (float)(int)(first % 1021)));
  else
    mark("ok", rank);
  free(v);
  NCCL_OK(ncclCommDestroy(comm));
}

/* Whether the network carries a collective between two hosts: writes nonet when the build says it
 * has no transport; any other failure is left to the real test to report. */
TEST_T(cluster_rank, net_probe, 120) {
  int rank, n, host;
  if (!cl_rank(&rank, &n, &host)) return;
  ncclComm_t comm;
  NCCL_OK(chorusInitFromEnv(&comm));
  float x = 1;
  if (ncclAllReduce(&x, &x, 1, ncclFloat, ncclSum, comm, NULL) != ncclSuccess &&
      strstr(ncclGetLastError(comm), "not available in this version"))
    mark("nonet", 0);
  ncclCommAbort(comm);
}
