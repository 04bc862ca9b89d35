/* Host streams (chorus.h): a background thread per stream runs the plans enqueued on it, in order,
 * so callers overlap computation with communication. */
#include <stdlib.h>
#include <string.h>

#include "chorus.h"
#include "../misc/log.h"
#include "../misc/utils.h"
#include "api.h"
#include "enqueue.h"

#define STREAM_MAGIC 0x53545245414d4348ULL

/* What one group queued: plans run together by one plan_exec (they may wait on each other). */
struct ch_batch {
  struct ch_batch* next;
  struct stage_gate* gate; /* run once it opens (device buffers in CUDA stream order), or NULL */
  void (*after)(void*, ch_status); /* run after the plans (gpu_call.c), or NULL */
  void* after_arg;
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
    log_set_thread_rank(b->plans[0]->comm->rank);
    /* WARNs of a batch of one communicator go to its ncclGetLastError record, as on the calling
     * thread. The comm outlives the batch: it is freed only after its last plan's done_ticket, which
     * plan_exec publishes as its last touch, and nothing logs after that. */
    struct ncclComm* one = b->plans[0]->comm;
    for (int i = 1; i < b->n; i++)
      if (b->plans[i]->comm != one) one = NULL;
    struct log_err_sink* prev = log_set_error_sink(one ? &one->last_error : NULL);
    if (b->gate) stage_gate_wait(b->gate, b->plans, b->n);
    ch_status s = plan_exec(b->plans, b->n); /* takes the plans */
    if (b->gate) stage_gate_open(b->gate);
    if (b->after) b->after(b->after_arg, s);
    log_set_error_sink(prev);
    free(b);
    pthread_mutex_lock(&st->mu);
    if (s != CH_OK && st->err == CH_OK) st->err = s;
    st->pending--;
    pthread_cond_broadcast(&st->cv);
  }
  pthread_mutex_unlock(&st->mu);
  return NULL;
}

ch_status stream_enqueue(cudaStream_t s, struct ch_plan** plans, int n) { return stream_enqueue_gated(s, plans, n, NULL); }

static ch_status enqueue(cudaStream_t s, struct ch_plan** plans, int n, struct stage_gate* g,
                         void (*after)(void*, ch_status), void* arg) {
  struct ch_stream* st = (struct ch_stream*)s;
  struct ch_batch* b = malloc(sizeof(*b) + (size_t)n * sizeof(b->plans[0]));
  if (!b) return CH_SYSTEM; /* the caller runs the plans itself */
  b->next = NULL;
  b->gate = g;
  b->after = after, b->after_arg = arg;
  b->n = n;
  memcpy(b->plans, plans, (size_t)n * sizeof(b->plans[0]));
  pthread_mutex_lock(&st->mu);
  if (st->tail) st->tail->next = b; else st->head = b;
  st->tail = b;
  st->pending++;
  pthread_cond_broadcast(&st->cv);
  pthread_mutex_unlock(&st->mu);
  return CH_OK;
}

ch_status stream_enqueue_gated(cudaStream_t s, struct ch_plan** plans, int n, struct stage_gate* g) {
  return enqueue(s, plans, n, g, NULL, NULL);
}

ch_status stream_enqueue_hook(cudaStream_t s, struct ch_plan** plans, int n, void (*after)(void*, ch_status), void* arg) {
  return enqueue(s, plans, n, NULL, after, arg);
}

ch_status comm_wait_idle(struct ncclComm* comm) {
  for (uint64_t i = 0; atomic_load(&comm->done_ticket) != atomic_load(&comm->next_ticket); i++) ut_backoff(i);
  return CH_OK;
}

/* Only batches of comm's plans alone, without device-buffer hooks (a gate or an after function: those
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
      int only = !b->gate && !b->after;
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

static struct ch_stream* stream_get(cudaStream_t s, const char* fn) {
  struct ch_stream* st = (struct ch_stream*)s;
  if (!s || !stream_is_ours(s) || st->magic != STREAM_MAGIC) {
    WARN("%s: %p is not a stream made by chorusStreamCreate", fn, (void*)s);
    return NULL;
  }
  return st;
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

CH_API(ncclResult_t, chorusStreamCreate, cudaStream_t* stream) {
  if (!stream) {
    WARN("chorusStreamCreate: stream is NULL");
    return ncclInvalidArgument;
  }
  return ch_to_nccl(stream_create(stream));
}

void stream_wait_idle(cudaStream_t stream) {
  struct ch_stream* st = (struct ch_stream*)stream;
  pthread_mutex_lock(&st->mu);
  while (st->pending) pthread_cond_wait(&st->cv, &st->mu);
  pthread_mutex_unlock(&st->mu);
}

CH_API(ncclResult_t, chorusStreamSynchronize, cudaStream_t stream) {
  struct ch_stream* st = stream_get(stream, "chorusStreamSynchronize");
  if (!st) return ncclInvalidArgument;
  pthread_mutex_lock(&st->mu);
  while (st->pending) pthread_cond_wait(&st->cv, &st->mu);
  ch_status err = st->err;
  st->err = CH_OK;
  pthread_mutex_unlock(&st->mu);
  return ch_to_nccl(err);
}

CH_API(ncclResult_t, chorusStreamQuery, cudaStream_t stream) {
  struct ch_stream* st = stream_get(stream, "chorusStreamQuery");
  if (!st) return ncclInvalidArgument;
  pthread_mutex_lock(&st->mu);
  ncclResult_t r = st->pending ? ncclInProgress : ch_to_nccl(st->err);
  pthread_mutex_unlock(&st->mu);
  return r;
}

CH_API(ncclResult_t, chorusStreamDestroy, cudaStream_t stream) {
  struct ch_stream* st = stream_get(stream, "chorusStreamDestroy");
  if (!st) return ncclInvalidArgument;
  stream_destroy(stream);
  return ncclSuccess;
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
