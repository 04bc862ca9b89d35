/* A stand-in for the CUDA driver (libcuda.so.1) with just what Chorus looks up: tests mark host
 * ranges as "device" or "managed" memory (fake_cuda_mark) and count stream synchronisations and
 * copies. Streams are emulated: each stream handle gets a thread that runs the work queued on it in
 * order (asynchronous copies, host functions, 32-bit waits, and the tests' stand-ins for kernels), so
 * stream semantics can be checked without a GPU. Every entry point keeps the real driver's prototype
 * and result codes (cuda.h); nothing here is ever loaded outside the tests (CHORUS_CUDA_LIBRARY). */
#define _GNU_SOURCE
#include <fcntl.h>
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <sys/mman.h>
#include <unistd.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "reduce/reduce.h"
#include "cuda/devjob.h"

#define EXPORT __attribute__((visibility("default")))
enum { ATTR_CONTEXT = 1, ATTR_MEMORY_TYPE = 2, ATTR_IS_MANAGED = 8, ATTR_DEVICE_ORDINAL = 9 };
enum { MEMTYPE_HOST = 1, MEMTYPE_DEVICE = 2 };
enum { E_INVALID_VALUE = 1, E_NOT_INITIALIZED = 3, E_INVALID_CONTEXT = 201, E_OPERATING_SYSTEM = 304, E_INVALID_HANDLE = 400 };

#define MAX_RANGES 256
/* kind 1 device, 2 managed; device memory from cuMemAlloc is a memfd mapping (fd), which another
 * process opens through /proc (CUDA IPC); id: the driver's buffer id. Under ranges_mu once threads run. */
static struct range { uintptr_t lo, hi; int kind, fd, imported; uint64_t id; } ranges[MAX_RANGES];
static int nranges, inited;
static uint64_t next_id = 1;
static pthread_mutex_t ranges_mu = PTHREAD_MUTEX_INITIALIZER;
static int syncs, copies, host_allocs; /* atomic builtins: ranks may be threads */
static _Thread_local int ctx_depth;    /* each thread has its own context stack, as with the driver */
static char fake_ctx;                  /* the one context: its address */

EXPORT void fake_cuda_mark(const void* p, size_t bytes, int kind) {
  pthread_mutex_lock(&ranges_mu);
  if (nranges < MAX_RANGES) ranges[nranges++] = (struct range){(uintptr_t)p, (uintptr_t)p + bytes, kind, -1, 0, next_id++};
  pthread_mutex_unlock(&ranges_mu);
}
static int kernels; /* kernels run (atomic builtins) */
EXPORT int fake_cuda_kernels(void) { return __atomic_load_n(&kernels, __ATOMIC_RELAXED); }
EXPORT void fake_cuda_reset(void) { nranges = 0, syncs = 0, copies = 0; }
EXPORT int fake_cuda_syncs(void) { return __atomic_load_n(&syncs, __ATOMIC_RELAXED); }
EXPORT int fake_cuda_copies(void) { return __atomic_load_n(&copies, __ATOMIC_RELAXED); }
EXPORT int fake_cuda_host_allocs(void) { return __atomic_load_n(&host_allocs, __ATOMIC_RELAXED); }
EXPORT int fake_cuda_ctx_depth(void) { return ctx_depth; }

/* A copy of the range holding p (0: none): entries move when another is dropped. */
static int find(uintptr_t p, struct range* out) {
  int found = 0;
  pthread_mutex_lock(&ranges_mu);
  for (int i = 0; i < nranges && !found; i++)
    if (p >= ranges[i].lo && p < ranges[i].hi) *out = ranges[i], found = 1;
  pthread_mutex_unlock(&ranges_mu);
  return found;
}
static int is_device(uintptr_t p, size_t n) {
  struct range rr_;
  const struct range* r = find(p, &rr_) ? &rr_ : NULL;
  return r && r->kind == 1 && p + n <= r->hi;
}

/* ---- streams ---- */

enum op_kind { OP_COPY, OP_HOST_FN, OP_WAIT32, OP_FILL, OP_HOLD, OP_RECORD, OP_WAIT_EVENT, OP_WRITE32, OP_KERNEL, OP_STAGE };
/* An event: records counts cuEventRecord calls, done the records that streams have reached. Never
 * freed (cuEventDestroy may come before the streams are done with it); kept reachable in `events`. */
struct event {
  struct event* next;
  uint32_t records, done;
};
static struct event* events;
static pthread_mutex_t events_mu = PTHREAD_MUTEX_INITIALIZER;
struct op {
  struct op* next;
  enum op_kind kind;
  void* dst;
  const void* src;
  size_t n;
  void (*fn)(void*);
  void* arg;
  uint32_t value;
  float fill;
  int delay_ms;
  struct dev_args args;        /* OP_KERNEL */
  struct dev_stage_args stage; /* OP_STAGE */
};
/* A captured graph: the ops queued on a stream between fake_cuda_begin_capture and _end_capture,
 * in order; a launch queues copies of them on a stream. */
