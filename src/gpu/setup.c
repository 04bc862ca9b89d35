/* Ranks on one GPU (gpu.h): what is set up at init and taken down with the communicator. */
#define _GNU_SOURCE
#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "../misc/log.h"
#include "../misc/param.h"
#include "../misc/utils.h"
#include "../transport/transport.h"
#include "../core/host_stream.h"
#include "gpu.h"

void gpu_hello_fill(struct ncclComm* comm, struct gpu_hello* h) {
  memset(h, 0, sizeof(*h));
  void* ctx = comm->cuda_ctx; /* the context current when the application made the communicator */
  int sms = 0, ordinal = -1;
  h->direct = param_int(PARAM_CUDA_DIRECT) != 0;
  h->relay = (int32_t)UT_MAX(UT_MIN(param_int(PARAM_CUDA_RELAY), 1), -1);
  /* a chunk of whole 4 KiB pages, at least 64 KiB (16-byte shares of 2 to 32 ranks' blocks), at most 256 MiB */
  h->relay_chunk = (uint32_t)UT_ALIGN_UP(UT_MAX(UT_MIN(param_int(PARAM_CUDA_RELAY_CHUNK), 1 << 28), 1 << 16), 4096);
  h->relay_depth = (uint32_t)UT_MAX(UT_MIN(param_int(PARAM_CUDA_RELAY_DEPTH), 64), 2);
  h->has_ctx = ctx && cudrv_async_ok() && param_int(PARAM_CUDA_ASYNC); /* synchronous pieces would only cost */
  h->piece = (uint32_t)UT_MAX(UT_MIN(param_int(PARAM_CUDA_STAGE_PIECE), 1 << 30), 0);
  /* staged reductions on the GPU (pieces_setup): kernels loaded for this context */
  int stage_reduce = h->has_ctx && param_int(PARAM_CUDA_STAGE_REDUCE) != 0;
  int paths = h->direct || h->relay != 0;
  if (!ctx || (!paths && !stage_reduce) || comm->nranks > DEV_MAX_RANKS || !cudrv_async_ok() || !cudev_ok())
    return;
  if (cudev_device(ctx, h->uuid, &sms, &ordinal) != CH_OK) return; /* WARNed */
  if (h->direct) /* only the direct path shares device memory (the relay maps host memory only) */
    h->shares = (uint32_t)cudev_probe(ctx, &h->probe_id, &h->probe); /* first: it checks the context is the same */
  if (!cudev_kernel(ctx, 0)) return;
  h->kernels = (uint32_t)stage_reduce;
  if (!paths) return;
  h->capable = 1;
  h->ctx_id = (uint64_t)(uintptr_t)ctx;
}

/* ---- the shared page: one mapping per process, registered with CUDA once ---- */

struct seg_map {
  struct seg_map* next;
  uint64_t token;
  void* mem;
  void* dev;
  size_t bytes;
  void* ctx;
  int refs;
};
static pthread_mutex_t maps_mu = PTHREAD_MUTEX_INITIALIZER;
static struct seg_map* maps; /* under maps_mu */

/* The mapping of `token` in this process: found (a rank of this process already has it), or made
 * from mem (rank 0, which created it) or from the exporter's descriptor server. NULL: WARNed. */
static struct seg_map* seg_get(uint64_t token, void* mem, uint64_t nonce, size_t bytes, void* ctx) {
  pthread_mutex_lock(&maps_mu);
  struct seg_map* m = maps;
  while (m && m->token != token) m = m->next;
  if (m) { /* a thread of this process mapped it first: rank 0's own mapping is not needed */
    m->refs++;
    if (mem && mem != m->mem) munmap(mem, bytes);
    pthread_mutex_unlock(&maps_mu);
    return m;
  }
  int mapped_here = !mem;
  if (!mem) mem = tp_fd_map(nonce, token, bytes, offsetof(struct gpu_seg, token), 0, 0, "the GPU barrier page");
  if (mem && (m = calloc(1, sizeof(*m))) != NULL) {
    m->token = token, m->mem = mem, m->bytes = bytes, m->ctx = ctx, m->refs = 1;
    if (cudev_host_register(mem, bytes, ctx, &m->dev) == CH_OK) {
      m->next = maps;
      maps = m;
    } else {
      free(m);
      m = NULL;
    }
  }
  if (!m && mem && mapped_here) munmap(mem, bytes);
  pthread_mutex_unlock(&maps_mu);
  return m;
}

