/* Network transport: connection setup and teardown, run by rank threads (the data moves in tcp_proxy.c).
 *
 * Each side of a connection has its own FIFO (struct fifo_ctrl + slots, as shm/local) in its own
 * heap. The receiver registers its FIFO with the process's proxy under a random token and offers
 * {listener address, token, challenge} through the (authenticated) bootstrap. The sender checks the
 * offered listener is on the IP its peer joined from, connects (NCCL_SOCKET_RETRY_* backoff), sends
 * one flight {token, ranks, nonce, HMAC proof of the job key} and hands the socket to its own proxy.
 * The receiver's proxy accepts, verifies and binds the socket to the FIFO; the receiver waits for
 * that before it reports the connection made. One socket per connection; each channel and each
 * send/recv peer has its own. */
#define _GNU_SOURCE
#include <errno.h>
#include <sched.h>
#include <stddef.h>
#include <stdlib.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include "../misc/log.h"
#include "../misc/param.h"
#include "../misc/sha256.h"
#include "../misc/utils.h"
#include "tcp.h"

#define TCP_CONNECT_TIMEOUT_NS (60ull * UT_NS_PER_S) /* connect + hello, on top of the retry policy */
#define TCP_BIND_TIMEOUT_NS (60ull * UT_NS_PER_S)    /* receiver: the sender's hello must arrive by then */

void tcp_hello_mac(const unsigned char* key, const struct tcp_hello* h, uint64_t challenge,
                   const union sock_addr* listener, unsigned char mac[TCP_MAC]) {
  static const char label[] = "chorus-net-v1";
  const void* parts[4] = {label, h, &challenge, listener};
  size_t lens[4] = {sizeof(label), offsetof(struct tcp_hello, mac), sizeof(challenge), sizeof(*listener)};
  hmac_sha256(key, 32, 4, parts, lens, mac);
}

/* Anonymous pages, zero until touched: only the slots the steps use (Simple's; the network never
 * carries LL or LL128) ever become resident, and net_trim can give them back. */
static ch_status fifo_alloc(struct conn* c, const struct tp_sizes* sz) {
  size_t bytes = tp_fifo_bytes(sz);
  void* mem = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (mem == MAP_FAILED) {
    WARN("cannot allocate %zu bytes for a network FIFO with rank %d: %s", bytes, c->peer, strerror(errno));
    return CH_SYSTEM;
  }
  tp_fifo_layout(c, mem, sz);
  c->map_base = mem;
  c->map_bytes = bytes;
  c->fd = -1;
  c->token = 0;
  return CH_OK;
}

static struct tcp_conn* record_new(struct conn* c, const struct tp_ctx* x, int is_send) {
  struct tcp_conn* n = calloc(1, sizeof(*n));
  if (!n) {
    WARN("out of memory for a network connection with rank %d", c->peer);
    return NULL;
  }
  n->is_send = is_send;
  n->rank = x->rank;
  n->peer = c->peer;
  n->ctrl = c->ctrl;
  n->buf = c->buff[PROTO_SIMPLE];
  n->slot_bytes = c->slot_bytes[PROTO_SIMPLE];
  memcpy(n->key, x->key, sizeof(n->key));
  n->uid_mode = x->uid_mode;
  n->async_err = x->async_err;
  n->lost_rank = x->lost_rank;
  n->abort = x->abort;
  n->sink = x->sink;
  n->peer_pid = x->peer_pid;
  snprintf(n->peer_host, sizeof(n->peer_host), "%s", x->peer_host ? x->peer_host : "?");
  n->fd = -1;
  atomic_store(&n->state, TCP_PENDING);
  return n;
}

static void fifo_free(struct conn* c) {
  if (c->map_base) munmap(c->map_base, c->map_bytes);
}

static void fail_free(struct conn* c, struct tcp_conn* n) {
  free(n);
  fifo_free(c);
  int peer = c->peer;
  memset(c, 0, sizeof(*c));
  c->fd = -1;
  c->peer = peer;
}

