/* Multi-threaded use and lifetime: ncclCommAbort from another thread while a call is connecting, in a
 * split, or blocked on a peer; a watchdog thread polling ncclCommGetAsyncError (PyTorch's pattern);
 * groups mixing streams and two communicators sharing one host stream; ncclGetLastError per
 * communicator. Run under ASan and TSan in CI: the defects these catch were use-after-free and races. */
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "chorus.h"
#include "comm/comm.h"
#include "runner.h"

static uint64_t now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

/* ---- abort from another thread ---- */

struct aborter {
  ncclComm_t comm;
  int delay_ms;
  uint64_t took_ms;
};

static void* abort_later(void* arg) {
  struct aborter* a = arg;
  usleep((useconds_t)a->delay_ms * 1000);
  uint64_t t0 = now_ms();
  ncclResult_t r = ncclCommAbort(a->comm);
  a->took_ms = now_ms() - t0;
  if (r != ncclSuccess) rt_fail(__FILE__, __LINE__, "ncclCommAbort -> %d", (int)r);
  return NULL;
}

enum stuck { STUCK_CONNECT, STUCK_SPLIT, STUCK_COLL };

/* Rank 0 enters a call that cannot finish because rank 1 never makes its side of it; another thread
 * aborts rank 0's comm. The call must return (not crash, not hang) and the abort must be prompt. */
static void abort_stuck_body(int rank, int nranks, ncclUniqueId id, void* arg) {
  enum stuck what = (enum stuck)(intptr_t)arg;
  ncclComm_t comm;
  NCCL_OK(ncclCommInitRank(&comm, nranks, id, rank));
  if (rank != 0) {
    usleep(1500 * 1000); /* alive, but never joins rank 0's call */
    NCCL_OK(ncclCommAbort(comm));
    return;
  }
  float buf[16] = {0};
  struct aborter a = {comm, 300, 0};
  pthread_t t;
  ASSERT(pthread_create(&t, NULL, abort_later, &a) == 0);
  uint64_t t0 = now_ms();
  ncclResult_t r;
  ncclComm_t child = (ncclComm_t)0x1;
  if (what == STUCK_CONNECT) r = ncclSend(buf, 16, ncclFloat, 1, comm, NULL);
  else if (what == STUCK_SPLIT) r = ncclCommSplit(comm, 0, rank, &child, NULL);
  else r = ncclAllReduce(buf, buf, 16, ncclFloat, ncclSum, comm, NULL);
  uint64_t took = now_ms() - t0;
  pthread_join(t, NULL);
  EXPECT(r != ncclSuccess);
  EXPECT(r == ncclInvalidUsage); /* the abort's own outcome, not "internal error" */
  if (what == STUCK_SPLIT) EXPECT(child == NULL);
  if (took > 2000) rt_fail(__FILE__, __LINE__, "the aborted call returned after %llu ms", (unsigned long long)took);
  if (a.took_ms > 2000) rt_fail(__FILE__, __LINE__, "ncclCommAbort took %llu ms", (unsigned long long)a.took_ms);
}

TEST_T(safety, abort_during_connect, 30) { rt_run_both(2, abort_stuck_body, (void*)(intptr_t)STUCK_CONNECT); }
TEST_T(safety, abort_during_split, 30) { rt_run_both(2, abort_stuck_body, (void*)(intptr_t)STUCK_SPLIT); }
TEST_T(safety, abort_during_collective, 30) { rt_run_both(2, abort_stuck_body, (void*)(intptr_t)STUCK_COLL); }

/* ---- a watchdog polling ncclCommGetAsyncError ---- */

struct watchdog {
  ncclComm_t comm;
  atomic_int stop;
  long polls;
};

