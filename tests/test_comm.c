/* Communicator life cycle: init/destroy at several sizes in threads and processes, InitAll, leaks over
 * many cycles, split, nonblocking init, abort of a stuck init, reused ids and version mismatches. */
#define _GNU_SOURCE
#include <pthread.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "misc/param.h"
#include "nccl.h"
#include "runner.h"

static uint64_t now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

static void check_comm(ncclComm_t comm, int rank, int nranks) {
  int n = -1, r = -1, dev = -1;
  NCCL_OK(ncclCommCount(comm, &n));
  NCCL_OK(ncclCommUserRank(comm, &r));
  NCCL_OK(ncclCommCuDevice(comm, &dev));
  EXPECT_EQ(n, nranks);
  EXPECT_EQ(r, rank);
  /* Chorus reports the rank's index among the ranks of its host; every test rank is on this host. */
  EXPECT_EQ(dev, rank);
}

static void init_destroy_body(int rank, int nranks, ncclUniqueId id, void* arg) {
  ncclComm_t comm = NULL;
  NCCL_OK(ncclCommInitRank(&comm, nranks, id, rank));
  check_comm(comm, rank, nranks);
  NCCL_OK(ncclCommDestroy(comm));
}

TEST_T(comm, init_destroy_1, 30) { rt_run_both(1, init_destroy_body, NULL); }
TEST_T(comm, init_destroy_2, 30) { rt_run_both(2, init_destroy_body, NULL); }
TEST_T(comm, init_destroy_4, 30) { rt_run_both(4, init_destroy_body, NULL); }
TEST_T(comm, init_destroy_8, 60) { rt_run_both(8, init_destroy_body, NULL); }
/* CHORUS_INIT_TIMEOUT=0 is no limit, as CHORUS_TIMEOUT=0 is (it made every init time out at once). */
TEST_T(comm, init_timeout_0_is_no_limit, 30) {
  setenv("CHORUS_INIT_TIMEOUT", "0", 1);
  param_reset();
  rt_run_both(2, init_destroy_body, NULL);
}

/* ncclCommInitRankScalable with several ids: the join is spread over their roots (before, only
 * commIds[0] was used); every rank gets the whole table and the comm works across the blocks. */
struct scalable_arg {
  int nids;
  ncclUniqueId ids[4];
};

static void scalable_body(int rank, int nranks, ncclUniqueId id, void* arg) {
  struct scalable_arg* a = arg;
  ncclComm_t comm = NULL;
  NCCL_OK(ncclCommInitRankScalable(&comm, nranks, rank, a->nids, a->ids, NULL));
  check_comm(comm, rank, nranks);
  int v = rank + 1, sum = 0;
  NCCL_OK(ncclAllReduce(&v, &sum, 1, ncclInt32, ncclSum, comm, NULL));
  EXPECT_EQ(sum, nranks * (nranks + 1) / 2);
  NCCL_OK(ncclCommDestroy(comm));
}

TEST_T(comm, init_rank_scalable_several_ids, 120) {
  int cases[][2] = {{7, 2}, {8, 3}, {9, 4}};
  int modes = 2;
#if defined(__SANITIZE_THREAD__)
  /* The ids' roots run here before the ranks fork, and TSan kills a multi-threaded fork's child that
   * starts a thread: the process half runs without it. */
  printf("    skipped under ThreadSanitizer: the process half (fork after threads)\n");
  modes = 1;
#endif
  for (int procs = 0; procs < modes; procs++)
    for (int c = 0; c < 3; c++) {
      struct scalable_arg a = {cases[c][1], {{{0}}}};
      for (int i = 0; i < a.nids; i++) NCCL_OK(ncclGetUniqueId(&a.ids[i]));
      if (procs) rt_run_procs(cases[c][0], scalable_body, &a);
      else rt_run_threads(cases[c][0], scalable_body, &a);
    }
}

