/* Bootstrap and the misc layer under it: rendezvous, peer messages, hostile connections, version
 * and rank-count mismatches, timeouts, abort, leaks; parameters, logging, sockets. */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <netdb.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

#include "bootstrap/boot_internal.h"
#include "bootstrap/bootstrap.h"
#include "chorus.h"
#include "misc/log.h"
#include "misc/param.h"
#include "misc/socket.h"
#include "misc/utils.h"
#include "runner.h"

#define SEC 1000000000ull

static uint64_t now_ms(void) { return ut_now_ns() / 1000000; }

static const union sock_addr* id_root(const void* id128) {
  static __thread struct boot_id id;
  memcpy(&id, id128, sizeof(id));
  return &id.root;
}

/* The id for a run: from arg when the test made one, else the runner's. */
static const void* pick_id(const ncclUniqueId* runner_id, void* arg) {
  return arg ? ((ncclUniqueId*)arg)->internal : runner_id->internal;
}

/* ---- the normal path ---- */

static void exercise(struct boot_state* b, int rank, int nranks) {
  int64_t* v = calloc((size_t)nranks, sizeof(*v));
  ASSERT(v);
  v[rank] = rank * 100 + 7;
  ASSERT_EQ(boot_allgather(b, v, sizeof(*v)), CH_OK);
  for (int r = 0; r < nranks; r++) EXPECT_EQ(v[r], r * 100 + 7);
  free(v);

  /* Larger than socket buffers, so sends block and must keep reading meanwhile. */
  size_t big = 1 << 20;
  unsigned char* d = malloc(big * (size_t)nranks);
  ASSERT(d);
  memset(d + (size_t)rank * big, rank + 1, big);
  ASSERT_EQ(boot_allgather(b, d, big), CH_OK);
  for (int r = 0; r < nranks; r++) EXPECT(d[(size_t)r * big] == r + 1 && d[(size_t)r * big + big - 1] == r + 1);
  free(d);

  /* Everyone to everyone, two tags, received in the opposite order. */
  for (int p = 0; p < nranks; p++) {
    int x = rank * 1000 + p, y = -x;
    ASSERT_EQ(boot_send(b, p, 11, &x, sizeof(x)), CH_OK);
    ASSERT_EQ(boot_send(b, p, 12, &y, sizeof(y)), CH_OK);
  }
  for (int p = nranks - 1; p >= 0; p--) {
    int x = 0, y = 0;
    ASSERT_EQ(boot_recv(b, p, 12, &y, sizeof(y)), CH_OK);
    ASSERT_EQ(boot_recv(b, p, 11, &x, sizeof(x)), CH_OK);
    EXPECT_EQ(x, p * 1000 + rank);
    EXPECT_EQ(y, -(p * 1000 + rank));
  }
  for (int i = 0; i < 3; i++) ASSERT_EQ(boot_barrier(b), CH_OK);
}

static void basic_rank(int rank, int nranks, ncclUniqueId id, void* arg) {
  struct boot_state* b = NULL;
  struct boot_rank_info* peers = NULL;
  ASSERT_EQ(boot_init(pick_id(&id, arg), rank, nranks, NULL, ut_now_ns() + 20 * SEC, &b, &peers), CH_OK);
  for (int r = 0; r < nranks; r++) {
    EXPECT_EQ(peers[r].rank, r);
    EXPECT_EQ(peers[r].nranks, nranks);
    EXPECT_EQ(peers[r].lib_version, CHORUS_VERSION_CODE);
    EXPECT(sock_addr_port(&peers[r].listen_addr) != 0);
    EXPECT(peers[r].host_hash == ut_host_hash());
  }
  exercise(b, rank, nranks);
  boot_close(b);
  free(peers);
}

TEST(bootstrap, init_allgather_sendrecv_4) { rt_run_both(4, basic_rank, NULL); }

TEST(bootstrap, single_rank) { rt_run_threads(1, basic_rank, NULL); }

/* Many ranks on two cores: everyone waiting must leave the CPU to the others. */
static void many_rank(int rank, int nranks, ncclUniqueId id, void* arg) {
  struct boot_state* b = NULL;
  ASSERT_EQ(boot_init(id.internal, rank, nranks, NULL, ut_now_ns() + 30 * SEC, &b, NULL), CH_OK);
  int* v = calloc((size_t)nranks, sizeof(*v));
  ASSERT(v);
  v[rank] = rank + 1;
  ASSERT_EQ(boot_allgather(b, v, sizeof(*v)), CH_OK);
  for (int r = 0; r < nranks; r++) EXPECT_EQ(v[r], r + 1);
  ASSERT_EQ(boot_barrier(b), CH_OK);
  free(v);
  boot_close(b);
}

/* "127.0.0.1:<port>" with a port that was free a moment ago (nobody listens on it now). */
static void free_local_port(char* buf, size_t n) {
  struct sock l;
  union sock_addr lo;
  ASSERT_EQ(sock_parse_addr("127.0.0.1:0", &lo), CH_OK);
  ASSERT_EQ(sock_listen(&lo, &l), CH_OK);
  snprintf(buf, n, "127.0.0.1:%d", sock_addr_port(&l.addr));
  sock_close(&l);
}

TEST(bootstrap, init_64_ranks) { rt_run_both(64, many_rank, NULL); }

/* The ranks gather the table by doubling, whose last step fetches only what is missing and whose
 * first needs only the next rank's address (the root sends nothing else): every count must work,
 * not only powers of two (before, the root sent every rank the whole table). */
TEST(bootstrap, gather_any_count) {
  for (int n = 2; n <= 13; n++) rt_run_threads(n, basic_rank, NULL);
  rt_run_procs(7, basic_rank, NULL);
}

/* What a peer forwards of the table is checked entry by entry (boot_check_info; fuzz_table.c). */
/* ---- several roots (ncclCommInitRankScalable) ---- */

