/* ncclCommGetUniqueId and ncclCommGrow (NCCL 2.29): a communicator grows by new ranks joining its
 * ranks in a new communicator of nRanks.
 *
 * One existing rank (the coordinator) asks for an id: a fresh bootstrap root hosted by its process
 * with a random key, whatever NCCL_COMM_ID says. It hands the id to the new ranks out of band. Then
 * every existing rank calls ncclCommGrow with the parent (the coordinator with the id, the others with
 * NULL) and keeps its rank; they exchange the id and nRanks over the parent's bootstrap, so a missing
 * or second coordinator, or ranks that disagree on nRanks, are named on every existing rank before
 * anyone joins. Every member then joins the new root as in ncclCommInitRank: a new rank that never
 * comes is CHORUS_INIT_TIMEOUT's failure, a rank number taken twice and a foreign or stale id are the
 * root's (bootstrap/root.c, auth.c), and the new communicator may be aborted from another thread while
 * it forms, as any init. The child is a new communicator in every respect (connections, clique, pools
 * are made again as first used); the parent stays usable until destroyed.
 *
 * One id at a time per communicator, used once: a second ncclCommGetUniqueId before the grow, or a
 * grow given an id this rank did not hand out or already used, is refused by name. */
#include <string.h>

#include "../misc/log.h"
#include "../misc/utils.h"
#include "../bootstrap/bootstrap.h"
#include "../comm/comm.h"
#include "../core/host_stream.h"
#include "../core/init.h"
#include "api.h"

struct grow_msg {
  int32_t has_id, nranks;
  ncclUniqueId id;
};

static uint64_t id_digest(const ncclUniqueId* id) { return ut_hash(id->internal, sizeof(id->internal), 0x67726f77); }

static int id_used(const struct ncclComm* comm, const ncclUniqueId* id) {
  uint64_t d = id_digest(id);
  for (size_t i = 0; i < sizeof(comm->grow_used) / sizeof(comm->grow_used[0]); i++)
    if (comm->grow_used[i] == d) return 1;
  return 0;
}

CH_API(ncclResult_t, ncclCommGetUniqueId, ncclComm_t comm, ncclUniqueId* uniqueId) {
  const char* fn = "ncclCommGetUniqueId";
  ch_status s = comm_check(comm, fn);
  if (s != CH_OK) return ch_to_nccl(s);
  ARG_NONNULL(uniqueId, fn);
  struct comm_guard g;
  if ((s = comm_enter(comm, &g)) != CH_OK) return ch_to_nccl(s);
  if ((s = comm_ensure_ready(comm)) == CH_OK) {
    if (comm->grow_issued) {
      WARN("%s: rank %d already handed out an id that no ncclCommGrow has used yet; grow with it first", fn,
           comm->rank);
      s = CH_INVALID_USAGE;
    } else if ((s = boot_get_random_id(comm->grow_id.internal)) == CH_OK) {
      comm->grow_issued = 1;
      *uniqueId = comm->grow_id;
      INFO(LOG_INIT, "comm %p rank %d: grow id made (its bootstrap root runs in this process)", (void*)comm,
           comm->rank);
    }
  }
  comm_leave(&g);
  return ch_to_nccl(s);
}

