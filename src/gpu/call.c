/* Ranks on one GPU (gpu.h): one call, from its description at enqueue to its pointer table. */
#include <stdlib.h>
#include <string.h>
#include <stddef.h>

#include "../misc/log.h"
#include "../misc/utils.h"
#include "../core/host_stream.h"
#include "../core/init.h"
#include "../core/plan.h"
#include "../tune/tune.h"
#include "gpu.h"

/* The calls that run on the GPU: every collective, and Send/Recv. */
static int on_gpu(int f) { return f >= 0 && f <= FUNC_GATHER && f != FUNC_SENDRECV; }
int gpu_is_p2p(int f) { return f == FUNC_SEND || f == FUNC_RECV; }

/* Decided from what every rank knows alike (the comm and the call), never from one rank's buffers:
 * a buffer that cannot take part (another device's) fails the call on every rank instead. */
/* Reproducible reductions run on host copies (staging/staging.c): the host's combination (reduce/repro.c)
 * is the one definition of their bits, so device buffers give what host buffers give. */
int gpu_takes(const struct ch_task* t) {
  const struct gpu_comm* g = t->comm->gpu;
  return g && t->count > 0 && on_gpu(t->func) && !tune_repro_level(t->comm, t->func, t->type) &&
         !(g->relay && gpu_is_p2p(t->func)); /* the relay: collectives only (sends and receives are staged) */
}

int gpu_runs_p2p(const struct ncclComm* comm) { return comm->gpu && !comm->gpu->relay; }

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
  /* Captured: the buffers are exchanged once, at capture, and every replay reuses the table (gpu.h:
   * graph words). Only where one kernel (rank 0's) does the call; sends and receives not yet. */
  const char* no = !capturing || g->relay ? NULL /* the relay: collectives only (gpu_takes) */
                   : gpu_is_p2p(t->func)   ? "sends and receives on device buffers of ranks sharing one GPU"
                   : g->n > 1 && !gpu_one_kernel(g, t->func)
                       ? "this call with CHORUS_CUDA_ONE_KERNEL=0 (or AlltoAll on more than 7 ranks)"
                       : NULL;
  if (no) {
    WARN("%s: stream %p is being captured into a CUDA graph, and Chorus cannot capture %s yet; make this call "
         "outside the capture (rank %d)", fn, (void*)t->stream, no, g->rank);
    return CH_INVALID_USAGE;
  }
  struct gpu_call* c = calloc(1, sizeof(*c) + (size_t)g->n * sizeof(c->all[0]));
  if (!c) return CH_SYSTEM;
  c->g = g, c->func = t->func, c->type = t->type, c->root = t->root, c->count = t->count, c->stream = t->stream;
  c->captured = capturing;
  c->peer = gpu_is_p2p(t->func) ? t->root : -1;
  if (t->func == FUNC_ALLREDUCE || t->func == FUNC_REDUCE || t->func == FUNC_REDUCESCATTER) c->red = t->red;
  else c->red.kind = RED_SUM;
  c->ptr[DEV_SEND] = needs_send ? t->sendbuff : NULL;
  c->ptr[DEV_RECV] = needs_recv ? t->recvbuff : NULL;
  struct gpu_desc* m = &c->mine;
  m->func = (uint32_t)c->func, m->type = (uint32_t)c->type, m->op_kind = (uint32_t)c->red.kind, m->count = c->count;
  m->root = c->func == FUNC_BROADCAST || c->func == FUNC_REDUCE || c->func == FUNC_GATHER || c->func == FUNC_SCATTER ||
                    gpu_is_p2p(c->func)
                ? c->root /* the peer, for Send/Recv */
                : -1;
  m->stream = (uint64_t)(uintptr_t)c->stream;
  if (red_type_is_float(c->type)) memcpy(&m->scalar, &c->red.scalar_f, sizeof(m->scalar));
  else memcpy(&m->scalar, &c->red.scalar_i, sizeof(m->scalar));
  for (int b = 0; b < 2 && g->relay; b++) /* shared with no one: only whether the kernels may touch it */
    if (c->ptr[b]) gpu_relay_describe(g, c->ptr[b], red_type_size(c->type), &m->buf[b]);
  for (int b = 0; b < 2 && !g->relay; b++) {
    if (!c->ptr[b]) continue;
    if (b == DEV_RECV && c->ptr[DEV_RECV] == c->ptr[DEV_SEND]) { /* in place: the same description */
      m->buf[DEV_RECV] = m->buf[DEV_SEND];
      continue;
    }
    int mode = capturing ? cudrv_capture_relaxed() : -1; /* cuIpcGetMemHandle inside a capture */
    ch_status s = describe(g, c->ptr[b], &m->buf[b]);
    cudrv_capture_restore(mode);
    if (s != CH_OK) {
      free(c);
      return s;
    }
  }
  /* One rank, out of place: the result is the input (a reduction of one, divided by one), a copy the
   * copy engine makes without a kernel or a table (NCCL's one-rank calls are a copy too). */
  c->copy_only = g->n == 1 && !g->relay && !gpu_is_p2p(c->func) && c->ptr[DEV_SEND] && c->ptr[DEV_RECV] &&
                 c->ptr[DEV_SEND] != c->ptr[DEV_RECV] && red_keeps_one(&c->red) && m->buf[DEV_SEND].present &&
                 m->buf[DEV_RECV].present && cudrv_has_dtod();
  /* The call becomes the allgather of the descriptions (a send's goes to its peer; a receive gets
   * its peer's): it runs on the bridge, in this communicator's order of calls, and the stream's part is
   * queued at launch (gpu_launch). */
  t->gpu = c;
  /* A send whose sender copies needs no host exchange: the receiver leaves its description in the
   * pair's mailbox (gpu.h), where the sender's bridge takes it. */
  t->hostless = gpu_p2p_mails(g, c) ||
                (c->func == FUNC_SEND && c->peer != g->rank && gpu_p2p_active(g, FUNC_SEND, c->peer));
  t->hostless |= g->n == 1 && !gpu_is_p2p(c->func); /* one rank's "allgather": at launch (gpu_launch) */
  /* One kernel (rank 0's) for a collective: only rank 0 needs the descriptions (the board, gpu.h). */
  c->boarded = g->seg && !capturing && !gpu_is_p2p(c->func) && gpu_one_kernel(g, c->func); /* never relayed */
  t->hostless |= c->boarded;
  t->type = ncclUint8, t->count = sizeof(struct gpu_desc), t->op = ncclSum;
  t->sendbuff = &c->mine, t->recvbuff = c->all;
  if (!gpu_is_p2p(t->func)) t->func = FUNC_ALLGATHER, t->root = 0;
  if (g->relay)
    INFO(LOG_COLL, "%s: device buffers of %d ranks of this host: relayed through pinned host memory", fn, g->n);
  else
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

