/* Primitives: the only operations algorithms use. One primitive moves one FIFO step:
 *
 *   send             out <- premul?(src)
 *   recv             dst <- in
 *   recvReduceSend   out <- in (+) premul(src)     (premul = 0: in (+) src, src already reduced)
 *   recvReduceCopy   dst <- post(in (+) premul(src))
 *   recvReduceCopySend dst, out <- post(in (+) premul(src))
 *   recvCopySend     dst, out <- in
 *   copySend         dst, out <- src
 *   copy             dst <- post(premul(src))        (a rank alone)
 *
 * expressed as flags on one struct so every protocol implements a single executor. prim_try never
 * blocks: it returns 0 when the input has not arrived or the output FIFO has no free slot, so one thread
 * can drive many operations (and many ranks) without deadlock. */
#ifndef CH_PRIMS_H
#define CH_PRIMS_H

#include <stddef.h>
#include <stdint.h>

#include "../reduce/reduce.h"
#include "../transport/transport.h"

struct prim {
  uint8_t recv;   /* consume one step from ctx->in */
  uint8_t send;   /* produce one step into ctx->out */
  uint8_t reduce; /* combine the received data with src */
  uint8_t premul; /* apply premul to src (local contribution) */
  uint8_t postop; /* apply postop to the result */
  /* dst gets this rank's final value of elements other ranks also get, though this step sends nothing
   * (Tree AllReduce's root): under a wire format it is kept as a compressed hop delivers it (prims.c) */
  uint8_t final_dst;
  uint8_t peers;  /* in/out are the per-peer connections of ranks in_peer/out_peer (set by the engine),
                   * not the op's own (its ring neighbours) */
  int in_peer, out_peer;
  /* combine (Owner): dst <- red_repro_combine of nslots contributions, slot q at slots + q * slot_stride
   * (premultiplied by their senders) but slot self, which is premul(src); nslots 0: dst <- dst (+)
   * premul(src) (Owner's streaming accumulation). No FIFO is touched. */
  uint8_t combine;
  int self, nslots;
  const char* slots;
  size_t slot_stride;
  const char* src;
  char* dst;
  size_t nelem;
};

struct prim_ctx {
  struct conn* in;
  struct conn* out;
  int proto;
  size_t esize;
  const struct red_op* red;
  int repro; /* the reproducible level (CH_REPRO_*) a combine step applies */
  char* scratch; /* >= largest LL/LL128 slot payload */
  int nt_dst; /* write final results (dst, not also sent) with streaming stores: a large output */
  /* Set when prim_try returns 0: what to sleep on (see prim_wait). */
  _Atomic uint64_t* wait_word;
  _Atomic uint32_t* wait_sleeping;
  uint64_t wait_seen;
  /* Wire format of the call (reduce/wire.h; 0: none, then Simple only): steps on a network connection
   * (every connection when wire_all) travel in it, and a value a rank produces and sends it keeps
   * rounded as the hop delivers it, so that every rank ends with the same bits. */
  uint8_t wire, wire_all;
  int wire_type; /* the call's ncclDataType_t */
  struct xfer_hdr hdr; /* this rank's call, sent with every step */
  uint32_t tag;        /* xfer_tag(&hdr): set when the call's sequence number is known */
};

/* Elements that fit in one step of `proto` with slots of `slot_bytes`. */
size_t prim_step_elems(int proto, size_t slot_bytes, size_t esize);
/* Payload bytes that fit in one slot of `proto` (scratch sizing). */
size_t prim_slot_payload(int proto, size_t slot_bytes);
/* Bytes a step of nelem elements puts on connection c: compressed where the call's wire format
 * applies to c (reduce/wire.h). Inline: the engine counts every step. */
size_t prim_wire_bytes(const struct prim_ctx* ctx, const struct conn* c, size_t nelem);
static inline size_t prim_bytes(const struct prim_ctx* ctx, const struct conn* c, size_t nelem) {
  return ctx->wire ? prim_wire_bytes(ctx, c, nelem) : nelem * ctx->esize;
}
/* 1: done; 0: must wait; PRIM_MISMATCH: the step that arrived was sent by a different call (nothing
 * of it was consumed; prim_their_hdr describes that call). */
#define PRIM_MISMATCH (-1)
int prim_try(struct prim_ctx* ctx, const struct prim* p);
/* Slow path of a blocked receive (call it when idle, not per poll): PRIM_MISMATCH if the peer posted
 * the step we wait for from a different call (e.g. with another protocol, or a different size), else 0. */
int prim_check(struct prim_ctx* ctx);
/* The header of the step waiting in ctx->in (after PRIM_MISMATCH). */
void prim_their_hdr(const struct prim_ctx* ctx, struct xfer_hdr* out);
/* Sleep until what blocked the last prim_try may have changed, or timeout_us passed. */
void prim_wait(struct prim_ctx* ctx, int timeout_us);

#endif
