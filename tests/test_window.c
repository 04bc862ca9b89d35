/* Windows and one-sided calls (api/window.c, api/rma_ops.c): puts land in the peer's window and its
 * wait sees them, counts add up, every misuse is refused by name, and a wait ends with a cause (peer
 * gone, timeout) instead of hanging. Threads and processes; ncclMemAlloc and plain memory. */
#include <stdatomic.h>
#include <stdint.h>
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "chorus.h"
#include "misc/param.h"
#include "report_util.h"
#include "runner.h"

#define CHUNK 100003 /* floats each rank puts into the next one's window per round */
#define ROUNDS 5

struct win_arg {
  int plain; /* windows in malloc memory (processes: needs CHORUS_CMA=1) */
};

static void* win_alloc(size_t bytes, int plain) {
  void* p = NULL;
  if (plain) p = malloc(bytes);
  else NCCL_OK(ncclMemAlloc(&p, bytes));
  ASSERT(p != NULL);
  return p;
}
static void win_free(void* p, int plain) {
  if (plain) free(p);
  else NCCL_OK(ncclMemFree(p));
}

/* A ring of puts: round k, rank r writes CHUNK floats of value (r + 1) * 1000 + k into slot k % 2 of
 * rank r+1's window and signals it; then waits for rank r-1's signal and checks what arrived. */
static void ring_body(int rank, int n, ncclUniqueId id, void* arg) {
  const struct win_arg* a = arg;
  ncclComm_t comm;
  NCCL_OK(ncclCommInitRank(&comm, n, id, rank));
  size_t bytes = 2 * CHUNK * sizeof(float);
  float* mem = win_alloc(bytes, a->plain);
  float* src = malloc(CHUNK * sizeof(float));
  ncclWindow_t win;
  NCCL_OK(ncclCommWindowRegister(comm, mem, bytes, &win, NCCL_WIN_DEFAULT));
  void* user = NULL;
  NCCL_OK(ncclWinGetUserPtr(comm, win, &user));
  EXPECT(user == mem);
  int next = (rank + 1) % n, prev = (rank + n - 1) % n;
  for (int k = 0; k < ROUNDS; k++) {
    for (int i = 0; i < CHUNK; i++) src[i] = (float)((rank + 1) * 1000 + k);
    NCCL_OK(
        ncclPutSignal(src, CHUNK, ncclFloat, next, win, (size_t)(k % 2) * CHUNK * sizeof(float), 0, 0, 0, comm, NULL));
    ncclWaitSignalDesc_t d = {.opCnt = 1, .peer = prev, .sigIdx = 0, .ctx = 0};
    NCCL_OK(ncclWaitSignal(1, &d, comm, NULL));
    const float* got = mem + (size_t)(k % 2) * CHUNK;
    float want = (float)((prev + 1) * 1000 + k);
    for (int i = 0; i < CHUNK; i++)
      if (got[i] != want) {
        rt_fail(__FILE__, __LINE__, "rank %d round %d [%d] = %g, want %g", rank, k, i, got[i], want);
        break;
      }
    /* A collective between rounds: one-sided calls and collectives mix on one communicator, and it
     * keeps the writer of the next round off the slot this round's reader is still checking. */
    int v = 1;
    NCCL_OK(ncclAllReduce(&v, &v, 1, ncclInt32, ncclSum, comm, NULL));
    EXPECT_EQ(v, n);
  }
  NCCL_OK(ncclCommWindowDeregister(comm, win));
  win_free(mem, a->plain);
  free(src);
  NCCL_OK(ncclCommDestroy(comm));
}
TEST_T(window, ring_of_puts_threads, 60) {
  struct win_arg a = {0};
  rt_run_threads(3, ring_body, &a);
  a.plain = 1; /* between threads any memory is reachable */
  rt_run_threads(4, ring_body, &a);
}
TEST_T(window, ring_of_puts_procs, 60) {
  struct win_arg a = {0};
  rt_run_procs(3, ring_body, &a);
  rt_run_procs(2, ring_body, &a);
}
TEST_T(window, ring_of_puts_procs_plain_by_cma, 60) {
  if (access("/proc/sys/kernel/yama/ptrace_scope", F_OK) == 0 && !getenv("CHORUS_TEST_CMA"))
    return; /* may be refused */
  setenv("CHORUS_CMA", "1", 1);
  struct win_arg a = {1};
  rt_run_procs(3, ring_body, &a);
  unsetenv("CHORUS_CMA");
}

