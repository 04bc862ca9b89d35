/* Messages between ranks after the rendezvous.
 *
 * Each pair of ranks talks over persistent TCP connections, opened on first use. A rank sends to a
 * peer on the first connection it has with that peer (its own, or one the peer opened), and reads
 * from every connection, so all messages from one peer arrive in order and two ranks that connect
 * to each other at the same time still work. There is no background thread: whoever waits (send
 * or recv) accepts new connections and reads everything that arrives, queueing messages per peer.
 * Reading while sending also means two ranks sending large messages to each other cannot deadlock.
 *
 * Every connection starts with the rank-to-rank handshake of boot_internal.h: the caller proves
 * the key in its first flight and may send right behind it (a send never waits for the receiver);
 * the callee reads nothing past that proof unless it checks out, and answers with its own proof,
 * which the caller checks before reading anything else there (state CS_OPEN). An incoming
 * connection must claim a rank in range, addressed to us, not already connected; it is closed if
 * it has not proved the key within BOOT_HELLO_TIMEOUT_NS while more than BOOT_MAX_PENDING wait.
 *
 * Liveness: a receive that has waited BOOT_LIVENESS_NS for a peer it has no connection with opens
 * one; a refused connection (the peer's listener existed, so it is gone) or an EOF on an open one
 * ends every wait for that peer with CH_REMOTE. */
#define _GNU_SOURCE /* accept4 */
#include <errno.h>
#include <signal.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

#include "../misc/log.h"
#include "../misc/utils.h"
#include "boot_internal.h"

#define BOOT_MAX_PENDING 64                /* incoming connections not yet authenticated, beyond one per peer */
#define BOOT_ACCEPT_PAUSE_NS (100 * UT_NS_PER_MS) /* out of descriptors: stop accepting this long */

struct boot_msg {
  struct boot_msg* next;
  int tag;
  size_t size;
  char data[];
};

enum { CS_SRV_HELLO, CS_SRV_PROOF, CS_CLI_WAIT, CS_OPEN };

/* Owned by the thread calling into the boot_state (bootstrap calls on one state are serialized). */
struct boot_conn {
  int fd;
  int peer;  /* client side: the rank we called; server side: -1 until authenticated */
  int state; /* CS_* */
  int dead;  /* EOF or error seen; closed and freed by reap() outside of send loops */
  uint64_t t0;
  union sock_addr addr;
  struct boot_hello hello;           /* ours (client) or theirs (server) */
  struct boot_peer_proof proof;      /* the other side's proof, being read */
  size_t got;                        /* bytes of the handshake record being read */
  size_t hdr_got;
  struct boot_msg_hdr hdr;
  struct boot_msg* cur; /* message whose payload is arriving */
  size_t cur_got;
};

struct boot_peer {
  struct boot_conn* send;
  struct boot_msg *head, *tail;
  size_t qbytes; /* queued, not yet received */
  int qcount;
  int authed_in; /* authenticated connections it opened to us (at most one) */
  int lost;      /* a connection with it closed or failed: nothing more will come */
  char why[200];
  int pid;        /* from the rank table (boot_name_peers), for messages; 0: unknown */
  char host[64];
};

struct boot_state {
  int rank, nranks;
  uint64_t magic;
  struct boot_key key;
  struct sock listener;
  union sock_addr* addrs;
  struct boot_peer* peers;
  struct boot_conn** conns;
  int nconns, cap;
  struct pollfd* pfds;
  int pcap;
  uint64_t accept_paused_until;
  int warned_emfile;
  const volatile int* abort;
  uint64_t deadline;
  /* What the owner's current bootstrap calls are for ("ncclAllReduce #1"), for a lost peer's message:
   * set and cleared by the thread that owns b around them (boot_set_context), read by that thread. */
  char context[96];
  /* The join connections to our root(s) while the table is gathered (-1: none; owned by boot_init,
   * which clears them here before closing them): readable means a report that the job failed. The
   * owner's thread only. `failed`: that report's status, returned by every later wait. */
  int root_fd[2];
  ch_status failed;
};

static struct sock_wait boot_wait(struct boot_state* b) {
  struct sock_wait w = {b->abort, b->deadline};
  return w;
}

static const char* peer_addr(struct boot_state* b, int peer, char* buf, size_t len) {
  return sock_addr_str(&b->addrs[peer], buf, len);
}

static struct boot_conn* conn_add(struct boot_state* b, int fd, const union sock_addr* addr, int peer, int state) {
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
  c->state = state;
  c->t0 = ut_now_ns();
  c->addr = *addr;
  b->conns[b->nconns++] = c;
  return c;
}