/* An existing rank's part before it joins: checks, and the id from the coordinator. */
static ch_status grow_agree(struct ncclComm* comm, int nranks, const ncclUniqueId* given, ncclUniqueId* id) {
  const char* fn = "ncclCommGrow";
  if (atomic_load(&comm->revoked)) {
    WARN("%s: communicator %p was revoked; shrink it or make a new one", fn, (void*)comm);
    return CH_INVALID_USAGE;
  }
  if (given && (!comm->grow_issued || memcmp(given, &comm->grow_id, sizeof(*given)) != 0)) {
    WARN("%s: rank %d was given an id %s", fn, comm->rank,
         id_used(comm, given) ? "that a grow of this communicator already used (each id serves once)"
                              : "that ncclCommGetUniqueId did not hand out on this rank for this communicator");
    return CH_INVALID_USAGE;
  }
  ch_status s = comm_wait_idle(comm);
  int n = comm->nranks;
  struct grow_msg* all = s == CH_OK ? calloc((size_t)n, sizeof(*all)) : NULL;
  if (s == CH_OK && !all) s = CH_SYSTEM;
  if (s == CH_OK) {
    all[comm->rank].has_id = given != NULL;
    all[comm->rank].nranks = nranks;
    if (given) all[comm->rank].id = *given;
    s = boot_allgather(comm->boot, all, sizeof(*all));
  }
  int coord = -1, second = -1, other = -1;
  for (int r = 0; s == CH_OK && r < n; r++) {
    if (all[r].nranks != nranks && other < 0) other = r;
    if (all[r].has_id && coord < 0) coord = r;
    else if (all[r].has_id && second < 0) second = r;
  }
  if (s == CH_OK && other >= 0) {
    WARN("%s: ranks disagree on the new size: %d on rank %d, %d on rank %d", fn, nranks, comm->rank, all[other].nranks,
         other);
    s = CH_INVALID_USAGE;
  } else if (s == CH_OK && coord < 0) {
    WARN("%s: no existing rank passed the id (the rank that called ncclCommGetUniqueId must pass it; the others "
         "NULL)",
         fn);
    s = CH_INVALID_USAGE;
  } else if (s == CH_OK && second >= 0) {
    WARN("%s: ranks %d and %d both passed an id; only the rank that called ncclCommGetUniqueId passes it", fn, coord,
         second);
    s = CH_INVALID_USAGE;
  }
  if (s == CH_OK) *id = all[coord].id; /* only carried to our own init: the root checks what it says */
  free(all);
  return s;
}

CH_API(ncclResult_t, ncclCommGrow, ncclComm_t comm, int nRanks, const ncclUniqueId* uniqueId, int rank,
       ncclComm_t* newcomm, ncclConfig_t* config) {
  const char* fn = "ncclCommGrow";
  ARG_NONNULL(newcomm, fn);
  *newcomm = NULL;
  if (!comm) { /* a new rank */
    if (!uniqueId) {
      WARN("%s: a new rank (comm NULL) must pass the id the coordinator got from ncclCommGetUniqueId", fn);
      return ncclInvalidArgument;
    }
    if (nRanks < 1 || rank < 0 || rank >= nRanks) {
      WARN("%s: a new rank must pass its rank in the grown communicator: rank %d of nRanks %d", fn, rank, nRanks);
      return ncclInvalidArgument;
    }
    return api_init_rank(newcomm, nRanks, uniqueId, rank, config, fn);
  }
  ch_status s = comm_check(comm, fn);
  if (s != CH_OK) return ch_to_nccl(s);
  if (rank != -1) {
    WARN("%s: an existing rank keeps its rank and passes rank = -1, not %d", fn, rank);
    return ncclInvalidArgument;
  }
  if (nRanks <= comm->nranks) {
    WARN("%s: nRanks %d must be larger than the communicator's %d ranks", fn, nRanks, comm->nranks);
    return ncclInvalidArgument;
  }
  ncclConfig_t cfg = comm->config; /* NULL: the parent's settings */
  if (config && (s = comm_parse_config(config, &cfg)) != CH_OK) return ch_to_nccl(s);
  struct comm_guard g;
  if ((s = comm_enter(comm, &g)) != CH_OK) return ch_to_nccl(s);
  ncclUniqueId id;
  int me = comm->rank;
  if ((s = comm_ensure_ready(comm)) == CH_OK) s = grow_agree(comm, nRanks, uniqueId, &id);
  if (s == CH_OK && uniqueId) { /* consumed once the members go to the root, whatever comes of it */
    comm->grow_issued = 0;
    memmove(&comm->grow_used[1], &comm->grow_used[0], sizeof(comm->grow_used) - sizeof(comm->grow_used[0]));
    comm->grow_used[0] = id_digest(&id);
  }
  comm_leave(&g);
  if (s != CH_OK) return ch_to_nccl(s);
  INFO(LOG_INIT, "grow: rank %d of %d joins a communicator of %d ranks", me, comm->nranks, nRanks);
  return api_init_rank(newcomm, nRanks, &id, me, &cfg, fn);
}
