/* Job-wide stall reports: the ranks exchange their progress records over the stall query service, so
 * a report says which ranks reached the stalled call and which did not. In every multi-rank test rank
 * 2 is alive but busy in its own code while ranks 0 and 1 wait in AllReduce #2 (call #1 connects),
 * so the expected headline is, in closed form,
 *   "AllReduce #2 (1 KiB): ranks 0-1 waiting, rank 2 last completed #1"   (256 floats = 1 KiB).
 * (stall.report_beside_abort is the exception: there nobody waits, and ranks 1 and 2 are stopped.) */
#define _GNU_SOURCE
#include <errno.h>
#include <limits.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "bootstrap/boot_internal.h"
#include "chorus.h"
#include "comm/comm.h"
#include "fault/stall.h"
#include "misc/param.h"
#include "misc/utils.h"
#include "report_util.h"
#include "runner.h"
#include "tools_util.h"

#define COUNT 256
static const char HEADLINE[] = "AllReduce #2 (1 KiB): ranks 0-1 waiting, rank 2 last completed #1";

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static ncclComm_t warm_comm(int rank, int nranks, ncclUniqueId id, float* buf) {
  ncclComm_t comm;
  NCCL_OK(ncclCommInitRank(&comm, nranks, id, rank));
  for (int i = 0; i < COUNT; i++) buf[i] = 1;
  NCCL_OK(ncclAllReduce(buf, buf, COUNT, ncclFloat, ncclSum, comm, NULL)); /* #1: connected */
  EXPECT(buf[0] == (float)nranks);
  return comm;
}

/* ---- the report a timed-out rank prints ---- */

static void timeout_body(int rank, int nranks, ncclUniqueId id, void* arg) {
  (void)arg;
  float buf[COUNT];
  ncclComm_t comm = warm_comm(rank, nranks, id, buf);
  if (rank == 2) {
    usleep(3 * 1000 * 1000); /* alive, busy elsewhere: never joins #2 */
    NCCL_OK(ncclCommAbort(comm));
    return;
  }
  NCCL_OK(chorusCommSetTimeout(comm, 1.0));
  EXPECT_EQ(ncclAllReduce(buf, buf, COUNT, ncclFloat, ncclSum, comm, NULL), ncclTimeout);
  const char* e = ncclGetLastError(comm);
  if (!strstr(e, HEADLINE) || !strstr(e, "no progress for"))
    rt_fail(__FILE__, __LINE__, "rank %d (%s): the report lacks \"%s\"; last error: %s", rank, rt_mode(), HEADLINE, e);
  if (!strcmp(rt_mode(), "procs")) usleep(1000 * 1000); /* a process that exits answers nothing: let the */
  NCCL_OK(ncclCommAbort(comm));                         /* other waiting rank finish its report first */
}

TEST_T(stall, timeout_names_the_late_rank, 60) { rt_run_both(3, timeout_body, NULL); }

/* ---- CHORUS_DUMP_SIGNAL: the same summary on request, and the call goes on ---- */

static void* signal_later(void* arg) {
  (void)arg;
  usleep(1000 * 1000); /* ranks 0 and 1 have published what they wait for by then */
  kill(getpid(), SIGUSR1);
  return NULL;
}

static void dump_body(int rank, int nranks, ncclUniqueId id, void* arg) {
  (void)arg;
  setenv("CHORUS_DUMP_SIGNAL", "SIGUSR1", 1);
  param_reset();
  float buf[COUNT];
  ncclComm_t comm = warm_comm(rank, nranks, id, buf);
  pthread_t t;
  if (rank == 2) usleep(2500 * 1000);
  if (rank == 0) ASSERT(pthread_create(&t, NULL, signal_later, NULL) == 0);
  for (int i = 0; i < COUNT; i++) buf[i] = 1;
  NCCL_OK(ncclAllReduce(buf, buf, COUNT, ncclFloat, ncclSum, comm, NULL));
  EXPECT(buf[0] == (float)nranks);
  if (rank == 0) {
    pthread_join(t, NULL);
    const char* e = ncclGetLastError(comm);
    if (!strstr(e, HEADLINE) || !strstr(e, "on request"))
      rt_fail(__FILE__, __LINE__, "%s: no summary \"%s\" on request; last error: %s", rt_mode(), HEADLINE, e);
  }
  NCCL_OK(ncclCommDestroy(comm));
}

TEST_T(stall, dump_on_signal_summary, 60) { rt_run_procs(3, dump_body, NULL); }

