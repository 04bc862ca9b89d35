/* Groups: calls between ncclGroupStart and ncclGroupEnd are collected per thread and launched
 * together, so send/recv pairs that would deadlock one by one progress concurrently. A call outside
 * a group is a group of one. Communicator inits inside a group run concurrently at ncclGroupEnd. */
#include <stdlib.h>
#include <string.h>

#include "../misc/log.h"
#include "../misc/utils.h"
#include "../comm/work.h"
#include "../tune/tune.h"
#include "../observe/observe.h"
#include "connect.h"
#include "pool.h"
#include "suspend.h"
#include "exec.h"
#include "group.h"
#include "init.h"
#include "plan.h"

#define MAX_GROUP_INITS 1024

static _Thread_local int depth;
static _Thread_local ch_status group_error;
static _Thread_local struct ncclComm* inits[MAX_GROUP_INITS];
static _Thread_local int ninits;

int group_depth(void) { return depth; }

/* Calls to queue once the outermost group has launched (group_after): in the order given. */
#define MAX_GROUP_AFTER 1024
static _Thread_local struct group_later {
  ch_status (*fn)(void* arg, int run);
  void* arg;
} afters[MAX_GROUP_AFTER];
static _Thread_local int nafters;

ch_status group_after(ch_status (*fn)(void* arg, int run), void* arg) {
  if (depth == 0 || nafters == MAX_GROUP_AFTER) {
    if (depth) WARN("too many calls in one group that queue work after it (max %d)", MAX_GROUP_AFTER);
    return depth ? CH_INVALID_USAGE : CH_INTERNAL;
  }
  afters[nafters++] = (struct group_later){fn, arg};
  return CH_OK;
}

/* The outermost group ended: its deferred calls are queued now (run: it launched), each a group of
 * its own, or let go. The count is taken first: a call queued here ends a group of its own, and none
 * can add to the list meanwhile (group_after needs an open group). */
static ch_status run_afters(int run) {
  int n = nafters;
  nafters = 0;
  ch_status res = CH_OK;
  for (int i = 0; i < n; i++) {
    ch_status s = afters[i].fn(afters[i].arg, run && res == CH_OK);
    if (res == CH_OK) res = s;
  }
  return res;
}

static _Thread_local uint64_t epoch; /* outermost groups this thread has opened */
uint64_t group_epoch(void) { return epoch; }

ch_status group_start(void) {
  if (depth++ == 0) epoch++;
  return CH_OK;
}

ch_status group_defer_init(struct ncclComm* comm) {
  if (ninits == MAX_GROUP_INITS) {
    WARN("too many communicator inits in one group (max %d)", MAX_GROUP_INITS);
    return CH_INVALID_USAGE;
  }
  atomic_fetch_add(&comm->refs, 1); /* run_inits' last touch drops it: an abort meanwhile frees the rest */
  atomic_store(&comm->init_gate, 0);
  inits[ninits++] = comm;
  return CH_OK;
}

int group_init_pending(const struct ncclComm* comm) {
  for (int i = 0; i < ninits; i++)
    if (inits[i] == comm) return 1;
  return 0;
}

static void* init_thread_main(void* arg) {
  struct ncclComm* comm = arg;
  comm_init_job(comm);
  return NULL;
}

/* Blocking comms: run all inits concurrently and join. Nonblocking ones keep running in background. */
static ch_status run_inits_held(int n);
static ch_status run_inits(void) {
  int n = ninits;
  ninits = 0;
  ch_status res = run_inits_held(n);
  for (int i = 0; i < n; i++) comm_unref(inits[i]);
  return res;
}

/* Begin comm's init, unless an abort cancelled it first (init_gate). */
static int init_begin(struct ncclComm* comm) {
  int expected = 0;
  return atomic_compare_exchange_strong(&comm->init_gate, &expected, 1);
}