ch_status tp_tcp_recv_setup(struct conn* c, const struct tp_sizes* sz, struct tp_handle* h,
                            const struct tp_ctx* x) {
  CHECK(fifo_alloc(c, sz));
  struct tcp_conn* n = record_new(c, x, 0);
  if (!n) return fail_free(c, NULL), CH_SYSTEM;
  n->token = tp_fresh_token();
  int64_t dmax = param_int(PARAM_NET_DIRECT_MAX_BYTES);
  n->direct_max = dmax > 0 ? (uint64_t)dmax : 0;
  if (ut_random(&n->challenge, sizeof(n->challenge)) != CH_OK) return fail_free(c, n), CH_SYSTEM;
  union sock_addr listener;
  ch_status s = proxy_register(n, x->listen_hint, &listener);
  if (s != CH_OK) {
    WARN("rank %d: cannot listen for the network connection from rank %d", x->rank, c->peer);
    return fail_free(c, n), s;
  }
  c->tcp = n;
  c->transport = TP_TCP;
  c->connected = 1;
  memset(h, 0, sizeof(*h));
  h->kind = TP_TCP;
  h->bytes = tp_fifo_bytes(sz);
  h->token = n->token;
  h->nonce = n->challenge;
  h->addr = listener;
  return CH_OK;
}

static int same_ip(const union sock_addr* a, const union sock_addr* b) {
  if (a->sa.sa_family != b->sa.sa_family) return 0;
  if (a->sa.sa_family == AF_INET) return a->sin.sin_addr.s_addr == b->sin.sin_addr.s_addr;
  if (a->sa.sa_family == AF_INET6) return memcmp(&a->sin6.sin6_addr, &b->sin6.sin6_addr, 16) == 0;
  return 0;
}

ch_status tp_tcp_send_connect(struct conn* c, const struct tp_sizes* sz, const struct tp_handle* h,
                              const struct tp_ctx* x) {
  const union sock_addr* expect_ip = x->peer_addr;
  char a[64], b[64];
  /* The address comes from the peer: accept only its own bootstrap IP, with a real port. */
  if (!same_ip(&h->addr, expect_ip) || sock_addr_port(&h->addr) == 0) {
    WARN("rank %d: rank %d offered a network listener at %s, not on the address it joined from (%s): refused",
         x->rank, c->peer, sock_addr_str(&h->addr, a, sizeof(a)), sock_addr_str(expect_ip, b, sizeof(b)));
    return CH_REMOTE;
  }
  struct sock s = {.fd = -1};
  struct sock_wait w = {x->abort, ut_now_ns() + TCP_CONNECT_TIMEOUT_NS};
  ch_status st = sock_connect(&h->addr, &s, &w);
  if (st != CH_OK) {
    if (st != CH_ABORTED)
      WARN("rank %d: cannot connect to rank %d's network listener %s (%s)", x->rank, c->peer,
           sock_addr_str(&h->addr, a, sizeof(a)), ch_status_str(st));
    return st == CH_ABORTED ? st : CH_REMOTE;
  }
  /* Without a secret, data may go only to our own uid: on this host, the listener's owner (its
   * process may have died and another user taken the port since the offer), as the bootstrap checks. */
  uid_t owner;
  if (x->uid_mode && sock_addr_is_local(&h->addr) && (sock_peer_uid(s.fd, &owner) != 0 || owner != geteuid())) {
    WARN("rank %d: the network listener %s offered by rank %d belongs to another user (or its owner cannot be "
         "found in /proc/net/tcp) and this job has no CHORUS_SECRET: not sending to it", x->rank,
         sock_addr_str(&h->addr, a, sizeof(a)), c->peer);
    sock_close(&s);
    return CH_REMOTE;
  }
  sock_tune_link(s.fd);
  struct tcp_hello hello;
  memset(&hello, 0, sizeof(hello));
  hello.magic = TCP_MAGIC;
  hello.token = h->token;
  hello.from_rank = x->rank;
  hello.to_rank = c->peer;
  st = ut_random(hello.nonce, sizeof(hello.nonce));
  tcp_hello_mac(x->key, &hello, h->nonce, &h->addr, hello.mac);
  if (st == CH_OK) st = sock_send_all(&s, &hello, sizeof(hello), &w);
  if (st != CH_OK) {
    if (st != CH_ABORTED)
      WARN("rank %d: sending the handshake to rank %d at %s failed (%s)", x->rank, c->peer,
           sock_addr_str(&h->addr, a, sizeof(a)), ch_status_str(st));
    sock_close(&s);
    return st == CH_ABORTED ? st : CH_REMOTE;
  }
  if ((st = fifo_alloc(c, sz)) != CH_OK) return sock_close(&s), st;
  struct tcp_conn* n = record_new(c, x, 1);
  if (!n) return sock_close(&s), fail_free(c, NULL), CH_SYSTEM;
  n->fd = s.fd;
  n->remote = h->addr;
  int64_t dmax = param_int(PARAM_NET_DIRECT_MAX_BYTES);
  n->direct_max = dmax > 0 ? (uint64_t)dmax : 0;
  atomic_store(&n->state, TCP_BOUND);
  /* tp_wake of every post finds the record through the FIFO (token is unused by net FIFOs). */
  c->ctrl->token = (uint64_t)(uintptr_t)n;
  atomic_store(&c->ctrl->recv_sleeping, TP_SLEEP_DIRECT);
  if ((st = proxy_register(n, x->listen_hint, NULL)) != CH_OK) return sock_close(&s), fail_free(c, n), st;
  c->tcp = n;
  c->transport = TP_TCP;
  c->connected = 1;
  return CH_OK;
}

