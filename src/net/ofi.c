/* Chorus's built-in libfabric network: NCCL's ncclNet_v12_t over tagged messages on one RDM endpoint
 * per device, following aws-ofi-nccl's SENDRECV protocol (docs: /work/shared/reference/rdma.md, 3).
 *
 * Protocol. listen() takes a 32-bit id from the device's counter and posts a receive for the
 * connection tag (ctrl_bit | id); its handle carries the endpoint name, the id and a random nonce.
 * connect() inserts the name into the AV and sends {magic, id, nonce, who} on that tag; it returns the
 * sendComm once that send completed. accept() returns the recvComm once a message with the right
 * magic, id and nonce arrived. Data then goes as fi_tsend/fi_trecv on tag = id: one tag per
 * connection, so order on a connection is the provider's send-after-send order (asked for in hints).
 * The provider buffers messages that arrive before their receive is posted.
 *
 * GPU memory is left out: Debian's libfabric has no FI_HMEM for CUDA, so ptrSupport is host only and
 * the transport stages device buffers through host memory. libfabric itself is in ofi_fabric.c. */
#define _GNU_SOURCE
#include <arpa/inet.h>
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

_Static_assert(sizeof(struct ofi_handle) <= NCCL_NET_HANDLE_MAXSIZE, "handle too large");
_Static_assert(sizeof(struct ofi_handle) == OFI_HANDLE_HDR + OFI_NAME_MAX, "handle has padding");
_Static_assert(sizeof(struct ofi_ctrl) == 16 + OFI_WHO_MAX, "connection message has padding");

/* ------------------------------------------------------------------------------------------------ */
/* Wire decoders (pure: no libfabric; built with or without it, fuzzed by fuzz/fuzz_ofi.c)           */

size_t ofi_handle_encode(const struct ofi_handle* h, void* buf, size_t len) {
  if (!h || !buf || h->name_len == 0 || h->name_len > OFI_NAME_MAX || len < OFI_HANDLE_HDR + h->name_len) return 0;
  size_t used = OFI_HANDLE_HDR + h->name_len;
  memset(buf, 0, len);
  memcpy(buf, h, used); /* the header, then the name: the struct's layout is the wire's (no padding) */
  return used;
}

int ofi_handle_decode(const void* buf, size_t len, uint16_t version, uint32_t addr_format, size_t min_name_len,
                      struct ofi_handle* out, const char** why) {
  const char* bad = NULL;
  memset(out, 0, sizeof(*out));
  if (!buf || len < OFI_HANDLE_HDR) {
    bad = "shorter than a handle's header";
    goto fail;
  }
  memcpy(out, buf, OFI_HANDLE_HDR); /* the caller's buffer has no alignment promise */
  if (out->magic != OFI_HANDLE_MAGIC) bad = "wrong magic: not a handle of Chorus's OFI network";
  else if (out->version != version) bad = "protocol version differs: mixed Chorus versions";
  else if (out->name_len == 0 || out->name_len > OFI_NAME_MAX) bad = "endpoint name length out of range";
  else if (out->name_len > len - OFI_HANDLE_HDR) bad = "endpoint name runs past the end of the handle";
  else if (out->addr_format != addr_format)
    bad = "address format differs: ranks use different providers or address families (set FI_PROVIDER alike)";
  else if (out->name_len < min_name_len) bad = "endpoint name too short for its address format";
  else if (out->id == 0) bad = "connection id 0";
  if (bad) goto fail;
  memcpy(out->name, (const uint8_t*)buf + OFI_HANDLE_HDR, out->name_len);
  return 0;
fail:
  if (why) *why = bad;
  return -1;
}

