/* Ranks that share one GPU (gpu/gpu.h): calls on device buffers run there, kernels reading and
 * writing the peers' buffers (CUDA IPC between processes), ordered by stream memory operations. The
 * stand-in driver (cuda_stub/fake_cuda.c) runs the kernels on the CPU with the library's element-wise
 * code, its device memory is a memfd that another process maps as CUDA IPC would, and its streams
 * are threads; so these tests check the orchestration, the job each rank runs and the checks of what
 * peers send, not the CUDA code itself (every_collective_real_gpu does, where a GPU is). */
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
#include "runner.h"

static struct {
  int (*init)(unsigned);
  int (*retain)(void**, int);
  int (*set)(void*);
  int (*alloc)(uintptr_t*, size_t);
  int (*free)(uintptr_t);
  int (*sync)(void*);
  int (*kernels)(void);
  int (*hold)(void*, int*);
  int (*copy)(void*, void*, const void*, size_t);
  void (*mark)(const void*, size_t, int);
  int (*registered)(void);
  int (*stage_runs)(void);
  int (*destroy)(void*);
  void (*begin_capture)(void*);
  void* (*end_capture)(void*);
  int (*graph_launch)(void*, void*);
  int (*graph_ops)(void*);
  void (*graph_destroy)(void*);
} fk;

/* A build without nvcc has no kernels: every device buffer goes through host memory then. */
static int no_kernels(void) {
  size_t bytes = 0;
  if (cudev_fatbin(&bytes) && bytes) return 0;
  printf("    SKIP: this build has no device kernels (no nvcc found)\n");
  return 1;
}

static void load(void) {
  void* h = dlopen(CHORUS_FAKE_CUDA, RTLD_NOW | RTLD_GLOBAL);
  ASSERT(h != NULL);
  *(void**)&fk.init = dlsym(h, "cuInit");
  *(void**)&fk.retain = dlsym(h, "cuDevicePrimaryCtxRetain");
  *(void**)&fk.set = dlsym(h, "cuCtxSetCurrent");
  *(void**)&fk.alloc = dlsym(h, "cuMemAlloc_v2");
  *(void**)&fk.free = dlsym(h, "cuMemFree_v2");
  *(void**)&fk.sync = dlsym(h, "cuStreamSynchronize");
  *(void**)&fk.kernels = dlsym(h, "fake_cuda_kernels");
  *(void**)&fk.hold = dlsym(h, "fake_cuda_hold");
  *(void**)&fk.copy = dlsym(h, "fake_cuda_copy");
  *(void**)&fk.mark = dlsym(h, "fake_cuda_mark");
  *(void**)&fk.registered = dlsym(h, "fake_cuda_registered");
  *(void**)&fk.destroy = dlsym(h, "cuStreamDestroy_v2");
  *(void**)&fk.stage_runs = dlsym(h, "fake_cuda_stage_runs");
  *(void**)&fk.begin_capture = dlsym(h, "fake_cuda_begin_capture");
  *(void**)&fk.end_capture = dlsym(h, "fake_cuda_end_capture");
  *(void**)&fk.graph_launch = dlsym(h, "fake_cuda_graph_launch");
  *(void**)&fk.graph_ops = dlsym(h, "fake_cuda_graph_ops");
  *(void**)&fk.graph_destroy = dlsym(h, "fake_cuda_graph_destroy");
  ASSERT(fk.init && fk.retain && fk.set && fk.alloc && fk.free && fk.sync && fk.kernels && fk.hold && fk.copy && fk.mark &&
         fk.registered && fk.stage_runs && fk.begin_capture && fk.end_capture && fk.graph_launch && fk.graph_ops && fk.graph_destroy);
  EXPECT_EQ(fk.init(0), 0);
  setenv("CHORUS_CUDA_LIBRARY", CHORUS_FAKE_CUDA, 1);
  param_reset();
}

/* As a CUDA application's rank: the device's primary context current on this thread. */
static void set_device(void) {
  void* ctx = NULL;
  ASSERT(fk.retain(&ctx, 0) == 0);
  ASSERT(fk.set(ctx) == 0);
}

