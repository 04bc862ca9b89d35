/* Fabric transport: connection setup and teardown, run by rank threads (the data moves in
 * fabric_proxy.c). A connection over the network chosen for this process (net/net.h) when that is not
 * the socket transport: Chorus's libfabric network (NCCL_NET=OFI) or an external NCCL net plugin.
 *
 * The receiver allocates its FIFO, asks the network to listen and offers the opaque handle through
 * the authenticated bootstrap; the sender copies the handle (bounded: the network itself validates
 * its content on connect) and hands its record to the progress thread, which connects; the
 * receiver's progress thread accepts. Each side registers its whole FIFO block once, when its comm
 * exists. Devices (NICs, rails): each new connection of the process takes the next one, so a
 * communicator's channels spread over every rail. */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "../misc/log.h"
#include "../misc/param.h"
#include "../misc/utils.h"
#include "fabric.h"

#define FAB_SETUP_TIMEOUT_NS (60ull * UT_NS_PER_S) /* connect/accept must complete within this */

/* Only a network named by NCCL_NET is started at init (to fail there, saying why); otherwise the
 * choice waits for the first peer that no host-local transport takes, so that a job on one host never
 * pays for loading libfabric or probing plugins. */
ch_status tp_net_config(void) {
  const struct ch_net* net;
  return param_is_set(PARAM_NET) ? ch_net_get(&net) : CH_OK;
}

static int fab_can_connect(const struct tp_peer* p, const char** why) {
  (void)p;
  const struct ch_net* net = NULL;
  if (ch_net_get(&net) != CH_OK || !net) return 0;
  static __thread char text[96];
  snprintf(text, sizeof(text), "network %s", net->name);
  *why = text;
  return 1;
}

static int next_dev(const struct ch_net* net) {
  static _Atomic unsigned rr;
  return net->ndev > 1 ? (int)(atomic_fetch_add(&rr, 1) % (unsigned)net->ndev) : 0;
}

/* The block: ctrl and the LL/LL128 buffers as every FIFO has them (unused over a network: Simple
 * only), then the Simple slots with room for a trailer each, then the control message area. */
static ch_status fab_alloc(struct conn* c, const struct tp_sizes* sz, struct fab_conn** out, const struct tp_ctx* x,
                           int is_send) {
  const struct ch_net* net = NULL;
  CHECK(ch_net_get(&net));
  if (!net) {
    WARN("rank %d: a fabric connection with rank %d, but no network was chosen (internal)", x->rank, c->peer);
    return CH_INTERNAL;
  }
  struct tp_sizes front = *sz;
  front.buff[PROTO_SIMPLE] = 0;
  size_t head = tp_fifo_bytes(&front), cap = sz->buff[PROTO_SIMPLE] / CH_STEPS;
  size_t stride = UT_ALIGN_UP(cap + FAB_TRAILER, 64);
  size_t pmin = UT_ALIGN_UP(sizeof(struct xfer_poison) + FAB_TRAILER, 64);
  if (stride < pmin) stride = pmin; /* every slot can take a poison message */
  size_t bytes = head + CH_STEPS * stride + 4096;
  struct fab_conn* n = calloc(1, sizeof(*n));
  void* mem = NULL;
  if (!n || posix_memalign(&mem, 4096, bytes) != 0) {
    WARN("rank %d: cannot allocate %zu bytes for a fabric FIFO with rank %d", x->rank, bytes, c->peer);
    free(n);
    return CH_SYSTEM;
  }
  memset(mem, 0, bytes);
  tp_fifo_layout(c, mem, &front);
  c->buff[PROTO_SIMPLE] = (char*)mem + head;
  c->slot_bytes[PROTO_SIMPLE] = stride; /* the stride; a step's capacity stays sz's (prims, plan.c) */
  c->map_base = NULL;
  c->fd = -1;
  n->is_send = is_send;
  n->rank = x->rank;
  n->peer = c->peer;
  n->dev = next_dev(net);
  n->ctrl = c->ctrl;
  n->buf = c->buff[PROTO_SIMPLE];
  n->cap = cap;
  n->stride = stride;
  n->ctl = (char*)mem + head + CH_STEPS * stride;
  n->mem = mem;
  n->mem_bytes = bytes;
  n->net = net;
  n->async_err = x->async_err;
  n->lost_rank = x->lost_rank;
  n->abort = x->abort;
  n->sink = x->sink;
  n->peer_pid = x->peer_pid;
  snprintf(n->peer_host, sizeof(n->peer_host), "%s", x->peer_host ? x->peer_host : "?");
  n->connect_deadline = ut_now_ns() + FAB_SETUP_TIMEOUT_NS;
  if (x->peer_query) n->probe_addr = *x->peer_query;
  else n->probe_addr.sa.sa_family = AF_UNSPEC;
  n->probe_fd = -1;
  atomic_store(&n->state, FAB_PENDING);
  /* Posts find the record through the FIFO (token is unused by fabric FIFOs), and always call in. */
  c->ctrl->token = (uint64_t)(uintptr_t)n;
  if (is_send) atomic_store(&c->ctrl->recv_sleeping, TP_SLEEP_FAB_TAIL);
  else atomic_store(&c->ctrl->send_sleeping, TP_SLEEP_FAB_HEAD);
  *out = n;
  return CH_OK;
}