/* Signals without data, several descriptors, counts carried over, a put into one's own window. */
static void signals_body(int rank, int n, ncclUniqueId id, void* arg) {
  (void)arg;
  ncclComm_t comm;
  NCCL_OK(ncclCommInitRank(&comm, n, id, rank));
  int* mem = win_alloc(4096, 0);
  ncclWindow_t win;
  NCCL_OK(ncclCommWindowRegister(comm, mem, 4096, &win, NCCL_WIN_COLL_SYMMETRIC | NCCL_WIN_STRICT_ORDERING));
  /* every rank signals every other rank three times */
  for (int p = 0; p < n; p++)
    for (int k = 0; p != rank && k < 3; k++) NCCL_OK(ncclSignal(p, 0, 0, 0, comm, NULL));
  ncclWaitSignalDesc_t d[8];
  int nd = 0;
  for (int p = 0; p < n; p++)
    if (p != rank) d[nd++] = (ncclWaitSignalDesc_t){.opCnt = 2, .peer = p, .sigIdx = 0, .ctx = 0};
  NCCL_OK(ncclWaitSignal(nd, d, comm, NULL)); /* 2 of the 3 */
  for (int i = 0; i < nd; i++) d[i].opCnt = 1;
  NCCL_OK(ncclWaitSignal(nd, d, comm, NULL)); /* the third */
  /* two descriptors of one signal: both counts */
  int other = (rank + 1) % n;
  NCCL_OK(ncclSignal(other, 0, 0, 0, comm, NULL));
  NCCL_OK(ncclSignal(other, 0, 0, 0, comm, NULL));
  ncclWaitSignalDesc_t two[2] = {{1, (rank + n - 1) % n, 0, 0}, {1, (rank + n - 1) % n, 0, 0}};
  NCCL_OK(ncclWaitSignal(2, two, comm, NULL));
  /* into my own window */
  int v = 42 + rank;
  NCCL_OK(ncclPutSignal(&v, 1, ncclInt32, rank, win, 8, 0, 0, 0, comm, NULL));
  ncclWaitSignalDesc_t self = {1, rank, 0, 0};
  NCCL_OK(ncclWaitSignal(1, &self, comm, NULL));
  EXPECT_EQ(mem[2], 42 + rank);
  NCCL_OK(ncclCommWindowDeregister(comm, win));
  win_free(mem, 0);
  NCCL_OK(ncclCommDestroy(comm));
}
TEST_T(window, signals_count_threads_and_procs, 60) { rt_run_both(3, signals_body, NULL); }

/* One-sided calls are seen as every call is (issue 46): a wait that does not complete is named in the
 * stall report (rank 0 waits for two signals from rank 1, which sends one, then the second only once
 * rank 0's monitoring thread has read a report that says so); every call is in the flight recorder,
 * the peer counters and the timeline (the test below reads the CHORUS_TRACE files). */