struct fgraph {
  struct op *head, *tail;
  int nops;
};
struct stream {
  uintptr_t handle;
  int capturing;
  struct fgraph* graph; /* capturing into it (fake_cuda_begin_capture) */
  pthread_t thread;
  pthread_mutex_t mu;
  pthread_cond_t cv;
  struct op *head, *tail;
  int running; /* an op is being run */
  int destroyed; /* cuStreamDestroy: what is queued still runs; new work is refused */
};
static struct stream streams[64];
static int nstreams;
static pthread_mutex_t streams_mu = PTHREAD_MUTEX_INITIALIZER;

static void sleep_ms(int ms) {
  struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
  nanosleep(&ts, NULL);
}

/* A stream waiting on a word or an event: a GPU's wait costs no CPU, so after a short spin this one
 * sleeps between looks (benchmarks on this stand-in share few cores with the ranks' host threads). */
static void wait_pause(unsigned* i) {
  if (++*i < 256) sched_yield();
  else nanosleep(&(struct timespec){0, 20000}, NULL);
}

static int stage_runs; /* stage kernels run (fake_cuda_stage_runs) */
EXPORT int fake_cuda_stage_runs(void) { return __atomic_load_n(&stage_runs, __ATOMIC_RELAXED); }

/* Chorus's device kernel (src/cuda/kernels.cu, devjob.h) on the CPU, with the host library's
 * element-wise code: every job's sources combined into a scratch block, then written to each
 * destination (all reads before any write, as the kernel does per element). */
static void run_kernel(const struct dev_args* a) {
  const struct dev_table* tab = (const struct dev_table*)(uintptr_t)a->table;
  if (__atomic_load_n(&tab->seq, __ATOMIC_ACQUIRE) != a->seq) return;
  for (int k = 0; k < 2; k++)
    if (a->fail[k] && __atomic_load_n((const int*)(uintptr_t)a->fail[k], __ATOMIC_ACQUIRE)) return;
  struct red_op op = {.kind = a->op_kind, .type = a->type, .divisor = a->divisor};
  size_t es = red_type_size(a->type);
  for (int j = 0; j < a->njobs; j++) {
    const struct dev_job* jb = &a->job[j];
    size_t bytes = jb->count * es;
    if (jb->reduce == DEV_PAIR) { /* ranks a < b; both blocks read before either is written */
      int ra = __builtin_ctz(jb->src_mask), rb = 31 - __builtin_clz(jb->src_mask);
      uint64_t c = jb->src_off;
      char* t2 = malloc(2 * bytes + 1);
      memcpy(t2, (char*)(uintptr_t)(tab->buf[DEV_SEND][ra] + rb * c), bytes);
      memcpy(t2 + bytes, (char*)(uintptr_t)(tab->buf[DEV_SEND][rb] + ra * c), bytes);
      memcpy((char*)(uintptr_t)(tab->buf[DEV_RECV][rb] + ra * c), t2, bytes);
      memcpy((char*)(uintptr_t)(tab->buf[DEV_RECV][ra] + rb * c), t2 + bytes, bytes);
      free(t2);
      continue;
    }
    char* tmp = malloc(bytes ? bytes : 1);
    /* 8- and 16-bit floats: carried in float across every source and rounded once, as the kernel's
     * accumulator (kernels.cu's ty<T>::acc) does */
    int wide = jb->reduce && red_type_is_float(a->type) && es < 4;
    float* acc = wide ? malloc(jb->count * sizeof(float) + 1) : NULL;
    float* in = wide ? malloc(jb->count * sizeof(float) + 1) : NULL;
    struct red_op fop = op;
    fop.type = 7; /* ncclFloat32 (nccl.h is not included here) */
    int first = 1;
    for (int r = 0; r < DEV_MAX_RANKS; r++) {
      if (!(jb->src_mask >> r & 1)) continue;
      const char* src = (const char*)(uintptr_t)(tab->buf[jb->src_buf][r] + jb->src_off);
      memcpy(&op.scalar_f, &tab->scalar[r], sizeof(op.scalar_f)); /* the source rank's own scalar */
      memcpy(&op.scalar_i, &tab->scalar[r], sizeof(op.scalar_i));
      fop.scalar_f = op.scalar_f;
      if (!jb->reduce) memcpy(tmp, src, bytes);
      else if (wide) {
        red_to_float(a->type, in, src, jb->count);
        if (first) red_premul(&fop, acc, in, jb->count);
        else red_reduce(&fop, acc, acc, in, jb->count);
      } else if (first) red_premul(&op, tmp, src, jb->count);
      else red_reduce(&op, tmp, tmp, src, jb->count);
      first = 0;
    }
    if (wide) red_from_float(a->type, tmp, acc, jb->count);
    free(acc), free(in);
    if (jb->reduce && !wide) red_postop(&op, tmp, tmp, jb->count);
    for (int r = 0; r < DEV_MAX_RANKS; r++)
      if (jb->dst_mask >> r & 1) memcpy((char*)(uintptr_t)(tab->buf[jb->dst_buf][r] + jb->dst_off), tmp, bytes);
    free(tmp);
  }
  __atomic_fetch_add(&kernels, 1, __ATOMIC_RELAXED);
}

