/* The communicator and the state every layer above the transports shares. */
#ifndef CH_COMM_H
#define CH_COMM_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>

#include "nccl.h"
#include "../misc/log.h"
#include "../misc/status.h"
#include "../reduce/reduce.h"
#include "../bootstrap/bootstrap.h"
#include "../transport/transport.h"
#include "../cuda/cudrv.h"
#include "../algo/algo.h"

#define CH_MAX_CHANNELS 16
#define CH_COMM_MAGIC 0x43484f5255534d4dULL /* "CHORUSMM" */

struct ch_channel {
  int id;
  int* ring;        /* ring[i] = rank at ring position i */
  int ring_index;   /* my position */
  int prev, next;   /* ranks */
  struct conn send; /* to next */
  struct conn recv; /* from prev */
};

/* Connections for send/recv with one peer (created on first use). */
struct ch_p2p {
  struct conn send;
  struct conn recv;
  int recv_acked; /* the sender has mapped our FIFO */
};

struct ch_redop_slot {
  int used;
  struct red_op red; /* kind RED_PREMULSUM with the scalar */
};
#define CH_MAX_REDOPS 64

/* Ranks sharing one GPU (gpu/gpu.h): what a rank says of itself at init (in comm_agree's message; read
 * from peers, only compared). */
struct gpu_hello {
  uint32_t capable;  /* a current context, kernels loaded, stream memory operations */
  uint32_t direct;   /* CHORUS_CUDA_DIRECT on */
  int32_t relay;     /* CHORUS_CUDA_RELAY (rank 0's holds, with its chunk and depth) */
  uint32_t relay_chunk, relay_depth;
  uint32_t shares;   /* probe below is set: this process can export device memory */
  uint32_t has_ctx;  /* a current context at init (pieces of staged calls need one on every rank) */
  uint32_t piece;    /* CHORUS_CUDA_STAGE_PIECE (rank 0's holds) */
  uint32_t kernels;  /* has_ctx, CHORUS_CUDA_STAGE_REDUCE on, and Chorus's kernels load: this rank's GPU
                      * can reduce what staging brings (every rank must) */
  uint32_t pad;
  uint64_t ctx_id;   /* the context's address: compared only between ranks of one process */
  unsigned char uuid[16];
  uint64_t probe_id; /* cudev_probe: a peer process opens it at setup (only a handle for the driver) */
  cudev_ipc_handle probe;
};

struct ch_plan;    /* comm/work.h */
struct rma_state;  /* api/rma.h */
struct tune_model; /* tune/tune.h */
struct fr_ring;    /* observe/recorder.c */
struct obs_trace;  /* observe/trace.c */
struct prof_comm;  /* observe/profiler.c */

struct ncclComm {
  uint64_t magic;
  /* The process that made it (set at alloc, read-only): a fork child that inherits the comm has none
   * of its threads, so it may not use it, and destroying it there only lets go (comm_inherited). */
  uint64_t proc_nonce;
  int pid;
  int rank, nranks;
  int local_rank, local_nranks; /* among ranks on this host */
  int nnodes;
  int oversubscribed; /* more local ranks than CPUs: waiting ranks must not spin */
  uint64_t comm_hash;
  ncclConfig_t config;
  int blocking;
  char name[64];

  struct boot_state* boot;
  struct boot_rank_info* peers; /* [nranks] */
  int* peer_tp;                 /* [nranks] transport kind to reach each rank */