static void sigwait_body(int rank, int n, ncclUniqueId id, void* arg) {
  atomic_int* seen = arg;
  ncclComm_t comm;
  NCCL_OK(ncclCommInitRank(&comm, n, id, rank));
  int* mem = win_alloc(4096, 0);
  ncclWindow_t win;
  NCCL_OK(ncclCommWindowRegister(comm, mem, 4096, &win, NCCL_WIN_COLL_SYMMETRIC));
  if (rank == 0) {
    struct ru_monitor* m = ru_monitor_start(comm, "rank 0 waiting for signal 0 from rank 1, 1 of 2 seen", seen);
    ncclWaitSignalDesc_t d = {.opCnt = 2, .peer = 1, .sigIdx = 0, .ctx = 0};
    NCCL_OK(ncclWaitSignal(1, &d, comm, NULL));
    char* text = ru_monitor_join(m);
    if (!strstr(text, "): in ncclWaitSignal, waiting for signal 0 (context 0) from rank 1, 1 of 2 seen, for "))
      rt_fail(__FILE__, __LINE__, "%s: the report said:\n%s", rt_mode(), text);
    free(text);
  } else {
    NCCL_OK(ncclSignal(0, 0, 0, 0, comm, NULL));
    ru_flag_wait(seen);
    NCCL_OK(ncclSignal(0, 0, 0, 0, comm, NULL));
    int v = 7;
    NCCL_OK(ncclPutSignal(&v, 1, ncclInt32, 1, win, 0, 0, 0, 0, comm, NULL)); /* into its own window */
    ncclWaitSignalDesc_t self = {1, 1, 0, 0};
    NCCL_OK(ncclWaitSignal(1, &self, comm, NULL));
    chorusPeerCounters_t pc0, pc1;
    NCCL_OK(chorusCommGetPeerCounters(comm, 0, &pc0));
    NCCL_OK(chorusCommGetPeerCounters(comm, 1, &pc1));
    EXPECT_EQ((long long)pc0.signalsSent, 2LL);
    EXPECT_EQ((long long)pc0.bytesPut, 0LL);
    EXPECT_EQ((long long)pc1.signalsSent, 1LL);
    EXPECT_EQ((long long)pc1.bytesPut, 4LL);
  }
  /* The flight recorder has them: func, type, op, root (the peer), count, ..., state, status. */
  char path[512], text[8192] = "";
  NCCL_OK(chorusCommDumpFlightRecorder(comm, path, sizeof path));
  FILE* f = fopen(path, "r");
  ASSERT(f != NULL);
  size_t got = fread(text, 1, sizeof text - 1, f);
  text[got] = '\0';
  fclose(f);
  unlink(path);
  const char* want0[] = {" WaitSignal - - 1 2 - - 0 host done ok "};
  const char* want1[] = {" Signal - - 0 0 - - 0 host done ok ", " PutSignal int32 - 1 1 - - 0 host done ok ",
                         " WaitSignal - - 1 1 - - 0 host done ok "};
  const char** want = rank == 0 ? want0 : want1;
  for (int i = 0; i < (rank == 0 ? 1 : 3); i++)
    if (!strstr(text, want[i])) rt_fail(__FILE__, __LINE__, "%s rank %d: no '%s' in the recorder:\n%s", rt_mode(), rank, want[i], text);
  NCCL_OK(ncclCommWindowDeregister(comm, win));
  win_free(mem, 0);
  NCCL_OK(ncclCommDestroy(comm));
}
static int file_has(const char* dir, const char* suffix, const char* what) {
  DIR* d = opendir(dir);
  int found = 0;
  for (struct dirent* e; d && !found && (e = readdir(d));) {
    size_t l = strlen(e->d_name), k = strlen(suffix);
    if (l < k || strcmp(e->d_name + l - k, suffix)) continue;
    char path[1024], text[16384];
    snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
    FILE* f = fopen(path, "r");
    if (!f) continue;
    size_t got = fread(text, 1, sizeof text - 1, f);
    text[got] = '\0';
    fclose(f);
    found = strstr(text, what) != NULL;
  }
  if (d) closedir(d);
  return found;
}

TEST_T(window, one_sided_calls_observed, 90) {
  char dir[] = "/tmp/chorus-win-trace-XXXXXX"; /* and on the timeline (CHORUS_TRACE) */
  ASSERT(mkdtemp(dir) != NULL);
  setenv("CHORUS_TRACE", dir, 1);
  param_reset();
  atomic_int* seen = ru_flag_new();
  rt_run_threads(2, sigwait_body, seen);
  atomic_store(seen, 0);
  rt_run_procs(2, sigwait_body, seen);
  ru_flag_free(seen);
  unsetenv("CHORUS_TRACE");
  param_reset();
  EXPECT(file_has(dir, "-r1.json", "\"name\":\"PutSignal\""));
  EXPECT(file_has(dir, "-r0.json", "\"name\":\"WaitSignal\""));
  char cmd[600];
  snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
  EXPECT_EQ(system(cmd), 0);
}

