/* Job-wide stall reports: every communicator of this process keeps a small progress record that other
 * threads read without locks; a rank that times out (or is asked: CHORUS_DUMP_SIGNAL, chorus-info
 * --stall) gathers every rank's record, from this process directly and from other processes through
 * their stall query service (bootstrap/query.c), and prints which ranks reached the stalled call and
 * which did not: `AllReduce #812 (64 MiB): ranks 0-6 waiting, rank 7 last completed #811`.
 *
 * The record (struct stall_rec) describes the call a rank is blocked in. Only the thread running the
 * communicator's current plan writes it (tickets let one thread at a time run a comm's plans), after
 * the plan made no progress for STALL_NOTE_AFTER_NS and then at most every STALL_NOTE_EVERY_NS; it
 * is a seqlock of atomics, so any reader gets a consistent copy or retries. Whether the rank is in
 * a call at all comes from the comm's own atomics (done_ticket, next_ticket, seq): a record whose
 * ticket is not the current one is stale and ignored. */
#include <pthread.h>
#include <stdarg.h>
#include <unistd.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../misc/log.h"
#include "../misc/utils.h"
#include "../comm/work.h"
#include "../tune/tune.h"
#include "../observe/observe.h"
#include "stall.h"

#define STALL_NOTE_AFTER_NS (10 * UT_NS_PER_MS)  /* a plan idle this long publishes what it waits for */
#define STALL_NOTE_EVERY_NS (100 * UT_NS_PER_MS) /* and refreshes it this often */
#define STALL_GATHER_NS (2ull * UT_NS_PER_S) /* a report asks other processes for at most this long */
#define STALL_ASK_NS UT_NS_PER_S        /* and one process for at most this long */

struct stall_rec {
  _Atomic uint64_t ver; /* odd while the writer is changing the fields */
  _Atomic uint64_t ticket, seq, last_done, bytes_total, bytes_done, idle_since;
  _Atomic int32_t func, type, peer, wait, algo, proto, gave_up;
};

/* Registry of this process's communicators, under reg_lock. An entry is removed (stall_unregister)
 * before its comm is freed; `comm` is only dereferenced under reg_lock, or by the thread running one
 * of its plans. */
struct stall_ent {
  struct ncclComm* comm;
  uint64_t hash;
  int rank, nranks;
  struct boot_key key;
  struct stall_rec rec;
  struct stall_ent* next;
};
static pthread_mutex_t reg_lock = PTHREAD_MUTEX_INITIALIZER;
static struct stall_ent* reg;

/* A destroyed communicator's last state, kept a while (under reg_lock, with its key still served):
 * ranks that time out a little later then learn that this rank timed out too (or had finished),
 * rather than that it has no such communicator. */
#define STALL_GONE_MAX 16
#define STALL_GONE_NS (300ull * UT_NS_PER_S)
struct stall_gone {
  struct stall_wire w;
  struct boot_key key;
  uint64_t when;
  struct stall_gone* next;
};
static struct stall_gone* gone;

static struct stall_ent* find_comm(const struct ncclComm* comm) {
  for (struct stall_ent* e = reg; e; e = e->next)
    if (e->comm == comm) return e;
  return NULL;
}

static struct stall_ent* find_rank(uint64_t hash, int rank, const struct boot_key* key) {
  for (struct stall_ent* e = reg; e; e = e->next)
    if (e->hash == hash && e->rank == rank &&
        (!key || (e->key.mode == key->mode && !memcmp(e->key.k, key->k, sizeof(key->k)))))
      return e;
  return NULL;
}

static const struct stall_wire* find_gone(uint64_t hash, int rank, int nranks, const struct boot_key* key) {
  for (struct stall_gone* g = gone; g; g = g->next)
    if (g->w.comm_hash == hash && g->w.rank == rank && g->w.nranks == nranks &&
        (!key || (g->key.mode == key->mode && !memcmp(g->key.k, key->k, sizeof(key->k)))))
      return &g->w;
  return NULL;
}

static size_t on_query(const struct boot_key* key, uint32_t kind, const void* req, size_t len, char* out, size_t cap);
static struct stall_wire* gather(uint64_t hash, const struct boot_key* key, int* nranks_out, union sock_addr* self,
                                 const volatile int* abort, int dump);

void stall_register(struct ncclComm* comm) {
  struct stall_ent* e = calloc(1, sizeof(*e));
  if (!e) return; /* reports then show this rank as not answering; nothing else depends on it */
  e->comm = comm;
  e->hash = comm->comm_hash;
  e->rank = comm->rank;
  e->nranks = comm->nranks;
  e->key = *boot_secret(comm->boot);
  boot_query_set_handler(on_query);
  boot_query_key(&e->key, 1);
  boot_query_run(1);
  pthread_mutex_lock(&reg_lock);
  e->next = reg;
  reg = e;
  pthread_mutex_unlock(&reg_lock);
  char a[64];
  const union sock_addr* q = &comm->peers[comm->rank].query_addr;
  if (q->sa.sa_family != AF_UNSPEC)
    INFO(LOG_INIT, "rank %d: stall reports of comm %016llx: chorus-info --stall %s", comm->rank,
         (unsigned long long)comm->comm_hash, sock_addr_str(q, a, sizeof(a)));
}

