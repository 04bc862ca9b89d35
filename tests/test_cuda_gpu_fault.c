/* Ranks that share one GPU, continued (test_cuda_gpu.c has the collectives and sends that work):
 * stream order, calls that differ or cannot run, failing and vanishing peers, CUDA graph capture,
 * streams destroyed under a call, one rank alone. Same stand-in driver (cuda_stub/fake_cuda.c). */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "chorus.h"
#include "gpu/gpu.h"
#include "cuda/cudrv.h"
#include "misc/param.h"
#include "nccl.h"
#include "cuda_gpu_util.h"
#include "runner.h"

/* Work queued on the stream before the call is done first: a 'kernel' that holds the stream until
 * released; the call returns at once and the result is what the held work left plus the peers'. */
static void order_body(int rank, int nranks, ncclUniqueId id, void* arg) {
  (void)arg;
  cudaStream_t s;
  ncclComm_t comm = open_rank(rank, nranks, id, 0x7400, &s);
  float* a = dev_alloc(N);
  static float src[2][N];
  for (int i = 0; i < N; i++) a[i] = 0, src[rank][i] = (float)(rank + 1);
  static int release[2];
  ASSERT_EQ(fk.hold(s, &release[rank]), 0);
  ASSERT_EQ(fk.copy(s, a, src[rank], sizeof(src[rank])), 0); /* 'the producer kernel' */
  NCCL_OK(ncclAllReduce(a, a, N, ncclFloat32, ncclSum, comm, s)); /* returns while the stream is held */
  usleep(20000);
  EXPECT(a[0] == 0.0f);
  __atomic_store_n(&release[rank], 1, __ATOMIC_RELEASE);
  ASSERT_EQ(fk.sync(s), 0);
  for (int i = 0; i < N; i++) EXPECT(a[i] == 3.0f);
  NCCL_OK(ncclCommDestroy(comm));
  fk.free((uintptr_t)a);
}

TEST_T(cuda_gpu, in_stream_order_2_procs, 60) {
  if (no_kernels()) return;
  load();
  rt_run_procs(2, order_body, NULL);
}

/* Ranks that make different calls: every rank fails (async error naming the difference), no stream
 * stays blocked. */
static void mismatch_body(int rank, int nranks, ncclUniqueId id, void* arg) {
  (void)arg;
  cudaStream_t s;
  ncclComm_t comm = open_rank(rank, nranks, id, 0x7800, &s);
  float* a = dev_alloc(2 * N);
  ncclResult_t r = ncclAllReduce(a, a, rank == 0 ? N : 2 * N, ncclFloat32, ncclSum, comm, s);
  EXPECT(r == ncclSuccess || r == ncclInvalidUsage);
  ASSERT_EQ(fk.sync(s), 0); /* released */
  expect_failed(comm, ncclInvalidUsage, "differs");
  NCCL_OK(ncclCommAbort(comm));
  fk.free((uintptr_t)a);
}

TEST_T(cuda_gpu, different_calls_fail_every_rank, 60) {
  if (no_kernels()) return;
  load();
  rt_run_procs(2, mismatch_body, NULL);
}

/* A peer's buffer smaller than the call needs (rank 1's: AllGather's recvbuff, AlltoAll's sendbuff,
 * one block instead of nranks) fails the call on every rank, naming it, before any kernel touches
 * it: what is checked is read off the kernel's own jobs (gpu/resolve.c). */
static void small_body(int rank, int nranks, ncclUniqueId id, void* arg) {
  int a2a = arg != NULL;
  cudaStream_t s;
  ncclComm_t comm = open_rank(rank, nranks, id, 0x7e00, &s);
  size_t full = (size_t)nranks * N, short_one = rank == 1 ? N : full;
  float* send = dev_alloc(a2a ? short_one : N);
  float* recv = dev_alloc(a2a ? full : short_one);
  if (a2a) NCCL_OK(ncclAlltoAll(send, recv, N, ncclFloat32, comm, s));
  else NCCL_OK(ncclAllGather(send, recv, N, ncclFloat32, comm, s));
  ASSERT_EQ(fk.sync(s), 0);
  expect_failed(comm, ncclInvalidArgument, "outside");
  NCCL_OK(ncclCommAbort(comm));
  fk.free((uintptr_t)send), fk.free((uintptr_t)recv);
}

