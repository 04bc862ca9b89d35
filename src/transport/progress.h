/* A progress thread with a registered list, the part the network proxy (tcp_proxy.c) and the fabric
 * progress thread (fabric_proxy.c) share. Rank threads hand records over (progress_add_locked); the
 * thread takes them into its list at its next pass (progress_sync) and lets a closing one go when the
 * owner's let_go says so, setting its `released` and waking the waiters. The thread starts with the
 * first record, exits when none remain (the next caller that finds it gone joins it), and a forked
 * child starts afresh: it has no thread and forgets the parent's records. */
#ifndef CH_PROGRESS_H
#define CH_PROGRESS_H

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>
#include <time.h>

enum { PROGRESS_NONE, PROGRESS_RUNNING, PROGRESS_EXITED };

struct progress {
  /* Set once (PROGRESS_INIT). A record links through a `next` pointer and has int `closing` (set by a
   * rank under lock) and int `released` (set by the thread under lock), at these offsets. */
  void* (*main)(void*);
  size_t next_off, closing_off, released_off;
  void (*child)(void); /* the owner's own fork-child reset, lock held (may be NULL) */
  pthread_mutex_t lock;
  pthread_cond_t cond; /* lock: a record was released, or the thread exited */
  int state;           /* lock: PROGRESS_* (the thread sets EXITED as its last act under lock) */
  pthread_t thread;    /* lock */
  void* incoming;      /* lock: registered, not yet taken */
  void* list;          /* the thread's list: taken under lock, walked by the thread only */
  _Atomic int changes; /* records came or are closing: the thread's next pass syncs (any thread) */
  _Atomic int hooked;  /* in the fork hooks' table (progress.c) */
};
#define PROGRESS_INIT(type, main_, child_)                                                          \
  {                                                                                                 \
    .main = (main_), .next_off = offsetof(type, next), .closing_off = offsetof(type, closing),      \
    .released_off = offsetof(type, released), .child = (child_), .lock = PTHREAD_MUTEX_INITIALIZER, \
    .cond = PTHREAD_COND_INITIALIZER                                                                \
  }

/* Lock p (and, on first use, install its fork hooks). */
void progress_lock(struct progress* p);
/* Under lock: whether the thread runs, having joined one that exited. */
int progress_running_locked(struct progress* p);
/* Under lock, the thread not running: start it. 0, or pthread_create's error (nothing started). */
int progress_start_locked(struct progress* p);
/* Under lock: hand rec to the thread (it takes it in at its next pass; the caller wakes it). */
void progress_add_locked(struct progress* p, void* rec);
/* Mark rec closing (the caller then wakes the thread). */
void progress_closing(struct progress* p, void* rec);
/* Wait until the thread has let rec go, until `until` (CLOCK_REALTIME; NULL: for ever), and join the
 * thread if that was its last record. Whether rec was let go. */
int progress_wait_released(struct progress* p, void* rec, const struct timespec* until);
/* Under lock, the thread only: take new records into its list (take(rec) for each; may be NULL). */
void progress_take_locked(struct progress* p, void (*take)(void* rec));
/* The thread's sync of its list: take new records (take(rec) for each, under lock; may be NULL), let
 * closing ones go (let_go(rec, now) returns 1 once rec may go; under lock). With no record left, calls
 * on_exit (under lock; may be NULL), marks the thread exited and returns 1: it must return now.
 * *draining: some closing record stays for now. */
int progress_sync(struct progress* p, void (*take)(void* rec), int (*let_go)(void* rec, uint64_t now),
                  void (*on_exit)(void), int* draining);

#endif
