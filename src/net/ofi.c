/* Chorus's built-in libfabric network: NCCL's ncclNet_v12_t over tagged messages on one RDM endpoint
 * per device, following aws-ofi-nccl's SENDRECV protocol, as NCCL's net plugins do.
 *
 * Protocol. listen() takes a 32-bit id from the device's counter and posts a receive for the
 * connection tag (ctrl_bit | id); its handle carries the endpoint name, the id and a random nonce.
 * connect() inserts the name into the AV and sends {magic, id, nonce, who} on that tag; it returns the
 * sendComm once that send completed. accept() returns the recvComm once a message with the right
 * magic, id and nonce arrived. Data then goes as fi_tsend/fi_trecv on tag = id | NCCL's tag << 33
 * (where the tag format leaves at least 8 bits below ctrl_bit; else id alone): order on a connection
 * is the provider's send-after-send order (asked for in hints), and a grouped receive (up to
 * OFI_MAX_RECVS buffers, tagged path only) posts one receive per buffer, so that each message lands
 * in the buffer of its sender's tag. The provider buffers messages that arrive before their receive
 * is posted.
 *
 * RMA path (CHORUS_OFI_RMA; rendezvous, as NCCL's IB plugin and aws-ofi-nccl's RDMA protocol). The
 * receiver decides per connection: listen() sets OFI_FLAG_RMA in its handle when its device can carry
 * it (FI_RMA, 8-byte remote CQ data, no FI_RX_CQ_DATA); connect() refuses such a handle when its own
 * device cannot, else echoes the flag with its endpoint name and a CTS id in the connection message.
 * Then irecv posts nothing for the data: it sends the sender a clear-to-send {seq, cq_id, size, addr or
 * offset, key} (fi_tsend on tag cts_bit | cts_id), and completes when an RMA write's remote CQ data
 * {cq_id:16, seq:16, size:32} arrives (the CQ reader dispatches it by cq_id through dev->rma_tab, and by
 * seq to the waiting request). isend returns a request at once (NULL only when all OFI_NREQS are in
 * flight) that holds the send until the CTS of its sequence number has arrived; isend and test() on the
 * comm then check that CTS (sequence, size >= the send: else the request fails with a WARN, and so does
 * every later send of the comm) and fi_writedata the data. The sender keeps OFI_CTS_POSTED CTS receives
 * posted, consumed in order; further CTSs wait in the provider as unexpected messages. (NCCL's IB plugin
 * returns NULL until the CTS instead; holding the send keeps NCCL's step in flight and lets a caller
 * that tests its first send before any completes, as tools/net_harness.c does, work.) Sizes travel in
 * 32 bits, so maxP2pBytes is capped at 2^32-1 on such devices. Receive buffers must be registered (regMr).
 * A closed recvComm's late writes find no waiting receive (its id is freed, its registration gone).
 *
 * Not done yet, hence CHORUS_OFI_RMA=0 by default: closing does not revoke the CTSs a receiver has
 * handed out. A sender that writes after the receiver deregistered its buffer (the fabric transport's
 * goodbye races with the receiver's close) makes the target reject the write, and tcp then drops the
 * connection between the two endpoints, which every comm between them shares (all of a process's comms
 * with ranks as threads): seen as rare "Broken pipe" failures in fabric_threads.all_colls_4 with
 * CHORUS_OFI_RMA=1. The fix is a revoke handshake before deregMr returns (the sender acknowledges that
 * it will not write again), which must not block the one fabric progress thread that serves both ends.
 *
 * GPU memory is left out: Debian's libfabric has no FI_HMEM for CUDA, so ptrSupport is host only and
 * the transport stages device buffers through host memory. libfabric itself is in ofi_fabric.c, the
 * RMA path's clear-to-sends, writes and CQ-data dispatch in ofi_rma.c, the wire decoders in ofi_wire.c. */
#define _GNU_SOURCE
#include <limits.h>
#include <netinet/in.h>
#include <sched.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../misc/log.h"
#include "net.h"
#include "ofi.h"

#ifdef CHORUS_HAVE_LIBFABRIC

#include "../misc/param.h"
#include "../misc/utils.h"

#define OFI_COMM_MAGIC 0x4f46494fu
#define OFI_MH_MAGIC 0x4f46494du
#define OFI_CLOSE_WAIT_NS (2 * UT_NS_PER_S) /* how long close waits for cancelled or unfinished operations */

/* Connects in progress (found again by their handle on the next call), and comms whose operations
 * never finished at close (their memory stays: the provider may still write op contexts in it). */
static pthread_mutex_t ofi_lists_mu = PTHREAD_MUTEX_INITIALIZER;
static struct ofi_comm* ofi_pending;
static struct ofi_comm* ofi_graveyard;

/* iflush on host memory has nothing to do: one request that is always done, never freed. */
static struct ofi_req ofi_flush_req;
static int ofi_ctx_dummy;

/* ------------------------------------------------------------------------------------------------ */
/* Comms and requests                                                                                */

static struct ofi_comm* comm_new(struct ofi_dev* d, int kind) {
  struct ofi_comm* c = calloc(1, sizeof(*c));
  if (!c) {
    WARN("NET/OFI: out of memory for a comm (%zu bytes)", sizeof(*c));
    return NULL;
  }
  c->magic = OFI_COMM_MAGIC;
  c->kind = kind;
  c->dev = d;
  c->ctrl_req.comm = c;
  for (int i = 0; i < OFI_NREQS; i++) c->reqs[i].comm = c, c->cts_req[i].comm = c;
  return c;
}

static struct ofi_comm* comm_check(void* p, int kind, const char* fn) {
  struct ofi_comm* c = p;
  if (!c || c->magic != OFI_COMM_MAGIC || (kind && c->kind != kind)) {
    WARN("NET/OFI: %s called with %p, which is not a live comm of the right kind", fn, p);
    return NULL;
  }
  return c;
}