/* nId > nranks is refused with ncclInvalidArgument, as NCCL does. */
TEST_T(comm, init_rank_scalable_more_ids_than_ranks, 30) {
  ncclUniqueId ids[3];
  for (int i = 0; i < 3; i++) NCCL_OK(ncclGetUniqueId(&ids[i]));
  ncclComm_t comm = NULL;
  EXPECT_EQ(ncclCommInitRankScalable(&comm, 2, 0, 3, ids, NULL), ncclInvalidArgument);
  EXPECT(comm == NULL);
  EXPECT_EQ(ncclCommInitRankScalable(&comm, 2, 0, 0, ids, NULL), ncclInvalidArgument);
}

TEST_T(comm, init_all, 30) {
  ncclComm_t comms[4] = {NULL, NULL, NULL, NULL};
  NCCL_OK(ncclCommInitAll(comms, 4, NULL));
  for (int i = 0; i < 4; i++) {
    ASSERT(comms[i] != NULL);
    check_comm(comms[i], i, 4);
  }
  for (int i = 0; i < 4; i++) NCCL_OK(ncclCommDestroy(comms[i]));
  /* A device list is accepted; host ranks have no devices, so it changes nothing else. */
  const int devs[3] = {2, 0, 1};
  NCCL_OK(ncclCommInitAll(comms, 3, devs));
  for (int i = 0; i < 3; i++) check_comm(comms[i], i, 3);
  for (int i = 0; i < 3; i++) NCCL_OK(ncclCommDestroy(comms[i]));
}

/* Nonblocking comms (NCCL_COMM_BLOCKING=0): ncclCommInitAll returns while they initialise, and they
 * become usable (it used to take ncclInProgress for a failure and free them under their init threads). */
TEST_T(comm, init_all_nonblocking, 30) {
  setenv("NCCL_COMM_BLOCKING", "0", 1);
  param_reset();
  ncclComm_t comms[3] = {NULL, NULL, NULL};
  ncclResult_t r = ncclCommInitAll(comms, 3, NULL);
  EXPECT(r == ncclSuccess || r == ncclInProgress);
  for (int i = 0; i < 3; i++) {
    ASSERT(comms[i] != NULL);
    ncclResult_t st = ncclInProgress;
    for (int k = 0; k < 2000 && st == ncclInProgress; k++) {
      NCCL_OK(ncclCommGetAsyncError(comms[i], &st));
      if (st == ncclInProgress) usleep(5000);
    }
    EXPECT_EQ(st, ncclSuccess);
    check_comm(comms[i], i, 3);
  }
  for (int i = 0; i < 3; i++) NCCL_OK(ncclCommDestroy(comms[i]));
}

/* An init that a group refuses (more than it holds) hands back no communicator, and the group's
 * other inits can still be aborted before it ends (a handle stuck "in progress" hung both). */
TEST_T(comm, init_refused_by_a_full_group_gives_no_handle, 60) {
  enum { MAX = 1024 };
  static ncclComm_t c[MAX];
  ncclUniqueId id;
  NCCL_OK(ncclGetUniqueId(&id));
  NCCL_OK(ncclGroupStart());
  for (int i = 0; i < MAX; i++) NCCL_OK(ncclCommInitRank(&c[i], 2, id, 0));
  ncclComm_t extra = (ncclComm_t)&extra;
  EXPECT_EQ(ncclCommInitRank(&extra, 2, id, 0), ncclInvalidUsage);
  EXPECT(extra == NULL);
  for (int i = 0; i < MAX; i++) NCCL_OK(ncclCommAbort(c[i])); /* cancels the deferred inits */
  EXPECT(ncclGroupEnd() != ncclInProgress);
}

/* Waits up to 2 s for lingering helper threads/sockets of the last job to go; returns when both counts
 * are back at or below the baseline, so one slow exit does not look like a leak. */
static void settle(int fds0, int threads0, int* fds, int* threads) {
  uint64_t end = now_ms() + 2000;
  do {
    *fds = rt_count_fds();
    *threads = rt_count_threads();
    if (*fds <= fds0 && *threads <= threads0) return;
    usleep(10000);
  } while (now_ms() < end);
}

