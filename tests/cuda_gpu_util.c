/* The stand-in driver and the steps of a rank, for the cuda_gpu tests (cuda_gpu_util.h). */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cuda/cudrv.h"
#include "cuda_gpu_util.h"
#include "misc/param.h"
#include "runner.h"

struct cg_driver fk;


/* A build without nvcc has no kernels: every device buffer goes through host memory then. */
int no_kernels(void) {
  size_t bytes = 0;
  if (cudev_fatbin(&bytes) && bytes) return 0;
  printf("    SKIP: this build has no device kernels (no nvcc found)\n");
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
  ASSERT(fk.init && fk.retain && fk.set && fk.alloc && fk.free && fk.sync && fk.kernels && fk.hold && fk.copy && fk.mark &&
         fk.registered && fk.stage_runs && fk.begin_capture && fk.end_capture && fk.graph_launch && fk.graph_ops && fk.graph_destroy);
  EXPECT_EQ(fk.init(0), 0);
  setenv("CHORUS_CUDA_LIBRARY", CHORUS_FAKE_CUDA, 1);
  param_reset();
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