static void seg_put(void* mem) {
  struct seg_map* last = NULL;
  pthread_mutex_lock(&maps_mu);
  for (struct seg_map** pp = &maps; *pp; pp = &(*pp)->next) {
    struct seg_map* m = *pp;
    if (m->mem != mem || --m->refs > 0) continue;
    *pp = m->next, last = m;
    break;
  }
  pthread_mutex_unlock(&maps_mu);
  if (!last) return;
  /* Off the lock (the driver may wait for the device): a new seg_get of the token maps it anew. */
  cudev_host_unregister(last->mem, last->ctx);
  munmap(last->mem, last->bytes);
  free(last);
}

/* words, pairs, mailboxes, graphs, boards; the relay's words and rings (relay: its chunk and depth) */
static size_t seg_bytes(int n, const struct gpu_hello* relay) {
  if (relay) return gpu_ring_off(n, (int)n, 0, relay->relay_chunk, relay->relay_depth);
  return UT_ALIGN_UP(gpu_board_off(n, n, 0), 4096);
}

/* Rank 0 creates the page (a sealed memfd, so nothing outlives the processes) and exports it; every
 * rank maps and registers it; *ok: every rank has it. Only the token crosses the bootstrap. */
static ch_status seg_setup(struct ncclComm* comm, struct gpu_comm* g, size_t bytes, int* ok) {
  int n = comm->nranks, me = comm->rank, fd = -1;
  uint64_t token = 0;
  uint64_t* all = calloc((size_t)n, sizeof(uint64_t));
  if (!all) return CH_SYSTEM;
  void* made = NULL;
  if (me == 0 && g) {
    fd = tp_memfd_new("chorus-gpu-flags", bytes, 1);
    made = fd < 0 ? MAP_FAILED : mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (made == MAP_FAILED) {
      WARN("cannot create %zu bytes of shared memory for the GPU barrier words: %s", bytes, strerror(errno));
      made = NULL;
    } else {
      struct gpu_seg* s = made;
      s->n = (uint32_t)n;
      if (!(s->token = tp_fd_export(fd, bytes))) { /* logged */
        munmap(made, bytes);
        made = NULL;
      }
      all[0] = token = made ? s->token : 0;
    }
  }
  ch_status s = boot_allgather(comm->boot, all, sizeof(uint64_t));
  struct seg_map* m = NULL;
  if (s == CH_OK && all[0] && g) m = seg_get(all[0], me == 0 ? made : NULL, comm->peers[0].proc_nonce, bytes, g->ctx);
  if (m && ((struct gpu_seg*)m->mem)->n != (uint32_t)n) { /* not the page rank 0 described */
    WARN("the GPU barrier page from rank 0 is for %u ranks, not %d: not used", ((struct gpu_seg*)m->mem)->n, n);
    if (m->mem == made) made = NULL; /* unmapped by seg_put */
    seg_put(m->mem);
    m = NULL;
  }
  if (me == 0 && made && !m) munmap(made, bytes);
  for (int r = 0; r < n; r++) all[r] = 0;
  all[me] = m != NULL;
  if (s == CH_OK) s = boot_allgather(comm->boot, all, sizeof(uint64_t));
  *ok = s == CH_OK;
  for (int r = 0; r < n && *ok; r++) *ok = all[r] != 0;
  if (me == 0 && fd >= 0) { /* everyone who could map it has */
    if (token) tp_fd_withdraw(token);
    close(fd);
  }
  if (m && *ok) {
    g->seg = m->mem, g->seg_dev = m->dev;
  } else if (m) {
    seg_put(m->mem);
  }
  free(all);
  return s;
}

/* ---- peers' allocations, opened once per process and context (the driver maps a handle once per
 * context, and a mapping made in one context is not an address in another) ---- */

