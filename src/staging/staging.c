/* CUDA device buffers through host memory: the host path cannot read device memory, so a call whose
 * buffers are device memory runs on host copies. Two ways, chosen per call (stage_in):
 *  - asynchronous (the default where the driver has stream memory operations, CUDA 11.7+): the call
 *    returns at once, as NCCL's does. At launch (stage_launch) each CUDA stream of the group gets
 *    copies of its inputs to pinned host memory and a host function that tells Chorus they are there;
 *    then a wait for this communicator's flag word; then copies of the results back and a host
 *    function that hands the host memory back. A Chorus host stream per communicator (the bridge)
 *    runs the group's plans once every stream's inputs are in, then writes the flag. Work queued on
 *    the streams before the group is done first, and work queued after waits for the results.
 *  - synchronous (CHORUS_CUDA_ASYNC=0, an older driver, a group that also has host buffers, or the
 *    pinned budget spent): the stream is synchronised, the input copied, the call runs like any host
 *    call and the result is copied back before the group returns.
 * A large AllReduce, Reduce, Broadcast, AllGather or ReduceScatter runs as pieces, each a call of its
 * own (stage_pieces; an AllGather's or ReduceScatter's piece: a slice of every block, stage_copy): a
 * piece copies its input on the pool's input stream, forked from the call's stream at the first
 * piece, so that while the bridge moves piece k the input stream copies piece k+1 in and the call's
 * stream copies piece k-1 back.
 * Graph capture (staging/stage_graph.c): a group captured on a stream gets pinned blocks, a flag word
 * and a plan of its own, kept until the communicator goes. The graph holds its copies, a host node
 * that hands the plan to the bridge at each replay, a wait for the flag and a write that resets it.
 * From the first capture on, the communicator's eager calls hand their plans to the bridge from a
 * host function too, on the pool's order stream (launch order, each after its streams' inputs), so
 * that replays and eager calls reach the bridge in the order their streams run them.
 * The pool of pinned blocks is staging/stage_pool.c's, captured calls staging/stage_graph.c's.
 * Ownership: a task's stage is made and finished by the thread in the call (the comm's owner);
 * stage_launch hands its pinned blocks to a gate, which the last of its host functions releases. */
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "../misc/log.h"
#include "../misc/param.h"
#include "../misc/utils.h"
#include "../cuda/cudrv.h"
#include "../comm/work.h"
#include "../core/host_stream.h"
#include "../core/init.h"
#include "../core/plan.h"
#include "../tune/tune.h"
#include "stage_int.h"
#include "staging.h"

/* One group's staged calls: opened by the bridge, released by the streams' last host functions. */
struct stage_gate {
  struct stage_comm* sc;
  uint32_t seq;
  int expected;          /* streams whose inputs the plans wait for */
  int arrived;           /* under mu */
  pthread_mutex_t mu;
  pthread_cond_t cv;
  /* The bridge, each stream's arrival and the first stream's last host function: the gate and its
   * blocks go back only once every stream is past every copy that uses them. */
  _Atomic int refs;
  int nblocks;
  struct ch_plan** plans; /* graph mode: the plans its order-stream host function hands the bridge, */
  int nplans;
  struct ch_batch* batch; /* in a batch made at launch (queueing it there cannot fail) */
  struct stage_gate* next_pending; /* sc->pending, under sc->enq_mu, until its host function runs */
  int dropped; /* under sc->enq_mu: an abort or a revoke took it back (stage_drop) */
  struct pin_block* blocks[];
};

/* Bytes of sendbuff and recvbuff a call spans (count is per rank for the gathering kinds). */
static void extents(const struct ch_task* t, int nranks, size_t* sb, size_t* rb) {
  size_t one = t->count * red_type_size(t->type), all = one * (size_t)nranks;
  switch (t->func) {
    case FUNC_ALLGATHER: case FUNC_GATHER: *sb = one, *rb = all; break;
    case FUNC_REDUCESCATTER: case FUNC_SCATTER: *sb = all, *rb = one; break;
    case FUNC_ALLTOALL: *sb = *rb = all; break;
    default: *sb = *rb = one; break;
  }
}

/* ---- per call ---- */

void stage_free(struct stage* st) {
  if (st->pin) block_put(st->pin);
  if (st->cap_block) cudrv_host_free_later(st->cap_block, st->ctx);
  free(st->block[0]);
  free(st->block[1]);
  free(st);
}