int ofi_ctrl_decode(const void* msg, size_t len, uint32_t expect_id, uint64_t expect_nonce, struct ofi_ctrl* out,
                    const char** why) {
  const size_t hdr = offsetof(struct ofi_ctrl, who);
  const char* bad = NULL;
  memset(out, 0, sizeof(*out));
  if (msg) memcpy(out, msg, len < hdr ? len : hdr); /* the header bytes present: for the caller's message too */
  if (!msg || len != sizeof(*out)) bad = "wrong size for a connection message";
  else if (out->magic != OFI_CTRL_MAGIC) bad = "wrong magic: not a connection message of Chorus's OFI network";
  else if (out->id != expect_id) bad = "connection id differs from the listener's";
  else if (out->nonce != expect_nonce) bad = "nonce differs from the listener's handle: a stale or stray sender";
  if (bad) {
    if (why) *why = bad;
    return -1;
  }
  const char* who = (const char*)msg + hdr;
  for (size_t i = 0; i + 1 < sizeof(out->who) && who[i]; i++) /* printed only: printable ASCII, terminated */
    out->who[i] = who[i] >= 0x20 && who[i] < 0x7f ? who[i] : '?';
  return 0;
}

const char* ofi_name_format(int family, const uint8_t* name, size_t len, char* buf, size_t buflen) {
  char ip[INET6_ADDRSTRLEN] = "?";
  if (!buf || buflen == 0) return buf;
  buf[0] = '\0';
  if (family == 4 && name && len >= sizeof(struct sockaddr_in)) {
    struct sockaddr_in sin;
    memcpy(&sin, name, sizeof(sin));
    if (!inet_ntop(AF_INET, &sin.sin_addr, ip, sizeof(ip))) snprintf(ip, sizeof(ip), "?");
    snprintf(buf, buflen, "%s:%d", ip, ntohs(sin.sin_port));
  } else if (family == 6 && name && len >= sizeof(struct sockaddr_in6)) {
    struct sockaddr_in6 sin6;
    memcpy(&sin6, name, sizeof(sin6));
    if (!inet_ntop(AF_INET6, &sin6.sin6_addr, ip, sizeof(ip))) snprintf(ip, sizeof(ip), "?");
    snprintf(buf, buflen, "[%s]:%d", ip, ntohs(sin6.sin6_port));
  } else {
    size_t used = (size_t)snprintf(buf, buflen, "%zu-byte address ", len);
    for (size_t i = 0; name && i < len && i < 8 && used + 3 <= buflen; i++)
      used += (size_t)snprintf(buf + used, buflen - used, "%02x", name[i]);
  }
  return buf;
}

#ifdef CHORUS_HAVE_LIBFABRIC

#include "../misc/utils.h"

#define OFI_COMM_MAGIC 0x4f46494fu
#define OFI_MH_MAGIC 0x4f46494du
#define OFI_NREQS 64                     /* requests per comm: NCCL needs 32 (NCCL_NET_MAX_REQUESTS) */
#define OFI_CLOSE_WAIT_NS 2000000000ull /* how long close waits for cancelled or unfinished operations */

enum ofi_kind { OFI_LISTEN = 1, OFI_SEND = 2, OFI_RECV = 3 };
enum ofi_stage { OFI_IDLE = 0, OFI_POSTED = 1, OFI_DONE = 2 }; /* of the connection message */

/* Listen, send and recv comms share one layout. Everything is touched only by the thread calling the
 * table on this comm, except the requests' results, which the CQ reader writes (see ofi.h). */
struct ofi_comm {
  uint32_t magic;            /* OFI_COMM_MAGIC while alive: catches stale and foreign pointers */
  int kind;                  /* enum ofi_kind */
  struct ofi_dev* dev;
  uint32_t id;               /* data tag */
  fi_addr_t peer;            /* send: the receiver */
  char peer_str[96];         /* the peer, for messages */
  int stage;                 /* enum ofi_stage of ctrl_req */
  int warned;                /* listen: a bad connection message was reported already */
  struct ofi_handle handle;  /* listen: what it wrote; send: what connect was given (pending key) */
  struct ofi_ctrl ctrl;      /* listen: receive buffer; send: the message */
  struct ofi_mr ctrl_mr;
  struct ofi_req ctrl_req;
  struct ofi_comm* next;     /* on ofi_pending (connecting) or ofi_graveyard; under ofi_lists_mu */
  int req_next;              /* where req_get looks first */
  struct ofi_req reqs[OFI_NREQS];
};

