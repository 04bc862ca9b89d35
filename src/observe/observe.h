/* Looking at what a rank did: the flight recorder (recorder.c), counters (counters.c), the timeline
 * (trace.c), and the clock they share, aligned across hosts at init (clock.c). Each has a cost of a
 * few stores per call when on and a pointer test when off; none of them changes what a call does.
 * docs/OBSERVE.md describes the files they write and the tools that read them. */
#ifndef CH_OBSERVE_H
#define CH_OBSERVE_H

#include <stddef.h>
#include <stdint.h>

#include "../misc/utils.h"
#include "../comm/work.h"

/* ---- the clock (clock.c) ---- */

/* At init, ranks on more than one host: each host's first rank measures its clock against rank 0's
 * over the bootstrap (the round trip with the least delay of a few), and every rank takes its host's
 * offset. comm->clock_offset_ns = this host's realtime - rank 0's. One host: 0, nothing sent. */
ch_status obs_clock_align(struct ncclComm* comm);
/* Times of calls are ticks: the CPU's time-stamp counter where it runs at a constant rate on every
 * core (x86 with constant_tsc and nonstop_tsc: ~10 ns to read, a third of clock_gettime), else
 * CLOCK_MONOTONIC ns. obs_ticks_init (once per process, before the first tick) decides which. */
extern int obs_tsc;
void obs_ticks_init(void);
static inline uint64_t obs_ticks(void) {
#if defined(__x86_64__)
  if (obs_tsc) return __builtin_ia32_rdtsc();
#endif
  return ut_now_ns();
}
/* Ticks as rank 0's realtime in ns: the job-wide time base of dumps and traces. */
struct obs_timebase {
  double ns_per_tick;
  uint64_t tick0;
  int64_t job0;   /* job time at tick0 */
  uint64_t mono0; /* CLOCK_MONOTONIC ns at tick0 */
};
void obs_timebase(const struct ncclComm* comm, struct obs_timebase* tb);
static inline uint64_t obs_job_ns(const struct obs_timebase* tb, uint64_t ticks) {
  return ticks ? (uint64_t)(tb->job0 + (int64_t)((double)(int64_t)(ticks - tb->tick0) * tb->ns_per_tick)) : 0;
}
static inline uint64_t obs_mono_job_ns(const struct obs_timebase* tb, uint64_t mono) {
  return (uint64_t)(tb->job0 + (int64_t)(mono - tb->mono0));
}

/* ---- the flight recorder (recorder.c) ---- */

enum fr_state { FR_QUEUED = 0, FR_STARTED = 1, FR_DONE = 2, FR_FAILED = 3, FR_LAUNCHED = 4, FR_NSTATES };
extern const char* const fr_state_names[FR_NSTATES];

/* One call as the recorder keeps it. */
struct fr_entry {
  uint64_t id;    /* 1-based: the n-th call made on this communicator (every kind, sends included) */
  uint64_t seq;   /* collective sequence number (the transfer headers' and stall reports'), 0 for others */
  uint64_t count; /* elements, as the call gave them */
  uint64_t t_enq, t_start, t_end; /* CLOCK_MONOTONIC ns; 0: not yet */
  int32_t func, type, op, root; /* root or peer; -1 where the call has none */
  int16_t algo, proto, nch; /* what tune/choose.c chose (-1 until the plan is built) */
  int16_t exec, hostless;   /* where it ran (core/exec.h); hostless: the GPU path ran it without a host plan */
  int32_t state;                  /* enum fr_state */
  int32_t status;                 /* ch_status of a finished call */
  uint64_t tag;                   /* ncclCollConfig_t.userProfilerTag; 0: untagged */
  uint32_t sel;                   /* its per-call algSelection (tune/select.c bits); 0: automatic */
};

/* Made at init with CHORUS_FLIGHT_RECORDER entries (NULL when 0); freed with the comm. */
struct fr_ring* fr_create(int cap);
void fr_free(struct fr_ring* fr);
int fr_capacity(const struct ncclComm* comm);
/* The calling thread queued task t (api/coll.c via core/group.c): returns its id, 0 when off (or not
 * recorded). runs_now: the calling thread runs it before returning (its queue time is its start). */
