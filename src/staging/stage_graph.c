/* Calls through host memory captured into CUDA graphs (staging/staging.c's header says how): a group of
 * one communicator, every call of it on one capturing stream. Its plan runs at every replay as it was
 * built (plan_snapshot), on pinned blocks of its own. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "../misc/log.h"
#include "../misc/param.h"
#include "../cuda/cudrv.h"
#include "../core/host_stream.h"
#include "../core/init.h"
#include "../core/plan.h"
#include "../observe/observe.h"
#include "stage_int.h"

ch_status capture_check(const struct ch_task* t, const char* fn) {
  const char* no = NULL;
  if (!cudrv_has_write_u32())
    no = "a call through host memory with this driver (no cuStreamWriteValue32)";
  else if (!param_int(PARAM_CUDA_ASYNC))
    no = "a call through host memory with CHORUS_CUDA_ASYNC=0";
  if (!no) return CH_OK;
  WARN("%s: stream %p is being captured into a CUDA graph, and Chorus cannot capture %s; make this call "
       "outside the capture (rank %d)", fn, (void*)t->stream, no, t->comm->rank);
  return CH_INVALID_USAGE;
}

/* Lets the replay's stream copy the blocks back (1) and reset the flag (0, the stream's own write). */
static void graph_open(struct stage_graph* gc) { atomic_store_explicit(gc->flag, 1, memory_order_release); }

/* After a replay's plan ran (or failed: the comm's async error says so): the results are in the
 * blocks; the replay's stream may copy them back. The bridge's thread, after plan_exec let go of the
 * plan. */
static void graph_done(void* arg, ch_status st) {
  (void)st;
  struct stage_graph* gc = arg;
  atomic_fetch_add_explicit(&gc->finished, 1, memory_order_release);
  graph_open(gc);
}

/* Whether another replay of this capture is still under way: its plan not done yet (restoring the
 * plan would write over one the bridge runs), or its results not copied back yet (the flag it resets
 * after its copies is still 1). A replay in stream order after the previous one sees neither: the
 * previous replay's stream reset the flag before this host node could run. */
static int replay_overlaps(struct stage_graph* gc) {
  return atomic_load_explicit(&gc->broken, memory_order_relaxed) ||
         atomic_load_explicit(&gc->started, memory_order_relaxed) !=
             atomic_load_explicit(&gc->finished, memory_order_acquire) ||
         atomic_load_explicit(gc->flag, memory_order_acquire) != 0;
}

/* A replay's host node (a driver thread: no CUDA, no waiting): the inputs are in the blocks; restore
 * the plan and hand it to the bridge, its ticket drawn there. The previous replay's plan is done: its
 * stream waited for graph_done before this graph could run again, unless the application launched
 * the graph twice at once (two instances, or two streams with no order between them), which Chorus
 * refuses: the second replay runs nothing, fails the communicator naming the cause and lets its
 * stream go (the results of both are undefined). */
static void graph_replay(void* arg) {
  struct stage_graph* gc = arg;
  struct stage_comm* sc = gc->sc;
  pthread_mutex_lock(&sc->enq_mu);
  if (sc->closed) { /* aborted: nothing runs, the stream goes on */
    pthread_mutex_unlock(&sc->enq_mu);
    graph_open(gc);
    return;
  }
  struct ch_plan* pl = gc->plan;
  if (replay_overlaps(gc)) {
    if (!atomic_exchange(&gc->broken, 1)) {
      WARN("rank %d: a CUDA graph holding calls on device buffers through host memory was replayed while "
           "another replay of it was still running (two instances of the graph, or launches on streams with "
           "no order between them): Chorus runs one replay of a capture at a time; the communicator fails",
           pl->comm->rank);
      comm_set_async_error(pl->comm, CH_INVALID_USAGE);
    }
    pthread_mutex_unlock(&sc->enq_mu);
    graph_open(gc); /* every later replay too: a stream never waits for a plan that will not run */
    return;
  }
  atomic_fetch_add_explicit(&gc->started, 1, memory_order_relaxed);
  plan_restore(pl, gc->snapshot);
  stream_enqueue_batch(sc->bridge, gc->batch, &pl, 1, NULL, graph_done, gc, 1); /* made at capture: cannot fail */
  pthread_mutex_unlock(&sc->enq_mu);
}

/* Why the group cannot be captured, or NULL: one communicator, every call with a stage on one
 * stream (a count of 0 touches nothing and has none). */
