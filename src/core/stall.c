/* Stall reports: what a rank that stopped making progress is waiting for. Printed when a call times
 * out (CHORUS_TIMEOUT, chorusCommSetTimeout), one WARN per pending operation, naming the collective,
 * its sequence number, how far it got and the peer whose data or credit it waits for. */
#include <stdio.h>

#include "../misc/log.h"
#include "enqueue.h"

/* Which peer op is blocked on, from what its last primitive would sleep on. */
static const char* waits_for(const struct ch_op* op, int* peer) {
  const struct prim_ctx* c = &op->ctx;
  *peer = -1;
  if (op->algo == ALGO_DIRECT && op->idx < 3) return "the other ranks of its Direct clique";
  if (c->in && c->in->ctrl && c->wait_word == &c->in->ctrl->tail) {
    *peer = c->in->peer;
    return "data from";
  }
  if (c->out && c->out->ctrl && c->wait_word == &c->out->ctrl->head) {
    *peer = c->out->peer;
    return "room in the FIFO of";
  }
  return "its turn (an earlier call on this communicator has not finished)";
}

void stall_report(const struct ch_plan* pl, double idle_s) {
  const struct ncclComm* comm = pl->comm;
  int reported = 0;
  for (int l = 0; l < pl->nlanes; l++) {
    const struct ch_lane* ln = &pl->lanes[l];
    if (ln->cur >= ln->nops) continue;
    const struct ch_op* op = ln->ops[ln->cur];
    int peer;
    const char* what = waits_for(op, &peer);
    char who[32] = "";
    if (peer >= 0) snprintf(who, sizeof(who), " rank %d", peer);
    uint64_t nsteps = op->nidx ? op->nidx - 1 : 0;
    int coll = op->func != FUNC_SEND && op->func != FUNC_RECV;
    WARN("rank %d: no progress for %.0f s: %s%s%llu (%zu x %s, %s/%s) at step %llu of %llu, waiting for %s%s",
         comm->rank, idle_s, tune_func_name(op->func), coll ? " #" : (op->func == FUNC_SEND ? " to peer " : " from peer "),
         coll ? (unsigned long long)op->ctx.hdr.seq : (unsigned long long)op->root, op->count, red_type_name((int)op->ctx.hdr.type),
         tune_algo_name(op->algo), tune_proto_name(op->proto), (unsigned long long)op->idx,
         (unsigned long long)nsteps, what, who);
    reported++;
  }
  if (!reported)
    WARN("rank %d: no progress for %.0f s in a call on communicator %p waiting for its turn", comm->rank, idle_s,
         (const void*)comm);
}
