/* The device path's driver calls (cudrv.h, second half): the embedded kernels, CUDA IPC, pinned
 * shared host memory and stream memory writes. Entry points are looked up once, on first use, from
 * the driver cudrv.c found; `dv` is filled under `mu` before `state` is published (release), and is
 * read-only afterwards. Loaded modules: one per context, under `mu`. */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>

#include "../misc/log.h"
#include "../misc/param.h"
#include "../misc/utils.h"
#include "cudrv.h"
#include "devjob.h"

typedef int cu_result;

static struct {
  cu_result (*module_load)(void**, const void*);
  cu_result (*module_fn)(void**, void*, const char*);
  cu_result (*launch)(void*, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, void*, void**,
                      void**);
  cu_result (*batch)(void*, unsigned, void*, unsigned);
  cu_result (*ptr_attrs)(unsigned, int*, void**, uintptr_t);
  cu_result (*ipc_get)(cudev_ipc_handle*, uintptr_t);
  cu_result (*ipc_open)(uintptr_t*, cudev_ipc_handle, unsigned);
  cu_result (*ipc_close)(uintptr_t);
  cu_result (*host_register)(void*, size_t, unsigned);
  cu_result (*host_unregister)(void*);
  cu_result (*host_dev_ptr)(uintptr_t*, void*, unsigned);
  cu_result (*ctx_device)(int*);
  cu_result (*uuid)(unsigned char*, int);
  cu_result (*attr)(int*, int, int);
  cu_result (*mem_alloc)(uintptr_t*, size_t);
  cu_result (*mem_free)(uintptr_t);
  cu_result (*ctx_id)(void*, unsigned long long*); /* optional (CUDA 12.0) */
  cu_result (*stream_create)(void**, unsigned);
  cu_result (*stream_destroy)(void*);
} dv;

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static _Atomic int state; /* 0 not looked, 1 usable, -1 not */

#define MAX_CTX 16
static struct loaded {
  void* ctx;
  unsigned long long ctx_id; /* 0: unknown (a driver before CUDA 12) */
  void* module;
  void* fn[DEV_NTYPES + 1]; /* the types' kernels, then the stage kernel */
  int probe_state; /* 0 not made, 1 made, -1 failed */
  uint64_t probe_id;
  cudev_ipc_handle probe;
} loaded[MAX_CTX]; /* under mu */
static int nloaded;

static int look(void) {
  size_t bytes = 0;
  if (!cudev_fatbin(&bytes) || !bytes || !cudrv_present()) return -1;
#define SYM(f, name) *(void**)&dv.f = cudrv_sym(name)
  SYM(module_load, "cuModuleLoadData");
  SYM(module_fn, "cuModuleGetFunction");
  SYM(launch, "cuLaunchKernel");
  SYM(batch, "cuStreamBatchMemOp_v2"); /* CUDA 11.7, as the asynchronous path's entry points */
  SYM(ptr_attrs, "cuPointerGetAttributes");
  SYM(ipc_get, "cuIpcGetMemHandle");
  SYM(ipc_open, "cuIpcOpenMemHandle_v2");
  if (!dv.ipc_open) SYM(ipc_open, "cuIpcOpenMemHandle");
  SYM(ipc_close, "cuIpcCloseMemHandle");
  SYM(host_register, "cuMemHostRegister_v2");
  SYM(host_unregister, "cuMemHostUnregister");
  SYM(host_dev_ptr, "cuMemHostGetDevicePointer_v2");
  SYM(ctx_device, "cuCtxGetDevice");
  SYM(uuid, "cuDeviceGetUuid_v2");
  if (!dv.uuid) SYM(uuid, "cuDeviceGetUuid");
  SYM(attr, "cuDeviceGetAttribute");
  SYM(mem_alloc, "cuMemAlloc_v2");
  SYM(mem_free, "cuMemFree_v2");
  SYM(ctx_id, "cuCtxGetId");
  SYM(stream_create, "cuStreamCreate");
  SYM(stream_destroy, "cuStreamDestroy_v2");
#undef SYM
  void** all = (void**)&dv;
  for (size_t i = 0; i + 1 < sizeof(dv) / sizeof(void*); i++) /* all but the optional last */
    if (!all[i]) {
      INFO(LOG_INIT, "the CUDA driver lacks an entry point of the device path (#%zu): device buffers go "
           "through host memory", i);
      return -1;
    }
  return 1;
}

