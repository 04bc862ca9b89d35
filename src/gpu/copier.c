/* Ranks on one GPU (gpu.h): rank 0's process copies the sends between the other ranks (the relayed
 * pairs, gpu_p2p_relayed). Kernels of different processes take turns on the GPU (~0.15 ms a turn on
 * an H200): a ring of sends on 4 processes, each pair copied by its lower rank, ran kernels in 3
 * processes and took 465 us a step against AllReduce's 66, whose kernels all run in rank 0's process.
 *
 * Both ranks of a relayed pair leave their description in the pair's mailboxes (gpu_post) and their
 * streams write `posted_send` (sender) and `posted` (receiver), then wait for `copied`. This thread,
 * in rank 0's process, takes each pair's descriptions in the pair's order, checks them against each
 * other, maps the buffers here (CUDA IPC, cached), and queues on the pair's own stream: wait for both
 * words, the copy kernel (which reads its table from this copier's ring and does nothing once the
 * communicator has failed), write `copied`. A stream per pair keeps each pair in its order without
 * one pair's wait holding another's copy.
 *
 * Ownership: the copier and its caches belong to its thread; start and stop belong to gpu/setup.c
 * (stop joins the thread first). The shared page's words are atomics (gpu.h). */
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <stddef.h>

#include "../misc/log.h"
#include "../misc/utils.h"
#include "../core/init.h"
#include "gpu.h"

enum { STOP_NO = 0, STOP_DRAIN = 1, STOP_NOW = 2 };
struct cp_slot { int src, dst; uint32_t k; int used; };

struct gpu_copier {
  struct gpu_comm* g;
  pthread_t th;
  _Atomic int stop;      /* STOP_*: set by gpu_copier_stop */
  int running;           /* the thread was started (gpu_copier_run) */
  uint64_t drain_until;  /* STOP_DRAIN's deadline (written before stop) */
  uint64_t last_work;    /* when the thread last queued a copy (its own) */
  int n;
  uint32_t* next;           /* [n*n]: the pair's last call taken */
  cudaStream_t* st;         /* [n*n]: the pair's stream, made when first needed */
  struct gpu_ipc (*ipc)[GPU_IPC_CACHE]; /* [n]: peers' allocations mapped here */
  struct dev_table* tab;    /* [GPU_SLOTS] mapped pinned memory: the kernels' tables */
  void* tab_dev;
  void* stage_dev;          /* [GPU_SLOTS] struct dev_staged */
  struct cp_slot slot[GPU_SLOTS];
  uint32_t count;           /* copies queued (the tables' numbers) */
};

static int cyc_before(uint32_t a, uint32_t b) { return (int32_t)(a - b) < 0; }

static struct gpu_pair* pair_of(struct gpu_comm* g, int s, int d) {
  return (struct gpu_pair*)((char*)g->seg + gpu_pair_off(g->n, s, d));
}
static struct gpu_mail* mail_of(struct gpu_comm* g, int s, int d, uint32_t k, int side) {
  return (struct gpu_mail*)((char*)g->seg + gpu_mail_off(g->n, s, d, k, side));
}
/* The copy numbered k on pair s -> d has finished on the copier's stream. */
static int copied(struct gpu_comm* g, int s, int d, uint32_t k) {
  return !cyc_before(atomic_load_explicit(&pair_of(g, s, d)->copied, memory_order_acquire), k);
}

static int in_flight(struct gpu_copier* cp);

static ch_status stopped(struct gpu_copier* cp) {
  struct ncclComm* comm = cp->g->comm;
  if (atomic_load(&cp->stop) == STOP_NOW || __atomic_load_n(&comm->abort_flag, __ATOMIC_ACQUIRE)) return CH_ABORTED;
  int as = atomic_load(&comm->async_result);
  if (as != ncclSuccess && as != ncclInProgress) return (ch_status)as;
  if (atomic_load_explicit(&cp->g->seg->failed_by, memory_order_acquire)) return CH_REMOTE;
  return CH_OK;
}

static int no_copy_in_flight(void* cp, const struct gpu_ipc* e) { return (void)e, !in_flight(cp); }