struct ipc_open {
  struct ipc_open* next;
  void* ctx;
  uint64_t nonce, id;
  uintptr_t base;
  size_t size;
  int refs;
  int closing; /* its last user is closing it, off the lock: an open of the same waits until it is gone */
};
static pthread_mutex_t ipc_mu = PTHREAD_MUTEX_INITIALIZER;
static struct ipc_open* opens; /* under ipc_mu */

ch_status gpu_ipc_open(void* ctx, uint64_t nonce, uint64_t id, const cudev_ipc_handle* h, uintptr_t* base,
                       size_t* size, int* cu) {
  ch_status s = CH_OK;
  *cu = 0;
  pthread_mutex_lock(&ipc_mu);
  struct ipc_open* o;
  for (uint64_t i = 0;; i++) { /* the driver maps a handle once per context: wait out a close of it */
    o = opens;
    while (o && (o->nonce != nonce || o->id != id || o->ctx != ctx)) o = o->next;
    if (!o || !o->closing) break;
    pthread_mutex_unlock(&ipc_mu);
    ut_backoff(i);
    pthread_mutex_lock(&ipc_mu);
  }
  if (o) {
    o->refs++;
  } else if ((o = calloc(1, sizeof(*o))) == NULL) {
    s = CH_SYSTEM;
  } else if ((*cu = cudev_ipc_open(h, ctx, &o->base)) != 0) {
    s = CH_SYSTEM;
  } else {
    uintptr_t b;
    uint64_t here_id;
    void* owner;
    int dev;
    if (cudev_describe((void*)o->base, &owner, &dev, &b, &o->size, &here_id) != 0) {
      WARN("a peer's allocation opened through CUDA IPC at %p: the driver gives no range for it", (void*)o->base);
      cudev_ipc_close(o->base, ctx);
      s = CH_SYSTEM;
    }
  }
  if (s == CH_OK && o->refs == 0) {
    o->ctx = ctx, o->nonce = nonce, o->id = id, o->refs = 1;
    o->next = opens;
    opens = o;
  } else if (s != CH_OK) {
    free(o);
  }
  if (s == CH_OK) *base = o->base, *size = o->size;
  pthread_mutex_unlock(&ipc_mu);
  return s;
}

/* The driver call runs off the lock: it may wait for the device, and the bridges open under it. */
void gpu_ipc_close(void* ctx, uintptr_t base) {
  struct ipc_open* last = NULL;
  pthread_mutex_lock(&ipc_mu);
  for (struct ipc_open* o = opens; o; o = o->next)
    if (o->base == base && o->ctx == ctx && !o->closing) {
      if (--o->refs == 0) o->closing = 1, last = o;
      break;
    }
  pthread_mutex_unlock(&ipc_mu);
  if (!last) return;
  cudev_ipc_close(last->base, ctx);
  pthread_mutex_lock(&ipc_mu);
  for (struct ipc_open** pp = &opens; *pp; pp = &(*pp)->next)
    if (*pp == last) {
      *pp = last->next;
      break;
    }
  pthread_mutex_unlock(&ipc_mu);
  free(last);
}

/* Whether this process can open every peer process's probe (CUDA IPC may be refused in a sandbox,
 * or between containers): once per peer process, opened and closed again. Said once, here. */
static int ipc_works(struct ncclComm* comm, void* ctx, const struct gpu_hello* all) {
  int n = comm->nranks, me = comm->rank;
  for (int r = 0; r < n; r++) {
    uint64_t nonce = comm->peers[r].proc_nonce;
    int seen = nonce == comm->peers[me].proc_nonce;
    for (int q = 0; q < r && !seen; q++) seen = comm->peers[q].proc_nonce == nonce;
    if (seen) continue;
    uintptr_t base = 0;
    size_t size = 0;
    int cu = 0;
    if (gpu_ipc_open(ctx, nonce, all[r].probe_id, &all[r].probe, &base, &size, &cu) != CH_OK) {
      INFO(LOG_INIT, "rank %d: CUDA IPC with rank %d's process does not work here (cuIpcOpenMemHandle: %s): calls "
           "on device buffers go through host memory", me, r, cu ? cudrv_errstr(cu) : "out of memory");
      return 0;
    }
    gpu_ipc_close(ctx, base);
  }
  return 1;
}