static void conn_free(struct boot_state* b, int i) {
  struct boot_conn* c = b->conns[i];
  if (c->peer >= 0 && b->peers[c->peer].send == c) b->peers[c->peer].send = NULL;
  if (c->fd >= 0) {
    /* Closing with unread input (a handshake answer we never needed) would reset the connection,
     * and the other side could take that for a failure: read it away first. */
    char junk[256];
    for (int k = 0; k < 64 && recv(c->fd, junk, sizeof(junk), MSG_DONTWAIT) > 0; k++) {
    }
    close(c->fd);
  }
  free(c->cur);
  free(c);
  b->conns[i] = b->conns[--b->nconns];
}

static void reap(struct boot_state* b) {
  for (int i = b->nconns - 1; i >= 0; i--)
    if (b->conns[i]->dead) conn_free(b, i);
}

static void conn_kill(struct boot_state* b, struct boot_conn* c) {
  c->dead = 1;
  if (c->peer >= 0 && b->peers[c->peer].send == c) b->peers[c->peer].send = NULL;
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
  p->qbytes += m->size;
  p->qcount++;
}

static struct boot_msg* take(struct boot_peer* p, int tag) {
  struct boot_msg **pp = &p->head, *prev = NULL;
  for (struct boot_msg* m = p->head; m; prev = m, pp = &m->next, m = m->next) {
    if (m->tag != tag) continue;
    *pp = m->next;
    if (p->tail == m) p->tail = prev;
    p->qbytes -= m->size;
    p->qcount--;
    return m;
  }
  return NULL;
}

/* Handshake records are small and go out on fresh sockets: they fit the send buffer at once. */
static int send_small(int fd, const void* buf, size_t n) {
  ssize_t w;
  do w = send(fd, buf, n, MSG_NOSIGNAL);
  while (w < 0 && errno == EINTR);
  return w == (ssize_t)n ? 0 : -1;
}

static void reject(struct boot_state* b, struct boot_conn* c, const char* why) {
  char who[64];
  snprintf(who, sizeof(who), "Bootstrap rank %d", b->rank);
  sock_warn_reject(who, &c->addr, why);
  conn_kill(b, c);
}

/* A complete handshake record arrived on c: advance its state. */
static void handshake_step(struct boot_state* b, struct boot_conn* c) {
  char a[64], why[200];
  if (c->state == CS_SRV_HELLO) {
    struct boot_hello* h = &c->hello;
    if (h->magic != b->magic || h->kind != BOOT_KIND_PEER) return reject(b, c, "not a Chorus peer hello of this version");
    if (h->arg >= (uint32_t)b->nranks || (int)h->arg == b->rank || h->to_rank != (uint32_t)b->rank ||
        h->nranks != (uint32_t)b->nranks) {
      snprintf(why, sizeof(why), "it claims rank %u of %u calling rank %u, but we are rank %d of %d", h->arg, h->nranks,
               h->to_rank, b->rank, b->nranks);
      return reject(b, c, why);
    }
    c->state = CS_SRV_PROOF;
  } else if (c->state == CS_SRV_PROOF) {
    int from = (int)c->hello.arg;
    if (!boot_peer_mac_ok(&b->key, 0, &c->hello, &b->listener.addr, c->proof.mac)) {
      snprintf(why, sizeof(why), "it claims rank %d but does not know this job's secret", from);
      return reject(b, c, why);
    }
    struct boot_peer* p = &b->peers[from];
    if (p->authed_in) {
      snprintf(why, sizeof(why), "it claims rank %d, which is already connected", from);
      return reject(b, c, why);
    }
    /* If our answer cannot be sent, the caller has already sent and closed: what it sent before
     * its proof checked out is still read (then EOF), only this connection is not used to send. */
    struct boot_peer_proof sp;
    boot_peer_mac(&b->key, 1, &c->hello, &b->listener.addr, sp.mac);
    int answered = send_small(c->fd, &sp, sizeof(sp)) == 0;
    p->authed_in = 1;
    c->peer = from;
    c->state = CS_OPEN;
    if (!p->send && answered) p->send = c;
  } else if (c->state == CS_CLI_WAIT) {
    if (!boot_peer_mac_ok(&b->key, 1, &c->hello, &b->addrs[c->peer], c->proof.mac)) {
      WARN("Bootstrap rank %d: rank %d at %s does not know this job's secret: the ranks run with different secrets "
           "(CHORUS_SECRET / CHORUS_SECRET_FILE), or another program now listens there",
           b->rank, c->peer, sock_addr_str(&c->addr, a, sizeof(a)));
      peer_lost(b, c->peer, "failed the handshake (different secret, or not a rank of this job)");
      return conn_kill(b, c);
    }
    c->state = CS_OPEN;
  }
}