/* A rank of a CUDA application: its device current, its communicator made, and (base != 0) a stream
 * of its own, base + 0x10 * rank. */
static ncclComm_t open_rank(int rank, int nranks, ncclUniqueId id, uintptr_t base, cudaStream_t* s) {
  set_device();
  ncclComm_t comm;
  NCCL_OK(ncclCommInitRank(&comm, nranks, id, rank));
  if (s) *s = (cudaStream_t)(base + 0x10 * (uintptr_t)rank);
  return comm;
}

static float* dev_alloc(size_t n) {
  uintptr_t d = 0;
  ASSERT(fk.alloc(&d, n * sizeof(float)) == 0);
  return (float*)d;
}

/* The communicator's asynchronous error, once one is set (up to 5 s). */
static ncclResult_t async_error(ncclComm_t comm) {
  ncclResult_t as = ncclSuccess;
  for (int i = 0; i < 500 && as == ncclSuccess; i++) {
    NCCL_OK(ncclCommGetAsyncError(comm, &as));
    if (as == ncclSuccess) usleep(10000);
  }
  return as;
}

/* Every rank finds the failure itself (want, saying `why`), unless a peer's report reaches it first
 * (through the shared page: ncclRemoteError). */
static void expect_failed(ncclComm_t comm, ncclResult_t want, const char* why) {
  ncclResult_t as = async_error(comm);
  EXPECT(as == want || as == ncclRemoteError);
  EXPECT(strstr(ncclGetLastError(comm), as == want ? why : "failed this communicator") != NULL);
}

#define N 1000 /* not a multiple of the ranks: AllReduce's shares are uneven */

/* Every collective that runs on the GPU, out of place and in place, on a stream per rank, results
 * read after the stream; expected values in closed form. */
