/* Which network interface the bootstrap and socket transport use, with NCCL's rules:
 * NCCL_SOCKET_IFNAME is a comma list of name prefixes ("eth,ib"), "^" excludes ("^docker,lo"),
 * "=" asks for exact names ("=eth0"; "^=docker0" combines both); NCCL_SOCKET_FAMILY keeps only
 * AF_INET or AF_INET6. Without NCCL_SOCKET_IFNAME, a rank joining a root uses the interface its
 * route to the root leaves by (what the kernel would pick; a UDP connect sends nothing); failing
 * that: ib*, then the interface in the same subnet as the root address, then anything but docker*,
 * lo, virbr*, then docker*, then lo, then virbr*. */
#include <arpa/inet.h>
#include <errno.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "log.h"
#include "param.h"
#include "socket.h"

#define IF_MAX 128 /* (interface, address) entries */
#define IF_LIST_MAX 16

struct if_list {
  int exclude, exact, n;
  char prefix[IF_LIST_MAX][IF_NAMESIZE + 1];
};

static void if_list_parse(const char* s, struct if_list* l) {
  memset(l, 0, sizeof(*l));
  if (*s == '^') { l->exclude = 1; s++; }
  if (*s == '=') { l->exact = 1; s++; }
  while (*s && l->n < IF_LIST_MAX) {
    size_t len = strcspn(s, ",");
    size_t name_len = strcspn(s, ",:"); /* "eth0:port" entries: the port part is not ours */
    if (name_len > IF_NAMESIZE) name_len = IF_NAMESIZE;
    if (name_len > 0) {
      memcpy(l->prefix[l->n], s, name_len);
      l->prefix[l->n][name_len] = '\0';
      l->n++;
    }
    s += len;
    if (*s == ',') s++;
  }
}

static int if_list_match(const struct if_list* l, const char* name) {
  if (l->n == 0) return 1;
  int found = 0;
  for (int i = 0; i < l->n && !found; i++)
    found = l->exact ? strcmp(name, l->prefix[i]) == 0 : strncmp(name, l->prefix[i], strlen(l->prefix[i])) == 0;
  return l->exclude ? !found : found;
}

static int family_wanted(int family) {
  const char* f = param_str(PARAM_SOCKET_FAMILY);
  if (!strcmp(f, "AF_INET")) return family == AF_INET;
  if (!strcmp(f, "AF_INET6")) return family == AF_INET6;
  return 1; /* other strings are ignored, as in NCCL */
}

/* 0 IPv4, 1 global IPv6, 2 link-local IPv6 (needs a scope; a last resort). */
static int addr_class(const union sock_addr* a) {
  if (a->sa.sa_family == AF_INET) return 0;
  return IN6_IS_ADDR_LINKLOCAL(&a->sin6.sin6_addr) ? 2 : 1;
}

/* Up interfaces and their IPv4/IPv6 addresses, ordered per interface (in the order getifaddrs first
 * names it) by addr_class, so the first entry of a name is its IPv4 address where it has one. */
static int if_collect(struct sock_iface* out, int max) {
  struct ifaddrs* all;
  if (getifaddrs(&all) != 0) {
    WARN("getifaddrs failed: %s", strerror(errno));
    return 0;
  }
  int n = 0;
  for (struct ifaddrs* i = all; i && n < max; i = i->ifa_next) {
    if (!i->ifa_addr || !(i->ifa_flags & IFF_UP) || !(i->ifa_flags & IFF_RUNNING)) continue;
    int fam = i->ifa_addr->sa_family;
    if ((fam != AF_INET && fam != AF_INET6) || !family_wanted(fam)) continue;
    if (strlen(i->ifa_name) >= sizeof(out->name)) continue;
    struct sock_iface f;
    memset(&f, 0, sizeof(f));
    snprintf(f.name, sizeof(f.name), "%s", i->ifa_name);
    size_t sz = fam == AF_INET ? sizeof(struct sockaddr_in) : sizeof(struct sockaddr_in6);
    memcpy(&f.addr, i->ifa_addr, sz);
    if (i->ifa_netmask) memcpy(&f.mask, i->ifa_netmask, sz);
    /* Insert after the last entry of the same name with a class <= ours, else at the end. */
    int at = n, last_same = -1;
    for (int k = 0; k < n; k++)
      if (!strcmp(out[k].name, f.name)) {
        last_same = k;
        if (addr_class(&out[k].addr) > addr_class(&f.addr) && at == n) at = k;
      }
    if (at == n && last_same >= 0) at = last_same + 1;
    memmove(&out[at + 1], &out[at], sizeof(out[0]) * (size_t)(n - at));
    out[at] = f;
    n++;
  }
  freeifaddrs(all);
  return n;
}