/* Where the communicator's calls on device buffers run, decided alike on every rank from every rank's
 * hello, and why not on the GPU (said once at init): GPU_NONE (host staging), GPU_DIRECT (ranks on one
 * GPU reading each other's buffers) or GPU_RELAY (through pinned host memory, gpu/relay.c). */
enum { GPU_NONE = 0, GPU_DIRECT = 1, GPU_RELAY = 2 };
static int choose(const struct ncclComm* comm, const struct gpu_hello* all) {
  int n = comm->nranks, me = comm->rank, apart = 0;
  if (!all[me].capable) return GPU_NONE; /* no CUDA here: nothing to say */
  const char *why = NULL, *direct_why = NULL;
  int who = -1, direct_who = -1;
  for (int r = 0; r < n && !why; r++) {
    who = r;
    if (!all[r].capable) why = "has no current CUDA context with Chorus's kernels at init";
    else if (r != me && !(tp_flags(comm->peer_tp[r]) & TP_F_SAME_HOST)) why = "is on another host (or NCCL_SHM_DISABLE)";
    /* Every rank must decide alike (they all take part in setup's allgathers, or none does): so these
     * look at every pair of ranks, not only at pairs with this one. */
    for (int q = 0; q < n && !why; q++) {
      int same = comm->peers[q].proc_nonce == comm->peers[r].proc_nonce;
      if (same && all[q].ctx_id != all[r].ctx_id) why = "shares its process with a rank on another CUDA context";
      else if (!same && !all[r].shares && !direct_why)
        direct_why = "is one of several processes and could not export device memory through CUDA IPC", direct_who = r;
    }
    if (memcmp(all[r].uuid, all[0].uuid, 16)) apart = 1;
    if (!direct_why && apart) direct_why = "is on another GPU", direct_who = r;
    if (!direct_why && !all[r].direct) direct_why = "has CHORUS_CUDA_DIRECT=0", direct_who = r;
  }
  if (why) {
    INFO(LOG_INIT, "rank %d: rank %d %s: calls on device buffers go through host memory", me, who, why);
    return GPU_NONE;
  }
  int relay = all[0].relay; /* rank 0's setting */
  if (n > 1 && (relay == 1 || (relay == -1 && apart))) return GPU_RELAY;
  if (!direct_why) return GPU_DIRECT;
  INFO(LOG_INIT, "rank %d: rank %d %s: calls on device buffers go through host memory%s", me, direct_who, direct_why,
       relay == 0 ? " (CHORUS_CUDA_RELAY=0)" : "");
  return GPU_NONE;
}

/* The ranks of GPU paths in this process, so that a peer that claims this process's nonce (sent in
 * the bootstrap, which every rank of the job sees) is taken for a thread here, whose pointers are
 * used as they are, only if it really is one. Under local_mu. */
static pthread_mutex_t local_mu = PTHREAD_MUTEX_INITIALIZER;
static struct local_rank {
  uint64_t comm_hash;
  int rank;
} * locals;
static int nlocals, locals_cap;

static int local_add(uint64_t hash, int rank) {
  pthread_mutex_lock(&local_mu);
  int ok = 1;
  if (nlocals == locals_cap) {
    int cap = locals_cap ? 2 * locals_cap : 16;
    struct local_rank* p = realloc(locals, sizeof(*p) * (size_t)cap);
    if (p) locals = p, locals_cap = cap;
    else ok = 0;
  }
  if (ok) locals[nlocals++] = (struct local_rank){hash, rank};
  pthread_mutex_unlock(&local_mu);
  return ok;
}

static int local_has(uint64_t hash, int rank) {
  pthread_mutex_lock(&local_mu);
  int found = 0;
  for (int i = 0; i < nlocals && !found; i++) found = locals[i].comm_hash == hash && locals[i].rank == rank;
  pthread_mutex_unlock(&local_mu);
  return found;
}

