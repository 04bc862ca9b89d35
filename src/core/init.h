/* Communicators: handles and who is inside them, init (core/init.c), the settings every rank must
 * share (core/agree.c), split and shrink (core/split.c). */
#ifndef CH_INIT_H
#define CH_INIT_H

#include "../comm/comm.h"

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

/* Exchange this rank's settings (after tune_init) and compare them with every rank's. On any
 * difference every rank returns CH_INVALID_USAGE, with one WARN per differing setting naming the
 * variable, the values and which ranks have which. */
ch_status comm_agree(struct ncclComm* comm);
/* Every rank's chorusCommSetReproducible level, compared (collective over the bootstrap). */
ch_status comm_agree_repro(struct ncclComm* comm, int level);

/* Run the init job (bootstrap, peers, channels) for comm; used blocking and from threads. */
ch_status comm_init_job(struct ncclComm* comm);
ch_status comm_alloc(struct ncclComm** out, int nranks, int rank, const ncclConfig_t* config);
void comm_free(struct ncclComm* comm);
ch_status comm_split(struct ncclComm* parent, int color, int key, struct ncclComm** out, const ncclConfig_t* cfg);
/* The survivors (all but exclude[], valid and distinct) build a child; excluded ranks are not contacted. */
ch_status comm_shrink(struct ncclComm* parent, const int* exclude, int nexclude, struct ncclComm** out,
                      const ncclConfig_t* cfg);

#endif