/* Ids for one run (a root serves one job): made in the test's process, which hosts their roots
 * whether the ranks are its threads or its children. */
struct ids_arg {
  int nids;
  ncclUniqueId ids[4];
  int odd_rank;            /* -1, or the rank given odd_ids instead */
  ncclUniqueId odd_ids[4];
};

static void make_ids(struct ids_arg* a, int nids) {
  memset(a, 0, sizeof(*a));
  a->nids = nids;
  a->odd_rank = -1;
  for (int i = 0; i < nids; i++) ASSERT_EQ(boot_get_unique_id(a->ids[i].internal), CH_OK);
}

static void ids_rank(int rank, int nranks, ncclUniqueId id, void* arg) {
  struct ids_arg* a = arg;
  struct boot_state* b = NULL;
  struct boot_rank_info* peers = NULL;
  ASSERT_EQ(boot_init_ids(a->ids, a->nids, rank, nranks, NULL, ut_now_ns() + 30 * SEC, &b, &peers), CH_OK);
  for (int r = 0; r < nranks; r++) { /* every rank has every rank's entry */
    EXPECT_EQ(peers[r].rank, r);
    EXPECT_EQ(peers[r].nranks, nranks);
    EXPECT_EQ(peers[r].nids, a->nids);
    EXPECT(peers[r].ids_digest == peers[rank].ids_digest);
    EXPECT(sock_addr_port(&peers[r].listen_addr) != 0);
  }
  int* v = calloc((size_t)nranks, sizeof(*v));
  ASSERT(v);
  v[rank] = rank + 1;
  ASSERT_EQ(boot_allgather(b, v, sizeof(*v)), CH_OK);
  for (int r = 0; r < nranks; r++) EXPECT_EQ(v[r], r + 1);
  int next = (rank + 1) % nranks, prev = (rank + nranks - 1) % nranks, x = -1;
  ASSERT_EQ(boot_send(b, next, 5, &rank, sizeof(rank)), CH_OK); /* the ring across the blocks' seams */
  ASSERT_EQ(boot_recv(b, prev, 5, &x, sizeof(x)), CH_OK);
  EXPECT_EQ(x, prev);
  ASSERT_EQ(boot_barrier(b), CH_OK);
  free(v);
  free(peers);
  boot_close(b);
}

static void run_ids(int procs, int nranks, int nids) {
  struct ids_arg a;
  make_ids(&a, nids);
  if (procs) rt_run_procs(nranks, ids_rank, &a);
  else rt_run_threads(nranks, ids_rank, &a);
}

/* NCCL's mapping: blocks as even as can be, the first nranks % nids one larger. */
TEST(bootstrap, root_blocks_match_nccl) {
  /* 10 ranks on 4 roots: 3, 3, 2, 2 (NCCL's firstRankFromRoot: 0, 3, 6, 8) */
  int first[5] = {0, 3, 6, 8, 10};
  for (int i = 0; i <= 4; i++) EXPECT_EQ(boot_root_first(i, 10, 4), first[i]);
  for (int n = 1; n <= 70; n++)
    for (int k = 1; k <= n && k <= 9; k++)
      for (int r = 0; r < n; r++) {
        int i = boot_root_of(r, n, k);
        EXPECT(i >= 0 && i < k && boot_root_first(i, n, k) <= r && r < boot_root_first(i + 1, n, k));
      }
}

/* Several ids spread the join over several roots; each root serves its block and links it to the
 * next (before, only commIds[0] was used). */
TEST_T(bootstrap, several_roots_threads, 120) {
  run_ids(0, 7, 2);
  run_ids(0, 7, 3);
  run_ids(0, 7, 4);
  run_ids(0, 4, 4); /* one rank a root: each is its block's first and last */
  run_ids(0, 10, 3);
  run_ids(0, 64, 4);
}

TEST_T(bootstrap, several_roots_procs, 120) {
  run_ids(1, 7, 2);
  run_ids(1, 9, 3);
  run_ids(1, 64, 4);
}

/* More ids than ranks is refused, as NCCL does (ncclCommInitRankDev: nId > nranks). */
TEST(bootstrap, more_ids_than_ranks_refused) {
  struct ids_arg a;
  make_ids(&a, 3);
  struct boot_state* b = NULL;
  EXPECT_EQ(boot_init_ids(a.ids, 3, 0, 2, NULL, ut_now_ns() + SEC, &b, NULL), CH_INVALID_ARG);
  EXPECT(strstr(log_last_error(), "3 unique ids for 2 ranks") != NULL);
  EXPECT_EQ(boot_init_ids(a.ids, 0, 0, 2, NULL, ut_now_ns() + SEC, &b, NULL), CH_INVALID_ARG);
}

static void odd_ids_rank(int rank, int nranks, ncclUniqueId id, void* arg) {
  struct ids_arg* a = arg;
  struct boot_state* b = NULL;
  /* The odd rank is in first, so that its root is still waiting for the others (a root whose block
   * is complete has closed: a rank late to it is reported missing at the deadline instead). */
  if (rank != a->odd_rank) usleep(1500000); /* 300 ms was once too little under ctest -j 2 */
  const ncclUniqueId* ids = rank == a->odd_rank ? a->odd_ids : a->ids;
  ch_status st = boot_init_ids(ids, a->nids, rank, nranks, NULL, ut_now_ns() + 20 * SEC, &b, NULL);
  const char* e = log_last_error();
  /* a rank of a block whose root did not see the odd rank may hear first that its link left */
  if (rank == a->odd_rank) EXPECT_EQ(st, CH_INVALID_USAGE);
  else EXPECT(st == CH_INVALID_USAGE || st == CH_REMOTE);
  if (!strstr(e, "different lists of unique ids") && !strstr(e, "left after joining"))
    rt_fail(__FILE__, __LINE__, "rank %d: unexpected report: %s", rank, e);
  if (rank == a->odd_rank && !strstr(e, "different lists of unique ids"))
    rt_fail(__FILE__, __LINE__, "rank %d: unexpected report: %s", rank, e);
  if (st == CH_OK) boot_close(b);
}

