/* Profiler plugins with NCCL's ABI (observe/profiler_abi.h, versions 7, 6 and 5, the newest a library
 * exports first, as NCCL 2.31 looks for them). NCCL_PROFILER_PLUGIN
 * names the library as NCCL reads it: unset, libnccl-profiler.so if present (silently absent);
 * "none", no plugin; else the value itself (a path or a library name), then libnccl-profiler-X.so.
 * The library is loaded once per process and shared by reference; init per communicator, finalize
 * when the communicator is freed. A plugin that does not load or init is reported, and the
 * communicator goes on without it.
 *
 * What is emitted, from the plans' hooks (core/plan.c) and the flight recorder's entries of their
 * calls: per plan, NCCL's v5-v7 tree for one outermost group on one communicator:
 *   GroupApi -> { CollApi -> Coll | P2pApi -> P2p } and Group (Coll and P2p name it as parentGroup).
 * NCCL starts the API events on the calling thread during the call; Chorus starts them when the plan
 * starts, in NCCL's order (GroupApi, its GroupStartApiStop state, each call's CollApi or P2pApi
 * started and stopped, GroupEndApiStart, then Group and the calls' Coll/P2p), because existing
 * profilers (NCCL's example among them) drop a Coll without a CollApi parent and a CollApi without a
 * GroupApi. Coll, P2p, Group and GroupApi stop when the plan finishes, children first, so their
 * span is the call's run (NCCL stops them once the work is handed to the GPU and its proxy).
 * AlltoAll, Gather and Scatter are reported as NCCL reports them: their per-peer sends and receives.
 * ProxyOp, ProxyStep, ProxyCtrl, KernelCh, KernelLaunch, NetPlugin and the copy-engine events are
 * not emitted: these hooks do not see the per-connection steps, and Chorus has no such kernels (nor
 * KernelPhase, v7's, nor symmetric kernels: a v7 Coll has kernelVariant NULL and isSymColl false).
 * A v7 plugin gets each call's ncclCollConfig_t.userProfilerTag as userTag on its CollApi or P2pApi
 * and Coll or P2p (the sends and receives of an AlltoAll, Gather or Scatter carry that call's). */
#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "../misc/log.h"
#include "../misc/names.h"
#include "../misc/param.h"
#include "../misc/plugin.h"
#include "../misc/utils.h"
#include "../net/net.h"
#include "observe.h"
#include "profiler_abi.h"

struct prof_lib {
  void* dl;
  int version;       /* 7, 6 or 5 */
  const void* iface; /* ncclProfiler_v7_t, _v6_t or _v5_t */
  const char* name;
  char path[512];  /* what dlopen accepted */
  int refs;        /* communicators using it (under once.mu) */
};

/* One call's events in the plan now running (see prof_comm). */
struct prof_item {
  void *api, *ev; /* CollApi/P2pApi and Coll/P2p handles (NULL: not started) */
  int coll;       /* 1: a Coll, 0: a P2p */
  uint64_t seq;   /* a Coll's seqNumber */
  int func;       /* FUNC_* (P2p: FUNC_SEND or FUNC_RECV) */
  int type, root; /* root, or peer */
  uint64_t count;
  uint64_t tag; /* the call's userProfilerTag (v7's userTag) */
  int16_t algo, proto, nch;
};

/* A communicator's plugin context. The plan fields are touched only by the thread running the comm's
 * current plan, between prof_plan_start and prof_plan_end: plans of one comm run one at a time (in
 * ticket order), so they need no lock. comm_free (prof_comm_fini) runs when no plan does. */
struct prof_comm {
  struct prof_lib* lib;
  void* ctx;
  uint64_t seq[FUNC_ALLREDUCE + 1]; /* the next Coll seqNumber of each collective: NCCL's comm->seqNumber */
  int open;                         /* a plan's events are started */
  int warned;                       /* out of memory for a plan's events: said once */
  uint64_t lo;                      /* its first call */
  void *group_api, *group;
  struct prof_item* items;
  int nitems, cap;
};

/* The activation mask: one int for the process at a fixed address, as NCCL's ncclProfilerEventMask.
 * Plugins write it (in init, or any time later through the pointer they kept); it is read with a
 * relaxed atomic load when a plan starts, and that value gates all the plan's events, as NCCL's copy
 * taken at each call gates that call's. */
static int prof_mask;

/* Process-wide: the loaded plugin and the last value that failed to load (reported once). */
static struct plugin_once once = PLUGIN_ONCE_INIT("NCCL_PROFILER_PLUGIN", "profiler");