TEST_T(comm, no_leaks_200_cycles, 180) {
  rt_run_threads(2, init_destroy_body, NULL); /* warm-up: lazily created global state */
  int fds0, threads0, fds, threads;
  settle(1 << 30, 1 << 30, &fds0, &threads0);
  for (int i = 0; i < 200 && rt_failures() == 0; i++) rt_run_threads(2, init_destroy_body, NULL);
  settle(fds0, threads0, &fds, &threads);
  EXPECT(fds0 > 0 && threads0 > 0);
  if (fds > fds0) rt_fail(__FILE__, __LINE__, "open fds grew from %d to %d over 200 cycles", fds0, fds);
  if (threads > threads0) rt_fail(__FILE__, __LINE__, "threads grew from %d to %d over 200 cycles", threads0, threads);
}

/* ---- split ---- */

static void split_body(int rank, int nranks, ncclUniqueId id, void* arg) {
  int with_allreduce = arg != NULL;
  ncclComm_t comm = NULL, half = NULL, rest = NULL;
  NCCL_OK(ncclCommInitRank(&comm, nranks, id, rank));

  /* Colour by parity; key reverses the order, so the highest old rank becomes new rank 0. */
  int color = rank % 2, members = (nranks - color + 1) / 2, pos = rank / 2;
  NCCL_OK(ncclCommSplit(comm, color, nranks - rank, &half, NULL));
  ASSERT(half != NULL);
  check_comm(half, members - 1 - pos, members);
  if (with_allreduce) {
    int v = rank, sum = -1, expect = 0;
    for (int r = color; r < nranks; r += 2) expect += r;
    NCCL_OK(ncclAllReduce(&v, &sum, 1, ncclInt32, ncclSum, half, NULL));
    EXPECT_EQ(sum, expect);
  }

  /* Rank 0 opts out: it gets NULL, the others a comm of nranks-1 in the old order. */
  NCCL_OK(ncclCommSplit(comm, rank == 0 ? NCCL_SPLIT_NOCOLOR : 7, rank, &rest, NULL));
  if (rank == 0) {
    EXPECT(rest == NULL);
  } else {
    ASSERT(rest != NULL);
    check_comm(rest, rank - 1, nranks - 1);
    if (with_allreduce) {
      int v = 1, sum = -1;
      NCCL_OK(ncclAllReduce(&v, &sum, 1, ncclInt32, ncclSum, rest, NULL));
      EXPECT_EQ(sum, nranks - 1);
    }
    NCCL_OK(ncclCommDestroy(rest));
  }
  NCCL_OK(ncclCommDestroy(half));
  NCCL_OK(ncclCommDestroy(comm));
}

TEST_T(comm, split, 60) {
  rt_run_both(4, split_body, NULL);
  rt_run_both(5, split_body, NULL); /* odd size: colours of unequal size */
}

TEST_T(comm, split_allreduce, 60) { rt_run_both(4, split_body, (void*)1); }

/* ---- nonblocking init ---- */

/* Polls until the comm leaves ncclInProgress; returns its final state. */
static ncclResult_t wait_ready(ncclComm_t comm, int timeout_ms) {
  ncclResult_t st = ncclInProgress;
  uint64_t end = now_ms() + (uint64_t)timeout_ms;
  while (now_ms() < end) {
    ncclResult_t r = ncclCommGetAsyncError(comm, &st);
    if (r != ncclSuccess) return r;
    if (st != ncclInProgress) return st;
    usleep(1000);
  }
  return ncclInProgress;
}

static void nonblocking_body(int rank, int nranks, ncclUniqueId id, void* arg) {
  ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
  cfg.blocking = 0;
  ncclComm_t comm = NULL;
  ncclResult_t r = ncclCommInitRankConfig(&comm, nranks, id, rank, &cfg);
  if (r != ncclInProgress && r != ncclSuccess)
    rt_fail_fatal(__FILE__, __LINE__, "nonblocking init -> %d (%s)", (int)r, ncclGetErrorString(r));
  ASSERT(comm != NULL);
  EXPECT_EQ(wait_ready(comm, 20000), ncclSuccess);
  check_comm(comm, rank, nranks);
  NCCL_OK(ncclCommDestroy(comm));
}

