/* Messages between ranks after the rendezvous.
 *
 * Each pair of ranks talks over persistent TCP connections, opened on first use. A rank sends to a
 * peer on the first connection it has with that peer (its own, or one the peer opened), and reads
 * from every connection, so all messages from one peer arrive in order and two ranks that connect
 * to each other at the same time still work. There is no background thread: whoever waits (send
 * or recv) accepts new connections and reads everything that arrives, queueing messages per peer.
 * Reading while sending also means two ranks sending large messages to each other cannot deadlock. */
#define _GNU_SOURCE /* accept4 */
#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../misc/log.h"
#include "../misc/utils.h"
#include "boot_internal.h"

#define BOOT_MAX_MSG (1ull << 40) /* larger sizes mean a corrupt header */

struct boot_msg {
  struct boot_msg* next;
  int tag;
  size_t size;
  char data[];
};

struct boot_conn {
  int fd;
  int peer; /* -1 until the hello is read */
  int dead; /* EOF or error seen; closed and freed by reap() outside of send loops */
  uint64_t t0;
  union sock_addr addr;
  size_t hello_got;
  unsigned char hello[sizeof(struct boot_hello) + sizeof(struct boot_peer_hello)];
  size_t hdr_got;
  struct boot_msg_hdr hdr;
  struct boot_msg* cur; /* message whose payload is arriving */
  size_t cur_got;
};

struct boot_peer {
  struct boot_conn* send;
  struct boot_msg *head, *tail;
  int lost; /* a connection with it closed or failed: nothing more will come */
  char why[160];
};

struct boot_state {
  int rank, nranks;
  uint64_t magic, secret;
  struct sock listener;
  union sock_addr* addrs;
  struct boot_peer* peers;
  struct boot_conn** conns;
  int nconns, cap;
  struct pollfd* pfds;
  int pcap;
  const volatile int* abort;
  uint64_t deadline;
};

static struct sock_wait boot_wait(struct boot_state* b) {
  struct sock_wait w = {b->abort, b->deadline};
  return w;
}

static struct boot_conn* conn_add(struct boot_state* b, int fd, const union sock_addr* addr, int peer) {
  if (b->nconns == b->cap) {
    int cap = b->cap ? b->cap * 2 : 8;
    struct boot_conn** c = realloc(b->conns, (size_t)cap * sizeof(*c));
    if (!c) return NULL;
    b->conns = c;
    b->cap = cap;
  }
  struct boot_conn* c = calloc(1, sizeof(*c));
  if (!c) return NULL;
  c->fd = fd;
  c->peer = peer;
  c->t0 = ut_now_ns();
  c->addr = *addr;
  b->conns[b->nconns++] = c;
  return c;
}

static void conn_free(struct boot_state* b, int i) {
  struct boot_conn* c = b->conns[i];
  if (c->peer >= 0 && b->peers[c->peer].send == c) b->peers[c->peer].send = NULL;
  if (c->fd >= 0) close(c->fd);
  free(c->cur);
  free(c);
  b->conns[i] = b->conns[--b->nconns];
}

static void reap(struct boot_state* b) {
  for (int i = b->nconns - 1; i >= 0; i--)
    if (b->conns[i]->dead) conn_free(b, i);
}

static void peer_lost(struct boot_state* b, int p, const char* why) {
  if (!b->peers[p].lost) snprintf(b->peers[p].why, sizeof(b->peers[p].why), "%s", why);
  b->peers[p].lost = 1;
}

static void enqueue(struct boot_peer* p, struct boot_msg* m) {
  m->next = NULL;
  if (p->tail) p->tail->next = m;
  else p->head = m;
  p->tail = m;
}

static struct boot_msg* take(struct boot_peer* p, int tag) {
  struct boot_msg **pp = &p->head, *prev = NULL;
  for (struct boot_msg* m = p->head; m; prev = m, pp = &m->next, m = m->next) {
    if (m->tag != tag) continue;
    *pp = m->next;
    if (p->tail == m) p->tail = prev;
    return m;
  }
  return NULL;
}