ch_status stage_copy(const struct stage* st, int in, cudaStream_t s) {
  char* host = in ? st->host_send : st->host_recv;
  char* app = in ? st->dev_send : st->dev_recv;
  size_t bytes = in ? st->send_bytes : st->recv_bytes;
  int strided = st->strided == (in ? STAGE_STRIDED_SEND : STAGE_STRIDED_RECV);
  size_t nseg = strided ? st->nseg : 1, seg = strided ? st->seg : bytes;
  for (size_t i = 0; bytes && i < nseg; i++) {
    char *h = host + i * seg, *a = app + i * (strided ? st->stride : 0);
    if (st->hostmem) memcpy(in ? h : a, in ? a : h, seg);
    else if (s) CHECK(cudrv_copy_async(in, h, a, seg, s, st->ctx));
    else CHECK(in ? cudrv_copy_dtoh(h, a, seg) : cudrv_copy_htod(a, h, seg));
  }
  return CH_OK;
}

/* Host memory for the copies: pinned (asynchronous) or malloc'd; one region when the buffers overlap
 * (a strided piece's host copies are laid out side by side, never as its buffers are). */
static int stage_alloc(struct ncclComm* comm, struct stage* st, struct stage_comm* sc, uintptr_t s, size_t sb,
                       uintptr_t r, size_t rb, ch_status* why) {
  int overlap = !st->strided && !st->reduce && sb && rb && s < r + rb && r < s + sb;
  uintptr_t lo = s < r ? s : r, hi = s + sb > r + rb ? s + sb : r + rb;
  *why = CH_OK;
  if (st->captured || st->async) { /* pinned: a block of the pool, or a captured call's own */
    size_t total = overlap ? hi - lo : UT_ALIGN_UP(sb, 64) + rb, tab = UT_ALIGN_UP(total, 64);
    if (st->reduce) total = tab + sizeof(struct dev_table); /* the kernel's table, after the copies */
    char* base;
    void* dev = NULL;
    if (st->captured) { /* kept with the graph (stage_capture) */
      int mode = cudrv_capture_relaxed(); /* allocations inside a capture in global mode */
      base = st->cap_block = cudrv_host_alloc(UT_MAX(total, (size_t)1), st->ctx, 1, &st->cap_dev);
      cudrv_capture_restore(mode);
      dev = st->cap_dev;
    } else {
      base = (st->pin = block_get(comm, sc, total, st->ctx, why)) ? st->pin->host : NULL;
      if (base) dev = st->pin->dev;
    }
    if (!base) return 0;
    st->host_send = base + (overlap ? s - lo : 0);
    st->host_recv = base + (overlap ? r - lo : UT_ALIGN_UP(sb, 64));
    if (st->reduce) {
      st->recv_mapped = (char*)dev + (st->host_recv - base);
      st->tab = (struct dev_table*)(base + tab), st->tab_dev = (char*)dev + tab;
    }
    return 1;
  }
  if (overlap) { /* in place, or overlapping: one block keeps the layout */
    if (!(st->block[0] = malloc(hi - lo))) return 0;
    st->host_send = st->block[0] + (s - lo), st->host_recv = st->block[0] + (r - lo);
    return 1;
  }
  if (sb && !(st->block[0] = malloc(sb))) return 0;
  if (rb && !(st->block[1] = malloc(rb))) return 0;
  st->host_send = st->block[0], st->host_recv = st->block[1];
  return 1;
}

/* The synchronous way in: wait for the stream, copy the input. Host buffers (a strided piece): what
 * a Chorus host stream still runs may write them; a CUDA stream does not touch them. */
static ch_status stage_copy_in_now(struct ch_task* t, struct stage* st) {
  if (!st->hostmem) CHECK(cudrv_stream_sync(t->stream)); /* the inputs are written */
  else if (t->stream && stream_is_ours(t->stream)) stream_wait_idle(t->stream);
  return stage_copy(st, 1, NULL);
}

