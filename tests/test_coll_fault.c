/* Failures around collectives. coll_args: every bad argument (type, op, root, peer, NULL buffer with
 * count > 0) is refused with ncclInvalidArgument, at once and without talking to peers, and leaves
 * the communicator usable. coll_fault: a rank process killed by SIGKILL in the middle of a collective
 * makes the others return an error within seconds, not hang, and leaves nothing in /dev/shm. */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "chorus.h"
#include "coll_util.h"
#include "comm/comm.h"
#include "core/connect.h"
#include "core/init.h"
#include "runner.h"

static uint64_t now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* A valid AllReduce: the communicator still works and no bad call left anything queued. */
static void check_still_works(ncclComm_t comm, int nranks) {
  int32_t v[5] = {1, 2, 3, 4, 5}, out[5] = {0};
  NCCL_OK(ncclAllReduce(v, out, 5, ncclInt32, ncclSum, comm, NULL));
  for (int i = 0; i < 5; i++)
    if (out[i] != (i + 1) * nranks) rt_fail(__FILE__, __LINE__, "AllReduce after bad calls: out[%d] = %d", i, out[i]);
}

#define BAD(call)                                                                                     \
  do {                                                                                                \
    ncclResult_t r_ = (call);                                                                         \
    if (r_ != ncclInvalidArgument)                                                                    \
      rt_fail(__FILE__, __LINE__, "%s -> %d (%s), expected ncclInvalidArgument", #call, (int)r_,      \
              ncclGetErrorString(r_));                                                                \
  } while (0)

