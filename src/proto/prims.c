/* The primitive executor, written once; protocols differ only in how a slot is tested, read and
 * written (Simple: raw bytes + tail counter; LL: 8 data bytes + 8-byte flag per 16-byte line;
 * LL128: 120 data bytes + 8-byte flag per 128-byte line). A flag is the call's tag above step+1
 * (a receiver never takes another call's data for its own), and the writer stores
 * the last line's flag with release order, so seeing that flag (acquire) proves the whole slot is
 * visible on any architecture. */
#include <stdlib.h>
#include <string.h>

#include "../reduce/wire.h"
#include "prims.h"
#include "proto.h"

size_t prim_slot_payload(int proto, size_t slot_bytes) {
  switch (proto) {
    case PROTO_LL: return slot_bytes / LL_LINE_BYTES * LL_LINE_DATA;
    case PROTO_LL128: return slot_bytes / LL128_LINE_BYTES * LL128_LINE_DATA;
    default: return slot_bytes;
  }
}

size_t prim_step_elems(int proto, size_t slot_bytes, size_t esize) {
  size_t n = prim_slot_payload(proto, slot_bytes) / esize;
  return n & ~(size_t)7; /* keep steps a multiple of 8 elements for vector loops */
}

static inline char* slot_ptr(struct conn* c, int proto, uint64_t step) {
  return c->buff[proto] + (step % CH_STEPS) * c->slot_bytes[proto];
}

/* LL/LL128 flags carry the call's tag above the step, so data of another call never looks ready;
 * the low half tells the step apart from the one CH_STEPS earlier in the same slot. */
static inline uint64_t line_flag(uint32_t tag, uint64_t step) { return (uint64_t)tag << 32 | (uint32_t)(step + 1); }

static int in_ready(struct conn* c, int proto, size_t bytes, uint32_t tag) {
  if (proto == PROTO_SIMPLE) return atomic_load_explicit(&c->ctrl->tail, memory_order_acquire) > c->step;
  return proto_flag_ready(proto, slot_ptr(c, proto, c->step), bytes, line_flag(tag, c->step));
}

/* Reading head pulls a line the receiver owns into our cache: a cross-core miss on every send.
 * Credits only grow, so a stale head that still leaves a free slot is good enough. */
static int out_ready(struct conn* c) {
  if (c->head_seen + CH_STEPS > c->step) return 1;
  c->head_seen = atomic_load_explicit(&c->ctrl->head, memory_order_acquire);
  return c->head_seen + CH_STEPS > c->step;
}

/* Compute the primitive's value into `to` (n elements). `in` is the received data or NULL. */
static void compute(const struct prim_ctx* ctx, const struct prim* p, const char* in, char* to) {
  size_t n = p->nelem, bytes = n * ctx->esize;
  if (n == 0) return;
  if (in && p->reduce) {
    if (p->premul || !red_has_premul(ctx->red)) {
      red_reduce(ctx->red, to, in, p->src, n);
    } else { /* src is a partial result (recursive doubling, tree): its scalars are applied already */
      struct red_op sum = *ctx->red;
      sum.kind = RED_SUM;
      red_reduce(&sum, to, in, p->src, n);
    }
  } else if (in) {
    if (to != in) memcpy(to, in, bytes);
  } else if (p->premul) {
    red_premul(ctx->red, to, p->src, n);
  } else if (to != p->src) {
    memmove(to, p->src, bytes);
  }
  if (p->postop) red_postop(ctx->red, to, to, n);
}

/* compute() into dst with streaming stores: through an L1-sized block when there is arithmetic to do,
 * which measured as fast as streaming from the arithmetic itself and works for every type and op. */
static void compute_streamed(const struct prim_ctx* ctx, const struct prim* p, const char* in, char* dst) {
  size_t bytes = p->nelem * ctx->esize;
  if (in && !p->reduce && !p->postop) {
    red_nt_copy(dst, in, bytes);
    red_nt_fence();
    return;
  }
  _Alignas(64) char block[4096];
  size_t per = sizeof(block) / ctx->esize;
  for (size_t off = 0; off < p->nelem; off += per) {
    struct prim q = *p;
    size_t at = off * ctx->esize;
    q.nelem = p->nelem - off < per ? p->nelem - off : per;
    q.src = p->src ? p->src + at : NULL;
    compute(ctx, &q, in ? in + at : NULL, block);
    red_nt_copy(dst + at, block, q.nelem * ctx->esize);
  }
  red_nt_fence();
}

