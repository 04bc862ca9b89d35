/* Transports move FIFO slots between two ranks. Every transport exposes the same thing to the
 * layers above: a connection = a FIFO of CH_STEPS slots per protocol plus head/tail counters, in
 * memory both sides can touch. The receiver owns (allocates) the FIFO; the sender maps it.
 *
 *   local : both ranks are threads of one process; the FIFO is ordinary heap memory.
 *   shm   : ranks are processes on one host; the FIFO is a memfd segment (never named in /dev/shm),
 *           handed to the peer by descriptor passing (fdpass.c), so nothing is left behind by a crash.
 * Nothing pointer-like crosses the bootstrap: handles carry random tokens that only the process that
 * made them can resolve (registry.c, fdpass.c).
 *   tcp   : each side has its own FIFO in its own heap; the process's proxy thread (tcp_proxy.c) sends the
 *           sender's posted slots over a TCP socket and receives them into the receiver's FIFO,
 *           mirroring tail/head on each side (tcp.c). Only Simple steps cross the network. */
#ifndef CH_TRANSPORT_H
#define CH_TRANSPORT_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include "../misc/log.h"
#include "../misc/names.h"
#include "../misc/socket.h"
#include "../misc/status.h"

#define CH_STEPS 8
#define CH_MAX_FIFO_BYTES ((size_t)1 << 30) /* per protocol and connection */
/* NCCL's protocols, in its numbering: rows of CH_PROTO_LIST (misc/names.h), which names them. */
#define CH_PROTO_ENUM_(id, name) PROTO_##id,
enum { CH_PROTO_LIST(CH_PROTO_ENUM_) CH_NPROTO };
#undef CH_PROTO_ENUM_
_Static_assert(PROTO_LL == 0 && PROTO_LL128 == 1 && PROTO_SIMPLE == 2 && CH_NPROTO == 3,
               "PROTO_* values are NCCL's and index tables");

/* Carried with every step (every protocol) so a receiver can tell which call produced the data: the
 * shape of the call, alike on every rank that takes part in it. Collectives: their own call and
 * sequence number. Send/recv: func is the call that made them (SendRecv, AlltoAll, Gather, Scatter),
 * root that call's root (-1 if none), seq and op 0, so both ends of a pair build the same header. */
struct xfer_hdr {
  uint64_t comm_hash;
  uint64_t seq;
  uint32_t func;
  uint32_t type;
  uint64_t count;
  uint32_t op; /* bits 0-7: ncclRedOp_t (ncclNumOps for any PreMulSum); 8-9: the reproducible level;
                * 10-31: the per-call algSelection the call honours (tune/select.c; 0: automatic) */
  int32_t root;
};
#define XFER_OP_REPRO_SHIFT 8
/* type: bits 0-15 the ncclDataType_t; 16-23 the wire format the call's compressed hops use
 * (reduce/wire.h; 0: none), so ranks whose calls compress differently meet as a mismatch naming both. */
#define XFER_TYPE_WIRE_SHIFT 16
#define XFER_TYPE_MASK 0xffffu
#define XFER_OP_SEL_SHIFT 10

/* A 32-bit digest of a header: what a receiver compares on every step, at no extra cache miss (it
 * sits in the line of `tail`, and LL/LL128 fold it into their flags). Never 0, so a zeroed slot never
 * matches. A 2^-31 chance that two different calls collide is accepted. */
static inline uint64_t xfer_mix(uint64_t x) {
  x ^= x >> 33;
  x *= 0xff51afd7ed558ccdull;
  x ^= x >> 33;
  x *= 0xc4ceb9fe1a85ec53ull;
  return x ^ (x >> 33);
}
static inline uint32_t xfer_tag(const struct xfer_hdr* h) {
  uint64_t x = xfer_mix(h->comm_hash ^ h->seq);
  x = xfer_mix(x ^ ((uint64_t)h->func << 32 | h->type));
  x = xfer_mix(x ^ h->count);
  x = xfer_mix(x ^ ((uint64_t)h->op << 32 | (uint32_t)h->root));
  return (uint32_t)(x >> 32) | 1u;
}

