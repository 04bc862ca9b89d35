/* Ranks that share one GPU: calls on device buffers run on the GPU itself (gpu/setup.c: init and
 * teardown; gpu/call.c: a call's description and its stream's part; gpu/resolve.c: the bridge's part;
 * gpu/watch.c: dead peers and timeouts).
 *
 * At init every rank says whether its thread has a current CUDA context and on which device (the
 * hello, carried in comm_agree's allgather). When every rank of the communicator is on this host and
 * on the same GPU (and ranks of one process on the same context), the communicator gets `gpu`: a
 * page of host memory shared by its ranks and mapped for the device, where each rank's CUDA stream
 * writes and waits for 32-bit barrier words with stream memory operations (never a kernel spinning on
 * a flag: kernels of different processes do not run at once without MPS), and per rank a ring of
 * pointer tables in mapped pinned memory.
 *
 * A call: its buffers are described (device address within its allocation, and a CUDA IPC handle for
 * ranks in other processes); the description is allgathered by the host engine on the
 * communicator's bridge thread, which then opens the peers' buffers (cached per allocation), checks
 * every field against the call, and fills the call's pointer table. The CUDA stream meanwhile waits
 * for that table, passes a barrier (every rank's inputs are ready), runs the kernel (devjob.h) that
 * reads and writes the peers' buffers directly, and passes a second barrier (nobody still reads).
 * Send/Recv: the send's description goes to its peer alone, and the two streams meet through the
 * pair's words (struct gpu_pair) instead of barriers. Nothing of this reaches a kernel unless its
 * table carries the call's number. */
#ifndef CH_CORE_GPU_H
#define CH_CORE_GPU_H

#include "../cuda/cudrv.h"
#include "../cuda/devjob.h"
#include "../comm/work.h"
#include "../misc/param.h"
#include "../misc/utils.h"


#define GPU_SLOTS 128    /* pointer tables per rank: calls whose table may be in use at once */
#define GPU_IPC_CACHE 32 /* a peer's allocations kept open */

/* Per rank, in the shared page: written by that rank's stream, read by every rank's stream. */
struct gpu_words {
  _Alignas(64) _Atomic uint32_t arrive, done;
  _Atomic uint32_t left; /* host-only: the rank's comm is being freed, its calls done (rank 0's copier waits for it) */
  _Atomic uint32_t board_taken; /* host-only: the last of this rank's board entries rank 0's bridge took */
};
struct gpu_seg {
  uint64_t token; /* the export token (tp_fd_map checks it) */
  uint32_t n;
  _Atomic int32_t failed_by; /* 1 + the first rank that failed the communicator's GPU calls (gpu_unblock) */
  struct gpu_words w[];      /* [n], then the pairs' words (gpu_pair_off) */
};
/* Per ordered pair src -> dst, after w[n]. One rank of the pair copies (gpu_p2p_active): the lower
 * one, so that two ranks that exchange need one process's kernel, not two (kernels of different
 * processes take turns on the GPU, ~0.15-0.3 ms each time on the H200). The other rank's stream says
 * its buffer is ready (`posted`: its send's data, or its receive's buffer free) and waits for
 * `copied`, which the copying rank's stream writes after its kernel. On 3 ranks or more, a pair
 * without rank 0 is copied by rank 0's process instead (gpu/copier.c: every copy then comes from
 * one process): the receiver's stream writes `posted`, the sender's `posted_send`, and the copier's
 * stream `copied`. All carry the number of sends on that ordered pair (alike on both sides).
 * `taken` and `taken_send` are host-only: the last description (below) the copying side took from
 * the pair's mailboxes. */
struct gpu_pair {
  _Atomic uint32_t posted, copied, taken, posted_send, taken_send, pad[3];
};
static inline size_t gpu_pair_off(int n, int src, int dst) {
  size_t pairs = sizeof(struct gpu_seg) + (size_t)n * sizeof(struct gpu_words);
  return pairs + ((size_t)src * n + dst) * sizeof(struct gpu_pair);
}

/* This rank's mapped pinned memory: written by the bridge (ready, slot contents), and by the stream
 * (slot_done); the kernel reads the slots. */
