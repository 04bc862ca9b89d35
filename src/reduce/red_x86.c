/* x86-64 kernels for the 16- and 8-bit float types, compiled for AVX2+F16C with function-level
 * target attributes and chosen at run time (the library still runs on any x86-64 CPU).
 *
 * Each type has an 8-lane load (widen to fp32) and store (round to the type, nearest even), used
 * both by the bulk conversions and by fused reduce kernels that do load, combine, store in one pass
 * (no fp32 scratch traffic: these are the inner loops for half/bf16 sums on large buffers). Tails
 * go through a padded stack buffer with the same code, so every element gets the same arithmetic.
 * Results equal the scalar routines of reduce_impl.h bit for bit (tests compare them):
 *  - half: F16C vcvtph2ps / vcvtps2ph with an explicit round-to-nearest-even immediate.
 *  - bf16: integer rounding of the fp32 bits.
 *  - fp8: normal results by integer rounding of the fp32 bits; subnormal results by scaling to
 *    units of the smallest subnormal (exact) and vroundps with an explicit nearest-even mode, so
 *    nothing depends on MXCSR's rounding mode. */
#if defined(__x86_64__)
#include <cpuid.h>
#include <immintrin.h>

#include "nccl.h"
#include "reduce_impl.h"

#define RED_AVX2 __attribute__((target("avx2,f16c"))) static inline
#define RNE (_MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC)
#define I32(x) _mm256_set1_epi32((int)(x))

/* ---- 8-lane loads and stores ------------------------------------------------------------------ */

RED_AVX2 __m256 ld_half(const void* p) { return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i*)p)); }
RED_AVX2 void st_half(void* p, __m256 v) { _mm_storeu_si128((__m128i*)p, _mm256_cvtps_ph(v, RNE)); }

RED_AVX2 __m256 ld_bf16(const void* p) {
  __m256i w = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i*)p));
  return _mm256_castsi256_ps(_mm256_slli_epi32(w, 16));
}
/* Round each lane to bf16, leaving it in the high 16 bits (low bits: garbage). NaN: quieted, top
 * payload bits kept. */
RED_AVX2 __m256i bf16_round_hi(__m256 v) {
  __m256i u = _mm256_castps_si256(v);
  __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(u, 16), I32(1));
  __m256 r = _mm256_castsi256_ps(_mm256_add_epi32(_mm256_add_epi32(u, I32(0x7fff)), lsb));
  __m256 qnan = _mm256_castsi256_ps(_mm256_or_si256(u, I32(0x400000)));
  return _mm256_castps_si256(_mm256_blendv_ps(r, qnan, _mm256_cmp_ps(v, v, _CMP_UNORD_Q)));
}
RED_AVX2 void st_bf16(void* p, __m256 v) {
  __m256i r = _mm256_srli_epi32(bf16_round_hi(v), 16);
  __m256i q = _mm256_permute4x64_epi64(_mm256_packus_epi32(r, r), 0x08);
  _mm_storeu_si128((__m128i*)p, _mm256_castsi256_si128(q));
}

/* e5m2 is the top byte of a half. */
RED_AVX2 __m256 ld_e5m2(const void* p) {
  __m128i b = _mm_loadl_epi64((const __m128i*)p);
  return _mm256_cvtph_ps(_mm_slli_epi16(_mm_cvtepu8_epi16(b), 8));
}
/* e4m3's magnitude bits shifted left by 7 and read as a half are the value times 2^-8 (subnormals
 * too: both formats put them at exponent field 0), so scale by 256 exactly. S.1111.111 (NaN) would
 * read as 1.875: or-ing 0x7e00 into it makes it a quiet half NaN instead (same sign). */
RED_AVX2 __m256 ld_e4m3(const void* p) {
  __m128i w = _mm_cvtepu8_epi16(_mm_loadl_epi64((const __m128i*)p));
  __m128i m = _mm_and_si128(w, _mm_set1_epi16(0x7f));
  __m128i nan = _mm_and_si128(_mm_cmpeq_epi16(m, _mm_set1_epi16(0x7f)), _mm_set1_epi16(0x7e00));
  __m128i h = _mm_or_si128(_mm_or_si128(_mm_slli_epi16(m, 7), nan),
                           _mm_slli_epi16(_mm_and_si128(w, _mm_set1_epi16(0x80)), 8));
  return _mm256_mul_ps(_mm256_cvtph_ps(h), _mm256_set1_ps(256.0f));
}