ch_status gpu_flush(struct gpu_memops* o) {
  if (o->st == CH_OK && o->k) o->st = cudev_memops(o->s, o->op, o->k, o->g->ctx);
  o->k = 0;
  return o->st;
}

void gpu_memop(struct gpu_memops* o, void* dev, uint32_t value, int wait) {
  if (o->k == CUDEV_MAX_MEMOPS) gpu_flush(o);
  o->op[o->k++] = (struct cudev_memop){.dev = dev, .value = value, .wait = wait};
}

/* Every rank's stream has written `seq` into its word `field`: my write, then a wait per peer. */
static void barrier(struct gpu_memops* o, uint32_t seq, size_t field) {
  struct gpu_comm* g = o->g;
  gpu_memop(o, word_dev(g, g->rank, field), seq, 0);
  for (int r = 0; r < g->n; r++)
    if (r != g->rank) gpu_memop(o, word_dev(g, r, field), seq, 1);
}

/* A word of the ordered pair src -> dst (gpu_pair): `posted` (the rank that does not copy has its
 * buffer ready; a relayed pair's sender: `posted_send`) or `copied` (the copy is done). */
enum { P_POSTED = 0, P_COPIED = 1, P_POSTED_SEND = 2 };
static void* pair_dev(struct gpu_comm* g, int src, int dst, int word) {
  size_t off = word == P_COPIED ? offsetof(struct gpu_pair, copied)
               : word == P_POSTED_SEND ? offsetof(struct gpu_pair, posted_send)
                                        : offsetof(struct gpu_pair, posted);
  return (char*)g->seg_dev + gpu_pair_off(g->n, src, dst) + off;
}
void* gpu_slot_done_dev(struct gpu_comm* g, uint32_t seq) {
  return priv_dev(g, offsetof(struct gpu_priv, slot_done) + (seq % GPU_SLOTS) * sizeof(uint32_t));
}

/* AlltoAll: rank me exchanges the blocks of the pairs {me, me + k mod n}, k = 1..(n-1)/2, and for an
 * even n the pair at distance n/2 falls to its lower rank: every pair once, each rank n/2 pairs at most. */
int gpu_a2a_pair(int n, int me, int r) {
  int d = (r - me + n) % n;
  return d > 0 && (d <= (n - 1) / 2 || (n % 2 == 0 && d == n / 2 && me < n / 2));
}

/* One kernel does every rank's part, on rank 0's stream (the others only pass the barriers): kernels
 * of different processes never run at once without MPS, their contexts take turns on the GPU, and on
 * the H200 each process's kernel added ~0.3 ms to a call whose waits alone took ~25 us; thread ranks
 * ran as fast or faster with one kernel too. So by default (CHORUS_CUDA_ONE_KERNEL), for every call
 * whose jobs fit one launch (AlltoAll's pairs: up to 7 ranks). */
