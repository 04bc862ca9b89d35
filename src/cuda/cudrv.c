/* The CUDA driver through dlopen (see cudrv.h). Only entry points with a single ABI version are
 * used, by their plain names. State: `state` (atomic) is DRV_UNKNOWN until a look, then DRV_ABSENT
 * (looked at `absent_at`, again a second later) or DRV_PRESENT (the table below is filled, under
 * `lock`, before the release store of DRV_PRESENT; read-only afterwards). */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "../misc/log.h"
#include "../misc/param.h"
#include "cudrv.h"

typedef int cu_result; /* CUresult: 0 is CUDA_SUCCESS */
#define CU_ATTR_MEMORY_TYPE 2
#define CU_ATTR_IS_MANAGED 8
#define CU_ATTR_DEVICE_ORDINAL 9
#define CU_MEMORYTYPE_DEVICE 2
#define CU_ERROR_INVALID_CONTEXT 201

static struct {
  cu_result (*init)(unsigned);
  cu_result (*driver_version)(int*);
  cu_result (*device_count)(int*);
  cu_result (*device_get)(int*, int);
  cu_result (*device_name)(char*, int, int);
  cu_result (*pointer_attrs)(unsigned, int*, void**, uintptr_t);
  cu_result (*stream_sync)(void*);
  cu_result (*pointer_attr)(void*, int, uintptr_t);
  cu_result (*dtoh)(void*, uintptr_t, size_t);
  cu_result (*htod)(uintptr_t, const void*, size_t);
  cu_result (*ctx_push)(void*);
  cu_result (*ctx_pop)(void**);
  cu_result (*error_string)(cu_result, const char**);
  /* the asynchronous path: all or none (async_ok) */
  cu_result (*dtoh_async)(void*, uintptr_t, size_t, void*);
  cu_result (*htod_async)(uintptr_t, const void*, size_t, void*);
  cu_result (*dtod_async)(uintptr_t, uintptr_t, size_t, void*); /* optional: cudrv_copy_dtod says so */
  cu_result (*capture_mode)(int*); /* optional: cuThreadExchangeStreamCaptureMode (CUDA 10.1) */
  cu_result (*host_fn)(void*, void (*)(void*), void*);
  cu_result (*wait_value32)(void*, uintptr_t, uint32_t, unsigned);
  cu_result (*host_alloc)(void**, size_t, unsigned);
  cu_result (*free_host)(void*);
  cu_result (*host_dev_ptr)(uintptr_t*, void*, unsigned);
  cu_result (*is_capturing)(void*, int*);
  cu_result (*event_create)(void**, unsigned);
  cu_result (*event_record)(void*, void*);
  cu_result (*wait_event)(void*, void*, unsigned);
  cu_result (*event_destroy)(void*);
  cu_result (*ctx_current)(void**);
  cu_result (*mem_alloc)(uintptr_t*, size_t);
  cu_result (*mem_free)(uintptr_t);
  cu_result (*write_value32)(void*, uintptr_t, uint32_t, unsigned); /* optional: graphs of staged calls */
  cu_result (*stream_create)(void**, unsigned);
  cu_result (*stream_destroy)(void*);
  int async_ok;
} cu;

enum { DRV_UNKNOWN, DRV_ABSENT, DRV_PRESENT };
static _Atomic int state = DRV_UNKNOWN;
static _Atomic int64_t absent_at; /* coarse seconds of the last look that found nothing */
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static char load_error[256]; /* under lock: why the last dlopen failed */
static void* drv_handle;     /* set under lock before DRV_PRESENT is published; never closed */

static int64_t coarse_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC_COARSE, &ts);
  return (int64_t)ts.tv_sec;
}