static void five_body(int rank, int nranks, ncclUniqueId id, void* arg) {
  (void)arg;
  cudaStream_t s;
  ncclComm_t comm = open_rank(rank, nranks, id, 0x7000, &s);
  float *a = dev_alloc((size_t)N * nranks), *b = dev_alloc((size_t)N * nranks);
  for (int i = 0; i < N * nranks; i++) a[i] = (float)(rank + i), b[i] = -1;
  float sum_r = (float)(nranks * (nranks - 1) / 2);
  /* AllReduce, out of place then in place */
  NCCL_OK(ncclAllReduce(a, b, N, ncclFloat32, ncclSum, comm, s));
  ASSERT_EQ(fk.sync(s), 0);
  for (int i = 0; i < N; i++) EXPECT(b[i] == sum_r + (float)(nranks * i));
  NCCL_OK(ncclAllReduce(a, a, N, ncclFloat32, ncclMax, comm, s));
  ASSERT_EQ(fk.sync(s), 0);
  for (int i = 0; i < N; i++) EXPECT(a[i] == (float)(nranks - 1 + i));
  /* AllGather in place: my block sits at rank * N */
  for (int i = 0; i < N; i++) a[rank * N + i] = (float)(rank * 1000 + i);
  NCCL_OK(ncclAllGather(a + rank * N, a, N, ncclFloat32, comm, s));
  ASSERT_EQ(fk.sync(s), 0);
  for (int r = 0; r < nranks; r++)
    for (int i = 0; i < N; i++) EXPECT(a[r * N + i] == (float)(r * 1000 + i));
  /* ReduceScatter out of place: block r of the sum of every rank's a (equal on all ranks) */
  NCCL_OK(ncclReduceScatter(a, b, N, ncclFloat32, ncclSum, comm, s));
  ASSERT_EQ(fk.sync(s), 0);
  for (int i = 0; i < N; i++) EXPECT(b[i] == (float)(nranks * (rank * 1000 + i)));
  /* Broadcast from the last rank, out of place */
  for (int i = 0; i < N; i++) a[i] = (float)(rank * 7 + i);
  NCCL_OK(ncclBroadcast(a, b, N, ncclFloat32, nranks - 1, comm, s));
  ASSERT_EQ(fk.sync(s), 0);
  for (int i = 0; i < N; i++) EXPECT(b[i] == (float)((nranks - 1) * 7 + i));
  /* Reduce to rank 0, in place at the root: non-roots' recvbuff is not touched */
  for (int i = 0; i < N; i++) b[i] = -5;
  NCCL_OK(ncclReduce(a, rank == 0 ? a : b, N, ncclFloat32, ncclSum, 0, comm, s));
  ASSERT_EQ(fk.sync(s), 0);
  for (int i = 0; i < N; i++) EXPECT(rank == 0 ? a[i] == (float)(7 * nranks * (nranks - 1) / 2 + nranks * i) : b[i] == -5);
  /* Avg of integers (SumPostDiv) and a per-rank PreMulSum scalar */
  int32_t* ia = (int32_t*)a;
  for (int i = 0; i < N; i++) ia[i] = rank * 4 + i;
  NCCL_OK(ncclAllReduce(ia, ia, N, ncclInt32, ncclAvg, comm, s));
  ASSERT_EQ(fk.sync(s), 0);
  for (int i = 0; i < N; i++) EXPECT(ia[i] == (int32_t)(2 * (nranks - 1) + i));
  double scalar = (double)(rank + 1);
  ncclRedOp_t op;
  NCCL_OK(ncclRedOpCreatePreMulSum(&op, &scalar, ncclFloat64, ncclScalarHostImmediate, comm));
  double* da = (double*)a;
  for (int i = 0; i < N / 2; i++) da[i] = (double)i;
  NCCL_OK(ncclAllReduce(da, da, N / 2, ncclFloat64, op, comm, s));
  ASSERT_EQ(fk.sync(s), 0);
  double scalars = (double)(nranks * (nranks + 1) / 2);
  for (int i = 0; i < N / 2; i++) EXPECT(da[i] == scalars * i);
  NCCL_OK(ncclRedOpDestroy(op, comm));
  NCCL_OK(ncclCommDestroy(comm));
  EXPECT_EQ(fk.free((uintptr_t)a), 0);
  EXPECT_EQ(fk.free((uintptr_t)b), 0);
}

/* How the kernels run: their tables read from host memory or from the stage kernel's copy in device
 * memory (CHORUS_CUDA_STAGE_BLOCKS: "0" always, a number beyond any grid never), and each rank's
 * kernel doing its part or rank 0's doing all (CHORUS_CUDA_ONE_KERNEL); NULL: as by default. */
static void kernels_as(const char* stage_blocks, const char* one_kernel) {
  const char* names[2] = {"CHORUS_CUDA_STAGE_BLOCKS", "CHORUS_CUDA_ONE_KERNEL"};
  const char* values[2] = {stage_blocks, one_kernel};
  for (int i = 0; i < 2; i++)
    if (values[i]) setenv(names[i], values[i], 1);
    else unsetenv(names[i]);
  param_reset();
}

/* body on 1 to 4 thread ranks, each time on the GPU path (a kernel ran, not host memory), leaving no
 * host registration behind (the barrier page: registered once per process, and given back): with
 * tables read from host memory, then staged into device memory (one kernel for all ranks, the
 * default), then each rank's kernel doing its own part. */
static void on_1_to_4_threads(rt_rank_fn body) {
  for (int v = 0; v < 3; v++) {
    kernels_as(v == 0 ? "1000000" : v == 1 ? "0" : NULL, v == 2 ? "0" : NULL);
    for (int n = 1; n <= 4; n++) {
      int before = fk.kernels(), staged_before = fk.stage_runs();
      rt_run_threads(n, body, NULL);
      if (n > 1) EXPECT(fk.kernels() > before); /* one rank: copies (copy engine) or nothing (in place) */
      if (v < 2 && n > 1) EXPECT(v ? fk.stage_runs() > staged_before : fk.stage_runs() == staged_before);
      EXPECT_EQ(fk.registered(), 0);
    }
  }
  kernels_as(NULL, NULL);
}