static int addr_equal(const union sock_addr* a, const union sock_addr* b) {
  if (a->sa.sa_family != b->sa.sa_family) return 0;
  if (a->sa.sa_family == AF_INET) return a->sin.sin_addr.s_addr == b->sin.sin_addr.s_addr;
  return !memcmp(&a->sin6.sin6_addr, &b->sin6.sin6_addr, 16);
}

int sock_iface_speed_mbits(const char* name) {
  char path[96];
  snprintf(path, sizeof path, "/sys/class/net/%.40s/speed", name);
  FILE* f = fopen(path, "r");
  int s = -1;
  if (f) {
    if (fscanf(f, "%d", &s) != 1) s = -1;
    fclose(f);
  }
  return s > 0 ? s : -1; /* loopback and most virtual links: no speed (EINVAL) or -1 */
}

int sock_addr_speed_mbits(const union sock_addr* a) {
  struct sock_iface ifs[64];
  int n = if_collect(ifs, 64);
  for (int i = 0; i < n; i++)
    if (addr_equal(&ifs[i].addr, a)) return sock_iface_speed_mbits(ifs[i].name);
  return -1;
}

int sock_addr_is_loopback(const union sock_addr* a) {
  if (a->sa.sa_family == AF_INET) return (ntohl(a->sin.sin_addr.s_addr) >> 24) == 127;
  if (a->sa.sa_family != AF_INET6) return 0;
  if (IN6_IS_ADDR_LOOPBACK(&a->sin6.sin6_addr)) return 1;
  return IN6_IS_ADDR_V4MAPPED(&a->sin6.sin6_addr) && a->sin6.sin6_addr.s6_addr[12] == 127;
}