int cudev_ok(void) {
  int s = atomic_load_explicit(&state, memory_order_acquire);
  if (s) return s > 0;
  pthread_mutex_lock(&mu);
  if (!(s = atomic_load_explicit(&state, memory_order_relaxed))) {
    s = look();
    atomic_store_explicit(&state, s, memory_order_release);
  }
  pthread_mutex_unlock(&mu);
  return s > 0;
}

#define IN_CTX CUDRV_IN_CTX

static ch_status load_module(void* ctx, struct loaded* l) {
  size_t bytes;
  const void* image = cudev_fatbin(&bytes);
  IN_CTX(ctx, "cuModuleLoadData (Chorus's device kernels; built for sm " "of CHORUS_CUDA_ARCHS)",
         dv.module_load(&l->module, image));
  for (int t = 0; t < DEV_NTYPES; t++) {
    char name[32];
    snprintf(name, sizeof(name), DEV_KERNEL_PREFIX "%d", t);
    IN_CTX(ctx, "cuModuleGetFunction", dv.module_fn(&l->fn[t], l->module, name));
  }
  IN_CTX(ctx, "cuModuleGetFunction (" DEV_STAGE_KERNEL ")", dv.module_fn(&l->fn[DEV_STAGE], l->module, DEV_STAGE_KERNEL));
  return CH_OK;
}

/* ctx's entry, its module loaded on first use; NULL if it cannot be. `check`: make sure it is still
 * the context the entry was made for (a context destroyed and made again at the same address, by
 * cudaDeviceReset, has lost its modules and memory): at init only, since it costs a driver call.
 * Under mu. */
static struct loaded* entry(void* ctx, int check) {
  unsigned long long id = 0;
  if (check && dv.ctx_id && dv.ctx_id(ctx, &id) != 0) id = 0;
  int i = 0;
  while (i < nloaded && loaded[i].ctx != ctx) i++;
  if (i < nloaded && id && loaded[i].ctx_id && loaded[i].ctx_id != id) {
    INFO(LOG_INIT, "CUDA context %p was made again since Chorus loaded its kernels into it: loading them again", ctx);
    loaded[i] = loaded[--nloaded]; /* the old module and probe went with the old context */
    i = nloaded;
  }
  if (i == nloaded && nloaded < MAX_CTX) {
    struct loaded l = {.ctx = ctx, .ctx_id = id};
    if (load_module(ctx, &l) == CH_OK) loaded[nloaded++] = l;
  }
  return i < nloaded ? &loaded[i] : NULL;
}

void* cudev_kernel(void* ctx, int type) {
  if (!cudev_ok() || type < 0 || type > DEV_STAGE) return NULL;
  pthread_mutex_lock(&mu);
  struct loaded* l = entry(ctx, 0);
  void* fn = l ? l->fn[type] : NULL;
  pthread_mutex_unlock(&mu);
  return fn;
}

static ch_status make_probe(void* ctx, struct loaded* l) {
  uintptr_t p = 0, base;
  size_t size;
  void* owner;
  int dev;
  IN_CTX(ctx, "cuMemAlloc (256 bytes: a CUDA IPC probe)", dv.mem_alloc(&p, 256));
  ch_status s = cudev_describe((void*)p, &owner, &dev, &base, &size, &l->probe_id) != 0 ? CH_SYSTEM
                                                                                      : cudev_ipc_get(p, ctx, &l->probe);
  if (s != CH_OK && cudrv_push(ctx) == 0) { /* kept only when peers may open it */
    dv.mem_free(p);
    cudrv_pop(ctx);
  }
  return s;
}

/* Made once per context and kept, like the module: a peer process may open it at any time during
 * its init, and 256 bytes are not worth a protocol to know when all have. */
int cudev_probe(void* ctx, uint64_t* id, cudev_ipc_handle* h) {
  if (!cudev_ok()) return 0;
  pthread_mutex_lock(&mu);
  struct loaded* l = entry(ctx, 1);
  if (l && !l->probe_state) l->probe_state = make_probe(ctx, l) == CH_OK ? 1 : -1;
  int ok = l && l->probe_state > 0;
  if (ok) *id = l->probe_id, *h = l->probe;
  pthread_mutex_unlock(&mu);
  return ok;
}

