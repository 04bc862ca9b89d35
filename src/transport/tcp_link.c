/* One network connection's bytes: steps out (send_steps) and in (recv_steps), by the proxy thread
 * (net_progress_*) or by a rank's own thread (tp_proxy_post's direct send through tcp_send_direct,
 * tp_tcp_poll's reads), and who reads a receive socket (reader_set, tp_tcp_idle). `busy` decides who
 * moves a connection's stream state at a time; the link state (conn_fail) is the proxy's alone.
 * Nothing read from the socket is trusted: a step's byte count is bounded by the slot before any
 * payload is read, and the poison/goodbye markers are the only other values accepted (tcp_proxy.c runs
 * the thread, its epoll set and the connections' lifetime). */
#define _GNU_SOURCE
#include <errno.h>
#include <sched.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <sys/uio.h>

#include "../misc/log.h"
#include "tcp.h"

static const char* conn_dir(const struct tcp_conn* n) { return n->is_send ? "to" : "from"; }

/* The link is gone: mark it (once), tell the communicator, wake the rank so it looks. err 0: EOF. */
static void conn_fail(struct tcp_conn* n, const char* op, int err) {
  int st = atomic_load_explicit(&n->state, memory_order_relaxed);
  if (st == TCP_FAILED || st == TCP_CLOSED) return;
  /* The communicator already failed with a cause (a peer reported a mismatch or a lost rank over
   * this or another link, or our rank's call failed): our rank fails with that cause, and a peer's
   * teardown that follows is no news. Saying "connection closed" then would replace the cause in
   * ncclGetLastError and the async error. */
  int told = proxy_comm_told(n);
  if (n->bye_seen || told) { /* the peer said goodbye first: an orderly close */
    if (told && !n->bye_seen)
      INFO(LOG_NET, "rank %d: rank %d closed the network connection after the communicator failed", n->rank, n->peer);
    atomic_store_explicit(&n->state, TCP_CLOSED, memory_order_release);
  } else {
    char a[64];
    struct log_err_sink* prev = log_set_error_sink(n->sink); /* ncclGetLastError(comm) says it too */
    WARN("rank %d: network connection %s rank %d (pid %d on %s, %s) failed in %s: %s", n->rank, conn_dir(n),
         n->peer, n->peer_pid, n->peer_host, sock_addr_str(&n->remote, a, sizeof(a)), op,
         err ? strerror(err) : "connection closed by the peer (it exited, was killed, or aborted)");
    log_set_error_sink(prev);
    atomic_store_explicit(&n->state, TCP_FAILED, memory_order_release);
    /* The peer is what a survivor shrinks away (chorusCommGetLostRank): a call that finds the async
     * error at its start never reaches the engine, which would otherwise name it. */
    tp_note_link_lost(n->async_err, n->lost_rank, n->peer);
  }
  if (n->fd >= 0) epoll_ctl(n->epfd, EPOLL_CTL_DEL, n->fd, NULL);
  n->rd_ready = n->wr_ready = 0;
  tp_wake_slow(&n->ctrl->tail);
  tp_wake_slow(&n->ctrl->head);
  if (atomic_load_explicit(&n->state, memory_order_relaxed) == TCP_FAILED) proxy_fail_comm(n);
}

/* Who reads receive socket n: the rank (its epoll entry keeps only hang-ups) or the proxy (re-armed
 * with EPOLLIN: the kernel reports at once what is already there). Caller holds n->busy. */
static void reader_set(struct tcp_conn* n, int rank) {
  atomic_store_explicit(&n->rank_reads, rank, memory_order_relaxed);
  if (rank) atomic_store_explicit(&n->ctrl->send_sleeping, 0, memory_order_relaxed);
  struct epoll_event e = {.events = (rank ? 0 : EPOLLIN) | EPOLLRDHUP | EPOLLET, .data.ptr = n};
  if (epoll_ctl(n->epfd, EPOLL_CTL_MOD, n->fd, &e) != 0 && errno != ENOENT) /* ENOENT: a failed link, removed */
    WARN("net proxy: epoll_ctl MOD failed: %s", strerror(errno));
}

