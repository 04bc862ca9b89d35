/* Algorithms: each collective is a sequence of primitives over a ring (or a peer, for send/recv).
 * An algorithm is a pure function from (operation, step index) to the primitive to run at that index,
 * so the engine can stop at any step that must wait and resume later without blocking a thread. */
#ifndef CH_ALGO_H
#define CH_ALGO_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdlib.h>
#include <stdint.h>

#include "../misc/names.h"
#include "../proto/prims.h"

/* NCCL's ncclFunc_t numbering, then ours: rows of CH_FUNC_LIST (misc/names.h), which names them. */
#define CH_FUNC_ENUM_(id, name, text) FUNC_##id,
enum ch_func { CH_FUNC_LIST(CH_FUNC_ENUM_) FUNC_COUNT };
#undef CH_FUNC_ENUM_
_Static_assert(FUNC_BROADCAST == 0 && FUNC_REDUCE == 1 && FUNC_ALLGATHER == 2 && FUNC_REDUCESCATTER == 3 &&
                   FUNC_ALLREDUCE == 4 && FUNC_SENDRECV == 5 && FUNC_SEND == 6 && FUNC_RECV == 7 &&
                   FUNC_ALLTOALL == 8 && FUNC_SCATTER == 9 && FUNC_GATHER == 10 && FUNC_ALLTOALLV == 11 &&
                   FUNC_COUNT == 12,
               "FUNC_* values are NCCL's ncclFunc_t and index tables");
/* NCCL's numbering for Tree/Ring; the others are ours: Exchange (two ranks), Direct (one host, peers'
 * buffers read in place), RecDbl (recursive doubling, log2(n) hops: small messages), Rabenseifner
 * (recursive halving + doubling: medium messages). Rows of CH_ALGO_LIST (misc/names.h). */
#define CH_ALGO_ENUM_(id, name, nccl) ALGO_##id,
enum ch_algo { CH_ALGO_LIST(CH_ALGO_ENUM_) ALGO_COUNT };
#undef CH_ALGO_ENUM_
_Static_assert(ALGO_TREE == 0 && ALGO_RING == 1 && ALGO_EXCHANGE == 2 && ALGO_DIRECT == 3 && ALGO_RECDBL == 4 &&
                   ALGO_RABEN == 5 && ALGO_OWNER == 6 && ALGO_COUNT == 7,
               "ALGO_* values are NCCL's for Tree and Ring and index tables");

/* Where a rank's buffer lives, so that peers can reach it (direct_allreduce.c). Threads of one process
 * use addr (the thread clique is this process's heap, written only by its threads). Processes never
 * use an address from the clique: they map the ncclMemAlloc allocation exported under token
 * (token 0: not in such an allocation, so only its own process can reach the buffer). */
struct direct_buf {
  uint64_t addr;        /* threads only */
  uint64_t token;       /* processes: export token of the allocation (core/memreg.c, transport/fdpass.c) */
  uint64_t alloc_bytes; /* size of the allocation */
  uint64_t off;         /* of the buffer in the allocation */
};

/* The call as its rank issued it: published before any peer memory is touched, so that a call that
 * does not match across ranks touches nothing (every rank checks every slot). */
struct direct_shape {
  uint64_t seq;
  uint64_t count;
  uint32_t type;
  uint32_t op; /* ncclRedOp_t; every PreMulSum op counts as ncclNumOps */
};

/* One rank's slot: plain data only, as the clique may be shared memory between processes. Each rank
 * writes only its own slot; peers read it after an acquire of arrive / done. Between processes a
 * peer's slot is untrusted input: copied once, validated, never dereferenced as an address. */