TEST_T(comm, nonblocking_init, 60) { rt_run_both(4, nonblocking_body, NULL); }

/* One thread starts every rank: only possible if init really does not block. */
TEST_T(comm, nonblocking_init_one_thread, 60) {
  enum { N = 4 };
  ncclUniqueId id;
  ncclComm_t comms[N];
  ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
  cfg.blocking = 0;
  NCCL_OK(ncclGetUniqueId(&id));
  for (int r = 0; r < N; r++) {
    comms[r] = NULL;
    ncclResult_t res = ncclCommInitRankConfig(&comms[r], N, id, r, &cfg);
    if (res != ncclInProgress)
      rt_fail_fatal(__FILE__, __LINE__, "rank %d: nonblocking init of a %d-rank comm -> %d, expected ncclInProgress",
                    r, N, (int)res);
    ASSERT(comms[r] != NULL);
  }
  for (int r = 0; r < N; r++) EXPECT_EQ(wait_ready(comms[r], 20000), ncclSuccess);
  for (int r = 0; r < N; r++) check_comm(comms[r], r, N);
  for (int r = 0; r < N; r++) NCCL_OK(ncclCommDestroy(comms[r]));
}

/* ---- abort of an init that can never finish ---- */

struct stuck_rank {
  ncclUniqueId id;
  int rank, nranks;
  ncclComm_t comm; /* published by the library before init completes, as NCCL does */
  ncclResult_t result;
  int returned;
};

static void* stuck_init(void* p) {
  struct stuck_rank* s = p;
  ncclResult_t r = ncclCommInitRank(&s->comm, s->nranks, s->id, s->rank);
  __atomic_store_n(&s->result, r, __ATOMIC_RELAXED);
  __atomic_store_n(&s->returned, 1, __ATOMIC_RELEASE);
  return NULL;
}

TEST_T(comm, abort_blocked_init, 30) {
  /* Ranks 0 and 1 of 3 join; rank 2 never does, so both block in init until aborted. */
  enum { JOIN = 2 };
  struct stuck_rank s[JOIN];
  pthread_t th[JOIN];
  ncclUniqueId id;
  NCCL_OK(ncclGetUniqueId(&id));
  for (int i = 0; i < JOIN; i++) {
    s[i] = (struct stuck_rank){.id = id, .rank = i, .nranks = 3, .comm = NULL, .result = ncclSuccess};
    ASSERT(pthread_create(&th[i], NULL, stuck_init, &s[i]) == 0);
  }
  usleep(300000);
  for (int i = 0; i < JOIN; i++)
    if (__atomic_load_n(&s[i].returned, __ATOMIC_ACQUIRE))
      rt_fail_fatal(__FILE__, __LINE__, "rank %d: init returned %d with a rank missing", i, (int)s[i].result);
  /* Once rank 0 aborts, it has left the root: rank 1's init then fails at once (ncclRemoteError, naming
   * rank 0) and frees its communicator, so rank 1 is aborted only if it is still blocked. */
  for (int i = 0; i < JOIN; i++) {
    if (i > 0) {
      for (uint64_t end = now_ms() + 500; !__atomic_load_n(&s[i].returned, __ATOMIC_ACQUIRE) && now_ms() < end;)
        usleep(1000);
      if (__atomic_load_n(&s[i].returned, __ATOMIC_ACQUIRE)) {
        EXPECT_EQ(s[i].result, ncclRemoteError);
        continue;
      }
    }
    ncclComm_t c = NULL;
    for (uint64_t end = now_ms() + 2000; !(c = __atomic_load_n(&s[i].comm, __ATOMIC_ACQUIRE)) && now_ms() < end;)
      usleep(1000);
    if (!c) rt_fail_fatal(__FILE__, __LINE__, "rank %d: blocked init never published its comm handle", i);
    uint64_t t0 = now_ms();
    NCCL_OK(ncclCommAbort(c));
    uint64_t took = now_ms() - t0;
    if (took > 1000) rt_fail(__FILE__, __LINE__, "rank %d: ncclCommAbort took %llu ms", i, (unsigned long long)took);
  }
  for (int i = 0; i < JOIN; i++) {
    uint64_t end = now_ms() + 2000;
    while (!__atomic_load_n(&s[i].returned, __ATOMIC_ACQUIRE) && now_ms() < end) usleep(1000);
    if (!__atomic_load_n(&s[i].returned, __ATOMIC_ACQUIRE))
      rt_fail_fatal(__FILE__, __LINE__, "rank %d: init still blocked 2 s after abort", i);
    pthread_join(th[i], NULL);
    EXPECT(s[i].result != ncclSuccess && s[i].result != ncclInProgress);
  }
}

