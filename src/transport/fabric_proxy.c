/* The fabric progress thread: one per process, started by the first fabric connection and gone with
 * the last. It establishes connections (connect/accept never block, so it loops them), hands posted
 * steps to the network, tests requests in order, posts receives for free slots, and closes. Ranks
 * take the same paths for their own connection where that saves a thread hop: a sender right after
 * it posts a step (tp_fab_post), a receiver while it waits (fab_poll), a receiver freeing a slot.
 * `busy` decides who moves a connection at a time.
 *
 * Networks under manual progress move data only inside their calls, so the thread keeps testing
 * while requests are in flight; after CHORUS_FABRIC_SPIN_US without progress it sleeps between
 * passes, growing to 50 us while a rank waits on one of its connections or a send is in flight, to
 * 20 ms otherwise; a post or kick wakes it. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <linux/futex.h>
#include <poll.h>
#include <pthread.h>
#include <sched.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "../misc/log.h"
#include "../misc/param.h"
#include "../misc/utils.h"
#include "fabric.h"
#include "progress.h"

#define DRAIN_TIMEOUT_NS (30ull * UT_NS_PER_S) /* a closing sender flushes posted steps this long */
#define BYE_TIMEOUT_NS (1000ull * UT_NS_PER_MS)    /* and waits this long for its goodbye to leave */
#define ABORT_FLUSH_NS (200ull * UT_NS_PER_MS)     /* an aborted one, only a poison record, this long */
#define ACTIVE_SLEEP_US 50       /* between passes while a rank waits on one of our connections or a send is
                                  * in flight: a network under manual progress moves data only in our calls */
#define IDLE_SLEEP_US 20000      /* while none does: an idle communicator costs ~50 passes a second */
#define PROBE_QUIET_NS (1000ull * UT_NS_PER_MS)    /* nothing moved for this long while our rank waits */
#define PROBE_EVERY_NS (3000ull * UT_NS_PER_MS)    /* then check the peer's process this often */
#define PROBE_PASS_NS (100ull * UT_NS_PER_MS)      /* liveness bookkeeping runs this often */

static void* fab_main(void* arg);
static void at_child(void);
/* The thread, its records (fx.list: the thread's) and their hand-over; changes: registrations or
 * closings wait for the thread's next pass. */
static struct progress fx = PROGRESS_INIT(struct fab_conn, fab_main, at_child);
static _Atomic int fx_relay;         /* a link failed: the thread tells the others of its communicator */
static _Atomic uint32_t fx_word;     /* futex the thread sleeps on; kicks bump it */
static _Atomic int fx_sleeping;
static int fx_draining;              /* the thread: closing records wait (a flush, a goodbye) */

void fab_kick(void) {
  atomic_fetch_add_explicit(&fx_word, 1, memory_order_release);
  atomic_thread_fence(memory_order_seq_cst);
  if (atomic_load_explicit(&fx_sleeping, memory_order_relaxed))
    syscall(SYS_futex, (uint32_t*)&fx_word, FUTEX_WAKE_PRIVATE, 1, NULL, NULL, 0);
}

static const char* dir(const struct fab_conn* n) { return n->is_send ? "to" : "from"; }

static const char* res_str(ncclResult_t r) {
  switch (r) {
    case ncclSuccess: return "protocol error";
    case ncclSystemError: return "system or network error";
    case ncclInternalError: return "internal error";
    case ncclInvalidArgument: return "invalid argument";
    case ncclInvalidUsage: return "invalid usage";
    case ncclRemoteError: return "remote error";
    default: return "error";
  }
}

/* A fork child has no progress thread (progress.c forgets the parent's records). */
static void at_child(void) { atomic_store(&fx_sleeping, 0); }

