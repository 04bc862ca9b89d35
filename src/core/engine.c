/* The progress engine: runs the lanes of a thread's plans (lane_progress) until each finishes, waits
 * between polls (engine_wait: spin, yield, sleep), watches peers for death and stalls while blocked,
 * and publishes each plan's completion in ticket order (plan_start, finish_plan). plan.c builds the
 * plans it runs. */
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <time.h>
#include <stdlib.h>
#include <string.h>

#include "../misc/log.h"
#include "../misc/param.h"
#include "../misc/utils.h"
#include "../comm/work.h"
#include "../tune/tune.h"
#include "../fault/mismatch.h"
#include "../fault/stall.h"
#include "../observe/observe.h"
#include "init.h"
#include "memreg.h"
#include "plan.h"

/* Steps are computed lazily (nidx) when an op first runs: connections exist by then. */
static int lane_progress(struct ncclComm* comm, struct ch_lane* ln, struct prim_ctx** blocked, ch_status* err) {
  int progressed = 0;
  while (ln->cur < ln->nops) {
    struct ch_op* op = ln->ops[ln->cur];
    if (op->standby) { /* Direct's verdict decides: nothing to do, or the fallback on this channel's share */
      int o = atomic_load_explicit(op->outcome, memory_order_acquire);
      if (o == DIRECT_OUTCOME_OPEN) break;
      if (o == DIRECT_OUTCOME_RAN) { ln->cur++; progressed = 1; continue; }
    }
    if (op->nidx == 0) op->nidx = algo_nsteps(op) + 1; /* +1: "computed" marker */
    if (op->traced && !op->t0) op->t0 = obs_ticks();
    if (op->idx + 1 >= op->nidx) {
      if (op->traced) {
        int p2p = op->func == FUNC_SEND || op->func == FUNC_RECV;
        trace_op(comm, op->func, p2p ? -1 : op->algo, op->proto, op->channel, p2p ? op->root : -1,
                 (uint64_t)(p2p ? op->count : op->part_count) * op->esize, op->t0, obs_ticks());
      }
      if (op->algo == ALGO_DIRECT && op->outcome)
        atomic_store_explicit(op->outcome, DIRECT_OUTCOME_RAN, memory_order_release);
      ln->cur++;
      progressed = 1;
      continue;
    }
    if (op->algo == ALGO_DIRECT) {
      int r = direct_allreduce_try(op);
      if (r == DIRECT_WAIT) break;
      if (r == DIRECT_MISMATCH || r == DIRECT_FAILED) { /* logged where it happened */
        if (op->outcome) atomic_store_explicit(op->outcome, DIRECT_OUTCOME_RAN, memory_order_release); /* standbys end */
        *err = r == DIRECT_MISMATCH ? CH_INVALID_USAGE : CH_SYSTEM;
        if (r == DIRECT_MISMATCH) atomic_store(&comm->poisoned, 1); /* every rank logged it: no second WARN */
        break;
      }
      if (r == DIRECT_FALLBACK) { /* some buffer is unreachable: every rank switches to the FIFO algorithm */
        if (op->outcome) atomic_store_explicit(op->outcome, DIRECT_OUTCOME_FELL_BACK, memory_order_release);
        op->algo = op->fallback_algo, op->idx = 0, op->step_at = 0;
        op_set_chunk(comm, op, 1, op->esize, 0); /* before counting its steps; Direct had no tuner chunk */
        op->nidx = algo_nsteps(op) + 1;
      }
      else
        op->idx++;
      progressed = 1;
      continue;
    }
    const struct prim* p = &op->step;
    if (op->step_at != op->idx + 1) { /* a step that waits is tried again as it was computed */
      algo_step(op, op->idx, &op->step);
      op->step_at = op->idx + 1;
    }
    if (p->peers) { /* RecDbl, Rabenseifner, Tree, Owner: this step's peer connections (group.c connects
                     * them with the rings) */
      if (p->recv) op->ctx.in = &comm_apeer(comm, p->in_peer)->recv;
      if (p->send) op->ctx.out = &comm_apeer(comm, p->out_peer)->send;
      if ((p->recv && !op->ctx.in->connected) || (p->send && !op->ctx.out->connected)) {
        WARN("rank %d: %s needs a connection with rank %d that was not set up (internal error)", comm->rank,
             algo_name(op->algo), p->recv && !op->ctx.in->connected ? p->in_peer : p->out_peer);
        *err = CH_INTERNAL;
        break;
      }
    }
    int r = prim_try(&op->ctx, p);
    if (r == PRIM_MISMATCH) {
      *err = mm_found(comm, op);
      break;
    }
    if (!r) {
      if (!*blocked) *blocked = &op->ctx;
      break;
    }
    if (p->send | p->recv) {
      if (p->send) obs_moved(op->ctx.out, prim_bytes(&op->ctx, op->ctx.out, p->nelem));
      if (p->recv) obs_moved(op->ctx.in, prim_bytes(&op->ctx, op->ctx.in, p->nelem));
    }
    op->idx++;
    progressed = 1;
  }
  return progressed;
}

