/* TCP sockets. Every descriptor is nonblocking; waits are poll() slices of at most 100 ms so the
 * abort flag and the deadline are seen promptly, and nothing can hang forever. */
#define _GNU_SOURCE /* accept4 */
#include <arpa/inet.h>
#include <errno.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netdb.h>
#include <netinet/tcp.h>
#include <linux/inet_diag.h>
#include <linux/sockios.h>
#include <linux/netlink.h>
#include <linux/sock_diag.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <time.h>
#include <unistd.h>

#include "log.h"
#include "param.h"
#include "socket.h"
#include "utils.h"

#define SOCK_SLICE_MS 100
#define SOCK_BACKLOG 16384

static socklen_t addr_len(const union sock_addr* a) {
  return a->sa.sa_family == AF_INET6 ? sizeof(struct sockaddr_in6) : sizeof(struct sockaddr_in);
}

int sock_addr_port(const union sock_addr* a) {
  if (a->sa.sa_family == AF_INET) return ntohs(a->sin.sin_port);
  if (a->sa.sa_family == AF_INET6) return ntohs(a->sin6.sin6_port);
  return 0;
}

const char* sock_addr_str(const union sock_addr* a, char* buf, size_t len) {
  char ip[INET6_ADDRSTRLEN] = "?";
  if (a->sa.sa_family == AF_INET) {
    inet_ntop(AF_INET, &a->sin.sin_addr, ip, sizeof(ip));
    snprintf(buf, len, "%s:%d", ip, sock_addr_port(a));
  } else if (a->sa.sa_family == AF_INET6) {
    inet_ntop(AF_INET6, &a->sin6.sin6_addr, ip, sizeof(ip));
    char scope[IF_NAMESIZE + 2] = "";
    char name[IF_NAMESIZE];
    if (a->sin6.sin6_scope_id && if_indextoname(a->sin6.sin6_scope_id, name)) snprintf(scope, sizeof(scope), "%%%s", name);
    snprintf(buf, len, "[%s%s]:%d", ip, scope, sock_addr_port(a));
  } else {
    snprintf(buf, len, "(no address)");
  }
  return buf;
}

static int parse_port(const char* s, int* port) {
  if (!*s) return -1;
  char* end;
  long v = strtol(s, &end, 10);
  if (*end || v < 0 || v > 65535) return -1;
  *port = (int)v;
  return 0;
}

ch_status sock_parse_addr(const char* str, union sock_addr* out) {
  char host[256];
  const char* port_str;
  memset(out, 0, sizeof(*out));
  if (str[0] == '[') {
    const char* close = strchr(str, ']');
    if (!close || close[1] != ':' || (size_t)(close - str - 1) >= sizeof(host)) goto bad;
    memcpy(host, str + 1, (size_t)(close - str - 1));
    host[close - str - 1] = '\0';
    port_str = close + 2;
  } else {
    const char* colon = strrchr(str, ':');
    if (!colon || colon != strchr(str, ':') || (size_t)(colon - str) >= sizeof(host)) goto bad; /* bare IPv6 */
    memcpy(host, str, (size_t)(colon - str));
    host[colon - str] = '\0';
    port_str = colon + 1;
  }
  int port;
  if (!host[0] || parse_port(port_str, &port) != 0) goto bad;

  char* pct = strchr(host, '%'); /* fe80::1%eth0 */
  unsigned scope = 0;
  if (pct) {
    *pct = '\0';
    scope = if_nametoindex(pct + 1);
  }
  if (inet_pton(AF_INET, host, &out->sin.sin_addr) == 1) {
    out->sin.sin_family = AF_INET;
    out->sin.sin_port = htons((uint16_t)port);
    return CH_OK;
  }
  if (inet_pton(AF_INET6, host, &out->sin6.sin6_addr) == 1) {
    out->sin6.sin6_family = AF_INET6;
    out->sin6.sin6_port = htons((uint16_t)port);
    out->sin6.sin6_scope_id = scope;
    return CH_OK;
  }
  struct addrinfo hints = {0}, *res = NULL;
  hints.ai_socktype = SOCK_STREAM;
  const char* fam = param_str(PARAM_SOCKET_FAMILY);
  hints.ai_family = !strcmp(fam, "AF_INET") ? AF_INET : !strcmp(fam, "AF_INET6") ? AF_INET6 : AF_UNSPEC;
  int rc = getaddrinfo(host, NULL, &hints, &res);
  if (rc != 0 || !res) {
    WARN("Cannot resolve host \"%s\" (from \"%s\"): %s", host, str, rc ? gai_strerror(rc) : "no address");
    return CH_INVALID_ARG;
  }
  memcpy(out, res->ai_addr, res->ai_addrlen <= sizeof(*out) ? res->ai_addrlen : sizeof(*out));
  freeaddrinfo(res);
  if (out->sa.sa_family == AF_INET) out->sin.sin_port = htons((uint16_t)port);
  else out->sin6.sin6_port = htons((uint16_t)port);
  return CH_OK;
bad:
  WARN("Invalid address \"%s\": expected ipv4:port, [ipv6]:port or hostname:port", str);
  return CH_INVALID_ARG;
}

