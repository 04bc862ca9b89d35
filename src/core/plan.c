/* Plans: the tasks of one communicator from one group, split into per-channel operations grouped in
 * lanes, and the engine that runs them. */
#include <sched.h>
#include <signal.h>
#include <time.h>
#include <stdlib.h>
#include <string.h>

#include "../misc/log.h"
#include "../misc/param.h"
#include "../misc/utils.h"
#include "enqueue.h"

#if defined(__x86_64__) || defined(__i386__)
#define CH_CPU_RELAX() __builtin_ia32_pause()
#elif defined(__aarch64__)
#define CH_CPU_RELAX() __asm__ volatile("yield")
#else
#define CH_CPU_RELAX() __asm__ volatile("" ::: "memory")
#endif

static int is_coll(int f) { return f <= FUNC_ALLREDUCE; }

/* Expand AlltoAll/Gather/Scatter into send/recv tasks (a private list, freed by the caller). */
static ch_status expand_task(const struct ch_task* t, int rank, int nranks, struct ch_task** head,
                             struct ch_task** tail) {
  size_t esize = red_type_size(t->type), stride = t->count * esize;
  for (int p = 0; p < nranks; p++) {
    struct ch_task pair[2];
    int n = 0;
    const char* sb = t->sendbuff;
    char* rb = t->recvbuff;
    switch (t->func) {
      case FUNC_ALLTOALL:
        pair[n++] = (struct ch_task){FUNC_SEND, sb + p * stride, NULL, t->count, t->type, 0, p, t->comm, t->stream, 0};
        pair[n++] = (struct ch_task){FUNC_RECV, NULL, rb + p * stride, t->count, t->type, 0, p, t->comm, t->stream, 0};
        break;
      case FUNC_GATHER:
        if (p == t->root)
          pair[n++] = (struct ch_task){FUNC_SEND, sb, NULL, t->count, t->type, 0, p, t->comm, t->stream, 0};
        if (rank == t->root)
          pair[n++] = (struct ch_task){FUNC_RECV, NULL, rb + p * stride, t->count, t->type, 0, p, t->comm, t->stream, 0};
        break;
      case FUNC_SCATTER:
        if (rank == t->root)
          pair[n++] = (struct ch_task){FUNC_SEND, sb + p * stride, NULL, t->count, t->type, 0, p, t->comm, t->stream, 0};
        if (p == t->root)
          pair[n++] = (struct ch_task){FUNC_RECV, NULL, rb, t->count, t->type, 0, p, t->comm, t->stream, 0};
        break;
    }
    for (int i = 0; i < n; i++) {
      struct ch_task* c = malloc(sizeof(*c));
      if (!c) return CH_SYSTEM;
      *c = pair[i];
      if (*tail) (*tail)->next = c; else *head = c;
      *tail = c;
    }
  }
  return CH_OK;
}

static void op_init(struct ch_op* op, struct ncclComm* comm, const struct ch_task* t, struct red_op* red) {
  memset(op, 0, sizeof(*op));
  op->func = t->func;
  op->sendbuff = t->sendbuff;
  op->recvbuff = t->recvbuff;
  op->count = t->count;
  op->esize = red_type_size(t->type);
  op->root = t->root;
  op->rank = comm->rank;
  op->nranks = comm->nranks;
  op->ctx.esize = op->esize;
  op->ctx.red = red;
  op->ctx.scratch = comm->scratch;
  op->ctx.hdr = (struct xfer_hdr){comm->comm_hash, comm->seq, (uint32_t)t->func, (uint32_t)t->type, t->count,
                                  (uint32_t)t->op, t->root};
}