/* A peer process that has died never advances its FIFOs: look for it when we stop making progress. */
static ch_status check_conn(struct ncclComm* comm, const struct conn* c, const struct prim_ctx* blocked,
                            int* culprit) {
  int st = tp_conn_health(c);
  if (st) *culprit = c->peer;
  /* A failure was logged and set as the async error by the transport; an orderly close matters only
   * to an operation waiting on that very connection. */
  if (st == 1 && blocked && (blocked->in == c || blocked->out == c)) {
    WARN("rank %d: rank %d closed its connection (destroyed or aborted its communicator) while rank %d was "
         "waiting for it", comm->rank, c->peer, comm->rank);
    return CH_REMOTE;
  }
  return st == 2 ? CH_REMOTE : CH_OK;
}

static ch_status check_links(struct ncclComm* comm, const struct prim_ctx* blocked, int* culprit) {
  for (int c = 0; c < comm->nchannels; c++) {
    CHECK(check_conn(comm, &comm->channels[c].send, blocked, culprit));
    CHECK(check_conn(comm, &comm->channels[c].recv, blocked, culprit));
  }
  for (int k = 0; comm->p2p && k < 2 * comm->nranks; k++) { /* both per-peer sets */
    CHECK(check_conn(comm, &comm->p2p[k].send, blocked, culprit));
    CHECK(check_conn(comm, &comm->p2p[k].recv, blocked, culprit));
  }
  return CH_OK;
}

/* A failure found here is passed on: every connection of the communicator is poisoned with the
 * culprit's rank (fault/mismatch.c), so ranks that do not talk to it directly fail now, naming it, instead
 * of at their timeout. */
static ch_status check_peers_alive(struct ncclComm* comm, const struct prim_ctx* blocked) {
  int culprit = -1;
  ch_status s = check_links(comm, blocked, &culprit);
  if (s != CH_OK) {
    mm_peer_lost(comm, culprit);
    return s;
  }
  for (int r = 0; r < comm->nranks; r++) {
    if (!(tp_flags(comm->peer_tp[r]) & TP_F_PID_WATCH)) continue;
    /* Only a rank we are waiting on: one that did its part of the call and exited is no failure
     * (the perf tools' last gather at 256 ranks failed so); one that left early is found by whoever
     * waits on it, which poisons every connection (above). Unknown waits check every rank. */
    if (blocked && !(blocked->in && blocked->in->peer == r) && !(blocked->out && blocked->out->peer == r)) continue;
    /* A pid from another PID namespace (a container) means nothing here. */
    uint64_t ns = comm->peers[comm->rank].pid_ns;
    if (ns == 0 || comm->peers[r].pid_ns != ns) continue;
    if (!ut_pid_alive(comm->peers[r].pid)) {
      /* It may have written its last step and left between our poll and this check: its stores are
       * visible now that it is gone, so poll once more before calling it lost (seen at 512 ranks, in
       * the perf tools' last broadcast). */
      if (comm->lost_suspect != r + 1) {
        comm->lost_suspect = r + 1;
        return CH_IN_PROGRESS;
      }
      WARN("rank %d (pid %d on %s) has exited while rank %d was waiting for it in a collective", r,
           comm->peers[r].pid, comm->peers[r].hostname, comm->rank);
      mm_peer_lost(comm, r);
      return CH_REMOTE;
    }
  }
  return CH_OK;
}

/* Waiting policy of the engine. With a core each, spin while the peer is likely mid-step (lowest
 * latency). With more ranks than cores, the rank we wait for may need our core: yield instead, which
 * keeps every rank runnable and hands over the CPU in a few microseconds. After that, sleep in the
 * kernel on the FIFO counter (the poster wakes us; we re-poll everything each millisecond), so idle
 * ranks stop using CPU. Measured with all_reduce_perf, 4 ranks on 2 cores, 8 B: sleeping at once
 * costs ~100 us per call (a wake-up per hop), yielding first ~20 us. */