/* A failed call (its ranks' calls did not match, or a rank was found dead) poisons every connection
 * of its communicator so that every rank fails the call instead of waiting for ever: `down` travels
 * with the data (sender to receiver), `up` against it (receiver to sender). Written once, by whoever
 * comes first (the rank at that end, or its process's network proxy): xfer_poison_put. The content
 * comes from a peer: ranks and call fields are only printed, never used as indices. */
enum { XFER_MISMATCH = 0, XFER_PEER_LOST = 1 };
struct xfer_poison {
  _Atomic uint32_t set;
  int32_t finder; /* rank that saw two calls differ (-1: unknown, e.g. relayed over the network) */
  int32_t other;  /* rank whose data it saw (-1: unknown); XFER_PEER_LOST: the rank found gone */
  int32_t kind;   /* XFER_MISMATCH or XFER_PEER_LOST */
  struct xfer_hdr mine, theirs; /* the finder's call, the other rank's call */
};

/* Copy a record's content (not `set`). */
static inline void xfer_poison_copy(struct xfer_poison* d, const struct xfer_poison* s) {
  d->finder = s->finder, d->other = s->other, d->kind = s->kind, d->mine = s->mine, d->theirs = s->theirs;
}
/* Fill a record once: the first writer claims it (set 0 -> 2), copies, then publishes (set = 1,
 * release); later writers leave it. 1 if this call wrote it. */
static inline int xfer_poison_put(struct xfer_poison* d, const struct xfer_poison* s) {
  uint32_t free_ = 0;
  if (!atomic_compare_exchange_strong(&d->set, &free_, 2)) return 0;
  xfer_poison_copy(d, s);
  atomic_store_explicit(&d->set, 1, memory_order_release);
  return 1;
}
static inline int xfer_poison_is_set(const struct xfer_poison* d) {
  return atomic_load_explicit(&d->set, memory_order_acquire) == 1;
}

struct fifo_ctrl {
  _Alignas(64) _Atomic uint64_t tail; /* sender: steps posted (every protocol) */
  _Atomic uint32_t recv_sleeping;     /* receiver is (about to be) asleep on tail: wake it */
  uint32_t tag[CH_STEPS];             /* sender: xfer_tag of each posted step (stored before tail) */
  char pad0[20];
  _Alignas(64) _Atomic uint64_t head; /* receiver: steps consumed (credits back to the sender) */
  _Atomic uint32_t send_sleeping;     /* sender is (about to be) asleep on head */
  char pad1[52];
  _Atomic int refs; /* local transport: both ends share the heap block; the last to leave frees it */
  uint64_t token;   /* shm: the export token, written once by the receiver; the sender checks it */
  /* Per-peer connections released under a budget (core/pool.c): messages reserved by the sender (bits
   * 0-30) and by the receiver (bits 32-62), and TP_POOL_CLOSED; compare-exchanged by both ends at
   * their call boundaries (tp_pool_reserve, tp_pool_close), never on the per-step path. */
  _Atomic uint64_t pool;
  _Alignas(64) uint64_t size[CH_STEPS];
  struct xfer_hdr hdr[CH_STEPS];
  _Alignas(64) struct xfer_poison down;
  _Alignas(64) struct xfer_poison up;
};

struct tp_sizes {
  size_t buff[CH_NPROTO]; /* bytes of each protocol's FIFO (CH_STEPS slots) */
};

struct tcp_conn; /* net.h */

/* One direction of one connection with one peer. */
struct conn {
  struct fifo_ctrl* ctrl;
  char* buff[CH_NPROTO];
  size_t slot_bytes[CH_NPROTO];
  uint64_t step; /* next step; both sides walk the same sequence */
  uint64_t head_seen; /* sender: last head read; the peer's line is only re-read when this looks full */
  int peer;
  int transport; /* enum tp_kind */
  /* Set last (release) by the comm's owner when it connects, after every field above; read by the
   * mismatch poll of a plan running on a host stream meanwhile (a later call connecting new peers while
   * an earlier one runs): only once it reads 1 does it touch ctrl. */
  _Atomic int connected;
  /* owner bookkeeping (receiver side owns the memory) */
  void* map_base;
  size_t map_bytes;
  int fd;
  uint64_t token; /* receiver: registry token of the FIFO until the sender has it (0: none) */
  struct tcp_conn* tcp; /* TP_TCP: the proxy's record of this connection (tcp.h) */
  struct fab_conn* fab; /* TP_FAB: the fabric proxy's record of this connection (fabric.h) */
  /* Payload bytes this end moved (chorusCommGetPeerCounters): added to by the thread running the
   * plan that uses the connection (one at a time), read by any thread. */
  _Atomic uint64_t bytes;
};

