/* NCCL API: versions, errors, unique ids and communicator lifecycle. */
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../observe/observe.h"
#include "chorus.h"
#include "../misc/log.h"
#include "../misc/param.h"
#include "../misc/utils.h"
#include "../cuda/cudrv.h"
#include "../comm/work.h"
#include "../core/exec.h"
#include "../core/group.h"
#include "../core/host_stream.h"
#include "../core/init.h"
#include "api.h"
#include "nvtx.h"

CH_API(ncclResult_t, ncclGetVersion, int* version) {
  ARG_NONNULL(version, "ncclGetVersion");
  *version = NCCL_VERSION_CODE;
  return ncclSuccess;
}

CH_API(ncclResult_t, chorusGetVersion, int* version) {
  ARG_NONNULL(version, "chorusGetVersion");
  *version = CHORUS_VERSION_CODE;
  return ncclSuccess;
}

CH_API(const char*, ncclGetErrorString, ncclResult_t code) {
  /* ch_status equals ncclResult_t; its texts drop "run with NCCL_DEBUG=..." where that is set already */
  return (int)code >= 0 && (int)code < ncclNumResults ? ch_status_str((ch_status)code) : "unknown result code";
}

/* Per communicator, as PyTorch reports it per process group: the last WARN of a call on comm (or of
 * its init); with NULL, the process's last WARN. */
CH_API(const char*, ncclGetLastError, ncclComm_t comm) {
  if (!comm) return log_last_error();
  if (comm->magic != CH_COMM_MAGIC) return "ncclGetLastError: not a valid communicator (destroyed?)";
  return log_sink_text(&comm->last_error);
}

__attribute__((visibility("default"))) void pncclResetDebugInit(void) __attribute__((alias("ncclResetDebugInit")));
__attribute__((visibility("default"))) void ncclResetDebugInit(void) { param_reset(); log_init(); }

CH_API(ncclResult_t, ncclGetUniqueId, ncclUniqueId* uniqueId) {
  ARG_NONNULL(uniqueId, "ncclGetUniqueId");
  memset(uniqueId, 0, sizeof(*uniqueId));
  return ch_to_nccl(boot_get_unique_id(uniqueId->internal));
}

static ncclResult_t init_rank_ids(ncclComm_t* newcomm, int nranks, const ncclUniqueId* id, int nids, int rank,
                                  const ncclConfig_t* user_cfg, const char* fn) {
  ARG_NONNULL(newcomm, fn);
  *newcomm = NULL;
  if (nranks < 1) {
    WARN("%s: invalid nranks %d (must be >= 1)", fn, nranks);
    return ncclInvalidArgument;
  }
  if (rank < 0 || rank >= nranks) {
    WARN("%s: invalid rank %d (nranks is %d)", fn, rank, nranks);
    return ncclInvalidArgument;
  }
  ncclConfig_t cfg;
  ch_status s = comm_parse_config(user_cfg, &cfg);
  if (s != CH_OK) return ch_to_nccl(s);
  comm_config_report(&cfg, rank);
  struct ncclComm* comm;
  s = comm_alloc(&comm, nranks, rank, &cfg);
  if (s != CH_OK) return ch_to_nccl(s);
  comm->init_id = *id;
  if (nids > 1) { /* copied: the caller's array need not outlive a nonblocking init */
    comm->init_ids = malloc((size_t)nids * sizeof(*id));
    if (!comm->init_ids) {
      WARN("%s: out of memory for %d unique ids", fn, nids);
      comm_free(comm);
      return ncclSystemError;
    }
    memcpy(comm->init_ids, id, (size_t)nids * sizeof(*id));
    comm->init_nids = nids;
  }
  atomic_store(&comm->init_caller, 1);
  /* Published before init runs, as in NCCL, so another thread may abort a blocked init; atomically,
   * because that thread reads it concurrently. */
  __atomic_store_n(newcomm, comm, __ATOMIC_RELEASE);
  if (group_depth() > 0) {
    s = group_defer_init(comm); /* WARNs when refused */
    if (s != CH_OK) { /* never to run: the caller gets no handle to a comm stuck in progress */
      __atomic_store_n(newcomm, NULL, __ATOMIC_RELEASE);
      atomic_store(&comm->init_state, (int)ch_to_nccl(s));
      if (!__atomic_load_n(&comm->abort_flag, __ATOMIC_ACQUIRE)) {
        comm_free(comm);
        return ch_to_nccl(s);
      }
    }
    atomic_store(&comm->init_caller, 0);
    return ch_to_nccl(s);
  }
  group_start();
  group_defer_init(comm);
  s = group_end();
  if (s != CH_OK && s != CH_IN_PROGRESS) {
    __atomic_store_n(newcomm, NULL, __ATOMIC_RELEASE);
    /* If another thread aborted this comm meanwhile, that thread frees it once we let go. */
    if (!__atomic_load_n(&comm->abort_flag, __ATOMIC_ACQUIRE)) {
      comm_free(comm);
      return ch_to_nccl(s);
    }
  }
  atomic_store(&comm->init_caller, 0); /* last touch */
  return ch_to_nccl(s);
}

