/* The network proxy: one thread per process moves Simple steps between this process's local FIFOs and
 * TCP sockets, for every communicator of the process.
 *
 *   sender side  : a rank posts `tail` on its local FIFO; the proxy sends each posted slot (a
 *                  tcp_step header, then the payload) and advances `head` (credit back to the rank).
 *   receiver side: the proxy reads a step into a free slot of the receiver's FIFO (only when
 *                  tail - head < CH_STEPS), fills size[]/hdr[] and publishes `tail` (release) after all
 *                  bytes are in, then wakes the rank. Counters never cross the wire.
 *
 * Sleeping: after CHORUS_NET_SPIN_US without progress the proxy stores TP_SLEEP_PROXY into the
 * sleeping word it would be woken by on each FIFO (recv_sleeping of send FIFOs, send_sleeping of
 * receive FIFOs), re-checks the counters (Dekker pair with tp_wake) and blocks in epoll_wait on its
 * sockets and an eventfd; tp_wake of a rank writes the eventfd. Sockets are edge-triggered: rd_ready /
 * wr_ready stay set until a call returns EAGAIN, so no pass wastes a syscall on an idle socket.
 *
 * This file runs the thread: its epoll set, accepting and authenticating sockets, sleeping and
 * waking, and the records' lifetime; tcp_link.c moves each connection's bytes.
 *
 * Ownership: a record (struct tcp_conn) is built by a rank thread and handed over through px.pg
 * (progress.h); from then on only this thread touches its progress fields. Teardown (destroy or abort)
 * sets `closing` under px.pg.lock and waits until the proxy sets `released`, after which the proxy
 * never touches the record or its FIFO again and the rank frees both. The thread starts with the first
 * record, exits when none remain (the last unregistering thread joins it), and a forked child starts
 * afresh. */
#define _GNU_SOURCE
#include <errno.h>
#include <stddef.h>
#include <netinet/tcp.h>
#include <stdint.h>
#include <stdio.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include "../misc/log.h"
#include "../misc/param.h"
#include "../misc/sha256.h"
#include "../misc/utils.h"
#include "progress.h"
#include "tcp.h"

#define MAX_ACCEPTS 256 /* sockets accepted and still authenticating (a large job's burst fits) */
#define ACCEPT_TIMEOUT_NS (5ull * UT_NS_PER_S) /* an accepted socket must authenticate by then */
#define EVICT_AFTER_NS (UT_NS_PER_S) /* when all are taken, one silent this long makes room */
#define ACCEPTS_PER_PASS 32 /* then the proxy moves data again before accepting more */
#define DRAIN_TIMEOUT_NS (30ull * UT_NS_PER_S)  /* a closing sender flushes posted steps this long */
#define ABORT_FLUSH_NS (200ull * UT_NS_PER_MS)       /* an aborted one, only a poison record, this long */
#define BYE_TIMEOUT_NS (2000ull * UT_NS_PER_MS)      /* and a goodbye that finds the socket buffer full */
#define TAG_LISTENER ((void*)1)
#define TAG_EVENTFD ((void*)2)

struct pending { /* an accepted socket that has not authenticated yet (proxy thread only) */
  int fd;
  union sock_addr remote;
  uint64_t deadline;
  size_t got;
  struct tcp_hello h;
};

static void* proxy_main(void* arg);
static void take(void* rec);
static void atfork_child(void);

/* Fields under px.pg.lock unless marked "proxy". */
static struct {
  struct progress pg;        /* the thread, its records (pg.list: proxy) and their hand-over */
  struct sock listener;      /* made by the registering thread; closed by the proxy when it exits */
  int epfd;                  /* process lifetime (recreated in a forked child) */
  struct pending acc[MAX_ACCEPTS]; /* proxy; fd -1: free */
  int nacc;                        /* proxy */
} px = {.pg = PROGRESS_INIT(struct tcp_conn, proxy_main, atfork_child), .listener = {.fd = -1}, .epfd = -1};
static _Atomic int px_evfd = -1;  /* eventfd: any thread may write it */
static _Atomic int px_sleeping;   /* the proxy is (about to be) blocked in epoll_wait */
static int accept_blocked;        /* proxy (reset before it starts): connections wait in the backlog */
static uint64_t accept_retry_at;  /* proxy: when a blocked accept is tried again (0: once a slot frees) */
static int accept_warned;         /* proxy: said why accepts wait (out of descriptors); 0 after one succeeds */