enum tp_kind { TP_LOCAL = 0, TP_SHM = 1, TP_FAB = 2, TP_TCP = 3, TP_COUNT };

/* The network proxy was busy moving data from t0 to t1 (CLOCK_MONOTONIC ns): set by observe/trace.c while
 * a trace is open (NULL otherwise), called by the proxy thread. */
extern void (*_Atomic tp_busy_hook)(uint64_t t0, uint64_t t1);

#define TP_BLOB_BYTES 128 /* NCCL_NET_HANDLE_MAXSIZE */
/* What the receiver tells the sender so it can reach the FIFO: no address, no descriptor. */
struct tp_handle {
  int32_t kind;
  int32_t pad;
  uint64_t bytes;
  uint64_t token; /* local: tp_local_publish token; shm: tp_fd_export token */
  uint64_t nonce; /* shm: the receiver's process nonce, naming its descriptor server; net: challenge */
  union sock_addr addr; /* net: the receiver's process listener (same IP as its bootstrap listener) */
  uint32_t blob_len;    /* fab: bytes of blob used (the network's listen handle, opaque, checked by it) */
  uint32_t pad2;
  unsigned char blob[TP_BLOB_BYTES];
};

/* Sleeping on a counter (futex on its low 32 bits, valid between processes) and waking sleepers.
 * Wakers pay one fence and one load per post; a syscall only when someone sleeps. */
void tp_wait(_Atomic uint64_t* word, _Atomic uint32_t* sleeping, uint64_t seen, int timeout_us);
/* Sleeping words above 1 belong to the TCP proxy (tcp_proxy.c): TP_SLEEP_PROXY, it sleeps in epoll_wait:
 * poke its eventfd; TP_SLEEP_DIRECT (kept for good on net send FIFOs' recv_sleeping): `word` is the
 * tail just posted: the poster may send the step itself, or poke the proxy if it sleeps. */
#define TP_SLEEP_PROXY 2u
#define TP_SLEEP_DIRECT 3u
/* Kept for good on fabric FIFOs (fabric.c): TAIL on a send FIFO's recv_sleeping (the rank posted a
 * step: it may hand it to the network itself), HEAD on a receive FIFO's send_sleeping (the rank freed
 * a slot: it may post the receive for it itself). */
#define TP_SLEEP_FAB_TAIL 4u
#define TP_SLEEP_FAB_HEAD 5u
void tp_wake_slow(_Atomic uint64_t* word); /* futex wake, whoever sleeps */
static inline void tp_wake(_Atomic uint64_t* word, _Atomic uint32_t* sleeping) {
  void tp_wake_slow(_Atomic uint64_t * word);
  void tp_proxy_post(_Atomic uint64_t * word, uint32_t how);
  atomic_thread_fence(memory_order_seq_cst);
  uint32_t s = atomic_load_explicit(sleeping, memory_order_relaxed);
  if (s >= TP_SLEEP_PROXY) tp_proxy_post(word, s);
  else if (s) tp_wake_slow(word);
}

size_t tp_fifo_bytes(const struct tp_sizes* sz);
/* Lay out ctrl + buffers in `mem` (receiver side) or over a mapping (sender side). */
void tp_fifo_layout(struct conn* c, void* mem, const struct tp_sizes* sz);

/* What a transport is told about the two ends of a connection (core/connect.c fills it). The
 * transport keeps what it needs; none of it comes from the wire except through the bootstrap's
 * authenticated exchange at init. */
