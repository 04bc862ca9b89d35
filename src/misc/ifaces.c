/* Which network interface the bootstrap and socket transport use, with NCCL's rules:
 * NCCL_SOCKET_IFNAME is a comma list of name prefixes ("eth,ib"), "^" excludes ("^docker,lo"),
 * "=" asks for exact names ("=eth0"; "^=docker0" combines both); NCCL_SOCKET_FAMILY keeps only
 * AF_INET or AF_INET6. Without NCCL_SOCKET_IFNAME: ib*, then the interface in the same subnet as
 * the root address, then anything but docker*, lo, virbr*, then docker*, then lo, then virbr*. */
#include <arpa/inet.h>
#include <errno.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <stdio.h>
#include <string.h>

#include "log.h"
#include "param.h"
#include "socket.h"

#define IF_MAX 64
#define IF_LIST_MAX 16

struct iface {
  char name[IF_NAMESIZE + 1];
  union sock_addr addr;
  union sock_addr mask;
};

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

/* Up interfaces with an IPv4/IPv6 address, one address per name (the first seen, usually IPv4). */
static int if_collect(struct iface* out, int max) {
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
    if (fam == AF_INET6 && IN6_IS_ADDR_LOOPBACK(&((struct sockaddr_in6*)(void*)i->ifa_addr)->sin6_addr)) continue;
    int dup = 0;
    for (int k = 0; k < n && !dup; k++) dup = !strcmp(out[k].name, i->ifa_name);
    if (dup) continue;
    struct iface* f = &out[n++];
    memset(f, 0, sizeof(*f));
    snprintf(f->name, sizeof(f->name), "%s", i->ifa_name);
    size_t sz = fam == AF_INET ? sizeof(struct sockaddr_in) : sizeof(struct sockaddr_in6);
    memcpy(&f->addr, i->ifa_addr, sz);
    if (i->ifa_netmask) memcpy(&f->mask, i->ifa_netmask, sz);
  }
  freeifaddrs(all);
  return n;
}

static int same_subnet(const struct iface* f, const union sock_addr* a) {
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

static int pick_by_list(const struct iface* ifs, int n, const char* spec) {
  struct if_list l;
  if_list_parse(spec, &l);
  for (int i = 0; i < n; i++)
    if (if_list_match(&l, ifs[i].name)) return i;
  return -1;
}

static void list_into(const struct iface* ifs, int n, char* buf, size_t len) {
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
  struct iface ifs[IF_MAX];
  int n = if_collect(ifs, IF_MAX);
  const char* spec = param_str(PARAM_SOCKET_IFNAME);
  int pick = -1;
  if (spec[0]) {
    pick = pick_by_list(ifs, n, spec);
  } else {
    pick = pick_by_list(ifs, n, "ib");
    for (int i = 0; pick < 0 && match && i < n; i++)
      if (same_subnet(&ifs[i], match)) pick = i;
    static const char* const order[] = {"^docker,lo,virbr", "docker", "lo", "virbr"};
    for (size_t k = 0; pick < 0 && k < sizeof(order) / sizeof(order[0]); k++) pick = pick_by_list(ifs, n, order[k]);
  }
  if (pick < 0) {
    char avail[1024];
    list_into(ifs, n, avail, sizeof(avail));
    WARN("No usable network interface found (NCCL_SOCKET_IFNAME=\"%s\", NCCL_SOCKET_FAMILY=\"%s\"); interfaces "
         "that are up: %s",
         spec, param_str(PARAM_SOCKET_FAMILY), n ? avail : "none");
    return spec[0] ? CH_INVALID_USAGE : CH_SYSTEM;
  }
  if (ifname) snprintf(ifname, ifname_len, "%s", ifs[pick].name);
  *addr = ifs[pick].addr;
  if (addr->sa.sa_family == AF_INET) addr->sin.sin_port = 0;
  else addr->sin6.sin6_port = 0;
  char a[64];
  INFO(LOG_NET, "Using interface %s:%s%s", ifs[pick].name, sock_addr_str(addr, a, sizeof(a)),
       spec[0] ? " (NCCL_SOCKET_IFNAME)" : "");
  return CH_OK;
}

void sock_list_interfaces(char* buf, size_t len) {
  if (len == 0) return;
  struct iface ifs[IF_MAX];
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