int gpu_one_kernel(const struct gpu_comm* g, int func) {
  int n = g->n;
  return g->one_kernel && !gpu_is_p2p(func) && (func != FUNC_ALLTOALL || n + n * (n - 1) / 2 <= DEV_MAX_JOBS);
}

/* Send/Recv run on the kernel of one rank of the pair: the lower one, so that two processes that
 * exchange (sendrecv_perf, a pipeline's neighbours) run one process's kernel, not two. */
int gpu_p2p_active(const struct gpu_comm* g, int func, int peer) {
  if (!g->one_kernel || peer == g->rank) return func == FUNC_RECV;
  int src = func == FUNC_SEND ? g->rank : peer, dst = func == FUNC_SEND ? peer : g->rank;
  return !gpu_p2p_relayed(g, src, dst) && g->rank < peer;
}

int gpu_p2p_mails(const struct gpu_comm* g, const struct gpu_call* c) {
  return gpu_is_p2p(c->func) && c->peer != g->rank && !gpu_p2p_active(g, c->func, c->peer) &&
         (c->func == FUNC_RECV || gpu_p2p_relayed(g, g->rank, c->peer));
}

/* Rank me's part of a call (devjob.h). Reductions: each rank reduces its share of the elements from
 * every rank's input and writes the result wherever it is wanted, so every byte is read and written
 * once in all; copies go from where the data is to where rank me's part writes. A part that would
 * copy a buffer onto itself (in place) is left out where this rank can tell: its own. */
static void rank_jobs(struct gpu_comm* g, const struct gpu_call* c, struct dev_args* a, int me) {
  int n = g->n, own = me == g->rank;
  uint32_t all = n == 32 ? 0xffffffffu : (1u << n) - 1, self = 1u << me;
  size_t E = red_type_size(c->type), C = c->count, B = C * E;
  const char *send = c->ptr[DEV_SEND], *recv = c->ptr[DEV_RECV];
  switch (c->func) {
    case FUNC_ALLREDUCE: { /* shares aligned to 16 bytes */
      size_t align = E >= 16 ? 1 : 16 / E, share = UT_ALIGN_UP(UT_DIV_UP(C, (size_t)n), align);
      size_t off = UT_MIN(C, share * (size_t)me), len = UT_MIN(share, C - off);
      if (len) dev_job_add(a, DEV_REDUCE, all, DEV_SEND, off * E, all, DEV_RECV, off * E, len);
      break;
    }
    case FUNC_ALLGATHER: dev_job_add(a, DEV_COPY, self, DEV_SEND, 0, all, DEV_RECV, (uint64_t)me * B, C); break;
    case FUNC_REDUCESCATTER: dev_job_add(a, DEV_REDUCE, all, DEV_SEND, (uint64_t)me * B, self, DEV_RECV, 0, C); break;
    case FUNC_BROADCAST: /* a root in place has nothing to do */
      if (me != c->root || !own || send != recv) dev_job_add(a, DEV_COPY, 1u << c->root, DEV_SEND, 0, self, DEV_RECV, 0, C);
      break;
    case FUNC_REDUCE:
      if (me == c->root) dev_job_add(a, DEV_REDUCE, all, DEV_SEND, 0, self, DEV_RECV, 0, C);
      break;
    case FUNC_ALLTOALL: /* its own block (unless in place), then its pairs */
      if (!own || send != recv) dev_job_add(a, DEV_COPY, self, DEV_SEND, me * B, self, DEV_RECV, me * B, C);
      for (int r = 0; r < n; r++)
        if (gpu_a2a_pair(n, me, r)) dev_job_add(a, DEV_PAIR, self | 1u << r, DEV_SEND, B, self | 1u << r, DEV_RECV, 0, C);
      break;
    case FUNC_GATHER: /* the root pulls every block; its own is already in place when sendbuff is there */
      for (int r = 0; me == c->root && r < n; r++)
        if (r != me || !own || send != recv + (size_t)me * B)
          dev_job_add(a, DEV_COPY, 1u << r, DEV_SEND, 0, self, DEV_RECV, (uint64_t)r * B, C);
      break;
    case FUNC_RECV: dev_job_add(a, DEV_COPY, 1u << c->peer, DEV_SEND, 0, self, DEV_RECV, 0, C); break;
    case FUNC_SEND: dev_job_add(a, DEV_COPY, self, DEV_SEND, 0, 1u << c->peer, DEV_RECV, 0, C); break;
    case FUNC_SCATTER: /* every rank pulls its block from the root (nothing to do for a root in place) */
      if (me != c->root || !own || recv != send + (size_t)me * B)
        dev_job_add(a, DEV_COPY, 1u << c->root, DEV_SEND, (uint64_t)me * B, self, DEV_RECV, 0, C);
      break;
  }
}