int prof_candidates(const char* value, char out[2][512]) { return ut_plugin_names("profiler", value, out); }

static void* load(const char* value, char path[512]) {
  char cand[2][512];
  int n = prof_candidates(value, cand), k = 0;
  void* dl = plugin_open_logged(&once, LOG_INIT | LOG_PROFILE, value, cand, n, &k);
  if (!dl) return NULL;
  static const char* const syms[] = {"ncclProfiler_v7", "ncclProfiler_v6", "ncclProfiler_v5"};
  const void* iface = NULL;
  int version = 0;
  for (int i = 0; i < 3 && !iface; i++)
    if ((iface = dlsym(dl, syms[i]))) version = 7 - i;
  /* v5, v6 and v7 tables have the same members in the same places; only the descriptor grew. */
  const ncclProfiler_v6_t* t = iface;
  const char* missing = !iface ? "symbol" : !t->name ? "name" : !t->init ? "init" : !t->startEvent ? "startEvent"
                        : !t->stopEvent ? "stopEvent" : !t->recordEventState ? "recordEventState"
                        : !t->finalize ? "finalize" : NULL;
  if (missing) {
    int older = !iface && (dlsym(dl, "ncclProfiler_v4") || dlsym(dl, "ncclProfiler_v3"));
    WARN("NCCL_PROFILER_PLUGIN=%s: %s %s%s; continuing without a profiler plugin%s", value, cand[k],
         !iface ? "exports none of ncclProfiler_v7, ncclProfiler_v6 and ncclProfiler_v5" : "has a NULL ",
         iface ? missing : "", older ? " (it has an older version, v4 or below, which Chorus does not support)" : "");
    dlclose(dl);
    return NULL;
  }
  struct prof_lib* p = calloc(1, sizeof(*p));
  if (!p) {
    WARN("profiler plugin %s: out of memory; continuing without it", cand[k]);
    dlclose(dl);
    return NULL;
  }
  p->dl = dl, p->version = version, p->iface = iface, p->name = t->name;
  snprintf(p->path, sizeof(p->path), "%.511s", cand[k]);
  snprintf(path, 512, "%s", cand[k]);
  INFO(LOG_INIT | LOG_PROFILE, "PROFILER/Plugin: Loaded %s (v%d) from %s", p->name, version, cand[k]);
  return p;
}

/* The process's plugin for this value, loaded on first use; a reference is taken when ref. */
static struct prof_lib* get_lib(int ref) {
  const char* value = param_str(PARAM_PROFILER_PLUGIN);
  char cand[2][512];
  if (strlen(value) >= sizeof(cand[0])) {
    WARN("NCCL_PROFILER_PLUGIN is longer than %zu characters; continuing without a profiler plugin",
         sizeof(cand[0]) - 1);
    return NULL;
  }
  if (prof_candidates(value, cand) == 0) return NULL;
  pthread_mutex_lock(&once.mu);
  struct prof_lib* p = plugin_once_get(&once, value, load);
  if (p && ref) p->refs++;
  pthread_mutex_unlock(&once.mu);
  return p;
}

static void put_ref(struct prof_lib* p) {
  pthread_mutex_lock(&once.mu);
  if (--p->refs == 0) { /* as NCCL: the library goes with the last communicator */
    plugin_once_forget(&once, p);
    dlclose(p->dl);
    free(p);
  }
  pthread_mutex_unlock(&once.mu);
}

int prof_wanted(void) { return get_lib(0) != NULL; }