struct gpu_priv {
  _Alignas(64) _Atomic uint32_t ready;        /* the last call whose table is filled (or failed) */
  _Atomic int32_t failed;                     /* this rank failed the communicator: no kernel runs */
  _Alignas(64) _Atomic uint32_t slot_done[GPU_SLOTS]; /* the last call that finished with each slot */
  struct dev_table slot[GPU_SLOTS];
};

struct gpu_ipc { uint64_t id, peer_base; uintptr_t base; size_t size; uint32_t last_seq; int pinned; /* a graph's */ };
struct gpu_own { uint64_t id; uintptr_t base; cudev_ipc_handle h; };

/* comm->gpu. Made at init and freed with the comm. Fields are set at init and read-only afterwards,
 * except: next_seq (the comm's owner, at launch), own[] (the owner, at enqueue), peer caches (the
 * bridge thread only), the shared words and priv (atomics, see above). */
struct gpu_comm {
  struct ncclComm* comm;
  void* ctx;
  int n, rank, sms, ordinal; /* ordinal: the device's */
  int any_proc;          /* some rank is in another process (IPC handles needed) */
  char* same_proc;       /* [n]: a thread of this process (checked against gpu/setup.c's local ranks) */
  uint64_t comm_hash;    /* its key among the local ranks */
  int local;             /* registered there */
  struct gpu_seg* seg;   /* NULL for one rank */
  void* seg_dev;
  struct gpu_priv* priv;
  void* priv_dev;
  void* stage_dev;  /* [GPU_SLOTS] struct dev_staged in device memory: written and read by this rank's stream */
  int stage_blocks; /* CHORUS_CUDA_STAGE_BLOCKS */
  int one_kernel;   /* CHORUS_CUDA_ONE_KERNEL, rank 0's: alike on every rank */
  int unroll;       /* CHORUS_CUDA_UNROLL: this rank's kernels */
  void* fn[DEV_STAGE + 1]; /* the kernels in ctx (cudev_kernel), looked up once at init */
  cudaStream_t bridge;
  uint32_t next_seq;  /* this rank's calls: tables, slots (the owner, at launch) */
  uint32_t next_cseq; /* collectives, numbered alike on every rank (the owner, at launch) */
  uint32_t next_bseq; /* boarded collectives (their board entries), alike on every rank (the owner) */
  _Atomic uint32_t launched_c; /* the last collective queued on a stream */
  _Atomic uint32_t* p2p_sent;  /* [n]: sends to each peer queued (the owner adds, gpu_unblock reads) */
  _Atomic uint32_t* p2p_recvd; /* [n]: receives from each peer queued */
  cudaStream_t last_stream; /* of the last call queued (the owner, at launch); valid once next_seq moved */
  void* done_ev; /* recorded after each call on its stream, a call on another waits for it (the owner, at launch) */
  int any_launched;
  _Atomic uint32_t launched; /* the last call queued on a stream */
  struct gpu_own own[16];
  int nown;
  struct gpu_ipc (*ipc)[GPU_IPC_CACHE]; /* [n][GPU_IPC_CACHE] */
  struct gpu_comm* next_orphan;         /* gpu/setup.c's orphans_mu */
  struct gpu_copier* copier;            /* rank 0 of 3+ ranks: copies the relayed pairs (gpu/copier.c) */
  struct gpu_graph_call* graphs;        /* captured calls (the owner, at launch; freed with the comm) */
  /* The relay (gpu/relay.c): set at init; relay_next and the events are the owner's, at launch. */
  int relay;
  size_t relay_chunk;
  uint32_t relay_depth;
  _Atomic uint32_t relay_next;
  void* relay_stream; /* cudaStream_t: this rank's consuming stream (kernels, copies out of the rings) */
  void* relay_ev[2];         /* the call's start on its stream, the consuming stream's end */
  uint32_t next_graph;                  /* captured calls so far: alike on every rank (the owner) */
  /* gpu/watch.c, under its watch_mu */
  struct gpu_comm* next_watched;
  uint32_t watch_seq;   /* the oldest unfinished call when last looked at */
  uint64_t watch_since; /* since when it is (0: nothing in flight) */
  int watch_fired;
};