void fab_fail(struct fab_conn* n, const char* op, ncclResult_t r) {
  int st = atomic_load_explicit(&n->state, memory_order_relaxed);
  if (st == FAB_FAILED || st == FAB_CLOSED) return;
  if (atomic_load(n->async_err) != 0 || n->peer_bye) { /* the communicator failed already, or the peer
                                                           * said goodbye: this is the aftermath */
    INFO(LOG_NET, "rank %d: fabric connection %s rank %d ended in %s after the communicator failed", n->rank, dir(n),
         n->peer, op);
    atomic_store_explicit(&n->state, FAB_CLOSED, memory_order_release);
  } else {
    struct log_err_sink* prev = log_set_error_sink(n->sink);
    WARN("rank %d: fabric connection %s rank %d (pid %d on %s; network %s, %s, device %d) failed in %s (%s)",
         n->rank, dir(n), n->peer, n->peer_pid, n->peer_host, n->net->name, n->net->origin, n->dev, op,
         res_str(r));
    log_set_error_sink(prev);
    atomic_store_explicit(&n->state, FAB_FAILED, memory_order_release);
    tp_note_link_lost(n->async_err, n->lost_rank, n->peer); /* as the TCP proxy's */
    atomic_store(&fx_relay, 1);
  }
  tp_wake_slow(&n->ctrl->tail);
  tp_wake_slow(&n->ctrl->head);
  fab_kick();
}

/* Proxy thread: every failed link's communicator tells the ranks behind its other links which rank
 * it lost (a peer-lost poison record), so they fail now instead of at their timeout. */
static void relay_failures(void) {
  if (!atomic_exchange(&fx_relay, 0)) return;
  for (struct fab_conn* f = fx.list; f; f = f->next) {
    if (atomic_load(&f->state) != FAB_FAILED) continue;
    struct xfer_poison rec = {.finder = f->rank, .other = f->peer, .kind = XFER_PEER_LOST};
    for (struct fab_conn* n = fx.list; n; n = n->next)
      if (n != f && n->async_err == f->async_err && n->is_send && atomic_load(&n->state) == FAB_BOUND)
        xfer_poison_put(&n->ctrl->down, &rec);
  }
}

/* ---- one connection (caller holds busy) ---- */

static int establish(struct fab_conn* n) {
  const ncclNet_t* net = n->net->net;
  ncclResult_t r;
  if (n->is_send) r = net->connect(n->net->ctx, n->dev, n->handle, &n->comm, NULL);
  else r = net->accept(n->lcomm, &n->comm, NULL);
  if (r != ncclSuccess) return fab_fail(n, n->is_send ? "connect" : "accept", r), 1;
  if (!n->comm) {
    if (ut_now_ns() > n->connect_deadline) fab_fail(n, n->is_send ? "connect (timed out)" : "accept (timed out)", ncclSystemError);
    return 0;
  }
  if (!n->is_send) {
    net->closeListen(n->lcomm);
    n->lcomm = NULL;
  }
  r = net->regMr(n->comm, n->mem, n->mem_bytes, NCCL_PTR_HOST, &n->mh);
  if (r != ncclSuccess) return fab_fail(n, "memory registration", r), 1;
  INFO(LOG_NET, "rank %d: fabric connection %s rank %d up on %s device %d", n->rank, dir(n), n->peer, n->net->name,
       n->dev);
  atomic_store_explicit(&n->state, FAB_BOUND, memory_order_release);
  return 1;
}

/* Test the request in *req; 1 when it completed (size in *size), -1 after a failure (logged). */
static int test_req(struct fab_conn* n, void** req, int* size, const char* op) {
  int done = 0;
  *size = 0;
  ncclResult_t r = n->net->net->test(*req, &done, size);
  if (r != ncclSuccess) return fab_fail(n, op, r), -1;
  if (done) *req = NULL;
  return done;
}