static void* watchdog_main(void* arg) {
  struct watchdog* w = arg;
  while (!atomic_load(&w->stop)) {
    ncclResult_t as = ncclSuccess;
    ncclResult_t r = ncclCommGetAsyncError(w->comm, &as);
    if (r != ncclSuccess || (as != ncclSuccess && as != ncclInProgress))
      rt_fail(__FILE__, __LINE__, "watchdog: GetAsyncError -> %d, async %d", (int)r, (int)as);
    w->polls++;
    sched_yield(); /* tight, but lets the ranks run on a small machine */
  }
  return NULL;
}

/* Nonblocking init while a watchdog thread polls from the first moment (the init thread's join used to
 * race between the poller and the caller: a second pthread_join hung), then calls, then destroy. */
static void watchdog_body(int rank, int nranks, ncclUniqueId id, void* arg) {
  int iters = (int)(intptr_t)arg;
  (void)id;
  for (int it = 0; it < iters; it++) {
    ncclUniqueId uid;
    /* Each iteration needs its own id: rank 0 makes it, the others read it from the shared slot. */
    static ncclUniqueId ids[2];
    static atomic_int ready[2];
    if (rank == 0) {
      NCCL_OK(ncclGetUniqueId(&ids[it & 1]));
      atomic_store(&ready[it & 1], it + 1);
    }
    while (atomic_load(&ready[it & 1]) != it + 1) sched_yield();
    uid = ids[it & 1];
    ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
    cfg.blocking = 0;
    ncclComm_t comm = NULL;
    ncclResult_t r = ncclCommInitRankConfig(&comm, nranks, uid, rank, &cfg);
    ASSERT(r == ncclSuccess || r == ncclInProgress);
    struct watchdog w = {comm, 0, 0};
    pthread_t t;
    ASSERT(pthread_create(&t, NULL, watchdog_main, &w) == 0);
    ncclResult_t as;
    do NCCL_OK(ncclCommGetAsyncError(comm, &as)); while (as == ncclInProgress);
    ASSERT_EQ(as, ncclSuccess);
    int v = rank + 1;
    r = ncclAllReduce(&v, &v, 1, ncclInt32, ncclSum, comm, NULL);
    EXPECT(r == ncclSuccess || r == ncclInProgress);
    do NCCL_OK(ncclCommGetAsyncError(comm, &as)); while (as == ncclInProgress);
    EXPECT_EQ(v, nranks * (nranks + 1) / 2);
    atomic_store(&w.stop, 1);
    pthread_join(t, NULL);
    NCCL_OK(ncclCommDestroy(comm));
    if (rt_failures()) return;
  }
}

/* Threads only: the shared id slots are process memory. */
TEST_T(safety, watchdog_polling_1000, 300) { rt_run_threads(2, watchdog_body, (void*)(intptr_t)1000); }

/* ---- streams in groups ---- */

/* One thread drives both ranks of ncclCommInitAll in one group, each call on a different kind of
 * stream: a host stream and none (the first call's stream used to decide for the group, and NULL
 * was then dereferenced as a host stream), or a foreign pointer (never to be touched: run inline). */
static void mixed_streams(int kind0, int kind1) {
  ncclComm_t comms[2];
  NCCL_OK(ncclCommInitAll(comms, 2, NULL));
  cudaStream_t s;
  NCCL_OK(chorusStreamCreate(&s));
  static int foreign_stream_object;
  cudaStream_t pick[3] = {NULL, s, (cudaStream_t)&foreign_stream_object};
  int x[2][64];
  for (int r = 0; r < 2; r++)
    for (int i = 0; i < 64; i++) x[r][i] = r + i;
  NCCL_OK(ncclGroupStart());
  NCCL_OK(ncclAllReduce(x[0], x[0], 64, ncclInt32, ncclSum, comms[0], pick[kind0]));
  NCCL_OK(ncclAllReduce(x[1], x[1], 64, ncclInt32, ncclSum, comms[1], pick[kind1]));
  NCCL_OK(ncclGroupEnd());
  NCCL_OK(chorusStreamSynchronize(s));
  for (int r = 0; r < 2; r++)
    for (int i = 0; i < 64; i++)
      if (x[r][i] != 2 * i + 1) rt_fail_fatal(__FILE__, __LINE__, "rank %d [%d] = %d, want %d", r, i, x[r][i], 2 * i + 1);
  NCCL_OK(chorusStreamDestroy(s));
  for (int r = 0; r < 2; r++) NCCL_OK(ncclCommDestroy(comms[r]));
}