void tp_proxy_kick(void) {
  int fd = atomic_load_explicit(&px_evfd, memory_order_relaxed);
  uint64_t one = 1;
  if (fd >= 0 && write(fd, &one, sizeof(one)) < 0) { /* EAGAIN: a wake-up is pending anyway */ }
}

/* The child has no proxy thread (progress.c forgets the records): close what is shared with the
 * parent and let the next registration start over. px.pg.lock is held. */
static void atfork_child(void) {
  if (px.listener.fd >= 0) close(px.listener.fd);
  for (int i = 0; i < MAX_ACCEPTS; i++)
    if (px.nacc && px.acc[i].fd > 0) close(px.acc[i].fd);
  if (px.epfd >= 0) close(px.epfd);
  int ev = atomic_exchange(&px_evfd, -1);
  if (ev >= 0) close(ev);
  px.listener.fd = -1, px.epfd = -1, px.nacc = 0;
  atomic_store(&px_sleeping, 0);
}

static void ep_add(int fd, void* tag, uint32_t events) {
  struct epoll_event e = {.events = events, .data.ptr = tag};
  if (epoll_ctl(px.epfd, EPOLL_CTL_ADD, fd, &e) != 0) WARN("net proxy: epoll_ctl ADD failed: %s", strerror(errno));
}
static void ep_del(int fd) { epoll_ctl(px.epfd, EPOLL_CTL_DEL, fd, NULL); }

/* Whether n's communicator already knows why it failed: its async error is set, or a poison record
 * crossed one of its links (a peer's report coming in, or our rank's going out). A link that closes
 * then is the failure's aftermath: a peer that reported a mismatch on one channel's socket may close
 * another channel's socket, mid-step, before our rank has taken the report in. Proxy thread only. */
int proxy_comm_told(const struct tcp_conn* n) {
  if (atomic_load(n->async_err) != 0) return 1;
  for (const struct tcp_conn* o = px.pg.list; o; o = o->next)
    if (o->async_err == n->async_err && (xfer_poison_is_set(&o->ctrl->down) || xfer_poison_is_set(&o->ctrl->up)))
      return 1;
  return 0;
}

/* One link of a communicator failed, so the communicator is unusable (its async error is set): tell
 * every rank at the other end of its other links, naming the rank this link led to (a peer-lost
 * poison record, relayed like a mismatch's), so that every rank of it fails within one hop per rank,
 * naming the culprit, instead of waiting for ever on a rank that is itself stuck (ring neighbours of
 * a dead rank are not its only waiters). Links that cannot carry it (not bound) are left alone. */
void proxy_fail_comm(struct tcp_conn* failed) {
  struct xfer_poison rec = {.finder = failed->rank, .other = failed->peer, .kind = XFER_PEER_LOST};
  for (struct tcp_conn* n = px.pg.list; n; n = n->next) {
    if (n == failed || n->async_err != failed->async_err || n->fd < 0) continue;
    if (atomic_load_explicit(&n->state, memory_order_relaxed) != TCP_BOUND) continue;
    INFO(LOG_NET, "rank %d: telling rank %d that the communicator failed (rank %d's link)", n->rank, n->peer,
         failed->peer);
    xfer_poison_put(n->is_send ? &n->ctrl->down : &n->ctrl->up, &rec);
  }
  atomic_store(&px.pg.changes, 1); /* a pass: can_progress sees the records to send */
}

static int progress_all(void) {
  int did = 0;
  for (struct tcp_conn* n = px.pg.list; n; n = n->next) {
    if (atomic_load_explicit(&n->state, memory_order_relaxed) != TCP_BOUND) continue;
    did |= n->is_send ? tcp_progress_send(n) : tcp_progress_recv(n);
  }
  return did;
}