int ofi_req_load_state(struct ofi_req* r) { return __atomic_load_n(&r->state, __ATOMIC_ACQUIRE); }

void ofi_req_reset(struct ofi_req* r, const char* op, size_t size) {
  r->op = op;
  r->posted = size;
  r->len = 0;
  r->err = 0;
  r->olen = 0;
  r->errtext[0] = '\0';
  /* Before posting: the completion may be read by another thread before the post call returns. */
  __atomic_store_n(&r->state, OFI_REQ_POSTED, __ATOMIC_RELEASE);
}

struct ofi_req* ofi_req_get(struct ofi_comm* c) {
  for (int k = 0; k < OFI_NREQS; k++) {
    int i = (c->req_next + k) % OFI_NREQS;
    if (c->reqs[i].in_use) continue;
    c->reqs[i].in_use = 1;
    c->req_next = (i + 1) % OFI_NREQS;
    return &c->reqs[i];
  }
  return NULL; /* all in flight: the caller retries (NULL request) */
}

void ofi_req_put(struct ofi_req* r) {
  __atomic_store_n(&r->state, 0, __ATOMIC_RELAXED);
  r->in_use = 0;
}

/* One WARN for a failed operation, with all we know about it. */
void ofi_req_warn(struct ofi_req* r) {
  struct ofi_comm* c = r->comm;
  if (r->err == FI_ETRUNC || r->olen)
    WARN("NET/OFI: %s of %zu bytes from %s on %s (provider %s) was truncated: a larger message arrived (%zu bytes "
         "over, 0 = not said); the peers disagree on message sizes", r->op, r->posted, c->peer_str, c->dev->name,
         ofi_prov_name(), r->olen);
  else
    WARN("NET/OFI: %s of %zu bytes %s %s on %s (provider %s) failed: %s (%s)", r->op, r->posted,
         c->kind == OFI_SEND ? "to" : "from", c->peer_str, c->dev->name, ofi_prov_name(), ofi_fn.strerror(r->err),
         r->errtext[0] ? r->errtext : "no provider detail");
}

/* Cancels posted receives, then waits (bounded, reading the CQ) until no operation of c is left in the
 * provider's hands. Returns 1 when all are finished. */
static int comm_quiesce(struct ofi_comm* c) {
  struct ofi_dev* d = c->dev;
  int recv_side = c->kind != OFI_SEND;
  if (!d->ep) return 1; /* never opened: nothing was posted */
  ofi_rma_detach(c);
  if (recv_side && ofi_req_load_state(&c->ctrl_req) == OFI_REQ_POSTED) fi_cancel(&d->ep->fid, &c->ctrl_req.ctx);
  for (int i = 0; recv_side && i < OFI_NREQS; i++)
    if (c->reqs[i].in_use && ofi_req_load_state(&c->reqs[i]) == OFI_REQ_POSTED) fi_cancel(&d->ep->fid, &c->reqs[i].ctx);
  for (int i = 0; !recv_side && c->rma && i < OFI_NREQS; i++) { /* CTS receives, arrived or not */
    if (ofi_req_load_state(&c->cts_req[i]) == OFI_REQ_POSTED) fi_cancel(&d->ep->fid, &c->cts_req[i].ctx);
    if (c->reqs[i].rma_deferred) { /* a send still waiting for its CTS: never the provider's */
      c->reqs[i].rma_deferred = 0;
      __atomic_store_n(&c->reqs[i].state, 0, __ATOMIC_RELAXED);
    }
  }
  uint64_t deadline = ut_now_ns() + OFI_CLOSE_WAIT_NS;
  for (;;) {
    int busy = ofi_req_load_state(&c->ctrl_req) == OFI_REQ_POSTED;
    for (int i = 0; !busy && i < OFI_NREQS; i++)
      busy = ofi_req_load_state(&c->reqs[i]) == OFI_REQ_POSTED || ofi_req_load_state(&c->cts_req[i]) == OFI_REQ_POSTED;
    if (!busy) return 1;
    if (__atomic_load_n(&d->cq_dead, __ATOMIC_ACQUIRE) || ut_now_ns() > deadline) return 0;
    ofi_progress(d);
    sched_yield();
  }
}

static void comm_free(struct ofi_comm* c) {
  if (!comm_quiesce(c)) {
    INFO(LOG_NET, "NET/OFI: a comm with %s closed with operations still posted; its memory is kept", c->peer_str);
    pthread_mutex_lock(&ofi_lists_mu);
    c->next = ofi_graveyard;
    ofi_graveyard = c;
    pthread_mutex_unlock(&ofi_lists_mu);
    return;
  }
  ofi_mr_close(&c->ctrl_mr);
  ofi_mr_close(&c->cts_mr);
  c->magic = 0;
  free(c);
}

/* ------------------------------------------------------------------------------------------------ */
/* init, devices, properties                                                                         */

static ncclResult_t ofi_init(void** ctx, uint64_t commId, ncclNetCommConfig_v12_t* config,
                             ncclDebugLogger_t logFunction, ncclProfilerCallback_t profFunction) {
  (void)commId, (void)config, (void)logFunction, (void)profFunction; /* built in: Chorus's own log */
  const char* why = NULL;
  if (ch_ofi_available(&why)) {
    WARN("NCCL_NET=OFI: %s", why);
    return ncclSystemError;
  }
  if (ctx) *ctx = &ofi_ctx_dummy;
  return ncclSuccess;
}

static ncclResult_t ofi_devices(int* ndev) {
  *ndev = ofi_ndevs();
  return ncclSuccess;
}