uint64_t fr_enqueue(struct ncclComm* comm, const struct ch_task* t, int runs_now);
/* plan_build chose for call id. */
void fr_choice(struct ncclComm* comm, uint64_t id, const struct tune_choice* how);
/* The plan holding calls [lo, hi] started (its ticket came up; seq_base: comm->seq before it) or
 * finished. A call of ranks sharing a GPU (exec kernel) ends as FR_LAUNCHED: its host part is done,
 * its kernel runs in stream order after. */
void fr_start(struct ncclComm* comm, uint64_t lo, uint64_t hi, uint64_t seq_base);
void fr_end(struct ncclComm* comm, uint64_t lo, uint64_t hi, ch_status status);
/* One-sided calls (api/rma_ops.c) have no ncclFunc_t: the recorder names them with numbers past every
 * FUNC_*. They run on the calling thread, so fr_rma records one as started (its id; 0: recorder off or
 * slot busy) and fr_end(comm, id, id, status) ends it. type -1: no data (Signal, WaitSignal). */
enum { FR_FUNC_PUTSIGNAL = 0xf0, FR_FUNC_SIGNAL = 0xf1, FR_FUNC_WAITSIGNAL = 0xf2 };
uint64_t fr_rma(struct ncclComm* comm, int func, int peer, uint64_t count, int type);
/* "AllReduce", ..., "PutSignal", "Signal", "WaitSignal"; NULL for any other number. */
const char* fr_func_name(int func);
/* Calls [lo, hi] of a group that failed (or was dropped) before running them: those still queued fail. */
void fr_fail_queued(struct ncclComm* comm, uint64_t lo, uint64_t hi, ch_status status);
/* A copy of the entries, oldest first (at most cap): returns how many; *recorded: calls so far, *skipped:
 * calls not recorded. The caller frees *out. */
int fr_snapshot(struct ncclComm* comm, struct fr_entry** out, uint64_t* recorded, uint64_t* skipped);

/* ---- counters (counters.c) ---- */

struct obs_ctr {
  uint64_t calls, bytes, wait_ns, errors;
};
struct obs_peer_ctr {
  uint64_t sent, received, wait_ns;
  uint64_t put_bytes, signals; /* one-sided calls to the peer */
};
void obs_counters(const struct ncclComm* comm, struct obs_ctr* out);
/* peer: its bytes over every connection of comm that reaches it; any thread, while comm lives. */
void obs_peer_counters(const struct ncclComm* comm, int peer, struct obs_peer_ctr* out);
/* Prometheus' text format for these communicators (one HELP/TYPE per family); returns the length the
 * whole text needs (written up to cap, NUL-terminated when it fits). */
size_t obs_prometheus(struct ncclComm* const* comms, int n, char* out, size_t cap);

/* Memory per rank (observe/memory.c). A communicator's FIFOs: live per-peer (send/recv, AlltoAll,
 * Gather, Scatter) peers, their cap and high-water mark, receive FIFOs it made and send FIFOs it maps
 * for them, the pool's releases and (re)made connections (core/pool.c), and the receive FIFOs of the
 * rings and of RecDbl/Rabenseifner/Tree. Any thread, beside a call. */
struct obs_mem {
  uint64_t p2p_peers, p2p_peers_max, p2p_cap, p2p_fifo, p2p_recv_bytes, p2p_send_bytes;
  uint64_t p2p_released, p2p_made, ring_bytes;
  uint64_t suspend_bytes, persist_bytes, suspended; /* chorusMemory_t's (core/suspend.c releases) */
  uint64_t net_resident, net_trimmed; /* network peers of the pool (core/pool.c's trim) */
};
void obs_comm_memory(const struct ncclComm* comm, struct obs_mem* out);
/* The process (/proc/self): resident shared memory (RssShmem: FIFOs, ncclMemAlloc), private memory
 * (RssAnon), pinned memory (VmPin + VmLck), open descriptors, threads. */
struct obs_proc_mem {
  uint64_t shmem, priv, pinned, fds, threads;
};
void obs_proc_memory(struct obs_proc_mem* out);