static ncclResult_t init_rank(ncclComm_t* newcomm, int nranks, const ncclUniqueId* id, int rank,
                              const ncclConfig_t* user_cfg, const char* fn) {
  return init_rank_ids(newcomm, nranks, id, 1, rank, user_cfg, fn);
}
ncclResult_t api_init_rank(ncclComm_t* newcomm, int nranks, const ncclUniqueId* id, int rank,
                           const ncclConfig_t* user_cfg, const char* fn) {
  return init_rank(newcomm, nranks, id, rank, user_cfg, fn);
}

CH_API(ncclResult_t, ncclCommInitRankConfig, ncclComm_t* comm, int nranks, ncclUniqueId commId, int rank,
       ncclConfig_t* config) {
  NVTX_RANGE(NVTX_COMM_INIT_RANK_CONFIG);
  return init_rank(comm, nranks, &commId, rank, config, "ncclCommInitRankConfig");
}

CH_API(ncclResult_t, ncclCommInitRank, ncclComm_t* comm, int nranks, ncclUniqueId commId, int rank) {
  NVTX_RANGE(NVTX_COMM_INIT_RANK);
  return init_rank(comm, nranks, &commId, rank, NULL, "ncclCommInitRank");
}

CH_API(ncclResult_t, ncclCommInitAll, ncclComm_t* comms, int ndev, const int* devlist) {
  NVTX_RANGE(NVTX_COMM_INIT_ALL);
  ARG_NONNULL(comms, "ncclCommInitAll");
  if (ndev < 1) {
    WARN("ncclCommInitAll: invalid ndev %d", ndev);
    return ncclInvalidArgument;
  }
  /* Host ranks have no devices. A CUDA program's comms live on the devices listed (the primary
   * context of each), as NCCL's do, whatever context the calling thread has. */
  ncclUniqueId id;
  ncclResult_t r = ncclGetUniqueId(&id);
  if (r != ncclSuccess) return r;
  group_start();
  int made = 0; /* comms[0..made) are ours: the rest of the caller's array is left alone */
  for (int i = 0; i < ndev; i++) {
    r = init_rank(&comms[i], ndev, &id, i, NULL, "ncclCommInitAll");
    if (r != ncclSuccess) break;
    made = i + 1;
    if (devlist && comms[i]->cuda_ctx) comms[i]->cuda_ctx = cudev_device_ctx(devlist[i]);
  }
  ch_status s = group_end();
  if (r == ncclSuccess) r = ch_to_nccl(s);
  if (r != ncclSuccess && r != ncclInProgress) { /* InProgress: nonblocking comms, still initialising */
    /* Abort, not free: a nonblocking comm's init thread may be running (abort joins it). */
    for (int i = 0; i < made; i++) {
      if (comms[i]) ncclCommAbort(comms[i]);
      comms[i] = NULL;
    }
  }
  return r;
}

CH_API(ncclResult_t, ncclCommInitRankScalable, ncclComm_t* newcomm, int nranks, int myrank, int nId,
       ncclUniqueId* commIds, ncclConfig_t* config) {
  NVTX_RANGE(NVTX_COMM_INIT_RANK_SCALABLE);
  ARG_NONNULL(commIds, "ncclCommInitRankScalable");
  if (nId < 1 || nId > nranks) { /* NCCL refuses nId > nranks as well (ncclCommInitRankDev) */
    WARN("ncclCommInitRankScalable: nId must be between 1 and nranks (%d), got %d", nranks, nId);
    return ncclInvalidArgument;
  }
  /* Root i of the nId serves the i-th block of ranks (boot_init_ids). */
  return init_rank_ids(newcomm, nranks, commIds, nId, myrank, config, "ncclCommInitRankScalable");
}

