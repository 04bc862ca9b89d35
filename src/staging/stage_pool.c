/* The pinned host memory of a communicator's staged calls (staging/stage_int.h), its bridge, and its
 * release when the communicator goes (staging/staging.c says how calls use them). */
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "../misc/log.h"
#include "../misc/param.h"
#include "../misc/utils.h"
#include "../core/host_stream.h"
#include "../core/init.h"
#include "../core/plan.h"
#include "stage_int.h"
#include "staging.h"

/* ---- pinned blocks ---- */

struct stage_comm* stage_comm_get(struct ncclComm* comm, void* ctx) {
  if (comm->stage) return comm->stage;
  struct stage_comm* sc = calloc(1, sizeof(*sc));
  if (!sc) return NULL;
  sc->ctx = ctx;
  sc->flag = cudrv_host_alloc(64, ctx, 1, &sc->flag_dev);
  if (!sc->flag || stream_create(&sc->bridge) != CH_OK) {
    cudrv_host_free((void*)sc->flag, ctx);
    free(sc);
    return NULL;
  }
  atomic_store(sc->flag, 0);
  pthread_mutex_init(&sc->enq_mu, NULL);
  comm->stage = sc;
  return sc;
}

/* The smallest free block of at least `bytes` (taken), or NULL. */
static struct pin_block* block_free_fit(struct stage_comm* sc, size_t bytes, void* ctx) {
  struct pin_block* best = NULL;
  for (struct pin_block* b = sc->blocks; b; b = b->next)
    if (!atomic_load_explicit(&b->busy, memory_order_acquire) && b->bytes >= bytes && b->ctx == ctx &&
        (!best || b->bytes < best->bytes))
      best = b;
  if (best) atomic_store_explicit(&best->busy, 1, memory_order_relaxed), best->queued = 0;
  return best;
}

/* Give idle blocks back until `want` more bytes fit under cap (not all of them: the next calls may
 * reuse the rest). */
static void block_drop_idle(struct stage_comm* sc, size_t want, size_t cap) {
  for (struct pin_block** pp = &sc->blocks; *pp && sc->pinned_bytes + want > cap;) {
    struct pin_block* b = *pp;
    if (atomic_load_explicit(&b->busy, memory_order_acquire)) { pp = &b->next; continue; }
    *pp = b->next;
    sc->pinned_bytes -= b->bytes;
    cudrv_host_free_later(b->host, b->ctx); /* a peer's stream may wait for this caller's next call */
    free(b);
  }
}

/* A new block, within CHORUS_CUDA_STAGING_MAX_BYTES once idle blocks are given back; NULL: none. */
static struct pin_block* block_new(struct stage_comm* sc, size_t bytes, void* ctx) {
  size_t want = UT_ALIGN_UP(UT_MAX(bytes, (size_t)1), (size_t)64 << 10), cap = (size_t)param_int(PARAM_CUDA_STAGING_MAX_BYTES);
  if (sc->pinned_bytes + want > cap) {
    struct pin_block* fit = block_free_fit(sc, bytes, ctx); /* one may have come back since the caller looked */
    if (fit) return fit;
    block_drop_idle(sc, want, cap);
  }
  if (sc->pinned_bytes + want > cap) return NULL;
  struct pin_block* b = calloc(1, sizeof(*b));
  if (!b) return NULL;
  if (!(b->host = cudrv_host_alloc(want, ctx, 1, &b->dev))) { /* mapped: GPU reductions read it (stage_result) */
    free(b);
    return NULL;
  }
  b->bytes = want, b->ctx = ctx, b->next = sc->blocks, b->owner = sc;
  atomic_store_explicit(&b->busy, 1, memory_order_relaxed);
  sc->blocks = b;
  sc->pinned_bytes += want;
  return b;
}

/* A block for a call of `bytes`: a free one, else a new one within CHORUS_CUDA_STAGING_MAX_BYTES, else
 * the next one the streams hand back. A caller that runs that far ahead of its streams waits here,
 * as NCCL's does when its queue is full: before, it completed the call before returning, through
 * freshly malloc'd copies (page faults on every page), once per pool's worth of calls: the likely
 * cause of the first GPU sitting's slow host staging (not measured on a GPU). The wait starts where
 * the synchronous way did (the pool's bytes spent), for one earlier call where that waited for every
 * call queued on the stream, and only for blocks of launched gates (this group's own free only after it launches).
 * It ends at an abort or when the communicator fails (*why): a block that never comes back belongs
 * to a call that fails after CHORUS_TIMEOUT (its stream never reached it, or a peer never came).
 * NULL with *why CH_OK: nothing to wait for, or the call alone passes the cap. */
