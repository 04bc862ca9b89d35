/* ncclCommSuspend, ncclCommResume and ncclCommMemStats (NCCL 2.29+): core/suspend.c says what a
 * suspend releases. As NCCL's, suspend is collective (every rank calls it) and waits for the calls in
 * flight; a second suspend and a resume of an active comm are refused. Unlike NCCL's, a call on a
 * suspended comm resumes it (what it needs is made again as on a first call) and ncclCommResume is
 * local: nothing has to be made again at once. docs/COMPATIBILITY.md. */
#include <stdint.h>

#include "../misc/log.h"
#include "../comm/comm.h"
#include "../core/init.h"
#include "../core/suspend.h"
#include "api.h"

/* Enter comm for fn (a call that uses it), initialized. */
static ch_status enter(ncclComm_t comm, const char* fn, struct comm_guard* g) {
  ch_status s = comm_check(comm, fn);
  if (s != CH_OK || (s = comm_enter(comm, g)) != CH_OK) return s;
  if ((s = comm_ensure_ready(comm)) != CH_OK) comm_leave(g);
  return s;
}

CH_API(ncclResult_t, ncclCommSuspend, ncclComm_t comm, int flags) {
  static const char fn[] = "ncclCommSuspend";
  struct comm_guard g;
  ch_status s = enter(comm, fn, &g);
  if (s != CH_OK) return ch_to_nccl(s);
  if (flags & ~NCCL_SUSPEND_MEM) {
    WARN("%s: flags 0x%x has bits other than NCCL_SUSPEND_MEM (0x%x)", fn, (unsigned)flags, NCCL_SUSPEND_MEM);
    s = CH_INVALID_ARG;
  } else if (!flags) { /* nothing asked for: as NCCL, nothing done, and the comm is not suspended */
  } else if (atomic_load(&comm->suspended)) {
    WARN("%s: communicator %p (rank %d) is already suspended; call ncclCommResume first", fn, (void*)comm, comm->rank);
    s = CH_INVALID_USAGE;
  } else if (atomic_load(&comm->revoked)) {
    WARN("%s: communicator %p (rank %d) is revoked: only split, shrink and destroy remain", fn, (void*)comm, comm->rank);
    s = CH_INVALID_USAGE;
  } else {
    struct suspend_report r;
    s = comm_suspend(comm, &r);
    if (s == CH_OK)
      INFO(LOG_INIT, "%s: rank %d released %d per-peer connection(s), %s, %zu bytes of reproducible-reduction scratch",
           fn, comm->rank, r.peers, r.rings ? "the rings' and RecDbl/Rabenseifner/Tree FIFOs" : "no ring FIFOs (network, or none made)",
           r.repro);
  }
  comm_leave(&g);
  return ch_to_nccl(s);
}

CH_API(ncclResult_t, ncclCommResume, ncclComm_t comm) {
  static const char fn[] = "ncclCommResume";
  struct comm_guard g;
  ch_status s = enter(comm, fn, &g);
  if (s != CH_OK) return ch_to_nccl(s);
  if (!comm_resume(comm, fn)) {
    WARN("%s: communicator %p (rank %d) is not suspended (a call made on it since ncclCommSuspend resumed it)", fn,
         (void*)comm, comm->rank);
    s = CH_INVALID_USAGE;
  }
  comm_leave(&g);
  return ch_to_nccl(s);
}

/* NCCL counts the GPU memory of a communicator. Chorus's FIFOs and scratch are host memory (reported by
 * chorusCommGetMemory, with what a suspend releases), and it allocates no device memory that a suspend
 * could release: the byte figures are 0, the flag is the truth. */
CH_API(ncclResult_t, ncclCommMemStats, ncclComm_t comm, ncclCommMemStat_t stat, uint64_t* value) {
  static const char fn[] = "ncclCommMemStats";
  ch_status s = comm_check(comm, fn);
  if (s != CH_OK) return ch_to_nccl(s);
  if (!value) {
    WARN("%s: value is NULL", fn);
    return ncclInvalidArgument;
  }
  if ((int)stat < ncclStatGpuMemSuspend || (int)stat > ncclStatGpuMemTotal) {
    WARN("%s: unknown stat %d (0..%d)", fn, (int)stat, ncclStatGpuMemTotal);
    return ncclInvalidArgument;
  }
  struct comm_guard g;
  if (!comm_try_enter(comm, &g)) {
    WARN("%s: communicator %p is being aborted, revoked or destroyed by another thread", fn, (void*)comm);
    return ncclInvalidUsage;
  }
  *value = stat == ncclStatGpuMemSuspended ? (uint64_t)(atomic_load(&comm->suspended) != 0) : 0;
  comm_leave(&g);
  return ncclSuccess;
}