/* What this rank's kernel does: its own part, every rank's (gpu_one_kernel, rank 0), or nothing. */
void* gpu_table_dev(struct gpu_comm* g, uint32_t seq) {
  return priv_dev(g, offsetof(struct gpu_priv, slot) + (seq % GPU_SLOTS) * sizeof(struct dev_table));
}

void gpu_args_init(struct gpu_comm* g, const struct gpu_call* c, struct dev_args* a) {
  memset(a, 0, sizeof(*a));
  a->table = (uint64_t)(uintptr_t)gpu_table_dev(g, c->seq);
  a->seq = c->seq, a->type = c->type, a->op_kind = c->red.kind, a->divisor = c->red.divisor, a->unroll = g->unroll;
  a->fail[0] = (uint64_t)(uintptr_t)priv_dev(g, offsetof(struct gpu_priv, failed));
  a->fail[1] = g->seg ? (uint64_t)(uintptr_t)((char*)g->seg_dev + offsetof(struct gpu_seg, failed_by)) : 0;
}

void gpu_fill_args(struct gpu_comm* g, const struct gpu_call* c, struct dev_args* a) {
  gpu_args_init(g, c, a);
  if (gpu_is_p2p(c->func)) {
    if (gpu_p2p_active(g, c->func, c->peer)) rank_jobs(g, c, a, g->rank);
  } else if (!gpu_one_kernel(g, c->func)) rank_jobs(g, c, a, g->rank);
  else
    for (int r = 0; g->rank == 0 && r < g->n; r++) rank_jobs(g, c, a, r);
}

/* A kernel for the jobs in a (its table and failure words filled in), on stream s: enough blocks to
 * cover the largest job at 4 elements a thread, at most 4 per SM in all; a kernel of many blocks
 * reads a copy of the table that the stage kernel makes in stage_dev's entry `slot` first. */
ch_status gpu_launch_jobs(struct gpu_comm* g, struct dev_args* a, void* stage_dev, uint32_t slot, cudaStream_t s) {
  uint64_t most = 0;
  for (int j = 0; j < a->njobs; j++) most = UT_MAX(most, a->job[j].count);
  uint64_t gx = UT_MIN(UT_DIV_UP(most, (uint64_t)512 * 4), (uint64_t)UT_MAX(g->sms * 4 / a->njobs, 1));
  gx = UT_MAX(gx, 1);
  if (gx * (uint64_t)a->njobs >= (uint64_t)g->stage_blocks) { /* the table read once, into device memory */
    struct dev_staged* d = (struct dev_staged*)((char*)stage_dev + (slot % GPU_SLOTS) * sizeof(*d));
    struct dev_stage_args sa = {.table = a->table, .fail = {a->fail[0], a->fail[1]}, .dst = (uintptr_t)d};
    CHECK(cudev_launch(g->fn[DEV_STAGE], 1, 1, s, g->ctx, &sa));
    a->table = (uintptr_t)&d->table, a->fail[0] = (uintptr_t)&d->failed[0], a->fail[1] = (uintptr_t)&d->failed[1];
  }
  return cudev_launch(g->fn[a->type], (unsigned)gx, (unsigned)a->njobs, s, g->ctx, a);
}

/* This call's kernel, if its rank has anything to do (gpu_fill_args). */
static ch_status run_kernel(struct gpu_comm* g, const struct gpu_call* c, cudaStream_t s) {
  struct dev_args a;
  gpu_fill_args(g, c, &a);
  if (!a.njobs) return CH_OK;
  return gpu_launch_jobs(g, &a, g->stage_dev, c->seq, s);
}

/* A rank's calls on one communicator run in call order whatever streams they name (as NCCL orders
 * them on its own stream): each rank's barrier words then only move forward, and a peer can never
 * pass call k against this rank's word for a later call on another stream. Through an event the
 * communicator owns, recorded after each call (done), not one recorded on the previous call's
 * stream at the next call: the application may have destroyed that stream meanwhile (allowed once
 * its work is queued), which would fail the call or, with the handle reused, order it after
 * another stream's work. */
ch_status gpu_follow(struct gpu_comm* g, cudaStream_t s) {
  if (g->any_launched && g->last_stream != s) CHECK(cudrv_event_wait(s, g->done_ev, g->ctx));
  g->last_stream = s, g->any_launched = 1;
  return CH_OK;
}

ch_status gpu_done(struct gpu_comm* g, cudaStream_t s) {
  if (!g->done_ev) CHECK(cudrv_event_new(&g->done_ev, g->ctx));
  return cudrv_event_record(g->done_ev, s, g->ctx);
}

