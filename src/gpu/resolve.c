/* Ranks on one GPU (gpu.h): the bridge's part of a call, once the descriptions are exchanged: check
 * what the peers sent against this rank's call, open the peers' buffers, fill the call's pointer
 * table, and let the stream past its wait for it. */
#include <stdlib.h>
#include <string.h>
#include <stddef.h>

#include "../misc/log.h"
#include "../misc/utils.h"
#include "../core/init.h"
#include "gpu.h"

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

/* An entry whose last call has finished may be closed: that call's slot says so, or it is at least
 * GPU_SLOTS calls before `now`, the call being resolved, whose wait_slot (and its predecessors')
 * waited for every such call; the second also when a cyclic comparison with a number 2^31 calls
 * old would not tell. */
static int ipc_idle(struct gpu_comm* g, const struct gpu_ipc* e, uint32_t now) {
  if (e->pinned) return 0; /* a captured call's: a graph may replay it until the comm goes */
  return now - e->last_seq >= GPU_SLOTS ||
         !cyc_before(atomic_load_explicit(&g->priv->slot_done[e->last_seq % GPU_SLOTS], memory_order_acquire),
                     e->last_seq);
}

struct idle_at {
  struct gpu_comm* g;
  uint32_t now;
};
static int idle_at(void* arg, const struct gpu_ipc* e) {
  const struct idle_at* a = arg;
  return ipc_idle(a->g, e, a->now);
}

/* Peer r's allocation `d` mapped here (opened once, kept in r's cache). */
static ch_status ipc_get(struct gpu_comm* g, int r, const struct gpu_buf_desc* d, uint32_t seq, int pin,
                         uintptr_t* base, size_t* size) {
  struct idle_at at = {g, seq};
  struct gpu_ipc_user u = {g->rank, "calls in flight", idle_at, &at};
  struct gpu_ipc* e;
  ch_status s = gpu_ipc_get(g, g->ipc[r], r, d, &u, &e); /* it WARNs */
  if (s != CH_OK) return s;
  e->pinned |= pin;
  if (!pin) e->last_seq = seq;
  *base = e->base, *size = e->size;
  return CH_OK;
}

/* need[r][b]: bytes from the start of rank r's buffer b that this rank's kernel touches (0: none),
 * read off the jobs it runs, so that what is checked is what the kernel does (devjob.h). */
static void touched(const struct dev_args* a, size_t esize, size_t need[][2]) {
  for (int i = 0; i < a->njobs; i++) {
    const struct dev_job* j = &a->job[i];
    uint64_t bytes = j->count * esize;
    if (j->reduce == DEV_PAIR) { /* ranks x < y: each one's blocks at the other's index, in both buffers */
      int x = __builtin_ctz(j->src_mask), y = 31 - __builtin_clz(j->src_mask);
      size_t blk = j->src_off; /* the block size, as the kernel reads it (devjob.h) */
      size_t ex = (size_t)(y + 1) * blk, ey = (size_t)(x + 1) * blk;
      need[x][DEV_SEND] = UT_MAX(need[x][DEV_SEND], ex), need[x][DEV_RECV] = UT_MAX(need[x][DEV_RECV], ex);
      need[y][DEV_SEND] = UT_MAX(need[y][DEV_SEND], ey), need[y][DEV_RECV] = UT_MAX(need[y][DEV_RECV], ey);
      continue;
    }
    for (uint32_t m = j->src_mask; m; m &= m - 1)
      need[__builtin_ctz(m)][j->src_buf] = UT_MAX(need[__builtin_ctz(m)][j->src_buf], j->src_off + bytes);
    for (uint32_t m = j->dst_mask; m; m &= m - 1)
      need[__builtin_ctz(m)][j->dst_buf] = UT_MAX(need[__builtin_ctz(m)][j->dst_buf], j->dst_off + bytes);
  }
}

static const char* bufname(int b) { return b == DEV_SEND ? "sendbuff" : "recvbuff"; }

/* The address in this process of rank r's buffer b, described by d, of which the call touches `need`
 * bytes from its start (own: this rank's own pointer, used as it is); or an error naming it. */