CH_API(ncclResult_t, ncclCommSplit, ncclComm_t comm, int color, int key, ncclComm_t* newcomm, ncclConfig_t* config) {
  NVTX_RANGE(NVTX_COMM_SPLIT);
  ARG_NONNULL(newcomm, "ncclCommSplit");
  *newcomm = NULL;
  struct comm_guard g;
  ch_status s = comm_check(comm, "ncclCommSplit");
  if (s != CH_OK) return ch_to_nccl(s);
  if ((s = comm_enter(comm, &g)) != CH_OK) return ch_to_nccl(s);
  s = comm_ensure_ready(comm);
  if (s == CH_OK && color < 0 && color != NCCL_SPLIT_NOCOLOR) {
    WARN("ncclCommSplit: color %d is invalid (must be >= 0 or NCCL_SPLIT_NOCOLOR)", color);
    s = CH_INVALID_ARG;
  }
  ncclConfig_t cfg = comm->config;
  if (s == CH_OK && config && (s = comm_parse_config(config, &cfg)) == CH_OK) comm_config_report(&cfg, comm->rank);
  if (s == CH_OK) s = comm_wait_idle(comm);
  if (s == CH_OK) s = comm_split(comm, color, key, newcomm, &cfg);
  comm_leave(&g);
  return ch_to_nccl(s);
}

CH_API(ncclResult_t, ncclCommFinalize, ncclComm_t comm) {
  NVTX_RANGE(NVTX_COMM_FINALIZE);
  struct comm_guard g;
  ch_status s = comm_check(comm, "ncclCommFinalize");
  if (s != CH_OK) return ch_to_nccl(s);
  if ((s = comm_enter(comm, &g)) != CH_OK) return ch_to_nccl(s);
  s = comm_ensure_ready(comm);
  if (s == CH_OK) s = comm_wait_idle(comm);
  comm_leave(&g);
  return ch_to_nccl(s);
}

/* A comm inherited through fork: its threads and sockets are the parent's, so tearing it down would
 * wait for threads that do not exist here (it hung) or close what the parent still uses. Let go. */
static int let_go_inherited(ncclComm_t comm, const char* fn) {
  if (!comm_inherited(comm)) return 0;
  INFO(LOG_INIT, "%s: communicator %p belongs to process %d (this one, %d, is its fork): left to it, not torn down",
       fn, (void*)comm, comm->pid, (int)getpid());
  return 1;
}

CH_API(ncclResult_t, ncclCommDestroy, ncclComm_t comm) {
  NVTX_RANGE(NVTX_COMM_DESTROY);
  if (comm == NULL) return ncclSuccess; /* as NCCL: destroying NULL is a no-op */
  if (let_go_inherited(comm, "ncclCommDestroy")) return ncclSuccess;
  ch_status s = comm_check(comm, "ncclCommDestroy");
  if (s != CH_OK) return ch_to_nccl(s);
  while (atomic_load(&comm->init_state) == ncclInProgress) ut_backoff(1000000);
  comm_join_init(comm);
  comm_wait_idle(comm);
  /* Nothing is queued any more: from here on a thread that enters comm (a group that queued calls
   * on it before, a query) sees `dead` and leaves, as with an abort's flag (the same Dekker pair);
   * one inside (a watchdog in ncclCommGetAsyncError) is let out before freeing. */
  atomic_store(&comm->dead, 1); /* not abort_flag: gpu_free still waits for the streams, as NCCL's */
  for (uint64_t i = 0; atomic_load(&comm->users) > 0 || atomic_load(&comm->owner); i++) ut_backoff(i);
  comm_free(comm);
  return ncclSuccess;
}

