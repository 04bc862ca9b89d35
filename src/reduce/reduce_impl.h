/* Internals shared by the element-wise kernel files (reduce.c, convert.c, red_*.c).
 *
 * Kernel model: every binary kernel computes d[i] = combine(a[i], premul(b[i])) where b is the
 * *local* operand; the aliasing dispatch (RED_BIN_DEFINE) picks a restrict-qualified loop for the
 * disjoint case, for d == a and for d == b, so that GCC vectorises all three without runtime alias
 * checks. Partial overlaps (not allowed by reduce.h) fall back to a plain loop. */
#ifndef CH_REDUCE_IMPL_H
#define CH_REDUCE_IMPL_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

/* The reduction's scalar in the forms kernels need (prepared once per call by reduce.c). */
struct red_sc {
  uint64_t i; /* integer premul scalar (wrapping), or the SUMPOSTDIV divisor */
  float f;    /* premul scalar / divisor for 8-, 16- and 32-bit floats */
  double d;   /* premul scalar / divisor for double */
};

typedef void (*red_bin_fn)(void* d, const void* a, const void* b, size_t n, const struct red_sc* sc);
typedef void (*red_un_fn)(void* d, const void* a, size_t n, const struct red_sc* sc);

/* Binary operators, indexed as below (PREMULSUM: a + b*s; SUMPOSTDIV combines with OP_SUM). */
enum { RED_OP_SUM = 0, RED_OP_PROD, RED_OP_MAX, RED_OP_MIN, RED_OP_PREMUL, RED_NOPS };

/* Per-family kernel tables (red_int.c, red_float.c, red_lowp.c). Index by ncclDataType_t. */
red_bin_fn red_int_bin(int type, int op);
red_un_fn red_int_scale(int type); /* d = a * s (wrapping) */
red_un_fn red_int_div(int type);   /* d = a / divisor, truncating toward zero */
red_bin_fn red_float_bin(int type, int op); /* float, double */
red_un_fn red_float_scale(int type);
red_un_fn red_float_div(int type);
/* 16- and 8-bit floats: fused AVX2 kernels on x86-64 (red_x86.c); elsewhere decode blocks to fp32,
 * run the fp32 kernel, encode once. */
void red_lowp_bin(int type, int op, void* d, const void* a, const void* b, size_t n, const struct red_sc* sc);
void red_lowp_un(int type, red_un_fn f32fn, void* d, const void* a, size_t n, const struct red_sc* sc);

/* Bulk conversions for the low-precision types (x86: F16C/AVX2 when available). */
typedef void (*red_dec_fn)(float* restrict out, const void* restrict in, size_t n);
typedef void (*red_enc_fn)(void* restrict out, const float* restrict in, size_t n);
red_dec_fn red_lowp_dec(int type);
red_enc_fn red_lowp_enc(int type);
/* Tests: force the portable (non-SIMD-dispatched) kernels and conversions. */
void red_force_portable(int on);
/* 1 when the AVX2 (x86-64) variants of the kernels are to be used, else 0. */
int red_simd_level(void);

/* The int/float kernel files instantiate their loops twice: baseline and, on x86-64, AVX2 (without
 * FMA, so that results do not depend on the variant). Selected at run time with the AVX2+F16C test
 * of red_x86.c. */
#if defined(__x86_64__)
#define RED_TARGET_AVX2 __attribute__((target("avx2")))
#define RED_NVARIANTS 2
#else
#define RED_NVARIANTS 1
#endif

#if defined(__x86_64__)
/* red_x86.c; return NULL when the CPU lacks AVX2+F16C or the type has no accelerated version. */
int red_x86_level(void);
red_dec_fn red_x86_dec(int type);
red_enc_fn red_x86_enc(int type);
red_bin_fn red_x86_bin(int type, int op); /* fused d = combine(a, premul(b)) */
#endif

/* ---- aliasing dispatch ------------------------------------------------------------------------ */

static inline int red_disjoint(const void* p, const void* q, size_t bytes) {
  uintptr_t a = (uintptr_t)p, b = (uintptr_t)q;
  return a + bytes <= b || b + bytes <= a;
}

/* Defines `static void name(void* d, const void* a, const void* b, size_t n, const struct red_sc*)`.
 * EXPR computes the result from `a`, `b` (elements of type T) and `s` (the scalar, type S taken
 * from sc->FIELD). ATTR (may be empty) goes on the loops, e.g. RED_TARGET_AVX2. */