  int nchannels;
  struct ch_channel channels[CH_MAX_CHANNELS];
  int rings_connected;
  struct algo_tree trees[2]; /* this rank in the Tree algorithm's trees (tune/trees.c); read-only after init */
  int ntrees;
  int tree_depth; /* hops from a tree's root to its deepest leaf (cost model) */
  /* [2 * nranks]: [r] sends and receives with rank r; [nranks + r] the FIFOs of RecDbl, Rabenseifner
   * and Tree with r, connected with the rings (connect.c), apart from the first, which a group's sends
   * and receives use in no fixed order with a collective (comm_apeer) */
  struct ch_p2p* p2p;
  struct tp_sizes sizes;     /* ring FIFOs */
  struct tp_sizes p2p_sizes; /* send/recv FIFOs: smaller, there can be one per peer (CHORUS_P2P_MEM) */
  /* The pool of per-peer connections (core/pool.c), set [0, nranks) of p2p only: at most p2p_cap peers
   * with a live connection (CHORUS_P2P_PEERS, or what CHORUS_P2P_MEM holds), the least recently used
   * released first. p2p_lru[nranks]: the pool clock when each peer was last needed. All touched only by
   * the thread in a call on the comm (owner); the counters are atomic for readers anywhere. */
  int p2p_cap;
  /* The most peers one group's per-peer calls meet at once before the group runs in waves (pool.h):
   * the smallest p2p_cap of any rank, from comm_agree, so that every rank splits a group alike. */
  int p2p_wave;
  uint64_t* p2p_lru;
  int* p2p_count;           /* [2 * nranks]: a group's messages to / from each peer (pool.c) */
  unsigned char* p2p_mark;  /* [2 * nranks]: a group's connections made by comm_connect (pool.c) */
  uint64_t p2p_clock;
  _Atomic int p2p_live, p2p_live_max;
  _Atomic uint64_t p2p_released, p2p_made;
  /* Network peers of the pool (pool.c's trim): [nranks], 1 while their FIFO pages may be resident (set
   * when a call uses the peer, cleared when its idle FIFOs gave the pages back; owner thread only), and
   * how many times they were given back (atomic, for readers anywhere). */
  unsigned char* p2p_resident;
  _Atomic int p2p_net_resident;
  _Atomic uint64_t p2p_trimmed;
  char* scratch; /* LL/LL128 staging, one slot payload */
  size_t scratch_bytes; /* scratch's size (init.c), for chorusCommGetMemory */
  /* ncclCommSuspend released what an idle comm can do without (core/suspend.c); the next call or
   * ncclCommResume clears it. Written by the thread in a call on the comm (owner), read by any. */
  _Atomic int suspended;
  /* Reproducible reductions: the level (CH_REPRO_*, CHORUS_REPRODUCIBLE or chorusCommSetReproducible
   * before the first call; read by the calling thread only), and Owner's slots (nranks steps of
   * peer_step_bytes, made by plan_build on first use, freed with the comm). */
  int repro;
  char* repro_scratch;
  size_t peer_step_bytes;
  char* peer_scratch; /* Tree Reduce partial results: one step of the per-peer FIFOs (init.c); used only
                       * by the thread running this comm's current plan (plans run one at a time,
                       * and a plan's Tree Reduces share one lane) */

  struct ch_redop_slot redops[CH_MAX_REDOPS];
  size_t exchange_max_bytes;
  size_t direct_min_bytes;
  size_t nt_min_bytes; /* CHORUS_STREAM_MIN_BYTES: results this large are written with non-temporal stores */
  int min_nchannels, max_nchannels; /* NCCL_MIN/MAX_NCHANNELS, read once (tune/choose.c) */
  struct direct_clique* clique; /* all ranks on this host: direct algorithms (init.c, direct_allreduce.c) */
  struct tp_map_cache* maps;    /* processes: peers' ncclMemAlloc buffers mapped here */
  struct direct_cma* cma;       /* processes: cross-memory copies for other buffers (init.c), or NULL */
  struct rma_state* rma;        /* windows and signals (api/window.c): the calling thread's, as any call's */
  size_t shm_direct_min_bytes;
  /* Allowed by NCCL_PROTO / NCCL_ALGO, per collective (index: tune.h tune_mask_index); set by tune_init,
   * read-only afterwards. tune_bad: a value did not parse (init fails after comm_agree). */
  unsigned proto_mask[6], algo_mask[6];
  int tune_bad;
  unsigned proto_ok; /* protocols the transports can carry (network: Simple only) */
  int tune_net;      /* some ranks talk over the network: the cost model uses its hop costs */
  /* Wire format (reduce/wire.h, docs/WIRE.md): format | WIRE_FORCE asked for the calls of this comm
   * (CHORUS_WIRE_FORMAT, then chorusCommSetWireFormat), and whether it applies to every hop
   * (CHORUS_WIRE_HOPS=all) or those over the network. Written by tune_init and by the thread calling
   * chorusCommSetWireFormat (a thread that may issue calls on the comm), read by calling threads. */
  _Atomic int wire;
  int wire_all;
  int wire_link_mbs; /* the slowest known bootstrap interface of any rank, MB/s (0: none known); comm_agree */
  _Atomic int wire_noted; /* bits of what a call without its format was told once (api/wire_api.c, tune/choose.c) */
  /* The hosts as the cost model sees them (tune/shape.c), alike on every rank: set by tune_init,
   * read-only afterwards. Used only when tune_net and tune_hosts > 1. */
  int tune_hosts, tune_ppn;       /* hosts, most ranks on one host */
  int tune_local_net;             /* ranks of one host also talk over the network (NCCL_SHM_DISABLE) */
  int tune_ring_cross;            /* hops of the ring that cross hosts */
  int tune_tree_net;              /* levels of Tree AllReduce's trees between hosts */
  int tune_fold_share;            /* RecDbl/Rabenseifner folds: most of one host's ranks crossing hosts at once */
  int tune_pof2_share[32];        /* ... their round at distance 2^k: the same (0: within hosts) */
  const struct tune_model* model; /* the cost model's constants (tune/model.c): set by tune_init, immutable */
  /* NCCL_TUNER_PLUGIN (tune/tuner_plugin.c): set at init, released by comm_free; called by the thread in a
   * call on this comm. tuner_failed: a getCollInfo error was reported (once); tuner_chunk_warned: a
   * getChunkSize answer was refused (once). */
  struct tune_plugin* tuner;
  void* tuner_ctx;
  _Atomic int tuner_failed;
  _Atomic int tuner_chunk_warned;