static void local_remove(uint64_t hash, int rank) {
  pthread_mutex_lock(&local_mu);
  for (int i = 0; i < nlocals; i++)
    if (locals[i].comm_hash == hash && locals[i].rank == rank) {
      locals[i] = locals[--nlocals];
      break;
    }
  pthread_mutex_unlock(&local_mu);
}

/* Where calls on device buffers are staged through host memory (no GPU path: ranks on different
 * hosts), large ones run in pieces so that copies overlap transfers, and reductions run on the GPU
 * (staging/staging.c). Every rank makes its calls alike, whatever its buffers, so pieces only where every
 * rank has a context (it then could stage) and at rank 0's size, GPU reductions only where every
 * rank's GPU can run them. */
static void pieces_setup(struct ncclComm* comm, const struct gpu_hello* all) {
  int ok = all && comm->nranks > 1, kernels = ok;
  for (int r = 0; ok && r < comm->nranks; r++) ok = all[r].has_ctx != 0, kernels &= all[r].kernels != 0;
  comm->stage_piece = ok && all[0].piece > 0 ? all[0].piece : 0;
  comm->stage_gpu_reduce = ok && kernels;
  if (comm->stage_piece)
    INFO(LOG_INIT, "rank %d: AllReduce, Reduce, Broadcast, AllGather and ReduceScatter over %zu bytes run in pieces of that size (CHORUS_CUDA_STAGE_PIECE)",
         comm->rank, comm->stage_piece);
  if (ok)
    INFO(LOG_INIT, "rank %d: staged AllReduce, Reduce and ReduceScatter reduce on %s (CHORUS_CUDA_STAGE_REDUCE%s)",
         comm->rank, kernels ? "the GPU" : "the CPU", kernels ? "" : " off, or kernels missing, on some rank");
}