ch_status sock_wait_check(const struct sock_wait* w) {
  if (!w) return CH_OK;
  if (w->abort && __atomic_load_n(w->abort, __ATOMIC_ACQUIRE)) return CH_ABORTED;
  if (w->deadline_ns && ut_now_ns() >= w->deadline_ns) return CH_TIMEOUT;
  return CH_OK;
}

int sock_wait_slice_ms(const struct sock_wait* w) {
  if (!w || !w->deadline_ns) return SOCK_SLICE_MS;
  uint64_t now = ut_now_ns();
  if (now >= w->deadline_ns) return 0;
  uint64_t ms = UT_DIV_UP(w->deadline_ns - now, UT_NS_PER_MS);
  return ms < SOCK_SLICE_MS ? (int)ms : SOCK_SLICE_MS;
}

/* Wait until fd is ready for `events`, the deadline passes or abort is set. */
static ch_status wait_fd(int fd, short events, const struct sock_wait* w) {
  for (;;) {
    CHECK(sock_wait_check(w));
    struct pollfd p = {fd, events, 0};
    int r = poll(&p, 1, sock_wait_slice_ms(w));
    if (r > 0) return CH_OK;
    if (r < 0 && errno != EINTR) {
      WARN("poll failed: %s", strerror(errno));
      return CH_SYSTEM;
    }
  }
}

/* Sleep ms milliseconds, in slices, unless the deadline or abort comes first. */
static ch_status sleep_ms(uint64_t ms, const struct sock_wait* w) {
  uint64_t end = ut_now_ns() + ms * UT_NS_PER_MS;
  for (;;) {
    CHECK(sock_wait_check(w));
    uint64_t now = ut_now_ns();
    if (now >= end) return CH_OK;
    uint64_t left = end - now;
    if (left > SOCK_SLICE_MS * UT_NS_PER_MS) left = SOCK_SLICE_MS * UT_NS_PER_MS;
    struct timespec ts = {(time_t)(left / UT_NS_PER_S), (long)(left % UT_NS_PER_S)};
    nanosleep(&ts, NULL);
  }
}

void sock_set_nodelay(int fd) {
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
}

/* A connection its peer reset (the peer died) is CLOSED with its unacknowledged count frozen above 0:
 * it will never drain, so it counts as nothing in flight. */
int sock_unacked(int fd) {
  int n = 0;
  struct tcp_info ti;
  socklen_t len = sizeof(ti);
  if (fd < 0 || ioctl(fd, SIOCOUTQ, &n) != 0 || n <= 0) return 0;
  if (getsockopt(fd, IPPROTO_TCP, TCP_INFO, &ti, &len) == 0 && ti.tcpi_state == TCP_CLOSE) return 0;
  return n;
}

