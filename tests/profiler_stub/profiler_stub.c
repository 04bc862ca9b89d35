/* A profiler plugin for tests/test_profiler.c, built against NCCL's ABI as Chorus declares it
 * (observe/profiler_abi.h): exports ncclProfiler_v6, or only ncclProfiler_v5 when built with
 * STUB_V5, or only ncclProfiler_v7 with STUB_V7. It checks the event stream as it comes, and when a communicator is finalized appends one
 * line for it to the file CHORUS_TEST_PROFILER_OUT names (one write on an O_APPEND descriptor, so
 * ranks that are processes share the file):
 *
 *   ctx v=6 rank=R nranks=N nnodes=H commId=X mask=0x.. GroupApi=a CollApi=b P2pApi=c Group=d Coll=e
 *       P2p=f other=g open=h errors=k colls=F:seq:count:type:root:algo:proto:nch;... p2ps=F:peer:count:type;...
 *       tags=<v7: cT, or pT, per Coll or P2p in start order (T its userTag)> err=<the first error, or none>
 *
 * The checks (each failure counts in errors, the first is quoted): every handle passed back is one
 * this plugin gave and is not stopped twice; a GroupApi has no parent and gets GroupStartApiStop then
 * GroupEndApiStart; a CollApi/P2pApi's parent is an open GroupApi past GroupStartApiStop; a Group has
 * no parent; a Coll's parent is a CollApi (NCCL stops that one before the Coll starts) of the same
 * function and its parentGroup an open Group; a P2p likewise with a P2pApi; parents stop after their
 * open children; Coll seqNumbers count from 0 per function; AllGather/Broadcast Colls are in bytes of
 * ncclInt8; every event's kind is wanted by the mask; at finalize nothing is left open; v7: a Coll or
 * P2p has its API event's userTag, and a Coll no kernelVariant nor isSymColl.
 *
 * Environment: CHORUS_TEST_PROFILER_MASK (the activation mask init sets; default every kind),
 * CHORUS_TEST_PROFILER_FAIL_INIT=1 (init fails). */
#include <fcntl.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "observe/profiler_abi.h"

#define EXPORT __attribute__((visibility("default")))
#define POOL 4096
#define NKINDS 16
#define EV_MAGIC 0x50524f46u

struct ctx;
struct ev {
  uint32_t magic;
  int kind; /* bit index */
  struct ctx* ctx;
  struct ev *parent, *group;
  int stopped, open_children, last_state, api_children;
  const char* func;
  size_t count;
  const char* datatype;
  uint64_t tag; /* v7: an API event's userTag */
};

struct ctx {
  struct ctx* next;
  int rank, nranks, nnodes;
  uint64_t comm_id;
  int* mask;
  int counts[NKINDS], other, errors, nev;
  uint64_t seq[8];
  char colls[2048], p2ps[2048], tags[1024], err[256];
  struct ev pool[POOL];
};

/* One lock for everything: the stub's cost does not matter, and handles are checked against every context. */
static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static struct ctx* ctxs;

static void fail(struct ctx* c, const char* fmt, ...) __attribute__((format(printf, 2, 3)));
static void fail(struct ctx* c, const char* fmt, ...) {
  if (c->errors++) return;
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(c->err, sizeof(c->err), fmt, ap);
  va_end(ap);
}

static int kind_of(uint64_t type) {
  for (int k = 0; k < NKINDS; k++)
    if (type == (1ull << k)) return k;
  return -1;
}

/* The handle's event if it is one of ours (from a live context), else NULL. */
static struct ev* lookup(void* h) {
  for (struct ctx* c = ctxs; c; c = c->next)
    if ((char*)h >= (char*)c->pool && (char*)h < (char*)(c->pool + POOL)) {
      struct ev* e = h;
      return ((char*)h - (char*)c->pool) % sizeof(struct ev) == 0 && e->magic == EV_MAGIC ? e : NULL;
    }
  return NULL;
}
static int live(struct ctx* c) {
  for (struct ctx* x = ctxs; x; x = x->next)
    if (x == c) return 1;
  return 0;
}