ch_status plan_build(struct ncclComm* comm, struct ch_task* tasks, struct ch_plan** out) {
  ch_status res = CH_OK;
  struct ch_task *xhead = NULL, *xtail = NULL;
  struct ch_plan* plan = NULL;
  struct red_op* reds = NULL;
  int *lane_of = NULL, *lane_n = NULL;
  /* Flatten: collectives stay, grouped p2p patterns become send/recv. */
  for (struct ch_task* t = tasks; t; t = t->next) {
    if (t->func == FUNC_ALLTOALL || t->func == FUNC_GATHER || t->func == FUNC_SCATTER) {
      CHECK_GOTO(expand_task(t, comm->rank, comm->nranks, &xhead, &xtail), res, fail);
    } else {
      struct ch_task* c = malloc(sizeof(*c));
      if (!c) { res = CH_SYSTEM; goto fail; }
      *c = *t;
      c->next = NULL;
      if (xtail) xtail->next = c; else xhead = c;
      xtail = c;
    }
  }
  int ntasks = 0;
  for (struct ch_task* t = xhead; t; t = t->next) ntasks++;

  plan = calloc(1, sizeof(*plan));
  int nlanes = CH_MAX_CHANNELS + 2 * comm->nranks, maxops = ntasks * CH_MAX_CHANNELS;
  reds = calloc((size_t)ntasks + 1, sizeof(struct red_op));
  lane_of = calloc((size_t)maxops + 1, sizeof(int));
  lane_n = calloc((size_t)nlanes, sizeof(int));
  if (!plan || !reds || !lane_of || !lane_n) { res = CH_SYSTEM; goto fail; }
  plan->ops = calloc((size_t)maxops + 1, sizeof(struct ch_op));
  if (!plan->ops) { res = CH_SYSTEM; goto fail; }
  plan->comm = comm;

  int ti = 0;
  for (struct ch_task* t = xhead; t; t = t->next, ti++) {
    size_t esize = red_type_size(t->type);
    if (is_coll(t->func)) {
      CHECK_GOTO(enq_red_op(comm, t->op, t->type, &reds[ti]), res, fail);
      comm->seq++;
    }
    int algo, proto, nch;
    size_t bytes = t->count * esize;
    tune_choose(comm, t->func, bytes, &algo, &proto, &nch);
    if (!is_coll(t->func) || comm->nranks == 1) nch = 1;
    size_t per = UT_ALIGN_UP(UT_DIV_UP(t->count, (size_t)nch), 64);
    for (int c = 0; c < nch; c++) {
      struct ch_op* op = &plan->ops[plan->nops++];
      op_init(op, comm, t, &reds[ti]);
      op->algo = algo;
      op->proto = proto;
      op->ctx.proto = proto;
      op->part_off = UT_MIN(t->count, (size_t)c * per);
      op->part_count = UT_MIN(t->count, op->part_off + per) - op->part_off;
      int lane;
      if (is_coll(t->func)) {
        struct ch_channel* ch = &comm->channels[c];
        op->ring = ch->ring;
        op->ring_index = ch->ring_index;
        op->ctx.in = &ch->recv;
        op->ctx.out = &ch->send;
        lane = c;
      } else if (t->func == FUNC_SEND) {
        op->ctx.out = &comm->p2p[t->root].send;
        lane = CH_MAX_CHANNELS + t->root;
      } else {
        op->ctx.in = &comm->p2p[t->root].recv;
        lane = CH_MAX_CHANNELS + comm->nranks + t->root;
      }
      op->chunk = prim_step_elems(proto, comm->sizes.buff[proto] / CH_STEPS, esize ? esize : 1);
      lane_of[plan->nops - 1] = lane;
      lane_n[lane]++;
    }
  }
  /* Keep only the lanes in use; their op lists share one array, in call order. */
  for (int l = 0; l < nlanes; l++) plan->nlanes += lane_n[l] > 0;
  plan->lanes = calloc((size_t)plan->nlanes + 1, sizeof(struct ch_lane));
  plan->lane_ops = calloc((size_t)plan->nops + 1, sizeof(struct ch_op*));
  if (!plan->lanes || !plan->lane_ops) { res = CH_SYSTEM; goto fail; }
  for (int l = 0, k = 0, at = 0; l < nlanes; l++) {
    if (!lane_n[l]) continue;
    plan->lanes[k].ops = plan->lane_ops + at;
    for (int i = 0; i < plan->nops; i++)
      if (lane_of[i] == l) plan->lanes[k].ops[plan->lanes[k].nops++] = &plan->ops[i];
    at += lane_n[l];
    k++;
  }
  plan->reds = reds;
  free(lane_of);
  free(lane_n);
  while (xhead) { struct ch_task* n = xhead->next; free(xhead); xhead = n; }
  *out = plan;
  return CH_OK;
fail:
  while (xhead) { struct ch_task* n = xhead->next; free(xhead); xhead = n; }
  free(lane_of);
  free(lane_n);
  if (plan) {
    plan->reds = reds;
    plan_free(plan);
  } else {
    free(reds);
  }
  if (res == CH_SYSTEM) WARN("could not build the execution plan: out of memory");
  return res;
}

void plan_free(struct ch_plan* plan) {
  if (!plan) return;
  free(plan->reds);
  free(plan->lane_ops);
  free(plan->lanes);
  free(plan->ops);
  free(plan);
}