static void bad_args_body(int rank, int nranks, ncclUniqueId id, void* arg) {
  (void)arg;
  ncclComm_t comm = cu_comm_init(rank, nranks, id);
  float* s = calloc(64 * (size_t)nranks, sizeof(float));
  float* d = calloc(64 * (size_t)nranks, sizeof(float));
  ASSERT(s && d);
  const size_t k = 4;

  /* Datatypes. */
  const int bad_types[] = {-1, ncclNumTypes, 100};
  for (int i = 0; i < 3; i++) {
    ncclDataType_t t = (ncclDataType_t)bad_types[i];
    BAD(ncclAllReduce(s, d, k, t, ncclSum, comm, NULL));
    BAD(ncclBroadcast(s, d, k, t, 0, comm, NULL));
    BAD(ncclBcast(d, k, t, 0, comm, NULL));
    BAD(ncclReduce(s, d, k, t, ncclSum, 0, comm, NULL));
    BAD(ncclAllGather(s, d, k, t, comm, NULL));
    BAD(ncclReduceScatter(s, d, k, t, ncclSum, comm, NULL));
    BAD(ncclAlltoAll(s, d, k, t, comm, NULL));
    BAD(ncclGather(s, d, k, t, 0, comm, NULL));
    BAD(ncclScatter(s, d, k, t, 0, comm, NULL));
    BAD(ncclSend(s, k, t, 0, comm, NULL));
    BAD(ncclRecv(d, k, t, 0, comm, NULL));
  }

  /* Reduction ops: out of range, a PreMulSum op of another type, a destroyed one. */
  const int bad_ops[] = {-1, ncclNumOps, ncclNumOps + 63, 1000, ncclMaxRedOp};
  for (int i = 0; i < 5; i++) {
    ncclRedOp_t op = (ncclRedOp_t)bad_ops[i];
    BAD(ncclAllReduce(s, d, k, ncclFloat32, op, comm, NULL));
    BAD(ncclReduce(s, d, k, ncclFloat32, op, 0, comm, NULL));
    BAD(ncclReduceScatter(s, d, k, ncclFloat32, op, comm, NULL));
  }
  float scalar = 2;
  ncclRedOp_t pm;
  NCCL_OK(ncclRedOpCreatePreMulSum(&pm, &scalar, ncclFloat32, ncclScalarHostImmediate, comm));
  BAD(ncclAllReduce(s, d, k, ncclFloat16, pm, comm, NULL));
  BAD(ncclReduce(s, d, k, ncclInt32, pm, 0, comm, NULL));
  NCCL_OK(ncclRedOpDestroy(pm, comm));
  BAD(ncclAllReduce(s, d, k, ncclFloat32, pm, comm, NULL));
  BAD(ncclRedOpDestroy(pm, comm));
  BAD(ncclRedOpDestroy(ncclSum, comm));
  BAD(ncclRedOpCreatePreMulSum(&pm, NULL, ncclFloat32, ncclScalarHostImmediate, comm));
  BAD(ncclRedOpCreatePreMulSum(NULL, &scalar, ncclFloat32, ncclScalarHostImmediate, comm));
  BAD(ncclRedOpCreatePreMulSum(&pm, &scalar, (ncclDataType_t)ncclNumTypes, ncclScalarHostImmediate, comm));
  BAD(ncclRedOpCreatePreMulSum(&pm, &scalar, ncclFloat32, (ncclScalarResidence_t)7, comm));

  /* Roots and peers. */
  const int bad_ranks[] = {-1, nranks, nranks + 5};
  for (int i = 0; i < 3; i++) {
    int r = bad_ranks[i];
    BAD(ncclBroadcast(s, d, k, ncclFloat32, r, comm, NULL));
    BAD(ncclBcast(d, k, ncclFloat32, r, comm, NULL));
    BAD(ncclReduce(s, d, k, ncclFloat32, ncclSum, r, comm, NULL));
    BAD(ncclGather(s, d, k, ncclFloat32, r, comm, NULL));
    BAD(ncclScatter(s, d, k, ncclFloat32, r, comm, NULL));
    BAD(ncclSend(s, k, ncclFloat32, r, comm, NULL));
    BAD(ncclRecv(d, k, ncclFloat32, r, comm, NULL));
  }

  /* NULL buffers with count > 0, where this rank would use them (root = this rank). */
  BAD(ncclAllReduce(NULL, d, k, ncclFloat32, ncclSum, comm, NULL));
  BAD(ncclAllReduce(s, NULL, k, ncclFloat32, ncclSum, comm, NULL));
  BAD(ncclBroadcast(NULL, d, k, ncclFloat32, rank, comm, NULL));
  BAD(ncclBroadcast(s, NULL, k, ncclFloat32, rank, comm, NULL));
  BAD(ncclBcast(NULL, k, ncclFloat32, rank, comm, NULL));
  BAD(ncclReduce(NULL, d, k, ncclFloat32, ncclSum, rank, comm, NULL));
  BAD(ncclReduce(s, NULL, k, ncclFloat32, ncclSum, rank, comm, NULL));
  BAD(ncclAllGather(NULL, d, k, ncclFloat32, comm, NULL));
  BAD(ncclAllGather(s, NULL, k, ncclFloat32, comm, NULL));
  BAD(ncclReduceScatter(NULL, d, k, ncclFloat32, ncclSum, comm, NULL));
  BAD(ncclReduceScatter(s, NULL, k, ncclFloat32, ncclSum, comm, NULL));
  BAD(ncclAlltoAll(NULL, d, k, ncclFloat32, comm, NULL));
  BAD(ncclAlltoAll(s, NULL, k, ncclFloat32, comm, NULL));
  BAD(ncclGather(NULL, d, k, ncclFloat32, rank, comm, NULL));
  BAD(ncclGather(s, NULL, k, ncclFloat32, rank, comm, NULL));
  BAD(ncclScatter(NULL, d, k, ncclFloat32, rank, comm, NULL));
  BAD(ncclScatter(s, NULL, k, ncclFloat32, rank, comm, NULL));
  BAD(ncclSend(NULL, k, ncclFloat32, rank, comm, NULL));
  BAD(ncclRecv(NULL, k, ncclFloat32, rank, comm, NULL));

  /* Counts whose byte size cannot be addressed (a count from a corrupted size computation). */
  size_t huge = (size_t)-1 / 2;
  BAD(ncclAllReduce(s, d, huge, ncclFloat32, ncclSum, comm, NULL));
  BAD(ncclBroadcast(s, d, (size_t)-1, ncclInt8, rank, comm, NULL));
  BAD(ncclAllGather(s, d, huge / 4 / (size_t)nranks + 1, ncclFloat32, comm, NULL));
  BAD(ncclSend(s, huge, ncclFloat64, rank, comm, NULL));

  /* A bad call inside a group fails at once and makes ncclGroupEnd fail; the group's other calls are
   * dropped on every rank alike, so nothing is left half-matched. */
  NCCL_OK(ncclGroupStart());
  NCCL_OK(ncclAllReduce(s, d, k, ncclFloat32, ncclSum, comm, NULL));
  BAD(ncclAllReduce(s, d, k, ncclFloat32, (ncclRedOp_t)-1, comm, NULL));
  ncclResult_t r = ncclGroupEnd();
  if (r != ncclInvalidArgument)
    rt_fail(__FILE__, __LINE__, "ncclGroupEnd after a bad call in the group -> %d (%s)", (int)r, ncclGetErrorString(r));
  EXPECT_EQ(ncclGroupEnd(), ncclInvalidUsage); /* no group open */

  check_still_works(comm, nranks);
  free(s);
  free(d);
  NCCL_OK(ncclCommDestroy(comm));
}

