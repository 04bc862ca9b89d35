/* Reproducible combination of all ranks' contributions to one block (docs/REPRODUCIBLE.md). The
 * algorithms that honour a level (algo/owner.c, algo/direct_allreduce.c) hold every rank's value of
 * an element at one place and call this, so the result depends on the values and the rank count only:
 *  - ORDER: rank 0's value, then rank 1's, ... combined left to right in the type's accumulation type
 *    (fp32 for the 16- and 8-bit types, rounded once at the end; the type itself for fp32 and fp64).
 *  - EXACT (sum, premulsum, avg): the exact sum held as an integer in units of its smallest term's
 *    last bit (an __int128 when the terms span at most 120 bits, else a multiword integer), rounded
 *    once to nearest even, straight to the type (never through fp32: no double rounding). avg divides
 *    that integer by the rank count exactly first. Prod follows ORDER.
 *  - MAX/MIN (both levels): the largest/smallest value with -0 below +0; a NaN loses to any number
 *    (as fmax/fmin, NCCL's rule), all NaN gives the type's canonical NaN. Independent of order.
 * Bits are decoded with integer arithmetic: no FPU mode (FTZ/DAZ, rounding) can change an EXACT or
 * MAX/MIN result. ORDER adds in the FPU, like every other algorithm. */
#include <stdlib.h>
#include <string.h>

#include "nccl.h"
#include "reduce.h"
#include "reduce_impl.h"

/* Elements per block (the block of every rank's values stays in L1) and the block's bytes. */
#define REPRO_BLOCK_BYTES (32u << 10)
#define REPRO_MAX_BLOCK 256

/* IEEE-like binary formats: mantissa bits (without the hidden one), exponent bias, field width,
 * whether the all-ones exponent means Inf/NaN (e4m3fn has no Inf; only S.1111.111 is NaN), and the
 * canonical quiet NaN. */
struct fmt {
  int mbits, ebits, bias, bits, ieee;
  uint64_t qnan;
};
static int fmt_of(int type, struct fmt* f) {
  switch (type) {
    case ncclFloat64: *f = (struct fmt){52, 11, 1023, 64, 1, 0x7ff8000000000000ull}; return 1;
    case ncclFloat32: *f = (struct fmt){23, 8, 127, 32, 1, 0x7fc00000u}; return 1;
    case ncclFloat16: *f = (struct fmt){10, 5, 15, 16, 1, 0x7e00u}; return 1;
    case ncclBfloat16: *f = (struct fmt){7, 8, 127, 16, 1, 0x7fc0u}; return 1;
    case ncclFloat8e5m2: *f = (struct fmt){2, 5, 15, 8, 1, 0x7eu}; return 1;
    case ncclFloat8e4m3: *f = (struct fmt){3, 4, 7, 8, 0, 0x7fu}; return 1;
    default: return 0;
  }
}

static uint64_t load_bits(const void* p, size_t i, int bits) {
  const unsigned char* b = (const unsigned char*)p;
  switch (bits) {
    case 64: { uint64_t v; memcpy(&v, b + 8 * i, 8); return v; }
    case 32: { uint32_t v; memcpy(&v, b + 4 * i, 4); return v; }
    case 16: { uint16_t v; memcpy(&v, b + 2 * i, 2); return v; }
    default: return b[i];
  }
}
static void store_bits(void* p, size_t i, int bits, uint64_t v) {
  unsigned char* b = (unsigned char*)p;
  switch (bits) {
    case 64: memcpy(b + 8 * i, &v, 8); break;
    case 32: { uint32_t w = (uint32_t)v; memcpy(b + 4 * i, &w, 4); break; }
    case 16: { uint16_t w = (uint16_t)v; memcpy(b + 2 * i, &w, 2); break; }
    default: b[i] = (unsigned char)v; break;
  }
}

