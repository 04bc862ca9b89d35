/* CUDA buffers without a GPU: the library classifies buffers only in a process that has the CUDA
 * driver loaded; device memory then runs on host copies (staging/staging.c), in the order of the call's CUDA
 * stream (or, with CHORUS_CUDA_ASYNC=0, before the call returns), mixed kinds are refused by name,
 * and managed memory is ordered after the call's CUDA stream. A stand-in driver
 * (cuda_stub/fake_cuda.c) plays libcuda.so.1: tests mark host ranges as device or managed memory,
 * and its streams run queued work on threads of their own. */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdint.h>
#include <dlfcn.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "cuda/cudrv.h"
#include "misc/param.h"
#include "chorus.h"
#include "nccl.h"
#include "runner.h"

static void (*mark)(const void*, size_t, int);
static int (*syncs)(void), (*copies)(void), (*ctx_depth)(void), (*host_allocs)(void);
static int (*cu_sync)(void*);
static int (*fill)(void*, float*, size_t, float, int), (*hold)(void*, int*), (*copy_on)(void*, void*, const void*, size_t);
static void (*set_capturing)(void*, int);

/* As an application that uses CUDA: the driver is loaded (and, unless told, initialised). */
static void load_fake(int init) {
  void* h = dlopen(CHORUS_FAKE_CUDA, RTLD_NOW | RTLD_GLOBAL);
  ASSERT(h != NULL);
  *(void**)&mark = dlsym(h, "fake_cuda_mark");
  *(void**)&syncs = dlsym(h, "fake_cuda_syncs");
  *(void**)&copies = dlsym(h, "fake_cuda_copies");
  *(void**)&ctx_depth = dlsym(h, "fake_cuda_ctx_depth");
  *(void**)&host_allocs = dlsym(h, "fake_cuda_host_allocs");
  *(void**)&cu_sync = dlsym(h, "cuStreamSynchronize");
  *(void**)&fill = dlsym(h, "fake_cuda_fill");
  *(void**)&hold = dlsym(h, "fake_cuda_hold");
  *(void**)&copy_on = dlsym(h, "fake_cuda_copy");
  *(void**)&set_capturing = dlsym(h, "fake_cuda_set_capturing");
  int (*cu_init)(unsigned) = (int (*)(unsigned))dlsym(h, "cuInit");
  ASSERT(mark && syncs && copies && ctx_depth && host_allocs && cu_sync && fill && hold && copy_on && set_capturing &&
         cu_init);
  if (init) EXPECT_EQ(cu_init(0), 0);
  setenv("CHORUS_CUDA_LIBRARY", CHORUS_FAKE_CUDA, 1);
  param_reset();
}

/* Pinned blocks still allocated once the frees handed to the library's reaper thread have run (an
 * abort's, or a pool's shrink: cudrv_defer), waiting up to 5 s for it to reach 0. */
static int host_allocs_settled(void) {
  for (int i = 0; i < 500 && host_allocs() != 0; i++) usleep(10 * 1000);
  return host_allocs();
}

static ncclComm_t one_rank(void) {
  ncclUniqueId id;
  ncclComm_t comm = NULL;
  NCCL_OK(ncclGetUniqueId(&id));
  NCCL_OK(ncclCommInitRank(&comm, 1, id, 0));
  return comm;
}

TEST_T(cuda, no_driver_host_path, 30) {
  setenv("CHORUS_CUDA_LIBRARY", "libchorus-no-such-driver.so", 1);
  param_reset();
  EXPECT_EQ(cudrv_present(), 0);
  ncclComm_t comm = one_rank();
  float a[4] = {1, 2, 3, 4}, b[4] = {0};
  NCCL_OK(ncclAllReduce(a, b, 4, ncclFloat32, ncclSum, comm, NULL));
  EXPECT(b[3] == 4.0f);
  NCCL_OK(ncclCommDestroy(comm));
}

/* CHORUS_CUDA_ASYNC=0: device buffers run on host copies before the call returns: the stream first,
 * one copy in, one copy back, each in the buffer's context (the calling thread has none current here). */
TEST_T(cuda, device_buffers_staged, 30) {
  setenv("CHORUS_CUDA_ASYNC", "0", 1);
  load_fake(1);
  EXPECT_EQ(cudrv_present(), 1);
  ncclComm_t comm = one_rank();
  static float a[64], b[64]; /* host memory the fake driver calls device memory */
  for (int i = 0; i < 64; i++) a[i] = (float)i;
  mark(a, sizeof(a), 1);
  mark(b, sizeof(b), 1);
  EXPECT_EQ(cudrv_classify(a + 3, NULL), CU_MEM_DEVICE);
  cudaStream_t cuda_stream = (cudaStream_t)(uintptr_t)0x5000;
  NCCL_OK(ncclAllReduce(a, b, 64, ncclFloat32, ncclSum, comm, cuda_stream));
  EXPECT_EQ(syncs(), 1);
  EXPECT_EQ(copies(), 2);
  EXPECT_EQ(ctx_depth(), 0);
  for (int i = 0; i < 64; i++) EXPECT(b[i] == (float)i);
  NCCL_OK(ncclAllReduce(b, b, 64, ncclFloat32, ncclProd, comm, NULL)); /* in place */
  EXPECT_EQ(copies(), 4);
  for (int i = 0; i < 64; i++) EXPECT(b[i] == (float)i);
  NCCL_OK(ncclCommDestroy(comm));
}