/* A collective: its table, a barrier (every input ready), the kernel, a barrier (nobody still reads),
 * its slot freed. The operations before and after the kernel go to the driver as one batch each. With
 * one kernel for all (rank 0's), the barriers are a star: only rank 0 waits for the others' inputs,
 * and the others only for rank 0's kernel (one cross-process round trip a call, not two each way). */
static ch_status queue_call(struct gpu_comm* g, const struct gpu_call* c) {
  if (g->relay) return gpu_relay_queue(g, c);
  struct gpu_memops o = {.g = g, .s = c->stream};
  CHECK(gpu_follow(g, c->stream));
  if (c->copy_only) {
    CHECK(cudrv_copy_dtod((void*)c->ptr[DEV_RECV], c->ptr[DEV_SEND], c->count * red_type_size(c->type), c->stream,
                          g->ctx));
    return gpu_done(g, c->stream); /* no table, so no slot to free: one driver call fewer */
  }
  if (g->seg && gpu_one_kernel(g, c->func)) { /* a star around rank 0, whose kernel alone touches buffers */
    size_t arrive = offsetof(struct gpu_words, arrive), dn = offsetof(struct gpu_words, done);
    if (g->rank == 0) { /* its table, every rank's inputs ready, the kernel, then the others may go on */
      gpu_memop(&o, priv_dev(g, offsetof(struct gpu_priv, ready)), c->seq, 1);
      for (int r = 1; r < g->n; r++) gpu_memop(&o, word_dev(g, r, arrive), c->cseq, 1);
      CHECK(gpu_flush(&o));
      CHECK(run_kernel(g, c, c->stream));
      gpu_memop(&o, word_dev(g, 0, dn), c->cseq, 0);
    } else { /* no kernel, no table: my inputs are ready, then wait until rank 0's kernel is done */
      gpu_memop(&o, word_dev(g, g->rank, arrive), c->cseq, 0);
      gpu_memop(&o, word_dev(g, 0, dn), c->cseq, 1);
    }
    gpu_memop(&o, gpu_slot_done_dev(g, c->seq), c->seq, 0);
    CHECK(gpu_flush(&o));
    return gpu_done(g, c->stream);
  }
  gpu_memop(&o, priv_dev(g, offsetof(struct gpu_priv, ready)), c->seq, 1);
  if (g->seg) barrier(&o, c->cseq, offsetof(struct gpu_words, arrive));
  CHECK(gpu_flush(&o));
  CHECK(run_kernel(g, c, c->stream));
  if (g->seg) barrier(&o, c->cseq, offsetof(struct gpu_words, done));
  gpu_memop(&o, gpu_slot_done_dev(g, c->seq), c->seq, 0);
  CHECK(gpu_flush(&o));
  return gpu_done(g, c->stream);
}

/* The ordered pair of a send or receive: its words and their number are the pair's (src -> dst). */
static void p2p_pair(const struct gpu_comm* g, const struct gpu_call* c, int* src, int* dst) {
  *src = c->func == FUNC_SEND ? g->rank : c->peer;
  *dst = c->func == FUNC_SEND ? c->peer : g->rank;
}

/* A group's sends and receives, on the first one's stream (which first waits for the others' work,
 * and which they wait for after), in three phases so that two ranks that send to each other never
 * wait for each other: every call this rank does not copy says its buffer is ready; each call it
 * copies in turn waits for its table and the peer's buffer, copies, and says it is done (so a peer's
 * later call, in a group of its own, can wait for an earlier copy here); every call it does not copy
 * waits for that. A pair's words carry the number of sends on that ordered pair (c->cseq), alike on
 * both sides. Copies run one after the other on one stream: copies whose peers post in another order
 * than this group's can wait for each other until CHORUS_TIMEOUT. */
