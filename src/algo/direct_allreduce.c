/* Direct AllReduce: every rank reads and writes the others' buffers, so no FIFO is needed. Rank r owns
 * segment r of the vector: it reads that segment from every rank's send buffer, reduces (its own data
 * first, then the others in rank order), and writes the result into every rank's receive buffer. Each
 * element is read n times and written n times in total, against about four passes through FIFOs.
 *
 * Threads of one process reach each other's buffers by address. Processes reach buffers allocated
 * with ncclMemAlloc (memfd-backed, src/core/memreg.c) by mapping them (transport/shm.c); when any rank's
 * buffer is elsewhere, all ranks see it in the slots and run the FIFO algorithm instead.
 *
 * Each rank's contribution goes through that rank's own premul (ncclRedOpCreatePreMulSum scalars are
 * per rank).
 *
 * Steps (op->idx): 0 publish the call's shape and buffers and arrive; 1 wait until all arrived, check
 * that every rank made the same call (else nobody touches a peer's memory: every rank marks its done
 * word mismatched), then reduce and scatter my segment, then mark done; 2 wait until all are done
 * (nobody still reads my send buffer or writes my receive buffer). In-place is safe: only the owner of
 * a segment reads or writes it. A rank that cannot map a peer's buffer marks its done word failed, so
 * every rank ends the call with an error instead of waiting for ever. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../misc/log.h"
#include "algo.h"

#define DONE_FAILED (1ull << 63)
#define DONE_MISMATCH (1ull << 62)
#define DONE_FLAGS (DONE_FAILED | DONE_MISMATCH)
#define OP_CUSTOM 5 /* ncclNumOps: every PreMulSum op (their numbers are per rank) */

struct direct_clique* direct_clique_new(int n) {
  struct direct_clique* c = aligned_alloc(64, direct_clique_bytes(n));
  if (!c) return NULL;
  memset(c, 0, direct_clique_bytes(n));
  atomic_store(&c->refs, 1); /* the creator; each thread that finds it in the registry adds one */
  c->n = n;
  return c;
}

void direct_clique_release(struct direct_clique* c) {
  if (c && atomic_fetch_sub(&c->refs, 1) == 1) free(c);
}

/* 0 until every rank has reached seq; then 1, -1 if one of them failed this call, -2 if they found
 * the calls mismatched. */
static int all_reached(const struct direct_clique* c, int n, int done, uint64_t seq) {
  uint64_t flags = 0;
  for (int k = 0; k < n; k++) {
    uint64_t v = atomic_load_explicit(done ? &c->slot[k].done : &c->slot[k].arrive, memory_order_acquire);
    if ((v & ~DONE_FLAGS) < seq) return 0;
    if ((v & ~DONE_FLAGS) == seq) flags |= v & DONE_FLAGS;
  }
  return flags & DONE_MISMATCH ? -2 : flags & DONE_FAILED ? -1 : 1;
}

/* 1 if every rank published my shape (and a reduction of my kind and type). Else log once which rank
 * differs and how, and return 0. Reads only the slots (peer memory is untouched). */
static int shapes_match(struct ch_op* op, const struct direct_shape* mine) {
  struct direct_clique* c = op->clique;
  for (int k = 0; k < op->nranks; k++) {
    struct direct_shape s;
    memcpy(&s, &c->slot[k].shape, sizeof(s));
    struct red_op r = c->slot[k].red;
    if (s.seq == mine->seq && s.count == mine->count && s.type == mine->type && s.op == mine->op &&
        r.kind == op->ctx.red->kind && r.type == op->ctx.red->type)
      continue;
    struct xfer_poison rec = {.finder = op->rank, .other = k, .mine = op->ctx.hdr, .theirs = op->ctx.hdr};
    rec.theirs.seq = s.seq, rec.theirs.count = s.count, rec.theirs.type = s.type, rec.theirs.op = s.op;
    char a[160], b[160];
    algo_call_text(a, sizeof(a), &rec.mine);
    algo_call_text(b, sizeof(b), &rec.theirs);
    char other[24];
    snprintf(other, sizeof(other), "rank %d", k);
    WARN(ALGO_MISMATCH_FMT, other, b, op->rank, a, "", "; no rank touched another's buffers");
    /* Logged: local ranks that are not in Direct learn it from my slot (fault/mismatch.c). */
    direct_slot_poison(&c->slot[op->rank], &rec);
    return 0;
  }
  return 1;
}