/* Refusals, each by name, none of which waits for a peer. */
static void refusals_body(int rank, int n, ncclUniqueId id, void* arg) {
  (void)arg;
  ncclComm_t comm, other;
  NCCL_OK(ncclCommInitRank(&comm, n, id, rank));
  int v[4] = {0};
  ncclWaitSignalDesc_t d = {1, 0, 0, 0};
  EXPECT_EQ(ncclSignal(0, 0, 0, 0, comm, NULL), ncclInvalidUsage); /* no window yet */
  EXPECT(strstr(ncclGetLastError(comm), "no window is registered") != NULL);
  EXPECT_EQ(ncclWaitSignal(1, &d, comm, NULL), ncclInvalidUsage);
  int* mem = win_alloc(64, 0);
  ncclWindow_t win, bogus = (ncclWindow_t)&v;
  EXPECT_EQ(ncclCommWindowRegister(comm, mem, 64, &win, 0x40), ncclInvalidArgument);
  EXPECT_EQ(ncclCommWindowRegister(comm, NULL, 64, &win, 0), ncclInvalidArgument);
  NCCL_OK(ncclCommWindowRegister(comm, mem, 64, &win, NCCL_WIN_DEFAULT));
  EXPECT_EQ(ncclPutSignal(v, 4, ncclInt32, 0, win, 60, 0, 0, 0, comm, NULL), ncclInvalidArgument); /* past the end */
  EXPECT(strstr(ncclGetLastError(comm), "past the end") != NULL);
  EXPECT_EQ(ncclPutSignal(v, 4, ncclInt32, 0, win, SIZE_MAX, 0, 0, 0, comm, NULL), ncclInvalidArgument);
  EXPECT_EQ(ncclPutSignal(v, 1, ncclInt32, n, win, 0, 0, 0, 0, comm, NULL), ncclInvalidArgument); /* peer */
  EXPECT_EQ(ncclPutSignal(v, 1, ncclInt32, 0, win, 0, 1, 0, 0, comm, NULL), ncclInvalidArgument); /* sigIdx */
  EXPECT_EQ(ncclPutSignal(v, 1, ncclInt32, 0, win, 0, 0, 1, 0, comm, NULL), ncclInvalidArgument); /* ctx */
  EXPECT_EQ(ncclPutSignal(v, 1, ncclInt32, 0, win, 0, 0, 0, 1, comm, NULL), ncclInvalidArgument); /* flags */
  EXPECT_EQ(ncclPutSignal(v, 1, (ncclDataType_t)99, 0, win, 0, 0, 0, 0, comm, NULL), ncclInvalidArgument);
  EXPECT_EQ(ncclPutSignal(v, 1, ncclInt32, 0, bogus, 0, 0, 0, 0, comm, NULL), ncclInvalidArgument);
  EXPECT(strstr(ncclGetLastError(comm), "is not registered") != NULL);
  EXPECT_EQ(ncclPutSignal(v, 1, ncclInt32, 0, win, 0, 0, 0, 0, comm, (cudaStream_t)&v), ncclInvalidUsage);
  d.opCnt = 0;
  EXPECT_EQ(ncclWaitSignal(1, &d, comm, NULL), ncclInvalidArgument);
  EXPECT_EQ(ncclWaitSignal(0, &d, comm, NULL), ncclInvalidArgument);
  d = (ncclWaitSignalDesc_t){1, -1, 0, 0};
  EXPECT_EQ(ncclWaitSignal(1, &d, comm, NULL), ncclInvalidArgument);
  /* a window of another communicator is not this one's */
  NCCL_OK(ncclCommSplit(comm, 0, rank, &other, NULL));
  EXPECT_EQ(ncclPutSignal(v, 1, ncclInt32, 0, win, 0, 0, 0, 0, other, NULL), ncclInvalidUsage); /* no window */
  NCCL_OK(ncclCommDestroy(other));
  NCCL_OK(ncclCommWindowDeregister(comm, win));
  EXPECT_EQ(ncclPutSignal(v, 1, ncclInt32, 0, win, 0, 0, 0, 0, comm, NULL), ncclInvalidArgument); /* gone */
  EXPECT_EQ(ncclCommWindowDeregister(comm, win), ncclInvalidArgument);
  win_free(mem, 0);
  NCCL_OK(ncclCommDestroy(comm));
}
TEST_T(window, misuse_refused_by_name, 60) { rt_run_both(2, refusals_body, NULL); }