CH_API(ncclResult_t, ncclCommAbort, ncclComm_t comm) {
  NVTX_RANGE(NVTX_COMM_ABORT);
  if (comm == NULL) return ncclSuccess;
  if (let_go_inherited(comm, "ncclCommAbort")) return ncclSuccess;
  ch_status s = comm_check(comm, "ncclCommAbort");
  if (s != CH_OK) return ch_to_nccl(s);
  if (atomic_exchange(&comm->aborting, 1)) {
    WARN("ncclCommAbort: communicator %p is already being aborted by another thread", (void*)comm);
    return ncclInvalidUsage;
  }
  /* The flight recorder is written when the abort stops calls in flight or follows a failure (an abort
   * of an idle, healthy comm, as at a job's end, says nothing worth a file). */
  int busy = atomic_load(&comm->next_ticket) != atomic_load(&comm->done_ticket) ||
             atomic_load(&comm->async_result) != ncclSuccess;
  /* A revoke or shrink may hold the flag already: it is counted in users, and leaves it raised. */
  __atomic_store_n(&comm->abort_flag, 1, __ATOMIC_SEQ_CST);
  /* Every wait in the library polls the flag at least every ~100 ms, so these waits are bounded:
   * first every thread inside a call on comm leaves (comm_enter's Dekker pair), then the init
   * thread, the init caller and queued plans finish. */
  for (uint64_t i = 0; atomic_load(&comm->users) > 0 || atomic_load(&comm->owner); i++) ut_backoff(i);
  /* An init deferred to a group's end that has not begun (that group may be another thread's, which
   * may be waiting for us) never will: nothing to wait for. */
  int not_begun = 0;
  if (atomic_compare_exchange_strong(&comm->init_gate, &not_begun, 2))
    atomic_store(&comm->init_state, ncclInvalidUsage);
  comm_join_init(comm);
  while (atomic_load(&comm->init_state) == ncclInProgress) ut_backoff(1000000);
  while (atomic_load(&comm->init_caller)) ut_backoff(1000000);
  if (ch_comm_hooks.abort) ch_comm_hooks.abort(comm); /* no ticket is drawn in stream order from here */
  comm_wait_idle_aborting(comm); /* its calls queued behind another comm's (perhaps stuck) need not wait */
  if (busy && atomic_load(&comm->init_state) == ncclSuccess) fr_dump_first(comm, "abort");
  comm_free(comm);
  return ncclSuccess;
}

/* Stop every call on comm without freeing it: raise the abort flag, wait until no other thread is
 * inside a call and nothing is queued, then lower the flag (unless an abort came meanwhile). Calls
 * that were blocked return ncclInvalidUsage. The caller is counted in users from here until
 * quiesce_end (an abort waits for it, as for any call): CH_OK only. */
static ch_status comm_quiesce(struct ncclComm* comm, const char* fn) {
  atomic_fetch_add(&comm->users, 1); /* Dekker pair with ncclCommAbort's flag, as comm_try_enter */
  if (atomic_load(&comm->aborting)) {
    atomic_fetch_sub(&comm->users, 1);
    WARN("%s: communicator %p is being aborted by another thread", fn, (void*)comm);
    return CH_INVALID_USAGE;
  }
  if (__atomic_exchange_n(&comm->abort_flag, 1, __ATOMIC_SEQ_CST)) {
    atomic_fetch_sub(&comm->users, 1);
    WARN("%s: communicator %p is being revoked or shrunk by another thread", fn, (void*)comm);
    return CH_INVALID_USAGE;
  }
  for (uint64_t i = 0; atomic_load(&comm->users) > 1 || atomic_load(&comm->owner); i++) ut_backoff(i);
  if (ch_comm_hooks.quiesce) ch_comm_hooks.quiesce(comm); /* calls a stream is still to reach end here */
  comm_wait_idle(comm);
  __atomic_store_n(&comm->abort_flag, 0, __ATOMIC_SEQ_CST);
  if (atomic_load(&comm->aborting)) __atomic_store_n(&comm->abort_flag, 1, __ATOMIC_SEQ_CST); /* its flag stays */
  return CH_OK;
}
static void quiesce_end(struct ncclComm* comm) { atomic_fetch_sub(&comm->users, 1); }

/* NCCL 2.28 semantics: outstanding calls end, later collectives fail with ncclInvalidUsage; the comm
 * can still be split, shrunk and destroyed. Safe from any thread, like ncclCommAbort. */
CH_API(ncclResult_t, ncclCommRevoke, ncclComm_t comm, int revokeFlags) {
  NVTX_RANGE(NVTX_COMM_REVOKE);
  ch_status s = comm_check(comm, "ncclCommRevoke");
  if (s != CH_OK) return ch_to_nccl(s);
  if (revokeFlags != NCCL_REVOKE_DEFAULT) {
    WARN("ncclCommRevoke: unknown revokeFlags 0x%x (only NCCL_REVOKE_DEFAULT)", (unsigned)revokeFlags);
    return ncclInvalidArgument;
  }
  atomic_store(&comm->revoked, 1); /* first: a call entering from now on is refused */
  s = comm_quiesce(comm, "ncclCommRevoke");
  if (s == CH_OK) {
    INFO(LOG_INIT, "rank %d: communicator %p revoked", comm->rank, (void*)comm);
    quiesce_end(comm); /* last touch */
  }
  return ch_to_nccl(s);
}