TEST_T(coll_args, bad_arguments, 30) {
  rt_run_threads(1, bad_args_body, NULL);
  rt_run_both(2, bad_args_body, NULL);
  rt_run_threads(3, bad_args_body, NULL);
}

/* Count 0 needs no buffers; buffers a rank does not use (non-root send/recv) may be NULL. */
static void null_ok_body(int rank, int nranks, ncclUniqueId id, void* arg) {
  (void)arg;
  ncclComm_t comm = cu_comm_init(rank, nranks, id);
  NCCL_OK(ncclAllReduce(NULL, NULL, 0, ncclFloat32, ncclSum, comm, NULL));
  NCCL_OK(ncclBroadcast(NULL, NULL, 0, ncclFloat32, 0, comm, NULL));
  NCCL_OK(ncclBcast(NULL, 0, ncclFloat32, 0, comm, NULL));
  NCCL_OK(ncclReduce(NULL, NULL, 0, ncclFloat32, ncclSum, 0, comm, NULL));
  NCCL_OK(ncclAllGather(NULL, NULL, 0, ncclFloat32, comm, NULL));
  NCCL_OK(ncclReduceScatter(NULL, NULL, 0, ncclFloat32, ncclSum, comm, NULL));
  NCCL_OK(ncclAlltoAll(NULL, NULL, 0, ncclFloat32, comm, NULL));
  NCCL_OK(ncclGather(NULL, NULL, 0, ncclFloat32, 0, comm, NULL));
  NCCL_OK(ncclScatter(NULL, NULL, 0, ncclFloat32, 0, comm, NULL));
  NCCL_OK(ncclGroupStart());
  NCCL_OK(ncclSend(NULL, 0, ncclFloat32, (rank + 1) % nranks, comm, NULL));
  NCCL_OK(ncclRecv(NULL, 0, ncclFloat32, (rank + nranks - 1) % nranks, comm, NULL));
  NCCL_OK(ncclGroupEnd());

  const size_t k = 1000;
  int root = nranks - 1, me = rank == root;
  float* a = calloc(k * (size_t)nranks, sizeof(float));
  float* b = calloc(k * (size_t)nranks, sizeof(float));
  ASSERT(a && b);
  for (size_t i = 0; i < k * (size_t)nranks; i++) a[i] = (float)(i % 100 + (size_t)rank);
  NCCL_OK(ncclBroadcast(me ? a : NULL, b, k, ncclFloat32, root, comm, NULL));
  for (size_t i = 0; i < k; i++)
    if (b[i] != (float)(i % 100 + (size_t)root)) { rt_fail(__FILE__, __LINE__, "Broadcast b[%zu] = %g", i, b[i]); break; }
  NCCL_OK(ncclReduce(a, me ? b : NULL, k, ncclFloat32, ncclMax, root, comm, NULL));
  if (me)
    for (size_t i = 0; i < k; i++)
      if (b[i] != (float)(i % 100 + (size_t)nranks - 1)) { rt_fail(__FILE__, __LINE__, "Reduce b[%zu] = %g", i, b[i]); break; }
  NCCL_OK(ncclGather(a, me ? b : NULL, k, ncclFloat32, root, comm, NULL));
  if (me)
    for (size_t i = 0; i < k * (size_t)nranks; i++)
      if (b[i] != (float)(i % k % 100 + i / k)) { rt_fail(__FILE__, __LINE__, "Gather b[%zu] = %g", i, b[i]); break; }
  NCCL_OK(ncclScatter(me ? a : NULL, b, k, ncclFloat32, root, comm, NULL));
  for (size_t i = 0; i < k; i++)
    if (b[i] != (float)(((size_t)rank * k + i) % 100 + (size_t)root)) { rt_fail(__FILE__, __LINE__, "Scatter b[%zu] = %g", i, b[i]); break; }
  free(a);
  free(b);
  NCCL_OK(ncclCommDestroy(comm));
}

