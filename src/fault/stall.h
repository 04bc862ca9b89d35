/* Stall reports shared by fault/stall.c (this rank's pending operations) and fault/stall_job.c (every rank's
 * progress record, gathered over the stall query service, and the job-wide summary). */
#ifndef CH_STALL_H
#define CH_STALL_H

#include <stddef.h>
#include <stdint.h>

#include "../comm/work.h"

/* Stall report (fault/stall.c): one WARN per pending operation of pl: what it waits for, and from whom. */
void stall_report(const struct ch_plan* pl, double idle_s, int on_request);
/* CHORUS_DUMP_SIGNAL: install the handler once per process; requests counted so far. */
void stall_install_signal(void);
unsigned stall_dump_requests(void);
/* plan_exec, on every idle pass: publishes what its started plans wait for, once they have been idle
 * for 10 ms, then every 100 ms (fault/stall_job.c), for other ranks' stall reports. */
void stall_note(struct ch_plan* const* plans, int n, uint64_t idle_ns, uint64_t now);

struct ch_op;
struct ch_plan;

static inline int stall_is_coll(int func) { return func != FUNC_SEND && func != FUNC_RECV; }

/* What an operation is blocked on (stall_waits_for; *peer set for DATA and ROOM). */
enum { STALL_WAIT_TURN = 0, STALL_WAIT_DATA = 1, STALL_WAIT_ROOM = 2, STALL_WAIT_CLIQUE = 3, STALL_WAIT_COUNT = 4 };
int stall_waits_for(const struct ch_op* op, int* peer);

/* A rank's state as one process tells another (query kind STALL_Q_RECORD). Processes of one job run
 * the same build (the root checks versions), so it travels as is; every field is validated on
 * receipt (stall_wire_ok). */
#define STALL_WIRE_MAGIC 0x53544c31u /* "STL1" */
enum { STALL_ST_IDLE = 1,     /* not in a call: every call so far returned */
       STALL_ST_WAIT = 2,     /* blocked in a call: func, seq, bytes, peer describe it */
       STALL_ST_BUSY = 3,     /* in a call that still makes progress */
       STALL_ST_GAVE_UP = 4,  /* its call timed out (described as for WAIT) and returned */
       STALL_ST_NOANSWER = 5, /* local only: the rank's process did not answer (note says why) */
       STALL_ST_CONNECT = 6,  /* in a call, making its connections: func, seq (collectives), peer (send/recv)
                               * name the call; bytes_total is the number of peers */
       STALL_ST_SIGNAL = 7    /* in ncclWaitSignal: for signal sig (context ctx) from peer, bytes_done of
                               * bytes_total counted, for idle_ms */ };
struct stall_wire {
  uint32_t magic;
  int32_t state, func, type, peer, wait, algo, proto, pid, rank, nranks, async;
  int32_t gone, pad; /* gone: the communicator was destroyed since; this was its last state */
  int32_t sig, ctx;  /* STALL_ST_SIGNAL */
  uint64_t comm_hash, seq, last_done, bytes_total, bytes_done, idle_ms;
  char host[64];
  char note[160]; /* local only */
};
/* Query kinds served by fault/stall_job.c. RECORD: {hash, rank, nranks} -> struct stall_wire (or nothing);
 * SUMMARY: {} or {hash} -> the text report of each matching communicator (chorus-info --stall). */
/* DUMP: {} or {hash} -> every rank of each matching communicator writes its flight recorder (this
 * process's directly, the others' asked through their services); the reply says how many did. */
/* METRICS: {} or {hash} -> this process's communicators' counters in Prometheus' text format. */
enum { STALL_Q_RECORD = 1, STALL_Q_SUMMARY = 2, STALL_Q_DUMP = 3, STALL_Q_METRICS = 4 };
int stall_wire_ok(struct stall_wire* w, uint64_t hash, int rank, int nranks);

/* Registry of this process's communicators (init.c: after init succeeds / before comm_free). */
void stall_register(struct ncclComm* comm);
void stall_unregister(struct ncclComm* comm);
/* Publish what pl is blocked on (the thread running it only); gave_up: its call is ending on a timeout. */
void stall_note_plan(const struct ch_plan* pl, uint64_t idle_ns, int gave_up);
/* Every rank's state for comm `hash` (a comm of this process; key NULL: any), formatted: a headline
 * ("AllReduce #5 (1 KiB): ranks 0-1 waiting, rank 2 last completed #4") then one line per rank.
 * `why` prefixes the headline; asking other processes stops after 2 s or once *abort is set. Returns
 * the length written (text NUL-terminated, truncated to cap). */
size_t stall_job_text(uint64_t hash, const struct boot_key* key, const char* why, const volatile int* abort, int dump,
                      char* out, size_t cap);
/* The same for a comm of this process, gathered once and formatted whole (chorusCommStallReport):
 * the text (the caller frees it) and its length in *len; NULL if out of memory. */
char* stall_job_text_all(uint64_t hash, const char* why, const volatile int* abort, size_t* len);
/* The same from explicit states (tests). */
size_t stall_format(const struct stall_wire* w, int n, uint64_t hash, const char* why, char* out, size_t cap);
/* Gather and WARN it, details first, headline last (so ncclGetLastError shows the headline). dump: every
 * rank asked also writes its flight recorder (a rank busy elsewhere too: its process's query thread
 * answers), for that reason. */
enum stall_dump { STALL_DUMP_NONE = 0, STALL_DUMP_TIMEOUT = 1, STALL_DUMP_SIGNAL = 2, STALL_DUMP_REQUEST = 3, STALL_DUMP_COUNT };
extern const char* const stall_dump_names[STALL_DUMP_COUNT];
void stall_job_report(const struct ncclComm* comm, const char* why, int dump);
/* Every communicator of this process writes its flight recorder (the CHORUS_DUMP_SIGNAL thread). */
void stall_dump_all(int why);
/* A call on comm failed with st (core/engine.c): its flight recorder is written, the first time. */
void stall_dump_failure(struct ncclComm* comm, ch_status st);

#endif
