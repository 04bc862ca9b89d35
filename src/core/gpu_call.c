/* Ranks on one GPU (gpu.h): one call, from its description at enqueue to its pointer table. */
#include <stdlib.h>
#include <string.h>
#include <stddef.h>

#include "../misc/log.h"
#include "../misc/utils.h"
#include "api.h"
#include "gpu.h"

/* The calls that run on the GPU (Send/Recv go through host memory). */
static int on_gpu(int f) { return (f >= 0 && f <= FUNC_ALLREDUCE) || (f >= FUNC_ALLTOALL && f <= FUNC_GATHER); }

static const char* fname(int f) {
  static const char* n[] = {"ncclBroadcast", "ncclReduce", "ncclAllGather", "ncclReduceScatter", "ncclAllReduce",
                            "?", "?", "?", "ncclAlltoAll", "ncclScatter", "ncclGather"};
  return on_gpu(f) ? n[f] : "another call";
}

/* Decided from what every rank knows alike (the comm and the call), never from one rank's buffers:
 * a buffer that cannot take part (another device's) fails the call on every rank instead. */
int gpu_takes(const struct ch_task* t) { return t->comm->gpu && t->count > 0 && on_gpu(t->func); }

/* Describe one buffer of this rank: its place in its allocation, and an IPC handle of the
 * allocation when some rank is another process (kept per allocation: the driver's buffer id). */
static ch_status describe(struct gpu_comm* g, const void* p, struct gpu_buf_desc* d) {
  uintptr_t base;
  size_t size;
  void* ctx = NULL;
  int dev = -1, cu = cudev_describe(p, &ctx, &dev, &base, &size, &d->id);
  if (cu > 0) {
    WARN("cuPointerGetAttributes(%p) failed: %s (%d)", p, cudrv_errstr(cu), cu);
    return CH_SYSTEM;
  }
  /* Memory of another context, or cuMemCreate memory (no context) of another device: not here. Every
   * rank fails the call, naming this buffer. */
  if (cu || (ctx ? ctx != g->ctx : dev != g->ordinal)) {
    d->foreign = 1;
    return CH_OK;
  }
  d->present = 1, d->off = (uintptr_t)p - base, d->ptr = (uintptr_t)p, d->base = base;
  d->shareable = ctx != NULL; /* cuMemCreate memory (no context) is not for legacy CUDA IPC */
  if (!g->any_proc || !d->shareable) return CH_OK;
  int k = 0;
  while (k < g->nown && g->own[k].id != d->id) k++;
  if (k == g->nown) {
    cudev_ipc_handle h;
    if (cudev_ipc_get(base, g->ctx, &h) != CH_OK) {
      d->shareable = 0; /* the bridge fails the call on every rank, naming this buffer */
      return CH_OK;
    }
    k = g->nown < (int)(sizeof(g->own) / sizeof(g->own[0])) ? g->nown++ : (int)(d->id % g->nown);
    g->own[k].id = d->id, g->own[k].h = h;
  }
  d->h = g->own[k].h;
  return CH_OK;
}