static ch_status queue_p2p(struct gpu_comm* g, struct gpu_call** cs, int k) {
  cudaStream_t s = cs[0]->stream;
  struct gpu_memops o = {.g = g, .s = s};
  int src, dst;
  CHECK(gpu_follow(g, s));
  for (int i = 1; i < k; i++)
    if (cs[i]->stream != s) CHECK(cudrv_join(cs[i]->stream, g->ctx, s, g->ctx)); /* twice is harmless */
  for (int i = 0; i < k; i++)
    if (!gpu_p2p_active(g, cs[i]->func, cs[i]->peer) && g->seg) {
      p2p_pair(g, cs[i], &src, &dst);
      int word = cs[i]->func == FUNC_SEND && gpu_p2p_relayed(g, src, dst) ? P_POSTED_SEND : P_POSTED;
      gpu_memop(&o, pair_dev(g, src, dst, word), cs[i]->cseq, 0);
    }
  for (int i = 0; i < k; i++) {
    if (!gpu_p2p_active(g, cs[i]->func, cs[i]->peer)) continue;
    p2p_pair(g, cs[i], &src, &dst);
    gpu_memop(&o, priv_dev(g, offsetof(struct gpu_priv, ready)), cs[i]->seq, 1);
    if (g->seg) gpu_memop(&o, pair_dev(g, src, dst, 0), cs[i]->cseq, 1);
    CHECK(gpu_flush(&o));
    CHECK(run_kernel(g, cs[i], s));
    if (g->seg) gpu_memop(&o, pair_dev(g, src, dst, 1), cs[i]->cseq, 0); /* sent with what follows */
  }
  for (int i = 0; i < k; i++)
    if (!gpu_p2p_active(g, cs[i]->func, cs[i]->peer) && g->seg) {
      p2p_pair(g, cs[i], &src, &dst);
      gpu_memop(&o, pair_dev(g, src, dst, 1), cs[i]->cseq, 1);
    }
  for (int i = 0; i < k; i++) gpu_memop(&o, gpu_slot_done_dev(g, cs[i]->seq), cs[i]->seq, 0);
  CHECK(gpu_flush(&o));
  CHECK(gpu_done(g, s));
  for (int i = 1; i < k; i++)
    if (cs[i]->stream != s) CHECK(cudrv_event_wait(cs[i]->stream, g->done_ev, g->ctx));
  return CH_OK;
}

/* ---- calls captured into CUDA graphs (gpu.h: graph words) ---- */

static void* graph_word(struct gpu_comm* g, uint32_t index, int r, int done_word) {
  return (char*)g->seg_dev + gpu_graph_off(g->n, index, r) +
         (done_word ? offsetof(struct gpu_graph_words, done) : offsetof(struct gpu_graph_words, arrive));
}

static ch_status graph_new(struct gpu_comm* g, struct gpu_graph_call** out) {
  /* A relayed call takes two flag pairs: one per barrier (gpu/relay.c), so that gpu_unblock's one
   * setting lets a replay through both. */
  uint32_t pairs = g->relay ? 2 : 1;
  if (g->next_graph + pairs > GPU_GRAPH_CALLS) {
    WARN("rank %d: more than %u calls on device buffers captured into CUDA graphs on this communicator", g->rank,
         GPU_GRAPH_CALLS / pairs);
    return CH_INVALID_USAGE;
  }
  struct gpu_graph_call* gc = calloc(1, sizeof(*gc));
  if (!gc) return CH_SYSTEM;
  gc->index = g->next_graph, gc->id = 0x80000000u | gc->index;
  g->next_graph += pairs;
  if (g->rank == 0 || g->relay) { /* only rank 0's kernel reads a table (one kernel for all), or each rank's (relay) */
    int mode = cudrv_capture_relaxed(); /* allocations inside a capture in global mode */
    gc->tab = cudrv_host_alloc(sizeof(struct dev_table), g->ctx, 1, &gc->tab_dev);
    ch_status s = gc->tab ? cudev_dev_alloc(g->ctx, sizeof(struct dev_staged), &gc->staged_dev) : CH_SYSTEM;
    cudrv_capture_restore(mode);
    if (s != CH_OK) {
      if (gc->tab) cudrv_host_free(gc->tab, g->ctx);
      free(gc);
      return CH_SYSTEM;
    }
    memset(gc->tab, 0, sizeof(*gc->tab));
  }
  gc->next = g->graphs, g->graphs = gc;
  *out = gc;
  return CH_OK;
}

void gpu_graphs_free(struct gpu_comm* g) {
  while (g->graphs) {
    struct gpu_graph_call* gc = g->graphs;
    g->graphs = gc->next;
    if (gc->tab) cudrv_host_free(gc->tab, g->ctx);
    if (gc->staged_dev) cudev_dev_free(g->ctx, gc->staged_dev);
    free(gc);
  }
}

/* The star of captured call k's flags (gpu.h), in two halves around what rank 0 does for all: the
 * gather (a rank other than 0 arrives and waits for its release, clearing it; rank 0 waits for every
 * arrival and clears them), then the release (rank 0 sets every other rank's `done`). Queued on o. */
void gpu_graph_gather(struct gpu_comm* g, uint32_t k, struct gpu_memops* o) {
  if (!g->seg) return;
  if (g->rank != 0) {
    gpu_memop(o, graph_word(g, k, g->rank, 0), 1, 0);
    gpu_memop(o, graph_word(g, k, g->rank, 1), 1, 1);
    gpu_memop(o, graph_word(g, k, g->rank, 1), 0, 0);
    return;
  }
  for (int r = 1; r < g->n; r++) gpu_memop(o, graph_word(g, k, r, 0), 1, 1);
  for (int r = 1; r < g->n; r++) gpu_memop(o, graph_word(g, k, r, 0), 0, 0);
}