enum { V_ZERO, V_FINITE, V_INF, V_NAN };
struct val {
  int cls, neg;
  uint64_t man; /* significand with its hidden bit: value = man * 2^lsb */
  int lsb;
};
static struct val decode(const struct fmt* f, uint64_t u) {
  struct val v = {V_ZERO, (int)((u >> (f->bits - 1)) & 1), 0, 0};
  uint64_t e = (u >> f->mbits) & ((1ull << f->ebits) - 1), m = u & ((1ull << f->mbits) - 1);
  uint64_t emax = (1ull << f->ebits) - 1;
  if (f->ieee && e == emax) {
    v.cls = m ? V_NAN : V_INF;
    return v;
  }
  if (!f->ieee && e == emax && m == (1ull << f->mbits) - 1) {
    v.cls = V_NAN;
    return v;
  }
  if (e == 0 && m == 0) return v;
  v.cls = V_FINITE;
  v.man = e ? m | 1ull << f->mbits : m;
  v.lsb = (e ? (int)e : 1) - f->bias - f->mbits;
  return v;
}

static int bitlen64(uint64_t x) { return x ? 64 - __builtin_clzll(x) : 0; }

/* A nonnegative integer of 32-bit digits (least significant first), value = digits * 2^lo. */
#define MW_DIGITS 80 /* 2560 bits: fp64's 2098-bit span, 96 bits for a quotient, carries */
struct mw {
  uint32_t d[MW_DIGITS];
  int n, lo;
};

static int bitlen128(unsigned __int128 x) {
  uint64_t h = (uint64_t)(x >> 64);
  return h ? 64 + bitlen64(h) : bitlen64((uint64_t)x);
}

/* Round a * 2^lo (a > 0; sticky: nonzero bits already dropped below it) to the format, to nearest
 * even, magnitude only (the caller applies the sign). Overflow gives Inf (e4m3fn: the largest finite,
 * 448, as its satfinite conversion does everywhere in Chorus). */
static uint64_t round_u128(const struct fmt* f, unsigned __int128 a, int lo, int sticky) {
  int p = f->mbits + 1, emin_lsb = 1 - f->bias - f->mbits;
  int r = bitlen128(a) - 1 + lo - (p - 1); /* exponent of the result's last bit */
  if (r < emin_lsb) r = emin_lsb;
  int sh = r - lo; /* bits of a below the result's last bit */
  uint64_t q;
  int guard;
  if (sh <= 0) {
    q = (uint64_t)(a << -sh), guard = 0; /* fewer than p bits: exact */
  } else if (sh > 128) {
    q = 0, guard = 0, sticky = 1;
  } else {
    q = sh == 128 ? 0 : (uint64_t)(a >> sh);
    guard = (int)((a >> (sh - 1)) & 1);
    sticky |= sh > 1 && (a & (((unsigned __int128)1 << (sh - 1)) - 1)) != 0;
  }
  if (guard && (sticky || (q & 1))) q++;
  if (q >> p) q >>= 1, r++; /* the carry made it 2^p: exact after the shift */
  uint64_t hidden = 1ull << f->mbits, emax = (1ull << f->ebits) - 1;
  uint64_t e = q >= hidden ? (uint64_t)(r - emin_lsb + 1) : 0;
  uint64_t bits = e << f->mbits | (q & (hidden - 1));
  if (f->ieee && e >= emax) return emax << f->mbits; /* Inf */
  if (!f->ieee && (e > emax || bits == (emax << f->mbits | (hidden - 1))))
    return emax << f->mbits | (hidden - 2); /* e4m3fn: 448 */
  return bits;
}

/* Round a multiword m: its top 128 bits from a 32-bit boundary at least 64 bits below its leading
 * one, the rest folded into sticky. */