ch_status gpu_in(struct ch_task* t, int needs_send, int needs_recv, const char* fn) {
  struct gpu_comm* g = t->comm->gpu;
  int capturing = 0;
  CHECK(cudrv_capturing(t->stream, g->ctx, &capturing));
  if (capturing) {
    WARN("%s: stream %p is being captured into a CUDA graph: Chorus orders calls between ranks from the host, "
         "which a graph cannot replay; make this call outside the capture (rank %d)", fn, (void*)t->stream, g->rank);
    return CH_INVALID_USAGE;
  }
  struct gpu_call* c = calloc(1, sizeof(*c) + (size_t)g->n * sizeof(c->all[0]));
  if (!c) return CH_SYSTEM;
  c->g = g, c->func = t->func, c->type = t->type, c->root = t->root, c->count = t->count, c->stream = t->stream;
  if (t->func == FUNC_ALLREDUCE || t->func == FUNC_REDUCE || t->func == FUNC_REDUCESCATTER) c->red = t->red;
  else c->red.kind = RED_SUM;
  c->ptr[DEV_SEND] = needs_send ? t->sendbuff : NULL;
  c->ptr[DEV_RECV] = needs_recv ? t->recvbuff : NULL;
  struct gpu_desc* m = &c->mine;
  m->func = (uint32_t)c->func, m->type = (uint32_t)c->type, m->op_kind = (uint32_t)c->red.kind, m->count = c->count;
  m->root = c->func == FUNC_BROADCAST || c->func == FUNC_REDUCE || c->func == FUNC_GATHER || c->func == FUNC_SCATTER
                ? c->root
                : -1;
  m->stream = (uint64_t)(uintptr_t)c->stream;
  if (red_type_is_float(c->type)) memcpy(&m->scalar, &c->red.scalar_f, sizeof(m->scalar));
  else memcpy(&m->scalar, &c->red.scalar_i, sizeof(m->scalar));
  for (int b = 0; b < 2; b++) {
    if (!c->ptr[b]) continue;
    if (b == DEV_RECV && c->ptr[DEV_RECV] == c->ptr[DEV_SEND]) { /* in place: the same description */
      m->buf[DEV_RECV] = m->buf[DEV_SEND];
      continue;
    }
    ch_status s = describe(g, c->ptr[b], &m->buf[b]);
    if (s != CH_OK) {
      free(c);
      return s;
    }
  }
  /* The call becomes the allgather of the descriptions: it runs on the bridge, in this communicator's
   * order of calls, and the stream's part is queued at launch (gpu_launch). */
  t->gpu = c;
  t->func = FUNC_ALLGATHER, t->type = ncclUint8, t->count = sizeof(struct gpu_desc), t->root = 0, t->op = ncclSum;
  t->sendbuff = &c->mine, t->recvbuff = c->all;
  INFO(LOG_COLL, "%s: device buffers of %d rank(s) on one GPU: the call runs there", fn, g->n);
  return CH_OK;
}

void gpu_drop(struct ch_task* t) {
  free(t->gpu);
  t->gpu = NULL;
}

/* ---- the stream's part ---- */

static void* priv_dev(struct gpu_comm* g, size_t off) { return (char*)g->priv_dev + off; }
static void* word_dev(struct gpu_comm* g, int r, size_t field) {
  return (char*)g->seg_dev + offsetof(struct gpu_seg, w) + (size_t)r * sizeof(struct gpu_words) + field;
}

static void memop(struct cudev_memop* ops, int* k, void* dev, uint32_t value, int wait) {
  ops[(*k)++] = (struct cudev_memop){.dev = dev, .value = value, .wait = wait};
}

/* Every rank's stream has written `seq` into its word `field`: my write, then a wait per peer. */
static void barrier(struct gpu_comm* g, struct cudev_memop* ops, int* k, uint32_t seq, size_t field) {
  memop(ops, k, word_dev(g, g->rank, field), seq, 0);
  for (int r = 0; r < g->n; r++)
    if (r != g->rank) memop(ops, k, word_dev(g, r, field), seq, 1);
}

static struct dev_job* job(struct dev_args* a, int reduce, uint32_t src_mask, int src_buf, uint64_t src_off,
                           uint32_t dst_mask, int dst_buf, uint64_t dst_off, uint64_t count) {
  struct dev_job* j = &a->job[a->njobs++];
  memset(j, 0, sizeof(*j));
  j->reduce = (uint8_t)reduce, j->src_mask = src_mask, j->src_buf = (uint8_t)src_buf, j->src_off = src_off;
  j->dst_mask = dst_mask, j->dst_buf = (uint8_t)dst_buf, j->dst_off = dst_off, j->count = count;
  return j;
}

/* AlltoAll: rank me exchanges the blocks of the pairs {me, me + k mod n}, k = 1..(n-1)/2, and for an
 * even n the pair at distance n/2 falls to its lower rank: every pair once, each rank n/2 pairs at most. */
