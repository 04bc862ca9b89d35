/* libFuzzer target: bytes sent to the network proxy's listener, by a stranger (raw hello bytes) or by
 * an authenticated sender (a valid first flight for a fresh receive FIFO, then the fuzzed rest as
 * step headers and payloads: any byte count, the goodbye and poison markers, truncation). The
 * proxy thread must reject or bound what arrives, never crash or write outside the FIFO, and keep
 * serving; the rank side here consumes whatever the proxy publishes.
 * A third mode plays the receiver of one of our senders: the rest comes back against the data
 * direction (goodbye bytes, 'P' + a poison record, garbage), which the sending proxy must parse.
 *   first byte % 3 == 0: raw bytes;  1: authenticated, then the rest;  2: back to a sender
 * In modes 0 and 1, bit 3 of the first byte makes the rank read the socket itself while it waits
 * (tp_tcp_poll: the carry buffer, the hand-backs to the proxy) and bit 4 makes it also give the socket
 * back now and then (tp_tcp_idle), as a rank that sleeps does. */
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "misc/utils.h"
#include "transport/tcp.h"

static unsigned char key[32];
static union sock_addr lo;
static _Atomic int async_err;
static volatile int no_abort;
static const struct tp_sizes sz = {{CH_STEPS * 4096, CH_STEPS * 4096, CH_STEPS * 4096}};

static void setup(void) {
  setenv("NCCL_DEBUG", getenv("FUZZ_DEBUG") ? getenv("FUZZ_DEBUG") : "", 1); /* quiet by default */
  if (ut_random(key, sizeof(key)) != CH_OK || sock_parse_addr("127.0.0.1:0", &lo) != CH_OK) abort();
}

static void pause_us(long us) {
  struct timespec ts = {0, us * 1000};
  nanosleep(&ts, NULL);
}

/* Our sender connects to a listener of ours; the fuzzed bytes are the "receiver's" answers. */
static void back_to_sender(const unsigned char* data, size_t size) {
  struct sock l = {.fd = -1};
  if (sock_listen(&lo, &l) != CH_OK) abort();
  struct tp_ctx x = {1, &lo, &lo, 0, key, 0, &async_err, &no_abort, NULL, 0, NULL, NULL, NULL};
  struct tp_handle h = {.kind = TP_TCP, .bytes = tp_fifo_bytes(&sz), .token = 1, .addr = l.addr};
  struct conn sc = {0};
  sc.peer = 0;
  if (tp_tcp_send_connect(&sc, &sz, &h, &x) != CH_OK) abort();
  int fd = accept(l.fd, NULL, NULL);
  if (fd < 0) abort();
  (void)!send(fd, data, size, MSG_NOSIGNAL);
  for (uint64_t end = ut_now_ns() + 3000000ull; ut_now_ns() < end;) pause_us(200); /* the proxy reads */
  struct linger lg = {1, 0};
  setsockopt(fd, SOL_SOCKET, SO_LINGER, &lg, sizeof(lg));
  close(fd);
  tp_conn_free(&sc);
  sock_close(&l);
  atomic_store(&async_err, 0);
}

int LLVMFuzzerTestOneInput(const unsigned char* data, size_t size) {
  static int ready;
  if (!ready) setup(), ready = 1;
  if (size == 0) return 0;
  if (data[0] % 3 == 2) {
    back_to_sender(data + 1, size - 1);
    return 0;
  }
  struct tp_ctx x = {0, &lo, &lo, 0, key, 0, &async_err, &no_abort, NULL, 0, NULL, NULL, NULL};
  struct conn rc = {0};
  struct tp_handle h;
  rc.peer = 1;
  if (tp_tcp_recv_setup(&rc, &sz, &h, &x) != CH_OK) abort();
  struct sock s = {.fd = -1};
  struct sock_wait w = {NULL, ut_now_ns() + 2000000000ull};
  if (sock_connect(&h.addr, &s, &w) != CH_OK) abort(); /* the proxy always accepts (backlog, then authenticates) */
  if (data[0] % 3 == 1) {
    struct tcp_hello hello;
    memset(&hello, 0, sizeof(hello));
    hello.magic = TCP_MAGIC;
    hello.token = h.token;
    hello.from_rank = 1;
    hello.to_rank = 0;
    tcp_hello_mac(key, &hello, h.nonce, &h.addr, hello.mac);
    (void)!send(s.fd, &hello, sizeof(hello), MSG_NOSIGNAL);
  }
  if (size > 1) (void)!send(s.fd, data + 1, size - 1, MSG_NOSIGNAL);
  /* Act as the rank: take every step the proxy publishes, until nothing moves for a few ms. */
  uint64_t seen = 0, quiet_since = ut_now_ns();
  int rank_reads = data[0] & 8, rank_sleeps = data[0] & 16;
  for (int pass = 0; ut_now_ns() - quiet_since < 3000000ull; pass++) {
    if (rank_reads) tp_tcp_poll(&rc);
    if (rank_sleeps && pass % 4 == 3) tp_tcp_idle(&rc);
    uint64_t tail = atomic_load(&rc.ctrl->tail);
    if (tail != seen) {
      if (tail - seen > CH_STEPS) abort(); /* the proxy filled slots it had no credit for */
      for (uint64_t st = seen; st < tail; st++)
        if (rc.ctrl->size[st % CH_STEPS] > rc.slot_bytes[PROTO_SIMPLE]) abort();
      seen = tail;
      atomic_store(&rc.ctrl->head, tail);
      tp_wake(&rc.ctrl->head, &rc.ctrl->send_sleeping);
      quiet_since = ut_now_ns();
    }
    pause_us(200);
  }
  struct linger lg = {1, 0}; /* reset: TIME_WAIT would use up loopback's ports */
  setsockopt(s.fd, SOL_SOCKET, SO_LINGER, &lg, sizeof(lg));
  sock_close(&s);
  tp_conn_free(&rc); /* waits until the proxy lets go of the record */
  atomic_store(&async_err, 0);
  return 0;
}