static void read_state(struct stall_ent* e, struct stall_wire* w);

void stall_unregister(struct ncclComm* comm) {
  struct stall_gone* g = calloc(1, sizeof(*g));
  struct stall_gone* drop = NULL; /* expired, or beyond STALL_GONE_MAX: freed outside the lock */
  pthread_mutex_lock(&reg_lock);
  struct stall_ent** pp = &reg;
  while (*pp && (*pp)->comm != comm) pp = &(*pp)->next;
  struct stall_ent* e = *pp;
  if (e) *pp = e->next;
  uint64_t now = ut_now_ns();
  int kept = 0;
  if (e && g) {
    read_state(e, &g->w);
    g->w.gone = 1;
    g->key = e->key; /* its reference on the key passes to the tombstone */
    g->when = now;
    g->next = gone;
    gone = g;
    g = NULL;
    kept = 1;
  }
  int k = 0;
  for (struct stall_gone** q = &gone; *q;) {
    if (++k > STALL_GONE_MAX || now - (*q)->when > STALL_GONE_NS) {
      struct stall_gone* x = *q;
      *q = x->next;
      x->next = drop;
      drop = x;
    } else {
      q = &(*q)->next;
    }
  }
  pthread_mutex_unlock(&reg_lock);
  free(g);
  if (e && !kept) boot_query_key(&e->key, -1);
  if (e) boot_query_run(-1); /* the last one stops the service's threads */
  while (drop) {
    struct stall_gone* x = drop;
    drop = x->next;
    boot_query_key(&x->key, -1);
    memset(&x->key, 0, sizeof(x->key));
    free(x);
  }
  if (!e) return;
  memset(&e->key, 0, sizeof(e->key));
  free(e);
}

/* ---- writer: the thread running a plan ---- */

void stall_note_plan(const struct ch_plan* pl, uint64_t idle_ns, int gave_up) {
  pthread_mutex_lock(&reg_lock);
  struct stall_ent* e = find_comm(pl->comm);
  pthread_mutex_unlock(&reg_lock); /* e lives while this thread runs a plan of its comm */
  if (!e) return;
  const struct ch_op* op = NULL;
  uint64_t key = UINT64_MAX;
  for (int l = 0; l < pl->nlanes; l++) { /* the earliest pending collective, else a send/recv */
    const struct ch_lane* ln = &pl->lanes[l];
    if (ln->cur >= ln->nops) continue;
    const struct ch_op* o = ln->ops[ln->cur];
    uint64_t k = stall_is_coll(o->func) ? o->ctx.hdr.seq : UINT64_MAX - 1;
    if (!op || k < key) op = o, key = k;
  }
  uint64_t sidx = 0, snidx = 0;
  for (int l = 0; op && l < pl->nlanes; l++) { /* its progress over every channel */
    const struct ch_lane* ln = &pl->lanes[l];
    if (ln->cur >= ln->nops) continue;
    const struct ch_op* o = ln->ops[ln->cur];
    if (o->func != op->func || o->ctx.hdr.seq != op->ctx.hdr.seq) continue;
    sidx += o->idx, snidx += o->nidx;
  }
  struct stall_rec* r = &e->rec;
  uint64_t v = atomic_load_explicit(&r->ver, memory_order_relaxed);
  atomic_store_explicit(&r->ver, v + 1, memory_order_relaxed);
  atomic_thread_fence(memory_order_release);
  int peer = -1, wait = STALL_WAIT_TURN;
  uint64_t total = op ? (uint64_t)op->count * op->esize : 0;
  if (op) wait = stall_waits_for(op, &peer);
  atomic_store_explicit(&r->ticket, pl->ticket, memory_order_relaxed);
  atomic_store_explicit(&r->func, op ? op->func : -1, memory_order_relaxed);
  atomic_store_explicit(&r->type, op ? (int32_t)(op->ctx.hdr.type & XFER_TYPE_MASK) : -1, memory_order_relaxed);
  atomic_store_explicit(&r->algo, op ? op->algo : -1, memory_order_relaxed);
  atomic_store_explicit(&r->proto, op ? op->proto : -1, memory_order_relaxed);
  atomic_store_explicit(&r->peer, op && !stall_is_coll(op->func) && peer < 0 ? op->root : peer, memory_order_relaxed);
  atomic_store_explicit(&r->wait, wait, memory_order_relaxed);
  atomic_store_explicit(&r->seq, op && stall_is_coll(op->func) ? op->ctx.hdr.seq : 0, memory_order_relaxed);
  uint64_t last = op && stall_is_coll(op->func) ? op->ctx.hdr.seq - 1 : atomic_load(&pl->comm->seq);
  atomic_store_explicit(&r->last_done, last, memory_order_relaxed);
  atomic_store_explicit(&r->bytes_total, total, memory_order_relaxed);
  atomic_store_explicit(&r->bytes_done, snidx ? (uint64_t)((double)total * (double)sidx / (double)snidx) : 0,
                        memory_order_relaxed);
  atomic_store_explicit(&r->idle_since, ut_now_ns() - idle_ns, memory_order_relaxed);
  atomic_store_explicit(&r->gave_up, gave_up, memory_order_relaxed);
  atomic_store_explicit(&r->ver, v + 2, memory_order_release);
}

