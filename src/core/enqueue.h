/* From API calls to executable plans: tasks are collected per group, turned into per-channel
 * operations (algorithm + protocol chosen in tuning.c), connected, and run by the engine. */
#ifndef CH_ENQUEUE_H
#define CH_ENQUEUE_H

#include "comm.h"

/* What tuning.c chose for one call. */
struct tune_choice {
  int algo, proto, nch;
  int fallback; /* algorithm when Direct finds a buffer other processes cannot reach */
  int stream; /* write results with streaming stores */
};

struct ch_task {
  int func;
  const void* sendbuff;
  void* recvbuff;
  size_t count;
  int type;
  int op; /* ncclRedOp_t */
  int root; /* root, or peer for send/recv */
  /* send/recv made by expand_task: the call they come from and its root (0 / -1 for ncclSend/Recv) */
  int origin, origin_root;
  struct tune_choice how; /* chosen by plan_build */
  struct red_op red;    /* built once, when the call is checked */
  struct ncclComm* comm;
  cudaStream_t stream;
  struct stage* stage; /* device buffers staged through host memory (staging.c), or NULL */
  struct gpu_call* gpu; /* device buffers of ranks on one GPU (gpu_call.c): t is their exchange, or NULL */
  int held;             /* queued in an open group: holds a reference on comm (group.c) */
  int lost;             /* its comm was aborted or destroyed before the group ended: dropped */
  struct ch_task* next;
};

/* staging.c: t's touched buffers are CUDA device memory. stage_in waits for t's CUDA stream, copies
 * the input to host memory and points t at host copies; stage_out (when t's group has run) copies the
 * result back if ok, and frees. */
ch_status stage_in(struct ch_task* t, int needs_send, int needs_recv, const char* fn);
ch_status stage_out(struct ch_task* t, int ok);
/* A group whose calls were all staged asynchronously: queue copies, host functions and waits on the
 * CUDA streams and the plans on comm's bridge stream. 1: done (plans taken), 0: run it as before. */
struct ch_plan;
int stage_launch(struct ch_plan** plans, struct ch_task** lists, int n, ch_status* res);
/* The bridge stream's side (stream.c): wait until every stream's inputs are in host memory (or an
 * abort), then, after the plans ran, write the flag the streams wait for. */
struct stage_gate;
void stage_gate_wait(struct stage_gate* g, struct ch_plan** plans, int n);
void stage_gate_open(struct stage_gate* g);
/* comm_free: the bridge stream and the pinned memory. */
void stage_comm_free(struct ncclComm* comm);

/* A lane is a queue of operations that share connections and so must run one after another. */
struct ch_lane {
  struct ch_op** ops;
  int nops, cur;
};

/* Ownership: the building thread owns a plan until launch; then plan_exec (the calling thread, or
 * the stream thread) owns it until it finishes, when plan_exec releases it: kept in comm->reuse_plan
 * (taken back only by plan_reuse's compare-exchange) or freed. */
struct ch_plan {
  struct ncclComm* comm;
  size_t alloc_bytes;
  uint64_t ticket;
  struct ch_op* ops;
  int nops;
  struct ch_lane* lanes;
  int nlanes;
  struct ch_op** lane_ops; /* storage for every lane's op list */
  struct red_op* reds;     /* one per task */
  int ncoll;               /* collectives in the plan: comm->seq advances by this when it starts */
  int started, done;       /* done: ran to the end (only such a plan is kept for reuse) */
  ch_status status;
  /* Set when the plan is one collective: a later call with this key can reuse it (plan_reuse). */
  int reusable, key_func, key_type, key_root;
  int first_algo; /* of a reusable plan's ops: Direct may switch to its fallback while running */
  size_t key_count;
  struct ch_plan* next; /* comm_wait_idle_aborting's list of plans taken off their streams */
};

/* Group layer (group.c). Every API call goes through enq_task. */
ch_status enq_task(struct ch_task* t);
int group_depth(void);
ch_status group_start(void);
ch_status group_end(void);
/* Close the group without launching anything; estimate its time in microseconds. */
ch_status group_simulate_end(float* estimated_us);
/* Remember that a call inside the current group failed its checks (the group then fails). */
void group_set_error(ch_status s);
/* Defer a communicator init to the end of the current group. */
ch_status group_defer_init(struct ncclComm* comm);
/* Is comm's init deferred to the end of this thread's current group? */
int group_init_pending(const struct ncclComm* comm);

/* Plans (plan.c). */
ch_status plan_build(struct ncclComm* comm, struct ch_task* tasks, struct ch_plan** out);
void plan_free(struct ch_plan* plan);
/* The plan of the previous call on comm, re-armed for task t, if it was the same collective with the
 * same count, type and root; NULL otherwise (then build one). */
struct ch_plan* plan_reuse(struct ncclComm* comm, const struct ch_task* t);
/* Done with a plan: keep it on its comm for a repeat if it ran to completion, else free it. NULL is
 * a no-op. Not for a plan whose completion was published (plan_exec releases those itself). */