struct direct_slot {
  _Alignas(64) _Atomic uint64_t arrive;
  struct direct_shape shape; /* in arrive's line: checking it costs no extra miss */
  struct direct_buf send, recv;
  struct red_op red; /* PreMulSum scalars differ per rank */
  _Alignas(64) _Atomic uint64_t done;
  /* Cross-memory attach (direct_cma.c): written once at init, before the ranks' allgather, and read
   * (probed) once after it. */
  int32_t cma_pid;
  uint32_t cma_pad;
  uint64_t cma_cookie, cma_addr;
  char pad[32];
  /* The collective this rank runs now, published for every collective (not only Direct) when its
   * plan starts: ranks that wait compare it in their slow path (fault/mismatch.c), so two calls that
   * exchange no FIFO data with each other (Direct against a ring) still meet. A seqlock (ver odd while
   * written) over atomic words: readers skip a torn copy. */
  _Alignas(64) _Atomic uint64_t call_ver;
  _Atomic uint64_t call[(sizeof(struct xfer_hdr) + 7) / 8];
  /* This rank failed a call that did not match (struct xfer_poison, written once, then the flag):
   * local ranks learn it here even when no FIFO connects them (Direct only). */
  _Atomic uint32_t poisoned;
  _Atomic uint64_t poison[(sizeof(struct xfer_poison) + 7) / 8];
};
/* Slots of all ranks: on the heap when all ranks are threads of one process (handed to the other
 * threads through the local registry), else in a memfd that every local process maps (procs = 1;
 * token: its export token, checked by importers). n and procs are informative only: code uses the
 * communicator's own values, since peers may write this memory. */
struct direct_clique {
  _Atomic int refs;
  int n;
  int procs;
  uint64_t token;
  _Alignas(64) struct direct_slot slot[];
};
/* Publish in my slot that I failed a call that did not match (after logging it). */
static inline void direct_slot_poison(struct direct_slot* sl, const struct xfer_poison* rec) {
  uint64_t w[sizeof(sl->poison) / 8] = {0};
  __builtin_memcpy(w, rec, sizeof(*rec));
  for (size_t i = 0; i < sizeof(w) / 8; i++) atomic_store_explicit(&sl->poison[i], w[i], memory_order_relaxed);
  atomic_store_explicit(&sl->poisoned, 1, memory_order_release);
}
/* Cross-memory attach for Direct between processes (direct_cma.c): made at init when every rank could
 * read every peer (init.c), then read-only; owned by the communicator. */
struct ch_op;
struct direct_cma {
  size_t min_bytes; /* CHORUS_CMA_MIN_BYTES: smaller calls with a buffer not from ncclMemAlloc fall back */
  int32_t pid[];    /* each rank's, as probed */
};
void direct_cma_publish(struct direct_slot* mine, const uint64_t* cookie);
/* 0 if this rank read every peer's cookie at its published pid and address (pids[] filled); else an
 * errno value and *bad the peer it could not read. */
int direct_cma_probe(const struct direct_clique* c, int n, int me, int32_t* pids, int* bad);
/* Copy len bytes between here and address `there` of process pid (write: to it), whole: 0 or an errno
 * value (not logged). */
int direct_cma_copy(int pid, void* here, uint64_t there, size_t len, int write);
/* Direct's segment [at, at + len) when some buffer is reachable only by cross-memory copies: send[k]
 * or recv[k] NULL, then send_at[k] / recv_at[k] are its address in rank k. 0, or an errno value
 * (logged). */
int direct_cma_segment(struct ch_op* op, const struct red_op* red, char** send, char** recv, const uint64_t* send_at,
                       const uint64_t* recv_at, size_t at, size_t len);
static inline size_t direct_clique_bytes(int n) {
  return sizeof(struct direct_clique) + sizeof(struct direct_slot) * (size_t)n;
}
struct direct_clique* direct_clique_new(int n);
void direct_clique_release(struct direct_clique* c);

/* This rank in one tree of the communicator (tune/trees.c): parent (-1 at the root) and children. */
struct algo_tree {
  int up;
  int down[3];
  int ndown;
};