/* Rank r's allocation `d` mapped in this process, kept in the copier's cache for r. An entry serves
 * copies on several pairs, which end in any order: one is closed only when no copy at all is in flight
 * (rare: the cache is full, or an address was reused). */
static ch_status map_peer(struct gpu_copier* cp, int r, const struct gpu_buf_desc* d,
                          uintptr_t* base, size_t* size) {
  struct gpu_ipc_user u = {0, "sends in flight between other ranks", no_copy_in_flight, cp};
  struct gpu_ipc* e;
  ch_status s = gpu_ipc_get(cp->g, cp->ipc[r], r, d, &u, &e); /* it WARNs */
  if (s != CH_OK) return s;
  *base = e->base, *size = e->size;
  return CH_OK;
}

/* The address here of rank r's buffer described by d, need bytes long and aligned to esize. */
static ch_status addr_of(struct gpu_copier* cp, int r, const char* what, const struct gpu_buf_desc* d, size_t need,
                         size_t esize, int s, int t, uint32_t k, uint64_t* addr) {
  struct gpu_comm* g = cp->g;
  uintptr_t base;
  size_t size;
  if (d->foreign || !d->present) {
    WARN("rank 0: rank %d's %s (send #%u from rank %d to rank %d) is %s", r, what, k, s, t,
         d->foreign ? "device memory of another GPU or CUDA context than its communicator's" : "missing");
    return CH_INVALID_ARG;
  }
  if (g->same_proc[r]) { /* a thread of this process: its address, if the driver agrees */
    void* owner;
    int dev;
    uint64_t id;
    if (cudev_describe((void*)(uintptr_t)d->ptr, &owner, &dev, &base, &size, &id) != 0 || d->ptr < base ||
        need > base + size - d->ptr) {
      WARN("rank 0: rank %d's %s %p (+%zu bytes) is not device memory of this context", r, what,
           (void*)(uintptr_t)d->ptr, need);
      return CH_INVALID_ARG;
    }
    *addr = d->ptr;
  } else if (!d->shareable) {
    WARN("rank 0: rank %d's %s cannot be shared with other processes through CUDA IPC (e.g. cuMemCreate memory): "
         "allocate it with cudaMalloc or ncclMemAlloc, or set CHORUS_CUDA_DIRECT=0", r, what);
    return CH_INVALID_USAGE;
  } else {
    CHECK(map_peer(cp, r, d, &base, &size));
    if (d->off > size || need > size - d->off) {
      WARN("rank 0: rank %d's %s (offset %llu, %zu bytes) lies outside its %zu-byte allocation", r, what,
           (unsigned long long)d->off, need, size);
      return CH_INVALID_ARG;
    }
    *addr = base + d->off;
  }
  if (*addr % (esize ? esize : 1)) {
    WARN("rank 0: rank %d's %s (%p) is not aligned to its %zu-byte elements", r, what, (void*)(uintptr_t)*addr, esize);
    return CH_INVALID_ARG;
  }
  return CH_OK;
}

