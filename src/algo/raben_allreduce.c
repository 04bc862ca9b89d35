/* Rabenseifner AllReduce: a ReduceScatter by recursive halving, then an AllGather by recursive
 * doubling. 2 log2(n) hops (the ring takes 2(n-1)) for the ring's bytes, 2(n-1)/n of the vector per
 * rank: the choice for medium sizes on many ranks.
 *
 * The vector is cut in p blocks (p: participants, a power of two). Round k of the halving pairs each
 * participant with the one whose virtual rank differs in bit (log2(p) - 1 - k): each keeps the half of
 * their common segment on its side of that bit, sends the other half and reduces the partner's copy of
 * the kept half into recvbuff. After log2(p) rounds participant v holds block v reduced over all
 * ranks; the doubling rounds then swap segments in the reverse order until all hold every block.
 * Non-powers of two: extra ranks fold into a partner first and get the result back (pof2.c), 2 hops
 * of the whole vector more.
 *
 * Within a round the partners keep a few chunks in flight each way (rb_order), so a round of any size
 * fits the FIFO; both compute the same number of steps from the same halves. The first contribution
 * of a rank is premultiplied, partial results are not (premul = 0). In place
 * works: a half is sent before anything overwrites it, and a kept half is only reduced into. */
#include "algo.h"

/* Elements of blocks [b0, b1) of the op's part. */
static void rb_blocks(const struct ch_op* op, int p, int b0, int b1, size_t* off, size_t* len) {
  size_t blk = (op->part_count + (size_t)p - 1) / (size_t)p;
  blk = (blk + 7) & ~(size_t)7;
  size_t lo = algo_min((size_t)b0 * blk, op->part_count), hi = algo_min((size_t)b1 * blk, op->part_count);
  *off = lo, *len = hi - lo;
}

static uint64_t rb_chunks(const struct ch_op* op, size_t len) { return (uint64_t)((len + op->chunk - 1) / op->chunk); }

/* Round r of 2 log2(p) (halving rounds first): the partner, the blocks this rank sends and the
 * blocks it receives. */
struct rb_round {
  int partner;
  int s0, s1, r0, r1;
};

static struct rb_round rb_round_of(const struct algo_pof2* ro, int n, int r) {
  struct rb_round x;
  int halving = r < ro->log, k = halving ? r : 2 * ro->log - 1 - r;
  int d = ro->p >> (k + 1);       /* the bit this round splits on */
  int seg = 2 * d;                /* blocks in the segment the two partners share */
  int base = ro->vrank & ~(seg - 1);
  int mine = base + (ro->vrank & d), theirs = base + ((ro->vrank & d) ^ d);
  x.partner = algo_pof2_rank(ro->vrank ^ d, n, ro->p);
  if (halving) { /* keep my half, send theirs */
    x.s0 = theirs, x.s1 = theirs + d, x.r0 = mine, x.r1 = mine + d;
  } else { /* send my half, receive theirs */
    x.s0 = mine, x.s1 = mine + d, x.r0 = theirs, x.r1 = theirs + d;
  }
  return x;
}

/* Steps of round r: 2 x the chunks of the larger of its two halves. */
static uint64_t rb_round_steps(const struct ch_op* op, const struct algo_pof2* ro, int r) {
  struct rb_round x = rb_round_of(ro, op->nranks, r);
  size_t o, ls, lr;
  rb_blocks(op, ro->p, x.s0, x.s1, &o, &ls);
  rb_blocks(op, ro->p, x.r0, x.r1, &o, &lr);
  return 2 * rb_chunks(op, ls > lr ? ls : lr);
}

/* Step `idx` of a round of c chunks each way: the first RB_AHEAD chunks are sent before anything is
 * received, then each receive is followed by the next send, then the last receives. Both partners
 * follow it, so neither ever has more than RB_AHEAD sends waiting (the FIFO holds CH_STEPS), and a
 * round over a slow link keeps RB_AHEAD chunks in flight instead of one. */