/* Under lock. flags: RTLD_NOLOAD to find a loaded driver only. */
static int resolve(int flags) {
  void* h = dlopen(param_str(PARAM_CUDA_LIBRARY), RTLD_NOW | RTLD_LOCAL | flags);
  if (!h) {
    const char* e = dlerror();
    snprintf(load_error, sizeof(load_error), "%s", e ? e : "not loaded");
    return 0;
  }
#define SYM(field, name) *(void**)&cu.field = dlsym(h, name)
  SYM(init, "cuInit");
  SYM(driver_version, "cuDriverGetVersion");
  SYM(device_count, "cuDeviceGetCount");
  SYM(device_get, "cuDeviceGet");
  SYM(device_name, "cuDeviceGetName");
  SYM(pointer_attrs, "cuPointerGetAttributes");
  SYM(stream_sync, "cuStreamSynchronize");
  SYM(error_string, "cuGetErrorString");
  SYM(pointer_attr, "cuPointerGetAttribute");
  SYM(dtoh, "cuMemcpyDtoH_v2"); /* the ABI names cuda.h maps cuMemcpyDtoH etc. to */
  SYM(htod, "cuMemcpyHtoD_v2");
  SYM(ctx_push, "cuCtxPushCurrent_v2");
  SYM(ctx_pop, "cuCtxPopCurrent_v2");
  SYM(dtoh_async, "cuMemcpyDtoHAsync_v2");
  SYM(htod_async, "cuMemcpyHtoDAsync_v2");
  SYM(dtod_async, "cuMemcpyDtoDAsync_v2");
  SYM(capture_mode, "cuThreadExchangeStreamCaptureMode");
  SYM(host_fn, "cuLaunchHostFunc");             /* CUDA 10.0 */
  SYM(wait_value32, "cuStreamWaitValue32_v2");  /* 11.7: stream memory operations on by default */
  SYM(host_alloc, "cuMemHostAlloc");
  SYM(free_host, "cuMemFreeHost");
  SYM(host_dev_ptr, "cuMemHostGetDevicePointer_v2");
  SYM(is_capturing, "cuStreamIsCapturing");
  SYM(event_create, "cuEventCreate");
  SYM(event_record, "cuEventRecord");
  SYM(wait_event, "cuStreamWaitEvent");
  SYM(event_destroy, "cuEventDestroy_v2");
  SYM(ctx_current, "cuCtxGetCurrent");
  SYM(mem_alloc, "cuMemAlloc_v2");
  SYM(mem_free, "cuMemFree_v2");
  SYM(write_value32, "cuStreamWriteValue32_v2");
  SYM(stream_create, "cuStreamCreate");
  SYM(stream_destroy, "cuStreamDestroy_v2");
#undef SYM
  drv_handle = h;
  cu.async_ok = cu.dtoh_async && cu.htod_async && cu.host_fn && cu.wait_value32 && cu.host_alloc && cu.free_host &&
                cu.host_dev_ptr && cu.is_capturing && cu.event_create && cu.event_record && cu.wait_event &&
                cu.event_destroy;
  if (!cu.pointer_attrs || !cu.stream_sync || !cu.pointer_attr || !cu.dtoh || !cu.htod || !cu.ctx_push ||
      !cu.ctx_pop) { /* not a CUDA driver (or one older than 7.0) */
    WARN("%s is loaded but lacks some of cuPointerGetAttributes, cuStreamSynchronize, cuMemcpyDtoH_v2, ... : "
         "CUDA buffers cannot be recognised", param_str(PARAM_CUDA_LIBRARY));
    memset(&cu, 0, sizeof(cu));
    return 0;
  }
  return 1; /* the handle stays open: the driver is never unloaded */
}

int cudrv_present(void) {
  int s = atomic_load_explicit(&state, memory_order_acquire);
  if (s == DRV_PRESENT) return 1;
  if (s == DRV_ABSENT && coarse_s() == atomic_load_explicit(&absent_at, memory_order_relaxed)) return 0;
  pthread_mutex_lock(&lock);
  s = atomic_load_explicit(&state, memory_order_relaxed);
  if (s != DRV_PRESENT) {
    int found = resolve(RTLD_NOLOAD);
    if (found) INFO(LOG_INIT, "CUDA driver %s found in the process: buffers are classified", param_str(PARAM_CUDA_LIBRARY));
    atomic_store_explicit(&absent_at, coarse_s(), memory_order_relaxed);
    atomic_store_explicit(&state, found ? DRV_PRESENT : DRV_ABSENT, memory_order_release);
    s = found ? DRV_PRESENT : DRV_ABSENT;
  }
  pthread_mutex_unlock(&lock);
  return s == DRV_PRESENT;
}

enum cu_mem cudrv_classify(const void* p, int* dev) {
  if (dev) *dev = -1;
  if (!p || !cudrv_present()) return CU_MEM_HOST;
  unsigned mtype = 0, managed = 0;
  int ordinal = -1;
  int attrs[3] = {CU_ATTR_MEMORY_TYPE, CU_ATTR_IS_MANAGED, CU_ATTR_DEVICE_ORDINAL};
  void* data[3] = {&mtype, &managed, &ordinal};
  /* A pointer the driver does not know (malloc) succeeds with zeros; a process that loaded the driver
   * but never initialised it fails (CUDA_ERROR_NOT_INITIALIZED): no device memory can exist then. */
  if (cu.pointer_attrs(3, attrs, data, (uintptr_t)p) != 0) return CU_MEM_HOST;
  if (dev) *dev = ordinal;
  if (managed) return CU_MEM_MANAGED;
  return mtype == CU_MEMORYTYPE_DEVICE ? CU_MEM_DEVICE : CU_MEM_HOST;
}