static void fab_drop(struct conn* c, struct fab_conn* n) {
  if (n) free(n->mem), free(n);
  int peer = c->peer;
  memset(c, 0, sizeof(*c));
  c->fd = -1;
  c->peer = peer;
}

static ch_status fab_recv_setup(struct conn* c, const struct tp_sizes* sz, struct tp_handle* h, const struct tp_ctx* x) {
  struct fab_conn* n;
  CHECK(fab_alloc(c, sz, &n, x, 0));
  unsigned char handle[TP_BLOB_BYTES];
  memset(handle, 0, sizeof(handle));
  ncclResult_t r = n->net->net->listen(n->net->ctx, n->dev, handle, &n->lcomm);
  if (r != ncclSuccess || !n->lcomm) {
    WARN("rank %d: network %s cannot listen on device %d for rank %d (error %d)", x->rank, n->net->name, n->dev,
         c->peer, (int)r);
    fab_drop(c, n);
    return CH_SYSTEM;
  }
  ch_status s = fab_register(n);
  if (s != CH_OK) {
    n->net->net->closeListen(n->lcomm);
    fab_drop(c, n);
    return s;
  }
  c->fab = n;
  c->transport = TP_FAB;
  c->connected = 1;
  memset(h, 0, sizeof(*h));
  h->kind = TP_FAB;
  h->bytes = tp_fifo_bytes(sz);
  h->blob_len = TP_BLOB_BYTES;
  memcpy(h->blob, handle, sizeof(handle));
  return CH_OK;
}

static ch_status fab_send_connect(struct conn* c, const struct tp_sizes* sz, const struct tp_handle* h,
                                  const struct tp_ctx* x) {
  if (h->blob_len != TP_BLOB_BYTES) { /* from the peer: the network checks the content itself */
    WARN("rank %d: rank %d offered a fabric handle of %u bytes (expected %d): refused", x->rank, c->peer,
         (unsigned)h->blob_len, TP_BLOB_BYTES);
    return CH_REMOTE;
  }
  struct fab_conn* n;
  CHECK(fab_alloc(c, sz, &n, x, 1));
  memcpy(n->handle, h->blob, sizeof(n->handle));
  /* The way back: without it the connection still works, only the receiver's records stay home. */
  if (n->net->net->listen(n->net->ctx, n->dev, n->back_handle, &n->blcomm) != ncclSuccess || !n->blcomm) {
    INFO(LOG_NET, "rank %d: no way back from rank %d on %s (listen failed)", x->rank, c->peer, n->net->name);
    n->blcomm = NULL, n->back_state = 2;
  }
  n->back_offered = n->blcomm != NULL; /* before registration: the answer reads it, the proxy never writes it */
  ch_status s = fab_register(n); /* the proxy connects (never blocking this thread on the peer) */
  if (s != CH_OK) {
    if (n->blcomm) n->net->net->closeListen(n->blcomm);
    return fab_drop(c, n), s;
  }
  c->fab = n;
  c->transport = TP_FAB;
  c->connected = 1;
  return CH_OK;
}

