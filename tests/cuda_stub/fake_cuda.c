/* A stand-in for the CUDA driver (libcuda.so.1) with just what Chorus's classification looks up:
 * tests mark host ranges as "device" or "managed" memory (fake_cuda_mark) and count stream
 * synchronisations. Every entry point keeps the real driver's prototype and result codes (cuda.h);
 * nothing here is ever loaded outside the tests (CHORUS_CUDA_LIBRARY names it). */
#include <stdint.h>
#include <string.h>

#define EXPORT __attribute__((visibility("default")))
enum { ATTR_MEMORY_TYPE = 2, ATTR_IS_MANAGED = 8, ATTR_DEVICE_ORDINAL = 9 };
enum { MEMTYPE_HOST = 1, MEMTYPE_DEVICE = 2 };

static struct range { uintptr_t lo, hi; int kind; } ranges[16]; /* kind 1 device, 2 managed */
static int nranges, inited;
static int syncs, copies;         /* atomic builtins: ranks may be threads */
static _Thread_local int ctx_depth; /* each thread has its own context stack, as with the driver */
static char fake_ctx; /* the one context: its address */

EXPORT void fake_cuda_mark(const void* p, size_t bytes, int kind) {
  if (nranges < 16) ranges[nranges++] = (struct range){(uintptr_t)p, (uintptr_t)p + bytes, kind};
}
EXPORT void fake_cuda_reset(void) { nranges = 0, syncs = 0, copies = 0; }
EXPORT int fake_cuda_syncs(void) { return __atomic_load_n(&syncs, __ATOMIC_RELAXED); }
EXPORT int fake_cuda_copies(void) { return __atomic_load_n(&copies, __ATOMIC_RELAXED); }
EXPORT int fake_cuda_ctx_depth(void) { return ctx_depth; }

EXPORT int cuInit(unsigned flags) { return flags ? 1 : (inited = 1, 0); }
EXPORT int cuDriverGetVersion(int* v) { return v ? (*v = 13000, 0) : 1; }
EXPORT int cuDeviceGetCount(int* n) { return !inited ? 3 : n ? (*n = 1, 0) : 1; }
EXPORT int cuDeviceGet(int* d, int i) { return !inited ? 3 : i == 0 && d ? (*d = 0, 0) : 101; }
EXPORT int cuDeviceGetName(char* name, int len, int d) {
  if (!inited) return 3;
  if (d != 0 || len <= 0) return 101;
  strncpy(name, "Fake GPU (tests)", (size_t)len - 1);
  name[len - 1] = 0;
  return 0;
}
/* As the driver: success with zeros for a pointer it does not know; NOT_INITIALIZED (3) before cuInit. */
EXPORT int cuPointerGetAttributes(unsigned n, int* attrs, void** data, uintptr_t p) {
  if (!inited) return 3;
  const struct range* r = NULL;
  for (int i = 0; i < nranges && !r; i++)
    if (p >= ranges[i].lo && p < ranges[i].hi) r = &ranges[i];
  for (unsigned i = 0; i < n; i++) {
    if (attrs[i] == ATTR_MEMORY_TYPE) *(unsigned*)data[i] = r ? (r->kind == 1 ? MEMTYPE_DEVICE : MEMTYPE_HOST) : 0;
    else if (attrs[i] == ATTR_IS_MANAGED) *(unsigned*)data[i] = r && r->kind == 2;
    else if (attrs[i] == ATTR_DEVICE_ORDINAL) *(int*)data[i] = r ? 0 : -2;
  }
  return 0;
}
static const struct range* find(uintptr_t p) {
  for (int i = 0; i < nranges; i++)
    if (p >= ranges[i].lo && p < ranges[i].hi) return &ranges[i];
  return NULL;
}
/* As the driver: CUDA_ERROR_INVALID_VALUE (1) for memory it does not know. */
EXPORT int cuPointerGetAttribute(void* data, int attr, uintptr_t p) {
  if (!inited) return 3;
  if (!find(p)) return 1;
  if (attr != 1) return 1; /* CONTEXT only */
  *(void**)data = &fake_ctx;
  return 0;
}
/* Copies need a current context and device memory on the device side (the range must be marked). */
static int fake_copy(void* dst, const void* src, size_t n, uintptr_t dev) {
  if (!inited) return 3;
  if (!ctx_depth) return 201; /* CUDA_ERROR_INVALID_CONTEXT */
  const struct range* r = find(dev);
  if (!r || dev + n > r->hi) return 1;
  memcpy(dst, src, n);
  __atomic_fetch_add(&copies, 1, __ATOMIC_RELAXED);
  return 0;
}
EXPORT int cuMemcpyDtoH_v2(void* dst, uintptr_t src, size_t n) { return fake_copy(dst, (const void*)src, n, src); }
EXPORT int cuMemcpyHtoD_v2(uintptr_t dst, const void* src, size_t n) { return fake_copy((void*)dst, src, n, dst); }
EXPORT int cuCtxPushCurrent_v2(void* ctx) { return ctx == &fake_ctx ? (ctx_depth++, 0) : 201; }
EXPORT int cuCtxPopCurrent_v2(void** ctx) {
  if (!ctx_depth) return 201;
  ctx_depth--;
  if (ctx) *ctx = &fake_ctx;
  return 0;
}
EXPORT int cuStreamSynchronize(void* s) {
  (void)s;
  if (!inited) return 3;
  __atomic_fetch_add(&syncs, 1, __ATOMIC_RELAXED);
  return 0;
}
EXPORT int cuGetErrorString(int e, const char** s) {
  *s = e == 3 ? "initialization error" : e == 101 ? "invalid device ordinal" : "fake error";
  return 0;
}