TEST_T(cuda_gpu, five_collectives_1_to_4_threads, 120) {
  if (no_kernels()) return;
  load();
  on_1_to_4_threads(five_body);
}

TEST_T(cuda_gpu, five_collectives_2_and_3_procs, 120) {
  if (no_kernels()) return;
  load();
  rt_run_procs(2, five_body, NULL);
  kernels_as("0", "0"); /* each process's kernel its own part, from staged tables */
  rt_run_procs(3, five_body, NULL);
  kernels_as(NULL, NULL);
}

/* Ranks whose CHORUS_CUDA_ONE_KERNEL differ take rank 0's (agreed at init): rank 0 alone says arg's
 * value, the others the other one; either way every rank's part runs exactly once. */
static void one_kernel_differs_body(int rank, int nranks, ncclUniqueId id, void* arg) {
  int zero_says = *(int*)arg;
  kernels_as(NULL, (rank == 0) == zero_says ? "1" : "0");
  five_body(rank, nranks, id, NULL);
}

TEST_T(cuda_gpu, one_kernel_settings_differ, 60) {
  if (no_kernels()) return;
  load();
  for (int zero_says = 0; zero_says < 2; zero_says++) rt_run_procs(3, one_kernel_differs_body, &zero_says);
  kernels_as(NULL, NULL);
}

/* AlltoAll, Gather and Scatter on the GPU, out of place and in place (AlltoAll's pairs then swap
 * blocks between two ranks' buffers), every root. Block j of rank r's data: v(r, j, i). */
static float v3(int r, int j, int i) { return (float)(r * 100000 + j * 1000 + i); }

static void three_body(int rank, int nranks, ncclUniqueId id, void* arg) {
  (void)arg;
  cudaStream_t s;
  ncclComm_t comm = open_rank(rank, nranks, id, 0x8000, &s);
  float *a = dev_alloc((size_t)N * nranks), *b = dev_alloc((size_t)N * nranks);
  for (int inplace = 0; inplace < 2; inplace++) {
    for (int j = 0; j < nranks; j++)
      for (int i = 0; i < N; i++) a[j * N + i] = v3(rank, j, i), b[j * N + i] = -1;
    float* out = inplace ? a : b;
    NCCL_OK(ncclAlltoAll(a, out, N, ncclFloat32, comm, s));
    ASSERT_EQ(fk.sync(s), 0);
    for (int j = 0; j < nranks; j++)
      for (int i = 0; i < N; i++) EXPECT(out[j * N + i] == v3(j, rank, i));
    for (int root = 0; root < nranks; root++) {
      /* Gather: in place, the root's input is already its block of the output */
      for (int j = 0; j < nranks; j++)
        for (int i = 0; i < N; i++) b[j * N + i] = -1, a[j * N + i] = j ? -2 : v3(rank, 0, i);
      float* in = inplace && rank == root ? b + (size_t)root * N : a;
      if (in != a) memcpy(in, a, N * sizeof(float));
      NCCL_OK(ncclGather(in, b, N, ncclFloat32, root, comm, s));
      ASSERT_EQ(fk.sync(s), 0);
      for (int j = 0; rank == root && j < nranks; j++)
        for (int i = 0; i < N; i++) EXPECT(b[j * N + i] == v3(j, 0, i));
      /* Scatter: in place, the root's output is its block of the input */
      for (int j = 0; j < nranks; j++)
        for (int i = 0; i < N; i++) a[j * N + i] = v3(rank, j, i), b[j * N + i] = -1;
      float* to = inplace && rank == root ? a + (size_t)root * N : b;
      NCCL_OK(ncclScatter(a, to, N, ncclFloat32, root, comm, s));
      ASSERT_EQ(fk.sync(s), 0);
      for (int i = 0; i < N; i++) EXPECT(to[i] == v3(root, rank, i));
    }
  }
  NCCL_OK(ncclCommDestroy(comm));
  EXPECT_EQ(fk.free((uintptr_t)a), 0);
  EXPECT_EQ(fk.free((uintptr_t)b), 0);
}