/* The network lets a waiting rank read its sockets itself. Such a socket stays with the rank across
 * calls (a rank that waits on it again pays no hand-over), until the rank sleeps: then every one goes
 * back to the transport, which moves data while nobody polls. The oldest goes back first when more
 * than COMM_POLLED_MAX are held. */
static void polled_note(struct ncclComm* comm, struct conn* c) {
  for (int i = 0; i < comm->npolled; i++)
    if (comm->polled[i] == c) return;
  if (comm->npolled == COMM_POLLED_MAX) {
    tp_conn_idle(comm->polled[0]);
    memmove(comm->polled, comm->polled + 1, sizeof(comm->polled[0]) * (COMM_POLLED_MAX - 1));
    comm->npolled--;
  }
  comm->polled[comm->npolled++] = c;
}

static void polled_release(struct ncclComm* comm) {
  for (int i = 0; i < comm->npolled; i++) tp_conn_idle(comm->polled[i]);
  comm->npolled = 0;
}

static void engine_wait(uint64_t idle_ns, int oversubscribed, struct prim_ctx* blocked, struct ncclComm* bcomm) {
  static _Thread_local int64_t spin_ns = -1, yield_ns;
  /* Waiting for data: a transport may move it from this thread (the network: read the socket here
   * rather than wait for the proxy's hop); polled_note keeps what must be given back. */
  struct conn* in = blocked && blocked->in && blocked->in->ctrl && blocked->wait_word == &blocked->in->ctrl->tail
                        ? blocked->in : NULL;
  if (in && bcomm && tp_conn_pollable(in)) {
    polled_note(bcomm, in);
    if (tp_conn_poll(in)) return;
  }
  if (spin_ns < 0) {
    spin_ns = param_int(PARAM_SPIN_US) * (int64_t)UT_NS_PER_US;
    yield_ns = param_int(PARAM_YIELD_US) * (int64_t)UT_NS_PER_US;
  }
  if (!oversubscribed && (int64_t)idle_ns < spin_ns) {
    ut_cpu_relax();
  } else if ((int64_t)idle_ns < (oversubscribed ? yield_ns : spin_ns + yield_ns / 8)) {
    sched_yield();
  } else if (blocked) {
    if (bcomm) polled_release(bcomm); /* asleep, we read nothing: the transport does */
    prim_wait(blocked, 1000);
  } else {
    struct timespec ts = {0, 50000};
    nanosleep(&ts, NULL);
  }
}

/* The plan's ticket came up: from here on the call counts. Sequence numbers are taken in ticket
 * order, so a call that fails before it is launched (connection setup, another call of its group)
 * leaves this rank's count where its peers' is. comm->seq is touched only by the thread running the
 * plan whose ticket is current (tickets serialize them; done_ticket carries the ordering). */
static void plan_start(struct ch_plan* pl) {
  struct ncclComm* comm = pl->comm;
  uint64_t base = atomic_load_explicit(&comm->seq, memory_order_relaxed);
  const struct xfer_hdr* first = NULL;
  for (int k = 0; k < pl->nops; k++) {
    struct ch_op* op = &pl->ops[k];
    if (op->func <= FUNC_ALLREDUCE) {
      op->ctx.hdr.seq += base;
      if (!first) first = &op->ctx.hdr;
    }
    op->ctx.tag = xfer_tag(&op->ctx.hdr);
  }
  if (first) mm_publish(comm, first); /* the group's first collective stands for it */
  if (!pl->wave_cont) {
    fr_start(comm, pl->fr_lo, pl->fr_hi, base);
    if (comm->prof) prof_plan_start(comm, pl->fr_lo, pl->fr_hi);
  }
  atomic_store_explicit(&comm->seq, base + (uint64_t)pl->ncoll, memory_order_relaxed);
  pl->started = 1;
}

/* Hand a finished plan back and publish its completion. Once done_ticket moves, a thread waiting in
 * ncclCommAbort/ncclCommDestroy may free the comm together with the plan kept on it: so the plan is
 * released (kept on its comm for a repeat, or freed) before that store, and neither is touched after
 * it. *slot is cleared; returns the plan's status. */