int sock_route_source(const union sock_addr* dst, union sock_addr* src) {
  int fam = dst->sa.sa_family;
  if (fam != AF_INET && fam != AF_INET6) return -1;
  int fd = socket(fam, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return -1;
  union sock_addr d = *dst;
  if (sock_addr_port(&d) == 0) { /* connect() on UDP needs a port; none is ever used */
    if (fam == AF_INET) d.sin.sin_port = htons(9);
    else d.sin6.sin6_port = htons(9);
  }
  socklen_t len = sizeof(*src);
  memset(src, 0, sizeof(*src));
  int rc = connect(fd, &d.sa, fam == AF_INET ? sizeof(d.sin) : sizeof(d.sin6));
  if (rc == 0) rc = getsockname(fd, &src->sa, &len);
  close(fd);
  return rc == 0 ? 0 : -1;
}

static int same_subnet(const struct sock_iface* f, const union sock_addr* a) {
  if (f->addr.sa.sa_family != a->sa.sa_family) return 0;
  const unsigned char *x, *y, *m;
  size_t len;
  if (a->sa.sa_family == AF_INET) {
    x = (const unsigned char*)&f->addr.sin.sin_addr;
    y = (const unsigned char*)&a->sin.sin_addr;
    m = (const unsigned char*)&f->mask.sin.sin_addr;
    len = 4;
  } else {
    x = (const unsigned char*)&f->addr.sin6.sin6_addr;
    y = (const unsigned char*)&a->sin6.sin6_addr;
    m = (const unsigned char*)&f->mask.sin6.sin6_addr;
    len = 16;
  }
  for (size_t i = 0; i < len; i++)
    if ((x[i] & m[i]) != (y[i] & m[i])) return 0;
  return 1;
}

static int pick_by_list(const struct sock_iface* ifs, int n, const char* spec) {
  struct if_list l;
  if_list_parse(spec, &l);
  for (int i = 0; i < n; i++)
    if (if_list_match(&l, ifs[i].name)) return i;
  return -1;
}

static int pick_by_addr(const struct sock_iface* ifs, int n, const union sock_addr* a, const struct if_list* l) {
  for (int i = 0; a && i < n; i++)
    if ((!l || if_list_match(l, ifs[i].name)) && addr_equal(&ifs[i].addr, a)) return i;
  return -1;
}

int sock_iface_pick(const struct sock_iface* ifs, int n, const char* spec, const union sock_addr* route_src,
                    const union sock_addr* match) {
  if (spec && spec[0]) {
    /* Among the interfaces asked for, the one the root's route leaves by, else the first. */
    struct if_list l;
    if_list_parse(spec, &l);
    int pick = pick_by_addr(ifs, n, route_src, &l);
    return pick >= 0 ? pick : pick_by_list(ifs, n, spec);
  }
  int pick = pick_by_addr(ifs, n, route_src, NULL);
  if (pick < 0) pick = pick_by_list(ifs, n, "ib");
  for (int i = 0; pick < 0 && match && i < n; i++)
    if (same_subnet(&ifs[i], match)) pick = i;
  static const char* const order[] = {"^docker,lo,virbr", "docker", "lo", "virbr"};
  for (size_t k = 0; pick < 0 && k < sizeof(order) / sizeof(order[0]); k++) pick = pick_by_list(ifs, n, order[k]);
  return pick;
}

static void list_into(const struct sock_iface* ifs, int n, char* buf, size_t len) {
  size_t o = 0;
  buf[0] = '\0';
  for (int i = 0; i < n && o < len; i++) {
    char a[64];
    int w = snprintf(buf + o, len - o, "%s%s:%s", i ? ", " : "", ifs[i].name, sock_addr_str(&ifs[i].addr, a, sizeof(a)));
    if (w < 0) break;
    o += (size_t)w;
  }
}

ch_status sock_find_interface(const union sock_addr* match, char* ifname, size_t ifname_len, union sock_addr* addr) {
  struct sock_iface ifs[IF_MAX];
  int n = if_collect(ifs, IF_MAX);
  const char* spec = param_str(PARAM_SOCKET_IFNAME);
  union sock_addr src;
  int routed = match && sock_route_source(match, &src) == 0;
  int pick = sock_iface_pick(ifs, n, spec, routed ? &src : NULL, match);
  char avail[1024], a[64], r[64];
  if (pick < 0) {
    list_into(ifs, n, avail, sizeof(avail));
    WARN("No usable network interface found (NCCL_SOCKET_IFNAME=\"%s\", NCCL_SOCKET_FAMILY=\"%s\"); interfaces "
         "that are up: %s",
         spec, param_str(PARAM_SOCKET_FAMILY), n ? avail : "none");
    return spec[0] ? CH_INVALID_USAGE : CH_SYSTEM;
  }
  /* A loopback address is reachable from this host only: never advertise one when the root (and so,
   * likely, other ranks) is elsewhere. Ranks on this host could use it, but the root's address
   * says the job spans hosts; the table check at join catches a mix that gets past this. */
  if (match && sock_addr_is_loopback(&ifs[pick].addr) && !sock_addr_is_local(match)) {
    list_into(ifs, n, avail, sizeof(avail));
    WARN("The bootstrap root %s is on another host, but the interface chosen here is loopback (%s:%s%s), which no "
         "other host can reach: set NCCL_SOCKET_IFNAME to an interface that reaches the root; interfaces that are up: %s",
         sock_addr_str(match, r, sizeof(r)), ifs[pick].name, sock_addr_str(&ifs[pick].addr, a, sizeof(a)),
         spec[0] ? ", from NCCL_SOCKET_IFNAME" : "", avail);
    return CH_INVALID_USAGE;
  }
  if (ifname) snprintf(ifname, ifname_len, "%s", ifs[pick].name);
  *addr = ifs[pick].addr;
  if (addr->sa.sa_family == AF_INET) addr->sin.sin_port = 0;
  else addr->sin6.sin6_port = 0;
  INFO(LOG_NET, "Using interface %s:%s%s", ifs[pick].name, sock_addr_str(addr, a, sizeof(a)),
       spec[0] ? " (NCCL_SOCKET_IFNAME)" : routed && addr_equal(&ifs[pick].addr, &src) ? " (routes to the root)" : "");
  return CH_OK;
}

void sock_list_interfaces(char* buf, size_t len) {
  if (len == 0) return;
  struct sock_iface ifs[IF_MAX];
  int n = if_collect(ifs, IF_MAX);
  size_t o = 0;
  buf[0] = '\0';
  for (int i = 0; i < n && o < len; i++) {
    char a[64];
    int w = snprintf(buf + o, len - o, "%s:%s\n", ifs[i].name, sock_addr_str(&ifs[i].addr, a, sizeof(a)));
    if (w < 0) break;
    o += (size_t)w;
  }
}

int sock_find_interfaces(struct sock_iface* out, int max) {
  struct sock_iface ifs[IF_MAX];
  int n = if_collect(ifs, IF_MAX);
  const char* spec = param_str(PARAM_SOCKET_IFNAME);
  /* As NCCL's socket network: every interface NCCL_SOCKET_IFNAME names, else the first non-empty
   * class of: ib, anything but docker, lo and virbr, then docker, lo, virbr. One entry per interface
   * (its first address: IPv4 where it has one). */
  static const char* const order[] = {"ib", "^docker,lo,virbr", "docker", "lo", "virbr"};
  const char* const* lists = spec[0] ? &spec : order;
  size_t nlists = spec[0] ? 1 : sizeof(order) / sizeof(order[0]);
  int got = 0;
  for (size_t k = 0; k < nlists && got == 0; k++) {
    struct if_list l;
    if_list_parse(lists[k], &l);
    for (int i = 0; i < n && got < max; i++) {
      if (!if_list_match(&l, ifs[i].name) || (i > 0 && !strcmp(ifs[i - 1].name, ifs[i].name))) continue;
      out[got] = ifs[i];
      if (out[got].addr.sa.sa_family == AF_INET) out[got].addr.sin.sin_port = 0;
      else out[got].addr.sin6.sin6_port = 0;
      got++;
    }
  }
  return got;
}
