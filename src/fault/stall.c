/* Stall reports: what a rank that stopped making progress is waiting for. Printed when a call times
 * out (CHORUS_TIMEOUT, chorusCommSetTimeout) or on CHORUS_DUMP_SIGNAL: one WARN per pending operation,
 * naming the collective, its sequence number, how far it got and the peer whose data or credit it
 * waits for, then the job-wide summary of fault/stall_job.c. */
#include <pthread.h>
#include <semaphore.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "../misc/log.h"
#include "../misc/param.h"
#include "../misc/utils.h"
#include "../comm/work.h"
#include "../tune/tune.h"
#include "../observe/observe.h"
#include "stall.h"

/* Which peer op is blocked on, from what its last primitive would sleep on. */
int stall_waits_for(const struct ch_op* op, int* peer) {
  const struct prim_ctx* c = &op->ctx;
  *peer = -1;
  if (op->algo == ALGO_DIRECT && op->idx < 3) return STALL_WAIT_CLIQUE;
  if (c->in && c->in->ctrl && c->wait_word == &c->in->ctrl->tail) {
    *peer = c->in->peer;
    return STALL_WAIT_DATA;
  }
  if (c->out && c->out->ctrl && c->wait_word == &c->out->ctrl->head) {
    *peer = c->out->peer;
    return STALL_WAIT_ROOM;
  }
  return STALL_WAIT_TURN;
}

static const char* const wait_what[STALL_WAIT_COUNT] = {
    "its turn (an earlier call on this communicator has not finished)", "data from", "room in the FIFO of",
    "the other ranks of its Direct clique"};

/* This rank's pending operations, one WARN each; then every rank's state, gathered from their
 * processes (fault/stall_job.c), so the report says who reached the call and who did not. */
void stall_report(const struct ch_plan* pl, double idle_s, int on_request) {
  const struct ncclComm* comm = pl->comm;
  int reported = 0;
  stall_note_plan(pl, (uint64_t)(idle_s * UT_NS_PER_S), !on_request); /* our own record, current */
  for (int l = 0; l < pl->nlanes; l++) {
    const struct ch_lane* ln = &pl->lanes[l];
    if (ln->cur >= ln->nops) continue;
    const struct ch_op* op = ln->ops[ln->cur];
    int peer;
    const char* what = wait_what[stall_waits_for(op, &peer)];
    char who[32] = "";
    if (peer >= 0) snprintf(who, sizeof(who), " rank %d", peer);
    uint64_t nsteps = op->nidx ? op->nidx - 1 : 0;
    int coll = stall_is_coll(op->func);
    WARN("rank %d: %s for %.0f s: %s%s%llu (%zu x %s, %s/%s) at step %llu of %llu, waiting for %s%s",
         comm->rank, on_request ? "report on request: no progress" : "no progress", idle_s, tune_func_name(op->func), coll ? " #" : (op->func == FUNC_SEND ? " to peer " : " from peer "),
         coll ? (unsigned long long)op->ctx.hdr.seq : (unsigned long long)op->root, op->count, red_type_name((int)(op->ctx.hdr.type & XFER_TYPE_MASK)),
         algo_name(op->algo), tune_proto_name(op->proto), (unsigned long long)op->idx,
         (unsigned long long)nsteps, what, who);
    reported++;
  }
  if (!reported)
    WARN("rank %d: no progress for %.0f s in a call on communicator %p waiting for its turn", comm->rank, idle_s,
         (const void*)comm);
  char why[64];
  if (on_request) snprintf(why, sizeof(why), "on request: ");
  else snprintf(why, sizeof(why), "no progress for %.0f s: ", idle_s);
  /* A timeout asks every rank to write its flight recorder (the one stuck elsewhere too); on a signal
   * each signalled process writes its own (stall_dump_thread), so the others are not asked again. */
  stall_job_report(comm, why, on_request ? STALL_DUMP_NONE : STALL_DUMP_TIMEOUT);
}

/* CHORUS_DUMP_SIGNAL: the handler only counts requests (async-signal-safe); ranks blocked in plan_exec
 * see the count move on their next idle pass and log stall_report. */
static _Atomic unsigned dump_requests;
static pthread_once_t dump_once = PTHREAD_ONCE_INIT;

/* The flight recorders are written by a thread of their own, woken by the handler (sem_post is
 * async-signal-safe): a rank that is not in a call (the one the others wait for, busy elsewhere) writes
 * its recorder too. */
static sem_t dump_sem;
static int dump_thread_ok;

static void on_dump_signal(int sig) {
  (void)sig;
  atomic_fetch_add_explicit(&dump_requests, 1, memory_order_relaxed);
  if (dump_thread_ok) sem_post(&dump_sem);
}

static void* dump_thread(void* arg) {
  (void)arg;
  for (;;) {
    while (sem_wait(&dump_sem) != 0) {}
    stall_dump_all(STALL_DUMP_SIGNAL);
  }
  return NULL;
}

static void dump_install(void) {
  const char* v = param_str(PARAM_DUMP_SIGNAL);
  if (!v[0]) return;
  static const struct { const char* name; int sig; } names[] = {
      {"USR1", SIGUSR1}, {"USR2", SIGUSR2}, {"HUP", SIGHUP}, {"QUIT", SIGQUIT}, {"URG", SIGURG}};
  const char* n = strncasecmp(v, "SIG", 3) == 0 ? v + 3 : v;
  int sig = 0;
  for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++)
    if (!strcasecmp(n, names[i].name)) sig = names[i].sig;
  if (!sig) sig = atoi(v);
  if (sig <= 0 || sig >= NSIG || sig == SIGKILL || sig == SIGSTOP) {
    WARN("CHORUS_DUMP_SIGNAL=%s is not a signal that can be caught (use e.g. SIGUSR1)", v);
    return;
  }
  pthread_t th;
  if (sem_init(&dump_sem, 0, 0) == 0 && pthread_create(&th, NULL, dump_thread, NULL) == 0) {
    pthread_detach(th);
    dump_thread_ok = 1;
  }
  struct sigaction sa;
  memset(&sa, 0, sizeof(sa));
  sa.sa_handler = on_dump_signal;
  sa.sa_flags = SA_RESTART;
  sigemptyset(&sa.sa_mask);
  if (sigaction(sig, &sa, NULL) != 0) WARN("CHORUS_DUMP_SIGNAL: sigaction(%d) failed", sig);
  else INFO(LOG_INIT, "CHORUS_DUMP_SIGNAL: signal %d makes blocked ranks report what they wait for", sig);
}

void stall_install_signal(void) { pthread_once(&dump_once, dump_install); }
unsigned stall_dump_requests(void) { return atomic_load_explicit(&dump_requests, memory_order_relaxed); }

void stall_dump_failure(struct ncclComm* comm, ch_status st) {
  const char* why = st == CH_TIMEOUT                 ? "timeout"
                    : atomic_load(&comm->poisoned)   ? "mismatch"
                    : st == CH_REMOTE                ? "peer-lost"
                                                     : fr_status_word(st);
  fr_dump_first(comm, why);
}