static int func_index(const char* f) {
  static const char* const n[] = {"Broadcast", "Reduce", "AllGather", "ReduceScatter", "AllReduce"};
  for (int i = 0; f && i < 5; i++)
    if (!strcmp(f, n[i])) return i;
  return -1;
}
static size_t type_bytes(const char* t) {
  if (!t) return 0;
  if (strstr(t, "64")) return 8;
  if (strstr(t, "32")) return 4;
  if (strstr(t, "16")) return 2;
  return 1;
}

static void append(char* buf, size_t cap, const char* fmt, ...) __attribute__((format(printf, 3, 4)));
static void append(char* buf, size_t cap, const char* fmt, ...) {
  size_t at = strlen(buf);
  va_list ap;
  va_start(ap, fmt);
  if (at < cap) vsnprintf(buf + at, cap - at, fmt, ap);
  va_end(ap);
}

/* The bits that make NCCL emit a kind (its own, or a descendant's). */
static int wanted_by(int kind) {
  const int net = ncclProfileProxyOp | ncclProfileProxyStep | ncclProfileKernelCh | ncclProfileNetPlugin;
  switch (1 << kind) {
    case ncclProfileGroupApi: return 0x7fff & ~ncclProfileProxyCtrl;
    case ncclProfileCollApi: return ncclProfileCollApi | ncclProfileColl | net | 0x7000;
    case ncclProfileP2pApi: return ncclProfileP2pApi | ncclProfileP2p | net;
    case ncclProfileGroup: return ncclProfileGroup | ncclProfileColl | ncclProfileP2p | net;
    case ncclProfileColl: return ncclProfileColl | net;
    case ncclProfileP2p: return ncclProfileP2p | net;
    default: return 1 << kind;
  }
}

static ncclResult_t stub_init(void** context, uint64_t commId, int* mask, const char* commName, int nNodes, int nranks,
                              int rank, ncclDebugLogger_t logfn) {
  *context = NULL;
  const char* f = getenv("CHORUS_TEST_PROFILER_FAIL_INIT");
  if (f && *f == '1') return ncclInternalError;
  struct ctx* c = calloc(1, sizeof(*c));
  if (!c) return ncclSystemError;
  c->rank = rank, c->nranks = nranks, c->nnodes = nNodes, c->comm_id = commId, c->mask = mask;
  if (!commName) fail(c, "init: commName is NULL");
  if (!mask) fail(c, "init: no mask pointer");
  if (!logfn) fail(c, "init: no logger");
  if (commId == 0 || nranks < 1 || rank < 0 || rank >= nranks || nNodes < 1 || nNodes > nranks)
    fail(c, "init: commId %llx rank %d nranks %d nNodes %d", (unsigned long long)commId, rank, nranks, nNodes);
  const char* m = getenv("CHORUS_TEST_PROFILER_MASK");
  if (mask) __atomic_store_n(mask, m && *m ? (int)strtol(m, NULL, 0) : 0x7fff, __ATOMIC_RELAXED);
  if (logfn) logfn(NCCL_LOG_INFO, 0x4000 /* NCCL_PROFILE */, __FILE__, __LINE__, "profiler stub: rank %d of %d", rank, nranks);
  pthread_mutex_lock(&mu);
  c->next = ctxs, ctxs = c;
  pthread_mutex_unlock(&mu);
  *context = c;
  return ncclSuccess;
}