struct ofi_mh {
  uint32_t magic;
  struct ofi_mr mr;
};

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
  for (int i = 0; i < OFI_NREQS; i++) c->reqs[i].comm = c;
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

static int req_state(struct ofi_req* r) { return __atomic_load_n(&r->state, __ATOMIC_ACQUIRE); }

static void req_reset(struct ofi_req* r, const char* op, size_t size) {
  r->op = op;
  r->posted = size;
  r->len = 0;
  r->err = 0;
  r->olen = 0;
  r->errtext[0] = '\0';
  /* Before posting: the completion may be read by another thread before the post call returns. */
  __atomic_store_n(&r->state, OFI_REQ_POSTED, __ATOMIC_RELEASE);
}

static struct ofi_req* req_get(struct ofi_comm* c) {
  for (int k = 0; k < OFI_NREQS; k++) {
    int i = (c->req_next + k) % OFI_NREQS;
    if (c->reqs[i].in_use) continue;
    c->reqs[i].in_use = 1;
    c->req_next = (i + 1) % OFI_NREQS;
    return &c->reqs[i];
  }
  return NULL; /* all in flight: the caller retries (NULL request) */
}

static void req_put(struct ofi_req* r) {
  __atomic_store_n(&r->state, 0, __ATOMIC_RELAXED);
  r->in_use = 0;
}

