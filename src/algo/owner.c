/* Owner: the reproducible reductions' FIFO algorithm (AllReduce, ReduceScatter, Reduce), for any
 * placement of ranks (threads, processes, hosts). The vector is cut in one block per rank; rank q owns
 * block q. Every rank sends its (premultiplied) share of block q straight to q over the per-peer
 * connections, so the owner holds all ranks' raw values of each of its elements and combines them with
 * red_repro_combine: in rank order (ORDER) or exactly (EXACT). Nothing else adds, so the result does
 * not depend on chunking, channels, protocol or placement. Then AllReduce sends each owner's result
 * to every rank, Reduce to the root; ReduceScatter keeps it. The bytes per rank are the ring's (each
 * sends N(n-1)/n and receives as much, twice for AllReduce), in two hops instead of 2(n-1).
 *
 * Per chunk j of a block (op->chunk elements), with d = 1..n-1:
 *   send my part of block rank+d to rank+d (premultiplied)   n-1 steps
 *   recv block rank's part from rank-d into tmp slot rank-d   n-1 steps
 *   combine tmp slots and my own part into the result         1 step
 *   AllReduce: send the result to rank+d; recv block rank-d's result from rank-d   2(n-1) steps
 *   Reduce: a non-root sends its result to the root (1 step); the root receives n-1 results
 * A part that is empty (the last blocks of a short vector) is an empty step at both ends. The order
 * of messages on each connection is the same at both ends, and a rank never has more than two
 * messages of one chunk outstanding to a peer, so the per-peer FIFOs cannot deadlock. In place works:
 * each part is sent before anything is written over it. */
#include "algo.h"

/* Block q of the call: where it starts in sendbuff (and, but for ReduceScatter, recvbuff) and how
 * long it is. */
static size_t blk_len(const struct ch_op* op, int q) {
  if (op->func == FUNC_REDUCESCATTER) return op->count;
  size_t per = (op->count + (size_t)op->nranks - 1) / (size_t)op->nranks;
  size_t at = algo_min(op->count, (size_t)q * per);
  return algo_min(op->count, at + per) - at;
}
static size_t blk_off(const struct ch_op* op, int q) {
  if (op->func == FUNC_REDUCESCATTER) return (size_t)q * op->count;
  size_t per = (op->count + (size_t)op->nranks - 1) / (size_t)op->nranks;
  return algo_min(op->count, (size_t)q * per);
}
/* Elements of block q in chunk j. */
static size_t part(const struct ch_op* op, int q, uint64_t j) {
  size_t len = blk_len(op, q), at = (size_t)j * op->chunk;
  return at >= len ? 0 : algo_min(op->chunk, len - at);
}

static uint64_t tail_steps(const struct ch_op* op) {
  int n = op->nranks;
  if (op->func == FUNC_ALLREDUCE) return 2 * (uint64_t)(n - 1);
  if (op->func == FUNC_REDUCE) return op->rank == op->root ? (uint64_t)(n - 1) : 1;
  return 0;
}
static uint64_t per_chunk(const struct ch_op* op) { return 2 * (uint64_t)(op->nranks - 1) + 1 + tail_steps(op); }

uint64_t owner_nsteps(const struct ch_op* op) {
  size_t longest = blk_len(op, 0); /* block 0 is never shorter than another */
  uint64_t chunks = (longest + op->chunk - 1) / op->chunk;
  return chunks * per_chunk(op);
}

/* Where my result for chunk j goes: my block of recvbuff (the root's block for a non-root Reduce
 * rank, which has no recvbuff: its own tmp slot). */
static char* result_at(const struct ch_op* op, uint64_t j) {
  size_t o = (size_t)j * op->chunk;
  if (op->func == FUNC_REDUCESCATTER) return op->recvbuff + o * op->esize;
  if (op->func == FUNC_REDUCE && op->rank != op->root) return op->tmp + (size_t)op->rank * op->tmp_stride;
  return op->recvbuff + (blk_off(op, op->rank) + o) * op->esize;
}

void owner_step(const struct ch_op* op, uint64_t idx, struct prim* p) {
  int n = op->nranks, me = op->rank;
  uint64_t per = per_chunk(op), j = idx / per;
  int s = (int)(idx % per);
  size_t o = (size_t)j * op->chunk, es = op->esize;
  p->peers = 1;
  if (s < n - 1) { /* my part of block me+d, to its owner */
    int q = (me + s + 1) % n;
    if (!(p->nelem = part(op, q, j))) return;
    p->send = 1, p->premul = 1, p->out_peer = q;
    p->src = op->sendbuff + (blk_off(op, q) + o) * es;
    return;
  }
  s -= n - 1;
  if (s < n - 1) { /* rank me-d's part of my block, into its slot */
    int q = (me - s - 1 + n) % n;
    if (!(p->nelem = part(op, me, j))) return;
    p->recv = 1, p->in_peer = q;
    p->dst = op->tmp + (size_t)q * op->tmp_stride;
    return;
  }
  s -= n - 1;
  if (s == 0) {
    if (!(p->nelem = part(op, me, j))) return;
    p->peers = 0, p->combine = 1;
    p->src = op->sendbuff + (blk_off(op, me) + o) * es;
    p->dst = result_at(op, j);
    p->slots = op->tmp, p->slot_stride = op->tmp_stride, p->self = me, p->nslots = n;
    return;
  }
  s -= 1;
  if (op->func == FUNC_REDUCE && me != op->root) {
    if (!(p->nelem = part(op, me, j))) return;
    p->send = 1, p->out_peer = op->root, p->src = result_at(op, j);
    return;
  }
  if (op->func == FUNC_REDUCE || s >= n - 1) { /* the root's, or AllReduce's second half: receive results */
    int d = op->func == FUNC_REDUCE ? s + 1 : s - (n - 1) + 1;
    int q = (me - d + n) % n;
    if (!(p->nelem = part(op, q, j))) return;
    p->recv = 1, p->in_peer = q;
    p->dst = op->recvbuff + (blk_off(op, q) + o) * es;
    return;
  }
  int q = (me + s + 1) % n; /* AllReduce: my result to every rank */
  if (!(p->nelem = part(op, me, j))) return;
  p->send = 1, p->out_peer = q, p->src = result_at(op, j);
}