/* The description of one rank's part of a call (allgathered; peers' are checked before use). */
struct gpu_buf_desc {
  uint32_t present, shareable;
  uint32_t foreign;   /* device memory of another device or context than the communicator's */
  uint32_t misaligned; /* the relay: not aligned to its elements (its kernel loads whole ones) */
  uint64_t id, off;
  uint64_t ptr;  /* used only between ranks of one process, and checked against the driver first */
  uint64_t base; /* the allocation's address in its process: only compared (a reused address is a new allocation) */
  cudev_ipc_handle h;
};
struct gpu_desc {
  uint32_t seq, func, type, op_kind;
  int32_t root;
  uint32_t pad;
  uint64_t count;
  uint64_t scalar; /* PreMulSum: this rank's scalar (bits of a double, or an int64_t) */
  uint64_t stream; /* the call's CUDA stream: only compared between ranks of one process */
  struct gpu_buf_desc buf[2];
};

/* A sender that copies (the lower rank of its pair) needs its receiver's buffer, and rank 0's copier
 * both buffers: the side that does not copy leaves its description in the pair's mailbox, after the
 * pair words, GPU_MAIL entries per ordered pair and side (GPU_MAIL_RECV: the receiver's; GPU_MAIL_SEND:
 * the sender's; entry k holds call number k mod GPU_MAIL). A rank writes an entry once the copying
 * side has taken the one before it there (gpu_pair.taken, taken_send), `seq` last; the copying side
 * waits for `seq`, copies the entry and checks every field before use. */
#define GPU_MAIL 8
enum { GPU_MAIL_RECV = 0, GPU_MAIL_SEND = 1 };
struct gpu_mail {
  _Atomic uint32_t seq;
  uint32_t pad;
  struct gpu_desc d;
};
static inline size_t gpu_mail_off(int n, int src, int dst, uint32_t k, int side) {
  return UT_ALIGN_UP(gpu_pair_off(n, n, 0), 64) +
         ((((size_t)src * n + dst) * 2 + (size_t)side) * GPU_MAIL + k % GPU_MAIL) * sizeof(struct gpu_mail);
}

/* Calls captured into CUDA graphs: each gets two words per rank in the shared page, after the
 * mailboxes, that every replay reuses: a rank's stream sets `arrive` to 1 (its inputs are ready),
 * rank 0's stream waits for every rank's, sets them back to 0, runs the kernel and sets every `done`
 * to 1, which the rank's stream waits for and sets back to 0. A flag is set only once its last use
 * was consumed, so replays never mix; the numbered words of eager calls cannot serve, since a replay
 * repeats the numbers it was captured with. */
#define GPU_GRAPH_CALLS 256
struct gpu_graph_words {
  _Atomic uint32_t arrive, done;
};
static inline size_t gpu_graph_off(int n, uint32_t call, int r) {
  return UT_ALIGN_UP(gpu_mail_off(n, n, 0, 0, 0), 64) + ((size_t)call * n + r) * sizeof(struct gpu_graph_words);
}
/* The board: a collective that one kernel (rank 0's) runs needs only rank 0 to know every rank's
 * buffers. Each other rank leaves its description on its board, after the graph words, GPU_MAIL
 * entries a rank (entry k holds boarded collective number k mod GPU_MAIL, numbered apart from the
 * others so that calls that are not boarded leave no gap; `seq` written last; rewritten once rank 0's
 * bridge has taken the one GPU_MAIL before: gpu_words.board_taken), and rank 0's bridge
 * collects them: no allgather through the host engine, and nothing for the others' bridges to do. */
static inline size_t gpu_board_off(int n, int r, uint32_t k) {
  return UT_ALIGN_UP(gpu_graph_off(n, GPU_GRAPH_CALLS, 0), 64) +
         ((size_t)r * GPU_MAIL + k % GPU_MAIL) * sizeof(struct gpu_mail);
}

