/* Plans: the tasks of one communicator from one group, split into per-channel operations grouped in
 * lanes, and the engine that runs them. */
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

#if defined(__x86_64__) || defined(__i386__)
#define CH_CPU_RELAX() __builtin_ia32_pause()
#elif defined(__aarch64__)
#define CH_CPU_RELAX() __asm__ volatile("yield")
#else
#define CH_CPU_RELAX() __asm__ volatile("" ::: "memory")
#endif

static int is_coll(int f) { return f <= FUNC_ALLREDUCE; }

/* Per-thread scratch reused by every plan_build, so the hot path does one allocation per plan. */
struct build_scratch {
  struct ch_task* tasks;
  int cap;
  int* lane_n;
  int lane_cap;
};
static _Thread_local struct build_scratch bs;
static pthread_key_t bs_key;
static pthread_once_t bs_once = PTHREAD_ONCE_INIT;

/* Thread-local buffers are freed when their thread exits (a key destructor runs in that thread). */
static _Thread_local struct ch_plan* cached_plan; /* one freed plan block kept for reuse */

static void bs_release(void* unused) {
  (void)unused;
  free(bs.tasks);
  free(bs.lane_n);
  free(cached_plan);
  cached_plan = NULL;
  memset(&bs, 0, sizeof(bs));
}
static void bs_key_init(void) { pthread_key_create(&bs_key, bs_release); }

static int grow(void** p, int* cap, int need, size_t elem) {
  if (need <= *cap) return 1;
  if (!*cap) {
    pthread_once(&bs_once, bs_key_init);
    pthread_setspecific(bs_key, &bs);
  }
  int n = *cap ? *cap : 16;
  while (n < need) n *= 2;
  void* q = realloc(*p, (size_t)n * elem);
  if (!q) return 0;
  *p = q;
  *cap = n;
  return 1;
}

static ch_status push_task(int* n, const struct ch_task* t) {
  if (!grow((void**)&bs.tasks, &bs.cap, *n + 1, sizeof(struct ch_task))) return CH_SYSTEM;
  bs.tasks[(*n)++] = *t;
  return CH_OK;
}

/* Expand AlltoAll/Gather/Scatter into send/recv tasks. */
static ch_status expand_task(const struct ch_task* t, int rank, int nranks, int* n) {
  size_t esize = red_type_size(t->type), stride = t->count * esize;
  const char* sb = t->sendbuff;
  char* rb = t->recvbuff;
  struct ch_task send = *t, recv = *t;
  send.func = FUNC_SEND, recv.func = FUNC_RECV;
  send.origin = recv.origin = t->func; /* both ends of each pair put the same call in the header */
  send.origin_root = recv.origin_root = t->func == FUNC_ALLTOALL ? -1 : t->root;
  for (int p = 0; p < nranks; p++) {
    send.root = recv.root = p;
    switch (t->func) {
      case FUNC_ALLTOALL:
        send.sendbuff = sb + p * stride, recv.recvbuff = rb + p * stride;
        CHECK(push_task(n, &send));
        CHECK(push_task(n, &recv));
        break;
      case FUNC_GATHER:
        send.sendbuff = sb, recv.recvbuff = rb + p * stride;
        if (p == t->root) CHECK(push_task(n, &send));
        if (rank == t->root) CHECK(push_task(n, &recv));
        break;
      case FUNC_SCATTER:
        send.sendbuff = sb + p * stride, recv.recvbuff = rb;
        if (rank == t->root) CHECK(push_task(n, &send));
        if (p == t->root) CHECK(push_task(n, &recv));
        break;
    }
  }
  return CH_OK;
}

/* The op as a call's header names it: a PreMulSum op's number is this rank's own (ranks create and
 * destroy them in their own order), so every such op describes the call alike, as Direct's slots do. */
static uint32_t hdr_op(int op) { return op >= ncclNumOps ? (uint32_t)ncclNumOps : (uint32_t)op; }
/* ... with the call's reproducible level: ranks whose levels differ run different algorithms, and
 * find so as a mismatch named by both calls instead of waiting for each other. */
static uint32_t hdr_op_level(int op, int repro) { return hdr_op(op) | (uint32_t)repro << XFER_OP_REPRO_SHIFT; }