/* A buffer not aligned to its elements (rank 1's, 2 bytes into a float allocation) fails the call on
 * every rank before any kernel loads from it: a misaligned load would end the GPU's context. */
static void misaligned_body(int rank, int nranks, ncclUniqueId id, void* arg) {
  (void)arg;
  cudaStream_t s;
  ncclComm_t comm = open_rank(rank, nranks, id, 0x7f00, &s);
  float* a = dev_alloc(N + 1);
  float* p = rank == 1 ? (float*)((char*)a + 2) : a;
  NCCL_OK(ncclAllReduce(p, p, N, ncclFloat32, ncclSum, comm, s));
  ASSERT_EQ(fk.sync(s), 0);
  expect_failed(comm, ncclInvalidArgument, "not aligned");
  NCCL_OK(ncclCommAbort(comm));
  fk.free((uintptr_t)a);
}

TEST_T(cuda_gpu, misaligned_buffer_fails_every_rank, 60) {
  if (no_kernels()) return;
  load();
  rt_run_procs(2, misaligned_body, NULL);
}

TEST_T(cuda_gpu, peer_buffer_too_small_fails_every_rank, 60) {
  if (no_kernels()) return;
  load();
  rt_run_procs(3, small_body, NULL);
  rt_run_procs(3, small_body, (void*)1);
}

/* Device memory that CUDA IPC cannot share (here: memory the stand-in was told is device memory,
 * not from cuMemAlloc) fails the call on every rank with a message that says what to do. */
static float unshareable[2][N];
static void unshareable_body(int rank, int nranks, ncclUniqueId id, void* arg) {
  (void)arg;
  set_device();
  fk.mark(unshareable, sizeof(unshareable), 1);
  ncclComm_t comm;
  NCCL_OK(ncclCommInitRank(&comm, nranks, id, rank));
  cudaStream_t s = (cudaStream_t)(uintptr_t)(0x7c00 + 0x10 * rank);
  NCCL_OK(ncclAllReduce(unshareable[rank], unshareable[rank], N, ncclFloat32, ncclSum, comm, s));
  ASSERT_EQ(fk.sync(s), 0);
  expect_failed(comm, ncclInvalidUsage, "CUDA IPC");
  NCCL_OK(ncclCommAbort(comm));
}

TEST_T(cuda_gpu, unshareable_buffer_is_refused_by_name, 60) {
  if (no_kernels()) return;
  load();
  rt_run_procs(2, unshareable_body, NULL);
}

/* An abort while the stream is held before the call: returns at once, and the stream, once let go,
 * runs through (its waits released, its kernel skipped: the data stays), whether the kernel reads its
 * table from host memory or from the stage kernel's copy. */
TEST_T(cuda_gpu, abort_with_a_held_stream, 60) {
  if (no_kernels()) return;
  load();
  set_device();
  for (int stage = 0; stage < 2; stage++) {
    kernels_as(stage ? "0" : "1000000", NULL);
    ncclUniqueId id;
    NCCL_OK(ncclGetUniqueId(&id));
    ncclComm_t comm[2];
    NCCL_OK(ncclGroupStart());
    for (int r = 0; r < 2; r++) NCCL_OK(ncclCommInitRank(&comm[r], 2, id, r));
    NCCL_OK(ncclGroupEnd());
    float* a = dev_alloc(2 * N);
    for (int i = 0; i < 2 * N; i++) a[i] = 1;
    int release = 0, staged_before = fk.stage_runs();
    cudaStream_t s0 = (cudaStream_t)(uintptr_t)(0x7f00 + 0x100 * stage), s1 = (cudaStream_t)(uintptr_t)(0x7f10 + 0x100 * stage);
    ASSERT_EQ(fk.hold(s0, &release), 0);
    /* one thread, two ranks: a group, as nccl-tests' -g does */
    NCCL_OK(ncclGroupStart());
    NCCL_OK(ncclAllReduce(a, a, N, ncclFloat32, ncclSum, comm[0], s0));
    NCCL_OK(ncclAllReduce(a + N, a + N, N, ncclFloat32, ncclSum, comm[1], s1));
    NCCL_OK(ncclGroupEnd());
    NCCL_OK(ncclCommAbort(comm[0]));
    NCCL_OK(ncclCommAbort(comm[1]));
    __atomic_store_n(&release, 1, __ATOMIC_RELEASE);
    EXPECT_EQ(fk.sync(s0), 0);
    EXPECT_EQ(fk.sync(s1), 0);
    for (int i = 0; i < 2 * N; i++) EXPECT(a[i] == 1);
    EXPECT(stage ? fk.stage_runs() > staged_before : fk.stage_runs() == staged_before);
    EXPECT_EQ(fk.free((uintptr_t)a), 0);
  }
  kernels_as(NULL, NULL);
}