#define RB_AHEAD (CH_STEPS / 2)
static void rb_order(uint64_t c, uint64_t idx, int* send, uint64_t* j) {
  uint64_t w = c < RB_AHEAD ? c : RB_AHEAD;
  if (idx < w) {
    *send = 1, *j = idx;
    return;
  }
  uint64_t k = idx - w;
  if (k < 2 * (c - w)) {
    *send = k % 2, *j = k % 2 ? k / 2 + w : k / 2;
    return;
  }
  *send = 0, *j = (c - w) + (k - 2 * (c - w));
}

uint64_t raben_allreduce_nsteps(const struct ch_op* op) {
  struct algo_pof2 ro = algo_pof2_of(op->rank, op->nranks);
  uint64_t whole = rb_chunks(op, op->part_count);
  if (op->part_count == 0) return 0;
  if (ro.vrank < 0) return 2 * whole;
  uint64_t s = ro.fold >= 0 ? 2 * whole : 0;
  for (int r = 0; r < 2 * ro.log; r++) s += rb_round_steps(op, &ro, r);
  return s;
}

void raben_allreduce_step(const struct ch_op* op, uint64_t idx, struct prim* p) {
  struct algo_pof2 ro = algo_pof2_of(op->rank, op->nranks);
  uint64_t whole = rb_chunks(op, op->part_count);
  size_t es = op->esize;
  p->peers = 1;
  uint64_t last = ro.fold >= 0 ? raben_allreduce_nsteps(op) - whole : 0; /* where the fold's way back starts */
  if (ro.fold >= 0 && (idx < whole || idx >= last)) {
    /* Fold: the extra rank's whole vector in (first), the result out (last). */
    int first = idx < whole;
    uint64_t j = first ? idx : idx - last;
    size_t o = op->part_off + (size_t)j * op->chunk;
    p->nelem = algo_min(op->chunk, op->part_off + op->part_count - o);
    if (ro.vrank < 0) {
      if (first) p->send = 1, p->premul = 1, p->src = op->sendbuff + o * es, p->out_peer = ro.fold;
      else p->recv = 1, p->dst = op->recvbuff + o * es, p->in_peer = ro.fold;
    } else if (first) {
      p->recv = 1, p->reduce = 1, p->premul = 1, p->src = op->sendbuff + o * es, p->dst = op->recvbuff + o * es;
      p->in_peer = ro.fold;
    } else {
      p->send = 1, p->src = op->recvbuff + o * es, p->out_peer = ro.fold;
    }
    return;
  }
  if (ro.fold >= 0) idx -= whole;
  int r = 0;
  uint64_t n;
  for (; idx >= (n = rb_round_steps(op, &ro, r)); r++) idx -= n;
  struct rb_round x = rb_round_of(&ro, op->nranks, r);
  int halving = r < ro.log, send;
  uint64_t j;
  rb_order(n / 2, idx, &send, &j);
  size_t o, len;
  if (send) rb_blocks(op, ro.p, x.s0, x.s1, &o, &len);
  else rb_blocks(op, ro.p, x.r0, x.r1, &o, &len);
  size_t at = algo_min((size_t)j * op->chunk, len);
  p->nelem = algo_min(op->chunk, len - at);
  size_t e = (op->part_off + o + at) * es;
  /* The input itself until this rank has reduced something into recvbuff (its first halving round,
   * unless a fold did); then its partial result there. */
  int first = r == 0 && ro.fold < 0;
  if (send) {
    p->send = 1, p->out_peer = x.partner;
    p->src = (first ? op->sendbuff : op->recvbuff) + e;
    p->premul = (uint8_t)first;
  } else if (halving) {
    p->recv = 1, p->reduce = 1, p->in_peer = x.partner;
    p->src = (first ? op->sendbuff : op->recvbuff) + e;
    p->premul = (uint8_t)first;
    p->dst = op->recvbuff + e;
    p->postop = r == ro.log - 1; /* the block this rank owns is final */
    p->final_dst = p->postop;    /* and the doubling rounds send it: a wire format keeps it rounded */
  } else {
    p->recv = 1, p->in_peer = x.partner, p->dst = op->recvbuff + e;
  }
}
