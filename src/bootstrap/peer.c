/* Messages between ranks after the rendezvous.
 *
 * Each pair of ranks talks over TCP connections opened on first use. A rank sends to a peer on one
 * connection it has with that peer (its own, or one the peer opened), and reads from every
 * connection, so two ranks that connect to each other at the same time still work. There is no
 * background thread: whoever waits (send or recv) accepts new connections and reads everything that
 * arrives, queueing messages per peer. Reading while sending also means two ranks sending large
 * messages to each other cannot deadlock. A rank keeps at most a few dozen connections open
 * (CHORUS_BOOT_MAX_CONNS): past that, the least recently used idle one is closed gracefully and
 * opened again when next needed (peer_close.c), so an AlltoAll's connection setup, which talks to
 * every rank, leaves O(1) sockets per rank instead of O(N).
 *
 * Every connection starts with the rank-to-rank handshake of boot_internal.h: the caller proves
 * the key in its first flight and may send right behind it (a send never waits for the receiver);
 * the callee reads nothing past that proof unless it checks out, and answers with its own proof,
 * which the caller checks before reading anything else there (state CS_OPEN). An incoming
 * connection must claim a rank in range, addressed to us, with a connection count (boot_hello.gen)
 * above that rank's last; it is closed if it has not proved the key within BOOT_PEER_HELLO_NS while
 * more than BOOT_MAX_PENDING wait.
 *
 * Liveness: a receive that has waited BOOT_LIVENESS_NS for a peer it has no connection with opens
 * one; a refused connection (the peer's listener existed, so it is gone) or an EOF on an open one
 * (not one being closed) ends every wait for that peer with CH_REMOTE. */
#define _GNU_SOURCE /* accept4 */
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <signal.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

#include "../misc/log.h"
#include "../misc/utils.h"
#include "peer_internal.h"

#define BOOT_MAX_PENDING 64                /* incoming connections not yet authenticated, beyond one per peer */
#define BOOT_ACCEPT_PAUSE_NS (100 * UT_NS_PER_MS) /* out of descriptors: stop accepting this long */
#define BOOT_SETTLE_NS (500 * UT_NS_PER_MS)       /* the longest a send waits for closes (settle) */
#define BOOT_FLUSH_NS (5 * UT_NS_PER_S)           /* the longest boot_close waits for its sends to arrive */
#define BOOT_EMFILE_RETRY_NS (2 * UT_NS_PER_S)    /* out of descriptors: a connect is tried again this long */
/* An incoming connection not authenticated by then is closed. Longer than the root's 5 s: a rank's
 * thread on a crowded machine may wait seconds for a CPU between its connect and its first write
 * (up to 3.5 s measured with 512 thread ranks on 2 CPUs), and a rank, unlike a joiner at the root,
 * does not connect again when cut off. Floods are bounded by BOOT_MAX_PENDING meanwhile. */
#define BOOT_PEER_HELLO_NS (30 * UT_NS_PER_S)

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
  c->used = ++b->tick;
  b->conns[b->nconns++] = c;
  return c;
}

static void conn_close_fd(struct boot_conn* c) {
  if (c->fd < 0) return;
  /* Closing with unread input (a handshake answer we never needed) would reset the connection,
   * and the other side could take that for a failure: read it away first. */
  char junk[256];
  for (int k = 0; k < 64 && recv(c->fd, junk, sizeof(junk), MSG_DONTWAIT) > 0; k++) {}
  close(c->fd);
  c->fd = -1;
}

static void conn_free(struct boot_state* b, int i) {
  struct boot_conn* c = b->conns[i];
  if (c->peer >= 0 && b->peers[c->peer].send == c) b->peers[c->peer].send = NULL;
  conn_close_fd(c);
  free(c->cur);
  free(c);
  b->conns[i] = b->conns[--b->nconns];
}

static void reap(struct boot_state* b) {
  for (int i = b->nconns - 1; i >= 0; i--)
    if (b->conns[i]->dead) conn_free(b, i);
}

/* Its descriptor goes at once (a thread of a busy machine may not run again for a while); the
 * structure stays until reap(), as callers up the stack may still hold it. */
void boot_conn_kill(struct boot_state* b, struct boot_conn* c) {
  c->dead = 1;
  if (c->peer >= 0 && b->peers[c->peer].send == c) b->peers[c->peer].send = NULL;
  conn_close_fd(c);
}

void boot_peer_lost(struct boot_state* b, int p, const char* why) {
  if (!b->peers[p].lost) snprintf(b->peers[p].why, sizeof(b->peers[p].why), "%s", why);
  b->peers[p].lost = 1;
}

