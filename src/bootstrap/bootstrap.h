/* Out-of-band bootstrap over TCP: rendezvous at a root, then peer-to-peer messages between ranks.
 *
 * Trust (docs/SECURITY.md): every job has a 256-bit key. From ncclGetUniqueId it is random and
 * travels in the unique id; with NCCL_COMM_ID it comes from CHORUS_SECRET / CHORUS_SECRET_FILE
 * (chorusrun sets one per job), or, without either, from the public address, in which case only
 * connections from processes of our own uid are admitted on this host. The key is never sent:
 * every connection (rank to root, rank to rank) starts with a mutual challenge-response (both
 * sides send a nonce and prove the key with HMAC-SHA256 over both nonces and the claimed ranks).
 * A connection that fails it is closed with one rate-limited WARN naming the remote address, and
 * the job goes on. Every field read from the wire is bounded and validated.
 *
 * Liveness: a blocking call that waits for a peer it has no connection with probes the peer's
 * listener after ~1 s; a refused connection or an EOF on an established one is CH_REMOTE. */
#ifndef CH_BOOTSTRAP_H
#define CH_BOOTSTRAP_H

#include <stddef.h>
#include <stdint.h>

#include "../misc/socket.h"
#include "../misc/status.h"

/* What each rank tells the root when it joins. The root checks that all ranks agree on nranks,
 * library version and wire version, and fails every rank with one message naming who differs. */
#define BOOT_CPU_WORDS 16
struct boot_rank_info {
  int32_t rank;
  int32_t nranks;
  int32_t lib_version;  /* CHORUS_VERSION_CODE */
  int32_t wire_version; /* param WIRE_VERSION */
  int32_t pid;
  uint64_t host_hash;
  uint64_t pid_ns;     /* ut_pid_ns(): `pid` names a process only within this PID namespace */
  uint64_t proc_nonce; /* ut_proc_nonce(): equal only for ranks that are threads of one process */
  char host_id[96];   /* hostname + boot id (or NCCL_HOSTID), truncated */
  char hostname[64];
  union sock_addr listen_addr; /* where this rank accepts peer connections */
  union sock_addr query_addr;  /* its process's stall query service (AF_UNSPEC: none; query.c) */
  /* CPUs its joining thread may run on (0-1023; any bits are valid): ranks of one host spin only
   * if theirs leave a CPU for each (init.c) */
  uint64_t cpus[BOOT_CPU_WORDS];
  /* The unique ids this rank was given (their roots' addresses and count, not their keys): every
   * rank must have the same list (boot_init_ids) */
  uint64_t ids_digest;
  int32_t nids, pad;
};

struct boot_state; /* opaque */

/* The job's key. mode says how far it can be trusted. */
enum { BOOT_AUTH_SECRET = 1, /* random or from CHORUS_SECRET*: knowing it proves membership */
       BOOT_AUTH_UID = 2 };  /* derived from public data: admit only our uid on this host */
struct boot_key {
  unsigned char k[32];
  uint32_t mode;
};

/* Fill the 128-byte unique id. Without NCCL_COMM_ID this starts the root listener thread in this
 * process (as NCCL does); with NCCL_COMM_ID the id only names that address, and rank 0 starts the
 * root inside boot_init. */
ch_status boot_get_unique_id(void* id128);
/* An id with a random key whose root this process hosts, whatever NCCL_COMM_ID says (a grow's id:
 * the job's fixed root address belongs to its first init). */
ch_status boot_get_random_id(void* id128);

/* Same as boot_get_unique_id with NCCL_COMM_ID=hostport, for launchers that name the root otherwise
 * (torchrun's MASTER_ADDR, a job-derived local port): no root is started here; rank 0 starts it. */
ch_status boot_id_from_addr(const char* hostport, void* id128);

/* Join the job: send our info to the root, which answers with our next rank's address only; the
 * ranks then gather everyone's info among themselves (returned in *peers, nranks entries, caller
 * frees; every entry checked as it arrives). Fails with CH_TIMEOUT after deadline_ns (absolute, 0 = none): the root then tells
 * every connected rank which ranks joined and which never arrived, and each rank logs that. On a
 * version/nranks mismatch every rank gets CH_INVALID_USAGE with a WARN naming ranks and values.
 * `abort` (may be NULL) is polled; when set, the call returns CH_ABORTED within ~100 ms. The returned
 * state keeps `abort` but not the deadline (see boot_set_deadline). */
ch_status boot_init(const void* id128, int rank, int nranks, const volatile int* abort, uint64_t deadline_ns,
                    struct boot_state** out, struct boot_rank_info** peers);

/* boot_init with nids unique ids (ncclCommInitRankScalable), 1 <= nids <= nranks: the join is
 * spread over their roots, root i serving the i-th block of ranks (boot_root_first); each root also
 * takes the first rank of the next block, so every rank still learns its next rank's address and the
 * roots' agreement checks chain from block to block. Rank-to-rank connections use the first id's
 * key. With NCCL_COMM_ID (a fixed first id) only the first id is used, as in NCCL. */
ch_status boot_init_ids(const void* ids128, int nids, int rank, int nranks, const volatile int* abort,
                        uint64_t deadline_ns, struct boot_state** out, struct boot_rank_info** peers);

/* Build a bootstrap for a subset of ranks without any root (ncclCommSplit): `addrs` are the members'
 * listen addresses in new-rank order, exchanged over the parent beforehand; `listener` is the
 * already-listening socket of this rank for the new bootstrap (ownership passes to the state). */