static void op_init(struct ch_op* op, struct ncclComm* comm, const struct ch_task* t, struct red_op* red) {
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
  /* hdr.seq is filled when the plan starts (plan_start): a call counts only once it runs. A send and
   * its recv describe the same thing, the call that made them (see struct xfer_hdr). */
  if (is_coll(t->func))
    op->ctx.hdr = (struct xfer_hdr){comm->comm_hash, 0, (uint32_t)t->func, (uint32_t)t->type, t->count,
                                    hdr_op_level(t->op, t->how.repro), t->root};
  else
    op->ctx.hdr = (struct xfer_hdr){comm->comm_hash, 0, (uint32_t)(t->origin ? t->origin : FUNC_SENDRECV),
                                    (uint32_t)t->type, t->count, 0, t->origin ? t->origin_root : -1};
}

/* Ops a task becomes: one per channel, or Direct's one op plus its standby ops (tune_choice.fb_nch). */
static int task_nops(const struct ch_task* t) {
  return t->how.algo == ALGO_DIRECT && t->how.fb_nch > 1 ? t->how.fb_nch : t->how.nch;
}

static int lane_of(const struct ncclComm* comm, const struct ch_task* t, int c) {
  if (is_coll(t->func)) return c;
  return CH_MAX_CHANNELS + (t->func == FUNC_SEND ? 0 : comm->nranks) + t->root;
}

/* How peers reach this rank's buffers, for Direct: by address for threads; processes look the
 * buffers up among the ncclMemAlloc allocations they can map. */
static void direct_describe(struct ch_op* op) {
  size_t bytes = op->count * op->esize;
  if (!op->clique->procs) {
    op->dsend = (struct direct_buf){.addr = (uint64_t)(uintptr_t)op->sendbuff};
    op->drecv = (struct direct_buf){.addr = (uint64_t)(uintptr_t)op->recvbuff};
    return;
  }
  mem_describe(op->sendbuff, bytes, &op->dsend);
  mem_describe(op->recvbuff, bytes, &op->drecv);
}

/* Elements per FIFO step of the connections op->algo runs on: the rings', or the per-peer ones
 * (RecDbl, Rabenseifner, Tree, and sends and receives). */
static void op_set_chunk(const struct ncclComm* comm, struct ch_op* op, int coll, size_t esize) {
  const struct tp_sizes* sz = coll && !algo_uses_peers(op->algo) ? &comm->sizes : &comm->p2p_sizes;
  op->chunk = prim_step_elems(op->proto, sz->buff[op->proto] / CH_STEPS, esize ? esize : 1);
  op->tmp_stride = op->chunk * esize; /* Owner's slots: one step each (init.c sizes repro_scratch so) */
  if (op->algo == ALGO_OWNER) op->tmp = comm->repro_scratch;
}