TEST_T(coll_args, null_buffers_allowed, 30) {
  rt_run_threads(1, null_ok_body, NULL);
  rt_run_both(3, null_ok_body, NULL);
}

/* ---- a rank killed in the middle of a collective ---- */

#define KILL_COUNT ((size_t)32 << 20) /* 128 MiB of floats: still in flight when the victim dies 3 ms in */

struct kill_shared {
  volatile uint64_t kill_ns; /* CLOCK_MONOTONIC is system-wide: comparable across processes */
  volatile int victim_failed;
  ncclUniqueId id;       /* made by the parent after the fork (its bootstrap root is a thread) */
  volatile int id_ready; /* release/acquire with id */
};

enum kill_kind { KILL_ALLREDUCE, KILL_RECV, KILL_STREAM };

/* The last rank: does one collective in step with the others, starts the next one on a stream, lets
 * it get going, and dies. */
static void victim_main(int nranks, enum kill_kind kind, struct kill_shared* sh) {
  ncclComm_t comm = NULL;
  int rank = nranks - 1;
  for (int i = 0; !__atomic_load_n(&sh->id_ready, __ATOMIC_ACQUIRE); i++) {
    if (i > 30000) { sh->victim_failed = 1; _exit(3); } /* 30 s: the parent is gone */
    usleep(1000);
  }
  ncclUniqueId id = sh->id;
  if (ncclCommInitRank(&comm, nranks, id, rank) != ncclSuccess) { sh->victim_failed = 1; _exit(3); }
  float* a = calloc(KILL_COUNT, sizeof(float));
  cudaStream_t st = NULL;
  if (!a || chorusStreamCreate(&st) != ncclSuccess) { sh->victim_failed = 1; _exit(3); }
  if (ncclAllReduce(a, a, KILL_COUNT, ncclFloat32, ncclSum, comm, NULL) != ncclSuccess) { sh->victim_failed = 1; _exit(3); }
  if (kind == KILL_RECV) ncclSend(a, KILL_COUNT, ncclFloat32, 0, comm, st);
  else ncclAllReduce(a, a, KILL_COUNT, ncclFloat32, ncclSum, comm, st);
  struct timespec ts = {0, 3 * 1000000};
  nanosleep(&ts, NULL);
  sh->kill_ns = now_ns();
  kill(getpid(), SIGKILL);
  _exit(4);
}

struct survivor {
  int rank, nranks;
  ncclUniqueId id;
  enum kill_kind kind;
  struct kill_shared* sh;
};