void boot_conn_drop(struct boot_state* b, struct boot_conn* c, const char* why) {
  char a[64];
  WARN("Bootstrap rank %d: rank %d at %s %s; dropping its connection", b->rank, c->peer,
       sock_addr_str(&c->addr, a, sizeof(a)), why);
  boot_peer_lost(b, c->peer, why);
  boot_conn_kill(b, c);
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
  boot_conn_kill(b, c);
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
    /* A rank opens its connections to us in order, each one after the last was authenticated (it
     * closes only open ones): a count not above the last one's is a replayed first flight. */
    if (c->hello.gen < p->in_gen) {
      snprintf(why, sizeof(why),
               "it claims rank %d, connection %u, but that rank's connection %llu was accepted already", from,
               c->hello.gen, (unsigned long long)p->in_gen - 1);
      return reject(b, c, why);
    }
    /* If our answer cannot be sent, the caller has already sent and closed: what it sent before
     * its proof checked out is still read (then EOF), only this connection is not used to send. */
    struct boot_peer_proof sp;
    boot_peer_mac(&b->key, 1, &c->hello, &b->listener.addr, sp.mac);
    c->can_send = send_small(c->fd, &sp, sizeof(sp)) == 0;
    p->in_gen = (uint64_t)c->hello.gen + 1;
    c->peer = from;
    c->state = CS_OPEN;
    c->used = ++b->tick;
    b->opened++;
    if (!p->send && c->can_send) p->send = c;
    boot_conns_trim(b, c); /* one more open: over the cap, close another */
  } else if (c->state == CS_CLI_WAIT) {
    if (!boot_peer_mac_ok(&b->key, 1, &c->hello, &b->addrs[c->peer], c->proof.mac)) {
      WARN("Bootstrap rank %d: rank %d at %s does not know this job's secret: the ranks run with different secrets "
           "(CHORUS_SECRET / CHORUS_SECRET_FILE), or another program now listens there",
           b->rank, c->peer, sock_addr_str(&c->addr, a, sizeof(a)));
      boot_peer_lost(b, c->peer, "failed the handshake (different secret, or not a rank of this job)");
      return boot_conn_kill(b, c);
    }
    c->state = CS_OPEN;
    b->settled++;
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

void boot_conn_eof(struct boot_state* b, struct boot_conn* c, int e) {
  char a[64], why[200];
  if (boot_closing_eof(b, c, e)) return;
  if (c->state == CS_SRV_HELLO || c->state == CS_SRV_PROOF) {
    INFO(LOG_BOOTSTRAP, "Bootstrap rank %d: ignoring connection from %s (closed during the handshake)", b->rank,
         sock_addr_str(&c->addr, a, sizeof(a)));
  } else if (c->state == CS_CLI_WAIT) {
    snprintf(why, sizeof(why), "closed the connection before proving itself (%s: it exited, or rejected us: see its log)",
             e ? strerror(e) : "EOF");
    boot_peer_lost(b, c->peer, why);
  } else if ((e == 0 || e == ECONNRESET || e == EPIPE) && c->hdr_got == 0 && other_conn(b, c)) {
    /* Two ranks that connected to each other have two connections. A peer that finished closes both;
     * what it sent on the other one (in order there) may still be on its way: only the last close
     * says the peer is gone. */
    INFO(LOG_BOOTSTRAP, "Bootstrap rank %d: rank %d closed one of its connections", b->rank, c->peer);
  } else if ((e == 0 || e == ECONNRESET || e == EPIPE) && c->hdr_got == 0) {
    /* A reset between messages: the peer closed with our handshake answer unread. */
    boot_peer_lost(b, c->peer, "closed its bootstrap connection (exited, or finished with the bootstrap)");
  } else {
    snprintf(why, sizeof(why), "broke its bootstrap connection (%s)",
             e == 0 ? "closed in the middle of a message" : strerror(e));
    boot_peer_lost(b, c->peer, why);
  }
  boot_conn_kill(b, c);
}

/* Read everything available on c, queueing complete messages. Never frees c. */
static void conn_read(struct boot_state* b, struct boot_conn* c) {
  while (!c->dead && !c->fin) {
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
      boot_conn_eof(b, c, n < 0 ? errno : 0);
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
      if (c->hdr_got == sizeof(c->hdr) && c->hdr.type != BOOT_REC_MSG) {
        c->hdr_got = 0;
        boot_ctl_record(b, c);
        continue;
      }
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
        else if (!boot_seq_ok(p, c->hdr.seq))
          snprintf(why, sizeof(why), "sent message number %llu, but %llu is due and %d may be held",
                   (unsigned long long)c->hdr.seq, (unsigned long long)p->rseq, BOOT_MAX_QUEUED_MSGS);
        else if (!(c->cur = malloc(sizeof(struct boot_msg) + c->hdr.size)))
          snprintf(why, sizeof(why), "sent a message we have no memory for (%llu bytes)",
                   (unsigned long long)c->hdr.size);
        if (why[0]) return boot_conn_drop(b, c, why);
        c->cur->tag = c->hdr.tag;
        c->cur->seq = c->hdr.seq;
        c->cur->size = c->hdr.size;
        c->cur_got = 0;
      }
    } else {
      c->cur_got += (size_t)n;
    }
    if (c->cur && c->cur_got == c->cur->size) {
      struct boot_msg* m = c->cur;
      c->cur = NULL;
      c->hdr_got = 0;
      c->used = ++b->tick;
      if (boot_enqueue(&b->peers[c->peer], m) != 0) {
        char why[120];
        snprintf(why, sizeof(why), "sent message number %llu twice", (unsigned long long)m->seq);
        free(m);
        return boot_conn_drop(b, c, why);
      }
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
  boot_conn_kill(b, old);
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

static ch_status progress(struct boot_state* b, struct boot_conn* want, int* writable, int wait_ms) {
  if (b->failed != CH_OK) return b->failed;
  reap(b); /* closed connections give their descriptors back now (callers hold no dead one) */
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
    short ev = (short)((c->fin ? 0 : POLLIN) | (c == want || c->ctl_on ? POLLOUT : 0));
    b->pfds[i + 1] = (struct pollfd){c->dead ? -1 : c->fd, ev, 0};
  }
  int nc = b->nconns;
  b->pfds[nc + 1] = (struct pollfd){b->root_fd[0], POLLIN, 0};
  b->pfds[nc + 2] = (struct pollfd){b->root_fd[1], POLLIN, 0};
  int slice = sock_wait_slice_ms(&w);
  int r = poll(b->pfds, (nfds_t)np, wait_ms >= 0 && wait_ms < slice ? wait_ms : slice);
  if (r < 0 && errno != EINTR) {
    WARN("Bootstrap rank %d: poll failed: %s", b->rank, strerror(errno));
    return CH_SYSTEM;
  }
  if (writable) *writable = 0;
  for (int i = 0; r > 0 && i < nc; i++) {
    struct boot_conn* c = b->conns[i];
    short ev = b->pfds[i + 1].revents;
    if (c == want && writable && (ev & (POLLOUT | POLLERR | POLLHUP))) *writable = 1;
    if (c->ctl_on && (ev & (POLLOUT | POLLERR | POLLHUP))) boot_ctl_flush(b, c);
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
    if ((c->state == CS_SRV_HELLO || c->state == CS_SRV_PROOF) && !c->dead && now - c->t0 > BOOT_PEER_HELLO_NS) {
      char a[64];
      INFO(LOG_BOOTSTRAP, "Bootstrap rank %d: dropping connection from %s (no handshake within 30 s)", b->rank,
           sock_addr_str(&c->addr, a, sizeof(a)));
      boot_conn_kill(b, c);
    }
  }
  /* Over the cap because every connection was busy when the last one opened: try again. */
  boot_conns_trim(b, NULL);
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
  /* The first flight is made before connecting: the callee gives it BOOT_PEER_HELLO_NS from its
   * accept, and a thread of a busy machine may wait long for the CPU between two steps. */
  struct {
    struct boot_hello h;
    struct boot_peer_proof p;
  } first;
  if (boot_hello_init(&first.h, BOOT_KIND_PEER, (uint32_t)b->rank, (uint32_t)peer, (uint32_t)b->nranks) != CH_OK) {
    WARN("Bootstrap rank %d: no random numbers for a connection to rank %d: %s", b->rank, peer, strerror(errno));
    return CH_SYSTEM;
  }
  first.h.gen = b->peers[peer].out_gen++;
  boot_peer_mac(&b->key, 0, &first.h, &b->addrs[peer], first.p.mac);
  ch_status st = sock_connect_brief(&b->addrs[peer], &s, &w, BOOT_REFUSED_GRACE_MS, &err);
  /* Out of descriptors: our limit, not the peer's fault. Ranks of this process closing connections
   * give some back soon: read and answer meanwhile, and try again for a while before giving up. */
  for (uint64_t end = ut_now_ns() + BOOT_EMFILE_RETRY_NS; st != CH_OK && (err == EMFILE || err == ENFILE) &&
                                                          ut_now_ns() < end;) {
    CHECK(progress(b, NULL, NULL, -1));
    w = boot_wait(b);
    st = sock_connect_brief(&b->addrs[peer], &s, &w, BOOT_REFUSED_GRACE_MS, &err);
  }
  if (st == CH_TIMEOUT || st == CH_ABORTED) return wait_failed(b, st, "connecting to", peer, tag);
  if (st != CH_OK && (err == EMFILE || err == ENFILE)) {
    struct rlimit rl = {0, 0};
    getrlimit(RLIMIT_NOFILE, &rl);
    WARN("Bootstrap rank %d: cannot open a connection to rank %d: %s (this process may hold %llu descriptors, "
         "`ulimit -n`; each of its ranks keeps up to %d bootstrap connections open, CHORUS_BOOT_MAX_CONNS, and thread "
         "ranks of one process hold both ends of theirs): raise the limit, lower CHORUS_BOOT_MAX_CONNS or use fewer "
         "ranks per process",
         b->rank, peer, strerror(err), (unsigned long long)rl.rlim_cur, boot_conns_cap(b));
    return CH_SYSTEM;
  }
  if (st != CH_OK && err == EADDRNOTAVAIL) { /* this host's ports toward it are all taken: ours too */
    WARN("Bootstrap rank %d: cannot open a connection to rank %d at %s: %s (no local port left toward that address: "
         "too many connections to it closed in the last minute, TIME_WAIT)",
         b->rank, peer, peer_addr(b, peer, a, sizeof(a)), strerror(err));
    return CH_SYSTEM;
  }
  if (st != CH_OK) {
    snprintf(why, sizeof(why), "is gone: connecting to its bootstrap listener failed: %s", strerror(err));
    boot_peer_lost(b, peer, why);
    return CH_REMOTE;
  }
  if (boot_uid_check(&b->key, s.fd, &s.addr, why, sizeof(why)) != 0) {
    WARN("Bootstrap rank %d: the listener of rank %d at %s is not ours: it is %s", b->rank, peer,
         peer_addr(b, peer, a, sizeof(a)), why);
    sock_close(&s);
    boot_peer_lost(b, peer, "listens on an address now held by another user");
    return CH_REMOTE;
  }
  struct boot_conn* c = conn_add(b, s.fd, &s.addr, peer, CS_CLI_WAIT);
  if (!c) {
    sock_close(&s);
    WARN("Bootstrap rank %d: out of memory", b->rank);
    return CH_SYSTEM;
  }
  c->hello = first.h;
  c->can_send = 1;
  b->opened++;
  if (send_small(c->fd, &first, sizeof(first)) != 0) {
    boot_conn_kill(b, c);
    snprintf(why, sizeof(why), "broke the connection at once (%s)", strerror(errno));
    boot_peer_lost(b, peer, why);
    return CH_REMOTE;
  }
  if (!b->peers[peer].send) b->peers[peer].send = c;
  boot_conns_trim(b, c); /* one more open: over the cap, close another */
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

/* Before a new connection: read what has arrived, without waiting. A rank that sends to many ranks in
 * a row (small sends return at once) reads nothing otherwise: the callees of its new connections
 * answer, and those it closed to make room keep their descriptors, until it reads their answers (as
 * do those its peers close until it answers). If one more would still go over the cap (every open
 * one waits for its callee's proof) or too many are closing, wait for answers (reading, and
 * answering others) as long as some arrive in each poll slice, and at most BOOT_SETTLE_NS: a send
 * must not wait on a rank that may be waiting on it (another rank driven by this very thread, or
 * one busy outside the bootstrap); past that it goes over the cap. */
static ch_status settle(struct boot_state* b, int peer, int tag) {
  CHECK(progress(b, NULL, NULL, 0));
  uint64_t end = ut_now_ns() + BOOT_SETTLE_NS;
  while (boot_conns_full(b) && ut_now_ns() < end) {
    struct sock_wait w = boot_wait(b);
    ch_status st = sock_wait_check(&w);
    if (st != CH_OK) return wait_failed(b, st, "sending to", peer, tag);
    uint64_t settled = b->settled;
    CHECK(progress(b, NULL, NULL, -1));
    if (b->settled == settled) break;
  }
  reap(b);
  return CH_OK;
}

/* A connection to send to peer on: ours (its proof may still be on the way), or an authenticated
 * one it opened, not being closed; opened here if there is none. */
static ch_status wait_open(struct boot_state* b, int peer, int tag) {
  struct boot_peer* p = &b->peers[peer];
  if (p->lost) return report_lost(b, peer, tag, "sending to");
  if (p->send) return CH_OK;
  CHECK(settle(b, peer, tag));
  if (p->lost) return report_lost(b, peer, tag, "sending to");
  for (int i = 0; !p->send && i < b->nconns; i++) {
    struct boot_conn* o = b->conns[i];
    if (!o->dead && o->peer == peer && o->can_send && !o->bye_out && !o->bye_in) p->send = o;
  }
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
      CHECK(progress(b, c, NULL, -1));
      continue;
    }
    int e = r < 0 ? errno : EPIPE;
    boot_conn_kill(b, c);
    boot_peer_lost(b, c->peer, e == EPIPE || e == ECONNRESET ? "closed its bootstrap connection" : strerror(e));
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
  struct boot_peer* p = &b->peers[peer];
  if (peer == b->rank) {
    struct boot_msg* m = malloc(sizeof(*m) + size);
    if (!m) {
      WARN("Bootstrap rank %d: out of memory for a %zu-byte message", b->rank, size);
      return CH_SYSTEM;
    }
    m->tag = tag;
    m->seq = p->sseq++;
    m->size = size;
    if (size) memcpy(m->data, data, size);
    (void)boot_enqueue(p, m); /* numbered in order: never a duplicate */
    return CH_OK;
  }
  CHECK(wait_open(b, peer, tag));
  struct boot_conn* c = p->send;
  struct boot_msg_hdr hdr = {tag, BOOT_REC_MSG, size, p->sseq++};
  ch_status st;
  b->writing = c;     /* not closed under us, even if it falls idle while we wait */
  if (size <= 4096) { /* one segment for the common small message */
    char buf[sizeof(hdr) + 4096];
    memcpy(buf, &hdr, sizeof(hdr));
    if (size) memcpy(buf + sizeof(hdr), data, size);
    st = conn_write(b, c, buf, sizeof(hdr) + size, tag);
  } else {
    st = conn_write(b, c, &hdr, sizeof(hdr), tag);
    if (st == CH_OK) st = conn_write(b, c, data, size, tag);
  }
  b->writing = NULL;
  c->used = ++b->tick;
  if (st == CH_OK) boot_conn_wrote(b, c);
  return st;
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
    struct boot_msg* m = boot_take(p, tag);
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
    int late = ut_now_ns() - t0 > BOOT_LIVENESS_NS;
    CHECK(progress(b, NULL, NULL, -1));
    reap(b);
    /* Liveness: with no connection to a silent peer, an EOF could never tell us it died. Only after
     * a round of reading: its last message may wait in our listener's queue (a rank that finished
     * closes its listener, and the probe is refused, once what it sent has arrived). A refused
     * probe marks it lost; the loop delivers what came before saying so. */
    if (late && peer != b->rank && !has_conn(b, peer) && b->addrs[peer].sa.sa_family != AF_UNSPEC) {
      st = conn_open(b, peer, tag);
      if (st != CH_OK && st != CH_REMOTE) return st;
      /* A peer at its cap may close this one again at once, having answered it (so it lives):
       * probe again a while later, not at every turn. */
      t0 = ut_now_ns();
    }
  }
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
  boot_conns_init(b);
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

/* Before closing: wait (at most BOOT_FLUSH_NS in all) until every peer's host has acknowledged what
 * we sent. Our last message may be on a connection its receiver has not accepted yet; once we close,
 * its answer (the proof, or a BYE from a rank at its cap) resets the connection, which throws away
 * whatever of ours was not acknowledged, and our listener refuses the receiver's liveness probe, so
 * it would call us lost. Even between processes of one host a busy machine drops packets (its soft
 * interrupts fall behind) and resends them after a timeout, so the wait is short or none, but not
 * always. */
static void flush_sends(struct boot_state* b) {
  uint64_t end = ut_now_ns() + BOOT_FLUSH_NS;
  for (;;) {
    int queued = 0;
    for (int i = 0; i < b->nconns && !queued; i++) queued = !b->conns[i]->dead && sock_unacked(b->conns[i]->fd) > 0; /* a reset one: 0 */
    if (!queued || ut_now_ns() >= end) return;
    usleep(1000);
  }
}

void boot_close(struct boot_state* b) {
  if (!b) return;
  boot_conns_fini(b);
  flush_sends(b);
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
