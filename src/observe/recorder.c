/* The flight recorder: per communicator, a ring of its last N calls (CHORUS_FLIGHT_RECORDER=N), each
 * with its arguments, the algorithm, protocol and channels chosen, and when it was queued, started and
 * finished, so that a dump after a timeout, a mismatch or a dead peer shows what every rank was doing.
 *
 * Cost: the 8 B AllReduce takes a third of a microsecond on two ranks, so no lock and no system clock
 * per call: times are CPU ticks (obs_ticks), converted when written out, and each slot is a seqlock.
 * Writers of a slot never overlap: the thread in a call on the comm fills it (fr_enqueue, fr_choice:
 * core/group.c and core/plan.c, under comm_enter) before it hands the plan on; the thread that runs the
 * plan (the caller, a host stream's or the staging bridge) then marks it started and finished; a
 * group that never ran marks its own calls failed. A slot is reused only once its call has finished
 * (a terminal state, never written again); a call that finds its slot still busy (more calls in flight
 * than the ring holds) is not recorded, and counted. Readers (dumps: a timeout, the stall query
 * service, the CHORUS_DUMP_SIGNAL thread) copy a slot and retry while its version moves. */
#include <stdlib.h>
#include <string.h>

#include "../misc/log.h"
#include "../misc/utils.h"
#include "observe.h"

const char* const fr_state_names[FR_NSTATES] = {"queued", "started", "done", "failed", "launched"};

/* Small fields packed so that a reader's copy is a handful of loads. */
#define HOW_NONE 0xffffu
struct fr_slot {
  _Atomic uint64_t ver; /* odd while a writer changes the slot */
  _Atomic uint64_t id, seq, count, t_enq, t_start, t_end;
  _Atomic uint64_t shape; /* func | type << 8 | op << 16 | exec << 48 | hostless << 56; root: below */
  _Atomic int32_t root;
  _Atomic uint32_t how;   /* algo | proto << 8 | nch << 16; HOW_NONE: not chosen */
  _Atomic uint32_t state; /* enum fr_state | (status + 128) << 8 */
  _Atomic uint64_t tag;   /* ncclCollConfig_t.userProfilerTag */
  _Atomic uint32_t sel;   /* per-call algSelection */
};

struct fr_ring {
  uint64_t next_id;          /* ids handed out so far (the comm's calling thread only) */
  _Atomic uint64_t last_id;  /* next_id as readers see it */
  _Atomic uint64_t skipped;  /* calls not recorded: their slot was still in flight */
  int cap;
  struct fr_slot s[];
};

#define LD(x) atomic_load_explicit(&(x), memory_order_relaxed)
#define ST(x, v) atomic_store_explicit(&(x), (v), memory_order_relaxed)

static void w_begin(struct fr_slot* s) {
  ST(s->ver, LD(s->ver) + 1);
  atomic_thread_fence(memory_order_release);
}
static void w_end(struct fr_slot* s) { atomic_store_explicit(&s->ver, LD(s->ver) + 1, memory_order_release); }

static int terminal(uint32_t st) { return (st & 0xff) == FR_DONE || (st & 0xff) == FR_FAILED || (st & 0xff) == FR_LAUNCHED; }
static uint32_t st_pack(int state, ch_status status) { return (uint32_t)state | (uint32_t)((int)status + 128) << 8; }

struct fr_ring* fr_create(int cap) {
  if (cap <= 0) return NULL;
  struct fr_ring* fr = calloc(1, sizeof(*fr) + sizeof(struct fr_slot) * (size_t)cap);
  if (!fr) {
    WARN("flight recorder: could not allocate %d entries; recording is off for this communicator", cap);
    return NULL;
  }
  fr->cap = cap;
  for (int i = 0; i < cap; i++) ST(fr->s[i].state, st_pack(FR_DONE, CH_OK)); /* free */
  obs_ticks_init();
  return fr;
}

void fr_free(struct fr_ring* fr) { free(fr); }

int fr_capacity(const struct ncclComm* comm) { return comm->fr ? comm->fr->cap : 0; }

static struct fr_slot* slot(struct fr_ring* fr, uint64_t id) {
  struct fr_slot* s = &fr->s[(id - 1) % (uint64_t)fr->cap];
  return LD(s->id) == id ? s : NULL;
}

