/* The bootstrap's collectives between ranks, over boot_send and boot_recv: the allgather by
 * bidirectional doubling and the dissemination barrier. Both talk to the ranks 2^k away only, the
 * partners that the cap on open connections keeps longest (peer_close.c). */
#include <stdlib.h>
#include <string.h>

#include "../misc/log.h"
#include "peer_internal.h"

/* Slots [lo, lo+count) modulo n of data, packed into (out) or unpacked from (in) buf. */
static void ag_copy(char* data, char* buf, int n, int lo, int count, size_t size, int out) {
  for (int k = 0; k < count; k++) {
    char* slot = data + (size_t)(((lo + k) % n + n) % n) * size;
    if (out) memcpy(buf + (size_t)k * size, slot, size);
    else memcpy(slot, buf + (size_t)k * size, size);
  }
}

/* count slots starting at lo to peer (or from it), in messages of at most ~1 MiB (BOOT_MAX_MSG and
 * the peer's queue bound hold at any job size). */
static ch_status ag_xfer(struct boot_state* b, int peer, int tag, char* data, int lo, int count, size_t size, int out,
                         char* buf, int per_msg) {
  for (int k = 0; k < count; k += per_msg) {
    int c = count - k < per_msg ? count - k : per_msg;
    if (out) {
      ag_copy(data, buf, b->nranks, lo + k, c, size, 1);
      CHECK(boot_send(b, peer, tag, buf, (size_t)c * size));
    } else {
      CHECK(boot_recv(b, peer, tag, buf, (size_t)c * size));
      ag_copy(data, buf, b->nranks, lo + k, c, size, 0);
    }
  }
  return CH_OK;
}

/* Bidirectional doubling. Before a step, rank r holds the slots [r-h, r+h]; it talks to the ranks
 * d = max(h, 1) away: it sends up (r+d) the c_lo slots just below that rank's window and down (r-d)
 * the c_hi slots just above that rank's window, and receives the same from them, so its window grows
 * to [r-h-c_lo, r+h+c_hi]. c_lo = c_hi = d until the last step, which fetches only what is still
 * missing. Every rank computes the same counts, so sizes match exactly. About log2(n) steps, each rank
 * receives every slot once (n-1 slots in all), and talks to ~2 log2(n) distinct ranks.
 * The first step (h = 0) needs only the address of rank r+1: the slot from r-1 is received before
 * anything is sent to it, and its connection to us carries our answer. `learn` (may be NULL) checks
 * the slots just received (and may learn addresses from them) before any of them is forwarded. */
ch_status boot_allgather_learn(struct boot_state* b, void* data, size_t size, boot_ag_learn_fn learn, void* arg) {
  int n = b->nranks, r = b->rank;
  if (n == 1) return CH_OK;
  if (size == 0 || size > BOOT_MAX_MSG) {
    WARN("Bootstrap rank %d: allgather slots of %zu bytes (1 to %llu allowed)", r, size,
         (unsigned long long)BOOT_MAX_MSG);
    return CH_INTERNAL;
  }
  size_t per = (1u << 20) / size;
  int per_msg = per < 1 ? 1 : per > (size_t)n ? n : (int)per;
  char* buf = malloc((size_t)per_msg * size);
  if (!buf) {
    WARN("Bootstrap rank %d: out of memory for an allgather of %d x %zu bytes", r, n, size);
    return CH_SYSTEM;
  }
  char* d = data;
  ch_status st = CH_OK;
  for (int h = 0; st == CH_OK && 2 * h + 1 < n;) {
    int dist = h > 0 ? h : 1, missing = n - (2 * h + 1);
    int c_lo = missing < dist ? missing : dist;
    int c_hi = missing - c_lo < dist ? missing - c_lo : dist;
    int up = (r + dist) % n, down = (r - dist + n) % n;
    /* To up: the slots below its window [up-h, up+h]; from down: those below ours. */
    st = ag_xfer(b, up, BOOT_TAG_ALLGATHER, d, up - h - c_lo, c_lo, size, 1, buf, per_msg);
    if (st == CH_OK) st = ag_xfer(b, down, BOOT_TAG_ALLGATHER, d, r - h - c_lo, c_lo, size, 0, buf, per_msg);
    if (st == CH_OK && learn) st = learn(arg, b, r - h - c_lo, c_lo, down);
    if (st == CH_OK && c_hi) st = ag_xfer(b, down, BOOT_TAG_ALLGATHER_UP, d, down + h + 1, c_hi, size, 1, buf, per_msg);
    if (st == CH_OK && c_hi) st = ag_xfer(b, up, BOOT_TAG_ALLGATHER_UP, d, r + h + 1, c_hi, size, 0, buf, per_msg);
    if (st == CH_OK && c_hi && learn) st = learn(arg, b, r + h + 1, c_hi, up);
    h += dist;
  }
  free(buf);
  return st;
}

ch_status boot_allgather(struct boot_state* b, void* data, size_t size) {
  return boot_allgather_learn(b, data, size, NULL, NULL);
}

/* Dissemination: in round k each rank sends an empty token to r+2^k and waits for one from r-2^k;
 * after ceil(log2 n) rounds every rank has heard, through some chain, from every other. The partners
 * are those of boot_allgather (plus at most one farther), so a barrier opens few new sockets. */
ch_status boot_barrier(struct boot_state* b) {
  int n = b->nranks, r = b->rank;
  for (int d = 1; d < n; d *= 2) {
    CHECK(boot_send(b, (r + d) % n, BOOT_TAG_BARRIER, NULL, 0));
    CHECK(boot_recv(b, (r - d + n) % n, BOOT_TAG_BARRIER, NULL, 0));
  }
  return CH_OK;
}