ch_status gpu_setup(struct ncclComm* comm, const struct gpu_hello* all) {
  int n = comm->nranks, me = comm->rank;
  struct gpu_hello one;
  if (n == 1) {
    gpu_hello_fill(comm, &one);
    all = &one;
  }
  int path = all ? choose(comm, all) : GPU_NONE;
  if (path == GPU_NONE) {
    pieces_setup(comm, all);
    return CH_OK;
  }
  /* From here every rank takes part in every allgather below (agreed above), whatever fails here: a
   * rank that failed alone says so, and every rank falls back together. */
  struct gpu_comm* g = calloc(1, sizeof(*g));
  int ok = g != NULL;
  if (g) {
    g->comm = comm, g->ctx = comm->cuda_ctx, g->n = n, g->rank = me;
    g->relay = path == GPU_RELAY;
    g->relay_chunk = all[0].relay_chunk, g->relay_depth = all[0].relay_depth; /* rank 0's */
    unsigned char uuid[16];
    g->same_proc = calloc((size_t)n, 1);
    g->ipc = calloc((size_t)n, sizeof(*g->ipc));
    g->p2p_sent = calloc((size_t)n, sizeof(*g->p2p_sent));
    g->p2p_recvd = calloc((size_t)n, sizeof(*g->p2p_recvd));
    ok = g->same_proc && g->ipc && g->p2p_sent && g->p2p_recvd &&
         cudev_device(g->ctx, uuid, &g->sms, &g->ordinal) == CH_OK;
    for (int r = 0; ok && r < n; r++) {
      g->same_proc[r] = comm->peers[r].proc_nonce == comm->peers[me].proc_nonce;
      g->any_proc |= !g->same_proc[r];
    }
    g->comm_hash = comm->comm_hash;
    if (ok) ok = g->local = local_add(g->comm_hash, me); /* before seg_setup's allgathers: seen after them */
    /* agreed in seg_setup's second allgather; the relay shares no device memory */
    if (ok && g->any_proc && !g->relay) ok = ipc_works(comm, g->ctx, all);
  }
  ch_status s = CH_OK;
  if (n > 1) s = seg_setup(comm, ok ? g : NULL, seg_bytes(n, path == GPU_RELAY ? &all[0] : NULL), &ok);
  for (int r = 0; s == CH_OK && ok && r < n; r++)
    if (g->same_proc[r] && !local_has(g->comm_hash, r)) {
      WARN("rank %d: rank %d gave this process's nonce but is no rank of this communicator in this process: "
           "calls on device buffers go through host memory", me, r);
      ok = 0;
    }
  if (s == CH_OK && ok) {
    g->priv = cudrv_host_alloc(sizeof(struct gpu_priv), g->ctx, 1, &g->priv_dev);
    if (g->priv) memset(g->priv, 0, sizeof(*g->priv));
    ok = g->priv && stream_create(&g->bridge) == CH_OK &&
         cudev_dev_alloc(g->ctx, GPU_SLOTS * sizeof(struct dev_staged), &g->stage_dev) == CH_OK;
    for (int t = 0; ok && t <= DEV_STAGE; t++) ok = (g->fn[t] = cudev_kernel(g->ctx, t)) != NULL;
    g->stage_blocks = (int)UT_MAX(param_int(PARAM_CUDA_STAGE_BLOCKS), 0);
    g->one_kernel = !g->relay && param_int(PARAM_CUDA_ONE_KERNEL) != 0; /* the relay: each rank its own */
    g->unroll = cudev_unroll();
    if (ok) ok = gpu_copier_start(g) == CH_OK; /* rank 0 of 3+ ranks (its one_kernel is everyone's) */
    if (ok && g->relay) ok = gpu_relay_setup(g) == CH_OK;
  }
  /* One rank that failed alone here must not leave the others on the GPU path: agree once more. */
  if (s == CH_OK && n > 1) {
    uint64_t* oks = calloc((size_t)n, sizeof(uint64_t));
    if (!oks) s = CH_SYSTEM;
    if (s == CH_OK) {
      oks[me] = (uint64_t)ok | (ok && g->one_kernel ? 2u : 0u);
      s = boot_allgather(comm->boot, oks, sizeof(uint64_t));
      for (int r = 0; s == CH_OK && r < n; r++) ok &= (oks[r] & 1) != 0;
      if (ok) g->one_kernel = (oks[0] & 2) != 0; /* rank 0's choice, should ranks' settings differ */
    }
    free(oks);
  }
  if (s != CH_OK || !ok) {
    if (!g) return s == CH_OK ? CH_SYSTEM : s;
    gpu_copier_free(g); /* never started */
    gpu_relay_free(g);
    if (g->bridge) stream_destroy(g->bridge);
    if (g->priv) cudrv_host_free(g->priv, g->ctx);
    cudev_dev_free(g->ctx, g->stage_dev);
    if (g->seg) seg_put(g->seg);
    if (g->local) local_remove(g->comm_hash, me);
    free(g->same_proc);
    free(g->ipc);
    free(g->p2p_sent);
    free(g->p2p_recvd);
    free(g);
    if (s == CH_OK) INFO(LOG_INIT, "rank %d: the GPU path could not be set up on every rank: calls on device "
                         "buffers go through host memory", me);
    if (s == CH_OK) pieces_setup(comm, all); /* alike: every rank fell back together */
    return s;
  }
  comm->gpu = g;
  gpu_copier_run(g);
  gpu_watch_add(g);
  if (g->relay)
    INFO(LOG_INIT, "rank %d: %d ranks on this host, not all on one GPU (or CHORUS_CUDA_RELAY=1): collectives on "
         "device buffers relay through pinned host memory in %zu-byte chunks (%u per rank at once), each GPU "
         "reducing what its rank receives", me, n, g->relay_chunk, g->relay_depth);
  else
    INFO(LOG_INIT, "rank %d: %d rank(s) on one GPU (%d SMs): calls on device buffers run there, %s", me, n, g->sms,
         g->any_proc ? "sharing buffers through CUDA IPC" : "all ranks threads of this process");
  return CH_OK;
}

void gpu_test_seq_base(struct ncclComm* comm, uint32_t base) {
  struct gpu_comm* g = comm->gpu;
  g->next_seq = g->next_cseq = base;
  atomic_store(&g->launched, base);
  atomic_store(&g->launched_c, base);
  atomic_store(&g->priv->ready, base);
  for (int k = 0; k < GPU_SLOTS; k++) atomic_store(&g->priv->slot_done[k], base);
  if (g->seg) atomic_store(&g->seg->w[g->rank].arrive, base), atomic_store(&g->seg->w[g->rank].done, base);
}

