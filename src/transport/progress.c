/* A progress thread with a registered list (progress.h). */
#include <errno.h>
#include <stdatomic.h>

#include "../misc/utils.h"
#include "progress.h"

#define NEXT(p, r) (*(void**)((char*)(r) + (p)->next_off))
#define CLOSING(p, r) (*(int*)((char*)(r) + (p)->closing_off))
#define RELEASED(p, r) (*(int*)((char*)(r) + (p)->released_off))

/* Every progress of the process, for the fork hooks (appended under all_mu, never removed). */
#define MAX_PROGRESS 4
static struct progress* all[MAX_PROGRESS];
static int nall;
static pthread_mutex_t all_mu = PTHREAD_MUTEX_INITIALIZER;

/* A fork child has no progress thread: it forgets the parent's records (their communicators are
 * unusable there) and starts over at its next registration. Each lock is held across the fork, so no
 * record is half-way through a change. */
static void at_prepare(void) {
  pthread_mutex_lock(&all_mu);
  for (int i = nall - 1; i >= 0; i--) pthread_mutex_lock(&all[i]->lock);
}
static void at_parent(void) {
  for (int i = 0; i < nall; i++) pthread_mutex_unlock(&all[i]->lock);
  pthread_mutex_unlock(&all_mu);
}
static void at_child(void) {
  for (int i = 0; i < nall; i++) {
    struct progress* p = all[i];
    pthread_cond_init(&p->cond, NULL); /* a parent's waiter has no thread here */
    p->state = PROGRESS_NONE, p->incoming = p->list = NULL;
    atomic_store(&p->changes, 0);
    if (p->child) p->child();
    pthread_mutex_unlock(&p->lock); /* taken by this (the forking) thread in at_prepare */
  }
  pthread_mutex_unlock(&all_mu);
}
static pthread_once_t hooks_once = PTHREAD_ONCE_INIT;
static void install_hooks(void) { ut_atfork_register(at_prepare, at_parent, at_child); }

void progress_lock(struct progress* p) {
  if (!atomic_load(&p->hooked)) {
    pthread_once(&hooks_once, install_hooks);
    pthread_mutex_lock(&all_mu);
    if (!atomic_load(&p->hooked) && nall < MAX_PROGRESS) all[nall++] = p, atomic_store(&p->hooked, 1);
    pthread_mutex_unlock(&all_mu);
  }
  pthread_mutex_lock(&p->lock);
}

int progress_running_locked(struct progress* p) {
  if (p->state == PROGRESS_EXITED) { /* it let go of the lock for good before setting this */
    pthread_join(p->thread, NULL);
    p->state = PROGRESS_NONE;
  }
  return p->state == PROGRESS_RUNNING;
}

int progress_start_locked(struct progress* p) {
  int e = pthread_create(&p->thread, NULL, p->main, NULL);
  if (e == 0) p->state = PROGRESS_RUNNING;
  return e;
}

void progress_add_locked(struct progress* p, void* rec) {
  NEXT(p, rec) = p->incoming;
  p->incoming = rec;
  atomic_store(&p->changes, 1);
}

void progress_closing(struct progress* p, void* rec) {
  pthread_mutex_lock(&p->lock);
  CLOSING(p, rec) = 1;
  atomic_store(&p->changes, 1);
  pthread_mutex_unlock(&p->lock);
}

int progress_wait_released(struct progress* p, void* rec, const struct timespec* until) {
  pthread_mutex_lock(&p->lock);
  int e = 0;
  while (!RELEASED(p, rec) && e != ETIMEDOUT)
    e = until ? pthread_cond_timedwait(&p->cond, &p->lock, until) : pthread_cond_wait(&p->cond, &p->lock);
  int released = RELEASED(p, rec);
  if (released) progress_running_locked(p); /* joins the thread if rec was its last record */
  pthread_mutex_unlock(&p->lock);
  return released;
}

void progress_take_locked(struct progress* p, void (*take)(void* rec)) {
  while (p->incoming) {
    void* n = p->incoming;
    p->incoming = NEXT(p, n);
    NEXT(p, n) = p->list;
    p->list = n;
    if (take) take(n);
  }
}

int progress_sync(struct progress* p, void (*take)(void* rec), int (*let_go)(void* rec, uint64_t now),
                  void (*on_exit)(void), int* draining) {
  pthread_mutex_lock(&p->lock);
  atomic_store(&p->changes, 0);
  progress_take_locked(p, take);
  int released = 0;
  *draining = 0;
  uint64_t now = ut_now_ns();
  for (void** pp = &p->list; *pp;) {
    void* n = *pp;
    if (CLOSING(p, n) && let_go(n, now)) {
      *pp = NEXT(p, n);
      RELEASED(p, n) = 1;
      released = 1;
    } else {
      *draining |= CLOSING(p, n);
      pp = &NEXT(p, n);
    }
  }
  int exiting = !p->list;
  if (exiting) {
    if (on_exit) on_exit();
    p->state = PROGRESS_EXITED;
  }
  if (released || exiting) pthread_cond_broadcast(&p->cond);
  pthread_mutex_unlock(&p->lock);
  return exiting;
}