/* The copy numbered k on pair s -> t, both descriptions in hand: checked, then queued. */
static ch_status queue_copy(struct gpu_copier* cp, int s, int t, uint32_t k, const struct gpu_desc* snd,
                            const struct gpu_desc* rcv) {
  struct gpu_comm* g = cp->g;
  if (snd->func != FUNC_SEND || rcv->func != FUNC_RECV || snd->root != t || rcv->root != s || snd->seq != k ||
      rcv->seq != k || snd->type != rcv->type || snd->count != rcv->count || snd->type >= DEV_NTYPES) {
    WARN("rank 0: the send #%u from rank %d to rank %d does not match its receive: %s to rank %d, count %llu, type %u "
         "against %s from rank %d, count %llu, type %u", k, s, t, algo_fname((int)snd->func), snd->root,
         (unsigned long long)snd->count, snd->type, algo_fname((int)rcv->func), rcv->root,
         (unsigned long long)rcv->count, rcv->type);
    return CH_INVALID_USAGE;
  }
  size_t esize = red_type_size((int)snd->type), need = snd->count * esize;
  if (esize && snd->count > SIZE_MAX / esize) return CH_INVALID_ARG;
  /* The table slot's last copy is done (waits only when GPU_SLOTS copies are in flight). */
  uint32_t seq = ++cp->count;
  if (!seq) seq = ++cp->count; /* 0 never names a table */
  struct cp_slot* sl = &cp->slot[seq % GPU_SLOTS];
  for (uint64_t i = 0; sl->used && !copied(g, sl->src, sl->dst, sl->k); i++) {
    CHECK(stopped(cp));
    ut_backoff(i);
  }
  struct dev_table* tab = &cp->tab[seq % GPU_SLOTS];
  CHECK(addr_of(cp, s, "sendbuff", &snd->buf[DEV_SEND], need, esize, s, t, k, &tab->buf[DEV_SEND][s]));
  CHECK(addr_of(cp, t, "recvbuff", &rcv->buf[DEV_RECV], need, esize, s, t, k, &tab->buf[DEV_RECV][t]));
  __atomic_store_n(&tab->seq, seq, __ATOMIC_RELEASE);
  *sl = (struct cp_slot){.src = s, .dst = t, .k = k, .used = 1};
  cudaStream_t* st = &cp->st[s * cp->n + t];
  if (!*st) CHECK(cudev_stream_new((void**)st, g->ctx));
  struct gpu_pair* pd = (struct gpu_pair*)((char*)g->seg_dev + gpu_pair_off(g->n, s, t));
  struct cudev_memop wait[2] = {{.dev = (void*)&pd->posted_send, .value = k, .wait = 1},
                                {.dev = (void*)&pd->posted, .value = k, .wait = 1}};
  struct cudev_memop done = {.dev = (void*)&pd->copied, .value = k, .wait = 0};
  struct dev_args a;
  memset(&a, 0, sizeof(a));
  a.table = (uint64_t)(uintptr_t)((char*)cp->tab_dev + (seq % GPU_SLOTS) * sizeof(struct dev_table));
  a.seq = seq, a.type = (int32_t)snd->type, a.op_kind = RED_SUM, a.njobs = 1;
  a.fail[0] = (uint64_t)(uintptr_t)((char*)g->priv_dev + offsetof(struct gpu_priv, failed));
  a.fail[1] = (uint64_t)(uintptr_t)((char*)g->seg_dev + offsetof(struct gpu_seg, failed_by));
  a.job[0] = (struct dev_job){.src_mask = 1u << s, .dst_mask = 1u << t, .src_buf = DEV_SEND, .dst_buf = DEV_RECV,
                              .reduce = DEV_COPY, .count = snd->count};
  INFO(LOG_P2P, "copier: send #%u %d -> %d, %llu x type %u: %p -> %p (table %u)", k, s, t,
       (unsigned long long)snd->count, snd->type, (void*)(uintptr_t)tab->buf[DEV_SEND][s],
       (void*)(uintptr_t)tab->buf[DEV_RECV][t], seq);
  CHECK(cudev_memops(*st, wait, 2, g->ctx));
  CHECK(gpu_launch_jobs(g, &a, cp->stage_dev, seq, *st));
  CHECK(cudev_memops(*st, &done, 1, g->ctx));
  return CH_OK;
}

/* Pair s -> t's next copy, if both sides have posted it: 1 if queued. */
static int try_pair(struct gpu_copier* cp, int s, int t, ch_status* err) {
  struct gpu_comm* g = cp->g;
  uint32_t k = cp->next[s * cp->n + t] + 1;
  struct gpu_mail *ms = mail_of(g, s, t, k, GPU_MAIL_SEND), *mr = mail_of(g, s, t, k, GPU_MAIL_RECV);
  if (atomic_load_explicit(&ms->seq, memory_order_acquire) != k ||
      atomic_load_explicit(&mr->seq, memory_order_acquire) != k)
    return 0;
  struct gpu_desc snd = ms->d, rcv = mr->d; /* rewritten only once `taken` says so */
  struct gpu_pair* pr = pair_of(g, s, t);
  atomic_store_explicit(&pr->taken_send, k, memory_order_release);
  atomic_store_explicit(&pr->taken, k, memory_order_release);
  cp->next[s * cp->n + t] = k;
  *err = queue_copy(cp, s, t, k, &snd, &rcv);
  return 1;
}