static ch_status run_inits_held(int n) {
  ch_status res = CH_OK;
  if (n == 1 && inits[0]->blocking) return init_begin(inits[0]) ? comm_init_job(inits[0]) : CH_ABORTED;
  char started[MAX_GROUP_INITS] = {0};
  for (int i = 0; i < n; i++) {
    if (!init_begin(inits[i])) {
      res = CH_ABORTED;
      continue;
    }
    if (pthread_create(&inits[i]->init_thread, NULL, init_thread_main, inits[i]) != 0) {
      WARN("cannot start an init thread: %s", strerror(errno));
      atomic_store(&inits[i]->init_state, ncclSystemError);
      res = CH_SYSTEM;
      continue;
    }
    started[i] = 1;
    atomic_store(&inits[i]->init_thread_live, 1);
  }
  int any_nonblocking = 0;
  for (int i = 0; i < n; i++) {
    if (!started[i]) continue;
    if (!inits[i]->blocking) { any_nonblocking = 1; continue; } /* joined by destroy or abort */
    comm_join_init(inits[i]);
    int st = atomic_load(&inits[i]->init_state);
    if (st != ncclSuccess && res == CH_OK) res = (ch_status)st;
  }
  if (res == CH_OK && any_nonblocking) res = CH_IN_PROGRESS;
  return res;
}

/* The calls of the current group, in call order. A thread-local array: no allocation per call. */
/* What the connections about to be set up are for, named as the user called it ("ncclAllReduce #3",
 * the next collective's number; "ncclSend to rank 2"), for a peer lost meanwhile (boot_set_context). */
static void connect_context(struct ncclComm* comm, const struct ch_task* t) {
  char what[96];
  if (!t) return;
  const char* more = t->next ? " (and the rest of its group)" : "";
  if (t->part) /* a call made of sends and receives (api/alltoallv.c) */
    snprintf(what, sizeof(what), "%s%s", algo_fname(t->origin), more);
  else if (t->func == FUNC_SEND || t->func == FUNC_RECV)
    snprintf(what, sizeof(what), "%s %s rank %d%s", algo_fname(t->func), t->func == FUNC_SEND ? "to" : "from",
             t->root, more);
  else
    snprintf(what, sizeof(what), "%s #%llu%s", algo_fname(t->func),
             (unsigned long long)atomic_load_explicit(&comm->seq, memory_order_relaxed) + 1, more);
  boot_set_context(comm->boot, what);
}

static _Thread_local struct ch_task* tasks;
static _Thread_local int ntasks_, tasks_cap;
static _Thread_local char* need_buf;
static _Thread_local size_t need_cap;

static pthread_key_t tl_key;
static pthread_once_t tl_once = PTHREAD_ONCE_INIT;
static void drop_held(int n);
static void tl_release(void* unused) {
  (void)unused;
  drop_held(ntasks_); /* a thread that ended inside a group: its calls never run */
  ntasks_ = 0;
  free(tasks);
  free(need_buf);
  tasks = NULL, need_buf = NULL;
  tasks_cap = 0, need_cap = 0;
}
static void tl_key_init(void) { pthread_key_create(&tl_key, tl_release); }
/* Free this thread's buffers when it exits. */
static void tl_register(void) {
  pthread_once(&tl_once, tl_key_init);
  pthread_setspecific(tl_key, &tasks_cap);
}

ch_status enq_task(struct ch_task* t) {
  if (ntasks_ == tasks_cap) {
    if (!tasks_cap) tl_register();
    int cap = tasks_cap ? 2 * tasks_cap : 16;
    struct ch_task* p = realloc(tasks, sizeof(*p) * (size_t)cap);
    if (!p) {
      WARN("out of memory queueing a call");
      exec_finish(t, 0); /* never queued: nobody else frees what its executor holds */
      return CH_SYSTEM;
    }
    tasks = p;
    tasks_cap = cap;
  }
  tasks[ntasks_] = *t;
  tasks[ntasks_].next = NULL;
  tasks[ntasks_].fr_id = t->part == 2 ? 0 : fr_enqueue(t->comm, t, depth == 0 && t->exec == EXEC_HOST);
  tasks[ntasks_].held = depth > 0, tasks[ntasks_].lost = 0;
  if (depth > 0) atomic_fetch_add(&t->comm->refs, 1); /* an abort meanwhile leaves comm to us */
  ntasks_++;
  if (depth == 0) {
    depth = 1;
    return group_end();
  }
  return CH_OK;
}