/* The engine waited ns for peer (-1: its turn, or a clique) in a call on comm. */
static inline void obs_waited(struct ncclComm* comm, int peer, uint64_t ns) {
  atomic_fetch_add_explicit(&comm->ctr_wait_ns, ns, memory_order_relaxed);
  if (peer >= 0 && peer < comm->nranks && comm->wait_ns_peer)
    atomic_fetch_add_explicit(&comm->wait_ns_peer[peer], ns, memory_order_relaxed);
}
/* Add to a counter that one thread at a time writes (no locked instruction: the 8 B call is ~300 ns). */
static inline void obs_add(_Atomic uint64_t* c, uint64_t v) {
  atomic_store_explicit(c, atomic_load_explicit(c, memory_order_relaxed) + v, memory_order_relaxed);
}
/* Payload bytes moved on one connection (the engine, after a primitive ran). */
static inline void obs_moved(struct conn* c, uint64_t bytes) {
  obs_add(&c->bytes, bytes); /* one writer: the thread running the plan that uses c */
}

/* One entry by id (a consistent copy); 0 if it is not in the ring. */
int fr_get(struct ncclComm* comm, uint64_t id, struct fr_entry* out);

/* ---- the timeline (trace.c) ---- */

/* At init with CHORUS_TRACE set (NULL otherwise); comm_free calls trace_close, which writes the rest. */
struct obs_trace* trace_open(struct ncclComm* comm);
void trace_close(struct ncclComm* comm);
/* The thread running comm's plans (only when comm->trace): calls [lo, hi] ended (spans from their
 * flight recorder entries), the engine waited on peer (-1: its turn) from t0 to t1, an operation ran
 * (channel for a collective's, peer for a send's or receive's). Times in ticks. */
void trace_calls(struct ncclComm* comm, uint64_t lo, uint64_t hi); /* lo == hi: that call, whatever its kind */
void trace_wait(struct ncclComm* comm, int peer, uint64_t t0, uint64_t t1);
void trace_op(struct ncclComm* comm, int func, int algo, int proto, int channel, int peer, uint64_t bytes, uint64_t t0,
              uint64_t t1);

/* ---- profiler plugins (profiler.c) ---- */

/* NCCL_PROFILER_PLUGIN (NCCL's v6/v5 profiler ABI, profiler_abi.h). prof_wanted: a plugin is loaded
 * for this process (loading it on first use), so init makes the flight recorder, which the events
 * are read from, even with CHORUS_FLIGHT_RECORDER=0. prof_comm_init (end of comm_setup) gives comm
 * its plugin context (comm->prof, NULL without a plugin); prof_comm_fini (comm_free) finalizes it.
 * The plan hooks are called only when comm->prof is set, by the thread running the plan holding
 * calls [lo, hi]: start right after fr_start, end right after fr_end. */
int prof_wanted(void);
void prof_comm_init(struct ncclComm* comm);
void prof_comm_fini(struct ncclComm* comm);
void prof_plan_start(struct ncclComm* comm, uint64_t lo, uint64_t hi);
void prof_plan_end(struct ncclComm* comm, uint64_t lo, uint64_t hi, ch_status st);
/* The libraries NCCL_PROFILER_PLUGIN=value names, in the order tried: 0 ("none"), 1 or 2. */
int prof_candidates(const char* value, char out[2][512]);

/* ---- dumps (dump.c) ---- */

/* CHORUS_DUMP_DIR, or $TMPDIR/chorus-dump-<uid> (made 0700): where dumps and default traces go. */
const char* obs_dump_dir(void);
/* Write comm's flight recorder to <dir>/chorus-fr-<comm hash>-r<rank>.txt (replacing an older dump of
 * this rank); reason says why (timeout, mismatch, peer-lost, abort, signal, request...). Returns the
 * path in path (may be NULL). */
ch_status fr_dump(struct ncclComm* comm, const char* reason, char* path, size_t len);
/* The same, unless comm's recorder was written for a failure before (comm->fr_dumped). */
void fr_dump_first(struct ncclComm* comm, const char* reason);
/* The same in two steps, for a caller that must hold a lock while it reads comm but not while it
 * writes a file: fr_render formats the dump in memory (-1: recorder off, already dumped for a failure,
 * or no memory), fr_write writes it (no lock needed) and frees the text. */
struct fr_text {
  char* buf;
  size_t len;
  char name[64], reason[16];
  int rank, calls;
};
int fr_render(struct ncclComm* comm, const char* reason, struct fr_text* out);
int fr_render_first(struct ncclComm* comm, const char* reason, struct fr_text* out);
ch_status fr_write(struct fr_text* t, char* path, size_t len);
/* A short word for a status in dumps and traces ("ok", "timeout", "remote"...). */
const char* fr_status_word(int status);

#endif
