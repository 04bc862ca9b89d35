/* Looking at what ranks did (docs/OBSERVE.md): the flight recorder's content after a known sequence of
 * calls, its dumps on a timeout and on a mismatch (and what chorus-info --flight makes of them), on
 * CHORUS_DUMP_SIGNAL and on request, and the counters with their Prometheus text. */
#include <dirent.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "chorus.h"
#include "flight.h"
#include "misc/param.h"
#include "runner.h"

/* A fresh CHORUS_DUMP_DIR for this test (its process and the rank processes it forks). */
static const char* fresh_dump_dir(void) {
  static char dir[64];
  snprintf(dir, sizeof(dir), "%s/obs-XXXXXX", getenv("CHORUS_DUMP_DIR") ? getenv("CHORUS_DUMP_DIR") : "/tmp");
  if (!mkdtemp(dir)) snprintf(dir, sizeof(dir), "/tmp/chorus-obs-%d", (int)getpid());
  setenv("CHORUS_DUMP_DIR", dir, 1);
  param_reset();
  return dir;
}

static char* read_all(const char* path) {
  FILE* f = fopen(path, "r");
  if (!f) return NULL;
  char* s = calloc(1, 1 << 20);
  if (s) s[fread(s, 1, (1 << 20) - 1, f)] = 0;
  fclose(f);
  return s;
}

/* The n-th entry line (after the header) of a dump, or NULL. */
static const char* entry_line(const char* text, int n, char* line, size_t len) {
  const char* p = strstr(text, "# id seq func");
  if (!p) return NULL;
  p = strchr(p, '\n');
  for (int i = 0; p && i < n; i++) p = strchr(p + 1, '\n');
  if (!p || !p[1]) return NULL;
  const char* e = strchr(p + 1, '\n');
  size_t k = e ? (size_t)(e - p - 1) : strlen(p + 1);
  if (k >= len) k = len - 1;
  memcpy(line, p + 1, k);
  line[k] = 0;
  return line;
}

/* ---- the recorder's content after known calls ---- */