void gpu_graph_release(struct gpu_comm* g, uint32_t k, struct gpu_memops* o) {
  for (int r = 1; g->seg && g->rank == 0 && r < g->n; r++) gpu_memop(o, graph_word(g, k, r, 1), 1, 0);
}

/* A captured call's stream part, once its table is filled: the star of flags around rank 0's kernel
 * (gpu.h), which every replay repeats as it is. Not ordered after the comm's eager calls on other
 * streams (an event recorded outside a capture cannot be waited for inside it). A relayed call has
 * its own (gpu/relay.c). */
static ch_status queue_graph(struct gpu_comm* g, const struct gpu_call* c) {
  if (c->copy_only)
    return cudrv_copy_dtod((void*)c->ptr[DEV_RECV], c->ptr[DEV_SEND], c->count * red_type_size(c->type), c->stream,
                           g->ctx);
  if (g->relay) return gpu_relay_queue_graph(g, c);
  struct gpu_memops o = {.g = g, .s = c->stream};
  gpu_graph_gather(g, c->gc->index, &o);
  CHECK(gpu_flush(&o));
  if (g->seg && g->rank != 0) return CH_OK; /* rank 0's kernel does the call */
  struct dev_args a;
  gpu_fill_args(g, c, &a);
  if (a.njobs) {
    a.table = (uint64_t)(uintptr_t)c->gc->tab_dev, a.seq = c->gc->id;
    CHECK(gpu_launch_jobs(g, &a, c->gc->staged_dev, 0, c->stream));
  }
  gpu_graph_release(g, c->gc->index, &o);
  return gpu_flush(&o);
}

/* Why a group with ngpu calls on the GPU cannot run as it is (NULL: it can). */
static const char* refusal(struct ch_task** lists, int n, int ngpu) {
  int nall = 0;
  for (int i = 0; i < n; i++) {
    int np2p = 0, k = 0, ncaptured = 0;
    for (struct ch_task* t = lists[i]; t; t = t->next, k++) {
      np2p += t->gpu && gpu_is_p2p(t->gpu->func);
      ncaptured += t->gpu && t->gpu->captured;
    }
    if (ncaptured && ncaptured < k)
      return "mixes calls on streams being captured into a CUDA graph with calls on other streams: issue them in "
             "separate groups";
    nall += k;
    if (np2p && np2p < k)
      return "mixes collectives and sends or receives on device buffers of ranks sharing one GPU: issue them in "
             "separate groups";
    if (np2p > GPU_SLOTS) /* each needs a table slot of its own until the group's end */
      return "has more than " UT_STR(GPU_SLOTS) " sends and receives on device buffers of ranks sharing one GPU for one "
             "communicator: split it";
  }
  if (ngpu < nall)
    return "mixes calls that run on the GPU (device buffers of ranks sharing one GPU, or collectives relayed "
           "between GPUs of one host) with calls through host memory (sends and receives between GPUs, host "
           "buffers...): issue them in separate groups, or set CHORUS_CUDA_DIRECT=0 (one GPU) or "
           "CHORUS_CUDA_RELAY=0 (several)";
  return NULL;
}