void stall_note(struct ch_plan* const* plans, int n, uint64_t idle_ns, uint64_t now) {
  static _Thread_local uint64_t last;
  if (idle_ns < STALL_NOTE_AFTER_NS || (now >= last && now - last < STALL_NOTE_EVERY_NS)) return;
  last = now;
  for (int i = 0; i < n; i++)
    if (plans[i] && plans[i]->started) stall_note_plan(plans[i], idle_ns, 0);
}

/* ---- readers ---- */

/* What rank e is doing, as sent on the wire. Under reg_lock. */
static void read_state(struct stall_ent* e, struct stall_wire* w) {
  struct ncclComm* c = e->comm;
  memset(w, 0, sizeof(*w));
  w->magic = STALL_WIRE_MAGIC;
  w->rank = e->rank;
  w->nranks = e->nranks;
  w->comm_hash = e->hash;
  w->pid = c->peers[e->rank].pid;
  snprintf(w->host, sizeof(w->host), "%s", c->peers[e->rank].hostname);
  w->async = atomic_load(&c->async_result);
  struct stall_rec* r = &e->rec;
  uint64_t v, ticket;
  struct stall_wire copy;
  int gave_up;
  uint64_t idle_since;
  for (int tries = 0;; tries++) { /* seqlock read */
    v = atomic_load_explicit(&r->ver, memory_order_acquire);
    ticket = atomic_load_explicit(&r->ticket, memory_order_relaxed);
    copy.func = atomic_load_explicit(&r->func, memory_order_relaxed);
    copy.type = atomic_load_explicit(&r->type, memory_order_relaxed);
    copy.algo = atomic_load_explicit(&r->algo, memory_order_relaxed);
    copy.proto = atomic_load_explicit(&r->proto, memory_order_relaxed);
    copy.peer = atomic_load_explicit(&r->peer, memory_order_relaxed);
    copy.wait = atomic_load_explicit(&r->wait, memory_order_relaxed);
    copy.seq = atomic_load_explicit(&r->seq, memory_order_relaxed);
    copy.last_done = atomic_load_explicit(&r->last_done, memory_order_relaxed);
    copy.bytes_total = atomic_load_explicit(&r->bytes_total, memory_order_relaxed);
    copy.bytes_done = atomic_load_explicit(&r->bytes_done, memory_order_relaxed);
    idle_since = atomic_load_explicit(&r->idle_since, memory_order_relaxed);
    gave_up = atomic_load_explicit(&r->gave_up, memory_order_relaxed);
    atomic_thread_fence(memory_order_acquire);
    if (!(v & 1) && atomic_load_explicit(&r->ver, memory_order_relaxed) == v) break;
    if (tries > 1000) { v = 0; break; } /* a writer that keeps writing: report it as running */
  }
  uint64_t done = atomic_load(&c->done_ticket), next = atomic_load(&c->next_ticket);
  uint64_t seq = atomic_load_explicit(&c->seq, memory_order_relaxed);
  int current = v != 0 && ticket == done && done != next;
  int ended = v != 0 && gave_up && ticket + 1 == done && done == next;
  if (current || ended) {
    w->func = copy.func, w->type = copy.type, w->algo = copy.algo, w->proto = copy.proto;
    w->peer = copy.peer, w->wait = copy.wait, w->seq = copy.seq, w->last_done = copy.last_done;
    w->bytes_total = copy.bytes_total, w->bytes_done = copy.bytes_done;
    uint64_t now = ut_now_ns();
    w->idle_ms = now > idle_since ? (now - idle_since) / UT_NS_PER_MS : 0;
    w->state = current ? STALL_ST_WAIT : STALL_ST_GAVE_UP;
  } else {
    int peers = atomic_load_explicit(&c->connecting, memory_order_acquire);
    int sig = atomic_load_explicit(&c->rma_wait, memory_order_acquire);
    int cfunc = atomic_load_explicit(&c->connecting_func, memory_order_relaxed);
    w->state = done != next                 ? STALL_ST_BUSY
               : peers > 0 && cfunc < 0     ? STALL_ST_BUSY /* connections of no call of its own (an internal step) */
               : peers > 0                  ? STALL_ST_CONNECT
               : sig                        ? STALL_ST_SIGNAL
                                            : STALL_ST_IDLE;
    w->func = w->type = w->algo = w->proto = w->peer = -1;
    w->last_done = seq; /* idle: every call so far has returned; busy: the last one started */
    if (w->state == STALL_ST_CONNECT) { /* its next call (connect_context's number) */
      w->func = cfunc;
      if (!stall_is_coll(w->func)) w->peer = atomic_load_explicit(&c->connecting_peer, memory_order_relaxed);
      w->seq = w->func <= FUNC_ALLREDUCE ? seq + 1 : 0; /* AlltoAll, Gather, Scatter have no number of their own */
      w->bytes_total = (uint64_t)peers;
    } else if (w->state == STALL_ST_SIGNAL) {
      w->peer = atomic_load_explicit(&c->rma_wait_peer, memory_order_relaxed);
      w->sig = atomic_load_explicit(&c->rma_wait_sig, memory_order_relaxed);
      w->ctx = atomic_load_explicit(&c->rma_wait_ctx, memory_order_relaxed);
      w->bytes_done = atomic_load_explicit(&c->rma_wait_have, memory_order_relaxed);
      w->bytes_total = atomic_load_explicit(&c->rma_wait_want, memory_order_relaxed);
      uint64_t since = atomic_load_explicit(&c->rma_wait_since, memory_order_relaxed), now = ut_now_ns();
      w->idle_ms = now > since ? (now - since) / UT_NS_PER_MS : 0;
      if (w->bytes_done > w->bytes_total) w->bytes_done = w->bytes_total; /* a read across a refresh */
    }
  }
}