/* After a pass without progress, with the sleeping words set: would a pass now do something? */
static int can_progress(void) {
  for (struct tcp_conn* n = px.pg.list; n; n = n->next) {
    if (atomic_load_explicit(&n->state, memory_order_relaxed) != TCP_BOUND) continue;
    if (n->is_send) {
      /* head, not step: the rank may be moving step (direct send); head == step between steps */
      if (n->rd_ready || (n->wr_ready && atomic_load(&n->ctrl->tail) > atomic_load(&n->ctrl->head))) return 1;
      if (n->poison_state < 2 && n->wr_ready && xfer_poison_is_set(&n->ctrl->down)) return 1;
    } else {
      if (atomic_load_explicit(&n->rank_reads, memory_order_relaxed) ? n->hup_event
          : (n->rd_ready || n->pending) && atomic_load(&n->ctrl->tail) - atomic_load(&n->ctrl->head) < CH_STEPS)
        return 1;
      if (n->poison_state != 2 && xfer_poison_is_set(&n->ctrl->up)) return 1;
    }
  }
  return 0;
}

/* Send FIFOs keep recv_sleeping = TP_SLEEP_DIRECT for good (every post calls tp_proxy_post, which
 * kicks only while px_sleeping); receive FIFOs get TP_SLEEP_PROXY in send_sleeping while we sleep. */
static void set_sleeping(uint32_t v) {
  atomic_store_explicit(&px_sleeping, v != 0, memory_order_relaxed);
  for (struct tcp_conn* n = px.pg.list; n; n = n->next) /* a socket the rank reads needs no head wake-ups */
    if (!n->is_send)
      atomic_store_explicit(&n->ctrl->send_sleeping,
                            atomic_load_explicit(&n->rank_reads, memory_order_relaxed) ? 0 : v, memory_order_relaxed);
}

/* tp_wake's slow path for sleeping words >= TP_SLEEP_PROXY. TP_SLEEP_DIRECT: `word` is the tail of a
 * net send FIFO the rank just posted: send small steps from this thread (one thread wake-up less per
 * hop), leave the rest to the proxy and wake it if it sleeps. */
void tp_proxy_post(_Atomic uint64_t* word, uint32_t how) {
  if (how >= TP_SLEEP_FAB_TAIL) { /* a fabric FIFO: its own progress thread (fabric_proxy.c) */
    tp_fab_post(word, how);
    return;
  }
  if (how == TP_SLEEP_DIRECT) {
    struct fifo_ctrl* ctrl = (struct fifo_ctrl*)((char*)word - offsetof(struct fifo_ctrl, tail));
    struct tcp_conn* n = (struct tcp_conn*)(uintptr_t)ctrl->token;
    if (!tcp_send_direct(n)) return;
    atomic_thread_fence(memory_order_seq_cst); /* our posts, then px_sleeping: pairs with the proxy */
    if (!atomic_load_explicit(&px_sleeping, memory_order_relaxed)) return;
  }
  tp_proxy_kick();
}

/* ---- accepting and authenticating ---- */

static void reject(struct pending* p, const char* why) {
  sock_warn_reject("net listener", &p->remote, why); /* once a minute per host: a scanner cannot flood the log */
  ep_del(p->fd);
  close(p->fd);
  p->fd = -1;
  px.nacc--;
}