int gpu_launch(struct ch_plan** plans, struct ch_task** lists, int n, ch_status* res) {
  int ngpu = 0;
  for (int i = 0; i < n; i++)
    for (struct ch_task* t = lists[i]; t; t = t->next) ngpu += t->gpu != NULL;
  if (!ngpu) return 0;
  const char* why = refusal(lists, n, ngpu);
  if (why) {
    WARN("a group %s", why);
    for (int i = 0; i < n; i++) plans[i]->status = CH_INVALID_USAGE; /* failed in ticket order */
    plan_exec(plans, n);
    *res = CH_INVALID_USAGE;
    return 1;
  }
  ch_status e = CH_OK;
  struct gpu_call** cap = calloc((size_t)n, sizeof(*cap)); /* per comm: copies of its captured calls */
  int* ncap = calloc((size_t)n, sizeof(int));
  if (!cap || !ncap) {
    free(cap), free(ncap);
    for (int i = 0; i < n; i++) plans[i]->status = CH_SYSTEM;
    plan_exec(plans, n);
    *res = CH_SYSTEM;
    return 1;
  }
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
    /* Numbers (all wrap: every comparison is cyclic): seq is this rank's, for its tables; cseq is
     * alike on the ranks that take part: the collective's number, or the send's on its pair. */
    for (struct ch_task* t = lists[i]; t; t = t->next) {
      struct gpu_call* c = b->call[b->n++] = t->gpu;
      t->gpu = NULL;
      c->seq = gpu_has_slot(c) ? ++g->next_seq : 0;
      if (c->func == FUNC_SEND) c->cseq = atomic_fetch_add(&g->p2p_sent[c->peer], 1) + 1;
      else if (c->func == FUNC_RECV) c->cseq = atomic_fetch_add(&g->p2p_recvd[c->peer], 1) + 1;
      else c->cseq = ++g->next_cseq;
      if (c->boarded) c->bseq = ++g->next_bseq;
      c->mine.seq = c->cseq;
      if (g->n == 1 && !gpu_is_p2p(c->func)) c->all[0] = c->mine; /* no host exchange (hostless) */
      if (gpu_p2p_mails(g, c) || (c->boarded && g->rank != 0))
        (void)gpu_post(c, 0, &c->mailed); /* now if the entry is free: else the bridge waits */
    }
    if (b->call[0]->captured) { /* then all are (refusal): exchanged first, queued below */
      ch_status q = (cap[i] = malloc((size_t)b->n * sizeof(struct gpu_call))) ? CH_OK : CH_SYSTEM;
      ncap[i] = b->n;
      for (int j = 0; j < b->n && q == CH_OK; j++) {
        if (!b->call[j]->copy_only) q = graph_new(g, &b->call[j]->gc);
        memcpy(&cap[i][j], b->call[j], sizeof(struct gpu_call)); /* without its descriptions */
      }
      if (q != CH_OK) {
        for (int j = 0; j < b->n; j++) free(b->call[j]);
        free(b), free(cap[i]), cap[i] = NULL;
        plans[i]->status = q;
        plan_exec(&plans[i], 1);
        plans[i] = NULL;
        e = e == CH_OK ? q : e;
        continue;
      }
    }
    /* Queued as one (sends and receives: then all are, by refusal) or call by call. */
    int p2p = gpu_is_p2p(b->call[0]->func);
    for (int j = 0; !cap[i] && j < b->n; j += p2p ? b->n : 1) {
      struct gpu_call* c = b->call[p2p ? b->n - 1 : j];
      ch_status q = p2p ? queue_p2p(g, b->call, b->n) : queue_call(g, c);
      if (!p2p) atomic_store_explicit(&g->launched_c, c->cseq, memory_order_release);
      if (gpu_has_slot(c)) atomic_store_explicit(&g->launched, c->seq, memory_order_release);
      if (q != CH_OK) { /* the stream may hold part of it: let it and the peers' streams through */
        comm_set_async_error(comm, q);
        if (e == CH_OK) e = q;
        /* Its slot-done write may never have been queued: mark it here, or the comm would look busy
         * for ever (destroy waits, then orphans it). The comm has failed: no later call reuses the
         * slot, and a write the stream still makes carries the same number. */
        for (int k = p2p ? 0 : j; k < (p2p ? b->n : j + 1); k++)
          if (gpu_has_slot(b->call[k]))
            atomic_store_explicit(&g->priv->slot_done[b->call[k]->seq % GPU_SLOTS], b->call[k]->seq,
                                  memory_order_release);
      }
    }
    /* One rank: the exchange is a copy, done here. Otherwise the bridge runs it with the peers, in
     * order: where it cannot take it (out of memory), it runs here once the bridge has run the earlier
     * ones (gpu_after's state is the bridge's, and tables must be filled in call order). */
    int here = g->n == 1;
    if (!here && stream_enqueue_hook(g->bridge, &plans[i], 1, NULL, gpu_after, b) != CH_OK) {
      stream_wait_idle(g->bridge);
      here = 1;
    }
    if (here) {
      ch_status s = plan_exec(&plans[i], 1);
      gpu_after(b, s);
    }
    plans[i] = NULL;
  }
  /* Captured calls: every comm's exchange is queued (thread ranks of one group need each other's),
   * then waited for, since the stream part needs the filled table (every rank captures the same
   * calls in the same order, as NCCL requires); a call whose table is not filled fails the capture. */
  for (int i = 0; i < n; i++) {
    if (!cap[i]) continue;
    struct gpu_comm* g = cap[i][0].g;
    if (g->n > 1) stream_wait_idle(g->bridge);
    ch_status q = CH_OK;
    for (int j = 0; j < ncap[i] && q == CH_OK; j++)
      if (!cap[i][j].copy_only && !cap[i][j].gc->resolved) {
        int as = atomic_load(&g->comm->async_result);
        q = as != ncclSuccess && as != ncclInProgress ? (ch_status)as : CH_INVALID_USAGE;
      }
    for (int j = 0; j < ncap[i] && q == CH_OK; j++) q = queue_graph(g, &cap[i][j]);
    if (q != CH_OK) comm_set_async_error(g->comm, q); /* the peers' captures wait for this rank's flags */
    if (q != CH_OK && e == CH_OK) e = q;
    free(cap[i]);
  }
  free(cap), free(ncap);
  *res = e;
  return 1;
}