void prof_comm_init(struct ncclComm* comm) {
  comm->prof = NULL;
  struct prof_lib* lib = get_lib(1);
  if (!lib) return;
  struct prof_comm* p = calloc(1, sizeof(*p));
  if (!p) {
    WARN("profiler plugin %s: out of memory for rank %d; this communicator goes without it", lib->name, comm->rank);
    put_ref(lib);
    return;
  }
  void* ctx = NULL;
  const ncclProfiler_v6_t* t = lib->iface; /* init has the same type in v5 and v7 */
  ncclResult_t rc = t->init(&ctx, comm->comm_hash, &prof_mask, comm->name, comm->nnodes, comm->nranks, comm->rank,
                            ch_net_logger);
  if (rc != ncclSuccess) {
    WARN("profiler plugin %s (%s): init of communicator %016llx rank %d returned %d; this communicator goes "
         "without it", lib->name, lib->path, (unsigned long long)comm->comm_hash, comm->rank, (int)rc);
    free(p);
    put_ref(lib);
    return;
  }
  /* Kinds an older plugin does not know: NCCL clears their bits after its init (v5: the copy-engine
   * events and KernelPhase, v6: KernelPhase). A v7 plugin that wants KernelPhase gets KernelCh too, which
   * NCCL turns on for it (a phase is part of a channel's event); neither is emitted here. */
  if (lib->version < 7) {
    int older =
        ncclProfileKernelPhase | (lib->version == 5 ? ncclProfileCeColl | ncclProfileCeSync | ncclProfileCeBatch : 0);
    __atomic_fetch_and(&prof_mask, ~older, __ATOMIC_RELAXED);
  } else if ((__atomic_load_n(&prof_mask, __ATOMIC_RELAXED) & (ncclProfileKernelPhase | ncclProfileKernelCh)) ==
             ncclProfileKernelPhase) {
    __atomic_fetch_or(&prof_mask, ncclProfileKernelCh, __ATOMIC_RELAXED);
    INFO(LOG_INIT | LOG_PROFILE, "profiler plugin %s asked for KernelPhase events: KernelCh is on too, as in NCCL",
         lib->name);
  }
  p->lib = lib, p->ctx = ctx;
  comm->prof = p;
  if (comm->rank == 0)
    INFO(LOG_INIT | LOG_PROFILE, "profiler plugin %s (v%d) for communicator %016llx; event mask 0x%x", lib->name,
         lib->version, (unsigned long long)comm->comm_hash, __atomic_load_n(&prof_mask, __ATOMIC_RELAXED));
}

/* ---- events ---- */

/* d in v6's form; tag: the call's userProfilerTag, which only v7 carries. */
static void* ev_start(struct prof_comm* p, ncclProfilerEventDescr_v6_t* d, uint64_t tag) {
  void* h = NULL; /* startEvent may leave it: no event */
  if (p->lib->version == 7) {
    ncclProfilerEventDescr_v7_t d7; /* v6's members sit where v7's do (profiler_abi.h); the rest appended */
    memset(&d7, 0, sizeof(d7));
    memcpy(&d7, d, sizeof(*d));
    if (d->type == ncclProfileCollApi) d7.collApi.userTag = tag;
    else if (d->type == ncclProfileP2pApi) d7.p2pApi.userTag = tag;
    else if (d->type == ncclProfileColl) d7.coll.userTag = tag; /* kernelVariant NULL, isSymColl false */
    else if (d->type == ncclProfileP2p) d7.p2p.userTag = tag;
    ((const ncclProfiler_v7_t*)p->lib->iface)->startEvent(p->ctx, &h, &d7);
  } else if (p->lib->version == 6) {
    ((const ncclProfiler_v6_t*)p->lib->iface)->startEvent(p->ctx, &h, d);
  } else {
    ncclProfilerEventDescr_v5_t d5; /* v5's members sit where v6's do */
    _Static_assert(sizeof(d5) == sizeof(*d), "v5 and v6 descriptors differ in size");
    memcpy(&d5, d, sizeof(d5));
    ((const ncclProfiler_v5_t*)p->lib->iface)->startEvent(p->ctx, &h, &d5);
  }
  return h; /* return values are ignored, as NCCL does */
}
static void ev_stop(struct prof_comm* p, void* h) {
  if (h) ((const ncclProfiler_v6_t*)p->lib->iface)->stopEvent(h);
}
static void ev_state(struct prof_comm* p, void* h, ncclProfilerEventState_t s) {
  if (h) ((const ncclProfiler_v6_t*)p->lib->iface)->recordEventState(h, s, NULL); /* GroupApi: no args, as NCCL */
}

/* NCCL's spellings (its ncclDatatypeToString, ncclAlgoToString, ncclProtoToString). ncclUint8 is
 * "ncclUint8" here, where NCCL's table misses it ("Unknown"). */
static const char* dtype_str(int t) {
  static const char* const n[] = {"ncclInt8", "ncclUint8", "ncclInt32", "ncclUint32", "ncclInt64", "ncclUint64",
                                  "ncclFloat16", "ncclFloat32", "ncclFloat64", "ncclBfloat16", "ncclFloat8e4m3",
                                  "ncclFloat8e5m2"};
  _Static_assert(sizeof(n) / sizeof(n[0]) == CH_NTYPES, "a datatype without its NCCL name");
  return t >= 0 && t < CH_NTYPES ? n[t] : "Unknown";
}
/* Tree and Ring as NCCL spells them; Chorus's own algorithms by their names in capitals. */
static const char* algo_str(int a) {
  static const char* const n[] = {"TREE", "RING", "EXCHANGE", "DIRECT", "RECDBL", "RABENSEIFNER", "OWNER"};
  _Static_assert(sizeof(n) / sizeof(n[0]) == CH_NALGO, "an algorithm without its profiler name");
  return a >= 0 && a < CH_NALGO ? n[a] : "Unknown";
}
static const char* proto_str(int p) {
  static const char* const n[] = {"LL", "LL128", "SIMPLE"};
  _Static_assert(sizeof(n) / sizeof(n[0]) == CH_NPROTOS, "a protocol without its NCCL name");
  return p >= 0 && p < CH_NPROTOS ? n[p] : "Unknown";
}

