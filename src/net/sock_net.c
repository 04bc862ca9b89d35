/* Chorus's socket network behind NCCL's net interface (sock_net.h): one TCP connection per comm.
 *
 * Devices are the interfaces NCCL's socket network would use (NCCL_SOCKET_IFNAME, else ib*, else the
 * rest but docker/lo/virbr, ...): one device each, so that the fabric transport spreads channels over
 * them as over NICs. listen() binds the device's address on an ephemeral port and draws a random nonce;
 * the handle carries both. connect() opens a non-blocking connection to the handle's address and sends
 * a hello holding the nonce; it returns the sendComm once the hello is out. accept() returns a recvComm
 * for the first connection whose hello has the listener's nonce; others are closed and logged.
 *
 * Every message is a 16-byte header {tag, size} and the payload. Requests of a comm are served in
 * posting order (sequence number s lives in slot s % SN_NREQS; a slot not yet freed by test makes
 * isend/irecv return a NULL request, "not now"). Each message goes to the oldest posted receive
 * with an unfilled buffer of its tag (a grouped receive of n buffers completes when all n are filled:
 * NCCL's per-tag order); a message whose receive is not posted yet waits in the socket for it, and
 * one larger than its buffer fails the comm (the stream cannot be trusted after it). isend writes at once what
 * the socket takes, and test() moves the rest: data moves only inside calls, as under a libfabric
 * provider with manual progress, so the caller (the fabric transport's thread, or a waiting rank)
 * keeps testing.
 *
 * Threads: a comm is guarded by its mutex (isend, irecv, test, close of the same comm may come from
 * different threads; the fabric transport lets one at a time, NCCL's proxy too, but a plugin should
 * not rely on it). Pending connects are found again by their handle's address and bytes and their
 * init's context, on a list under sn_mu. An accepted connection must send its hello within 10 s.
 * Nothing from a peer is used before sock_wire.c has checked it. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include "../misc/log.h"
#include "../misc/param.h"
#include "../misc/utils.h"
#include "net.h"
#include "sock_net.h"

#define SN_NREQS 32        /* NCCL_NET_MAX_REQUESTS */
#define SN_MAX_DEVS 16
#define SN_MAX_ACCEPTS 8   /* connections accepted whose hello has not arrived */
#define SN_COMM_MAGIC 0x434e5343u
#define SN_CARRY 4096      /* a receive reads small messages (and headers) this many bytes at a time */

enum { SN_LISTEN = 1, SN_SEND, SN_RECV };

struct sn_req {
  struct sn_comm* comm;
  int in_use, done;
  int n; /* buffers (1 for a send) */
  void* data[SN_MAX_RECVS];
  size_t cap[SN_MAX_RECVS]; /* send: the size */
  int tag[SN_MAX_RECVS];
  size_t got[SN_MAX_RECVS];
  unsigned char filled[SN_MAX_RECVS];
  int nfilled;
  unsigned char hdr[SN_MSG_BYTES]; /* send: the header */
  size_t off;                      /* send: bytes of header + payload written */
};

#define SN_HELLO_WAIT_NS (10ull * UT_NS_PER_S) /* an accepted connection's hello must come by then */

struct sn_accepting {
  int fd;
  uint64_t deadline; /* its hello must have come by then, or the slot is freed */
  size_t got;
  unsigned char hello[SN_HELLO_BYTES];
  union sock_addr from;
};