TEST_T(cuda, mixed_or_host_stream_refused, 30) {
  load_fake(1);
  ncclComm_t comm = one_rank();
  static float host[64], dev[64];
  mark(dev, sizeof(dev), 1);
  EXPECT_EQ(ncclAllReduce(host, dev, 64, ncclFloat32, ncclSum, comm, NULL), ncclInvalidArgument);
  EXPECT(strstr(ncclGetLastError(comm), "host memory but recvbuff") != NULL);
  EXPECT_EQ(ncclGroupStart(), ncclSuccess); /* in a group: refused at the call, the group reports it too */
  EXPECT_EQ(ncclBroadcast(dev, host, 64, ncclFloat32, 0, comm, NULL), ncclInvalidArgument);
  EXPECT(ncclGroupEnd() != ncclSuccess);
  cudaStream_t ours;
  NCCL_OK(chorusStreamCreate(&ours));
  EXPECT_EQ(ncclAllReduce(dev, dev, 64, ncclFloat32, ncclSum, comm, ours), ncclInvalidArgument);
  EXPECT(strstr(ncclGetLastError(comm), "Chorus host stream") != NULL);
  NCCL_OK(chorusStreamDestroy(ours));
  for (int i = 0; i < 64; i++) EXPECT(dev[i] == 0.0f && host[i] == 0.0f); /* nothing written */
  NCCL_OK(ncclCommDestroy(comm));
}

/* Three thread ranks, every buffer device memory: AllGather in place, ReduceScatter, Broadcast and a
 * ring of Send/Recv in a group; closed-form results. */
#define SR 3
#define SC 1000
static float g_buf[SR][SR * SC], g_rs[SR][SC], g_p2p[SR][2][SC];

/* arg: the stream handle of rank 0 (each rank its own; NULL: the legacy stream, and the calls complete
 * before returning). Several ranks on one GPU need a stream each, as with NCCL: on one stream a rank's
 * wait for the result would hold back the next rank's input. */
static void staged_body(int rank, int nranks, ncclUniqueId id, void* arg) {
  cudaStream_t s = arg ? (cudaStream_t)((uintptr_t)arg + (uintptr_t)rank) : NULL;
#define SYNC() EXPECT_EQ(s ? cu_sync(s) : 0, 0)
  ncclComm_t comm;
  NCCL_OK(ncclCommInitRank(&comm, nranks, id, rank));
  float* ag = g_buf[rank];
  for (int i = 0; i < SC; i++) ag[rank * SC + i] = (float)(rank * SC + i);
  NCCL_OK(ncclAllGather(ag + rank * SC, ag, SC, ncclFloat32, comm, s));
  SYNC();
  for (int i = 0; i < SR * SC; i++) EXPECT(ag[i] == (float)i);
  NCCL_OK(ncclReduceScatter(ag, g_rs[rank], SC, ncclFloat32, ncclSum, comm, s));
  SYNC();
  for (int i = 0; i < SC; i++) EXPECT(g_rs[rank][i] == (float)(SR * (rank * SC + i)));
  NCCL_OK(ncclBroadcast(g_rs[rank], g_rs[rank], SC, ncclFloat32, 1, comm, s));
  SYNC();
  for (int i = 0; i < SC; i++) EXPECT(g_rs[rank][i] == (float)(SR * (SC + i)));
  for (int i = 0; i < SC; i++) g_p2p[rank][0][i] = (float)(rank * 10 + i);
  NCCL_OK(ncclGroupStart());
  NCCL_OK(ncclSend(g_p2p[rank][0], SC, ncclFloat32, (rank + 1) % nranks, comm, s));
  NCCL_OK(ncclRecv(g_p2p[rank][1], SC, ncclFloat32, (rank + nranks - 1) % nranks, comm, s));
  NCCL_OK(ncclGroupEnd());
  SYNC();
#undef SYNC
  int from = (rank + nranks - 1) % nranks;
  for (int i = 0; i < SC; i++) EXPECT(g_p2p[rank][1][i] == (float)(from * 10 + i));
  NCCL_OK(ncclCommDestroy(comm));
}

TEST_T(cuda, device_buffers_staged_3_threads, 60) {
  setenv("CHORUS_CUDA_ASYNC", "0", 1);
  load_fake(1);
  mark(g_buf, sizeof(g_buf), 1);
  mark(g_rs, sizeof(g_rs), 1);
  mark(g_p2p, sizeof(g_p2p), 1);
  rt_run_threads(SR, staged_body, NULL);
  EXPECT(copies() > 0);
}

TEST_T(cuda, device_buffers_in_stream_order_3_threads, 60) {
  load_fake(1);
  mark(g_buf, sizeof(g_buf), 1);
  mark(g_rs, sizeof(g_rs), 1);
  mark(g_p2p, sizeof(g_p2p), 1);
  rt_run_threads(SR, staged_body, (void*)(uintptr_t)0x6000);
  EXPECT(copies() > 0);
  EXPECT_EQ(syncs(), 4 * SR); /* the test's own: the library synchronised no stream */
}

