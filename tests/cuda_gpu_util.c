/* The stand-in driver and the steps of a rank, for the cuda_gpu tests (cuda_gpu_util.h). */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "nccl.h"

#include "cuda/cudrv.h"
#include "cuda_gpu_util.h"
#include "misc/param.h"
#include "runner.h"

struct cg_driver fk;


/* A build without nvcc has no kernels: every device buffer goes through host memory then. */
int no_kernels(void) {
  size_t bytes = 0;
  if (cudev_fatbin(&bytes) && bytes) return 0;
  printf("    SKIP: this build has no device kernels (no nvcc found; install the CUDA toolkit and rebuild)\n");
  return 1;
}

void load(void) {
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
  *(void**)&fk.copies = dlsym(h, "fake_cuda_copies");
  *(void**)&fk.host_allocs = dlsym(h, "fake_cuda_host_allocs");
  ASSERT(fk.init && fk.retain && fk.set && fk.alloc && fk.free && fk.sync && fk.kernels && fk.hold && fk.copy && fk.mark &&
         fk.registered && fk.stage_runs && fk.begin_capture && fk.end_capture && fk.graph_launch && fk.graph_ops && fk.graph_destroy &&
         fk.copies && fk.host_allocs);
  EXPECT_EQ(fk.init(0), 0);
  setenv("CHORUS_CUDA_LIBRARY", CHORUS_FAKE_CUDA, 1);
  param_reset();
}

void load_staged(const char* piece) {
  setenv("CHORUS_CUDA_DIRECT", "0", 1);
  setenv("CHORUS_CUDA_RELAY", "0", 1);
  setenv("CHORUS_CUDA_STAGE_PIECE", piece, 1);
  load();
}

/* As a CUDA application's rank: the device's primary context current on this thread. */
void set_device(void) {
  void* ctx = NULL;
  ASSERT(fk.retain(&ctx, 0) == 0);
  ASSERT(fk.set(ctx) == 0);
}

/* A rank of a CUDA application: its device current, its communicator made, and (base != 0) a stream
 * of its own, base + 0x10 * rank. */
ncclComm_t open_rank(int rank, int nranks, ncclUniqueId id, uintptr_t base, cudaStream_t* s) {
  set_device();
  ncclComm_t comm;
  NCCL_OK(ncclCommInitRank(&comm, nranks, id, rank));
  if (s) *s = (cudaStream_t)(base + 0x10 * (uintptr_t)rank);
  return comm;
}

float* any_alloc(size_t n, int host) {
  float* p = host ? calloc(n, sizeof(float)) : dev_alloc(n);
  ASSERT(p);
  return p;
}

void any_free(float* p, int host) {
  if (host) free(p);
  else fk.free((uintptr_t)p);
}

float* dev_alloc(size_t n) {
  uintptr_t d = 0;
  ASSERT(fk.alloc(&d, n * sizeof(float)) == 0);
  return (float*)d;
}

/* The communicator's asynchronous error, once one is set (up to 5 s). */
ncclResult_t async_error(ncclComm_t comm) {
  ncclResult_t as = ncclSuccess;
  for (int i = 0; i < 500 && as == ncclSuccess; i++) {
    NCCL_OK(ncclCommGetAsyncError(comm, &as));
    if (as == ncclSuccess) usleep(10000);
  }
  return as;
}

/* Every rank finds the failure itself (want, saying `why`), unless a peer's report reaches it first
 * (through the shared page: ncclRemoteError). */
void expect_failed(ncclComm_t comm, ncclResult_t want, const char* why) {
  ncclResult_t as = async_error(comm);
  EXPECT(as == want || as == ncclRemoteError);
  EXPECT(strstr(ncclGetLastError(comm), as == want ? why : "failed this communicator") != NULL);
}

/* How the kernels run: their tables read from host memory or from the stage kernel's copy in device
 * memory (CHORUS_CUDA_STAGE_BLOCKS: "0" always, a number beyond any grid never), and each rank's
 * kernel doing its part or rank 0's doing all (CHORUS_CUDA_ONE_KERNEL); NULL: as by default. */