ch_status stage_in(struct ch_task* t, int needs_send, int needs_recv, int hostmem, const char* fn) {
  size_t sb, rb;
  extents(t, t->comm->nranks, &sb, &rb);
  if (!needs_send) sb = 0;
  if (!needs_recv) rb = 0;
  uintptr_t s = (uintptr_t)t->sendbuff, r = (uintptr_t)t->recvbuff;
  void* ctx = hostmem ? NULL : cudrv_ptr_ctx(sb ? t->sendbuff : t->recvbuff);
  /* a new call: piece_in forks anew (not at a split's AllGather, a part of the call that keeps order) */
  if (t->piece <= 1 && !t->piece_ordered && t->comm->stage) t->comm->stage->in_forked = 0;
  int capturing = 0;
  if (!hostmem && cudrv_async_ok()) CHECK(cudrv_capturing(t->stream, ctx, &capturing));
  if (capturing) CHECK(capture_check(t, fn));
  struct stage* st = calloc(1, sizeof(*st));
  if (!st) goto oom;
  st->ctx = ctx, st->hostmem = hostmem;
  if (t->gpu_reduce && rb) { /* the host result is nranks blocks, reduced into one: the device's */
    st->reduce = 1, st->red = t->red, st->count = t->count, st->nblk = (size_t)t->comm->nranks;
  }
  if (t->stride) { /* AllGather's result or ReduceScatter's input (an AlltoAll's, for the GPU to reduce) */
    st->strided = t->func == FUNC_REDUCESCATTER || t->func == FUNC_ALLTOALL ? STAGE_STRIDED_SEND : STAGE_STRIDED_RECV;
    st->nseg = (size_t)t->comm->nranks;
    st->seg = t->count * red_type_size(t->type), st->stride = t->stride * red_type_size(t->type);
  }
  if (capturing) { /* its pool's bridge runs the replays */
    int mode = cudrv_capture_relaxed();
    int made = stage_comm_get(t->comm, ctx) != NULL;
    cudrv_capture_restore(mode);
    if (!made) goto oom;
    st->captured = 1;
  }
  st->dev_send = (void*)s, st->send_bytes = sb;
  st->dev_recv = (void*)r, st->recv_bytes = rb;
  size_t rb_app = st->reduce ? t->count * red_type_size(t->type) : rb; /* the application's side of it */
  /* The comm checked its init context's kernels (gpu_hello.kernels); buffers of another context whose
   * kernels do not load are combined by the CPU, the call then completing before returning. */
  if (st->reduce && !hostmem) st->kernel = cudev_kernel(ctx, t->type); /* once per call: stage_result's */
  int no_kernel = st->reduce && !hostmem && !st->kernel;
  if (no_kernel && capturing) {
    WARN("%s: stream %p is being captured into a CUDA graph, and Chorus's kernels do not load in its buffers' "
         "context to reduce there (rank %d); make this call outside the capture", fn, (void*)t->stream,
         t->comm->rank);
    stage_free(st);
    return CH_INVALID_USAGE;
  }
  if (no_kernel)
    INFO(LOG_COLL, "%s: Chorus's kernels do not load in the buffers' context: the CPU reduces, and the call "
         "completes before returning (rank %d)", fn, t->comm->rank);
  struct stage_comm* sc = NULL;
  st->async = capturing || (!hostmem && !no_kernel && param_int(PARAM_CUDA_ASYNC) && cudrv_async_ok() &&
                            (sc = stage_comm_get(t->comm, ctx)) != NULL);
  ch_status why;
  if (!stage_alloc(t->comm, st, sc, s, sb, r, rb, &why)) {
    if (why != CH_OK) { /* aborted, or the communicator failed, while waiting for a block */
      stage_free(st);
      return why;
    }
    if (!st->async || st->captured) goto oom;
    INFO(LOG_COLL, "%s: no pinned host memory for %zu + %zu bytes within CHORUS_CUDA_STAGING_MAX_BYTES: the call "
         "completes before returning", fn, sb, rb);
    st->async = 0;
    if (!stage_alloc(t->comm, st, sc, s, sb, r, rb, &why)) goto oom;
  }
  if (!st->async) {
    ch_status e = stage_copy_in_now(t, st);
    if (e != CH_OK) {
      stage_free(st);
      return e;
    }
  }
  st->recv_bytes = rb_app;
  if (sb) t->sendbuff = st->host_send;
  if (rb) t->recvbuff = st->host_recv;
  t->stage = st;
  INFO(LOG_COLL, "%s: %s buffers staged through %zu + %zu bytes of host memory (%s)", fn, hostmem ? "host" : "device",
       sb, rb, capturing ? "captured into a CUDA graph" : st->async ? "in stream order" : "completes before returning");
  return CH_OK;
oom:
  WARN("%s: out of memory for host copies of device buffers (%zu + %zu bytes, rank %d)", fn, sb, rb, t->comm->rank);
  if (st) stage_free(st);
  return CH_SYSTEM;
}

/* Where the call completes before returning (or the buffers are host memory): the CPU reduces the
 * blocks into the first, in rank order as the kernel does, and to its bits: the kernel carries 8- and
 * 16-bit floats in float across all blocks and rounds once, so here too (else one rank's result could
 * differ from its peers' in the last bit). */