/* The relay (gpu/relay.c): ranks of one host whose buffers are not shared directly (on different GPUs,
 * or CHORUS_CUDA_RELAY=1). Per rank, after the boards, two counters of pieces (chunks of a call,
 * numbered on from call to call alike on every rank, cyclic): `in`, the pieces whose input this
 * rank's stream has copied into its ring (written after each copy), and `used`, the pieces this rank
 * has consumed from every ring (written after its kernel or copies of each piece, even where it had
 * nothing to do). Then each rank's ring: `depth` entries of `chunk` bytes of pinned host memory that
 * every rank maps for its device; piece G sits in entry G mod depth. */
struct gpu_relay_words {
  _Atomic uint32_t in, used;
  _Atomic uint32_t gin, gused; /* the same for a call captured into a graph: counted from 0 (gpu/relay.c) */
  uint32_t pad[12];
};
static inline size_t gpu_relay_off(int n, int r) {
  return UT_ALIGN_UP(gpu_board_off(n, n, 0), 64) + (size_t)r * sizeof(struct gpu_relay_words);
}
static inline size_t gpu_ring_off(int n, int r, uint32_t entry, size_t chunk, uint32_t depth) {
  return UT_ALIGN_UP(gpu_relay_off(n, n), 4096) + ((size_t)r * depth + entry) * chunk;
}

/* A captured call's own table and staging slot, kept with the communicator (a graph may be replayed
 * at any time until it goes, as NCCL requires). */
struct gpu_graph_call {
  struct gpu_graph_call* next;
  uint32_t index;       /* its words (gpu_graph_off); a relayed call's also index + 1 */
  uint32_t id;          /* its table's seq */
  int resolved;         /* the bridge filled the table (gpu/resolve.c) */
  struct dev_table* tab; /* mapped pinned memory */
  void* tab_dev;
  void* staged_dev;     /* one struct dev_staged */
};

/* One call, from enqueue to the bridge's hook. */
struct gpu_call {
  struct gpu_comm* g;
  uint32_t seq, cseq; /* this rank's call number; the collective's, or the send's on its pair */
  int func, type, root, peer; /* peer: Send/Recv's (-1 otherwise) */
  int mailed;   /* a receive whose sender copies: its description is in the pair's mailbox */
  int copy_only; /* one rank, out of place, no scaling: a copy engine copy, no table, no kernel */
  int captured;  /* its stream is being captured into a CUDA graph */
  int boarded;   /* a collective whose descriptions go through the board (gpu_board_off) */
  uint32_t bseq; /* boarded: its number among boarded calls (its entry; board_taken counts these) */
  struct gpu_graph_call* gc; /* captured (but not copy_only): its own table, no ring slot (gpu/call.c) */
  size_t count;
  struct red_op red;
  cudaStream_t stream;
  const void* ptr[2];
  struct gpu_desc mine;
  struct gpu_desc all[]; /* [n]: the allgather's result */
};

/* A call with a table in this rank's ring (its seq names it): not one captured into a graph (its own
 * table) nor a plain one-rank copy (none). */
static inline int gpu_has_slot(const struct gpu_call* c) { return !c->captured && !c->copy_only; }

/* gpu/setup.c */
void gpu_hello_fill(struct ncclComm* comm, struct gpu_hello* h);
ch_status gpu_setup(struct ncclComm* comm, const struct gpu_hello* all);
void gpu_free(struct ncclComm* comm);
/* Let every stream of the communicator past every barrier and table wait (an abort, or a failure that
 * leaves peers unable to arrive). Any thread. */
void gpu_unblock(struct gpu_comm* g);
/* 1 and *oldest = the oldest call queued on a stream that has not finished there; 0 if none. Any
 * thread (atomics only). */
int gpu_unfinished(struct gpu_comm* g, uint32_t* oldest);

/* A peer process's allocation opened in this process (CUDA IPC), shared by every communicator and
 * rank here that uses it (the driver maps a handle once per process): nonce names the exporting
 * process. Any thread. */
ch_status gpu_ipc_open(void* ctx, uint64_t nonce, uint64_t id, const cudev_ipc_handle* h, uintptr_t* base,
                       size_t* size, int* cu); /* *cu: the driver's refusal (CUresult), said by the caller */