/* recv() result: 1 if bytes came, else 0 (EAGAIN clears rd_ready; EOF and errors fail the link). */
static int recv_ok(struct tcp_conn* n, ssize_t r) {
  if (r > 0) return 1;
  if (r == 0) conn_fail(n, "receive", 0);
  else if (errno == EAGAIN || errno == EWOULDBLOCK) n->rd_ready = 0;
  else if (errno != EINTR) conn_fail(n, "receive", errno);
  return 0;
}

/* Send what the rank posted, one step after the other. Caller holds n->busy. direct: called by the
 * rank thread right after its post (small steps only, up to max bytes); it leaves every error and
 * every EAGAIN to the proxy (the only one to touch wr_ready or fail a link), so no epoll edge is lost.
 * Returns 1 if bytes moved (or the link failed), 0 otherwise; *rest: posted steps are left. */
static int send_steps(struct tcp_conn* n, int direct, uint64_t max, int* rest) {
  int did = 0;
  const size_t hs = sizeof(n->cur);
  *rest = 0;
  for (;;) {
    if (n->poison_state == 2) break; /* the communicator failed: nothing follows the poison */
    /* The rank's call failed (fault/mismatch.c): the record goes out before any further step. */
    if (!direct && !n->poison_state && n->off == 0 && xfer_poison_is_set(&n->ctrl->down)) {
      const struct xfer_poison* d = &n->ctrl->down;
      xfer_poison_copy(&n->pbuf, d);
      n->cur.bytes = TCP_POISON;
      memset(&n->cur.hdr, 0, sizeof(n->cur.hdr));
      n->poison_state = 1;
    }
    char* data;
    if (n->poison_state == 1) {
      if (direct) break;
      *rest = 1;
      if (!n->wr_ready) break;
      data = (char*)&n->pbuf;
    } else {
      uint64_t tail = atomic_load_explicit(&n->ctrl->tail, memory_order_acquire);
      if (n->step >= tail) break;
      *rest = 1;
      if (!direct && !n->wr_ready) break;
      int slot = (int)(n->step % CH_STEPS);
      data = n->buf + (size_t)slot * n->slot_bytes;
      if (n->off == 0) {
        if (direct && n->ctrl->size[slot] > max) break;
        n->cur.bytes = n->ctrl->size[slot];
        n->cur.hdr = n->ctrl->hdr[slot];
      }
      if (n->cur.bytes > n->slot_bytes) { /* only Simple records sizes: another protocol reached net */
        if (direct) break;
        WARN("rank %d: step of %llu bytes for a %zu-byte slot on the network connection to rank %d (internal)",
             n->rank, (unsigned long long)n->cur.bytes, n->slot_bytes, n->peer);
        conn_fail(n, "send", EPROTO);
        return 1;
      }
    }
    size_t payload = n->poison_state == 1 ? sizeof(n->pbuf) : n->cur.bytes, total = hs + payload;
    struct iovec iov[2];
    int k = 0;
    if (n->off < hs) {
      iov[k++] = (struct iovec){(char*)&n->cur + n->off, hs - n->off};
      if (payload) iov[k++] = (struct iovec){data, payload};
    } else {
      iov[k++] = (struct iovec){data + (n->off - hs), total - n->off};
    }
    struct msghdr m = {.msg_iov = iov, .msg_iovlen = (size_t)k};
    ssize_t r = sendmsg(n->fd, &m, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (r < 0) {
      if (errno == EINTR) continue;
      if (direct) break;
      if (errno == EAGAIN || errno == EWOULDBLOCK) n->wr_ready = 0;
      else conn_fail(n, "send", errno);
      break;
    }
    did = 1;
    n->off += (size_t)r;
    if (n->off == total && n->poison_state == 1) {
      n->off = 0, n->poison_state = 2, *rest = 0;
      break;
    }
    if (n->off == total) { /* in the kernel now: the slot is free again */
      n->off = 0;
      n->step++;
      *rest = 0;
      atomic_store_explicit(&n->ctrl->head, n->step, memory_order_release);
      tp_wake(&n->ctrl->head, &n->ctrl->send_sleeping);
    }
  }
  return did;
}

int tcp_progress_send(struct tcp_conn* n) {
  int did = 0, rest;
  /* The rank may be sending a small step itself (tp_proxy_post): then it is its turn. */
  if (!atomic_exchange_explicit(&n->busy, 1, memory_order_acquire)) {
    did = send_steps(n, 0, 0, &rest);
    atomic_store_explicit(&n->busy, 0, memory_order_release);
  }
  /* The receiver only ever writes its goodbye, or the record of a failed call; EOF without a goodbye
   * means it died. */
  while (n->rd_ready) {
    char b[128];
    ssize_t r = recv(n->fd, b, sizeof(b), MSG_DONTWAIT);
    if (!recv_ok(n, r)) break;
    did = 1;
    for (ssize_t i = 0; i < r; i++) {
      if (n->pup_in) {
        ((char*)&n->pup)[n->pup_off++] = b[i];
        if (n->pup_off < sizeof(n->pup)) continue;
        n->pup_in = 0;
        if (xfer_poison_put(&n->ctrl->up, &n->pup)) tp_wake_slow(&n->ctrl->head); /* only printed: no checks */
      } else if (b[i] == TCP_POISON_BYTE) {
        n->pup_in = 1, n->pup_off = 0;
      } else if (b[i] == TCP_BYE_BYTE) {
        n->bye_seen = 1;
      } else {
        conn_fail(n, "receive (unexpected data from the receiver)", EPROTO);
        return 1;
      }
    }
  }
  return did;
}

static int carry_left(const struct tcp_conn* n) { return n->carry_off < n->carry_len; }

/* A step wholly read (a payload of 0 bytes: its header is all) that waited for a free slot: it needs
 * no more bytes, so no epoll edge will announce it. */
static int step_in_hand(const struct tcp_conn* n) {
  return n->off >= sizeof(n->cur) && n->cur.bytes <= n->slot_bytes && n->off == sizeof(n->cur) + n->cur.bytes;
}

/* A header read that needs no more bytes to act on (a goodbye, or a step larger than the slot: the
 * rank hands such a header back), so no epoll edge may come for it either. */
static int header_in_hand(const struct tcp_conn* n) {
  return n->off == sizeof(n->cur) && n->cur.bytes != TCP_POISON &&
         (n->cur.bytes == TCP_BYE || n->cur.bytes > n->slot_bytes);
}

/* Read the stream: bytes carried over first (never beyond them: the next call goes to the socket). */
static ssize_t tcp_read(struct tcp_conn* n, void* dst, size_t len) {
  if (!carry_left(n)) return recv(n->fd, dst, len, MSG_DONTWAIT);
  size_t m = n->carry_len - n->carry_off;
  if (m > len) m = len;
  memcpy(dst, n->carry + n->carry_off, m);
  n->carry_off += m;
  if (n->carry_off == n->carry_len) n->carry_off = n->carry_len = 0;
  return (ssize_t)m;
}

/* A read's result: 1 if bytes came. Else the proxy handles EAGAIN, EOF and errors (recv_ok); the rank
 * (direct) keeps the socket on EAGAIN only and otherwise gives it back (*back): the proxy alone
 * fails links. */
static int read_ok(struct tcp_conn* n, int direct, ssize_t r, int* back) {
  if (!direct) return recv_ok(n, r);
  if (r > 0) return 1;
  *back = !(r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR));
  return 0;
}