TEST_T(cuda_gpu, alltoall_gather_scatter_1_to_4_threads, 120) {
  if (no_kernels()) return;
  load();
  on_1_to_4_threads(three_body);
}

TEST_T(cuda_gpu, alltoall_gather_scatter_2_to_5_procs, 120) {
  if (no_kernels()) return;
  load();
  for (int n = 2; n <= 5; n++) rt_run_procs(n, three_body, NULL); /* one kernel for all: the default */
  kernels_as(NULL, "0");                                            /* each process's kernel its part */
  rt_run_procs(3, three_body, NULL);
  kernels_as(NULL, NULL);
}

/* Send/Recv on the GPU: a ring (each rank sends to the next, receives from the previous), then every
 * rank sends a block to every rank, itself included, and two blocks more to the next rank, all in one
 * group (the pair's order matches them). Block j from rank r: v3(r, j, i). */
static void p2p_body(int rank, int nranks, ncclUniqueId id, void* arg) {
  (void)arg;
  cudaStream_t s;
  ncclComm_t comm = open_rank(rank, nranks, id, 0x9000, &s);
  int next = (rank + 1) % nranks, prev = (rank + nranks - 1) % nranks;
  size_t M = (size_t)N * (nranks + 2);
  float *a = dev_alloc(M), *b = dev_alloc(M);
  for (int i = 0; i < N; i++) a[i] = v3(rank, 0, i), b[i] = -1;
  NCCL_OK(ncclGroupStart());
  NCCL_OK(ncclSend(a, N, ncclFloat32, next, comm, s));
  NCCL_OK(ncclRecv(b, N, ncclFloat32, prev, comm, s));
  NCCL_OK(ncclGroupEnd());
  ASSERT_EQ(fk.sync(s), 0);
  for (int i = 0; i < N; i++) EXPECT(b[i] == v3(prev, 0, i));
  for (int j = 0; j < nranks + 2; j++)
    for (int i = 0; i < N; i++) a[(size_t)j * N + i] = v3(rank, j, i), b[(size_t)j * N + i] = -1;
  NCCL_OK(ncclGroupStart());
  for (int p = 0; p < nranks; p++) {
    NCCL_OK(ncclSend(a + (size_t)p * N, N, ncclFloat32, p, comm, s));
    NCCL_OK(ncclRecv(b + (size_t)p * N, N, ncclFloat32, p, comm, s));
  }
  for (int k = 0; k < 2; k++) { /* matched in order: block n + k of the previous rank into block n + k */
    NCCL_OK(ncclSend(a + (size_t)(nranks + k) * N, N, ncclFloat32, next, comm, s));
    NCCL_OK(ncclRecv(b + (size_t)(nranks + k) * N, N, ncclFloat32, prev, comm, s));
  }
  NCCL_OK(ncclGroupEnd());
  ASSERT_EQ(fk.sync(s), 0);
  for (int j = 0; j < nranks; j++)
    for (int i = 0; i < N; i++) EXPECT(b[(size_t)j * N + i] == v3(j, rank, i));
  for (int k = 0; k < 2; k++)
    for (int i = 0; i < N; i++) EXPECT(b[(size_t)(nranks + k) * N + i] == v3(prev, nranks + k, i));
  NCCL_OK(ncclCommDestroy(comm));
  EXPECT_EQ(fk.free((uintptr_t)a), 0);
  EXPECT_EQ(fk.free((uintptr_t)b), 0);
}

TEST_T(cuda_gpu, send_recv_1_to_4_threads, 120) {
  if (no_kernels()) return;
  load();
  on_1_to_4_threads(p2p_body);
}

TEST_T(cuda_gpu, send_recv_2_to_4_procs, 120) {
  if (no_kernels()) return;
  load();
  for (int n = 2; n <= 4; n++) rt_run_procs(n, p2p_body, NULL); /* the lower rank of a pair copies */
  kernels_as(NULL, "0");                                         /* each receiver copies */
  rt_run_procs(3, p2p_body, NULL);
  kernels_as(NULL, NULL);
}