/* The share of one collective (or one send/recv) carried by one channel. */
struct ch_op {
  int func;
  int algo;
  int proto;
  const char* sendbuff;
  char* recvbuff;
  size_t count;   /* elements per rank-block, as the API call counts them */
  size_t esize;
  int root;       /* rank (broadcast/reduce) */
  int rank, nranks;
  int ring_index; /* our position in this channel's ring */
  const int* ring; /* ring order: ring[i] = rank at position i */
  const struct algo_tree* trees; /* ALGO_TREE: the communicator's trees, each carrying a part of the data */
  int ntrees;
  char* tmp; /* Tree Reduce: one step of partial results (a non-root rank may have no recvbuff); Owner:
              * a slot per rank of one step each, tmp_stride bytes apart */
  size_t tmp_stride;
  /* this channel's part of each block: [part_off, part_off + part_count) */
  size_t part_off, part_count;
  size_t chunk; /* elements per step */
  struct prim_ctx ctx;
  struct direct_clique* clique; /* ALGO_DIRECT */
  const struct direct_cma* cma;  /* ALGO_DIRECT between processes: the comm's, NULL without CMA */
  struct tp_map_cache* maps;     /* ALGO_DIRECT between processes (NULL between threads): this rank's
                                  * mappings of peer buffers */
  struct direct_buf dsend, drecv; /* ALGO_DIRECT: this rank's buffers as peers reach them */
  int fallback_algo;             /* ALGO_DIRECT between processes, when some buffer is not shareable */
  /* Direct between processes on several channels: the Direct op (channel 0) and standby ops (channels
   * 1.., standby = 1, algo = the fallback) share the task's outcome (the plan's): undecided, Direct
   * ran (standbys skip), or Direct fell back (each op runs the fallback on its channel's share). */
  int standby;
  _Atomic int* outcome;
  uint64_t idx, nidx; /* next primitive index, total */
  /* The primitive of step step_at - 1 (0: none), kept while that step waits so that polling does not
   * compute it again. Only the thread running the plan touches both. */
  struct prim step;
  uint64_t step_at;
  int channel;  /* a collective's: the channel of its share */
  uint64_t t0;  /* CHORUS_TRACE: ticks when its first step was tried (0: not yet) */
  int traced;   /* CHORUS_TRACE and more than one op in its plan: a span of its own (one op: the call's) */
};

/* Algorithms that talk to other ranks than their ring neighbours (RecDbl, Rabenseifner, Tree) name the
 * peer of each step (prim.peers) and use per-peer connections of their own (comm_apeer, not the ones
 * send/recv use, whose lanes run in no fixed order with a collective): one channel, so that the order
 * of steps on a connection is the same at both ends. Their peers are connected with the rings
 * (algo_peer_set): ranks whose calls differ never wait for each other in connection setup. */
int algo_uses_peers(int algo);
const char* algo_name(int algo); /* as NCCL_ALGO and the TUNING log spell it */
/* The NCCL function a FUNC_* names ("ncclAllReduce"; "?" for any other number). */
static inline const char* algo_fname(int func) {
  const char* n = ch_func_api_name(func);
  return n ? n : "?";
}
/* Number of primitive steps the op needs; then fill the primitive for step `idx` < that number. */
uint64_t algo_nsteps(const struct ch_op* op);
void algo_step(const struct ch_op* op, uint64_t idx, struct prim* p);

/* One file per algorithm. */
uint64_t ring_allreduce_nsteps(const struct ch_op* op);
void ring_allreduce_step(const struct ch_op* op, uint64_t idx, struct prim* p);
uint64_t exchange_allreduce_nsteps(const struct ch_op* op);
void exchange_allreduce_step(const struct ch_op* op, uint64_t idx, struct prim* p);
enum { DIRECT_OUTCOME_OPEN = 0, DIRECT_OUTCOME_RAN = 1, DIRECT_OUTCOME_FELL_BACK = 2 };
/* Direct ops are not made of FIFO primitives: the engine calls this (3 steps) and gets one of these.
 * FALLBACK: the ranks' buffers cannot all be reached by peers, every rank runs op->fallback_algo
 * instead (all reach the same verdict from the same slots). FAILED (CH_SYSTEM): a rank could not map
 * a peer's buffer. MISMATCH (CH_INVALID_USAGE): the ranks' calls differ; nobody touched peer memory.
 * Both end the call on every rank, logged where seen. */