struct tp_ctx {
  int rank;
  const union sock_addr* listen_hint; /* this rank's bootstrap listen address: the net listener's interface */
  const union sock_addr* peer_addr;   /* the peer's bootstrap address: an offered net listener must be on its IP */
  uint64_t peer_nonce;                /* the peer's process nonce: whose descriptor server holds a shm FIFO */
  const unsigned char* key;           /* the job's 32-byte key (boot_secret); never sent */
  int uid_mode;                       /* key derived from public data: local peers must be our uid */
  _Atomic int* async_err;             /* the communicator's async error: CH_REMOTE when a link fails */
  const volatile int* abort;
  struct log_err_sink* sink; /* the communicator's last-error record: the proxy's WARNs about it go there */
  int peer_pid;              /* from the rank table: failure messages name the peer's process */
  const char* peer_host;
  const union sock_addr* peer_query; /* the peer process's stall query service (fabric liveness checks) */
  _Atomic int* lost_rank; /* the communicator's lost rank: the peer of the link that failed first (NULL: none) */
};

/* What a transport's probe knows of a peer, from the authenticated rank table (alike on both ends). */
struct tp_peer {
  int self;      /* the rank itself */
  int same_host; /* same host identity */
  int same_proc; /* same process */
};

/* What a transport's connections are, for the layers above, so that they never compare kinds. */
enum {
  TP_F_SAME_PROC = 1u << 0, /* the peer is a thread of this process: its memory is ours */
  TP_F_SAME_HOST = 1u << 1, /* the peer runs on this host: it can map our ncclMemAlloc memory */
  TP_F_PID_WATCH = 1u << 2, /* a dead peer breaks no link: the engine checks its pid while it waits */
  TP_F_NETWORK = 1u << 3,   /* crosses a network through the proxy thread: Simple only, network costs */
};

/* A transport: how a receiver makes a FIFO and describes it (struct tp_handle: no address, no
 * descriptor), how a sender attaches to it (checking everything in the handle: it comes from the
 * peer), and what the engine asks of a live connection. Core never looks inside a connection's kind. */
struct tp_ops {
  const char* name;
  /* The probe (NCCL's canConnect): 1 when this transport can carry a connection between this rank and
   * the peer p describes, with *why saying what made it fit (logged once per kind). NULL: any peer. */
  int (*can_connect)(const struct tp_peer* p, const char** why);
  unsigned flags; /* TP_F_* */
  ch_status (*recv_setup)(struct conn* c, const struct tp_sizes* sz, struct tp_handle* h, const struct tp_ctx* x);
  ch_status (*send_connect)(struct conn* c, const struct tp_sizes* sz, const struct tp_handle* h,
                            const struct tp_ctx* x);
  /* Receiver, after the sender's answer (attached: it said it attached; back: what the sender's
   * back_handle wrote, from the peer, unchecked): drop what only served the handshake; the network
   * waits until the sender's socket has authenticated. */
  ch_status (*recv_done)(struct conn* c, int attached, const struct tp_handle* back, const struct tp_ctx* x);
  /* Sender, after send_connect: a handle for the receiver to reach back (a network whose links are
   * one-way: the receiver's poison records and goodbye). NULL: the answer carries none. */
  void (*back_handle)(struct conn* c, struct tp_handle* out);
  /* 0: fine; 1: the peer closed in order (destroyed its communicator); 2: the link failed (logged).
   * NULL: the transport cannot fail on its own (a dead peer process is found by pid, core/engine.c). */
  int (*health)(const struct conn* c);
  /* A rank waiting for data on c may move it itself; 1 if something arrived. NULL: nothing to do. */
  int (*poll)(struct conn* c);
  /* The rank that polled c stops (it sleeps or waits on something else): whatever moved c's data
   * while the rank did not (the network proxy) takes over again. NULL: nothing to do. */
  void (*idle)(struct conn* c);
  /* Wake whoever waits at the other end of c (after a poison: fifo_ctrl up/down records). */
  void (*wake)(struct conn* c, int we_send);
  void (*free)(struct conn* c);
  /* Before freeing many connections: start closing c now (a network sender flushes what its rank
   * posted, up to 30 s), so that their flushes overlap instead of running one after another. NULL:
   * nothing to flush. */
  void (*closing)(struct conn* c);
  /* An idle connection gives the pages of its FIFO's slots back (the pool, core/pool.c, for peers whose
   * connection it cannot close: the network's FIFOs are each end's own memory, so this needs no word
   * from the peer); zero pages come back when a step next touches them. 1 if done; 0 if a slot is in
   * use now (tried again at a later boundary). The owner thread, with no plan of the communicator queued
   * or running (core/pool.c evicts only then: a plan writes a send slot before it moves the tail, outside
   * the transport's locks). NULL: cannot. */
  int (*trim)(struct conn* c);
};
extern const struct tp_ops tp_local_ops, tp_shm_ops, tp_fab_ops, tp_tcp_ops;
/* The network this process was configured for (NCCL_NET, NCCL_NET_PLUGIN) can start: CH_OK, or the
 * error (logged) of a named network that cannot. Called at communicator setup, before transports are
 * chosen. */