#define COMBINE_CHUNK 2048
static void host_combine(struct stage* st) {
  size_t es = red_type_size(st->red.type), bytes = st->count * es;
  char* b = st->host_recv;
  if (!red_type_is_float(st->red.type) || es >= 4) {
    red_premul(&st->red, b, b, st->count); /* ncclAvg on floats: 1/n (a copy for every other op) */
    for (size_t q = 1; q < st->nblk; q++) red_reduce(&st->red, b, b, b + q * bytes, st->count);
    if (red_has_postop(&st->red)) red_postop(&st->red, b, b, st->count);
    return;
  }
  struct red_op f = st->red;
  f.type = ncclFloat32;
  float acc[COMBINE_CHUNK], in[COMBINE_CHUNK];
  for (size_t off = 0; off < st->count; off += COMBINE_CHUNK) {
    size_t n = st->count - off < COMBINE_CHUNK ? st->count - off : COMBINE_CHUNK;
    red_to_float(st->red.type, in, b + off * es, n);
    red_premul(&f, acc, in, n);
    for (size_t q = 1; q < st->nblk; q++) {
      red_to_float(st->red.type, in, b + q * bytes + off * es, n);
      red_reduce(&f, acc, acc, in, n);
    }
    red_from_float(st->red.type, b + off * es, acc, n);
  }
}

/* Blocks of a GPU reduction's kernel: each reads the table from mapped host memory once, and a few
 * keep enough loads in flight to fill PCIe (many blocks each reading it were slow: devjob.h). */
#define STAGE_RED_BLOCKS 8

ch_status stage_result(struct stage* st, cudaStream_t s) {
  if (!st->reduce) return stage_copy(st, 0, s); /* a reduction here has its kernel (stage_in) */
  size_t bytes = st->count * red_type_size(st->red.type);
  /* The block is this call's until its gate is handed back, after this kernel; a captured call's
   * table is written once, at capture, and read by every replay. */
  memset(st->tab, 0, sizeof(*st->tab));
  uint64_t scalar = 0; /* ncclAvg on floats: every rank's 1/n (as bits: a double, or an int64_t) */
  if (st->red.kind == RED_PREMULSUM && red_type_is_float(st->red.type)) memcpy(&scalar, &st->red.scalar_f, 8);
  else if (st->red.kind == RED_PREMULSUM) memcpy(&scalar, &st->red.scalar_i, 8);
  for (size_t q = 0; q < st->nblk; q++)
    st->tab->buf[DEV_SEND][q] = (uintptr_t)st->recv_mapped + q * bytes, st->tab->scalar[q] = scalar;
  st->tab->buf[DEV_RECV][0] = (uintptr_t)st->dev_recv;
  st->tab->seq = 1;
  struct dev_args a;
  memset(&a, 0, sizeof(a));
  a.table = (uintptr_t)st->tab_dev, a.seq = 1, a.type = st->red.type, a.op_kind = st->red.kind;
  a.divisor = st->red.divisor, a.unroll = cudev_unroll();
  uint32_t all = st->nblk >= 32 ? 0xffffffffu : (1u << st->nblk) - 1;
  dev_job_add(&a, DEV_REDUCE, all, DEV_SEND, 0, 1, DEV_RECV, 0, st->count);
  uint64_t gx = UT_MAX(UT_MIN(UT_DIV_UP((uint64_t)st->count, (uint64_t)512 * 4), (uint64_t)STAGE_RED_BLOCKS), 1);
  return cudev_launch(st->kernel, (unsigned)gx, 1, s, st->ctx, &a);
}

ch_status stage_out(struct ch_task* t, int ok) {
  struct stage* st = t->stage;
  if (!st) return CH_OK;
  t->stage = NULL;
  ch_status s = CH_OK;
  if (st->async && ok) { /* never reached the stream (a group that ran here): synchronously after all */
    WARN("internal: a staged call was not launched on its stream");
    s = CH_INTERNAL;
  } else if (ok) {
    if (st->reduce) host_combine(st);
    s = stage_copy(st, 0, NULL);
  }
  stage_free(st);
  return s;
}

/* Reductions through host memory where every GPU can combine (comm->stage_gpu_reduce): host memory only
 * moves the data and Chorus's kernel combines it. From the communicator and the call only, so alike
 * on every rank whatever its buffers.
 *  - GATHER: every rank gathers every input (an AllGather; a Gather to a Reduce's root) and its GPU
 *    reduces them: one round trip; on 2 ranks as few bytes on the network as a ring, beyond that
 *    about (n - 2) x the input more, so only where that stays small.
 *  - SPLIT: each rank's block of every input reaches it (an AlltoAll: a ring's bytes), its GPU reduces
 *    them, and an AllGather brings the reduced blocks back (AllReduce; ReduceScatter needs no
 *    AllGather).
 *  - CPU: the host reduces the staged copies: PreMulSum (each rank's scalar is its own; ncclAvg's is
 *    everyone's and stays on the GPU), the
 *    reproducible levels (the host's combination defines their bits), a large Reduce on 3 ranks or
 *    more (its root would receive n - 1 inputs), and more than 32 ranks (the kernel's masks). */
#define STAGE_GATHER_MAX_BYTES (64u << 10)