struct pin_block* block_get(struct ncclComm* comm, struct stage_comm* sc, size_t bytes, void* ctx, ch_status* why) {
  int noted = 0;
  uint64_t t0 = 0;
  *why = CH_OK;
  if (UT_ALIGN_UP(UT_MAX(bytes, (size_t)1), (size_t)64 << 10) > (size_t)param_int(PARAM_CUDA_STAGING_MAX_BYTES))
    return NULL;
  for (uint64_t i = 0;; i++) {
    struct pin_block* b = block_free_fit(sc, bytes, ctx);
    if (b || (b = block_new(sc, bytes, ctx))) return b;
    int queued = 0;
    for (struct pin_block* p = sc->blocks; p; p = p->next)
      queued += p->queued && atomic_load_explicit(&p->busy, memory_order_acquire);
    if (!queued) return NULL;
    if (__atomic_load_n(&comm->abort_flag, __ATOMIC_RELAXED)) {
      *why = CH_ABORTED;
      return NULL;
    }
    int failed = atomic_load_explicit(&comm->async_result, memory_order_relaxed); /* logged where it happened */
    if (failed) {
      *why = (ch_status)failed;
      return NULL;
    }
    uint64_t now = ut_now_ns();
    if (!t0) t0 = now;
    if (!noted && now - t0 > 10 * UT_NS_PER_S) {
      noted = 1;
      INFO(LOG_COLL, "rank %d: a call on device buffers has waited 10 s for the CUDA streams to finish earlier calls "
           "and hand pinned memory back (CHORUS_CUDA_STAGING_MAX_BYTES=%lld in use)", comm->rank,
           (long long)sc->pinned_bytes);
    }
    /* The streams hand blocks back a copy later (milliseconds): sleep, do not spin, as the ranks'
     * host threads need the cores meanwhile (5 us doubling to 200 us). */
    nanosleep(&(struct timespec){0, UT_MIN(5000L << (i < 6 ? i : 6), 200000L)}, NULL);
  }
}

/* Pinned memory of freed communicators that CUDA streams still use (an abort while a stream was
 * stuck before the call): freed by a later stage_comm_free once the streams are done with it (a
 * host function may not call CUDA to free it). Under orphans_mu. */
static pthread_mutex_t orphans_mu = PTHREAD_MUTEX_INITIALIZER;
static struct stage_comm* orphans;

static void sc_free(struct stage_comm* sc) {
  for (struct pin_block* b = sc->blocks, *next; b; b = next) {
    next = b->next;
    cudrv_host_free(b->host, b->ctx);
    free(b);
  }
  for (struct stage_graph* gc = sc->graphs, *next; gc; gc = next) {
    next = gc->next;
    plan_free(gc->plan);
    free(gc->snapshot);
    stream_batch_free(gc->batch);
    for (int i = 0; i < gc->nblocks; i++) cudrv_host_free(gc->blocks[i], gc->ctx);
    cudrv_host_free((void*)gc->flag, sc->ctx);
    free(gc);
  }
  cudrv_host_free((void*)sc->flag, sc->ctx);
  cudrv_stream_free(sc->in_stream, sc->ctx);
  cudrv_stream_free(sc->order_stream, sc->ctx);
  pthread_mutex_destroy(&sc->enq_mu);
  free(sc);
}

static void sc_free_job(void* sc, void* unused) {
  (void)unused;
  sc_free(sc);
}
/* cuMemFreeHost waits for the whole device: an abort hands the frees to the reaper (cudrv_defer), as
 * it never waits for a stream, not even one stuck in another communicator's call. */
static void sc_free_on(struct stage_comm* sc, int here) {
  if (here) sc_free(sc);
  else cudrv_defer(sc_free_job, sc, NULL);
}

/* Take back the calls whose tickets their streams are still to draw (their host functions drop them
 * when the streams get there), and with `close` every later one too. The comm is alive: its owner is
 * not in a call (an abort or a quiesce waited for that). */
static void stage_stop(struct ncclComm* comm, int close) {
  struct stage_comm* sc = comm->stage;
  if (!sc) return;
  int dropped = 0;
  pthread_mutex_lock(&sc->enq_mu);
  for (struct stage_gate* g = sc->pending; g; g = stage_gate_next(g)) dropped += stage_gate_drop(g);
  sc->pending = NULL;
  if (close) sc->closed = 1;
  pthread_mutex_unlock(&sc->enq_mu);
  /* A replay's stream waiting for its flag is let go too: its plan may be one that will not run (a
   * replay refused as overlapping another: graph_replay), and an abort ends the others' anyway. */
  for (struct stage_graph* gc = close ? sc->graphs : NULL; gc; gc = gc->next)
    atomic_store_explicit(gc->flag, 1, memory_order_release);
  if (!dropped) return;
  atomic_fetch_sub(&comm->unticketed, dropped);
  INFO(LOG_COLL, "rank %d: %d call(s) on device buffers their CUDA streams had not reached yet are dropped", comm->rank,
       dropped); /* stopped by the caller's own abort or revoke: no asynchronous error, as for other calls */
}

void stage_close(struct ncclComm* comm) { stage_stop(comm, 1); }
void stage_drop(struct ncclComm* comm) { stage_stop(comm, 0); }

void stage_comm_free(struct ncclComm* comm) {
  struct stage_comm* sc = comm->stage;
  int here = !__atomic_load_n(&comm->abort_flag, __ATOMIC_ACQUIRE);
  pthread_mutex_lock(&orphans_mu);
  for (struct stage_comm** pp = &orphans; *pp;) {
    struct stage_comm* o = *pp;
    if (atomic_load_explicit(&o->outstanding, memory_order_acquire)) { pp = &o->next_orphan; continue; }
    *pp = o->next_orphan;
    sc_free_on(o, here);
  }
  pthread_mutex_unlock(&orphans_mu);
  if (!sc) return;
  stage_close(comm); /* what a stream still hands on is dropped (an abort's: comm_wait_idle waited for the rest) */
  comm->stage = NULL;
  stream_destroy(sc->bridge); /* nothing of comm is queued any more: its thread just ends */
  int left = atomic_load_explicit(&sc->outstanding, memory_order_acquire);
  if (!left) {
    sc_free_on(sc, here);
    return;
  }
  INFO(LOG_COLL, "rank %d: %d staged calls are still queued on CUDA streams: their pinned memory is freed later",
       comm->rank, left);
  pthread_mutex_lock(&orphans_mu);
  sc->next_orphan = orphans;
  orphans = sc;
  pthread_mutex_unlock(&orphans_mu);
}
