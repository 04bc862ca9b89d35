/* ncclPutSignal, ncclSignal and ncclWaitSignal on the windows and signal blocks of api/window.c (see
 * there for what is guaranteed). A put or signal never waits for its target. A wait polls this rank's
 * own counters, and while it waits checks for an abort, a target process that exited, and the
 * communicator's timeout, so that it ends with a named cause instead of hanging. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../misc/log.h"
#include "../misc/utils.h"
#include "../algo/algo.h"
#include "../comm/comm.h"
#include "../core/host_stream.h"
#include "../core/init.h"
#include "../fault/mismatch.h"
#include "../reduce/reduce.h"
#include "api.h"
#include "../observe/observe.h"
#include "rma.h"

/* Checks shared by the three calls, inside the caller's comm_enter: the comm's signals exist and the
 * stream is NULL or a host stream (drained first: stream order). */
static ch_status rma_enter(struct ncclComm* comm, cudaStream_t stream, const char* fn) {
  ch_status s = comm_ensure_ready(comm);
  if (s != CH_OK) return s;
  if (atomic_load(&comm->revoked)) {
    WARN("%s: communicator %p was revoked; shrink, split or destroy it", fn, (void*)comm);
    return CH_INVALID_USAGE;
  }
  if (!comm->rma) {
    WARN("%s: no window is registered on communicator %p yet (ncclCommWindowRegister makes the signals too)", fn,
         (void*)comm);
    return CH_INVALID_USAGE;
  }
  const struct rma_state* r = comm->rma;
  if (!r->nctx || !r->nsig) {
    WARN("%s: one-sided calls are off on communicator %p (its config's numRmaCtx %d, numRmaSig %d)", fn, (void*)comm,
         r->nctx, r->nsig);
    return CH_INVALID_USAGE;
  }
  if (stream && !stream_is_ours(stream)) {
    WARN("%s: CUDA streams are not supported for one-sided calls yet; pass NULL or a chorusStreamCreate stream", fn);
    return CH_INVALID_USAGE;
  }
  if (stream) stream_wait_idle(stream); /* what was issued on it before runs first */
  return CH_OK;
}

/* (peer, sig, ctx) names a signal of comm. */
static ch_status rma_range(const struct ncclComm* comm, int peer, int sig, int ctx, const char* fn) {
  const struct rma_state* r = comm->rma;
  if (peer >= 0 && peer < comm->nranks && sig >= 0 && sig < r->nsig && ctx >= 0 && ctx < r->nctx) return CH_OK;
  WARN("%s: peer %d, signal %d, context %d out of range (%d ranks, numRmaSig %d, numRmaCtx %d)", fn, peer, sig, ctx,
       comm->nranks, r->nsig, r->nctx);
  return CH_INVALID_ARG;
}

/* End a one-sided call's record, and put it on the timeline (CHORUS_TRACE) when no plan of comm is queued
 * or running: the trace's buffer belongs to the thread running comm's plans (observe/trace.c), which,
 * with nothing queued and this thread in the call, is this one. A call beside queued stream work is
 * in the flight recorder only. */
static void rma_end(struct ncclComm* comm, uint64_t fr, ch_status s) {
  fr_end(comm, fr, fr, s);
  if (fr && comm->trace && !atomic_load(&comm->unticketed) &&
      atomic_load(&comm->done_ticket) == atomic_load(&comm->next_ticket))
    trace_calls(comm, fr, fr);
}

static void signal_peer(struct ncclComm* comm, int peer, int sig, int ctx, size_t bytes) {
  struct rma_state* r = comm->rma;
  atomic_fetch_add_explicit(&r->peer[peer][sig_at(r, comm->nranks, ctx, sig, comm->rank)], 1, memory_order_release);
  if (comm->rma_ctr) { /* chorusCommGetPeerCounters */
    atomic_fetch_add_explicit(&comm->rma_ctr[peer], bytes, memory_order_relaxed);
    atomic_fetch_add_explicit(&comm->rma_ctr[comm->nranks + peer], 1, memory_order_relaxed);
  }
}