/* The group's calls will not run (an earlier call of it failed its checks, or an init): those whose
 * comm is still there are marked failed in its flight recorder. */
static void drop_tasks(ch_status why) {
  for (int k = 0; k < ntasks_; k++) {
    struct comm_guard g;
    if (!tasks[k].fr_id || tasks[k].lost || !comm_try_enter(tasks[k].comm, &g)) continue; /* aborted: gone */
    fr_fail_queued(tasks[k].comm, tasks[k].fr_id, tasks[k].fr_id, why);
    comm_leave(&g);
  }
  ntasks_ = 0;
}

/* A group runs on the highest executor any of its calls needs (core/exec.h): device buffers on the GPU
 * or staged, else a Chorus host stream when every call names it, else here, before returning. Tickets
 * keep each communicator's order behind plans already queued elsewhere either way. */
static enum ch_exec group_exec(struct ch_task** lists, int n) {
  int e = EXEC_HOST;
  for (int i = 0; i < n; i++)
    for (const struct ch_task* t = lists[i]; t; t = t->next) e = t->exec > e ? t->exec : e;
  return (enum ch_exec)e;
}

/* Tickets keep each communicator's plans in call order across threads and streams. Calls of a comm
 * whose tickets a CUDA stream draws when it gets there (comm->unticketed) come first: wait for
 * them (until an abort, after which the plans fail at their start anyway). */
static void draw_tickets(struct ch_plan** plans, int n) {
  for (int i = 0; i < n; i++)
    for (uint64_t k = 0; atomic_load(&plans[i]->comm->unticketed) && !__atomic_load_n(&plans[i]->comm->abort_flag, __ATOMIC_RELAXED); k++)
      ut_backoff(k);
  plan_tickets(plans, n);
}

/* Connected plans, one per communicator (lists[i]: its tasks): handed to their executor, or run here
 * and released. Every plans[i] is NULL afterwards. */
static ch_status launch_plans(struct ch_plan** plans, struct ch_task** lists, int n) {
  ch_status res = CH_OK;
  const struct ch_executor* x = ch_executors[group_exec(lists, n)];
  if (!x->own_tickets) draw_tickets(plans, n);
  if (x->launch && x->launch(plans, lists, n, &res)) return res;
  if (x->own_tickets) draw_tickets(plans, n);
  return plan_exec(plans, n); /* takes the plans: each is kept for reuse or freed, and NULLed */
}

#define SMALL 8
/* Mark the connections a plan needs (comm_connect's layout: [0, n) sends and receives, [n] the rings,
 * [n + 1, 2n + 1) the peers of RecDbl, Rabenseifner and Tree); returns whether some are missing. */
static int plan_needs(struct ncclComm* c, const struct ch_plan* pl, char* need_send, char* need_recv) {
  int n = c->nranks, unconnected = 0;
  for (int k = 0; k < pl->nops; k++) {
    const struct ch_op* op = &pl->ops[k];
    int peer = op->root;
    if (op->func == FUNC_SEND) {
      need_send[peer] = 1;
      unconnected |= !c->p2p[peer].send.connected;
    } else if (op->func == FUNC_RECV) {
      need_recv[peer] = 1;
      unconnected |= !c->p2p[peer].recv.connected || (peer != c->rank && !c->p2p[peer].recv_acked);
    } else if (n > 1) {
      need_send[n] = 1; /* rings */
      unconnected |= !c->rings_connected;
      /* With the rings, on every rank's first collective alike: the peers of RecDbl, Rabenseifner
       * and Tree for any call, so that ranks whose calls differ never wait for each other here. */
      if (!c->rings_connected && tune_peer_algos(c)) {
        algo_peer_set(c->rank, n, c->trees, c->ntrees, need_send + n + 1);
        algo_peer_set(c->rank, n, c->trees, c->ntrees, need_recv + n + 1);
      }
      /* Owner (the reproducible levels) talks to every rank: all pairs, with the rings. */
      for (int r = 0; !c->rings_connected && c->repro && r < n; r++)
        if (r != c->rank) need_send[n + 1 + r] = need_recv[n + 1 + r] = 1;
    }
  }
  return unconnected;
}