TEST_T(safety, group_host_then_null_stream, 30) { mixed_streams(1, 0); }
TEST_T(safety, group_null_then_host_stream, 30) { mixed_streams(0, 1); }
TEST_T(safety, group_host_then_foreign_stream, 30) { mixed_streams(1, 2); }

/* ncclCommInitAll and one thread driving both ranks on one host stream: the two plans must run
 * together (one after the other, each waits for the other for ever). */
TEST_T(safety, group_shared_host_stream, 30) {
  ncclComm_t comms[2];
  NCCL_OK(ncclCommInitAll(comms, 2, NULL));
  cudaStream_t s;
  NCCL_OK(chorusStreamCreate(&s));
  float x[2][256];
  for (int iter = 0; iter < 20; iter++) {
    for (int r = 0; r < 2; r++)
      for (int i = 0; i < 256; i++) x[r][i] = (float)(r + i);
    NCCL_OK(ncclGroupStart());
    for (int r = 0; r < 2; r++) NCCL_OK(ncclAllReduce(x[r], x[r], 256, ncclFloat, ncclSum, comms[r], s));
    NCCL_OK(ncclGroupEnd());
    NCCL_OK(chorusStreamSynchronize(s));
    for (int r = 0; r < 2; r++)
      for (int i = 0; i < 256; i++)
        if (x[r][i] != (float)(2 * i + 1)) {
          rt_fail_fatal(__FILE__, __LINE__, "iter %d rank %d [%d] = %g, want %d", iter, r, i, (double)x[r][i], 2 * i + 1);
        }
  }
  NCCL_OK(chorusStreamDestroy(s));
  for (int r = 0; r < 2; r++) NCCL_OK(ncclCommDestroy(comms[r]));
}

/* ---- ncclGetLastError per communicator ---- */

TEST_T(safety, last_error_per_comm, 30) {
  ncclComm_t a, b;
  ncclUniqueId ia, ib;
  NCCL_OK(ncclGetUniqueId(&ia));
  NCCL_OK(ncclGetUniqueId(&ib));
  NCCL_OK(ncclCommInitRank(&a, 1, ia, 0));
  NCCL_OK(ncclCommInitRank(&b, 1, ib, 0));
  float v = 1;
  EXPECT_EQ(ncclBroadcast(&v, &v, 1, ncclFloat, 7, a, NULL), ncclInvalidArgument);
  const char* ea = ncclGetLastError(a);
  EXPECT(strstr(ea, "invalid root 7") != NULL);
  EXPECT(strstr(ncclGetLastError(NULL), "invalid root 7") != NULL); /* the process's record too */
  EXPECT(strstr(ncclGetLastError(b), "invalid root") == NULL);
  EXPECT_EQ(ncclAllReduce(&v, &v, 1, (ncclDataType_t)99, ncclSum, b, NULL), ncclInvalidArgument);
  EXPECT(strstr(ncclGetLastError(b), "invalid datatype 99") != NULL);
  EXPECT(strstr(ncclGetLastError(a), "invalid root 7") != NULL); /* a's record is a's */
  NCCL_OK(ncclCommDestroy(a));
  NCCL_OK(ncclCommDestroy(b));
}

/* ---- one communicator, two threads at once ---- */

struct first_caller {
  ncclComm_t comm;
  float* buf;
  ncclResult_t r;
};

static void* first_call(void* arg) {
  struct first_caller* f = arg;
  f->r = ncclAllReduce(f->buf, f->buf, 64, ncclFloat, ncclSum, f->comm, NULL);
  return NULL;
}