TEST_T(cuda, managed_memory_waits_for_the_stream, 30) {
  load_fake(1);
  ncclComm_t comm = one_rank();
  float* a = malloc(256 * sizeof(float));
  float* b = malloc(256 * sizeof(float));
  ASSERT(a && b);
  for (int i = 0; i < 256; i++) a[i] = (float)i;
  mark(a, 256 * sizeof(float), 2);
  mark(b, 256 * sizeof(float), 2);
  EXPECT_EQ(cudrv_classify(a, NULL), CU_MEM_MANAGED);
  cudaStream_t cuda_stream = (cudaStream_t)(uintptr_t)0x5000; /* a CUDA stream: not a Chorus host stream */
  NCCL_OK(ncclAllReduce(a, b, 256, ncclFloat32, ncclSum, comm, cuda_stream));
  EXPECT_EQ(syncs(), 1); /* ordered after the stream's queued work */
  for (int i = 0; i < 256; i++) EXPECT(b[i] == (float)i);
  float h[4] = {0}, g[4];
  NCCL_OK(ncclAllReduce(h, g, 4, ncclFloat32, ncclSum, comm, cuda_stream)); /* host buffers: no sync */
  EXPECT_EQ(syncs(), 1);
  free(a), free(b);
  NCCL_OK(ncclCommDestroy(comm));
}

/* An application that loaded the driver but never initialised it has no device memory. */
TEST_T(cuda, driver_not_initialised, 30) {
  load_fake(0);
  ncclComm_t comm = one_rank();
  float a[8] = {2}, b[8];
  mark(b, sizeof(b), 1);
  EXPECT_EQ(cudrv_classify(b, NULL), CU_MEM_HOST);
  NCCL_OK(ncclAllReduce(a, b, 8, ncclFloat32, ncclSum, comm, NULL));
  EXPECT(b[0] == 2.0f);
  NCCL_OK(ncclCommDestroy(comm));
}

TEST_T(cuda, chorus_info_reports_the_driver, 30) {
  char self[PATH_MAX], cmd[PATH_MAX * 2];
  const char* dir = getenv("CHORUS_BIN_DIR");
  if (!dir || !*dir) {
    ssize_t n = readlink("/proc/self/exe", self, sizeof(self) - 1);
    self[n > 0 ? n : 0] = 0;
    char* slash = strrchr(self, '/');
    if (slash) *slash = 0;
    dir = self;
  }
  snprintf(cmd, sizeof(cmd), "CHORUS_CUDA_LIBRARY=%s %s/chorus-info --brief", CHORUS_FAKE_CUDA, dir);
  FILE* f = popen(cmd, "r");
  ASSERT(f != NULL);
  char line[1024], found[1024] = "";
  while (fgets(line, sizeof(line), f))
    if (strstr(line, "CUDA:")) snprintf(found, sizeof(found), "%s", line);
  EXPECT_EQ(pclose(f), 0);
  printf("    %s", found);
  EXPECT(strstr(found, "driver 13.0, 1 device(s): 0: Fake GPU (tests)") != NULL);
  EXPECT(strstr(found, "device buffers: through pinned host memory in CUDA stream order") != NULL);
}

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* NCCL's stream semantics: the call returns at once; it reads what a kernel queued before it writes,
 * and work queued after it reads its result. */
TEST_T(cuda, returns_at_once_in_stream_order, 30) {
  load_fake(1);
  ncclComm_t comm = one_rank();
  static float a[4096], b[4096], seen[4096];
  mark(a, sizeof(a), 1);
  mark(b, sizeof(b), 1);
  cudaStream_t s = (cudaStream_t)(uintptr_t)0x7000;
  for (int iter = 0; iter < 3; iter++) {
    EXPECT_EQ(fill(s, a, 4096, (float)(iter + 3), 300), 0); /* a kernel: 300 ms, then writes a */
    double t0 = now_s();
    NCCL_OK(ncclAllReduce(a, b, 4096, ncclFloat32, ncclSum, comm, s));
    double took = now_s() - t0;
    EXPECT(took < 0.15);
    EXPECT_EQ(copy_on(s, seen, b, sizeof(b)), 0); /* work queued after the call */
    EXPECT_EQ(cu_sync(s), 0);
    for (int i = 0; i < 4096; i++) EXPECT(seen[i] == (float)(iter + 3));
    if (iter == 0) printf("    returned after %.1f ms; the kernel before it takes 300 ms\n", took * 1e3);
  }
  EXPECT_EQ(ctx_depth(), 0);
  EXPECT_EQ(syncs(), 3); /* the test's own */
  EXPECT_EQ(host_allocs(), 2); /* the flag and one staging block, reused */
  NCCL_OK(ncclCommDestroy(comm));
  EXPECT_EQ(host_allocs(), 0);
}

/* A group over two streams starts after the work queued on both, and work queued later on either
 * stream sees every result of the group. */