struct sn_comm {
  uint32_t magic;
  int kind, dev, fd;
  pthread_mutex_t mu;
  ncclResult_t failed; /* mu: sticky; every later call returns it */
  char peer[64];       /* host:port, for messages */
  /* SN_SEND/SN_RECV (mu) */
  struct sn_req reqs[SN_NREQS];
  uint64_t post_seq, prog_seq;
  /* SN_RECV: the message being read (mu) */
  unsigned char hdr[SN_MSG_BYTES];
  size_t hdr_got;
  int cur;          /* buffer being filled (of request cur_seq), -1: a header being read, or read whole
                     * (hdr_got == SN_MSG_BYTES) and waiting for the receive it belongs to */
  uint64_t cur_seq, cur_size, cur_off;
  /* Bytes read ahead: one recv takes a header with its small payload (and what follows), instead of
   * one recv for each. carry[carry_off, carry_len) is the stream's next bytes. */
  size_t carry_off, carry_len;
  unsigned char* carry;
  /* SN_LISTEN (mu) */
  uint64_t nonce;
  struct sn_accepting acc[SN_MAX_ACCEPTS];
  /* SN_SEND while connecting (sn_mu): found again by the handle's address and bytes (a caller that
   * gave up and reuses the buffer for another handle starts a new connect) */
  const void* handle_key;
  unsigned char handle_bytes[SN_HANDLE_BYTES];
  void* ctx; /* the init it belongs to (finalize closes its own) */
  int hello_sent;
  size_t hello_off;
  unsigned char hello[SN_HELLO_BYTES];
  struct sn_comm* next;
};

static pthread_mutex_t sn_mu = PTHREAD_MUTEX_INITIALIZER;
static int sn_ndevs = -1; /* sn_mu: -1 until init */
static struct sock_iface sn_devs[SN_MAX_DEVS];
static struct sn_comm* sn_connecting; /* sn_mu */
static struct sn_req sn_flush_req = {.in_use = 1, .done = 1};
static int sn_mr_token; /* every registration's handle: sockets need none */

/* One per init (NCCL 2.28+ inits per communicator): finalize closes the connects this context left
 * unfinished, and only those. */
#define SN_CTX_MAGIC 0x58544353u
struct sn_ctx {
  uint32_t magic;
};

static ncclResult_t sn_init(void** ctx, uint64_t commId, ncclNetCommConfig_v12_t* config,
                            ncclDebugLogger_t logFunction, ncclProfilerCallback_t profFunction) {
  (void)commId, (void)config, (void)logFunction, (void)profFunction; /* built in: Chorus's own log */
  pthread_mutex_lock(&sn_mu);
  if (sn_ndevs < 0) {
    sn_ndevs = sock_find_interfaces(sn_devs, SN_MAX_DEVS);
    for (int d = 0; d < sn_ndevs; d++) {
      char a[64];
      INFO(LOG_INIT | LOG_NET, "NET/Socket: device %d is %s:%s", d, sn_devs[d].name,
           sock_addr_str(&sn_devs[d].addr, a, sizeof(a)));
    }
  }
  int n = sn_ndevs;
  pthread_mutex_unlock(&sn_mu);
  if (n <= 0) {
    WARN("NET/Socket: no usable interface (NCCL_SOCKET_IFNAME=\"%s\")", param_str(PARAM_SOCKET_IFNAME));
    return ncclSystemError;
  }
  if (ctx) {
    struct sn_ctx* x = calloc(1, sizeof(*x));
    if (!x) {
      WARN("NET/Socket: out of memory for a context");
      return ncclSystemError;
    }
    x->magic = SN_CTX_MAGIC;
    *ctx = x;
  }
  return ncclSuccess;
}

static ncclResult_t sn_devices(int* ndev) {
  pthread_mutex_lock(&sn_mu);
  *ndev = sn_ndevs < 0 ? 0 : sn_ndevs;
  pthread_mutex_unlock(&sn_mu);
  return ncclSuccess;
}

/* The link speed in Mbit/s from sysfs (virtual links say -1 or nothing: 10 Gbit/s, as NCCL assumes). */
static int dev_speed(const char* name) {
  int s = sock_iface_speed_mbits(name);
  return s > 0 ? s : 10000;
}