#define RED_BIN_DEFINE(name, T, S, FIELD, EXPR, ATTR)                                              \
  ATTR static void name##_dis(T* restrict dp, const T* restrict ap, const T* restrict bp, size_t n, \
                         S s) {                                                                    \
    (void)s;                                                                                       \
    for (size_t i = 0; i < n; i++) { T a = ap[i], b = bp[i]; dp[i] = (T)(EXPR); }                  \
  }                                                                                                \
  ATTR static void name##_ina(T* restrict dp, const T* restrict bp, size_t n, S s) {               \
    (void)s;                                                                                       \
    for (size_t i = 0; i < n; i++) { T a = dp[i], b = bp[i]; dp[i] = (T)(EXPR); }                  \
  }                                                                                                \
  ATTR static void name##_inb(T* restrict dp, const T* restrict ap, size_t n, S s) {               \
    (void)s;                                                                                       \
    for (size_t i = 0; i < n; i++) { T a = ap[i], b = dp[i]; dp[i] = (T)(EXPR); }                  \
  }                                                                                                \
  ATTR static void name##_gen(T* dp, const T* ap, const T* bp, size_t n, S s) {                    \
    (void)s;                                                                                       \
    for (size_t i = 0; i < n; i++) { T a = ap[i], b = bp[i]; dp[i] = (T)(EXPR); }                  \
  }                                                                                                \
  static void name(void* d, const void* a, const void* b, size_t n, const struct red_sc* sc) {     \
    size_t bytes = n * sizeof(T);                                                                  \
    if (d == a && d != b)                                                                          \
      name##_ina((T*)d, (const T*)b, n, (S)sc->FIELD);                                             \
    else if (d == b && d != a)                                                                     \
      name##_inb((T*)d, (const T*)a, n, (S)sc->FIELD);                                             \
    else if (red_disjoint(d, a, bytes) && red_disjoint(d, b, bytes))                               \
      name##_dis((T*)d, (const T*)a, (const T*)b, n, (S)sc->FIELD);                                \
    else                                                                                           \
      name##_gen((T*)d, (const T*)a, (const T*)b, n, (S)sc->FIELD);                                \
  }

/* Same for unary kernels d[i] = EXPR(a, s): in place or disjoint. */
#define RED_UN_DEFINE(name, T, S, FIELD, EXPR, ATTR)                                               \
  ATTR static void name##_dis(T* restrict dp, const T* restrict ap, size_t n, S s) {               \
    for (size_t i = 0; i < n; i++) { T a = ap[i]; dp[i] = (T)(EXPR); }                             \
  }                                                                                                \
  ATTR static void name##_in(T* restrict dp, size_t n, S s) {                                      \
    for (size_t i = 0; i < n; i++) { T a = dp[i]; dp[i] = (T)(EXPR); }                             \
  }                                                                                                \
  ATTR static void name##_gen(T* dp, const T* ap, size_t n, S s) {                                 \
    for (size_t i = 0; i < n; i++) { T a = ap[i]; dp[i] = (T)(EXPR); }                             \
  }                                                                                                \
  static void name(void* d, const void* a, size_t n, const struct red_sc* sc) {                    \
    if (d == a)                                                                                    \
      name##_in((T*)d, n, (S)sc->FIELD);                                                           \
    else if (red_disjoint(d, a, n * sizeof(T)))                                                    \
      name##_dis((T*)d, (const T*)a, n, (S)sc->FIELD);                                             \
    else                                                                                           \
      name##_gen((T*)d, (const T*)a, n, (S)sc->FIELD);                                             \
  }

/* Float max/min with fmaxf/fminf semantics (as NCCL's FuncMax/FuncMin on floats): when exactly one
 * operand is NaN the other is returned; NaN only when both are. Written with comparisons so that
 * GCC vectorises it (a call to fmaxf would not be, without -ffast-math). */
#define RED_FMAX(a, b) (((a) > (b) || (b) != (b)) ? (a) : (b))
#define RED_FMIN(a, b) (((a) < (b) || (b) != (b)) ? (a) : (b))

/* ---- scalar conversions (convert.c exports them; the portable bulk loops inline them) ----------
 * Narrowing: round to nearest even with integer arithmetic on the fp32 bits, independent of the
 * FPU rounding mode and of FTZ/DAZ. See convert.c for the special-value rules. Written without
 * branches (both paths computed, then selected) so that loops over them vectorise where the ISA
 * has per-lane shifts (AVX2, NEON). */

static inline uint32_t red_f2u(float f) {
  uint32_t u;
  memcpy(&u, &f, sizeof u);
  return u;
}
static inline float red_u2f(uint32_t u) {
  float f;
  memcpy(&f, &u, sizeof f);
  return f;
}

/* Round x >> sh to nearest even (1 <= sh <= 31). */
static inline uint32_t red_rne_shift(uint32_t x, uint32_t sh) {
  return (x + (1u << (sh - 1)) - 1u + ((x >> sh) & 1u)) >> sh;
}