static int a2a_pair(int n, int me, int r) {
  int d = (r - me + n) % n;
  return d > 0 && (d <= (n - 1) / 2 || (n % 2 == 0 && d == n / 2 && me < n / 2));
}

/* What this rank's kernel does (devjob.h). Reductions: each rank reduces its share of the elements
 * from every rank's input and writes the result wherever it is wanted, so every byte is read and
 * written once in all; copies go from where the data is to where this rank's kernel writes. */
static void fill_args(struct gpu_comm* g, const struct gpu_call* c, struct dev_args* a) {
  int n = g->n, me = g->rank;
  uint32_t all = n == 32 ? 0xffffffffu : (1u << n) - 1, self = 1u << me;
  size_t E = red_type_size(c->type), C = c->count, B = C * E;
  memset(a, 0, sizeof(*a));
  a->table = (uint64_t)(uintptr_t)priv_dev(g, offsetof(struct gpu_priv, slot) + (c->seq % GPU_SLOTS) * sizeof(struct dev_table));
  a->seq = c->seq, a->type = c->type, a->op_kind = c->red.kind, a->divisor = c->red.divisor;
  a->fail[0] = (uint64_t)(uintptr_t)priv_dev(g, offsetof(struct gpu_priv, failed));
  a->fail[1] = g->seg ? (uint64_t)(uintptr_t)((char*)g->seg_dev + offsetof(struct gpu_seg, failed_by)) : 0;
  switch (c->func) {
    case FUNC_ALLREDUCE: { /* shares aligned to 16 bytes */
      size_t align = E >= 16 ? 1 : 16 / E, share = UT_ALIGN_UP(UT_DIV_UP(C, (size_t)n), align);
      size_t off = UT_MIN(C, share * (size_t)me), len = UT_MIN(share, C - off);
      if (len) job(a, DEV_REDUCE, all, DEV_SEND, off * E, all, DEV_RECV, off * E, len);
      break;
    }
    case FUNC_ALLGATHER: job(a, DEV_COPY, self, DEV_SEND, 0, all, DEV_RECV, (uint64_t)me * B, C); break;
    case FUNC_REDUCESCATTER: job(a, DEV_REDUCE, all, DEV_SEND, (uint64_t)me * B, self, DEV_RECV, 0, C); break;
    case FUNC_BROADCAST: /* a root in place has nothing to do */
      if (me != c->root || c->ptr[DEV_SEND] != c->ptr[DEV_RECV])
        job(a, DEV_COPY, 1u << c->root, DEV_SEND, 0, self, DEV_RECV, 0, C);
      break;
    case FUNC_REDUCE:
      if (me == c->root) job(a, DEV_REDUCE, all, DEV_SEND, 0, self, DEV_RECV, 0, C);
      break;
    case FUNC_ALLTOALL: /* its own block (unless in place), then its pairs */
      if (c->ptr[DEV_SEND] != c->ptr[DEV_RECV]) job(a, DEV_COPY, self, DEV_SEND, me * B, self, DEV_RECV, me * B, C);
      for (int r = 0; r < n; r++)
        if (a2a_pair(n, me, r)) job(a, DEV_PAIR, self | 1u << r, DEV_SEND, B, self | 1u << r, DEV_RECV, 0, C);
      break;
    case FUNC_GATHER: /* the root pulls every block; its own is already in place when sendbuff is there */
      for (int r = 0; me == c->root && r < n; r++)
        if (r != me || (const char*)c->ptr[DEV_SEND] != (const char*)c->ptr[DEV_RECV] + (size_t)me * B)
          job(a, DEV_COPY, 1u << r, DEV_SEND, 0, self, DEV_RECV, (uint64_t)r * B, C);
      break;
    case FUNC_SCATTER: /* every rank pulls its block from the root (nothing to do for a root in place) */
      if (me != c->root || (const char*)c->ptr[DEV_RECV] != (const char*)c->ptr[DEV_SEND] + (size_t)me * B)
        job(a, DEV_COPY, 1u << c->root, DEV_SEND, (uint64_t)me * B, self, DEV_RECV, 0, C);
      break;
  }
}