  /* Ordering of work: plans run in ticket order, one at a time per communicator. */
  atomic_uint_fast64_t next_ticket;
  atomic_uint_fast64_t done_ticket;
  /* Collectives run (sequence number carried in transfer headers). Advanced when a plan starts, by
   * the thread running the plan whose ticket is current (plan.c); others may only read it (logs). */
  _Atomic uint64_t seq;
  /* The last single-collective plan that ran to completion, kept for a repeat (plan.c). Stored by
   * plan_release before the plan's done_ticket moves; taken by plan_reuse (compare-exchange) or
   * freed by comm_free once no ticket is outstanding. */
  struct ch_plan* _Atomic reuse_plan;
  /* Receive connections whose sockets this communicator's waiting thread has read itself (the
   * network lets a rank do that, tp_conn_poll); all given back to the transport before it sleeps.
   * Touched only by the thread running the plan whose ticket is current, like seq (plan.c). */
#define COMM_POLLED_MAX 8
  struct conn* polled[COMM_POLLED_MAX];
  int npolled;

  volatile int abort_flag;           /* set by ncclCommAbort (and for a while by Revoke); polled everywhere */
  /* ncclCommAbort claimed the comm (exchange: one abort). A revoke or shrink that raised abort_flag to
   * stop the calls in flight lowers it again only if no abort claimed the comm meanwhile. */
  _Atomic int aborting;
  _Atomic int async_result;          /* first asynchronous failure (ncclResult_t) */
  _Atomic int init_state;            /* ncclInProgress until init finishes, then its result */
  pthread_t init_thread;   /* written before init_thread_live is set */
  /* 1 while init_thread is to be joined; whoever exchanges it to 0 joins (run_inits for blocking
   * comms, else ncclCommDestroy / ncclCommAbort): exactly once. ncclCommGetAsyncError never joins. */
  _Atomic int init_thread_live;
  _Atomic int init_caller; /* a blocking ncclCommInitRank* is still inside the library with this comm */
  /* Its init: 0 deferred to a group's end (maybe another thread's) and not begun, 1 begun (or not
   * deferred: split comms), 2 cancelled by an abort first (which then need not wait for it).
   * Compare-exchanged from 0 by run_inits and ncclCommAbort. */
  _Atomic int init_gate;
  /* arguments kept for a deferred or background init */
  ncclUniqueId init_id;
  ncclUniqueId* init_ids; /* ncclCommInitRankScalable's init_nids ids (malloc'd; NULL: init_id alone) */
  int init_nids;
  int nsplits; /* splits made from this comm (all ranks count alike) */
  /* ncclCommGetUniqueId / ncclCommGrow (api/grow.c), touched only by the thread calling them (NCCL's
   * rule: no other call on comm meanwhile): the id handed out and not yet consumed by a grow, and a
   * digest of each id consumed, so that one is not used twice. */
  int grow_issued;
  ncclUniqueId grow_id;
  uint64_t grow_used[8];

  /* CHORUS_TIMEOUT or chorusCommSetTimeout, in ns (0 = none): read by whichever thread runs a plan. */
  _Atomic uint64_t timeout_ns;