static ncclResult_t ofi_get_properties(int dev, ncclNetProperties_v12_t* props) {
  struct ofi_dev* d = ofi_dev_get(dev);
  if (!d || !props) {
    WARN("NET/OFI: getProperties of device %d: there are %d", dev, ofi_ndevs());
    return ncclInvalidArgument;
  }
  memset(props, 0, sizeof(*props));
  props->name = d->name;
  props->pciPath = d->pci_path;
  props->guid = (uint64_t)dev;
  props->ptrSupport = NCCL_PTR_HOST;
  props->regIsGlobal = 0;
  props->forceFlush = 0;
  props->speed = d->speed;
  props->port = 0;
  props->latency = 0;
  props->maxComms = 65536;
  props->maxRecvs = !d->rma && d->tag_mask ? OFI_MAX_RECVS : 1;
  props->netDeviceType = NCCL_NET_DEVICE_HOST;
  props->netDeviceVersion = NCCL_NET_DEVICE_INVALID_VERSION;
  props->vProps.ndevs = 1;
  props->vProps.devs[0] = dev;
  uint64_t max = d->info->ep_attr->max_msg_size;
  props->maxP2pBytes = (size_t)(max && max < NCCL_MAX_NET_SIZE_BYTES ? max : NCCL_MAX_NET_SIZE_BYTES);
  if (d->rma && props->maxP2pBytes > OFI_RMA_MAX) props->maxP2pBytes = (size_t)OFI_RMA_MAX; /* 32-bit CQ data */
  props->maxCollBytes = props->maxP2pBytes;
  props->maxMultiRequestSize = 1;
  props->railId = NCCL_NET_ID_UNDEF;
  props->planeId = NCCL_NET_ID_UNDEF;
  return ncclSuccess;
}

/* ------------------------------------------------------------------------------------------------ */
/* Connection setup                                                                                  */

static struct ofi_dev* dev_arg(int dev, const char* fn) {
  struct ofi_dev* d = ofi_dev_get(dev);
  if (!d) WARN("NET/OFI: %s on device %d: there are %d", fn, dev, ofi_ndevs());
  return d;
}

/* Posts the listener's receive for the connection message; -FI_EAGAIN leaves it for the next accept. */
static ncclResult_t listen_post(struct ofi_comm* l) {
  struct ofi_dev* d = l->dev;
  ofi_req_reset(&l->ctrl_req, "connection message receive", sizeof(l->ctrl));
  ssize_t rc = fi_trecv(d->ep, &l->ctrl, sizeof(l->ctrl), l->ctrl_mr.desc, FI_ADDR_UNSPEC, d->ctrl_bit | l->id, 0,
                        &l->ctrl_req.ctx);
  if (rc == 0) {
    l->stage = OFI_POSTED;
    return ncclSuccess;
  }
  __atomic_store_n(&l->ctrl_req.state, 0, __ATOMIC_RELAXED);
  if (rc == -FI_EAGAIN) return ncclSuccess;
  WARN("NET/OFI: posting the connection receive on %s (provider %s) failed: %s", d->name, ofi_prov_name(),
       ofi_fn.strerror((int)-rc));
  return ncclSystemError;
}

static ncclResult_t ofi_listen(void* ctx, int dev, void* handle, void** listenComm) {
  (void)ctx;
  ncclResult_t res = ncclSuccess;
  struct ofi_dev* d = dev_arg(dev, "listen");
  *listenComm = NULL;
  if (!d || !handle) return ncclInvalidArgument;
  if ((res = ofi_dev_open(d)) != ncclSuccess) return res;
  struct ofi_comm* l = comm_new(d, OFI_LISTEN);
  if (!l) return ncclSystemError;
  snprintf(l->peer_str, sizeof(l->peer_str), "(not connected yet)");
  pthread_mutex_lock(&d->mu);
  l->id = d->next_id++;
  if (d->next_id == 0) d->next_id = 1; /* 0 stays unused, so a zeroed handle never matches */
  pthread_mutex_unlock(&d->mu);
  struct ofi_handle* h = &l->handle;
  h->magic = OFI_HANDLE_MAGIC;
  h->version = OFI_PROTO_VERSION;
  h->name_len = (uint16_t)d->ep_name_len;
  h->addr_format = d->info->addr_format;
  h->id = l->id;
  h->flags = d->rma ? OFI_FLAG_RMA : 0; /* the receiver chooses the path */
  memcpy(h->name, d->ep_name, d->ep_name_len);
  if (ut_random(&h->nonce, sizeof(h->nonce)) != CH_OK) {
    res = ncclSystemError;
    goto fail;
  }
  if ((res = ofi_mr_open(d, &l->ctrl, sizeof(l->ctrl), &l->ctrl_mr)) != ncclSuccess) goto fail;
  if ((res = listen_post(l)) != ncclSuccess) goto fail;
  if (!ofi_handle_encode(h, handle, NCCL_NET_HANDLE_MAXSIZE)) {
    WARN("NET/OFI: listen on %s: the endpoint name is %zu bytes, outside 1..%d (provider %s)", d->name,
         d->ep_name_len, OFI_NAME_MAX, ofi_prov_name());
    res = ncclInternalError;
    goto fail;
  }
  *listenComm = l;
  return ncclSuccess;
fail:
  comm_free(l);
  return res;
}

/* The shortest endpoint name the device's address format allows (fi_av_insert reads that many bytes). */
static size_t name_min(const struct ofi_dev* d) {
  if (d->info->addr_format == FI_SOCKADDR_IN) return sizeof(struct sockaddr_in);
  if (d->info->addr_format == FI_SOCKADDR_IN6) return sizeof(struct sockaddr_in6);
  return 1;
}