/* Owner's combine step: every rank's contribution is here (reduce/repro.c). */
static int prim_combine(struct prim_ctx* ctx, const struct prim* p) {
  if (p->nslots == 0) { /* streaming ORDER: dst <- dst (+) premul(src), the owner's own part */
    red_reduce(ctx->red, p->dst, p->dst, p->src, p->nelem);
    return 1;
  }
  struct red_contrib stack_in[64] = {{0}}, *in = p->nslots <= 64 ? stack_in : malloc(sizeof(*in) * (size_t)p->nslots);
  if (!in) return 0; /* retried: this is the only allocation on the path, and it is small */
  for (int q = 0; q < p->nslots; q++)
    in[q] = q == p->self ? (struct red_contrib){p->src, ctx->red}
                         : (struct red_contrib){p->slots + (size_t)q * p->slot_stride, NULL};
  int done = red_repro_combine(ctx->repro, ctx->red, p->dst, in, p->nslots, p->nelem);
  if (in != stack_in) free(in);
  return done; /* 0: out of memory for a moment (over 64 ranks): the engine calls again */
}

/* Whether connection c carries the call's wire format. */
static inline int wire_hop(const struct prim_ctx* ctx, const struct conn* c) {
  return ctx->wire_all || c->transport == TP_TCP || c->transport == TP_FAB;
}

size_t prim_wire_bytes(const struct prim_ctx* ctx, const struct conn* c, size_t nelem) {
  if (ctx->proto == PROTO_SIMPLE && wire_hop(ctx, c)) return wire_bytes(ctx->wire, ctx->wire_type, nelem);
  return nelem * ctx->esize;
}

/* A Simple step with a wire format (prim_try has checked that both ends are ready): through blocks
 * of WBLK values, decoded from `in` if it is compressed, computed, kept rounded where this rank
 * produces a value it sends, encoded into `out` if that is compressed. in_w / out_w: compressed. */
#define WBLK 1024 /* values: a multiple of WIRE_GROUP; 4 KiB of float32 */
static void wire_step(const struct prim_ctx* ctx, const struct prim* p, const char* in, int in_w, char* out,
                      int out_w) {
  int f = ctx->wire, ty = ctx->wire_type;
  size_t es = ctx->esize;
  /* A value this rank made (not one it forwards) that travels on: rounded here, so the ranks that get it
   * over an exact hop hold what the ranks behind a compressed one hold. */
  int keep_rounded = p->final_dst || (p->send && p->dst && !(p->recv && !p->reduce));
  _Alignas(64) char ib[WBLK * sizeof(float)], ob[WBLK * sizeof(float)];
  for (size_t at = 0; at < p->nelem; at += WBLK) {
    struct prim q = *p;
    q.nelem = p->nelem - at < WBLK ? p->nelem - at : WBLK;
    q.src = p->src ? p->src + at * es : NULL;
    const char* qin = NULL;
    if (p->recv && in_w) {
      wire_decode(f, ty, ib, in + wire_bytes(f, ty, at), q.nelem);
      qin = ib;
    } else if (p->recv) {
      qin = in + at * es;
    }
    char* to = p->dst ? p->dst + at * es : out_w ? ob : out + at * es;
    compute(ctx, &q, qin, to);
    if (keep_rounded) wire_round(f, ty, to, q.nelem);
    if (!p->send) continue;
    if (out_w) wire_encode(f, ty, out + wire_bytes(f, ty, at), to, q.nelem);
    else if (to != out + at * es) memcpy(out + at * es, to, q.nelem * es);
  }
}