static uint64_t round_mw(const struct fmt* f, const struct mw* m, int sticky) {
  int top = m->n - 1;
  while (top > 0 && !m->d[top]) top--;
  int msb = top * 32 + bitlen64(m->d[top]) - 1;
  int w = msb < 64 ? 0 : (msb - 64) / 32; /* first digit of the window */
  unsigned __int128 a = 0;
  for (int j = 3; j >= 0; j--) a = a << 32 | (w + j < m->n ? m->d[w + j] : 0);
  for (int i = 0; i < w && !sticky; i++) sticky = m->d[i] != 0;
  return round_u128(f, a, m->lo + 32 * w, sticky);
}

/* Divide m by d (exactly, keeping 96 more bits below it); returns whether a remainder was left. */
static int div_mw(struct mw* m, uint64_t d) {
  memmove(m->d + 3, m->d, sizeof(uint32_t) * (size_t)m->n);
  m->d[0] = m->d[1] = m->d[2] = 0;
  m->n += 3, m->lo -= 96;
  uint64_t rem = 0;
  for (int i = m->n - 1; i >= 0; i--) {
    uint64_t cur = rem << 32 | m->d[i];
    m->d[i] = (uint32_t)(cur / d);
    rem = cur % d;
  }
  return rem != 0;
}

/* One element of EXACT sum. v[0..n) are the contributions' bits. */
static uint64_t exact_one(const struct fmt* f, const uint64_t* v, int n, uint64_t divisor) {
  int nan = 0, pinf = 0, ninf = 0, allneg0 = 1, any = 0, lo = 0, hi = 0;
  for (int k = 0; k < n; k++) {
    struct val x = decode(f, v[k]);
    if (!(x.cls == V_ZERO && x.neg)) allneg0 = 0;
    if (x.cls == V_NAN) nan = 1;
    else if (x.cls == V_INF) *(x.neg ? &ninf : &pinf) = 1;
    else if (x.cls == V_FINITE) {
      int top = x.lsb + bitlen64(x.man);
      if (!any || x.lsb < lo) lo = x.lsb;
      if (!any || top > hi) hi = top;
      any = 1;
    }
  }
  uint64_t sign = 1ull << (f->bits - 1);
  if (nan || (pinf && ninf)) return f->qnan;
  if (pinf || ninf) return (ninf ? sign : 0) | ((1ull << f->ebits) - 1) << f->mbits;
  if (!any) return allneg0 ? sign : 0;
  struct mw m;
  int neg;
  if (hi - lo + bitlen64((uint64_t)n) < 120) { /* the common case: the terms fit one __int128 */
    __int128 acc = 0;
    for (int k = 0; k < n; k++) {
      struct val x = decode(f, v[k]);
      if (x.cls != V_FINITE) continue;
      __int128 t = (__int128)x.man << (x.lsb - lo);
      acc += x.neg ? -t : t;
    }
    if (acc == 0) return 0; /* exact cancellation: +0, as IEEE addition under RN gives */
    neg = acc < 0;
    unsigned __int128 a = neg ? -(unsigned __int128)acc : (unsigned __int128)acc;
    if (divisor <= 1) return (neg ? sign : 0) | round_u128(f, a, lo, 0);
    m.n = 4, m.lo = lo;
    for (int i = 0; i < 4; i++) m.d[i] = (uint32_t)(a >> (32 * i));
  } else { /* wide spread: positive and negative parts as multiword integers, carries deferred */
    uint64_t pos[MW_DIGITS] = {0}, negp[MW_DIGITS] = {0};
    int nd = (hi - lo + 63) / 32 + 2;
    for (int k = 0; k < n; k++) {
      struct val x = decode(f, v[k]);
      if (x.cls != V_FINITE) continue;
      int s = x.lsb - lo, w = s / 32, b = s % 32;
      unsigned __int128 t = (unsigned __int128)x.man << b; /* <= 53 + 31 bits */
      uint64_t* acc = x.neg ? negp : pos;
      for (int j = 0; j < 3 && w + j < nd; j++) acc[w + j] += (uint64_t)(uint32_t)(t >> (32 * j));
    }
    /* normalise both (each digit gathered fewer than 2^32 terms of < 2^32), then subtract */
    uint64_t cp = 0, cn = 0;
    for (int i = 0; i < nd; i++) {
      pos[i] += cp, cp = pos[i] >> 32, pos[i] &= 0xffffffffu;
      negp[i] += cn, cn = negp[i] >> 32, negp[i] &= 0xffffffffu;
    }
    int cmp = 0;
    for (int i = nd - 1; i >= 0 && !cmp; i--) cmp = pos[i] > negp[i] ? 1 : pos[i] < negp[i] ? -1 : 0;
    if (!cmp) return 0;
    neg = cmp < 0;
    const uint64_t* a = neg ? negp : pos;
    const uint64_t* b = neg ? pos : negp;
    int64_t borrow = 0;
    for (int i = 0; i < nd; i++) {
      int64_t d = (int64_t)a[i] - (int64_t)b[i] - borrow;
      borrow = d < 0;
      m.d[i] = (uint32_t)(d + (borrow ? (1ll << 32) : 0));
    }
    m.n = nd, m.lo = lo;
  }
  int sticky = divisor > 1 ? div_mw(&m, divisor) : 0;
  return (neg ? sign : 0) | round_mw(f, &m, sticky);
}