static const char* capture_refusal(struct ch_task** lists, int n) {
  if (n != 1) return "a group over several communicators";
  for (struct ch_task* t = lists[0]; t; t = t->next) {
    if (!t->stage && t->count == 0) continue;
    if (!t->stage || !t->stage->captured) return "a group of captured calls and calls on other streams";
    if (t->stream != lists[0]->stream) return "a group over several capturing streams";
  }
  return NULL;
}

int stage_capture(struct ch_plan** plans, struct ch_task** lists, int n, int ntasks, ch_status* res) {
  struct ncclComm* comm = plans[0]->comm;
  const char* no = capture_refusal(lists, n);
  if (no) {
    WARN("rank %d: %s is being captured into a CUDA graph: Chorus captures the calls of one communicator on one "
         "stream (through host memory); make these calls outside the capture", comm->rank, no);
    for (int i = 0; i < n; i++) plan_release(plans[i]), plans[i] = NULL; /* never ticketed nor run */
    *res = CH_INVALID_USAGE;
    return 1;
  }
  struct stage_comm* sc = comm->stage; /* made by stage_in */
  cudaStream_t s = lists[0]->stream;
  int mode = cudrv_capture_relaxed();
  struct stage_graph* gc = calloc(1, sizeof(*gc) + (size_t)ntasks * sizeof(gc->blocks[0]));
  if (gc && !(gc->flag = cudrv_host_alloc(64, sc->ctx, 1, &gc->flag_dev))) free(gc), gc = NULL;
  cudrv_capture_restore(mode);
  plans[0]->fr_lo = plans[0]->fr_hi = 0; /* replays are not recorded (the capture is, below) */
  plans[0]->persistent = 1;
  void* snapshot = gc ? plan_snapshot(plans[0]) : NULL;
  struct ch_batch* batch = snapshot ? stream_batch_new(1, 1) : NULL;
  if (!batch) {
    WARN("rank %d: out of memory capturing calls on device buffers into a CUDA graph", comm->rank);
    if (gc) cudrv_host_free((void*)gc->flag, sc->ctx);
    free(snapshot);
    free(gc);
    plans[0]->persistent = 0;
    plan_release(plans[0]), plans[0] = NULL;
    *res = CH_SYSTEM;
    return 1;
  }
  atomic_store(gc->flag, 0);
  gc->sc = sc, gc->plan = plans[0], gc->snapshot = snapshot, gc->batch = batch;
  plans[0] = NULL;
  for (struct ch_task* t = lists[0]; t; t = t->next)
    if (t->stage) gc->blocks[gc->nblocks++] = t->stage->cap_block, t->stage->cap_block = NULL, gc->ctx = t->stage->ctx;
  gc->next = sc->graphs, sc->graphs = gc; /* kept even if a part below fails: the graph may hold the others */
  sc->graph_mode = 1; /* from now on eager calls reach the bridge in stream order too (stage_launch) */
  ch_status e = CH_OK;
  void* ctx = gc->ctx; /* the stream's: its calls' buffers' (one context per communicator) */
  for (struct ch_task* t = lists[0]; t && e == CH_OK; t = t->next)
    if (t->stage) e = stage_copy(t->stage, 1, s);
  if (e == CH_OK) e = cudrv_host_fn(s, graph_replay, gc, ctx);
  if (e == CH_OK) e = cudrv_wait_geq(s, gc->flag_dev, 1, ctx);
  for (struct ch_task* t = lists[0]; t && e == CH_OK; t = t->next)
    if (t->stage) e = stage_result(t->stage, s);
  if (e == CH_OK) e = cudrv_write_u32(s, gc->flag_dev, 0, ctx);
  uint64_t lo = 0, hi = 0; /* the capture itself is done */
  for (struct ch_task* t = lists[0]; t; t = t->next)
    if (t->fr_id) hi = t->fr_id, lo = lo ? lo : t->fr_id;
  if (lo) {
    fr_start(comm, lo, hi, atomic_load_explicit(&comm->seq, memory_order_relaxed));
    fr_end(comm, lo, hi, e);
  }
  INFO(LOG_COLL, "rank %d: %d call(s) on device buffers through host memory captured into a CUDA graph", comm->rank,
       gc->nblocks);
  for (struct ch_task* t = lists[0]; t; t = t->next)
    if (t->stage) stage_free(t->stage), t->stage = NULL;
  *res = e;
  return 1;
}
