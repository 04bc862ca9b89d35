/* libFuzzer target: the socket network's decoders of peer data (net/sock_wire.c): the listen handle
 * connect() is given (from the peer, through the bootstrap), the hello accept() reads, and the header
 * of every message a receive matches against its posted buffers. Each must refuse or bound what it
 * gets and never read past its input (every slice is copied into a buffer of exactly its size, so
 * ASan sees an over-read); what it accepts must be well-formed and encode back to the same bytes.
 * Input layout: byte 0: handle length (% 64); byte 1: n of the grouped receive (% 10, so 0 and 9 are
 * tried); bytes 2-9: the listener's nonce; then n (tag byte, capacity byte, filled byte) triples; then
 * the handle, the 16-byte hello and message headers of 16 bytes while input lasts. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "net/sock_net.h"

#define CHECK_OR_ABORT(cond) \
  do {                       \
    if (!(cond)) abort();    \
  } while (0)

static void* dup_exact(const uint8_t* p, size_t n) {
  void* q = malloc(n ? n : 1);
  CHECK_OR_ABORT(q);
  if (n) memcpy(q, p, n);
  return q;
}

int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 10) return 0;
  size_t hlen = data[0] % 64;
  int n = data[1] % 10;
  uint64_t nonce;
  memcpy(&nonce, data + 2, 8);
  size_t off = 10;
  int tags[SN_MAX_RECVS + 1];
  size_t caps[SN_MAX_RECVS + 1];
  unsigned char filled[SN_MAX_RECVS + 1];
  for (int i = 0; i < n; i++) {
    if (off + 3 > size) return 0;
    tags[i] = data[off], caps[i] = data[off + 1], filled[i] = data[off + 2] & 1;
    off += 3;
  }

  /* the handle */
  if (off + hlen > size) return 0;
  void* h = dup_exact(data + off, hlen);
  off += hlen;
  struct sn_handle out;
  const char* why = NULL;
  if (sn_handle_decode(h, hlen, &out, &why) == 0) {
    CHECK_OR_ABORT(hlen >= SN_HANDLE_BYTES && !why);
    CHECK_OR_ABORT(out.addr.sa.sa_family == AF_INET || out.addr.sa.sa_family == AF_INET6);
    unsigned char again[SN_HANDLE_BYTES];
    CHECK_OR_ABORT(sn_handle_encode(&out, again, sizeof(again)) == 0);
    CHECK_OR_ABORT(memcmp(again, h, SN_HANDLE_BYTES) == 0);
  } else {
    CHECK_OR_ABORT(why && out.addr.sa.sa_family == 0 && out.nonce == 0);
  }
  free(h);

  /* the hello */
  if (off + SN_HELLO_BYTES > size) return 0;
  unsigned char* hello = dup_exact(data + off, SN_HELLO_BYTES);
  off += SN_HELLO_BYTES;
  if (sn_hello_check(hello, nonce, &why) == 0) {
    unsigned char mine[SN_HELLO_BYTES];
    sn_hello_encode(nonce, mine);
    CHECK_OR_ABORT(memcmp(mine, hello, SN_HELLO_BYTES) == 0 || hello[6] || hello[7]); /* padding unread */
  } else {
    CHECK_OR_ABORT(why);
  }
  free(hello);

  /* message headers, filling the group as a receive would */
  while (off + SN_MSG_BYTES <= size) {
    unsigned char* m = dup_exact(data + off, SN_MSG_BYTES);
    off += SN_MSG_BYTES;
    int idx, tag;
    uint64_t sz;
    if (sn_msg_decode(m, &tag, &sz, &why) == 0) {
      int k = sn_group_pick(n, tags, caps, filled, tag, sz, &idx, &why);
      if (k == 0) {
        CHECK_OR_ABORT(n >= 1 && n <= SN_MAX_RECVS && idx >= 0 && idx < n);
        CHECK_OR_ABORT(!filled[idx] && tags[idx] == tag && sz <= caps[idx]);
        filled[idx] = 1;
      } else if (k == 1) {
        CHECK_OR_ABORT(idx == -1 && n >= 1 && n <= SN_MAX_RECVS);
        for (int i = 0; i < n; i++) CHECK_OR_ABORT(filled[i] || tags[i] != tag);
      } else {
        CHECK_OR_ABORT(k == -1 && why && idx == -1);
      }
    } else {
      CHECK_OR_ABORT(why);
    }
    free(m);
  }
  return 0;
}
