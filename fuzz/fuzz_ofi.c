/* libFuzzer target: the built-in libfabric network's decoders of peer data (net/ofi_wire.c), which are pure
 * functions and build without libfabric: the 128-byte listen handle that connect() is given (it comes
 * from the peer through the bootstrap), the connection message that accept() receives, and the
 * printable form of a peer's endpoint name. Each must reject or bound what it gets, never read past
 * the length it was given (every slice is copied into a buffer of exactly its size, so ASan sees an
 * over-read), and what it accepts must be well-formed and survive encoding and decoding again.
 * Input layout:
 *   byte 0: flags. bit 0: patch the handle's header to what is expected (so the accept paths are
 *           reached at once); bit 1: same for the connection message; bit 2: the handle is exactly
 *           128 bytes (as connect() passes it) rather than the length byte's; bits 3-4: address family
 *           for the name's printable form (0, 4, 6).
 *   bytes 1-4: expected address format; byte 5: shortest name allowed (% 64); bytes 6-9: expected id
 *   (the listener's); bytes 10-17: expected nonce; byte 18: handle length (% 160); byte 19: buffer
 *   length for the name's printable form (1 + % 128); then the handle bytes, then the message bytes. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "net/ofi.h"

#define NCCL_HANDLE 128 /* NCCL_NET_HANDLE_MAXSIZE */
#define PARAMS 20

#define CHECK_OR_ABORT(cond) \
  do {                       \
    if (!(cond)) abort();    \
  } while (0)

static void* dup_exact(const void* p, size_t n) {
  void* q = malloc(n ? n : 1);
  CHECK_OR_ABORT(q);
  if (n) memcpy(q, p, n);
  return q;
}

static int all_zero(const void* p, size_t n) {
  const uint8_t* b = p;
  for (size_t i = 0; i < n; i++)
    if (b[i]) return 0;
  return 1;
}

static size_t bounded_len(const char* s, size_t max) { /* strnlen, without needing POSIX */
  size_t n = 0;
  while (n < max && s[n]) n++;
  return n;
}

/* A handle was accepted: check every promise, then encode it and decode that again. */
static void handle_accepted(const uint8_t* in, size_t len, uint16_t ver, uint32_t fmt, size_t min,
                            const struct ofi_handle* h) {
  CHECK_OR_ABORT(h->magic == OFI_HANDLE_MAGIC && h->version == ver && h->addr_format == fmt && h->id != 0);
  CHECK_OR_ABORT(h->name_len >= 1 && h->name_len <= OFI_NAME_MAX && h->name_len >= min);
  CHECK_OR_ABORT(OFI_HANDLE_HDR + h->name_len <= len);
  CHECK_OR_ABORT(!memcmp(h, in, OFI_HANDLE_HDR));
  CHECK_OR_ABORT(!memcmp(h->name, in + OFI_HANDLE_HDR, h->name_len));
  CHECK_OR_ABORT(all_zero(h->name + h->name_len, OFI_NAME_MAX - h->name_len));
  uint8_t* enc = malloc(NCCL_HANDLE);
  CHECK_OR_ABORT(enc);
  size_t used = ofi_handle_encode(h, enc, NCCL_HANDLE);
  CHECK_OR_ABORT(used == OFI_HANDLE_HDR + h->name_len);
  CHECK_OR_ABORT(!memcmp(enc, in, used) && all_zero(enc + used, NCCL_HANDLE - used));
  struct ofi_handle again;
  const char* why = NULL;
  CHECK_OR_ABORT(ofi_handle_decode(enc, NCCL_HANDLE, ver, fmt, min, &again, &why) == 0);
  CHECK_OR_ABORT(!memcmp(&again, h, sizeof(again)));
  /* The shortest buffer that holds it decodes too; one byte less does not. */
  uint8_t* tight = dup_exact(enc, used);
  CHECK_OR_ABORT(ofi_handle_decode(tight, used, ver, fmt, min, &again, &why) == 0);
  CHECK_OR_ABORT(!memcmp(&again, h, sizeof(again)));
  CHECK_OR_ABORT(ofi_handle_decode(tight, used - 1, ver, fmt, min, &again, &why) != 0 && why);
  CHECK_OR_ABORT(ofi_handle_encode(h, tight, used - 1) == 0);
  free(tight);
  free(enc);
}

static void fuzz_handle(const uint8_t* in, size_t len, uint16_t ver, uint32_t fmt, size_t min) {
  struct ofi_handle h;
  const char* why = NULL;
  memset(&h, 0xa5, sizeof(h)); /* the decoder must set all of it */
  if (ofi_handle_decode(in, len, ver, fmt, min, &h, &why) == 0) {
    handle_accepted(in, len, ver, fmt, min, &h);
  } else {
    CHECK_OR_ABORT(why && why[0]);
    CHECK_OR_ABORT(all_zero(h.name, sizeof(h.name)));
    if (len >= OFI_HANDLE_HDR) CHECK_OR_ABORT(!memcmp(&h, in, OFI_HANDLE_HDR));
    else CHECK_OR_ABORT(all_zero(&h, sizeof(h)));
  }
  (void)ofi_handle_decode(NULL, len, ver, fmt, min, &h, NULL); /* why may be NULL; no buffer: rejected */
}