/* Total order key of a non-NaN value's bits: -0 below +0, magnitudes ordered by their bits. */
static uint64_t order_key(const struct fmt* f, uint64_t u) {
  uint64_t sign = 1ull << (f->bits - 1), all = sign | (sign - 1);
  return u & sign ? ~u & all : u | sign;
}

/* ---- EXACT's fast path for the types inside fp32 (fp32, bf16, fp16, fp8) -------------------------
 * When an element's nonzero terms are normal numbers whose exponents lie within 53 - p - log2(n)
 * binades of each other, their sum and every partial sum is exact in a double (the common case:
 * gradients span a few binades). The double is then rounded to the type with integer arithmetic.
 * Anything else (a subnormal term or result, Inf, NaN, a wider spread, an overflow, a quotient near
 * a tie) goes to exact_one. Same bits either way: both are the exact sum rounded once. Subnormal
 * terms are excluded so that DAZ cannot zero them; the adds are exact, so rounding modes do not
 * matter; FTZ could only touch subnormal results, which are excluded too. */

/* RN of d (exact, or for a quotient within half an ulp of a double) to the format, without branches so
 * that the loops calling it vectorise. Bit 63 set: the slow path must decide (the result is not normal
 * in the format, overflows, or near_tie and d is close to a midpoint: rounding the double again could
 * differ from rounding the exact quotient). An exact zero keeps IEEE's sign: -0 only from -0 terms. */
static inline uint64_t round_double(const struct fmt* f, double d, uint64_t near_tie) {
  const uint64_t sh = (uint64_t)(52 - f->mbits), half = 1ull << (sh - 1), hid = 1ull << f->mbits;
  const uint64_t emaxf = (1ull << f->ebits) - 1;
  const uint64_t maxfin = f->ieee ? ((emaxf - 1) << f->mbits | (hid - 1)) : (emaxf << f->mbits | (hid - 2));
  const uint64_t emin = (uint64_t)(1023 + 1 - f->bias); /* smallest double exponent field normal here */
  uint64_t u;
  memcpy(&u, &d, 8);
  uint64_t sign = u >> 63, E = (u >> 52) & 0x7ff, mant = u & ((1ull << 52) - 1), disc = mant & ((1ull << sh) - 1);
  uint64_t r = ((E - 1023 + (uint64_t)f->bias) << f->mbits) + ((mant + half - 1 + ((mant >> sh) & 1)) >> sh);
  uint64_t zero = (uint64_t)((u << 1) == 0);
  uint64_t tie = near_tie & (uint64_t)(disc + 1 >= half) & (uint64_t)(disc <= half + 1);
  uint64_t ok = zero | ((uint64_t)(E >= emin) & (uint64_t)(r <= maxfin) & (tie ^ 1));
  return (sign << (f->bits - 1)) | (r & (zero - 1)) | ((ok ^ 1) << 63);
}