/* Round |x| (fp32 bits `a`, not NaN) to a format with `man` mantissa bits and exponent bias `bias`.
 * Returns exponent|mantissa bits before overflow handling: a value at or past the format's
 * Inf/NaN encoding means overflow.
 *  - normal result (|x| >= 2^(1-bias)): rebias the exponent in place and round the mantissa; a
 *    carry out of the mantissa correctly bumps the exponent.
 *  - subnormal result: the significand with its implicit bit, in units of the smallest subnormal,
 *    is m >> sh; a carry into bit `man` gives the smallest normal, as it should. sh is clamped to
 *    31, where every m (< 2^24) rounds to 0; fp32 subnormals (exponent 0) land there too. */
static inline uint32_t red_round_mag(uint32_t a, int man, int bias) {
  uint32_t exp = a >> 23;
  uint32_t rn = red_rne_shift(a - ((uint32_t)(127 - bias) << 23), (uint32_t)(23 - man));
  int32_t sh = (23 - man) + (127 + 1 - bias) - (int32_t)exp;
  uint32_t shc = sh < 1 ? 1u : sh > 31 ? 31u : (uint32_t)sh;
  uint32_t rs = red_rne_shift((a & 0x7fffffu) | 0x800000u, shc);
  return exp >= (uint32_t)(128 - bias) ? rn : rs;
}

static inline float red_cv_half_to_float(uint16_t h) {
  uint32_t sign = (uint32_t)(h & 0x8000u) << 16, em = h & 0x7fffu;
  uint32_t norm = (em << 13) + (112u << 23);               /* rebias 15 -> 127 */
  uint32_t spec = norm + (112u << 23);                     /* exponent 31 -> 255: Inf/NaN, payload kept */
  uint32_t sub = red_f2u((float)(int32_t)em * 0x1p-24f);   /* exact, and a normal fp32 */
  uint32_t is_spec = 0u - (uint32_t)(em >= 0x7c00u), is_norm = 0u - (uint32_t)(em >= 0x400u);
  /* Mask arithmetic rather than ?: so that GCC does not turn the selection into branches. */
  return red_u2f(sign | (spec & is_spec) | (norm & is_norm & ~is_spec) | (sub & ~is_norm));
}

static inline uint16_t red_cv_float_to_half(float f) {
  uint32_t u = red_f2u(f), a = u & 0x7fffffffu, sign = (u >> 16) & 0x8000u;
  uint32_t r = red_round_mag(a, 10, 15);
  r = r >= 0x7c00u ? 0x7c00u : r;                          /* overflow: Inf */
  uint32_t nan = 0x7e00u | ((a >> 13) & 0x3ffu);           /* quiet, top payload bits */
  return (uint16_t)(sign | (a > 0x7f800000u ? nan : r));
}

static inline float red_cv_bf16_to_float(uint16_t h) { return red_u2f((uint32_t)h << 16); }

static inline uint16_t red_cv_float_to_bf16(float f) {
  uint32_t u = red_f2u(f);
  /* fp32's exponent range: rounding off 16 bits is all; the carry handles overflow to Inf. */
  uint32_t r = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
  return (uint16_t)((u & 0x7fffffffu) > 0x7f800000u ? (u >> 16) | 0x40u : r);
}

static inline float red_cv_e5m2_to_float(uint8_t v) { return red_cv_half_to_float((uint16_t)(v << 8)); }

static inline uint8_t red_cv_float_to_e5m2(float f) {
  uint32_t u = red_f2u(f), a = u & 0x7fffffffu, sign = (u >> 24) & 0x80u;
  uint32_t r = red_round_mag(a, 2, 15);
  r = r >= 0x7cu ? 0x7cu : r;                              /* overflow: Inf */
  uint32_t nan = 0x7eu | ((a >> 21) & 0x3u);
  return (uint8_t)(sign | (a > 0x7f800000u ? nan : r));
}

static inline float red_cv_e4m3_to_float(uint8_t v) {
  uint32_t sign = (uint32_t)(v & 0x80u) << 24, m = v & 0x7fu;
  uint32_t norm = (m << 20) + (120u << 23);                /* rebias 7 -> 127 */
  uint32_t sub = red_f2u((float)(int32_t)m * 0x1p-9f);
  uint32_t is_nan = 0u - (uint32_t)(m == 0x7fu), is_norm = 0u - (uint32_t)(m >= 8u);
  return red_u2f(sign | (0x7fc00000u & is_nan) | (norm & is_norm & ~is_nan) | (sub & ~is_norm));
}

static inline uint8_t red_cv_float_to_e4m3(float f) {
  uint32_t u = red_f2u(f), a = u & 0x7fffffffu, sign = (u >> 24) & 0x80u;
  uint32_t r = red_round_mag(a, 3, 7);
  r = r > 0x7eu ? 0x7eu : r;                               /* satfinite: overflow and Inf give 448 */
  return (uint8_t)(sign | (a > 0x7f800000u ? 0x7fu : r));
}

#endif