/* More sends than a pair's mailbox holds (GPU_MAIL), one call each at the sender and all in one
 * group at the receiver, in both directions: the copying rank is the sender one way, the receiver
 * the other. */
#define MANY 20
static void many_sends_body(int rank, int nranks, ncclUniqueId id, void* arg) {
  (void)arg, (void)nranks;
  cudaStream_t s;
  ncclComm_t comm = open_rank(rank, nranks, id, 0x9e00, &s);
  float* a = dev_alloc((size_t)MANY * N);
  for (int dir = 0; dir < 2; dir++) {
    int sender = dir; /* rank 0 sends first (it copies), then rank 1 (rank 0 copies as the receiver) */
    for (int i = 0; i < MANY * N; i++) a[i] = rank == sender ? v3(sender, i / N, i % N) : -1;
    if (rank == sender) {
      for (int k = 0; k < MANY; k++) NCCL_OK(ncclSend(a + (size_t)k * N, N, ncclFloat32, 1 - rank, comm, s));
    } else {
      NCCL_OK(ncclGroupStart());
      for (int k = 0; k < MANY; k++) NCCL_OK(ncclRecv(a + (size_t)k * N, N, ncclFloat32, 1 - rank, comm, s));
      NCCL_OK(ncclGroupEnd());
    }
    ASSERT_EQ(fk.sync(s), 0);
    for (int i = 0; i < MANY * N; i++) EXPECT(a[i] == v3(sender, i / N, i % N));
  }
  NCCL_OK(ncclCommDestroy(comm));
  fk.free((uintptr_t)a);
}

/* Rank 0 sends, then receives, in two calls; rank 1 does both in one group (as NCCL allows): rank 0's
 * send (it copies) must not wait behind its receive's host exchange, nor rank 1's group behind it. */
static void crossed_body(int rank, int nranks, ncclUniqueId id, void* arg) {
  (void)arg;
  cudaStream_t s;
  ncclComm_t comm = open_rank(rank, nranks, id, 0x9f00, &s);
  float* a = dev_alloc(2 * (size_t)N);
  for (int i = 0; i < N; i++) a[i] = v3(rank, 0, i), a[N + i] = -1;
  if (rank == 0) {
    NCCL_OK(ncclSend(a, N, ncclFloat32, 1, comm, s));
    NCCL_OK(ncclRecv(a + N, N, ncclFloat32, 1, comm, s));
  } else {
    NCCL_OK(ncclGroupStart());
    NCCL_OK(ncclSend(a, N, ncclFloat32, 0, comm, s));
    NCCL_OK(ncclRecv(a + N, N, ncclFloat32, 0, comm, s));
    NCCL_OK(ncclGroupEnd());
  }
  ASSERT_EQ(fk.sync(s), 0);
  for (int i = 0; i < N; i++) EXPECT(a[N + i] == v3(1 - rank, 0, i));
  NCCL_OK(ncclCommDestroy(comm));
  fk.free((uintptr_t)a);
}

TEST_T(cuda_gpu, more_sends_than_the_mailbox_holds, 60) {
  if (no_kernels()) return;
  load();
  rt_run_procs(2, many_sends_body, NULL); /* processes first: no fork after the stand-in's threads */
  rt_run_procs(2, crossed_body, NULL);
  rt_run_threads(2, many_sends_body, NULL);
  rt_run_threads(2, crossed_body, NULL);
}

/* Two receives in one group, their sends in two calls at the peer: the first receive's copy must not
 * wait for the second send, which waits for it. */