void plan_release(struct ch_plan* plan);
/* Run plans to completion (plans of several communicators progress together). Takes ownership:
 * each plan is released before its completion is published, and plans[i] is set to NULL. */
ch_status plan_exec(struct ch_plan** plans, int n);

/* Algorithm and protocol choice (tuning.c): the one place that decides, and logs why. */
/* Whether any two ranks talk over the network, alike on every rank (tuning.c). */
int tune_uses_net(const struct ncclComm* comm);
/* NCCL_SOCKET_NTHREADS x NCCL_NSOCKS_PERTHREAD (threads 1..16, at most CH_MAX_CHANNELS sockets). */
int tune_net_socks(void);
void tune_init(struct ncclComm* comm);
void tune_choose(struct ncclComm* comm, int func, size_t bytes, struct tune_choice* out);
const char* tune_proto_name(int proto); /* "LL", "LL128", "Simple" */
/* Whether NCCL_ALGO leaves some collective an algorithm that uses the per-peer connections (RecDbl,
 * Rabenseifner, Tree): then those are connected with the rings (group.c). The same on every rank. */
int tune_peer_algos(const struct ncclComm* comm);
const char* tune_algo_name(int algo);   /* "Tree", "Ring", "Exchange", "Direct", "RecDbl", "Rabenseifner" */
const char* tune_func_name(int func);   /* "AllReduce", ... */

/* Stall report (stall.c): one WARN per pending operation of pl: what it waits for, and from whom. */
void stall_report(const struct ch_plan* pl, double idle_s, int on_request);
/* CHORUS_DUMP_SIGNAL: install the handler once per process; requests counted so far. */
void stall_install_signal(void);
unsigned stall_dump_requests(void);
/* plan_exec, on every idle pass: publishes what its started plans wait for, once they have been idle
 * for 10 ms, then every 100 ms (stall_job.c), for other ranks' stall reports. */
void stall_note(struct ch_plan* const* plans, int n, uint64_t idle_ns, uint64_t now);

/* Calls that differ across ranks (mismatch.c): CH_INVALID_USAGE, logged once per rank, and every
 * connection of comm poisoned so that the other ranks fail the call too. mm_found: op's receive met a
 * step of another call; mm_poll: slow-path check of a waiting plan. */
ch_status mm_found(struct ncclComm* comm, const struct ch_op* op);
ch_status mm_poll(struct ncclComm* comm, struct ch_plan* pl);
/* Rank `lost` (-1: unknown) is dead or its link failed (logged by the caller): tell every rank. */
void mm_peer_lost(struct ncclComm* comm, int lost);
/* Publish the collective this rank starts (h), for local peers' slow-path checks. */
void mm_publish(struct ncclComm* comm, const struct xfer_hdr* h);

/* Host streams (stream.c). */
int stream_is_ours(cudaStream_t s);
/* Queue a group's plans on s as one batch; CH_SYSTEM (out of memory): the caller runs them itself. */
ch_status stream_enqueue(cudaStream_t s, struct ch_plan** plans, int n);
/* The same, run once gate g opens (staging.c's bridge). */
/* Queue plans whose batch ends with after(arg, status of the plans) on the stream's thread. */
ch_status stream_enqueue_hook(cudaStream_t s, struct ch_plan** plans, int n, void (*after)(void*, ch_status), void* arg);
ch_status stream_enqueue_gated(cudaStream_t s, struct ch_plan** plans, int n, struct stage_gate* g);
/* Host streams for the library's own use (chorusStreamCreate/Destroy without the API checks). */
ch_status stream_create(cudaStream_t* s);
void stream_destroy(cudaStream_t s);
/* Wait until nothing is queued or running on s. */
void stream_wait_idle(cudaStream_t s);
/* Wait until nothing of `comm` is queued or running anywhere. */
ch_status comm_wait_idle(struct ncclComm* comm);
/* ncclCommAbort (its flag set): wait until nothing of comm is queued or running, as comm_wait_idle,
 * but take comm's batches that no stream has begun off their streams first (they may sit behind
 * another communicator's call, perhaps stuck): each such plan ends aborted when its ticket comes up,
 * here, instead of when its stream gets to it. */
void comm_wait_idle_aborting(struct ncclComm* comm);
/* A plan that never ran ends aborted: released and its completion published (its ticket is due). */
void plan_cancel(struct ch_plan* plan);

/* Describe buf for direct algorithms (mem.c): 1 if [buf, buf + bytes) lies in one memfd-backed
 * ncclMemAlloc allocation that other local processes can map, else 0 (out still has the address). */
int mem_describe(const void* buf, size_t bytes, struct direct_buf* out);

/* Build the reduction for (op, type) on comm; CH_INVALID_ARG if op is not valid. */
ch_status enq_red_op(struct ncclComm* comm, int op, int type, struct red_op* out);

#endif