static void authenticate(struct pending* p) {
  struct tcp_hello* h = &p->h;
  if (h->magic != TCP_MAGIC) return reject(p, "not a Chorus network connection (bad magic)");
  struct tcp_conn* n = NULL;
  for (int pass = 0; pass < 2 && !n; pass++) {
    if (pass) { /* the hello may beat the proxy to the record its receiver just registered */
      pthread_mutex_lock(&px.pg.lock);
      progress_take_locked(&px.pg, take);
      pthread_mutex_unlock(&px.pg.lock);
    }
    for (n = px.pg.list; n; n = n->next)
      if (!n->is_send && n->token == h->token && atomic_load(&n->state) == TCP_PENDING) break;
  }
  if (!n) return reject(p, "unknown or already used connection token");
  if (h->from_rank != n->peer || h->to_rank != n->rank) return reject(p, "ranks do not match the offer");
  unsigned char mac[TCP_MAC];
  tcp_hello_mac(n->key, h, n->challenge, &n->listener, mac);
  if (ct_memcmp(mac, h->mac, TCP_MAC) != 0) return reject(p, "authentication failed (not this job's key)");
  if (n->uid_mode && sock_addr_is_local(&p->remote)) {
    uid_t uid;
    if (sock_peer_uid(p->fd, &uid) != 0 || uid != geteuid())
      return reject(p, "a local connection from another user (job without a secret admits only our uid)");
  }
  /* No EPOLLOUT: a receiver writes only a failed call's record, which waits in progress_recv (and
   * keeps can_progress true) until it fits; re-arming the socket (reader_set) then wakes nobody. */
  struct epoll_event e = {.events = EPOLLIN | EPOLLRDHUP | EPOLLET, .data.ptr = n};
  epoll_ctl(px.epfd, EPOLL_CTL_MOD, p->fd, &e);
  n->fd = p->fd;
  n->remote = p->remote;
  n->rd_ready = n->wr_ready = 1;
  p->fd = -1;
  px.nacc--;
  atomic_store_explicit(&n->state, TCP_BOUND, memory_order_release);
}

static void read_hello(struct pending* p) {
  for (;;) {
    ssize_t r = recv(p->fd, (char*)&p->h + p->got, sizeof(p->h) - p->got, MSG_DONTWAIT);
    if (r == 0) return reject(p, "closed before authenticating");
    if (r < 0) {
      if (errno == EINTR) continue;
      if (errno != EAGAIN && errno != EWOULDBLOCK) reject(p, strerror(errno));
      return;
    }
    p->got += (size_t)r;
    if (p->got == sizeof(p->h)) return authenticate(p);
  }
}

/* A slot for a new socket, or NULL: a free one, else, when all are taken, the oldest socket if it has
 * been silent for EVICT_AFTER_NS (a flood cannot keep peers out; a burst of real senders, whose hellos
 * are moments behind their connects, is never evicted). evict: drop that socket now (only once a new
 * one is accepted: none may be waiting). */
static struct pending* free_slot(int evict) {
  struct pending* old = NULL;
  for (int i = 0; i < MAX_ACCEPTS; i++) {
    if (px.acc[i].fd < 0) return &px.acc[i];
    if (!old || px.acc[i].deadline < old->deadline) old = &px.acc[i];
  }
  if (old->deadline + EVICT_AFTER_NS > ut_now_ns() + ACCEPT_TIMEOUT_NS) return NULL; /* accepted < 1 s ago */
  if (evict) reject(old, "too many connections waiting to authenticate: the oldest is dropped");
  return old;
}

static void accept_all(void) {
  for (int k = 0;; k++) {
    if (k == ACCEPTS_PER_PASS || !free_slot(0)) {
      accept_blocked = 1, accept_retry_at = k == ACCEPTS_PER_PASS ? 0 : ut_now_ns() + 10 * UT_NS_PER_MS;
      return; /* the rest wait in the backlog: the next pass, or once a slot frees or ages */
    }
    union sock_addr ra;
    socklen_t len = sizeof(ra);
    memset(&ra, 0, sizeof(ra));
    int fd = accept4(px.listener.fd, &ra.sa, &len, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0) {
      int e = errno;
      if (e == EINTR || e == ECONNABORTED) continue;
      if (e == EMFILE || e == ENFILE || e == ENOBUFS || e == ENOMEM) {
        /* The connection stays in the backlog, and the listener is edge-triggered: no new edge will
         * come for it, so try again shortly rather than on the next connection. */
        if (!accept_warned)
          WARN("net listener: cannot accept a peer's connection: %s (trying again every 100 ms; raise the "
               "descriptor limit, ulimit -n, if this lasts)", strerror(e));
        accept_warned = 1, accept_blocked = 1, accept_retry_at = ut_now_ns() + 100 * UT_NS_PER_MS;
      }
      return; /* EAGAIN: the next edge */
    }
    accept_warned = 0;
    struct pending* p = free_slot(1);
    if (!p) { /* cannot happen: checked before the accept */
      close(fd);
      continue;
    }
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    sock_tune_link(fd);
    memset(p, 0, sizeof(*p));
    p->fd = fd;
    p->remote = ra;
    p->deadline = ut_now_ns() + ACCEPT_TIMEOUT_NS;
    px.nacc++;
    ep_add(fd, p, EPOLLIN | EPOLLRDHUP | EPOLLET);
    read_hello(p);
  }
}