CH_API(ncclResult_t, ncclCommShrink, ncclComm_t comm, int* excludeRanksList, int excludeRanksCount,
       ncclComm_t* newcomm, ncclConfig_t* config, int shrinkFlags) {
  NVTX_RANGE(NVTX_COMM_SHRINK);
  ARG_NONNULL(newcomm, "ncclCommShrink");
  *newcomm = NULL;
  ch_status s = comm_check(comm, "ncclCommShrink");
  if (s != CH_OK) return ch_to_nccl(s);
  if (shrinkFlags != NCCL_SHRINK_DEFAULT && shrinkFlags != NCCL_SHRINK_ABORT) {
    WARN("ncclCommShrink: unknown shrinkFlags 0x%x (NCCL_SHRINK_DEFAULT or NCCL_SHRINK_ABORT)", (unsigned)shrinkFlags);
    return ncclInvalidArgument;
  }
  if (excludeRanksCount < 0 || excludeRanksCount >= comm->nranks || (excludeRanksCount > 0 && !excludeRanksList)) {
    WARN("ncclCommShrink: excludeRanksCount %d is invalid for %d ranks (list %p)", excludeRanksCount, comm->nranks,
         (void*)excludeRanksList);
    return ncclInvalidArgument;
  }
  for (int i = 0; i < excludeRanksCount; i++) {
    int r = excludeRanksList[i];
    if (r < 0 || r >= comm->nranks) {
      WARN("ncclCommShrink: excluded rank %d is out of range (nranks %d)", r, comm->nranks);
      return ncclInvalidArgument;
    }
    if (r == comm->rank) {
      WARN("ncclCommShrink: rank %d is in its own exclude list; excluded ranks must not call ncclCommShrink", r);
      return ncclInvalidUsage;
    }
    for (int k = 0; k < i; k++)
      if (excludeRanksList[k] == r) {
        WARN("ncclCommShrink: rank %d is excluded twice", r);
        return ncclInvalidArgument;
      }
  }
  ncclConfig_t cfg = comm->config;
  if (config && (s = comm_parse_config(config, &cfg)) != CH_OK) return ch_to_nccl(s);
  if (config) comm_config_report(&cfg, comm->rank);
  /* NCCL_SHRINK_ABORT: calls still blocked on the dead ranks end first (this thread is not in one). */
  int quiesced = shrinkFlags == NCCL_SHRINK_ABORT;
  if (quiesced && (s = comm_quiesce(comm, "ncclCommShrink")) != CH_OK) return ch_to_nccl(s);
  struct comm_guard g;
  s = comm_enter(comm, &g);
  if (quiesced) quiesce_end(comm); /* entered (or refused): an abort may go on */
  if (s != CH_OK) return ch_to_nccl(s);
  /* Not comm_ensure_ready: a comm with an asynchronous error (a dead peer) is what shrink is for. */
  int st = atomic_load(&comm->init_state);
  if (st != ncclSuccess) {
    WARN("ncclCommShrink: the communicator's initialisation %s", st == ncclInProgress ? "is still running" : "failed");
    s = CH_INVALID_USAGE;
  }
  if (s == CH_OK) s = comm_wait_idle(comm);
  if (s == CH_OK) s = comm_shrink(comm, excludeRanksList, excludeRanksCount, newcomm, &cfg);
  comm_leave(&g);
  return ch_to_nccl(s);
}

CH_API(ncclResult_t, chorusCommSetTimeout, ncclComm_t comm, double seconds) {
  ch_status s = comm_check(comm, "chorusCommSetTimeout");
  if (s != CH_OK) return ch_to_nccl(s);
  if (!(seconds >= 0 && seconds <= 1e9)) { /* also rejects NaN */
    WARN("chorusCommSetTimeout: %g seconds is not a valid timeout (0 = none, up to 1e9)", seconds);
    return ncclInvalidArgument;
  }
  atomic_store(&comm->timeout_ns, (uint64_t)(seconds * UT_NS_PER_S));
  return ncclSuccess;
}