void gpu_unblock(struct gpu_comm* g) {
  if (!g) return;
  /* First the words every kernel reads before touching memory: a stream let through below, here or
   * at a peer, finds them set. */
  atomic_store_explicit(&g->priv->failed, 1, memory_order_release);
  int32_t none = 0; /* the peers' watchers fail their ranks too */
  if (g->seg) atomic_compare_exchange_strong(&g->seg->failed_by, &none, g->rank + 1);
  const uint32_t ahead = 0x40000000u;
  uint32_t v = atomic_load_explicit(&g->launched, memory_order_acquire) + ahead;
  uint32_t vc = atomic_load_explicit(&g->launched_c, memory_order_acquire) + ahead;
  /* Kernels not yet started skip: slot i only serves calls whose number is i modulo GPU_SLOTS. */
  for (uint32_t i = 0; i < GPU_SLOTS; i++) __atomic_store_n(&g->priv->slot[i].seq, i + 1, __ATOMIC_RELEASE);
  if (g->seg)
    for (int r = 0; r < g->n; r++) {
      atomic_store_explicit(&g->seg->w[r].arrive, vc, memory_order_release);
      atomic_store_explicit(&g->seg->w[r].done, vc, memory_order_release);
      /* the words of this rank's pairs, which its stream and the peer's wait on */
      struct gpu_pair* to = (struct gpu_pair*)((char*)g->seg + gpu_pair_off(g->n, g->rank, r));
      struct gpu_pair* from = (struct gpu_pair*)((char*)g->seg + gpu_pair_off(g->n, r, g->rank));
      uint32_t s = atomic_load_explicit(&g->p2p_sent[r], memory_order_relaxed) + ahead;
      uint32_t d = atomic_load_explicit(&g->p2p_recvd[r], memory_order_relaxed) + ahead;
      atomic_store_explicit(&to->posted, s, memory_order_release);
      atomic_store_explicit(&to->posted_send, s, memory_order_release);
      atomic_store_explicit(&to->copied, s, memory_order_release);
      atomic_store_explicit(&from->posted, d, memory_order_release);
      atomic_store_explicit(&from->posted_send, d, memory_order_release);
      atomic_store_explicit(&from->copied, d, memory_order_release);
    }
  gpu_copier_unblock(g); /* rank 0: the copies it makes for other ranks */
  gpu_relay_unblock(g);
  if (g->seg) /* replays of captured calls go through too (their kernel finds the failure words set) */
    for (uint32_t k = 0; k < GPU_GRAPH_CALLS; k++)
      for (int r = 0; r < g->n; r++) {
        struct gpu_graph_words* w = (struct gpu_graph_words*)((char*)g->seg + gpu_graph_off(g->n, k, r));
        atomic_store_explicit(&w->arrive, 1, memory_order_release);
        atomic_store_explicit(&w->done, 1, memory_order_release);
      }
  atomic_store_explicit(&g->priv->ready, v, memory_order_release);
}

int gpu_unfinished(struct gpu_comm* g, uint32_t* oldest) {
  uint32_t last = atomic_load_explicit(&g->launched, memory_order_acquire);
  for (uint32_t k = GPU_SLOTS; k > 0; k--) { /* oldest first; cyclic: slots never used hold 0, not before */
    uint32_t seq = last - k + 1;
    if ((int32_t)(atomic_load_explicit(&g->priv->slot_done[seq % GPU_SLOTS], memory_order_acquire) - seq) < 0) {
      *oldest = seq;
      return 1;
    }
  }
  return 0;
}

static int all_done(struct gpu_comm* g) {
  uint32_t oldest;
  return !gpu_unfinished(g, &oldest) && !gpu_copier_busy(g);
}