/* fp32 -> fp8 magnitude bits before overflow handling (see red_round_mag): MAN mantissa bits,
 * BIAS exponent bias, SUBSCALE = 2^(BIAS - 1 + MAN) converts to units of the smallest subnormal. */
RED_AVX2 __m256i fp8_round(__m256i a, int man, int bias, float subscale) {
  const int sn = 23 - man;
  __m256i mn = _mm256_sub_epi32(a, I32((127 - bias) << 23));
  __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(mn, sn), I32(1));
  __m256i rn = _mm256_srli_epi32(_mm256_add_epi32(_mm256_add_epi32(mn, I32((1 << (sn - 1)) - 1)), lsb), sn);
  __m256 q = _mm256_round_ps(_mm256_mul_ps(_mm256_castsi256_ps(a), _mm256_set1_ps(subscale)), RNE);
  __m256i rs = _mm256_cvttps_epi32(q);
  __m256i normal = _mm256_cmpgt_epi32(a, I32(((128 - bias) << 23) - 1));
  return _mm256_blendv_epi8(rs, rn, normal);
}
/* 8 x int32 (0..255) -> 8 bytes. */
RED_AVX2 void st_bytes(void* p, __m256i r) {
  __m256i w = _mm256_packus_epi16(_mm256_packus_epi32(r, r), _mm256_setzero_si256());
  __m256i q = _mm256_permutevar8x32_epi32(w, _mm256_setr_epi32(0, 4, 0, 0, 0, 0, 0, 0));
  _mm_storel_epi64((__m128i*)p, _mm256_castsi256_si128(q));
}
RED_AVX2 void st_e4m3(void* p, __m256 v) {
  __m256i u = _mm256_castps_si256(v), a = _mm256_and_si256(u, I32(0x7fffffff));
  __m256i r = _mm256_min_epu32(fp8_round(a, 3, 7, 0x1p9f), I32(0x7e)); /* satfinite */
  r = _mm256_blendv_epi8(r, I32(0x7f), _mm256_cmpgt_epi32(a, I32(0x7f800000)));
  st_bytes(p, _mm256_or_si256(r, _mm256_srli_epi32(_mm256_andnot_si256(I32(0x7fffffff), u), 24)));
}
RED_AVX2 void st_e5m2(void* p, __m256 v) {
  __m256i u = _mm256_castps_si256(v), a = _mm256_and_si256(u, I32(0x7fffffff));
  __m256i r = _mm256_min_epu32(fp8_round(a, 2, 15, 0x1p16f), I32(0x7c)); /* overflow: Inf */
  __m256i nanv = _mm256_or_si256(I32(0x7e), _mm256_and_si256(_mm256_srli_epi32(a, 21), I32(3)));
  r = _mm256_blendv_epi8(r, nanv, _mm256_cmpgt_epi32(a, I32(0x7f800000)));
  st_bytes(p, _mm256_or_si256(r, _mm256_srli_epi32(_mm256_andnot_si256(I32(0x7fffffff), u), 24)));
}

/* ---- combine operators (same arithmetic as red_float.c's fp32 kernels) ------------------------- */

RED_AVX2 __m256 op_sum(__m256 a, __m256 b, __m256 s) { (void)s; return _mm256_add_ps(a, b); }
RED_AVX2 __m256 op_prod(__m256 a, __m256 b, __m256 s) { (void)s; return _mm256_mul_ps(a, b); }
RED_AVX2 __m256 op_premul(__m256 a, __m256 b, __m256 s) { return _mm256_add_ps(a, _mm256_mul_ps(b, s)); }
/* RED_FMAX/RED_FMIN: a if (a > b or b is NaN), else b. */
RED_AVX2 __m256 op_max(__m256 a, __m256 b, __m256 s) {
  (void)s;
  __m256 m = _mm256_or_ps(_mm256_cmp_ps(a, b, _CMP_GT_OQ), _mm256_cmp_ps(b, b, _CMP_UNORD_Q));
  return _mm256_blendv_ps(b, a, m);
}
RED_AVX2 __m256 op_min(__m256 a, __m256 b, __m256 s) {
  (void)s;
  __m256 m = _mm256_or_ps(_mm256_cmp_ps(a, b, _CMP_LT_OQ), _mm256_cmp_ps(b, b, _CMP_UNORD_Q));
  return _mm256_blendv_ps(b, a, m);
}