CH_API(ncclResult_t, chorusCommSetReproducible, ncclComm_t comm, int level) {
  struct comm_guard g;
  ch_status s = comm_check(comm, "chorusCommSetReproducible");
  if (s == CH_OK && (s = comm_enter(comm, &g)) == CH_OK) {
    if (level < CH_REPRO_OFF || level > CH_REPRO_EXACT) {
      WARN("chorusCommSetReproducible: level %d is not one of chorusReproOff (0), chorusReproOrder (1), "
           "chorusReproExact (2)", level);
      s = CH_INVALID_ARG;
    } else if ((s = comm_ensure_ready(comm)) != CH_OK) {
    } else if (level && atomic_load(&comm->wire)) {
      WARN("chorusCommSetReproducible: communicator %p (rank %d) has a compressed wire format (CHORUS_WIRE_FORMAT or "
           "chorusCommSetWireFormat); turn it off first", (void*)comm, comm->rank);
      s = CH_INVALID_USAGE;
    } else if (comm->rings_connected || atomic_load(&comm->seq) != 0) {
      /* the calls so far connected and chose without it: ranks would disagree on what runs */
      WARN("chorusCommSetReproducible: communicator %p (rank %d) has already run a collective; set the level "
           "before its first call", (void*)comm, comm->rank);
      s = CH_INVALID_USAGE;
    } else if ((s = comm_agree_repro(comm, level)) == CH_OK) { /* every rank calls it: compared first */
      comm->repro = level;
      INFO(LOG_INIT, "comm %p rank %d: reproducible reductions %s", (void*)comm, comm->rank,
           level == CH_REPRO_EXACT ? "exact" : level ? "order" : "off");
    }
    comm_leave(&g);
  }
  return ch_to_nccl(s);
}

CH_API(ncclResult_t, chorusCommGetReproducible, ncclComm_t comm, int* level) {
  ch_status s = comm_check(comm, "chorusCommGetReproducible");
  if (s != CH_OK) return ch_to_nccl(s);
  ARG_NONNULL(level, "chorusCommGetReproducible");
  *level = comm->repro;
  return ncclSuccess;
}

/* Safe from any thread at any time (PyTorch's watchdog polls it while the main thread issues calls):
 * atomic loads only, never a join or a wait; counted in `users` so a concurrent abort waits for it. */
CH_API(ncclResult_t, ncclCommGetAsyncError, ncclComm_t comm, ncclResult_t* asyncError) {
  ch_status s = comm_check(comm, "ncclCommGetAsyncError");
  if (s != CH_OK) return ch_to_nccl(s);
  ARG_NONNULL(asyncError, "ncclCommGetAsyncError");
  struct comm_guard g;
  if (!comm_try_enter(comm, &g)) return ncclInvalidUsage; /* aborted: it is being freed */
  int st = atomic_load(&comm->init_state);
  if (st == ncclInProgress) *asyncError = ncclInProgress;
  else *asyncError = st != ncclSuccess ? (ncclResult_t)st : (ncclResult_t)atomic_load(&comm->async_result);
  comm_leave(&g);
  return ncclSuccess;
}

/* Any thread, any time (an atomic load), also while another thread is blocked in a call on comm. */
CH_API(ncclResult_t, chorusCommGetLostRank, ncclComm_t comm, int* rank) {
  ch_status s = comm_check(comm, "chorusCommGetLostRank");
  if (s != CH_OK) return ch_to_nccl(s);
  ARG_NONNULL(rank, "chorusCommGetLostRank");
  *rank = atomic_load(&comm->lost_rank);
  return ncclSuccess;
}

static ncclResult_t comm_query(const ncclComm_t comm, int* out, int what, const char* fn) {
  ch_status s = comm_check(comm, fn);
  if (s != CH_OK) return ch_to_nccl(s);
  ARG_NONNULL(out, fn);
  struct comm_guard g;
  if (!comm_try_enter((struct ncclComm*)comm, &g)) return ncclInvalidUsage; /* being aborted */
  s = comm_ensure_ready((struct ncclComm*)comm);
  if (s == CH_OK) *out = what == 0 ? comm->nranks : what == 1 ? comm->rank : comm->local_rank;
  comm_leave(&g);
  return ch_to_nccl(s);
}

CH_API(ncclResult_t, ncclCommCount, const ncclComm_t comm, int* count) {
  NVTX_RANGE(NVTX_COMM_COUNT);
  return comm_query(comm, count, 0, "ncclCommCount");
}
CH_API(ncclResult_t, ncclCommUserRank, const ncclComm_t comm, int* rank) {
  NVTX_RANGE(NVTX_COMM_USER_RANK);
  return comm_query(comm, rank, 1, "ncclCommUserRank");
}
/* On host memory there is no CUDA device: we report the rank's index among the ranks of its host,
 * which is what NCCL programs use the device number for (picking per-rank resources). */
CH_API(ncclResult_t, ncclCommCuDevice, const ncclComm_t comm, int* device) {
  NVTX_RANGE(NVTX_COMM_CU_DEVICE);
  return comm_query(comm, device, 2, "ncclCommCuDevice");
}