static inline double small_to_double(int type, uint64_t u) {
  switch (type) {
    case ncclFloat32: return (double)red_u2f((uint32_t)u);
    case ncclBfloat16: return (double)red_u2f((uint32_t)u << 16);
    case ncclFloat16: return (double)red_cv_half_to_float((uint16_t)u);
    case ncclFloat8e5m2: return (double)red_cv_e5m2_to_float((uint8_t)u);
    default: return (double)red_cv_e4m3_to_float((uint8_t)u);
  }
}

/* One block of EXACT sum/avg for a type inside fp32; always inlined with constant formats. Pass 1
 * runs over ranks, then elements, so that it vectorises: the double sums and each element's exponent
 * range and special terms. Pass 2 rounds each sum, or sends the element to exact_one. */
static inline __attribute__((always_inline)) void exact_block_small(int type, const struct fmt* f, void* dst,
                                                                    size_t at, const char** src, int n, size_t m,
                                                                    uint64_t divisor, uint64_t* v) {
  int logn = bitlen64((uint64_t)n);
  int span = 53 - (f->mbits + 1) - logn; /* widest exponent spread the double holds exactly */
  int pow2 = (divisor & (divisor - 1)) == 0;
  const uint32_t emask = (1u << f->ebits) - 1, mmask = (1u << f->mbits) - 1;
  _Alignas(64) double acc[REPRO_MAX_BLOCK];
  _Alignas(64) int32_t lo[REPRO_MAX_BLOCK], hi[REPRO_MAX_BLOCK], bad[REPRO_MAX_BLOCK];
  for (size_t i = 0; i < m; i++) acc[i] = -0.0, lo[i] = 1 << 30, hi[i] = 0, bad[i] = 0; /* -0: the identity */
  for (int k = 0; k < n; k++) {
    const char* p = src[k];
    for (size_t i = 0; i < m; i++) {
      uint32_t u = (uint32_t)load_bits(p, i, f->bits);
      int32_t e = (int32_t)((u >> f->mbits) & emask);
      uint32_t mt = u & mmask;
      int32_t special = f->ieee ? e == (int32_t)emask : (e == (int32_t)emask && mt == mmask); /* Inf, NaN */
      bad[i] |= special | (e == 0 && mt != 0); /* subnormal terms: DAZ must not see them */
      int32_t el = e ? e : 1 << 30;
      lo[i] = el < lo[i] ? el : lo[i];
      hi[i] = e > hi[i] ? e : hi[i];
    }
    /* a loop of its own: the conversion chain keeps the loop above from vectorising otherwise */
    for (size_t i = 0; i < m; i++) acc[i] += small_to_double(type, (uint32_t)load_bits(p, i, f->bits));
  }
  _Alignas(64) uint64_t out[REPRO_MAX_BLOCK];
  for (size_t i = 0; i < m; i++) /* bit 63: the slow path (a special or subnormal term, a wide spread) */
    out[i] = (uint64_t)((bad[i] != 0) | (hi[i] != 0 && hi[i] - lo[i] > span)) << 63;
  if (divisor <= 1) { /* sums (a loop of their own: no division, which vectorises) */
    for (size_t i = 0; i < m; i++) out[i] |= round_double(f, acc[i], 0);
  } else { /* avg: the quotient rounded to a double first, so a midpoint nearby needs the slow path */
    const double dv = (double)divisor;
    for (size_t i = 0; i < m; i++) out[i] |= round_double(f, acc[i] / dv, (uint64_t)!pow2);
  }
  for (size_t i = 0; i < m; i++) {
    uint64_t r = out[i];
    if (r >> 63) {
      for (int k = 0; k < n; k++) v[k] = load_bits(src[k], i, f->bits);
      r = exact_one(f, v, n, divisor);
    }
    store_bits(dst, at + i, f->bits, r);
  }
}