ch_status plan_build(struct ncclComm* comm, struct ch_task* tasks, struct ch_plan** out) {
  /* Flatten: collectives stay, grouped p2p patterns become send/recv. */
  int ntasks = 0;
  for (struct ch_task* t = tasks; t; t = t->next) {
    if (t->hostless) continue;
    if (t->func == FUNC_ALLTOALL || t->func == FUNC_GATHER || t->func == FUNC_SCATTER)
      CHECK(expand_task(t, comm->rank, comm->nranks, &ntasks));
    else
      CHECK(push_task(&ntasks, t));
  }
  /* Choose algorithm/protocol/channels once per task (kept in the task), and size the plan. */
  int nlanes = CH_MAX_CHANNELS + 2 * comm->nranks, nops = 0, nused = 0;
  if (!grow((void**)&bs.lane_n, &bs.lane_cap, nlanes, sizeof(int))) return CH_SYSTEM;
  memset(bs.lane_n, 0, sizeof(int) * (size_t)nlanes);
  for (int i = 0; i < ntasks; i++) {
    struct ch_task* t = &bs.tasks[i];
    /* The same on every rank, whatever else its group holds: RecDbl, Rabenseifner and Tree have
     * FIFOs of their own (comm_apeer), apart from the group's sends and receives. */
    tune_choose(comm, t->func, t->count * red_type_size(t->type), tune_repro_level(comm, t->func, t->type),
                &t->how);
    if (t->how.repro && !comm->repro_scratch) {
      /* Owner's slots (a step per rank), made once; only this comm's calling thread builds its plans */
      comm->repro_scratch = malloc(comm->peer_step_bytes * (size_t)comm->nranks);
      if (!comm->repro_scratch) {
        WARN("could not allocate %zu bytes for the reproducible reductions' slots",
             comm->peer_step_bytes * (size_t)comm->nranks);
        return CH_SYSTEM;
      }
    }
    if (!is_coll(t->func) || comm->nranks == 1) t->how.nch = 1, t->how.fb_nch = 1;
    if (is_coll(t->func)) fr_choice(comm, t->fr_id, &t->how);
    for (int c = 0; c < task_nops(t); c++) nused += bs.lane_n[lane_of(comm, t, c)]++ == 0;
    nops += task_nops(t);
  }
  size_t bytes = sizeof(struct ch_plan) + sizeof(struct ch_op) * (size_t)nops +
                 sizeof(struct ch_lane) * (size_t)nused + sizeof(struct ch_op*) * (size_t)nops +
                 sizeof(struct red_op) * (size_t)ntasks + sizeof(_Atomic int) * (size_t)ntasks;
  char* mem;
  if (cached_plan && cached_plan->alloc_bytes >= bytes) {
    size_t have = cached_plan->alloc_bytes;
    mem = (char*)cached_plan;
    cached_plan = NULL;
    memset(mem, 0, bytes);
    bytes = have;
  } else {
    bytes = UT_MAX(bytes, 2048);
    mem = calloc(1, bytes);
  }
  if (!mem) {
    WARN("could not build the execution plan: out of memory (%zu bytes)", bytes);
    return CH_SYSTEM;
  }
  struct ch_plan* plan = (struct ch_plan*)mem;
  for (struct ch_task* t = tasks; t; t = t->next) { /* the group's calls on comm, hostless ones too */
    if (t->fr_id && !plan->fr_lo) plan->fr_lo = t->fr_id;
    if (t->fr_id) plan->fr_hi = t->fr_id;
    plan->user_bytes += (uint64_t)t->count * red_type_size(t->type);
    plan->ncalls++;
  }
  plan->ops = (struct ch_op*)(plan + 1);
  plan->lanes = (struct ch_lane*)(plan->ops + nops);
  plan->lane_ops = (struct ch_op**)(plan->lanes + nused);
  plan->reds = (struct red_op*)(plan->lane_ops + nops);
  plan->outcome = (_Atomic int*)(plan->reds + ntasks);
  plan->comm = comm;
  plan->alloc_bytes = bytes;
  plan->nlanes = nused;
  if (ntasks == 1 && is_coll(bs.tasks[0].func)) {
    plan->reusable = 1;
    plan->key_func = bs.tasks[0].func, plan->key_type = bs.tasks[0].type, plan->key_root = bs.tasks[0].root;
    plan->key_count = bs.tasks[0].count;
    plan->first_algo = bs.tasks[0].how.algo;
  }
  /* lane_n becomes each used lane's index; lanes share lane_ops in lane-id order. */
  int* lane_idx = bs.lane_n;
  for (int l = 0, k = 0, at = 0; l < nlanes; l++) {
    if (!lane_idx[l]) {
      lane_idx[l] = -1;
      continue;
    }
    plan->lanes[k].ops = plan->lane_ops + at;
    at += lane_idx[l];
    lane_idx[l] = k++;
  }

  for (int i = 0; i < ntasks; i++) {
    struct ch_task* t = &bs.tasks[i];
    size_t esize = red_type_size(t->type);
    if (is_coll(t->func)) {
      plan->reds[i] = t->red;
      plan->ncoll++;
    }
    int nt_ops = task_nops(t);
    atomic_init(&plan->outcome[i], DIRECT_OUTCOME_OPEN);
    size_t per = UT_ALIGN_UP(UT_DIV_UP(t->count, (size_t)nt_ops), 64);
    for (int c = 0; c < nt_ops; c++) {
      struct ch_op* op = &plan->ops[plan->nops++];
      op_init(op, comm, t, &plan->reds[i]);
      if (is_coll(t->func)) op->ctx.hdr.seq = (uint64_t)plan->ncoll; /* 1-based, relative to the start */
      op->algo = t->how.algo;
      op->proto = op->ctx.proto = t->how.proto;
      op->ctx.nt_dst = t->how.nt;
      op->ctx.repro = t->how.repro;
      op->part_off = UT_MIN(t->count, (size_t)c * per);
      op->part_count = UT_MIN(t->count, op->part_off + per) - op->part_off;
      if (is_coll(t->func)) {
        struct ch_channel* ch = &comm->channels[c];
        op->channel = c;
        op->ring = ch->ring;
        op->ring_index = ch->ring_index;
        op->trees = comm->trees;
        op->ntrees = comm->ntrees;
        op->tmp = comm->peer_scratch; /* only one Tree Reduce op runs at a time: it has one channel */
        op->ctx.in = &ch->recv;
        op->ctx.out = &ch->send;
        op->clique = comm->clique;
        op->maps = comm->maps;
        op->fallback_algo = t->how.fallback;
        op->outcome = &plan->outcome[i];
        if (c > 0 && op->algo == ALGO_DIRECT) op->algo = t->how.fallback, op->standby = 1; /* channel c's share */
        if (op->algo == ALGO_DIRECT) direct_describe(op);
      } else if (t->func == FUNC_SEND) {
        op->ctx.out = &comm->p2p[t->root].send;
      } else {
        op->ctx.in = &comm->p2p[t->root].recv;
      }
      op_set_chunk(comm, op, is_coll(t->func), esize);
      struct ch_lane* ln = &plan->lanes[lane_idx[lane_of(comm, t, c)]];
      ln->ops[ln->nops++] = op;
    }
  }
  for (int k = 0; comm->trace && plan->nops > 1 && k < plan->nops; k++) plan->ops[k].traced = 1;
  *out = plan;
  return CH_OK;
}