static void known_calls_body(int rank, int nranks, ncclUniqueId id, void* arg) {
  (void)arg;
  ncclComm_t comm;
  NCCL_OK(ncclCommInitRank(&comm, nranks, id, rank));
  float buf[1024], out[2048];
  for (int i = 0; i < 1024; i++) buf[i] = (float)rank;
  NCCL_OK(ncclAllReduce(buf, buf, 1024, ncclFloat, ncclSum, comm, NULL));
  NCCL_OK(ncclBroadcast(buf, buf, 100, ncclFloat, 1, comm, NULL));
  NCCL_OK(ncclGroupStart());
  NCCL_OK(ncclSend(buf, 10, ncclFloat, (rank + 1) % nranks, comm, NULL));
  NCCL_OK(ncclRecv(out, 10, ncclFloat, (rank + nranks - 1) % nranks, comm, NULL));
  NCCL_OK(ncclGroupEnd());
  NCCL_OK(ncclAllGather(buf, out, 1024 / nranks, ncclFloat, comm, NULL));
  char path[512];
  NCCL_OK(chorusCommDumpFlightRecorder(comm, path, sizeof(path)));
  char* text = read_all(path);
  ASSERT(text != NULL);
  EXPECT(strstr(text, "# chorus flight recorder 1\n") == text);
  EXPECT(strstr(text, "\nreason request\n") != NULL);
  char want[64];
  snprintf(want, sizeof(want), "\nrank %d\nnranks %d\n", rank, nranks);
  EXPECT(strstr(text, want) != NULL);
  /* id seq func type op root count algo proto nch exec state status enq start end */
  static const struct {
    unsigned long long seq;
    const char *func, *type, *op;
    int root;
    unsigned long long count;
  } calls[] = {{1, "AllReduce", "float32", "sum", -1, 1024}, {2, "Broadcast", "float32", "-", 1, 100},
               {0, "Send", "float32", "-", -2, 10},        {0, "Recv", "float32", "-", -3, 10},
               {3, "AllGather", "float32", "-", -1, 0}};
  unsigned long long prev_start = 0;
  for (int i = 0; i < 5; i++) {
    char line[512], func[32], type[32], op[32], algo[32], proto[32], exec[32], state[32], status[32];
    unsigned long long id, seq, count, enq, start, end;
    int root, nch;
    ASSERT(entry_line(text, i, line, sizeof(line)) != NULL);
    int k = sscanf(line, "%llu %llu %31s %31s %31s %d %llu %31s %31s %d %31s %31s %31s %llu %llu %llu", &id, &seq,
                   func, type, op, &root, &count, algo, proto, &nch, exec, state, status, &enq, &start, &end);
    ASSERT(k == 16);
    EXPECT_EQ(id, (unsigned long long)i + 1);
    EXPECT_EQ(seq, calls[i].seq);
    EXPECT(!strcmp(func, calls[i].func));
    EXPECT(!strcmp(type, calls[i].type));
    EXPECT(!strcmp(op, calls[i].op));
    int want_root = calls[i].root == -2 ? (rank + 1) % nranks : calls[i].root == -3 ? (rank + nranks - 1) % nranks
                                                                                     : calls[i].root;
    EXPECT_EQ(root, want_root);
    EXPECT_EQ(count, calls[i].count ? calls[i].count : (unsigned long long)(1024 / nranks));
    EXPECT(!strcmp(state, "done"));
    EXPECT(!strcmp(status, "ok"));
    if (calls[i].seq) EXPECT(strcmp(algo, "-") != 0 && strcmp(proto, "-") != 0 && nch >= 1); /* chosen */
    EXPECT(enq > 0 && enq <= start && start <= end);
    EXPECT(start >= prev_start);
    prev_start = start;
  }
  char line[512];
  EXPECT(entry_line(text, 5, line, sizeof(line)) == NULL); /* exactly those calls */
  free(text);
  NCCL_OK(ncclCommDestroy(comm));
}

TEST_T(observe, recorder_known_calls, 60) {
  fresh_dump_dir();
  rt_run_both(3, known_calls_body, NULL);
}

/* The ring keeps the last N calls: older ones give way, ids keep counting. */
TEST_T(observe, recorder_keeps_the_last_n, 30) {
  setenv("CHORUS_FLIGHT_RECORDER", "4", 1);
  fresh_dump_dir();
  ncclComm_t comm;
  NCCL_OK(ncclCommInitAll(&comm, 1, NULL));
  float v = 1, w = 0;
  for (int i = 0; i < 10; i++) NCCL_OK(ncclAllReduce(&v, &w, 1, ncclFloat, ncclSum, comm, NULL));
  char path[512];
  NCCL_OK(chorusCommDumpFlightRecorder(comm, path, sizeof(path)));
  char* text = read_all(path);
  ASSERT(text != NULL);
  EXPECT(strstr(text, "\ncapacity 4\nrecorded 10\n") != NULL);
  char line[512];
  for (int i = 0; i < 4; i++) {
    unsigned long long id = 0, seq = 0;
    ASSERT(entry_line(text, i, line, sizeof(line)) != NULL);
    EXPECT(sscanf(line, "%llu %llu", &id, &seq) == 2);
    EXPECT_EQ(id, (unsigned long long)i + 7);
    EXPECT_EQ(seq, (unsigned long long)i + 7);
  }
  EXPECT(entry_line(text, 4, line, sizeof(line)) == NULL);
  free(text);
  NCCL_OK(ncclCommDestroy(comm));
  setenv("CHORUS_FLIGHT_RECORDER", "0", 1);
  param_reset();
  NCCL_OK(ncclCommInitAll(&comm, 1, NULL));
  EXPECT_EQ(chorusCommDumpFlightRecorder(comm, path, sizeof(path)), ncclInvalidUsage);
  NCCL_OK(ncclCommDestroy(comm));
}