/* Device memory is ordered by the device: a stream's kernel and copies wait for words that another
 * process's stream writes, which ThreadSanitizer cannot see (two streams of one process writing one
 * buffer in turn, ordered through a peer process, look like a race). Their memory accesses are not
 * checked; their waits and writes of words still order what the host threads see. */
#if defined(__SANITIZE_THREAD__)
void __tsan_ignore_thread_begin(void);
void __tsan_ignore_thread_end(void);
#define DEVICE_ACCESS(x) (__tsan_ignore_thread_begin(), (x), __tsan_ignore_thread_end())
#else
#define DEVICE_ACCESS(x) (x)
#endif

/* The stage kernel: the table and the failure words into device memory. */
static void stage_kernel(const struct op* o) {
  struct dev_staged* d = (struct dev_staged*)(uintptr_t)o->stage.dst;
  /* seq as the device reads it, one word at once (a failure voids it meanwhile: gpu_unblock) */
  const struct dev_table* t = (const struct dev_table*)(uintptr_t)o->stage.table;
  memcpy((char*)&d->table + offsetof(struct dev_table, buf), t->buf, sizeof(*t) - offsetof(struct dev_table, buf));
  d->table.seq = __atomic_load_n((const uint32_t*)&t->seq, __ATOMIC_ACQUIRE);
  for (int k = 0; k < 2; k++)
    d->failed[k] = o->stage.fail[k] ? __atomic_load_n((uint32_t*)(uintptr_t)o->stage.fail[k], __ATOMIC_ACQUIRE) : 0;
  __atomic_fetch_add(&stage_runs, 1, __ATOMIC_RELAXED);
}

static void run_op(struct op* o) {
  switch (o->kind) {
    case OP_COPY:
      memcpy(o->dst, o->src, o->n);
      __atomic_fetch_add(&copies, 1, __ATOMIC_RELAXED);
      break;
    case OP_HOST_FN: o->fn(o->arg); break;
    case OP_WAIT32: { /* CU_STREAM_WAIT_VALUE_GEQ: cyclic comparison */
      unsigned i = 0;
      while ((int32_t)(__atomic_load_n((uint32_t*)o->dst, __ATOMIC_ACQUIRE) - o->value) < 0) wait_pause(&i);
      break;
    }
    case OP_FILL: /* a kernel that takes delay_ms, then writes its output */
      sleep_ms(o->delay_ms);
      for (size_t i = 0; i < o->n; i++) ((float*)o->dst)[i] = o->fill;
      break;
    case OP_HOLD: /* a kernel that runs until the test lets it end */
      while (!__atomic_load_n((int*)o->dst, __ATOMIC_ACQUIRE)) sleep_ms(1);
      break;
    case OP_RECORD: __atomic_store_n(&((struct event*)o->dst)->done, o->value, __ATOMIC_RELEASE); break;
    case OP_WAIT_EVENT: {
      unsigned i = 0;
      while ((int32_t)(__atomic_load_n(&((struct event*)o->dst)->done, __ATOMIC_ACQUIRE) - o->value) < 0) wait_pause(&i);
      break;
    }
    case OP_WRITE32: __atomic_store_n((uint32_t*)o->dst, o->value, __ATOMIC_RELEASE); break;
    case OP_KERNEL: DEVICE_ACCESS(run_kernel(&o->args)); break;
    case OP_STAGE: DEVICE_ACCESS(stage_kernel(o)); break; /* a kernel too */
  }
}

static void* stream_main(void* arg) {
  struct stream* s = arg;
  pthread_mutex_lock(&s->mu);
  for (;;) {
    while (!s->head) pthread_cond_wait(&s->cv, &s->mu);
    struct op* o = s->head;
    s->head = o->next;
    if (!s->head) s->tail = NULL;
    s->running = 1;
    pthread_mutex_unlock(&s->mu);
    run_op(o);
    free(o);
    pthread_mutex_lock(&s->mu);
    s->running = 0;
    pthread_cond_broadcast(&s->cv);
  }
  return NULL;
}

/* The stream of a handle (NULL: the legacy stream), its thread started on first use. */
static struct stream* stream_of(void* h) {
  pthread_mutex_lock(&streams_mu);
  struct stream* s = NULL;
  for (int i = 0; i < nstreams && !s; i++)
    if (streams[i].handle == (uintptr_t)h) s = &streams[i];
  if (!s && nstreams < 64) {
    s = &streams[nstreams++];
    s->handle = (uintptr_t)h;
    pthread_mutex_init(&s->mu, NULL);
    pthread_cond_init(&s->cv, NULL);
    pthread_create(&s->thread, NULL, stream_main, s);
    pthread_detach(s->thread);
  }
  pthread_mutex_unlock(&streams_mu);
  return s;
}