static int send_progress(struct fab_conn* n) {
  const ncclNet_t* net = n->net->net;
  int did = 0, size, t;
  while (n->done < n->posted) {
    if ((t = test_req(n, &n->req[n->done % CH_STEPS], &size, "send")) < 0) return 1;
    if (!t) break;
    n->done++, did = 1;
    atomic_store_explicit(&n->ctrl->head, n->done, memory_order_release); /* the slot is free again */
    tp_wake(&n->ctrl->head, &n->ctrl->send_sleeping);
  }
  if (n->preq) {
    if ((t = test_req(n, &n->preq, &size, "send")) < 0) return 1;
    if (t) {
      did = 1;
      if (n->poison_state == 1) n->poison_state = 2;
      if (n->bye_state == 1) n->bye_state = 2;
    }
  }
  if (n->poison_state || n->bye_state) return did; /* nothing follows a poison or a goodbye */
  if (xfer_poison_is_set(&n->ctrl->down)) { /* our rank's call failed: the record goes out next */
    struct xfer_poison rec;
    xfer_poison_copy(&rec, &n->ctrl->down);
    atomic_store_explicit(&rec.set, 1, memory_order_relaxed);
    struct tcp_step tr = {.bytes = TCP_POISON};
    memcpy(n->ctl, &rec, sizeof(rec));
    memcpy(n->ctl + sizeof(rec), &tr, sizeof(tr));
    ncclResult_t r = net->isend(n->comm, n->ctl, sizeof(rec) + sizeof(tr), n->rank, n->mh, NULL, &n->preq);
    if (r != ncclSuccess) return fab_fail(n, "send", r), 1;
    if (n->preq) n->poison_state = 1, did = 1;
    return did;
  }
  uint64_t tail = atomic_load_explicit(&n->ctrl->tail, memory_order_acquire);
  while (n->posted < tail) {
    int slot = (int)(n->posted % CH_STEPS);
    uint64_t bytes = n->ctrl->size[slot];
    if (bytes > n->cap) { /* only Simple records sizes: another protocol reached the network */
      WARN("rank %d: step of %llu bytes for a %zu-byte slot on the fabric connection to rank %d (internal)", n->rank,
           (unsigned long long)bytes, n->cap, n->peer);
      return fab_fail(n, "send", ncclInternalError), 1;
    }
    char* p = n->buf + (size_t)slot * n->stride;
    struct tcp_step tr = {.bytes = bytes, .hdr = n->ctrl->hdr[slot]};
    memcpy(p + bytes, &tr, sizeof(tr));
    ncclResult_t r = net->isend(n->comm, p, bytes + sizeof(tr), n->rank, n->mh, NULL, &n->req[slot]);
    if (r != ncclSuccess) return fab_fail(n, "send", r), 1;
    if (!n->req[slot]) break; /* the network says not now */
    n->posted++, did = 1;
  }
  return did;
}

/* A completed receive in `slot` of `size` bytes: a step, a poison record or a goodbye. Checked whole
 * before anything is believed: it comes from the peer. 0 to go on, 1 when the stream ended. */
static int take_message(struct fab_conn* n, int slot, int size) {
  char* p = n->buf + (size_t)slot * n->stride;
  struct tcp_step tr;
  uint64_t payload;
  char why[160];
  switch (fab_msg_decode(p, size, n->stride, n->cap, &tr, &payload, why, sizeof(why))) {
  case FAB_MSG_POISON: { /* the sender's call failed */
    struct xfer_poison rec;
    memcpy(&rec, p, sizeof(rec)); /* only printed: ranks and fields are never used as indices */
    if (xfer_poison_put(&n->ctrl->down, &rec)) tp_wake_slow(&n->ctrl->tail);
    n->poison_state = 2;
    return 1;
  }
  case FAB_MSG_BYE:
    atomic_store_explicit(&n->state, FAB_CLOSED, memory_order_release);
    tp_wake_slow(&n->ctrl->tail);
    return 1;
  case FAB_MSG_STEP:
    n->ctrl->size[slot] = payload;
    n->ctrl->hdr[slot] = tr.hdr;
    n->ctrl->tag[slot] = xfer_tag(&tr.hdr); /* from the trailer: the rank compares it with its own */
    return 0;
  default: {
    char what[200];
    snprintf(what, sizeof(what), "receive: %s", why);
    fab_fail(n, what, ncclSuccess);
    return 1;
  }
  }
}