/* One rank: an in-place call does nothing at all, an out-of-place one is a copy-engine copy (no
 * kernel), PreMulSum still scales (a kernel); results in closed form. */
TEST_T(cuda_gpu, one_rank_copies_or_does_nothing, 30) {
  if (no_kernels()) return;
  load();
  set_device();
  ncclUniqueId id;
  NCCL_OK(ncclGetUniqueId(&id));
  ncclComm_t comm;
  NCCL_OK(ncclCommInitRank(&comm, 1, id, 0));
  float *a = dev_alloc(N), *b = dev_alloc(N);
  for (int i = 0; i < N; i++) a[i] = (float)i, b[i] = -1;
  cudaStream_t s = (cudaStream_t)(uintptr_t)0x8200;
  int k0 = fk.kernels();
  NCCL_OK(ncclAllReduce(a, a, N, ncclFloat32, ncclAvg, comm, s));
  NCCL_OK(ncclAllReduce(a, b, N, ncclFloat32, ncclMax, comm, s));
  ASSERT_EQ(fk.sync(s), 0);
  EXPECT_EQ(fk.kernels(), k0);
  for (int i = 0; i < N; i++) EXPECT(a[i] == (float)i && b[i] == (float)i);
  ncclRedOp_t op;
  float two = 2.0f;
  NCCL_OK(ncclRedOpCreatePreMulSum(&op, &two, ncclFloat32, ncclScalarHostImmediate, comm));
  NCCL_OK(ncclAllReduce(a, a, N, ncclFloat32, op, comm, s));
  ASSERT_EQ(fk.sync(s), 0);
  EXPECT(fk.kernels() > k0);
  for (int i = 0; i < N; i++) EXPECT(a[i] == 2.0f * (float)i);
  NCCL_OK(ncclRedOpDestroy(op, comm));
  NCCL_OK(ncclCommDestroy(comm));
  EXPECT_EQ(fk.free((uintptr_t)a), 0);
  EXPECT_EQ(fk.free((uintptr_t)b), 0);
}

/* CUDA graphs: an AllReduce (sum) and a Broadcast captured on each rank's stream, nothing run by the
 * capture; the graph replayed 100 times with new inputs each time, an eager AllReduce between
 * replays, results in closed form every time. A send under capture is refused, naming it. */