/* Nothing posted that is not copied, no copy in flight, and every other process rank has left (or is
 * gone): the copier's work is over. Its own thread only (next[]). */
static int drained(struct gpu_copier* cp) {
  struct gpu_comm* g = cp->g;
  struct ncclComm* comm = g->comm;
  for (int s = 1; s < cp->n; s++)
    for (int t = 1; t < cp->n; t++) {
      uint32_t k = cp->next[s * cp->n + t] + 1;
      if (s != t && (atomic_load_explicit(&mail_of(g, s, t, k, GPU_MAIL_SEND)->seq, memory_order_acquire) == k ||
                     atomic_load_explicit(&mail_of(g, s, t, k, GPU_MAIL_RECV)->seq, memory_order_acquire) == k))
        return 0;
    }
  if (in_flight(cp)) return 0;
  for (int r = 1; r < cp->n; r++) {
    const struct boot_rank_info* p = &comm->peers[r];
    if (atomic_load_explicit(&g->seg->w[r].left, memory_order_acquire)) continue;
    /* A thread rank of this process may be destroyed after rank 0 by the same thread (a loop over
     * the comms, as nccl-tests does): its calls are launched by then, and a post its bridge still
     * owes comes within moments, so 100 ms without work stands for it having left. */
    if (g->same_proc[r] && ut_now_ns() - cp->last_work > 100 * UT_NS_PER_MS) continue;
    if (p->pid_ns == comm->peers[0].pid_ns && p->pid > 0 && kill(p->pid, 0) != 0 && errno == ESRCH) continue;
    return 0;
  }
  return 1;
}

static void* copier_main(void* arg) {
  struct gpu_copier* cp = arg;
  struct gpu_comm* g = cp->g;
  int n = cp->n;
  log_set_error_sink(&g->comm->last_error); /* this thread's WARNs are the comm's last error */
  for (uint64_t idle = 0; stopped(cp) == CH_OK;) {
    int did = 0;
    ch_status e = CH_OK;
    for (int s = 1; s < n && e == CH_OK; s++)
      for (int t = 1; t < n && e == CH_OK; t++)
        if (s != t) did |= try_pair(cp, s, t, &e);
    if (e != CH_OK) {
      if (e != CH_ABORTED) comm_set_async_error(g->comm, e); /* and gpu_unblock: the peers fail too */
      break;
    }
    if (did) {
      idle = 0;
      cp->last_work = ut_now_ns();
      continue;
    }
    if (atomic_load(&cp->stop) == STOP_DRAIN && (drained(cp) || ut_now_ns() > cp->drain_until)) break;
    ut_backoff(idle++);
  }
  return NULL;
}

ch_status gpu_copier_start(struct gpu_comm* g) {
  if (g->rank != 0 || !gpu_p2p_relayed(g, 1, 2)) return CH_OK;
  int n = g->n;
  struct gpu_copier* cp = calloc(1, sizeof(*cp));
  if (!cp) return CH_SYSTEM;
  cp->g = g, cp->n = n;
  cp->next = calloc((size_t)n * n, sizeof(uint32_t));
  cp->st = calloc((size_t)n * n, sizeof(cudaStream_t));
  cp->ipc = calloc((size_t)n, sizeof(*cp->ipc));
  cp->tab = cudrv_host_alloc(GPU_SLOTS * sizeof(struct dev_table), g->ctx, 1, &cp->tab_dev);
  ch_status s = cp->next && cp->st && cp->ipc && cp->tab ? CH_OK : CH_SYSTEM;
  if (s == CH_OK) memset(cp->tab, 0, GPU_SLOTS * sizeof(struct dev_table));
  if (s == CH_OK) s = cudev_dev_alloc(g->ctx, GPU_SLOTS * sizeof(struct dev_staged), &cp->stage_dev);
  if (s != CH_OK) {
    if (cp->stage_dev) cudev_dev_free(g->ctx, cp->stage_dev);
    if (cp->tab) cudrv_host_free(cp->tab, g->ctx);
    free(cp->next), free(cp->st), free(cp->ipc), free(cp);
    return s;
  }
  g->copier = cp;
  return CH_OK;
}