/* Every field of a handle from the wire, before anything in it is used (ofi_handle_decode). */
static ncclResult_t handle_check(const struct ofi_dev* d, const void* handle, struct ofi_handle* h) {
  const char* bad = NULL;
  if (!ofi_handle_decode(handle, NCCL_NET_HANDLE_MAXSIZE, OFI_PROTO_VERSION, (uint32_t)d->info->addr_format,
                         name_min(d), h, &bad))
    return ncclSuccess;
  WARN("NET/OFI: connect on %s was given a bad handle (magic 0x%x, version %u, name length %u, address format %u, "
       "id %u): %s", d->name, h->magic, h->version, h->name_len, h->addr_format, h->id, bad);
  return ncclInvalidArgument;
}

void ofi_lists_at_child(void) {
  pthread_mutex_init(&ofi_lists_mu, NULL);
  ofi_pending = ofi_graveyard = NULL; /* the parent's: left alone */
}

static struct ofi_comm* pending_take(struct ofi_dev* d, const struct ofi_handle* h) {
  pthread_mutex_lock(&ofi_lists_mu);
  struct ofi_comm** pp = &ofi_pending;
  while (*pp && ((*pp)->dev != d || memcmp(&(*pp)->handle, h, sizeof(*h)))) pp = &(*pp)->next;
  struct ofi_comm* c = *pp;
  if (c) *pp = c->next, c->next = NULL;
  pthread_mutex_unlock(&ofi_lists_mu);
  return c;
}

static void pending_put(struct ofi_comm* c) {
  pthread_mutex_lock(&ofi_lists_mu);
  c->next = ofi_pending;
  ofi_pending = c;
  pthread_mutex_unlock(&ofi_lists_mu);
}

static ncclResult_t send_comm_new(struct ofi_dev* d, const struct ofi_handle* h, struct ofi_comm** out) {
  ncclResult_t res;
  if ((h->flags & OFI_FLAG_RMA) && !d->rma) {
    WARN("NET/OFI: connect on %s: the receiver chose the RMA path (CHORUS_OFI_RMA), which this process's device "
         "cannot carry (CHORUS_OFI_RMA=%lld here, provider %s); set CHORUS_OFI_RMA alike on every rank",
         d->name, (long long)param_int(PARAM_OFI_RMA), ofi_prov_name());
    return ncclInvalidUsage;
  }
  struct ofi_comm* c = comm_new(d, OFI_SEND);
  if (!c) return ncclSystemError;
  c->handle = *h;
  c->id = h->id;
  ofi_name_str(d, h->name, h->name_len, c->peer_str, sizeof(c->peer_str));
  if ((res = ofi_addr_insert(d, h->name, h->name_len, &c->peer)) != ncclSuccess) goto fail;
  c->ctrl.magic = OFI_CTRL_MAGIC;
  c->ctrl.id = h->id;
  c->ctrl.nonce = h->nonce;
  snprintf(c->ctrl.who, sizeof(c->ctrl.who), "%s pid %d", ut_hostname(), (int)getpid());
  if (h->flags & OFI_FLAG_RMA) {
    c->rma = 1;
    pthread_mutex_lock(&d->mu);
    c->cts_id = d->next_id++;
    if (d->next_id == 0) d->next_id = 1;
    pthread_mutex_unlock(&d->mu);
    c->ctrl.flags = OFI_FLAG_RMA;
    c->ctrl.cts_id = c->cts_id;
    c->ctrl.name_len = (uint16_t)d->ep_name_len;
    memcpy(c->ctrl.name, d->ep_name, d->ep_name_len);
    if ((res = ofi_mr_open(d, c->cts_msg, sizeof(c->cts_msg), &c->cts_mr)) != ncclSuccess) goto fail;
    if ((res = ofi_cts_post_all(c)) != ncclSuccess) goto fail; /* before the receiver can send any */
  }
  if ((res = ofi_mr_open(d, &c->ctrl, sizeof(c->ctrl), &c->ctrl_mr)) != ncclSuccess) goto fail;
  *out = c;
  return ncclSuccess;
fail:
  comm_free(c);
  return res;
}

/* One step of a connect: post the connection message (rxm answers -FI_EAGAIN until its connection to
 * the peer is up, and only reading the CQ moves that along), then wait for its completion. */
static ncclResult_t connect_step(struct ofi_comm* c) {
  struct ofi_dev* d = c->dev;
  if (c->stage == OFI_IDLE) {
    ofi_req_reset(&c->ctrl_req, "connection message send", sizeof(c->ctrl));
    ssize_t rc = fi_tsend(d->ep, &c->ctrl, sizeof(c->ctrl), c->ctrl_mr.desc, c->peer, d->ctrl_bit | c->id,
                          &c->ctrl_req.ctx);
    if (rc) {
      __atomic_store_n(&c->ctrl_req.state, 0, __ATOMIC_RELAXED);
      if (rc != -FI_EAGAIN) {
        WARN("NET/OFI: sending the connection message to %s on %s (provider %s) failed: %s", c->peer_str, d->name,
             ofi_prov_name(), ofi_fn.strerror((int)-rc));
        return ncclSystemError;
      }
      ofi_progress(d);
      return ncclSuccess;
    }
    c->stage = OFI_POSTED;
  }
  if (ofi_req_load_state(&c->ctrl_req) == OFI_REQ_POSTED) ofi_progress(d);
  int st = ofi_req_load_state(&c->ctrl_req);
  if (st == OFI_REQ_FAILED) {
    ofi_req_warn(&c->ctrl_req);
    return ncclSystemError;
  }
  if (st == OFI_REQ_DONE) c->stage = OFI_DONE;
  else if (__atomic_load_n(&d->cq_dead, __ATOMIC_ACQUIRE)) return ncclSystemError;
  return ncclSuccess;
}