/* ---- dumps on a timeout (rank 2 never enters the call) and on a mismatch ---- */

enum fault { F_TIMEOUT, F_MISMATCH };

static void fault_body(int rank, int nranks, ncclUniqueId id, void* arg) {
  enum fault f = (enum fault)(intptr_t)arg;
  ncclComm_t comm;
  NCCL_OK(ncclCommInitRank(&comm, nranks, id, rank));
  NCCL_OK(chorusCommSetTimeout(comm, 1.0));
  float buf[512] = {0};
  for (int i = 0; i < 3; i++) NCCL_OK(ncclAllReduce(buf, buf, 256, ncclFloat, ncclSum, comm, NULL));
  if (f == F_TIMEOUT && rank == nranks - 1) {
    usleep(3500 * 1000); /* alive, busy elsewhere: the others' timeout asks this process to dump too */
    NCCL_OK(ncclCommAbort(comm));
    return;
  }
  size_t count = f == F_MISMATCH && rank == 1 ? 512 : 256;
  ncclResult_t r = ncclAllReduce(buf, buf, count, ncclFloat, ncclSum, comm, NULL);
  EXPECT(r != ncclSuccess);
  NCCL_OK(ncclCommAbort(comm));
}

static void check_report(const char* dir, int nranks, const char* must1, const char* must2) {
  char path[600];
  snprintf(path, sizeof(path), "%s/report.txt", dir);
  FILE* out = fopen(path, "w");
  ASSERT(out != NULL);
  EXPECT_EQ(flight_report(dir, out), 0);
  fclose(out);
  char* text = read_all(path);
  ASSERT(text != NULL);
  char want[64];
  snprintf(want, sizeof(want), "%d ranks, dumps from %d\n", nranks, nranks);
  if (!strstr(text, want) || !strstr(text, must1) || (must2 && !strstr(text, must2)))
    rt_fail(__FILE__, __LINE__, "chorus-info --flight said:\n%s", text);
  free(text);
}

/* ncclConfig_t.commName names the communicator in its flight recorder dump, chorus-info --flight's
 * report and its trace. */
TEST_T(observe, comm_name_in_dump_report_and_trace, 30) {
  const char* dir = fresh_dump_dir();
  setenv("CHORUS_TRACE", dir, 1);
  param_reset();
  ncclUniqueId id;
  NCCL_OK(ncclGetUniqueId(&id));
  ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
  cfg.commName = "dp group 3";
  ncclComm_t comm;
  NCCL_OK(ncclCommInitRankConfig(&comm, 1, id, 0, &cfg));
  float buf[16] = {0};
  NCCL_OK(ncclAllReduce(buf, buf, 16, ncclFloat, ncclSum, comm, NULL));
  char path[512];
  NCCL_OK(chorusCommDumpFlightRecorder(comm, path, sizeof(path)));
  NCCL_OK(ncclCommDestroy(comm)); /* closes the trace */
  char* text = read_all(path);
  ASSERT(text != NULL);
  EXPECT(strstr(text, "\nname dp group 3\n") != NULL);
  free(text);
  check_report(dir, 1, "\"dp group 3\": 1 ranks", NULL);
  int found = 0;
  DIR* d = opendir(dir);
  ASSERT(d != NULL);
  for (struct dirent* e; (e = readdir(d));) {
    if (strncmp(e->d_name, "chorus-trace-", 13)) continue;
    char tp[600];
    snprintf(tp, sizeof(tp), "%s/%s", dir, e->d_name);
    char* t = read_all(tp);
    found = t && strstr(t, "\"comm_name\":\"dp group 3\"") && strstr(t, "dp group 3, ");
    free(t);
  }
  closedir(d);
  EXPECT(found);
}