static ncclResult_t sn_get_properties(int dev, ncclNetProperties_v12_t* props) {
  int n;
  sn_devices(&n);
  if (dev < 0 || dev >= n || !props) {
    WARN("NET/Socket: getProperties of device %d: there are %d", dev, n);
    return ncclInvalidArgument;
  }
  memset(props, 0, sizeof(*props));
  props->name = sn_devs[dev].name;
  props->pciPath = NULL;
  props->guid = (uint64_t)dev;
  props->ptrSupport = NCCL_PTR_HOST;
  props->speed = dev_speed(sn_devs[dev].name);
  props->latency = 0;
  props->maxComms = 65536;
  props->maxRecvs = SN_MAX_RECVS;
  props->netDeviceType = NCCL_NET_DEVICE_HOST;
  props->netDeviceVersion = NCCL_NET_DEVICE_INVALID_VERSION;
  props->vProps.ndevs = 1;
  props->vProps.devs[0] = dev;
  props->maxP2pBytes = NCCL_MAX_NET_SIZE_BYTES;
  props->maxCollBytes = NCCL_MAX_NET_SIZE_BYTES;
  props->maxMultiRequestSize = 1;
  props->railId = NCCL_NET_ID_UNDEF;
  props->planeId = NCCL_NET_ID_UNDEF;
  return ncclSuccess;
}

static struct sn_comm* comm_new(int kind, int dev, int fd) {
  struct sn_comm* c = calloc(1, sizeof(*c));
  if (!c) {
    WARN("NET/Socket: out of memory for a comm");
    return NULL;
  }
  c->magic = SN_COMM_MAGIC;
  c->kind = kind, c->dev = dev, c->fd = fd, c->cur = -1;
  if (kind == SN_RECV && !(c->carry = malloc(SN_CARRY))) {
    WARN("NET/Socket: out of memory for a comm");
    free(c);
    return NULL;
  }
  pthread_mutex_init(&c->mu, NULL);
  for (int i = 0; i < SN_NREQS; i++) c->reqs[i].comm = c;
  for (int i = 0; i < SN_MAX_ACCEPTS; i++) c->acc[i].fd = -1;
  return c;
}

static void comm_free(struct sn_comm* c) {
  if (c->fd >= 0) close(c->fd);
  for (int i = 0; i < SN_MAX_ACCEPTS; i++)
    if (c->acc[i].fd >= 0) close(c->acc[i].fd);
  c->magic = 0;
  free(c->carry);
  pthread_mutex_destroy(&c->mu);
  free(c);
}

static struct sn_comm* comm_check(void* p, int kind, const char* fn) {
  struct sn_comm* c = p;
  if (!c || c->magic != SN_COMM_MAGIC || c->kind != kind) {
    WARN("NET/Socket: %s called with %p, which is not a live comm of the right kind", fn, p);
    return NULL;
  }
  return c;
}

/* Data connections: no Nagle (a step's trailer must not wait for an ACK), the transport's buffer and
 * link-timeout settings (a cut link fails in bounded time). */
static void data_sockopts(int fd) {
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  sock_tune_link(fd);
}

static ncclResult_t sn_listen(void* ctx, int dev, void* handle, void** listenComm) {
  (void)ctx;
  *listenComm = NULL;
  int n;
  sn_devices(&n);
  if (dev < 0 || dev >= n || !handle) {
    WARN("NET/Socket: listen on device %d: there are %d", dev, n);
    return ncclInvalidArgument;
  }
  struct sock s;
  if (sock_listen(&sn_devs[dev].addr, &s) != CH_OK) return ncclSystemError; /* sock_listen said why */
  int fl = fcntl(s.fd, F_GETFL);
  if (fl < 0 || fcntl(s.fd, F_SETFL, fl | O_NONBLOCK) < 0) {
    WARN("NET/Socket: cannot make a listening socket non-blocking: %s", strerror(errno));
    sock_close(&s);
    return ncclSystemError;
  }
  struct sn_comm* c = comm_new(SN_LISTEN, dev, s.fd);
  if (!c) {
    sock_close(&s);
    return ncclSystemError;
  }
  struct sn_handle h = {.addr = s.addr};
  if (ut_random(&h.nonce, sizeof(h.nonce)) != CH_OK) {
    comm_free(c); /* closes the listening socket */
    return ncclSystemError;
  }
  c->nonce = h.nonce;
  sock_addr_str(&s.addr, c->peer, sizeof(c->peer));
  if (sn_handle_encode(&h, handle, NCCL_NET_HANDLE_MAXSIZE) != 0) {
    WARN("NET/Socket: cannot describe listening address %s in a handle", c->peer);
    comm_free(c);
    return ncclInternalError;
  }
  *listenComm = c;
  return ncclSuccess;
}

