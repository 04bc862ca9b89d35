/* Direct AllReduce between ranks that are threads of one process: every rank can read and write the
 * others' buffers, so no FIFO is needed. Rank r owns segment r of the vector: it reads that segment
 * from every rank's send buffer, reduces (its own data first, then the others in rank order), and
 * writes the result into every rank's receive buffer. Each element is read n times and written n
 * times in total, against about four passes through FIFOs.
 *
 * Each rank's contribution goes through that rank's own premul (ncclRedOpCreatePreMulSum scalars are
 * per rank).
 *
 * Steps (op->idx): 0 publish buffers and arrive; 1 wait until all arrived, then reduce and scatter my
 * segment, then mark done; 2 wait until all are done (nobody still reads my send buffer or writes my
 * receive buffer). In-place is safe: only the owner of a segment reads or writes it. */
#include <string.h>

#include "algo.h"

struct direct_clique* direct_clique_new(int n) {
  struct direct_clique* c = aligned_alloc(64, sizeof(*c) + sizeof(struct direct_slot) * (size_t)n);
  if (!c) return NULL;
  memset(c, 0, sizeof(*c) + sizeof(struct direct_slot) * (size_t)n);
  atomic_store(&c->refs, n);
  c->n = n;
  return c;
}

void direct_clique_release(struct direct_clique* c) {
  if (c && atomic_fetch_sub(&c->refs, 1) == 1) free(c);
}

static int all_reached(const struct direct_clique* c, int done, uint64_t seq) {
  for (int k = 0; k < c->n; k++) {
    const _Atomic uint64_t* w = done ? &c->slot[k].done : &c->slot[k].arrive;
    if (atomic_load_explicit(w, memory_order_acquire) < seq) return 0;
  }
  return 1;
}

int direct_allreduce_try(struct ch_op* op) {
  struct direct_clique* c = op->clique;
  struct direct_slot* me = &c->slot[op->rank];
  uint64_t seq = op->ctx.hdr.seq + 1;
  int n = op->nranks;
  if (op->idx == 0) {
    me->send = op->sendbuff;
    me->recv = op->recvbuff;
    me->red = op->ctx.red; /* PreMulSum scalars may differ per rank */
    atomic_store_explicit(&me->arrive, seq, memory_order_release);
    return 1;
  }
  if (op->idx == 1) {
    if (!all_reached(c, 0, seq)) return 0;
    size_t per = (op->count + n - 1) / n;
    per = (per + 15) & ~(size_t)15;
    size_t off = algo_min(op->count, (size_t)op->rank * per);
    size_t len = algo_min(op->count, off + per) - off, at = off * op->esize;
    if (len) {
      const struct red_op* red = op->ctx.red;
      char* acc = op->recvbuff + at;
      red_premul(red, acc, op->sendbuff + at, len);
      for (int k = 0; k < n; k++)
        if (k != op->rank) red_reduce(c->slot[k].red, acc, acc, c->slot[k].send + at, len);
      if (red_has_postop(red)) red_postop(red, acc, acc, len);
      for (int k = 0; k < n; k++)
        if (k != op->rank) memcpy(c->slot[k].recv + at, acc, len * op->esize);
    }
    atomic_store_explicit(&me->done, seq, memory_order_release);
    return 1;
  }
  return all_reached(c, 1, seq);
}