static int recv_progress(struct fab_conn* n, int post_only) {
  const ncclNet_t* net = n->net->net;
  int did = 0, size, t;
  if (n->poison_state == 2 || atomic_load_explicit(&n->state, memory_order_relaxed) != FAB_BOUND) return 0;
  while (!post_only && n->done < n->posted) {
    int slot = (int)(n->done % CH_STEPS);
    if ((t = test_req(n, &n->req[slot], &size, "receive")) < 0) return 1;
    if (!t) break;
    did = 1;
    n->done++;
    if (take_message(n, slot, size)) return 1;
    atomic_store_explicit(&n->ctrl->tail, n->done, memory_order_release); /* after every byte */
    tp_wake(&n->ctrl->tail, &n->ctrl->recv_sleeping);
  }
  uint64_t head = atomic_load_explicit(&n->ctrl->head, memory_order_acquire);
  while (n->posted < head + CH_STEPS) {
    int slot = (int)(n->posted % CH_STEPS);
    void* data = n->buf + (size_t)slot * n->stride;
    size_t len = n->stride;
    int tag = n->peer;
    ncclResult_t r = net->irecv(n->comm, 1, &data, &len, &tag, &n->mh, NULL, &n->req[slot]);
    if (r != ncclSuccess) return fab_fail(n, "receive", r), 1;
    if (!n->req[slot]) break;
    n->posted++, did = 1;
  }
  return did;
}

/* ---- the way back (caller holds busy) ---- */

static int back_setup(struct fab_conn* n) {
  const ncclNet_t* net = n->net->net;
  ncclResult_t r;
  if (n->is_send) r = net->accept(n->blcomm, &n->bcomm, NULL);
  else r = net->connect(n->net->ctx, n->dev, n->back_handle, &n->bcomm, NULL);
  if (r != ncclSuccess || (!n->bcomm && ut_now_ns() > n->connect_deadline)) {
    INFO(LOG_NET, "rank %d: the way back %s rank %d could not be set up (error %d): its records stay home",
         n->rank, n->is_send ? "from" : "to", n->peer, (int)r);
    n->back_state = 2;
    return 1;
  }
  if (!n->bcomm) return 0;
  if (n->is_send) {
    net->closeListen(n->blcomm);
    n->blcomm = NULL;
  }
  if (net->regMr(n->bcomm, n->mem, n->mem_bytes, NCCL_PTR_HOST, &n->bmh) != ncclSuccess) {
    n->back_state = 2;
    return 1;
  }
  n->back_state = 1;
  return 1;
}

/* Sender: what came back. Receiver: send its poison record once its call failed. */
static int back_progress(struct fab_conn* n) {
  const ncclNet_t* net = n->net->net;
  int size, t;
  if (n->back_state == 2) return 0;
  if (n->back_state == 0) {
    if (n->is_send ? !n->blcomm : !atomic_load_explicit(&n->back_wanted, memory_order_acquire)) return 0;
    return back_setup(n);
  }
  if (n->is_send) {
    char* at = n->ctl + FAB_BACK_OFF;
    if (!n->breq) {
      void* data = at;
      size_t len = 4096 - FAB_BACK_OFF;
      int tag = n->peer;
      ncclResult_t r = net->irecv(n->bcomm, 1, &data, &len, &tag, &n->bmh, NULL, &n->breq);
      if (r != ncclSuccess) return fab_fail(n, "receive on the way back", r), 1;
      return n->breq != NULL;
    }
    if ((t = test_req(n, &n->breq, &size, "receive on the way back")) <= 0) return t < 0;
    struct tcp_step tr;
    uint64_t payload;
    char why[160];
    int kind = fab_msg_decode(at, size, 4096 - FAB_BACK_OFF, 0, &tr, &payload, why, sizeof(why));
    if (kind == FAB_MSG_POISON) {
      struct xfer_poison rec;
      memcpy(&rec, at, sizeof(rec)); /* only printed: ranks and fields are never used as indices */
      if (xfer_poison_put(&n->ctrl->up, &rec)) tp_wake_slow(&n->ctrl->head);
    } else if (kind == FAB_MSG_BYE) {
      n->peer_bye = 1;
    } else {
      struct log_err_sink* prev = log_set_error_sink(n->sink);
      WARN("rank %d: rank %d sent %s on the fabric connection's way back: ignored", n->rank, n->peer, why);
      log_set_error_sink(prev);
    }
    n->back_state = 2; /* either ends the way back */
    return 1;
  }
  if (n->up_sent == 1) {
    if ((t = test_req(n, &n->breq, &size, "send on the way back")) <= 0) return t < 0;
    n->up_sent = 2, n->back_state = 2;
    return 1;
  }
  if (!xfer_poison_is_set(&n->ctrl->up)) return 0;
  struct xfer_poison rec;
  xfer_poison_copy(&rec, &n->ctrl->up);
  atomic_store_explicit(&rec.set, 1, memory_order_relaxed);
  struct tcp_step tr = {.bytes = TCP_POISON};
  memcpy(n->ctl, &rec, sizeof(rec));
  memcpy(n->ctl + sizeof(rec), &tr, sizeof(tr));
  ncclResult_t r = net->isend(n->bcomm, n->ctl, sizeof(rec) + sizeof(tr), n->rank, n->bmh, NULL, &n->breq);
  if (r != ncclSuccess) return fab_fail(n, "send on the way back", r), 1;
  if (n->breq) n->up_sent = 1;
  return n->breq != NULL;
}