static ch_status queue_call(struct gpu_comm* g, const struct gpu_call* c) {
  cudaStream_t s = c->stream;
  struct dev_args a;
  fill_args(g, c, &a);
  /* A rank's calls on one communicator run in call order whatever streams they name (as NCCL orders
   * them on its own stream): each rank's barrier words then only move forward, and a peer can never
   * pass call k against this rank's word for a later call on another stream. */
  if (g->any_launched && g->last_stream != s) CHECK(cudrv_join(g->last_stream, g->ctx, s, g->ctx));
  g->last_stream = s, g->any_launched = 1;
  /* Two batches of stream memory operations around the kernel (one driver call each, not 2n + 3). */
  struct cudev_memop ops[CUDEV_MAX_MEMOPS];
  int k = 0;
  memop(ops, &k, priv_dev(g, offsetof(struct gpu_priv, ready)), c->seq, 1);
  if (g->seg) barrier(g, ops, &k, c->seq, offsetof(struct gpu_words, arrive));
  CHECK(cudev_memops(s, ops, k, g->ctx));
  if (a.njobs) {
    void* fn = cudev_kernel(g->ctx, c->type);
    if (!fn) return CH_SYSTEM;
    uint64_t most = 0;
    for (int j = 0; j < a.njobs; j++) most = UT_MAX(most, a.job[j].count);
    /* enough blocks to cover the largest job at 4 elements a thread, at most 4 per SM in all */
    uint64_t gx = UT_MIN(UT_DIV_UP(most, (uint64_t)512 * 4), (uint64_t)UT_MAX(g->sms * 4 / a.njobs, 1));
    CHECK(cudev_launch(fn, (unsigned)UT_MAX(gx, 1), (unsigned)a.njobs, s, g->ctx, &a));
  }
  k = 0;
  if (g->seg) barrier(g, ops, &k, c->seq, offsetof(struct gpu_words, done));
  size_t done = offsetof(struct gpu_priv, slot_done) + (c->seq % GPU_SLOTS) * sizeof(uint32_t);
  memop(ops, &k, priv_dev(g, done), c->seq, 0);
  CHECK(cudev_memops(s, ops, k, g->ctx));
  return CH_OK;
}

struct gpu_batch {
  int n;
  struct gpu_call* call[];
};

int gpu_launch(struct ch_plan** plans, struct ch_task** lists, int n, ch_status* res) {
  int ngpu = 0, nall = 0;
  for (int i = 0; i < n; i++)
    for (struct ch_task* t = lists[i]; t; t = t->next) nall++, ngpu += t->gpu != NULL;
  if (!ngpu) return 0;
  if (ngpu < nall) {
    WARN("a group mixes calls that run on the GPU (device buffers of ranks sharing one GPU: AllReduce, AllGather, "
         "ReduceScatter, Broadcast, Reduce, AlltoAll, Gather, Scatter) with other calls (Send/Recv): issue them in "
         "separate groups, or set CHORUS_CUDA_DIRECT=0");
    for (int i = 0; i < n; i++) plans[i]->status = CH_INVALID_USAGE; /* failed in ticket order */
    plan_exec(plans, n);
    *res = CH_INVALID_USAGE;
    return 1;
  }
  ch_status e = CH_OK;
  for (int i = 0; i < n; i++) {
    struct ncclComm* comm = plans[i]->comm;
    struct gpu_comm* g = comm->gpu;
    int k = 0;
    for (struct ch_task* t = lists[i]; t; t = t->next) k++;
    struct gpu_batch* b = malloc(sizeof(*b) + (size_t)k * sizeof(b->call[0]));
    if (!b) { /* nothing queued yet: fail this comm's calls in order */
      plans[i]->status = CH_SYSTEM;
      plan_exec(&plans[i], 1);
      e = CH_SYSTEM;
      continue;
    }
    b->n = 0;
    for (struct ch_task* t = lists[i]; t; t = t->next) {
      struct gpu_call* c = b->call[b->n++] = t->gpu;
      t->gpu = NULL;
      c->seq = c->mine.seq = ++g->next_seq; /* wraps: every comparison of call numbers is cyclic */
      ch_status q = queue_call(g, c); /* waits for the table that the exchange fills */
      atomic_store_explicit(&g->launched, c->seq, memory_order_release);
      if (q != CH_OK) { /* the stream may hold part of it: let it and the peers' streams through */
        comm_set_async_error(comm, q);
        if (e == CH_OK) e = q;
      }
    }
    /* One rank: the exchange is a copy, done here. Otherwise the bridge runs it with the peers. */
    if (g->n == 1 || stream_enqueue_hook(g->bridge, &plans[i], 1, gpu_after, b) != CH_OK) {
      ch_status s = plan_exec(&plans[i], 1);
      gpu_after(b, s);
    }
    plans[i] = NULL;
  }
  *res = e;
  return 1;
}