ch_status sock_listen(const union sock_addr* addr, struct sock* s) {
  char a[64];
  s->fd = -1;
  int fd = socket(addr->sa.sa_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd < 0) {
    WARN("socket() for listening on %s failed: %s", sock_addr_str(addr, a, sizeof(a)), strerror(errno));
    return CH_SYSTEM;
  }
  if (sock_addr_port(addr) != 0) { /* a fixed port (NCCL_COMM_ID) must be reusable right after a job */
    int one = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  }
  union sock_addr bound = *addr;
  socklen_t len = addr_len(addr);
  if (bind(fd, &bound.sa, len) != 0) {
    int e = errno;
    WARN("Cannot listen on %s: bind failed: %s%s", sock_addr_str(addr, a, sizeof(a)), strerror(e),
         e == EADDRINUSE ? " (another process, or an earlier job, holds this port)" : "");
    close(fd);
    return CH_SYSTEM;
  }
  if (listen(fd, SOCK_BACKLOG) != 0 || getsockname(fd, &bound.sa, &len) != 0) {
    WARN("listen on %s failed: %s", sock_addr_str(addr, a, sizeof(a)), strerror(errno));
    close(fd);
    return CH_SYSTEM;
  }
  s->fd = fd;
  s->addr = bound;
  return CH_OK;
}

static int accept_transient(int e) {
  return e == EAGAIN || e == EWOULDBLOCK || e == EINTR || e == ECONNABORTED || e == ENETDOWN || e == EPROTO ||
         e == ENOPROTOOPT || e == EHOSTDOWN || e == ENONET || e == EHOSTUNREACH || e == EOPNOTSUPP ||
         e == ENETUNREACH;
}

ch_status sock_accept(struct sock* listener, struct sock* out, const struct sock_wait* w) {
  out->fd = -1;
  for (;;) {
    socklen_t len = sizeof(out->addr);
    int fd = accept4(listener->fd, &out->addr.sa, &len, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd >= 0) {
      sock_set_nodelay(fd);
      out->fd = fd;
      return CH_OK;
    }
    if (!accept_transient(errno)) {
      char a[64];
      WARN("accept on %s failed: %s", sock_addr_str(&listener->addr, a, sizeof(a)), strerror(errno));
      return CH_SYSTEM;
    }
    CHECK(wait_fd(listener->fd, POLLIN, w));
  }
}

static int connect_transient(int e) {
  return e == ECONNREFUSED || e == ETIMEDOUT || e == EHOSTUNREACH || e == ENETUNREACH || e == EAGAIN ||
         e == EINTR || e == ECONNRESET || e == ECONNABORTED;
}

/* One connection attempt: 0 and *fd_out on success, else the errno of the failure. */
static int connect_once(const union sock_addr* addr, int* fd_out, const struct sock_wait* w, ch_status* st) {
  *st = CH_OK;
  int fd = socket(addr->sa.sa_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd < 0) return errno;
  sock_set_nodelay(fd);
  int err = 0;
  if (connect(fd, &addr->sa, addr_len(addr)) != 0) {
    err = errno;
    if (err == EINPROGRESS) {
      *st = wait_fd(fd, POLLOUT, w);
      if (*st != CH_OK) {
        close(fd);
        return ETIMEDOUT;
      }
      socklen_t len = sizeof(err);
      if (getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len) != 0) err = errno;
    }
  }
  if (err) {
    close(fd);
    return err;
  }
  *fd_out = fd;
  return 0;
}

