/* Plans (core/plan.c) and the engine that runs them (core/engine.c). */
#ifndef CH_CORE_PLAN_H
#define CH_CORE_PLAN_H

#include "../comm/work.h"

/* Plans (plan.c). */
ch_status plan_build(struct ncclComm* comm, struct ch_task* tasks, struct ch_plan** out);
/* One wave of a group too wide for the pool (core/group.c): only the sends and receives whose pair
 * falls in wave `wave` of `width` ring distances (plan_wave_of), and the collectives in wave 0. The
 * plan still names every call of the group (flight recorder, counters). */
ch_status plan_build_wave(struct ncclComm* comm, struct ch_task* tasks, int wave, int width, struct ch_plan** out);
/* The wave of the pair (rank, peer): by their ring distance min(d, n - d), the same number at both
 * ends, so that a message and its match always run in the same wave. Self: wave 0. */
int plan_wave_of(int rank, int peer, int nranks, int width);
void plan_free(struct ch_plan* plan);
/* The plan of the previous call on comm, re-armed for task t, if it was the same collective with the
 * same count, type and root; NULL otherwise (then build one). */
struct ch_plan* plan_reuse(struct ncclComm* comm, const struct ch_task* t);
/* A plan captured into a CUDA graph runs at every replay as it was built: a copy of it before it
 * first runs (malloc'd, NULL: out of memory; the caller frees it), written back before each run by
 * whoever owns the plan then. */
void* plan_snapshot(const struct ch_plan* pl);
void plan_restore(struct ch_plan* pl, const void* snapshot);
/* Done with a plan: keep it on its comm for a repeat if it ran to completion, else free it. NULL is
 * a no-op. Not for a plan whose completion was published (plan_exec releases those itself). */
void plan_release(struct ch_plan* plan);
/* Draw the plans' tickets (their places in their communicators' order), in array order. Any thread. */
static inline void plan_tickets(struct ch_plan** plans, int n) {
  for (int i = 0; i < n; i++) plans[i]->ticket = atomic_fetch_add(&plans[i]->comm->next_ticket, 1);
}
/* The engine (engine.c). Run plans to completion (plans of several communicators progress together). Takes ownership:
 * each plan is released before its completion is published, and plans[i] is set to NULL. */
ch_status plan_exec(struct ch_plan** plans, int n);
/* Elements per FIFO step of op's connections, at most chunk bytes' worth when chunk > 0 (a tuner
 * plugin's choice; plan.c; the engine sets it again when a Direct op falls back). */
void op_set_chunk(const struct ncclComm* comm, struct ch_op* op, int coll, size_t esize, size_t chunk);

#endif
