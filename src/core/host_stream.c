/* Host streams (chorus.h): a background thread per stream runs the plans enqueued on it, in order,
 * so callers overlap computation with communication. */
#include <stdlib.h>
#include <string.h>

#include "chorus.h"
#include "../misc/log.h"
#include "../misc/utils.h"
#include "../comm/work.h"
#include "exec.h"
#include "host_stream.h"
#include "plan.h"

#define STREAM_MAGIC 0x53545245414d4348ULL

/* What one group queued: plans run together by one plan_exec (they may wait on each other). */
struct ch_batch {
  struct ch_batch* next;
  /* An executor's hooks (staging/staging.c waits for device inputs before and lets the CUDA streams go
   * after; gpu/call.c settles the kernel's part after), or NULL. */
  void (*before)(void*, struct ch_plan**, int);
  void (*after)(void*, ch_status);
  void* hook_arg;
  int keep; /* its maker's (stream_batch_new): not freed after it ran */
  int n;
  struct ch_plan* plans[];
};

struct ch_stream {
  uint64_t magic;
  pthread_t thread;
  pthread_mutex_t mu; /* guards everything below */
  pthread_cond_t cv;
  struct ch_batch *head, *tail;
  int pending; /* batches queued or running */
  int stop;
  ch_status err;
  struct ch_stream* next_live; /* under live_mu */
};

/* The streams alive in this process. Every call with a stream asks whether it is ours; a global mutex
 * there is a convoy when several threads issue calls, so each thread remembers its last answer,
 * valid while `live_gen` (bumped under live_mu by every create and destroy) has not moved. */
static pthread_mutex_t live_mu = PTHREAD_MUTEX_INITIALIZER;
static struct ch_stream* live;
static _Atomic uint64_t live_gen = 1;
static _Thread_local struct {
  cudaStream_t s;
  uint64_t gen;
  int ours;
} last_lookup;

int stream_is_ours(cudaStream_t s) {
  uint64_t gen = atomic_load_explicit(&live_gen, memory_order_acquire);
  if (last_lookup.s == s && last_lookup.gen == gen) return last_lookup.ours;
  int found = 0;
  pthread_mutex_lock(&live_mu);
  gen = atomic_load_explicit(&live_gen, memory_order_relaxed);
  for (struct ch_stream* p = live; p; p = p->next_live) found |= (void*)p == (void*)s;
  pthread_mutex_unlock(&live_mu);
  last_lookup.s = s, last_lookup.gen = gen, last_lookup.ours = found;
  return found;
}

static void* stream_main(void* arg) {
  struct ch_stream* st = arg;
  pthread_mutex_lock(&st->mu);
  for (;;) {
    while (!st->head && !st->stop) pthread_cond_wait(&st->cv, &st->mu);
    if (!st->head && st->stop) break;
    struct ch_batch* b = st->head;
    st->head = b->next;
    if (!st->head) st->tail = NULL;
    pthread_mutex_unlock(&st->mu);
    /* WARNs of a batch of one communicator go to its ncclGetLastError record, as on the calling
     * thread. The comm outlives the batch: it is freed only after its last plan's done_ticket, which
     * plan_exec publishes as its last touch, and nothing logs after that. A batch of no plans runs
     * its hooks only, in queue order (staging/staging.c's dropped gates). */
    struct ncclComm* one = b->n ? b->plans[0]->comm : NULL;
    if (one) log_set_thread_rank(one->rank);
    for (int i = 1; i < b->n; i++)
      if (b->plans[i]->comm != one) one = NULL;
    struct log_err_sink* prev = log_set_error_sink(one ? &one->last_error : NULL);
    int keep = b->keep; /* read first: a kept batch may be queued again once `after` ran */
    if (b->before) b->before(b->hook_arg, b->plans, b->n);
    ch_status s = b->n ? plan_exec(b->plans, b->n) : CH_OK; /* takes the plans */
    if (b->after) b->after(b->hook_arg, s);
    log_set_error_sink(prev);
    if (!keep) free(b);
    pthread_mutex_lock(&st->mu);
    if (s != CH_OK && st->err == CH_OK) st->err = s;
    st->pending--;
    pthread_cond_broadcast(&st->cv);
  }
  pthread_mutex_unlock(&st->mu);
  return NULL;
}