static ncclResult_t ofi_connect(void* ctx, int dev, void* handle, void** sendComm,
                                ncclNetDeviceHandle_v12_t** sendDevComm) {
  (void)ctx;
  ncclResult_t res;
  struct ofi_dev* d = dev_arg(dev, "connect");
  *sendComm = NULL;
  if (sendDevComm) *sendDevComm = NULL;
  if (!d || !handle) return ncclInvalidArgument;
  struct ofi_handle h;
  if ((res = handle_check(d, handle, &h)) != ncclSuccess) return res;
  if ((res = ofi_dev_open(d)) != ncclSuccess) return res;
  struct ofi_comm* c = pending_take(d, &h);
  if (!c && (res = send_comm_new(d, &h, &c)) != ncclSuccess) return res;
  if ((res = connect_step(c)) != ncclSuccess) {
    comm_free(c);
    return res;
  }
  if (c->stage == OFI_DONE) {
    INFO(LOG_NET, "NET/OFI: connected to %s on %s (tag %u, %s)", c->peer_str, d->name, c->id,
         c->rma ? "RMA path" : "tagged path");
    *sendComm = c;
  } else {
    pending_put(c);
  }
  return ncclSuccess;
}

static ncclResult_t ofi_accept(void* listenComm, void** recvComm, ncclNetDeviceHandle_v12_t** recvDevComm) {
  struct ofi_comm* l = comm_check(listenComm, OFI_LISTEN, "accept");
  *recvComm = NULL;
  if (recvDevComm) *recvDevComm = NULL;
  if (!l) return ncclInvalidArgument;
  struct ofi_dev* d = l->dev;
  if (l->stage == OFI_DONE) {
    WARN("NET/OFI: accept called again on a listen comm that already accepted its one connection");
    return ncclInternalError;
  }
  if (l->stage == OFI_IDLE) {
    ncclResult_t res = listen_post(l);
    if (res != ncclSuccess || l->stage == OFI_IDLE) {
      ofi_progress(d);
      return res;
    }
  }
  if (ofi_req_load_state(&l->ctrl_req) == OFI_REQ_POSTED) ofi_progress(d);
  int st = ofi_req_load_state(&l->ctrl_req);
  if (st == OFI_REQ_POSTED) return __atomic_load_n(&d->cq_dead, __ATOMIC_ACQUIRE) ? ncclSystemError : ncclSuccess;
  if (st == OFI_REQ_FAILED && l->ctrl_req.err != FI_ETRUNC) {
    ofi_req_warn(&l->ctrl_req);
    return ncclSystemError;
  }
  /* Is the arrived message the one this listener's handle asked for? (A truncated one is not.) */
  struct ofi_ctrl m;
  const char* bad = "longer than a connection message";
  size_t got = l->ctrl_req.len;
  memset(&m, 0, sizeof(m));
  if (st == OFI_REQ_DONE && got > sizeof(l->ctrl)) bad = "longer than the receive buffer";
  else if (st == OFI_REQ_DONE && !ofi_ctrl_decode(&l->ctrl, got, l->id, l->handle.nonce, &m, &bad)) bad = NULL;
  if (bad) {
    /* A stray or forged sender: drop its message, keep waiting for the real one. */
    if (!l->warned)
      WARN("NET/OFI: listener %u on %s dropped a connection message that does not match its handle (%zu bytes, "
           "magic 0x%x, id %u: %s); a peer from another job or run? Later ones are dropped silently",
           l->id, d->name, got, m.magic, m.id, bad);
    l->warned = 1;
    l->stage = OFI_IDLE;
    return listen_post(l);
  }
  if (m.flags != l->handle.flags || ((m.flags & OFI_FLAG_RMA) && m.name_len < name_min(d))) {
    WARN("NET/OFI: listener %u on %s: %s answered path flags 0x%x (endpoint name %u bytes) to a handle with 0x%x; "
         "mixed Chorus versions?", l->id, d->name, m.who, m.flags, m.name_len, l->handle.flags);
    return ncclSystemError;
  }
  struct ofi_comm* r = comm_new(d, OFI_RECV);
  if (!r) return ncclSystemError;
  r->id = l->id;
  snprintf(r->peer_str, sizeof(r->peer_str), "%s", m.who);
  snprintf(l->peer_str, sizeof(l->peer_str), "%s", m.who);
  if (m.flags & OFI_FLAG_RMA) {
    ncclResult_t res;
    r->rma = 1;
    r->cts_id = m.cts_id;
    if ((res = ofi_addr_insert(d, m.name, m.name_len, &r->peer)) != ncclSuccess ||
        (res = ofi_mr_open(d, r->cts_msg, sizeof(r->cts_msg), &r->cts_mr)) != ncclSuccess) {
      comm_free(r);
      return res;
    }
    if (ofi_rma_attach(r)) {
      WARN("NET/OFI: accept on %s: all %d RMA connection ids of the device are in use", d->name, OFI_RMA_IDS);
      comm_free(r);
      return ncclSystemError;
    }
  }
  l->stage = OFI_DONE;
  INFO(LOG_NET, "NET/OFI: accepted %s on %s (tag %u, %s)", r->peer_str, d->name, r->id,
       r->rma ? "RMA path" : "tagged path");
  *recvComm = r;
  return ncclSuccess;
}

/* ------------------------------------------------------------------------------------------------ */
/* Registration                                                                                      */

static ncclResult_t ofi_reg_mr(void* comm, void* data, size_t size, int type, void** mhandle) {
  struct ofi_comm* c = comm_check(comm, 0, "regMr");
  *mhandle = NULL;
  if (!c || c->kind == OFI_LISTEN) return ncclInvalidArgument;
  if (type != NCCL_PTR_HOST) {
    WARN("NET/OFI: regMr of memory type %d: only host memory is supported (ptrSupport NCCL_PTR_HOST)", type);
    return ncclInternalError;
  }
  struct ofi_mh* mh = calloc(1, sizeof(*mh));
  if (!mh) return ncclSystemError;
  mh->magic = OFI_MH_MAGIC;
  if (size) {
    ncclResult_t res = ofi_mr_open(c->dev, data, size, &mh->mr);
    if (res != ncclSuccess) {
      free(mh);
      return res;
    }
  }
  *mhandle = mh;
  return ncclSuccess;
}

