/* The staging path's shared parts (staging/staging.c: calls and their launch; staging/stage_pool.c: the
 * pinned memory of a communicator; staging/stage_graph.c: calls captured into CUDA graphs). */
#ifndef CH_GPU_STAGE_INT_H
#define CH_GPU_STAGE_INT_H

#include <pthread.h>
#include <stdint.h>

#include "../cuda/cudrv.h"
#include "../cuda/devjob.h"
#include "../comm/work.h"

/* Pinned host memory of one communicator, reused across calls. `busy` is set by the comm's owner
 * when it hands the block to a call and cleared (release) by whoever finishes that call: the owner
 * (synchronous path) or a gate's last host function. */
struct pin_block {
  struct pin_block* next;
  struct stage_comm* owner; /* whose pool: counted in its `outstanding` while a gate holds the block */
  char* host;
  void* dev; /* host's address for the device (mapped) */
  size_t bytes;
  void* ctx; /* allocated in */
  _Atomic int busy;
  int queued; /* the owner's: handed to a launched gate, so it frees once the streams get there */
};

/* comm->stage: made by the first asynchronous call; fields are the comm owner's unless said. */
struct stage_comm {
  cudaStream_t bridge; /* Chorus host stream that runs the staged plans (its thread writes *flag) */
  void* ctx;
  _Atomic uint32_t* flag; /* mapped pinned word: the last gate the bridge opened */
  void* flag_dev;
  uint32_t next_seq;
  struct pin_block* blocks;
  size_t pinned_bytes;
  /* Gates whose streams may still touch this pool: one for the flag (the gate's own pool) and one per
   * block of the pool a gate holds (a group over several comms holds blocks of each). Any thread. */
  _Atomic int outstanding;
  struct stage_comm* next_orphan; /* under orphans_mu */
  /* Graph mode (the first capture sets it, the owner): eager plans reach the bridge from host
   * functions on order_stream, their tickets drawn there (stage_launch). */
  int graph_mode;
  void* order_stream;
  /* Host functions that hand plans to the bridge (gate_enqueue, graph_replay) do it under enq_mu,
   * unless `closed` (stage_close: an abort, or the pool going): then they drop them. */
  pthread_mutex_t enq_mu;
  int closed;
  struct stage_gate* pending; /* under enq_mu: gates whose host function has not run yet */
  struct stage_graph* graphs; /* captured calls: the owner links them, freed with sc */
  void* in_stream; /* pieces' input copies (made at the first piece; NULL: none could be) */
  int in_tried, order_tried;
  int in_forked;   /* the current call's first piece forked in_stream from its stream (cleared by
                    * every call's first stage_in: a later piece never uses an older call's fork) */
};

struct stage {
  struct pin_block* pin; /* asynchronous: one pinned block for both copies */
  char* block[2];        /* synchronous: host copies, one when the buffers overlap, else one each */
  void* dev_send;
  char* host_send;
  size_t send_bytes;
  void* dev_recv; /* where the result goes back to */
  char* host_recv;
  size_t recv_bytes;
  void* ctx;     /* the buffers' context */
  /* A piece of an AllGather (its result) or a ReduceScatter (its input): that side of the
   * application's buffer is nseg segments of seg bytes, `stride` bytes apart (one per rank's block),
   * and its host copy is them side by side. strided: STAGE_STRIDED_SEND or _RECV, else 0. */
  int strided;
  size_t seg, stride, nseg;
  int hostmem;   /* the application's buffers are host memory (a strided piece, or a reduction's data
                  * movement): copies are memcpy */
  /* A reduction's data movement (t->gpu_reduce) with a result here: host_recv holds nblk blocks of
   * `count` elements, which the GPU (stage_result: Chorus's kernel reading mapped host memory through
   * the table `tab`, in the same pinned block) or, where the call completes before returning, the CPU
   * (host_combine) reduces into dev_recv (recv_bytes: one block). */
  int reduce;
  struct red_op red;
  size_t count, nblk;
  char* recv_mapped;   /* host_recv's address for the device (pinned blocks are mapped) */
  struct dev_table* tab;
  void* tab_dev;
  void* kernel; /* Chorus's kernel for its type in ctx, looked up once (stage_in) */
  int async;     /* copies go on the stream at launch */
  int captured;    /* its stream is being captured into a CUDA graph */
  char* cap_block; /* captured: a block of its own (not the pool's), handed to its stage_graph */
  void* cap_dev;   /* cap_block's address for the device */
};

/* A group captured into a CUDA graph: replayed at will until its communicator goes (NCCL's rule). Set
 * at capture by the owner, then: the plan restored from its snapshot by the replay's host node and
 * run by the bridge (one replay at a time: the replay's stream waits for `flag` before the graph
 * ends); `flag` written by the bridge (1: results in the blocks) and by the stream (0, after the
 * copies back). */
struct stage_graph {
  struct stage_graph* next;
  struct stage_comm* sc;
  struct ch_plan* plan; /* persistent */
  void* snapshot;       /* the plan as built (plan_snapshot) */
  struct ch_batch* batch; /* kept: queued on the bridge at every replay */
  void* ctx;            /* of its blocks */
  _Atomic uint32_t* flag;
  void* flag_dev;
  /* Replays whose plan was handed to the bridge (graph_replay, under sc->enq_mu) and whose plan ended
   * (graph_done, the bridge): they differ while a replay's plan runs. `broken`: two replays ran at
   * once (graph_replay); from then on replays run nothing and their streams pass. */
  _Atomic uint32_t started, finished;
  _Atomic int broken;
  int nblocks;
  char* blocks[]; /* its calls' pinned blocks */
};
enum { STAGE_STRIDED_SEND = 1, STAGE_STRIDED_RECV = 2 };

/* staging/stage_pool.c */
struct stage_comm* stage_comm_get(struct ncclComm* comm, void* ctx); /* comm->stage, made on first use */
/* A pinned block of at least `bytes` for a call (waits for one the streams hand back; NULL with *why
 * CH_OK: none, the call completes before returning), and handing one back. */
struct pin_block* block_get(struct ncclComm* comm, struct stage_comm* sc, size_t bytes, void* ctx, ch_status* why);
static inline void block_put(struct pin_block* b) { atomic_store_explicit(&b->busy, 0, memory_order_release); }
/* staging/staging.c */
void stage_free(struct stage* st);
/* Copy a call's input to its host copy (in) or its result back (!in): on stream s (asynchronous) or
 * now (s NULL), one copy per segment where that side is strided. */
ch_status stage_copy(const struct stage* st, int in, cudaStream_t s);
/* The result on stream s: copied back, or (a reduction's data movement) reduced by the GPU. */
ch_status stage_result(struct stage* st, cudaStream_t s);
/* Pending gates (sc->pending, under sc->enq_mu): the next, and marking one dropped (returns its plans). */
struct stage_gate;
struct stage_gate* stage_gate_next(struct stage_gate* g);
int stage_gate_drop(struct stage_gate* g);
/* staging/stage_graph.c: whether t, on a capturing stream, can be captured (else a WARN saying why), and
 * the launch of a group holding such a call (1: handled, *res its status). */
ch_status capture_check(const struct ch_task* t, const char* fn);
int stage_capture(struct ch_plan** plans, struct ch_task** lists, int n, int ntasks, ch_status* res);

#endif