/* Steps are computed lazily (nidx) when an op first runs: connections exist by then. */
static int lane_progress(struct ch_lane* ln, struct prim_ctx** blocked) {
  int progressed = 0;
  while (ln->cur < ln->nops) {
    struct ch_op* op = ln->ops[ln->cur];
    if (op->nidx == 0 && op->idx == 0) op->nidx = algo_nsteps(op) + 1; /* +1: "computed" marker */
    if (op->idx + 1 >= op->nidx) { ln->cur++; progressed = 1; continue; }
    struct prim p;
    algo_step(op, op->idx, &p);
    if (!prim_try(&op->ctx, &p)) {
      if (!*blocked) *blocked = &op->ctx;
      break;
    }
    op->idx++;
    progressed = 1;
  }
  return progressed;
}

/* A peer process that has died never advances its FIFOs: look for it when we stop making progress. */
static ch_status check_peers_alive(struct ncclComm* comm) {
  for (int r = 0; r < comm->nranks; r++) {
    if (comm->peer_tp[r] != TP_SHM) continue;
    if (!ut_pid_alive(comm->peers[r].pid)) {
      WARN("rank %d (pid %d on %s) has exited while rank %d was waiting for it in a collective", r,
           comm->peers[r].pid, comm->peers[r].hostname, comm->rank);
      return CH_REMOTE;
    }
  }
  return CH_OK;
}

/* Waiting policy of the engine: spin while the peer is likely mid-step (cheap, lowest latency), then
 * yield, then sleep so idle ranks stop eating CPU. Oversubscribed hosts skip spinning: the peer we wait
 * for may need our core. */
static void engine_wait(uint64_t idle_ns, int oversubscribed, struct prim_ctx* blocked) {
  static _Thread_local int64_t spin_ns = -1, yield_ns;
  if (spin_ns < 0) {
    spin_ns = param_int(PARAM_SPIN_US) * 1000;
    yield_ns = spin_ns + param_int(PARAM_YIELD_US) * 1000;
  }
  if (!oversubscribed && (int64_t)idle_ns < spin_ns) {
    for (int i = 0; i < 8; i++) CH_CPU_RELAX();
  } else if (blocked) {
    /* Sleep in the kernel until the peer posts (it wakes us), re-polling everything each ms. */
    prim_wait(blocked, 1000);
  } else if ((int64_t)idle_ns < yield_ns) {
    sched_yield();
  } else {
    struct timespec ts = {0, 50000};
    nanosleep(&ts, NULL);
  }
}

/* The last touch of a plan's communicator: after done_ticket moves, the comm may be freed. */
static void finish_plan(struct ch_plan* pl) {
  pl->done = 1;
  if (pl->status != CH_OK) {
    if (pl->status == CH_INTERNAL && pl->comm->abort_flag)
      INFO(LOG_COLL, "operation on rank %d stopped: communicator aborted", pl->comm->rank);
    comm_set_async_error(pl->comm, pl->status);
  }
  atomic_fetch_add(&pl->comm->done_ticket, 1);
}

ch_status plan_exec(struct ch_plan** plans, int n) {
  int remaining = n;
  int oversubscribed = plans[0]->comm->oversubscribed;
  uint64_t idle = 0, idle_since = 0, check_since = 0;
  while (remaining > 0) {
    int progressed = 0;
    struct prim_ctx* blocked = NULL;
    for (int i = 0; i < n; i++) {
      struct ch_plan* pl = plans[i];
      if (pl->done) continue;
      struct ncclComm* comm = pl->comm;
      if (!pl->started) {
        if (atomic_load(&comm->done_ticket) != pl->ticket) continue;
        pl->started = 1;
      }
      int busy = 0;
      if (comm->abort_flag) {
        pl->status = CH_INTERNAL;
      } else {
        for (int l = 0; l < pl->nlanes; l++) {
          struct ch_lane* ln = &pl->lanes[l];
          if (ln->cur >= ln->nops) continue;
          progressed |= lane_progress(ln, &blocked);
          busy |= ln->cur < ln->nops;
        }
      }
      if (!busy || pl->status != CH_OK) {
        finish_plan(pl);
        remaining--;
        progressed = 1;
      }
    }
    if (progressed) {
      idle = 0;
      continue;
    }
    uint64_t t = ut_now_ns();
    if (idle++ == 0) idle_since = check_since = t;
    engine_wait(t - idle_since, oversubscribed, blocked);
    if (t - check_since > 1000000000ull) {
      for (int i = 0; i < n; i++) {
        if (plans[i]->done || !plans[i]->started) continue;
        plans[i]->status = check_peers_alive(plans[i]->comm);
        if (plans[i]->status != CH_OK) {
          finish_plan(plans[i]);
          remaining--;
        }
      }
      check_since = t;
    }
  }
  for (int i = 0; i < n; i++)
    if (plans[i]->status != CH_OK) return plans[i]->status;
  return CH_OK;
}
