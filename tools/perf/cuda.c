/* --device: buffers in CUDA device memory and a CUDA stream per rank, as nccl-tests runs. The driver
 * is opened at run time (never linked: the tools build and run without CUDA); CHORUS_CUDA_LIBRARY
 * names another library to open, as for libchorus. Each thread makes its device's primary context
 * current; local rank r uses device r % devices (several ranks share a GPU when there are fewer). */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"

typedef int cu_result;
static struct {
  cu_result (*init)(unsigned);
  cu_result (*device_count)(int*);
  cu_result (*device_get)(int*, int);
  cu_result (*primary_retain)(void**, int);
  cu_result (*ctx_set)(void*);
  cu_result (*mem_alloc)(uintptr_t*, size_t);
  cu_result (*mem_free)(uintptr_t);
  cu_result (*htod)(uintptr_t, const void*, size_t);
  cu_result (*dtoh)(void*, uintptr_t, size_t);
  cu_result (*stream_create)(void**, unsigned);
  cu_result (*stream_destroy)(void*);
  cu_result (*stream_sync)(void*);
  cu_result (*dtod_async)(uintptr_t, uintptr_t, size_t, void*);
  cu_result (*error_string)(cu_result, const char**);
  cu_result (*ctx_sync)(void);
  int ndev;
} cu;

static void cu_check(perf_ctx* ctx, cu_result r, const char* what) {
  if (r == 0) return;
  const char* s = NULL;
  if (!cu.error_string || cu.error_string(r, &s) != 0 || !s) s = "unknown CUDA error";
  perf_fail_msg(ctx, PERF_INTERNAL, "--device: %s failed: %s (%d)", what, s, r);
}

void perf_cuda_open(perf_ctx* ctx) {
  const char* name = getenv("CHORUS_CUDA_LIBRARY");
  if (!name || !*name) name = "libcuda.so.1";
  /* RTLD_GLOBAL: libchorus looks for the driver among the loaded libraries. */
  void* h = dlopen(name, RTLD_NOW | RTLD_GLOBAL);
  if (!h) perf_fail_msg(ctx, PERF_INVALID_USAGE, "--device: cannot open the CUDA driver %s: %s", name, dlerror());
#define SYM(f, s) *(void**)&cu.f = dlsym(h, s)
  SYM(init, "cuInit");
  SYM(device_count, "cuDeviceGetCount");
  SYM(device_get, "cuDeviceGet");
  SYM(primary_retain, "cuDevicePrimaryCtxRetain");
  SYM(ctx_set, "cuCtxSetCurrent");
  SYM(mem_alloc, "cuMemAlloc_v2");
  SYM(mem_free, "cuMemFree_v2");
  SYM(htod, "cuMemcpyHtoD_v2");
  SYM(dtoh, "cuMemcpyDtoH_v2");
  SYM(stream_create, "cuStreamCreate");
  SYM(stream_destroy, "cuStreamDestroy_v2");
  SYM(stream_sync, "cuStreamSynchronize");
  SYM(dtod_async, "cuMemcpyDtoDAsync_v2");
  SYM(error_string, "cuGetErrorString");
  SYM(ctx_sync, "cuCtxSynchronize");
#undef SYM
  if (!cu.init || !cu.device_count || !cu.device_get || !cu.primary_retain || !cu.ctx_set || !cu.mem_alloc ||
      !cu.mem_free || !cu.htod || !cu.dtoh || !cu.stream_create || !cu.stream_destroy || !cu.stream_sync ||
      !cu.dtod_async || !cu.ctx_sync)
    perf_fail_msg(ctx, PERF_INVALID_USAGE, "--device: %s lacks CUDA driver entry points", name);
  cu_check(ctx, cu.init(0), "cuInit");
  cu_check(ctx, cu.device_count(&cu.ndev), "cuDeviceGetCount");
  if (cu.ndev < 1) perf_fail_msg(ctx, PERF_INVALID_USAGE, "--device: no CUDA device");
}

int perf_cuda_ordinal(int local_rank) { return cu.ndev > 0 ? local_rank % cu.ndev : 0; }

void perf_cuda_bind(perf_ctx* ctx, int local_rank) {
  int dev = 0;
  void* pctx = NULL;
  cu_check(ctx, cu.device_get(&dev, perf_cuda_ordinal(local_rank)), "cuDeviceGet");
  cu_check(ctx, cu.primary_retain(&pctx, dev), "cuDevicePrimaryCtxRetain");
  cu_check(ctx, cu.ctx_set(pctx), "cuCtxSetCurrent");
}

void* perf_cuda_alloc(perf_ctx* ctx, size_t bytes) {
  uintptr_t d = 0;
  cu_check(ctx, cu.mem_alloc(&d, bytes), "cuMemAlloc");
  return (void*)d;
}

void perf_cuda_free(perf_ctx* ctx, void* p) { cu_check(ctx, cu.mem_free((uintptr_t)p), "cuMemFree"); }

void perf_cuda_copy(perf_ctx* ctx, void* dst, const void* src, size_t bytes, int to_device) {
  /* A copy from pageable memory may return before its DMA has landed, and the ranks' streams are
   * NON_BLOCKING, so nothing orders them after it: on an H200 such a late copy of the initial data
   * overwrote results of work queued next (hypercube_perf out of place, wrong elements). Wait. */
  if (to_device) {
    cu_check(ctx, cu.htod((uintptr_t)dst, src, bytes), "cuMemcpyHtoD");
    cu_check(ctx, cu.ctx_sync(), "cuCtxSynchronize");
  } else cu_check(ctx, cu.dtoh(dst, (uintptr_t)src, bytes), "cuMemcpyDtoH");
}

cudaStream_t perf_cuda_stream(perf_ctx* ctx) {
  void* s = NULL;
  cu_check(ctx, cu.stream_create(&s, 1 /* CU_STREAM_NON_BLOCKING */), "cuStreamCreate");
  return (cudaStream_t)s;
}

void perf_cuda_stream_destroy(perf_ctx* ctx, cudaStream_t s) {
  cu_check(ctx, cu.stream_destroy((void*)s), "cuStreamDestroy");
}

void perf_cuda_sync(perf_ctx* ctx, cudaStream_t s) { cu_check(ctx, cu.stream_sync((void*)s), "cuStreamSynchronize"); }

/* A copy within one rank's buffers, in the order of its stream: device memory with --device (opened
 * once above), host memory otherwise (after the work queued on the host stream). */
ncclResult_t perf_copy(void* dst, const void* src, size_t bytes, cudaStream_t s) {
  if (cu.ndev) return cu.dtod_async((uintptr_t)dst, (uintptr_t)src, bytes, (void*)s) ? ncclUnhandledCudaError : ncclSuccess;
  ncclResult_t r = s ? chorusStreamSynchronize(s) : ncclSuccess; /* earlier work may still write */
  if (r == ncclSuccess) memcpy(dst, src, bytes);
  return r;
}