/* Between processes a malloc window cannot be mapped: refused on every rank unless CHORUS_CMA=1. */
static void plain_procs_body(int rank, int n, ncclUniqueId id, void* arg) {
  (void)arg;
  ncclComm_t comm;
  NCCL_OK(ncclCommInitRank(&comm, n, id, rank));
  /* all plain, then only the last rank's: the same verdict on every rank either way */
  for (int round = 0; round < 2; round++) {
    int plain = round == 0 || rank == n - 1;
    void* mem = win_alloc(4096, plain);
    ncclWindow_t win = (ncclWindow_t)mem;
    EXPECT_EQ(ncclCommWindowRegister(comm, mem, 4096, &win, 0), ncclInvalidUsage);
    EXPECT(win == NULL);
    EXPECT(strstr(ncclGetLastError(comm), "ncclMemAlloc") != NULL);
    win_free(mem, plain);
  }
  /* then a proper one works: the signals are made again */
  int* mem = win_alloc(4096, 0);
  ncclWindow_t win;
  NCCL_OK(ncclCommWindowRegister(comm, mem, 4096, &win, 0));
  int v = 7;
  NCCL_OK(ncclPutSignal(&v, 1, ncclInt32, (rank + 1) % n, win, 0, 0, 0, 0, comm, NULL));
  ncclWaitSignalDesc_t d = {1, (rank + n - 1) % n, 0, 0};
  NCCL_OK(ncclWaitSignal(1, &d, comm, NULL));
  EXPECT_EQ(mem[0], 7);
  NCCL_OK(ncclCommWindowDeregister(comm, win));
  win_free(mem, 0);
  NCCL_OK(ncclCommDestroy(comm));
}
TEST_T(window, plain_memory_between_procs_refused, 60) {
  rt_run_procs(2, plain_procs_body, NULL);
  rt_run_procs(3, plain_procs_body, NULL);
}

/* A wait whose signaller is gone (arg NULL: it exits; else it lives but never signals and the wait
 * times out) ends with that cause. */
static void gone_body(int rank, int n, ncclUniqueId id, void* arg) {
  ncclComm_t comm;
  NCCL_OK(ncclCommInitRank(&comm, n, id, rank));
  void* mem = win_alloc(4096, 0);
  ncclWindow_t win;
  NCCL_OK(ncclCommWindowRegister(comm, mem, 4096, &win, 0));
  if (rank == 1) {
    if (!arg) _exit(0);
    sleep(4);
  } else {
    NCCL_OK(chorusCommSetTimeout(comm, 1));
    ncclWaitSignalDesc_t d = {1, 1, 0, 0};
    ncclResult_t r = ncclWaitSignal(1, &d, comm, NULL);
    EXPECT_EQ(r, arg ? ncclTimeout : ncclRemoteError);
    EXPECT(strstr(ncclGetLastError(comm), arg ? "0 of 1 seen" : "has exited") != NULL);
    NCCL_OK(ncclCommAbort(comm));
    comm = NULL;
  }
  if (comm) NCCL_OK(ncclCommAbort(comm)); /* the windows go with it */
  win_free(mem, 0);
}
TEST_T(window, wait_for_a_dead_peer_fails, 60) { rt_run_procs(2, gone_body, NULL); }
TEST_T(window, wait_times_out, 60) { rt_run_procs(2, gone_body, (void*)1); }

