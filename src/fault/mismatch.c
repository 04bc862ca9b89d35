/* Calls that do not match across ranks. Every step carries its call's header (struct xfer_hdr) and a
 * digest of it that receivers compare as they take the step (proto/prims.c), so a rank that receives
 * data of a different call finds out before it uses any of it. It then fails the call with
 * ncclInvalidUsage, names both calls, and poisons every connection of the communicator: a rank that
 * waits on a poisoned connection fails too and poisons its own, so the failure floods the rings and
 * pairs and no rank waits for ever. Calls whose ranks exchange no data at all (each rank names itself
 * the root of a Broadcast) leave steps that the next call on the communicator finds.
 *
 * Runs on the thread that runs the plan (plan_exec): comm->poisoned is the only shared field touched
 * here (atomic exchange, so one WARN per rank); the FIFO records have one writer each (fifo.c). */
#include <stdio.h>
#include <string.h>

#include "../misc/log.h"
#include "../comm/work.h"
#include "mismatch.h"

/* Remember the first rank known to be gone (chorusCommGetLostRank). */
static void note_lost(struct ncclComm* comm, int d) {
  int none = -1;
  if (d >= 0 && d < comm->nranks) atomic_compare_exchange_strong(&comm->lost_rank, &none, d);
}

/* Another rank found a peer dead: name it as the rank that found it did (pid and host from init). */
static void say_lost(struct ncclComm* comm, const struct xfer_poison* r) {
  int d = r->other;
  note_lost(comm, d);
  if (d >= 0 && d < comm->nranks)
    WARN("rank %d: rank %d (pid %d on %s) is gone (found by rank %d): the communicator failed; shrink it "
         "(ncclCommShrink) or abort it", comm->rank, d, comm->peers[d].pid, comm->peers[d].hostname, r->finder);
  else
    WARN("rank %d: rank %d found a peer gone: the communicator failed; shrink it (ncclCommShrink) or abort it",
         comm->rank, r->finder);
}

static void say(struct ncclComm* comm, const struct xfer_poison* r) {
  if (r->kind == XFER_PEER_LOST) return say_lost(comm, r);
  char mine[160], theirs[160], other[24] = "a peer", finder[48] = "";
  algo_call_text(mine, sizeof(mine), &r->mine);
  algo_call_text(theirs, sizeof(theirs), &r->theirs);
  if (r->other >= 0) snprintf(other, sizeof(other), "rank %d", r->other);
  if (r->finder != comm->rank) {
    if (r->finder >= 0) snprintf(finder, sizeof(finder), " (found by rank %d)", r->finder);
    else snprintf(finder, sizeof(finder), " (reported over the network)");
  }
  if (r->finder < 0 || r->mine.comm_hash == 0) {
    WARN("rank %d: the call failed on another rank because the ranks' calls do not match (see that rank's "
         "log); this communicator cannot be used any more", comm->rank);
    return;
  }
  const char* later = r->mine.seq != r->theirs.seq && r->theirs.func <= FUNC_ALLREDUCE && r->mine.func <= FUNC_ALLREDUCE
                          ? "; the calls differ at that sequence number or earlier (an earlier call may have "
                            "exchanged no data and returned)"
                          : "";
  char counts[160];
  const struct xfer_hdr *snd = &r->theirs, *rcv = &r->mine; /* found by the receiving end (mm_found) */
  if (snd->func == FUNC_ALLTOALLV && rcv->func == FUNC_ALLTOALLV && snd->root == rcv->root && snd->op == rcv->op &&
      snd->count != rcv->count) { /* the pair's counts, as the application names them */
    snprintf(counts, sizeof(counts), "; rank %d's sendcounts[%u] (%llu) must equal rank %u's recvcounts[%d] (%llu)",
             snd->root, snd->op, (unsigned long long)snd->count, rcv->op, rcv->root, (unsigned long long)rcv->count);
    later = counts;
  }
  WARN(ALGO_MISMATCH_FMT, other, theirs, r->finder >= 0 ? r->finder : comm->rank, mine, finder, later);
}

/* Tell every connection of the communicator (each direction the way the other end reads it), and the
 * local ranks through the clique. */