/* Where rank k's buffer (bytes long; mine is this rank's own pointer to it) is in this process: my
 * own pointer for my rank; an address from the clique between threads of this process; else our
 * mapping of its allocation, bounded by the allocation; or, for a buffer not from ncclMemAlloc (the
 * caller checked that cross-memory copies are on), NULL here and its address in rank k (*remote). 0 if
 * that fails (logged). */
static int reach(struct ch_op* op, int k, const struct direct_buf* shared, const void* mine, size_t bytes,
                 char** at, uint64_t* remote) {
  *remote = 0;
  if (k == op->rank) {
    *at = (char*)mine;
    return 1;
  }
  if (!op->maps) {
    *at = (char*)(uintptr_t)shared->addr;
    return 1;
  }
  struct direct_buf b;
  memcpy(&b, shared, sizeof(b)); /* read once: the peer may write its slot at any time */
  if (!b.token) { /* the kernel bounds the address to rank k's own memory */
    if (!op->cma) {
      WARN("rank %d's buffer is no longer from ncclMemAlloc: refused", k); /* it changed its slot */
      return 0;
    }
    *at = NULL;
    *remote = b.addr;
    return 1;
  }
  if (b.off > b.alloc_bytes || bytes > b.alloc_bytes - b.off) {
    WARN("rank %d described a buffer of %zu bytes at offset %llu of a %llu-byte allocation: refused", k, bytes,
         (unsigned long long)b.off, (unsigned long long)b.alloc_bytes);
    return 0;
  }
  char* base = tp_map_peer(op->maps, k, b.token, b.alloc_bytes);
  *at = base ? base + b.off : NULL;
  return base != NULL;
}

/* My segment: reduce through an L1-sized block, then write the block to every rank's receive buffer
 * (streaming stores for large results, reduce/nt_copy.c). One pass over everything. */
static void reduce_scatter_segment(struct ch_op* op, const struct red_op* red, char** send, char** recv, size_t at,
                                   size_t len) {
  int n = op->nranks, me = op->rank;
  size_t es = op->esize;
  _Alignas(64) char block[4096];
  size_t per = sizeof(block) / es;
  struct red_contrib in[64]; /* tune/choose.c takes Direct under a level for at most 64 ranks */
  for (size_t o = 0; o < len; o += per) {
    size_t m = len - o < per ? len - o : per, b = (at + o) * es;
    if (op->ctx.repro && n <= 64) { /* every rank's value of each element in rank order (reduce/repro.c) */
      for (int k = 0; k < n; k++) in[k] = (struct red_contrib){send[k] + b, &red[k]};
      (void)red_repro_combine(op->ctx.repro, &red[me], block, in, n, m); /* no heap below 65 ranks */
    } else {
      red_premul(&red[me], block, send[me] + b, m);
      for (int k = 0; k < n; k++)
        if (k != me) red_reduce(&red[k], block, block, send[k] + b, m);
      if (red_has_postop(&red[me])) red_postop(&red[me], block, block, m);
    }
    for (int k = 0; k < n; k++) {
      if (op->ctx.nt_dst) red_nt_copy(recv[k] + b, block, m * es);
      else memcpy(recv[k] + b, block, m * es);
    }
  }
  if (op->ctx.nt_dst) red_nt_fence();
}

