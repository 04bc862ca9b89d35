/* The work a call becomes: a task (one checked call), and the plan its group's tasks turn into
 * (per-channel operations in lanes). Types only: the layers that build and run them have their own
 * headers (core/group.h, core/plan.h). */
#ifndef CH_WORK_H
#define CH_WORK_H

#include "comm.h"

/* What tune/choose.c chose for one call. */
struct tune_choice {
  int algo, proto, nch;
  int fallback; /* algorithm when Direct finds a buffer other processes cannot reach */
  int fb_nch;   /* Direct between processes: the channels that fallback takes (the model's for it), 1 if one */
  int nt;     /* write results with non-temporal (streaming) stores */
  int repro;  /* the reproducible level (CH_REPRO_*) this call honours; 0: none */
  size_t chunk; /* bytes per FIFO step a tuner plugin chose (getChunkSize), checked; 0: a whole step */
  int wire;     /* the wire format its compressed hops use (reduce/wire.h; 0: none) */
};

struct ch_task {
  int func;
  const void* sendbuff;
  void* recvbuff;
  size_t count;
  int type;
  int op; /* ncclRedOp_t */
  int root; /* root, or peer for send/recv */
  /* send/recv made by expand_task or api/alltoallv.c: the call they come from and its root (0 / -1 for
   * ncclSend/Recv) */
  int origin, origin_root;
  /* One of the sends and receives api/alltoallv.c made of one call: 1 for its first, which stands for
   * the whole call in the flight recorder and the counters (as origin, call_count elements), 2 for the
   * others, neither recorded nor counted; 0: a call of its own. */
  int part;
  size_t call_count;
  struct tune_choice how; /* chosen by plan_build */
  unsigned sel;         /* per-call algSelection as tune_sel_resolve left it (tune/select.c); 0: automatic */
  int wire;             /* wire format the call may use (api/coll.c: api_wire_for_call); 0: none */
  uint64_t user_tag;    /* ncclCollConfig_t.userProfilerTag; 0: untagged */
  struct red_op red;    /* built once, when the call is checked */
  struct ncclComm* comm;
  cudaStream_t stream;
  int exec; /* enum ch_exec (core/exec.h): where it runs, decided once when it is checked (api/route.c) */
  struct stage* stage; /* device buffers staged through host memory (staging/staging.c), or NULL */
  struct gpu_call* gpu; /* device buffers of ranks on one GPU (gpu/call.c): t is their exchange, or NULL */
  uint64_t fr_id;       /* its flight recorder entry (observe/recorder.c), 0 when the recorder is off */
  int piece;            /* 1 + its index among the pieces of one large call (staging/staging.c's stage_pieces), else 0 */
  int piece_ordered;    /* pieces copy in on the call's stream: its call's buffers overlap without being one,
                         * or its input is the call before's result (a split reduction's AllGather) */
  int gpu_reduce;       /* the data movement of a staged reduction (an AlltoAll, AllGather or Gather that
                         * stage_reduce_way made of it): the GPU combines the nranks blocks its host result
                         * holds into recvbuff's count elements, with red (staging/staging.c) */
  size_t stride;        /* a piece of an AllGather (result) or ReduceScatter (input): elements between the
                         * rank blocks of that buffer, whose slices the piece takes (else 0) */
  int noop;             /* nothing to do (one rank, in place): checked, never queued */
  int hostless;         /* its executor exchanges what it needs itself (gpu/call.c): no host operation */
  int held;             /* queued in an open group: holds a reference on comm (group.c) */
  int lost;             /* its comm was aborted or destroyed before the group ended: dropped */
  struct ch_task* next;
};

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
  _Atomic int* outcome;    /* one per task: Direct's verdict for its standby ops (DIRECT_OUTCOME_*, algo.h) */
  int ncoll;               /* collectives in the plan: comm->seq advances by this when it starts */
  int started, done;       /* done: ran to the end (only such a plan is kept for reuse) */
  ch_status status;
  /* Set when the plan is one collective: a later call with this key can reuse it (plan_reuse). */
  int reusable, key_func, key_type, key_root;
  unsigned key_sel; /* the task's per-call selection: a plan chosen under one is not another's */
  int key_wire;     /* and its wire format request (api_wire_for_call) */
  int first_algo; /* of a reusable plan's ops: Direct may switch to its fallback while running */
  int persistent; /* a captured group's (staging/stage_graph.c): restored at each replay, never released, freed with its comm */
  size_t key_count;
  struct ch_plan* next; /* comm_wait_idle_aborting's list of plans taken off their streams */
  /* Observation: the flight recorder entries of its calls (ids fr_lo..fr_hi, this comm's calls of the
   * group in call order; 0: none) and what the counters add when it ends. */
  uint64_t fr_lo, fr_hi;
  uint64_t user_bytes; /* count x type size of its calls */
  int ncalls;
  /* One wave of a group run in waves (core/group.c): a later wave does not start its calls in the
   * recorder again (wave_cont), an earlier one that succeeds does not end or count them (wave_more). */
  int wave_cont, wave_more;
};

#endif