static void fault_case(enum fault f, int procs) {
  const char* dir = fresh_dump_dir();
  if (procs) rt_run_procs(3, fault_body, (void*)(intptr_t)f);
  else rt_run_threads(3, fault_body, (void*)(intptr_t)f);
  if (f == F_TIMEOUT)
    check_report(dir, 3, "NEVER ENTERED by ranks 2:", "rank 2: last entered #3 (done); not in any call");
  else
    check_report(dir, 3, "DIVERGED at collective #4:", "rank 1: AllReduce float32 sum count 512");
}

TEST_T(observe, dump_on_timeout_names_absent_rank_threads, 40) { fault_case(F_TIMEOUT, 0); }
TEST_T(observe, dump_on_timeout_names_absent_rank_procs, 40) { fault_case(F_TIMEOUT, 1); }
TEST_T(observe, dump_on_mismatch_names_divergence_threads, 40) { fault_case(F_MISMATCH, 0); }
TEST_T(observe, dump_on_mismatch_names_divergence_procs, 40) { fault_case(F_MISMATCH, 1); }

/* CHORUS_DUMP_SIGNAL: an idle communicator (no call in progress) writes its recorder too. */
TEST_T(observe, dump_on_signal_when_idle, 30) {
  setenv("CHORUS_DUMP_SIGNAL", "SIGUSR1", 1);
  const char* dir = fresh_dump_dir();
  ncclComm_t comm;
  NCCL_OK(ncclCommInitAll(&comm, 1, NULL));
  float v = 1;
  NCCL_OK(ncclAllReduce(&v, &v, 1, ncclFloat, ncclSum, comm, NULL));
  raise(SIGUSR1);
  char* text = NULL;
  for (int i = 0; i < 100 && !text; i++) {
    usleep(20 * 1000);
    DIR* d = opendir(dir);
    struct dirent* de;
    while (d && (de = readdir(d)))
      if (!strncmp(de->d_name, "chorus-fr-", 10) && strstr(de->d_name, ".txt") && !strstr(de->d_name, ".tmp")) {
        char p[600];
        snprintf(p, sizeof(p), "%s/%s", dir, de->d_name);
        text = read_all(p);
      }
    if (d) closedir(d);
  }
  ASSERT(text != NULL);
  EXPECT(strstr(text, "\nreason signal\n") != NULL);
  free(text);
  NCCL_OK(ncclCommDestroy(comm));
}

/* ---- counters ---- */

static void counters_body(int rank, int nranks, ncclUniqueId id, void* arg) {
  (void)arg;
  ncclComm_t comm;
  NCCL_OK(ncclCommInitRank(&comm, nranks, id, rank));
  float* buf = calloc(1 << 16, sizeof(float));
  float* got = calloc(1000, sizeof(float));
  ASSERT(buf && got);
  for (int i = 0; i < 5; i++) NCCL_OK(ncclAllReduce(buf, buf, 1 << 16, ncclFloat, ncclSum, comm, NULL));
  int next = (rank + 1) % nranks, prev = (rank + nranks - 1) % nranks;
  NCCL_OK(ncclGroupStart());
  NCCL_OK(ncclSend(buf, 1000, ncclFloat, next, comm, NULL));
  NCCL_OK(ncclRecv(got, 1000, ncclFloat, prev, comm, NULL));
  NCCL_OK(ncclGroupEnd());
  chorusCounters_t c;
  NCCL_OK(chorusCommGetCounters(comm, &c));
  EXPECT_EQ(c.calls, 7ull);
  EXPECT_EQ(c.bytes, 5ull * (4u << 16) + 2 * 4000);
  EXPECT_EQ(c.errors, 0ull);
  chorusPeerCounters_t p;
  NCCL_OK(chorusCommGetPeerCounters(comm, next, &p));
  EXPECT(p.bytesSent >= 4000);
  NCCL_OK(chorusCommGetPeerCounters(comm, prev, &p));
  EXPECT(p.bytesReceived >= 4000);
  EXPECT_EQ(chorusCommGetPeerCounters(comm, nranks, &p), ncclInvalidArgument);
  EXPECT_EQ(chorusCommGetCounters(comm, NULL), ncclInvalidArgument);
  size_t need = 0;
  NCCL_OK(chorusCommMetrics(comm, NULL, 0, &need));
  char* text = calloc(1, need + 1);
  ASSERT(text != NULL);
  NCCL_OK(chorusCommMetrics(comm, text, need + 1, NULL));
  char want[128];
  snprintf(want, sizeof(want), "rank=\"%d\",nranks=\"%d\"} 7\n", rank, nranks);
  if (!strstr(text, "# TYPE chorus_calls_total counter\n") || !strstr(text, want))
    rt_fail(__FILE__, __LINE__, "metrics text lacks %s:\n%s", want, text);
  snprintf(want, sizeof(want), "chorus_peer_sent_bytes_total{");
  EXPECT(strstr(text, want) != NULL);
  free(text);
  free(buf);
  free(got);
  NCCL_OK(ncclCommDestroy(comm));
}