/* Another live connection with c's peer, past the handshake (it can still deliver messages). */
static int other_conn(struct boot_state* b, const struct boot_conn* c) {
  for (int i = 0; i < b->nconns; i++) {
    const struct boot_conn* o = b->conns[i];
    if (o != c && !o->dead && o->peer == c->peer && (o->state == CS_OPEN || o->state == CS_CLI_WAIT)) return 1;
  }
  return 0;
}

/* EOF or error on c (errno in e, 0 for EOF). */
static void conn_eof(struct boot_state* b, struct boot_conn* c, int e) {
  char a[64], why[200];
  if (c->state == CS_SRV_HELLO || c->state == CS_SRV_PROOF) {
    INFO(LOG_BOOTSTRAP, "Bootstrap rank %d: ignoring connection from %s (closed during the handshake)", b->rank,
         sock_addr_str(&c->addr, a, sizeof(a)));
  } else if (c->state == CS_CLI_WAIT) {
    snprintf(why, sizeof(why), "closed the connection before proving itself (%s: it exited, or rejected us: see its log)",
             e ? strerror(e) : "EOF");
    peer_lost(b, c->peer, why);
  } else if ((e == 0 || e == ECONNRESET) && c->hdr_got == 0 && other_conn(b, c)) {
    /* Two ranks that connected to each other have two connections. A peer that finished closes both;
     * what it sent on the other one (in order there) may still be on its way: only the last close
     * says the peer is gone. */
    INFO(LOG_BOOTSTRAP, "Bootstrap rank %d: rank %d closed one of its connections", b->rank, c->peer);
  } else if ((e == 0 || e == ECONNRESET) && c->hdr_got == 0) {
    /* A reset between messages: the peer closed with our handshake answer unread. */
    peer_lost(b, c->peer, "closed its bootstrap connection (exited, or finished with the bootstrap)");
  } else {
    snprintf(why, sizeof(why), "broke its bootstrap connection (%s)",
             e == 0 ? "closed in the middle of a message" : strerror(e));
    peer_lost(b, c->peer, why);
  }
  conn_kill(b, c);
}