/* On a host stream: in stream order, the calls drain what was issued before them. */
static void stream_body(int rank, int n, ncclUniqueId id, void* arg) {
  (void)arg;
  ncclComm_t comm;
  NCCL_OK(ncclCommInitRank(&comm, n, id, rank));
  cudaStream_t s;
  NCCL_OK(chorusStreamCreate(&s));
  int* mem = win_alloc(4096, 0);
  ncclWindow_t win;
  NCCL_OK(ncclCommWindowRegister(comm, mem, 4096, &win, 0));
  int v[64];
  for (int i = 0; i < 64; i++) v[i] = rank;
  NCCL_OK(ncclAllReduce(v, v, 64, ncclInt32, ncclSum, comm, s));                      /* queued */
  NCCL_OK(ncclPutSignal(v, 64, ncclInt32, (rank + 1) % n, win, 0, 0, 0, 0, comm, s)); /* after it */
  ncclWaitSignalDesc_t d = {1, (rank + n - 1) % n, 0, 0};
  NCCL_OK(ncclWaitSignal(1, &d, comm, s));
  NCCL_OK(chorusStreamSynchronize(s));
  EXPECT_EQ(mem[63], n * (n - 1) / 2); /* the AllReduce's result was put */
  NCCL_OK(ncclCommWindowDeregister(comm, win));
  win_free(mem, 0);
  NCCL_OK(chorusStreamDestroy(s));
  NCCL_OK(ncclCommDestroy(comm));
}
TEST_T(window, host_stream_order, 60) { rt_run_both(3, stream_body, NULL); }

/* numRmaSig x numRmaCtx signals from the config; 0 contexts turns one-sided calls off (as NCCL). */
static void config_body(int rank, int n, ncclUniqueId id, void* arg) {
  int off = arg != NULL;
  ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
  cfg.numRmaCtx = off ? 0 : 2;
  cfg.numRmaSig = 4;
  ncclComm_t comm;
  NCCL_OK(ncclCommInitRankConfig(&comm, n, id, rank, &cfg));
  void* mem = win_alloc(4096, 0);
  ncclWindow_t win;
  NCCL_OK(ncclCommWindowRegister(comm, mem, 4096, &win, 0));
  int peer = (rank + 1) % n, from = (rank + n - 1) % n;
  if (off) {
    EXPECT_EQ(ncclSignal(peer, 0, 0, 0, comm, NULL), ncclInvalidUsage);
    EXPECT(strstr(ncclGetLastError(comm), "one-sided calls are off") != NULL);
  } else {
    NCCL_OK(ncclSignal(peer, 3, 1, 0, comm, NULL));
    NCCL_OK(ncclSignal(peer, 0, 0, 0, comm, NULL));
    EXPECT_EQ(ncclSignal(peer, 4, 0, 0, comm, NULL), ncclInvalidArgument);
    EXPECT_EQ(ncclSignal(peer, 0, 2, 0, comm, NULL), ncclInvalidArgument);
    ncclWaitSignalDesc_t d[2] = {{1, from, 3, 1}, {1, from, 0, 0}};
    NCCL_OK(ncclWaitSignal(2, d, comm, NULL));
  }
  NCCL_OK(ncclCommWindowDeregister(comm, win));
  win_free(mem, 0);
  NCCL_OK(ncclCommDestroy(comm));
}
TEST_T(window, signals_and_contexts_from_config, 60) {
  rt_run_both(2, config_body, NULL);
  rt_run_both(2, config_body, (void*)1); /* no signals: processes reach no peer's block */
}

/* What a peer publishes of its window or signal block is checked before anything of it is mapped or
 * used (api/window.c): hostile spans are refused. */
#include "api/rma.h"
TEST(window, hostile_descriptions_refused) {
  EXPECT(rma_span_ok(0, 4096, 4096));
  EXPECT(rma_span_ok(4096, 0, 4096));
  EXPECT(!rma_span_ok(4097, 0, 4096));            /* offset past the allocation */
  EXPECT(!rma_span_ok(8, 4096, 4096));            /* runs past its end */
  EXPECT(!rma_span_ok(1, UINT64_MAX, 4096));      /* wraps */
  EXPECT(!rma_span_ok(UINT64_MAX, 1, UINT64_MAX)); /* an allocation no process could have */
  EXPECT(!rma_span_ok(0, 1, (uint64_t)PTRDIFF_MAX));
}