int stall_wire_ok(struct stall_wire* w, uint64_t hash, int rank, int nranks) {
  if (w->magic != STALL_WIRE_MAGIC || w->comm_hash != hash || w->rank != rank || w->nranks != nranks) return 0;
  if (w->state < STALL_ST_IDLE || w->state == STALL_ST_NOANSWER || w->state > STALL_ST_SIGNAL) return 0;
  if (w->state == STALL_ST_SIGNAL && (w->peer < 0 || w->sig < 0 || w->ctx < 0 || w->bytes_done > w->bytes_total))
    return 0;
  if (w->state == STALL_ST_CONNECT && (w->func < 0 || w->func >= FUNC_COUNT || w->bytes_total >= (uint64_t)nranks))
    return 0;
  int waiting = w->state == STALL_ST_WAIT || w->state == STALL_ST_GAVE_UP;
  if (waiting && (w->func < 0 || w->func >= FUNC_COUNT || w->algo < -1 || w->algo >= ALGO_COUNT || w->proto < -1 ||
                  w->proto >= CH_NPROTO || w->wait < 0 || w->wait >= STALL_WAIT_COUNT || w->type < -1 ||
                  w->type >= 64 || w->bytes_done > w->bytes_total))
    return 0;
  if (w->peer < -1 || w->peer >= nranks || (w->gone != 0 && w->gone != 1)) return 0;
  if (boot_text_field(w->host, sizeof(w->host)) != 0) return 0;
  return 1;
}

/* ---- the query service's handler ---- */

struct stall_query_req {
  uint64_t hash;
  int32_t rank, nranks;
  int32_t dump, pad; /* enum stall_dump: the rank also writes its flight recorder (observe/dump.c) */
};

const char* const stall_dump_names[STALL_DUMP_COUNT] = {"", "timeout", "signal", "request"};

/* Flight recorder dumps rendered under reg_lock and written once it is released (write_dumps): a slow
 * or blocked file system must not hold the lock that ncclCommDestroy needs. */
struct dumps {
  struct fr_text* v;
  int n, cap;
};

/* Render comm's flight recorder for `why`: a timeout's once per comm (every rank that times out asks
 * every other), a signal's or a request's every time. */
static void dump_for(struct ncclComm* comm, int why, struct dumps* d) {
  if (why <= STALL_DUMP_NONE || why >= STALL_DUMP_COUNT) return;
  if (d->n == d->cap) {
    struct fr_text* v = realloc(d->v, (size_t)(d->cap ? 2 * d->cap : 4) * sizeof(*v));
    if (!v) return;
    d->v = v, d->cap = d->cap ? 2 * d->cap : 4;
  }
  const char* reason = stall_dump_names[why];
  struct fr_text* t = &d->v[d->n];
  if ((why == STALL_DUMP_TIMEOUT ? fr_render_first(comm, reason, t) : fr_render(comm, reason, t)) == 0) d->n++;
}

static void write_dumps(struct dumps* d) {
  for (int i = 0; i < d->n; i++) (void)fr_write(&d->v[i], NULL, 0);
  free(d->v);
}