int stage_reduce_way(const struct ch_task* t) {
  struct ncclComm* comm = t->comm;
  int f = t->func, n = comm->nranks;
  /* stage_gpu_reduce: every rank's kernels load, and at most DEV_MAX_RANKS ranks (gpu_hello_fill) */
  if (!comm->stage_gpu_reduce || t->gpu_reduce || !t->count) return STAGE_RED_CPU;
  if (f != FUNC_ALLREDUCE && f != FUNC_REDUCE && f != FUNC_REDUCESCATTER) return STAGE_RED_CPU;
  /* PreMulSum: each rank knows only its own scalar, but ncclAvg's (1/n on floats) is everyone's */
  if ((t->red.kind == RED_PREMULSUM && t->op != ncclAvg) || tune_repro_level(comm, f, t->type)) return STAGE_RED_CPU;
  if (f == FUNC_REDUCESCATTER) return STAGE_RED_SPLIT;
  size_t bytes = t->count * red_type_size(t->type);
  if (n == 2 || t->count < (size_t)n || (size_t)(n - 2) * bytes <= STAGE_GATHER_MAX_BYTES) return STAGE_RED_GATHER;
  return f == FUNC_ALLREDUCE ? STAGE_RED_SPLIT : STAGE_RED_CPU;
}

/* At most this many pieces: past 16 x CHORUS_CUDA_STAGE_PIECE the pieces grow, so that a call's
 * launches stay few. */
#define STAGE_MAX_PIECES 16

/* An AllGather's or ReduceScatter's piece copies one segment per rank: past this many ranks their
 * copies would be too small to pay for themselves, and those calls stay whole. */
#define STAGE_MAX_SEGMENTS 64

size_t stage_pieces(const struct ch_task* t) {
  size_t piece = t->comm->stage_piece, esize = red_type_size(t->type);
  int f = t->func, n = t->comm->nranks;
  int blocks = f == FUNC_ALLGATHER || f == FUNC_REDUCESCATTER; /* a slice of each rank's block per piece */
  if (!piece || (f != FUNC_ALLREDUCE && f != FUNC_REDUCE && f != FUNC_BROADCAST && !blocks) ||
      (blocks && n > STAGE_MAX_SEGMENTS))
    return 0;
  size_t unit = esize * (blocks ? (size_t)n : 1); /* bytes a piece moves per element of count */
  if (t->count * unit <= piece) return 0;
  size_t per = UT_MAX(piece / unit, (t->count + STAGE_MAX_PIECES - 1) / STAGE_MAX_PIECES);
  per = UT_ALIGN_UP(per, 4096 / esize); /* pieces start on whole pages */
  return per < t->count ? per : 0;
}

/* ---- asynchronous launch ---- */

static void gate_unref(struct stage_gate* g) {
  if (atomic_fetch_sub_explicit(&g->refs, 1, memory_order_acq_rel) != 1) return;
  struct stage_comm* sc = g->sc;
  for (int i = 0; i < g->nblocks; i++) {
    struct stage_comm* owner = g->blocks[i]->owner;
    block_put(g->blocks[i]);
    atomic_fetch_sub_explicit(&owner->outstanding, 1, memory_order_release); /* the last touch of the block */
  }
  pthread_mutex_destroy(&g->mu);
  pthread_cond_destroy(&g->cv);
  free(g->plans);
  free(g);
  atomic_fetch_sub_explicit(&sc->outstanding, 1, memory_order_release); /* the last touch of sc */
}

static void gate_count(struct stage_gate* g) {
  pthread_mutex_lock(&g->mu);
  g->arrived++;
  pthread_cond_broadcast(&g->cv);
  pthread_mutex_unlock(&g->mu);
}

/* Host functions (a driver thread; no CUDA calls, no waiting). */
static void gate_arrive(void* arg) {
  gate_count(arg);
  gate_unref(arg);
}
static void gate_release(void* arg) { gate_unref(arg); }

/* The bridge: wait until every stream's inputs are in host memory. A stream that does not get there
 * before an abort or the comm's timeout fails every plan of the batch (none may run on inputs that
 * never came); the gate still opens, so the streams that did arrive run on. */