/* ---- the bridge's part: check the descriptions, open the peers' buffers, fill the table ---- */

static int cyc_before(uint32_t a, uint32_t b) { return (int32_t)(a - b) < 0; }

static ch_status broken(struct gpu_comm* g) {
  if (__atomic_load_n(&g->comm->abort_flag, __ATOMIC_ACQUIRE)) return CH_ABORTED;
  int as = atomic_load(&g->comm->async_result);
  return as != ncclSuccess && as != ncclInProgress ? (ch_status)as : CH_OK;
}

/* The call that last used seq's slot (GPU_SLOTS calls earlier) has finished on its stream. */
static ch_status wait_slot(struct gpu_comm* g, uint32_t seq) {
  /* Cyclic, so it holds across the 32-bit wrap, and for the first calls too (slot_done starts at 0,
   * which is not before seq - GPU_SLOTS then). */
  _Atomic uint32_t* done = &g->priv->slot_done[seq % GPU_SLOTS];
  for (uint64_t i = 0; cyc_before(atomic_load_explicit(done, memory_order_acquire), seq - GPU_SLOTS); i++) {
    CHECK(broken(g));
    ut_backoff(i);
  }
  return CH_OK;
}

/* An entry whose last call has finished may be closed. */
static int ipc_idle(struct gpu_comm* g, const struct gpu_ipc* e) {
  return !cyc_before(atomic_load_explicit(&g->priv->slot_done[e->last_seq % GPU_SLOTS], memory_order_acquire),
                     e->last_seq);
}

/* Peer r's allocation `d` mapped here (opened once, kept in r's cache). */
static ch_status ipc_get(struct gpu_comm* g, int r, const struct gpu_buf_desc* d, uint32_t seq, uintptr_t* base,
                         size_t* size) {
  struct gpu_ipc* cache = g->ipc[r];
  struct gpu_ipc* e = NULL;
  for (int k = 0; k < GPU_IPC_CACHE && !e; k++)
    if (cache[k].base && cache[k].id == d->id) e = &cache[k];
  if (!e) {
    for (int k = 0; k < GPU_IPC_CACHE; k++) { /* an allocation at the same address was freed: close it */
      struct gpu_ipc* o = &cache[k];
      if (o->base && o->peer_base == d->base && ipc_idle(g, o)) gpu_ipc_close(g->ctx, o->base), o->base = 0;
    }
    for (int k = 0; k < GPU_IPC_CACHE && !e; k++)
      if (!cache[k].base) e = &cache[k];
    for (int k = 0; k < GPU_IPC_CACHE && (!e || e->base); k++) /* else the least recently used idle one */
      if (!e || (ipc_idle(g, &cache[k]) && cyc_before(cache[k].last_seq, e->last_seq))) e = &cache[k];
    if (e->base && !ipc_idle(g, e)) {
      WARN("rank %d: calls in flight use more than %d buffers of rank %d: wait for some (synchronise the stream)",
           g->rank, GPU_IPC_CACHE, r);
      return CH_INVALID_USAGE;
    }
    if (e->base) gpu_ipc_close(g->ctx, e->base), e->base = 0;
    uintptr_t b = 0;
    size_t sz = 0;
    int cu = 0;
    if (gpu_ipc_open(g->ctx, g->comm->peers[r].proc_nonce, d->id, &d->h, &b, &sz, &cu) != CH_OK) {
      if (cu) WARN("rank %d: cannot open rank %d's device buffer through CUDA IPC: cuIpcOpenMemHandle: %s (%d)", g->rank,
                   r, cudrv_errstr(cu), cu);
      return CH_SYSTEM;
    }
    e->id = d->id, e->peer_base = d->base, e->base = b, e->size = sz;
  }
  e->last_seq = seq;
  *base = e->base, *size = e->size;
  return CH_OK;
}