CH_API(ncclResult_t, ncclPutSignal, const void* localbuff, size_t count, ncclDataType_t datatype, int peer,
       ncclWindow_t peerWin, size_t peerWinOffset, int sigIdx, int ctx, unsigned int flags, ncclComm_t comm,
       cudaStream_t stream) {
  const char* fn = "ncclPutSignal";
  ch_status s = comm_check(comm, fn);
  if (s != CH_OK) return ch_to_nccl(s);
  size_t es = red_type_size((int)datatype);
  if (!es || flags || (count && !localbuff) || count > SIZE_MAX / es) {
    WARN("%s: %s (datatype %d, flags 0x%x, %zu elements at %p)", fn,
         !es          ? "invalid datatype"
         : flags      ? "flags must be 0"
         : !localbuff ? "localbuff is NULL"
                      : "count too large",
         (int)datatype, flags, count, localbuff);
    return ncclInvalidArgument;
  }
  struct comm_guard g;
  if ((s = comm_enter(comm, &g)) != CH_OK) return ch_to_nccl(s);
  uint64_t fr = 0; /* recorded once the comm is ready (comm_ensure_ready: a non-blocking init may run) */
  struct ncclWindow_vidmem* w = NULL;
  size_t bytes = count * es;
  if ((s = rma_enter(comm, stream, fn)) == CH_OK) fr = fr_rma(comm, FR_FUNC_PUTSIGNAL, peer, count, (int)datatype);
  if (s == CH_OK && (s = rma_range(comm, peer, sigIdx, ctx, fn)) == CH_OK && !(w = rma_win_of(comm, peerWin, fn)))
    s = CH_INVALID_ARG;
  if (s == CH_OK && !rma_put_ok(peerWinOffset, bytes, w->d[peer].size)) {
    WARN("%s: %zu bytes at offset %zu go past the end of rank %d's window (%llu bytes)", fn, bytes, peerWinOffset, peer,
         (unsigned long long)w->d[peer].size);
    s = CH_INVALID_ARG;
  }
  if (s == CH_OK && bytes) {
    if (w->at[peer]) {
      memmove(w->at[peer] + peerWinOffset, localbuff, bytes); /* in its own window, it may overlap */
    } else {
      int e = direct_cma_copy(comm->cma->pid[peer], (void*)localbuff, w->d[peer].addr + peerWinOffset, bytes, 1);
      if (e) {
        WARN("%s: cannot write rank %d's window (process_vm_writev): %s", fn, peer, strerror(e));
        s = CH_SYSTEM;
      }
    }
  }
  if (s == CH_OK) signal_peer(comm, peer, sigIdx, ctx, bytes);
  rma_end(comm, fr, s);
  comm_leave(&g);
  return ch_to_nccl(s);
}

CH_API(ncclResult_t, ncclSignal, int peer, int sigIdx, int ctx, unsigned int flags, ncclComm_t comm,
       cudaStream_t stream) {
  const char* fn = "ncclSignal";
  ch_status s = comm_check(comm, fn);
  if (s != CH_OK) return ch_to_nccl(s);
  if (flags) {
    WARN("%s: flags must be 0, got 0x%x", fn, flags);
    return ncclInvalidArgument;
  }
  struct comm_guard g;
  if ((s = comm_enter(comm, &g)) != CH_OK) return ch_to_nccl(s);
  uint64_t fr = 0;
  if ((s = rma_enter(comm, stream, fn)) == CH_OK) fr = fr_rma(comm, FR_FUNC_SIGNAL, peer, 0, -1);
  if (s == CH_OK && (s = rma_range(comm, peer, sigIdx, ctx, fn)) == CH_OK) signal_peer(comm, peer, sigIdx, ctx, 0);
  rma_end(comm, fr, s);
  comm_leave(&g);
  return ch_to_nccl(s);
}

/* Why a wait cannot go on, checked every few milliseconds: an abort, a target that exited, the timeout. */
static ch_status wait_check(struct ncclComm* comm, const ncclWaitSignalDesc_t* d, uint64_t have, uint64_t want,
                            uint64_t since) {
  if (__atomic_load_n(&comm->abort_flag, __ATOMIC_ACQUIRE)) return CH_ABORTED;
  int p = d->peer;
  uint64_t ns = comm->peers[comm->rank].pid_ns;
  if (p != comm->rank && ns && comm->peers[p].pid_ns == ns && !ut_pid_alive(comm->peers[p].pid)) {
    WARN("ncclWaitSignal: rank %d (pid %d on %s) has exited while rank %d waited for its signal %d (context %d): %llu "
         "of %llu seen",
         p, comm->peers[p].pid, comm->peers[p].hostname, comm->rank, d->sigIdx, d->ctx, (unsigned long long)have,
         (unsigned long long)want);
    mm_peer_lost(comm, p);
    return CH_REMOTE;
  }
  uint64_t limit = atomic_load(&comm->timeout_ns);
  if (limit && ut_now_ns() - since > limit) {
    WARN("ncclWaitSignal: rank %d waited %.0f s for signal %d (context %d) from rank %d: %llu of %llu seen", comm->rank,
         (double)(ut_now_ns() - since) / 1e9, d->sigIdx, d->ctx, p, (unsigned long long)have, (unsigned long long)want);
    return CH_TIMEOUT;
  }
  return CH_OK;
}