/* On rank 0 one thread is inside an AllReduce (rank 1 joins late); a second thread calling on the same
 * comm is refused at once with a WARN saying so, and the first call completes correctly. */
static void two_threads_body(int rank, int nranks, ncclUniqueId id, void* arg) {
  (void)arg;
  ncclComm_t comm;
  NCCL_OK(ncclCommInitRank(&comm, nranks, id, rank));
  float buf[64];
  for (int i = 0; i < 64; i++) buf[i] = (float)(rank + i);
  if (rank == 1) {
    usleep(800 * 1000);
    NCCL_OK(ncclAllReduce(buf, buf, 64, ncclFloat, ncclSum, comm, NULL));
  } else {
    struct first_caller f = {comm, buf, ncclInternalError};
    pthread_t t;
    ASSERT(pthread_create(&t, NULL, first_call, &f) == 0);
    usleep(300 * 1000); /* the first thread is waiting for rank 1 by now */
    float v = 1;
    EXPECT_EQ(ncclAllReduce(&v, &v, 1, ncclFloat, ncclSum, comm, NULL), ncclInvalidUsage);
    EXPECT(strstr(ncclGetLastError(NULL), "two threads at once") != NULL);
    pthread_join(t, NULL);
    EXPECT_EQ(f.r, ncclSuccess);
  }
  for (int i = 0; i < 64; i++)
    if (buf[i] != (float)(2 * i + 1)) {
      rt_fail(__FILE__, __LINE__, "rank %d [%d] = %g, want %d", rank, i, (double)buf[i], 2 * i + 1);
      break;
    }
  NCCL_OK(ncclCommDestroy(comm));
}

TEST_T(safety, one_comm_two_threads_refused, 30) { rt_run_both(2, two_threads_body, NULL); }

/* An abort (or a destroy) from another thread while this thread has calls on the comm in an open
 * group: the group's end must not touch the freed communicator; it drops that comm's calls and runs
 * the others of the group (another comm's here: its result is checked). */
static void* destroy_comm(void* arg) {
  ncclCommDestroy((ncclComm_t)arg);
  return NULL;
}
static void lost_in_group(int destroy) {
  ncclUniqueId id, id2;
  ncclComm_t comm, other;
  NCCL_OK(ncclGetUniqueId(&id));
  NCCL_OK(ncclCommInitRank(&comm, 1, id, 0));
  NCCL_OK(ncclGetUniqueId(&id2));
  NCCL_OK(ncclCommInitRank(&other, 1, id2, 0));
  static float a[64], b[64], c[64];
  for (int i = 0; i < 64; i++) a[i] = b[i] = (float)i, c[i] = 0;
  NCCL_OK(ncclGroupStart());
  NCCL_OK(ncclAllReduce(a, a, 64, ncclFloat32, ncclSum, comm, NULL));
  NCCL_OK(ncclAllReduce(b, c, 64, ncclFloat32, ncclSum, other, NULL));
  struct aborter ab = {comm, 0, 0};
  pthread_t t;
  ASSERT(pthread_create(&t, NULL, destroy ? destroy_comm : abort_later, destroy ? (void*)comm : (void*)&ab) == 0);
  pthread_join(t, NULL);
  EXPECT_EQ(ncclGroupEnd(), ncclInvalidUsage); /* its calls dropped, said by a WARN */
  EXPECT(strstr(ncclGetLastError(NULL), "aborted, revoked or destroyed") != NULL);
  for (int i = 0; i < 64; i++) EXPECT(c[i] == (float)i); /* the other comm's call ran */
  NCCL_OK(ncclCommDestroy(other));
}
TEST_T(safety, abort_during_open_group, 30) { lost_in_group(0); }
TEST_T(safety, destroy_during_open_group, 30) { lost_in_group(1); }

