/* libFuzzer target: bytes sent to a process's stall query service (bootstrap/query.c), which serves a
 * 1-rank communicator: by a stranger (raw bytes), by a client of our uid without a key, or by a
 * client that proves the job's key (then the input's second byte is the request kind and the rest
 * its body: record, summary, flight recorder dump, metrics). The service must reject or answer within its bounds, close the connection, never crash,
 * leak or hang, and keep serving.
 *   first byte % 3 == 0: raw bytes;  1: keyed request;  2: request without a key (local, same uid) */
#include <errno.h>
#include <poll.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "bootstrap/boot_internal.h"
#include "misc/sha256.h"
#include "misc/utils.h"
#include "nccl.h"
#include "comm/comm.h"

static ncclComm_t comm;
static union sock_addr qaddr;

static void setup(void) {
  setenv("NCCL_DEBUG", getenv("FUZZ_DEBUG") ? getenv("FUZZ_DEBUG") : "", 1); /* quiet by default */
  setenv("CHORUS_DUMP_DIR", "/tmp/chorus-fuzz-query-dumps", 0); /* kind 3 (dump) and record's dump field write here */
  ncclUniqueId id;
  if (ncclGetUniqueId(&id) != ncclSuccess || ncclCommInitRank(&comm, 1, id, 0) != ncclSuccess) abort();
  qaddr = comm->peers[0].query_addr;
  if (qaddr.sa.sa_family == AF_UNSPEC) abort();
}

/* Read until the service closes; it must within its own deadlines (2 s for a request, 5 s to answer). */
static void drain(int fd) {
  uint64_t end = ut_now_ns() + 8000000000ull;
  char buf[4096];
  for (;;) {
    if (ut_now_ns() > end) abort(); /* the service kept a connection open past its deadlines */
    struct pollfd p = {fd, POLLIN, 0};
    if (poll(&p, 1, 100) <= 0) continue;
    ssize_t r = recv(fd, buf, sizeof(buf), 0);
    if (r < 0 && (errno == EINTR || errno == EAGAIN || errno == EWOULDBLOCK)) continue;
    if (r <= 0) return;
  }
}

int LLVMFuzzerTestOneInput(const unsigned char* data, size_t size) {
  static int ready;
  if (!ready) setup(), ready = 1;
  if (size == 0) return 0;
  struct sock s = {.fd = -1};
  struct sock_wait w = {NULL, ut_now_ns() + 2000000000ull};
  if (sock_connect(&qaddr, &s, &w) != CH_OK) abort();
  int mode = data[0] % 3;
  if (mode == 0) {
    if (size > 1) (void)!send(s.fd, data + 1, size - 1, MSG_NOSIGNAL);
  } else {
    const unsigned char* body = size > 2 ? data + 2 : NULL;
    size_t len = size > 2 ? size - 2 : 0;
    if (len > BOOT_QUERY_MAX_REQ) len = BOOT_QUERY_MAX_REQ;
    struct boot_hello h;
    if (boot_hello_init(&h, BOOT_KIND_QUERY, size > 1 ? data[1] % 4 : 0, mode == 1, (uint32_t)len) != CH_OK) abort();
    unsigned char nonce[BOOT_NONCE], mac[BOOT_MAC] = {0};
    (void)!send(s.fd, &h, sizeof(h), MSG_NOSIGNAL);
    size_t got = 0;
    uint64_t end = ut_now_ns() + 2000000000ull;
    while (got < sizeof(nonce)) { /* a well-formed hello always gets a nonce, within 2 s */
      struct pollfd p = {s.fd, POLLIN, 0};
      if (ut_now_ns() > end) abort();
      /* libFuzzer's timeout timer (SIGALRM) interrupts poll: EINTR is no answer yet, not a failure */
      int pr = poll(&p, 1, 100);
      if (pr < 0 && errno != EINTR) abort();
      if (pr <= 0) continue;
      ssize_t r = recv(s.fd, nonce + got, sizeof(nonce) - got, 0);
      if (r < 0 && (errno == EINTR || errno == EAGAIN || errno == EWOULDBLOCK)) continue;
      if (r <= 0) abort();
      got += (size_t)r;
    }
    if (mode == 1) { /* the client MAC as boot_query computes it */
      static const char cli[] = "chorus-query-v1 client";
      const void* parts[4] = {cli, &h, nonce, ""};
      size_t lens[4] = {sizeof(cli), sizeof(h), BOOT_NONCE, 0};
      const struct boot_key* key = boot_secret(comm->boot);
      hmac_sha256(key->k, sizeof(key->k), 4, parts, lens, mac);
    }
    (void)!send(s.fd, mac, sizeof(mac), MSG_NOSIGNAL);
    if (len) (void)!send(s.fd, body, len, MSG_NOSIGNAL);
  }
  shutdown(s.fd, SHUT_WR);
  drain(s.fd);
  struct linger lg = {1, 0}; /* no TIME_WAIT: hundreds of inputs a second would use up loopback's ports */
  setsockopt(s.fd, SOL_SOCKET, SO_LINGER, &lg, sizeof(lg));
  sock_close(&s);
  return 0;
}