/* ---- chorus-info --stall against a live job, and the query's authentication ---- */

/* A rank publishes what it waits for once it has been idle ~10 ms, noticed on the engine's next clock
 * read (tens of ms, more on a loaded machine): ask again until the report says `want` (at most 15 s).
 * Returns chorus-info's exit status of the last try. */
static int run_info(const char* addr, const char* env, char* out, size_t cap);
static int info_until(const char* addr, const char* env, const char* want, char* out, size_t cap) {
  int rc = -1;
  for (double end = now_s() + 15; now_s() < end; usleep(200 * 1000)) {
    rc = run_info(addr, env, out, cap);
    if (rc == 0 && strstr(out, want)) break;
  }
  return rc;
}

/* Run chorus-info --stall addr (env: one extra NAME=VALUE or NULL); stdout and stderr into out. Exit status. */
static int run_info(const char* addr, const char* env, char* out, size_t cap) {
  int p[2];
  ASSERT(pipe(p) == 0);
  pid_t pid = fork();
  ASSERT(pid >= 0);
  if (pid == 0) {
    dup2(p[1], 1), dup2(p[1], 2);
    close(p[0]), close(p[1]);
    unsetenv("CHORUS_SECRET"), unsetenv("CHORUS_SECRET_FILE"), unsetenv("NCCL_COMM_ID");
    if (env) putenv((char*)env);
    execl(tu_bin("chorus-info"), "chorus-info", "--stall", addr, (char*)NULL);
    _exit(127);
  }
  close(p[1]);
  size_t got = 0;
  double end = now_s() + 20;
  while (got + 1 < cap && now_s() < end) {
    struct pollfd pf = {p[0], POLLIN, 0};
    if (poll(&pf, 1, 100) <= 0) continue;
    ssize_t n = read(p[0], out + got, cap - 1 - got);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    got += (size_t)n;
  }
  out[got] = '\0';
  close(p[0]);
  if (now_s() >= end) kill(pid, SIGKILL);
  int st = 0;
  while (waitpid(pid, &st, 0) < 0 && errno == EINTR) {
  }
  return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

static void info_body(int rank, int nranks, ncclUniqueId id, void* arg) {
  (void)arg;
  float buf[COUNT];
  ncclComm_t comm = warm_comm(rank, nranks, id, buf);
  NCCL_OK(chorusCommSetTimeout(comm, 30.0));
  if (rank == 2) {
    usleep(500 * 1000); /* ranks 0 and 1 are blocked in #2 by now */
    char addr[64], out[16384];
    sock_addr_str(&comm->peers[0].query_addr, addr, sizeof addr);
    double t0 = now_s();
    int rc = info_until(addr, NULL, HEADLINE, out, sizeof out); /* no secret: same uid, same host */
    EXPECT_EQ(rc, 0);
    if (!strstr(out, HEADLINE)) rt_fail(__FILE__, __LINE__, "%s: chorus-info --stall %s printed:\n%s", rt_mode(), addr, out);
    if (now_s() - t0 > 16) rt_fail(__FILE__, __LINE__, "chorus-info --stall took %.1f s", now_s() - t0);
    /* With the job's key the answer is the same; a wrong secret is refused. */
    const struct boot_key* key = boot_secret(comm->boot);
    size_t len = 0;
    char why[200];
    ASSERT_EQ(boot_query(&comm->peers[1].query_addr, key, STALL_Q_SUMMARY, NULL, 0, out, sizeof out - 1, &len,
                         ut_now_ns() + 5000000000ull, NULL, why, sizeof why), CH_OK);
    out[len] = '\0';
    if (!strstr(out, HEADLINE)) rt_fail(__FILE__, __LINE__, "keyed summary from rank 1's process:\n%s", out);
    struct boot_key wrong = *key;
    wrong.k[0] ^= 1;
    wrong.mode = BOOT_AUTH_SECRET;
    EXPECT(boot_query(&comm->peers[0].query_addr, &wrong, STALL_Q_SUMMARY, NULL, 0, out, sizeof out, &len,
                      ut_now_ns() + 5000000000ull, NULL, why, sizeof why) != CH_OK);
    EXPECT(len == 0 && strstr(why, "rejected") != NULL);
    rc = run_info(addr, "CHORUS_SECRET=this-is-not-the-job-secret", out, sizeof out);
    EXPECT(rc != 0);
    if (!strstr(out, "rejected the query")) rt_fail(__FILE__, __LINE__, "chorus-info with a wrong secret:\n%s", out);
  }
  for (int i = 0; i < COUNT; i++) buf[i] = 1;
  NCCL_OK(ncclAllReduce(buf, buf, COUNT, ncclFloat, ncclSum, comm, NULL));
  EXPECT(buf[0] == (float)nranks);
  NCCL_OK(ncclCommDestroy(comm));
}

TEST_T(stall, chorus_info_live_job, 90) { rt_run_both(3, info_body, NULL); }

/* A job named by NCCL_COMM_ID with CHORUS_SECRET (as chorusrun starts one): chorus-info proves the
 * same secret; a wrong one is refused. 2 ranks: rank 1 is the late one. */
static void secret_body(int rank, int nranks, ncclUniqueId unused, void* arg) {
  (void)unused;
  char hostport[64];
  snprintf(hostport, sizeof hostport, "127.0.0.1:%d", (int)(intptr_t)arg);
  setenv("CHORUS_SECRET", "stall-test-secret-0123456789abcdef", 1);
  setenv("NCCL_COMM_ID", hostport, 1);
  param_reset();
  ncclUniqueId id;
  NCCL_OK(ncclGetUniqueId(&id)); /* with NCCL_COMM_ID: the key comes from CHORUS_SECRET */
  float buf[COUNT];
  ncclComm_t comm = warm_comm(rank, nranks, id, buf);
  if (rank == 1) {
    usleep(500 * 1000);
    char addr[64], out[16384];
    sock_addr_str(&comm->peers[0].query_addr, addr, sizeof addr);
    EXPECT_EQ(info_until(addr, "CHORUS_SECRET=stall-test-secret-0123456789abcdef",
                         "AllReduce #2 (1 KiB): rank 0 waiting, rank 1 last completed #1", out, sizeof out), 0);
    if (!strstr(out, "AllReduce #2 (1 KiB): rank 0 waiting, rank 1 last completed #1"))
      rt_fail(__FILE__, __LINE__, "chorus-info --stall %s with the job's secret printed:\n%s", addr, out);
    EXPECT(run_info(addr, "CHORUS_SECRET=stall-test-secret-0123456789abcdeX", out, sizeof out) != 0);
    if (!strstr(out, "rejected the query")) rt_fail(__FILE__, __LINE__, "with a wrong secret:\n%s", out);
  }
  NCCL_OK(ncclAllReduce(buf, buf, COUNT, ncclFloat, ncclSum, comm, NULL));
  NCCL_OK(ncclCommDestroy(comm));
}

TEST_T(stall, chorus_info_with_job_secret, 60) {
  union sock_addr a; /* a free loopback port for the root rank 0 hosts */
  struct sock l = {.fd = -1};
  ASSERT_EQ(sock_parse_addr("127.0.0.1:0", &a), CH_OK);
  ASSERT_EQ(sock_listen(&a, &l), CH_OK);
  int port = sock_addr_port(&l.addr);
  sock_close(&l);
  rt_run_procs(2, secret_body, (void*)(intptr_t)port);
}

/* ---- hostile input to the service ---- */

static int raw_connect(const union sock_addr* a) {
  struct sock s;
  struct sock_wait w = {NULL, ut_now_ns() + 5000000000ull};
  return sock_connect(a, &s, &w) == CH_OK ? s.fd : -1;
}

/* Read exactly n bytes within ms; returns the bytes read. */
static size_t read_within(int fd, void* buf, size_t n, int ms) {
  size_t got = 0;
  double end = now_s() + ms / 1000.0;
  while (got < n && now_s() < end) {
    struct pollfd p = {fd, POLLIN, 0};
    if (poll(&p, 1, 50) <= 0) continue;
    ssize_t r = recv(fd, (char*)buf + got, n - got, 0);
    if (r < 0 && (errno == EAGAIN || errno == EINTR)) continue;
    if (r <= 0) break;
    got += (size_t)r;
  }
  return got;
}

/* 1 if the server closes fd within ms (after discarding whatever it sends). */
static int closed_within(int fd, int ms) {
  double end = now_s() + ms / 1000.0;
  char junk[256];
  while (now_s() < end) {
    struct pollfd p = {fd, POLLIN, 0};
    if (poll(&p, 1, 50) <= 0) continue;
    ssize_t r = recv(fd, junk, sizeof junk, 0);
    if (r == 0 || (r < 0 && errno == ECONNRESET)) return 1;
  }
  return 0;
}

TEST_T(stall, service_rejects_garbage, 60) {
  ncclUniqueId id;
  ncclComm_t comm;
  NCCL_OK(ncclGetUniqueId(&id));
  NCCL_OK(ncclCommInitRank(&comm, 1, id, 0));
  const union sock_addr* qa = &comm->peers[0].query_addr;
  ASSERT(qa->sa.sa_family == AF_INET || qa->sa.sa_family == AF_INET6);
  /* Random bytes. */
  int fd = raw_connect(qa);
  ASSERT(fd >= 0);
  unsigned char junk[300];
  ASSERT_EQ(ut_random(junk, sizeof junk), CH_OK);
  EXPECT(send(fd, junk, sizeof junk, MSG_NOSIGNAL) == (ssize_t)sizeof junk);
  EXPECT(closed_within(fd, 3000));
  close(fd);
  /* A hello announcing an oversized request. */
  struct boot_hello h;
  ASSERT_EQ(boot_hello_init(&h, BOOT_KIND_QUERY, STALL_Q_SUMMARY, 0, 1u << 30), CH_OK);
  fd = raw_connect(qa);
  ASSERT(fd >= 0);
  EXPECT(send(fd, &h, sizeof h, MSG_NOSIGNAL) == (ssize_t)sizeof h);
  EXPECT(closed_within(fd, 3000));
  close(fd);
  /* Claims a key, proves none (its MAC is zeros), then sends a request anyway. */
  ASSERT_EQ(boot_hello_init(&h, BOOT_KIND_QUERY, STALL_Q_SUMMARY, 1, 0), CH_OK);
  fd = raw_connect(qa);
  ASSERT(fd >= 0);
  unsigned char nonce[BOOT_NONCE], mac[BOOT_MAC] = {0};
  EXPECT(send(fd, &h, sizeof h, MSG_NOSIGNAL) == (ssize_t)sizeof h);
  EXPECT(read_within(fd, nonce, sizeof nonce, 3000) == sizeof nonce);
  EXPECT(send(fd, mac, sizeof mac, MSG_NOSIGNAL) == (ssize_t)sizeof mac);
  EXPECT(closed_within(fd, 3000));
  close(fd);
  /* Silent: closed after the 2 s handshake limit. */
  fd = raw_connect(qa);
  ASSERT(fd >= 0);
  double t0 = now_s();
  EXPECT(closed_within(fd, 5000));
  EXPECT(now_s() - t0 >= 1.5);
  close(fd);
  /* A well-formed record query for a communicator that is not there: an empty answer. */
  const struct boot_key* key = boot_secret(comm->boot);
  char out[4096], why[200];
  size_t len = 1;
  uint64_t q[2] = {comm->comm_hash ^ 1, 0};
  EXPECT_EQ(boot_query(qa, key, STALL_Q_RECORD, q, sizeof q, out, sizeof out, &len, ut_now_ns() + 5000000000ull, NULL, why,
                       sizeof why), CH_OK);
  EXPECT_EQ(len, 0);
  /* And the service still answers properly. */
  ASSERT_EQ(boot_query(qa, key, STALL_Q_SUMMARY, NULL, 0, out, sizeof out - 1, &len, ut_now_ns() + 5000000000ull, NULL, why,
                       sizeof why), CH_OK);
  out[len] = '\0';
  if (!strstr(out, "no rank is blocked in a collective: rank 0 last completed #0"))
    rt_fail(__FILE__, __LINE__, "summary of an idle 1-rank comm:\n%s", out);
  NCCL_OK(ncclCommDestroy(comm));
}

/* ---- the summary's wording, from given states (the example) ---- */

TEST(stall, format_closed_form) {
  enum { N = 10 };
  struct stall_wire w[N];
  memset(w, 0, sizeof w);
  for (int r = 0; r < N; r++) {
    w[r].magic = STALL_WIRE_MAGIC, w[r].rank = r, w[r].nranks = N, w[r].pid = 100 + r;
    snprintf(w[r].host, sizeof w[r].host, "h%d", r / 4);
    w[r].state = STALL_ST_WAIT, w[r].func = 4 /* AllReduce */, w[r].seq = 812, w[r].last_done = 811;
    w[r].bytes_total = 64ull << 20, w[r].bytes_done = 16ull << 20, w[r].type = ncclFloat, w[r].algo = 1, w[r].proto = 2;
    w[r].wait = STALL_WAIT_DATA, w[r].peer = (r + N - 1) % N, w[r].idle_ms = 5000;
  }
  w[7].state = STALL_ST_IDLE, w[7].last_done = 811;
  w[8].state = STALL_ST_NOANSWER, snprintf(w[8].note, sizeof w[8].note, "10.0.0.8:999: Connection refused");
  w[9].state = STALL_ST_GAVE_UP; /* timed out at #812: it reached the call too */
  char out[8192];
  stall_format(w, N, 0xabcull, "", out, sizeof out);
  const char* want = "stall report for comm 0000000000000abc (10 ranks): AllReduce #812 (64 MiB): ranks 0-6,9 "
                     "waiting, rank 7 last completed #811, rank 8 did not answer\n";
  if (strncmp(out, want, strlen(want))) rt_fail(__FILE__, __LINE__, "got:\n%s\nwanted:\n%s", out, want);
  EXPECT(strstr(out, "  rank 0 (h0 pid 100): in AllReduce #812 (64 MiB float, Ring/Simple), 16 MiB done, waiting for "
                     "data from rank 9, no progress for 5.0 s; last completed #811\n") != NULL);
  EXPECT(strstr(out, "  rank 7 (h1 pid 107): not in a call; last completed #811\n") != NULL);
  EXPECT(strstr(out, "  rank 8 (h2 pid 108): no answer: 10.0.0.8:999: Connection refused\n") != NULL);
  EXPECT(strstr(out, "  rank 9 (h2 pid 109): timed out in AllReduce #812") != NULL);
  /* Validation of what another process sends. */
  struct stall_wire x = w[0];
  EXPECT(stall_wire_ok(&x, 0, 0, N));
  x.func = 99;
  EXPECT(!stall_wire_ok(&x, 0, 0, N));
  x = w[0], x.peer = N;
  EXPECT(!stall_wire_ok(&x, 0, 0, N));
  x = w[0], x.bytes_done = x.bytes_total + 1;
  EXPECT(!stall_wire_ok(&x, 0, 0, N));
  x = w[0], x.state = STALL_ST_NOANSWER;
  EXPECT(!stall_wire_ok(&x, 0, 0, N));
  x = w[0], memset(x.host, 'a', sizeof x.host), x.host[3] = '\n';
  EXPECT(!stall_wire_ok(&x, 0, 0, N));
  x = w[0];
  EXPECT(!stall_wire_ok(&x, 1, 0, N)); /* another communicator */
  /* A rank still making the connections of its next call is in that call, not idle. */
  w[7].state = STALL_ST_CONNECT, w[7].func = 4, w[7].seq = 812, w[7].bytes_total = 2, w[7].peer = -1;
  stall_format(w, N, 0xabcull, "", out, sizeof out);
  if (!strstr(out, "waiting, rank 7 setting up connections for AllReduce #812, rank 8 did not answer\n"))
    rt_fail(__FILE__, __LINE__, "got:\n%s", out);
  EXPECT(strstr(out, "  rank 7 (h1 pid 107): in AllReduce #812, setting up its connections with 2 peers; last "
                     "completed #811\n") != NULL);
  x = w[7], x.rank = 0;
  EXPECT(stall_wire_ok(&x, 0, 0, N));
  x.bytes_total = N; /* more peers than the communicator has */
  EXPECT(!stall_wire_ok(&x, 0, 0, N));
  x = w[7], x.rank = 0, x.func = -1;
  EXPECT(!stall_wire_ok(&x, 0, 0, N));
  /* A one-sided wait, as the issue words it. */
  w[7].state = STALL_ST_SIGNAL, w[7].sig = 2, w[7].ctx = 0, w[7].peer = 3, w[7].bytes_done = 4, w[7].bytes_total = 5;
  w[7].idle_ms = 3000;
  stall_format(w, N, 0xabcull, "", out, sizeof out);
  if (!strstr(out, "waiting, rank 7 waiting for signal 2 from rank 3, 4 of 5 seen, rank 8 did not answer\n"))
    rt_fail(__FILE__, __LINE__, "got:\n%s", out);
  EXPECT(strstr(out, "  rank 7 (h1 pid 107): in ncclWaitSignal, waiting for signal 2 (context 0) from rank 3, 4 of 5 "
                     "seen, for 3.0 s; last completed #811\n") != NULL);
  x = w[7], x.rank = 0;
  EXPECT(stall_wire_ok(&x, 0, 0, N));
  x.bytes_done = 6; /* more seen than waited for */
  EXPECT(!stall_wire_ok(&x, 0, 0, N));
  x = w[7], x.rank = 0, x.sig = -1;
  EXPECT(!stall_wire_ok(&x, 0, 0, N));
  x = w[7], x.rank = 0, x.peer = -1;
  EXPECT(!stall_wire_ok(&x, 0, 0, N));
}

/* A rank whose first Send to a peer waits for that peer to make the connection (it is late: in its
 * own code) shows in the report as setting up that call's connections, not as idle: at 512 ranks on
 * a small machine, making an AlltoAll's connections took minutes, and the report said "not in a call". */
static void connect_body(int rank, int nranks, ncclUniqueId id, void* arg) {
  atomic_int* seen = arg;
  float buf[COUNT];
  ncclComm_t comm = warm_comm(rank, nranks, id, buf);
  if (rank == 0) {
    struct ru_monitor* m = ru_monitor_start(comm, "setting up connections for Send to rank 1", seen);
    NCCL_OK(ncclSend(buf, COUNT, ncclFloat, 1, comm, NULL));
    char* text = ru_monitor_join(m);
    char want[256];
    snprintf(want, sizeof want, "\n  rank 0 (%s pid %d): in Send to rank 1, setting up its connections with 1 peer;",
             comm->peers[0].hostname, comm->peers[0].pid);
    if (!strstr(text, want)) rt_fail(__FILE__, __LINE__, "%s: the report said:\n%s", rt_mode(), text);
    free(text);
  } else {
    ru_flag_wait(seen);
    NCCL_OK(ncclRecv(buf, COUNT, ncclFloat, 0, comm, NULL));
  }
  NCCL_OK(ncclCommDestroy(comm));
}

TEST_T(stall, report_names_a_rank_making_connections, 90) {
  atomic_int* seen = ru_flag_new();
  rt_run_threads(2, connect_body, seen);
  atomic_store(seen, 0);
  rt_run_procs(2, connect_body, seen);
  ru_flag_free(seen);
}

/* ---- chorusCommStallReport: the same report, returned to the program ---- */

TEST(stall, report_argument_errors) {
  char text[64];
  size_t need = 77;
  memset(text, 'x', sizeof text);
  EXPECT_EQ(chorusCommStallReport(NULL, text, sizeof text, &need), ncclInvalidArgument);
  EXPECT(strstr(ncclGetLastError(NULL), "chorusCommStallReport: comm is NULL") != NULL);
  struct ncclComm* bogus = calloc(1, sizeof(*bogus)); /* no magic: never initialised */
  ASSERT(bogus != NULL);
  EXPECT_EQ(chorusCommStallReport(bogus, text, sizeof text, &need), ncclInvalidArgument);
  EXPECT(strstr(ncclGetLastError(NULL), "is not a valid communicator") != NULL);
  free(bogus);
  ncclUniqueId id;
  ncclComm_t comm;
  NCCL_OK(ncclGetUniqueId(&id));
  NCCL_OK(ncclCommInitRank(&comm, 1, id, 0));
  EXPECT_EQ(chorusCommStallReport(comm, NULL, 16, &need), ncclInvalidArgument);
  EXPECT(strstr(ncclGetLastError(NULL), "chorusCommStallReport: text is NULL with len 16") != NULL);
  EXPECT_EQ(chorusCommStallReport(comm, NULL, 0, NULL), ncclInvalidArgument);
  EXPECT(strstr(ncclGetLastError(NULL), "chorusCommStallReport: text and needed are both NULL") != NULL);
  /* Refused calls change nothing. */
  EXPECT_EQ(need, 77);
  for (size_t i = 0; i < sizeof text; i++) EXPECT(text[i] == 'x');
  NCCL_OK(ncclCommDestroy(comm));
}

/* A 1-rank communicator after one AllReduce: the whole report in closed form, then the same cut to
 * every interesting length (the NUL always inside len, nothing written past it, *needed the whole). */
TEST(stall, report_length_and_truncation) {
  ncclUniqueId id;
  ncclComm_t comm;
  NCCL_OK(ncclGetUniqueId(&id));
  NCCL_OK(ncclCommInitRank(&comm, 1, id, 0));
  int v = 1;
  NCCL_OK(ncclAllReduce(&v, &v, 1, ncclInt32, ncclSum, comm, NULL));
  char want[2048], addr[64] = "";
  const union sock_addr* qa = &comm->peers[0].query_addr;
  int at = snprintf(want, sizeof want,
                    "stall report for comm %016llx (1 ranks): no rank is blocked in a collective: rank 0 last "
                    "completed #1\n  rank 0 (%s pid %d): not in a call; last completed #1\n",
                    (unsigned long long)comm->comm_hash, comm->peers[0].hostname, (int)getpid());
  if (qa->sa.sa_family != AF_UNSPEC)
    snprintf(want + at, sizeof want - (size_t)at,
             "  (while the job runs, chorus-info --stall %s prints this report again)\n",
             sock_addr_str(qa, addr, sizeof addr));
  size_t n = strlen(want), need = 0;
  NCCL_OK(chorusCommStallReport(comm, NULL, 0, &need)); /* the length alone */
  EXPECT_EQ(need, n);
  char full[4096];
  memset(full, 'x', sizeof full);
  need = 0;
  NCCL_OK(chorusCommStallReport(comm, full, sizeof full, &need));
  EXPECT_EQ(need, n);
  if (strcmp(full, want)) rt_fail(__FILE__, __LINE__, "report:\n%s\nwanted:\n%s", full, want);
  size_t lens[] = {1, 2, 10, n - 1, n, n + 1};
  for (size_t i = 0; i < sizeof lens / sizeof lens[0]; i++) {
    size_t len = lens[i];
    char buf[4096];
    memset(buf, 'x', sizeof buf);
    need = 0;
    NCCL_OK(chorusCommStallReport(comm, buf, len, &need));
    EXPECT_EQ(need, n);
    size_t k = len - 1 < n ? len - 1 : n; /* what fits before the NUL */
    if (strlen(buf) != k || memcmp(buf, want, k) || buf[k + 1] != 'x')
      rt_fail(__FILE__, __LINE__, "len %zu: got \"%s\" (%zu bytes), wanted the first %zu bytes of the report", len, buf,
              strlen(buf), k);
  }
  memset(full, 'x', sizeof full);
  NCCL_OK(chorusCommStallReport(comm, full, 0, &need)); /* len 0: text untouched */
  EXPECT(full[0] == 'x');
  NCCL_OK(chorusCommStallReport(comm, full, sizeof full, NULL)); /* needed is optional */
  EXPECT(strcmp(full, want) == 0);
  /* Returned, not logged. */
  EXPECT(strstr(ncclGetLastError(comm), "stall report") == NULL);
  EXPECT(strstr(ncclGetLastError(NULL), "stall report") == NULL);
  NCCL_OK(ncclCommDestroy(comm));
}

/* Ranks 0 and 1 block in AllReduce #2 while rank 2 idles in its own code until a monitoring thread of
 * rank 0's process (beside the blocked call, as monitored_barrier's) has a report naming the waiting
 * call and rank 2's last completed call. As threads, every record is read in the process; as
 * processes, ranks 1 and 2 answer through their stall query services. */
struct report_shared {
  atomic_int got; /* rank 0's monitor is done: rank 2 may join #2 */
};

struct monitor {
  ncclComm_t comm;
  struct report_shared* sh;
  ncclResult_t r;
  size_t needed;
  char text[16384];
};

static void* monitor_main(void* arg) {
  struct monitor* m = arg;
  /* Ranks 0 and 1 show as "running" until they publish what they wait for (after ~10 ms idle). */
  for (double end = now_s() + 15; now_s() < end; usleep(20 * 1000)) {
    m->r = chorusCommStallReport(m->comm, m->text, sizeof m->text, &m->needed);
    if (m->r != ncclSuccess || strstr(m->text, HEADLINE)) break;
  }
  atomic_store(&m->sh->got, 1);
  return NULL;
}

static void report_body(int rank, int nranks, ncclUniqueId id, void* arg) {
  struct report_shared* sh = arg;
  float buf[COUNT];
  ncclComm_t comm = warm_comm(rank, nranks, id, buf);
  if (rank == 2) /* idle: every call it made has returned */
    for (double end = now_s() + 20; !atomic_load(&sh->got) && now_s() < end;) usleep(10 * 1000);
  struct monitor* m = NULL;
  pthread_t t;
  if (rank == 0) {
    m = calloc(1, sizeof(*m));
    ASSERT(m != NULL);
    m->comm = comm, m->sh = sh;
    ASSERT(pthread_create(&t, NULL, monitor_main, m) == 0);
  }
  for (int i = 0; i < COUNT; i++) buf[i] = 1;
  NCCL_OK(ncclAllReduce(buf, buf, COUNT, ncclFloat, ncclSum, comm, NULL));
  EXPECT(buf[0] == (float)nranks);
  if (rank == 0) {
    pthread_join(t, NULL);
    EXPECT_EQ(m->r, ncclSuccess);
    EXPECT_EQ(m->needed, strlen(m->text));
    char head[256], idle[256], wait0[256], wait1[256];
    snprintf(head, sizeof head, "stall report for comm %016llx (3 ranks): %s\n", (unsigned long long)comm->comm_hash,
             HEADLINE);
    snprintf(idle, sizeof idle, "\n  rank 2 (%s pid %d): not in a call; last completed #1\n", comm->peers[2].hostname,
             comm->peers[2].pid);
    for (int r = 0; r < 2; r++)
      snprintf(r ? wait1 : wait0, sizeof wait0, "\n  rank %d (%s pid %d): in AllReduce #2 (1 KiB float, ", r,
               comm->peers[r].hostname, comm->peers[r].pid);
    if (strncmp(m->text, head, strlen(head)) || !strstr(m->text, idle) || !strstr(m->text, wait0) ||
        !strstr(m->text, wait1) || !strstr(m->text, "; last completed #1\n"))
      rt_fail(__FILE__, __LINE__, "%s: chorusCommStallReport gave:\n%s\nwanted the headline:\n%s", rt_mode(), m->text,
              head);
    /* Returned, not logged. */
    EXPECT(strstr(ncclGetLastError(comm), "stall report") == NULL);
    free(m);
  }
  NCCL_OK(ncclCommDestroy(comm));
}

TEST_T(stall, report_from_a_monitoring_thread, 90) {
  struct report_shared* sh = mmap(NULL, sizeof(*sh), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  ASSERT(sh != MAP_FAILED);
  atomic_store(&sh->got, 0);
  rt_run_threads(3, report_body, sh);
  atomic_store(&sh->got, 0);
  rt_run_procs(3, report_body, sh);
  munmap(sh, sizeof(*sh));
}

/* ncclCommAbort while a report waits for processes that cannot answer (stopped): the report's
 * gathering polls the abort flag, so the abort returns at once rather than after the ~2 s the report
 * would take, and the report still comes back, naming the ranks it could not ask. */
struct abort_shared {
  atomic_int done; /* rank 0 has aborted and let ranks 1 and 2 go on */
};

struct asker {
  ncclComm_t comm;
  ncclResult_t r;
  double t_end;
  char text[4096];
};

static void* asker_main(void* arg) {
  struct asker* a = arg;
  a->r = chorusCommStallReport(a->comm, a->text, sizeof a->text, NULL);
  a->t_end = now_s();
  return NULL;
}

static void abort_report_body(int rank, int nranks, ncclUniqueId id, void* arg) {
  struct abort_shared* sh = arg;
  float buf[COUNT];
  ncclComm_t comm = warm_comm(rank, nranks, id, buf);
  if (rank != 0) {
    for (double end = now_s() + 30; !atomic_load(&sh->done) && now_s() < end;) usleep(10 * 1000);
    NCCL_OK(ncclCommAbort(comm));
    return;
  }
  pid_t p1 = comm->peers[1].pid, p2 = comm->peers[2].pid;
  ASSERT(kill(p1, SIGSTOP) == 0 && kill(p2, SIGSTOP) == 0);
  static struct asker a;
  a.comm = comm;
  pthread_t t;
  ASSERT(pthread_create(&t, NULL, asker_main, &a) == 0);
  /* Abort only once the report is inside (counted in users), then give it time to reach the stopped ranks. */
  for (double end = now_s() + 10; atomic_load(&comm->users) == 0 && now_s() < end;) usleep(1000);
  EXPECT(atomic_load(&comm->users) > 0);
  usleep(200 * 1000);
  double t0 = now_s();
  NCCL_OK(ncclCommAbort(comm));
  double took = now_s() - t0;
  pthread_join(t, NULL);
  kill(p1, SIGCONT), kill(p2, SIGCONT);
  atomic_store(&sh->done, 1);
  EXPECT_EQ(a.r, ncclSuccess);
  EXPECT(a.t_end >= t0); /* it was still gathering when the abort came */
  if (took > 1.0) rt_fail(__FILE__, __LINE__, "ncclCommAbort took %.2f s beside a report (it should stop it)", took);
  if (!strstr(a.text, "no rank is blocked in a collective: rank 0 last completed #1, ranks 1-2 did not answer\n"))
    rt_fail(__FILE__, __LINE__, "report cut short by the abort:\n%s", a.text);
}

TEST_T(stall, report_beside_abort, 60) {
  struct abort_shared* sh = mmap(NULL, sizeof(*sh), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  ASSERT(sh != MAP_FAILED);
  atomic_store(&sh->done, 0);
  rt_run_procs(3, abort_report_body, sh);
  munmap(sh, sizeof(*sh));
}