static void fuzz_ctrl(const uint8_t* in, size_t len, uint32_t id, uint64_t nonce) {
  struct ofi_ctrl m;
  const char* why = NULL;
  const size_t hdr = offsetof(struct ofi_ctrl, who);
  memset(&m, 0xa5, sizeof(m));
  if (ofi_ctrl_decode(in, len, id, nonce, &m, &why) != 0) {
    CHECK_OR_ABORT(why && why[0]);
    CHECK_OR_ABORT(all_zero(m.who, sizeof(m.who)));
    size_t have = len < hdr ? len : hdr;
    CHECK_OR_ABORT(!memcmp(&m, in, have) && all_zero((uint8_t*)&m + have, hdr - have));
    return;
  }
  CHECK_OR_ABORT(len == sizeof(m) && m.magic == OFI_CTRL_MAGIC && m.id == id && m.nonce == nonce);
  size_t n = bounded_len(m.who, sizeof(m.who));
  CHECK_OR_ABORT(n < sizeof(m.who) && all_zero(m.who + n, sizeof(m.who) - n));
  const char* src = (const char*)in + hdr;
  CHECK_OR_ABORT(n == sizeof(m.who) - 1 || src[n] == '\0'); /* cut at the sender's NUL or at the bound */
  for (size_t i = 0; i < n; i++) {
    CHECK_OR_ABORT(m.who[i] >= 0x20 && m.who[i] < 0x7f);
    CHECK_OR_ABORT(src[i] != '\0' && (m.who[i] == src[i] || m.who[i] == '?'));
  }
  /* Round trip: what was accepted, sent again, is accepted unchanged. */
  uint8_t* enc = dup_exact(&m, sizeof(m));
  struct ofi_ctrl again;
  CHECK_OR_ABORT(ofi_ctrl_decode(enc, sizeof(m), id, nonce, &again, &why) == 0);
  CHECK_OR_ABORT(!memcmp(&again, &m, sizeof(m)));
  CHECK_OR_ABORT(ofi_ctrl_decode(enc, sizeof(m) - 1, id, nonce, &again, NULL) != 0);
  CHECK_OR_ABORT(ofi_ctrl_decode(enc, sizeof(m), id ^ 1, nonce, &again, NULL) != 0);
  CHECK_OR_ABORT(ofi_ctrl_decode(enc, sizeof(m), id, nonce ^ 1, &again, NULL) != 0);
  free(enc);
}

static void fuzz_name(int family, const uint8_t* name, size_t len, size_t buflen) {
  char* buf = malloc(buflen);
  CHECK_OR_ABORT(buf);
  CHECK_OR_ABORT(ofi_name_format(family, name, len, buf, buflen) == buf);
  CHECK_OR_ABORT(bounded_len(buf, buflen) < buflen);
  free(buf);
}

/* Known inputs, checked once: a handle as listen() writes it, the connection message connect() sends,
 * and one bad field each. A decoder that rejects its own encoder's output fails here at once. */