ch_status sock_connect(const union sock_addr* addr, struct sock* out, const struct sock_wait* w) {
  char a[64];
  int64_t max_retries = param_int(PARAM_SOCKET_RETRY_CNT);
  int64_t step_ms = param_int(PARAM_SOCKET_RETRY_SLEEP_MSEC);
  if (step_ms < 1) step_ms = 1;
  uint64_t start = ut_now_ns();
  int attempts = 0, retries = 0;
  uint64_t probe_ms = 1;
  out->fd = -1;
  for (;;) {
    CHECK(sock_wait_check(w));
    int fd = -1;
    ch_status st;
    attempts++;
    int err = connect_once(addr, &fd, w, &st);
    if (st != CH_OK) return st; /* deadline or abort while the connect was in flight */
    if (err == 0) {
      out->fd = fd;
      out->addr = *addr;
      if (attempts > 1)
        INFO(LOG_BOOTSTRAP | LOG_NET, "Connected to %s after %d attempts", sock_addr_str(addr, a, sizeof(a)), attempts);
      return CH_OK;
    }
    if (!connect_transient(err)) {
      WARN("connect to %s failed: %s", sock_addr_str(addr, a, sizeof(a)), strerror(err));
      return CH_SYSTEM;
    }
    /* The peer is usually about to listen: probe quickly (1, 2, 4 ... ms) during the first retry
     * step, then back off linearly like NCCL (k * NCCL_SOCKET_RETRY_SLEEP_MSEC). */
    uint64_t elapsed_ms = (ut_now_ns() - start) / UT_NS_PER_MS;
    uint64_t sleep;
    if (elapsed_ms < (uint64_t)step_ms) {
      sleep = probe_ms;
      probe_ms *= 2;
    } else {
      if (retries >= max_retries) {
        WARN("connect to %s failed: %s (gave up after %d attempts in %.1f s)", sock_addr_str(addr, a, sizeof(a)),
             strerror(err), attempts, (double)(ut_now_ns() - start) / UT_NS_PER_S);
        return CH_REMOTE;
      }
      retries++;
      sleep = (uint64_t)(retries * step_ms);
      if (retries == 1 || retries % 10 == 0)
        INFO(LOG_BOOTSTRAP | LOG_NET, "connect to %s returned %s, retrying", sock_addr_str(addr, a, sizeof(a)),
             strerror(err));
    }
    CHECK(sleep_ms(sleep, w));
  }
}

ch_status sock_connect_brief(const union sock_addr* addr, struct sock* out, const struct sock_wait* w,
                             uint64_t give_up_ms, int* err) {
  uint64_t end = ut_now_ns() + give_up_ms * UT_NS_PER_MS, sleep = 1;
  out->fd = -1;
  *err = 0;
  for (;;) {
    CHECK(sock_wait_check(w));
    int fd = -1;
    ch_status st;
    int e = connect_once(addr, &fd, w, &st);
    if (st != CH_OK) return st;
    if (e == 0) {
      out->fd = fd;
      out->addr = *addr;
      return CH_OK;
    }
    *err = e;
    if (!connect_transient(e) || ut_now_ns() >= end) return CH_REMOTE;
    CHECK(sleep_ms(sleep, w));
    if (sleep < 100) sleep *= 2;
  }
}

int sock_addr_is_local(const union sock_addr* a) {
  if (sock_addr_is_loopback(a)) return 1;
  struct ifaddrs* list = NULL;
  if (getifaddrs(&list) != 0) return 1; /* cannot tell: treat as local, so the stricter check applies */
  int local = 0;
  for (struct ifaddrs* i = list; i && !local; i = i->ifa_next) {
    if (!i->ifa_addr || i->ifa_addr->sa_family != a->sa.sa_family) continue;
    if (a->sa.sa_family == AF_INET)
      local = ((struct sockaddr_in*)i->ifa_addr)->sin_addr.s_addr == a->sin.sin_addr.s_addr;
    else
      local = !memcmp(&((struct sockaddr_in6*)i->ifa_addr)->sin6_addr, &a->sin6.sin6_addr, 16);
  }
  freeifaddrs(list);
  return local;
}

/* /proc/net/tcp prints each address as native-endian 32-bit words of the network-order bytes. */
static int proc_addr_eq(const char* hex, unsigned port, const union sock_addr* a) {
  if (port != (unsigned)sock_addr_port(a)) return 0;
  size_t n = a->sa.sa_family == AF_INET ? 4 : 16;
  if (strlen(hex) != 2 * n) return 0;
  const unsigned char* bytes = a->sa.sa_family == AF_INET ? (const unsigned char*)&a->sin.sin_addr
                                                          : (const unsigned char*)&a->sin6.sin6_addr;
  for (size_t w = 0; w < n / 4; w++) {
    char word[9];
    memcpy(word, hex + 8 * w, 8);
    word[8] = '\0';
    uint32_t v = (uint32_t)strtoul(word, NULL, 16), mine;
    memcpy(&mine, bytes + 4 * w, 4);
    if (v != mine) return 0;
  }
  return 1;
}

/* The owner of the TCP socket whose local end is `src` and remote end `dst`, asked of the kernel by
 * its 4-tuple (sock_diag, one hash lookup): a scan of /proc/net/tcp costs time in proportion to every
 * socket of the host, which a flood of connections makes long. -1 where netlink is not available (the
 * caller scans instead) or no such socket exists. */