/* An abort of a comm whose init waits for this thread's ncclGroupEnd: it does not wait for that
 * group (whose thread might be waiting for the aborter), and the group's end then runs no init and
 * touches nothing freed. */
TEST_T(safety, abort_of_a_deferred_init, 30) {
  ncclUniqueId id;
  ncclComm_t comm = NULL;
  NCCL_OK(ncclGetUniqueId(&id));
  NCCL_OK(ncclGroupStart());
  NCCL_OK(ncclCommInitRank(&comm, 1, id, 0));
  struct aborter ab = {comm, 0, 0};
  pthread_t t;
  ASSERT(pthread_create(&t, NULL, abort_later, &ab) == 0);
  pthread_join(t, NULL); /* returned without our ncclGroupEnd */
  EXPECT(ab.took_ms < 2000);
  EXPECT(ncclGroupEnd() != ncclSuccess);
}

/* A call on comm X queued on a host stream behind comm Y's call, which waits for a peer that never
 * calls: ncclCommAbort(X) returns at once (it waited for Y's call to time out), X's call ends aborted,
 * and the stream goes on once Y is aborted too. */
static ncclComm_t q_y[2];
static float q_a[2][1024];
static void* q_warm(void* p) {
  int r = (int)(intptr_t)p;
  NCCL_OK(ncclAllReduce(q_a[r], q_a[r], 1024, ncclFloat32, ncclSum, q_y[r], NULL));
  return NULL;
}
TEST_T(safety, abort_of_a_call_queued_behind_a_stuck_one, 60) {
  setenv("CHORUS_TIMEOUT", "40", 1);
  ncclComm_t x;
  NCCL_OK(ncclCommInitAll(q_y, 2, NULL));
  NCCL_OK(ncclCommInitAll(&x, 1, NULL));
  pthread_t t[2];
  for (intptr_t i = 0; i < 2; i++) ASSERT(pthread_create(&t[i], NULL, q_warm, (void*)i) == 0);
  for (int i = 0; i < 2; i++) pthread_join(t[i], NULL);
  cudaStream_t s;
  NCCL_OK(chorusStreamCreate(&s));
  static float b[1024];
  NCCL_OK(ncclAllReduce(q_a[0], q_a[0], 1024, ncclFloat32, ncclSum, q_y[0], s)); /* rank 1 never calls */
  NCCL_OK(ncclAllReduce(b, b, 1024, ncclFloat32, ncclSum, x, s));
  struct timespec t0, t1;
  clock_gettime(CLOCK_MONOTONIC, &t0);
  NCCL_OK(ncclCommAbort(x));
  clock_gettime(CLOCK_MONOTONIC, &t1);
  double took = (double)(t1.tv_sec - t0.tv_sec) + (double)(t1.tv_nsec - t0.tv_nsec) / 1e9;
  EXPECT(took < 2.0);
  NCCL_OK(ncclCommAbort(q_y[0]));
  EXPECT(chorusStreamSynchronize(s) != ncclSuccess); /* both calls ended aborted */
  NCCL_OK(chorusStreamDestroy(s));
  NCCL_OK(ncclCommDestroy(q_y[1]));
}

/* ncclCommAbort during ncclCommRevoke (which raises the abort flag to stop the calls in flight, then
 * lowered it): the abort was refused ("already being aborted") and then lost when the flag came down. */