TEST_T(cuda, group_of_two_streams, 30) {
  load_fake(1);
  ncclComm_t comm = one_rank();
  static float a[256], b[256], c[256], d[256], seen[256];
  mark(a, sizeof(a), 1), mark(b, sizeof(b), 1), mark(c, sizeof(c), 1), mark(d, sizeof(d), 1);
  cudaStream_t s1 = (cudaStream_t)(uintptr_t)0x7100, s2 = (cudaStream_t)(uintptr_t)0x7200;
  EXPECT_EQ(fill(s1, a, 256, 5.0f, 200), 0);
  EXPECT_EQ(fill(s2, c, 256, 7.0f, 50), 0);
  NCCL_OK(ncclGroupStart());
  NCCL_OK(ncclAllReduce(a, b, 256, ncclFloat32, ncclMax, comm, s1));
  NCCL_OK(ncclBroadcast(c, d, 256, ncclFloat32, 0, comm, s2));
  NCCL_OK(ncclGroupEnd());
  EXPECT_EQ(copy_on(s2, seen, b, sizeof(b)), 0); /* s1's result, read in s2's order */
  EXPECT_EQ(cu_sync(s2), 0);
  for (int i = 0; i < 256; i++) EXPECT(seen[i] == 5.0f);
  EXPECT_EQ(cu_sync(s1), 0);
  for (int i = 0; i < 256; i++) EXPECT(d[i] == 7.0f && b[i] == 5.0f);
  NCCL_OK(ncclCommDestroy(comm));
}

/* A caller that runs ahead of its stream: once CHORUS_CUDA_STAGING_MAX_BYTES of pinned blocks are
 * queued (here two), the next call waits for one to come back and still returns before the stream
 * runs it (it used to complete before returning, through malloc'd copies); a group whose calls need
 * more than that waits for none of its own blocks: it completes before returning. */
TEST_T(cuda, calls_ahead_of_the_stream_wait_for_pinned_memory, 30) {
  setenv("CHORUS_CUDA_STAGING_MAX_BYTES", "131072", 1); /* two 64 KiB blocks */
  load_fake(1);
  ncclComm_t comm = one_rank();
  enum { N = 2048, CALLS = 6 };
  static float a[CALLS][N], b[CALLS][N];
  mark(a, sizeof(a), 1), mark(b, sizeof(b), 1);
  cudaStream_t s = (cudaStream_t)(uintptr_t)0x7c00;
  for (int c = 0; c < CALLS; c++) EXPECT_EQ(fill(s, a[c], N, (float)(c + 1), c == 0 ? 200 : 0), 0);
  double t0 = now_s();
  for (int c = 0; c < CALLS; c++) NCCL_OK(ncclAllReduce(a[c], b[c], N, ncclFloat32, ncclSum, comm, s));
  double took = now_s() - t0;
  EXPECT(took >= 0.15); /* the third call waited for the first, behind the 200 ms kernel */
  /* the flag and two blocks, and perhaps one block given back that the reaper frees once the stream
   * is idle (a block that came back just as a call looked may be given back for a new one) */
  EXPECT(host_allocs() == 3 || host_allocs() == 4);
  EXPECT_EQ(cu_sync(s), 0);
  for (int i = 0; i < 500 && host_allocs() > 3; i++) usleep(10 * 1000);
  for (int c = 0; c < CALLS; c++)
    for (int i = 0; i < N; i++) EXPECT(b[c][i] == (float)(c + 1));
  EXPECT_EQ(fill(s, a[0], N, 9.0f, 100), 0);
  NCCL_OK(ncclGroupStart()); /* three calls of one group: no third block, none waited for */
  for (int c = 0; c < 3; c++) NCCL_OK(ncclAllReduce(a[c], b[c], N, ncclFloat32, ncclMax, comm, s));
  NCCL_OK(ncclGroupEnd());
  EXPECT_EQ(host_allocs(), 3);
  EXPECT_EQ(cu_sync(s), 0);
  for (int i = 0; i < N; i++) EXPECT(b[0][i] == 9.0f && b[1][i] == 2.0f && b[2][i] == 3.0f);
  printf("    6 calls issued in %.0f ms behind a 200 ms kernel\n", took * 1e3);
  NCCL_OK(ncclCommDestroy(comm));
  EXPECT_EQ(host_allocs(), 0);
  unsetenv("CHORUS_CUDA_STAGING_MAX_BYTES");
}

/* cuMemFreeHost waits for the whole device (the stand-in's does too). Rank 1's
 * call needs a bigger block than its pool has room for beside an idle one, which it gives back;
 * rank 0's stream is then waiting for rank 1's input, which rank 1 queues only after that free:
 * freed on rank 1's thread, the free and the stream waited for each other for ever. */