ch_status cudev_launch(void* fn, unsigned gx, unsigned gy, void* stream, void* ctx, const void* args) {
  void* params[1] = {(void*)args}; /* copied by the driver at launch */
  IN_CTX(ctx, "cuLaunchKernel (a Chorus device kernel)", dv.launch(fn, gx, gy, 1, 512, 1, 1, 0, stream, params, NULL));
  return CH_OK;
}

ch_status cudev_dev_alloc(void* ctx, size_t bytes, void** dev) {
  uintptr_t p = 0;
  IN_CTX(ctx, "cuMemAlloc (the staged tables of ranks on one GPU)", dv.mem_alloc(&p, bytes));
  *dev = (void*)p;
  return CH_OK;
}

ch_status cudev_dev_free(void* ctx, void* dev) {
  if (dev) IN_CTX(ctx, "cuMemFree (the staged tables of ranks on one GPU)", dv.mem_free((uintptr_t)dev));
  return CH_OK;
}

/* CUstreamBatchMemOpParams: a 48-byte union whose wait and write members share this layout. */
struct batch_op {
  uint32_t operation, pad0;
  uint64_t address, value; /* a 32-bit value in the low half (little-endian union) */
  uint32_t flags, pad1;    /* 0: CU_STREAM_WAIT_VALUE_GEQ, CU_STREAM_WRITE_VALUE_DEFAULT */
  uint64_t alias, pad2;
};
_Static_assert(sizeof(struct batch_op) == 48, "CUstreamBatchMemOpParams is 48 bytes");
#define CU_STREAM_MEM_OP_WAIT_VALUE_32 1
#define CU_STREAM_MEM_OP_WRITE_VALUE_32 2

ch_status cudev_memops(void* stream, const struct cudev_memop* ops, int n, void* ctx) {
  struct batch_op b[CUDEV_MAX_MEMOPS];
  if (n <= 0 || n > CUDEV_MAX_MEMOPS) return n ? CH_INTERNAL : CH_OK;
  memset(b, 0, (size_t)n * sizeof(b[0]));
  for (int i = 0; i < n; i++) {
    b[i].operation = ops[i].wait ? CU_STREAM_MEM_OP_WAIT_VALUE_32 : CU_STREAM_MEM_OP_WRITE_VALUE_32;
    b[i].address = (uintptr_t)ops[i].dev, b[i].value = ops[i].value;
  }
  IN_CTX(ctx, "cuStreamBatchMemOp (the waits and writes of ranks on one GPU)", dv.batch(stream, (unsigned)n, b, 0));
  return CH_OK;
}

#define CU_POINTER_ATTRIBUTE_CONTEXT 1
#define CU_POINTER_ATTRIBUTE_BUFFER_ID 7
#define CU_POINTER_ATTRIBUTE_RANGE_START_ADDR 11
#define CU_POINTER_ATTRIBUTE_RANGE_SIZE 12
#define CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL 9

int cudev_describe(const void* p, void** ctx, int* ordinal, uintptr_t* base, size_t* size, uint64_t* id) {
  int attrs[5] = {CU_POINTER_ATTRIBUTE_CONTEXT, CU_POINTER_ATTRIBUTE_BUFFER_ID, CU_POINTER_ATTRIBUTE_RANGE_START_ADDR,
                  CU_POINTER_ATTRIBUTE_RANGE_SIZE, CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL};
  unsigned long long bid = 0;
  *ctx = NULL, *base = 0, *size = 0, *ordinal = -1;
  void* data[5] = {ctx, &bid, base, size, ordinal};
  cu_result r = dv.ptr_attrs(5, attrs, data, (uintptr_t)p);
  *id = bid;
  return r == 0 && *base <= (uintptr_t)p && (uintptr_t)p - *base < *size ? 0 : r ? r : -1;
}