static int enqueue(void* h, struct op o) {
  struct stream* s = stream_of(h);
  if (s && __atomic_load_n(&s->destroyed, __ATOMIC_ACQUIRE)) return E_INVALID_HANDLE;
  struct op* p = malloc(sizeof(*p));
  if (!s || !p) return 2; /* CUDA_ERROR_OUT_OF_MEMORY */
  *p = o;
  p->next = NULL;
  if (s->graph) { /* captured: recorded, not run */
    if (s->graph->tail) s->graph->tail->next = p; else s->graph->head = p;
    s->graph->tail = p;
    s->graph->nops++;
    return 0;
  }
  pthread_mutex_lock(&s->mu);
  if (s->tail) s->tail->next = p; else s->head = p;
  s->tail = p;
  pthread_cond_broadcast(&s->cv);
  pthread_mutex_unlock(&s->mu);
  return 0;
}

/* Test hooks: a kernel writing n floats of `value` into device memory after delay_ms; a kernel that
 * runs until *release is nonzero; graph capture on a stream. */
EXPORT int fake_cuda_fill(void* stream, float* p, size_t n, float value, int delay_ms) {
  return enqueue(stream, (struct op){.kind = OP_FILL, .dst = p, .n = n, .fill = value, .delay_ms = delay_ms});
}
EXPORT int fake_cuda_hold(void* stream, int* release) { return enqueue(stream, (struct op){.kind = OP_HOLD, .dst = release}); }
/* A copy in stream order between any two host-visible addresses (a test reading results in order). */
EXPORT int fake_cuda_copy(void* stream, void* dst, const void* src, size_t n) {
  return enqueue(stream, (struct op){.kind = OP_COPY, .dst = dst, .src = src, .n = n});
}
EXPORT void fake_cuda_set_capturing(void* stream, int on) { stream_of(stream)->capturing = on; }
/* Capture as cuStreamBeginCapture/EndCapture and cuGraphLaunch do, for the ops this stand-in knows
 * (kernels, copies, stream memory operations): what the stream is given meanwhile is recorded. */
EXPORT void fake_cuda_begin_capture(void* stream) {
  struct stream* s = stream_of(stream);
  s->graph = calloc(1, sizeof(*s->graph));
  s->capturing = 1;
}
EXPORT void* fake_cuda_end_capture(void* stream) {
  struct stream* s = stream_of(stream);
  struct fgraph* gr = s->graph;
  s->graph = NULL, s->capturing = 0;
  return gr;
}
EXPORT int fake_cuda_graph_ops(void* graph) { return ((struct fgraph*)graph)->nops; }
EXPORT void fake_cuda_graph_destroy(void* graph) {
  struct fgraph* gr = graph;
  while (gr && gr->head) {
    struct op* o = gr->head;
    gr->head = o->next;
    free(o);
  }
  free(gr);
}
EXPORT int fake_cuda_graph_launch(void* graph, void* stream) {
  for (struct op* o = ((struct fgraph*)graph)->head; o; o = o->next) {
    struct op c = *o;
    int r = enqueue(stream, c);
    if (r) return r;
  }
  return 0;
}