enum { FREE_N = 16384 }; /* 64 KiB of floats: one block; twice that fills the pool */
static float g_fr[2][2 * FREE_N];
static int g_fr_issued;
static void free_body(int rank, int nranks, ncclUniqueId id, void* arg) {
  (void)arg;
  cudaStream_t s = (cudaStream_t)(uintptr_t)(0x8800 + rank);
  ncclComm_t comm;
  NCCL_OK(ncclCommInitRank(&comm, nranks, id, rank));
  float* x = g_fr[rank];
  for (int i = 0; i < 2 * FREE_N; i++) x[i] = (float)(rank + 1);
  NCCL_OK(ncclAllReduce(x, x, FREE_N, ncclFloat32, ncclSum, comm, s)); /* one 64 KiB block, idle after */
  EXPECT_EQ(cu_sync(s), 0);
  if (rank == 1)
    while (!__atomic_load_n(&g_fr_issued, __ATOMIC_ACQUIRE)) usleep(1000);
  if (rank == 1) usleep(100 * 1000); /* rank 0's stream now waits for rank 1's input */
  NCCL_OK(ncclAllReduce(x, x, 2 * FREE_N, ncclFloat32, ncclSum, comm, s)); /* a 128 KiB block */
  if (rank == 0) __atomic_store_n(&g_fr_issued, 1, __ATOMIC_RELEASE);
  EXPECT_EQ(cu_sync(s), 0);
  for (int i = 0; i < FREE_N; i++) EXPECT(x[i] == 6.0f);
  for (int i = FREE_N; i < 2 * FREE_N; i++) EXPECT(x[i] == 3.0f);
  NCCL_OK(ncclCommDestroy(comm));
}

TEST_T(cuda, pinned_memory_is_not_freed_by_a_rank_a_stream_waits_for, 30) {
  setenv("CHORUS_CUDA_STAGING_MAX_BYTES", "131072", 1);
  load_fake(1);
  mark(g_fr, sizeof(g_fr), 1);
  rt_run_threads(2, free_body, NULL);
  EXPECT_EQ(host_allocs_settled(), 0);
}

struct waiting_call {
  ncclComm_t comm;
  float* buf;
  cudaStream_t s;
  ncclResult_t rc;
  int done;
};
static void* issue_one(void* arg) {
  struct waiting_call* w = arg;
  w->rc = ncclAllReduce(w->buf, w->buf, 256, ncclFloat32, ncclSum, w->comm, w->s);
  __atomic_store_n(&w->done, 1, __ATOMIC_RELEASE);
  return NULL;
}

/* A one-rank comm whose pinned memory (CHORUS_CUDA_STAGING_MAX_BYTES: two 64 KiB blocks) is held by
 * two calls on a stream stuck before them; a[2] is for a third. */
static ncclComm_t stuck_pool(float (*a)[256], cudaStream_t s, int* release) {
  setenv("CHORUS_CUDA_STAGING_MAX_BYTES", "131072", 1);
  load_fake(1);
  ncclComm_t comm = one_rank();
  mark(a, 3 * sizeof(a[0]), 1);
  EXPECT_EQ(hold(s, release), 0);
  NCCL_OK(ncclAllReduce(a[0], a[0], 256, ncclFloat32, ncclSum, comm, s));
  NCCL_OK(ncclAllReduce(a[1], a[1], 256, ncclFloat32, ncclSum, comm, s));
  return comm;
}

/* A call waiting for a pinned block that a stuck stream holds returns when the comm is aborted. */
TEST_T(cuda, abort_while_waiting_for_a_block, 30) {
  static float a[3][256];
  static int release;
  cudaStream_t s = (cudaStream_t)(uintptr_t)0x7d00;
  ncclComm_t comm = stuck_pool(a, s, &release);
  struct waiting_call w = {comm, a[2], s, ncclSuccess, 0};
  pthread_t th;
  ASSERT(pthread_create(&th, NULL, issue_one, &w) == 0);
  usleep(200000);
  EXPECT_EQ(__atomic_load_n(&w.done, __ATOMIC_ACQUIRE), 0); /* waiting for a block */
  double t0 = now_s();
  NCCL_OK(ncclCommAbort(comm));
  EXPECT(now_s() - t0 < 2.0);
  pthread_join(th, NULL);
  EXPECT(w.rc != ncclSuccess);
  __atomic_store_n(&release, 1, __ATOMIC_RELEASE);
  EXPECT_EQ(cu_sync(s), 0);
  ncclComm_t other = one_rank(); /* its teardown frees what the aborted comm left to the stream */
  NCCL_OK(ncclCommDestroy(other));
}

/* ... and when the communicator fails meanwhile (here: the stuck stream's call times out). */
TEST_T(cuda, comm_failure_ends_the_wait_for_a_block, 30) {
  setenv("CHORUS_TIMEOUT", "1", 1);
  static float a[3][256];
  static int release;
  cudaStream_t s = (cudaStream_t)(uintptr_t)0x7f00;
  ncclComm_t comm = stuck_pool(a, s, &release);
  double t0 = now_s();
  EXPECT(ncclAllReduce(a[2], a[2], 256, ncclFloat32, ncclSum, comm, s) == ncclTimeout);
  EXPECT(now_s() - t0 < 5.0);
  __atomic_store_n(&release, 1, __ATOMIC_RELEASE);
  EXPECT_EQ(cu_sync(s), 0);
  NCCL_OK(ncclCommAbort(comm));
}

/* An abort from another thread while a staged call waits in this thread's open group: the group's
 * end drops it and hands its pinned block back to a pool the group's reference kept alive. */
