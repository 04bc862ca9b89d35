/* libFuzzer target: bytes sent to a rank's bootstrap listener, by a stranger (raw) or by a rank of the
 * job (authenticated first flight, then the rest as records: headers with any type, tag, size and
 * number). The rank drives its peer layer with a short receive after each input. It must reject,
 * bound or queue what arrives, never crash, leak or allocate without bound, and keep serving.
 *   first byte bit 0 clear: raw bytes;  set: authenticated as the next rank of a large job
 *   bit 1 set (authenticated): the rest is read 4 bytes a record, {type, tag, size, number}, so that
 *   closes (BYE, BYE_ACK where none was asked for, unknown types) and message numbers (in order, ahead,
 *   repeated) come up often; a record's payload is zeros */
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "bootstrap/boot_internal.h"
#include "misc/utils.h"

#define NRANKS 4096 /* each authenticated input claims a fresh rank, connection count 0 (accepted once per rank) */
#define IDLE (NRANKS - 1) /* never claimed: waiting on it (briefly) drives the peer layer */

static struct boot_key key;
static struct boot_state* me;
static union sock_addr* addrs;
static int next_rank = 1;

static void setup(void) {
  setenv("NCCL_DEBUG", getenv("FUZZ_DEBUG") ? getenv("FUZZ_DEBUG") : "", 1); /* quiet by default */
  if (boot_key_random(&key) != CH_OK) abort();
  union sock_addr any;
  struct sock l = {.fd = -1};
  if (sock_parse_addr("127.0.0.1:0", &any) != CH_OK || sock_listen(&any, &l) != CH_OK) abort();
  addrs = calloc(NRANKS, sizeof(*addrs));
  if (!addrs) abort();
  /* Other ranks "listen" on port 1 of loopback: nothing does, so a probe finds them gone. */
  for (int r = 1; r < NRANKS; r++)
    if (sock_parse_addr("127.0.0.1:1", &addrs[r]) != CH_OK) abort();
  addrs[0] = l.addr;
  if (boot_peers_create(&me, 0, NRANKS, BOOT_ID_MAGIC, &key, addrs, &l, NULL, 0) != CH_OK) abort();
}

int LLVMFuzzerTestOneInput(const unsigned char* data, size_t size) {
  static int ready;
  if (!ready) setup(), ready = 1;
  if (size == 0) return 0;
  struct sock s = {.fd = -1};
  struct sock_wait w = {NULL, ut_now_ns() + 2000000000ull};
  /* The rank accepts only while it waits in a bootstrap call (there is no background thread): if the
   * listen backlog is full, let it wait a little and try again. Still refused after that: a bug. */
  for (int tries = 0; sock_connect(&addrs[0], &s, &w) != CH_OK; tries++) {
    if (tries == 20) abort();
    char drain[64];
    boot_set_deadline(me, ut_now_ns() + 100000000ull);
    (void)boot_recv(me, IDLE, 0, drain, sizeof(drain));
    w.deadline_ns = ut_now_ns() + 500000000ull;
  }
  int from = 0;
  size_t sent = 1;
  if (data[0] & 1) {
    from = next_rank;
    next_rank = next_rank + 1 < IDLE ? next_rank + 1 : 1; /* wrapped: the replayed-count paths */
    struct {
      struct boot_hello h;
      struct boot_peer_proof p;
    } first;
    if (boot_hello_init(&first.h, BOOT_KIND_PEER, (uint32_t)from, 0, NRANKS) != CH_OK) abort();
    boot_peer_mac(&key, 0, &first.h, &addrs[0], first.p.mac);
    (void)!send(s.fd, &first, sizeof(first), MSG_NOSIGNAL);
    static const unsigned char zeros[64];
    for (uint64_t seq = 0; (data[0] & 2) && sent + 4 <= size; sent += 4) {
      const unsigned char* r = data + sent;
      struct boot_msg_hdr h = {(int8_t)r[1], r[0] % 4u, r[2] % 64u, 0};
      h.seq = r[3] < 128 ? seq++ : r[3] < 192 ? seq + (r[3] & 7) : (uint64_t)r[3] << (r[3] & 31);
      if (h.type != BOOT_REC_MSG && r[3] & 1) h.size = h.seq = 0, h.tag = 0; /* a well-formed BYE or BYE_ACK */
      (void)!send(s.fd, &h, sizeof(h), MSG_NOSIGNAL);
      if (h.size) (void)!send(s.fd, zeros, h.size, MSG_NOSIGNAL);
    }
  }
  if (size > sent) (void)!send(s.fd, data + sent, size - sent, MSG_NOSIGNAL);
  /* Let rank 0's peer layer read it: a short receive from that rank (any outcome is fine). */
  char buf[64];
  boot_set_deadline(me, ut_now_ns() + 5000000ull);
  (void)boot_recv(me, from ? from : IDLE, 0, buf, sizeof(buf));
  /* Close with a reset: a normal close leaves this end in TIME_WAIT, and hundreds of inputs a second
   * would use up loopback's ephemeral ports (connects then fail with EADDRNOTAVAIL: not the rank's
   * fault). The rank sees ECONNRESET instead of EOF, a path worth fuzzing too. */
  struct linger lg = {1, 0};
  setsockopt(s.fd, SOL_SOCKET, SO_LINGER, &lg, sizeof(lg));
  sock_close(&s);
  boot_set_deadline(me, ut_now_ns() + 5000000ull);
  (void)boot_recv(me, IDLE, 0, buf, sizeof(buf)); /* and see the close (a lost rank returns at once) */
  return 0;
}