TEST_T(observe, counters_and_metrics, 60) { rt_run_both(3, counters_body, NULL); }

/* The stall query service serves the counters (chorus-info --metrics) and writes every rank's recorder
 * on request (chorus-info --dump). */
#include "bootstrap/bootstrap.h"
#include "comm/comm.h"
#include "fault/stall.h"
#include "misc/utils.h"

static void query_body(int rank, int nranks, ncclUniqueId id, void* arg) {
  (void)arg;
  ncclComm_t comm;
  NCCL_OK(ncclCommInitRank(&comm, nranks, id, rank));
  float v[64] = {0};
  for (int i = 0; i < 3; i++) NCCL_OK(ncclAllReduce(v, v, 64, ncclFloat, ncclSum, comm, NULL));
  NCCL_OK(ncclAllReduce(v, v, 1, ncclFloat, ncclSum, comm, NULL)); /* all ranks past the three */
  if (rank == 0) {
    const union sock_addr* qa = &comm->peers[0].query_addr;
    if (qa->sa.sa_family == AF_UNSPEC) {
      printf("    SKIP: no stall query service here\n");
    } else {
      char* out = calloc(1, 1 << 16);
      char why[200] = "";
      size_t got = 0;
      ASSERT(out != NULL);
      ASSERT_EQ(boot_query(qa, NULL, STALL_Q_METRICS, NULL, 0, out, (1 << 16) - 1, &got, ut_now_ns() + 5000000000ull,
                           NULL, why, sizeof(why)), CH_OK);
      out[got] = 0;
      char want[96];
      snprintf(want, sizeof(want), "rank=\"0\",nranks=\"%d\"} 4\n", nranks);
      if (!strstr(out, "chorus_calls_total{") || !strstr(out, want))
        rt_fail(__FILE__, __LINE__, "metrics over the query service lack %s:\n%s", want, out);
      got = 0;
      ASSERT_EQ(boot_query(qa, NULL, STALL_Q_DUMP, NULL, 0, out, (1 << 16) - 1, &got, ut_now_ns() + 5000000000ull, NULL,
                           why, sizeof(why)), CH_OK);
      out[got] = 0;
      snprintf(want, sizeof(want), ": %d of %d ranks wrote their flight recorder", nranks, nranks);
      if (!strstr(out, want)) rt_fail(__FILE__, __LINE__, "the dump request answered:\n%s", out);
      free(out);
    }
  }
  NCCL_OK(ncclAllReduce(v, v, 1, ncclFloat, ncclSum, comm, NULL)); /* nobody leaves before the query */
  NCCL_OK(ncclCommDestroy(comm));
}

TEST_T(observe, query_service_metrics_and_dump, 60) {
  const char* dir = fresh_dump_dir();
  rt_run_both(3, query_body, NULL);
  int files = 0;
  DIR* d = opendir(dir);
  struct dirent* de;
  while (d && (de = readdir(d))) files += !strncmp(de->d_name, "chorus-fr-", 10);
  if (d) closedir(d);
  EXPECT_EQ(files, 6); /* 3 ranks, threads then processes: two communicators */
}
