/* The communicator and the state every layer above the transports shares. */
#ifndef CH_COMM_H
#define CH_COMM_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>

#include "nccl.h"
#include "../algo/algo.h"
#include "../bootstrap/bootstrap.h"
#include "../coll/reduce.h"
#include "../misc/log.h"
#include "../misc/status.h"
#include "../transport/transport.h"

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

struct ch_plan; /* enqueue.h */
struct tune_model; /* tune.h */

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
  struct algo_tree trees[2]; /* this rank in the Tree algorithm's trees (topo_tree.c); read-only after init */
  int ntrees;
  int tree_depth; /* hops from a tree's root to its deepest leaf (cost model) */
  /* [2 * nranks]: [r] sends and receives with rank r; [nranks + r] the FIFOs of RecDbl, Rabenseifner
   * and Tree with r, connected with the rings (connect.c), apart from the first, which a group's sends
   * and receives use in no fixed order with a collective (comm_apeer) */
  struct ch_p2p* p2p;
  struct tp_sizes sizes;     /* ring FIFOs */
  struct tp_sizes p2p_sizes; /* send/recv FIFOs: smaller, there can be one per peer */
  char* scratch; /* LL/LL128 staging, one slot payload */
  char* peer_scratch; /* Tree Reduce partial results: one step of the per-peer FIFOs (init.c); used only
                       * by the thread running this comm's current plan (plans run one at a time,
                       * and a plan's Tree Reduces share one lane) */

  struct ch_redop_slot redops[CH_MAX_REDOPS];
  size_t exchange_max_bytes;
  size_t direct_min_bytes;
  size_t stream_min_bytes;
  int min_nchannels, max_nchannels; /* NCCL_MIN/MAX_NCHANNELS, read once (tuning.c) */
  struct direct_clique* clique; /* all ranks on this host: direct algorithms (init.c, direct_allreduce.c) */
  struct tp_map_cache* maps;    /* processes: peers' ncclMemAlloc buffers mapped here */
  size_t shm_direct_min_bytes;
  /* Allowed by NCCL_PROTO / NCCL_ALGO, per collective (index: tune.h tune_mask_index); set by tune_init,
   * read-only afterwards. tune_bad: a value did not parse (init fails after comm_agree). */
  unsigned proto_mask[6], algo_mask[6];
  int tune_bad;
  unsigned proto_ok; /* protocols the transports can carry (network: Simple only) */
  int tune_net;      /* some ranks talk over the network: the cost model uses its hop costs */
  const struct tune_model* model; /* the cost model's constants (tune_model.c): set by tune_init, immutable */
  /* NCCL_TUNER_PLUGIN (tuner_plugin.c): set at init, released by comm_free; called by the thread in a
   * call on this comm. tuner_failed: a getCollInfo error was reported (once). */
  struct tune_plugin* tuner;
  void* tuner_ctx;
  _Atomic int tuner_failed;

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
  int nsplits; /* splits made from this comm (all ranks count alike) */

  /* CHORUS_TIMEOUT or chorusCommSetTimeout, in ns (0 = none): read by whichever thread runs a plan. */
  _Atomic uint64_t timeout_ns;

  /* Who is inside a public call on this comm: `owner` names the one thread in a call that uses it
   * (comm_enter: collectives, groups, split, finalize; 0 = none), `users` counts threads in queries
   * that may run beside it (comm_try_enter: ncclCommGetAsyncError, ncclCommCount...). ncclCommAbort
   * sets abort_flag, then waits for both to drop to 0 before freeing anything. */
  _Atomic uintptr_t owner;
  _Atomic int revoked; /* ncclCommRevoke: no more collectives; split, shrink and destroy still work */
  _Atomic int poisoned; /* a call did not match across ranks; its connections are poisoned (mismatch.c) */
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
  /* Device buffers in CUDA stream order (staging.c): made by the first such call and used by the
   * thread in a call on this comm (owner); freed by comm_free. */
  struct stage_comm* stage;
  /* Ranks sharing one GPU (gpu.h): the context current when the application made the comm (its
   * creating thread), the peers' hellos from comm_agree (until gpu_setup), and the GPU path, made at
   * init and read-only afterwards but for its own documented fields. */
  void* cuda_ctx;
  struct gpu_hello* gpu_hellos;
  struct gpu_comm* gpu;
};

static inline struct ch_p2p* comm_apeer(struct ncclComm* comm, int r) { return &comm->p2p[comm->nranks + r]; }

/* Validate a handle passed by the user; WARNs and returns CH_INVALID_ARG if bad, CH_INVALID_USAGE in
 * a fork child that inherited it. */
ch_status comm_check(const struct ncclComm* comm, const char* fn);
/* A valid handle made by the process this one forked from (no WARN). */
int comm_inherited(const struct ncclComm* comm);
/* Wait until a nonblocking init has finished; returns its result. */
ch_status comm_ensure_ready(struct ncclComm* comm);
void comm_set_async_error(struct ncclComm* comm, ch_status s);
void comm_unref(struct ncclComm* comm); /* drop a reference (refs): the last frees comm */

/* Bracket a public call on comm (after comm_check): counts the caller in `users` and routes its
 * WARNs to the comm's last-error record. comm_enter fails with CH_ABORTED once abort has begun. */
struct comm_guard {
  struct ncclComm* comm;
  struct ncclComm* prev_comm; /* the thread's entered comm before this one */
  struct log_err_sink* prev_sink;
  int nested;    /* comm was already entered by this thread: nothing to undo */
  int exclusive; /* holds comm->owner (else counted in comm->users) */
};
/* A call that uses the comm: CH_ABORTED once abort has begun, CH_INVALID_USAGE (with a WARN) while
 * another thread is inside such a call. */
ch_status comm_enter(struct ncclComm* comm, struct comm_guard* g);
/* A query that may run beside such a call (any thread): 0, without a WARN, once abort has begun. */
int comm_try_enter(struct ncclComm* comm, struct comm_guard* g);
void comm_leave(struct comm_guard* g);
/* Join the background init thread if nobody has (destroy and abort only). */
void comm_join_init(struct ncclComm* comm);

/* Connect what the next plans need and is not connected yet, for several communicators at once
 * (one thread may drive many ranks). need_send[i][p] / need_recv[i][p] flag peers p of comms[i] for
 * sends and receives, need_send[i][nranks] asks for the rings, and need_*[i][nranks + 1 + p] flags p
 * as a peer of RecDbl, Rabenseifner or Tree (comm_apeer): 2 * nranks + 1 flags each. Two phases (all receivers publish their FIFOs, then all
 * senders attach), so no order of peers can deadlock. */
ch_status comm_connect(struct ncclComm** comms, int ncomms, char** need_send, char** need_recv);
/* Test hook: the next `count` connection setups of comm fail at this rank's receiving
 * (CONNECT_FAULT_RECV) or sending (CONNECT_FAULT_SEND) end with `status`, as a failed allocation would. */
enum { CONNECT_FAULT_RECV = 1, CONNECT_FAULT_SEND = 2 };
void comm_connect_inject_fault(struct ncclComm* comm, int where, int count, ch_status status);
/* Free every connection. */
void comm_free_connections(struct ncclComm* comm);

/* Run the init job (bootstrap, peers, channels) for comm; used blocking and from threads. */
ch_status comm_init_job(struct ncclComm* comm);

#endif