static void two_sends_body(int rank, int nranks, ncclUniqueId id, void* arg) {
  (void)arg;
  cudaStream_t s;
  ncclComm_t comm = open_rank(rank, nranks, id, 0x9c00, &s);
  float* a = dev_alloc(2 * N);
  for (int i = 0; i < 2 * N; i++) a[i] = rank ? v3(1, i / N, i % N) : -1;
  if (rank == 0) {
    NCCL_OK(ncclGroupStart());
    NCCL_OK(ncclRecv(a, N, ncclFloat32, 1, comm, s));
    NCCL_OK(ncclRecv(a + N, N, ncclFloat32, 1, comm, s));
    NCCL_OK(ncclGroupEnd());
  } else {
    NCCL_OK(ncclSend(a, N, ncclFloat32, 0, comm, s));
    NCCL_OK(ncclSend(a + N, N, ncclFloat32, 0, comm, s));
  }
  ASSERT_EQ(fk.sync(s), 0);
  for (int i = 0; i < 2 * N; i++) EXPECT(a[i] == v3(1, i / N, i % N));
  NCCL_OK(ncclCommDestroy(comm));
  fk.free((uintptr_t)a);
}

TEST_T(cuda_gpu, grouped_receives_of_separate_sends, 60) {
  if (no_kernels()) return;
  load();
  rt_run_procs(2, two_sends_body, NULL);
}

/* A receive that does not match its send (another count) fails both ranks, naming both sides; no
 * stream stays blocked. */
static void p2p_mismatch_body(int rank, int nranks, ncclUniqueId id, void* arg) {
  (void)arg;
  cudaStream_t s;
  ncclComm_t comm = open_rank(rank, nranks, id, 0x9400, &s);
  float* a = dev_alloc(2 * N);
  int from = nranks - 2, to = nranks - 1; /* on 3 ranks: a pair that rank 0's process copies */
  if (rank == from) NCCL_OK(ncclSend(a, N, ncclFloat32, to, comm, s));
  else if (rank == to) NCCL_OK(ncclRecv(a, 2 * N, ncclFloat32, from, comm, s));
  ASSERT_EQ(fk.sync(s), 0);
  expect_failed(comm, ncclInvalidUsage, "does not match");
  NCCL_OK(ncclCommAbort(comm));
  fk.free((uintptr_t)a);
}

TEST_T(cuda_gpu, send_recv_mismatch_fails_both, 60) {
  if (no_kernels()) return;
  load();
  rt_run_procs(2, p2p_mismatch_body, NULL);
  rt_run_procs(3, p2p_mismatch_body, NULL);
}

/* A send whose receive never comes: CHORUS_TIMEOUT fails it, and its stream, which waits for the
 * receiver's copy, goes on. */
static void lonely_send_body(int rank, int nranks, ncclUniqueId id, void* arg) {
  (void)arg;
  cudaStream_t s;
  ncclComm_t comm = open_rank(rank, nranks, id, 0x9800, &s);
  float* a = dev_alloc(2 * N);
  NCCL_OK(ncclGroupStart()); /* connected first: the lonely send then reaches its stream */
  NCCL_OK(ncclSend(a, N, ncclFloat32, 1 - rank, comm, s));
  NCCL_OK(ncclRecv(a + N, N, ncclFloat32, 1 - rank, comm, s));
  NCCL_OK(ncclGroupEnd());
  ASSERT_EQ(fk.sync(s), 0);
  if (rank == 0) {
    ncclResult_t r = ncclSend(a, N, ncclFloat32, 1, comm, s);
    EXPECT_EQ(r, ncclSuccess);
    ASSERT_EQ(fk.sync(s), 0);
    ncclResult_t as = async_error(comm);
    EXPECT(as == ncclTimeout || as == ncclRemoteError);
  } else {
    usleep(1500000);
  }
  NCCL_OK(ncclCommAbort(comm));
  fk.free((uintptr_t)a);
}

TEST_T(cuda_gpu, send_without_receive_times_out, 60) {
  if (no_kernels()) return;
  setenv("CHORUS_TIMEOUT", "1", 1);
  load();
  rt_run_procs(2, lonely_send_body, NULL);
}

/* Where CUDA IPC between processes is refused (a sandbox), init finds it out and process ranks go
 * through host memory: same results, no kernel, no failed call. */
static void refused_body(int rank, int nranks, ncclUniqueId id, void* arg) {
  five_body(rank, nranks, id, arg);
  EXPECT_EQ(fk.kernels(), 0);
}