static void* abort_comm(void* arg) {
  ncclCommAbort((ncclComm_t)arg);
  return NULL;
}
TEST_T(cuda, abort_during_open_group_with_a_staged_call, 30) {
  load_fake(1);
  ncclComm_t comm = one_rank();
  static float a[256];
  mark(a, sizeof(a), 1);
  cudaStream_t s = (cudaStream_t)(uintptr_t)0x7f80;
  NCCL_OK(ncclGroupStart());
  NCCL_OK(ncclAllReduce(a, a, 256, ncclFloat32, ncclSum, comm, s));
  pthread_t th;
  ASSERT(pthread_create(&th, NULL, abort_comm, comm) == 0);
  pthread_join(th, NULL);
  EXPECT(ncclGroupEnd() != ncclSuccess);
  EXPECT_EQ(cu_sync(s), 0);
  EXPECT_EQ(host_allocs_settled(), 0); /* the pool went with the group's last reference */
}

/* Two process ranks, each with a stream: AllReduce in place, many times (staging memory reused). */
static void procs_body(int rank, int nranks, ncclUniqueId id, void* arg) {
  (void)arg;
  load_fake(1);
  static float x[10000];
  mark(x, sizeof(x), 1);
  ncclComm_t comm;
  NCCL_OK(ncclCommInitRank(&comm, nranks, id, rank));
  cudaStream_t s = (cudaStream_t)(uintptr_t)(0x8000 + rank);
  for (int iter = 0; iter < 20; iter++) {
    EXPECT_EQ(fill(s, x, 10000, (float)(rank + iter), rank ? 5 : 0), 0);
    NCCL_OK(ncclAllReduce(x, x, 10000, ncclFloat32, ncclSum, comm, s));
  }
  EXPECT_EQ(cu_sync(s), 0);
  float want = 0;
  for (int r = 0; r < nranks; r++) want += (float)(r + 19);
  for (int i = 0; i < 10000; i++) EXPECT(x[i] == want);
  int allocs = host_allocs(); /* one block per call in flight (up to 20) and the flag */
  EXPECT(allocs >= 2 && allocs <= 21);
  for (int iter = 0; iter < 20; iter++) { /* one call in flight at a time: no new block */
    NCCL_OK(ncclAllReduce(x, x, 10000, ncclFloat32, ncclMin, comm, s));
    EXPECT_EQ(cu_sync(s), 0);
  }
  EXPECT_EQ(host_allocs(), allocs);
  for (int i = 0; i < 10000; i++) EXPECT(x[i] == want);
  NCCL_OK(ncclCommDestroy(comm));
}

TEST_T(cuda, in_stream_order_2_procs, 60) { rt_run_procs(2, procs_body, NULL); }

/* A group of device and host buffers completes before returning (host buffers have no stream order). */
TEST_T(cuda, group_with_host_buffers_completes_at_once, 30) {
  load_fake(1);
  ncclComm_t comm = one_rank();
  static float a[64], b[64];
  float h[64], g[64];
  mark(a, sizeof(a), 1), mark(b, sizeof(b), 1);
  for (int i = 0; i < 64; i++) a[i] = 2.0f, h[i] = 3.0f;
  cudaStream_t s = (cudaStream_t)(uintptr_t)0x7300;
  NCCL_OK(ncclGroupStart());
  NCCL_OK(ncclAllReduce(a, b, 64, ncclFloat32, ncclSum, comm, s));
  NCCL_OK(ncclAllReduce(h, g, 64, ncclFloat32, ncclSum, comm, NULL));
  NCCL_OK(ncclGroupEnd());
  for (int i = 0; i < 64; i++) EXPECT(b[i] == 2.0f && g[i] == 3.0f);
  NCCL_OK(ncclCommDestroy(comm));
}

/* Calls through host memory are captured asynchronously (test_cuda_stage_graph.c): with
 * CHORUS_CUDA_ASYNC=0 the capture is refused by name, and the stream works on after. */
TEST_T(cuda, graph_capture_refused_when_synchronous, 30) {
  setenv("CHORUS_CUDA_ASYNC", "0", 1);
  load_fake(1);
  ncclComm_t comm = one_rank();
  static float a[64];
  mark(a, sizeof(a), 1);
  cudaStream_t s = (cudaStream_t)(uintptr_t)0x7400;
  set_capturing(s, 1);
  EXPECT_EQ(ncclAllReduce(a, a, 64, ncclFloat32, ncclSum, comm, s), ncclInvalidUsage);
  EXPECT(strstr(ncclGetLastError(comm), "captured into a CUDA graph") != NULL);
  EXPECT(strstr(ncclGetLastError(comm), "CHORUS_CUDA_ASYNC=0") != NULL);
  set_capturing(s, 0);
  NCCL_OK(ncclAllReduce(a, a, 64, ncclFloat32, ncclSum, comm, s));
  EXPECT_EQ(cu_sync(s), 0);
  NCCL_OK(ncclCommDestroy(comm));
}

/* ncclCommAbort never waits for a stream stuck before the call; the stream, let go later, finishes
 * without touching freed memory (ASan runs this too). */
TEST_T(cuda, abort_with_a_stuck_stream, 30) {
  load_fake(1);
  ncclComm_t comm = one_rank();
  static float a[1024];
  static int release;
  mark(a, sizeof(a), 1);
  cudaStream_t s = (cudaStream_t)(uintptr_t)0x7500;
  EXPECT_EQ(hold(s, &release), 0); /* a kernel that never ends until we say so */
  NCCL_OK(ncclAllReduce(a, a, 1024, ncclFloat32, ncclSum, comm, s));
  double t0 = now_s();
  NCCL_OK(ncclCommAbort(comm));
  EXPECT(now_s() - t0 < 2.0);
  __atomic_store_n(&release, 1, __ATOMIC_RELEASE);
  EXPECT_EQ(cu_sync(s), 0);
}