static ch_status finish_plan(struct ch_plan** slot) {
  struct ch_plan* pl = *slot;
  struct ncclComm* comm = pl->comm;
  ch_status st = pl->status;
  pl->done = 1;
  if (!pl->wave_more || st != CH_OK) { /* a wave with more to come ends nothing unless it failed */
    fr_end(comm, pl->fr_lo, pl->fr_hi, st);
    if (comm->prof) prof_plan_end(comm, pl->fr_lo, pl->fr_hi, st);
    if (comm->trace) trace_calls(comm, pl->fr_lo, pl->fr_hi);
    obs_add(&comm->ctr_calls, (uint64_t)pl->ncalls); /* plans of a comm finish one at a time (tickets) */
    obs_add(&comm->ctr_bytes, pl->user_bytes);
  }
  if (st != CH_OK) {
    if (st == CH_ABORTED) INFO(LOG_COLL, "operation on rank %d stopped: communicator aborted", comm->rank);
    obs_add(&comm->ctr_errors, (uint64_t)pl->ncalls);
    comm_set_async_error(comm, st);
    if (st != CH_ABORTED) stall_dump_failure(comm, st); /* the flight recorder, once per comm */
  }
  *slot = NULL;
  plan_release(pl);
  atomic_fetch_add(&comm->done_ticket, 1); /* the last touch of comm */
  return st;
}

void plan_cancel(struct ch_plan* pl) {
  pl->status = CH_ABORTED;
  finish_plan(&pl);
}

/* The engine's current wait (one at a time: it waits for all its plans at once), charged to the comm
 * and peer it was blocked on when it began: counters and, when traced, the timeline. */
struct wait_rec {
  struct ncclComm* comm; /* NULL: nothing to charge (none, or charged already) */
  int peer;
  uint64_t since_ns, tick;
};

/* End the wait (progress resumed, or it ends in a failure). Called before finish_plan hands comm on:
 * after it, another thread may run the comm's plans or free it. */
static void wait_end(struct wait_rec* w) {
  if (!w->comm) return;
  obs_waited(w->comm, w->peer, ut_now_ns() - w->since_ns); /* waits past 64 polls only: see plan_exec */
  if (w->tick && w->comm->trace) trace_wait(w->comm, w->peer, w->tick, obs_ticks());
  w->comm = NULL;
}
static void wait_end_for(struct wait_rec* w, const struct ch_plan* pl) {
  if (w->comm == pl->comm) wait_end(w);
}

/* Plans are owned by plan_exec from the call on: each is released as it finishes and plans[i] becomes
 * NULL (callers' later plan_release/plan_free of plans[i] are no-ops). Returns the status of the first
 * plan (in array order) that failed. */
