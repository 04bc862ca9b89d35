/* Where a call runs. The API (api/route.c, after coll.c's checks) records each call's executor in its task once; the
 * group's end (core/group.c) hands the group's plans to the executor of its most demanding call
 * through this table, and the host engine (plan_exec) runs whatever an executor leaves it. Adding an
 * executor is adding a value here and a row in the table (api/executors.c, the one file that sees
 * every layer that provides one). */
#ifndef CH_CORE_EXEC_H
#define CH_CORE_EXEC_H

#include "../comm/work.h"

/* In precedence order: a group runs on the highest executor any of its calls needs (the kernel and
 * staging rows refuse, or fall back for, groups that mix them with host buffers). */
enum ch_exec {
  EXEC_HOST = 0,        /* the calling thread runs the plans before returning (core/engine.c) */
  EXEC_HOST_STREAM = 1, /* a Chorus host stream's thread runs them (core/host_stream.c) */
  EXEC_STAGE = 2,       /* device buffers through host memory, in CUDA stream order (staging/staging.c) */
  EXEC_KERNEL = 3,      /* device buffers of ranks sharing one GPU, run by a kernel (gpu/call.c) */
  EXEC_COUNT
};

struct ch_executor {
  const char* name;
  /* Take a group's connected plans (lists[i]: the tasks of plans[i], tickets drawn): 1 when it ran or
   * queued them (*res: the status; plans[] taken and NULLed), 0 to leave them to the host engine.
   * NULL: the host engine runs them. */
  int (*launch)(struct ch_plan** plans, struct ch_task** lists, int n, ch_status* res);
  /* A task of this executor leaves its group: it ran (ok) or was dropped (!ok). NULL: nothing to do. */
  ch_status (*finish)(struct ch_task* t, int ok);
  /* 1: launch draws the plans' tickets itself (in CUDA stream order, for calls captured into graphs);
   * the group draws them only for plans it leaves to the host engine. */
  int own_tickets;
};
extern const struct ch_executor* const ch_executors[EXEC_COUNT];

static inline ch_status exec_finish(struct ch_task* t, int ok) {
  const struct ch_executor* x = ch_executors[t->exec];
  return x->finish ? x->finish(t, ok) : CH_OK;
}

/* What the layers above core add to a communicator's life (the GPU path's setup and teardown), so
 * that core calls them without knowing them. Each may be NULL. Defined in api/executors.c. */
struct ch_comm_hooks {
  /* At init: what this rank says of itself, carried in comm_agree's allgather. */
  void (*hello)(struct ncclComm* comm, struct gpu_hello* out);
  /* At init, after comm_agree, with every rank's hello: alike on every rank. */
  ch_status (*setup)(struct ncclComm* comm, const struct gpu_hello* all);
  /* The communicator's async error was just set (any thread): let waiters on other paths go. */
  void (*failed)(struct ncclComm* comm);
  /* comm_free begins (no call is inside the comm). */
  void (*teardown)(struct ncclComm* comm);
  /* ncclCommAbort, before it waits for the comm's tickets: nothing may draw one from now on. */
  void (*abort)(struct ncclComm* comm);
  /* A revoke or shrink stops the calls in flight (the abort flag raised, no thread in a call): calls
   * whose tickets are not drawn yet are dropped. */
  void (*quiesce)(struct ncclComm* comm);
  /* The last reference is dropped (comm_unref): every ticket is done. */
  void (*release)(struct ncclComm* comm);
};
extern const struct ch_comm_hooks ch_comm_hooks;

/* Host streams' row (core/host_stream.c): every call of the group names one Chorus host stream. */
int stream_launch(struct ch_plan** plans, struct ch_task** lists, int n, ch_status* res);

#endif