static int add_item(struct prof_comm* p, int coll, int func, const struct fr_entry* e, int peer) {
  if (p->nitems == p->cap) {
    int cap = p->cap ? 2 * p->cap : 16;
    struct prof_item* it = realloc(p->items, sizeof(*it) * (size_t)cap);
    if (!it) return 0;
    p->items = it, p->cap = cap;
  }
  p->items[p->nitems++] = (struct prof_item){.coll = coll,
                                             .func = func,
                                             .type = e->type,
                                             .root = peer,
                                             .count = e->count,
                                             .tag = e->tag,
                                             .algo = e->algo,
                                             .proto = e->proto,
                                             .nch = e->nch};
  return 1;
}

/* A call as NCCL's tasks: one Coll, or the sends and receives NCCL makes of it. */
static int add_call(struct prof_comm* p, const struct fr_entry* e, int rank, int nranks) {
  int ok = 1;
  switch (e->func) {
    case FUNC_SEND: case FUNC_RECV: return add_item(p, 0, e->func, e, e->root);
    case FUNC_ALLTOALL:
      for (int r = 0; r < nranks && ok; r++) ok = add_item(p, 0, FUNC_SEND, e, r) && add_item(p, 0, FUNC_RECV, e, r);
      return ok;
    case FUNC_GATHER:
      ok = add_item(p, 0, FUNC_SEND, e, e->root);
      for (int r = 0; r < nranks && ok && rank == e->root; r++) ok = add_item(p, 0, FUNC_RECV, e, r);
      return ok;
    case FUNC_SCATTER:
      for (int r = 0; r < nranks && ok && rank == e->root; r++) ok = add_item(p, 0, FUNC_SEND, e, r);
      return ok && add_item(p, 0, FUNC_RECV, e, e->root);
    default:
      /* NCCL drops an empty collective before it makes any event */
      return e->func > FUNC_ALLREDUCE || e->count == 0 || add_item(p, 1, e->func, e, e->root);
  }
}

#define M_NET (ncclProfileProxyOp | ncclProfileProxyStep | ncclProfileKernelCh | ncclProfileNetPlugin)
#define M_CE (ncclProfileCeColl | ncclProfileCeSync | ncclProfileCeBatch)
#define M_ALL ((1 << 15) - 1) /* every kind up to v6 (GroupApi is not gated on v7's KernelPhase, as in NCCL) */

