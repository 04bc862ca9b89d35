/* Calls through host memory captured into CUDA graphs (gpu/staging.c's header says how). */
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

/* What a captured call needs: one collective that is one plan (not Send/Recv, nor AlltoAll, Gather
 * or Scatter, which are sends and receives), a driver that writes stream words, asynchronous calls. */
ch_status capture_check(const struct ch_task* t, const char* fn) {
  const char* no = NULL;
  if (t->func == FUNC_SEND || t->func == FUNC_RECV || t->func == FUNC_ALLTOALL || t->func == FUNC_GATHER ||
      t->func == FUNC_SCATTER)
    no = "Send/Recv, AlltoAll, Gather and Scatter through host memory";
  else if (!cudrv_has_write_u32())
    no = "a call through host memory with this driver (no cuStreamWriteValue32)";
  else if (!param_int(PARAM_CUDA_ASYNC))
    no = "a call through host memory with CHORUS_CUDA_ASYNC=0";
  if (!no) return CH_OK;
  WARN("%s: stream %p is being captured into a CUDA graph, and Chorus cannot capture %s yet; make this call "
       "outside the capture (rank %d)", fn, (void*)t->stream, no, t->comm->rank);
  return CH_INVALID_USAGE;
}

/* ---- calls captured into CUDA graphs ---- */

/* After a replay's plan ran (or failed: the comm's async error says so): the results are in the block;
 * the replay's stream may copy them back. The bridge's thread. */
static void graph_done(void* arg, ch_status st) {
  (void)st;
  struct stage_graph* gc = arg;
  atomic_store_explicit(gc->flag, 1, memory_order_release);
}

/* A replay's host node (a driver thread: no CUDA, no waiting): the inputs are in the block; hand the
 * re-armed plan to the bridge, its ticket drawn there. The previous replay's plan is done (its stream
 * waited for it before this graph could run again). */
static void graph_replay(void* arg) {
  struct stage_graph* gc = arg;
  struct ch_plan* pl = gc->plan;
  plan_rearm(pl, &gc->task);
  if (stream_enqueue_tickets(gc->sc->bridge, &pl, 1, NULL, graph_done, gc) != CH_OK) {
    WARN("rank %d: out of memory replaying a call captured into a CUDA graph", pl->comm->rank);
    comm_set_async_error(pl->comm, CH_SYSTEM);
    graph_done(gc, CH_SYSTEM); /* its stream goes on; no ticket was drawn */
  }
}

/* A group holding a call on a stream being captured: that call alone (one plan of one collective)
 * becomes a stage_graph; its stream gets the graph's part. 1: handled (*res its status). */
int stage_capture(struct ch_plan** plans, struct ch_task** lists, int n, int ntasks, ch_status* res) {
  struct ch_task* t = lists[0];
  struct stage* st = t->stage;
  struct ncclComm* comm = plans[0]->comm;
  if (n != 1 || ntasks != 1 || t->next || !st || !st->cap_block || !plans[0]->reusable) {
    WARN("rank %d: a group of calls on device buffers staged through host memory is being captured into a CUDA "
         "graph: Chorus captures such calls one at a time; issue each outside a group", comm->rank);
    for (int i = 0; i < n; i++) plan_release(plans[i]), plans[i] = NULL; /* never ticketed nor run */
    *res = CH_INVALID_USAGE;
    return 1;
  }
  struct stage_comm* sc = comm->stage; /* made by stage_in */
  int mode = cudrv_capture_relaxed();
  struct stage_graph* gc = calloc(1, sizeof(*gc));
  if (gc && !(gc->flag = cudrv_host_alloc(64, sc->ctx, 1, &gc->flag_dev))) free(gc), gc = NULL;
  cudrv_capture_restore(mode);
  if (!gc) {
    WARN("rank %d: out of memory capturing a call on device buffers into a CUDA graph", comm->rank);
    plan_release(plans[0]), plans[0] = NULL;
    *res = CH_SYSTEM;
    return 1;
  }
  atomic_store(gc->flag, 0);
  gc->sc = sc, gc->plan = plans[0], gc->block = st->cap_block;
  gc->plan->persistent = 1, gc->plan->fr_lo = gc->plan->fr_hi = 0;
  plans[0] = NULL, st->cap_block = NULL;
  gc->task = *t;
  gc->task.next = NULL, gc->task.stage = NULL, gc->task.fr_id = 0;
  gc->next = sc->graphs, sc->graphs = gc; /* kept even if a part below fails: the graph may hold the others */
  sc->graph_mode = 1; /* from now on eager calls reach the bridge in stream order too (stage_launch) */
  void* ctx = st->ctx;
  ch_status e = cudrv_copy_async(1, st->host_send, st->dev_send, st->send_bytes, t->stream, ctx);
  if (e == CH_OK) e = cudrv_host_fn(t->stream, graph_replay, gc, ctx);
  if (e == CH_OK) e = cudrv_wait_geq(t->stream, gc->flag_dev, 1, ctx);
  if (e == CH_OK) e = cudrv_copy_async(0, st->host_recv, st->dev_recv, st->recv_bytes, t->stream, ctx);
  if (e == CH_OK) e = cudrv_write_u32(t->stream, gc->flag_dev, 0, ctx);
  if (t->fr_id) { /* the capture itself is done; replays are not recorded */
    fr_start(comm, t->fr_id, t->fr_id, atomic_load_explicit(&comm->seq, memory_order_relaxed));
    fr_end(comm, t->fr_id, t->fr_id, e);
  }
  INFO(LOG_COLL, "rank %d: a call on device buffers (%zu + %zu bytes through host memory) captured into a CUDA graph",
       comm->rank, st->send_bytes, st->recv_bytes);
  stage_free(st);
  t->stage = NULL;
  *res = e;
  return 1;
}