static void graph_body(int rank, int nranks, ncclUniqueId id, void* arg) {
  (void)arg;
  cudaStream_t s;
  ncclComm_t comm = open_rank(rank, nranks, id, 0xa000, &s);
  float *a = dev_alloc(N), *b = dev_alloc(N), *c = dev_alloc(N);
  for (int i = 0; i < N; i++) a[i] = -2, b[i] = c[i] = -1;
  fk.begin_capture(s);
  NCCL_OK(ncclAllReduce(a, b, N, ncclFloat32, ncclSum, comm, s));
  NCCL_OK(ncclBroadcast(a, c, N, ncclFloat32, nranks - 1, comm, s));
  EXPECT_EQ(ncclSend(a, N, ncclFloat32, 0, comm, s), ncclInvalidUsage);
  EXPECT(strstr(ncclGetLastError(comm), "CUDA graph") != NULL);
  void* graph = fk.end_capture(s);
  ASSERT(graph != NULL);
  EXPECT(fk.graph_ops(graph) > 0);
  ASSERT_EQ(fk.sync(s), 0);
  for (int i = 0; i < N; i++) EXPECT(b[i] == -1 && c[i] == -1); /* captured, not run */
  for (int rep = 0; rep < 100; rep++) {
    for (int i = 0; i < N; i++) a[i] = (float)(rank + rep + i % 7);
    ASSERT_EQ(fk.graph_launch(graph, s), 0);
    ASSERT_EQ(fk.sync(s), 0);
    for (int i = 0; i < N; i++) {
      float want = (float)(nranks * (nranks - 1) / 2 + nranks * (rep + i % 7));
      if (b[i] != want || c[i] != (float)(nranks - 1 + rep + i % 7)) {
        rt_fail(__FILE__, __LINE__, "rank %d replay %d [%d]: %g %g", rank, rep, i, b[i], c[i]);
        break;
      }
    }
    if (rep % 10 == 0) { /* an eager call between replays */
      NCCL_OK(ncclAllReduce(a, c, N, ncclFloat32, ncclMax, comm, s));
      ASSERT_EQ(fk.sync(s), 0);
      EXPECT(c[0] == (float)(nranks - 1 + rep));
    }
  }
  fk.graph_destroy(graph);
  NCCL_OK(ncclCommDestroy(comm));
  fk.free((uintptr_t)a), fk.free((uintptr_t)b), fk.free((uintptr_t)c);
}

TEST_T(cuda_gpu, graph_capture_and_replay_threads, 120) {
  if (no_kernels()) return;
  load();
  for (int n = 1; n <= 3; n++) rt_run_threads(n, graph_body, NULL);
}

/* Processes (a test of its own: the stand-in's stream threads do not survive a fork). */
TEST_T(cuda_gpu, graph_capture_and_replay_procs, 120) {
  if (no_kernels()) return;
  load();
  for (int n = 2; n <= 4; n++) rt_run_procs(n, graph_body, NULL);
}

/* A group that mixes a call run on the GPU with ones through host memory (Send/Recv) is refused. */
TEST_T(cuda_gpu, mixed_group_refused, 30) {
  if (no_kernels()) return;
  load();
  set_device();
  ncclUniqueId id;
  NCCL_OK(ncclGetUniqueId(&id));
  ncclComm_t comm;
  NCCL_OK(ncclCommInitRank(&comm, 1, id, 0));
  float *a = dev_alloc(N), *b = dev_alloc(N);
  cudaStream_t s = (cudaStream_t)(uintptr_t)0x8100;
  NCCL_OK(ncclGroupStart());
  NCCL_OK(ncclAllReduce(a, b, N, ncclFloat32, ncclSum, comm, s));
  NCCL_OK(ncclSend(a, N / 2, ncclFloat32, 0, comm, s));
  NCCL_OK(ncclRecv(a + N / 2, N / 2, ncclFloat32, 0, comm, s));
  EXPECT_EQ(ncclGroupEnd(), ncclInvalidUsage);
  EXPECT(strstr(ncclGetLastError(comm), "separate groups") != NULL);
  EXPECT_EQ(fk.sync(s), 0);
  NCCL_OK(ncclCommDestroy(comm));
}

/* A peer process dies while this rank's stream waits at the call's barrier for it (the exchange of
 * descriptions was done: no host call is waiting, only the GPU): the watcher finds it gone, fails the
 * communicator naming it, and the stream runs on. */
static void dead_peer_body(int rank, int nranks, ncclUniqueId id, void* arg) {
  (void)arg;
  cudaStream_t s;
  ncclComm_t comm = open_rank(rank, nranks, id, 0x8400, &s);
  dead_peer_steps(comm, s, rank, N);
}

TEST_T(cuda_gpu, peer_dies_while_the_stream_waits, 60) {
  if (no_kernels()) return;
  load();
  rt_run_procs(2, dead_peer_body, NULL);
}

/* CHORUS_TIMEOUT: a peer whose stream never reaches the call (alive, held) fails the call on the
 * others once the timeout passes, instead of holding their streams for ever. */
static void held_peer_body(int rank, int nranks, ncclUniqueId id, void* arg) {
  (void)arg;
  cudaStream_t s;
  ncclComm_t comm = open_rank(rank, nranks, id, 0x8800, &s);
  held_peer_steps(comm, s, rank, N);
}