void kernels_as(const char* stage_blocks, const char* one_kernel) {
  const char* names[2] = {"CHORUS_CUDA_STAGE_BLOCKS", "CHORUS_CUDA_ONE_KERNEL"};
  const char* values[2] = {stage_blocks, one_kernel};
  for (int i = 0; i < 2; i++)
    if (values[i]) setenv(names[i], values[i], 1);
    else unsetenv(names[i]);
  param_reset();
}

/* Block j of rank r's AlltoAll/Gather/Scatter input, element i (exact in a float up to 9 ranks). */
static float v3(int r, int j, int i) { return (float)(r * 1000000 + j * 100000 + i % 99991); }

void three_steps(ncclComm_t comm, cudaStream_t s, int rank, int n, size_t count) {
  size_t all = count * (size_t)n;
  float *a = dev_alloc(all), *b = dev_alloc(all);
  for (int inplace = 0; inplace < 2; inplace++) {
    for (int j = 0; j < n; j++)
      for (size_t i = 0; i < count; i++) a[j * count + i] = v3(rank, j, (int)i), b[j * count + i] = -1;
    float* out = inplace ? a : b;
    NCCL_OK(ncclAlltoAll(a, out, count, ncclFloat32, comm, s));
    ASSERT_EQ(fk.sync(s), 0);
    for (int j = 0; j < n; j++)
      for (size_t i = 0; i < count; i++) EXPECT(out[j * count + i] == v3(j, rank, (int)i));
    for (int root = 0; root < n; root++) {
      /* Gather: in place, the root's input is already its block of the output */
      for (size_t i = 0; i < all; i++) b[i] = -1, a[i] = i < count ? v3(rank, 0, (int)i) : -2;
      float* in = inplace && rank == root ? b + (size_t)root * count : a;
      if (in != a) memcpy(in, a, count * sizeof(float));
      NCCL_OK(ncclGather(in, b, count, ncclFloat32, root, comm, s));
      ASSERT_EQ(fk.sync(s), 0);
      for (int j = 0; rank == root && j < n; j++)
        for (size_t i = 0; i < count; i++) EXPECT(b[j * count + i] == v3(j, 0, (int)i));
      /* Scatter: in place, the root's output is its block of the input */
      for (int j = 0; j < n; j++)
        for (size_t i = 0; i < count; i++) a[j * count + i] = v3(rank, j, (int)i), b[j * count + i] = -1;
      float* to = inplace && rank == root ? a + (size_t)root * count : b;
      NCCL_OK(ncclScatter(a, to, count, ncclFloat32, root, comm, s));
      ASSERT_EQ(fk.sync(s), 0);
      for (size_t i = 0; i < count; i++) EXPECT(to[i] == v3(root, rank, (int)i));
    }
  }
  EXPECT_EQ(fk.free((uintptr_t)a), 0);
  EXPECT_EQ(fk.free((uintptr_t)b), 0);
}

void dead_peer_steps(ncclComm_t comm, cudaStream_t s, int rank, size_t count) {
  float* a = dev_alloc(count);
  static int never;
  if (rank == 1) ASSERT_EQ(fk.hold(s, &never), 0); /* its stream never reaches the call */
  NCCL_OK(ncclAllReduce(a, a, count, ncclFloat32, ncclSum, comm, s));
  if (rank == 1) {
    usleep(300000); /* the exchange is done on both ranks */
    _exit(0);
  }
  ASSERT_EQ(fk.sync(s), 0); /* let through once rank 1 is found gone */
  EXPECT_EQ(async_error(comm), ncclRemoteError);
  EXPECT(strstr(ncclGetLastError(comm), "is gone") != NULL);
  NCCL_OK(ncclCommAbort(comm));
}

void held_peer_steps(ncclComm_t comm, cudaStream_t s, int rank, size_t count) {
  float* a = dev_alloc(count);
  static int release;
  if (rank == 1) ASSERT_EQ(fk.hold(s, &release), 0);
  NCCL_OK(ncclAllReduce(a, a, count, ncclFloat32, ncclSum, comm, s));
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