ch_status tp_net_config(void);
/* Every transport, indexed by its kind, which is also its priority: a peer is carried by the first whose
 * probe accepts it (tp_choose), as NCCL tries P2P, SHM, then the network. A new transport is a row. */
extern const struct tp_ops* const tp_table[TP_COUNT];
/* The kind that carries connections to the peer p describes, and why (a static string). */
int tp_choose(const struct tp_peer* p, const char** why);
/* kind was validated (connect.c checks every kind from the wire against the peer's). */
static inline const struct tp_ops* tp_ops_of(int kind) { return tp_table[kind]; }
static inline unsigned tp_flags(int kind) { return tp_table[kind]->flags; }
static inline int tp_conn_health(const struct conn* c) {
  const struct tp_ops* o = tp_ops_of(c->transport);
  return c->connected && o->health ? o->health(c) : 0;
}
/* Whether a waiting rank can move c's data itself (then it must give c back with tp_conn_idle). */
static inline int tp_conn_pollable(const struct conn* c) { return c->connected && tp_ops_of(c->transport)->poll; }
static inline int tp_conn_poll(struct conn* c) {
  const struct tp_ops* o = tp_ops_of(c->transport);
  return c->connected && o->poll ? o->poll(c) : 0;
}
static inline void tp_conn_idle(struct conn* c) {
  const struct tp_ops* o = tp_ops_of(c->transport);
  if (c->connected && o->idle) o->idle(c);
}
void tp_conn_free(struct conn* c);
static inline int tp_conn_can_trim(int kind) { return tp_table[kind]->trim != NULL; }
static inline int tp_conn_trim(struct conn* c) {
  const struct tp_ops* o = tp_ops_of(c->transport);
  return c->connected && o->trim ? o->trim(c) : 0;
}
static inline void tp_conn_closing(struct conn* c) {
  const struct tp_ops* o = tp_ops_of(c->transport);
  if (c->connected && o->closing) o->closing(c);
}

/* The implementations (fifo.c, shm.c, tcp.c), also called by tests. */
ch_status tp_local_recv_setup(struct conn* c, const struct tp_sizes* sz, struct tp_handle* h, const struct tp_ctx* x);
ch_status tp_local_send_connect(struct conn* c, const struct tp_sizes* sz, const struct tp_handle* h,
                                const struct tp_ctx* x);
ch_status tp_shm_recv_setup(struct conn* c, const struct tp_sizes* sz, struct tp_handle* h, const struct tp_ctx* x);
ch_status tp_shm_send_connect(struct conn* c, const struct tp_sizes* sz, const struct tp_handle* h,
                              const struct tp_ctx* x);
ch_status tp_tcp_recv_setup(struct conn* c, const struct tp_sizes* sz, struct tp_handle* h, const struct tp_ctx* x);
ch_status tp_tcp_send_connect(struct conn* c, const struct tp_sizes* sz, const struct tp_handle* h,
                              const struct tp_ctx* x);
/* Receiver: wait (bounded, abortable) until the sender's socket has authenticated and been bound. */
ch_status tp_tcp_wait_bound(struct conn* c, const struct tp_ctx* x);
int tp_tcp_state(const struct conn* c);
const char* tp_name(int kind);

/* A per-peer connection in a pool (core/pool.c) agrees on its release through its FIFO's shared `pool`
 * word, so only transports whose FIFO both ends map can be pooled (local, shm: not TP_F_NETWORK).
 * tp_pool_reserve: this end will use the connection for one more message; 0 if the peer has closed it
 * (then neither end uses it again: both re-make it). tp_pool_close: close it if every message either
 * end reserved has been reserved by the other end too (the caller has none in flight); 1 if closed. */