TEST_T(cuda_gpu, stream_that_never_arrives_times_out, 60) {
  if (no_kernels()) return;
  setenv("CHORUS_TIMEOUT", "1", 1);
  load();
  rt_run_procs(2, held_peer_body, NULL);
}

/* Two thread ranks on one stream (the legacy NULL stream is one for every thread) would each wait at
 * the barrier for the other's part, queued behind it: refused by name instead of hanging. */
static void one_stream_body(int rank, int nranks, ncclUniqueId id, void* arg) {
  (void)arg;
  ncclComm_t comm = open_rank(rank, nranks, id, 0, NULL);
  float* a = dev_alloc(N);
  NCCL_OK(ncclAllReduce(a, a, N, ncclFloat32, ncclSum, comm, NULL));
  ASSERT_EQ(fk.sync(NULL), 0);
  expect_failed(comm, ncclInvalidUsage, "a stream each");
  NCCL_OK(ncclCommAbort(comm));
}

TEST_T(cuda_gpu, thread_ranks_on_one_stream_refused, 60) {
  if (no_kernels()) return;
  load();
  rt_run_threads(2, one_stream_body, NULL);
}

/* Call numbers are 32 bits and wrap: 100 calls across the wrap, results right, and the communicator
 * ends at once (every call seen finished). */
static pthread_barrier_t wrap_barrier;
static void wrap_body(int rank, int nranks, ncclUniqueId id, void* arg) {
  (void)arg;
  ncclComm_t comm = open_rank(rank, nranks, id, 0, NULL);
  gpu_test_seq_base(comm, 0xffffffe0u);
  pthread_barrier_wait(&wrap_barrier); /* every rank has set its base before anyone's first call */
  cudaStream_t s = (cudaStream_t)(uintptr_t)(0x8c00 + 0x10 * rank);
  float* a = dev_alloc(N);
  for (int it = 0; it < 100; it++) {
    for (int i = 0; i < N; i++) a[i] = (float)(rank + it);
    NCCL_OK(ncclAllReduce(a, a, N, ncclFloat32, ncclSum, comm, s));
    ASSERT_EQ(fk.sync(s), 0);
    for (int i = 0; i < N; i += 97) EXPECT(a[i] == (float)(1 + 2 * it));
  }
  struct timespec t0, t1; /* wall time: destroy would wait (asleep) for calls it thought unfinished */
  clock_gettime(CLOCK_MONOTONIC, &t0);
  NCCL_OK(ncclCommDestroy(comm));
  clock_gettime(CLOCK_MONOTONIC, &t1);
  EXPECT((double)(t1.tv_sec - t0.tv_sec) + (double)(t1.tv_nsec - t0.tv_nsec) / 1e9 < 1.0);
  fk.free((uintptr_t)a);
}

TEST_T(cuda_gpu, call_numbers_wrap, 60) {
  if (no_kernels()) return;
  load();
  pthread_barrier_init(&wrap_barrier, NULL, 2);
  rt_run_threads(2, wrap_body, NULL);
  pthread_barrier_destroy(&wrap_barrier);
}

/* One rank's calls on one communicator follow call order across the streams they name (as NCCL's
 * do): call 1 on a held stream X, call 2 on stream Y; a peer must not run call 1 against rank 0's
 * word for call 2 while X has not produced call 1's input. */
