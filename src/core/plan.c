/* Plans: the tasks of one communicator from one group, split into per-channel operations grouped in
 * lanes, built once and reused by calls of the same shape. The engine that runs them is engine.c. */
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
/* The per-call selection rides above it for the same reason: ranks whose calls select differently
 * (an application bug: ncclCollConfig_t must match) fail as a mismatch naming both selections rather
 * than run different algorithms against each other. */
static uint32_t hdr_op_level(int op, int repro, unsigned sel) {
  return hdr_op(op) | (uint32_t)repro << XFER_OP_REPRO_SHIFT | (uint32_t)sel << XFER_OP_SEL_SHIFT;
}

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
    op->ctx.hdr = (struct xfer_hdr){comm->comm_hash, 0, (uint32_t)t->func,
                                    (uint32_t)t->type | (uint32_t)t->how.wire << XFER_TYPE_WIRE_SHIFT, t->count,
                                    hdr_op_level(t->op, t->how.repro, t->sel), t->root};
  else if (t->origin == FUNC_ALLTOALLV) /* both ends name the pair: the sender as root, the receiver as op */
    op->ctx.hdr = (struct xfer_hdr){comm->comm_hash, 0, FUNC_ALLTOALLV, (uint32_t)t->type, t->count,
                                    (uint32_t)(t->func == FUNC_SEND ? t->root : comm->rank),
                                    t->func == FUNC_SEND ? comm->rank : t->root};
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

/* Elements per FIFO step of the connections op->algo runs on (tune_step_elems), or fewer where a tuner
 * plugin chose chunk bytes for the call (tune_choice.chunk, checked to fit a step; 0: none). */
void op_set_chunk(const struct ncclComm* comm, struct ch_op* op, int coll, size_t esize, size_t chunk) {
  op->chunk = tune_step_elems(comm, coll, op->algo, op->proto, esize);
  if (chunk && esize && chunk / esize < op->chunk) op->chunk = chunk / esize;
  op->tmp_stride = op->chunk * esize; /* Owner's slots: one step each (init.c sizes repro_scratch so) */
  if (op->algo == ALGO_OWNER) op->tmp = comm->repro_scratch;
}

int plan_wave_of(int rank, int peer, int nranks, int width) {
  int d = ((peer - rank) % nranks + nranks) % nranks, key = d < nranks - d ? d : nranks - d;
  return key == 0 || width <= 0 ? 0 : (key - 1) / width;
}

ch_status plan_build(struct ncclComm* comm, struct ch_task* tasks, struct ch_plan** out) {
  return plan_build_wave(comm, tasks, 0, 0, out);
}

ch_status plan_build_wave(struct ncclComm* comm, struct ch_task* tasks, int wave, int width, struct ch_plan** out) {
  /* Flatten: collectives stay, grouped p2p patterns become send/recv. */
  int ntasks = 0;
  for (struct ch_task* t = tasks; t; t = t->next) {
    if (t->hostless) continue;
    if (t->func == FUNC_ALLTOALL || t->func == FUNC_GATHER || t->func == FUNC_SCATTER)
      CHECK(expand_task(t, comm->rank, comm->nranks, &ntasks));
    else
      CHECK(push_task(&ntasks, t));
  }
  if (width > 0) { /* one wave: its sends and receives; the collectives go with the first */
    int kept = 0;
    for (int i = 0; i < ntasks; i++) {
      const struct ch_task* t = &bs.tasks[i];
      int w = is_coll(t->func) ? 0 : plan_wave_of(comm->rank, t->root, comm->nranks, width);
      if (w == wave) bs.tasks[kept++] = *t;
    }
    ntasks = kept;
  }
  /* Choose algorithm/protocol/channels once per task (kept in the task), and size the plan. */
  int nlanes = CH_MAX_CHANNELS + 2 * comm->nranks, nops = 0, nused = 0;
  if (!grow((void**)&bs.lane_n, &bs.lane_cap, nlanes, sizeof(int))) return CH_SYSTEM;
  memset(bs.lane_n, 0, sizeof(int) * (size_t)nlanes);
  for (int i = 0; i < ntasks; i++) {
    struct ch_task* t = &bs.tasks[i];
    /* The same on every rank, whatever else its group holds: RecDbl, Rabenseifner and Tree have
     * FIFOs of their own (comm_apeer), apart from the group's sends and receives. */
    tune_choose_sel(comm, t->func, t->count * red_type_size(t->type), red_type_size(t->type),
                    tune_repro_level(comm, t->func, t->type), t->sel, t->wire, &t->how);
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
    if (t->part == 2) continue; /* counted with its call's first part */
    plan->user_bytes += (uint64_t)(t->part ? t->call_count : t->count) * red_type_size(t->type);
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
    plan->key_sel = bs.tasks[0].sel;
    plan->key_wire = bs.tasks[0].wire;
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
      op->ctx.wire = (uint8_t)t->how.wire;
      op->ctx.wire_all = (uint8_t)comm->wire_all;
      op->ctx.wire_type = t->type;
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
        op->cma = comm->cma;
        op->fallback_algo = t->how.fallback;
        op->outcome = &plan->outcome[i];
        if (c > 0 && op->algo == ALGO_DIRECT) op->algo = t->how.fallback, op->standby = 1; /* channel c's share */
        if (op->algo == ALGO_DIRECT) direct_describe(op);
      } else if (t->func == FUNC_SEND) {
        op->ctx.out = &comm->p2p[t->root].send;
      } else {
        op->ctx.in = &comm->p2p[t->root].recv;
      }
      /* the tuner's chunk is for the chosen algorithm: not for Direct's standby ops of its fallback */
      op_set_chunk(comm, op, is_coll(t->func), esize, op->algo == t->how.algo ? t->how.chunk : 0);
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
  if (pl->key_func != t->func || pl->key_count != t->count || pl->key_type != t->type || pl->key_root != t->root ||
      pl->key_sel != t->sel || pl->key_wire != t->wire) {
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
    op->ctx.hdr.op = hdr_op_level(t->op, op->ctx.repro, t->sel);
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
