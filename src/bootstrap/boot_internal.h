/* Bootstrap internals shared by bootstrap.c (rank side), root.c (rendezvous), peer.c (messages
 * between ranks) and auth.c (keys and the handshake). Wire structures are exchanged between
 * processes of the same build only: the root rejects joins whose sizes or versions differ. */
#ifndef CH_BOOT_INTERNAL_H
#define CH_BOOT_INTERNAL_H

#include <stddef.h>
#include <stdint.h>

#include "bootstrap.h"

/* "CHRBS1" + format 4 (key + handshake + the root's ACCEPTED; 4: a peer hello's connection count, record
 * types and message numbers between ranks) */
#define BOOT_ID_MAGIC 0x4348524253310004ull
#define BOOT_KIND_JOIN 1u                   /* a rank joining at the root */
#define BOOT_KIND_PEER 2u                   /* a rank connecting to another rank */
#define BOOT_KIND_QUERY 3u                  /* a stall query (query.c) */
#define BOOT_HELLO_TIMEOUT_NS (5ull * UT_NS_PER_S) /* connections not authenticated by then are closed */
#define BOOT_MAX_RANKS (1 << 18)
/* Largest bootstrap message: the library sends small records (rank infos, addresses, connection
 * handles, a few hundred bytes per rank); 16 MiB leaves room for tables of every rank while
 * keeping what a broken peer can make us allocate small. */
#define BOOT_MAX_MSG (16ull << 20)
/* Unexpected messages queued per peer; beyond either bound the peer is dropped. */
#define BOOT_MAX_QUEUED_BYTES (64ull << 20)
#define BOOT_MAX_QUEUED_MSGS 16384
#define BOOT_LIVENESS_NS UT_NS_PER_S   /* waiting this long for a silent peer probes its listener */
#define BOOT_REFUSED_GRACE_MS 1000     /* a refused connection to a listener known to exist is retried this long */
/* A rank tells its root(s) it has the whole table by this byte; the root watches every rank's join
 * connection until then, and one that closes first fails the job at once (root.c). */
#define BOOT_DONE_BYTE 0x44
#define BOOT_NONCE 32
#define BOOT_MAC 32

/* Internal tags; user tags (BOOT_TAG_*, transport tags) are non-negative. */
#define BOOT_TAG_ALLGATHER (-1)
#define BOOT_TAG_BARRIER (-2)
#define BOOT_TAG_ALLGATHER_UP (-3) /* allgather slots sent to the lower partner */

/* Layout of the 128-byte unique id. */
struct boot_id {
  uint64_t magic;
  unsigned char key[32];
  union sock_addr root;
  uint32_t fixed; /* 1: NCCL_COMM_ID address; rank 0 runs the root inside boot_init */
  uint32_t mode;  /* BOOT_AUTH_* */
};

/* Handshakes; the key itself never travels, and nothing else is read from a side before its proof
 * checked out.
 * Rank to root (the root is a thread of its own, so a round trip is cheap): the client sends a
 * hello with its nonce; the root answers {nonce_s, HMAC(key, "server" || hello || nonce_s)}; the
 * client checks it and answers HMAC(key, "client" || hello || nonce_s), then its join. The root
 * answers a good proof with a BOOT_REPLY_ACCEPTED header at once: a connection lost before that
 * was cut off by the root making room (root.c), and the rank connects again; one lost after it
 * means the root failed.
 * Rank to rank: a sender must not wait for the receiver (one thread may drive several ranks of a
 * group, and small sends always completed at once), so the client proves itself in its first
 * flight: hello (fresh nonce, from/to ranks) + HMAC(key, "client" || hello || server address), and
 * may send messages right behind it. The server checks it, then answers
 * HMAC(key, "server" || hello || server address), which the client checks before it reads
 * anything else from that connection. The server's listen address in the MAC binds the proof to
 * one listener, and the hello's `gen` to one connection: a rank may connect to another again after
 * a close (peer_close.c), but each count is accepted once and only in increasing order, so a
 * recorded flight cannot be replayed. */
struct boot_hello {
  uint64_t magic;
  uint32_t kind;
  uint32_t arg;     /* JOIN: sizeof(struct boot_rank_info); PEER: sender rank */
  uint32_t to_rank; /* PEER: the rank meant (guards against stale addresses); JOIN: 0 */
  uint32_t nranks;
  uint32_t gen; /* PEER: connections the sender opened to to_rank before this one; else 0 */
  uint32_t pad;
  unsigned char nonce[BOOT_NONCE];
};
struct boot_srv_proof {
  unsigned char nonce[BOOT_NONCE];
  unsigned char mac[BOOT_MAC];
};
struct boot_cli_proof {
  unsigned char mac[BOOT_MAC];
};
struct boot_peer_proof { /* rank to rank, either direction */
  unsigned char mac[BOOT_MAC];
};

/* Follows the client proof of a JOIN. */
struct boot_join {
  uint64_t timeout_ms; /* time left before this rank's deadline (0 = none): the root reports by then */
  /* Several roots (ncclCommInitRankScalable): root `iroot` of `nroots` serves the block of ranks
   * boot_root_first(iroot) .. boot_root_first(iroot + 1) - 1 (NCCL's mapping); the first rank of the
   * next block also joins it, with link = 1, so that the block's last rank learns its next rank. */
  uint32_t nroots, iroot, link, pad;
  struct boot_rank_info info;
};