/* A rank given another list (the same ids in another order, or another id) fails, and so does every
 * rank, each with a report, well before the deadline: its root compares every joiner's list, and a
 * rank that leaves its own root's block for it is reported there ("left after joining"). */
TEST_T(bootstrap, different_id_lists_fail, 90) {
  for (int mode = 0; mode < 2; mode++)
    for (int procs = 0; procs < 2; procs++) {
      struct ids_arg a;
      make_ids(&a, 2);
      a.odd_rank = 3;
      if (mode == 0) { /* swapped: rank 3 goes to the first block's root */
        a.odd_ids[0] = a.ids[1];
        a.odd_ids[1] = a.ids[0];
      } else { /* rank 0 keeps its root but has another second id */
        a.odd_rank = 0;
        a.odd_ids[0] = a.ids[0];
        ASSERT_EQ(boot_get_unique_id(a.odd_ids[1].internal), CH_OK);
      }
      uint64_t t0 = now_ms();
      if (procs) rt_run_procs(4, odd_ids_rank, &a);
      else rt_run_threads(4, odd_ids_rank, &a);
      EXPECT(now_ms() - t0 < 15000);
    }
}

/* Out of descriptors on our side is our limit, not a dead peer: before, a connection that socket()
 * refused with EMFILE was reported as "rank P ... is gone" (RemoteError), which sent users looking
 * for a crash (512 thread ranks' AlltoAll, issue 44). */
static void emfile_rank(int rank, int nranks, ncclUniqueId id, void* arg) {
  struct boot_state* b = NULL;
  ASSERT_EQ(boot_init(id.internal, rank, nranks, NULL, ut_now_ns() + 20 * SEC, &b, NULL), CH_OK);
  ASSERT_EQ(boot_barrier(b), CH_OK);
  int x = 42, y = 0;
  if (rank == 0) { /* rank 3 is no gather or barrier partner of rank 0 among 8: a new connection */
    struct rlimit old, low;
    ASSERT(getrlimit(RLIMIT_NOFILE, &old) == 0);
    low = old;
    low.rlim_cur = (rlim_t)rt_count_fds();
    ASSERT(setrlimit(RLIMIT_NOFILE, &low) == 0);
    int held[256], nheld = 0; /* the free numbers below the limit, taken */
    while (nheld < 256 && (held[nheld] = dup(0)) >= 0) nheld++;
    ch_status st = boot_send(b, 3, 9, &x, sizeof(x));
    while (nheld > 0) close(held[--nheld]);
    ASSERT(setrlimit(RLIMIT_NOFILE, &old) == 0);
    EXPECT_EQ(st, CH_SYSTEM);
    EXPECT(strstr(log_last_error(), "cannot open a connection to rank 3") != NULL);
    EXPECT(strstr(log_last_error(), "is gone") == NULL);
    EXPECT_EQ(boot_send(b, 3, 9, &x, sizeof(x)), CH_OK); /* the peer was not written off */
  } else if (rank == 3) {
    EXPECT_EQ(boot_recv(b, 0, 9, &y, sizeof(y)), CH_OK);
    EXPECT_EQ(y, 42);
  }
  ASSERT_EQ(boot_barrier(b), CH_OK);
  boot_close(b);
}

TEST(bootstrap, out_of_descriptors_is_not_a_dead_peer) { rt_run_procs(8, emfile_rank, NULL); }

TEST(bootstrap, table_entry_checks) {
  struct boot_rank_info t, good;
  char why[96];
  memset(&good, 0, sizeof(good));
  good.rank = 3;
  good.nranks = 8;
  ASSERT_EQ(sock_parse_addr("127.0.0.1:4000", &good.listen_addr), CH_OK);
  snprintf(good.hostname, sizeof(good.hostname), "h");
  t = good;
  EXPECT_EQ(boot_check_info(&t, 3, 8, why, sizeof(why)), 0);
  t = good;
  EXPECT_EQ(boot_check_info(&t, 4, 8, why, sizeof(why)), -1); /* another rank's slot */
  EXPECT(strstr(why, "rank") != NULL);
  t = good;
  EXPECT_EQ(boot_check_info(&t, 3, 9, why, sizeof(why)), -1);
  t = good;
  memset(&t.listen_addr, 0, sizeof(t.listen_addr));
  EXPECT_EQ(boot_check_info(&t, 3, 8, why, sizeof(why)), -1);
  EXPECT(strstr(why, "listen address") != NULL);
  t = good;
  t.query_addr.sa.sa_family = AF_UNIX;
  EXPECT_EQ(boot_check_info(&t, 3, 8, why, sizeof(why)), -1);
  t = good;
  memset(t.hostname, 'x', sizeof(t.hostname)); /* not terminated: cut, still printable */
  EXPECT_EQ(boot_check_info(&t, 3, 8, why, sizeof(why)), 0);
  EXPECT(strlen(t.hostname) < sizeof(t.hostname));
  t = good;
  t.host_id[0] = 7;
  EXPECT_EQ(boot_check_info(&t, 3, 8, why, sizeof(why)), -1);
  EXPECT(strstr(why, "host name") != NULL);
}

/* NCCL_COMM_ID: rank 0 hosts the root on a fixed port; twice in a row reuses the port. */
TEST(bootstrap, comm_id_fixed_root) {
  char env[64];
  free_local_port(env, sizeof(env));
  setenv("NCCL_COMM_ID", env, 1);
  param_reset();
  ncclUniqueId id;
  for (int round = 0; round < 2; round++) {
    ASSERT_EQ(boot_get_unique_id(id.internal), CH_OK);
    EXPECT_EQ(sock_addr_port(id_root(id.internal)), atoi(strchr(env, ':') + 1));
    rt_run_threads(4, basic_rank, &id);
    rt_run_procs(4, basic_rank, &id);
  }
}