static void expire_accepts(void) {
  if (!px.nacc) return;
  uint64_t now = ut_now_ns();
  for (int i = 0; i < MAX_ACCEPTS; i++)
    if (px.acc[i].fd >= 0 && now > px.acc[i].deadline) reject(&px.acc[i], "did not authenticate in time");
}

static void handle_events(const struct epoll_event* ev, int ne) {
  for (int i = 0; i < ne; i++) {
    void* tag = ev[i].data.ptr;
    uint32_t e = ev[i].events;
    if (tag == TAG_EVENTFD) {
      uint64_t v;
      if (read(atomic_load(&px_evfd), &v, sizeof(v)) < 0) { /* EAGAIN: drained already */ }
    } else if (tag == TAG_LISTENER) {
      accept_all();
    } else if ((uintptr_t)tag >= (uintptr_t)px.acc && (uintptr_t)tag < (uintptr_t)(px.acc + MAX_ACCEPTS)) {
      struct pending* p = tag;
      if (p->fd >= 0) read_hello(p);
    } else {
      struct tcp_conn* n = tag;
      if (e & (EPOLLIN | EPOLLRDHUP | EPOLLHUP | EPOLLERR)) n->rd_ready = 1;
      if (e & (EPOLLOUT | EPOLLHUP | EPOLLERR)) n->wr_ready = 1;
      if (!n->is_send && (e & (EPOLLRDHUP | EPOLLHUP | EPOLLERR))) n->hup_event = 1;
    }
  }
}

/* ---- registration and teardown ---- */

/* Let a closing record go: a sender first flushes what its rank posted (the rank may have returned
 * from its last collective before the proxy sent it), unless aborted or the link is gone. Returns 0
 * while it must stay. Under px.pg.lock. */