static int diag_uid(const union sock_addr* src, const union sock_addr* dst, uid_t* uid) {
  int fam = src->sa.sa_family;
  if ((fam != AF_INET && fam != AF_INET6) || dst->sa.sa_family != fam) return -1;
  int nl = socket(AF_NETLINK, SOCK_DGRAM | SOCK_CLOEXEC, NETLINK_SOCK_DIAG);
  if (nl < 0) return -1;
  struct {
    struct nlmsghdr h;
    struct inet_diag_req_v2 r;
  } q;
  memset(&q, 0, sizeof(q));
  q.h.nlmsg_len = sizeof(q);
  q.h.nlmsg_type = SOCK_DIAG_BY_FAMILY;
  q.h.nlmsg_flags = NLM_F_REQUEST; /* no NLM_F_DUMP: one socket, found by its 4-tuple */
  q.r.sdiag_family = (uint8_t)fam;
  q.r.sdiag_protocol = IPPROTO_TCP;
  q.r.idiag_states = ~0u;
  q.r.id.idiag_cookie[0] = q.r.id.idiag_cookie[1] = INET_DIAG_NOCOOKIE;
  if (fam == AF_INET) {
    q.r.id.idiag_sport = src->sin.sin_port, q.r.id.idiag_dport = dst->sin.sin_port;
    memcpy(q.r.id.idiag_src, &src->sin.sin_addr, 4), memcpy(q.r.id.idiag_dst, &dst->sin.sin_addr, 4);
  } else {
    q.r.id.idiag_sport = src->sin6.sin6_port, q.r.id.idiag_dport = dst->sin6.sin6_port;
    memcpy(q.r.id.idiag_src, &src->sin6.sin6_addr, 16), memcpy(q.r.id.idiag_dst, &dst->sin6.sin6_addr, 16);
  }
  struct sockaddr_nl kernel = {.nl_family = AF_NETLINK};
  struct timeval tv = {1, 0}; /* the kernel answers at once; never wait longer than this */
  setsockopt(nl, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  int found = -1;
  union {
    struct nlmsghdr h;
    char buf[1024];
  } a;
  if (sendto(nl, &q, sizeof(q), 0, (struct sockaddr*)&kernel, sizeof(kernel)) == (ssize_t)sizeof(q)) {
    ssize_t n = recv(nl, &a, sizeof(a), 0);
    /* The answer is the kernel's (a netlink socket takes nothing from other processes unasked), but
     * its lengths are still checked before the record is read. */
    if (n >= (ssize_t)NLMSG_LENGTH(sizeof(struct inet_diag_msg)) && a.h.nlmsg_type == SOCK_DIAG_BY_FAMILY &&
        a.h.nlmsg_len <= (size_t)n && a.h.nlmsg_len >= NLMSG_LENGTH(sizeof(struct inet_diag_msg))) {
      const struct inet_diag_msg* m = NLMSG_DATA(&a.h);
      *uid = (uid_t)m->idiag_uid;
      found = 0;
    }
  }
  close(nl);
  return found;
}

int sock_peer_uid(int fd, uid_t* uid) {
  union sock_addr me, peer;
  socklen_t l1 = sizeof(me), l2 = sizeof(peer);
  memset(&me, 0, sizeof(me));
  memset(&peer, 0, sizeof(peer));
  if (getsockname(fd, &me.sa, &l1) != 0 || getpeername(fd, &peer.sa, &l2) != 0) return -1;
  if (me.sa.sa_family != peer.sa.sa_family) return -1;
  /* The other end's socket: its local address is our peer and its remote address is us. */
  if (diag_uid(&peer, &me, uid) == 0) return 0;
  FILE* f = fopen(me.sa.sa_family == AF_INET ? "/proc/net/tcp" : "/proc/net/tcp6", "r");
  if (!f) return -1;
  char line[512];
  int found = -1;
  while (found < 0 && fgets(line, sizeof(line), f)) {
    char la[40], ra[40];
    unsigned lp, rp, st, u;
    /* sl local rem st tx:rx tr:when retrnsmt uid */
    if (sscanf(line, " %*d: %39[0-9A-Fa-f]:%x %39[0-9A-Fa-f]:%x %x %*x:%*x %*x:%*x %*x %u", la, &lp, ra, &rp, &st,
               &u) != 6)
      continue;
    /* The other end's socket: its local address is our peer and its remote address is us. */
    if (proc_addr_eq(la, lp, &peer) && proc_addr_eq(ra, rp, &me)) {
      *uid = (uid_t)u;
      found = 0;
    }
  }
  fclose(f);
  return found;
}

int sock_peer_uids(const int* fds, int n, uid_t* uids, unsigned char* found) {
  int nfound = 0;
  union sock_addr* ends = calloc((size_t)n * 2, sizeof(*ends)); /* [2i] ours, [2i+1] the peer's */
  if (!ends) return 0;
  for (int i = 0; i < n; i++) {
    socklen_t l1 = sizeof(ends[0]), l2 = sizeof(ends[0]);
    found[i] = 0;
    if (getsockname(fds[i], &ends[2 * i].sa, &l1) != 0 || getpeername(fds[i], &ends[2 * i + 1].sa, &l2) != 0)
      ends[2 * i].sa.sa_family = AF_UNSPEC;
  }
  /* Asked of the kernel one by one (sock_diag, a hash lookup each); what it cannot answer is looked
   * for in one pass over each table, whatever n is: a flood's sockets make it long. */
  for (int i = 0; i < n; i++)
    if (ends[2 * i].sa.sa_family != AF_UNSPEC && diag_uid(&ends[2 * i + 1], &ends[2 * i], &uids[i]) == 0)
      found[i] = 1, nfound++;
  for (int t = 0; t < 2 && nfound < n; t++) {
    FILE* f = fopen(t == 0 ? "/proc/net/tcp" : "/proc/net/tcp6", "r");
    if (!f) continue;
    char line[512];
    while (nfound < n && fgets(line, sizeof(line), f)) {
      char la[40], ra[40];
      unsigned lp, rp, st, u;
      if (sscanf(line, " %*d: %39[0-9A-Fa-f]:%x %39[0-9A-Fa-f]:%x %x %*x:%*x %*x:%*x %*x %u", la, &lp, ra, &rp, &st,
                 &u) != 6)
        continue;
      for (int i = 0; i < n; i++) {
        const union sock_addr *me = &ends[2 * i], *peer = &ends[2 * i + 1];
        if (found[i] || me->sa.sa_family != (t == 0 ? AF_INET : AF_INET6) || sock_addr_port(peer) != (int)lp) continue;
        if (proc_addr_eq(la, lp, peer) && proc_addr_eq(ra, rp, me)) {
          uids[i] = (uid_t)u;
          found[i] = 1;
          nfound++;
          break;
        }
      }
    }
    fclose(f);
  }
  free(ends);
  return nfound;
}

ch_status sock_send_all(struct sock* s, const void* buf, size_t n, const struct sock_wait* w) {
  const char* p = buf;
  char a[64];
  while (n > 0) {
    ssize_t r = send(s->fd, p, n, MSG_NOSIGNAL);
    if (r > 0) {
      p += r;
      n -= (size_t)r;
      continue;
    }
    if (r < 0 && errno == EINTR) continue;
    if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      CHECK(wait_fd(s->fd, POLLOUT, w));
      continue;
    }
    if (r < 0 && (errno == EPIPE || errno == ECONNRESET)) {
      WARN("Connection closed by remote peer %s", sock_addr_str(&s->addr, a, sizeof(a)));
      return CH_REMOTE;
    }
    WARN("send to %s failed: %s", sock_addr_str(&s->addr, a, sizeof(a)), r < 0 ? strerror(errno) : "no progress");
    return CH_REMOTE;
  }
  return CH_OK;
}