void plan_free(struct ch_plan* plan) {
  if (!plan) return;
  if (cached_plan || bs.cap == 0) { /* bs.cap == 0: this thread has no exit hook to free a cache */
    free(plan);
    return;
  }
  cached_plan = plan;
}

/* Training loops repeat the same call: building its plan again (tuning, lanes, chunking) was most of
 * the host time of a small collective. Only buffers, reduction, sequence number and progress change. */
struct ch_plan* plan_reuse(struct ncclComm* comm, const struct ch_task* t) {
  /* A call with no host operation has an empty plan: a cached one (an exchange of descriptions of
   * the same size) would run an operation its peers do not. */
  if (t->hostless || !atomic_load_explicit(&comm->reuse_plan, memory_order_relaxed)) return NULL;
  /* Take the plan before reading it: a stream thread finishing a newer plan may replace and free it. */
  struct ch_plan* pl = atomic_exchange(&comm->reuse_plan, NULL);
  if (!pl) return NULL;
  if (pl->key_func != t->func || pl->key_count != t->count || pl->key_type != t->type || pl->key_root != t->root) {
    struct ch_plan* none = NULL;
    if (!atomic_compare_exchange_strong(&comm->reuse_plan, &none, pl)) plan_free(pl); /* a newer one came */
    return NULL;
  }
  pl->reds[0] = t->red;
  pl->fr_lo = pl->fr_hi = t->fr_id;
  pl->user_bytes = (uint64_t)t->count * red_type_size(t->type), pl->ncalls = 1;
  fr_choice(comm, t->fr_id, &(struct tune_choice){.algo = pl->first_algo, .proto = pl->ops[0].proto, .nch = pl->nops});
  atomic_store(&pl->outcome[0], DIRECT_OUTCOME_OPEN);
  pl->started = pl->done = 0;
  pl->status = CH_OK;
  for (int l = 0; l < pl->nlanes; l++) pl->lanes[l].cur = 0;
  for (int k = 0; k < pl->nops; k++) {
    struct ch_op* op = &pl->ops[k];
    op->sendbuff = t->sendbuff;
    op->recvbuff = t->recvbuff;
    op->idx = 0, op->step_at = 0, op->t0 = 0; /* new buffers: no step computed for them yet */
    if (!op->standby && op->algo != pl->first_algo) op->algo = pl->first_algo, op->nidx = 0; /* Direct fell back */
    if (op->algo == ALGO_DIRECT) direct_describe(op);
    if (op->algo == ALGO_OWNER) op->nidx = 0; /* its step count depends on in place or not (owner.c) */
    op->ctx.hdr.seq = 1; /* the plan's only collective; made absolute by plan_start */
    op->ctx.hdr.op = hdr_op_level(t->op, op->ctx.repro);
    op->ctx.wait_word = NULL;
    op->ctx.wait_sleeping = NULL;
  }
  return pl;
}