/* connect: a first call opens the connection and returns no comm; later calls with the same handle
 * find it again on sn_connecting and finish it (connected, hello sent). */
static ncclResult_t sn_connect(void* ctx, int dev, void* handle, void** sendComm, ncclNetDeviceHandle_v12_t** dh) {
  *sendComm = NULL;
  if (dh) *dh = NULL;
  pthread_mutex_lock(&sn_mu);
  struct sn_comm** pp = &sn_connecting;
  while (*pp && ((*pp)->handle_key != handle || !handle || (*pp)->ctx != ctx ||
                 memcmp((*pp)->handle_bytes, handle, SN_HANDLE_BYTES) != 0))
    pp = &(*pp)->next;
  struct sn_comm* c = *pp;
  pthread_mutex_unlock(&sn_mu);
  if (!c) {
    struct sn_handle h;
    const char* why = NULL;
    if (!handle || sn_handle_decode(handle, NCCL_NET_HANDLE_MAXSIZE, &h, &why) != 0) {
      WARN("NET/Socket: connect refused a handle: %s", why ? why : "none given");
      return ncclInvalidArgument;
    }
    int fd = socket(h.addr.sa.sa_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0) {
      WARN("NET/Socket: socket() failed: %s", strerror(errno));
      return ncclSystemError;
    }
    socklen_t alen = h.addr.sa.sa_family == AF_INET ? sizeof(h.addr.sin) : sizeof(h.addr.sin6);
    char a[64];
    sock_addr_str(&h.addr, a, sizeof(a));
    if (connect(fd, &h.addr.sa, alen) != 0 && errno != EINPROGRESS) {
      WARN("NET/Socket: connect to %s failed: %s", a, strerror(errno));
      close(fd);
      return ncclRemoteError;
    }
    if (!(c = comm_new(SN_SEND, dev, fd))) {
      close(fd);
      return ncclSystemError;
    }
    snprintf(c->peer, sizeof(c->peer), "%s", a);
    sn_hello_encode(h.nonce, c->hello);
    c->handle_key = handle;
    c->ctx = ctx;
    memcpy(c->handle_bytes, handle, SN_HANDLE_BYTES);
    pthread_mutex_lock(&sn_mu);
    c->next = sn_connecting, sn_connecting = c;
    pthread_mutex_unlock(&sn_mu);
    return ncclSuccess;
  }
  ncclResult_t rc = ncclSuccess;
  if (!c->hello_sent) { /* connected yet? */
    struct pollfd p = {.fd = c->fd, .events = POLLOUT};
    if (poll(&p, 1, 0) <= 0) return ncclSuccess;
    int err = 0;
    socklen_t el = sizeof(err);
    if (getsockopt(c->fd, SOL_SOCKET, SO_ERROR, &err, &el) != 0) err = errno;
    if (err) {
      WARN("NET/Socket: connect to %s failed: %s", c->peer, strerror(err));
      rc = ncclRemoteError;
      goto done;
    }
    c->hello_sent = 1;
  }
  while (c->hello_off < SN_HELLO_BYTES) {
    ssize_t w = send(c->fd, c->hello + c->hello_off, SN_HELLO_BYTES - c->hello_off, MSG_NOSIGNAL);
    if (w < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return ncclSuccess;
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) {
      WARN("NET/Socket: sending the hello to %s failed: %s", c->peer, strerror(errno));
      rc = ncclRemoteError;
      goto done;
    }
    c->hello_off += (size_t)w;
  }
  data_sockopts(c->fd);
done:
  pthread_mutex_lock(&sn_mu);
  for (pp = &sn_connecting; *pp && *pp != c;) pp = &(*pp)->next;
  if (*pp) *pp = c->next;
  pthread_mutex_unlock(&sn_mu);
  c->next = NULL, c->handle_key = NULL;
  if (rc != ncclSuccess) {
    comm_free(c);
    return rc;
  }
  *sendComm = c;
  return ncclSuccess;
}