/* ncclMemAlloc: device memory for a thread with a current CUDA context (nccl-tests built on CUDA's
 * nccl.h), host memory otherwise; CHORUS_MEM_ALLOC_DEVICE=0 keeps host memory. */
TEST_T(cuda, mem_alloc_follows_the_current_context, 30) {
  load_fake(1);
  void* h = NULL;
  NCCL_OK(ncclMemAlloc(&h, 4096));
  EXPECT_EQ(cudrv_classify(h, NULL), CU_MEM_HOST);
  void* dh = dlopen(CHORUS_FAKE_CUDA, RTLD_NOW | RTLD_NOLOAD);
  ASSERT(dh != NULL);
  int (*push)(void*) = (int (*)(void*))dlsym(dh, "cuCtxPushCurrent_v2");
  int (*pop)(void**) = (int (*)(void**))dlsym(dh, "cuCtxPopCurrent_v2");
  int (*attr)(void*, int, uintptr_t) = (int (*)(void*, int, uintptr_t))dlsym(dh, "cuPointerGetAttribute");
  void* ctx = NULL;
  static char probe[64];
  mark(probe, sizeof(probe), 1);
  EXPECT_EQ(attr(&ctx, 1, (uintptr_t)probe), 0); /* the fake's one context */
  EXPECT_EQ(push(ctx), 0);
  void* d = NULL;
  NCCL_OK(ncclMemAlloc(&d, 1 << 20));
  EXPECT_EQ(cudrv_classify(d, NULL), CU_MEM_DEVICE);
  void* popped;
  EXPECT_EQ(pop(&popped), 0);
  ncclComm_t comm = one_rank(); /* and it works as a collective's buffer */
  cudaStream_t s = (cudaStream_t)(uintptr_t)0x7600;
  EXPECT_EQ(fill(s, d, 1024, 4.0f, 0), 0);
  NCCL_OK(ncclAllReduce(d, d, 1024, ncclFloat32, ncclSum, comm, s));
  EXPECT_EQ(cu_sync(s), 0);
  EXPECT(((float*)d)[1023] == 4.0f);
  NCCL_OK(ncclCommDestroy(comm));
  NCCL_OK(ncclMemFree(d)); /* freed in its own context: this thread has none now */
  EXPECT_EQ(cudrv_classify(d, NULL), CU_MEM_HOST);
  NCCL_OK(ncclMemFree(h));
  setenv("CHORUS_MEM_ALLOC_DEVICE", "0", 1);
  param_reset();
  EXPECT_EQ(push(ctx), 0);
  NCCL_OK(ncclMemAlloc(&h, 4096));
  EXPECT_EQ(cudrv_classify(h, NULL), CU_MEM_HOST);
  NCCL_OK(ncclMemFree(h));
  EXPECT_EQ(pop(&popped), 0);
}
/* A peer process dies before a call on device buffers: the call returned at once, so the failure
 * reaches the survivor through ncclCommGetAsyncError, and its stream still runs on (the flag is
 * written when the plan fails), never hangs. */
static void dead_peer_body(int rank, int nranks, ncclUniqueId id, void* arg) {
  (void)arg;
  load_fake(1);
  static float x[4096];
  mark(x, sizeof(x), 1);
  ncclComm_t comm;
  NCCL_OK(ncclCommInitRank(&comm, nranks, id, rank));
  cudaStream_t s = (cudaStream_t)(uintptr_t)(0x9000 + rank);
  NCCL_OK(ncclAllReduce(x, x, 4096, ncclFloat32, ncclSum, comm, s));
  EXPECT_EQ(cu_sync(s), 0);
  if (rank == 1) _exit(0); /* gone, without a word to anyone */
  double t0 = now_s();
  NCCL_OK(ncclAllReduce(x, x, 4096, ncclFloat32, ncclSum, comm, s)); /* returns at once */
  EXPECT_EQ(cu_sync(s), 0);
  ncclResult_t as = ncclSuccess;
  NCCL_OK(ncclCommGetAsyncError(comm, &as));
  printf("    rank 0: stream done after %.2f s, async error %d: %.200s\n", now_s() - t0, (int)as, ncclGetLastError(comm));
  EXPECT_EQ(as, ncclRemoteError);
  EXPECT(now_s() - t0 < 10.0);
  NCCL_OK(ncclCommAbort(comm));
}

TEST_T(cuda, peer_dies_during_a_stream_call, 60) { rt_run_procs(2, dead_peer_body, NULL); }

/* PreMulSum with its scalar in device memory (ncclScalarDevice, as PyTorch passes a tensor factor):
 * copied from the device, never dereferenced on the host. */
