/* Interface and address choice (src/misc/ifaces.c, socket.c, bootstrap.c): NCCL_SOCKET_IFNAME's syntax
 * on made-up interface lists, the route to the root deciding by default, a missing interface failing
 * with the list of those that exist, loopback never advertised to another host, NCCL_SOCKET_FAMILY,
 * and a real init over IPv6 loopback. */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "bootstrap/bootstrap.h"
#include "comm/comm.h"
#include "misc/log.h"
#include "misc/param.h"
#include "misc/socket.h"
#include "runner.h"

static void set(const char* name, const char* value) {
  if (value) setenv(name, value, 1);
  else unsetenv(name);
  param_reset();
}

static struct sock_iface mk(const char* name, const char* ip, int prefix) {
  struct sock_iface f;
  memset(&f, 0, sizeof(f));
  snprintf(f.name, sizeof(f.name), "%s", name);
  if (strchr(ip, ':')) {
    f.addr.sin6.sin6_family = f.mask.sin6.sin6_family = AF_INET6;
    ASSERT(inet_pton(AF_INET6, ip, &f.addr.sin6.sin6_addr) == 1);
    for (int i = 0; i < prefix; i++) f.mask.sin6.sin6_addr.s6_addr[i / 8] |= (uint8_t)(0x80 >> (i % 8));
  } else {
    f.addr.sin.sin_family = f.mask.sin.sin_family = AF_INET;
    ASSERT(inet_pton(AF_INET, ip, &f.addr.sin.sin_addr) == 1);
    f.mask.sin.sin_addr.s_addr = htonl(prefix ? 0xffffffffu << (32 - prefix) : 0);
  }
  return f;
}

static union sock_addr ad(const char* s) {
  union sock_addr a;
  ASSERT_EQ(sock_parse_addr(s, &a), CH_OK);
  return a;
}

TEST(ifaces, ifname_syntax) {
  struct sock_iface ifs[] = {mk("lo", "127.0.0.1", 8), mk("docker0", "172.17.0.1", 16), mk("eth0", "10.0.0.2", 24),
                             mk("eth10", "10.1.0.2", 24), mk("ib0", "10.2.0.2", 24)};
  int n = 5;
  EXPECT_EQ(sock_iface_pick(ifs, n, "eth", NULL, NULL), 2);
  EXPECT_EQ(sock_iface_pick(ifs, n, "eth1", NULL, NULL), 3);    /* prefix */
  EXPECT_EQ(sock_iface_pick(ifs, n, "=eth1", NULL, NULL), -1);  /* exact: no "eth1" */
  EXPECT_EQ(sock_iface_pick(ifs, n, "=eth10", NULL, NULL), 3);
  EXPECT_EQ(sock_iface_pick(ifs, n, "^lo,docker", NULL, NULL), 2);
  EXPECT_EQ(sock_iface_pick(ifs, n, "^=lo,docker0,eth0", NULL, NULL), 3);
  EXPECT_EQ(sock_iface_pick(ifs, n, "wlan,ib", NULL, NULL), 4);
  EXPECT_EQ(sock_iface_pick(ifs, n, "eth9", NULL, NULL), -1);
  EXPECT_EQ(sock_iface_pick(ifs, n, "eth0:5000", NULL, NULL), 2); /* a port part is ignored */
  /* No NCCL_SOCKET_IFNAME, no route: ib first, then not docker/lo. */
  EXPECT_EQ(sock_iface_pick(ifs, n, "", NULL, NULL), 4);
  EXPECT_EQ(sock_iface_pick(ifs, 4, "", NULL, NULL), 2);
  EXPECT_EQ(sock_iface_pick(ifs, 2, "", NULL, NULL), 1); /* docker before lo */
  EXPECT_EQ(sock_iface_pick(ifs, 1, "", NULL, NULL), 0);
  EXPECT_EQ(sock_iface_pick(ifs, 0, "", NULL, NULL), -1);
}

TEST(ifaces, route_to_root_decides) {
  struct sock_iface ifs[] = {mk("lo", "127.0.0.1", 8), mk("eth0", "10.0.0.2", 24), mk("eth1", "10.77.0.3", 24),
                             mk("eth1", "fd77::3", 64), mk("ib0", "10.2.0.2", 24)};
  int n = 5;
  union sock_addr root4 = ad("10.77.0.1:5000"), src4 = ad("10.77.0.3:0");
  union sock_addr root6 = ad("[fd77::1]:5000"), src6 = ad("[fd77::3]:0");
  union sock_addr far = ad("10.9.9.9:1"), src_far = ad("10.0.0.2:0");
  EXPECT_EQ(sock_iface_pick(ifs, n, "", &src4, &root4), 2); /* not ib0, not the first ethernet */
  EXPECT_EQ(sock_iface_pick(ifs, n, "", &src6, &root6), 3); /* the IPv6 address the route uses */
  EXPECT_EQ(sock_iface_pick(ifs, n, "", &src_far, &far), 1);
  /* No route known: ib, then the root's subnet. */
  EXPECT_EQ(sock_iface_pick(ifs, n, "", NULL, &root4), 4);
  EXPECT_EQ(sock_iface_pick(ifs, 4, "", NULL, &root4), 2);
  /* NCCL_SOCKET_IFNAME limits the choice; within it the route still decides. */
  EXPECT_EQ(sock_iface_pick(ifs, n, "eth0", &src4, &root4), 1);
  EXPECT_EQ(sock_iface_pick(ifs, n, "eth", &src4, &root4), 2);
  EXPECT_EQ(sock_iface_pick(ifs, n, "^eth1", &src4, &root4), 0);
  /* A root on this host is reached through loopback. */
  union sock_addr lo = ad("127.0.0.1:1");
  EXPECT_EQ(sock_iface_pick(ifs, n, "", &lo, &lo), 0);
}