/* A plan is one allocation whose pointers are into itself or the comm's: a copy written back over it
 * at the same address gives the plan as it was, ready to run again. */
void* plan_snapshot(const struct ch_plan* pl) {
  void* s = malloc(pl->alloc_bytes);
  if (s) memcpy(s, pl, pl->alloc_bytes);
  return s;
}

void plan_restore(struct ch_plan* pl, const void* snapshot) {
  memcpy(pl, snapshot, ((const struct ch_plan*)snapshot)->alloc_bytes);
}

/* Only a plan that ran to completion is known to be connected and correct: one that was built but
 * never launched (its connection setup failed, or another call of its group failed) is freed. */
void plan_release(struct ch_plan* plan) {
  if (!plan || plan->persistent) return; /* a captured call's: its owner frees it */
  if (plan->reusable && plan->done && plan->status == CH_OK) /* the newest plan is the likeliest to repeat */
    plan = atomic_exchange(&plan->comm->reuse_plan, plan);
  plan_free(plan);
}

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
        op_set_chunk(comm, op, 1, op->esize); /* before counting its steps */
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
      uint64_t b = (uint64_t)p->nelem * op->ctx.esize;
      if (p->send) obs_moved(op->ctx.out, b);
      if (p->recv) obs_moved(op->ctx.in, b);
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
    /* A pid from another PID namespace (a container) means nothing here. */
    uint64_t ns = comm->peers[comm->rank].pid_ns;
    if (ns == 0 || comm->peers[r].pid_ns != ns) continue;
    if (!ut_pid_alive(comm->peers[r].pid)) {
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
    spin_ns = param_int(PARAM_SPIN_US) * 1000;
    yield_ns = param_int(PARAM_YIELD_US) * 1000;
  }
  if (!oversubscribed && (int64_t)idle_ns < spin_ns) {
    CH_CPU_RELAX();
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
    if (is_coll(op->func)) {
      op->ctx.hdr.seq += base;
      if (!first) first = &op->ctx.hdr;
    }
    op->ctx.tag = xfer_tag(&op->ctx.hdr);
  }
  if (first) mm_publish(comm, first); /* the group's first collective stands for it */
  fr_start(comm, pl->fr_lo, pl->fr_hi, base);
  if (comm->prof) prof_plan_start(comm, pl->fr_lo, pl->fr_hi);
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
  fr_end(comm, pl->fr_lo, pl->fr_hi, st);
  if (comm->prof) prof_plan_end(comm, pl->fr_lo, pl->fr_hi, st);
  if (comm->trace) trace_calls(comm, pl->fr_lo, pl->fr_hi);
  obs_add(&comm->ctr_calls, (uint64_t)pl->ncalls); /* plans of a comm finish one at a time (tickets) */
  obs_add(&comm->ctr_bytes, pl->user_bytes);
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
        if (plans[i] && plans[i]->started) stall_report(plans[i], idle_since ? (double)(t - idle_since) / 1e9 : 0, 1);
    }
    if (idle_since && t - idle_since > timeout_ns) {
      /* Nothing moved for the timeout: every started plan reports what it waits for and fails. A plan
       * still waiting for its ticket is behind one of those (or another thread's, which times out
       * itself); it must not finish out of ticket order, so it waits on. */
      for (int i = 0; i < n; i++) {
        if (!plans[i] || !plans[i]->started) continue;
        stall_report(plans[i], (double)(t - idle_since) / 1e9, 0);
        plans[i]->status = CH_TIMEOUT;
        wait_end_for(&wait, plans[i]);
        ch_status st = finish_plan(&plans[i]);
        if (i < err_at) err = st, err_at = i;
        remaining--;
      }
      idle_since = t;
    }
    if (t - check_since > 500000000ull) { /* a dead peer is named within ~1 s */
      for (int i = 0; i < n; i++) {
        if (!plans[i] || !plans[i]->started) continue;
        plans[i]->status = check_peers_alive(plans[i]->comm, blocked);
        if (plans[i]->status != CH_OK) {
          wait_end_for(&wait, plans[i]);
          ch_status st = finish_plan(&plans[i]);
          if (i < err_at) err = st, err_at = i;
          remaining--;
        }
      }
      check_since = t;
    }
  }
  return err;
}