static ch_status buf_addr(struct gpu_comm* g, const struct gpu_call* c, int r, int b, const struct gpu_buf_desc* d,
                          size_t need, const void* own, uint64_t* addr) {
  int me = g->rank;
  const char* fn = algo_fname(b == DEV_SEND && c->func == FUNC_RECV ? FUNC_SEND : c->func);
  uintptr_t base = 0;
  size_t size = 0;
  uint64_t id;
  if (d->foreign) {
    WARN("rank %d: rank %d's %s for %s is device memory of another GPU or CUDA context than its communicator's "
         "(made for the context current at ncclCommInitRank): allocate it there", me, r, bufname(b), fn);
    return CH_INVALID_ARG;
  }
  if (!d->present) {
    WARN("rank %d: rank %d gave no %s for %s", me, r, bufname(b), fn);
    return CH_INVALID_ARG;
  }
  if (own) {
    *addr = (uintptr_t)own;
  } else if (g->same_proc[r]) { /* a thread of this process: its address, if the driver agrees */
    void* owner;
    int dev;
    if (cudev_describe((void*)(uintptr_t)d->ptr, &owner, &dev, &base, &size, &id) != 0 || d->ptr < base ||
        need > base + size - d->ptr) {
      WARN("rank %d: rank %d's %s %p (+%zu bytes) is not device memory of this context", me, r, bufname(b),
           (void*)(uintptr_t)d->ptr, need);
      return CH_INVALID_ARG;
    }
    *addr = d->ptr;
  } else if (!d->shareable) {
    WARN("rank %d: rank %d's %s for %s is device memory that cannot be shared with other processes through "
         "CUDA IPC (cuIpcGetMemHandle refused it: e.g. cuMemCreate memory, or PyTorch's expandable segments); "
         "allocate it with cudaMalloc or ncclMemAlloc, or set CHORUS_CUDA_DIRECT=0", me, r, bufname(b), fn);
    return CH_INVALID_USAGE;
  } else {
    /* a captured call has no ring number: the rank's newest one stands for "now" */
    uint32_t now = c->gc ? atomic_load_explicit(&g->launched, memory_order_acquire) : c->seq;
    CHECK(ipc_get(g, r, d, now, c->gc != NULL, &base, &size));
    if (d->off > size || need > size - d->off) {
      WARN("rank %d: rank %d's %s (offset %llu, %zu bytes) lies outside its %zu-byte allocation", me, r, bufname(b),
           (unsigned long long)d->off, need, size);
      return CH_INVALID_ARG;
    }
    *addr = base + d->off;
  }
  /* The kernels load and store whole elements: a misaligned one faults, which ends the CUDA context
   * of every rank on the GPU (a peer's offset comes from the wire). */
  size_t esize = red_type_size(c->type);
  if (*addr % (esize ? esize : 1)) {
    WARN("rank %d: rank %d's %s for %s (%p) is not aligned to its %zu-byte elements", me, r, bufname(b), fn,
         (void*)(uintptr_t)*addr, esize);
    return CH_INVALID_ARG;
  }
  return CH_OK;
}

/* Thread ranks: each stream would wait for the other rank's part, queued behind it on a shared
 * stream, or (the legacy stream: NULL or CU_STREAM_LEGACY) behind any blocking stream of the
 * context. cudaStreamPerThread (0x2) is one stream per thread. */
static ch_status streams_apart(struct gpu_comm* g, const struct gpu_call* c, int r, uint64_t theirs) {
  uint64_t mine = c->mine.stream;
  if (r == g->rank || !g->same_proc[r] || (theirs != mine && mine > 1 && theirs > 1) || (theirs == mine && mine == 2))
    return CH_OK;
  WARN("rank %d: rank %d, a thread of this process, passed %s CUDA stream (%p and %p) to %s: ranks that share a "
       "GPU in one process need a stream each, and not the legacy NULL stream (as with NCCL)", g->rank, r,
       theirs == mine ? "the same" : "the legacy", (void*)(uintptr_t)mine, (void*)(uintptr_t)theirs,
       algo_fname(c->func));
  return CH_INVALID_USAGE;
}

/* A relayed call (gpu/relay.c): every rank's buffers usable by its own kernels and copies (each rank
 * says so of its own; any that is not fails the call everywhere, named), then this rank's table. */