/* Check a complete hello; returns 0 and sets c->peer when it is one of our job's ranks. */
static int check_hello(struct boot_state* b, struct boot_conn* c) {
  struct boot_hello h;
  struct boot_peer_hello ph;
  memcpy(&h, c->hello, sizeof(h));
  memcpy(&ph, c->hello + sizeof(h), sizeof(ph));
  if (h.magic != b->magic || h.secret != b->secret || h.kind != BOOT_KIND_PEER) return -1;
  if (h.arg >= (uint32_t)b->nranks || (int)h.arg == b->rank || ph.to_rank != (uint32_t)b->rank ||
      ph.nranks != (uint32_t)b->nranks)
    return -1;
  c->peer = (int)h.arg;
  if (!b->peers[c->peer].send) b->peers[c->peer].send = c;
  return 0;
}

/* Read everything available on c, queueing complete messages. Never frees c. */
static void conn_read(struct boot_state* b, struct boot_conn* c) {
  char a[64];
  for (;;) {
    void* dst;
    size_t want;
    if (c->peer < 0) {
      dst = c->hello + c->hello_got;
      want = sizeof(c->hello) - c->hello_got;
    } else if (c->hdr_got < sizeof(c->hdr)) {
      dst = (char*)&c->hdr + c->hdr_got;
      want = sizeof(c->hdr) - c->hdr_got;
    } else {
      dst = c->cur->data + c->cur_got;
      want = c->cur->size - c->cur_got;
    }
    ssize_t n = want ? recv(c->fd, dst, want, 0) : 0;
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return;
    if (n <= 0 && want) { /* EOF or error */
      c->dead = 1;
      if (c->peer < 0) {
        INFO(LOG_BOOTSTRAP, "Bootstrap rank %d: ignoring connection from %s (closed before its hello)", b->rank,
             sock_addr_str(&c->addr, a, sizeof(a)));
      } else if (n == 0 && c->hdr_got == 0) {
        peer_lost(b, c->peer, "closed its bootstrap connection");
      } else {
        char why[160];
        snprintf(why, sizeof(why), "broke its bootstrap connection (%s)",
                 n == 0 ? "closed in the middle of a message" : strerror(errno));
        peer_lost(b, c->peer, why);
      }
      return;
    }
    if (c->peer < 0) {
      c->hello_got += (size_t)n;
      if (c->hello_got == sizeof(c->hello) && check_hello(b, c) != 0) {
        INFO(LOG_BOOTSTRAP, "Bootstrap rank %d: ignoring connection from %s (not this job's hello)", b->rank,
             sock_addr_str(&c->addr, a, sizeof(a)));
        c->dead = 1;
        return;
      }
    } else if (c->hdr_got < sizeof(c->hdr)) {
      c->hdr_got += (size_t)n;
      if (c->hdr_got == sizeof(c->hdr)) {
        if (c->hdr.size > BOOT_MAX_MSG || !(c->cur = malloc(sizeof(struct boot_msg) + c->hdr.size))) {
          peer_lost(b, c->peer, "sent a corrupt or oversized bootstrap message");
          c->dead = 1;
          return;
        }
        c->cur->tag = c->hdr.tag;
        c->cur->size = c->hdr.size;
        c->cur_got = 0;
      }
    } else {
      c->cur_got += (size_t)n;
    }
    if (c->peer >= 0 && c->cur && c->cur_got == c->cur->size) {
      enqueue(&b->peers[c->peer], c->cur);
      c->cur = NULL;
      c->hdr_got = 0;
    }
  }
}

/* One poll round (≤100 ms): accept new connections, read what arrived. *writable tells whether
 * `want` may be written to. Connection failures are recorded on peers, not returned. */
