/* libFuzzer target: bytes sent to a bootstrap root, as a stranger (raw) or as a client that knows the
 * job key (past the handshake, so the join decoder itself is reached). The root must drop what is
 * malformed with a WARN and keep serving: no crash, no leak, no hang, no unbounded allocation.
 *   first byte even: raw bytes on a fresh connection
 *   first byte odd:  authenticated hello, then the rest as the join record */
#include <poll.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "bootstrap/boot_internal.h"
#include "misc/utils.h"

static struct boot_key key;
static union sock_addr root;

/* A root serves one job: an input that completes a join table (or fails the job) ends it, so a new
 * one is started when the old one is gone. */
static void start_root(void) {
  union sock_addr any;
  if (sock_parse_addr("127.0.0.1:0", &any) != CH_OK) abort();
  if (boot_root_start(&any, BOOT_ID_MAGIC, &key, &root) != CH_OK) abort();
}

static void setup(void) {
  setenv("NCCL_DEBUG", getenv("FUZZ_DEBUG") ? getenv("FUZZ_DEBUG") : "", 1); /* quiet by default */
  if (boot_key_random(&key) != CH_OK) abort();
  start_root();
}

/* Read until the root closes or goes quiet: it answers or drops us; either way we move on. */
static void drain(int fd) {
  char buf[4096];
  struct pollfd p = {fd, POLLIN, 0};
  while (poll(&p, 1, 200) > 0 && recv(fd, buf, sizeof(buf), 0) > 0) {
  }
}

static int handshake(int fd) {
  struct boot_hello h;
  if (boot_hello_init(&h, BOOT_KIND_JOIN, (uint32_t)sizeof(struct boot_rank_info), 0, 2) != CH_OK) return -1;
  if (send(fd, &h, sizeof(h), MSG_NOSIGNAL) != (ssize_t)sizeof(h)) return -1;
  struct boot_srv_proof sp;
  size_t got = 0;
  struct pollfd p = {fd, POLLIN, 0};
  while (got < sizeof(sp) && poll(&p, 1, 1000) > 0) {
    ssize_t r = recv(fd, (char*)&sp + got, sizeof(sp) - got, 0);
    if (r <= 0) return -1;
    got += (size_t)r;
  }
  if (got < sizeof(sp) || !boot_mac_ok(&key, 1, &h, sp.nonce, sp.mac)) return -1;
  struct boot_cli_proof cp;
  boot_mac(&key, 0, &h, sp.nonce, cp.mac);
  return send(fd, &cp, sizeof(cp), MSG_NOSIGNAL) == (ssize_t)sizeof(cp) ? 0 : -1;
}

int LLVMFuzzerTestOneInput(const unsigned char* data, size_t size) {
  static int ready;
  if (!ready) setup(), ready = 1;
  if (size == 0) return 0;
  struct sock s = {.fd = -1};
  struct sock_wait w = {NULL, ut_now_ns() + 2000000000ull};
  if (sock_connect(&root, &s, &w) != CH_OK) {
    start_root(); /* the last job ended; a live root that stops accepting would fail here again */
    w.deadline_ns = ut_now_ns() + 2000000000ull;
    if (sock_connect(&root, &s, &w) != CH_OK) abort();
  }
  int authed = data[0] & 1;
  if (!authed || handshake(s.fd) == 0) {
    if (size > 1) (void)!send(s.fd, data + 1, size - 1, MSG_NOSIGNAL);
    shutdown(s.fd, SHUT_WR);
    drain(s.fd);
  }
  sock_close(&s);
  return 0;
}
