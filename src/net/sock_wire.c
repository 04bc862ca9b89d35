/* The socket network's wire formats (sock_net.h): pure encoders and decoders of what peers send,
 * fuzzed by fuzz/fuzz_socknet.c. Bytes are little-endian whatever the host, and read one at a time,
 * so a buffer from a peer needs no alignment. */
#include <arpa/inet.h>
#include <string.h>

#include "sock_net.h"

#define WIRE_INET 4
#define WIRE_INET6 6

static void put16(unsigned char* p, uint16_t v) { p[0] = (unsigned char)v, p[1] = (unsigned char)(v >> 8); }
static void put32(unsigned char* p, uint32_t v) {
  for (int i = 0; i < 4; i++) p[i] = (unsigned char)(v >> (8 * i));
}
static void put64(unsigned char* p, uint64_t v) {
  for (int i = 0; i < 8; i++) p[i] = (unsigned char)(v >> (8 * i));
}
static uint16_t get16(const unsigned char* p) { return (uint16_t)(p[0] | p[1] << 8); }
static uint32_t get32(const unsigned char* p) {
  uint32_t v = 0;
  for (int i = 3; i >= 0; i--) v = v << 8 | p[i];
  return v;
}
static uint64_t get64(const unsigned char* p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; i--) v = v << 8 | p[i];
  return v;
}

/* Handle: 0 magic, 4 version(16), 6 family(16: 4 or 6), 8 port(16, host order), 10 zero(16),
 * 12 IPv6 scope(32), 16 address(16: IPv4 in the first 4), 32 nonce(64). */
int sn_handle_encode(const struct sn_handle* h, void* buf, size_t len) {
  if (!h || !buf || len < SN_HANDLE_BYTES) return -1;
  unsigned char* p = buf;
  memset(p, 0, len);
  put32(p, SN_HANDLE_MAGIC);
  put16(p + 4, SN_VERSION);
  if (h->addr.sa.sa_family == AF_INET) {
    put16(p + 6, WIRE_INET);
    put16(p + 8, ntohs(h->addr.sin.sin_port));
    memcpy(p + 16, &h->addr.sin.sin_addr, 4);
  } else if (h->addr.sa.sa_family == AF_INET6) {
    put16(p + 6, WIRE_INET6);
    put16(p + 8, ntohs(h->addr.sin6.sin6_port));
    put32(p + 12, h->addr.sin6.sin6_scope_id);
    memcpy(p + 16, &h->addr.sin6.sin6_addr, 16);
  } else {
    return -1;
  }
  put64(p + 32, h->nonce);
  return 0;
}

int sn_handle_decode(const void* buf, size_t len, struct sn_handle* out, const char** why) {
  const unsigned char* p = buf;
  memset(out, 0, sizeof(*out));
  *why = NULL;
  if (!p || len < SN_HANDLE_BYTES) *why = "shorter than a socket handle";
  else if (get32(p) != SN_HANDLE_MAGIC) *why = "not a Chorus socket handle (magic)";
  else if (get16(p + 4) != SN_VERSION) *why = "a socket handle of another version";
  else if (get16(p + 8) == 0) *why = "port 0";
  else if (get16(p + 10) != 0) *why = "reserved bytes set";
  if (*why) return -1;
  uint16_t fam = get16(p + 6), port = get16(p + 8);
  static const unsigned char zero[16];
  if (fam == WIRE_INET) {
    if (get32(p + 12) != 0 || memcmp(p + 20, zero, 12) != 0) *why = "IPv4 handle with IPv6 bytes set";
    out->addr.sin.sin_family = AF_INET;
    out->addr.sin.sin_port = htons(port);
    memcpy(&out->addr.sin.sin_addr, p + 16, 4);
    if (!*why && (out->addr.sin.sin_addr.s_addr == htonl(INADDR_ANY) ||
                  out->addr.sin.sin_addr.s_addr == htonl(INADDR_BROADCAST)))
      *why = "a wildcard or broadcast address";
  } else if (fam == WIRE_INET6) {
    out->addr.sin6.sin6_family = AF_INET6;
    out->addr.sin6.sin6_port = htons(port);
    out->addr.sin6.sin6_scope_id = get32(p + 12);
    memcpy(&out->addr.sin6.sin6_addr, p + 16, 16);
    if (!memcmp(p + 16, zero, 16)) *why = "the IPv6 wildcard address";
  } else {
    *why = "an address family other than IPv4 and IPv6";
  }
  if (*why) {
    memset(out, 0, sizeof(*out));
    return -1;
  }
  out->nonce = get64(p + 32);
  return 0;
}

void sn_hello_encode(uint64_t nonce, unsigned char out[SN_HELLO_BYTES]) {
  memset(out, 0, SN_HELLO_BYTES);
  put32(out, SN_HELLO_MAGIC);
  put16(out + 4, SN_VERSION);
  put64(out + 8, nonce);
}

int sn_hello_check(const unsigned char in[SN_HELLO_BYTES], uint64_t nonce, const char** why) {
  *why = NULL;
  if (get32(in) != SN_HELLO_MAGIC) *why = "not a Chorus socket hello";
  else if (get16(in + 4) != SN_VERSION) *why = "a hello of another version";
  else if (get64(in + 8) != nonce) *why = "a hello with the wrong nonce (not for this listener)";
  return *why ? -1 : 0;
}

/* Message header: 0 magic, 4 tag(32, signed), 8 size(64). */
void sn_msg_encode(int tag, uint64_t size, unsigned char out[SN_MSG_BYTES]) {
  put32(out, SN_MSG_MAGIC);
  put32(out + 4, (uint32_t)tag);
  put64(out + 8, size);
}

int sn_msg_decode(const unsigned char in[SN_MSG_BYTES], int* tag, uint64_t* size, const char** why) {
  *why = NULL;
  *tag = 0;
  *size = 0;
  if (get32(in) != SN_MSG_MAGIC) {
    *why = "a message header without its magic (the stream is out of step)";
    return -1;
  }
  *tag = (int)get32(in + 4);
  *size = get64(in + 8);
  return 0;
}

int sn_group_pick(int n, const int* tags, const size_t* caps, const unsigned char* filled, int tag, uint64_t size,
                  int* idx, const char** why) {
  *why = NULL;
  *idx = -1;
  if (n < 1 || n > SN_MAX_RECVS) {
    *why = "a receive of no buffers";
    return -1;
  }
  int at = -1;
  for (int i = 0; i < n && at < 0; i++)
    if (!filled[i] && tags[i] == tag) at = i;
  if (at < 0) return 1; /* not this receive's: a later one's */
  if (size > caps[at]) {
    *why = "a message larger than the receive posted for it";
    return -1;
  }
  *idx = at;
  return 0;
}