static const char* cu_err(cu_result r) {
  const char* s = NULL;
  if (cu.error_string && cu.error_string(r, &s) == 0 && s) return s;
  return "unknown CUDA error";
}

/* For cudev.c, which looks up the entry points of the device path itself. */
void* cudrv_sym(const char* name) { return cudrv_present() ? dlsym(drv_handle, name) : NULL; }
const char* cudrv_errstr(int r) { return cu_err(r); }
int cudrv_push(void* ctx) { return ctx ? cu.ctx_push(ctx) : 0; }
void cudrv_pop(void* ctx) {
  void* popped;
  if (ctx) cu.ctx_pop(&popped);
}

#define CU_ATTR_CONTEXT 1

/* Run a copy in the context that owns dev: the calling thread may have another one current, or none
 * (a Chorus stream thread). */
static ch_status copy(int to_host, void* host, uintptr_t dev, size_t bytes) {
  if (!bytes) return CH_OK;
  if (!cudrv_present()) return CH_INTERNAL;
  void* ctx = NULL;
  cu_result r = cu.pointer_attr(&ctx, CU_ATTR_CONTEXT, dev);
  if (r == 0 && ctx) r = cu.ctx_push(ctx);
  if (r == 0) {
    r = to_host ? cu.dtoh(host, dev, bytes) : cu.htod(dev, host, bytes);
    void* popped;
    if (ctx) cu.ctx_pop(&popped);
  }
  if (r != 0) {
    WARN("copying %zu bytes %s device memory %p failed: %s (%d)", bytes, to_host ? "from" : "to", (void*)dev,
         cu_err(r), r);
    return CH_SYSTEM;
  }
  return CH_OK;
}

ch_status cudrv_copy_dtoh(void* dst, const void* dev, size_t bytes) { return copy(1, dst, (uintptr_t)dev, bytes); }
ch_status cudrv_copy_htod(void* dev, const void* src, size_t bytes) {
  return copy(0, (void*)(uintptr_t)src, (uintptr_t)dev, bytes);
}

ch_status cudrv_stream_sync(void* stream) {
  if (!cudrv_present()) return CH_OK;
  cu_result r = cu.stream_sync(stream);
  if (r == CU_ERROR_INVALID_CONTEXT && !stream) return CH_OK; /* no context on this thread: nothing queued by it */
  if (r != 0) {
    WARN("cuStreamSynchronize(%p) failed: %s (%d)", stream, cu_err(r), r);
    return CH_SYSTEM;
  }
  return CH_OK;
}

int cudrv_describe(char* out, size_t cap) {
  pthread_mutex_lock(&lock);
  int ok = atomic_load(&state) == DRV_PRESENT || resolve(0);
  if (ok && atomic_load(&state) != DRV_PRESENT) atomic_store_explicit(&state, DRV_PRESENT, memory_order_release);
  pthread_mutex_unlock(&lock);
  if (!ok) {
    snprintf(out, cap, "not found (%s): host memory only", load_error);
    return -1;
  }
  int ver = 0, n = 0;
  cu_result r = cu.init ? cu.init(0) : -1;
  if (r != 0) {
    snprintf(out, cap, "%s loaded, cuInit failed: %s (%d)", param_str(PARAM_CUDA_LIBRARY), cu_err(r), r);
    return -1;
  }
  if (cu.driver_version) cu.driver_version(&ver);
  if (cu.device_count) cu.device_count(&n);
  size_t len = (size_t)snprintf(out, cap, "driver %d.%d, %d device(s)", ver / 1000, ver % 1000 / 10, n);
  for (int i = 0; i < n && len < cap; i++) {
    int d = -1;
    char name[128] = "?";
    if (cu.device_get && cu.device_get(&d, i) == 0 && cu.device_name) cu.device_name(name, (int)sizeof(name), d);
    len += (size_t)snprintf(out + len, cap - len, "%s %d: %s", i ? ";" : ":", i, name);
  }
  size_t fb = 0;
  cudev_fatbin(&fb);
  if (len < cap)
    len += (size_t)snprintf(out + len, cap - len, "; device kernels: %s%s", cudev_fatbin_archs(),
                            !fb ? ""
                            : !param_int(PARAM_CUDA_DIRECT)
                                ? (param_int(PARAM_CUDA_RELAY) ? " (ranks sharing one GPU: off, CHORUS_CUDA_DIRECT=0; "
                                                                 "used by the relay between GPUs of one host)"
                                                               : " (off: CHORUS_CUDA_DIRECT=0, CHORUS_CUDA_RELAY=0)")
                                : ", used by ranks that share one GPU and by the relay between GPUs of one host");
  if (len < cap)
    snprintf(out + len, cap - len, "; other device buffers: %s",
             !cu.async_ok ? "through host memory, completing before the call returns (no cuStreamWaitValue32_v2)"
             : param_int(PARAM_CUDA_ASYNC) ? "through pinned host memory in CUDA stream order"
                                           : "through host memory, completing before the call returns (CHORUS_CUDA_ASYNC=0)");
  return 0;
}

