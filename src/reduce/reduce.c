/* Element-wise reductions: type table, operator preparation and dispatch to the kernel families
 * (red_int.c, red_float.c, red_lowp.c). Semantics beyond reduce.h:
 *  - Integer SUM/PROD/PREMULSUM wrap modulo 2^bits (computed unsigned: no signed-overflow UB).
 *  - Float MAX/MIN follow fmaxf/fminf, as NCCL does: NaN is dropped when the other operand is a
 *    number, and NaN results only when both are NaN. SUM/PROD propagate NaN as IEEE does.
 *  - SUMPOSTDIV divides the final sum by `divisor`: integers truncate toward zero like C; float types
 *    (not used by NCCL's ncclAvg, which premultiplies by 1/nranks) divide in the compute type. A
 *    divisor of 0 or 1 makes postop the identity.
 *  - PREMULSUM's scalar is taken modulo 2^bits for integers and converted to the compute type for
 *    floats (fp32 for float and the 8/16-bit types, fp64 for double); when it equals 1 there, premul
 *    is the identity and the plain SUM kernels run.
 * Low-precision types compute in fp32 and round once per output element. */
#include <string.h>

#include "nccl.h"
#include "../misc/names.h"
#include "reduce.h"
#include "reduce_impl.h"

#define RED_TYPE_ROW_(v, name, test_name, bytes, is_float) [v] = {bytes, is_float},
static const struct {
  size_t size;
  int is_float;
} red_types[ncclNumTypes] = {CH_TYPE_LIST(RED_TYPE_ROW_)};
#undef RED_TYPE_ROW_

static int type_ok(int type) { return type >= 0 && type < ncclNumTypes; }

size_t red_type_size(int type) { return type_ok(type) ? red_types[type].size : 0; }
const char* red_type_name(int type) { return type_ok(type) ? ch_type_test_name(type) : "invalid"; }
int red_type_is_float(int type) { return type_ok(type) && red_types[type].is_float; }

enum fam { FAM_INT, FAM_FLOAT, FAM_LOWP };
static int family(int type) {
  if (!red_types[type].is_float) return FAM_INT;
  return type == ncclFloat32 || type == ncclFloat64 ? FAM_FLOAT : FAM_LOWP;
}

/* Premul scalar in the element's arithmetic is exactly 1. */
static int premul_is_identity(const struct red_op* op) {
  if (!red_types[op->type].is_float) {
    uint64_t s = (uint64_t)op->scalar_i, mask = red_types[op->type].size == 8 ? ~0ull
                                                 : (1ull << (8 * red_types[op->type].size)) - 1;
    return (s & mask) == 1;
  }
  if (op->type == ncclFloat64) return op->scalar_f == 1.0;
  return (float)op->scalar_f == 1.0f;
}

int red_has_premul(const struct red_op* op) {
  return op && type_ok(op->type) && op->kind == RED_PREMULSUM && !premul_is_identity(op);
}

int red_has_postop(const struct red_op* op) {
  return op && type_ok(op->type) && op->kind == RED_SUMPOSTDIV && op->divisor > 1;
}

static void prepare_scalar(const struct red_op* op, struct red_sc* sc) {
  if (op->kind == RED_PREMULSUM) {
    sc->i = (uint64_t)op->scalar_i;
    sc->f = (float)op->scalar_f;
    sc->d = op->scalar_f;
  } else {
    sc->i = op->divisor;
    sc->f = (float)op->divisor;
    sc->d = (double)op->divisor;
  }
}

void red_reduce(const struct red_op* op, void* dst, const void* in, const void* local, size_t n) {
  struct red_sc sc;
  int bop;
  if (n == 0 || !type_ok(op->type)) return; /* the enqueue layer validates types and ops */
  switch (op->kind) {
    case RED_SUM:
    case RED_SUMPOSTDIV: bop = RED_OP_SUM; break;
    case RED_PROD: bop = RED_OP_PROD; break;
    case RED_MAX: bop = RED_OP_MAX; break;
    case RED_MIN: bop = RED_OP_MIN; break;
    case RED_PREMULSUM: bop = red_has_premul(op) ? RED_OP_PREMUL : RED_OP_SUM; break;
    default: return;
  }
  prepare_scalar(op, &sc);
  switch (family(op->type)) {
    case FAM_INT: red_int_bin(op->type, bop)(dst, in, local, n, &sc); break;
    case FAM_FLOAT: red_float_bin(op->type, bop)(dst, in, local, n, &sc); break;
    default: red_lowp_bin(op->type, bop, dst, in, local, n, &sc); break;
  }
}

static void copy(void* dst, const void* src, size_t bytes) {
  if (dst != src && bytes) memmove(dst, src, bytes);
}

static void apply_unary(const struct red_op* op, red_un_fn int_fn, red_un_fn float_fn, void* dst,
                        const void* src, size_t n) {
  struct red_sc sc;
  prepare_scalar(op, &sc);
  switch (family(op->type)) {
    case FAM_INT: int_fn(dst, src, n, &sc); break;
    case FAM_FLOAT: float_fn(dst, src, n, &sc); break;
    default: red_lowp_un(op->type, float_fn, dst, src, n, &sc); break;
  }
}

void red_premul(const struct red_op* op, void* dst, const void* src, size_t n) {
  if (n == 0 || !type_ok(op->type)) return;
  if (!red_has_premul(op)) {
    copy(dst, src, n * red_types[op->type].size);
    return;
  }
  apply_unary(op, red_int_scale(op->type), red_float_scale(op->type), dst, src, n);
}

void red_postop(const struct red_op* op, void* dst, const void* src, size_t n) {
  if (n == 0 || !type_ok(op->type)) return;
  if (!red_has_postop(op)) {
    copy(dst, src, n * red_types[op->type].size);
    return;
  }
  apply_unary(op, red_int_div(op->type), red_float_div(op->type), dst, src, n);
}

void red_to_float(int type, float* dst, const void* src, size_t n) {
  if (n == 0) return;
  if (type == ncclFloat32) {
    copy(dst, src, n * sizeof(float));
    return;
  }
  red_dec_fn f = red_lowp_dec(type);
  if (f) f(dst, src, n);
}

void red_from_float(int type, void* dst, const float* src, size_t n) {
  if (n == 0) return;
  if (type == ncclFloat32) {
    copy(dst, src, n * sizeof(float));
    return;
  }
  red_enc_fn f = red_lowp_enc(type);
  if (f) f(dst, src, n);
}