/* 8 processes must meet quickly (the whole rendezvous, not counting fork). */
static void timed_rank(int rank, int nranks, ncclUniqueId id, void* arg) {
  struct boot_state* b = NULL;
  uint64_t t0 = ut_now_ns();
  ASSERT_EQ(boot_init(id.internal, rank, nranks, NULL, 0, &b, NULL), CH_OK);
  ASSERT_EQ(boot_barrier(b), CH_OK);
  double ms = (double)(ut_now_ns() - t0) / 1e6;
  if (rank == 0) printf("    8-process init + barrier: %.1f ms on rank 0\n", ms);
  EXPECT(ms < 1000); /* loose: the machine is shared; typical is a few ms */
  boot_close(b);
}

TEST(bootstrap, init_8_procs_fast) { rt_run_procs(8, timed_rank, NULL); }

/* ---- split-style bootstrap without a root ---- */

static void table_rank(int rank, int nranks, ncclUniqueId id, void* arg) {
  struct boot_state* b = NULL;
  ASSERT_EQ(boot_init(id.internal, rank, nranks, NULL, ut_now_ns() + 20 * SEC, &b, NULL), CH_OK);
  struct sock l;
  ASSERT_EQ(boot_new_listener(b, &l), CH_OK);
  union sock_addr* all = calloc((size_t)nranks, sizeof(*all));
  ASSERT(all);
  all[rank] = l.addr;
  ASSERT_EQ(boot_allgather(b, all, sizeof(*all)), CH_OK);
  /* Even and odd ranks form two groups, in reverse order. */
  int m = 0, me = -1;
  union sock_addr sub[64];
  for (int r = nranks - 1; r >= 0; r--)
    if (r % 2 == rank % 2) {
      if (r == rank) me = m;
      sub[m++] = all[r];
    }
  struct boot_state* c = NULL;
  ASSERT_EQ(boot_init_from_table(me, m, boot_secret(b), sub, &l, NULL, &c), CH_OK);
  exercise(c, me, m);
  boot_close(c);
  ASSERT_EQ(boot_barrier(b), CH_OK);
  boot_close(b);
  free(all);
}

TEST(bootstrap, init_from_table) { rt_run_both(4, table_rank, NULL); }

/* ---- hostile and broken peers ---- */

static int raw_connect(const union sock_addr* a) {
  struct sock s;
  struct sock_wait w = {NULL, ut_now_ns() + 5 * SEC};
  return sock_connect(a, &s, &w) == CH_OK ? s.fd : -1;
}

/* Open connections the root or a rank must shrug off; returns how many fds are in out[]. */
static int hostile_connections(const union sock_addr* a, int out[8]) {
  int n = 0, fd;
  unsigned char junk[300];
  for (size_t i = 0; i < sizeof(junk); i++) junk[i] = (unsigned char)(i * 37 + 11);
  if ((fd = raw_connect(a)) >= 0) { /* garbage, kept open */
    EXPECT(write(fd, junk, sizeof(junk)) > 0);
    out[n++] = fd;
  }
  if ((fd = raw_connect(a)) >= 0) { /* a proper hello, then a proof made without the key */
    struct boot_hello h;
    ASSERT_EQ(boot_hello_init(&h, BOOT_KIND_JOIN, sizeof(struct boot_rank_info), 0, 4), CH_OK);
    EXPECT(write(fd, &h, sizeof(h)) == sizeof(h));
    EXPECT(write(fd, junk, sizeof(junk)) > 0);
    out[n++] = fd;
  }
  if ((fd = raw_connect(a)) >= 0) out[n++] = fd; /* silent: dropped after 30 s, must not block the job */
  if ((fd = raw_connect(a)) >= 0) {               /* half a hello, then gone */
    EXPECT(write(fd, junk, 5) == 5);
    close(fd);
  }
  return n;
}

static void hostile_rank(int rank, int nranks, ncclUniqueId id, void* arg) {
  struct boot_state* b = NULL;
  struct boot_rank_info* peers = NULL;
  uint64_t t0 = now_ms();
  ASSERT_EQ(boot_init(pick_id(&id, arg), rank, nranks, NULL, ut_now_ns() + 20 * SEC, &b, &peers), CH_OK);
  int fds[8], n = 0;
  if (rank == 0) {
    n = hostile_connections(&peers[1].listen_addr, fds);
    /* A hello meant for another rank (a stale address). */
    int fd = raw_connect(&peers[1].listen_addr);
    if (fd >= 0) {
      struct boot_hello h;
      ASSERT_EQ(boot_hello_init(&h, BOOT_KIND_PEER, 0, 2, (uint32_t)nranks), CH_OK);
      EXPECT(write(fd, &h, sizeof(h)) == sizeof(h));
      fds[n++] = fd;
    }
  }
  ASSERT_EQ(boot_barrier(b), CH_OK); /* rank 1 must see the junk before the real traffic */
  exercise(b, rank, nranks);
  EXPECT(now_ms() - t0 < 4000); /* the silent connections did not hold anyone up */
  for (int i = 0; i < n; i++) close(fds[i]);
  boot_close(b);
  free(peers);
}

TEST(bootstrap, hostile_connections_ignored) {
  for (int mode = 0; mode < 2; mode++) {
    ncclUniqueId id;
    ASSERT_EQ(boot_get_unique_id(id.internal), CH_OK);
    int fds[8];
    int n = hostile_connections(id_root(id.internal), fds);
    EXPECT_EQ(n, 3);
    if (mode == 0) rt_run_threads(4, hostile_rank, &id);
    else rt_run_procs(4, hostile_rank, &id);
    for (int i = 0; i < n; i++) close(fds[i]);
  }
}

/* A rank that claims a rank number twice is told so; the job still completes with the right one. */
struct dup_arg {
  ncclUniqueId id;
  ch_status st[3];
};

