/* CUDA frees that may wait for the whole device, run on a thread nothing waits for.
 *
 * cuMemFreeHost and cuMemFree synchronise the device (PyTorch caches pinned memory to avoid exactly
 * that). A thread that a CUDA stream may be waiting for must therefore never call them: a caller
 * whose next call on one communicator is what a peer's stream waits for (that peer's stream waits for
 * this rank's input), or the GPU watcher, the one thread that lets streams stuck on a dead peer go,
 * would wait for the device while the device waits for it. Such frees are queued here instead.
 *
 * `q_head`, `q_tail`, `running`, `exiting`: under q_mu. The thread is detached and never ends; a fork
 * child starts without it and drops the parent's queue (its contexts are not the child's); once the
 * process exits it starts no more jobs (the driver may be torn down by then; one running goes on). Frees handed
 * over by an abort may still be queued when it returns: the pinned memory goes back a moment later. */
#define _GNU_SOURCE
#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "../misc/log.h"
#include "../misc/utils.h"
#include "cudrv.h"

struct job {
  struct job* next;
  void (*fn)(void*, void*);
  void *a, *b;
};

static pthread_mutex_t q_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t q_cv = PTHREAD_COND_INITIALIZER;
static struct job *q_head, *q_tail;
static int running;
static int exiting; /* the process is exiting: no more driver calls from here (CUDA may be torn down) */

static void* reaper_main(void* arg) {
  (void)arg;
  log_set_thread_rank(-1);
  pthread_mutex_lock(&q_mu);
  for (;;) {
    while (!q_head || exiting) pthread_cond_wait(&q_cv, &q_mu);
    struct job* j = q_head;
    if (!(q_head = j->next)) q_tail = NULL;
    pthread_mutex_unlock(&q_mu);
    j->fn(j->a, j->b);
    free(j);
    pthread_mutex_lock(&q_mu);
  }
  return NULL;
}

static void at_prepare(void) { pthread_mutex_lock(&q_mu); }
static void at_parent(void) { pthread_mutex_unlock(&q_mu); }
static void at_child(void) {
  pthread_mutex_init(&q_mu, NULL);
  pthread_cond_init(&q_cv, NULL);
  q_head = q_tail = NULL; /* leaked on purpose: the parent's pinned memory is not the child's to free */
  running = 0;
}
static void at_exit(void) { /* what is still queued is the process's to give back */
  pthread_mutex_lock(&q_mu);
  exiting = 1;
  pthread_mutex_unlock(&q_mu);
}
static pthread_once_t hooks_once = PTHREAD_ONCE_INIT;
static void install_hooks(void) {
  ut_atfork_register(at_prepare, at_parent, at_child);
  atexit(at_exit);
}

void cudrv_defer(void (*fn)(void*, void*), void* a, void* b) {
  pthread_once(&hooks_once, install_hooks);
  struct job* j = malloc(sizeof(*j));
  pthread_mutex_lock(&q_mu);
  if (j && !running) {
    pthread_t t;
    int e = pthread_create(&t, NULL, reaper_main, NULL);
    if (e == 0) {
      pthread_detach(t);
      running = 1;
    } else {
      INFO(LOG_INIT, "cannot start the thread that frees CUDA memory: %s (freeing on the caller's thread)",
           strerror(e));
    }
  }
  int queued = j && running;
  if (queued) {
    *j = (struct job){NULL, fn, a, b};
    if (q_tail) q_tail->next = j;
    else q_head = j;
    q_tail = j;
    pthread_cond_signal(&q_cv);
  }
  pthread_mutex_unlock(&q_mu);
  if (!queued) { /* no thread, or no memory for the job: better a wait here than a leak */
    free(j);
    fn(a, b);
  }
}

static void host_free_job(void* p, void* ctx) { cudrv_host_free(p, ctx); }
void cudrv_host_free_later(void* p, void* ctx) {
  if (p) cudrv_defer(host_free_job, p, ctx);
}