/* The host-stream executor: the stream's thread runs all the group's plans together (so two
 * communicators sharing the stream progress at once) when every call of the group names that one
 * stream; otherwise the calling thread does. */
int stream_launch(struct ch_plan** plans, struct ch_task** lists, int n, ch_status* res) {
  cudaStream_t s = lists[0]->stream;
  for (int i = 0; i < n; i++)
    for (const struct ch_task* t = lists[i]; t; t = t->next)
      if (t->stream != s) return 0;
  if (!s || !stream_is_ours(s) || stream_enqueue(s, plans, n) != CH_OK) return 0;
  for (int i = 0; i < n; i++) plans[i] = NULL;
  *res = CH_OK;
  return 1;
}

ch_status stream_enqueue(cudaStream_t s, struct ch_plan** plans, int n) {
  return stream_enqueue_hook(s, plans, n, NULL, NULL, NULL);
}

struct ch_batch* stream_batch_new(int n, int keep) {
  struct ch_batch* b = malloc(sizeof(*b) + (size_t)n * sizeof(b->plans[0]));
  if (b) b->keep = keep;
  return b;
}

void stream_batch_free(struct ch_batch* b) { free(b); }

void stream_enqueue_batch(cudaStream_t s, struct ch_batch* b, struct ch_plan** plans, int n,
                          void (*before)(void*, struct ch_plan**, int), void (*after)(void*, ch_status), void* arg,
                          int tickets) {
  struct ch_stream* st = (struct ch_stream*)s;
  b->next = NULL;
  b->before = before, b->after = after, b->hook_arg = arg;
  b->n = n; /* at most the n it was made for */
  memcpy(b->plans, plans, (size_t)n * sizeof(b->plans[0]));
  pthread_mutex_lock(&st->mu);
  if (tickets) plan_tickets(b->plans, b->n); /* under the stream's lock: the queue stays in ticket order */
  if (st->tail) st->tail->next = b; else st->head = b;
  st->tail = b;
  st->pending++;
  pthread_cond_broadcast(&st->cv);
  pthread_mutex_unlock(&st->mu);
}

static ch_status enqueue(cudaStream_t s, struct ch_plan** plans, int n, void (*before)(void*, struct ch_plan**, int),
                         void (*after)(void*, ch_status), void* arg, int tickets) {
  struct ch_batch* b = stream_batch_new(n, 0);
  if (!b) return CH_SYSTEM; /* the caller runs the plans itself */
  stream_enqueue_batch(s, b, plans, n, before, after, arg, tickets);
  return CH_OK;
}

ch_status stream_enqueue_hook(cudaStream_t s, struct ch_plan** plans, int n, void (*before)(void*, struct ch_plan**, int),
                              void (*after)(void*, ch_status), void* arg) {
  return enqueue(s, plans, n, before, after, arg, 0);
}
ch_status stream_enqueue_tickets(cudaStream_t s, struct ch_plan** plans, int n,
                                 void (*before)(void*, struct ch_plan**, int), void (*after)(void*, ch_status), void* arg) {
  return enqueue(s, plans, n, before, after, arg, 1);
}

ch_status comm_wait_idle(struct ncclComm* comm) {
  /* Calls a stream is still to ticket: not once an abort began (it drops them, and waits for us) */
  for (uint64_t i = 0; (atomic_load(&comm->unticketed) && !atomic_load(&comm->aborting)) ||
                       atomic_load(&comm->done_ticket) != atomic_load(&comm->next_ticket);
       i++)
    ut_backoff(i);
  return CH_OK;
}

/* Only batches of comm's plans alone, without an executor's hooks (before or after functions: those
 * run, and abort, in turn). Completions are published in ticket order (a plan waits for done_ticket
 * to reach its ticket before it starts): a plan taken off ends only once every earlier plan of comm
 * has, whichever stream runs those. Lock order: live_mu, then a stream's mu. */