/* Receiver, once the sender said it attached: wait (bounded, abortable) for the accept. */
static void fab_back_handle(struct conn* c, struct tp_handle* out) {
  memset(out, 0, sizeof(*out));
  if (!c->fab || !c->fab->back_offered) return;
  out->kind = TP_FAB;
  out->blob_len = TP_BLOB_BYTES;
  memcpy(out->blob, c->fab->back_handle, TP_BLOB_BYTES);
}

static ch_status fab_recv_done(struct conn* c, int attached, const struct tp_handle* back, const struct tp_ctx* x) {
  if (!attached) return CH_OK;
  /* From the peer: only its size is ours to check; the network checks the content on connect. */
  if (back && back->kind == TP_FAB && back->blob_len == TP_BLOB_BYTES) {
    memcpy(c->fab->back_handle, back->blob, TP_BLOB_BYTES);
    atomic_store_explicit(&c->fab->back_wanted, 1, memory_order_release);
    fab_kick(); /* the progress thread connects the way back now */
  }
  long ns = 20000;
  for (;;) {
    int st = atomic_load_explicit(&c->fab->state, memory_order_acquire);
    if (st == FAB_BOUND || st == FAB_CLOSED) return CH_OK;
    if (st == FAB_FAILED) return CH_REMOTE; /* logged by the proxy */
    if (__atomic_load_n(x->abort, __ATOMIC_RELAXED)) return CH_ABORTED;
    struct timespec ts = {0, ns};
    nanosleep(&ts, NULL);
    if (ns < (long)UT_NS_PER_MS) ns *= 2;
  }
}

static int fab_health(const struct conn* c) {
  if (!c->fab) return 0;
  int st = atomic_load_explicit(&c->fab->state, memory_order_acquire);
  return st == FAB_FAILED ? 2 : st == FAB_CLOSED ? 1 : 0;
}

static int fab_conn_poll(struct conn* c) { return c->fab ? fab_poll(c->fab) : 0; }

/* The rank stops polling c (it goes to sleep on the FIFO): the progress thread, which may be in a long
 * idle sleep, must test c's receives from now on. */
static void fab_idle(struct conn* c) {
  (void)c;
  fab_kick();
}

static void fab_wake(struct conn* c, int we_send) {
  (void)c, (void)we_send;
  fab_kick(); /* the proxy sends our poison record on */
}

static void fab_conn_closing(struct conn* c) {
  if (c->fab) fab_closing(c->fab);
}

static void fab_free(struct conn* c) {
  struct fab_conn* n = c->fab;
  if (n && fab_unregister(n)) { /* the proxy no longer touches the record or the FIFO */
    free(n->mem);
    free(n);
  }
  memset(c, 0, sizeof(*c));
  c->fd = -1;
}

const struct tp_ops tp_fab_ops = {
    .name = "fabric",
    .can_connect = fab_can_connect,
    .flags = TP_F_NETWORK,
    .recv_setup = fab_recv_setup,
    .send_connect = fab_send_connect,
    .recv_done = fab_recv_done,
    .back_handle = fab_back_handle,
    .health = fab_health,
    .poll = fab_conn_poll,
    .idle = fab_idle,
    .wake = fab_wake,
    .free = fab_free,
    .closing = fab_conn_closing,
};