/* Checks a new event against its descriptor (d7: the v7 one, NULL from an older host view); fills e. */
static void check_start(struct ctx* c, struct ev* e, const ncclProfilerEventDescr_v5_t* d,
                        const ncclProfilerEventDescr_v7_t* d7) {
  struct ev* parent = d->parentObj ? lookup(d->parentObj) : NULL;
  if (d->parentObj && !parent) fail(c, "kind %d: parentObj %p is no handle of ours", e->kind, d->parentObj);
  e->parent = parent;
  int mask = __atomic_load_n(c->mask, __ATOMIC_RELAXED);
  if (!(mask & wanted_by(e->kind))) fail(c, "kind %d started while mask 0x%x does not want it", e->kind, mask);
  switch (1 << e->kind) {
    case ncclProfileGroupApi:
    case ncclProfileGroup:
      if (d->parentObj) fail(c, "kind %d has a parent", e->kind);
      if ((1 << e->kind) == ncclProfileGroupApi && d->groupApi.groupDepth < 1) fail(c, "GroupApi depth %d", d->groupApi.groupDepth);
      break;
    case ncclProfileCollApi:
    case ncclProfileP2pApi: {
      int coll = (1 << e->kind) == ncclProfileCollApi;
      if (!parent || parent->kind != 8 || parent->stopped || parent->last_state != ncclProfilerGroupStartApiStop)
        fail(c, "%sApi's parent is not an open GroupApi past GroupStartApiStop", coll ? "Coll" : "P2p");
      else
        parent->open_children++, e->group = parent;
      e->func = coll ? d->collApi.func : d->p2pApi.func;
      e->count = coll ? d->collApi.count : d->p2pApi.count;
      e->datatype = coll ? d->collApi.datatype : d->p2pApi.datatype;
      if (d7) e->tag = coll ? d7->collApi.userTag : d7->p2pApi.userTag;
      if (!e->func || !e->datatype) fail(c, "an API event without func or datatype");
      break;
    }
    case ncclProfileColl:
    case ncclProfileP2p: {
      int coll = (1 << e->kind) == ncclProfileColl;
      struct ev* g = lookup(coll ? d->coll.parentGroup : d->p2p.parentGroup);
      const char* func = coll ? d->coll.func : d->p2p.func;
      if (!parent || parent->kind != (coll ? 9 : 10) || parent->api_children++)
        fail(c, "%s's parent is not a fresh %sApi", coll ? "Coll" : "P2p", coll ? "Coll" : "P2p");
      else if (!func || !parent->func || strcmp(func, parent->func))
        fail(c, "%s func %s under an API event for %s", coll ? "Coll" : "P2p", func ? func : "(null)", parent->func);
      if (!g || g->kind != 0 || g->stopped)
        fail(c, "%s's parentGroup is not an open Group", coll ? "Coll" : "P2p");
      else
        g->open_children++, e->group = g;
      if (d->rank != c->rank) fail(c, "%s rank %d, context's %d", coll ? "Coll" : "P2p", d->rank, c->rank);
      if (d7) {
        uint64_t tag = coll ? d7->coll.userTag : d7->p2p.userTag;
        if (parent && tag != parent->tag)
          fail(c, "%s userTag %llu under an API event tagged %llu", coll ? "Coll" : "P2p", (unsigned long long)tag,
               (unsigned long long)parent->tag);
        if (coll && (d7->coll.kernelVariant || d7->coll.isSymColl)) fail(c, "Coll with a symmetric kernel");
        append(c->tags, sizeof(c->tags), "%c%llu;", coll ? 'c' : 'p', (unsigned long long)tag);
      }
      if (coll) {
        int fi = func_index(func);
        if (fi < 0) {
          fail(c, "Coll func %s", func ? func : "(null)");
          break;
        }
        if (d->coll.seqNumber != c->seq[fi]) fail(c, "%s seqNumber %llu, expected %llu", func,
                                                  (unsigned long long)d->coll.seqNumber, (unsigned long long)c->seq[fi]);
        c->seq[fi] = d->coll.seqNumber + 1;
        int bytes = fi == 0 || fi == 2;
        if (!d->coll.datatype || !d->coll.algo || !d->coll.proto || !strcmp(d->coll.algo, "Unknown") ||
            !strcmp(d->coll.proto, "Unknown") || d->coll.nChannels < 1)
          fail(c, "%s: datatype, algo, proto or nChannels missing", func);
        else if (parent && bytes && (strcmp(d->coll.datatype, "ncclInt8") ||
                                     d->coll.count != parent->count * type_bytes(parent->datatype)))
          fail(c, "%s: %zu %s, not the API's %zu %s as bytes", func, d->coll.count, d->coll.datatype, parent->count,
               parent->datatype);
        append(c->colls, sizeof(c->colls), "%s:%llu:%zu:%s:%d:%s:%s:%d;", func, (unsigned long long)d->coll.seqNumber,
               d->coll.count, d->coll.datatype ? d->coll.datatype : "-", d->coll.root, d->coll.algo ? d->coll.algo : "-",
               d->coll.proto ? d->coll.proto : "-", d->coll.nChannels);
      } else {
        if (d->p2p.peer < 0 || d->p2p.peer >= c->nranks) fail(c, "P2p peer %d", d->p2p.peer);
        append(c->p2ps, sizeof(c->p2ps), "%s:%d:%zu:%s;", func ? func : "-", d->p2p.peer, d->p2p.count,
               d->p2p.datatype ? d->p2p.datatype : "-");
      }
      break;
    }
    default: fail(c, "unexpected kind %d", e->kind);
  }
}