/* ---- the asynchronous path ---- */

int cudrv_async_ok(void) { return cudrv_present() && cu.async_ok; }

void* cudrv_ptr_ctx(const void* p) {
  void* ctx = NULL;
  if (!cudrv_present() || cu.pointer_attr(&ctx, CU_ATTR_CONTEXT, (uintptr_t)p) != 0) return NULL;
  return ctx;
}

#define IN_CTX CUDRV_IN_CTX

ch_status cudrv_capturing(void* stream, void* ctx, int* yes) {
  int status = 0;
  IN_CTX(ctx, "cuStreamIsCapturing", cu.is_capturing(stream, &status));
  *yes = status != 0; /* ACTIVE (1) or INVALIDATED (2): either way inside a capture */
  return CH_OK;
}

#define CU_MEMHOSTALLOC_PORTABLE 0x01
#define CU_MEMHOSTALLOC_DEVICEMAP 0x02

static ch_status host_alloc(size_t bytes, void* ctx, int mapped, void** p, void** dev) {
  char what[96];
  snprintf(what, sizeof(what), "cuMemHostAlloc(%zu bytes of pinned host memory)", bytes);
  IN_CTX(ctx, what, cu.host_alloc(p, bytes, CU_MEMHOSTALLOC_PORTABLE | (mapped ? CU_MEMHOSTALLOC_DEVICEMAP : 0)));
  if (!mapped) return CH_OK;
  uintptr_t d = 0;
  IN_CTX(ctx, "cuMemHostGetDevicePointer", cu.host_dev_ptr(&d, *p, 0));
  *dev = (void*)d;
  return CH_OK;
}

void* cudrv_host_alloc(size_t bytes, void* ctx, int mapped, void** dev) {
  void* p = NULL;
  if (host_alloc(bytes, ctx, mapped, &p, dev) == CH_OK) return p;
  if (p) cudrv_host_free(p, ctx);
  return NULL;
}

static ch_status host_free(void* p, void* ctx) {
  IN_CTX(ctx, "cuMemFreeHost", cu.free_host(p));
  return CH_OK;
}
void cudrv_host_free(void* p, void* ctx) {
  if (p) host_free(p, ctx);
}

ch_status cudrv_copy_async(int to_host, void* host, void* dev, size_t bytes, void* stream, void* ctx) {
  if (!bytes) return CH_OK;
  if (to_host) IN_CTX(ctx, "cuMemcpyDtoHAsync", cu.dtoh_async(host, (uintptr_t)dev, bytes, stream));
  else IN_CTX(ctx, "cuMemcpyHtoDAsync", cu.htod_async((uintptr_t)dev, host, bytes, stream));
  return CH_OK;
}

ch_status cudrv_copy_dtod(void* dst, const void* src, size_t bytes, void* stream, void* ctx) {
  if (!cu.dtod_async) return CH_INTERNAL; /* the caller runs a kernel instead */
  if (!bytes) return CH_OK;
  IN_CTX(ctx, "cuMemcpyDtoDAsync", cu.dtod_async((uintptr_t)dst, (uintptr_t)src, bytes, stream));
  return CH_OK;
}
int cudrv_has_dtod(void) { return cu.dtod_async != NULL; }

#define CU_STREAM_CAPTURE_MODE_RELAXED 2
int cudrv_capture_relaxed(void) {
  int mode = CU_STREAM_CAPTURE_MODE_RELAXED;
  if (!cu.capture_mode || cu.capture_mode(&mode) != 0) return -1;
  return mode; /* the thread's mode before */
}
void cudrv_capture_restore(int mode) {
  if (mode >= 0 && cu.capture_mode) cu.capture_mode(&mode);
}