/* Read everything available on c, queueing complete messages. Never frees c. */
static void conn_read(struct boot_state* b, struct boot_conn* c) {
  while (!c->dead) {
    void* dst;
    size_t want;
    if (c->state != CS_OPEN) {
      void* rec = c->state == CS_SRV_HELLO ? (void*)&c->hello : (void*)&c->proof;
      size_t n = c->state == CS_SRV_HELLO ? sizeof(c->hello) : sizeof(c->proof);
      dst = (char*)rec + c->got;
      want = n - c->got;
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
    if (n <= 0 && want) {
      conn_eof(b, c, n < 0 ? errno : 0);
      return;
    }
    if (c->state != CS_OPEN) {
      c->got += (size_t)n;
      size_t need = c->state == CS_SRV_HELLO ? sizeof(c->hello) : sizeof(c->proof);
      if (c->got == need) {
        c->got = 0;
        handshake_step(b, c);
      }
      continue;
    }
    if (c->hdr_got < sizeof(c->hdr)) {
      c->hdr_got += (size_t)n;
      if (c->hdr_got == sizeof(c->hdr)) {
        struct boot_peer* p = &b->peers[c->peer];
        char why[200];
        why[0] = '\0';
        if (c->hdr.size > BOOT_MAX_MSG)
          snprintf(why, sizeof(why), "sent a bootstrap message of %llu bytes (at most %llu)",
                   (unsigned long long)c->hdr.size, (unsigned long long)BOOT_MAX_MSG);
        else if (p->qbytes + c->hdr.size > BOOT_MAX_QUEUED_BYTES || p->qcount >= BOOT_MAX_QUEUED_MSGS)
          snprintf(why, sizeof(why), "sent more unexpected bootstrap messages than we queue (%d messages, %zu bytes)",
                   p->qcount, p->qbytes);
        else if (!(c->cur = malloc(sizeof(struct boot_msg) + c->hdr.size)))
          snprintf(why, sizeof(why), "sent a message we have no memory for (%llu bytes)",
                   (unsigned long long)c->hdr.size);
        if (why[0]) {
          char a[64];
          WARN("Bootstrap rank %d: rank %d at %s %s; dropping its connection", b->rank, c->peer,
               sock_addr_str(&c->addr, a, sizeof(a)), why);
          peer_lost(b, c->peer, why);
          conn_kill(b, c);
          return;
        }
        c->cur->tag = c->hdr.tag;
        c->cur->size = c->hdr.size;
        c->cur_got = 0;
      }
    } else {
      c->cur_got += (size_t)n;
    }
    if (c->cur && c->cur_got == c->cur->size) {
      enqueue(&b->peers[c->peer], c->cur);
      c->cur = NULL;
      c->hdr_got = 0;
    }
  }
}

static int pending_count(struct boot_state* b) {
  int n = 0;
  for (int i = 0; i < b->nconns; i++)
    n += !b->conns[i]->dead && (b->conns[i]->state == CS_SRV_HELLO || b->conns[i]->state == CS_SRV_PROOF);
  return n;
}

/* Drop the oldest incoming connection that has not authenticated. */
static void evict_pending(struct boot_state* b, const char* why) {
  struct boot_conn* old = NULL;
  for (int i = 0; i < b->nconns; i++) {
    struct boot_conn* c = b->conns[i];
    if (!c->dead && (c->state == CS_SRV_HELLO || c->state == CS_SRV_PROOF) && (!old || c->t0 < old->t0)) old = c;
  }
  if (!old) return;
  char a[64];
  INFO(LOG_BOOTSTRAP, "Bootstrap rank %d: dropping connection from %s (%s)", b->rank,
       sock_addr_str(&old->addr, a, sizeof(a)), why);
  conn_kill(b, old);
}

static void accept_new(struct boot_state* b) {
  char who[64];
  snprintf(who, sizeof(who), "Bootstrap rank %d", b->rank);
  for (int k = 0; k < 256; k++) {
    union sock_addr addr;
    socklen_t len = sizeof(addr);
    memset(&addr, 0, sizeof(addr));
    int fd = accept4(b->listener.fd, &addr.sa, &len, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0) {
      if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM) {
        if (!b->warned_emfile++)
          WARN("Bootstrap rank %d: cannot accept connections: %s; pausing", b->rank, strerror(errno));
        b->accept_paused_until = ut_now_ns() + BOOT_ACCEPT_PAUSE_NS;
        evict_pending(b, "out of descriptors");
      }
      return;
    }
    sock_set_nodelay(fd); /* accepted sockets do not inherit it: the join's replies are records */
    char why[160];
    if (boot_uid_check(&b->key, fd, &addr, why, sizeof(why)) != 0) {
      sock_warn_reject(who, &addr, why);
      close(fd);
      continue;
    }
    /* Every peer may be authenticating at once (an AlltoAll's setup on an oversubscribed host, where a
     * connector can be descheduled between its connect and its hello): room for all of them, and the
     * bound beyond that for strangers. */
    if (pending_count(b) >= BOOT_MAX_PENDING + b->nranks) evict_pending(b, "too many unauthenticated connections");
    struct boot_conn* c = conn_add(b, fd, &addr, -1, CS_SRV_HELLO);
    if (!c) {
      close(fd);
      return;
    }
    conn_read(b, c); /* the hello is usually there already */
  }
}

/* One poll round (≤100 ms): accept new connections, read what arrived. *writable tells whether
 * `want` may be written to. Connection failures are recorded on peers, not returned. */
/* A root's connection became readable while we gather the table: its report that the job failed (a
 * rank left), or its end. Said once; every wait then returns the status. */
static ch_status root_report(struct boot_state* b, int fd) {
  struct boot_reply rep;
  struct sock s = {.fd = fd};
  struct sock_wait w = {b->abort, ut_now_ns() + UT_NS_PER_S}; /* the root writes its report at once */
  char text[1024] = "";
  if (sock_recv_all(&s, &rep, sizeof(rep), &w) == CH_OK && rep.type == BOOT_REPLY_ERROR && rep.len < sizeof(text) &&
      sock_recv_all(&s, text, rep.len, &w) == CH_OK) {
    text[rep.len] = 0;
    for (char* c = text; *c; c++)
      if ((unsigned char)*c < 0x20 || (unsigned char)*c > 0x7e) *c = '?';
    WARN("%s", text); /* the same report on every rank */
    b->failed = rep.status == CH_INVALID_USAGE || rep.status == CH_TIMEOUT ? (ch_status)rep.status : CH_REMOTE;
  } else {
    WARN("Bootstrap rank %d: the bootstrap root closed its connection while the ranks gathered their table (the "
         "process that runs it, rank 0's or the one that called ncclGetUniqueId, exited?)", b->rank);
    b->failed = CH_REMOTE;
  }
  b->root_fd[0] = b->root_fd[1] = -1; /* read once */
  return b->failed;
}

void boot_watch_roots(struct boot_state* b, int fd0, int fd1) { b->root_fd[0] = fd0, b->root_fd[1] = fd1; }