ch_status tp_tcp_wait_bound(struct conn* c, const struct tp_ctx* x) {
  uint64_t end = ut_now_ns() + TCP_BIND_TIMEOUT_NS;
  long ns = 20000;
  for (;;) {
    int st = atomic_load_explicit(&c->tcp->state, memory_order_acquire);
    /* Closed in order: it was bound, and the peer may have sent everything and left before we looked
     * (its steps, or the poison of a failed call, are in our FIFO). */
    if (st == TCP_BOUND || st == TCP_CLOSED) return CH_OK;
    if (st != TCP_PENDING) return CH_REMOTE; /* logged by the proxy */
    if (__atomic_load_n(x->abort, __ATOMIC_RELAXED)) return CH_ABORTED;
    if (ut_now_ns() > end) {
      WARN("rank %d: rank %d said it connected to our network listener, but no authenticated connection "
           "arrived within %llu s", x->rank, c->peer, TCP_BIND_TIMEOUT_NS / UT_NS_PER_S);
      return CH_REMOTE;
    }
    struct timespec ts = {0, ns};
    nanosleep(&ts, NULL);
    if (ns < (long)UT_NS_PER_MS) ns *= 2;
  }
}

static ch_status net_recv_done(struct conn* c, int attached, const struct tp_handle* back, const struct tp_ctx* x) {
  (void)back;
  return attached ? tp_tcp_wait_bound(c, x) : CH_OK;
}

static void net_wake(struct conn* c, int we_send) {
  (void)c, (void)we_send;
  tp_proxy_kick(); /* the proxy relays to the other host */
}

int tp_tcp_state(const struct conn* c) {
  if (c->transport != TP_TCP || !c->tcp) return 0;
  int st = atomic_load_explicit(&c->tcp->state, memory_order_acquire);
  return st == TCP_FAILED ? 2 : st == TCP_CLOSED ? 1 : 0;
}

static void net_closing(struct conn* c) {
  if (c->tcp) proxy_closing(c->tcp);
}

static void net_free(struct conn* c) {
  if (c->tcp) proxy_unregister(c->tcp); /* the proxy no longer touches the record or the FIFO */
  free(c->tcp);
  fifo_free(c);
  memset(c, 0, sizeof(*c));
  c->fd = -1;
}

/* Under busy, so that neither the proxy nor a rank's direct send or read moves this stream meanwhile,
 * and only with every slot empty: a send FIFO's posted steps are all in the kernel (head == tail); a
 * receive FIFO's arrived steps are all consumed (head == tail) and none is being filled (off == 0,
 * nothing carried). Bytes that arrive later wait in the socket for the next fill, which touches fresh
 * zero pages. The slots follow the control page (tp_fifo_layout). */
static int net_trim(struct conn* c) {
  struct tcp_conn* n = c->tcp;
  if (!n || !c->map_base) return 0;
  /* busy is held only for a few non-blocking calls (the proxy's pass over this stream) */
  while (atomic_exchange_explicit(&n->busy, 1, memory_order_acquire)) sched_yield();
  int ok = n->off == 0 && n->carry_len == 0 && !n->poison_state &&
           atomic_load_explicit(&c->ctrl->head, memory_order_acquire) ==
               atomic_load_explicit(&c->ctrl->tail, memory_order_acquire);
  if (ok) {
    char* slots = c->buff[0];
    ok = madvise(slots, c->map_bytes - (size_t)(slots - (char*)c->map_base), MADV_DONTNEED) == 0;
  }
  atomic_store_explicit(&n->busy, 0, memory_order_release);
  return ok;
}

const struct tp_ops tp_tcp_ops = {
    .name = "tcp",
    .can_connect = NULL, /* the last resort: any peer */
    .flags = TP_F_NETWORK,
    .recv_setup = tp_tcp_recv_setup,
    .send_connect = tp_tcp_send_connect,
    .recv_done = net_recv_done,
    .health = tp_tcp_state,
    .poll = tp_tcp_poll,
    .idle = tp_tcp_idle,
    .wake = net_wake,
    .free = net_free,
    .closing = net_closing,
    .trim = net_trim,
};