static size_t on_query(const struct boot_key* key, uint32_t kind, const void* req, size_t len, char* out, size_t cap) {
  if (kind == STALL_Q_RECORD) {
    struct stall_query_req q;
    if (len != sizeof(q) || cap < sizeof(struct stall_wire)) return 0;
    memcpy(&q, req, sizeof(q));
    size_t n = 0;
    struct dumps dumps = {0};
    pthread_mutex_lock(&reg_lock);
    struct stall_ent* e = find_rank(q.hash, q.rank, key);
    const struct stall_wire* g = find_gone(q.hash, q.rank, q.nranks, key);
    if (e && e->nranks == q.nranks) {
      read_state(e, (struct stall_wire*)(void*)out);
      n = sizeof(struct stall_wire);
      dump_for(e->comm, q.dump, &dumps); /* under reg_lock: the comm stays */
    } else if (g) {
      memcpy(out, g, sizeof(*g));
      n = sizeof(struct stall_wire);
    }
    pthread_mutex_unlock(&reg_lock);
    write_dumps(&dumps);
    return n; /* 0: no such communicator here (destroyed, or never made) */
  }
  if ((kind != STALL_Q_SUMMARY && kind != STALL_Q_DUMP && kind != STALL_Q_METRICS) ||
      (len != 0 && len != sizeof(uint64_t)))
    return 0;
  uint64_t only = 0;
  if (len) memcpy(&only, req, sizeof(only));
  if (kind == STALL_Q_METRICS) { /* this process's comms, formatted under reg_lock (they stay) */
    enum { MAXM = 64 };
    struct ncclComm* comms[MAXM];
    int nc = 0;
    pthread_mutex_lock(&reg_lock);
    for (struct stall_ent* e = reg; e && nc < MAXM; e = e->next)
      if ((!key || (e->key.mode == key->mode && !memcmp(e->key.k, key->k, sizeof(key->k)))) && (!only || e->hash == only))
        comms[nc++] = e->comm;
    size_t n = obs_prometheus(comms, nc, out, cap);
    pthread_mutex_unlock(&reg_lock);
    return n < cap ? n : cap - 1;
  }
  /* One report per communicator this process serves under that key, each made once. */
  enum { MAXC = 32 };
  uint64_t hashes[MAXC];
  int nh = 0;
  pthread_mutex_lock(&reg_lock);
  for (struct stall_ent* e = reg; e && nh < MAXC; e = e->next) {
    if (key && (e->key.mode != key->mode || memcmp(e->key.k, key->k, sizeof(key->k)))) continue;
    if (only && e->hash != only) continue;
    int seen = 0;
    for (int i = 0; i < nh; i++) seen |= hashes[i] == e->hash;
    if (!seen) hashes[nh++] = e->hash;
  }
  pthread_mutex_unlock(&reg_lock);
  size_t at = 0;
  if (!nh) at = (size_t)snprintf(out, cap, "no communicator of this job in process %d\n", (int)getpid());
  if (kind == STALL_Q_DUMP) {
    for (int i = 0; i < nh && at + 1 < cap; i++) {
      int n = 0, wrote = 0;
      union sock_addr self;
      struct stall_wire* w = gather(hashes[i], key, &n, &self, NULL, STALL_DUMP_REQUEST);
      for (int r = 0; r < n; r++) wrote += w[r].state != STALL_ST_NOANSWER;
      at += (size_t)snprintf(out + at, cap - at, "comm %016llx: %d of %d ranks wrote their flight recorder (each in "
                             "its host's CHORUS_DUMP_DIR; this process's: %s)\n", (unsigned long long)hashes[i],
                             wrote, n, obs_dump_dir());
      free(w);
    }
    return at < cap ? at : cap - 1;
  }
  for (int i = 0; i < nh && at + 1 < cap; i++) at += stall_job_text(hashes[i], key, NULL, NULL, STALL_DUMP_NONE, out + at, cap - at);
  return at < cap ? at : cap - 1;
}

/* ---- gathering and formatting ---- */

/* Every rank's state for comm `hash` as seen from this process; the caller frees. *me: a rank of
 * it in this process. NULL if this process has no such communicator. */
