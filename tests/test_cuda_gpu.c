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
#include "cuda_gpu_util.h"
#include "runner.h"

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

/* Block j of rank r's data, element i, in the point-to-point tests below. */
static float v3(int r, int j, int i) { return (float)(r * 100000 + j * 1000 + i); }

/* AlltoAll, Gather and Scatter on the GPU, out of place and in place (AlltoAll's pairs then swap
 * blocks between two ranks' buffers), every root (cuda_gpu_util.c). */
static void three_body(int rank, int nranks, ncclUniqueId id, void* arg) {
  (void)arg;
  cudaStream_t s;
  ncclComm_t comm = open_rank(rank, nranks, id, 0x8000, &s);
  three_steps(comm, s, rank, nranks, N);
  NCCL_OK(ncclCommDestroy(comm));
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
  setenv("CHORUS_CUDA_STAGE_REDUCE", "0", 1); /* the CPU reduces staged copies: no kernel at all */
  load();
  rt_run_procs(3, one_mute_body, NULL);
}

TEST_T(cuda_gpu, ipc_refused_goes_through_host_memory, 60) {
  if (no_kernels()) return;
  setenv("FAKE_CUDA_IPC_REFUSED", "1", 1);
  setenv("CHORUS_CUDA_STAGE_REDUCE", "0", 1); /* the CPU reduces staged copies: no kernel at all */
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
  setenv("CHORUS_CUDA_STAGE_REDUCE", "0", 1); /* the CPU reduces staged copies: no kernel at all */
  load();
  rt_run_threads(2, five_body, NULL);
  EXPECT_EQ(fk.kernels(), 0);
}