static ncclResult_t sn_accept(void* listenComm, void** recvComm, ncclNetDeviceHandle_v12_t** dh) {
  *recvComm = NULL;
  if (dh) *dh = NULL;
  struct sn_comm* l = comm_check(listenComm, SN_LISTEN, "accept");
  if (!l) return ncclInvalidArgument;
  pthread_mutex_lock(&l->mu);
  for (int i = 0; i < SN_MAX_ACCEPTS; i++) { /* take what is waiting in the backlog */
    if (l->acc[i].fd >= 0) continue;
    socklen_t al = sizeof(l->acc[i].from);
    int fd = accept4(l->fd, &l->acc[i].from.sa, &al, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0) break;
    l->acc[i].fd = fd, l->acc[i].got = 0, l->acc[i].deadline = ut_now_ns() + SN_HELLO_WAIT_NS;
  }
  struct sn_comm* c = NULL;
  for (int i = 0; i < SN_MAX_ACCEPTS && !c; i++) {
    struct sn_accepting* a = &l->acc[i];
    if (a->fd < 0) continue;
    ssize_t r = recv(a->fd, a->hello + a->got, SN_HELLO_BYTES - a->got, 0);
    const char* why = NULL;
    if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) {
      if (ut_now_ns() < a->deadline) continue;
      why = "sent no hello within 10 s";
    }
    if (why) {
      /* silent past its deadline */
    } else if (r <= 0) {
      why = r == 0 ? "closed before its hello" : "failed before its hello";
    } else if ((a->got += (size_t)r) < SN_HELLO_BYTES) {
      continue;
    } else {
      sn_hello_check(a->hello, l->nonce, &why);
    }
    if (why) {
      sock_warn_reject("NET/Socket", &a->from, why);
      close(a->fd);
      a->fd = -1;
      continue;
    }
    c = comm_new(SN_RECV, l->dev, a->fd);
    if (!c) {
      pthread_mutex_unlock(&l->mu);
      return ncclSystemError;
    }
    a->fd = -1;
    sock_addr_str(&a->from, c->peer, sizeof(c->peer));
    data_sockopts(c->fd);
  }
  pthread_mutex_unlock(&l->mu);
  *recvComm = c;
  return ncclSuccess;
}

static ncclResult_t sn_reg_mr(void* comm, void* data, size_t size, int type, void** mhandle) {
  (void)comm, (void)data, (void)size;
  *mhandle = NULL;
  if (type != NCCL_PTR_HOST) {
    WARN("NET/Socket: regMr of memory type %d: only host memory (NCCL_PTR_HOST) can be sent", type);
    return ncclInvalidArgument;
  }
  *mhandle = &sn_mr_token; /* sockets need no registration: a non-NULL token */
  return ncclSuccess;
}

static ncclResult_t sn_dereg_mr(void* comm, void* mhandle) {
  (void)comm, (void)mhandle;
  return ncclSuccess;
}

/* The first failure of a comm: said once, with the peer; every later call returns it. Under mu. */
static ncclResult_t comm_fail(struct sn_comm* c, ncclResult_t rc, const char* what, const char* why) {
  if (c->failed == ncclSuccess) {
    WARN("NET/Socket: %s %s %s: %s", what, c->kind == SN_SEND ? "to" : "from", c->peer, why);
    c->failed = rc;
  }
  return c->failed;
}