/* The peers a connection setup waits on: per-peer sets 0 and 1, and the rings' neighbours. */
static int connect_peers(const struct ncclComm* c, const char* ns, const char* nr) {
  int n = c->nranks, k = 0;
  for (int p = 0; p < n; p++) {
    int ring = 0;
    for (int ch = 0; ns[n] && ch < c->nchannels && !ring; ch++) ring = c->channels[ch].prev == p || c->channels[ch].next == p;
    k += p != c->rank && (ns[p] || nr[p] || ns[n + 1 + p] || nr[n + 1 + p] || ring);
  }
  return k;
}

/* Make the connections need_send/need_recv mark (plan_needs) for the group's comms, bounded by their
 * timeouts, and reserve the group's messages on the ones made (pool_after_connect). */
static ch_status connect_group(struct ncclComm** comms, struct ch_task** lists, int ncomms, char** need_send,
                               char** need_recv) {
  /* Connection setup waits on peers over the bootstrap: bound it by the comms' timeouts. */
  uint64_t now = ut_now_ns();
  for (int i = 0; i < ncomms; i++) {
    struct ncclComm* c = comms[i];
    uint64_t to = atomic_load(&c->timeout_ns);
    boot_set_deadline(c->boot, to ? now + to : 0);
    connect_context(c, lists[i]);
    /* For the stall report: a rank making connections is in a call, not idle. */
    atomic_store_explicit(&c->connecting_func, !lists[i] ? -1 : lists[i]->part ? lists[i]->origin : lists[i]->func,
                          memory_order_relaxed);
    atomic_store_explicit(&c->connecting_peer, lists[i] ? lists[i]->root : -1, memory_order_relaxed);
    atomic_store_explicit(&c->connecting, connect_peers(c, need_send[i], need_recv[i]), memory_order_release);
  }
  ch_status res = comm_connect(comms, ncomms, need_send, need_recv);
  for (int i = 0; i < ncomms; i++) {
    boot_set_deadline(comms[i]->boot, 0), boot_set_context(comms[i]->boot, NULL);
    atomic_store_explicit(&comms[i]->connecting, 0, memory_order_release);
  }
  if (res != CH_OK) return res;
  for (int i = 0; i < ncomms; i++) pool_after_connect(comms[i]);
  return CH_OK;
}

/* Waves: a group whose sends and receives meet more pooled peers (those on this host: pool.c) than
 * every rank's pool holds (an AlltoAll of a thousand ranks on one host) would connect them all at
 * once, a FIFO per peer: it runs instead in waves of at
 * most comm->p2p_wave peers (the smallest pool of any rank), each connected, run to the end here and
 * left to the pool, which releases its peers as the next wave needs room (pool.c). A pair of ranks
 * falls in the same wave at both ends (plan_wave_of), and every rank runs its waves in order, so wave
 * w of every rank finishes once every rank has finished the waves before it: no wave waits on a later
 * one. A rank whose group needs no waves (a Gather's sender) runs all of it at once, which waits on
 * nothing more. Only for one communicator whose group runs here (EXEC_HOST); other groups connect
 * every peer they need, as before. Returns the number of waves (0: not needed) and their width. */
#define WAVE_WAIT_NS (10 * UT_NS_PER_S) /* for the previous wave's peers to let go (pool_before_wave) */
static int wave_count(const struct ncclComm* c, const char* need_send, const char* need_recv, int* width) {
  int n = c->nranks;
  if (c->p2p_wave >= n - 1 || c->p2p_wave < 1) return 0;
  if (pool_count(c, need_send, need_recv) <= c->p2p_wave) return 0; /* network peers count too: they trim */
  *width = UT_MAX(1, c->p2p_wave / 2); /* a width of distances meets up to two peers at each */
  return UT_DIV_UP(n / 2, *width);
}