static int progress(struct fab_conn* n) {
  int st = atomic_load_explicit(&n->state, memory_order_relaxed), did;
  if (st == FAB_PENDING) did = establish(n);
  else if (st != FAB_BOUND) return 0;
  else did = n->is_send ? send_progress(n) : recv_progress(n, 0);
  if (atomic_load_explicit(&n->state, memory_order_relaxed) != FAB_FAILED) did |= back_progress(n);
  if (did) atomic_store_explicit(&n->last_move, ut_now_ns(), memory_order_relaxed);
  return did;
}

/* ---- liveness (proxy thread) ---- */

static void probe_close(struct fab_conn* n) {
  if (n->probe_fd >= 0) close(n->probe_fd);
  n->probe_fd = -1;
}

static int rank_waits(struct fab_conn* n, uint64_t now) {
  if (n->is_send)
    return atomic_load(&n->ctrl->tail) > atomic_load(&n->ctrl->head) || atomic_load(&n->ctrl->send_sleeping) == 1;
  return atomic_load(&n->ctrl->recv_sleeping) == 1 || now - atomic_load(&n->last_wait) < PROBE_PASS_NS * 2;
}

static void probe_fail(struct fab_conn* n, const char* what) {
  char a[64], op[160];
  snprintf(op, sizeof(op), "a liveness check (its process's query service %s: %s)",
           sock_addr_str(&n->probe_addr, a, sizeof(a)), what);
  while (atomic_exchange_explicit(&n->busy, 1, memory_order_acquire)) sched_yield();
  fab_fail(n, op, ncclRemoteError);
  atomic_store_explicit(&n->busy, 0, memory_order_release);
}

/* No route to the peer (our link is down): a link may come back, so only once that has lasted
 * CHORUS_NET_LINK_TIMEOUT_MS, as a socket's user timeout would. */
static void unreachable(struct fab_conn* n, uint64_t now, int err) {
  int64_t ms = param_int(PARAM_NET_LINK_TIMEOUT_MS);
  if (!n->unreach_since) n->unreach_since = now;
  if (now - n->unreach_since >= (uint64_t)(ms > 0 ? ms : 20000) * UT_NS_PER_MS) probe_fail(n, strerror(err));
  else n->next_probe = now + PROBE_PASS_NS * 5; /* look again soon */
}