static int let_go(void* rec, uint64_t now) {
  struct tcp_conn* n = rec;
  int st = atomic_load(&n->state);
  /* After a failed call's poison only the poison is flushed: its steps will never be taken. */
  int unsent = n->poison_state == 2 ? 0
               : n->is_send  ? n->off || atomic_load(&n->ctrl->tail) > n->step || xfer_poison_is_set(&n->ctrl->down)
                             : xfer_poison_is_set(&n->ctrl->up);
  /* An abort flushes nothing but a poison record still going out (a moment at most): the ranks behind
   * this link learn who failed instead of seeing this close and blaming us. */
  int aborted = __atomic_load_n(n->abort, __ATOMIC_RELAXED);
  int poison_due = n->poison_state != 2 && xfer_poison_is_set(n->is_send ? &n->ctrl->down : &n->ctrl->up);
  if (st == TCP_BOUND && (aborted ? poison_due : unsent)) {
    if (!n->drain_deadline) n->drain_deadline = now + (aborted ? ABORT_FLUSH_NS : DRAIN_TIMEOUT_NS);
    if (now < n->drain_deadline) return 0;
    if (!aborted && !n->bye_deadline) /* once: a goodbye waiting for room brings us back here */
      WARN("rank %d: closing the network connection to rank %d with %llu step(s) it never took", n->rank, n->peer,
         (unsigned long long)(atomic_load(&n->ctrl->tail) - n->step));
  }
  if (n->fd >= 0) {
    /* Goodbye, so the peer knows this close is orderly; none after an abort, so that ranks still
     * waiting on this one see a failure (and spread it) instead of waiting for ever. */
    if (st == TCP_BOUND && n->off == 0 && n->poison_state != 1 && !__atomic_load_n(n->abort, __ATOMIC_RELAXED)) {
      /* Whole, or not at all: a goodbye lost to a full socket buffer (the last steps still in it) made
       * the peer see EOF without it, and fail a communicator that closed in order. So a full buffer
       * keeps the record for the next pass, BYE_TIMEOUT_NS at most. */
      struct tcp_step bye = {.bytes = TCP_BYE};
      const char* msg = n->is_send ? (const char*)&bye : "B";
      size_t len = n->is_send ? sizeof(bye) : 1;
      while (n->bye_off < len) {
        ssize_t w = send(n->fd, msg + n->bye_off, len - n->bye_off, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (w > 0) {
          n->bye_off += (size_t)w;
          continue;
        }
        if (w < 0 && errno == EINTR) continue;
        if (w < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
          if (!n->bye_deadline) n->bye_deadline = now + BYE_TIMEOUT_NS;
          if (now < n->bye_deadline) return 0;
        }
        break; /* the link is gone, or the peer reads no more: nothing more to say */
      }
    }
    /* A waiting rank may be in tp_tcp_poll on this socket (an abort from another thread): close it
     * under busy, so the rank never reads or re-arms a descriptor number that is reused. */
    while (atomic_exchange_explicit(&n->busy, 1, memory_order_acquire)) ut_cpu_relax();
    ep_del(n->fd);
    close(n->fd);
    n->fd = -1;
    atomic_store_explicit(&n->busy, 0, memory_order_release);
  }
  return 1;
}

/* A record taken into the proxy's list: its socket joins the epoll set. Under px.pg.lock. */
static void take(void* rec) {
  struct tcp_conn* n = rec;
  n->epfd = px.epfd;
  if (n->fd >= 0) {
    n->rd_ready = n->wr_ready = 1;
    ep_add(n->fd, n, EPOLLIN | EPOLLOUT | EPOLLRDHUP | EPOLLET);
  }
}

/* The last record went: the thread exits, closing its accepted sockets and listener. Under px.pg.lock. */
static void last_gone(void) {
  for (int i = 0; i < MAX_ACCEPTS; i++)
    if (px.acc[i].fd >= 0) ep_del(px.acc[i].fd), close(px.acc[i].fd), px.acc[i].fd = -1;
  px.nacc = 0;
  ep_del(px.listener.fd);
  close(px.listener.fd);
  px.listener.fd = -1;
}

/* Take new records, release closing ones. Returns 1 when the thread must exit (nothing left). */
static int sync_lists(void) {
  int draining;
  int exiting = progress_sync(&px.pg, take, let_go, last_gone, &draining);
  if (draining) atomic_store(&px.pg.changes, 1); /* look again next pass */
  return exiting;
}

void (*_Atomic tp_busy_hook)(uint64_t t0, uint64_t t1);

static void* proxy_main(void* arg) {
  (void)arg;
  struct epoll_event ev[64];
  int64_t spin_ns = param_int(PARAM_NET_SPIN_US) * (int64_t)UT_NS_PER_US;
  uint64_t idle_since = 0, busy_since = 0; /* busy_since: only while a trace wants the busy periods */
  for (;;) {
    if (atomic_load_explicit(&px.pg.changes, memory_order_acquire) && sync_lists()) break;
    if (px.nacc) expire_accepts();
    if (accept_blocked && (!accept_retry_at || ut_now_ns() >= accept_retry_at)) {
      accept_blocked = 0;
      accept_all();
    }
    int ne = epoll_wait(px.epfd, ev, 64, 0);
    handle_events(ev, ne);
    if (progress_all() || ne > 0) {
      idle_since = 0;
      if (!busy_since && atomic_load_explicit(&tp_busy_hook, memory_order_relaxed)) busy_since = ut_now_ns();
      continue;
    }
    uint64_t now = ut_now_ns();
    if (busy_since) {
      void (*hook)(uint64_t, uint64_t) = atomic_load_explicit(&tp_busy_hook, memory_order_relaxed);
      if (hook) hook(busy_since, now);
      busy_since = 0;
    }
    if (!idle_since) idle_since = now;
    if ((int64_t)(now - idle_since) < spin_ns) {
      ut_cpu_relax();
      continue;
    }
    set_sleeping(TP_SLEEP_PROXY);
    atomic_thread_fence(memory_order_seq_cst); /* pairs with tp_wake's fence */
    /* Connections left in the backlog by the per-pass cap (no retry time) are work too. */
    if (!atomic_load(&px.pg.changes) && !can_progress() && !(accept_blocked && !accept_retry_at)) {
      ne = epoll_wait(px.epfd, ev, 64, accept_blocked ? 100 : px.nacc ? 200 : -1);
      set_sleeping(0);
      handle_events(ev, ne > 0 ? ne : 0);
    } else {
      set_sleeping(0);
    }
    idle_since = 0;
  }
  return NULL;
}

/* Under px.pg.lock: the process-lifetime epoll set and eventfd. */
static ch_status ensure_epoll(void) {
  if (px.epfd >= 0) return CH_OK;
  int ep = epoll_create1(EPOLL_CLOEXEC), ev = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (ep < 0 || ev < 0) {
    WARN("net proxy: cannot create its epoll set or eventfd: %s", strerror(errno));
    if (ep >= 0) close(ep);
    if (ev >= 0) close(ev);
    return CH_SYSTEM;
  }
  px.epfd = ep;
  atomic_store(&px_evfd, ev);
  ep_add(ev, TAG_EVENTFD, EPOLLIN | EPOLLET);
  return CH_OK;
}

ch_status proxy_register(struct tcp_conn* n, const union sock_addr* hint, union sock_addr* listener) {
  progress_lock(&px.pg);
  ch_status s = CH_OK;
  if (!progress_running_locked(&px.pg)) {
    for (int i = 0; i < MAX_ACCEPTS; i++) px.acc[i].fd = -1;
    px.nacc = 0;
    accept_blocked = 0, accept_retry_at = 0, accept_warned = 0;
    s = ensure_epoll();
    union sock_addr a = *hint;
    if (a.sa.sa_family == AF_INET6) a.sin6.sin6_port = 0;
    else a.sin.sin_port = 0;
    if (s == CH_OK) s = sock_listen(&a, &px.listener); /* WARNs */
    if (s == CH_OK) ep_add(px.listener.fd, TAG_LISTENER, EPOLLIN | EPOLLET);
    int e = 0;
    if (s == CH_OK && (e = progress_start_locked(&px.pg)) != 0) {
      WARN("cannot start the network proxy thread: %s", strerror(e)); /* pthread_create returns it, not errno */
      s = CH_SYSTEM;
    }
    if (s != CH_OK && px.listener.fd >= 0) {
      ep_del(px.listener.fd);
      close(px.listener.fd);
      px.listener.fd = -1;
    }
  }
  if (s == CH_OK) {
    n->listener = px.listener.addr; /* before the proxy can see n: part of the hello's MAC */
    progress_add_locked(&px.pg, n);
    if (listener) *listener = px.listener.addr;
  }
  pthread_mutex_unlock(&px.pg.lock);
  if (s == CH_OK) tp_proxy_kick();
  return s;
}

void proxy_closing(struct tcp_conn* n) {
  progress_closing(&px.pg, n);
  tp_proxy_kick();
}

void proxy_unregister(struct tcp_conn* n) {
  proxy_closing(n);
  progress_wait_released(&px.pg, n, NULL);
}

int proxy_listener_addr(union sock_addr* out) {
  pthread_mutex_lock(&px.pg.lock);
  int ok = px.pg.state == PROGRESS_RUNNING && px.listener.fd >= 0;
  if (ok) *out = px.listener.addr;
  pthread_mutex_unlock(&px.pg.lock);
  return ok;
}