/* One process that cannot export its memory (its probe fails): every rank decides alike at init
 * (host memory), none waits for the others in setup. */
static void one_mute_body(int rank, int nranks, ncclUniqueId id, void* arg) {
  if (rank == 1) setenv("FAKE_CUDA_IPC_GET_REFUSED", "1", 1);
  refused_body(rank, nranks, id, arg);
}

TEST_T(cuda_gpu, one_process_without_ipc_decides_alike, 60) {
  if (no_kernels()) return;
  load();
  rt_run_procs(3, one_mute_body, NULL);
}

TEST_T(cuda_gpu, ipc_refused_goes_through_host_memory, 60) {
  if (no_kernels()) return;
  setenv("FAKE_CUDA_IPC_REFUSED", "1", 1);
  load();
  rt_run_procs(2, refused_body, NULL);
}

/* A context destroyed and made again at the same address (cudaDeviceReset) has lost the kernels
 * loaded into it: the next communicator finds out and loads them again. */
TEST_T(cuda_gpu, kernels_reloaded_into_a_new_context, 60) {
  if (no_kernels()) return;
  load();
  void* h = dlopen(CHORUS_FAKE_CUDA, RTLD_NOW | RTLD_GLOBAL);
  void (*new_ctx)(void) = (void (*)(void))dlsym(h, "fake_cuda_new_ctx");
  int (*loads)(void) = (int (*)(void))dlsym(h, "fake_cuda_module_loads");
  ASSERT(new_ctx && loads);
  rt_run_threads(2, five_body, NULL);
  int first = loads();
  rt_run_threads(2, five_body, NULL);
  EXPECT_EQ(loads(), first); /* the same context: loaded once */
  new_ctx();
  int before = fk.kernels();
  rt_run_threads(2, five_body, NULL);
  EXPECT_EQ(loads(), first + 1);
  EXPECT(fk.kernels() > before);
}

/* CHORUS_CUDA_DIRECT=0: the same calls go through host memory (no kernel runs). */
TEST_T(cuda_gpu, direct_off_goes_through_host_memory, 60) {
  setenv("CHORUS_CUDA_DIRECT", "0", 1);
  load();
  rt_run_threads(2, five_body, NULL);
  EXPECT_EQ(fk.kernels(), 0);
}

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
  float* a = dev_alloc(N);
  static int never;
  if (rank == 1) ASSERT_EQ(fk.hold(s, &never), 0); /* its stream never reaches the call */
  NCCL_OK(ncclAllReduce(a, a, N, ncclFloat32, ncclSum, comm, s));
  if (rank == 1) {
    usleep(300000); /* the exchange is done on both ranks */
    _exit(0);
  }
  ASSERT_EQ(fk.sync(s), 0); /* let through once rank 1 is found gone */
  EXPECT_EQ(async_error(comm), ncclRemoteError);
  EXPECT(strstr(ncclGetLastError(comm), "is gone") != NULL);
  NCCL_OK(ncclCommAbort(comm));
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
  float* a = dev_alloc(N);
  static int release;
  if (rank == 1) ASSERT_EQ(fk.hold(s, &release), 0);
  NCCL_OK(ncclAllReduce(a, a, N, ncclFloat32, ncclSum, comm, s));
  if (rank == 0) {
    ASSERT_EQ(fk.sync(s), 0);
    /* both ranks' watchers time out; whichever is first, the other learns it from the shared page */
    ncclResult_t as = async_error(comm);
    const char* why = ncclGetLastError(comm);
    EXPECT(as == ncclTimeout || as == ncclRemoteError);
    EXPECT(strstr(why, as == ncclTimeout ? "CHORUS_TIMEOUT" : "rank 1 failed") != NULL);
  } else {
    usleep(1500000);
    __atomic_store_n(&release, 1, __ATOMIC_RELEASE);
    ASSERT_EQ(fk.sync(s), 0);
  }
  NCCL_OK(ncclCommAbort(comm));
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