/* Once comm->gpu is published (the thread may fail the comm, whose hook reads it). */
void gpu_copier_run(struct gpu_comm* g) {
  struct gpu_copier* cp = g->copier;
  if (!cp) return;
  if (pthread_create(&cp->th, NULL, copier_main, cp) == 0) {
    cp->running = 1;
    return;
  }
  WARN("rank 0: cannot start the thread that copies sends between the other ranks on the GPU: failing the "
       "communicator");
  comm_set_async_error(g->comm, CH_SYSTEM);
}

/* Copies queued on the GPU and not done: the copier's thread, or anyone once it is joined. */
static int in_flight(struct gpu_copier* cp) {
  for (int i = 0; i < GPU_SLOTS; i++)
    if (cp->slot[i].used && !copied(cp->g, cp->slot[i].src, cp->slot[i].dst, cp->slot[i].k)) return 1;
  return 0;
}
/* 0 while the thread runs (its slots are its own; destroy stops it before asking). */
int gpu_copier_busy(struct gpu_comm* g) {
  struct gpu_copier* cp = g->copier;
  return cp && !cp->running && in_flight(cp);
}

/* The relayed pairs' `posted` words past every queued copy, so that the copier's streams go on: their
 * kernels find rank 0's failure word set (gpu_unblock) and touch nothing. */
static void let_through(struct gpu_comm* g) {
  for (int s = 1; s < g->n; s++)
    for (int t = 1; t < g->n; t++) {
      if (s == t) continue;
      struct gpu_pair* pr = pair_of(g, s, t);
      uint32_t v = atomic_load_explicit(&pr->copied, memory_order_acquire) + 0x40000000u;
      atomic_store_explicit(&pr->posted, v, memory_order_release);
      atomic_store_explicit(&pr->posted_send, v, memory_order_release);
    }
}

void gpu_copier_unblock(struct gpu_comm* g) {
  if (g->copier && g->seg) let_through(g);
}

/* After the comm's own streams are done (or let through): the thread joined; copies still queued (a
 * rank that never posted, or an abort) are let through with the kernels off, and given a second to
 * end. The streams, tables and mappings go with the comm (gpu_copier_free); while copies are queued
 * the comm counts as busy (gpu/setup.c orphans it). */
void gpu_copier_stop(struct gpu_comm* g) {
  struct gpu_copier* cp = g->copier;
  if (!cp) return;
  int aborted = __atomic_load_n(&g->comm->abort_flag, __ATOMIC_ACQUIRE);
  cp->drain_until = ut_now_ns() + 10 * UT_NS_PER_S; /* as long as destroy waits for its own streams */
  atomic_store(&cp->stop, aborted ? STOP_NOW : STOP_DRAIN);
  if (cp->running) pthread_join(cp->th, NULL);
  cp->running = 0;
  if (!gpu_copier_busy(g)) return;
  atomic_store_explicit(&g->priv->failed, 1, memory_order_release); /* rank 0's comm is going: kernels off */
  let_through(g);
  uint64_t t0 = ut_now_ns();
  for (uint64_t i = 0; gpu_copier_busy(g) && ut_now_ns() - t0 < UT_NS_PER_S; i++) {
    if (i % 64 == 0) let_through(g); /* a peer's stream may write its own, lower, number meanwhile */
    ut_backoff(i);
  }
}

void gpu_copier_free(struct gpu_comm* g) {
  struct gpu_copier* cp = g->copier;
  if (!cp) return;
  g->copier = NULL;
  int n = cp->n;
  for (int i = 0; i < n * n; i++) cudev_stream_free(cp->st[i], g->ctx);
  for (int r = 0; r < n; r++)
    for (int i = 0; i < GPU_IPC_CACHE; i++)
      if (cp->ipc[r][i].base) gpu_ipc_close(g->ctx, cp->ipc[r][i].base);
  cudev_dev_free(g->ctx, cp->stage_dev);
  cudrv_host_free(cp->tab, g->ctx);
  free(cp->next), free(cp->st), free(cp->ipc), free(cp);
}