static void two_streams_body(int rank, int nranks, ncclUniqueId id, void* arg) {
  (void)arg;
  ncclComm_t comm = open_rank(rank, nranks, id, 0, NULL);
  cudaStream_t x = (cudaStream_t)(uintptr_t)(0x9000 + 0x10 * rank), y = (cudaStream_t)(uintptr_t)(0x9008 + 0x10 * rank);
  float *a = dev_alloc(N), *b = dev_alloc(N);
  static float src[N];
  static int release;
  for (int i = 0; i < N; i++) a[i] = -100, b[i] = (float)(rank + 1), src[i] = 10;
  if (rank == 0) {
    ASSERT_EQ(fk.hold(x, &release), 0);
    ASSERT_EQ(fk.copy(x, a, src, sizeof(src)), 0); /* call 1's input, produced late */
  } else {
    for (int i = 0; i < N; i++) a[i] = 1;
  }
  NCCL_OK(ncclAllReduce(a, a, N, ncclFloat32, ncclSum, comm, x));
  NCCL_OK(ncclAllReduce(b, b, N, ncclFloat32, ncclSum, comm, rank == 0 ? y : x));
  if (rank == 0) {
    usleep(100000);
    __atomic_store_n(&release, 1, __ATOMIC_RELEASE);
  }
  ASSERT_EQ(fk.sync(x), 0);
  ASSERT_EQ(fk.sync(y), 0);
  for (int i = 0; i < N; i++) EXPECT(a[i] == 11.0f && b[i] == 3.0f);
  NCCL_OK(ncclCommDestroy(comm));
}

TEST_T(cuda_gpu, call_order_across_streams, 60) {
  if (no_kernels()) return;
  load();
  rt_run_procs(2, two_streams_body, NULL);
}

/* The application destroys a call's stream once its work is queued (allowed), then calls on another:
 * the order between the two calls goes through the communicator's own event, not the gone stream. */
static void destroyed_body(int rank, int nranks, ncclUniqueId id, void* arg) {
  uintptr_t base = (uintptr_t)arg; /* streams of their own per run: destroyed ones stay destroyed */
  ncclComm_t comm = open_rank(rank, nranks, id, 0, NULL);
  cudaStream_t x = (cudaStream_t)(base + 0x10 * rank), y = (cudaStream_t)(base + 8 + 0x10 * rank);
  float* a = dev_alloc(N);
  for (int i = 0; i < N; i++) a[i] = (float)(rank + 1);
  NCCL_OK(ncclAllReduce(a, a, N, ncclFloat32, ncclSum, comm, x));
  ASSERT_EQ(fk.destroy(x), 0); /* its queued work still runs */
  NCCL_OK(ncclAllReduce(a, a, N, ncclFloat32, ncclSum, comm, y));
  ASSERT_EQ(fk.sync(y), 0);
  ncclResult_t as;
  NCCL_OK(ncclCommGetAsyncError(comm, &as));
  EXPECT_EQ(as, ncclSuccess);
  float want = (float)(nranks * (nranks + 1) / 2 * nranks);
  for (int i = 0; i < N; i++) EXPECT(a[i] == want);
  NCCL_OK(ncclCommDestroy(comm));
  fk.free((uintptr_t)a);
}

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* A call that cannot be queued (its stream is gone) fails the communicator, which is then not left
 * looking busy: ncclCommDestroy returns without waiting for a call that will never finish. */
static void unqueued_body(int rank, int nranks, ncclUniqueId id, void* arg) {
  (void)arg;
  ncclComm_t comm = open_rank(rank, nranks, id, 0, NULL);
  cudaStream_t x = (cudaStream_t)(uintptr_t)(0x9c00 + 0x10 * rank);
  float* a = dev_alloc(N);
  ASSERT_EQ(fk.destroy(x), 0);
  EXPECT(ncclAllReduce(a, a, N, ncclFloat32, ncclSum, comm, x) != ncclSuccess);
  double t0 = now_s();
  ncclCommDestroy(comm);
  EXPECT(now_s() - t0 < 5.0);
  fk.free((uintptr_t)a);
}

TEST_T(cuda_gpu, unqueued_call_does_not_hold_destroy, 60) {
  if (no_kernels()) return;
  load();
  rt_run_procs(2, unqueued_body, NULL);
}

/* (Threads and processes in separate tests: the stand-in's stream threads outlive a thread run, and
 * ThreadSanitizer refuses to fork after threads.) */
TEST_T(cuda_gpu, next_call_after_the_stream_is_destroyed_threads, 60) {
  if (no_kernels()) return;
  load();
  rt_run_threads(2, destroyed_body, (void*)(uintptr_t)0x9a00);
}
TEST_T(cuda_gpu, next_call_after_the_stream_is_destroyed_procs, 60) {
  if (no_kernels()) return;
  load();
  rt_run_procs(2, destroyed_body, (void*)(uintptr_t)0x9b00);
}