TEST(ifaces, addresses) {
  union sock_addr a;
  char s[64];
  ASSERT_EQ(sock_parse_addr("[fd77::1]:29400", &a), CH_OK);
  EXPECT_EQ(a.sa.sa_family, AF_INET6);
  EXPECT_EQ(sock_addr_port(&a), 29400);
  EXPECT(!strcmp(sock_addr_str(&a, s, sizeof(s)), "[fd77::1]:29400"));
  EXPECT(!sock_addr_is_loopback(&a));
  ASSERT_EQ(sock_parse_addr("[::1]:1", &a), CH_OK);
  EXPECT(sock_addr_is_loopback(&a));
  ASSERT_EQ(sock_parse_addr("[::ffff:127.0.0.2]:1", &a), CH_OK);
  EXPECT(sock_addr_is_loopback(&a));
  ASSERT_EQ(sock_parse_addr("127.1.2.3:1", &a), CH_OK);
  EXPECT(sock_addr_is_loopback(&a));
  ASSERT_EQ(sock_parse_addr("10.77.0.1:1", &a), CH_OK);
  EXPECT(!sock_addr_is_loopback(&a));
  EXPECT_EQ(sock_parse_addr("[fd77::1]", &a), CH_INVALID_ARG);
  EXPECT_EQ(sock_parse_addr("[fd77::1:80", &a), CH_INVALID_ARG);
  EXPECT_EQ(sock_parse_addr("fd77::1:80", &a), CH_INVALID_ARG);
}

TEST(ifaces, route_source_of_loopback) {
  union sock_addr src, dst = ad("127.0.0.1:1");
  ASSERT_EQ(sock_route_source(&dst, &src), 0);
  EXPECT(sock_addr_is_loopback(&src));
  char name[32];
  union sock_addr a;
  ASSERT_EQ(sock_find_interface(&dst, name, sizeof(name), &a), CH_OK);
  EXPECT(!strcmp(name, "lo"));
  EXPECT_EQ(a.sa.sa_family, AF_INET);
  dst = ad("[::1]:1");
  if (sock_route_source(&dst, &src) != 0) {
    printf("    (no IPv6 on this machine: the IPv6 half is skipped)\n");
    return;
  }
  ASSERT_EQ(sock_find_interface(&dst, name, sizeof(name), &a), CH_OK);
  EXPECT(!strcmp(name, "lo"));
  EXPECT_EQ(a.sa.sa_family, AF_INET6);
}

TEST(ifaces, missing_interface_lists_the_others) {
  set("NCCL_SOCKET_IFNAME", "=chorus-no-such-if");
  char name[32];
  union sock_addr a, root = ad("127.0.0.1:1");
  EXPECT_EQ(sock_find_interface(&root, name, sizeof(name), &a), CH_INVALID_USAGE);
  const char* e = log_last_error();
  EXPECT(strstr(e, "chorus-no-such-if") != NULL);
  EXPECT(strstr(e, "interfaces that are up: ") != NULL);
  EXPECT(strstr(e, "lo:127.0.0.1") != NULL);
}

static void init_fails_body(int rank, int nranks, ncclUniqueId id, void* arg) {
  const char* want = arg;
  ncclComm_t comm = NULL;
  ncclResult_t r = ncclCommInitRank(&comm, nranks, id, rank);
  EXPECT_EQ(r, ncclInvalidUsage);
  if (r == ncclInvalidUsage) {
    const char* e = ncclGetLastError(NULL);
    if (!strstr(e, want)) rt_fail(__FILE__, __LINE__, "rank %d: last error lacks \"%s\": %s", rank, want, e);
  }
  if (comm) ncclCommDestroy(comm);
}

static void comm_id_free_port(const char* host_fmt);

/* The whole init fails, on every rank, as threads and processes (with NCCL_COMM_ID, so that
 * ncclGetUniqueId, which fails the same way, is not what fails). */