/* Receive steps into free slots. Caller holds n->busy. direct: called by the waiting rank thread
 * (tp_tcp_poll); it leaves EOF, errors, goodbyes, bad headers and steps over direct_max to the proxy
 * (the only one to touch rd_ready or the link state) by setting *back: the socket goes back to the
 * proxy, whose epoll set then reports what is there. */
static int recv_steps(struct tcp_conn* n, int direct, int* back) {
  int did = 0;
  const size_t hs = sizeof(n->cur);
  while (direct || n->rd_ready || carry_left(n) || step_in_hand(n) || header_in_hand(n)) {
    if (direct && n->off == 0 && !carry_left(n)) { /* a new step: header and a small payload at once */
      ssize_t r = recv(n->fd, n->carry, sizeof(n->carry), MSG_DONTWAIT);
      if (!read_ok(n, direct, r, back)) break;
      n->carry_off = 0, n->carry_len = (size_t)r;
    }
    if (n->off < hs) {
      ssize_t r = tcp_read(n, (char*)&n->cur + n->off, hs - n->off);
      if (!read_ok(n, direct, r, back)) break;
      did = 1;
      n->off += (size_t)r;
      if (n->off < hs) continue;
    }
    /* A step larger than the slot goes back too: only the proxy fails a link (conn_fail walks its
     * list of records). */
    if (direct && (n->cur.bytes > n->direct_max || n->cur.bytes > n->slot_bytes || n->cur.bytes == TCP_POISON ||
                   n->cur.bytes == TCP_BYE)) {
      if (n->cur.bytes > n->direct_max && n->cur.bytes <= n->slot_bytes) n->big = 1;
      *back = 1;
      break;
    }
    if (n->cur.bytes == TCP_POISON) { /* the sender's call failed: a record, not a step */
      size_t total = hs + sizeof(n->pbuf);
      ssize_t r = tcp_read(n, (char*)&n->pbuf + (n->off - hs), total - n->off);
      if (!recv_ok(n, r)) break;
      n->off += (size_t)r;
      did = 1;
      if (n->off < total) continue;
      n->off = 0;
      if (xfer_poison_put(&n->ctrl->down, &n->pbuf)) tp_wake_slow(&n->ctrl->tail); /* only printed: no checks */
      continue;
    }
    if (n->cur.bytes == TCP_BYE || n->cur.bytes > n->slot_bytes) {
      if (n->cur.bytes == TCP_BYE) {
        n->bye_seen = 1;
        atomic_store_explicit(&n->state, TCP_CLOSED, memory_order_release);
        epoll_ctl(n->epfd, EPOLL_CTL_DEL, n->fd, NULL);
        n->rd_ready = n->wr_ready = 0;
      } else { /* never trust the wire */
        struct log_err_sink* prev = log_set_error_sink(n->sink);
        WARN("rank %d: rank %d announced a %llu-byte step on the network connection, more than the %zu-byte slot: "
             "closing it", n->rank, n->peer, (unsigned long long)n->cur.bytes, n->slot_bytes);
        log_set_error_sink(prev);
        conn_fail(n, "receive", EPROTO);
      }
      return 1;
    }
    uint64_t head = atomic_load_explicit(&n->ctrl->head, memory_order_acquire);
    if (n->step - head >= CH_STEPS) break; /* no free slot: the rank's head post wakes us */
    int slot = (int)(n->step % CH_STEPS);
    size_t total = hs + n->cur.bytes;
    if (n->off < total) {
      char* data = n->buf + (size_t)slot * n->slot_bytes;
      ssize_t r = tcp_read(n, data + (n->off - hs), total - n->off);
      if (!read_ok(n, direct, r, back)) break;
      did = 1;
      n->off += (size_t)r;
      if (n->off < total) continue;
    }
    n->ctrl->size[slot] = n->cur.bytes;
    n->ctrl->hdr[slot] = n->cur.hdr;
    n->ctrl->tag[slot] = xfer_tag(&n->cur.hdr); /* from the header: the rank compares it with its own */
    if (n->cur.bytes <= n->direct_max) n->big = 0; /* small steps again: the rank may read them */
    n->off = 0;
    n->step++;
    did = 1;
    atomic_store_explicit(&n->ctrl->tail, n->step, memory_order_release); /* after every byte */
    if (!direct) tp_wake(&n->ctrl->tail, &n->ctrl->recv_sleeping);
  }
  return did;
}