static void self_check(void) {
  struct ofi_handle h, out;
  const char* why = NULL;
  uint8_t wire[NCCL_HANDLE];
  memset(&h, 0, sizeof(h));
  h.magic = OFI_HANDLE_MAGIC, h.version = OFI_PROTO_VERSION, h.name_len = 16, h.addr_format = 2, h.id = 7;
  h.nonce = 0x0123456789abcdefull;
  const uint8_t sin[16] = {2, 0, 0x30, 0x39, 127, 0, 0, 1}; /* AF_INET, port 12345, 127.0.0.1 */
  memcpy(h.name, sin, sizeof(sin));
  CHECK_OR_ABORT(ofi_handle_encode(&h, wire, sizeof(wire)) == OFI_HANDLE_HDR + 16);
  CHECK_OR_ABORT(ofi_handle_decode(wire, sizeof(wire), OFI_PROTO_VERSION, 2, 16, &out, &why) == 0);
  CHECK_OR_ABORT(!memcmp(&out, &h, sizeof(h)));
  CHECK_OR_ABORT(ofi_handle_decode(wire, sizeof(wire), OFI_PROTO_VERSION, 3, 16, &out, &why) != 0); /* format */
  CHECK_OR_ABORT(ofi_handle_decode(wire, sizeof(wire), OFI_PROTO_VERSION, 2, 28, &out, &why) != 0); /* short name */
  CHECK_OR_ABORT(ofi_handle_decode(wire, sizeof(wire), OFI_PROTO_VERSION + 1, 2, 16, &out, &why) != 0);
  CHECK_OR_ABORT(ofi_handle_decode(wire, OFI_HANDLE_HDR + 15, OFI_PROTO_VERSION, 2, 16, &out, &why) != 0);
  uint8_t bad[NCCL_HANDLE];
  memcpy(bad, wire, sizeof(bad));
  bad[0] ^= 1; /* magic */
  CHECK_OR_ABORT(ofi_handle_decode(bad, sizeof(bad), OFI_PROTO_VERSION, 2, 16, &out, &why) != 0);
  memcpy(bad, wire, sizeof(bad));
  bad[offsetof(struct ofi_handle, name_len)] = OFI_NAME_MAX + 1;
  CHECK_OR_ABORT(ofi_handle_decode(bad, sizeof(bad), OFI_PROTO_VERSION, 2, 16, &out, &why) != 0);
  memcpy(bad, wire, sizeof(bad));
  memset(bad + offsetof(struct ofi_handle, id), 0, sizeof(h.id));
  CHECK_OR_ABORT(ofi_handle_decode(bad, sizeof(bad), OFI_PROTO_VERSION, 2, 16, &out, &why) != 0);
  char str[64];
  CHECK_OR_ABORT(!strcmp(ofi_name_format(4, h.name, h.name_len, str, sizeof(str)), "127.0.0.1:12345"));
  CHECK_OR_ABORT(!strcmp(ofi_name_format(6, h.name, h.name_len, str, sizeof(str)), "16-byte address 020030397f000001"));
  struct ofi_ctrl c, cm;
  memset(&c, 0, sizeof(c));
  c.magic = OFI_CTRL_MAGIC, c.id = 7, c.nonce = h.nonce;
  strcpy(c.who, "node1 pid 42\n\x1b");
  CHECK_OR_ABORT(ofi_ctrl_decode(&c, sizeof(c), 7, h.nonce, &cm, &why) == 0 && !strcmp(cm.who, "node1 pid 42??"));
  CHECK_OR_ABORT(ofi_ctrl_decode(&c, sizeof(c), 8, h.nonce, &cm, &why) != 0);
  CHECK_OR_ABORT(ofi_ctrl_decode(&c, sizeof(c), 7, h.nonce + 1, &cm, &why) != 0);
  CHECK_OR_ABORT(ofi_ctrl_decode(&c, sizeof(c) - 1, 7, h.nonce, &cm, &why) != 0);
  memset(c.who, 'x', sizeof(c.who)); /* no NUL: cut at the bound */
  CHECK_OR_ABORT(ofi_ctrl_decode(&c, sizeof(c), 7, h.nonce, &cm, &why) == 0 && strlen(cm.who) == sizeof(cm.who) - 1);
}

int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static int ready;
  if (!ready) self_check(), ready = 1;
  if (size < PARAMS) return 0;
  uint8_t flags = data[0];
  uint32_t fmt, id;
  uint64_t nonce;
  memcpy(&fmt, data + 1, 4);
  size_t min = data[5] % 64;
  memcpy(&id, data + 6, 4);
  memcpy(&nonce, data + 10, 8);
  size_t hlen = (flags & 4) ? NCCL_HANDLE : data[18] % 160;
  size_t namebuf = 1 + data[19] % 128;
  const uint8_t* rest = data + PARAMS;
  size_t nrest = size - PARAMS;
  if (hlen > nrest) hlen = nrest;

  /* The handle: an exact-size copy, patched when asked so that decoding gets past the header checks. */
  uint8_t* hb = dup_exact(rest, hlen);
  if ((flags & 1) && hlen >= OFI_HANDLE_HDR) {
    struct ofi_handle p;
    memcpy(&p, hb, OFI_HANDLE_HDR);
    p.magic = OFI_HANDLE_MAGIC;
    p.version = OFI_PROTO_VERSION;
    p.addr_format = fmt;
    p.name_len = (uint16_t)(p.name_len % (OFI_NAME_MAX + 1));
    memcpy(hb, &p, OFI_HANDLE_HDR);
  }
  fuzz_handle(hb, hlen, OFI_PROTO_VERSION, fmt, min);
  int family = (flags >> 3) & 3;
  family = family == 1 ? 4 : family == 2 ? 6 : 0;
  if (hlen > OFI_HANDLE_HDR) /* the name as printed, whatever its length field says */
    fuzz_name(family, hb + OFI_HANDLE_HDR, hlen - OFI_HANDLE_HDR, namebuf);
  free(hb);

  /* The connection message: the rest of the input. */
  size_t mlen = nrest - hlen;
  uint8_t* mb = dup_exact(rest + hlen, mlen);
  if ((flags & 2) && mlen >= offsetof(struct ofi_ctrl, who)) {
    struct ofi_ctrl p;
    memcpy(&p, mb, offsetof(struct ofi_ctrl, who));
    p.magic = OFI_CTRL_MAGIC;
    p.id = id;
    p.nonce = nonce;
    memcpy(mb, &p, offsetof(struct ofi_ctrl, who));
  }
  fuzz_ctrl(mb, mlen, id, nonce);
  free(mb);
  return 0;
}