static ch_status progress(struct boot_state* b, struct boot_conn* want, int* writable) {
  struct sock_wait w = boot_wait(b);
  int np = b->nconns + 1;
  if (np > b->pcap) {
    struct pollfd* p = realloc(b->pfds, (size_t)np * 2 * sizeof(*p));
    if (!p) {
      WARN("Bootstrap rank %d: out of memory", b->rank);
      return CH_SYSTEM;
    }
    b->pfds = p;
    b->pcap = np * 2;
  }
  b->pfds[0] = (struct pollfd){b->listener.fd, POLLIN, 0};
  for (int i = 0; i < b->nconns; i++) {
    struct boot_conn* c = b->conns[i];
    b->pfds[i + 1] = (struct pollfd){c->dead ? -1 : c->fd, (short)(POLLIN | (c == want ? POLLOUT : 0)), 0};
  }
  int nc = b->nconns;
  int r = poll(b->pfds, (nfds_t)np, sock_wait_slice_ms(&w));
  if (r < 0 && errno != EINTR) {
    WARN("Bootstrap rank %d: poll failed: %s", b->rank, strerror(errno));
    return CH_SYSTEM;
  }
  if (writable) *writable = 0;
  for (int i = 0; r > 0 && i < nc; i++) {
    struct boot_conn* c = b->conns[i];
    short ev = b->pfds[i + 1].revents;
    if (c == want && writable && (ev & (POLLOUT | POLLERR | POLLHUP))) *writable = 1;
    if (ev & (POLLIN | POLLERR | POLLHUP)) conn_read(b, c);
  }
  if (r > 0 && (b->pfds[0].revents & POLLIN)) {
    for (;;) {
      union sock_addr addr;
      socklen_t len = sizeof(addr);
      int fd = accept4(b->listener.fd, &addr.sa, &len, SOCK_NONBLOCK | SOCK_CLOEXEC);
      if (fd < 0) break;
      struct boot_conn* c = conn_add(b, fd, &addr, -1);
      if (!c) {
        close(fd);
        break;
      }
      conn_read(b, c); /* the hello is usually there already */
    }
  }
  uint64_t now = ut_now_ns();
  for (int i = 0; i < b->nconns; i++) {
    struct boot_conn* c = b->conns[i];
    if (c->peer < 0 && !c->dead && now - c->t0 > BOOT_HELLO_TIMEOUT_NS) {
      char a[64];
      INFO(LOG_BOOTSTRAP, "Bootstrap rank %d: dropping connection from %s (no hello within 5 s)", b->rank,
           sock_addr_str(&c->addr, a, sizeof(a)));
      c->dead = 1;
    }
  }
  return CH_OK;
}

/* A wait ended without success: say why (abort is not an error to report loudly). */
static ch_status wait_failed(struct boot_state* b, ch_status st, const char* what, int peer, int tag) {
  char a[64];
  if (st == CH_ABORTED)
    INFO(LOG_BOOTSTRAP, "Bootstrap rank %d: aborted while %s rank %d (tag %d)", b->rank, what, peer, tag);
  else if (st == CH_TIMEOUT)
    WARN("Bootstrap rank %d: timed out %s rank %d at %s (tag %d)", b->rank, what, peer,
         sock_addr_str(&b->addrs[peer], a, sizeof(a)), tag);
  return st;
}

static ch_status conn_write(struct boot_state* b, struct boot_conn* c, const void* buf, size_t n, int tag) {
  const char* p = buf;
  char a[64];
  while (n > 0) {
    ssize_t r = send(c->fd, p, n, MSG_NOSIGNAL);
    if (r > 0) {
      p += r;
      n -= (size_t)r;
      continue;
    }
    if (r < 0 && errno == EINTR) continue;
    if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      struct sock_wait w = boot_wait(b);
      ch_status st = sock_wait_check(&w);
      if (st != CH_OK) return wait_failed(b, st, "sending to", c->peer, tag);
      CHECK(progress(b, c, NULL));
      continue;
    }
    int e = r < 0 ? errno : EPIPE;
    c->dead = 1;
    peer_lost(b, c->peer, e == EPIPE || e == ECONNRESET ? "closed its bootstrap connection" : strerror(e));
    WARN("Bootstrap rank %d: sending to rank %d at %s failed: %s", b->rank, c->peer,
         sock_addr_str(&b->addrs[c->peer], a, sizeof(a)),
         e == EPIPE || e == ECONNRESET ? "connection closed by the peer" : strerror(e));
    return CH_REMOTE;
  }
  return CH_OK;
}