static void* dup_thread(void* p) {
  struct dup_arg* a = p;
  struct boot_state* b = NULL;
  a->st[2] = boot_init(a->id.internal, 1, 2, NULL, ut_now_ns() + 10 * SEC, &b, NULL);
  boot_close(b);
  return NULL;
}

TEST(bootstrap, duplicate_and_out_of_range_ranks) {
  struct dup_arg a;
  memset(&a, 0, sizeof(a));
  ASSERT_EQ(boot_get_unique_id(a.id.internal), CH_OK);
  EXPECT_EQ(boot_init(a.id.internal, 5, 2, NULL, 0, &(struct boot_state*){NULL}, NULL), CH_INVALID_ARG);
  pthread_t t;
  ASSERT(pthread_create(&t, NULL, dup_thread, &a) == 0);
  usleep(200000); /* the first rank 1 is in; now a second one */
  struct boot_state* b = NULL;
  EXPECT_EQ(boot_init(a.id.internal, 1, 2, NULL, ut_now_ns() + 5 * SEC, &b, NULL), CH_INVALID_USAGE);
  EXPECT(strstr(log_last_error(), "rank 1 joined twice") != NULL);
  ASSERT_EQ(boot_init(a.id.internal, 0, 2, NULL, ut_now_ns() + 5 * SEC, &b, NULL), CH_OK);
  pthread_join(t, NULL);
  EXPECT_EQ(a.st[2], CH_OK);
  boot_close(b);
}

/* ---- disagreements ---- */

static void wire_rank(int rank, int nranks, ncclUniqueId id, void* arg) {
  if (rank == 2) {
    setenv("CHORUS_WIRE_VERSION", "2", 1);
    param_reset();
  }
  struct boot_state* b = NULL;
  ch_status st = boot_init(id.internal, rank, nranks, NULL, ut_now_ns() + 20 * SEC, &b, NULL);
  EXPECT_EQ(st, CH_INVALID_USAGE);
  const char* e = log_last_error();
  if (!strstr(e, "wire version differs") || !strstr(e, "2 on rank 2") || !strstr(e, "1 on ranks 0-1,3"))
    rt_fail(__FILE__, __LINE__, "unexpected report: %s", e);
  if (st == CH_OK) boot_close(b);
}

TEST(bootstrap, wire_version_mismatch) { rt_run_procs(4, wire_rank, NULL); }

static void nranks_rank(int rank, int nranks, ncclUniqueId id, void* arg) {
  struct boot_state* b = NULL;
  if (rank == 2) usleep(100000); /* the others are in first */
  ch_status st = boot_init(id.internal, rank, rank == 2 ? 5 : nranks, NULL, ut_now_ns() + 20 * SEC, &b, NULL);
  EXPECT_EQ(st, CH_INVALID_USAGE);
  if (!strstr(log_last_error(), "disagree on the number of ranks"))
    rt_fail(__FILE__, __LINE__, "unexpected report: %s", log_last_error());
  if (st == CH_OK) boot_close(b);
}

TEST(bootstrap, nranks_mismatch) { rt_run_threads(3, nranks_rank, NULL); }

/* ---- timeouts and abort ---- */

static void missing_rank(int rank, int nranks, ncclUniqueId id, void* arg) {
  if (rank == 3) return; /* never shows up */
  uint64_t deadline = arg ? ut_now_ns() + 1 * SEC : 0;
  struct boot_state* b = NULL;
  uint64_t t0 = now_ms();
  ch_status st = boot_init(id.internal, rank, nranks, NULL, deadline, &b, NULL);
  uint64_t took = now_ms() - t0;
  EXPECT_EQ(st, CH_TIMEOUT);
  if (!strstr(log_last_error(), "missing ranks 3 of 4") || !strstr(log_last_error(), "ranks 0-2"))
    rt_fail(__FILE__, __LINE__, "unexpected report: %s", log_last_error());
  EXPECT(took >= 500 && took < 3000);
}

TEST(bootstrap, missing_rank_times_out) {
  /* The root's own limit (CHORUS_INIT_TIMEOUT) with ranks that have no deadline... */
  setenv("CHORUS_INIT_TIMEOUT", "1", 1);
  param_reset();
  rt_run_both(4, missing_rank, NULL);
  /* ...and ranks with a 1 s deadline under the default root limit: the root reports by then. */
  unsetenv("CHORUS_INIT_TIMEOUT");
  param_reset();
  rt_run_both(4, missing_rank, (void*)1);
}

TEST(bootstrap, unreachable_root) {
  /* A port nobody listens on: the deadline ends the connect retries. */
  char addr[64];
  free_local_port(addr, sizeof(addr));
  ncclUniqueId id;
  ASSERT_EQ(boot_id_from_addr(addr, id.internal), CH_OK);
  struct boot_state* b = NULL;
  uint64_t t0 = now_ms();
  EXPECT_EQ(boot_init(id.internal, 1, 2, NULL, ut_now_ns() + SEC / 2, &b, NULL), CH_TIMEOUT);
  EXPECT(now_ms() - t0 < 1500);
  EXPECT(strstr(log_last_error(), "could not reach bootstrap root at") != NULL);
}

struct abort_arg {
  ncclUniqueId id;
  int rank;
  volatile int flag;
  ch_status st;
  uint64_t returned_ms;
};

static void* abort_thread(void* p) {
  struct abort_arg* a = p;
  struct boot_state* b = NULL;
  a->st = boot_init(a->id.internal, a->rank, 3, &a->flag, 0, &b, NULL);
  a->returned_ms = now_ms();
  if (a->st == CH_OK) boot_close(b);
  return NULL;
}