ch_status sock_recv_all(struct sock* s, void* buf, size_t n, const struct sock_wait* w) {
  char* p = buf;
  char a[64];
  while (n > 0) {
    ssize_t r = recv(s->fd, p, n, 0);
    if (r > 0) {
      p += r;
      n -= (size_t)r;
      continue;
    }
    if (r == 0 || (r < 0 && errno == ECONNRESET)) {
      WARN("Connection closed by remote peer %s", sock_addr_str(&s->addr, a, sizeof(a)));
      return CH_REMOTE;
    }
    if (errno == EINTR) continue;
    if (errno == EAGAIN || errno == EWOULDBLOCK) {
      CHECK(wait_fd(s->fd, POLLIN, w));
      continue;
    }
    WARN("recv from %s failed: %s", sock_addr_str(&s->addr, a, sizeof(a)), strerror(errno));
    return CH_REMOTE;
  }
  return CH_OK;
}

void sock_close(struct sock* s) {
  if (s->fd >= 0) close(s->fd);
  s->fd = -1;
}

/* Rejections are remembered per host address (not port: scanners vary it). */
#define REJECT_SLOTS 32
#define REJECT_QUIET_NS (60ull * UT_NS_PER_S)
static pthread_mutex_t reject_lock = PTHREAD_MUTEX_INITIALIZER;
static struct {
  unsigned char addr[16];
  int family;
  uint64_t last;
} rejects[REJECT_SLOTS]; /* under reject_lock */