static void* survivor_main(void* p) {
  struct survivor* s = p;
  ncclComm_t comm = NULL;
  NCCL_OK(ncclCommInitRank(&comm, s->nranks, s->id, s->rank));
  float* a = calloc(KILL_COUNT, sizeof(float));
  ASSERT(a);
  NCCL_OK(ncclAllReduce(a, a, KILL_COUNT, ncclFloat32, ncclSum, comm, NULL));
  cudaStream_t st = NULL;
  ncclResult_t r;
  if (s->kind == KILL_RECV && s->rank == 0) {
    r = ncclRecv(a, KILL_COUNT, ncclFloat32, s->nranks - 1, comm, NULL);
  } else if (s->kind == KILL_STREAM) {
    NCCL_OK(chorusStreamCreate(&st));
    r = ncclAllReduce(a, a, KILL_COUNT, ncclFloat32, ncclSum, comm, st);
    EXPECT_EQ(r, ncclSuccess); /* queued: the failure shows when synchronizing */
    r = chorusStreamSynchronize(st);
  } else {
    r = ncclAllReduce(a, a, KILL_COUNT, ncclFloat32, ncclSum, comm, NULL);
  }
  uint64_t t_err = now_ns();
  ncclResult_t async = ncclSuccess;
  NCCL_OK(ncclCommGetAsyncError(comm, &async));
  if (s->kind == KILL_RECV && s->rank != 0) {
    /* This rank took no part in the failed call; the communicator need not know. */
  } else {
    if (r == ncclSuccess)
      rt_fail(__FILE__, __LINE__, "rank %d: the call succeeded although rank %d was killed", s->rank, s->nranks - 1);
    if (r != ncclRemoteError && async != ncclRemoteError)
      rt_fail(__FILE__, __LINE__, "rank %d: call -> %d (%s), async error %d (%s); expected ncclRemoteError", s->rank,
              (int)r, ncclGetErrorString(r), (int)async, ncclGetErrorString(async));
    if (s->sh->kill_ns == 0) {
      rt_fail(__FILE__, __LINE__, "rank %d: the call returned before the victim died", s->rank);
    } else {
      double secs = (double)(t_err - s->sh->kill_ns) / 1e9;
      if (secs > 5.0) rt_fail(__FILE__, __LINE__, "rank %d: the error came %.1f s after the kill", s->rank, secs);
    }
  }
  if (st) EXPECT(chorusStreamDestroy(st) == ncclSuccess);
  uint64_t t0 = now_ns();
  NCCL_OK(ncclCommAbort(comm));
  double secs = (double)(now_ns() - t0) / 1e9;
  if (secs > 5.0) rt_fail(__FILE__, __LINE__, "rank %d: ncclCommAbort took %.1f s", s->rank, secs);
  free(a);
  return NULL;
}

/* Names in /dev/shm now (a static list; at most 256). */
static int shm_list(char names[][128], int max) {
  DIR* d = opendir("/dev/shm");
  if (!d) return 0;
  int n = 0;
  struct dirent* e;
  while ((e = readdir(d)) != NULL && n < max)
    if (e->d_name[0] != '.') snprintf(names[n++], 128, "%.127s", e->d_name);
  closedir(d);
  return n;
}

/* Descriptors of this process that are FIFO segments (the shm transport's memfds). */
static int count_fifo_fds(void) {
  DIR* d = opendir("/proc/self/fd");
  if (!d) return -1;
  int n = 0;
  struct dirent* e;
  char path[300], target[256];
  while ((e = readdir(d)) != NULL) {
    if (e->d_name[0] == '.') continue;
    snprintf(path, sizeof(path), "/proc/self/fd/%s", e->d_name);
    ssize_t len = readlink(path, target, sizeof(target) - 1);
    if (len <= 0) continue;
    target[len] = 0;
    if (strstr(target, "memfd:") || strstr(target, "/dev/shm/")) n++;
  }
  closedir(d);
  return n;
}

struct reaper {
  pid_t pid;
  int status;
};

static void* reaper_main(void* p) {
  struct reaper* r = p;
  while (waitpid(r->pid, &r->status, 0) < 0 && errno == EINTR) {}
  return NULL;
}

struct watchdog {
  struct kill_shared* sh;
  volatile int done;
};