void comm_wait_idle_aborting(struct ncclComm* comm) {
  struct ch_plan* taken = NULL;
  pthread_mutex_lock(&live_mu);
  for (struct ch_stream* st = live; st; st = st->next_live) {
    pthread_mutex_lock(&st->mu);
    int removed = 0;
    struct ch_batch* prev = NULL;
    for (struct ch_batch** pp = &st->head; *pp;) {
      struct ch_batch* b = *pp;
      int only = !b->before && !b->after;
      for (int i = 0; i < b->n && only; i++) only = b->plans[i]->comm == comm;
      if (!only) {
        prev = b, pp = &b->next;
        continue;
      }
      *pp = b->next;
      if (st->tail == b) st->tail = prev;
      for (int i = 0; i < b->n; i++) b->plans[i]->next = taken, taken = b->plans[i];
      free(b);
      st->pending--;
      if (st->err == CH_OK) st->err = CH_ABORTED;
      removed = 1;
    }
    if (removed) pthread_cond_broadcast(&st->cv);
    pthread_mutex_unlock(&st->mu);
  }
  pthread_mutex_unlock(&live_mu);
  for (uint64_t i = 0; atomic_load(&comm->done_ticket) != atomic_load(&comm->next_ticket); i++) {
    uint64_t due = atomic_load(&comm->done_ticket);
    for (struct ch_plan** pp = &taken; *pp; pp = &(*pp)->next)
      if ((*pp)->ticket == due) {
        struct ch_plan* pl = *pp;
        *pp = pl->next;
        plan_cancel(pl); /* done_ticket moves on */
        i = 0;
        break;
      }
    ut_backoff(i);
  }
}


ch_status stream_create(cudaStream_t* stream) {
  struct ch_stream* st = calloc(1, sizeof(*st));
  if (!st) return CH_SYSTEM;
  st->magic = STREAM_MAGIC;
  pthread_mutex_init(&st->mu, NULL);
  pthread_cond_init(&st->cv, NULL);
  if (pthread_create(&st->thread, NULL, stream_main, st) != 0) {
    WARN("cannot start a stream thread: %s", strerror(errno));
    free(st);
    return CH_SYSTEM;
  }
  pthread_mutex_lock(&live_mu);
  st->next_live = live;
  live = st;
  atomic_fetch_add_explicit(&live_gen, 1, memory_order_release);
  pthread_mutex_unlock(&live_mu);
  *stream = (cudaStream_t)st;
  return CH_OK;
}


int stream_valid(cudaStream_t s, const char* fn) {
  if (!s || !stream_is_ours(s) || ((struct ch_stream*)s)->magic != STREAM_MAGIC) {
    WARN("%s: %p is not a stream made by chorusStreamCreate", fn, (void*)s);
    return 0;
  }
  return 1;
}

ch_status stream_sync(cudaStream_t stream) {
  struct ch_stream* st = (struct ch_stream*)stream;
  pthread_mutex_lock(&st->mu);
  while (st->pending) pthread_cond_wait(&st->cv, &st->mu);
  ch_status err = st->err;
  st->err = CH_OK;
  pthread_mutex_unlock(&st->mu);
  return err;
}

ch_status stream_query(cudaStream_t stream) {
  struct ch_stream* st = (struct ch_stream*)stream;
  pthread_mutex_lock(&st->mu);
  ch_status r = st->pending ? CH_IN_PROGRESS : st->err;
  pthread_mutex_unlock(&st->mu);
  return r;
}

void stream_wait_idle(cudaStream_t stream) {
  struct ch_stream* st = (struct ch_stream*)stream;
  pthread_mutex_lock(&st->mu);
  while (st->pending) pthread_cond_wait(&st->cv, &st->mu);
  pthread_mutex_unlock(&st->mu);
}




void stream_destroy(cudaStream_t stream) {
  struct ch_stream* st = (struct ch_stream*)stream;
  pthread_mutex_lock(&live_mu);
  for (struct ch_stream** p = &live; *p; p = &(*p)->next_live)
    if (*p == st) { *p = st->next_live; break; }
  atomic_fetch_add_explicit(&live_gen, 1, memory_order_release);
  pthread_mutex_unlock(&live_mu);
  pthread_mutex_lock(&st->mu);
  st->stop = 1;
  pthread_cond_broadcast(&st->cv);
  pthread_mutex_unlock(&st->mu);
  pthread_join(st->thread, NULL); /* finishes queued work first */
  pthread_mutex_destroy(&st->mu);
  pthread_cond_destroy(&st->cv);
  st->magic = 0;
  free(st);
}