void gpu_ipc_close(void* ctx, uintptr_t base);
/* Who looks up a cache of GPU_IPC_CACHE entries (one per peer), and when one of its entries may be
 * closed: a copier closes one only while no copy at all is in flight, a rank once the calls that used
 * it have finished. */
struct gpu_ipc_user {
  int rank;         /* named in the WARNs */
  const char* busy; /* what holds the entries when none may go ("calls in flight") */
  int (*idle)(void* arg, const struct gpu_ipc* e);
  void* arg;
};
/* Peer r's allocation d mapped here: its entry in `cache`, opened (and the least recently used idle
 * entry closed) when not there yet. The cache's owner thread only. */
ch_status gpu_ipc_get(struct gpu_comm* g, struct gpu_ipc* cache, int r, const struct gpu_buf_desc* d,
                      const struct gpu_ipc_user* u, struct gpu_ipc** out);

/* Tests: start this rank's call numbers at base (before its first call on device buffers), to
 * cross the 32-bit wrap. Every rank of the communicator must do it alike. */
void gpu_test_seq_base(struct ncclComm* comm, uint32_t base);

/* gpu/watch.c: watch for dead peers and CHORUS_TIMEOUT while calls are in flight (from setup to free). */
void gpu_watch_add(struct gpu_comm* g);
void gpu_orphans_tick(int here); /* gpu/setup.c; here = 0: frees go to the reaper (cudrv_defer) */
void gpu_watch_remove(struct gpu_comm* g);

/* gpu/call.c */
int gpu_is_p2p(int func);
int gpu_a2a_pair(int n, int me, int r); /* AlltoAll: rank me moves the blocks of the pair {me, r} */
int gpu_one_kernel(const struct gpu_comm* g, int func); /* rank 0's kernel does every rank's part */
/* Send/Recv: 1 if this rank's kernel copies the pair's data (the lower rank of the pair with
 * CHORUS_CUDA_ONE_KERNEL, else the receiver; a send to itself: the receive; 0 on both sides of a
 * relayed pair). */
int gpu_p2p_active(const struct gpu_comm* g, int func, int peer);
/* The ordered pair src -> dst is copied by rank 0's process (gpu/copier.c): 3 ranks or more, neither
 * is rank 0, CHORUS_CUDA_ONE_KERNEL. */
static inline int gpu_p2p_relayed(const struct gpu_comm* g, int src, int dst) {
  return g->one_kernel && g->n >= 3 && g->seg && src != 0 && dst != 0 && src != dst;
}
/* Stream memory operations gathered for one driver call (cudev_memops), sent when full or flushed. */
struct gpu_memops {
  struct gpu_comm* g;
  cudaStream_t s;
  ch_status st; /* the first failure */
  int k;
  struct cudev_memop op[CUDEV_MAX_MEMOPS];
};
ch_status gpu_flush(struct gpu_memops* o);
void gpu_memop(struct gpu_memops* o, void* dev, uint32_t value, int wait); /* wait: for *dev >= value, cyclic */
/* A rank's calls on one communicator run in call order whatever streams they name: s first waits for
 * the previous call (gpu_follow), and gpu_done marks where the next one must wait. */
ch_status gpu_follow(struct gpu_comm* g, cudaStream_t s);
ch_status gpu_done(struct gpu_comm* g, cudaStream_t s);
struct dev_args;
/* Launch the kernel for a's jobs on s (stage_dev: GPU_SLOTS struct dev_staged, entry slot % GPU_SLOTS). */
ch_status gpu_launch_jobs(struct gpu_comm* g, struct dev_args* a, void* stage_dev, uint32_t slot, cudaStream_t s);
/* A kernel's arguments for call c without jobs: its table slot, failure words, type and operation. */
void gpu_args_init(struct gpu_comm* g, const struct gpu_call* c, struct dev_args* a);
void* gpu_table_dev(struct gpu_comm* g, uint32_t seq);     /* call seq's table (its ring slot) */
void* gpu_slot_done_dev(struct gpu_comm* g, uint32_t seq); /* the word its stream writes when done */
/* The jobs of this rank's kernel for call c (none: it launches nothing); also what resolve checks. */
void gpu_fill_args(struct gpu_comm* g, const struct gpu_call* c, struct dev_args* a);
/* 1 if t (checked; device buffers) runs on the GPU; then gpu_in describes it and turns t into the
 * host allgather of the descriptions (t->gpu holds the call). */