TEST(ifaces, missing_interface_fails_init) {
  comm_id_free_port("127.0.0.1:%d");
  set("NCCL_SOCKET_IFNAME", "=chorus-no-such-if");
  ncclUniqueId id;
  EXPECT_EQ(ncclGetUniqueId(&id), ncclSuccess);
  rt_run_both(3, init_fails_body, (void*)"interfaces that are up");
  unsetenv("NCCL_COMM_ID");
  set("NCCL_SOCKET_IFNAME", "=chorus-no-such-if");
  EXPECT_EQ(ncclGetUniqueId(&id), ncclInvalidUsage);
}

/* NCCL_SOCKET_IFNAME=lo with a root on another host: refused before anything is advertised.
 * 192.0.2.77 is TEST-NET-1 (never assigned to a real host). */
TEST(ifaces, loopback_refused_for_remote_root) {
  set("NCCL_SOCKET_IFNAME", "lo");
  char name[32];
  union sock_addr a, root = ad("192.0.2.77:1");
  if (sock_addr_is_local(&root)) {
    printf("    SKIP: 192.0.2.77 is an address of this machine\n");
    return;
  }
  EXPECT_EQ(sock_find_interface(&root, name, sizeof(name), &a), CH_INVALID_USAGE);
  EXPECT(strstr(log_last_error(), "loopback") != NULL);
}

/* Ranks that call themselves different hosts, with a root on loopback: all advertise loopback, which
 * the other "host" could not reach; every rank's init fails with one message naming the ranks. */
static void two_hosts_on_lo(int rank, int nranks, ncclUniqueId id, void* arg) {
  set("NCCL_HOSTID", rank == 0 ? "ifaces-host-a" : "ifaces-host-b");
  init_fails_body(rank, nranks, id, arg);
}

static void comm_id_free_port(const char* host_fmt) {
  union sock_addr lo = ad(strchr(host_fmt, '[') ? "[::1]:0" : "127.0.0.1:0");
  struct sock l;
  ASSERT_EQ(sock_listen(&lo, &l), CH_OK);
  char env[64];
  snprintf(env, sizeof(env), host_fmt, sock_addr_port(&l.addr));
  sock_close(&l);
  set("NCCL_COMM_ID", env);
}

TEST(ifaces, loopback_never_advertised_to_another_host) {
  comm_id_free_port("127.0.0.1:%d");
  set("CHORUS_SECRET", "ifaces-test-secret");
  rt_run_procs(2, two_hosts_on_lo, (void*)"advertises the loopback address");
}

static void family_body(int rank, int nranks, ncclUniqueId id, void* arg) {
  int fam = *(const int*)arg;
  ncclComm_t comm = NULL;
  NCCL_OK(ncclCommInitRank(&comm, nranks, id, rank));
  for (int r = 0; r < nranks; r++) EXPECT_EQ(comm->peers[r].listen_addr.sa.sa_family, fam);
  float v[1000];
  for (int i = 0; i < 1000; i++) v[i] = (float)(rank + i);
  NCCL_OK(ncclAllReduce(v, v, 1000, ncclFloat, ncclSum, comm, NULL));
  for (int i = 0; i < 1000; i++)
    if (v[i] != (float)(nranks * i + nranks * (nranks - 1) / 2)) {
      rt_fail(__FILE__, __LINE__, "rank %d: v[%d] = %g", rank, i, v[i]);
      break;
    }
  NCCL_OK(ncclCommDestroy(comm));
}

static int have_ipv6_loopback(void) {
  union sock_addr src, dst = ad("[::1]:1");
  struct sock l;
  union sock_addr lo = ad("[::1]:0");
  if (sock_route_source(&dst, &src) != 0 || sock_listen(&lo, &l) != CH_OK) return 0;
  sock_close(&l);
  return 1;
}

/* NCCL_COMM_ID=[::1]:port: the root and every rank listen on IPv6 loopback. */
TEST(ifaces, init_over_ipv6_loopback) {
  if (!have_ipv6_loopback()) {
    printf("    SKIP: no IPv6 loopback on this machine\n");
    return;
  }
  comm_id_free_port("[::1]:%d");
  set("CHORUS_SECRET", "ifaces-test-secret");
  int fam = AF_INET6;
  rt_run_both(3, family_body, &fam);
}

/* NCCL_SOCKET_FAMILY keeps one family: AF_INET6 with no root address picks an IPv6 address. */
TEST(ifaces, socket_family) {
  char name[32];
  union sock_addr a;
  set("NCCL_SOCKET_FAMILY", "AF_INET");
  ASSERT_EQ(sock_find_interface(NULL, name, sizeof(name), &a), CH_OK);
  EXPECT_EQ(a.sa.sa_family, AF_INET);
  if (!have_ipv6_loopback()) return;
  set("NCCL_SOCKET_FAMILY", "AF_INET6");
  ASSERT_EQ(sock_find_interface(NULL, name, sizeof(name), &a), CH_OK);
  EXPECT_EQ(a.sa.sa_family, AF_INET6);
  int fam = AF_INET6;
  rt_run_procs(2, family_body, &fam); /* the root from ncclGetUniqueId on IPv6 too */
}