static void probe(struct fab_conn* n, uint64_t now) {
  if (n->probe_fd >= 0) {
    struct pollfd p = {.fd = n->probe_fd, .events = POLLOUT};
    if (poll(&p, 1, 0) > 0) {
      int err = 0;
      socklen_t len = sizeof(err);
      getsockopt(n->probe_fd, SOL_SOCKET, SO_ERROR, &err, &len);
      probe_close(n);
      n->next_probe = now + PROBE_EVERY_NS;
      if (err == ECONNREFUSED) probe_fail(n, "connection refused: the process is gone");
      else if (err == ENETUNREACH || err == EHOSTUNREACH) unreachable(n, now, err);
      else if (err) probe_fail(n, strerror(err));
      else n->unreach_since = 0; /* it answered: alive */
    } else if (now > n->probe_deadline) {
      probe_close(n);
      probe_fail(n, "no answer within CHORUS_NET_LINK_TIMEOUT_MS: its host or the link is down");
    }
    return;
  }
  if (atomic_load(&n->state) != FAB_BOUND || n->probe_addr.sa.sa_family == AF_UNSPEC || now < n->next_probe) return;
  if (!rank_waits(n, now) || now - atomic_load(&n->last_move) < PROBE_QUIET_NS) return;
  int fam = n->probe_addr.sa.sa_family;
  int fd = socket(fam, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd < 0) return;
  socklen_t len = fam == AF_INET ? sizeof(struct sockaddr_in) : sizeof(struct sockaddr_in6);
  if (connect(fd, &n->probe_addr.sa, len) == 0 || errno == EINPROGRESS) {
    int64_t ms = param_int(PARAM_NET_LINK_TIMEOUT_MS);
    n->probe_fd = fd;
    n->probe_deadline = now + (uint64_t)(ms > 0 ? ms : 20000) * UT_NS_PER_MS;
    return;
  }
  int e = errno;
  close(fd);
  n->next_probe = now + PROBE_EVERY_NS;
  if (e == ECONNREFUSED) probe_fail(n, "connection refused: the process is gone");
  else if (e == ENETUNREACH || e == EHOSTUNREACH) unreachable(n, now, e);
}

static void probe_all(void) {
  static uint64_t last;
  uint64_t now = ut_now_ns();
  if (now - last < PROBE_PASS_NS) return;
  last = now;
  for (struct fab_conn* n = fx.list; n; n = n->next) probe(n, now);
}

int fab_poll(struct fab_conn* n) {
  if (atomic_load_explicit(&n->state, memory_order_acquire) != FAB_BOUND) return 0;
  atomic_store_explicit(&n->last_wait, ut_now_ns(), memory_order_relaxed);
  if (atomic_exchange_explicit(&n->busy, 1, memory_order_acquire)) return 0;
  uint64_t before = n->done;
  progress(n);
  int moved = n->done != before;
  atomic_store_explicit(&n->busy, 0, memory_order_release);
  return moved;
}

void tp_fab_post(_Atomic uint64_t* word, uint32_t how) {
  size_t off = how == TP_SLEEP_FAB_TAIL ? offsetof(struct fifo_ctrl, tail) : offsetof(struct fifo_ctrl, head);
  struct fifo_ctrl* ctrl = (struct fifo_ctrl*)((char*)word - off);
  struct fab_conn* n = (struct fab_conn*)(uintptr_t)ctrl->token;
  if (atomic_load_explicit(&n->state, memory_order_acquire) == FAB_BOUND &&
      !atomic_exchange_explicit(&n->busy, 1, memory_order_acquire)) {
    /* Again under busy: whoever held it may have failed or let go of the link meanwhile. */
    if (atomic_load_explicit(&n->state, memory_order_relaxed) == FAB_BOUND && n->comm) {
      if (n->is_send) send_progress(n);
      else recv_progress(n, 1); /* post the receive for the slot just freed */
    }
    atomic_store_explicit(&n->busy, 0, memory_order_release);
  }
  fab_kick(); /* the thread tests what is in flight */
}

/* ---- the thread ---- */

/* Let a closing record go (under fx.lock, thread only): a sender first flushes what its rank posted
 * and says goodbye, unless aborted or the link is gone. 0 while it must stay. */