/* The formats as constants, so that each instance of exact_block_small is compiled for its own. */
#define EXACT_FAST_CASES(TYPE_CALL)                                                        \
  switch (type) {                                                                          \
    case ncclFloat32: TYPE_CALL(ncclFloat32, 23, 8, 127, 32, 1, 0x7fc00000u); return 1;    \
    case ncclBfloat16: TYPE_CALL(ncclBfloat16, 7, 8, 127, 16, 1, 0x7fc0u); return 1;       \
    case ncclFloat16: TYPE_CALL(ncclFloat16, 10, 5, 15, 16, 1, 0x7e00u); return 1;         \
    case ncclFloat8e5m2: TYPE_CALL(ncclFloat8e5m2, 2, 5, 15, 8, 1, 0x7eu); return 1;       \
    case ncclFloat8e4m3: TYPE_CALL(ncclFloat8e4m3, 3, 4, 7, 8, 0, 0x7fu); return 1;        \
    default: return 0;                                                                     \
  }
#define EXACT_FAST_CALL(T, MB, EB, BIAS, BITS, IEEE, QNAN)                                      \
  do {                                                                                          \
    static const struct fmt cf = {MB, EB, BIAS, BITS, IEEE, QNAN};                              \
    exact_block_small(T, &cf, dst, at, src, n, m, divisor, v);                                  \
  } while (0)

static int exact_fast_base(int type, void* dst, size_t at, const char** src, int n, size_t m, uint64_t divisor,
                           uint64_t* v) {
  EXACT_FAST_CASES(EXACT_FAST_CALL)
}
#if defined(__x86_64__)
/* The same loops with AVX2 (no FMA: the adds are exact anyway), chosen at run time as the kernels are. */
RED_TARGET_AVX2 static int exact_fast_avx2(int type, void* dst, size_t at, const char** src, int n, size_t m,
                                           uint64_t divisor, uint64_t* v) {
  EXACT_FAST_CASES(EXACT_FAST_CALL)
}
#endif
static int exact_fast(int type, void* dst, size_t at, const char** src, int n, size_t m, uint64_t divisor,
                      uint64_t* v) {
#if defined(__x86_64__)
  if (red_simd_level()) return exact_fast_avx2(type, dst, at, src, n, m, divisor, v);
#endif
  return exact_fast_base(type, dst, at, src, n, m, divisor, v);
}

static uint64_t maxmin_one(const struct fmt* f, const uint64_t* v, int n, int is_max) {
  int found = 0;
  uint64_t best = 0, bk = 0;
  for (int k = 0; k < n; k++) {
    if (decode(f, v[k]).cls == V_NAN) continue;
    uint64_t key = order_key(f, v[k]);
    if (!found || (is_max ? key > bk : key < bk)) best = v[k], bk = key, found = 1;
  }
  return found ? best : f->qnan;
}

/* Contributions premultiplied where asked, into buf (n blocks of m elements); returns per-rank
 * pointers to read (buf's or the caller's). */
static void gather_block(const struct red_contrib* in, int n, size_t at, size_t m, size_t es, char* buf,
                         const char** src) {
  for (int k = 0; k < n; k++) {
    const char* p = (const char*)in[k].p + at * es;
    if (in[k].premul && red_has_premul(in[k].premul)) {
      red_premul(in[k].premul, buf + (size_t)k * m * es, p, m);
      p = buf + (size_t)k * m * es;
    }
    src[k] = p;
  }
}


