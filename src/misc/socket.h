/* TCP sockets for bootstrap and (later) the socket transport. Every blocking call polls an abort
 * flag and honours a deadline, so nothing here can hang forever. */
#ifndef CH_SOCKET_H
#define CH_SOCKET_H

#include <netinet/in.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/socket.h>
#include <sys/types.h>

#include "status.h"

union sock_addr {
  struct sockaddr sa;
  struct sockaddr_in sin;
  struct sockaddr_in6 sin6;
};

struct sock {
  int fd;
  union sock_addr addr; /* peer (connected) or bound (listening) address */
};

/* Deadline is an absolute ut_now_ns() value; 0 means none. abort may be NULL. */
struct sock_wait {
  const volatile int* abort;
  uint64_t deadline_ns;
};

/* "1.2.3.4:5", "[::1]:5" or "host:5" (name resolved). */
ch_status sock_parse_addr(const char* str, union sock_addr* out);
/* Text form "ip:port" / "[ip]:port" into buf (>= 64 bytes); returns buf. */
const char* sock_addr_str(const union sock_addr* a, char* buf, size_t len);
int sock_addr_port(const union sock_addr* a);

/* Pick the interface for this host per NCCL_SOCKET_IFNAME / NCCL_SOCKET_FAMILY rules. With `match` (the
 * bootstrap root's address) and no NCCL_SOCKET_IFNAME: the interface holding the address this host's
 * routing table would send from to reach `match`; a loopback choice while `match` is not on this
 * host fails (no rank elsewhere could reach it). Otherwise, and without a route: ib*, the interface in
 * the root's subnet, anything but docker*, lo, virbr*, then docker*, lo, virbr*. A NCCL_SOCKET_IFNAME
 * that matches nothing fails with CH_INVALID_USAGE and a WARN listing the interfaces that are up.
 * Fills name and address (port 0). */
ch_status sock_find_interface(const union sock_addr* match, char* ifname, size_t ifname_len,
                              union sock_addr* addr);
/* List every usable interface as "name:addr" lines into buf (chorus-info). */
void sock_list_interfaces(char* buf, size_t len);

/* The pure part of the choice, for tests: one entry per (interface, address), each interface's IPv4
 * addresses first, then global IPv6, then link-local. */
struct sock_iface {
  char name[16];
  union sock_addr addr;
  union sock_addr mask;
};
/* Index into ifs[n] of the choice described above, or -1. `spec` is NCCL_SOCKET_IFNAME ("" = unset);
 * `route_src` (may be NULL) the local address the route to the root uses; `match` the root. */
int sock_iface_pick(const struct sock_iface* ifs, int n, const char* spec, const union sock_addr* route_src,
                    const union sock_addr* match);
/* Every interface NCCL's socket network would use (NCCL_SOCKET_IFNAME, else its default classes),
 * one entry each, at most max; the count. */
int sock_find_interfaces(struct sock_iface* out, int max);
/* The source address the kernel would use to reach dst (a UDP connect: nothing is sent). 0 on success. */
int sock_route_source(const union sock_addr* dst, union sock_addr* src);
/* Loopback address (127/8, ::1, v4-mapped 127/8). */
int sock_addr_is_loopback(const union sock_addr* a);
/* The link speed (Mbit/s, /sys/class/net/IF/speed) of the interface holding address a; -1 unknown
 * (loopback, a virtual link that reports none, an address no interface has). */
int sock_addr_speed_mbits(const union sock_addr* a);
/* The same for interface name; -1 unknown. */
int sock_iface_speed_mbits(const char* name);
/* Listen on addr (port 0 = ephemeral; the bound port is written back into s->addr). */
ch_status sock_listen(const union sock_addr* addr, struct sock* s);
/* Accept one connection; CH_TIMEOUT on deadline, CH_ABORTED on abort. */
ch_status sock_accept(struct sock* listener, struct sock* out, const struct sock_wait* w);
/* Connect with NCCL's retry policy (ECONNREFUSED etc. retried NCCL_SOCKET_RETRY_CNT times with linear
 * backoff of NCCL_SOCKET_RETRY_SLEEP_MSEC), bounded by the deadline too. Logs host:port on failure. */
ch_status sock_connect(const union sock_addr* addr, struct sock* out, const struct sock_wait* w);
/* Send/receive exactly n bytes. A closed peer gives CH_REMOTE with the peer address in the log. */
ch_status sock_send_all(struct sock* s, const void* buf, size_t n, const struct sock_wait* w);
ch_status sock_recv_all(struct sock* s, void* buf, size_t n, const struct sock_wait* w);
void sock_close(struct sock* s);

/* Connect, retrying transient failures (refused, reset) for at most give_up_ms: for peers whose
 * listener is known to have existed, so a refusal means the peer is gone. Nothing is logged: on
 * failure *err holds the errno (CH_REMOTE), or the call returns CH_TIMEOUT / CH_ABORTED. */
ch_status sock_connect_brief(const union sock_addr* addr, struct sock* out, const struct sock_wait* w,
                             uint64_t give_up_ms, int* err);

/* Whether a is a loopback address or one of this host's interface addresses. */
int sock_addr_is_local(const union sock_addr* a);
/* The owner uid of the socket at the other end of the connected TCP socket fd, found in
 * /proc/net/tcp{,6} (only meaningful when that end is on this host). 0 on success, -1 if not found. */
int sock_peer_uid(int fd, uid_t* uid);
/* sock_peer_uid for n sockets in one pass over the tables (a flood's sockets make them long):
 * found[i] = 1 and uids[i] set for each whose other end is on this host. Returns how many were found. */
int sock_peer_uids(const int* fds, int n, uid_t* uids, unsigned char* found);

/* For callers that run their own poll loops (bootstrap): CH_ABORTED if the abort flag is set,
 * CH_TIMEOUT if the deadline passed, else CH_OK. Neither is logged here (the caller knows what it
 * was waiting for); sock_accept/connect/send/recv return them unlogged too. */
ch_status sock_wait_check(const struct sock_wait* w);
/* Milliseconds to pass to poll(): at most 100, less when the deadline is nearer. */
int sock_wait_slice_ms(const struct sock_wait* w);

/* A WARN that `who` rejected a connection from remote (why); further ones from that host for 60 s
 * go to INFO, so a scanner cannot flood the log. Any thread. */
void sock_warn_reject(const char* who, const union sock_addr* remote, const char* why);

/* A data connection's settings: SO_SNDBUF/SO_RCVBUF (CHORUS_NET_SOCKBUF_BYTES), and a cut link turned
 * into ETIMEDOUT in bounded time (CHORUS_NET_LINK_TIMEOUT_MS: TCP_USER_TIMEOUT and keepalive). */
void sock_tune_link(int fd);
/* Small records go out at once (Nagle would hold a second one for the peer's delayed ACK: 40 ms). */
void sock_set_nodelay(int fd);
/* Bytes sent on fd that its peer has not acknowledged: 0 once the peer reset it (they never will be). */
int sock_unacked(int fd);

#endif