static ch_status progress(struct boot_state* b, struct boot_conn* want, int* writable) {
  if (b->failed != CH_OK) return b->failed;
  struct sock_wait w = boot_wait(b);
  int np = b->nconns + 3; /* the listener, the connections, two roots */
  if (np > b->pcap) {
    struct pollfd* p = realloc(b->pfds, (size_t)np * 2 * sizeof(*p));
    if (!p) {
      WARN("Bootstrap rank %d: out of memory", b->rank);
      return CH_SYSTEM;
    }
    b->pfds = p;
    b->pcap = np * 2;
  }
  uint64_t now = ut_now_ns();
  int paused = b->accept_paused_until && now < b->accept_paused_until;
  b->pfds[0] = (struct pollfd){paused ? -1 : b->listener.fd, POLLIN, 0};
  for (int i = 0; i < b->nconns; i++) {
    struct boot_conn* c = b->conns[i];
    b->pfds[i + 1] = (struct pollfd){c->dead ? -1 : c->fd, (short)(POLLIN | (c == want ? POLLOUT : 0)), 0};
  }
  int nc = b->nconns;
  b->pfds[nc + 1] = (struct pollfd){b->root_fd[0], POLLIN, 0};
  b->pfds[nc + 2] = (struct pollfd){b->root_fd[1], POLLIN, 0};
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
  if (r > 0 && (b->pfds[0].revents & POLLIN)) accept_new(b);
  for (int k = 0; r > 0 && k < 2; k++)
    if (b->pfds[nc + 1 + k].fd >= 0 && b->pfds[nc + 1 + k].revents) return root_report(b, b->pfds[nc + 1 + k].fd);
  now = ut_now_ns();
  /* Past the handshake's time only while strangers crowd the listener: on an oversubscribed host a
   * rank can be descheduled for seconds between its connect and its hello (1,024 ranks on 2 CPUs),
   * and a dropped member fails its call. */
  int crowded = pending_count(b) > BOOT_MAX_PENDING;
  for (int i = 0; crowded && i < b->nconns; i++) {
    struct boot_conn* c = b->conns[i];
    if ((c->state == CS_SRV_HELLO || c->state == CS_SRV_PROOF) && !c->dead && now - c->t0 > BOOT_HELLO_TIMEOUT_NS) {
      char a[64];
      INFO(LOG_BOOTSTRAP, "Bootstrap rank %d: dropping connection from %s (no handshake within 5 s)", b->rank,
           sock_addr_str(&c->addr, a, sizeof(a)));
      conn_kill(b, c);
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
    WARN("Bootstrap rank %d: timed out %s rank %d at %s (tag %d)", b->rank, what, peer, peer_addr(b, peer, a, sizeof(a)),
         tag);
  return st;
}

/* Open a client connection to peer and send our hello and proof; it becomes the peer's send connection.
 * Refused (after a short grace) means the peer is gone: recorded as lost, CH_REMOTE. */
static ch_status conn_open(struct boot_state* b, int peer, int tag) {
  char a[64], why[200];
  struct sock s;
  struct sock_wait w = boot_wait(b);
  int err = 0;
  ch_status st = sock_connect_brief(&b->addrs[peer], &s, &w, BOOT_REFUSED_GRACE_MS, &err);
  if (st == CH_TIMEOUT || st == CH_ABORTED) return wait_failed(b, st, "connecting to", peer, tag);
  if (st != CH_OK && (err == EMFILE || err == ENFILE)) { /* our limit, not the peer's fault */
    struct rlimit rl = {0, 0};
    getrlimit(RLIMIT_NOFILE, &rl);
    WARN("Bootstrap rank %d: cannot open a connection to rank %d: %s (this process may hold %llu descriptors, "
         "`ulimit -n`; thread ranks of one process hold two for each pair of ranks that exchange connection "
         "setup, so an AlltoAll of N thread ranks needs about N*N): raise the limit or use fewer ranks per process",
         b->rank, peer, strerror(err), (unsigned long long)rl.rlim_cur);
    return CH_SYSTEM;
  }
  if (st != CH_OK) {
    snprintf(why, sizeof(why), "is gone: connecting to its bootstrap listener failed: %s", strerror(err));
    peer_lost(b, peer, why);
    return CH_REMOTE;
  }
  if (boot_uid_check(&b->key, s.fd, &s.addr, why, sizeof(why)) != 0) {
    WARN("Bootstrap rank %d: the listener of rank %d at %s is not ours: it is %s", b->rank, peer,
         peer_addr(b, peer, a, sizeof(a)), why);
    sock_close(&s);
    peer_lost(b, peer, "listens on an address now held by another user");
    return CH_REMOTE;
  }
  struct boot_conn* c = conn_add(b, s.fd, &s.addr, peer, CS_CLI_WAIT);
  if (!c) {
    sock_close(&s);
    WARN("Bootstrap rank %d: out of memory", b->rank);
    return CH_SYSTEM;
  }
  struct {
    struct boot_hello h;
    struct boot_peer_proof p;
  } first;
  int bad = boot_hello_init(&c->hello, BOOT_KIND_PEER, (uint32_t)b->rank, (uint32_t)peer, (uint32_t)b->nranks) != CH_OK;
  first.h = c->hello;
  boot_peer_mac(&b->key, 0, &c->hello, &b->addrs[peer], first.p.mac);
  if (bad || send_small(c->fd, &first, sizeof(first)) != 0) {
    conn_kill(b, c);
    snprintf(why, sizeof(why), "broke the connection at once (%s)", strerror(errno));
    peer_lost(b, peer, why);
    return CH_REMOTE;
  }
  if (!b->peers[peer].send) b->peers[peer].send = c;
  return CH_OK;
}

/* A peer process on this host (same host name) that no longer exists: it exited. Its pid is only
 * compared where the host names match; a pid of another PID namespace could name another process,
 * which only makes us say less (that it closed its connection), never more. */
static int peer_exited(const struct boot_state* b, const struct boot_peer* p) {
  const struct boot_peer* me = &b->peers[b->rank];
  return p->pid > 0 && me->host[0] && !strcmp(p->host, me->host) && kill(p->pid, 0) != 0 && errno == ESRCH;
}

/* Said once, in the user's terms: which rank, its pid and host, what it did and which call cannot
 * complete. The message tag is internal: INFO only. */
static ch_status report_lost(struct boot_state* b, int peer, int tag, const char* what) {
  char a[64], who[96] = "";
  const struct boot_peer* p = &b->peers[peer];
  if (p->pid) snprintf(who, sizeof(who), " (pid %d on %s)", p->pid, p->host);
  INFO(LOG_BOOTSTRAP, "Bootstrap rank %d: %s rank %d (tag %d) failed", b->rank, what, peer, tag);
  if (b->context[0] && peer_exited(b, p))
    WARN("rank %d%s has exited while rank %d was setting up %s with it: %s cannot complete", peer, who, b->rank,
         b->context, b->context);
  else if (b->context[0])
    WARN("rank %d%s at %s %s while rank %d was setting up %s with it: %s cannot complete", peer, who,
         peer_addr(b, peer, a, sizeof(a)), p->why, b->rank, b->context, b->context);
  else if (peer_exited(b, p))
    WARN("Bootstrap rank %d: rank %d%s has exited while rank %d was %s it", b->rank, peer, who, b->rank, what);
  else
    WARN("Bootstrap rank %d: %s rank %d%s at %s failed: it %s", b->rank, what, peer, who,
         peer_addr(b, peer, a, sizeof(a)), p->why);
  return CH_REMOTE;
}

void boot_set_context(struct boot_state* b, const char* what) {
  snprintf(b->context, sizeof(b->context), "%s", what ? what : "");
}

void boot_name_peer(struct boot_state* b, int r, int pid, const char* host) {
  b->peers[r].pid = pid;
  snprintf(b->peers[r].host, sizeof(b->peers[r].host), "%s", host); /* the caller checked it printable */
}

void boot_name_peers(struct boot_state* b, const struct boot_rank_info* table) {
  for (int r = 0; r < b->nranks; r++) boot_name_peer(b, r, table[r].pid, table[r].hostname);
}

/* A connection to send to peer on: ours (its proof may still be on the way), or an authenticated
 * one it opened; opened here if there is none. */
static ch_status wait_open(struct boot_state* b, int peer, int tag) {
  struct boot_peer* p = &b->peers[peer];
  if (p->lost) return report_lost(b, peer, tag, "sending to");
  if (p->send) return CH_OK;
  if (b->addrs[peer].sa.sa_family == AF_UNSPEC) { /* boot_allgather_learn never lets this happen */
    WARN("Bootstrap rank %d: sending to rank %d (tag %d), whose address this rank does not know yet", b->rank, peer,
         tag);
    return CH_INTERNAL;
  }
  ch_status st = conn_open(b, peer, tag);
  if (st == CH_REMOTE) return report_lost(b, peer, tag, "sending to");
  return st;
}

static ch_status conn_write(struct boot_state* b, struct boot_conn* c, const void* buf, size_t n, int tag) {
  const char* p = buf;
  while (n > 0) {
    if (c->dead) return report_lost(b, c->peer, tag, "sending to"); /* progress saw it break */
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
    conn_kill(b, c);
    peer_lost(b, c->peer, e == EPIPE || e == ECONNRESET ? "closed its bootstrap connection" : strerror(e));
    return report_lost(b, c->peer, tag, "sending to"); /* names its pid and host */
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
  CHECK(check_peer(b, peer, "send to"));
  if (size > BOOT_MAX_MSG) {
    WARN("Bootstrap rank %d: a %zu-byte message to rank %d exceeds the bootstrap's limit of %llu bytes", b->rank, size,
         peer, (unsigned long long)BOOT_MAX_MSG);
    return CH_INTERNAL;
  }
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
  CHECK(wait_open(b, peer, tag));
  struct boot_conn* c = b->peers[peer].send;
  if (size <= 4096) { /* one segment for the common small message */
    char buf[sizeof(hdr) + 4096];
    memcpy(buf, &hdr, sizeof(hdr));
    if (size) memcpy(buf + sizeof(hdr), data, size);
    return conn_write(b, c, buf, sizeof(hdr) + size, tag);
  }
  CHECK(conn_write(b, c, &hdr, sizeof(hdr), tag));
  return conn_write(b, c, data, size, tag);
}

static int has_conn(struct boot_state* b, int peer) {
  for (int i = 0; i < b->nconns; i++)
    if (!b->conns[i]->dead && b->conns[i]->peer == peer) return 1;
  return 0;
}

ch_status boot_recv(struct boot_state* b, int peer, int tag, void* data, size_t size) {
  CHECK(check_peer(b, peer, "receive from"));
  reap(b);
  struct boot_peer* p = &b->peers[peer];
  uint64_t t0 = ut_now_ns();
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
    if (p->lost) return report_lost(b, peer, tag, "waiting for a message from");
    struct sock_wait w = boot_wait(b);
    ch_status st = sock_wait_check(&w);
    if (st != CH_OK) return wait_failed(b, st, "waiting for a message from", peer, tag);
    /* Liveness: with no connection to a silent peer, an EOF could never tell us it died. */
    if (peer != b->rank && ut_now_ns() - t0 > BOOT_LIVENESS_NS && !has_conn(b, peer) &&
        b->addrs[peer].sa.sa_family != AF_UNSPEC) {
      st = conn_open(b, peer, tag);
      if (st == CH_REMOTE) return report_lost(b, peer, tag, "waiting for a message from");
      if (st != CH_OK) return st;
    }
    CHECK(progress(b, NULL, NULL));
    reap(b);
  }
}

/* Slots [lo, lo+count) modulo n of data, packed into (out) or unpacked from (in) buf. */
static void ag_copy(char* data, char* buf, int n, int lo, int count, size_t size, int out) {
  for (int k = 0; k < count; k++) {
    char* slot = data + (size_t)(((lo + k) % n + n) % n) * size;
    if (out) memcpy(buf + (size_t)k * size, slot, size);
    else memcpy(slot, buf + (size_t)k * size, size);
  }
}

/* count slots starting at lo to peer (or from it), in messages of at most ~1 MiB (BOOT_MAX_MSG and
 * the peer's queue bound hold at any job size). */
static ch_status ag_xfer(struct boot_state* b, int peer, int tag, char* data, int lo, int count, size_t size, int out,
                         char* buf, int per_msg) {
  for (int k = 0; k < count; k += per_msg) {
    int c = count - k < per_msg ? count - k : per_msg;
    if (out) {
      ag_copy(data, buf, b->nranks, lo + k, c, size, 1);
      CHECK(boot_send(b, peer, tag, buf, (size_t)c * size));
    } else {
      CHECK(boot_recv(b, peer, tag, buf, (size_t)c * size));
      ag_copy(data, buf, b->nranks, lo + k, c, size, 0);
    }
  }
  return CH_OK;
}

/* Bidirectional doubling. Before a step, rank r holds the slots [r-h, r+h]; it talks to the ranks
 * d = max(h, 1) away: it sends up (r+d) the c_lo slots just below that rank's window and down (r-d)
 * the c_hi slots just above that rank's window, and receives the same from them, so its window grows
 * to [r-h-c_lo, r+h+c_hi]. c_lo = c_hi = d until the last step, which fetches only what is still
 * missing. Every rank computes the same counts, so sizes match exactly. About log2(n) steps, each rank
 * receives every slot once (n-1 slots in all), and talks to ~2 log2(n) distinct ranks.
 * The first step (h = 0) needs only the address of rank r+1: the slot from r-1 is received before
 * anything is sent to it, and its connection to us carries our answer. `learn` (may be NULL) checks
 * the slots just received (and may learn addresses from them) before any of them is forwarded. */
ch_status boot_allgather_learn(struct boot_state* b, void* data, size_t size, boot_ag_learn_fn learn, void* arg) {
  int n = b->nranks, r = b->rank;
  if (n == 1) return CH_OK;
  if (size == 0 || size > BOOT_MAX_MSG) {
    WARN("Bootstrap rank %d: allgather slots of %zu bytes (1 to %llu allowed)", r, size,
         (unsigned long long)BOOT_MAX_MSG);
    return CH_INTERNAL;
  }
  size_t per = (1u << 20) / size;
  int per_msg = per < 1 ? 1 : per > (size_t)n ? n : (int)per;
  char* buf = malloc((size_t)per_msg * size);
  if (!buf) {
    WARN("Bootstrap rank %d: out of memory for an allgather of %d x %zu bytes", r, n, size);
    return CH_SYSTEM;
  }
  char* d = data;
  ch_status st = CH_OK;
  for (int h = 0; st == CH_OK && 2 * h + 1 < n;) {
    int dist = h > 0 ? h : 1, missing = n - (2 * h + 1);
    int c_lo = missing < dist ? missing : dist;
    int c_hi = missing - c_lo < dist ? missing - c_lo : dist;
    int up = (r + dist) % n, down = (r - dist + n) % n;
    /* To up: the slots below its window [up-h, up+h]; from down: those below ours. */
    st = ag_xfer(b, up, BOOT_TAG_ALLGATHER, d, up - h - c_lo, c_lo, size, 1, buf, per_msg);
    if (st == CH_OK) st = ag_xfer(b, down, BOOT_TAG_ALLGATHER, d, r - h - c_lo, c_lo, size, 0, buf, per_msg);
    if (st == CH_OK && learn) st = learn(arg, b, r - h - c_lo, c_lo, down);
    if (st == CH_OK && c_hi) st = ag_xfer(b, down, BOOT_TAG_ALLGATHER_UP, d, down + h + 1, c_hi, size, 1, buf, per_msg);
    if (st == CH_OK && c_hi) st = ag_xfer(b, up, BOOT_TAG_ALLGATHER_UP, d, r + h + 1, c_hi, size, 0, buf, per_msg);
    if (st == CH_OK && c_hi && learn) st = learn(arg, b, r + h + 1, c_hi, up);
    h += dist;
  }
  free(buf);
  return st;
}

ch_status boot_allgather(struct boot_state* b, void* data, size_t size) {
  return boot_allgather_learn(b, data, size, NULL, NULL);
}

ch_status boot_learn_addr(struct boot_state* b, int rank, const union sock_addr* addr) {
  union sock_addr* a = &b->addrs[rank];
  if (a->sa.sa_family == AF_UNSPEC) {
    *a = *addr;
    return CH_OK;
  }
  char x[64], y[64];
  if (strcmp(sock_addr_str(addr, x, sizeof(x)), sock_addr_str(a, y, sizeof(y))) == 0) return CH_OK;
  WARN("Bootstrap rank %d: rank %d's listen address is %s in the table gathered from the ranks, but %s from the root",
       b->rank, rank, x, y);
  return CH_INTERNAL;
}

/* Dissemination: in round k each rank sends an empty token to r+2^k and waits for one from r-2^k;
 * after ceil(log2 n) rounds every rank has heard, through some chain, from every other. The partners
 * are those of boot_allgather (plus at most one farther), so a barrier opens few new sockets. */
ch_status boot_barrier(struct boot_state* b) {
  int n = b->nranks, r = b->rank;
  for (int d = 1; d < n; d *= 2) {
    CHECK(boot_send(b, (r + d) % n, BOOT_TAG_BARRIER, NULL, 0));
    CHECK(boot_recv(b, (r - d + n) % n, BOOT_TAG_BARRIER, NULL, 0));
  }
  return CH_OK;
}

ch_status boot_peers_create(struct boot_state** out, int rank, int nranks, uint64_t magic, const struct boot_key* key,
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
  b->key = *key;
  b->listener = *listener;
  listener->fd = -1; /* ours now */
  b->abort = abort;
  b->deadline = deadline_ns;
  b->root_fd[0] = b->root_fd[1] = -1;
  *out = b;
  return CH_OK;
}

ch_status boot_new_listener(struct boot_state* parent, struct sock* listener) {
  union sock_addr a = parent->listener.addr;
  if (a.sa.sa_family == AF_INET) a.sin.sin_port = 0;
  else a.sin6.sin6_port = 0;
  return sock_listen(&a, listener);
}

const struct boot_key* boot_secret(struct boot_state* b) { return &b->key; }
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
  memset(&b->key, 0, sizeof(b->key));
  free(b);
}