static ncclResult_t start(void* context, void** eHandle, const ncclProfilerEventDescr_v5_t* d,
                          const ncclProfilerEventDescr_v7_t* d7) {
  *eHandle = NULL;
  pthread_mutex_lock(&mu);
  struct ctx* c = context;
  if (!c || !live(c)) goto out; /* not ours: nothing to record it in */
  int k = kind_of(d->type);
  if (k < 0) {
    fail(c, "type 0x%llx is not one kind", (unsigned long long)d->type);
    goto out;
  }
  c->counts[k]++;
  if (c->nev == POOL) {
    c->other++; /* dropped, as a plugin whose pool is empty does */
    goto out;
  }
  struct ev* e = &c->pool[c->nev++];
  memset(e, 0, sizeof(*e));
  e->magic = EV_MAGIC, e->kind = k, e->ctx = c, e->last_state = -1;
  check_start(c, e, d, d7);
  *eHandle = e;
out:
  pthread_mutex_unlock(&mu);
  return ncclSuccess;
}

/* v6's descriptor is v5's with members appended to the union, and v7's members are v6's with fields
 * appended: the v5 view reads the first bytes of either. */
#if defined(STUB_V5)
static ncclResult_t stub_start(void* context, void** eHandle, ncclProfilerEventDescr_v5_t* d) {
  return start(context, eHandle, d, NULL);
}
#elif defined(STUB_V7)
static ncclResult_t stub_start(void* context, void** eHandle, ncclProfilerEventDescr_v7_t* d) {
  ncclProfilerEventDescr_v5_t v5;
  memcpy(&v5, d, sizeof(v5));
  return start(context, eHandle, &v5, d);
}
#else
static ncclResult_t stub_start(void* context, void** eHandle, ncclProfilerEventDescr_v6_t* d) {
  ncclProfilerEventDescr_v5_t v5;
  memcpy(&v5, d, sizeof(v5));
  return start(context, eHandle, &v5, NULL);
}
#endif

static ncclResult_t stub_stop(void* h) {
  pthread_mutex_lock(&mu);
  struct ev* e = lookup(h);
  if (e) {
    struct ctx* c = e->ctx;
    if (e->stopped) fail(c, "kind %d stopped twice", e->kind);
    if (e->open_children) fail(c, "kind %d stopped before %d of its children", e->kind, e->open_children);
    if (e->kind == 8 && e->last_state != ncclProfilerGroupEndApiStart) fail(c, "GroupApi stopped without GroupEndApiStart");
    if (!e->stopped && e->group) e->group->open_children--;
    e->stopped = 1;
  } else {
    for (struct ctx* c = ctxs; c; c = c->next) fail(c, "stop of a handle %p that is not ours", h);
  }
  pthread_mutex_unlock(&mu);
  return ncclSuccess;
}