ch_status plan_exec(struct ch_plan** plans, int n) {
  int remaining = n, err_at = n;
  ch_status err = CH_OK;
  int oversubscribed = plans[0]->comm->oversubscribed;
  unsigned dumps = stall_dump_requests();
  uint64_t timeout_ns = UINT64_MAX; /* the shortest of the plans' communicators (0 = none) */
  for (int i = 0; i < n; i++) {
    uint64_t c = atomic_load_explicit(&plans[i]->comm->timeout_ns, memory_order_relaxed);
    if (c && c < timeout_ns) timeout_ns = c;
  }
  uint64_t idle = 0, idle_since = 0, check_since = 0, mm_since = 0, t = 0;
  struct wait_rec wait = {0};
  while (remaining > 0) {
    int progressed = 0;
    struct prim_ctx* blocked = NULL;
    struct ncclComm* bcomm = NULL; /* blocked's */
    struct ncclComm* stuck = NULL; /* the first comm whose plan did not move */
    for (int i = 0; i < n; i++) {
      struct ch_plan* pl = plans[i];
      if (!pl) continue; /* finished and released */
      struct ncclComm* comm = pl->comm;
      if (!pl->started) {
        if (atomic_load(&comm->done_ticket) != pl->ticket) continue;
        plan_start(pl);
        /* A plan queued on a stream behind one that failed: the peers are out of step (a dead rank,
         * a poisoned call), so running it could only misreport or hang. It fails with that error. */
        int as = atomic_load(&comm->async_result);
        if (as != ncclSuccess) pl->status = (ch_status)as;
      }
      int busy = 0, moved = 0;
      if (__atomic_load_n(&comm->abort_flag, __ATOMIC_RELAXED)) {
        pl->status = CH_ABORTED;
      } else if (pl->status == CH_OK) {
        for (int l = 0; l < pl->nlanes; l++) {
          struct ch_lane* ln = &pl->lanes[l];
          if (ln->cur >= ln->nops) continue;
          moved |= lane_progress(comm, ln, &blocked, &pl->status);
          if (blocked && !bcomm) bcomm = comm;
          busy |= ln->cur < ln->nops;
        }
        progressed |= moved;
        if (busy && !moved && !stuck) stuck = comm; /* a wait is charged to it (Direct's too: no blocked) */
      }
      if (!busy || pl->status != CH_OK) {
        wait_end_for(&wait, pl);
        ch_status st = finish_plan(&plans[i]);
        if (st != CH_OK && i < err_at) err = st, err_at = i;
        remaining--;
        progressed = 1;
      }
    }
    if (progressed) {
      wait_end(&wait); /* its comm's plan is still running (a finished one was charged above) */
      idle = 0, idle_since = 0;
      continue;
    }
    /* Reading the clock costs as much as a few polls, and most waits are shorter than that: read it
     * every 64th idle pass (every pass when oversubscribed, where we yield at once anyway). */
    if (oversubscribed || (++idle & 63) == 0) {
      t = ut_now_ns();
      if (!idle_since) {
        idle_since = check_since = mm_since = t;
        struct ncclComm* wc = bcomm ? bcomm : stuck;
        wait = (struct wait_rec){.comm = wc, .peer = -1, .since_ns = t, .tick = wc && wc->trace ? obs_ticks() : 0};
        if (blocked && bcomm)
          stall_waits_for((const struct ch_op*)(const void*)((char*)blocked - offsetof(struct ch_op, ctx)), &wait.peer);
      }
    }
    /* Not per poll: a mismatch or a poisoned connection only matters once we have waited a while,
     * and the check reads lines that peers write. */
    if (idle_since && t - mm_since > 20000) {
      mm_since = t;
      for (int i = 0; i < n; i++) {
        if (!plans[i] || !plans[i]->started) continue;
        plans[i]->status = mm_poll(plans[i]->comm, plans[i]);
        if (plans[i]->status != CH_OK) {
          wait_end_for(&wait, plans[i]);
          ch_status st = finish_plan(&plans[i]);
          if (i < err_at) err = st, err_at = i;
          remaining--;
        }
      }
      if (!remaining) break;
    }
    engine_wait(idle_since ? t - idle_since : 0, oversubscribed, blocked, bcomm);
    if (idle_since) stall_note(plans, n, t - idle_since, t); /* stall reports: what we wait for */
    if (stall_dump_requests() != dumps) { /* CHORUS_DUMP_SIGNAL */
      dumps = stall_dump_requests();
      for (int i = 0; i < n; i++)
        if (plans[i] && plans[i]->started)
          stall_report(plans[i], idle_since ? (double)(t - idle_since) / UT_NS_PER_S : 0, 1);
    }
    if (idle_since && t - idle_since > timeout_ns) {
      /* Nothing moved for the timeout: every started plan reports what it waits for and fails. A plan
       * still waiting for its ticket is behind one of those (or another thread's, which times out
       * itself); it must not finish out of ticket order, so it waits on. */
      for (int i = 0; i < n; i++) {
        if (!plans[i] || !plans[i]->started) continue;
        stall_report(plans[i], (double)(t - idle_since) / UT_NS_PER_S, 0);
        plans[i]->status = CH_TIMEOUT;
        wait_end_for(&wait, plans[i]);
        ch_status st = finish_plan(&plans[i]);
        if (i < err_at) err = st, err_at = i;
        remaining--;
      }
      idle_since = t;
    }
    if (t - check_since > 500 * UT_NS_PER_MS) { /* a dead peer is named within ~1 s */
      int again = 0; /* a peer just found gone: check once more after the next poll */
      for (int i = 0; i < n; i++) {
        if (!plans[i] || !plans[i]->started) continue;
        plans[i]->status = check_peers_alive(plans[i]->comm, blocked);
        if (plans[i]->status == CH_IN_PROGRESS) plans[i]->status = CH_OK, again = 1;
        if (plans[i]->status != CH_OK) {
          wait_end_for(&wait, plans[i]);
          ch_status st = finish_plan(&plans[i]);
          if (i < err_at) err = st, err_at = i;
          remaining--;
        }
      }
      check_since = again ? t - 500 * UT_NS_PER_MS : t;
    }
  }
  return err;
}