static int let_go(void* rec, uint64_t now) {
  struct fab_conn* n = rec;
  while (atomic_exchange_explicit(&n->busy, 1, memory_order_acquire)) sched_yield();
  int keep = 0;
  int aborted = __atomic_load_n(n->abort, __ATOMIC_RELAXED);
  if (aborted) {
    /* An abort flushes nothing but a poison record still going out (a moment at most), as on sockets:
     * the ranks behind this link learn what failed instead of only that this rank went away. */
    int due = n->is_send ? xfer_poison_is_set(&n->ctrl->down) && n->poison_state != 2 &&
                               atomic_load(&n->state) == FAB_BOUND
                         : xfer_poison_is_set(&n->ctrl->up) && n->back_state == 1 && n->up_sent != 2;
    if (due) {
      if (!n->drain_deadline) n->drain_deadline = now + ABORT_FLUSH_NS;
      keep = now < n->drain_deadline;
    }
  }
  if (n->is_send && atomic_load(&n->state) == FAB_BOUND && !aborted && n->poison_state != 2) {
    int unsent = atomic_load(&n->ctrl->tail) > n->done || n->poison_state == 1;
    if (!n->drain_deadline) n->drain_deadline = now + DRAIN_TIMEOUT_NS;
    if (unsent && now < n->drain_deadline) {
      keep = 1;
    } else if (!n->bye_state && !n->preq && !unsent) {
      struct tcp_step tr = {.bytes = TCP_BYE};
      memcpy(n->ctl, &tr, sizeof(tr));
      if (n->net->net->isend(n->comm, n->ctl, sizeof(tr), n->rank, n->mh, NULL, &n->preq) == ncclSuccess) {
        if (n->preq) {
          n->bye_state = 1;
          n->drain_deadline = now + BYE_TIMEOUT_NS;
        }
        keep = n->preq || now < n->drain_deadline; /* no request: the network says not now */
      }
    } else if (n->bye_state == 1 && now < n->drain_deadline) {
      keep = 1;
    } else if (n->bye_state == 2 && n->back_state == 1 && !n->peer_bye) {
      /* The receiver's goodbye is its last message into our memory: wait for it (bounded) before the
       * registration goes, so that no write of a network doing RMA lands on a dead key. */
      if (!n->back_deadline) n->back_deadline = now + BYE_TIMEOUT_NS;
      keep = now < n->back_deadline;
    } else if (unsent) {
      WARN("rank %d: closing the fabric connection to rank %d with %llu step(s) it never took", n->rank, n->peer,
           (unsigned long long)(atomic_load(&n->ctrl->tail) - n->done));
    }
  } else if (!n->is_send && !aborted) {
    /* The sender's goodbye is its last message into our FIFO (bounded wait, as above); then ours goes
     * on the way back. */
    if (!n->drain_deadline) n->drain_deadline = now + BYE_TIMEOUT_NS;
    int sender_open = atomic_load(&n->state) == FAB_BOUND && n->poison_state != 2;
    if (sender_open && now < n->drain_deadline) {
      keep = 1;
    } else if (n->back_state != 1) {
      /* no way back: nothing more to say */
    } else if (n->breq) { /* quietly: the sender may have closed first */
      if (!n->back_deadline) n->back_deadline = now + BYE_TIMEOUT_NS;
      int done = 0, size = 0;
      if (n->net->net->test(n->breq, &done, &size) != ncclSuccess || done) n->breq = NULL;
      keep = n->breq && now < n->back_deadline;
    } else if (!n->bye_state && n->up_sent == 0) {
      struct tcp_step tr = {.bytes = TCP_BYE};
      memcpy(n->ctl, &tr, sizeof(tr));
      if (!n->back_deadline) n->back_deadline = now + BYE_TIMEOUT_NS;
      if (n->net->net->isend(n->bcomm, n->ctl, sizeof(tr), n->rank, n->bmh, NULL, &n->breq) == ncclSuccess) {
        if (n->breq) n->bye_state = 1;
        keep = n->breq || now < n->back_deadline; /* no request: not now */
      }
    }
  }
  if (!keep) {
    const ncclNet_t* net = n->net->net;
    if (n->bcomm) {
      if (n->bmh) net->deregMr(n->bcomm, n->bmh);
      if (n->is_send) net->closeRecv(n->bcomm);
      else net->closeSend(n->bcomm);
    }
    if (n->blcomm) net->closeListen(n->blcomm);
    n->bcomm = n->blcomm = n->bmh = NULL;
    if (n->comm) {
      if (n->mh) net->deregMr(n->comm, n->mh);
      if (n->is_send) net->closeSend(n->comm);
      else net->closeRecv(n->comm);
    }
    if (n->lcomm) net->closeListen(n->lcomm);
    n->comm = n->lcomm = n->mh = NULL;
    probe_close(n);
    int bound = FAB_BOUND;
    atomic_compare_exchange_strong(&n->state, &bound, FAB_CLOSED); /* no fast path touches it again */
  }
  atomic_store_explicit(&n->busy, 0, memory_order_release);
  return !keep;
}