enum direct_result { DIRECT_MISMATCH = -3, DIRECT_FAILED = -2, DIRECT_FALLBACK = -1, DIRECT_WAIT = 0, DIRECT_STEP = 1 };
int direct_allreduce_try(struct ch_op* op);
uint64_t tree_allreduce_nsteps(const struct ch_op* op);
void tree_allreduce_step(const struct ch_op* op, uint64_t idx, struct prim* p);
uint64_t tree_broadcast_nsteps(const struct ch_op* op);
void tree_broadcast_step(const struct ch_op* op, uint64_t idx, struct prim* p);
uint64_t tree_reduce_nsteps(const struct ch_op* op);
void tree_reduce_step(const struct ch_op* op, uint64_t idx, struct prim* p);
uint64_t raben_allreduce_nsteps(const struct ch_op* op);
void raben_allreduce_step(const struct ch_op* op, uint64_t idx, struct prim* p);
uint64_t recdbl_allreduce_nsteps(const struct ch_op* op);
void recdbl_allreduce_step(const struct ch_op* op, uint64_t idx, struct prim* p);
uint64_t ring_allgather_nsteps(const struct ch_op* op);
void ring_allgather_step(const struct ch_op* op, uint64_t idx, struct prim* p);
uint64_t ring_reducescatter_nsteps(const struct ch_op* op);
void ring_reducescatter_step(const struct ch_op* op, uint64_t idx, struct prim* p);
uint64_t ring_broadcast_nsteps(const struct ch_op* op);
void ring_broadcast_step(const struct ch_op* op, uint64_t idx, struct prim* p);
uint64_t ring_reduce_nsteps(const struct ch_op* op);
void ring_reduce_step(const struct ch_op* op, uint64_t idx, struct prim* p);
/* Owner (owner.c): the reproducible reductions' FIFO algorithm (AllReduce, ReduceScatter, Reduce). */
uint64_t owner_nsteps(const struct ch_op* op);
void owner_step(const struct ch_op* op, uint64_t idx, struct prim* p);
uint64_t p2p_nsteps(const struct ch_op* op);
void p2p_step(const struct ch_op* op, uint64_t idx, struct prim* p);
uint64_t local_nsteps(const struct ch_op* op);
void local_step(const struct ch_op* op, uint64_t idx, struct prim* p);

/* Power-of-two algorithms on any n (pof2.c): p participants (the largest power of two <= n), log2(p)
 * rounds, this rank's virtual rank among them (-1: it folds into another and sits out), and the rank
 * folded into it or that it folds into (-1: none). algo_pof2_rank maps a virtual rank back. */
struct algo_pof2 {
  int p, log, vrank, fold;
};
struct algo_pof2 algo_pof2_of(int rank, int n);
int algo_pof2_rank(int vrank, int n, int p);
/* This rank in the binomial tree rooted at `root` (Tree Broadcast and Reduce), built on the same
 * pairs: its parent (-1 at the root; for the participant an extra root folds into, that root), its
 * children, largest subtree first, and the extra rank it serves (-1: none; not the root). An extra
 * rank's parent is the rank it folds into, or, if it is the root, that rank is its one child. */
struct algo_binom {
  int parent;
  int child[32];
  int nchild;
  int extra;
  int fold, is_extra;
};
struct algo_binom algo_binom_of(int rank, int n, int root);
/* Every rank that RecDbl, Rabenseifner or Tree may exchange with (both directions), whatever the call
 * and root: so they are connected all at once, with the rings, on every rank alike. */
void algo_peer_set(int rank, int n, const struct algo_tree* trees, int ntrees, char* mark);

/* A call as messages name it, e.g. "AllReduce(1048576 x float32, sum) #17" (algo.c). */
void algo_call_text(char* buf, size_t len, const struct xfer_hdr* h);
/* The one wording of a mismatch, whichever rank and path found it (Direct here, fault/mismatch.c):
 * (other rank's text, its call, the reporting rank, its call, " (found by rank F)" or "", a hint or ""). */
#define ALGO_MISMATCH_FMT "%s called %s but rank %d called %s%s: calls on a communicator must match on every rank%s"

/* Helpers shared by the ring algorithms. */
static inline size_t algo_min(size_t a, size_t b) { return a < b ? a : b; }
static inline int algo_mod(int a, int n) { return ((a % n) + n) % n; }

#endif