static ch_status resolve_relay(struct gpu_comm* g, struct gpu_call* c, struct dev_table* tab) {
  for (int r = 0; r < g->n; r++)
    for (int b = 0; b < 2; b++) {
      const struct gpu_buf_desc* d = &c->all[r].buf[b];
      if (!d->present || (!d->foreign && !d->misaligned)) continue;
      WARN("rank %d: rank %d's %s for %s is %s", g->rank, r, bufname(b), algo_fname(c->func),
           d->foreign ? "device memory of another GPU or CUDA context than its communicator's (made for the context "
                        "current at ncclCommInitRank): allocate it there"
                      : "not aligned to its elements");
      return CH_INVALID_ARG;
    }
  if (!c->gc) CHECK(wait_slot(g, c->seq)); /* a captured call has a table of its own */
  gpu_relay_table(g, c, tab);
  if (c->gc) c->gc->resolved = 1; /* read by the launching thread once the bridge is idle */
  __atomic_store_n(&tab->seq, c->gc ? c->gc->id : c->seq, __ATOMIC_RELEASE); /* the addresses first */
  return CH_OK;
}

static ch_status resolve(struct gpu_comm* g, struct gpu_call* c) {
  int n = g->n, me = g->rank;
  CHECK(broken(g));
  for (int r = 0; r < n; r++) {
    const struct gpu_desc *d = &c->all[r], *m = &c->mine;
    if (d->seq != m->seq || d->func != m->func || d->type != m->type || d->count != m->count || d->root != m->root ||
        d->op_kind != m->op_kind) {
      WARN("rank %d: rank %d's call on device buffers differs from this rank's %s (count %zu, type %d, op %u, root "
           "%d, call #%u): %s count %llu type %u op %u root %d call #%u",
           me, r, algo_fname(c->func), c->count, c->type, m->op_kind, m->root, m->seq,
           algo_fname((int)d->func), (unsigned long long)d->count, d->type,
           d->op_kind, d->root, d->seq);
      return CH_INVALID_USAGE;
    }
  }
  for (int r = 0; r < n; r++) CHECK(streams_apart(g, c, r, c->all[r].stream));
  struct dev_table* tab = c->gc ? c->gc->tab : &g->priv->slot[c->seq % GPU_SLOTS];
  if (g->relay) return resolve_relay(g, c, tab);
  if (!c->gc) CHECK(wait_slot(g, c->seq));
  struct dev_args a;
  size_t need[32][2] = {{0}}; /* n <= 32: the jobs' rank masks */
  gpu_fill_args(g, c, &a);
  touched(&a, red_type_size(c->type), need);
  for (int r = 0; r < n; r++)
    for (int b = 0; b < 2; b++)
      if (need[r][b])
        CHECK(buf_addr(g, c, r, b, &c->all[r].buf[b], need[r][b], r == me ? c->ptr[b] : NULL, &tab->buf[b][r]));
  if (c->gc) c->gc->resolved = 1; /* read by the launching thread once the bridge is idle */
  if (!tab) return CH_OK;          /* a captured call of a rank whose kernel does nothing: no table */
  for (int r = 0; r < n; r++) tab->scalar[r] = c->all[r].scalar; /* only ever multiplies data */
  /* the addresses before the seq that makes them valid */
  __atomic_store_n(&tab->seq, c->gc ? c->gc->id : c->seq, __ATOMIC_RELEASE);
  return CH_OK;
}

/* A receive: the sender's description came from it (a host send on the bridge), in the pair's order.
 * Checked here, and the table filled: this rank copies (gpu_p2p_active). */
static ch_status resolve_recv(struct gpu_comm* g, struct gpu_call* c) {
  int me = g->rank, p = c->peer;
  const struct gpu_desc* d = &c->all[0];
  CHECK(broken(g));
  if (d->func != FUNC_SEND || d->root != me || d->type != (uint32_t)c->type || d->count != c->count ||
      d->seq != c->cseq) {
    WARN("rank %d: ncclRecv from rank %d (count %zu, type %d, receive #%u from it) does not match what rank %d "
         "sent: %s to rank %d, count %llu, type %u, send #%u to this rank", me, p, c->count, c->type, c->cseq, p,
         algo_fname((int)d->func), d->root, (unsigned long long)d->count, d->type, d->seq);
    return CH_INVALID_USAGE;
  }
  CHECK(streams_apart(g, c, p, d->stream));
  CHECK(wait_slot(g, c->seq));
  struct dev_table* tab = &g->priv->slot[c->seq % GPU_SLOTS];
  size_t need = c->count * red_type_size(c->type);
  CHECK(buf_addr(g, c, p, DEV_SEND, &d->buf[DEV_SEND], need, NULL, &tab->buf[DEV_SEND][p]));
  CHECK(buf_addr(g, c, me, DEV_RECV, &c->mine.buf[DEV_RECV], need, c->ptr[DEV_RECV], &tab->buf[DEV_RECV][me]));
  __atomic_store_n(&tab->seq, c->seq, __ATOMIC_RELEASE);
  return CH_OK;
}