/* ---- kernels ----------------------------------------------------------------------------------- */

/* Fused d = OP(a, b): 16 lanes per iteration, then an 8-lane step, then a padded tail. */
#define X86_BIN(T, ES, OP)                                                                         \
  __attribute__((target("avx2,f16c"))) static void bin_##T##_##OP(                                \
      void* d, const void* a, const void* b, size_t n, const struct red_sc* sc) {                  \
    const __m256 s = _mm256_set1_ps(sc->f);                                                        \
    char* dp = d;                                                                                  \
    const char *ap = a, *bp = b;                                                                   \
    size_t i = 0;                                                                                  \
    for (; i + 16 <= n; i += 16) {                                                                 \
      __m256 x0 = ld_##T(ap + i * ES), x1 = ld_##T(ap + (i + 8) * ES);                             \
      __m256 y0 = ld_##T(bp + i * ES), y1 = ld_##T(bp + (i + 8) * ES);                             \
      st_##T(dp + i * ES, op_##OP(x0, y0, s));                                                     \
      st_##T(dp + (i + 8) * ES, op_##OP(x1, y1, s));                                               \
    }                                                                                              \
    for (; i + 8 <= n; i += 8)                                                                     \
      st_##T(dp + i * ES, op_##OP(ld_##T(ap + i * ES), ld_##T(bp + i * ES), s));                   \
    if (i < n) {                                                                                   \
      char ta[8 * ES] = {0}, tb[8 * ES] = {0}, td[8 * ES];                                         \
      memcpy(ta, ap + i * ES, (n - i) * ES);                                                       \
      memcpy(tb, bp + i * ES, (n - i) * ES);                                                       \
      st_##T(td, op_##OP(ld_##T(ta), ld_##T(tb), s));                                              \
      memcpy(dp + i * ES, td, (n - i) * ES);                                                       \
    }                                                                                              \
  }

/* bf16 without shuffles: 16 elements as 8 lanes of (even, odd) pairs; the even element widens by
 * a shift, the odd one by masking, and element-wise operators do not care which is which. */
#define X86_BIN_BF16(OP)                                                                           \
  RED_AVX2 void bin16_bf16_##OP(char* d, const char* a, const char* b, __m256 s) {                \
    const __m256i hi = I32(0xffff0000u);                                                           \
    __m256i x = _mm256_loadu_si256((const __m256i*)a), y = _mm256_loadu_si256((const __m256i*)b); \
    __m256 ev = op_##OP(_mm256_castsi256_ps(_mm256_slli_epi32(x, 16)),                             \
                        _mm256_castsi256_ps(_mm256_slli_epi32(y, 16)), s);                         \
    __m256 od = op_##OP(_mm256_castsi256_ps(_mm256_and_si256(x, hi)),                              \
                        _mm256_castsi256_ps(_mm256_and_si256(y, hi)), s);                          \
    __m256i r = _mm256_or_si256(_mm256_and_si256(bf16_round_hi(od), hi),                           \
                                _mm256_srli_epi32(bf16_round_hi(ev), 16));                         \
    _mm256_storeu_si256((__m256i*)d, r);                                                           \
  }                                                                                                \
  __attribute__((target("avx2,f16c"))) static void bin_bf16_##OP(                                 \
      void* d, const void* a, const void* b, size_t n, const struct red_sc* sc) {                  \
    const __m256 s = _mm256_set1_ps(sc->f);                                                        \
    size_t i = 0;                                                                                  \
    for (; i + 16 <= n; i += 16)                                                                   \
      bin16_bf16_##OP((char*)d + 2 * i, (const char*)a + 2 * i, (const char*)b + 2 * i, s);        \
    if (i < n) {                                                                                   \
      char ta[32] = {0}, tb[32] = {0}, td[32];                                                     \
      memcpy(ta, (const char*)a + 2 * i, (n - i) * 2);                                             \
      memcpy(tb, (const char*)b + 2 * i, (n - i) * 2);                                             \
      bin16_bf16_##OP(td, ta, tb, s);                                                              \
      memcpy((char*)d + 2 * i, td, (n - i) * 2);                                                   \
    }                                                                                              \
  }