/* Run comm's group (list, planned whole as *full, which is given back) in nw waves of width distances.
 * *launched: some wave ran (its calls started in the recorder; a later failure ends them here). */
static ch_status launch_waves(struct ncclComm* c, struct ch_task* list, struct ch_plan** full, int nw, int width,
                              char* need_send, char* need_recv, int* launched) {
  int n = c->nranks, nplans = 0;
  ch_status res = CH_OK;
  plan_release(*full);
  *full = NULL;
  struct ch_plan** pls = calloc((size_t)nw, sizeof(*pls));
  if (!pls) {
    WARN("out of memory planning %d waves of a group of sends and receives", nw);
    return CH_SYSTEM;
  }
  for (int w = 0; w < nw; w++) { /* all built first: the first and the last that run are known */
    CHECK_GOTO(plan_build_wave(c, list, w, width, &pls[nplans]), res, out);
    if (pls[nplans]->nops || (w == nw - 1 && !nplans)) nplans++;
    else plan_release(pls[nplans]), pls[nplans] = NULL;
  }
  INFO(LOG_P2P, "rank %d: a group of sends and receives with more peers than CHORUS_P2P_PEERS=%d runs in %d waves",
       c->rank, c->p2p_wave, nplans);
  for (int k = 0; k < nplans; k++) pls[k]->wave_cont = k > 0, pls[k]->wave_more = k < nplans - 1;
  for (int k = 0; k < nplans && res == CH_OK; k++) {
    memset(need_send, 0, 2 * (size_t)n + 1);
    memset(need_recv, 0, 2 * (size_t)n + 1);
    int unconnected = plan_needs(c, pls[k], need_send, need_recv);
    uint64_t to = atomic_load(&c->timeout_ns);
    unconnected |= pool_before_wave(c, pls[k], k ? UT_MIN(to ? to : UINT64_MAX, WAVE_WAIT_NS) : 0);
    if (unconnected) res = connect_group(&c, &list, 1, &need_send, &need_recv);
    if (res != CH_OK) {
      if (k > 0) fr_end(c, pls[k]->fr_lo, pls[k]->fr_hi, res); /* started by the first wave */
      break;
    }
    *launched = 1;
    res = launch_plans(&pls[k], &list, 1); /* runs it here, to the end */
  }
out:
  for (int k = 0; k < nw; k++) plan_release(pls[k]);
  free(pls);
  return res;
}