/* Why a wait on a peer's word must end: this communicator failed, or a rank of the GPU did. */
static ch_status peer_wait_broken(struct gpu_comm* g) {
  CHECK(broken(g));
  if (atomic_load_explicit(&g->seg->failed_by, memory_order_acquire)) return CH_REMOTE;
  return CH_OK;
}

/* A send or receive that another rank copies (gpu_p2p_mails): leave this rank's description in the
 * pair's mailbox (gpu.h), once the copying side has taken the entry GPU_MAIL calls before it.
 * Unchecked here: the copying side checks it against the other side's (and fails, failing this rank
 * through the GPU's failure word, if they differ). Called by the launching thread (wait = 0) and by
 * the bridge (wait = 1), never for one entry at once: the launching thread posts entry k only once
 * k - GPU_MAIL is taken, whose post came first. */
ch_status gpu_post(struct gpu_call* c, int wait, int* posted) {
  struct gpu_comm* g = c->g;
  struct gpu_mail* m;
  _Atomic uint32_t* taken;
  uint32_t k = c->boarded ? c->bseq : c->cseq;
  if (c->boarded) {
    m = (struct gpu_mail*)((char*)g->seg + gpu_board_off(g->n, g->rank, k));
    taken = &g->seg->w[g->rank].board_taken;
  } else {
    int send = c->func == FUNC_SEND, src = send ? g->rank : c->peer, dst = send ? c->peer : g->rank;
    struct gpu_pair* pr = (struct gpu_pair*)((char*)g->seg + gpu_pair_off(g->n, src, dst));
    m = (struct gpu_mail*)((char*)g->seg + gpu_mail_off(g->n, src, dst, c->cseq, send ? GPU_MAIL_SEND : GPU_MAIL_RECV));
    taken = send ? &pr->taken_send : &pr->taken;
  }
  for (uint64_t i = 0; cyc_before(atomic_load_explicit(taken, memory_order_acquire), k - GPU_MAIL); i++) {
    if (!wait) return CH_OK;
    CHECK(peer_wait_broken(g));
    ut_backoff(i);
  }
  m->d = c->mine;
  atomic_store_explicit(&m->seq, k, memory_order_release);
  *posted = 1;
  return CH_OK;
}

/* Rank 0, a boarded collective: every other rank's description from its board, in call order. */
static ch_status board_collect(struct gpu_comm* g, struct gpu_call* c) {
  c->all[0] = c->mine;
  for (int r = 1; r < g->n; r++) {
    struct gpu_mail* m = (struct gpu_mail*)((char*)g->seg + gpu_board_off(g->n, r, c->bseq));
    for (uint64_t i = 0; atomic_load_explicit(&m->seq, memory_order_acquire) != c->bseq; i++) {
      CHECK(peer_wait_broken(g));
      ut_backoff(i);
    }
    c->all[r] = m->d; /* rewritten only once board_taken says so; checked by resolve like any peer's */
    atomic_store_explicit(&g->seg->w[r].board_taken, c->bseq, memory_order_release);
  }
  return CH_OK;
}

static ch_status resolve_boarded(struct gpu_comm* g, struct gpu_call* c) {
  CHECK(board_collect(g, c));
  /* The others' bridges check nothing: two thread ranks of another process on one stream (or the
   * legacy stream) would wait for each other in the star's barrier, so rank 0 refuses them. */
  for (int a = 1; a < g->n; a++)
    for (int b = a + 1; b < g->n; b++) {
      uint64_t x = c->all[a].stream, y = c->all[b].stream;
      if (g->comm->peers[a].proc_nonce != g->comm->peers[b].proc_nonce || (x != y && x > 1 && y > 1) ||
          (x == y && x == 2))
        continue;
      WARN("rank 0: ranks %d and %d, threads of one process, passed %s CUDA stream (%p and %p) to %s: ranks that "
           "share a GPU in one process need a stream each, and not the legacy NULL stream (as with NCCL)", a, b,
           x == y ? "the same" : "the legacy", (void*)(uintptr_t)x, (void*)(uintptr_t)y, algo_fname(c->func));
      return CH_INVALID_USAGE;
    }
  return resolve(g, c);
}