struct rr_ctx {
  ncclComm_t comm;
  int delay_us;
  ncclResult_t rc;
};
static void* rr_call(void* p) {
  struct rr_ctx* c = p;
  static float v[256];
  c->rc = ncclAllReduce(v, v, 256, ncclFloat32, ncclSum, c->comm, NULL); /* its peer never calls */
  return NULL;
}
static void* rr_revoke(void* p) {
  struct rr_ctx* c = p;
  usleep((useconds_t)c->delay_us);
  c->rc = ncclCommRevoke(c->comm, NCCL_REVOKE_DEFAULT);
  return NULL;
}
static void* rr_abort(void* p) { /* once the revoke has raised the flag: it is inside its quiesce */
  struct rr_ctx* c = p;
  for (int i = 0; i < 50000 && !__atomic_load_n(&c->comm->abort_flag, __ATOMIC_ACQUIRE); i++) usleep(100);
  usleep((useconds_t)c->delay_us);
  c->rc = ncclCommAbort(c->comm);
  return NULL;
}
TEST_T(safety, abort_during_revoke_is_not_lost, 60) {
  for (int it = 0; it < 12; it++) {
    ncclComm_t c[2];
    NCCL_OK(ncclCommInitAll(c, 2, NULL));
    struct rr_ctx call = {c[0], 0, ncclSuccess}, rev = {c[0], 20000, ncclSuccess},
                  ab = {c[0], (it % 4) * 300, ncclInternalError};
    pthread_t t[3];
    ASSERT(pthread_create(&t[0], NULL, rr_call, &call) == 0);
    ASSERT(pthread_create(&t[1], NULL, rr_revoke, &rev) == 0);
    ASSERT(pthread_create(&t[2], NULL, rr_abort, &ab) == 0);
    for (int i = 0; i < 3; i++) pthread_join(t[i], NULL);
    EXPECT_EQ(ab.rc, ncclSuccess);
    EXPECT(call.rc != ncclSuccess);
    EXPECT(rev.rc == ncclSuccess || rev.rc == ncclInvalidUsage);
    NCCL_OK(ncclCommAbort(c[1]));
  }
}

/* As above, with a group of X and Z queued between Y's stuck call and X's lone call: the lone call is
 * taken off the stream but ends only after X's grouped call (completions keep X's call order), which
 * ends once Y is aborted; the abort used to finish it at once and leave the grouped call waiting for a
 * turn that never came (the abort hung). */
static void* q_abort_y_later(void* p) {
  (void)p;
  usleep(300 * 1000);
  NCCL_OK(ncclCommAbort(q_y[0]));
  return NULL;
}
TEST_T(safety, abort_keeps_call_order_behind_a_grouped_call, 60) {
  ncclComm_t x, z;
  NCCL_OK(ncclCommInitAll(q_y, 2, NULL));
  NCCL_OK(ncclCommInitAll(&x, 1, NULL));
  NCCL_OK(ncclCommInitAll(&z, 1, NULL));
  pthread_t t[2];
  for (intptr_t i = 0; i < 2; i++) ASSERT(pthread_create(&t[i], NULL, q_warm, (void*)i) == 0);
  for (int i = 0; i < 2; i++) pthread_join(t[i], NULL);
  cudaStream_t s;
  NCCL_OK(chorusStreamCreate(&s));
  static float bx[1024], bz[1024], bx2[1024];
  NCCL_OK(ncclAllReduce(q_a[0], q_a[0], 1024, ncclFloat32, ncclSum, q_y[0], s)); /* rank 1 never calls */
  NCCL_OK(ncclGroupStart());
  NCCL_OK(ncclAllReduce(bx, bx, 1024, ncclFloat32, ncclSum, x, s));
  NCCL_OK(ncclAllReduce(bz, bz, 1024, ncclFloat32, ncclSum, z, s));
  NCCL_OK(ncclGroupEnd());
  NCCL_OK(ncclAllReduce(bx2, bx2, 1024, ncclFloat32, ncclSum, x, s));
  pthread_t ay;
  ASSERT(pthread_create(&ay, NULL, q_abort_y_later, NULL) == 0);
  NCCL_OK(ncclCommAbort(x)); /* returns once Y's abort lets the grouped call end */
  pthread_join(ay, NULL);
  EXPECT(chorusStreamSynchronize(s) != ncclSuccess);
  NCCL_OK(chorusStreamDestroy(s));
  NCCL_OK(ncclCommDestroy(z));
  NCCL_OK(ncclCommDestroy(q_y[1]));
}