/* Split the group's calls by communicator (keeping call order), plan, connect and run or queue them. */
static ch_status launch_tasks(void) {
  int ntasks = ntasks_, lost = 0;
  ntasks_ = 0;
  for (int k = 0; k < ntasks; k++) lost += tasks[k].lost;
  if (lost == ntasks) return CH_OK;
  if (ntasks == 1) { /* the common case, a lone repeated collective: its plan is ready and connected */
    struct comm_guard g;
    ch_status res = comm_enter(tasks[0].comm, &g);
    if (res != CH_OK) return res;
    comm_resume(tasks[0].comm, "a call"); /* a suspended comm has no cached plan: it goes on below */
    struct ch_plan* pl = plan_reuse(tasks[0].comm, &tasks[0]);
    struct ch_task* t0 = &tasks[0];
    int reused = pl != NULL;
    if (reused) res = launch_plans(&pl, &t0, 1);
    comm_leave(&g);
    if (reused) return res;
  }
  ch_status res = CH_OK;
  struct comm_guard guards_s[SMALL];
  struct ncclComm* comms_s[SMALL];
  struct ch_task *lists_s[SMALL], *tails_s[SMALL];
  struct ch_plan* plans_s[SMALL];
  char *send_s[SMALL], *recv_s[SMALL];
  int big = ntasks > SMALL;
  struct ncclComm** comms = big ? calloc((size_t)ntasks, sizeof(*comms)) : comms_s;
  struct ch_task** lists = big ? calloc((size_t)ntasks, sizeof(*lists)) : lists_s;
  struct ch_task** tails = big ? calloc((size_t)ntasks, sizeof(*tails)) : tails_s;
  struct ch_plan** plans = big ? calloc((size_t)ntasks, sizeof(*plans)) : plans_s;
  struct comm_guard* guards = big ? calloc((size_t)ntasks, sizeof(*guards)) : guards_s;
  char** need_send = big ? calloc((size_t)ntasks, sizeof(char*)) : send_s;
  char** need_recv = big ? calloc((size_t)ntasks, sizeof(char*)) : recv_s;
  int ncomms = 0, unconnected = 0, entered = 0, launched = 0;
  if (!comms || !lists || !tails || !plans || !guards || !need_send || !need_recv) {
    res = CH_SYSTEM;
    goto out;
  }
  for (int k = 0; k < ntasks; k++) {
    struct ch_task* t = &tasks[k];
    if (t->lost) continue;
    int i = 0;
    while (i < ncomms && comms[i] != t->comm) i++;
    if (i == ncomms) {
      comms[ncomms] = t->comm;
      lists[ncomms] = tails[ncomms] = NULL;
      plans[ncomms] = NULL;
      ncomms++;
    }
    if (tails[i]) tails[i]->next = t; else lists[i] = t;
    tails[i] = t;
  }
  /* Inside the library on every comm of the group until we return: an abort waits for us. */
  for (; entered < ncomms; entered++) CHECK_GOTO(comm_enter(comms[entered], &guards[entered]), res, out);
  for (int i = 0; i < ncomms; i++) comm_resume(comms[i], "a call"); /* what it needs is made below */
  size_t need = 0;
  for (int i = 0; i < ncomms; i++) need += 2 * (2 * (size_t)comms[i]->nranks + 1);
  if (need > need_cap) {
    if (!need_cap) tl_register();
    char* p = realloc(need_buf, need);
    if (!p) {
      res = CH_SYSTEM;
      goto out;
    }
    need_buf = p;
    need_cap = need;
  }
  memset(need_buf, 0, need);

  for (int i = 0, at = 0; i < ncomms; i++) {
    int n = comms[i]->nranks;
    need_send[i] = need_buf + at;
    need_recv[i] = need_buf + at + 2 * n + 1;
    at += 2 * (2 * n + 1);
    CHECK_GOTO(comm_ensure_ready(comms[i]), res, out);
    CHECK_GOTO(plan_build(comms[i], lists[i], &plans[i]), res, out);
    unconnected |= plan_needs(comms[i], plans[i], need_send[i], need_recv[i]);
    int width = 0, nw = ncomms == 1 && group_exec(lists, 1) == EXEC_HOST
                            ? wave_count(comms[0], need_send[0], need_recv[0], &width) : 0;
    if (nw > 1) {
      res = launch_waves(comms[0], lists[0], &plans[0], nw, width, need_send[0], need_recv[0], &launched);
      goto out;
    }
    unconnected |= pool_before_connect(comms[i], plans[i]);
  }
  if (unconnected) CHECK_GOTO(connect_group(comms, lists, ncomms, need_send, need_recv), res, out);

  launched = 1;
  res = launch_plans(plans, lists, ncomms);
out:
  /* Failed before any ran (setup, planning, connections): its calls will never start. */
  for (int i = 0; i < entered && !launched && res != CH_OK; i++) /* inside those comms: not freed under us */
    for (struct ch_task* t = lists[i]; t; t = t->next) fr_fail_queued(comms[i], t->fr_id, t->fr_id, res);
  for (int i = 0; i < ncomms && plans; i++) plan_release(plans[i]);
  while (entered > 0) comm_leave(&guards[--entered]);
  if (big) {
    free(guards);
    free(comms);
    free(lists);
    free(tails);
    free(plans);
    free(need_send);
    free(need_recv);
  }
  return res;
}

/* ncclGroupSimulateEnd: the sum of the cost model's predictions for the calls (tune/choose.c). */
static float estimate_us(void) {
  double us = 0;
  for (int k = 0; k < ntasks_; k++) {
    struct tune_choice how;
    struct comm_guard g;
    if (tasks[k].lost || !comm_try_enter(tasks[k].comm, &g)) continue; /* an abort waits for us */
    const struct ch_task* t = &tasks[k];
    us += tune_predict_sel(t->comm, t->func, t->count * red_type_size(t->type),
                           tune_repro_level(t->comm, t->func, t->type), t->sel, t->wire, &how); /* as plan_build will */
    comm_leave(&g);
  }
  return (float)us;
}