TEST_T(comm, abort_nonblocking_init, 30) {
  ncclUniqueId id;
  ncclComm_t comm = NULL;
  ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
  cfg.blocking = 0;
  NCCL_OK(ncclGetUniqueId(&id));
  /* Rank 0 of 2; rank 1 never comes. */
  ncclResult_t r = ncclCommInitRankConfig(&comm, 2, id, 0, &cfg);
  EXPECT_EQ(r, ncclInProgress);
  ASSERT(comm != NULL);
  usleep(200000);
  ncclResult_t st = ncclSuccess;
  NCCL_OK(ncclCommGetAsyncError(comm, &st));
  EXPECT_EQ(st, ncclInProgress);
  uint64_t t0 = now_ms();
  NCCL_OK(ncclCommAbort(comm));
  uint64_t took = now_ms() - t0;
  if (took > 1000) rt_fail(__FILE__, __LINE__, "ncclCommAbort took %llu ms", (unsigned long long)took);
}

/* ---- jobs that must fail cleanly ---- */

/* Short connect retries and init deadline so a failure shows up in seconds, not minutes. */
static void fail_fast(void) {
  setenv("CHORUS_INIT_TIMEOUT", "5", 1);
  setenv("NCCL_SOCKET_RETRY_CNT", "3", 1);
  setenv("NCCL_SOCKET_RETRY_SLEEP_MSEC", "20", 1);
  param_reset();
}

struct reuse_arg {
  int phase; /* 0: first job, must work; 1: same id again, must fail */
  ncclUniqueId id;
};

static void reuse_body(int rank, int nranks, ncclUniqueId id, void* arg) {
  struct reuse_arg* a = arg;
  ncclComm_t comm = NULL;
  if (a->phase == 0) {
    NCCL_OK(ncclCommInitRank(&comm, nranks, a->id, rank));
    NCCL_OK(ncclCommDestroy(comm));
    return;
  }
  uint64_t t0 = now_ms();
  ncclResult_t r = ncclCommInitRank(&comm, nranks, a->id, rank);
  if (r == ncclSuccess) {
    rt_fail(__FILE__, __LINE__, "init with an id whose job already finished succeeded");
    ncclCommDestroy(comm);
    return;
  }
  EXPECT(r != ncclInProgress);
  EXPECT(now_ms() - t0 < 15000);
  if (comm) ncclCommAbort(comm);
}

TEST_T(comm, reused_id_fails, 40) {
  fail_fast();
  struct reuse_arg a = {0};
  NCCL_OK(ncclGetUniqueId(&a.id));
  rt_run_threads(2, reuse_body, &a);
  ASSERT(rt_failures() == 0);
  a.phase = 1;
  rt_run_threads(2, reuse_body, &a);
}

static void wire_mismatch_body(int rank, int nranks, ncclUniqueId id, void* arg) {
  fail_fast();
  if (rank == 1) {
    setenv("CHORUS_WIRE_VERSION", "2", 1);
    param_reset();
  }
  ncclComm_t comm = NULL;
  ncclResult_t r = ncclCommInitRank(&comm, nranks, id, rank);
  EXPECT_EQ(r, ncclInvalidUsage);
  if (r == ncclSuccess)
    ncclCommDestroy(comm);
  else if (comm)
    ncclCommAbort(comm);
}

TEST_T(comm, wire_version_mismatch, 40) { rt_run_procs(3, wire_mismatch_body, NULL); }