#define X86_CONV(T, ES)                                                                            \
  __attribute__((target("avx2,f16c"))) static void dec_##T(float* restrict o, const void* restrict in, \
                                                            size_t n) {                            \
    const char* p = in;                                                                            \
    size_t i = 0;                                                                                  \
    for (; i + 8 <= n; i += 8) _mm256_storeu_ps(o + i, ld_##T(p + i * ES));                        \
    if (i < n) {                                                                                   \
      char t[8 * ES] = {0};                                                                        \
      float f[8];                                                                                  \
      memcpy(t, p + i * ES, (n - i) * ES);                                                         \
      _mm256_storeu_ps(f, ld_##T(t));                                                              \
      memcpy(o + i, f, (n - i) * sizeof(float));                                                   \
    }                                                                                              \
  }                                                                                                \
  __attribute__((target("avx2,f16c"))) static void enc_##T(void* restrict out, const float* restrict in, \
                                                            size_t n) {                            \
    char* p = out;                                                                                 \
    size_t i = 0;                                                                                  \
    for (; i + 8 <= n; i += 8) st_##T(p + i * ES, _mm256_loadu_ps(in + i));                        \
    if (i < n) {                                                                                   \
      float f[8] = {0};                                                                            \
      char t[8 * ES];                                                                              \
      memcpy(f, in + i, (n - i) * sizeof(float));                                                  \
      st_##T(t, _mm256_loadu_ps(f));                                                               \
      memcpy(p + i * ES, t, (n - i) * ES);                                                         \
    }                                                                                              \
  }

#define X86_TYPE(T, ES)                                                                            \
  X86_BIN(T, ES, sum) X86_BIN(T, ES, prod) X86_BIN(T, ES, max) X86_BIN(T, ES, min)                 \
  X86_BIN(T, ES, premul) X86_CONV(T, ES)                                                           \
  static const red_bin_fn bin_##T[RED_NOPS] = {bin_##T##_sum, bin_##T##_prod, bin_##T##_max,      \
                                               bin_##T##_min, bin_##T##_premul};

X86_TYPE(half, 2)
X86_TYPE(e4m3, 1)
X86_TYPE(e5m2, 1)
X86_BIN_BF16(sum) X86_BIN_BF16(prod) X86_BIN_BF16(max) X86_BIN_BF16(min) X86_BIN_BF16(premul)
X86_CONV(bf16, 2)
static const red_bin_fn bin_bf16[RED_NOPS] = {bin_bf16_sum, bin_bf16_prod, bin_bf16_max, bin_bf16_min,
                                              bin_bf16_premul};

/* ---- run-time selection ------------------------------------------------------------------------ */

static int x86_level = -1; /* -1 unknown, 0 baseline, 1 AVX2+F16C */

int red_x86_level(void) {
  int v = __atomic_load_n(&x86_level, __ATOMIC_RELAXED);
  if (v < 0) {
    unsigned a, b, c = 0, d;
    __builtin_cpu_init();
    /* cpu_supports("avx2") includes the OS (XSAVE) check; F16C is read from CPUID directly as
     * not every compiler knows it by name (all AVX2 CPUs have it in practice). */
    v = __builtin_cpu_supports("avx2") && __get_cpuid(1, &a, &b, &c, &d) && (c & bit_F16C) ? 1 : 0;
    __atomic_store_n(&x86_level, v, __ATOMIC_RELAXED); /* idempotent: racing threads agree */
  }
  return v;
}

red_dec_fn red_x86_dec(int type) {
  if (red_x86_level() < 1) return NULL;
  switch (type) {
    case ncclFloat16: return dec_half;
    case ncclBfloat16: return dec_bf16;
    case ncclFloat8e4m3: return dec_e4m3;
    case ncclFloat8e5m2: return dec_e5m2;
    default: return NULL;
  }
}

red_enc_fn red_x86_enc(int type) {
  if (red_x86_level() < 1) return NULL;
  switch (type) {
    case ncclFloat16: return enc_half;
    case ncclBfloat16: return enc_bf16;
    case ncclFloat8e4m3: return enc_e4m3;
    case ncclFloat8e5m2: return enc_e5m2;
    default: return NULL;
  }
}

red_bin_fn red_x86_bin(int type, int op) {
  if (red_x86_level() < 1 || op < 0 || op >= RED_NOPS) return NULL;
  switch (type) {
    case ncclFloat16: return bin_half[op];
    case ncclBfloat16: return bin_bf16[op];
    case ncclFloat8e4m3: return bin_e4m3[op];
    case ncclFloat8e5m2: return bin_e5m2[op];
    default: return NULL;
  }
}
#else
typedef int red_x86_unused; /* ISO C forbids an empty translation unit */
#endif