int gpu_takes(const struct ch_task* t);
/* Sends and receives of device buffers run on comm's GPU (ranks sharing one GPU, not relayed), where a
 * group cannot also hold sends and receives through host memory (an empty one: gpu_takes). Alike on
 * every rank: decided at init. */
int gpu_runs_p2p(const struct ncclComm* comm);
ch_status gpu_in(struct ch_task* t, int needs_send, int needs_recv, const char* fn);
/* The tables of calls captured into CUDA graphs (with the communicator). */
void gpu_graphs_free(struct gpu_comm* g);
/* The star of captured call k's flags, around what rank 0 does for all (gpu/call.c): gather, release. */
void gpu_graph_gather(struct gpu_comm* g, uint32_t k, struct gpu_memops* o);
void gpu_graph_release(struct gpu_comm* g, uint32_t k, struct gpu_memops* o);
/* Free the call of a task that never launched. */
void gpu_drop(struct ch_task* t);
/* A group with such calls: queue the exchange on the bridge and the stream's part. 1: handled. */
int gpu_launch(struct ch_plan** plans, struct ch_task** lists, int n, ch_status* res);
struct gpu_batch {
  int n;
  struct gpu_call* call[];
};
/* gpu/resolve.c: a send or receive that another rank copies leaves its description in the pair's
 * mailbox, a boarded collective on its rank's board (wait: until the entry is free; else only if it
 * is free now). *posted = 1 once it is there. */
ch_status gpu_post(struct gpu_call* c, int wait, int* posted);
/* 1 if c leaves its description in a mailbox (gpu_post). */
int gpu_p2p_mails(const struct gpu_comm* g, const struct gpu_call* c);
/* gpu/copier.c: rank 0's copier of the relayed pairs (started at setup where some pair is). Stopped
 * before the shared page goes: unless aborting, once the other process ranks have left (their calls
 * done) and every copy posted is done, or after 10 s. */
struct gpu_copier;
ch_status gpu_copier_start(struct gpu_comm* g);
void gpu_copier_run(struct gpu_comm* g); /* its thread, once comm->gpu is set */
void gpu_copier_stop(struct gpu_comm* g);
int gpu_copier_busy(struct gpu_comm* g); /* copies queued on the GPU and not done */
void gpu_copier_unblock(struct gpu_comm* g); /* gpu_unblock's part: the relayed pairs' words (any thread) */
void gpu_copier_free(struct gpu_comm* g); /* with the comm, once not busy */
/* gpu/relay.c: every collective of a relaying communicator (gpu_takes: sends and receives are staged).
 * relay_setup: the consuming stream and events (after the shared page, which holds the rings);
 * relay_describe: a buffer's usability in its description; relay_table: the addresses the bridge fills
 * in once every rank's call is checked; relay_queue: a call's pieces on its stream and the consuming
 * one (its kernels wait for that table); relay_unblock: every relay word far ahead (gpu_unblock's
 * part); relay_free: with the comm. */
ch_status gpu_relay_setup(struct gpu_comm* g);
ch_status gpu_relay_queue(struct gpu_comm* g, const struct gpu_call* c);
ch_status gpu_relay_queue_graph(struct gpu_comm* g, const struct gpu_call* c); /* a captured call's */
void gpu_relay_describe(struct gpu_comm* g, const void* p, size_t esize, struct gpu_buf_desc* d); /* at enqueue */
void gpu_relay_table(struct gpu_comm* g, const struct gpu_call* c, struct dev_table* tab);         /* the bridge's */
void gpu_relay_unblock(struct gpu_comm* g);
void gpu_relay_free(struct gpu_comm* g);
/* gpu/resolve.c: the bridge's hook after the exchange ran (status st); frees the batch. */
void gpu_after(void* batch, ch_status st);

#endif