static void poison_all(struct ncclComm* comm, const struct xfer_poison* rec) {
  if (comm->clique) direct_slot_poison(&comm->clique->slot[comm->rank], rec);
  for (int c = 0; c < comm->nchannels; c++) {
    tp_conn_poison(&comm->channels[c].send, 1, rec);
    tp_conn_poison(&comm->channels[c].recv, 0, rec);
  }
  for (int k = 0; comm->p2p && k < 2 * comm->nranks; k++) { /* both per-peer sets */
    tp_conn_poison(&comm->p2p[k].send, 1, rec);
    tp_conn_poison(&comm->p2p[k].recv, 0, rec);
  }
}

void mm_publish(struct ncclComm* comm, const struct xfer_hdr* h) {
  if (!comm->clique) return;
  struct direct_slot* sl = &comm->clique->slot[comm->rank];
  uint64_t w[sizeof(sl->call) / 8] = {0}, v = atomic_load_explicit(&sl->call_ver, memory_order_relaxed);
  memcpy(w, h, sizeof(*h));
  atomic_store_explicit(&sl->call_ver, v + 1, memory_order_relaxed);
  atomic_thread_fence(memory_order_release);
  for (size_t i = 0; i < sizeof(w) / 8; i++) atomic_store_explicit(&sl->call[i], w[i], memory_order_relaxed);
  atomic_store_explicit(&sl->call_ver, v + 2, memory_order_release);
}

/* Rank r's published call, or 0 if it is being rewritten. */
static int peer_call(const struct ncclComm* comm, int r, struct xfer_hdr* out) {
  struct direct_slot* sl = &comm->clique->slot[r];
  uint64_t w[sizeof(sl->call) / 8], v = atomic_load_explicit(&sl->call_ver, memory_order_acquire);
  if (v & 1 || !v) return 0;
  for (size_t i = 0; i < sizeof(w) / 8; i++) w[i] = atomic_load_explicit(&sl->call[i], memory_order_relaxed);
  atomic_thread_fence(memory_order_acquire);
  if (atomic_load_explicit(&sl->call_ver, memory_order_relaxed) != v) return 0;
  memcpy(out, w, sizeof(*out));
  return 1;
}

/* A local rank that runs a different call under the same sequence number, or that failed a call
 * (2: this rank did, in Direct, and logged it). */
static int clique_mismatch(const struct ncclComm* comm, const struct ch_plan* pl, struct xfer_poison* rec) {
  if (!comm->clique) return 0;
  for (int r = comm->rank, k = 0; k < comm->nranks; k++, r = (r + 1) % comm->nranks) { /* mine first */
    struct direct_slot* sl = &comm->clique->slot[r];
    if (!atomic_load_explicit(&sl->poisoned, memory_order_acquire)) continue;
    uint64_t w[sizeof(sl->poison) / 8];
    for (size_t i = 0; i < sizeof(w) / 8; i++) w[i] = atomic_load_explicit(&sl->poison[i], memory_order_relaxed);
    memcpy(rec, w, sizeof(*rec));
    return r == comm->rank ? 2 : 1;
  }
  const struct xfer_hdr* mine = NULL;
  for (int l = 0; l < pl->nlanes; l++) { /* Direct past its own shape check (step 1) needs none */
    const struct ch_lane* ln = &pl->lanes[l];
    if (ln->cur < ln->nops && ln->ops[ln->cur]->algo == ALGO_DIRECT && ln->ops[ln->cur]->idx >= 2) return 0;
  }
  for (int k = 0; k < pl->nops && !mine; k++)
    if (pl->ops[k].func <= FUNC_ALLREDUCE) mine = &pl->ops[k].ctx.hdr;
  if (!mine) return 0;
  for (int r = 0; r < comm->nranks; r++) {
    struct xfer_hdr h;
    if (r == comm->rank || !peer_call(comm, r, &h) || h.seq != mine->seq) continue;
    if (xfer_tag(&h) == xfer_tag(mine)) continue;
    *rec = (struct xfer_poison){.finder = comm->rank, .other = r, .mine = *mine, .theirs = h};
    return 1;
  }
  return 0;
}

