/* ncclCommSuspend and ncclCommResume (core/suspend.c). */
#ifndef CH_CORE_SUSPEND_H
#define CH_CORE_SUSPEND_H

#include "../comm/comm.h"

/* What a suspend let go of, for its log line and tests. */
struct suspend_report {
  int peers;     /* pooled per-peer connections closed */
  int rings;     /* ring and RecDbl/Rabenseifner/Tree FIFOs released (1) or kept (0: network) */
  size_t repro;  /* reproducible-reduction scratch freed (bytes) */
};
/* Collective (every rank calls it, as NCCL's, which meets at a bootstrap barrier): wait for the comm's
 * calls in flight, meet every rank, then release what is made again on demand. The caller is in a
 * call on comm (comm_enter) and the comm is initialized and not suspended. */
ch_status comm_suspend(struct ncclComm* comm, struct suspend_report* out);
/* A call on a suspended comm (or ncclCommResume): nothing to make here (connections and scratch are
 * made again by the calls that need them), only the mark is cleared. Returns whether it was set. */
int comm_resume(struct ncclComm* comm, const char* by);

#endif