/* One WARN for a failed operation, with all we know about it. */
static void req_warn(struct ofi_req* r) {
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
  if (recv_side && req_state(&c->ctrl_req) == OFI_REQ_POSTED) fi_cancel(&d->ep->fid, &c->ctrl_req.ctx);
  for (int i = 0; recv_side && i < OFI_NREQS; i++)
    if (c->reqs[i].in_use && req_state(&c->reqs[i]) == OFI_REQ_POSTED) fi_cancel(&d->ep->fid, &c->reqs[i].ctx);
  uint64_t deadline = ut_now_ns() + OFI_CLOSE_WAIT_NS;
  for (;;) {
    int busy = req_state(&c->ctrl_req) == OFI_REQ_POSTED;
    for (int i = 0; !busy && i < OFI_NREQS; i++) busy = req_state(&c->reqs[i]) == OFI_REQ_POSTED;
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
  props->maxRecvs = 1;
  props->netDeviceType = NCCL_NET_DEVICE_HOST;
  props->netDeviceVersion = NCCL_NET_DEVICE_INVALID_VERSION;
  props->vProps.ndevs = 1;
  props->vProps.devs[0] = dev;
  uint64_t max = d->info->ep_attr->max_msg_size;
  props->maxP2pBytes = (size_t)(max && max < NCCL_MAX_NET_SIZE_BYTES ? max : NCCL_MAX_NET_SIZE_BYTES);
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
  req_reset(&l->ctrl_req, "connection message receive", sizeof(l->ctrl));
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
    req_reset(&c->ctrl_req, "connection message send", sizeof(c->ctrl));
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
  if (req_state(&c->ctrl_req) == OFI_REQ_POSTED) ofi_progress(d);
  int st = req_state(&c->ctrl_req);
  if (st == OFI_REQ_FAILED) {
    req_warn(&c->ctrl_req);
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
    INFO(LOG_NET, "NET/OFI: connected to %s on %s (tag %u)", c->peer_str, d->name, c->id);
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
  if (req_state(&l->ctrl_req) == OFI_REQ_POSTED) ofi_progress(d);
  int st = req_state(&l->ctrl_req);
  if (st == OFI_REQ_POSTED) return __atomic_load_n(&d->cq_dead, __ATOMIC_ACQUIRE) ? ncclSystemError : ncclSuccess;
  if (st == OFI_REQ_FAILED && l->ctrl_req.err != FI_ETRUNC) {
    req_warn(&l->ctrl_req);
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
  struct ofi_comm* r = comm_new(d, OFI_RECV);
  if (!r) return ncclSystemError;
  r->id = l->id;
  snprintf(r->peer_str, sizeof(r->peer_str), "%s", m.who);
  snprintf(l->peer_str, sizeof(l->peer_str), "%s", m.who);
  l->stage = OFI_DONE;
  INFO(LOG_NET, "NET/OFI: accepted %s on %s (tag %u)", r->peer_str, d->name, r->id);
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

static ncclResult_t ofi_isend(void* sendComm, void* data, size_t size, int tag, void* mhandle, void* phandle,
                              void** request) {
  (void)tag, (void)phandle; /* one tag per connection already; NCCL's tag is its rank */
  struct ofi_comm* c = comm_check(sendComm, OFI_SEND, "isend");
  void* desc;
  *request = NULL;
  if (!c) return ncclInvalidArgument;
  ncclResult_t res = mh_desc(mhandle, &desc);
  if (res != ncclSuccess) return res;
  struct ofi_dev* d = c->dev;
  if (d->info->ep_attr->max_msg_size && size > d->info->ep_attr->max_msg_size) {
    WARN("NET/OFI: isend of %zu bytes exceeds the provider's limit of %zu (maxP2pBytes)", size,
         (size_t)d->info->ep_attr->max_msg_size);
    return ncclInternalError;
  }
  struct ofi_req* r = req_get(c);
  if (!r) return ncclSuccess;
  req_reset(r, "send", size);
  ssize_t rc = fi_tsend(d->ep, data, size, desc, c->peer, c->id, &r->ctx);
  if (rc) {
    req_put(r);
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

static ncclResult_t ofi_irecv(void* recvComm, int n, void** data, size_t* sizes, int* tags, void** mhandles,
                              void** phandles, void** request) {
  (void)tags, (void)phandles;
  struct ofi_comm* c = comm_check(recvComm, OFI_RECV, "irecv");
  void* desc;
  *request = NULL; /* also clears NCCL_NET_OPTIONAL_RECV_COMPLETION: we always complete */
  if (!c) return ncclInvalidArgument;
  if (n != 1) {
    WARN("NET/OFI: irecv of %d buffers; this network groups none (maxRecvs 1)", n);
    return ncclInternalError;
  }
  ncclResult_t res = mh_desc(mhandles ? mhandles[0] : NULL, &desc);
  if (res != ncclSuccess) return res;
  struct ofi_dev* d = c->dev;
  struct ofi_req* r = req_get(c);
  if (!r) return ncclSuccess;
  req_reset(r, "receive", sizes[0]);
  ssize_t rc = fi_trecv(d->ep, data[0], sizes[0], desc, FI_ADDR_UNSPEC, c->id, 0, &r->ctx);
  if (rc) {
    req_put(r);
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
  struct ofi_dev* d = r->comm->dev;
  if (req_state(r) == OFI_REQ_POSTED) ofi_progress(d);
  int st = req_state(r);
  if (st == OFI_REQ_POSTED) {
    if (!__atomic_load_n(&d->cq_dead, __ATOMIC_ACQUIRE)) return ncclSuccess;
    return ncclSystemError; /* the CQ reader warned once for all */
  }
  if (st == OFI_REQ_FAILED) {
    req_warn(r);
    req_put(r);
    return ncclSystemError;
  }
  /* A send's completion carries no length (fi_cq(3)): it moved all it was given. */
  size_t moved = r->comm->kind == OFI_SEND ? r->posted : r->len;
  if (sizes) sizes[0] = moved > INT_MAX ? INT_MAX : (int)moved;
  *done = 1;
  req_put(r);
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
