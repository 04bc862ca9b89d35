/* The OFI network's wire formats: encoding and decoding of the listen handle, the connection message
 * and the clear-to-send, and the printable form of an endpoint name. Pure functions over bytes from
 * peers, with no libfabric in them: unlike the rest of the network they build whether or not
 * libfabric's headers are present (no CHORUS_HAVE_LIBFABRIC here), so that fuzz/fuzz_ofi.c builds and
 * fuzzes them anywhere. Declared, with the layouts they check, in ofi.h. */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <netinet/in.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>

#include "net.h"
#include "ofi.h"

_Static_assert(sizeof(struct ofi_handle) <= NCCL_NET_HANDLE_MAXSIZE, "handle too large");
_Static_assert(sizeof(struct ofi_handle) == OFI_HANDLE_HDR + OFI_NAME_MAX, "handle has padding");
_Static_assert(sizeof(struct ofi_ctrl) == 16 + OFI_WHO_MAX + 16 + OFI_NAME_MAX, "connection message has padding");
_Static_assert(sizeof(struct ofi_cts) == 32, "clear-to-send has padding");

/* ------------------------------------------------------------------------------------------------ */
/* Wire decoders (pure: no libfabric; built with or without it, fuzzed by fuzz/fuzz_ofi.c)           */

size_t ofi_handle_encode(const struct ofi_handle* h, void* buf, size_t len) {
  if (!h || !buf || h->name_len == 0 || h->name_len > OFI_NAME_MAX || len < OFI_HANDLE_HDR + h->name_len) return 0;
  size_t used = OFI_HANDLE_HDR + h->name_len;
  memset(buf, 0, len);
  memcpy(buf, h, used); /* the header, then the name: the struct's layout is the wire's (no padding) */
  return used;
}

int ofi_handle_decode(const void* buf, size_t len, uint16_t version, uint32_t addr_format, size_t min_name_len,
                      struct ofi_handle* out, const char** why) {
  const char* bad = NULL;
  memset(out, 0, sizeof(*out));
  if (!buf || len < OFI_HANDLE_HDR) {
    bad = "shorter than a handle's header";
    goto fail;
  }
  memcpy(out, buf, OFI_HANDLE_HDR); /* the caller's buffer has no alignment promise */
  if (out->magic != OFI_HANDLE_MAGIC) bad = "wrong magic: not a handle of Chorus's OFI network";
  else if (out->version != version) bad = "protocol version differs: mixed Chorus versions";
  else if (out->name_len == 0 || out->name_len > OFI_NAME_MAX) bad = "endpoint name length out of range";
  else if (out->name_len > len - OFI_HANDLE_HDR) bad = "endpoint name runs past the end of the handle";
  else if (out->addr_format != addr_format)
    bad = "address format differs: ranks use different providers or address families (set FI_PROVIDER alike)";
  else if (out->name_len < min_name_len) bad = "endpoint name too short for its address format";
  else if (out->id == 0) bad = "connection id 0";
  else if ((out->flags & ~OFI_FLAGS_KNOWN) || out->reserved) bad = "unknown flags: mixed Chorus versions";
  if (bad) goto fail;
  memcpy(out->name, (const uint8_t*)buf + OFI_HANDLE_HDR, out->name_len);
  return 0;
fail:
  if (why) *why = bad;
  return -1;
}

int ofi_ctrl_decode(const void* msg, size_t len, uint32_t expect_id, uint64_t expect_nonce, struct ofi_ctrl* out,
                    const char** why) {
  const size_t hdr = offsetof(struct ofi_ctrl, who);
  const char* bad = NULL;
  memset(out, 0, sizeof(*out));
  if (msg) memcpy(out, msg, len < hdr ? len : hdr); /* the header bytes present: for the caller's message too */
  if (!msg || len != sizeof(*out)) bad = "wrong size for a connection message";
  else if (out->magic != OFI_CTRL_MAGIC) bad = "wrong magic: not a connection message of Chorus's OFI network";
  else if (out->id != expect_id) bad = "connection id differs from the listener's";
  else if (out->nonce != expect_nonce) bad = "nonce differs from the listener's handle: a stale or stray sender";
  struct ofi_ctrl tail; /* the fields after `who`, checked before any is kept */
  if (!bad) {
    memcpy(&tail, msg, sizeof(tail));
    if ((tail.flags & ~OFI_FLAGS_KNOWN) || tail.reserved || tail.reserved2) bad = "unknown flags: mixed Chorus versions";
    else if (tail.name_len > OFI_NAME_MAX) bad = "endpoint name length out of range";
    else if ((tail.flags & OFI_FLAG_RMA) && (tail.name_len == 0 || tail.cts_id == 0))
      bad = "RMA path without the sender's endpoint name or CTS id";
  }
  if (bad) {
    if (why) *why = bad;
    return -1;
  }
  const char* who = (const char*)msg + hdr;
  for (size_t i = 0; i + 1 < sizeof(out->who) && who[i]; i++) /* printed only: printable ASCII, terminated */
    out->who[i] = who[i] >= 0x20 && who[i] < 0x7f ? who[i] : '?';
  out->name_len = tail.name_len;
  out->flags = tail.flags;
  out->cts_id = tail.cts_id;
  memcpy(out->name, tail.name, tail.name_len);
  return 0;
}

int ofi_cts_decode(const void* msg, size_t len, uint16_t expect_seq, struct ofi_cts* out, const char** why) {
  const char* bad = NULL;
  memset(out, 0, sizeof(*out));
  if (msg) memcpy(out, msg, len < sizeof(*out) ? len : sizeof(*out));
  if (!msg || len != sizeof(*out)) bad = "wrong size for a clear-to-send";
  else if (out->magic != OFI_CTS_MAGIC) bad = "wrong magic: not a clear-to-send of Chorus's OFI network";
  else if (out->flags) bad = "unknown flags: mixed Chorus versions";
  else if (out->seq != expect_seq) bad = "out of sequence: a clear-to-send was lost, repeated or forged";
  if (bad && why) *why = bad;
  return bad ? -1 : 0;
}

const char* ofi_name_format(int family, const uint8_t* name, size_t len, char* buf, size_t buflen) {
  char ip[INET6_ADDRSTRLEN] = "?";
  if (!buf || buflen == 0) return buf;
  buf[0] = '\0';
  if (family == 4 && name && len >= sizeof(struct sockaddr_in)) {
    struct sockaddr_in sin;
    memcpy(&sin, name, sizeof(sin));
    if (!inet_ntop(AF_INET, &sin.sin_addr, ip, sizeof(ip))) snprintf(ip, sizeof(ip), "?");
    snprintf(buf, buflen, "%s:%d", ip, ntohs(sin.sin_port));
  } else if (family == 6 && name && len >= sizeof(struct sockaddr_in6)) {
    struct sockaddr_in6 sin6;
    memcpy(&sin6, name, sizeof(sin6));
    if (!inet_ntop(AF_INET6, &sin6.sin6_addr, ip, sizeof(ip))) snprintf(ip, sizeof(ip), "?");
    snprintf(buf, buflen, "[%s]:%d", ip, ntohs(sin6.sin6_port));
  } else {
    size_t used = (size_t)snprintf(buf, buflen, "%zu-byte address ", len);
    for (size_t i = 0; name && i < len && i < 8 && used + 3 <= buflen; i++)
      used += (size_t)snprintf(buf + used, buflen - used, "%02x", name[i]);
  }
  return buf;
}