/* Moves the head requests of a send comm as far as the socket takes them. Under mu. */
static ncclResult_t progress_send(struct sn_comm* c) {
  while (c->prog_seq < c->post_seq) {
    struct sn_req* r = &c->reqs[c->prog_seq % SN_NREQS];
    size_t total = SN_MSG_BYTES + r->cap[0];
    while (r->off < total) {
      struct iovec iov[2];
      int niov = 0;
      if (r->off < SN_MSG_BYTES) iov[niov++] = (struct iovec){r->hdr + r->off, SN_MSG_BYTES - r->off};
      size_t doff = r->off > SN_MSG_BYTES ? r->off - SN_MSG_BYTES : 0;
      if (r->cap[0] > doff) iov[niov++] = (struct iovec){(char*)r->data[0] + doff, r->cap[0] - doff};
      struct msghdr m = {.msg_iov = iov, .msg_iovlen = (size_t)niov};
      ssize_t w = sendmsg(c->fd, &m, MSG_NOSIGNAL | MSG_DONTWAIT);
      if (w < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return ncclSuccess;
      if (w < 0 && errno == EINTR) continue;
      if (w < 0) return comm_fail(c, ncclRemoteError, "send", strerror(errno));
      r->off += (size_t)w;
    }
    r->done = 1;
    c->prog_seq++;
  }
  return ncclSuccess;
}

/* The header in hand goes to the oldest posted receive with an unfilled buffer of its tag. 1 when it
 * found one (cur set), 0 when no receive posted yet takes it (its receive comes later: wait), -1 after
 * a failure (*rc). Under mu. */
static int match_header(struct sn_comm* c, ncclResult_t* rc) {
  int tag;
  uint64_t size;
  const char* why = NULL;
  if (sn_msg_decode(c->hdr, &tag, &size, &why) != 0) return *rc = comm_fail(c, ncclRemoteError, "receive", why), -1;
  for (uint64_t s = c->prog_seq; s < c->post_seq; s++) {
    struct sn_req* r = &c->reqs[s % SN_NREQS];
    if (r->done) continue;
    int idx;
    int k = sn_group_pick(r->n, r->tag, r->cap, r->filled, tag, size, &idx, &why);
    if (k < 0) return *rc = comm_fail(c, ncclRemoteError, "receive", why), -1;
    if (k == 0) {
      c->cur_seq = s, c->cur = idx, c->cur_size = size, c->cur_off = 0, c->hdr_got = 0;
      return 1;
    }
  }
  return 0;
}

/* The buffer being filled is complete; so is its receive when it was the last. Under mu. */
static void buffer_done(struct sn_comm* c) {
  struct sn_req* r = &c->reqs[c->cur_seq % SN_NREQS];
  r->filled[c->cur] = 1;
  r->got[c->cur] = (size_t)c->cur_size;
  c->cur = -1;
  if (++r->nfilled == r->n) r->done = 1;
  while (c->prog_seq < c->post_seq && c->reqs[c->prog_seq % SN_NREQS].done) c->prog_seq++;
}

/* Reads messages into the posted receives while the socket has data (and some receive waits). Under mu. */
static ncclResult_t progress_recv(struct sn_comm* c) {
  ncclResult_t rc = ncclSuccess;
  while (c->prog_seq < c->post_seq) {
    if (c->cur < 0 && c->hdr_got == SN_MSG_BYTES) {
      int m = match_header(c, &rc);
      if (m <= 0) return rc; /* failed, or the message is a receive's not posted yet */
      if (c->cur_size == 0) {
        buffer_done(c);
        continue;
      }
    }
    void* dst;
    size_t want;
    if (c->cur < 0) {
      dst = c->hdr + c->hdr_got, want = SN_MSG_BYTES - c->hdr_got;
    } else {
      struct sn_req* r = &c->reqs[c->cur_seq % SN_NREQS];
      dst = (char*)r->data[c->cur] + c->cur_off, want = (size_t)(c->cur_size - c->cur_off);
    }
    size_t got;
    if (c->carry_off < c->carry_len) { /* read ahead already */
      got = UT_MIN(want, c->carry_len - c->carry_off);
      memcpy(dst, c->carry + c->carry_off, got);
      c->carry_off += got;
    } else {
      int ahead = want < SN_CARRY; /* small: into the carry, with whatever follows */
      ssize_t r = recv(c->fd, ahead ? c->carry : dst, ahead ? SN_CARRY : want, MSG_DONTWAIT);
      if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return ncclSuccess;
      if (r < 0 && errno == EINTR) continue;
      if (r == 0) return comm_fail(c, ncclRemoteError, "receive", "the connection was closed by the peer");
      if (r < 0) return comm_fail(c, ncclRemoteError, "receive", strerror(errno));
      if (ahead) {
        c->carry_off = 0, c->carry_len = (size_t)r;
        continue;
      }
      got = (size_t)r;
    }
    if (c->cur < 0) {
      c->hdr_got += got;
    } else if ((c->cur_off += got) == c->cur_size) {
      buffer_done(c);
    }
  }
  return ncclSuccess;
}

/* A free slot for the next request, or NULL ("not now": the one s - SN_NREQS is not yet tested). */
static struct sn_req* req_take(struct sn_comm* c) {
  struct sn_req* r = &c->reqs[c->post_seq % SN_NREQS];
  if (r->in_use) return NULL;
  memset(&r->n, 0, sizeof(*r) - offsetof(struct sn_req, n));
  r->in_use = 1, r->done = 0;
  return r;
}

static ncclResult_t sn_isend(void* sendComm, void* data, size_t size, int tag, void* mhandle, void* phandle,
                             void** request) {
  (void)mhandle, (void)phandle;
  *request = NULL;
  struct sn_comm* c = comm_check(sendComm, SN_SEND, "isend");
  if (!c) return ncclInvalidArgument;
  if (size && !data) {
    WARN("NET/Socket: isend of %zu bytes from NULL", size);
    return ncclInvalidArgument;
  }
  pthread_mutex_lock(&c->mu);
  ncclResult_t rc = c->failed;
  struct sn_req* r = rc == ncclSuccess ? req_take(c) : NULL;
  if (r) {
    r->n = 1, r->data[0] = data, r->cap[0] = size, r->tag[0] = tag;
    sn_msg_encode(tag, size, r->hdr);
    c->post_seq++;
    rc = progress_send(c);
    *request = r;
  }
  pthread_mutex_unlock(&c->mu);
  return rc;
}

static ncclResult_t sn_irecv(void* recvComm, int n, void** data, size_t* sizes, int* tags, void** mhandles,
                             void** phandles, void** request) {
  (void)mhandles, (void)phandles;
  *request = NULL;
  struct sn_comm* c = comm_check(recvComm, SN_RECV, "irecv");
  if (!c) return ncclInvalidArgument;
  if (n < 1 || n > SN_MAX_RECVS) {
    WARN("NET/Socket: irecv of %d buffers (1 to %d)", n, SN_MAX_RECVS);
    return ncclInvalidArgument;
  }
  for (int i = 0; i < n; i++)
    if (sizes[i] && !data[i]) {
      WARN("NET/Socket: irecv of %zu bytes into NULL", sizes[i]);
      return ncclInvalidArgument;
    }
  pthread_mutex_lock(&c->mu);
  ncclResult_t rc = c->failed;
  struct sn_req* r = rc == ncclSuccess ? req_take(c) : NULL;
  if (r) {
    r->n = n;
    for (int i = 0; i < n; i++) r->data[i] = data[i], r->cap[i] = sizes[i], r->tag[i] = tags[i];
    c->post_seq++;
    rc = progress_recv(c);
    *request = r;
  }
  pthread_mutex_unlock(&c->mu);
  return rc;
}

static ncclResult_t sn_iflush(void* recvComm, int n, void** data, int* sizes, void** mhandles, void** request) {
  (void)recvComm, (void)n, (void)data, (void)sizes, (void)mhandles;
  *request = &sn_flush_req; /* host memory: nothing to flush */
  return ncclSuccess;
}

static ncclResult_t sn_test(void* request, int* done, int* sizes) {
  *done = 0;
  struct sn_req* r = request;
  if (r == &sn_flush_req) {
    *done = 1;
    return ncclSuccess;
  }
  struct sn_comm* c = r ? r->comm : NULL;
  if (!c || c->magic != SN_COMM_MAGIC || c->kind == SN_LISTEN || r < c->reqs || r >= c->reqs + SN_NREQS ||
      !r->in_use) {
    WARN("NET/Socket: test of %p, which is not a request in flight", request);
    return ncclInvalidArgument;
  }
  pthread_mutex_lock(&c->mu);
  ncclResult_t rc = c->failed;
  if (rc == ncclSuccess && !r->done) rc = c->kind == SN_SEND ? progress_send(c) : progress_recv(c);
  if (r->done) {
    *done = 1;
    if (sizes)
      for (int i = 0; i < r->n; i++) sizes[i] = (int)(r->got[i] > (size_t)INT32_MAX ? INT32_MAX : r->got[i]);
    if (sizes && c->kind == SN_SEND) sizes[0] = (int)(r->cap[0] > (size_t)INT32_MAX ? INT32_MAX : r->cap[0]);
    r->in_use = 0;
    rc = ncclSuccess; /* a request that completed before the failure did complete */
  }
  pthread_mutex_unlock(&c->mu);
  return rc;
}

static ncclResult_t close_comm(void* comm, int kind, const char* fn) {
  struct sn_comm* c = comm_check(comm, kind, fn);
  if (!c) return ncclInvalidArgument;
  comm_free(c);
  return ncclSuccess;
}

static ncclResult_t sn_close_send(void* c) { return close_comm(c, SN_SEND, "closeSend"); }
static ncclResult_t sn_close_recv(void* c) { return close_comm(c, SN_RECV, "closeRecv"); }
static ncclResult_t sn_close_listen(void* c) { return close_comm(c, SN_LISTEN, "closeListen"); }

static ncclResult_t sn_finalize(void* ctx) {
  struct sn_ctx* x = ctx;
  if (x && x->magic != SN_CTX_MAGIC) {
    WARN("NET/Socket: finalize of %p, which is not a context of this network", ctx);
    return ncclInvalidArgument;
  }
  /* This context's connects never finished: their callers are gone (a communicator's connects all
   * come from the thread that finalizes it, so none is in a connect call now). */
  pthread_mutex_lock(&sn_mu);
  for (struct sn_comm** pp = &sn_connecting; *pp;) {
    struct sn_comm* c = *pp;
    if (c->ctx != ctx) {
      pp = &c->next;
      continue;
    }
    *pp = c->next;
    comm_free(c);
  }
  pthread_mutex_unlock(&sn_mu);
  if (x) {
    x->magic = 0;
    free(x);
  }
  return ncclSuccess;
}

const ncclNet_v12_t ch_sock_net = {
    .name = "Socket",
    .init = sn_init,
    .devices = sn_devices,
    .getProperties = sn_get_properties,
    .listen = sn_listen,
    .connect = sn_connect,
    .accept = sn_accept,
    .regMr = sn_reg_mr,
    .regMrDmaBuf = NULL,
    .deregMr = sn_dereg_mr,
    .isend = sn_isend,
    .irecv = sn_irecv,
    .iflush = sn_iflush,
    .test = sn_test,
    .closeSend = sn_close_send,
    .closeRecv = sn_close_recv,
    .closeListen = sn_close_listen,
    .getDeviceMr = NULL,
    .irecvConsumed = NULL,
    .makeVDevice = NULL,
    .finalize = sn_finalize,
    .setNetAttr = NULL,
};
