/* Direct AllReduce: every rank reads and writes the others' buffers, so no FIFO is needed. Rank r owns
 * segment r of the vector: it reads that segment from every rank's send buffer, reduces (its own data
 * first, then the others in rank order), and writes the result into every rank's receive buffer. Each
 * element is read n times and written n times in total, against about four passes through FIFOs.
 *
 * Threads of one process reach each other's buffers by address. Processes reach buffers allocated
 * with ncclMemAlloc (memfd-backed, src/core/mem.c) by mapping them (transport/shm.c); when any rank's
 * buffer is elsewhere, all ranks see it in the slots and run the FIFO algorithm instead.
 *
 * Each rank's contribution goes through that rank's own premul (ncclRedOpCreatePreMulSum scalars are
 * per rank).
 *
 * Steps (op->idx): 0 publish buffers and arrive; 1 wait until all arrived, then reduce and scatter my
 * segment, then mark done; 2 wait until all are done (nobody still reads my send buffer or writes my
 * receive buffer). In-place is safe: only the owner of a segment reads or writes it. A rank that
 * cannot map a peer's buffer marks its done word failed, so every rank ends the call with an error
 * instead of waiting for ever. */
#include <string.h>
#include <unistd.h>

#include "../misc/log.h"
#include "algo.h"

#define DONE_FAILED (1ull << 63)

struct direct_clique* direct_clique_new(int n) {
  struct direct_clique* c = aligned_alloc(64, direct_clique_bytes(n));
  if (!c) return NULL;
  memset(c, 0, direct_clique_bytes(n));
  atomic_store(&c->refs, n);
  c->n = n;
  return c;
}

void direct_clique_release(struct direct_clique* c) {
  if (c && !c->procs && atomic_fetch_sub(&c->refs, 1) == 1) free(c);
}

/* 0 until every rank has reached seq; then 1, or -1 if one of them failed this call. */
static int all_reached(const struct direct_clique* c, int done, uint64_t seq) {
  int failed = 0;
  for (int k = 0; k < c->n; k++) {
    uint64_t v = atomic_load_explicit(done ? &c->slot[k].done : &c->slot[k].arrive, memory_order_acquire);
    if ((v & ~DONE_FAILED) < seq) return 0;
    failed |= v == (seq | DONE_FAILED);
  }
  return failed ? -1 : 1;
}

/* Where rank k's buffer is in this process: its address when we share the address space, else our
 * mapping of its allocation. 0 if that mapping failed (logged). */
static int reach(struct ch_op* op, int k, const struct direct_buf* b, char** at) {
  if (k == op->rank || !op->clique->procs || b->pid == (int32_t)getpid()) {
    *at = (char*)(uintptr_t)b->addr;
    return 1;
  }
  char* base = tp_map_peer(op->maps, b->pid, b->fd, b->serial, b->alloc_bytes);
  *at = base ? base + b->off : NULL;
  return base != NULL;
}

/* My segment: reduce through an L1-sized block, then write the block to every rank's receive buffer
 * (streaming stores for large results, coll/red_stream.c). One pass over everything. */
static void reduce_scatter_segment(struct ch_op* op, char** send, char** recv, size_t at, size_t len) {
  const struct direct_clique* c = op->clique;
  int n = op->nranks, me = op->rank;
  size_t es = op->esize;
  _Alignas(64) char block[4096];
  size_t per = sizeof(block) / es;
  for (size_t o = 0; o < len; o += per) {
    size_t m = len - o < per ? len - o : per, b = (at + o) * es;
    red_premul(&c->slot[me].red, block, send[me] + b, m);
    for (int k = 0; k < n; k++)
      if (k != me) red_reduce(&c->slot[k].red, block, block, send[k] + b, m);
    if (red_has_postop(&c->slot[me].red)) red_postop(&c->slot[me].red, block, block, m);
    for (int k = 0; k < n; k++) {
      if (op->ctx.stream_dst) red_stream_copy(recv[k] + b, block, m * es);
      else memcpy(recv[k] + b, block, m * es);
    }
  }
  if (op->ctx.stream_dst) red_stream_fence();
}

int direct_allreduce_try(struct ch_op* op) {
  struct direct_clique* c = op->clique;
  struct direct_slot* me = &c->slot[op->rank];
  uint64_t seq = op->ctx.hdr.seq + 1;
  int n = op->nranks;
  if (op->idx == 0) {
    me->send = op->dsend;
    me->recv = op->drecv;
    me->red = *op->ctx.red;
    atomic_store_explicit(&me->arrive, seq, memory_order_release);
    return 1;
  }
  if (op->idx == 1) {
    if (!all_reached(c, 0, seq)) return 0;
    char *send[n], *recv[n];
    for (int k = 0; k < n; k++) {
      if (c->procs && (c->slot[k].send.fd < 0 || c->slot[k].recv.fd < 0)) {
        INFO(LOG_COLL, "AllReduce seq %llu: rank %d's buffers are not from ncclMemAlloc, so not reachable by "
             "other processes: using %s", (unsigned long long)seq, k,
             op->fallback_algo == ALGO_EXCHANGE ? "Exchange" : "Ring");
        return -1;
      }
    }
    for (int k = 0; k < n; k++) {
      if (!reach(op, k, &c->slot[k].send, &send[k]) || !reach(op, k, &c->slot[k].recv, &recv[k])) {
        /* Peers may still write into my buffers: fail, but only after waiting for them in step 2. */
        atomic_store_explicit(&me->done, seq | DONE_FAILED, memory_order_release);
        return 1;
      }
    }
    size_t per = (op->count + n - 1) / n;
    per = (per + 15) & ~(size_t)15;
    size_t off = algo_min(op->count, (size_t)op->rank * per);
    size_t len = algo_min(op->count, off + per) - off;
    if (len) reduce_scatter_segment(op, send, recv, off, len);
    atomic_store_explicit(&me->done, seq, memory_order_release);
    return 1;
  }
  int r = all_reached(c, 1, seq);
  if (r < 0) {
    WARN("AllReduce seq %llu on rank %d: a rank could not map a peer's buffers (see its WARN); the call "
         "failed on every rank", (unsigned long long)seq, op->rank);
    return -2;
  }
  return r;
}