/* ---- the driver's entry points ---- */

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
  struct range rr_;
  const struct range* r = find(p, &rr_) ? &rr_ : NULL;
  for (unsigned i = 0; i < n; i++) {
    if (attrs[i] == ATTR_MEMORY_TYPE) *(unsigned*)data[i] = r ? (r->kind == 1 ? MEMTYPE_DEVICE : MEMTYPE_HOST) : 0;
    else if (attrs[i] == ATTR_IS_MANAGED) *(unsigned*)data[i] = r && r->kind == 2;
    else if (attrs[i] == ATTR_DEVICE_ORDINAL) *(int*)data[i] = r ? 0 : -2;
    else if (attrs[i] == ATTR_CONTEXT) *(void**)data[i] = r ? &fake_ctx : NULL;
    else if (attrs[i] == 7) *(unsigned long long*)data[i] = r ? r->id : 0; /* BUFFER_ID */
    else if (attrs[i] == 11) *(uintptr_t*)data[i] = r && r->kind == 1 ? r->lo : 0; /* RANGE_START_ADDR */
    else if (attrs[i] == 12) *(size_t*)data[i] = r && r->kind == 1 ? r->hi - r->lo : 0; /* RANGE_SIZE */
  }
  return 0;
}
/* As the driver: CUDA_ERROR_INVALID_VALUE (1) for memory it does not know. */
EXPORT int cuPointerGetAttribute(void* data, int attr, uintptr_t p) {
  if (!inited) return 3;
  struct range rr_;
  const struct range* r = find(p, &rr_) ? &rr_ : NULL;
  if (!r) return 1;
  if (attr == 7) { /* BUFFER_ID */
    *(unsigned long long*)data = r->id;
    return 0;
  }
  if (attr != ATTR_CONTEXT) return 1; /* CONTEXT and BUFFER_ID only */
  *(void**)data = &fake_ctx;
  return 0;
}
/* Copies need a current context and device memory on the device side (the range must be marked). */
static int fake_copy(void* dst, const void* src, size_t n, uintptr_t dev) {
  if (!inited) return 3;
  if (!ctx_depth) return E_INVALID_CONTEXT;
  if (!is_device(dev, n)) return E_INVALID_VALUE;
  memcpy(dst, src, n);
  __atomic_fetch_add(&copies, 1, __ATOMIC_RELAXED);
  return 0;
}
EXPORT int cuMemcpyDtoH_v2(void* dst, uintptr_t src, size_t n) { return fake_copy(dst, (const void*)src, n, src); }
EXPORT int cuMemcpyHtoD_v2(uintptr_t dst, const void* src, size_t n) { return fake_copy((void*)dst, src, n, dst); }
static int copy_async(void* dst, const void* src, size_t n, uintptr_t dev, void* stream) {
  if (!inited) return 3;
  if (!ctx_depth) return E_INVALID_CONTEXT;
  if (!is_device(dev, n)) return E_INVALID_VALUE;
  return enqueue(stream, (struct op){.kind = OP_COPY, .dst = dst, .src = src, .n = n});
}
EXPORT int cuMemcpyDtoHAsync_v2(void* dst, uintptr_t src, size_t n, void* s) {
  return copy_async(dst, (const void*)src, n, src, s);
}
EXPORT int cuMemcpyHtoDAsync_v2(uintptr_t dst, const void* src, size_t n, void* s) {
  return copy_async((void*)dst, src, n, dst, s);
}
EXPORT int cuMemcpyDtoDAsync_v2(uintptr_t dst, uintptr_t src, size_t n, void* s) {
  if (!inited) return 3;
  if (!ctx_depth) return E_INVALID_CONTEXT;
  if (!is_device(dst, n) || !is_device(src, n)) return E_INVALID_VALUE;
  return enqueue(s, (struct op){.kind = OP_COPY, .dst = (void*)dst, .src = (const void*)src, .n = n});
}
EXPORT int cuLaunchHostFunc(void* s, void (*fn)(void*), void* arg) {
  if (!inited) return 3;
  if (!ctx_depth) return E_INVALID_CONTEXT;
  return enqueue(s, (struct op){.kind = OP_HOST_FN, .fn = fn, .arg = arg});
}
EXPORT int cuStreamWaitValue32_v2(void* s, uintptr_t addr, uint32_t value, unsigned flags) {
  if (!inited) return 3;
  if (!ctx_depth) return E_INVALID_CONTEXT;
  if (flags != 0) return E_INVALID_VALUE; /* GEQ only here */
  return enqueue(s, (struct op){.kind = OP_WAIT32, .dst = (void*)addr, .value = value});
}
EXPORT int cuEventCreate(void** ev, unsigned flags) {
  (void)flags;
  if (!inited) return 3;
  if (!ctx_depth) return E_INVALID_CONTEXT;
  struct event* e = calloc(1, sizeof(*e));
  if (!e) return 2;
  pthread_mutex_lock(&events_mu);
  e->next = events, events = e;
  pthread_mutex_unlock(&events_mu);
  *ev = e;
  return 0;
}
EXPORT int cuEventRecord(void* ev, void* s) {
  if (!ctx_depth) return E_INVALID_CONTEXT;
  struct event* e = ev;
  return enqueue(s, (struct op){.kind = OP_RECORD, .dst = e, .value = ++e->records});
}
EXPORT int cuStreamWaitEvent(void* s, void* ev, unsigned flags) {
  if (!ctx_depth) return E_INVALID_CONTEXT;
  if (flags) return E_INVALID_VALUE;
  struct event* e = ev;
  return enqueue(s, (struct op){.kind = OP_WAIT_EVENT, .dst = e, .value = e->records});
}
/* CUDA_ERROR_NOT_READY (600) until the stream has run the event's latest record (torch_chorus's Works). */
EXPORT int cuEventQuery(void* ev) {
  struct event* e = ev;
  return (int32_t)(__atomic_load_n(&e->done, __ATOMIC_ACQUIRE) - e->records) < 0 ? 600 : 0;
}
EXPORT int cuEventSynchronize(void* ev) {
  while (cuEventQuery(ev)) sched_yield();
  return 0;
}
EXPORT int cuEventDestroy_v2(void* ev) { return ev ? 0 : E_INVALID_HANDLE; }
EXPORT int cuMemHostAlloc(void** p, size_t n, unsigned flags) {
  (void)flags;
  if (!inited) return 3;
  if (!ctx_depth) return E_INVALID_CONTEXT;
  if (!(*p = malloc(n ? n : 1))) return 2;
  __atomic_fetch_add(&host_allocs, 1, __ATOMIC_RELAXED);
  return 0;
}
/* cuMemFreeHost and cuMemFree wait, as the driver's do, until every stream has run everything queued
 * on it (a stream blocked in a wait blocks the free); FAKE_CUDA_FREE_SYNCS=0: they do not. */