static ncclResult_t stub_state(void* h, ncclProfilerEventState_t s, ncclProfilerEventStateArgs_v5_t* args) {
  pthread_mutex_lock(&mu);
  struct ev* e = lookup(h);
  if (e) {
    struct ctx* c = e->ctx;
    int want = e->last_state < 0 ? ncclProfilerGroupStartApiStop : ncclProfilerGroupEndApiStart;
    if (e->kind != 8 || e->stopped || (int)s != want || args)
      fail(c, "state %d (args %p) on kind %d (stopped %d, last state %d)", (int)s, (void*)args, e->kind, e->stopped,
           e->last_state);
    e->last_state = s;
  }
  pthread_mutex_unlock(&mu);
  return ncclSuccess;
}

static ncclResult_t stub_finalize(void* context) {
  pthread_mutex_lock(&mu);
  struct ctx* c = context;
  struct ctx** pp = &ctxs;
  while (*pp && *pp != c) pp = &(*pp)->next;
  if (!*pp) {
    pthread_mutex_unlock(&mu);
    return ncclInvalidArgument;
  }
  *pp = c->next;
  pthread_mutex_unlock(&mu);
  int nopen = 0;
  for (int i = 0; i < c->nev; i++) nopen += !c->pool[i].stopped;
  if (nopen) fail(c, "%d events never stopped", nopen);
  char line[8192];
  int n = snprintf(line, sizeof(line),
                   "ctx v=%d rank=%d nranks=%d nnodes=%d commId=%016llx mask=0x%x GroupApi=%d CollApi=%d P2pApi=%d "
                   "Group=%d Coll=%d P2p=%d other=%d open=%d errors=%d colls=%s p2ps=%s tags=%s err=%s\n",
#if defined(STUB_V5)
                   5,
#elif defined(STUB_V7)
                   7,
#else
                   6,
#endif
                   c->rank, c->nranks, c->nnodes, (unsigned long long)c->comm_id,
                   __atomic_load_n(c->mask, __ATOMIC_RELAXED), c->counts[8], c->counts[9], c->counts[10], c->counts[0],
                   c->counts[1], c->counts[2],
                   c->other + c->counts[3] + c->counts[4] + c->counts[5] + c->counts[6] + c->counts[7] + c->counts[11] +
                       c->counts[12] + c->counts[13] + c->counts[14] + c->counts[15],
                   nopen, c->errors, c->colls, c->p2ps, c->tags, c->errors ? c->err : "none");
  const char* out = getenv("CHORUS_TEST_PROFILER_OUT");
  int fd = out && *out ? open(out, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0600) : -1;
  if (fd >= 0) {
    if (write(fd, line, (size_t)(n < (int)sizeof(line) ? n : (int)sizeof(line) - 1)) < 0) n = -1;
    close(fd);
  }
  free(c);
  return ncclSuccess;
}

#if defined(STUB_V5)
EXPORT const ncclProfiler_v5_t ncclProfiler_v5 = {
    "chorus-test-stub-v5", stub_init, stub_start, stub_stop, stub_state, stub_finalize};
#elif defined(STUB_V7)
EXPORT const ncclProfiler_v7_t ncclProfiler_v7 = {"chorus-test-stub-v7", stub_init, stub_start, stub_stop, stub_state,
                                                  stub_finalize};
#else
EXPORT const ncclProfiler_v6_t ncclProfiler_v6 = {
    "chorus-test-stub", stub_init, stub_start, stub_stop, stub_state, stub_finalize};
#endif
