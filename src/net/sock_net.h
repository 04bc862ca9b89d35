/* Chorus's socket network as an ncclNet_v12_t ("Socket", sock_net.c): TCP sockets behind NCCL's
 * net interface, so that the fabric transport (transport/fabric.c) can drive them as it drives OFI
 * or a plugin, and so that libnccl-net-chorus-socket.so can offer them to NCCL. The tuned socket
 * transport (transport/tcp.c) stays the default row: CHORUS_SOCKET_NET=1 makes NCCL_NET's "Socket"
 * this table instead (docs/CLUSTER.md; the speed of the two is compared in docs/PERFORMANCE.md).
 *
 * Wire formats, all little-endian, decoded here by pure functions (sock_wire.c, fuzzed by
 * fuzz/fuzz_socknet.c) before any field is used:
 *   handle (40 of NCCL's 128 bytes): magic, version, family, port, scope, address, nonce;
 *   hello (16 bytes, connector to listener): magic, version, nonce (the listener's, from the handle);
 *   message header (16 bytes, before each message): magic, tag, size.
 * A message goes to the oldest posted receive with an unfilled buffer of its tag (NCCL's grouped
 * receives: each tag's messages in order, the tags of a group in any order). */
#ifndef CH_NET_SOCK_NET_H
#define CH_NET_SOCK_NET_H

#include <stddef.h>
#include <stdint.h>

#include "../misc/socket.h"
#include "net_abi.h"

#define SN_VERSION 1
#define SN_HANDLE_MAGIC 0x48534e43u /* "CNSH" */
#define SN_HELLO_MAGIC 0x4c534e43u  /* "CNSL" */
#define SN_MSG_MAGIC 0x4d534e43u    /* "CNSM" */
#define SN_HANDLE_BYTES 40
#define SN_HELLO_BYTES 16
#define SN_MSG_BYTES 16
#define SN_MAX_RECVS 8 /* largest n of a grouped receive */

/* What a handle says: where to connect, and the nonce the hello must repeat. */
struct sn_handle {
  union sock_addr addr; /* AF_INET or AF_INET6 with a non-zero port */
  uint64_t nonce;
};

/* Encodes into buf (len >= SN_HANDLE_BYTES; the rest of buf is zeroed). 0, or -1 for a bad address. */
int sn_handle_encode(const struct sn_handle* h, void* buf, size_t len);
/* Decodes a handle from a peer: 0 and *out, or -1 with *why (static text). */
int sn_handle_decode(const void* buf, size_t len, struct sn_handle* out, const char** why);

void sn_hello_encode(uint64_t nonce, unsigned char out[SN_HELLO_BYTES]);
/* 0 when the hello has the magic, the version and the expected nonce; else -1 with *why. */
int sn_hello_check(const unsigned char in[SN_HELLO_BYTES], uint64_t nonce, const char** why);

void sn_msg_encode(int tag, uint64_t size, unsigned char out[SN_MSG_BYTES]);
/* A message header from the peer: 0 with its tag and size, or -1 with *why (no magic: the stream is
 * out of step). The size is not trusted until sn_group_pick has bounded it. */
int sn_msg_decode(const unsigned char in[SN_MSG_BYTES], int* tag, uint64_t* size, const char** why);
/* Where a message of `tag` and `size` goes in a grouped receive of n (1..SN_MAX_RECVS) buffers: tags[i]
 * and caps[i] as posted, filled[i] set for buffers already received. 0 with *idx (the first unfilled
 * buffer of that tag); 1 when none is unfilled (the message is a later receive's); -1 with *why when
 * it is larger than its buffer (or n is out of range). */
int sn_group_pick(int n, const int* tags, const size_t* caps, const unsigned char* filled, int tag, uint64_t size,
                  int* idx, const char** why);

extern const ncclNet_v12_t ch_sock_net;

#endif
