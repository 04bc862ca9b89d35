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
 *   (ORDER on fp32/fp64 sum and prod instead: receive from rank 0, 1, ... adding each part into the
 *   result as it comes, my own in its turn: n steps, +1 in place; see streams())
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
/* ORDER on fp32/fp64 sums and products, whose accumulation type is the element type: the owner adds
 * each rank's part into its result as it arrives, in rank order (receiving from rank 0, then 1, ...),
 * straight from the FIFO, instead of copying the parts into slots and combining them after. Same
 * bits: a + b is b + a, and the order of the additions is rank order either way. */
static int streams(const struct ch_op* op) {
  const struct red_op* r = op->ctx.red;
  return op->ctx.repro == CH_REPRO_ORDER && (r->type == ncclFloat32 || r->type == ncclFloat64) &&
         (r->kind == RED_SUM || r->kind == RED_PREMULSUM || r->kind == RED_PROD);
}
/* Where my result for chunk j goes: my block of recvbuff (the root's block for a non-root Reduce
 * rank, which has no recvbuff: its own tmp slot). */
static char* result_at(const struct ch_op* op, uint64_t j) {
  size_t o = (size_t)j * op->chunk;
  if (op->func == FUNC_REDUCESCATTER) return op->recvbuff + o * op->esize;
  if (op->func == FUNC_REDUCE && op->rank != op->root) return op->tmp + (size_t)op->rank * op->tmp_stride;
  return op->recvbuff + (blk_off(op, op->rank) + o) * op->esize;
}
/* Where streaming accumulates: the result, unless that is my own input (in place) and ranks before me
 * would overwrite it before I add it: then slot 0 (streaming uses no slots), copied over at the end. */
static char* acc_at(const struct ch_op* op, uint64_t j) {
  char* a = result_at(op, j);
  const char* own = op->sendbuff + (blk_off(op, op->rank) + (size_t)j * op->chunk) * op->esize;
  return op->rank > 0 && a == own ? op->tmp : a;
}
/* Steps after the sends: the receives and the combine, or streaming's n steps (+1 copy). */
static uint64_t gather_steps(const struct ch_op* op) {
  if (!streams(op)) return (uint64_t)op->nranks;
  int inplace = op->rank > 0 && result_at(op, 0) == op->sendbuff + blk_off(op, op->rank) * op->esize;
  return (uint64_t)op->nranks + (uint64_t)inplace;
}
static uint64_t per_chunk(const struct ch_op* op) {
  return (uint64_t)(op->nranks - 1) + gather_steps(op) + tail_steps(op);
}

uint64_t owner_nsteps(const struct ch_op* op) {
  size_t longest = blk_len(op, 0); /* block 0 is never shorter than another */
  uint64_t chunks = (longest + op->chunk - 1) / op->chunk;
  return chunks * per_chunk(op);
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
  int g = (int)gather_steps(op);
  if (s < g && !(p->nelem = part(op, me, j))) return;
  if (s < g && streams(op)) { /* rank s's part, added in rank order */
    char* acc = acc_at(op, j);
    if (s == n) { /* in place: the sum over to where the result goes */
      p->peers = 0, p->src = acc, p->dst = result_at(op, j);
    } else if (s == me) { /* my own part: a copy (rank 0) or an add, premultiplied (combine's accumulate) */
      p->peers = 0, p->src = op->sendbuff + (blk_off(op, me) + o) * es, p->dst = acc;
      if (s == 0) p->premul = 1;
      else p->combine = 1, p->nslots = 0;
    } else {
      p->recv = 1, p->in_peer = s, p->dst = acc;
      if (s > 0) p->reduce = 1, p->src = acc; /* acc + part: commutative, the same bits as part + acc */
    }
    return;
  }
  if (s < g - 1) { /* rank me-d's part of my block, into its slot */
    int q = (me - s - 1 + n) % n;
    p->recv = 1, p->in_peer = q;
    p->dst = op->tmp + (size_t)q * op->tmp_stride;
    return;
  }
  if (s == g - 1) { /* all parts here: combine them (reduce/repro.c) */
    p->peers = 0, p->combine = 1;
    p->src = op->sendbuff + (blk_off(op, me) + o) * es;
    p->dst = result_at(op, j);
    p->slots = op->tmp, p->slot_stride = op->tmp_stride, p->self = me, p->nslots = n;
    return;
  }
  s -= g; /* the tail: results to where they go */
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