/* Bytes of rank r's buffer b that this rank's kernel touches (0: none). */
static size_t touched(const struct gpu_call* c, int n, int me, int r, int b) {
  size_t B = c->count * red_type_size(c->type);
  switch (c->func) {
    case FUNC_ALLREDUCE: return B;
    case FUNC_ALLGATHER: return b == DEV_SEND ? (r == me ? B : 0) : B * (size_t)n;
    case FUNC_REDUCESCATTER: return b == DEV_SEND ? B * (size_t)n : (r == me ? B : 0);
    case FUNC_BROADCAST: return b == DEV_SEND ? (r == c->root ? B : 0) : (r == me ? B : 0);
    case FUNC_REDUCE: return me != c->root ? 0 : b == DEV_SEND ? B : (r == me ? B : 0);
    case FUNC_ALLTOALL: return r == me || a2a_pair(n, me, r) ? B * (size_t)n : 0;
    case FUNC_GATHER: return me != c->root ? 0 : b == DEV_SEND ? B : (r == me ? B * (size_t)n : 0);
    case FUNC_SCATTER: return b == DEV_SEND ? (r == c->root ? B * (size_t)n : 0) : (r == me ? B : 0);
  }
  return 0;
}

static const char* bufname(int b) { return b == DEV_SEND ? "sendbuff" : "recvbuff"; }