TEST_T(cuda, premulsum_scalar_in_device_memory, 30) {
  load_fake(1);
  ncclComm_t comm = one_rank();
  static float scalar = 3.0f, a[64];
  mark(&scalar, sizeof(scalar), 1);
  mark(a, sizeof(a), 1);
  for (int i = 0; i < 64; i++) a[i] = (float)i;
  ncclRedOp_t op;
  int before = copies();
  NCCL_OK(ncclRedOpCreatePreMulSum(&op, &scalar, ncclFloat32, ncclScalarDevice, comm));
  EXPECT_EQ(copies(), before + 1);
  cudaStream_t s = (cudaStream_t)(uintptr_t)0x7700;
  NCCL_OK(ncclAllReduce(a, a, 64, ncclFloat32, op, comm, s));
  EXPECT_EQ(cu_sync(s), 0);
  for (int i = 0; i < 64; i++) EXPECT(a[i] == 3.0f * (float)i);
  NCCL_OK(ncclRedOpDestroy(op, comm));
  NCCL_OK(ncclCommDestroy(comm));
}
/* A group over two streams, one stuck: the abort fails the group without waiting; the stuck stream,
 * let go later, still finds its gate (each stream's arrival holds a reference) and its memory. */
TEST_T(cuda, abort_with_one_of_two_streams_stuck, 30) {
  load_fake(1);
  ncclComm_t comm = one_rank();
  static float a[256], b[256];
  static int release;
  mark(a, sizeof(a), 1), mark(b, sizeof(b), 1);
  cudaStream_t s1 = (cudaStream_t)(uintptr_t)0x7800, s2 = (cudaStream_t)(uintptr_t)0x7900;
  EXPECT_EQ(hold(s2, &release), 0);
  NCCL_OK(ncclGroupStart());
  NCCL_OK(ncclAllReduce(a, a, 256, ncclFloat32, ncclSum, comm, s1));
  NCCL_OK(ncclAllReduce(b, b, 256, ncclFloat32, ncclSum, comm, s2));
  NCCL_OK(ncclGroupEnd());
  double t0 = now_s();
  NCCL_OK(ncclCommAbort(comm));
  EXPECT(now_s() - t0 < 2.0);
  EXPECT_EQ(cu_sync(s1), 0); /* the first stream runs on: the flag was written */
  __atomic_store_n(&release, 1, __ATOMIC_RELEASE);
  EXPECT_EQ(cu_sync(s2), 0);
  ncclComm_t other = one_rank(); /* its teardown frees what the aborted comm left to the streams */
  NCCL_OK(ncclCommDestroy(other));
}

/* A stream that never reaches the call fails it after CHORUS_TIMEOUT, through the async error. */
TEST_T(cuda, stream_never_reaching_the_call_times_out, 30) {
  setenv("CHORUS_TIMEOUT", "1", 1);
  load_fake(1);
  ncclComm_t comm = one_rank();
  static float a[256];
  static int release;
  mark(a, sizeof(a), 1);
  cudaStream_t s = (cudaStream_t)(uintptr_t)0x7a00;
  EXPECT_EQ(hold(s, &release), 0);
  NCCL_OK(ncclAllReduce(a, a, 256, ncclFloat32, ncclSum, comm, s));
  ncclResult_t as = ncclSuccess;
  double t0 = now_s();
  while (as == ncclSuccess && now_s() - t0 < 5) {
    NCCL_OK(ncclCommGetAsyncError(comm, &as));
    usleep(10000);
  }
  EXPECT_EQ(as, ncclTimeout);
  EXPECT(strstr(ncclGetLastError(comm), "CUDA stream to reach it") != NULL);
  __atomic_store_n(&release, 1, __ATOMIC_RELEASE);
  EXPECT_EQ(cu_sync(s), 0);
  NCCL_OK(ncclCommAbort(comm));
}

/* ncclGroupSimulateEnd runs nothing: device buffers are left alone. */
TEST_T(cuda, simulated_group_copies_nothing_back, 30) {
  load_fake(1);
  ncclComm_t comm = one_rank();
  static float a[64], b[64];
  mark(a, sizeof(a), 1), mark(b, sizeof(b), 1);
  for (int i = 0; i < 64; i++) a[i] = 1.0f, b[i] = -1.0f;
  ncclSimInfo_t sim = NCCL_SIM_INFO_INITIALIZER;
  cudaStream_t s = (cudaStream_t)(uintptr_t)0x7b00;
  NCCL_OK(ncclGroupStart());
  NCCL_OK(ncclAllReduce(a, b, 64, ncclFloat32, ncclSum, comm, s));
  NCCL_OK(ncclGroupSimulateEnd(&sim));
  EXPECT_EQ(cu_sync(s), 0);
  for (int i = 0; i < 64; i++) EXPECT(b[i] == -1.0f);
  NCCL_OK(ncclCommDestroy(comm));
}

TEST_T(cuda, device_alloc_without_a_driver, 30) {
  setenv("CHORUS_CUDA_LIBRARY", "libchorus-no-such-driver.so", 1);
  setenv("CHORUS_MEM_ALLOC_DEVICE", "1", 1);
  param_reset();
  void* p = (void*)1;
  EXPECT_EQ(ncclMemAlloc(&p, 4096), ncclInvalidUsage);
  EXPECT(p == NULL);
  EXPECT(strstr(ncclGetLastError(NULL), "no CUDA driver") != NULL);
}