#define TP_POOL_CLOSED (1ull << 63)
int tp_pool_reserve(struct conn* c, int we_send, int n);
int tp_pool_close(struct conn* c);
int tp_pool_closed(const struct conn* c);
/* Whether the other end has reserved fewer messages than this end (it has yet to reach them). */
int tp_pool_behind(const struct conn* c, int we_send);
/* Poison a connection (fifo.c): write rec into its `down` (we send on c) or `up` (we receive on c)
 * record, once, and wake whoever waits at the other end (the proxy, for the network). */
void tp_conn_poison(struct conn* c, int we_send, const struct xfer_poison* rec);
void tp_proxy_kick(void); /* tcp_proxy.c: wake the network proxy */
/* fabric_proxy.c: a fabric FIFO's counter was posted (how: TP_SLEEP_FAB_*). */
void tp_fab_post(_Atomic uint64_t* word, uint32_t how);
/* A link of a communicator failed (a network proxy): the first such failure's peer is its lost rank
 * (chorusCommGetLostRank), unless the communicator had failed already (the async error was set). */
static inline void tp_note_link_lost(_Atomic int* async_err, _Atomic int* lost_rank, int peer) {
  int expected = 0, none = -1;
  if (atomic_compare_exchange_strong(async_err, &expected, (int)CH_REMOTE) && lost_rank)
    atomic_compare_exchange_strong(lost_rank, &none, peer);
}
/* Has the other end poisoned c? Copies the record (set = 1) and returns 1. */
int tp_conn_poisoned(const struct conn* c, int we_send, struct xfer_poison* out);

/* A fresh random token, never 0 (registry.c). */
uint64_t tp_fresh_token(void);
/* Process-local registry (registry.c). Publish mem under a fresh random token (0 if out of memory);
 * lookup returns mem and adds a reference to *refs (under the registry lock, so the publisher cannot
 * free it in between), or NULL for a token this process did not publish; take also withdraws it. */
uint64_t tp_local_publish(void* mem, _Atomic int* refs);
void* tp_local_lookup(uint64_t token, int take);
void tp_local_withdraw(uint64_t token);

/* Descriptor passing between processes of one host (fdpass.c). tp_memfd_new makes a sealed memfd
 * named `name` (must start with "chorus") of `bytes` (reserve: fallocate), or -1 with errno.
 * tp_fd_export makes fd (which the caller keeps open until it withdraws) fetchable by processes of our
 * user under a fresh token; 0 with a WARN on failure. tp_fd_map fetches the descriptor exported under
 * token by the process whose nonce is `nonce`, checks it is a sealed Chorus memfd of exactly bytes
 * whose uint64 at token_off equals the token, and maps it; NULL with a WARN naming peer and what. */
int tp_memfd_new(const char* name, size_t bytes, int reserve);
uint64_t tp_fd_export(int fd, uint64_t bytes);
void tp_fd_withdraw(uint64_t token);
void* tp_fd_map(uint64_t nonce, uint64_t token, size_t bytes, size_t token_off, int populate, int peer,
                const char* what);

/* ncclMemAlloc segments: the user's bytes, then one page whose first word is the export token. */
static inline size_t tp_mem_segment_bytes(size_t user) { return ((user + 4095) & ~(size_t)4095) + 4096; }
static inline size_t tp_mem_token_off(size_t user) { return (user + 4095) & ~(size_t)4095; }

/* Memory of other local processes, mapped on demand (direct algorithms): rank r's ncclMemAlloc
 * allocation exported under token, fetched from rank r's descriptor server (nonces[r]). Mappings stay
 * cached, keyed by (rank, token), so a repeated call costs a lookup; the least recently used is
 * unmapped when the cache is full. */
struct tp_map_cache;
struct tp_map_cache* tp_map_cache_new(int nranks, const uint64_t* nonces);
void tp_map_cache_free(struct tp_map_cache* mc);
/* Base of the mapping of rank's allocation of user_bytes exported under token, or NULL with a WARN. */
char* tp_map_peer(struct tp_map_cache* mc, int rank, uint64_t token, size_t user_bytes);

#endif