int direct_allreduce_try(struct ch_op* op) {
  struct direct_clique* c = op->clique;
  struct direct_slot* me = &c->slot[op->rank];
  uint64_t seq = op->ctx.hdr.seq + 1;
  int n = op->nranks;
  uint32_t base = op->ctx.hdr.op & ((1u << XFER_OP_REPRO_SHIFT) - 1); /* above: the level, compared too */
  uint32_t opc = (base < OP_CUSTOM ? base : OP_CUSTOM) | (op->ctx.hdr.op & ~((1u << XFER_OP_REPRO_SHIFT) - 1));
  struct direct_shape mine = {op->ctx.hdr.seq, op->count, op->ctx.hdr.type, opc};
  if (op->idx == 0) {
    me->shape = mine;
    me->send = op->dsend;
    me->recv = op->drecv;
    me->red = *op->ctx.red;
    atomic_store_explicit(&me->arrive, seq, memory_order_release);
    return DIRECT_STEP;
  }
  if (op->idx == 1) {
    if (!all_reached(c, n, 0, seq)) return DIRECT_WAIT;
    if (!shapes_match(op, &mine)) {
      atomic_store_explicit(&me->done, seq | DONE_MISMATCH, memory_order_release);
      return DIRECT_STEP;
    }
    size_t bytes = op->count * op->esize;
    for (int k = 0; k < n; k++) {
      if (op->maps && (c->slot[k].send.token == 0 || c->slot[k].recv.token == 0)) {
        if (op->cma && bytes >= op->cma->min_bytes) continue; /* reached by cross-memory copies (reach) */
        INFO(LOG_COLL, "AllReduce seq %llu: rank %d's buffers are not from ncclMemAlloc, so not mapped by "
             "other processes, and %s: using %s", (unsigned long long)seq, k,
             op->cma ? "the call is below CHORUS_CMA_MIN_BYTES" : "cross-memory copies are off (see the INFO at init)",
             algo_name(op->fallback_algo));
        return DIRECT_FALLBACK;
      }
    }
    char *send[n], *recv[n];
    uint64_t send_at[n], recv_at[n];
    struct red_op red[n];
    for (int k = 0; k < n; k++) {
      red[k] = c->slot[k].red;
      red[k].kind = op->ctx.red->kind, red[k].type = op->ctx.red->type; /* as checked: the scalars are theirs */
      if (!reach(op, k, &c->slot[k].send, op->sendbuff, bytes, &send[k], &send_at[k]) ||
          !reach(op, k, &c->slot[k].recv, op->recvbuff, bytes, &recv[k], &recv_at[k])) {
        /* Peers may still write into my buffers: fail, but only after waiting for them in step 2. */
        atomic_store_explicit(&me->done, seq | DONE_FAILED, memory_order_release);
        return DIRECT_STEP;
      }
    }
    size_t per = (op->count + n - 1) / n;
    per = (per + 15) & ~(size_t)15;
    size_t off = algo_min(op->count, (size_t)op->rank * per);
    size_t len = algo_min(op->count, off + per) - off;
    int copies = 0; /* some buffer is reached only by cross-memory copies (direct_cma.c) */
    for (int k = 0; k < n; k++) copies |= !send[k] || !recv[k];
    if (len && copies && direct_cma_segment(op, red, send, recv, send_at, recv_at, off, len) != 0) {
      atomic_store_explicit(&me->done, seq | DONE_FAILED, memory_order_release); /* logged */
      return DIRECT_STEP;
    }
    if (len && !copies) reduce_scatter_segment(op, red, send, recv, off, len);
    atomic_store_explicit(&me->done, seq, memory_order_release);
    return DIRECT_STEP;
  }
  int r = all_reached(c, n, 1, seq);
  if (r == -2) return DIRECT_MISMATCH; /* every rank logged it in step 1 */
  if (r < 0) {
    WARN("AllReduce seq %llu on rank %d: a rank could not reach a peer's buffers (see its WARN); the call "
         "failed on every rank", (unsigned long long)seq, op->rank);
    return DIRECT_FAILED;
  }
  return r ? DIRECT_STEP : DIRECT_WAIT;
}