static void free_syncs(void) {
  const char* e = getenv("FAKE_CUDA_FREE_SYNCS");
  if (e && e[0] == '0') return;
  pthread_mutex_lock(&streams_mu);
  int n = nstreams;
  pthread_mutex_unlock(&streams_mu);
  for (int i = 0; i < n; i++) {
    struct stream* s = &streams[i];
    pthread_mutex_lock(&s->mu);
    while (s->head || s->running) pthread_cond_wait(&s->cv, &s->mu);
    pthread_mutex_unlock(&s->mu);
  }
}
EXPORT int cuMemFreeHost(void* p) {
  if (!ctx_depth) return E_INVALID_CONTEXT;
  free_syncs();
  free(p);
  __atomic_fetch_sub(&host_allocs, 1, __ATOMIC_RELAXED);
  return 0;
}
EXPORT int cuMemHostGetDevicePointer_v2(uintptr_t* d, void* p, unsigned flags) {
  if (flags || !ctx_depth) return flags ? E_INVALID_VALUE : E_INVALID_CONTEXT;
  *d = (uintptr_t)p; /* unified addressing: the same address */
  return 0;
}
static __thread int capture_mode; /* cuThreadExchangeStreamCaptureMode: kept, not enforced */
EXPORT int cuThreadExchangeStreamCaptureMode(int* mode) {
  int old = capture_mode;
  capture_mode = *mode, *mode = old;
  return 0;
}
EXPORT int cuStreamIsCapturing(void* s, int* status) {
  if (!inited) return 3;
  *status = stream_of(s)->capturing;
  return 0;
}
EXPORT int cuCtxGetCurrent(void** ctx) {
  if (!inited) return 3;
  *ctx = ctx_depth ? &fake_ctx : NULL;
  return 0;
}
/* Device memory: host memory marked as device memory until freed. */
static int add_range(void* mem, size_t n, int fd, int imported) {
  pthread_mutex_lock(&ranges_mu);
  int ok = nranges < MAX_RANGES;
  if (ok) ranges[nranges++] = (struct range){(uintptr_t)mem, (uintptr_t)mem + n, 1, fd, imported, next_id++};
  pthread_mutex_unlock(&ranges_mu);
  return ok;
}
/* Remove the device range at d (imported or not, as asked); its fd, or -2 if none. */
static int drop_range(uintptr_t d, int imported, size_t* n) {
  int fd = -2;
  pthread_mutex_lock(&ranges_mu);
  for (int i = 0; i < nranges; i++)
    if (ranges[i].lo == d && ranges[i].kind == 1 && ranges[i].imported == imported) {
      fd = ranges[i].fd, *n = ranges[i].hi - ranges[i].lo;
      ranges[i] = ranges[--nranges];
      break;
    }
  pthread_mutex_unlock(&ranges_mu);
  return fd;
}
EXPORT int cuMemAlloc_v2(uintptr_t* d, size_t n) {
  if (!inited) return 3;
  if (!ctx_depth) return E_INVALID_CONTEXT;
  if (!n) n = 1;
  int fd = memfd_create("fake-cuda", MFD_CLOEXEC);
  void* mem = fd < 0 || ftruncate(fd, (off_t)n) != 0 ? MAP_FAILED : mmap(NULL, n, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (mem == MAP_FAILED || !add_range(mem, n, fd, 0)) {
    if (mem != MAP_FAILED) munmap(mem, n);
    if (fd >= 0) close(fd);
    return 2; /* CUDA_ERROR_OUT_OF_MEMORY */
  }
  *d = (uintptr_t)mem;
  return 0;
}
EXPORT int cuMemFree_v2(uintptr_t d) {
  if (!ctx_depth) return E_INVALID_CONTEXT;
  free_syncs();
  size_t n = 0;
  int fd = drop_range(d, 0, &n);
  if (fd == -2) return E_INVALID_VALUE;
  munmap((void*)d, n);
  close(fd);
  return 0;
}
/* ---- what ranks on one GPU use: IPC, registered host memory, stream writes, kernels ---- */
struct ipc_handle { int pid, fd; uint64_t bytes; char pad[48]; };
EXPORT int cuIpcGetMemHandle(struct ipc_handle* h, uintptr_t base) {
  if (getenv("FAKE_CUDA_IPC_GET_REFUSED")) return E_INVALID_VALUE; /* this process cannot export */
  struct range rr_;
  const struct range* r = find(base, &rr_) ? &rr_ : NULL;
  if (!r || r->lo != base || r->fd < 0 || r->imported) return E_INVALID_VALUE; /* not a cuMemAlloc base */
  memset(h, 0, sizeof(*h));
  h->pid = getpid(), h->fd = r->fd, h->bytes = r->hi - r->lo;
  return 0;
}
EXPORT int cuIpcOpenMemHandle_v2(uintptr_t* d, struct ipc_handle h, unsigned flags) {
  (void)flags;
  if (!ctx_depth) return E_INVALID_CONTEXT;
  if (h.pid == getpid()) return E_INVALID_CONTEXT; /* as the driver: not in the exporting process */
  if (getenv("FAKE_CUDA_IPC_REFUSED")) return E_OPERATING_SYSTEM; /* as in a sandbox without it */
  char path[64];
  snprintf(path, sizeof(path), "/proc/%d/fd/%d", h.pid, h.fd);
  int fd = open(path, O_RDWR | O_CLOEXEC);
  if (fd < 0) return E_INVALID_HANDLE;
  void* mem = mmap(NULL, h.bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  close(fd);
  if (mem == MAP_FAILED || !add_range(mem, h.bytes, -1, 1)) return 2;
  *d = (uintptr_t)mem;
  return 0;
}
EXPORT int cuIpcCloseMemHandle(uintptr_t d) {
  size_t n = 0;
  if (drop_range(d, 1, &n) == -2) return E_INVALID_VALUE;
  munmap((void*)d, n);
  return 0;
}
EXPORT int cuMemGetAddressRange_v2(uintptr_t* base, size_t* size, uintptr_t p) {
  if (!inited) return 3;
  struct range rr_;
  const struct range* r = find(p, &rr_) ? &rr_ : NULL;
  if (!r || r->kind != 1) return E_INVALID_VALUE;
  if (base) *base = r->lo;
  if (size) *size = r->hi - r->lo;
  return 0;
}
/* Registered host ranges: as the driver, registering memory that overlaps a registered range fails
 * (CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED), and so does unregistering what is not registered. */
#define MAX_REGS 64
static struct { uintptr_t lo, hi; } regs[MAX_REGS]; /* under ranges_mu */
static int nregs;
EXPORT int fake_cuda_registered(void) {
  pthread_mutex_lock(&ranges_mu);
  int n = nregs;
  pthread_mutex_unlock(&ranges_mu);
  return n;
}
EXPORT int cuMemHostRegister_v2(void* p, size_t n, unsigned flags) {
  (void)flags;
  if (!ctx_depth) return E_INVALID_CONTEXT;
  uintptr_t lo = (uintptr_t)p, hi = lo + n;
  int e = 0;
  pthread_mutex_lock(&ranges_mu);
  for (int i = 0; i < nregs && !e; i++)
    if (lo < regs[i].hi && regs[i].lo < hi) e = 712;
  if (!e && nregs == MAX_REGS) e = 2;
  if (!e) regs[nregs].lo = lo, regs[nregs++].hi = hi;
  pthread_mutex_unlock(&ranges_mu);
  return e;
}
EXPORT int cuMemHostUnregister(void* p) {
  if (!ctx_depth) return E_INVALID_CONTEXT;
  int e = 713; /* CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED */
  pthread_mutex_lock(&ranges_mu);
  for (int i = 0; i < nregs && e; i++)
    if (regs[i].lo == (uintptr_t)p) regs[i] = regs[--nregs], e = 0;
  pthread_mutex_unlock(&ranges_mu);
  return e;
}
EXPORT int cuStreamWriteValue32_v2(void* s, uintptr_t addr, uint32_t value, unsigned flags) {
  if (!ctx_depth) return E_INVALID_CONTEXT;
  if (flags) return E_INVALID_VALUE;
  return enqueue(s, (struct op){.kind = OP_WRITE32, .dst = (void*)addr, .value = value});
}
/* CUstreamBatchMemOpParams (48 bytes; the wait and write members share this layout). */
struct batch_op {
  uint32_t operation, pad0;
  uint64_t address, value;
  uint32_t flags, pad1;
  uint64_t alias, pad2;
};
EXPORT int cuStreamBatchMemOp_v2(void* s, unsigned count, const struct batch_op* ops, unsigned flags) {
  if (!ctx_depth) return E_INVALID_CONTEXT;
  if (flags || count > 256) return E_INVALID_VALUE;
  for (unsigned i = 0; i < count; i++) /* as the driver: every operation checked before any is queued */
    if ((ops[i].operation != 1 && ops[i].operation != 2) || ops[i].flags || ops[i].value >> 32) return E_INVALID_VALUE;
  for (unsigned i = 0; i < count; i++) {
    struct op o = {.kind = ops[i].operation == 1 ? OP_WAIT32 : OP_WRITE32, .dst = (void*)(uintptr_t)ops[i].address,
                   .value = (uint32_t)ops[i].value};
    int r = enqueue(s, o);
    if (r) return r;
  }
  return 0;
}
static char fake_module;
static int module_loads;
/* The context's unique id (cuCtxGetId, CUDA 12): fake_cuda_new_ctx stands for a context destroyed
 * and made again at the same address (cudaDeviceReset), whose modules are gone. */
static unsigned long long ctx_gen = 1;
EXPORT int cuCtxGetId(void* ctx, unsigned long long* id) {
  if (ctx != &fake_ctx) return E_INVALID_CONTEXT;
  *id = __atomic_load_n(&ctx_gen, __ATOMIC_RELAXED);
  return 0;
}
EXPORT void fake_cuda_new_ctx(void) { __atomic_fetch_add(&ctx_gen, 1, __ATOMIC_RELAXED); }
EXPORT int fake_cuda_module_loads(void) { return __atomic_load_n(&module_loads, __ATOMIC_RELAXED); }
EXPORT int cuModuleLoadData(void** mod, const void* image) {
  if (!ctx_depth) return E_INVALID_CONTEXT;
  if (!image) return E_INVALID_VALUE;
  *mod = &fake_module;
  __atomic_fetch_add(&module_loads, 1, __ATOMIC_RELAXED);
  return 0;
}
EXPORT int cuModuleGetFunction(void** fn, void* mod, const char* name) {
  if (mod == &fake_module && !strcmp(name, DEV_STAGE_KERNEL)) {
    *fn = (void*)(uintptr_t)(1 + DEV_STAGE);
    return 0;
  }
  if (mod != &fake_module || strncmp(name, DEV_KERNEL_PREFIX, strlen(DEV_KERNEL_PREFIX))) return 500; /* NOT_FOUND */
  *fn = (void*)(uintptr_t)(1 + atoi(name + strlen(DEV_KERNEL_PREFIX)));
  return 0;
}
EXPORT int cuLaunchKernel(void* fn, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz,
                          unsigned shmem, void* s, void** params, void** extra) {
  (void)gx, (void)gz, (void)bx, (void)by, (void)bz, (void)shmem, (void)extra;
  if (!ctx_depth) return E_INVALID_CONTEXT;
  if ((uintptr_t)fn == (uintptr_t)(1 + DEV_STAGE)) {
    if (gx != 1 || gy != 1) return E_INVALID_VALUE; /* one block */
    struct op o = {.kind = OP_STAGE};
    o.stage = *(const struct dev_stage_args*)params[0];
    return enqueue(s, o);
  }
  const struct dev_args* a = params[0];
  if ((uintptr_t)fn != (uintptr_t)(1 + a->type) || gy != (unsigned)a->njobs) return E_INVALID_VALUE;
  struct op o = {.kind = OP_KERNEL};
  o.args = *a; /* copied at launch, as the driver does */
  return enqueue(s, o);
}
EXPORT int cuCtxGetDevice(int* dev) {
  if (!ctx_depth) return E_INVALID_CONTEXT;
  *dev = 0;
  return 0;
}
EXPORT int cuDeviceGetUuid_v2(unsigned char* uuid, int dev) {
  if (dev != 0) return 101;
  const char* other = getenv("FAKE_CUDA_UUID"); /* this process "is on another GPU" (its last two characters) */
  memcpy(uuid, "fake-gpu-uuid-00", 16);
  if (other && other[0]) memcpy(uuid + 14, other, other[1] ? 2 : 1);
  return 0;
}
EXPORT int cuDeviceGetAttribute(int* v, int attr, int dev) {
  if (dev != 0) return 101;
  *v = attr == 16 ? 4 : 0; /* MULTIPROCESSOR_COUNT */
  return 0;
}
/* The primary context is the fake's one context; setting it current makes the thread's stack one deep. */
EXPORT int cuDevicePrimaryCtxRetain(void** ctx, int dev) {
  if (!inited) return 3;
  if (dev != 0) return 101;
  *ctx = &fake_ctx;
  return 0;
}
EXPORT int cuCtxSetCurrent(void* ctx) {
  if (ctx && ctx != &fake_ctx) return E_INVALID_CONTEXT;
  if (!ctx) ctx_depth = 0;
  else if (!ctx_depth) ctx_depth = 1;
  return 0;
}
static uintptr_t next_stream = 0x10000;
EXPORT int cuStreamCreate(void** s, unsigned flags) {
  (void)flags;
  if (!inited) return 3;
  if (!ctx_depth) return E_INVALID_CONTEXT;
  *s = (void*)__atomic_fetch_add(&next_stream, 0x100, __ATOMIC_RELAXED);
  return 0;
}
EXPORT int cuStreamDestroy_v2(void* h) {
  struct stream* s = stream_of(h); /* its thread stays: handles are never reused */
  if (s) __atomic_store_n(&s->destroyed, 1, __ATOMIC_RELEASE);
  return 0;
}
EXPORT int cuCtxPushCurrent_v2(void* ctx) { return ctx == &fake_ctx ? (ctx_depth++, 0) : E_INVALID_CONTEXT; }
EXPORT int cuCtxPopCurrent_v2(void** ctx) {
  if (!ctx_depth) return E_INVALID_CONTEXT;
  ctx_depth--;
  if (ctx) *ctx = &fake_ctx;
  return 0;
}
/* The stand-in's host-to-device copies are done when they return: nothing else to wait for here. */
EXPORT int cuCtxSynchronize(void) { return inited ? (ctx_depth ? 0 : E_INVALID_CONTEXT) : 3; }
/* Waits for everything queued on the stream, as the driver does. */
EXPORT int cuStreamSynchronize(void* h) {
  if (!inited) return 3;
  __atomic_fetch_add(&syncs, 1, __ATOMIC_RELAXED);
  struct stream* s = stream_of(h);
  pthread_mutex_lock(&s->mu);
  while (s->head || s->running) pthread_cond_wait(&s->cv, &s->mu);
  pthread_mutex_unlock(&s->mu);
  return 0;
}
EXPORT int cuGetErrorString(int e, const char** s) {
  *s = e == 3     ? "initialization error"
       : e == 101 ? "invalid device ordinal"
       : e == 201 ? "invalid device context"
       : e == 304 ? "OS call failed or operation not supported on this OS"
                  : "fake error";
  return 0;
}