/* Root → rank answer. */
/* 1 was the whole rank table (N x N bytes from the root); the ranks now gather it themselves. */
enum { BOOT_REPLY_ERROR = 2, BOOT_REPLY_ACCEPTED = 3 /* len 0 */, BOOT_REPLY_NEXT = 4 /* struct boot_next */,
       BOOT_REPLY_LINKED = 5 /* len 0: to a link join, once its block is complete */ };
struct boot_reply {
  uint32_t type;
  uint32_t status; /* ch_status for ERROR */
  uint64_t len;    /* payload bytes: struct boot_next, or the error text (no NUL) */
};

/* Record header between ranks, after the handshake. A message is a header and `size` bytes; BYE and
 * BYE_ACK close a connection gracefully (peer_close.c) and carry nothing (tag, size and seq 0). */
enum { BOOT_REC_MSG = 0, BOOT_REC_BYE = 1, BOOT_REC_BYE_ACK = 2 };
struct boot_msg_hdr {
  int32_t tag;
  uint32_t type; /* BOOT_REC_* */
  uint64_t size;
  /* MSG: messages the sender sent to this receiver before this one, over any connection: a message on
   * a new connection may overtake the last ones on a closing one, and the receiver restores the order */
  uint64_t seq;
};

/* auth.c */
ch_status boot_key_random(struct boot_key* key);
/* Key for an NCCL_COMM_ID job: CHORUS_SECRET_FILE, else CHORUS_SECRET, else public (BOOT_AUTH_UID). */
ch_status boot_key_from_env(const char* hostport, struct boot_key* key);
ch_status boot_hello_init(struct boot_hello* h, uint32_t kind, uint32_t arg, uint32_t to_rank, uint32_t nranks);
void boot_mac(const struct boot_key* key, int server, const struct boot_hello* h,
              const unsigned char nonce_s[BOOT_NONCE], unsigned char mac[BOOT_MAC]);
int boot_mac_ok(const struct boot_key* key, int server, const struct boot_hello* h,
                const unsigned char nonce_s[BOOT_NONCE], const unsigned char mac[BOOT_MAC]);
/* Rank-to-rank proof over the hello and the server's listen address (IP and port). */
void boot_peer_mac(const struct boot_key* key, int server, const struct boot_hello* h, const union sock_addr* server_addr,
                   unsigned char mac[BOOT_MAC]);
int boot_peer_mac_ok(const struct boot_key* key, int server, const struct boot_hello* h,
                     const union sock_addr* server_addr, const unsigned char mac[BOOT_MAC]);
/* BOOT_AUTH_UID: 0 if the other end of fd is on another host or is owned by our uid; else -1
 * with *why filled. Always 0 for BOOT_AUTH_SECRET. */
int boot_uid_check(const struct boot_key* key, int fd, const union sock_addr* remote, char* why, size_t len);

/* Start the root on `addr` (port 0 = ephemeral) in a detached thread; the bound address is
 * returned in *bound. It serves one job, then exits. */
ch_status boot_root_start(const union sock_addr* addr, uint64_t magic, const struct boot_key* key,
                          union sock_addr* bound);
/* A rank whose init failed waits (up to max_ns) for the roots of its process that are still telling
 * other ranks why the job failed: its process may exit at once, and the root's thread with it. */
void boot_root_wait_reports(uint64_t max_ns);


/* Peer layer (peer.c). */
ch_status boot_peers_create(struct boot_state** out, int rank, int nranks, uint64_t magic, const struct boot_key* key,
                            const union sock_addr* addrs, struct sock* listener, const volatile int* abort,
                            uint64_t deadline_ns);

/* boot_allgather with a hook: learn(arg, b, lo, count, from) runs on the `count` slots starting at
 * `lo` (modulo nranks) just received from rank `from`, before any of them is forwarded; a failure
 * ends the allgather. Used by boot_init to check the rank table and learn addresses as it arrives. */
typedef ch_status (*boot_ag_learn_fn)(void* arg, struct boot_state* b, int lo, int count, int from);
ch_status boot_allgather_learn(struct boot_state* b, void* data, size_t size, boot_ag_learn_fn learn, void* arg);
/* Record rank's listen address (AF_UNSPEC until known); CH_INTERNAL with a WARN if it was known and differs. */
ch_status boot_learn_addr(struct boot_state* b, int rank, const union sock_addr* addr);
/* Check one rank-table entry received from a peer (rank index, counts, addresses, text fields);
 * 0 if usable, else -1 with *why filled. Text fields are NUL-terminated in place. */
int boot_check_info(struct boot_rank_info* info, int slot, int nranks, char* why, size_t len);
/* Several roots (NCCL's rootIdFromRank / firstRankFromRoot, bootstrap.cc): nranks split into nroots
 * blocks as even as can be, the first nranks % nroots of them one rank larger. */
static inline int boot_root_first(int iroot, int nranks, int nroots) {
  return iroot * (nranks / nroots) + (iroot < nranks % nroots ? iroot : nranks % nroots);
}
static inline int boot_root_of(int rank, int nranks, int nroots) {
  int rem = nranks % nroots, per = nranks / nroots, big = rem * (per + 1);
  return rank < big ? rank / (per + 1) : (rank - big) / per + rem;
}

/* The root's answer to a join, after every rank of the job joined: where our next rank listens. */
struct boot_next {
  int32_t rank, nranks; /* the joiner's, echoed */
  union sock_addr next; /* listen address of rank (rank + 1) % nranks */
  int32_t next_pid;     /* and its pid and host name, for messages until the table arrives */
  char next_host[64];
};

#endif