int prim_try(struct prim_ctx* ctx, const struct prim* p) {
  if (p->combine) return prim_combine(ctx, p);
  if (!p->send && !p->recv && !p->dst) return 1; /* an empty step (Owner: an empty part) */
  int proto = ctx->proto;
  size_t bytes = p->nelem * ctx->esize;
  if (p->recv && !in_ready(ctx->in, proto, bytes, ctx->tag)) {
    /* tail is posted after the data (and flags), for every protocol: sleep on it */
    ctx->wait_word = &ctx->in->ctrl->tail;
    ctx->wait_sleeping = &ctx->in->ctrl->recv_sleeping;
    ctx->wait_seen = ctx->in->step;
    return 0;
  }
  if (p->send && !out_ready(ctx->out)) {
    ctx->wait_word = &ctx->out->ctrl->head;
    ctx->wait_sleeping = &ctx->out->ctrl->send_sleeping;
    ctx->wait_seen = ctx->out->step - CH_STEPS;
    return 0;
  }

  const char* in = NULL;
  size_t sent = bytes; /* Simple: bytes on the wire */
  if (ctx->wire && proto == PROTO_SIMPLE) {
    int in_w = p->recv && wire_hop(ctx, ctx->in), out_w = p->send && wire_hop(ctx, ctx->out);
    if (p->recv) {
      if (ctx->in->ctrl->tag[ctx->in->step % CH_STEPS] != ctx->tag) return PRIM_MISMATCH;
      in = slot_ptr(ctx->in, proto, ctx->in->step);
    }
    if (out_w) sent = prim_bytes(ctx, ctx->out, p->nelem);
    wire_step(ctx, p, in, in_w, p->send ? slot_ptr(ctx->out, proto, ctx->out->step) : NULL, out_w);
    goto posted;
  }
  if (p->recv) {
    char* s = slot_ptr(ctx->in, proto, ctx->in->step);
    if (proto == PROTO_SIMPLE) {
      /* tag[] shares tail's line, just read: the check costs no miss. */
      if (ctx->in->ctrl->tag[ctx->in->step % CH_STEPS] != ctx->tag) return PRIM_MISMATCH;
      in = s;
    } else {
      proto_unpack(proto, s, ctx->scratch, bytes);
      in = ctx->scratch;
    }
  }

  char* out_slot = p->send ? slot_ptr(ctx->out, proto, ctx->out->step) : NULL;
  if (p->dst && !p->send && ctx->nt_dst && p->dst != p->src) {
    compute_streamed(ctx, p, in, p->dst);
  } else if (p->dst) {
    compute(ctx, p, in, p->dst);
    if (p->send) {
      if (proto == PROTO_SIMPLE) memcpy(out_slot, p->dst, bytes);
      else proto_pack(proto, out_slot, p->dst, bytes, line_flag(ctx->tag, ctx->out->step));
    }
  } else if (p->send) {
    if (proto == PROTO_SIMPLE) {
      compute(ctx, p, in, out_slot);
    } else {
      /* LL lines interleave flags with data: compute into scratch (which may already hold `in`). */
      compute(ctx, p, in, ctx->scratch);
      proto_pack(proto, out_slot, ctx->scratch, bytes, line_flag(ctx->tag, ctx->out->step));
    }
  }

posted:
  if (p->recv) {
    struct conn* c = ctx->in;
    c->step++;
    atomic_store_explicit(&c->ctrl->head, c->step, memory_order_release);
    tp_wake(&c->ctrl->head, &c->ctrl->send_sleeping);
  }
  if (p->send) {
    struct conn* c = ctx->out;
    int slot = (int)(c->step % CH_STEPS);
    /* Every protocol: a receiver that expects another protocol (its call differs) still finds out. */
    if (proto == PROTO_SIMPLE) c->ctrl->size[slot] = sent;
    c->ctrl->tag[slot] = ctx->tag;
    c->ctrl->hdr[slot] = ctx->hdr;
    c->step++;
    atomic_store_explicit(&c->ctrl->tail, c->step, memory_order_release);
    tp_wake(&c->ctrl->tail, &c->ctrl->recv_sleeping);
  }
  return 1;
}

int prim_check(struct prim_ctx* ctx) {
  struct conn* c = ctx->in;
  if (!c || !c->ctrl || ctx->wait_word != &c->ctrl->tail) return 0;
  /* tail is posted after tag[] and the data: a posted step with another tag came from another call. */
  if (atomic_load_explicit(&c->ctrl->tail, memory_order_acquire) <= c->step) return 0;
  return c->ctrl->tag[c->step % CH_STEPS] != ctx->tag ? PRIM_MISMATCH : 0;
}

void prim_their_hdr(const struct prim_ctx* ctx, struct xfer_hdr* out) {
  *out = ctx->in->ctrl->hdr[ctx->in->step % CH_STEPS];
}

void prim_wait(struct prim_ctx* ctx, int timeout_us) {
  if (ctx->wait_word) tp_wait(ctx->wait_word, ctx->wait_sleeping, ctx->wait_seen, timeout_us);
}
