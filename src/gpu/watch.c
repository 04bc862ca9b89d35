/* Ranks on one GPU (gpu.h): nothing on the host waits while a CUDA stream waits for a peer's barrier
 * word, so a peer process that dies then, or a stream that never gets there, would hang its peers'
 * streams silently. One thread per process looks at every such communicator ten times a second while
 * it has calls in flight: a peer process that is gone (same host and PID namespace: kill(pid, 0)), or a
 * call unfinished for CHORUS_TIMEOUT, fails the communicator (WARN naming the rank, async error),
 * which lets every stream through (gpu_unblock).
 * `watched` and the gpu_comm watch fields: under watch_mu, only the watcher thread and
 * gpu_watch_add/remove touch them. */
#define _GNU_SOURCE
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "../misc/log.h"
#include "../misc/utils.h"
#include "../core/init.h"
#include "gpu.h"

static pthread_mutex_t watch_mu = PTHREAD_MUTEX_INITIALIZER;
static struct gpu_comm* watched;
static int running; /* the watcher thread exists (under watch_mu) */

static void fail(struct gpu_comm* g, ch_status s) {
  g->watch_fired = 1;
  comm_set_async_error(g->comm, s); /* and gpu_unblock */
}

static void look(struct gpu_comm* g, uint64_t now) {
  struct ncclComm* comm = g->comm;
  uint32_t oldest = 0;
  int32_t by = g->seg ? atomic_load_explicit(&g->seg->failed_by, memory_order_acquire) : 0;
  if (!g->watch_fired && by > 0 && by - 1 != g->rank) {
    struct log_err_sink* prev = log_set_error_sink(&comm->last_error);
    WARN("rank %d: rank %d failed this communicator's calls on device buffers (its log says why): failing them "
         "here too", g->rank, by - 1);
    log_set_error_sink(prev);
    fail(g, CH_REMOTE);
  }
  if (!gpu_unfinished(g, &oldest)) {
    g->watch_since = 0;
    return;
  }
  if (atomic_load_explicit(&g->priv->failed, memory_order_acquire)) {
    /* failed (here, by the bridge or an abort): streams that went on write their own, lower, numbers
     * into their words, which peers may still wait on: raise them again */
    gpu_unblock(g);
    return;
  }
  if (!g->watch_since || oldest != g->watch_seq) g->watch_seq = oldest, g->watch_since = now;
  struct log_err_sink* prev = log_set_error_sink(&comm->last_error);
  const struct boot_rank_info* me = &comm->peers[g->rank];
  for (int r = 0; r < g->n && !g->watch_fired; r++) {
    const struct boot_rank_info* p = &comm->peers[r];
    if (g->same_proc[r] || p->pid_ns != me->pid_ns || p->pid <= 0) continue;
    if (kill(p->pid, 0) != 0 && errno == ESRCH) {
      WARN("rank %d: rank %d (pid %d on %s) is gone while this rank's CUDA stream waits for it in call #%u on "
           "device buffers: failing the communicator (its streams run on)", g->rank, r, (int)p->pid, p->hostname,
           oldest);
      fail(g, CH_REMOTE);
    }
  }
  uint64_t timeout = atomic_load_explicit(&comm->timeout_ns, memory_order_relaxed);
  if (!g->watch_fired && timeout && now - g->watch_since > timeout) {
    WARN("rank %d: call #%u on device buffers has not finished on its CUDA stream for %.0f s (a peer's stream "
         "never reached it, or work queued before it never ended): failing it (CHORUS_TIMEOUT)",
         g->rank, oldest, (double)(now - g->watch_since) / UT_NS_PER_S);
    fail(g, CH_TIMEOUT);
  }
  log_set_error_sink(prev);
}

static void* watch_main(void* arg) {
  (void)arg;
  log_set_thread_rank(-1);
  for (;;) {
    struct timespec ts = {0, (long)(100 * UT_NS_PER_MS)};
    nanosleep(&ts, NULL);
    pthread_mutex_lock(&watch_mu);
    uint64_t now = ut_now_ns();
    for (struct gpu_comm* g = watched; g; g = g->next_watched) look(g, now);
    pthread_mutex_unlock(&watch_mu);
    gpu_orphans_tick(0); /* never a free here: the device may be waiting for this thread */
  }
  return NULL;
}

/* A fork child has no watcher thread, and must not inherit the lock held by one. */
static void at_prepare(void) { pthread_mutex_lock(&watch_mu); }
static void at_parent(void) { pthread_mutex_unlock(&watch_mu); }
static void at_child(void) {
  pthread_mutex_init(&watch_mu, NULL);
  running = 0;
  watched = NULL; /* the parent's communicators are not the child's to watch */
}
static pthread_once_t hooks_once = PTHREAD_ONCE_INIT;
static void install_hooks(void) { ut_atfork_register(at_prepare, at_parent, at_child); }

void gpu_watch_add(struct gpu_comm* g) {
  pthread_once(&hooks_once, install_hooks);
  pthread_mutex_lock(&watch_mu);
  g->next_watched = watched;
  watched = g;
  if (!running) {
    pthread_t t;
    if (pthread_create(&t, NULL, watch_main, NULL) == 0) {
      pthread_detach(t);
      running = 1;
    } else {
      INFO(LOG_INIT, "cannot start the GPU watcher thread: %s (a dead peer may then hang a stream)", strerror(errno));
    }
  }
  pthread_mutex_unlock(&watch_mu);
}

void gpu_watch_remove(struct gpu_comm* g) {
  pthread_mutex_lock(&watch_mu);
  for (struct gpu_comm** pp = &watched; *pp; pp = &(*pp)->next_watched)
    if (*pp == g) {
      *pp = g->next_watched;
      break;
    }
  pthread_mutex_unlock(&watch_mu);
}