/* A step waiting unread on any incoming connection, sent by a different call under our sequence
 * number. Calls of different algorithms can use different connections (RecDbl's per-peer ones
 * against a ring collective), so the connection a rank waits on may never carry the other call. A
 * step of a later call is no mismatch (the peer is ahead); an earlier one is left to the receive that
 * will read it. The rank thread owns each conn's step; tail is read with acquire after hdr[] was
 * stored before it. */
static int conn_mismatch(const struct ncclComm* comm, const struct xfer_hdr* mine, struct xfer_poison* rec) {
  int nch = comm->nchannels;
  for (int k = 0; k < nch + 2 * comm->nranks; k++) { /* the rings', then both per-peer sets */
    const struct conn* c = k < nch                               ? &comm->channels[k].recv
                           : comm->p2p && k - nch != comm->rank ? &comm->p2p[k - nch].recv
                                                                 : NULL;
    if (!c || !c->connected || !c->ctrl || atomic_load_explicit(&c->ctrl->tail, memory_order_acquire) <= c->step)
      continue;
    struct xfer_hdr h = c->ctrl->hdr[c->step % CH_STEPS];
    if (h.comm_hash != mine->comm_hash || h.seq != mine->seq || xfer_tag(&h) == xfer_tag(mine)) continue;
    *rec = (struct xfer_poison){.finder = comm->rank, .other = c->peer, .mine = *mine, .theirs = h};
    return 1;
  }
  return 0;
}

void mm_peer_lost(struct ncclComm* comm, int lost) {
  struct xfer_poison rec = {.finder = comm->rank, .other = lost, .kind = XFER_PEER_LOST};
  note_lost(comm, lost);
  if (!atomic_exchange(&comm->poisoned, 1)) poison_all(comm, &rec);
}

ch_status mm_found(struct ncclComm* comm, const struct ch_op* op) {
  struct xfer_poison rec = {.finder = comm->rank, .other = op->ctx.in->peer, .mine = op->ctx.hdr};
  prim_their_hdr(&op->ctx, &rec.theirs);
  if (!atomic_exchange(&comm->poisoned, 1)) {
    say(comm, &rec);
    poison_all(comm, &rec);
  }
  return CH_INVALID_USAGE;
}

/* Slow path of a waiting plan: a poisoned connection, or a blocked receive whose peer posted a step
 * of another call (which the fast path cannot see when the protocols differ). */
ch_status mm_poll(struct ncclComm* comm, struct ch_plan* pl) {
  for (int l = 0; l < pl->nlanes; l++) {
    struct ch_lane* ln = &pl->lanes[l];
    if (ln->cur < ln->nops && ln->ops[ln->cur]->algo != ALGO_DIRECT && prim_check(&ln->ops[ln->cur]->ctx))
      return mm_found(comm, ln->ops[ln->cur]);
  }
  struct xfer_poison rec;
  int hit = clique_mismatch(comm, pl, &rec);
  if (hit == 2) { /* this rank failed the call itself and logged why */
    if (rec.kind == XFER_PEER_LOST) note_lost(comm, rec.other);
    atomic_store(&comm->poisoned, 1);
    return rec.kind == XFER_PEER_LOST ? CH_REMOTE : CH_INVALID_USAGE;
  }
  for (int k = 0; k < pl->nops && !hit; k++)
    if (pl->ops[k].func <= FUNC_ALLREDUCE) { /* the group's first collective: the sequence number peers use */
      hit = conn_mismatch(comm, &pl->ops[k].ctx.hdr, &rec);
      break;
    }
  for (int c = 0; c < comm->nchannels && !hit; c++)
    hit = tp_conn_poisoned(&comm->channels[c].send, 1, &rec) || tp_conn_poisoned(&comm->channels[c].recv, 0, &rec);
  for (int k = 0; comm->p2p && k < 2 * comm->nranks && !hit; k++) /* both per-peer sets */
    hit = tp_conn_poisoned(&comm->p2p[k].send, 1, &rec) || tp_conn_poisoned(&comm->p2p[k].recv, 0, &rec);
  if (!hit) return CH_OK;
  if (rec.kind == XFER_PEER_LOST) note_lost(comm, rec.other);
  if (!atomic_exchange(&comm->poisoned, 1)) {
    say(comm, &rec);
    poison_all(comm, &rec);
  }
  return rec.kind == XFER_PEER_LOST ? CH_REMOTE : CH_INVALID_USAGE;
}