static ncclResult_t ofi_dereg_mr(void* comm, void* mhandle) {
  (void)comm;
  struct ofi_mh* mh = mhandle;
  if (!mh) return ncclSuccess;
  if (mh->magic != OFI_MH_MAGIC) {
    WARN("NET/OFI: deregMr of %p, which is not a registration", mhandle);
    return ncclInvalidArgument;
  }
  ofi_mr_close(&mh->mr);
  mh->magic = 0;
  free(mh);
  return ncclSuccess;
}

ncclResult_t ofi_mh_get(void* mhandle, struct ofi_mh** out) {
  struct ofi_mh* mh = mhandle;
  *out = mh;
  if (mh && mh->magic != OFI_MH_MAGIC) {
    WARN("NET/OFI: a data call was given %p, which is not a registration", mhandle);
    return ncclInvalidArgument;
  }
  return ncclSuccess;
}

static ncclResult_t mh_desc(void* mhandle, void** desc) {
  struct ofi_mh* mh = mhandle;
  *desc = NULL;
  if (!mh) return ncclSuccess; /* unregistered: fine where the provider needs no FI_MR_LOCAL */
  if (mh->magic != OFI_MH_MAGIC) {
    WARN("NET/OFI: a data call was given %p, which is not a registration", mhandle);
    return ncclInvalidArgument;
  }
  *desc = mh->mr.desc;
  return ncclSuccess;
}

/* ------------------------------------------------------------------------------------------------ */
/* Data                                                                                              */

/* The tag of a data message: the connection's id, and the sender's NCCL tag where the device has room
 * for it (so that a grouped receive can put each message in the buffer of its tag). */
static uint64_t data_tag(const struct ofi_dev* d, uint32_t id, int tag) {
  return (uint64_t)id | ((uint64_t)(uint32_t)tag & d->tag_mask) << OFI_TAG_SHIFT;
}

static ncclResult_t ofi_isend(void* sendComm, void* data, size_t size, int tag, void* mhandle, void* phandle,
                              void** request) {
  (void)phandle;
  struct ofi_comm* c = comm_check(sendComm, OFI_SEND, "isend");
  void* desc;
  *request = NULL;
  if (!c) return ncclInvalidArgument;
  ncclResult_t res = mh_desc(mhandle, &desc);
  if (res != ncclSuccess) return res;
  struct ofi_dev* d = c->dev;
  if ((d->info->ep_attr->max_msg_size && size > d->info->ep_attr->max_msg_size) || (c->rma && size > OFI_RMA_MAX)) {
    WARN("NET/OFI: isend of %zu bytes exceeds the limit of %zu (maxP2pBytes)", size,
         (size_t)(c->rma && (!d->info->ep_attr->max_msg_size || d->info->ep_attr->max_msg_size > OFI_RMA_MAX)
                      ? OFI_RMA_MAX
                      : d->info->ep_attr->max_msg_size));
    return ncclInternalError;
  }
  if (c->rma) return ofi_rma_isend(c, data, size, desc, request);
  struct ofi_req* r = ofi_req_get(c);
  if (!r) return ncclSuccess;
  ofi_req_reset(r, "send", size);
  ssize_t rc = fi_tsend(d->ep, data, size, desc, c->peer, data_tag(d, c->id, tag), &r->ctx);
  if (rc) {
    ofi_req_put(r);
    if (rc == -FI_EAGAIN) {
      ofi_progress(d); /* frees provider resources; NCCL calls again */
      return ncclSuccess;
    }
    WARN("NET/OFI: posting a send of %zu bytes to %s on %s (provider %s) failed: %s", size, c->peer_str, d->name,
         ofi_prov_name(), ofi_fn.strerror((int)-rc));
    return ncclSystemError;
  }
  *request = r;
  return ncclSuccess;
}

/* Posts the members of a grouped receive not yet posted, in order; stops at the first the provider
 * refuses for now. A member is POSTED only once the provider has it (close cancels only those).
 * ncclSystemError (said) when one is refused for good. */
static ncclResult_t group_post(struct ofi_req* h) {
  struct ofi_comm* c = h->comm;
  struct ofi_dev* d = c->dev;
  while (h->group_posted < h->group_n) {
    struct ofi_req* m = h->group[h->group_posted];
    size_t size = m->posted;
    ofi_req_reset(m, "receive", size);
    ssize_t rc = fi_trecv(d->ep, m->gbuf, size, m->gdesc, FI_ADDR_UNSPEC, m->gtag, 0, &m->ctx);
    if (rc) __atomic_store_n(&m->state, 0, __ATOMIC_RELAXED); /* not the provider's */
    if (rc == -FI_EAGAIN) {
      ofi_progress(d);
      return ncclSuccess;
    }
    if (rc) {
      WARN("NET/OFI: posting a receive of %zu bytes from %s on %s (provider %s) failed: %s", size, c->peer_str,
           d->name, ofi_prov_name(), ofi_fn.strerror((int)-rc));
      return ncclSystemError;
    }
    h->group_posted++;
  }
  if (c->group_partial == h) c->group_partial = NULL;
  return ncclSuccess;
}

