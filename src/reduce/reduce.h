/* Element-wise kernels: type conversions and reductions for all twelve NCCL types.
 * 16- and 8-bit floats are converted to fp32, combined, and rounded once (round-to-nearest-even). */
#ifndef CH_REDUCE_H
#define CH_REDUCE_H

#include <stddef.h>
#include <stdint.h>

enum red_kind { RED_SUM = 0, RED_PROD = 1, RED_MAX = 2, RED_MIN = 3, RED_PREMULSUM = 4, RED_SUMPOSTDIV = 5 };

/* A reduction as the algorithms see it (built from ncclRedOp_t by the enqueue layer):
 *  - premul(x): applied to each rank's *local* contribution before it enters the reduction
 *    (identity unless kind == RED_PREMULSUM, where it multiplies by the scalar);
 *  - combine(a, b): sum/prod/max/min (PREMULSUM and SUMPOSTDIV combine by sum; integer sums and
 *    products wrap; float max/min follow fmaxf/fminf: a NaN loses to a number, see reduce.c);
 *  - postop(x): applied once to the final result (SUMPOSTDIV divides integers by `divisor`). */
struct red_op {
  int kind;     /* enum red_kind */
  int type;     /* ncclDataType_t */
  double scalar_f;  /* PREMULSUM scalar for floating types */
  int64_t scalar_i; /* PREMULSUM scalar for signed integer types (unsigned: reinterpret) */
  uint64_t divisor; /* SUMPOSTDIV */
};

size_t red_type_size(int type); /* 0 for an invalid type */
const char* red_type_name(int type); /* nccl-tests names (misc/names.h): "float", "half", ...; "invalid" */
int red_type_is_float(int type);

/* dst[i] = combine(in[i], premul(local[i])). dst may alias in or local. */
void red_reduce(const struct red_op* op, void* dst, const void* in, const void* local, size_t n);
/* dst <- src with streaming stores (no read of dst lines first). For large results: on x86 saves a
 * third of the memory traffic of writing them; elsewhere a memcpy. red_nt_fence must follow
 * before the data is published to another thread. */
void red_nt_copy(void* dst, const void* src, size_t bytes);
void red_nt_fence(void);
/* dst[i] = premul(src[i]) (a plain copy when premul is the identity). dst may alias src. */
void red_premul(const struct red_op* op, void* dst, const void* src, size_t n);
/* dst[i] = postop(src[i]) (a plain copy when postop is the identity). dst may alias src. */
void red_postop(const struct red_op* op, void* dst, const void* src, size_t n);
/* True when postop is not the identity. */
int red_has_postop(const struct red_op* op);
int red_has_premul(const struct red_op* op);

/* Bulk conversions between fp32 and a 16- or 8-bit float type (or float itself: a copy), with the
 * same results as the scalar ones below; vectorised where the CPU allows. dst and src must not
 * overlap. Other types: nothing is written. */
void red_to_float(int type, float* dst, const void* src, size_t n);
void red_from_float(int type, void* dst, const float* src, size_t n);

/* Scalar conversions (round to nearest even; NaN/Inf preserved; e4m3 saturates to +-448 as NCCL's
 * satfinite conversion does, e5m2 overflows to Inf). */
float red_half_to_float(uint16_t h);
uint16_t red_float_to_half(float f);
float red_bf16_to_float(uint16_t h);
uint16_t red_float_to_bf16(float f);
float red_e4m3_to_float(uint8_t v);
uint8_t red_float_to_e4m3(float f);
float red_e5m2_to_float(uint8_t v);
uint8_t red_float_to_e5m2(float f);

/* Reproducible reductions (reduce/repro.c, docs/REPRODUCIBLE.md): levels as CHORUS_REPRODUCIBLE and
 * chorusCommSetReproducible number them. */
enum { CH_REPRO_OFF = 0, CH_REPRO_ORDER = 1, CH_REPRO_EXACT = 2 };
/* One rank's contribution to a block: its elements, and the reduction whose premul applies to them
 * (NULL: taken as they are, e.g. premultiplied by the rank that sent them). */
struct red_contrib {
  const void* p;
  const struct red_op* premul;
};
/* dst[i] = the combination of in[0..n)[i], rank 0 first, as `level` defines it for op's kind and
 * (floating) type; op's postop included (SUMPOSTDIV: EXACT divides the exact sum). dst may be one of
 * the inputs (the same elements). Returns 0, having written nothing, only when more than 64 ranks need
 * a few KiB of heap that malloc refused: the caller tries again later. */
int red_repro_combine(int level, const struct red_op* op, void* dst, const struct red_contrib* in, int n,
                       size_t count);

/* The reduction of one rank's data leaves it as it is (a one-rank call is then a copy, or nothing in
 * place): every kind but a PreMulSum whose scalar is not 1 (a float average over one rank is a
 * PreMulSum by 1). */
static inline int red_keeps_one(const struct red_op* r) {
  return r->kind != RED_PREMULSUM || (red_type_is_float(r->type) ? r->scalar_f == 1.0 : r->scalar_i == 1);
}

#endif