uint64_t fr_enqueue(struct ncclComm* comm, const struct ch_task* t, int runs_now) {
  struct fr_ring* fr = comm->fr;
  if (!fr) return 0;
  uint64_t id = ++fr->next_id;
  atomic_store_explicit(&fr->last_id, id, memory_order_release);
  struct fr_slot* s = &fr->s[(id - 1) % (uint64_t)fr->cap];
  if (!terminal(atomic_load_explicit(&s->state, memory_order_acquire))) { /* its call is still in flight */
    atomic_fetch_add_explicit(&fr->skipped, 1, memory_order_relaxed);
    return 0;
  }
  /* A call that runs at once (no group, the calling thread's engine) is timed when it starts. */
  uint64_t now = runs_now && !t->noop ? 0 : obs_ticks();
  w_begin(s);
  /* The first of the sends and receives one call became stands for that call (api/alltoallv.c). */
  int func = t->part ? t->origin : t->func, root = t->part ? -1 : t->root;
  ST(s->id, id), ST(s->seq, 0), ST(s->count, (uint64_t)(t->part ? t->call_count : t->count));
  ST(s->t_enq, now), ST(s->t_start, t->noop ? now : 0), ST(s->t_end, t->noop ? now : 0);
  ST(s->shape, (uint64_t)(func & 0xff) | (uint64_t)(t->type & 0xff) << 8 | (uint64_t)(uint32_t)t->op << 16 |
                   (uint64_t)(t->exec & 0xff) << 48 | (uint64_t)(t->hostless != 0) << 56);
  ST(s->root, root), ST(s->how, HOW_NONE), ST(s->tag, t->user_tag), ST(s->sel, t->sel);
  ST(s->state, st_pack(t->noop ? FR_DONE : FR_QUEUED, CH_OK)); /* one rank, in place: nothing to do */
  w_end(s);
  return id;
}

uint64_t fr_rma(struct ncclComm* comm, int func, int peer, uint64_t count, int type) {
  struct fr_ring* fr = comm->fr;
  if (!fr) return 0;
  uint64_t id = ++fr->next_id; /* the calling thread, in the call (comm_enter), as fr_enqueue */
  atomic_store_explicit(&fr->last_id, id, memory_order_release);
  struct fr_slot* s = &fr->s[(id - 1) % (uint64_t)fr->cap];
  if (!terminal(atomic_load_explicit(&s->state, memory_order_acquire))) {
    atomic_fetch_add_explicit(&fr->skipped, 1, memory_order_relaxed);
    return 0;
  }
  uint64_t now = obs_ticks();
  w_begin(s);
  ST(s->id, id), ST(s->seq, 0), ST(s->count, count), ST(s->t_enq, now), ST(s->t_start, now), ST(s->t_end, 0);
  ST(s->shape, (uint64_t)(func & 0xff) | (uint64_t)(type & 0xff) << 8 | (uint64_t)0xffffffffu << 16);
  ST(s->root, peer), ST(s->how, HOW_NONE), ST(s->tag, 0), ST(s->sel, 0);
  ST(s->state, st_pack(FR_STARTED, CH_OK));
  w_end(s);
  return id;
}

const char* fr_func_name(int func) {
  switch (func) {
    case FR_FUNC_PUTSIGNAL: return "PutSignal";
    case FR_FUNC_SIGNAL: return "Signal";
    case FR_FUNC_WAITSIGNAL: return "WaitSignal";
    default: return ch_func_name(func);
  }
}

void fr_choice(struct ncclComm* comm, uint64_t id, const struct tune_choice* how) {
  struct fr_ring* fr = comm->fr;
  struct fr_slot* s = fr && id ? slot(fr, id) : NULL;
  if (!s) return;
  w_begin(s);
  ST(s->how, (uint32_t)(how->algo & 0xff) | (uint32_t)(how->proto & 0xff) << 8 | (uint32_t)(how->nch & 0xffff) << 16);
  w_end(s);
}

static int counts_in_seq(int func) { return func <= FUNC_ALLREDUCE; } /* plan.c's is_coll */

void fr_start(struct ncclComm* comm, uint64_t lo, uint64_t hi, uint64_t seq_base) {
  struct fr_ring* fr = comm->fr;
  if (!fr || !lo) return;
  uint64_t now = obs_ticks();
  for (uint64_t id = lo; id <= hi; id++) {
    struct fr_slot* s = slot(fr, id); /* NULL: not recorded (its slot was busy) */
    if (!s || (LD(s->state) & 0xff) != FR_QUEUED) continue; /* a call with nothing to do never queued */
    uint64_t shape = LD(s->shape);
    w_begin(s);
    if (counts_in_seq((int)(shape & 0xff)) && !(shape >> 56)) ST(s->seq, ++seq_base); /* call order, as plan.c */
    if (!LD(s->t_enq)) ST(s->t_enq, now);
    ST(s->t_start, now);
    ST(s->state, st_pack(FR_STARTED, CH_OK));
    w_end(s);
  }
}