TEST(bootstrap, abort_unblocks_init) {
  /* Ranks 0 and 1 of 3 wait at the root; a third thread waits for a root that does not exist. */
  struct abort_arg a[3];
  memset(a, 0, sizeof(a));
  ASSERT_EQ(boot_get_unique_id(a[0].id.internal), CH_OK);
  a[1].id = a[0].id;
  a[0].rank = 0;
  a[1].rank = 1;
  char addr[64];
  free_local_port(addr, sizeof(addr));
  ASSERT_EQ(boot_id_from_addr(addr, a[2].id.internal), CH_OK);
  a[2].rank = 1;
  pthread_t t[3];
  for (int i = 0; i < 3; i++) ASSERT(pthread_create(&t[i], NULL, abort_thread, &a[i]) == 0);
  usleep(300000);
  for (int i = 0; i < 3; i++) EXPECT_EQ(a[i].returned_ms, 0);
  uint64_t t0 = now_ms();
  for (int i = 0; i < 3; i++) __atomic_store_n(&a[i].flag, 1, __ATOMIC_RELEASE);
  for (int i = 0; i < 3; i++) {
    pthread_join(t[i], NULL);
    EXPECT_EQ(a[i].st, CH_ABORTED);
    EXPECT(a[i].returned_ms - t0 < 1000);
  }
}

/* ---- peers that go away, wrong sizes ---- */

static void closing_rank(int rank, int nranks, ncclUniqueId id, void* arg) {
  struct boot_state* b = NULL;
  ASSERT_EQ(boot_init(id.internal, rank, nranks, NULL, ut_now_ns() + 20 * SEC, &b, NULL), CH_OK);
  boot_set_deadline(b, ut_now_ns() + 10 * SEC);
  int x = 42;
  if (rank == 1) {
    ASSERT_EQ(boot_send(b, 0, 1, &x, sizeof(x)), CH_OK);
    int64_t big = 0;
    ASSERT_EQ(boot_send(b, 0, 2, &big, sizeof(big)), CH_OK);
    boot_close(b);
    return;
  }
  int y = 0;
  ASSERT_EQ(boot_recv(b, 1, 1, &y, sizeof(y)), CH_OK); /* queued before the close: still delivered */
  EXPECT_EQ(y, 42);
  EXPECT_EQ(boot_recv(b, 1, 2, &y, sizeof(y)), CH_INTERNAL); /* 8 bytes sent, 4 expected */
  EXPECT(strstr(log_last_error(), "has 8 bytes, expected 4") != NULL);
  EXPECT_EQ(boot_recv(b, 1, 3, &y, sizeof(y)), CH_REMOTE); /* rank 1 is gone */
  /* Named with its pid and host (known from the root or the table); a process found gone "has exited". */
  EXPECT(strstr(log_last_error(), "rank 1 (pid ") != NULL);
  EXPECT(strstr(log_last_error(), "closed its bootstrap connection") || strstr(log_last_error(), "has exited"));
  boot_close(b);
}

TEST(bootstrap, peer_close_and_size_mismatch) { rt_run_both(2, closing_rank, NULL); }

static void deadline_rank(int rank, int nranks, ncclUniqueId id, void* arg) {
  struct boot_state* b = NULL;
  ASSERT_EQ(boot_init(id.internal, rank, nranks, NULL, ut_now_ns() + 20 * SEC, &b, NULL), CH_OK);
  if (rank == 0) {
    boot_set_deadline(b, ut_now_ns() + SEC / 5);
    int y;
    uint64_t t0 = now_ms();
    EXPECT_EQ(boot_recv(b, 1, 9, &y, sizeof(y)), CH_TIMEOUT);
    EXPECT(now_ms() - t0 < 1000);
    boot_set_deadline(b, 0);
  }
  ASSERT_EQ(boot_barrier(b), CH_OK);
  boot_close(b);
}

TEST(bootstrap, recv_deadline) { rt_run_threads(2, deadline_rank, NULL); }

/* ---- no leaks over many jobs ---- */

struct cycle_arg {
  ncclUniqueId id;
  int rank;
  ch_status st;
};

static void* cycle_thread(void* p) {
  struct cycle_arg* a = p;
  struct boot_state* b = NULL;
  struct boot_rank_info* peers = NULL;
  a->st = boot_init(a->id.internal, a->rank, 4, NULL, ut_now_ns() + 20 * SEC, &b, &peers);
  if (a->st == CH_OK) {
    int v[4] = {0};
    v[a->rank] = a->rank;
    a->st = boot_allgather(b, v, sizeof(v[0]));
    if (a->st == CH_OK) a->st = boot_barrier(b);
    boot_close(b);
  }
  free(peers);
  return NULL;
}

static int one_cycle(void) {
  struct cycle_arg a[4];
  pthread_t t[4];
  if (boot_get_unique_id(a[0].id.internal) != CH_OK) return -1;
  for (int i = 0; i < 4; i++) {
    a[i].id = a[0].id;
    a[i].rank = i;
    if (pthread_create(&t[i], NULL, cycle_thread, &a[i]) != 0) return -1;
  }
  int bad = 0;
  for (int i = 0; i < 4; i++) {
    pthread_join(t[i], NULL);
    bad |= a[i].st != CH_OK;
  }
  return bad ? -1 : 0;
}

TEST(bootstrap, no_leaks_200_cycles) {
  ASSERT_EQ(one_cycle(), 0); /* warm up lazily created state */
  usleep(50000);
  int fds0 = rt_count_fds(), th0 = rt_count_threads();
  uint64_t t0 = now_ms();
  for (int i = 0; i < 200; i++) ASSERT_EQ(one_cycle(), 0);
  uint64_t took = now_ms() - t0;
  printf("    200 x (4-rank init + allgather + barrier + close): %llu ms\n", (unsigned long long)took);
  /* Root threads finish just after their job: give them a moment. */
  int fds = 0, th = 0;
  for (uint64_t end = now_ms() + 3000; now_ms() < end; usleep(10000)) {
    fds = rt_count_fds();
    th = rt_count_threads();
    if (fds <= fds0 && th <= th0) break;
  }
  EXPECT_EQ(fds, fds0);
  EXPECT_EQ(th, th0);
}

