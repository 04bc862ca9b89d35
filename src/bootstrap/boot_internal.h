/* Bootstrap internals shared by bootstrap.c (rank side), root.c (rendezvous) and peer.c (messages
 * between ranks). Wire structures are exchanged between processes of the same build only: the
 * root rejects joins whose sizes or versions differ. */
#ifndef CH_BOOT_INTERNAL_H
#define CH_BOOT_INTERNAL_H

#include <stddef.h>
#include <stdint.h>

#include "bootstrap.h"

#define BOOT_ID_MAGIC 0x4348524253310001ull /* "CHRBS1" + unique id format 1 */
#define BOOT_KIND_JOIN 1u                   /* a rank joining at the root */
#define BOOT_KIND_PEER 2u                   /* a rank connecting to another rank */
#define BOOT_HELLO_TIMEOUT_NS (5ull * 1000000000ull) /* slower hellos are dropped */

/* Internal tags; user tags (BOOT_TAG_*, transport tags) are non-negative. */
#define BOOT_TAG_ALLGATHER (-1)
#define BOOT_TAG_BARRIER (-2)

/* Layout of the 128-byte unique id. */
struct boot_id {
  uint64_t magic;
  uint64_t secret;
  union sock_addr root;
  uint32_t fixed; /* 1: NCCL_COMM_ID address; rank 0 runs the root inside boot_init */
};

/* First bytes of every bootstrap connection. */
struct boot_hello {
  uint64_t magic;
  uint64_t secret;
  uint32_t kind;
  uint32_t arg; /* JOIN: sizeof(struct boot_rank_info); PEER: sender rank */
};

/* Follows a JOIN hello. */
struct boot_join {
  uint64_t timeout_ms; /* time left before this rank's deadline (0 = none): the root reports by then */
  uint32_t to_rank;    /* unused by JOIN (0) */
  uint32_t pad;
  struct boot_rank_info info;
};

/* Follows a PEER hello: who the connection is meant for (guards against stale addresses). */
struct boot_peer_hello {
  uint32_t to_rank;
  uint32_t nranks;
};

/* Root → rank answer. */
enum { BOOT_REPLY_TABLE = 1, BOOT_REPLY_ERROR = 2 };
struct boot_reply {
  uint32_t type;
  uint32_t status; /* ch_status for ERROR */
  uint64_t len;    /* payload bytes: the rank table, or the error text (no NUL) */
};

/* Message header between ranks. */
struct boot_msg_hdr {
  int32_t tag;
  uint32_t pad;
  uint64_t size;
};

/* Start the root on `addr` (port 0 = ephemeral) in a detached thread; the bound address is
 * returned in *bound. It serves one job, then exits. */
ch_status boot_root_start(const union sock_addr* addr, uint64_t magic, uint64_t secret, union sock_addr* bound);

/* "3,5-7" for the ranks i < n with flags[i] == want; truncated with "..." if buf is short. */
void boot_format_ranks(const unsigned char* flags, int n, unsigned char want, char* buf, size_t len);

/* Peer layer (peer.c). */
ch_status boot_peers_create(struct boot_state** out, int rank, int nranks, uint64_t magic, uint64_t secret,
                            const union sock_addr* addrs, struct sock* listener, const volatile int* abort,
                            uint64_t deadline_ns);

#endif
