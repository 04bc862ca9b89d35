/* chorusCommStallReport: the job-wide stall report (fault/stall_job.c) handed to the program rather
 * than logged. Its use is a monitoring thread asking while another thread is blocked in a call on the
 * same communicator, so it is a query (comm_try_enter: counted in `users`, no ownership), and its
 * gathering polls the abort flag, so a concurrent ncclCommAbort waits for it only briefly. */
#include <stdlib.h>
#include <string.h>

#include "chorus.h"
#include "../misc/log.h"
#include "../fault/stall.h"
#include "../core/init.h"
#include "api.h"

CH_API(ncclResult_t, chorusCommStallReport, ncclComm_t comm, char* text, size_t len, size_t* needed) {
  static const char fn[] = "chorusCommStallReport";
  ch_status s = comm_check(comm, fn);
  if (s != CH_OK) return ch_to_nccl(s);
  if (!text && len > 0) {
    WARN("%s: text is NULL with len %zu (pass a buffer of len bytes, or len 0 to ask for *needed only)", fn, len);
    return ncclInvalidArgument;
  }
  if (!text && !needed) {
    WARN("%s: text and needed are both NULL: there is nowhere to return the report", fn);
    return ncclInvalidArgument;
  }
  struct comm_guard g;
  if (!comm_try_enter(comm, &g)) { /* comm is being freed: only its address may be named */
    WARN("%s: communicator %p is being aborted, revoked or destroyed by another thread; no report", fn, (void*)comm);
    return ncclInvalidUsage;
  }
  ncclResult_t r = ncclSuccess;
  int st = atomic_load(&comm->init_state);
  if (st == ncclInProgress) {
    r = ncclInProgress; /* a nonblocking init still running: no records (and no comm_hash) yet */
  } else if (st != ncclSuccess) {
    r = ch_to_nccl(comm_ensure_ready(comm)); /* WARNs that the init failed */
  } else {
    /* Not comm_ensure_ready: a comm with an asynchronous error (a timeout) is when the report matters. */
    size_t n = 0;
    char* all = stall_job_text_all(comm->comm_hash, NULL, &comm->abort_flag, &n);
    if (!all) {
      WARN("%s: out of memory for the report of rank %d's %d-rank communicator", fn, comm->rank, comm->nranks);
      r = ncclSystemError;
    } else {
      if (len > 0) {
        size_t k = n < len ? n : len - 1;
        memcpy(text, all, k);
        text[k] = '\0';
      }
      if (needed) *needed = n;
      free(all);
    }
  }
  comm_leave(&g); /* last touch of comm */
  return r;
}