/* ---- misc layer ---- */

TEST(bootstrap, format_ranks) {
  unsigned char f[10] = {1, 1, 1, 0, 1, 0, 0, 0, 1, 1};
  char buf[64];
  boot_format_ranks(f, 10, 0, buf, sizeof(buf));
  EXPECT(!strcmp(buf, "3,5-7"));
  boot_format_ranks(f, 10, 1, buf, sizeof(buf));
  EXPECT(!strcmp(buf, "0-2,4,8-9"));
  unsigned char g[200];
  for (int i = 0; i < 200; i++) g[i] = (unsigned char)(i % 2);
  boot_format_ranks(g, 200, 1, buf, 32);
  EXPECT(strlen(buf) < 32 && strstr(buf, "...") != NULL);
}

TEST(bootstrap, parse_addresses) {
  union sock_addr a;
  char s[64];
  ASSERT_EQ(sock_parse_addr("10.1.2.3:29500", &a), CH_OK);
  EXPECT(!strcmp(sock_addr_str(&a, s, sizeof(s)), "10.1.2.3:29500"));
  ASSERT_EQ(sock_parse_addr("[::1]:7", &a), CH_OK);
  EXPECT(!strcmp(sock_addr_str(&a, s, sizeof(s)), "[::1]:7"));
  struct addrinfo* ai = NULL;
  if (getaddrinfo("localhost", NULL, NULL, &ai) == 0) { /* a host name (a chroot may lack /etc/hosts) */
    freeaddrinfo(ai);
    ASSERT_EQ(sock_parse_addr("localhost:9", &a), CH_OK);
    EXPECT_EQ(sock_addr_port(&a), 9);
  } else {
    printf("    skipped: the host name half: 'localhost' does not resolve here (no /etc/hosts?)\n");
  }
  EXPECT_EQ(sock_parse_addr("::1:7", &a), CH_INVALID_ARG);
  EXPECT_EQ(sock_parse_addr("1.2.3.4", &a), CH_INVALID_ARG);
  EXPECT_EQ(sock_parse_addr("1.2.3.4:70000", &a), CH_INVALID_ARG);
  EXPECT_EQ(sock_parse_addr("1.2.3.4:x", &a), CH_INVALID_ARG);
}

TEST(bootstrap, interface_selection) {
  char name[64];
  union sock_addr a;
  setenv("NCCL_SOCKET_IFNAME", "lo", 1);
  param_reset();
  ASSERT_EQ(sock_find_interface(NULL, name, sizeof(name), &a), CH_OK);
  EXPECT(!strcmp(name, "lo"));
  setenv("NCCL_SOCKET_IFNAME", "=lo", 1);
  param_reset();
  ASSERT_EQ(sock_find_interface(NULL, name, sizeof(name), &a), CH_OK);
  EXPECT(!strcmp(name, "lo"));
  setenv("NCCL_SOCKET_IFNAME", "=l", 1); /* exact: no interface is called "l" */
  param_reset();
  EXPECT_EQ(sock_find_interface(NULL, name, sizeof(name), &a), CH_INVALID_USAGE);
  EXPECT(strstr(log_last_error(), "No usable network interface") != NULL);
  setenv("NCCL_SOCKET_IFNAME", "^lo", 1);
  param_reset();
  if (sock_find_interface(NULL, name, sizeof(name), &a) == CH_OK) EXPECT(strcmp(name, "lo") != 0);
  unsetenv("NCCL_SOCKET_IFNAME");
  param_reset();
  /* The root's subnet decides when nothing else does: 127.0.0.1 → lo, unless an ib* exists. */
  union sock_addr root;
  ASSERT_EQ(sock_parse_addr("127.0.0.1:1", &root), CH_OK);
  ASSERT_EQ(sock_find_interface(&root, name, sizeof(name), &a), CH_OK);
  EXPECT(!strcmp(name, "lo") || !strncmp(name, "ib", 2));
  char list[1024];
  sock_list_interfaces(list, sizeof(list));
  EXPECT(strstr(list, "lo:127.0.0.1") != NULL);
}

TEST(bootstrap, params_env_file_and_errors) {
  char path[] = "/tmp/chorus-conf-XXXXXX";
  int fd = mkstemp(path);
  ASSERT(fd >= 0);
  const char* text = "# comment\n CHORUS_SPIN_COUNT = 77 \nNCCL_SOCKET_RETRY_CNT=0x10\nNCCL_ALGO=Ring\n"
                     "CHORUS_INIT_TIMEOUT=abc\n";
  ASSERT(write(fd, text, strlen(text)) == (ssize_t)strlen(text));
  close(fd);
  setenv("NCCL_CONF_FILE", path, 1);
  setenv("NCCL_ALGO", "Tree", 1); /* the environment wins over the file */
  param_reset();
  EXPECT_EQ(param_int(PARAM_SPIN_COUNT), 77);
  EXPECT_EQ(param_int(PARAM_SOCKET_RETRY_CNT), 16);
  EXPECT(!strcmp(param_str(PARAM_ALGO), "Tree"));
  EXPECT_EQ(param_int(PARAM_INIT_TIMEOUT), 120); /* bad value: default, with a warning */
  EXPECT(strstr(log_last_error(), "CHORUS_INIT_TIMEOUT") != NULL);
  struct param_info info;
  param_describe(PARAM_SPIN_COUNT, &info);
  EXPECT(!strcmp(info.source, path));
  param_describe(PARAM_ALGO, &info);
  EXPECT(!strcmp(info.source, "environment"));
  EXPECT(param_is_set(PARAM_ALGO));
  EXPECT(!param_is_set(PARAM_BUFFSIZE));
  param_describe(PARAM_BUFFSIZE, &info);
  EXPECT(!strcmp(info.source, "default") && !strcmp(info.env, "NCCL_BUFFSIZE"));
  const char* held = param_str(PARAM_ALGO);
  setenv("NCCL_ALGO", "Ring", 1);
  EXPECT(!strcmp(param_str(PARAM_ALGO), "Tree")); /* cached until param_reset */
  param_reset();
  EXPECT(!strcmp(param_str(PARAM_ALGO), "Ring"));
  EXPECT(!strcmp(held, "Tree")); /* old strings stay valid */
  setenv("NCCL_ALGO", "", 1); /* set but empty: the default, not the file's value (as NCCL) */
  param_reset();
  EXPECT(!strcmp(param_str(PARAM_ALGO), ""));
  unlink(path);
}