/* Take new records, release closing ones. 1 when the thread must exit (nothing left). */
static int sync_lists(void) {
  int draining;
  int exiting = progress_sync(&fx, NULL, let_go, NULL, &draining);
  fx_draining = draining; /* look again at the next pass (the thread's own flag: it still sleeps briefly) */
  return exiting;
}

static void* fab_main(void* arg) {
  (void)arg;
  uint64_t spin_ns = (uint64_t)param_int(PARAM_FABRIC_SPIN_US) * UT_NS_PER_US, idle_since = 0;
  long sleep_us = 1;
  for (;;) {
    /* Before the pass: a kick that lands during it (a post the pass may have missed) must cut the
     * sleep that follows. */
    uint32_t seen = atomic_load_explicit(&fx_word, memory_order_acquire);
    if ((fx_draining || atomic_load_explicit(&fx.changes, memory_order_acquire)) && sync_lists()) break;
    relay_failures();
    probe_all();
    int did = 0;
    for (struct fab_conn* n = fx.list; n; n = n->next) {
      if (atomic_exchange_explicit(&n->busy, 1, memory_order_acquire)) continue; /* a rank moves it now */
      did |= progress(n);
      atomic_store_explicit(&n->busy, 0, memory_order_release);
    }
    if (did) {
      idle_since = 0, sleep_us = 1;
      continue;
    }
    uint64_t now = ut_now_ns();
    if (!idle_since) idle_since = now;
    if (now - idle_since < spin_ns) {
      sched_yield();
      continue;
    }
    atomic_store(&fx_sleeping, 1);
    atomic_thread_fence(memory_order_seq_cst);
    if (!atomic_load(&fx.changes) && atomic_load(&fx_word) == seen) {
      struct timespec ts = {0, sleep_us * (long)UT_NS_PER_US};
      syscall(SYS_futex, (uint32_t*)&fx_word, FUTEX_WAIT_PRIVATE, seen, &ts, NULL, 0);
    }
    atomic_store(&fx_sleeping, 0);
    if (atomic_load(&fx_word) != seen) {
      sleep_us = 1, idle_since = 0; /* kicked: something was posted */
    } else {
      int waits = fx_draining;
      uint64_t t = ut_now_ns();
      for (struct fab_conn* n = fx.list; n && !waits; n = n->next) waits = rank_waits(n, t);
      long cap = waits ? ACTIVE_SLEEP_US : IDLE_SLEEP_US;
      sleep_us = sleep_us * 2 < cap ? sleep_us * 2 : cap;
    }
  }
  return NULL;
}

ch_status fab_register(struct fab_conn* n) {
  progress_lock(&fx);
  int e = progress_running_locked(&fx) ? 0 : progress_start_locked(&fx);
  if (e != 0) {
    pthread_mutex_unlock(&fx.lock);
    WARN("rank %d: cannot start the fabric progress thread: %s", n->rank, strerror(e));
    return CH_SYSTEM;
  }
  progress_add_locked(&fx, n);
  pthread_mutex_unlock(&fx.lock);
  fab_kick();
  return CH_OK;
}

void fab_closing(struct fab_conn* n) {
  progress_closing(&fx, n);
  fab_kick();
}

int fab_unregister(struct fab_conn* n) {
  fab_closing(n);
  /* Bounded: the flush and goodbyes are (30 s at most); only a network call that never returns can
   * keep the thread longer. Then the record is left to it (leaked) rather than the caller hanging. */
  struct timespec until;
  clock_gettime(CLOCK_REALTIME, &until);
  until.tv_sec += 60;
  int released = progress_wait_released(&fx, n, &until);
  if (!released)
    WARN("rank %d: the fabric connection %s rank %d was not let go within 60 s (a network call that does not "
         "return?): leaving it behind", n->rank, dir(n), n->peer);
  return released;
}