static ch_status resolve(struct gpu_comm* g, struct gpu_call* c) {
  int n = g->n, me = g->rank;
  CHECK(broken(g));
  for (int r = 0; r < n; r++) {
    const struct gpu_desc *d = &c->all[r], *m = &c->mine;
    if (d->seq != m->seq || d->func != m->func || d->type != m->type || d->count != m->count || d->root != m->root ||
        d->op_kind != m->op_kind) {
      WARN("rank %d: rank %d's call on device buffers differs from this rank's %s (count %zu, type %d, op %u, root "
           "%d, call #%u): %s count %llu type %u op %u root %d call #%u",
           me, r, fname(c->func), c->count, c->type, m->op_kind, m->root, m->seq,
           fname((int)d->func), (unsigned long long)d->count, d->type,
           d->op_kind, d->root, d->seq);
      return CH_INVALID_USAGE;
    }
  }
  /* Thread ranks: each stream would wait at the barrier for the other rank's part, queued behind it
   * on a shared stream, or (the legacy stream: NULL or CU_STREAM_LEGACY) behind any blocking stream of
   * the context. cudaStreamPerThread (0x2) is one stream per thread. */
  for (int r = 0; r < n; r++) {
    uint64_t theirs = c->all[r].stream, mine = c->mine.stream;
    if (r == me || !g->same_proc[r] || (theirs != mine && mine > 1 && theirs > 1) || (theirs == mine && mine == 2))
      continue;
    WARN("rank %d: rank %d, a thread of this process, passed %s CUDA stream (%p and %p) to %s: ranks that share a "
         "GPU in one process need a stream each, and not the legacy NULL stream (as with NCCL)", me, r,
         theirs == mine ? "the same" : "the legacy", (void*)(uintptr_t)mine, (void*)(uintptr_t)theirs, fname(c->func));
    return CH_INVALID_USAGE;
  }
  CHECK(wait_slot(g, c->seq));
  struct dev_table* tab = &g->priv->slot[c->seq % GPU_SLOTS];
  for (int r = 0; r < n; r++)
    for (int b = 0; b < 2; b++) {
      size_t need = touched(c, n, me, r, b);
      const struct gpu_buf_desc* d = &c->all[r].buf[b];
      uintptr_t addr = 0, base = 0;
      size_t size = 0;
      uint64_t id;
      if (!need) {
      } else if (d->foreign) {
        WARN("rank %d: rank %d's %s for %s is device memory of another GPU or CUDA context than its communicator's "
             "(made for the context current at ncclCommInitRank): allocate it there", me, r, bufname(b),
             fname(c->func));
        return CH_INVALID_ARG;
      } else if (!d->present) {
        WARN("rank %d: rank %d gave no %s for %s", me, r, bufname(b), fname(c->func));
        return CH_INVALID_ARG;
      } else if (r == me) {
        addr = (uintptr_t)c->ptr[b];
      } else if (g->same_proc[r]) { /* a thread of this process: its address, if the driver agrees */
        if (cudev_range((void*)(uintptr_t)d->ptr, g->ctx, &base, &size, &id) != CH_OK || d->ptr + need > base + size) {
          WARN("rank %d: rank %d's %s %p (+%zu bytes) is not device memory of this context", me, r, bufname(b),
               (void*)(uintptr_t)d->ptr, need);
          return CH_INVALID_ARG;
        }
        addr = (uintptr_t)d->ptr;
      } else if (!d->shareable) {
        WARN("rank %d: rank %d's %s for %s is device memory that cannot be shared with other processes through "
             "CUDA IPC (cuIpcGetMemHandle refused it: e.g. cuMemCreate memory, or PyTorch's expandable segments); "
             "allocate it with cudaMalloc or ncclMemAlloc, or set CHORUS_CUDA_DIRECT=0", me, r, bufname(b),
             fname(c->func));
        return CH_INVALID_USAGE;
      } else {
        CHECK(ipc_get(g, r, d, c->seq, &base, &size));
        if (d->off > size || need > size - d->off) {
          WARN("rank %d: rank %d's %s (offset %llu, %zu bytes) lies outside its %zu-byte allocation", me, r,
               bufname(b), (unsigned long long)d->off, need, size);
          return CH_INVALID_ARG;
        }
        addr = base + d->off;
      }
      tab->buf[b][r] = addr;
    }
  for (int r = 0; r < n; r++) tab->scalar[r] = c->all[r].scalar; /* only ever multiplies data */
  __atomic_store_n(&tab->seq, c->seq, __ATOMIC_RELEASE); /* the addresses before the seq that makes them valid */
  return CH_OK;
}

static void ready_raise(struct gpu_comm* g, uint32_t v) {
  uint32_t cur = atomic_load_explicit(&g->priv->ready, memory_order_relaxed);
  while (cyc_before(cur, v) &&
         !atomic_compare_exchange_weak_explicit(&g->priv->ready, &cur, v, memory_order_release, memory_order_relaxed)) {
  }
}

/* On the bridge (or the launching thread for one rank), once the descriptions are exchanged. A failed
 * call fails its communicator (async error, which lets every stream through: gpu_unblock). */
void gpu_after(void* batch, ch_status st) {
  struct gpu_batch* b = batch;
  for (int i = 0; i < b->n; i++) {
    struct gpu_call* c = b->call[i];
    struct gpu_comm* g = c->g;
    ch_status e = st == CH_OK ? resolve(g, c) : st;
    if (e != CH_OK) { /* the error unblocks (voids every table, lets every stream through); an abort is no error */
      comm_set_async_error(g->comm, e);
      if (e == CH_ABORTED) gpu_unblock(g);
    }
    ready_raise(g, c->seq);
    free(c);
  }
  free(b);
}