static void gate_wait(void* arg, struct ch_plan** plans, int n) {
  struct stage_gate* g = arg;
  uint64_t t0 = ut_now_ns(), timeout = UINT64_MAX;
  for (int i = 0; i < n; i++) {
    uint64_t c = atomic_load_explicit(&plans[i]->comm->timeout_ns, memory_order_relaxed);
    if (c && c < timeout) timeout = c;
  }
  int said = 0;
  ch_status fail = CH_OK;
  pthread_mutex_lock(&g->mu);
  while (g->arrived < g->expected && fail == CH_OK) {
    for (int i = 0; i < n; i++)
      if (__atomic_load_n(&plans[i]->comm->abort_flag, __ATOMIC_RELAXED)) fail = CH_ABORTED;
    uint64_t waited = ut_now_ns() - t0;
    if (fail == CH_OK && waited > timeout) {
      WARN("rank %d: a call on device buffers waited %.0f s for its CUDA stream to reach it (%d of %d streams "
           "there): failing it (CHORUS_TIMEOUT)",
           plans[0]->comm->rank, (double)waited / UT_NS_PER_S, g->arrived, g->expected);
      fail = CH_TIMEOUT;
    }
    if (fail != CH_OK) break;
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    ts.tv_nsec += (long)(100 * UT_NS_PER_MS);
    if (ts.tv_nsec >= (long)UT_NS_PER_S) ts.tv_sec++, ts.tv_nsec -= (long)UT_NS_PER_S;
    pthread_cond_timedwait(&g->cv, &g->mu, &ts);
    if (!said && ut_now_ns() - t0 > 10 * UT_NS_PER_S) {
      said = 1;
      INFO(LOG_COLL, "rank %d: a call on device buffers has waited 10 s for its CUDA stream to reach it (%d of %d "
           "streams there)", plans[0]->comm->rank, g->arrived, g->expected);
    }
  }
  pthread_mutex_unlock(&g->mu);
  if (fail != CH_OK)
    for (int i = 0; i < n; i++) plans[i]->status = fail; /* plan_exec fails them in ticket order */
}

/* After the plans ran (or failed): results are in host memory; the first stream may copy them back.
 * Gates of one pool open in the bridge's queue order, so the flag only moves forward. */
static void gate_open(void* arg, ch_status plans_status) {
  (void)plans_status; /* it opens whatever the plans did: the CUDA streams wait for it */
  struct stage_gate* g = arg;
  /* Forward only: the bridge opens gates in order, but a gate dropped by an abort or a revoke opens
   * where its stream gets to it, perhaps before earlier ones (their streams then go on early: the
   * calls failed, and the gates still hold their blocks). */
  uint32_t cur = atomic_load_explicit(g->sc->flag, memory_order_relaxed);
  while ((int32_t)(g->seq - cur) > 0 &&
         !atomic_compare_exchange_weak_explicit(g->sc->flag, &cur, g->seq, memory_order_release, memory_order_relaxed)) {
  }
  gate_unref(g);
}

/* The group's async stages run synchronously after all (it also has host buffers, or no memory for
 * the gate). A failed copy fails the call through its comm's async error: plan_exec then fails the
 * plan at its start, keeping the comm's tickets in order. */
static void stage_degrade(struct ch_task** lists, int n) {
  for (int i = 0; i < n; i++)
    for (struct ch_task* t = lists[i]; t; t = t->next) {
      struct stage* st = t->stage;
      if (!st || !st->async) continue;
      st->async = 0;
      ch_status e = stage_copy_in_now(t, st);
      if (e != CH_OK) comm_set_async_error(t->comm, e);
    }
}

/* The stream a piece alone in its group copies its input on: the pool's input stream, forked from the
 * call's stream at the first piece (the input is written by then; later pieces' inputs too). NULL:
 * the call's own stream copies it (not a piece, no input stream, or the fork failed for this call). */
static cudaStream_t piece_in(struct stage_comm* sc, struct ch_task** lists, int n) {
  struct ch_task* t = n == 1 ? lists[0] : NULL;
  if (!t || t->next || !t->piece || t->piece_ordered || !t->stage || t->stage->ctx != sc->ctx) return NULL;
  if (!sc->in_tried) {
    sc->in_tried = 1;
    if (cudrv_stream_new(&sc->in_stream, sc->ctx) != CH_OK) sc->in_stream = NULL; /* pieces then stay in order */
  }
  if (t->piece == 1) sc->in_forked = sc->in_stream && cudrv_join(t->stream, sc->ctx, sc->in_stream, sc->ctx) == CH_OK;
  return sc->in_forked ? sc->in_stream : NULL;
}

struct stage_gate* stage_gate_next(struct stage_gate* g) { return g->next_pending; }
int stage_gate_drop(struct stage_gate* g) {
  g->dropped = 1;
  return g->nplans;
}

/* Graph mode: the group's inputs are in (the order stream joined its streams); hand its plans to the
 * bridge, their tickets drawn there. A driver thread: no CUDA, no waiting. */