void prof_plan_start(struct ncclComm* comm, uint64_t lo, uint64_t hi) {
  struct prof_comm* p = comm->prof;
  if (!lo || p->open) return; /* calls not recorded; or (never) a plan whose end was not seen */
  p->nitems = 0;
  for (uint64_t id = lo; id <= hi; id++) {
    struct fr_entry e;
    if (!fr_get(comm, id, &e) || e.state != FR_STARTED) continue; /* not this plan's (a no-op call), or lost */
    if (!add_call(p, &e, comm->rank, comm->nranks)) {
      if (!p->warned)
        WARN("profiler plugin %s: out of memory for the events of %llu calls; rank %d reports none of them",
             p->lib->name, (unsigned long long)(hi - lo + 1), comm->rank);
      p->warned = 1;
      return;
    }
  }
  /* NCCL counts every collective, whether its event is wanted or not. */
  for (int i = 0; i < p->nitems; i++)
    if (p->items[i].coll) p->items[i].seq = p->seq[p->items[i].func]++;
  /* Each kind is started when its bit or a descendant's is set (NCCL's gating, 2.29). */
  int mask = __atomic_load_n(&prof_mask, __ATOMIC_RELAXED);
  int m_group_api = mask & (M_ALL & ~ncclProfileProxyCtrl);
  int m_coll_api = mask & (ncclProfileCollApi | ncclProfileColl | M_NET | M_CE);
  int m_p2p_api = mask & (ncclProfileP2pApi | ncclProfileP2p | M_NET);
  int m_group = mask & (ncclProfileGroup | ncclProfileColl | ncclProfileP2p | M_NET);
  int m_coll = mask & (ncclProfileColl | M_NET), m_p2p = mask & (ncclProfileP2p | M_NET);
  ncclProfilerEventDescr_v6_t d;
  p->open = 1, p->lo = lo, p->group_api = p->group = NULL;
  if (p->nitems && m_group_api) {
    memset(&d, 0, sizeof(d));
    d.type = ncclProfileGroupApi;
    d.groupApi.groupDepth = hi > lo ? 2 : 1; /* several calls: the application grouped them */
    p->group_api = ev_start(p, &d, 0);
    ev_state(p, p->group_api, ncclProfilerGroupStartApiStop);
  }
  for (int i = 0; i < p->nitems; i++) {
    struct prof_item* it = &p->items[i];
    it->api = it->ev = NULL;
    if (!(it->coll ? m_coll_api : m_p2p_api)) continue;
    memset(&d, 0, sizeof(d));
    d.parentObj = p->group_api;
    if (it->coll) {
      d.type = ncclProfileCollApi;
      d.collApi.func = ch_func_name(it->func), d.collApi.count = it->count, d.collApi.datatype = dtype_str(it->type);
      d.collApi.root = it->root;
    } else {
      d.type = ncclProfileP2pApi;
      d.p2pApi.func = ch_func_name(it->func), d.p2pApi.count = it->count, d.p2pApi.datatype = dtype_str(it->type);
    }
    it->api = ev_start(p, &d, it->tag);
    ev_stop(p, it->api); /* as NCCL: the API event ends with the call; it stays the task's parent */
  }
  ev_state(p, p->group_api, ncclProfilerGroupEndApiStart);
  if (p->nitems && m_group) {
    memset(&d, 0, sizeof(d));
    d.type = ncclProfileGroup;
    p->group = ev_start(p, &d, 0);
  }
  for (int i = 0; i < p->nitems; i++) {
    struct prof_item* it = &p->items[i];
    if (!(it->coll ? m_coll : m_p2p)) continue;
    memset(&d, 0, sizeof(d));
    d.parentObj = it->api, d.rank = comm->rank;
    if (it->coll) {
      /* NCCL moves AllGather and Broadcast as bytes */
      int bytes = it->func == FUNC_ALLGATHER || it->func == FUNC_BROADCAST;
      d.type = ncclProfileColl;
      d.coll.seqNumber = it->seq, d.coll.func = ch_func_name(it->func);
      d.coll.count = bytes ? it->count * (uint64_t)ch_type_bytes(it->type) : it->count;
      d.coll.datatype = bytes ? "ncclInt8" : dtype_str(it->type);
      d.coll.root = it->root, d.coll.nChannels = (uint8_t)(it->nch > 0 ? it->nch : 1);
      d.coll.algo = algo_str(it->algo), d.coll.proto = proto_str(it->proto), d.coll.parentGroup = p->group;
    } else {
      d.type = ncclProfileP2p;
      d.p2p.func = ch_func_name(it->func), d.p2p.datatype = dtype_str(it->type), d.p2p.count = it->count;
      d.p2p.peer = it->root, d.p2p.nChannels = 1, d.p2p.parentGroup = p->group;
    }
    it->ev = ev_start(p, &d, it->tag);
  }
}

/* Stop the open plan's events, children before parents. */
static void close_plan(struct prof_comm* p) {
  for (int i = 0; i < p->nitems; i++) ev_stop(p, p->items[i].ev);
  ev_stop(p, p->group);
  ev_stop(p, p->group_api);
  p->open = 0, p->nitems = 0, p->group = p->group_api = NULL;
}

void prof_plan_end(struct ncclComm* comm, uint64_t lo, uint64_t hi, ch_status st) {
  (void)hi, (void)st; /* no v5-v7 state says a call failed */
  struct prof_comm* p = comm->prof;
  if (p->open && p->lo == lo) close_plan(p); /* else a plan that never started (cancelled) */
}

void prof_comm_fini(struct ncclComm* comm) {
  struct prof_comm* p = comm->prof;
  if (!p) return;
  if (p->open) close_plan(p); /* every start has its stop */
  if (p->ctx) { /* NCCL finalizes only a context init gave */
    ncclResult_t rc = ((const ncclProfiler_v6_t*)p->lib->iface)->finalize(p->ctx);
    if (rc != ncclSuccess)
      INFO(LOG_INIT | LOG_PROFILE, "profiler plugin %s: finalize of rank %d returned %d", p->lib->name, comm->rank,
           (int)rc);
  }
  put_ref(p->lib);
  free(p->items);
  free(p);
  comm->prof = NULL;
}