/* What a wait that has taken 10 ms is waiting for, for the stall report (fault/stall_job.c). */
static void publish_wait(struct ncclComm* comm, const ncclWaitSignalDesc_t* d, uint64_t have, uint64_t want,
                         uint64_t since) {
  atomic_store_explicit(&comm->rma_wait_sig, d->sigIdx, memory_order_relaxed);
  atomic_store_explicit(&comm->rma_wait_ctx, d->ctx, memory_order_relaxed);
  atomic_store_explicit(&comm->rma_wait_peer, d->peer, memory_order_relaxed);
  atomic_store_explicit(&comm->rma_wait_have, have, memory_order_relaxed);
  atomic_store_explicit(&comm->rma_wait_want, want, memory_order_relaxed);
  atomic_store_explicit(&comm->rma_wait_since, since, memory_order_relaxed);
  atomic_store_explicit(&comm->rma_wait, 1, memory_order_release);
}

CH_API(ncclResult_t, ncclWaitSignal, int nDesc, ncclWaitSignalDesc_t* signalDescs, ncclComm_t comm,
       cudaStream_t stream) {
  const char* fn = "ncclWaitSignal";
  ch_status s = comm_check(comm, fn);
  if (s != CH_OK) return ch_to_nccl(s);
  if (nDesc <= 0 || !signalDescs) {
    WARN("%s: %d descriptors at %p: nothing to wait for", fn, nDesc, (void*)signalDescs);
    return ncclInvalidArgument;
  }
  struct comm_guard g;
  if ((s = comm_enter(comm, &g)) != CH_OK) return ch_to_nccl(s);
  /* Recorded as one call: the peer of a lone descriptor (else -1), the signals it waits for in all. */
  uint64_t total = 0;
  for (int i = 0; i < nDesc; i++) total += signalDescs[i].opCnt > 0 ? (uint64_t)signalDescs[i].opCnt : 0;
  uint64_t fr = 0;
  uint64_t* want = calloc((size_t)nDesc, sizeof(uint64_t));
  size_t* at = calloc((size_t)nDesc, sizeof(size_t));
  if (!want || !at) s = CH_SYSTEM;
  if (s == CH_OK && (s = rma_enter(comm, stream, fn)) == CH_OK)
    fr = fr_rma(comm, FR_FUNC_WAITSIGNAL, nDesc == 1 ? signalDescs[0].peer : -1, total, -1);
  for (int i = 0; s == CH_OK && i < nDesc; i++) {
    const ncclWaitSignalDesc_t* d = &signalDescs[i];
    if ((s = rma_range(comm, d->peer, d->sigIdx, d->ctx, fn)) != CH_OK) break;
    if (d->opCnt <= 0) {
      WARN("%s: descriptor %d waits for %d signals; opCnt must be positive", fn, i, d->opCnt);
      s = CH_INVALID_ARG;
      break;
    }
    at[i] = sig_at(comm->rma, comm->nranks, d->ctx, d->sigIdx, d->peer);
    want[i] = comm->rma->seen[at[i]] + (uint64_t)d->opCnt;
    for (int j = 0; j < i; j++) /* two descriptors of one signal wait for both counts */
      if (at[j] == at[i]) want[i] += (uint64_t)signalDescs[j].opCnt;
  }
  uint64_t since = s == CH_OK ? ut_now_ns() : 0, last = since;
  for (uint64_t it = 0; s == CH_OK; it++) {
    int left = -1;
    for (int i = 0; i < nDesc && left < 0; i++)
      if (atomic_load_explicit(&comm->rma->mine[at[i]], memory_order_acquire) < want[i]) left = i;
    if (left < 0) break;
    if (__atomic_load_n(&comm->abort_flag, __ATOMIC_ACQUIRE)) s = CH_ABORTED;
    /* The slower checks (a syscall each) every 10 ms, the first 10 ms in: a short wait makes none. */
    if (s == CH_OK && (it & 63) == 63 && ut_now_ns() - last >= 10 * UT_NS_PER_MS) {
      last = ut_now_ns();
      const ncclWaitSignalDesc_t* d = &signalDescs[left];
      uint64_t have = atomic_load(&comm->rma->mine[at[left]]) - comm->rma->seen[at[left]];
      publish_wait(comm, d, have, want[left] - comm->rma->seen[at[left]], since);
      s = wait_check(comm, d, have, want[left] - comm->rma->seen[at[left]], since);
    }
    if (s == CH_OK) ut_backoff(it);
  }
  atomic_store_explicit(&comm->rma_wait, 0, memory_order_release);
  for (int i = 0; s == CH_OK && i < nDesc; i++)
    if (want[i] > comm->rma->seen[at[i]]) comm->rma->seen[at[i]] = want[i];
  rma_end(comm, fr, s);
  free(want), free(at);
  comm_leave(&g);
  return ch_to_nccl(s);
}