static struct stall_wire* gather(uint64_t hash, const struct boot_key* key, int* nranks_out, union sock_addr* self,
                                 const volatile int* abort, int dump) {
  struct dumps dumps = {0};
  pthread_mutex_lock(&reg_lock);
  struct stall_ent* e = NULL;
  for (struct stall_ent* x = reg; x && !e; x = x->next)
    if (x->hash == hash && (!key || (x->key.mode == key->mode && !memcmp(x->key.k, key->k, sizeof(key->k))))) e = x;
  if (!e) {
    pthread_mutex_unlock(&reg_lock);
    return NULL;
  }
  int n = e->nranks;
  struct boot_key k = e->key;
  *self = e->comm->peers[e->rank].query_addr;
  struct stall_wire* w = calloc((size_t)n, sizeof(*w));
  union sock_addr* qa = calloc((size_t)n, sizeof(*qa));
  char* have = calloc((size_t)n, 1);
  if (!w || !qa || !have) {
    pthread_mutex_unlock(&reg_lock);
    free(w), free(qa), free(have);
    return NULL;
  }
  for (int r = 0; r < n; r++) {
    qa[r] = e->comm->peers[r].query_addr;
    w[r].pid = e->comm->peers[r].pid;
    snprintf(w[r].host, sizeof(w[r].host), "%s", e->comm->peers[r].hostname);
    struct stall_ent* x = find_rank(hash, r, &k);
    const struct stall_wire* g = find_gone(hash, r, n, &k);
    if (x && x->nranks == n) read_state(x, &w[r]), have[r] = 1, dump_for(x->comm, dump, &dumps);
    else if (g) w[r] = *g, have[r] = 1;
  }
  pthread_mutex_unlock(&reg_lock);
  write_dumps(&dumps);
  uint64_t end = ut_now_ns() + STALL_GATHER_NS;
  for (int r = 0; r < n; r++) {
    if (have[r]) continue;
    w[r].rank = r;
    w[r].state = STALL_ST_NOANSWER;
    w[r].func = w[r].peer = -1;
    char why[160] = "its process serves no stall queries (CHORUS_STALL_QUERY=0)";
    uint64_t now = ut_now_ns();
    if (abort && __atomic_load_n(abort, __ATOMIC_RELAXED)) {
      snprintf(why, sizeof(why), "not asked: the communicator is being aborted");
    } else if (now >= end) {
      snprintf(why, sizeof(why), "not asked: the report's %llu s were spent", STALL_GATHER_NS / UT_NS_PER_S);
    } else if (qa[r].sa.sa_family != AF_UNSPEC) {
      struct stall_query_req q = {hash, r, n, dump, 0};
      struct stall_wire got;
      size_t len = 0;
      uint64_t dl = now + STALL_ASK_NS < end ? now + STALL_ASK_NS : end;
      char a[64];
      if (boot_query(&qa[r], &k, STALL_Q_RECORD, &q, sizeof(q), (char*)&got, sizeof(got), &len, dl, abort, why,
                     sizeof(why)) == CH_OK) {
        if (len == sizeof(got) && stall_wire_ok(&got, hash, r, n)) {
          w[r] = got;
          continue;
        }
        snprintf(why, sizeof(why), len ? "sent an invalid record" : "has no such communicator (destroyed?)");
      }
      snprintf(w[r].note, sizeof(w[r].note), "%s: %.*s", sock_addr_str(&qa[r], a, sizeof(a)), 90, why);
      continue;
    }
    snprintf(w[r].note, sizeof(w[r].note), "%.*s", 150, why);
  }
  memset(&k, 0, sizeof(k));
  free(qa);
  free(have);
  *nranks_out = n;
  return w;
}

static const char* wait_text[STALL_WAIT_COUNT] = {"its turn (an earlier call has not finished)", "data from",
                                                  "room in the FIFO of", "the other ranks of its Direct clique"};

static void fmt_bytes(uint64_t b, char* s, size_t n) {
  if (b >= (1ull << 30) && b % (1ull << 30) == 0) snprintf(s, n, "%llu GiB", (unsigned long long)(b >> 30));
  else if (b >= (1ull << 20) && b % (1ull << 20) == 0) snprintf(s, n, "%llu MiB", (unsigned long long)(b >> 20));
  else if (b >= (1ull << 10) && b % (1ull << 10) == 0) snprintf(s, n, "%llu KiB", (unsigned long long)(b >> 10));
  else snprintf(s, n, "%llu B", (unsigned long long)b);
}

/* "AllReduce #5" or "Send to rank 3" */
static void fmt_call(const struct stall_wire* w, char* s, size_t n) {
  if (stall_is_coll(w->func) && !w->seq) snprintf(s, n, "%s", tune_func_name(w->func));
  else if (stall_is_coll(w->func)) snprintf(s, n, "%s #%llu", tune_func_name(w->func), (unsigned long long)w->seq);
  else snprintf(s, n, "%s %s rank %d", tune_func_name(w->func), w->func == FUNC_SEND ? "to" : "from", w->peer);
}

/* Ranks of one kind in the headline; classes in the order they are listed. */
enum { C_FOCUS, C_IDLE, C_OTHER, C_SIGNAL, C_CONNECT, C_BUSY, C_NOANSWER };

static int cls_of(const struct stall_wire* w, const struct stall_wire* focus) {
  if (w->state == STALL_ST_WAIT || w->state == STALL_ST_GAVE_UP) {
    if (focus && w->func == focus->func && w->seq == focus->seq && stall_is_coll(w->func)) return C_FOCUS;
    return C_OTHER;
  }
  if (w->state == STALL_ST_IDLE) return C_IDLE;
  if (w->state == STALL_ST_BUSY) return C_BUSY;
  if (w->state == STALL_ST_CONNECT) return C_CONNECT;
  if (w->state == STALL_ST_SIGNAL) return C_SIGNAL;
  return C_NOANSWER;
}

static int same_group(const struct stall_wire* a, const struct stall_wire* b, const struct stall_wire* focus) {
  int c = cls_of(a, focus);
  if (c != cls_of(b, focus)) return 0;
  if (c == C_IDLE) return a->last_done == b->last_done && a->async == b->async;
  if (c == C_SIGNAL)
    return a->peer == b->peer && a->sig == b->sig && a->ctx == b->ctx && a->bytes_done == b->bytes_done &&
           a->bytes_total == b->bytes_total;
  if (c == C_OTHER || c == C_CONNECT)
    return a->func == b->func && a->seq == b->seq && (stall_is_coll(a->func) || a->peer == b->peer);
  return 1;
}