/* Quiet: a buffer that cannot be shared is reported by the caller, which knows the call. */
ch_status cudev_ipc_get(uintptr_t base, void* ctx, cudev_ipc_handle* h) {
  cu_result r = cudrv_push(ctx);
  if (r == 0) {
    r = dv.ipc_get(h, base);
    cudrv_pop(ctx);
  }
  if (r != 0) {
    INFO(LOG_COLL, "cuIpcGetMemHandle(%p): %s (%d)", (void*)base, cudrv_errstr(r), r);
    return CH_SYSTEM;
  }
  return CH_OK;
}

#define CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS 1

int cudev_ipc_open(const cudev_ipc_handle* h, void* ctx, uintptr_t* base) {
  cu_result r = cudrv_push(ctx);
  if (r == 0) {
    r = dv.ipc_open(base, *h, CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS);
    cudrv_pop(ctx);
  }
  return r;
}

static ch_status ipc_close(uintptr_t base, void* ctx) {
  IN_CTX(ctx, "cuIpcCloseMemHandle", dv.ipc_close(base));
  return CH_OK;
}
void cudev_ipc_close(uintptr_t base, void* ctx) { ipc_close(base, ctx); }

#define CU_STREAM_NON_BLOCKING 0x1
ch_status cudev_stream_new(void** s, void* ctx) {
  if (!dv.stream_create || !dv.stream_destroy) return CH_INTERNAL;
  IN_CTX(ctx, "cuStreamCreate", dv.stream_create(s, CU_STREAM_NON_BLOCKING));
  return CH_OK;
}
static ch_status stream_free(void* s, void* ctx) {
  IN_CTX(ctx, "cuStreamDestroy", dv.stream_destroy(s));
  return CH_OK;
}
void cudev_stream_free(void* s, void* ctx) {
  if (s) stream_free(s, ctx);
}

#define CU_MEMHOSTREGISTER_PORTABLE 0x01
#define CU_MEMHOSTREGISTER_DEVICEMAP 0x02

ch_status cudev_host_register(void* p, size_t bytes, void* ctx, void** dev) {
  uintptr_t d = 0;
  IN_CTX(ctx, "cuMemHostRegister (shared host memory for the ranks' flags)",
         dv.host_register(p, bytes, CU_MEMHOSTREGISTER_PORTABLE | CU_MEMHOSTREGISTER_DEVICEMAP));
  cu_result r = cudrv_push(ctx);
  if (r == 0) {
    r = dv.host_dev_ptr(&d, p, 0);
    if (r != 0) dv.host_unregister(p);
    cudrv_pop(ctx);
  }
  if (r != 0) {
    WARN("cuMemHostGetDevicePointer failed: %s (%d)", cudrv_errstr(r), r);
    return CH_SYSTEM;
  }
  *dev = (void*)d;
  return CH_OK;
}

static ch_status host_unregister(void* p, void* ctx) {
  IN_CTX(ctx, "cuMemHostUnregister", dv.host_unregister(p));
  return CH_OK;
}
void cudev_host_unregister(void* p, void* ctx) { host_unregister(p, ctx); }

void* cudev_device_ctx(int ordinal) {
  int (*get)(int*, int) = (int (*)(int*, int))cudrv_sym("cuDeviceGet");
  int (*retain)(void**, int) = (int (*)(void**, int))cudrv_sym("cuDevicePrimaryCtxRetain");
  int dev = -1;
  void* ctx = NULL;
  if (!get || !retain || get(&dev, ordinal) != 0 || retain(&ctx, dev) != 0) {
    INFO(LOG_INIT, "no primary context for CUDA device %d: its communicator's device buffers go through host memory",
         ordinal);
    return NULL;
  }
  return ctx; /* the retain is kept: the context outlives the communicator */
}

#define CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT 16

ch_status cudev_device(void* ctx, unsigned char uuid[16], int* sms, int* ordinal) {
  int dev = -1;
  IN_CTX(ctx, "cuCtxGetDevice", dv.ctx_device(&dev));
  *ordinal = dev; /* a CUdevice is its ordinal */
  IN_CTX(ctx, "cuDeviceGetUuid", dv.uuid(uuid, dev));
  IN_CTX(ctx, "cuDeviceGetAttribute", dv.attr(sms, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, dev));
  return CH_OK;
}

int cudev_unroll(void) { return (int)UT_MAX(UT_MIN(param_int(PARAM_CUDA_UNROLL), 4), 1); }