static void read_file(const char* path, char* buf, size_t len) {
  FILE* f = fopen(path, "r");
  size_t n = f ? fread(buf, 1, len - 1, f) : 0;
  buf[n] = '\0';
  if (f) fclose(f);
}

TEST(bootstrap, log_format_and_filters) {
  char path[128], expanded[512], buf[8192];
  snprintf(path, sizeof(path), "/tmp/chorus-log-%d-%%h-%%p.txt", (int)getpid());
  char host[256];
  gethostname(host, sizeof(host));
  snprintf(expanded, sizeof(expanded), "/tmp/chorus-log-%d-%s-%d.txt", (int)getpid(), host, (int)getpid());
  unlink(expanded);
  setenv("NCCL_DEBUG", "INFO", 1);
  setenv("NCCL_DEBUG_SUBSYS", "^NET", 1);
  setenv("NCCL_DEBUG_FILE", path, 1);
  param_reset();
  log_set_thread_rank(3);
  INFO(LOG_INIT, "hello %d", 1);
  INFO(LOG_NET, "filtered out");
  WARN("something %s", "broke");
  log_set_thread_rank(-1);
  INFO(LOG_COLL, "no rank");
  read_file(expanded, buf, sizeof(buf));
  char want[256];
  snprintf(want, sizeof(want), ":%d:", (int)getpid());
  EXPECT(strstr(buf, want) != NULL);
  EXPECT(strstr(buf, "Chorus " CHORUS_VERSION_STRING " (NCCL API ") != NULL);
  EXPECT(strstr(buf, " [3] NCCL INFO hello 1\n") != NULL);
  EXPECT(strstr(buf, "filtered out") == NULL);
  EXPECT(strstr(buf, " [3] test_bootstrap.c:") != NULL && strstr(buf, " NCCL WARN something broke\n") != NULL);
  EXPECT(strstr(buf, " NCCL INFO no rank\n") != NULL && strstr(buf, "] NCCL INFO no rank") == NULL);
  EXPECT(!strcmp(log_last_error(), "something broke"));
  /* Quiet by default, yet warnings are still kept for ncclGetLastError. */
  unsetenv("NCCL_DEBUG");
  param_reset();
  WARN("silent %d", 2);
  EXPECT(!strcmp(log_last_error(), "silent 2"));
  read_file(expanded, buf, sizeof(buf));
  EXPECT(strstr(buf, "silent 2") == NULL);
  unsetenv("NCCL_DEBUG_FILE");
  unsetenv("NCCL_DEBUG_SUBSYS");
  param_reset();
  unlink(expanded);
}

TEST(bootstrap, utils) {
  uint64_t x = 0, y = 0;
  ASSERT_EQ(ut_random(&x, sizeof(x)), CH_OK);
  ASSERT_EQ(ut_random(&y, sizeof(y)), CH_OK);
  EXPECT(x != y);
  EXPECT(ut_hash("a", 1, 0) != ut_hash("b", 1, 0));
  EXPECT(ut_hash("a", 1, 0) == ut_hash("a", 1, 0));
  EXPECT(strlen(ut_host_id()) > strlen(ut_hostname()));
  EXPECT(ut_ncpus() >= 1);
  uint64_t t0 = ut_now_ns();
  for (uint64_t i = 0; i < 3000; i++) ut_backoff(i); /* spins, yields, then sleeps ≤64 us */
  EXPECT(ut_now_ns() - t0 < 2 * SEC);
  EXPECT(!strcmp(ch_status_str(CH_TIMEOUT), "timeout"));
}

/* A failure passing through CHECK leaves "file:line -> status" at NCCL_DEBUG=INFO, as NCCL's NCCLCHECK
 * does: a malformed NCCL_ALGO fails init deep in setup, and the trail names core/init.c. */
static ch_status trail_fails(void) { return CH_INVALID_ARG; }
static int trail_line;
static ch_status trail_passes_through(void) {
  trail_line = __LINE__ + 1;
  CHECK(trail_fails());
  return CH_OK;
}
TEST(bootstrap, check_leaves_a_trail) {
  char path[128], buf[16384];
  snprintf(path, sizeof(path), "/tmp/chorus-trail-%d.txt", (int)getpid());
  unlink(path);
  setenv("NCCL_DEBUG", "INFO", 1);
  setenv("NCCL_DEBUG_FILE", path, 1);
  param_reset();
  ASSERT_EQ(trail_passes_through(), CH_INVALID_ARG);
  setenv("NCCL_ALGO", "NoSuchAlgorithm", 1);
  ncclComm_t comm = NULL;
  EXPECT(ncclCommInitAll(&comm, 1, NULL) == ncclInvalidUsage);
  unsetenv("NCCL_ALGO");
  unsetenv("NCCL_DEBUG");
  unsetenv("NCCL_DEBUG_FILE");
  param_reset();
  read_file(path, buf, sizeof(buf));
  unlink(path);
  char want[64];
  snprintf(want, sizeof(want), "test_bootstrap.c:%d -> 4 (invalid argument", trail_line);
  EXPECT(strstr(buf, want) != NULL);
  EXPECT(strstr(buf, "core/init.c:") != NULL && strstr(buf, " -> 5 (invalid usage") != NULL);
}