/* A send this rank copies: the receiver's description from the pair's mailbox, checked like any
 * peer's, then the table: this rank's send buffer and the peer's receive buffer. */
static ch_status resolve_send(struct gpu_comm* g, struct gpu_call* c) {
  int me = g->rank, p = c->peer;
  struct gpu_pair* pr = (struct gpu_pair*)((char*)g->seg + gpu_pair_off(g->n, me, p));
  struct gpu_mail* m = (struct gpu_mail*)((char*)g->seg + gpu_mail_off(g->n, me, p, c->cseq, GPU_MAIL_RECV));
  for (uint64_t i = 0; atomic_load_explicit(&m->seq, memory_order_acquire) != c->cseq; i++) {
    CHECK(peer_wait_broken(g));
    ut_backoff(i);
  }
  struct gpu_desc d = m->d; /* the receiver writes this entry again only once `taken` says so */
  atomic_store_explicit(&pr->taken, c->cseq, memory_order_release);
  if (d.func != FUNC_RECV || d.root != me || d.type != (uint32_t)c->type || d.count != c->count || d.seq != c->cseq) {
    WARN("rank %d: ncclSend to rank %d (count %zu, type %d, send #%u to it) does not match what rank %d receives: "
         "%s from rank %d, count %llu, type %u, receive #%u from this rank", me, p, c->count, c->type, c->cseq, p,
         algo_fname((int)d.func), d.root, (unsigned long long)d.count, d.type, d.seq);
    return CH_INVALID_USAGE;
  }
  CHECK(streams_apart(g, c, p, d.stream));
  CHECK(wait_slot(g, c->seq));
  struct dev_table* tab = &g->priv->slot[c->seq % GPU_SLOTS];
  size_t need = c->count * red_type_size(c->type);
  CHECK(buf_addr(g, c, me, DEV_SEND, &c->mine.buf[DEV_SEND], need, c->ptr[DEV_SEND], &tab->buf[DEV_SEND][me]));
  CHECK(buf_addr(g, c, p, DEV_RECV, &d.buf[DEV_RECV], need, NULL, &tab->buf[DEV_RECV][p]));
  __atomic_store_n(&tab->seq, c->seq, __ATOMIC_RELEASE);
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
  /* A captured call's peers are opened (CUDA IPC) while the application captures, maybe in global
   * mode, which forbids that to every thread not in relaxed mode. */
  int mode = b->n && b->call[0]->captured ? cudrv_capture_relaxed() : -1;
  /* First every description a copying sender waits for, so that two ranks' bridges never wait for
   * each other (the copying rank is the lower one of each pair: waits only go up in rank). */
  for (int i = 0; st == CH_OK && i < b->n; i++) {
    struct gpu_call* c = b->call[i];
    if (c->mailed || !(gpu_p2p_mails(c->g, c) || (c->boarded && c->g->rank != 0))) continue;
    ch_status e = gpu_post(c, 1, &c->mailed);
    if (e != CH_OK) st = e;
  }
  for (int i = 0; i < b->n; i++) {
    struct gpu_call* c = b->call[i];
    struct gpu_comm* g = c->g;
    ch_status e = st != CH_OK            ? st
                  : c->func == FUNC_SEND ? (gpu_p2p_active(g, FUNC_SEND, c->peer) ? resolve_send(g, c) : broken(g))
                  : c->func == FUNC_RECV ? (gpu_p2p_active(g, FUNC_RECV, c->peer) ? resolve_recv(g, c) : broken(g))
                  : c->copy_only         ? broken(g) /* its buffers are its own, checked at enqueue */
                  : c->boarded           ? (g->rank ? broken(g) : resolve_boarded(g, c))
                                         : resolve(g, c);
    if (e != CH_OK) { /* the error unblocks (voids every table, lets every stream through); an abort is no error */
      comm_set_async_error(g->comm, e);
      if (e == CH_ABORTED) gpu_unblock(g);
    }
    if (gpu_has_slot(c)) ready_raise(g, c->seq);
    free(c);
  }
  cudrv_capture_restore(mode);
  free(b);
}