static void release(struct gpu_comm* g) {
  if (g->local) local_remove(g->comm_hash, g->rank), g->local = 0;
  if (g->done_ev) cudrv_event_free(g->done_ev, g->ctx);
  for (int r = 0; r < g->n; r++)
    for (int k = 0; k < GPU_IPC_CACHE; k++)
      if (g->ipc[r][k].base) gpu_ipc_close(g->ctx, g->ipc[r][k].base);
  cudrv_host_free(g->priv, g->ctx);
  cudev_dev_free(g->ctx, g->stage_dev);
  gpu_graphs_free(g);
  gpu_copier_free(g);
  gpu_relay_free(g);
  if (g->seg) seg_put(g->seg);
  free(g->same_proc);
  free(g->ipc);
  free(g->p2p_sent);
  free(g->p2p_recvd);
  free(g);
}

/* Communicators freed while CUDA streams may still use their page and tables: released by a later
 * gpu_free once those streams are done. Under orphans_mu. */
static pthread_mutex_t orphans_mu = PTHREAD_MUTEX_INITIALIZER;
static struct gpu_comm* orphans;

static void release_job(void* g, void* unused) {
  (void)unused;
  release(g);
}
/* The frees may wait for the whole device: off this thread when the device may be waiting for it
 * (the watcher), or when it must not wait for a stuck stream (an abort). */
static void release_on(struct gpu_comm* g, int here) {
  if (g->local) local_remove(g->comm_hash, g->rank), g->local = 0; /* no call of it is checked any more */
  if (here) release(g);
  else cudrv_defer(release_job, g, NULL);
}

/* Orphans whose streams are done are released (here, or by the reaper: cuMemFreeHost waits for the
 * device, which may wait for the watcher); the others are let through again (a stream that went on
 * after an unblock writes its own, lower, numbers into its words, which a peer may wait on). Called
 * by every gpu_free and by the watcher ten times a second. */
void gpu_orphans_tick(int here) {
  struct gpu_comm* done = NULL;
  pthread_mutex_lock(&orphans_mu);
  for (struct gpu_comm** pp = &orphans; *pp;) {
    struct gpu_comm* o = *pp;
    if (!all_done(o)) {
      gpu_unblock(o);
      pp = &o->next_orphan;
      continue;
    }
    *pp = o->next_orphan;
    o->next_orphan = done, done = o;
  }
  pthread_mutex_unlock(&orphans_mu);
  /* Off the lock: a free may wait for the device, and the watcher takes the lock ten times a second. */
  while (done) {
    struct gpu_comm* o = done;
    done = o->next_orphan;
    release_on(o, here);
  }
}

void gpu_free(struct ncclComm* comm) {
  gpu_orphans_tick(!__atomic_load_n(&comm->abort_flag, __ATOMIC_ACQUIRE));
  struct gpu_comm* g = comm->gpu;
  if (!g) return;
  stream_destroy(g->bridge); /* idle: every ticket of the comm is done */
  int aborted = __atomic_load_n(&comm->abort_flag, __ATOMIC_ACQUIRE);
  /* Destroy waits (a while) for the streams, as NCCL's does; an abort never waits for a stream. */
  uint64_t t0 = ut_now_ns();
  for (uint64_t i = 0; !aborted && !all_done(g) && ut_now_ns() - t0 < 10 * UT_NS_PER_S; i++) ut_backoff(i);
  if (g->seg) atomic_store_explicit(&g->seg->w[g->rank].left, 1, memory_order_release);
  gpu_copier_stop(g); /* rank 0: the copies between other ranks (their calls are done, or they fail) */
  gpu_watch_remove(g); /* it may have let the streams through meanwhile; now before anything goes */
  comm->gpu = NULL;    /* only the watcher (gone now) and the comm's own threads (done) read it */
  if (!all_done(g)) { /* an abort, or streams stuck past the wait */
    gpu_unblock(g);
    INFO(LOG_INIT, "rank %d: CUDA streams may still run calls of this communicator: its GPU barrier page and "
         "pointer tables are freed later, once they are done", comm->rank);
    g->comm = NULL;
    pthread_mutex_lock(&orphans_mu);
    g->next_orphan = orphans;
    orphans = g;
    pthread_mutex_unlock(&orphans_mu);
    return;
  }
  release_on(g, !aborted); /* an abort never waits for a stream, not even another comm's */
}