static ch_status group_close(float* simulate);

ch_status group_end(void) { return group_close(NULL); }

ch_status group_simulate_end(float* estimated_us) { return group_close(estimated_us); }

/* The group is done with its n calls: each executor finishes its own (device results copied back if
 * the group ran (ok), host copies freed either way). tasks[] still holds them after launch or drop. */
static ch_status finish_tasks(int n, int ok, ch_status res) {
  for (int k = 0; k < n; k++) {
    ch_status s = exec_finish(&tasks[k], ok && !tasks[k].lost);
    if (res == CH_OK) res = s;
  }
  return res;
}

/* The group is done with its n calls: host copies freed, and each held comm let go (its last touch). */
static void drop_held(int n) {
  finish_tasks(n, 0, CH_OK);
  for (int k = 0; k < n; k++)
    if (tasks[k].held) comm_unref(tasks[k].comm);
}

static ch_status group_run(float* simulate, ch_status* lost);

static ch_status group_close(float* simulate) {
  if (depth == 0) {
    WARN("%s called without a matching ncclGroupStart", simulate ? "ncclGroupSimulateEnd" : "ncclGroupEnd");
    return CH_INVALID_USAGE;
  }
  if (--depth > 0) return CH_OK;
  int n = ntasks_;
  ch_status lost = CH_OK, res = group_run(simulate, &lost);
  /* A simulated group ran nothing: no result to copy back (nor do dropped calls). */
  int ran = !simulate && (res == CH_OK || res == CH_IN_PROGRESS);
  res = finish_tasks(n, ran, res);
  for (int k = 0; k < n; k++) /* the last touch of each comm */
    if (tasks[k].held) comm_unref(tasks[k].comm);
  ch_status later = run_afters(ran); /* a call on a comm lost meanwhile fails its own check */
  if (res == CH_OK && lost == CH_OK) res = later;
  return res == CH_OK ? lost : res;
}

/* Calls on a comm aborted, revoked or destroyed (by another thread) since this group queued them:
 * nothing of it may be used but its struct and staging pool, which the calls' references keep.
 * They are dropped (lost); the group's other calls run. A later abort is seen by comm_enter. */
static ch_status group_drop_lost(void) {
  ch_status res = CH_OK;
  for (int k = 0; k < ntasks_; k++) {
    struct ncclComm* c = tasks[k].comm;
    if (!tasks[k].held || !(__atomic_load_n(&c->abort_flag, __ATOMIC_SEQ_CST) || atomic_load(&c->dead))) continue;
    if (res == CH_OK)
      WARN("ncclGroupEnd: communicator %p was aborted, revoked or destroyed after this group queued calls on it: "
           "those calls are dropped", (void*)c);
    tasks[k].lost = 1, res = CH_ABORTED;
  }
  return res;
}

static ch_status group_run(float* simulate, ch_status* lost) {
  ch_status res = group_error;
  group_error = CH_OK;
  if (res != CH_OK) {
    /* An earlier call in this group failed its checks: drop its calls, but still create the
     * communicators it asked for, whose handles the caller already holds. */
    drop_tasks(res);
    if (ninits) run_inits();
    return res;
  }
  if (ninits) {
    res = run_inits();
    if (res != CH_OK && res != CH_IN_PROGRESS) {
      drop_tasks(res);
      return res;
    }
  }
  *lost = group_drop_lost();
  if (simulate) { /* estimate, then drop the calls: nothing is launched */
    *simulate = estimate_us();
    drop_tasks(CH_OK); /* simulated: recorded as done, never started */
    return res;
  }
  ch_status r2 = launch_tasks();
  return r2 != CH_OK ? r2 : res;
}

void group_set_error(ch_status s) {
  if (depth > 0 && group_error == CH_OK) group_error = s;
}