static ch_status check_peer(struct boot_state* b, int peer, const char* what) {
  if (peer < 0 || peer >= b->nranks) {
    WARN("Bootstrap rank %d: %s invalid peer %d (nranks %d)", b->rank, what, peer, b->nranks);
    return CH_INTERNAL;
  }
  return CH_OK;
}

ch_status boot_send(struct boot_state* b, int peer, int tag, const void* data, size_t size) {
  char a[64];
  CHECK(check_peer(b, peer, "send to"));
  reap(b);
  struct boot_msg_hdr hdr = {tag, 0, size};
  if (peer == b->rank) {
    struct boot_msg* m = malloc(sizeof(*m) + size);
    if (!m) {
      WARN("Bootstrap rank %d: out of memory for a %zu-byte message", b->rank, size);
      return CH_SYSTEM;
    }
    m->tag = tag;
    m->size = size;
    if (size) memcpy(m->data, data, size);
    enqueue(&b->peers[peer], m);
    return CH_OK;
  }
  struct boot_peer* p = &b->peers[peer];
  if (p->lost) {
    WARN("Bootstrap rank %d: cannot send to rank %d (tag %d): it %s", b->rank, peer, tag, p->why);
    return CH_REMOTE;
  }
  if (!p->send) {
    struct sock s;
    struct sock_wait w = boot_wait(b);
    ch_status st = sock_connect(&b->addrs[peer], &s, &w);
    if (st == CH_TIMEOUT || st == CH_ABORTED) return wait_failed(b, st, "connecting to", peer, tag);
    if (st != CH_OK) {
      WARN("Bootstrap rank %d: cannot connect to rank %d at %s", b->rank, peer,
           sock_addr_str(&b->addrs[peer], a, sizeof(a)));
      return st;
    }
    struct boot_conn* c = conn_add(b, s.fd, &s.addr, peer);
    if (!c) {
      sock_close(&s);
      WARN("Bootstrap rank %d: out of memory", b->rank);
      return CH_SYSTEM;
    }
    p->send = c;
    struct {
      struct boot_hello h;
      struct boot_peer_hello ph;
    } hello = {{b->magic, b->secret, BOOT_KIND_PEER, (uint32_t)b->rank}, {(uint32_t)peer, (uint32_t)b->nranks}};
    CHECK(conn_write(b, c, &hello, sizeof(hello), tag));
  }
  if (size <= 4096) { /* one segment for the common small message */
    char buf[sizeof(hdr) + 4096];
    memcpy(buf, &hdr, sizeof(hdr));
    if (size) memcpy(buf + sizeof(hdr), data, size);
    return conn_write(b, p->send, buf, sizeof(hdr) + size, tag);
  }
  CHECK(conn_write(b, p->send, &hdr, sizeof(hdr), tag));
  return conn_write(b, p->send, data, size, tag);
}

ch_status boot_recv(struct boot_state* b, int peer, int tag, void* data, size_t size) {
  CHECK(check_peer(b, peer, "receive from"));
  reap(b);
  struct boot_peer* p = &b->peers[peer];
  for (;;) {
    struct boot_msg* m = take(p, tag);
    if (m) {
      ch_status st = CH_OK;
      if (m->size != size) {
        WARN("Bootstrap rank %d: message from rank %d (tag %d) has %zu bytes, expected %zu", b->rank, peer, tag,
             m->size, size);
        st = CH_INTERNAL;
      } else if (size) {
        memcpy(data, m->data, size);
      }
      free(m);
      return st;
    }
    if (p->lost) {
      WARN("Bootstrap rank %d: rank %d %s before sending the expected message (tag %d)", b->rank, peer, p->why, tag);
      return CH_REMOTE;
    }
    struct sock_wait w = boot_wait(b);
    ch_status st = sock_wait_check(&w);
    if (st != CH_OK) return wait_failed(b, st, "waiting for a message from", peer, tag);
    CHECK(progress(b, NULL, NULL));
  }
}