static void gate_enqueue(void* arg) {
  struct stage_gate* g = arg;
  struct stage_comm* sc = g->sc;
  pthread_mutex_lock(&sc->enq_mu);
  for (struct stage_gate** pp = &sc->pending; *pp; pp = &(*pp)->next_pending)
    if (*pp == g) {
      *pp = g->next_pending;
      break;
    }
  if (sc->closed || g->dropped) { /* its comm may be gone (nothing of it is touched); the streams go on */
    for (int i = 0; i < g->nplans; i++) plan_release(g->plans[i]); /* never ticketed nor run */
    if (!sc->closed) { /* a revoke or shrink: open it in the bridge's order, after the gates before it */
      stream_enqueue_batch(sc->bridge, g->batch, g->plans, 0, NULL, gate_open, g, 0);
      pthread_mutex_unlock(&sc->enq_mu);
      return;
    }
    pthread_mutex_unlock(&sc->enq_mu);
    stream_batch_free(g->batch);
    gate_open(g, CH_ABORTED); /* an abort: every call of the pool fails, the order no longer matters */
    return;
  }
  /* read first: once queued, the bridge may run the plans and the streams hand the gate back at once */
  struct ncclComm* comm = g->plans[0]->comm;
  int n = g->nplans;
  stream_enqueue_batch(sc->bridge, g->batch, g->plans, n, gate_wait, gate_open, g, 1);
  atomic_fetch_sub(&comm->unticketed, n); /* drawn; an abort waits for them from here */
  pthread_mutex_unlock(&sc->enq_mu);
}

/* Queue the streams' side of a group whose calls are all staged asynchronously, and its plans on the
 * bridge. 1: done (plans taken, *res its status), 0: not such a group (run it as before). */