/* A grouped receive: n requests, one per buffer, each matching the sender's tag of its buffer. */
static ncclResult_t group_irecv(struct ofi_comm* c, int n, void** data, size_t* sizes, int* tags, void** mhandles,
                                void** request) {
  struct ofi_req* m[OFI_MAX_RECVS];
  void* desc[OFI_MAX_RECVS];
  for (int i = 0; i < n; i++) {
    ncclResult_t res = mh_desc(mhandles ? mhandles[i] : NULL, &desc[i]);
    if (res != ncclSuccess) return res;
    for (int j = 0; j < i; j++) /* tags the data tag cannot tell apart would take each other's messages */
      if (tags[j] != tags[i] && data_tag(c->dev, 0, tags[j]) == data_tag(c->dev, 0, tags[i])) {
        WARN("NET/OFI: irecv of a group with tags %d and %d, which differ only above the %d bits a data tag carries",
             tags[j], tags[i], __builtin_popcountll(c->dev->tag_mask));
        return ncclInvalidArgument;
      }
  }
  for (int i = 0; i < n; i++) {
    if (!(m[i] = ofi_req_get(c))) { /* not enough free: "not now" */
      while (i-- > 0) ofi_req_put(m[i]);
      return ncclSuccess;
    }
  }
  for (int i = 0; i < n; i++) {
    m[i]->posted = sizes[i]; /* group_post resets and posts it */
    m[i]->gbuf = data[i], m[i]->gdesc = desc[i], m[i]->gtag = data_tag(c->dev, c->id, tags[i]);
    m[i]->group_n = 0;
    m[0]->group[i] = m[i];
  }
  m[0]->group_n = n, m[0]->group_posted = 0;
  c->group_partial = m[0];
  ncclResult_t res = group_post(m[0]);
  if (res != ncclSuccess) {
    for (int i = m[0]->group_posted; i < n; i++) ofi_req_put(m[i]); /* posted ones stay: the provider holds them */
    m[0]->group_n = 0;
    c->group_partial = NULL;
    return res;
  }
  *request = m[0];
  return ncclSuccess;
}

/* test() of a grouped receive: done when every member is; sizes[i] of buffer i. */
static ncclResult_t group_test(struct ofi_req* h, int* done, int* sizes) {
  struct ofi_dev* d = h->comm->dev;
  ncclResult_t res = group_post(h);
  if (res != ncclSuccess) return res;
  int posted = h->group_n - h->group_posted, failed = -1; /* not yet posted: pending too */
  for (int i = 0; i < h->group_posted; i++) {
    int st = ofi_req_load_state(h->group[i]);
    posted += st == OFI_REQ_POSTED;
    if (st == OFI_REQ_FAILED && failed < 0) failed = i;
  }
  if (posted && failed < 0) {
    ofi_progress(d);
    posted = h->group_n - h->group_posted;
    for (int i = 0; i < h->group_posted; i++) {
      int st = ofi_req_load_state(h->group[i]);
      posted += st == OFI_REQ_POSTED;
      if (st == OFI_REQ_FAILED && failed < 0) failed = i;
    }
  }
  if (failed >= 0) {
    ofi_req_warn(h->group[failed]);
    return ncclSystemError; /* members still posted stay with the provider until the comm closes */
  }
  if (posted) return __atomic_load_n(&d->cq_dead, __ATOMIC_ACQUIRE) ? ncclSystemError : ncclSuccess;
  int n = h->group_n;
  for (int i = 0; i < n; i++) {
    size_t moved = h->group[i]->len;
    if (sizes) sizes[i] = moved > INT_MAX ? INT_MAX : (int)moved;
  }
  h->group_n = 0;
  for (int i = n - 1; i >= 0; i--) ofi_req_put(h->group[i]);
  *done = 1;
  return ncclSuccess;
}

static ncclResult_t ofi_irecv(void* recvComm, int n, void** data, size_t* sizes, int* tags, void** mhandles,
                              void** phandles, void** request) {
  (void)phandles;
  struct ofi_comm* c = comm_check(recvComm, OFI_RECV, "irecv");
  void* desc;
  *request = NULL; /* also clears NCCL_NET_OPTIONAL_RECV_COMPLETION: we always complete */
  if (!c) return ncclInvalidArgument;
  int max = !c->rma && c->dev->tag_mask ? OFI_MAX_RECVS : 1;
  if (n < 1 || n > max) {
    WARN("NET/OFI: irecv of %d buffers; this device groups 1 to %d (maxRecvs)", n, max);
    return ncclInvalidArgument;
  }
  if (c->group_partial) { /* an earlier group is not wholly posted: this receive must not overtake it */
    ncclResult_t res = group_post(c->group_partial);
    if (res != ncclSuccess || c->group_partial) return res; /* not now */
  }
  if (n > 1) return group_irecv(c, n, data, sizes, tags, mhandles, request);
  if (c->rma) return ofi_rma_irecv(c, data[0], sizes[0], mhandles ? mhandles[0] : NULL, request);
  ncclResult_t res = mh_desc(mhandles ? mhandles[0] : NULL, &desc);
  if (res != ncclSuccess) return res;
  struct ofi_dev* d = c->dev;
  struct ofi_req* r = ofi_req_get(c);
  if (!r) return ncclSuccess;
  ofi_req_reset(r, "receive", sizes[0]);
  ssize_t rc = fi_trecv(d->ep, data[0], sizes[0], desc, FI_ADDR_UNSPEC, data_tag(d, c->id, tags[0]), 0, &r->ctx);
  if (rc) {
    ofi_req_put(r);
    if (rc == -FI_EAGAIN) {
      ofi_progress(d);
      return ncclSuccess;
    }
    WARN("NET/OFI: posting a receive of %zu bytes from %s on %s (provider %s) failed: %s", sizes[0], c->peer_str,
         d->name, ofi_prov_name(), ofi_fn.strerror((int)-rc));
    return ncclSystemError;
  }
  *request = r;
  return ncclSuccess;
}