  /* Who is inside a public call on this comm: `owner` names the one thread in a call that uses it
   * (comm_enter: collectives, groups, split, finalize; 0 = none), `users` counts threads in queries
   * that may run beside it (comm_try_enter: ncclCommGetAsyncError, ncclCommCount...). ncclCommAbort
   * sets abort_flag, then waits for both to drop to 0 before freeing anything. */
  _Atomic uintptr_t owner;
  _Atomic int revoked; /* ncclCommRevoke: no more collectives; split, shrink and destroy still work */
  _Atomic int poisoned; /* a call did not match across ranks; its connections are poisoned (fault/mismatch.c) */
  /* The first rank this rank learned is gone (exited, or its link failed), -1 while none: set once by
   * whichever thread finds or hears of it (compare-exchange from -1, fault/mismatch.c), read by any
   * (chorusCommGetLostRank). */
  _Atomic int lost_rank;
  /* 1 + a rank found gone once while we waited on it, to be confirmed after one more poll (core/engine.c);
   * only the thread running this comm's plans touches it. */
  int lost_suspect;
  _Atomic int users;
  /* 1 for the handle, until ncclCommAbort/ncclCommDestroy has torn the comm down, + 1 for each of
   * its calls queued in some thread's open group (that thread adds it in enq_task and drops it when
   * ncclGroupEnd is done with the call): whoever drops the last frees the struct and its staging
   * pool, which the group's end still touches (comm_unref). Atomic. */
  _Atomic int refs;
  /* ncclCommDestroy has begun (its Dekker pair with comm_enter, like abort_flag's; comm_free sets it
   * too): no thread enters any more, and once freed only refs' part of the struct is left. */
  _Atomic int dead;
  struct log_err_sink last_error; /* WARNs of calls on this comm: ncclGetLastError(comm) */
  /* Observation (observe/): the flight recorder (its own lock; NULL when CHORUS_FLIGHT_RECORDER=0), made
   * at init and freed by comm_free after stall_unregister, so a dump from the query service never sees
   * it go; fr_dumped: the first failure's dump was written (exchanged to 1 once). clock_offset_ns: this
   * host's realtime minus rank 0's (observe/clock.c), set at init, read-only afterwards. */
  struct fr_ring* fr;
  _Atomic int fr_dumped;
  int64_t clock_offset_ns;
  /* Counters (chorusCommGetCounters): calls, bytes and errors added to by the thread finishing a plan
   * (one at a time: tickets), wait times with atomic adds by any waiting thread; read by any. wait_ns_peer[nranks]: time the engine waited on each peer (made at
   * init). Bytes per peer are counted on the connections (struct conn). */
  _Atomic uint64_t ctr_calls, ctr_bytes, ctr_wait_ns, ctr_errors;
  _Atomic uint64_t ctr_noop; /* calls with nothing to do (one rank, in place): the calling thread's */
  _Atomic uint64_t* wait_ns_peer;
  /* One-sided calls to each peer (api/rma_ops.c): [2 * nranks], bytes put into its windows, then signals
   * sent to it (a put's included). Added to by the calling thread, read by any; made at init. */
  _Atomic uint64_t* rma_ctr;
  struct obs_trace* trace; /* CHORUS_TRACE (observe/trace.c), or NULL */
  /* NCCL_PROFILER_PLUGIN's context (observe/profiler.c), or NULL: set at the end of init, freed by
   * comm_free; its plan events only by the thread running the comm's current plan (tickets). */
  struct prof_comm* prof;
  /* Device buffers in CUDA stream order (staging/staging.c): made by the first such call and used by the
   * thread in a call on this comm (owner); freed by comm_free. */
  struct stage_comm* stage;
  /* Bytes per piece of a large AllReduce, Reduce, Broadcast, AllGather or ReduceScatter (staging/staging.c's stage_pieces), or 0:
   * set by gpu_setup alike on every rank, read-only afterwards. */
  size_t stage_piece;
  /* Staged AllReduce, Reduce and ReduceScatter reduce on the GPU (staging/staging.c's stage_reduce_way):
   * set by gpu_setup alike on every rank, read-only afterwards. */
  int stage_gpu_reduce;
  /* Plans handed to a CUDA stream that draws their tickets when it gets there (staging/staging.c's graph
   * mode): added by the comm's owner at launch, taken back once drawn (or dropped at an abort). A
   * thread that draws tickets itself waits for 0 first (core/group.c), as does comm_wait_idle. */
  _Atomic int unticketed;
  /* While the owner thread makes a group's connections (core/group.c connect_group, which may wait on
   * peers for long at scale): how many peers (0: not connecting), and the group's first call (func, its
   * peer for send/recv). Written by the owner, read by the stall query (fault/stall_job.c) without a
   * lock: a report read across a change may pair a count with the next group's call. */
  _Atomic int connecting, connecting_func, connecting_peer;
  /* ncclWaitSignal in progress (api/rma_ops.c), for the stall report: rma_wait 1 while it waits; the
   * descriptor it still waits on (signal, context, peer), its counts since the call (have of want) and
   * when the wait began, refreshed every 10 ms. Written by the waiting thread, read by the stall query
   * without a lock (a read across a refresh may mix two refreshes' counts). */
  _Atomic int rma_wait, rma_wait_sig, rma_wait_ctx, rma_wait_peer;
  _Atomic uint64_t rma_wait_have, rma_wait_want, rma_wait_since;
  /* Ranks sharing one GPU (gpu.h): the context current when the application made the comm (its
   * creating thread), the peers' hellos from comm_agree (until gpu_setup), and the GPU path, made at
   * init and read-only afterwards but for its own documented fields. */
  void* cuda_ctx;
  struct gpu_hello* gpu_hellos;
  struct gpu_comm* gpu;
};

static inline struct ch_p2p* comm_apeer(struct ncclComm* comm, int r) { return &comm->p2p[comm->nranks + r]; }

#endif