/* Turns a hang into a failure that says what went wrong (the runner's timeout would only say TIMEOUT). */
static void* watchdog_main(void* p) {
  struct watchdog* w = p;
  while (!w->done) {
    uint64_t k = w->sh->kill_ns;
    if (k && now_ns() - k > 10000000000ull)
      rt_fail_fatal(__FILE__, __LINE__, "surviving ranks still blocked 10 s after the last rank was killed: "
                                        "the peer's death was not detected");
    usleep(50000);
  }
  return NULL;
}

/* nranks-1 survivor ranks run as threads of this process, the last rank is a forked process that kills
 * itself. With reap, a thread waits for the victim at once, as a launcher would; without, the victim
 * stays an unreaped zombie child of the survivors' own process until they return. */
static void kill_test(int nranks, enum kill_kind kind, int reap) {
#if defined(__SANITIZE_THREAD__)
  /* These tests fork ranks from a multi-threaded process, which ThreadSanitizer does not support. */
  printf("    skipped under ThreadSanitizer (fork after threads)\n");
  return;
#endif
  static char before[256][128], after[256][128];
  int nbefore = shm_list(before, 256);
  int fds0 = count_fifo_fds();
  struct kill_shared* sh = mmap(NULL, sizeof(*sh), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  ASSERT(sh != MAP_FAILED);
  memset(sh, 0, sizeof(*sh));
  /* Fork before any thread of ours exists (ncclGetUniqueId starts the bootstrap root's): a fork copies
   * locks other threads hold (malloc's under ASan), and the child could hang on one before its kill
   * (a CI timeout of killed_while_sending under ASan, the victim never reaching its kill). */
  fflush(stdout);
  pid_t victim = fork();
  ASSERT(victim >= 0);
  if (victim == 0) victim_main(nranks, kind, sh);
  ncclUniqueId id;
  NCCL_OK(ncclGetUniqueId(&id));
  sh->id = id;
  __atomic_store_n(&sh->id_ready, 1, __ATOMIC_RELEASE);

  struct reaper rp = {victim, 0};
  pthread_t rth;
  if (reap) ASSERT(pthread_create(&rth, NULL, reaper_main, &rp) == 0);

  struct watchdog wd = {sh, 0};
  pthread_t wth;
  ASSERT(pthread_create(&wth, NULL, watchdog_main, &wd) == 0);

  struct survivor sv[8];
  pthread_t th[8];
  for (int r = 0; r < nranks - 1; r++) {
    sv[r] = (struct survivor){r, nranks, id, kind, sh};
    ASSERT(pthread_create(&th[r], NULL, survivor_main, &sv[r]) == 0);
  }
  for (int r = 0; r < nranks - 1; r++) pthread_join(th[r], NULL);
  wd.done = 1;
  pthread_join(wth, NULL);

  if (reap) pthread_join(rth, NULL);
  else ASSERT(waitpid(victim, &rp.status, 0) == victim);
  int st = rp.status;
  if (sh->victim_failed || !WIFSIGNALED(st) || WTERMSIG(st) != SIGKILL)
    rt_fail(__FILE__, __LINE__, "the victim rank did not reach its kill (status 0x%x)", st);

  /* Nothing left behind: no FIFO descriptor held here, no new name in /dev/shm (others' short-lived
   * files may come and go meanwhile: give them a moment). */
  EXPECT_EQ(count_fifo_fds(), fds0);
  int nafter = 0, leaked = 0;
  for (int tries = 0; tries < 20; tries++) {
    nafter = shm_list(after, 256);
    leaked = 0;
    for (int i = 0; i < nafter; i++) {
      int old = 0;
      for (int j = 0; j < nbefore && !old; j++) old = !strcmp(after[i], before[j]);
      leaked += !old;
    }
    if (!leaked) break;
    usleep(100000);
  }
  for (int i = 0; i < nafter && leaked; i++) {
    int old = 0;
    for (int j = 0; j < nbefore && !old; j++) old = !strcmp(after[i], before[j]);
    if (!old) rt_fail(__FILE__, __LINE__, "/dev/shm/%s appeared during the test and is still there", after[i]);
  }
  munmap(sh, sizeof(*sh));
}

TEST_T(coll_fault, killed_in_allreduce_2, 60) { kill_test(2, KILL_ALLREDUCE, 1); }
TEST_T(coll_fault, killed_in_allreduce_3, 60) { kill_test(3, KILL_ALLREDUCE, 1); }
TEST_T(coll_fault, killed_while_sending, 60) { kill_test(2, KILL_RECV, 1); }
TEST_T(coll_fault, killed_stream_sync, 60) { kill_test(2, KILL_STREAM, 1); }
/* A dead peer that is this process's own child and not yet reaped is a zombie: it still answers
 * kill(pid, 0), but it is as dead as any other (a program that forks its ranks and is rank 0 itself). */
TEST_T(coll_fault, killed_unreaped_child, 20) { kill_test(2, KILL_ALLREDUCE, 0); }

/* ---- a rank whose end of a connection fails locally (issue 9, items 7 and 9) ----
 * The failing rank still answers its peers, marked failed: every rank of the failed setup returns an
 * error (the failing one its own, its peers ncclRemoteError), nobody waits for ever. The error stays
 * on the communicator; once a test clears it, the retry must connect again (the failed call's plan
 * was not kept) and compute the right values. */
struct connect_fault {
  int where; /* CONNECT_FAULT_RECV / CONNECT_FAULT_SEND */
  int rank;  /* the rank that fails */
  int p2p;   /* rank 0 sends to rank 1 (else an AllReduce over rings) */
};

static ncclResult_t fault_call(const struct connect_fault* fc, int rank, int nranks, ncclComm_t comm, float* v, int k) {
  for (int i = 0; i < 64; i++) v[i] = (float)(rank + i + k);
  if (!fc->p2p) return ncclAllReduce(v, v, 64, ncclFloat, ncclSum, comm, NULL);
  if (rank == 0) return ncclSend(v, 64, ncclFloat, 1, comm, NULL);
  if (rank == 1) return ncclRecv(v, 64, ncclFloat, 0, comm, NULL);
  return ncclSuccess;
}

static void fault_check(const struct connect_fault* fc, int rank, int nranks, const float* v, int k) {
  for (int i = 0; i < 64; i++) {
    float want = fc->p2p ? (rank == 1 ? (float)(i + k) : (float)(rank + i + k))
                         : (float)(nranks * (i + k) + nranks * (nranks - 1) / 2);
    if (v[i] != want) {
      rt_fail(__FILE__, __LINE__, "%s rank %d: v[%d] = %g after the retry, want %g", rt_mode(), rank, i, v[i], want);
      return;
    }
  }
}

static void connect_fault_body(int rank, int nranks, ncclUniqueId id, void* arg) {
  const struct connect_fault* fc = arg;
  ncclComm_t comm = cu_comm_init(rank, nranks, id);
  int involved = !fc->p2p || rank < 2;
  if (rank == fc->rank) comm_connect_inject_fault(comm, fc->where, 1, CH_SYSTEM);
  float v[64];
  ncclResult_t r = fault_call(fc, rank, nranks, comm, v, 0);
  if (involved) {
    ncclResult_t want = rank == fc->rank ? ncclSystemError : ncclRemoteError;
    if (r != want)
      rt_fail(__FILE__, __LINE__, "%s rank %d: the call whose connection failed -> %d (%s), want %d", rt_mode(), rank,
              (int)r, ncclGetErrorString(r), (int)want);
    ncclResult_t async = ncclSuccess;
    NCCL_OK(ncclCommGetAsyncError(comm, &async));
    EXPECT_EQ(async, want);
    /* The communicator keeps its error: a retry fails at once, cleanly. */
    EXPECT_EQ(fault_call(fc, rank, nranks, comm, v, 1), want);
    /* A test can clear it (internal field): then the retry connects again and runs. */
    atomic_store(&comm->async_result, ncclSuccess);
  }
  NCCL_OK(fault_call(fc, rank, nranks, comm, v, 2));
  fault_check(fc, rank, nranks, v, 2);
  NCCL_OK(fault_call(fc, rank, nranks, comm, v, 3)); /* a repeat, through the reused plan */
  fault_check(fc, rank, nranks, v, 3);
  NCCL_OK(ncclCommDestroy(comm));
}

TEST_T(coll_fault, connect_fails_at_receiver_then_retry, 60) {
  struct connect_fault fc = {CONNECT_FAULT_RECV, 1, 0};
  rt_run_both(2, connect_fault_body, &fc);
  rt_run_both(3, connect_fault_body, &fc); /* the failing rank's other neighbour learns it too */
}
TEST_T(coll_fault, connect_fails_at_sender_then_retry, 60) {
  struct connect_fault fc = {CONNECT_FAULT_SEND, 0, 0};
  rt_run_both(2, connect_fault_body, &fc);
}
/* The receiver used to wait for ever for the sender's acknowledgement. */
TEST_T(coll_fault, p2p_sender_fails_receiver_returns, 60) {
  struct connect_fault fc = {CONNECT_FAULT_SEND, 0, 1};
  rt_run_both(3, connect_fault_body, &fc);
}
TEST_T(coll_fault, p2p_receiver_fails_sender_returns, 60) {
  struct connect_fault fc = {CONNECT_FAULT_RECV, 1, 1};
  rt_run_both(2, connect_fault_body, &fc);
}

/* ---- a call that fails before it is launched does not count (issue 9, item 7) ----
 * Rank 0 groups an AllReduce on communicator A with a call on B, and B fails between the calls'
 * checks and their launch: the AllReduce on A never ran, on any rank. The next AllReduce on A must
 * match its peers' (sequence numbers are checked by Direct between threads and carried in headers):
 * the right sum, and A's sequence number equal to the calls that ran. */
static void seq_body(int rank, int nranks, ncclUniqueId id, void* arg) {
  ncclUniqueId* id_b = arg;
  ncclComm_t a = cu_comm_init(rank, nranks, id);
  ncclComm_t b = cu_comm_init(rank, nranks, *id_b);
  float v[256];
  for (int i = 0; i < 256; i++) v[i] = (float)(rank + i);
  NCCL_OK(ncclAllReduce(v, v, 256, ncclFloat, ncclSum, a, NULL));
  if (rank == 0) {
    NCCL_OK(ncclGroupStart());
    NCCL_OK(ncclAllReduce(v, v, 256, ncclFloat, ncclSum, a, NULL));
    NCCL_OK(ncclAllReduce(v, v, 256, ncclFloat, ncclSum, b, NULL));
    comm_set_async_error(b, CH_REMOTE); /* as if B failed meanwhile (another thread's call) */
    ncclResult_t r = ncclGroupEnd();
    EXPECT_EQ(r, ncclRemoteError);
  }
  for (int k = 0; k < 3; k++) {
    for (int i = 0; i < 256; i++) v[i] = (float)(rank + i + k);
    NCCL_OK(ncclAllReduce(v, v, 256, ncclFloat, ncclSum, a, NULL));
    for (int i = 0; i < 256; i++) {
      float want = (float)(nranks * (i + k) + nranks * (nranks - 1) / 2);
      if (v[i] != want) {
        rt_fail(__FILE__, __LINE__, "%s rank %d call %d: v[%d] = %g, want %g", rt_mode(), rank, k, i, v[i], want);
        break;
      }
    }
  }
  EXPECT_EQ(atomic_load(&a->seq), 4); /* the calls that ran */
  NCCL_OK(ncclCommDestroy(a));
  ncclCommAbort(b); /* rank 0's B has an error; the others' B did nothing */
}

TEST_T(coll_fault, failed_call_does_not_advance_sequence, 30) {
  ncclUniqueId id_b;
  NCCL_OK(ncclGetUniqueId(&id_b));
  rt_run_threads(2, seq_body, &id_b);
  NCCL_OK(ncclGetUniqueId(&id_b));
  rt_run_procs(2, seq_body, &id_b);
}