/* Remember each rank's pid and host (the rank table) so that failure reports name them. */
void boot_name_peers(struct boot_state* b, const struct boot_rank_info* table);
/* The same for one rank (its pid and printable host name), as it becomes known during init. */
void boot_name_peer(struct boot_state* b, int r, int pid, const char* host);
ch_status boot_init_from_table(int rank, int nranks, const struct boot_key* key, const union sock_addr* addrs,
                               struct sock* listener, const volatile int* abort, struct boot_state** out);

/* Create a listening socket on this rank's bootstrap interface (for boot_init_from_table). */
ch_status boot_new_listener(struct boot_state* parent, struct sock* listener);
/* The key of b (a child bootstrap made by ncclCommSplit inherits it). */
const struct boot_key* boot_secret(struct boot_state* b);

/* Messages between ranks, matched by (peer, tag); messages arriving early are queued (at most
 * BOOT_MAX_QUEUED_BYTES / _MSGS per peer). Sizes must match exactly, otherwise CH_INTERNAL with a
 * WARN naming both sizes; a message is at most BOOT_MAX_MSG bytes. A peer that has exited gives
 * CH_REMOTE (with a WARN naming rank, host:port and the error) within a few seconds. */
ch_status boot_send(struct boot_state* b, int peer, int tag, const void* data, size_t size);
ch_status boot_recv(struct boot_state* b, int peer, int tag, void* data, size_t size);
/* data holds nranks slots of `size` bytes; slot[rank] is ours on entry, all filled on return. */
ch_status boot_allgather(struct boot_state* b, void* data, size_t size);
ch_status boot_barrier(struct boot_state* b);
/* Change the abort flag polled by b (communicator creation swaps it in). */
void boot_set_abort(struct boot_state* b, const volatile int* abort);
/* Set a deadline (absolute ns, 0 = none) for subsequent blocking bootstrap calls. */
void boot_set_deadline(struct boot_state* b, uint64_t deadline_ns);
/* Name what the next blocking bootstrap calls are for ("ncclAllReduce #1"; NULL clears): a peer lost
 * meanwhile is reported as that call failing. The owner's thread only. */
void boot_set_context(struct boot_state* b, const char* what);
/* While init gathers the table: the join connections to our root(s) (-1: none), whose report that a
 * rank left ends every wait at once. Cleared (-1, -1) before the caller closes them. */
void boot_watch_roots(struct boot_state* b, int fd0, int fd1);
void boot_close(struct boot_state* b);

/* b's connections with other ranks (bootstrap/peer_close.c), for tests and logs. */
struct boot_conn_stats {
  int open;                /* past the handshake and not being closed */
  int opening;             /* ours waiting for the callee's proof: with `open`, what CHORUS_BOOT_MAX_CONNS caps */
  int closing;             /* BYE sent or received, not closed yet */
  int max_open;            /* the most open at once, counted after each new one closed another */
  int max_held;            /* the same for open + opening: over the cap only while no open one could be closed */
  int cap;                 /* the cap now */
  uint64_t opened, closed; /* connections opened (either side), and closed gracefully */
  uint64_t crossed;        /* closes in which both sides sent BYE at once */
};
void boot_conn_stats(struct boot_state* b, struct boot_conn_stats* out);
/* Test hook: start closing b's idle connections with peer, as the cap does; returns how many. */
int boot_close_idle(struct boot_state* b, int peer);

#define BOOT_TAG_CONNECT (1 << 30)

/* NUL-terminate a fixed-size text field received from the wire; -1 if it holds non-printable bytes. */
int boot_text_field(char* s, size_t size);
/* "3,5-7" for the ranks i < n with flags[i] == want; truncated with "..." if buf is short. */
void boot_format_ranks(const unsigned char* flags, int n, unsigned char want, char* buf, size_t len);

/* Stall queries (query.c): one service per process and bootstrap interface, served by threads of its
 * own, so it answers while every rank of the process is blocked in a call. Connections are
 * authenticated with the key of a job the process serves, or, without a key, admitted only from a
 * process of our uid on this host. */
#define BOOT_QUERY_MAX_REQ 256
#define BOOT_QUERY_MAX_REPLY (64u << 10)
/* Answers an authenticated request (kind and body as the client sent them, untrusted) into out (at
 * most cap bytes); returns the reply length. key: the job key the client proved, NULL for a local
 * client of our uid without one (it may see every job). Runs on a worker thread. */
typedef size_t (*boot_query_handler)(const struct boot_key* key, uint32_t kind, const void* req, size_t len, char* out,
                                     size_t cap);
void boot_query_set_handler(boot_query_handler fn);
/* Serve (delta 1) or stop serving (delta -1) queries proving key; counted per key. */
void boot_query_key(const struct boot_key* key, int delta);
/* One more (1) or one less (-1) communicator to serve: the listener threads run while there is one. */
void boot_query_run(int delta);
/* The service's address on near's interface (its socket made on first use, kept for the process's
 * life; connections queue there while no communicator is served); AF_UNSPEC when disabled
 * (CHORUS_STALL_QUERY=0) or it could not start (logged at INFO). */
void boot_query_addr(const union sock_addr* near, union sock_addr* out);
/* Ask the service at addr (client side), proving key (NULL: none, for a local service of our uid), by
 * deadline_ns; `abort` (may be NULL) is polled every 100 ms. Nothing is logged: on failure *why says what happened. The reply is authenticated (MAC, or the
 * server's uid) before it is returned; its content is still the caller's to validate. */
ch_status boot_query(const union sock_addr* addr, const struct boot_key* key, uint32_t kind, const void* req, size_t len,
                     char* out, size_t cap, size_t* got, uint64_t deadline_ns, const volatile int* abort, char* why,
                     size_t whylen);

#endif