static size_t put(char* out, size_t cap, size_t at, const char* fmt, ...) __attribute__((format(printf, 4, 5)));
static size_t put(char* out, size_t cap, size_t at, const char* fmt, ...) {
  if (at + 1 >= cap) return at;
  va_list ap;
  va_start(ap, fmt);
  int k = vsnprintf(out + at, cap - at, fmt, ap);
  va_end(ap);
  if (k < 0) return at;
  return at + (size_t)k < cap ? at + (size_t)k : cap - 1;
}

#define STALL_DETAIL_RANKS 64

size_t stall_format(const struct stall_wire* w, int n, uint64_t hash, const char* why, char* out, size_t cap) {
  const struct stall_wire* focus = NULL;
  for (int r = 0; r < n; r++) /* the furthest collective anyone waits in: the one that stalled */
    if ((w[r].state == STALL_ST_WAIT || w[r].state == STALL_ST_GAVE_UP) && stall_is_coll(w[r].func) &&
        (!focus || w[r].seq > focus->seq))
      focus = &w[r];
  size_t at = put(out, cap, 0, "%sstall report for comm %016llx (%d ranks): ", why, (unsigned long long)hash, n);
  char call[96], b1[32], b2[32], list[160];
  if (focus) {
    fmt_call(focus, call, sizeof(call));
    fmt_bytes(focus->bytes_total, b1, sizeof(b1));
    at = put(out, cap, at, "%s (%s): ", call, b1);
  } else {
    at = put(out, cap, at, "no rank is blocked in a collective: ");
  }
  int* grp = calloc((size_t)n, sizeof(int));
  unsigned char* flags = calloc((size_t)n, 1);
  if (!grp || !flags) {
    free(grp), free(flags);
    return put(out, cap, at, "(out of memory)\n");
  }
  int ngroups = 0;
  for (int c = C_FOCUS; c <= C_NOANSWER; c++) {
    for (int r = 0; r < n; r++) {
      if (cls_of(&w[r], focus) != c || grp[r]) continue;
      int g = ++ngroups, count = 0;
      for (int q = r; q < n; q++)
        if (!grp[q] && same_group(&w[q], &w[r], focus)) grp[q] = g, count++;
      for (int q = 0; q < n; q++) flags[q] = grp[q] == g;
      boot_format_ranks(flags, n, 1, list, sizeof(list));
      const char* s = count > 1 ? "ranks" : "rank";
      at = put(out, cap, at, "%s", ngroups > 1 ? ", " : "");
      if (c == C_FOCUS) at = put(out, cap, at, "%s %s waiting", s, list);
      else if (c == C_IDLE && w[r].async)
        at = put(out, cap, at, "%s %s not in a call (communicator failed: %s), last call #%llu", s, list,
                 ch_status_str((ch_status)w[r].async), (unsigned long long)w[r].last_done);
      else if (c == C_IDLE)
        at = put(out, cap, at, "%s %s last completed #%llu", s, list, (unsigned long long)w[r].last_done);
      else if (c == C_OTHER) {
        fmt_call(&w[r], call, sizeof(call));
        at = put(out, cap, at, "%s %s waiting in %s", s, list, call);
      } else if (c == C_SIGNAL) {
        at = put(out, cap, at, "%s %s waiting for signal %d from rank %d, %llu of %llu seen", s, list, w[r].sig,
                 w[r].peer, (unsigned long long)w[r].bytes_done, (unsigned long long)w[r].bytes_total);
      } else if (c == C_CONNECT) {
        fmt_call(&w[r], call, sizeof(call));
        at = put(out, cap, at, "%s %s setting up connections for %s", s, list, call);
      } else if (c == C_BUSY) at = put(out, cap, at, "%s %s running (in a call, not blocked)", s, list);
      else at = put(out, cap, at, "%s %s did not answer", s, list);
    }
  }
  at = put(out, cap, at, "\n");
  for (int r = 0; r < n && r < STALL_DETAIL_RANKS; r++) {
    const struct stall_wire* x = &w[r];
    at = put(out, cap, at, "  rank %d (%s pid %d): ", r, x->host[0] ? x->host : "?", x->pid);
    if (x->state == STALL_ST_WAIT || x->state == STALL_ST_GAVE_UP) {
      fmt_call(x, call, sizeof(call));
      fmt_bytes(x->bytes_done, b1, sizeof(b1));
      fmt_bytes(x->bytes_total, b2, sizeof(b2));
      char who[32] = "";
      if (x->peer >= 0 && (x->wait == STALL_WAIT_DATA || x->wait == STALL_WAIT_ROOM))
        snprintf(who, sizeof(who), " rank %d", x->peer);
      at = put(out, cap, at, "%s %s (%s %s, %s/%s), %s done, waiting for %s%s, no progress for %.1f s",
               x->state == STALL_ST_GAVE_UP ? "timed out in" : "in", call, b2, red_type_name(x->type),
               x->algo >= 0 ? algo_name(x->algo) : "?", x->proto >= 0 ? tune_proto_name(x->proto) : "?", b1,
               wait_text[x->wait], who, (double)x->idle_ms / 1000.0);
      at = put(out, cap, at, "; last completed #%llu%s\n", (unsigned long long)x->last_done,
               x->gone ? " (communicator since destroyed)" : "");
    } else if (x->state == STALL_ST_IDLE) {
      at = put(out, cap, at, "not in a call; last %s #%llu%s%s%s\n", x->async ? "call" : "completed",
               (unsigned long long)x->last_done, x->async ? "; communicator failed: " : "",
               x->async ? ch_status_str((ch_status)x->async) : "", x->gone ? " (communicator since destroyed)" : "");
    } else if (x->state == STALL_ST_SIGNAL) {
      at = put(out, cap, at, "in ncclWaitSignal, waiting for signal %d (context %d) from rank %d, %llu of %llu seen, "
               "for %.1f s; last completed #%llu\n", x->sig, x->ctx, x->peer, (unsigned long long)x->bytes_done,
               (unsigned long long)x->bytes_total, (double)x->idle_ms / 1000.0, (unsigned long long)x->last_done);
    } else if (x->state == STALL_ST_CONNECT) {
      fmt_call(x, call, sizeof(call));
      at = put(out, cap, at, "in %s, setting up its connections with %llu peer%s; last completed #%llu\n", call,
               (unsigned long long)x->bytes_total, x->bytes_total == 1 ? "" : "s", (unsigned long long)x->last_done);
    } else if (x->state == STALL_ST_BUSY) {
      at = put(out, cap, at, "in a call and making progress (calls started: %llu)\n", (unsigned long long)x->last_done);
    } else {
      at = put(out, cap, at, "no answer: %s\n", x->note);
    }
  }
  if (n > STALL_DETAIL_RANKS) at = put(out, cap, at, "  ... and %d more ranks\n", n - STALL_DETAIL_RANKS);
  free(grp);
  free(flags);
  return at;
}