int tcp_progress_recv(struct tcp_conn* n) {
  int did = 0;
  /* Our rank's call failed: tell the sender, against the data direction. */
  if (n->poison_state != 2 && xfer_poison_is_set(&n->ctrl->up)) {
    if (!n->poison_state) {
      const struct xfer_poison* u = &n->ctrl->up;
      xfer_poison_copy(&n->pup, u);
      n->poison_state = 1, n->pup_off = 0;
    }
    while (n->pup_off < 1 + sizeof(n->pup)) {
      char p = TCP_POISON_BYTE;
      const char* src = n->pup_off ? (const char*)&n->pup + n->pup_off - 1 : &p;
      size_t len = n->pup_off ? sizeof(n->pup) - (n->pup_off - 1) : 1;
      ssize_t r = send(n->fd, src, len, MSG_NOSIGNAL | MSG_DONTWAIT);
      if (r < 0 && errno == EINTR) continue;
      if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) break;
      if (r <= 0) { /* the link is going anyway: nothing more to tell */
        n->pup_off = 1 + sizeof(n->pup);
        break;
      }
      n->pup_off += (size_t)r, did = 1;
    }
    if (n->pup_off == 1 + sizeof(n->pup)) n->poison_state = 2;
  }
  if (atomic_load_explicit(&n->rank_reads, memory_order_relaxed) && !n->hup_event) {
    n->rd_ready = 0; /* an edge from before the rank took the socket: it reads what came */
    return did;
  }
  /* The rank may be receiving itself while it waits (tp_tcp_poll): then it is its turn. */
  if (!atomic_exchange_explicit(&n->busy, 1, memory_order_acquire)) {
    if (atomic_load_explicit(&n->rank_reads, memory_order_relaxed)) {
      /* The peer hung up while the rank had the socket: read to the end here, so that a lost peer is
       * reported (async error) even when the rank is in no call. */
      atomic_store_explicit(&n->hup, 1, memory_order_relaxed);
      reader_set(n, 0);
      n->rd_ready = 1;
    }
    n->hup_event = 0;
    did = recv_steps(n, 0, NULL);
    n->pending = carry_left(n) || step_in_hand(n) || header_in_hand(n); /* for can_progress (no busy) */
    atomic_store_explicit(&n->busy, 0, memory_order_release);
  }
  return did;
}