static void combine_order(const struct red_op* op, void* dst, const struct red_contrib* in, int n, size_t count,
                          char* buf, const char** src) {
  size_t es = red_type_size(op->type);
  int lowp = op->type != ncclFloat32 && op->type != ncclFloat64;
  struct red_op acc_op = {.kind = op->kind == RED_PROD ? RED_PROD : RED_SUM, .type = lowp ? ncclFloat32 : op->type};
  size_t blk = REPRO_BLOCK_BYTES / ((size_t)n * es);
  blk = blk < 1 ? 1 : blk > REPRO_MAX_BLOCK ? REPRO_MAX_BLOCK : blk;
  _Alignas(64) float acc[REPRO_MAX_BLOCK], t[REPRO_MAX_BLOCK];
  _Alignas(64) char wide[REPRO_MAX_BLOCK * 8];
  for (size_t at = 0; at < count; at += blk) {
    size_t m = count - at < blk ? count - at : blk;
    gather_block(in, n, at, m, es, buf, src);
    if (lowp) {
      red_to_float(op->type, acc, src[0], m);
      for (int k = 1; k < n; k++) {
        red_to_float(op->type, t, src[k], m);
        red_reduce(&acc_op, acc, acc, t, m);
      }
      red_from_float(op->type, (char*)dst + at * es, acc, m);
    } else {
      /* accumulate in dst itself unless it holds a later rank's input (in place, as rank k > 0) */
      char* d = (char*)dst + at * es;
      int later = 0;
      for (int k = 1; k < n && !later; k++) later = !red_disjoint(d, src[k], m * es);
      char* acc_at = later ? wide : d;
      if (acc_at != src[0]) memcpy(acc_at, src[0], m * es);
      for (int k = 1; k < n; k++) red_reduce(&acc_op, acc_at, acc_at, src[k], m);
      if (later) memcpy(d, wide, m * es);
    }
  }
  if (op->kind == RED_SUMPOSTDIV && op->divisor > 1) red_postop(op, dst, dst, count);
}

int red_repro_combine(int level, const struct red_op* op, void* dst, const struct red_contrib* in, int n,
                      size_t count) {
  struct fmt f;
  int done = 0;
  if (!count || n < 1 || !fmt_of(op->type, &f)) return 1; /* integers never come here (exact already) */
  size_t es = red_type_size(op->type);
  /* premultiplied copies of one block of every rank: on the stack up to 32 KiB, else the heap */
  _Alignas(64) char stackbuf[REPRO_BLOCK_BYTES];
  const char* stack_src[64];
  size_t blk = REPRO_BLOCK_BYTES / ((size_t)n * es);
  blk = blk < 1 ? 1 : blk > REPRO_MAX_BLOCK ? REPRO_MAX_BLOCK : blk;
  char* buf = (size_t)n * blk * es <= sizeof(stackbuf) ? stackbuf : malloc((size_t)n * blk * es);
  const char** src = n <= 64 ? stack_src : malloc(sizeof(char*) * (size_t)n);
  uint64_t stack_v[64], *v = n <= 64 ? stack_v : malloc(sizeof(uint64_t) * (size_t)n);
  if (!buf || !src || !v) goto out;
  int kind = op->kind;
  if (kind == RED_MAX || kind == RED_MIN || (level == CH_REPRO_EXACT && kind != RED_PROD)) {
    uint64_t divisor = kind == RED_SUMPOSTDIV && op->divisor > 1 ? op->divisor : 1;
    for (size_t at = 0; at < count; at += blk) {
      size_t m = count - at < blk ? count - at : blk;
      gather_block(in, n, at, m, es, buf, src);
      if (kind != RED_MAX && kind != RED_MIN && n < 64 && exact_fast(op->type, dst, at, src, n, m, divisor, v))
        continue;
      for (size_t i = 0; i < m; i++) {
        for (int k = 0; k < n; k++) v[k] = load_bits(src[k], i, f.bits);
        uint64_t r = kind == RED_MAX || kind == RED_MIN ? maxmin_one(&f, v, n, kind == RED_MAX)
                                                         : exact_one(&f, v, n, divisor);
        store_bits(dst, at + i, f.bits, r);
      }
    }
  } else {
    combine_order(op, dst, in, n, count, buf, src);
  }
  done = 1;
out:
  if (buf != stackbuf) free(buf);
  if (src != stack_src) free((void*)src);
  if (v != stack_v) free(v);
  return done;
}