ch_status cudrv_host_fn(void* stream, void (*fn)(void*), void* arg, void* ctx) {
  IN_CTX(ctx, "cuLaunchHostFunc", cu.host_fn(stream, fn, arg));
  return CH_OK;
}

ch_status cudrv_wait_geq(void* stream, void* dev, uint32_t value, void* ctx) {
  IN_CTX(ctx, "cuStreamWaitValue32", cu.wait_value32(stream, (uintptr_t)dev, value, 0 /* GEQ */));
  return CH_OK;
}

#define CU_EVENT_DISABLE_TIMING 0x2

static ch_status record_in(void* ev, void* from, void* from_ctx) {
  IN_CTX(from_ctx, "cuEventRecord", cu.event_record(ev, from));
  return CH_OK;
}

/* The event belongs to from's context; a stream of another context (device) may wait for it. */
ch_status cudrv_join(void* from, void* from_ctx, void* to, void* to_ctx) {
  void* ev = NULL;
  IN_CTX(from_ctx, "cuEventCreate", cu.event_create(&ev, CU_EVENT_DISABLE_TIMING));
  ch_status s = record_in(ev, from, from_ctx);
  if (s == CH_OK) IN_CTX(to_ctx, "cuStreamWaitEvent", cu.wait_event(to, ev, 0));
  /* Destroying a recorded event that a stream still waits on is allowed: the driver frees it after. */
  IN_CTX(from_ctx, "cuEventDestroy", cu.event_destroy(ev));
  return s;
}

ch_status cudrv_write_u32(void* stream, void* dev, uint32_t value, void* ctx) {
  if (!cu.write_value32) return CH_INTERNAL;
  IN_CTX(ctx, "cuStreamWriteValue32", cu.write_value32(stream, (uintptr_t)dev, value, 0));
  return CH_OK;
}
int cudrv_has_write_u32(void) { return cu.write_value32 != NULL; }

ch_status cudrv_stream_new(void** stream, void* ctx) {
  *stream = NULL;
  if (!cu.stream_create || !cu.stream_destroy) return CH_INTERNAL;
  IN_CTX(ctx, "cuStreamCreate", cu.stream_create(stream, 1 /* CU_STREAM_NON_BLOCKING */));
  return CH_OK;
}

void cudrv_stream_free(void* stream, void* ctx) {
  if (!stream || cudrv_push(ctx) != 0) return;
  cu.stream_destroy(stream); /* work queued on it still completes */
  cudrv_pop(ctx);
}

ch_status cudrv_event_new(void** ev, void* ctx) {
  *ev = NULL;
  IN_CTX(ctx, "cuEventCreate", cu.event_create(ev, CU_EVENT_DISABLE_TIMING));
  return CH_OK;
}

ch_status cudrv_event_record(void* ev, void* stream, void* ctx) { return record_in(ev, stream, ctx); }

ch_status cudrv_event_wait(void* stream, void* ev, void* ctx) {
  IN_CTX(ctx, "cuStreamWaitEvent", cu.wait_event(stream, ev, 0));
  return CH_OK;
}

void cudrv_event_free(void* ev, void* ctx) {
  if (!ev || cudrv_push(ctx) != 0) return;
  cu.event_destroy(ev); /* a stream may still wait on it: the driver frees it after */
  cudrv_pop(ctx);
}

static int dev_mem_ok(void) { return cudrv_present() && cu.ctx_current && cu.mem_alloc && cu.mem_free; }

void* cudrv_current_ctx(void) {
  void* ctx = NULL;
  if (!dev_mem_ok() || cu.ctx_current(&ctx) != 0) return NULL;
  return ctx;
}

ch_status cudrv_dev_alloc(void** p, size_t bytes) {
  uintptr_t d = 0;
  if (!dev_mem_ok()) {
    WARN("CUDA device memory asked for (CHORUS_MEM_ALLOC_DEVICE=1), but this process has no CUDA driver loaded "
         "(%s)", param_str(PARAM_CUDA_LIBRARY));
    return CH_INVALID_USAGE;
  }
  char what[64];
  snprintf(what, sizeof(what), "cuMemAlloc(%zu bytes)", bytes);
  IN_CTX(NULL, what, cu.mem_alloc(&d, bytes)); /* in the caller's current context */
  *p = (void*)d;
  return CH_OK;
}

ch_status cudrv_dev_free(void* p) {
  if (!dev_mem_ok()) return CH_INTERNAL; /* only device blocks come here: the driver was there */
  void* ctx = cudrv_ptr_ctx(p);
  IN_CTX(ctx, "cuMemFree", cu.mem_free((uintptr_t)p));
  return CH_OK;
}
