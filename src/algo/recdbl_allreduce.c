/* Recursive doubling AllReduce: in round k every rank exchanges its partial result with the rank whose
 * index differs in bit k and reduces, so after log2(n) rounds all hold the total: log2(n) hops instead of
 * the ring's 2(n-1), for log2(n) times the bytes. The choice for small messages (MPICH's below 2 KiB).
 *
 * n not a power of two: with p the largest power of two below n and r = n - p, each even rank below 2r
 * first hands its data to the odd rank above it and sits out; the p others run the rounds (as virtual
 * ranks 0..p-1) and the odd ranks hand the result back: two hops more (pof2.c).
 *
 * Every rank computes the same value: each round combines two partial results with a commutative
 * operation, in either order, so the pair reaches bit-identical sums (float addition is commutative;
 * associativity is what the rounds' grouping fixes, and the grouping is the same on every rank).
 *
 * Per chunk (op->chunk elements, pipelined only through the FIFO's slots), a participant's steps are:
 *   [fold: recvReduceCopy from its extra rank]  (send, recvReduceCopy) x log2(p)  [send back]
 * and an extra rank's: send, recv. recvbuff holds the partial result; the first contribution is
 * premultiplied, later ones are partial results already (premul = 0). In place works: a chunk is
 * sent before it is overwritten. */
#include "algo.h"

static uint64_t rd_per_chunk(const struct algo_pof2* r) {
  if (r->vrank < 0) return 2;
  return (uint64_t)(2 * r->log + (r->fold >= 0 ? 2 : 0));
}

uint64_t recdbl_allreduce_nsteps(const struct ch_op* op) {
  struct algo_pof2 r = algo_pof2_of(op->rank, op->nranks);
  uint64_t chunks = (op->part_count + op->chunk - 1) / op->chunk;
  return chunks * rd_per_chunk(&r);
}

void recdbl_allreduce_step(const struct ch_op* op, uint64_t idx, struct prim* p) {
  struct algo_pof2 r = algo_pof2_of(op->rank, op->nranks);
  uint64_t per = rd_per_chunk(&r), j = idx / per;
  int s = (int)(idx % per);
  size_t o = op->part_off + (size_t)j * op->chunk;
  p->nelem = algo_min(op->chunk, op->part_off + op->part_count - o);
  const char* in = op->sendbuff + o * op->esize;
  char* acc = op->recvbuff + o * op->esize;
  p->peers = 1;
  if (r.vrank < 0) { /* extra: hand over the contribution, take back the result */
    if (s == 0) p->send = 1, p->premul = 1, p->src = in, p->out_peer = r.fold;
    else p->recv = 1, p->dst = acc, p->in_peer = r.fold;
    return;
  }
  int folded = r.fold >= 0;
  if (folded && s == 0) {
    p->recv = 1, p->reduce = 1, p->premul = 1, p->src = in, p->dst = acc, p->in_peer = r.fold;
    return;
  }
  if (folded && s == (int)per - 1) {
    p->send = 1, p->src = acc, p->out_peer = r.fold;
    return;
  }
  int k = (s - folded) / 2; /* round */
  int partner = algo_pof2_rank(r.vrank ^ (1 << k), op->nranks, r.p);
  /* The first round reads the input itself unless a fold already reduced it into acc. */
  int first = k == 0 && !folded;
  p->src = first ? in : acc;
  p->premul = (uint8_t)first;
  if ((s - folded) % 2 == 0) {
    p->send = 1, p->out_peer = partner;
  } else {
    p->recv = 1, p->reduce = 1, p->dst = acc, p->in_peer = partner;
    p->postop = k == r.log - 1;
  }
}