static void finish(struct fr_ring* fr, uint64_t lo, uint64_t hi, ch_status status, int only_queued) {
  uint64_t now = obs_ticks();
  for (uint64_t id = lo; id <= hi; id++) {
    struct fr_slot* s = slot(fr, id);
    uint32_t st = s ? LD(s->state) : 0;
    if (!s || terminal(st) || (only_queued && (st & 0xff) != FR_QUEUED)) continue;
    int exec = (int)(LD(s->shape) >> 48 & 0xff);
    w_begin(s);
    if (!LD(s->t_enq)) ST(s->t_enq, now);
    if (!LD(s->t_start)) ST(s->t_start, now);
    ST(s->t_end, now);
    w_end(s);
    /* The state last, with release: once terminal, the slot is free for a newer call. */
    atomic_store_explicit(&s->state,
                          st_pack(status != CH_OK ? FR_FAILED : exec == 3 /* EXEC_KERNEL */ ? FR_LAUNCHED : FR_DONE, status),
                          memory_order_release);
  }
}

void fr_end(struct ncclComm* comm, uint64_t lo, uint64_t hi, ch_status status) {
  if (comm->fr && lo) finish(comm->fr, lo, hi, status, 0);
}

void fr_fail_queued(struct ncclComm* comm, uint64_t lo, uint64_t hi, ch_status status) {
  if (comm->fr && lo) finish(comm->fr, lo, hi, status, 1);
}

/* A consistent copy of slot s if it holds call id: 1, else 0. */
static int read_slot(struct fr_slot* s, uint64_t id, struct fr_entry* out) {
  for (int tries = 0; tries < 1000; tries++) {
    uint64_t v1 = atomic_load_explicit(&s->ver, memory_order_acquire);
    if (v1 & 1) continue;
    uint64_t shape = LD(s->shape);
    uint32_t how = LD(s->how), st = LD(s->state);
    struct fr_entry e = {.id = LD(s->id), .seq = LD(s->seq), .count = LD(s->count), .t_enq = LD(s->t_enq),
                         .t_start = LD(s->t_start), .t_end = LD(s->t_end), .func = (int32_t)(shape & 0xff),
                         .type = (int32_t)(shape >> 8 & 0xff), .op = (int32_t)(uint32_t)(shape >> 16),
                         .root = LD(s->root), .exec = (int16_t)(shape >> 48 & 0xff),
                         .hostless = (int16_t)(shape >> 56 & 1), .state = (int32_t)(st & 0xff),
                         .status = (int32_t)(st >> 8) - 128, .tag = LD(s->tag), .sel = LD(s->sel)};
    e.algo = (how & 0xffff) == HOW_NONE ? -1 : (int16_t)(how & 0xff);
    e.proto = (how & 0xffff) == HOW_NONE ? -1 : (int16_t)(how >> 8 & 0xff);
    e.nch = (how & 0xffff) == HOW_NONE ? 0 : (int16_t)(how >> 16);
    atomic_thread_fence(memory_order_acquire);
    if (LD(s->ver) != v1) continue;
    if (e.id != id) return 0; /* a slot this call never took (it was busy), or reused since */
    *out = e;
    return 1;
  }
  return 0;
}

int fr_get(struct ncclComm* comm, uint64_t id, struct fr_entry* out) {
  struct fr_ring* fr = comm->fr;
  return fr && id ? read_slot(&fr->s[(id - 1) % (uint64_t)fr->cap], id, out) : 0;
}

int fr_snapshot(struct ncclComm* comm, struct fr_entry** out, uint64_t* recorded, uint64_t* skipped) {
  struct fr_ring* fr = comm->fr;
  *out = NULL;
  *recorded = *skipped = 0;
  if (!fr) return 0;
  struct fr_entry* copy = malloc(sizeof(*copy) * (size_t)fr->cap);
  if (!copy) return 0;
  uint64_t last = atomic_load_explicit(&fr->last_id, memory_order_acquire);
  uint64_t first = last > (uint64_t)fr->cap ? last - (uint64_t)fr->cap + 1 : 1;
  int n = 0;
  for (uint64_t id = first; id <= last; id++) {
    struct fr_slot* s = &fr->s[(id - 1) % (uint64_t)fr->cap];
    struct fr_entry e;
    int ok = read_slot(s, id, &e);
    if (ok) copy[n++] = e;
  }
  *out = copy;
  *recorded = last;
  *skipped = atomic_load_explicit(&fr->skipped, memory_order_relaxed);
  return n;
}