static ncclResult_t ofi_iflush(void* recvComm, int n, void** data, int* sizes, void** mhandles, void** request) {
  (void)n, (void)data, (void)sizes, (void)mhandles;
  if (!comm_check(recvComm, OFI_RECV, "iflush")) return ncclInvalidArgument;
  *request = &ofi_flush_req; /* host memory: received data is visible already */
  return ncclSuccess;
}

static ncclResult_t ofi_test(void* request, int* done, int* sizes) {
  struct ofi_req* r = request;
  *done = 0;
  if (r == &ofi_flush_req) {
    *done = 1;
    return ncclSuccess;
  }
  if (!r || !r->comm || r->comm->magic != OFI_COMM_MAGIC || r < r->comm->reqs || r >= r->comm->reqs + OFI_NREQS ||
      !r->in_use) {
    WARN("NET/OFI: test of %p, which is not a request in flight", request);
    return ncclInternalError;
  }
  if (r->group_n > 1) return group_test(r, done, sizes);
  struct ofi_dev* d = r->comm->dev;
  if (ofi_req_load_state(r) == OFI_REQ_POSTED && r->comm->rma && r->comm->kind == OFI_SEND) ofi_rma_pump(r->comm);
  if (ofi_req_load_state(r) == OFI_REQ_POSTED) ofi_progress(d);
  int st = ofi_req_load_state(r);
  if (st == OFI_REQ_POSTED && r->comm->rma && r->comm->kind == OFI_RECV) {
    struct ofi_req* q = &r->comm->cts_req[r - r->comm->reqs]; /* its CTS never reached the sender? */
    if (ofi_req_load_state(q) == OFI_REQ_FAILED) {
      ofi_req_warn(q);
      __atomic_store_n(&q->state, 0, __ATOMIC_RELAXED);
      ofi_rma_unwait(r);
      ofi_req_put(r);
      return ncclSystemError;
    }
  }
  if (st == OFI_REQ_POSTED) {
    if (!__atomic_load_n(&d->cq_dead, __ATOMIC_ACQUIRE)) return ncclSuccess;
    return ncclSystemError; /* the CQ reader warned once for all */
  }
  if (st == OFI_REQ_FAILED) {
    ofi_req_warn(r);
    ofi_req_put(r);
    return ncclSystemError;
  }
  /* A send's completion carries no length (fi_cq(3)): it moved all it was given. */
  size_t moved = r->comm->kind == OFI_SEND ? r->posted : r->len;
  if (sizes) sizes[0] = moved > INT_MAX ? INT_MAX : (int)moved;
  *done = 1;
  ofi_req_put(r);
  return ncclSuccess;
}

/* ------------------------------------------------------------------------------------------------ */
/* Close                                                                                             */

static ncclResult_t ofi_close_kind(void* comm, int kind, const char* fn) {
  if (!comm) return ncclSuccess;
  struct ofi_comm* c = comm_check(comm, kind, fn);
  if (!c) return ncclInvalidArgument;
  comm_free(c);
  return ncclSuccess;
}
static ncclResult_t ofi_close_send(void* c) { return ofi_close_kind(c, OFI_SEND, "closeSend"); }
static ncclResult_t ofi_close_recv(void* c) { return ofi_close_kind(c, OFI_RECV, "closeRecv"); }
static ncclResult_t ofi_close_listen(void* c) { return ofi_close_kind(c, OFI_LISTEN, "closeListen"); }

static ncclResult_t ofi_finalize(void* ctx) {
  (void)ctx; /* devices live as long as the process: other inits may share them */
  return ncclSuccess;
}

const ncclNet_v12_t ch_ofi_net = {
    .name = "OFI",
    .init = ofi_init,
    .devices = ofi_devices,
    .getProperties = ofi_get_properties,
    .listen = ofi_listen,
    .connect = ofi_connect,
    .accept = ofi_accept,
    .regMr = ofi_reg_mr,
    .regMrDmaBuf = NULL,
    .deregMr = ofi_dereg_mr,
    .isend = ofi_isend,
    .irecv = ofi_irecv,
    .iflush = ofi_iflush,
    .test = ofi_test,
    .closeSend = ofi_close_send,
    .closeRecv = ofi_close_recv,
    .closeListen = ofi_close_listen,
    .getDeviceMr = NULL,
    .irecvConsumed = NULL,
    .makeVDevice = NULL,
    .finalize = ofi_finalize,
    .setNetAttr = NULL,
};

#else /* !CHORUS_HAVE_LIBFABRIC: the network exists but says why it cannot start */

static const char ofi_absent[] = "Chorus was built without libfabric's headers (install libfabric-dev and rebuild)";

int ch_ofi_available(const char** why) {
  if (why) *why = ofi_absent;
  return -1;
}
int ch_ofi_is_rdma(void) { return 0; }
const char* ch_ofi_provider(void) { return ""; }

static ncclResult_t ofi_init(void** ctx, uint64_t commId, ncclNetCommConfig_v12_t* config,
                             ncclDebugLogger_t logFunction, ncclProfilerCallback_t profFunction) {
  (void)ctx, (void)commId, (void)config, (void)logFunction, (void)profFunction;
  WARN("NCCL_NET=OFI: %s", ofi_absent);
  return ncclSystemError;
}
static ncclResult_t ofi_devices(int* ndev) {
  *ndev = 0;
  return ncclSuccess;
}
static ncclResult_t ofi_get_properties(int dev, ncclNetProperties_v12_t* props) {
  (void)dev, (void)props;
  return ncclInternalError;
}
static ncclResult_t ofi_finalize(void* ctx) {
  (void)ctx;
  return ncclSuccess;
}

/* init always fails, so nothing else is ever called. */
const ncclNet_v12_t ch_ofi_net = {
    .name = "OFI", .init = ofi_init, .devices = ofi_devices, .getProperties = ofi_get_properties,
    .finalize = ofi_finalize,
};

#endif /* CHORUS_HAVE_LIBFABRIC */