/* w (NULL: this process has no such communicator) formatted, with how to ask again. */
static size_t job_text(const struct stall_wire* w, int n, const union sock_addr* self, uint64_t hash, const char* why,
                       char* out, size_t cap) {
  if (!w) return put(out, cap, 0, "comm %016llx: not found in process %d\n", (unsigned long long)hash, (int)getpid());
  size_t at = stall_format(w, n, hash, why ? why : "", out, cap);
  char a[64];
  if (self->sa.sa_family != AF_UNSPEC)
    at = put(out, cap, at, "  (while the job runs, chorus-info --stall %s prints this report again)\n",
             sock_addr_str(self, a, sizeof(a)));
  return at;
}

size_t stall_job_text(uint64_t hash, const struct boot_key* key, const char* why, const volatile int* abort, int dump,
                      char* out, size_t cap) {
  int n = 0;
  union sock_addr self;
  struct stall_wire* w = gather(hash, key, &n, &self, abort, dump);
  size_t at = job_text(w, n, &self, hash, why, out, cap);
  free(w);
  return at;
}

char* stall_job_text_all(uint64_t hash, const char* why, const volatile int* abort, size_t* len) {
  int n = 0;
  union sock_addr self;
  struct stall_wire* w = gather(hash, NULL, &n, &self, abort, STALL_DUMP_NONE); /* once: the states do not change below */
  char* out = NULL;
  for (size_t cap = 256;; cap *= 2) { /* doubled until it fits: formatting the same states again is cheap */
    char* p = cap <= ((size_t)1 << 30) ? realloc(out, cap) : NULL;
    if (!p) {
      free(out);
      out = NULL;
      break;
    }
    out = p;
    *len = job_text(w, n, &self, hash, why, out, cap);
    if (*len + 1 < cap) break; /* whole: a cut text ends at cap - 1 (put) */
  }
  free(w);
  return out;
}

void stall_job_report(const struct ncclComm* comm, const char* why, int dump) {
  size_t cap = 16384;
  char* text = malloc(cap);
  if (!text) return;
  stall_job_text(comm->comm_hash, NULL, why, &comm->abort_flag, dump, text, cap);
  /* Details first, the headline last: it is what ncclGetLastError shows. */
  char* nl = strchr(text, '\n');
  char* details = nl ? nl + 1 : NULL;
  if (nl) *nl = '\0';
  for (char *save = NULL, *line = details ? strtok_r(details, "\n", &save) : NULL; line;
       line = strtok_r(NULL, "\n", &save))
    WARN("rank %d: %s", comm->rank, line);
  WARN("rank %d: %s", comm->rank, text);
  free(text);
}

void stall_dump_all(int why) {
  struct dumps dumps = {0};
  pthread_mutex_lock(&reg_lock);
  for (struct stall_ent* e = reg; e; e = e->next) dump_for(e->comm, why, &dumps);
  pthread_mutex_unlock(&reg_lock);
  write_dumps(&dumps);
}