/* Ring: in step s each rank forwards the slot it received in step s-1 to its next rank. */
ch_status boot_allgather(struct boot_state* b, void* data, size_t size) {
  int n = b->nranks, r = b->rank;
  if (n == 1) return CH_OK;
  char* d = data;
  int next = (r + 1) % n, prev = (r + n - 1) % n;
  for (int s = 0; s < n - 1; s++) {
    int send_slot = (r - s + n) % n, recv_slot = (r - s - 1 + 2 * n) % n;
    CHECK(boot_send(b, next, BOOT_TAG_ALLGATHER, d + (size_t)send_slot * size, size));
    CHECK(boot_recv(b, prev, BOOT_TAG_ALLGATHER, d + (size_t)recv_slot * size, size));
  }
  return CH_OK;
}

/* n-1 empty tokens around the ring: the k-th token a rank receives proves that rank r-k arrived.
 * It uses only the ring connections, so a barrier opens no new sockets. */
ch_status boot_barrier(struct boot_state* b) {
  int n = b->nranks, r = b->rank;
  for (int s = 0; s < n - 1; s++) {
    CHECK(boot_send(b, (r + 1) % n, BOOT_TAG_BARRIER, NULL, 0));
    CHECK(boot_recv(b, (r + n - 1) % n, BOOT_TAG_BARRIER, NULL, 0));
  }
  return CH_OK;
}

ch_status boot_peers_create(struct boot_state** out, int rank, int nranks, uint64_t magic, uint64_t secret,
                            const union sock_addr* addrs, struct sock* listener, const volatile int* abort,
                            uint64_t deadline_ns) {
  struct boot_state* b = calloc(1, sizeof(*b));
  if (b) {
    b->addrs = malloc((size_t)nranks * sizeof(*b->addrs));
    b->peers = calloc((size_t)nranks, sizeof(*b->peers));
  }
  if (!b || !b->addrs || !b->peers) {
    if (b) {
      free(b->addrs);
      free(b->peers);
      free(b);
    }
    WARN("Bootstrap rank %d: out of memory for %d ranks", rank, nranks);
    return CH_SYSTEM;
  }
  memcpy(b->addrs, addrs, (size_t)nranks * sizeof(*addrs));
  b->rank = rank;
  b->nranks = nranks;
  b->magic = magic;
  b->secret = secret;
  b->listener = *listener;
  listener->fd = -1; /* ours now */
  b->abort = abort;
  b->deadline = deadline_ns;
  *out = b;
  return CH_OK;
}

ch_status boot_new_listener(struct boot_state* parent, struct sock* listener) {
  union sock_addr a = parent->listener.addr;
  if (a.sa.sa_family == AF_INET) a.sin.sin_port = 0;
  else a.sin6.sin6_port = 0;
  return sock_listen(&a, listener);
}

uint64_t boot_secret(struct boot_state* b) { return b->secret; }
void boot_set_abort(struct boot_state* b, const volatile int* abort) { b->abort = abort; }
void boot_set_deadline(struct boot_state* b, uint64_t deadline_ns) { b->deadline = deadline_ns; }

void boot_close(struct boot_state* b) {
  if (!b) return;
  while (b->nconns > 0) conn_free(b, b->nconns - 1);
  for (int i = 0; i < b->nranks; i++) {
    struct boot_msg* m = b->peers[i].head;
    while (m) {
      struct boot_msg* next = m->next;
      free(m);
      m = next;
    }
  }
  sock_close(&b->listener);
  free(b->conns);
  free(b->pfds);
  free(b->addrs);
  free(b->peers);
  free(b);
}