int stage_launch(struct ch_plan** plans, struct ch_task** lists, int n, ch_status* res) {
  int ntasks = 0, nasync = 0, ncap = 0;
  for (int i = 0; i < n; i++) /* calls of count 0 touch no buffer: they need no stage */
    for (struct ch_task* t = lists[i]; t; t = t->next) {
      ntasks += t->count > 0, nasync += t->stage && t->stage->async;
      ncap += t->stage && t->stage->captured;
    }
  if (ncap) return stage_capture(plans, lists, n, ntasks, res);
  if (!nasync) return 0;
  if (nasync < ntasks) { /* host buffers too: everything completes here */
    stage_degrade(lists, n);
    return 0;
  }
  struct stage_comm* sc = plans[0]->comm->stage;
  /* Graph mode, where the comm has captured calls: the plans reach the bridge from a host function
   * on the order stream, behind the streams' inputs, so that replays (whose host nodes hand theirs
   * on as their streams get there) and eager calls keep their streams' order. A group over several
   * comms, one of them in graph mode, or no order stream: the calls complete before returning, their
   * tickets drawn here once the comms' calls before them have drawn theirs (core/group.c). */
  int gm = 0;
  for (int i = 0; i < n; i++) gm |= plans[i]->comm->stage && plans[i]->comm->stage->graph_mode;
  if (gm && !sc->order_tried) {
    sc->order_tried = 1;
    if (cudrv_stream_new(&sc->order_stream, sc->ctx) != CH_OK) sc->order_stream = NULL;
  }
  if (gm && (n > 1 || !sc->order_stream)) {
    stage_degrade(lists, n);
    return 0;
  }
  struct stage_gate* g = calloc(1, sizeof(*g) + (size_t)ntasks * sizeof(g->blocks[0]));
  cudaStream_t* streams = calloc((size_t)ntasks, sizeof(*streams));
  void** sctx = calloc((size_t)ntasks, sizeof(*sctx));
  struct ncclComm** plans_comm = calloc((size_t)n, sizeof(*plans_comm)); /* plans are taken below */
  if (g && gm) g->plans = malloc((size_t)n * sizeof(*g->plans)), g->batch = stream_batch_new(n, 0);
  if (!g || !streams || !sctx || !plans_comm || (gm && (!g->plans || !g->batch))) {
    if (g) free(g->plans), stream_batch_free(g->batch);
    free(g), free(streams), free(sctx), free(plans_comm);
    stage_degrade(lists, n);
    return 0;
  }
  int ns = 0;
  for (int i = 0; i < n; i++)
    for (struct ch_task* t = lists[i]; t; t = t->next) {
      if (!t->stage) continue;
      int k = 0;
      while (k < ns && streams[k] != t->stream) k++;
      if (k == ns) streams[ns] = t->stream, sctx[ns++] = t->stage->ctx;
      g->blocks[g->nblocks++] = t->stage->pin;
      t->stage->pin->queued = 1; /* the comm's owner: frees once this gate's streams are done */
      atomic_fetch_add(&t->stage->pin->owner->outstanding, 1);
    }
  g->sc = sc, g->expected = gm ? 0 : ns, g->seq = ++sc->next_seq;
  pthread_mutex_init(&g->mu, NULL);
  pthread_cond_init(&g->cv, NULL);
  /* The bridge, each stream's arrival, the first stream's release; graph mode: no arrivals (the order
   * stream's host function runs behind every stream's inputs). */
  atomic_store(&g->refs, 2 + (gm ? 0 : ns));
  atomic_fetch_add(&sc->outstanding, 1);
  ch_status e = CH_OK;
  cudaStream_t in = piece_in(sc, lists, n);
  /* Inputs: each stream copies its calls' inputs, then says so. A stream that cannot be told counts
   * as there (the call fails through the comm's async error instead of waiting for ever) but keeps
   * its reference: copies of it already queued may still write the blocks. */
  for (int k = 0; k < ns; k++) {
    ch_status ek = CH_OK;
    cudaStream_t is = in ? in : streams[k];
    for (int i = 0; i < n; i++)
      for (struct ch_task* t = lists[i]; t && ek == CH_OK; t = t->next)
        if (t->stage && t->stream == streams[k])
          ek = stage_copy(t->stage, 1, is);
    if (gm) {
      if (ek == CH_OK) ek = cudrv_join(is, sctx[k], sc->order_stream, sc->ctx);
      if (ek != CH_OK) e = ek;
      continue;
    }
    if (ek == CH_OK) ek = cudrv_host_fn(is, gate_arrive, g, sctx[k]);
    if (ek != CH_OK) gate_count(g), e = ek;
  }
  for (int i = 0; i < n; i++) plans_comm[i] = plans[i]->comm;
  if (e != CH_OK)
    for (int i = 0; i < n; i++) comm_set_async_error(plans_comm[i], e);
  if (gm) {
    memcpy(g->plans, plans, (size_t)n * sizeof(*plans));
    g->nplans = n;
    pthread_mutex_lock(&sc->enq_mu); /* an abort or revoke may take it back from here on (stage_drop) */
    g->next_pending = sc->pending, sc->pending = g;
    atomic_fetch_add(&plans_comm[0]->unticketed, n); /* before the host function may take them back */
    pthread_mutex_unlock(&sc->enq_mu);
    ch_status eh = cudrv_host_fn(sc->order_stream, gate_enqueue, g, sc->ctx);
    if (eh != CH_OK) { /* handed on here (the comm failed above, or fails now: plans fail at their start) */
      if (e == CH_OK) e = eh;
      for (int i = 0; i < n; i++) comm_set_async_error(plans_comm[i], eh);
      gate_enqueue(g);
    }
  } else if (stream_enqueue_tickets(sc->bridge, plans, n, gate_wait, gate_open, g) != CH_OK) {
    /* Out of memory: run it here, once the bridge has opened every earlier gate of this pool (the
     * flag must not move backwards). */
    stream_wait_idle(sc->bridge);
    plan_tickets(plans, n);
    gate_wait(g, plans, n);
    e = plan_exec(plans, n);
    gate_open(g, e);
  }
  for (int i = 0; i < n; i++) plans[i] = NULL;
  /* Results: the first stream waits for the flag, copies every result back and hands the gate back;
   * the group's other streams wait for those copies (an event), as NCCL makes every stream of a group
   * wait for its kernel. */
  ch_status ek = CH_OK;
  /* A piece's results wait for its input copy too, not only for the flag: a call failed by a timeout
   * or an abort opens its gate without the input (its block, and the application's next writes to
   * sendbuff, would race with that copy). One event; the input stream holds no later piece yet. */
  if (in) ek = cudrv_join(in, sc->ctx, streams[0], sctx[0]);
  if (ek == CH_OK) ek = cudrv_wait_geq(streams[0], sc->flag_dev, g->seq, sctx[0]);
  for (int i = 0; i < n; i++)
    for (struct ch_task* t = lists[i]; t && ek == CH_OK; t = t->next)
      if (t->stage)
        ek = stage_result(t->stage, streams[0]);
  for (int k = 1; k < ns && ek == CH_OK; k++) ek = cudrv_join(streams[0], sctx[0], streams[k], sctx[k]);
  if (ek == CH_OK) ek = cudrv_host_fn(streams[0], gate_release, g, sctx[0]);
  if (ek != CH_OK) { /* the reference stays: its blocks stay busy, since queued copies may use them */
    if (e == CH_OK) e = ek;
    for (int i = 0; i < n; i++) comm_set_async_error(plans_comm[i], ek);
  }
  for (int i = 0; i < n; i++) /* the blocks are the gate's now */
    for (struct ch_task* t = lists[i]; t; t = t->next) {
      if (!t->stage) continue;
      t->stage->pin = NULL;
      stage_free(t->stage);
      t->stage = NULL;
    }
  free(streams);
  free(sctx);
  free(plans_comm);
  *res = e;
  return 1;
}