void sock_warn_reject(const char* who, const union sock_addr* remote, const char* why) {
  unsigned char a[16] = {0};
  int fam = remote->sa.sa_family;
  if (fam == AF_INET) memcpy(a, &remote->sin.sin_addr, 4);
  else if (fam == AF_INET6) memcpy(a, &remote->sin6.sin6_addr, 16);
  uint64_t now = ut_now_ns();
  int loud = 1;
  pthread_mutex_lock(&reject_lock);
  int slot = -1, oldest = 0;
  for (int i = 0; i < REJECT_SLOTS; i++) {
    if (rejects[i].family == fam && !memcmp(rejects[i].addr, a, 16)) slot = i;
    if (rejects[i].last < rejects[oldest].last) oldest = i;
  }
  if (slot >= 0 && rejects[slot].last && now - rejects[slot].last < REJECT_QUIET_NS) loud = 0;
  if (slot < 0) slot = oldest;
  if (loud) {
    memcpy(rejects[slot].addr, a, 16);
    rejects[slot].family = fam;
    rejects[slot].last = now;
  }
  pthread_mutex_unlock(&reject_lock);
  char s[64];
  sock_addr_str(remote, s, sizeof(s));
  if (loud) WARN("%s: rejected a connection from %s: %s (further rejections from this host for 60 s are logged at INFO)",
                 who, s, why);
  else INFO(LOG_BOOTSTRAP | LOG_NET, "%s: rejected a connection from %s: %s", who, s, why);
}

void sock_tune_link(int fd) {
  int64_t b = param_int(PARAM_NET_SOCKBUF_BYTES);
  if (b > 0) { /* autotuning otherwise: an explicit size switches it off */
    int v = (int)(b > (1 << 30) ? (1 << 30) : b);
    setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &v, sizeof(v));
    setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &v, sizeof(v));
  }
  /* A cut link gives no EOF: the sender's unacknowledged data (TCP_USER_TIMEOUT) or the receiver's
   * unanswered keepalive probes turn it into ETIMEDOUT, hence a failure, in bounded time. A peer
   * host that is alive acknowledges both, however long its rank takes. */
  int64_t ms = param_int(PARAM_NET_LINK_TIMEOUT_MS);
  if (ms > 0) {
    unsigned ut = (unsigned)(ms > 3600000 ? 3600000 : ms);
    int on = 1, idle = (int)UT_MAX(1, ut / 4000), intvl = (int)UT_MAX(1, ut / 8000), cnt = 4;
    setsockopt(fd, IPPROTO_TCP, TCP_USER_TIMEOUT, &ut, sizeof(ut));
    setsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &on, sizeof(on));
    setsockopt(fd, IPPROTO_TCP, TCP_KEEPIDLE, &idle, sizeof(idle));
    setsockopt(fd, IPPROTO_TCP, TCP_KEEPINTVL, &intvl, sizeof(intvl));
    setsockopt(fd, IPPROTO_TCP, TCP_KEEPCNT, &cnt, sizeof(cnt));
  }
}