int tp_tcp_poll(struct conn* c) {
  struct tcp_conn* n = c->tcp;
  if (c->transport != TP_TCP || !n || n->is_send || !n->direct_max ||
      atomic_load_explicit(&n->state, memory_order_acquire) != TCP_BOUND ||
      atomic_load_explicit(&n->hup, memory_order_relaxed))
    return 0;
  if (atomic_exchange_explicit(&n->busy, 1, memory_order_acquire)) return 0;
  int did = 0, back = 0;
  /* fd: let_go closes it under busy. A large transfer stays with the proxy, which receives while
   * this rank reduces; the rank takes the socket between steps only. */
  if (n->fd >= 0 && !n->big && !atomic_load_explicit(&n->hup, memory_order_relaxed) &&
      (atomic_load_explicit(&n->rank_reads, memory_order_relaxed) || n->off == 0)) {
    if (!atomic_load_explicit(&n->rank_reads, memory_order_relaxed)) reader_set(n, 1);
    did = recv_steps(n, 1, &back);
    if (back) reader_set(n, 0);
  }
  atomic_store_explicit(&n->busy, 0, memory_order_release);
  /* The proxy may have slept while this rank read: it must look at what this rank leaves it (carried
   * bytes, a step in hand) that no epoll edge announces, and arm its wake-ups for this FIFO. */
  if (back) tp_proxy_kick();
  return did;
}

void tp_tcp_idle(struct conn* c) {
  struct tcp_conn* n = c->tcp;
  if (c->transport != TP_TCP || !n || n->is_send || !atomic_load_explicit(&n->rank_reads, memory_order_relaxed))
    return;
  /* busy is held only for a few non-blocking calls (the proxy's pass, let_go's close) */
  while (atomic_exchange_explicit(&n->busy, 1, memory_order_acquire)) sched_yield();
  int back = n->fd >= 0 && atomic_load_explicit(&n->rank_reads, memory_order_relaxed);
  if (back) reader_set(n, 0);
  atomic_store_explicit(&n->busy, 0, memory_order_release);
  if (back) tp_proxy_kick(); /* as in tp_tcp_poll */
}

/* The rank just posted on send FIFO n: send what fits now from this thread (steps up to direct_max).
 * Returns 1 if posted steps are left for the proxy. */
int tcp_send_direct(struct tcp_conn* n) {
  int rest = 1;
  if (n->direct_max && atomic_load_explicit(&n->state, memory_order_relaxed) == TCP_BOUND &&
      !atomic_exchange_explicit(&n->busy, 1, memory_order_acquire)) {
    send_steps(n, 1, n->direct_max, &rest);
    atomic_store_explicit(&n->busy, 0, memory_order_release);
  }
  return rest;
}
