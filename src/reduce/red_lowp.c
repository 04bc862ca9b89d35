/* 16- and 8-bit float types (half, bf16, fp8 e4m3/e5m2): compute in fp32 and round once per
 * output element (round to nearest even). For sum and product of two 8/16-bit values the fp32
 * result is exact or rounded innocuously (fp32 has at least 2p+2 bits for every p-bit format here),
 * so those results are correctly rounded.
 * On x86-64 with AVX2+F16C the fused kernels of red_x86.c do it in one pass. Otherwise (and for the
 * unary premul/postop) blocks of elements are widened into L1-sized fp32 scratch, combined by the
 * fp32 kernels and narrowed back: one decoder and one encoder per type, which are the scalar
 * routines of reduce_impl.h (they vectorise where the ISA has per-lane shifts). */
#include "nccl.h"
#include "reduce_impl.h"

#define RED_BLOCK 512 /* elements: 2 x 2 KiB of fp32 scratch on the stack */

/* Portable bulk conversions: loops over the scalar routines. */
static void dec_half(float* restrict o, const void* restrict in, size_t n) {
  const uint16_t* p = in;
  for (size_t i = 0; i < n; i++) o[i] = red_cv_half_to_float(p[i]);
}
static void enc_half(void* restrict out, const float* restrict in, size_t n) {
  uint16_t* p = out;
  for (size_t i = 0; i < n; i++) p[i] = red_cv_float_to_half(in[i]);
}
static void dec_bf16(float* restrict o, const void* restrict in, size_t n) {
  const uint16_t* p = in;
  for (size_t i = 0; i < n; i++) o[i] = red_cv_bf16_to_float(p[i]);
}
static void enc_bf16(void* restrict out, const float* restrict in, size_t n) {
  uint16_t* p = out;
  for (size_t i = 0; i < n; i++) p[i] = red_cv_float_to_bf16(in[i]);
}
static void dec_e4m3(float* restrict o, const void* restrict in, size_t n) {
  const uint8_t* p = in;
  for (size_t i = 0; i < n; i++) o[i] = red_cv_e4m3_to_float(p[i]);
}
static void enc_e4m3(void* restrict out, const float* restrict in, size_t n) {
  uint8_t* p = out;
  for (size_t i = 0; i < n; i++) p[i] = red_cv_float_to_e4m3(in[i]);
}
static void dec_e5m2(float* restrict o, const void* restrict in, size_t n) {
  const uint8_t* p = in;
  for (size_t i = 0; i < n; i++) o[i] = red_cv_e5m2_to_float(p[i]);
}
static void enc_e5m2(void* restrict out, const float* restrict in, size_t n) {
  uint8_t* p = out;
  for (size_t i = 0; i < n; i++) p[i] = red_cv_float_to_e5m2(in[i]);
}

static int force_portable; /* tests only; set before any kernel runs */
void red_force_portable(int on) { __atomic_store_n(&force_portable, on, __ATOMIC_RELAXED); }

static int lowp_index(int type) {
  switch (type) {
    case ncclFloat16: return 0;
    case ncclBfloat16: return 1;
    case ncclFloat8e4m3: return 2;
    case ncclFloat8e5m2: return 3;
    default: return -1;
  }
}

red_dec_fn red_lowp_dec(int type) {
  static const red_dec_fn portable[4] = {dec_half, dec_bf16, dec_e4m3, dec_e5m2};
  int k = lowp_index(type);
  if (k < 0) return NULL;
#if defined(__x86_64__)
  if (!__atomic_load_n(&force_portable, __ATOMIC_RELAXED)) {
    red_dec_fn f = red_x86_dec(type);
    if (f) return f;
  }
#endif
  return portable[k];
}

red_enc_fn red_lowp_enc(int type) {
  static const red_enc_fn portable[4] = {enc_half, enc_bf16, enc_e4m3, enc_e5m2};
  int k = lowp_index(type);
  if (k < 0) return NULL;
#if defined(__x86_64__)
  if (!__atomic_load_n(&force_portable, __ATOMIC_RELAXED)) {
    red_enc_fn f = red_x86_enc(type);
    if (f) return f;
  }
#endif
  return portable[k];
}

int red_simd_level(void) {
#if defined(__x86_64__)
  return !__atomic_load_n(&force_portable, __ATOMIC_RELAXED) && red_x86_level() > 0;
#else
  return 0;
#endif
}

void red_lowp_bin(int type, int op, void* d, const void* a, const void* b, size_t n,
                  const struct red_sc* sc) {
  float ta[RED_BLOCK], tb[RED_BLOCK];
  red_dec_fn dec = red_lowp_dec(type);
  red_enc_fn enc = red_lowp_enc(type);
  red_bin_fn f = red_float_bin(ncclFloat32, op);
  size_t es = type == ncclFloat16 || type == ncclBfloat16 ? 2 : 1;
  if (!dec || !enc || !f) return;
#if defined(__x86_64__)
  if (!__atomic_load_n(&force_portable, __ATOMIC_RELAXED)) {
    red_bin_fn fused = red_x86_bin(type, op);
    if (fused) {
      fused(d, a, b, n, sc);
      return;
    }
  }
#endif
  /* Both inputs of a block are read before its output is written, so d may equal a or b. */
  for (size_t off = 0; off < n; off += RED_BLOCK) {
    size_t m = n - off < RED_BLOCK ? n - off : RED_BLOCK;
    dec(ta, (const char*)a + off * es, m);
    dec(tb, (const char*)b + off * es, m);
    f(ta, ta, tb, m, sc);
    enc((char*)d + off * es, ta, m);
  }
}

void red_lowp_un(int type, red_un_fn f32fn, void* d, const void* a, size_t n, const struct red_sc* sc) {
  float t[RED_BLOCK];
  red_dec_fn dec = red_lowp_dec(type);
  red_enc_fn enc = red_lowp_enc(type);
  size_t es = type == ncclFloat16 || type == ncclBfloat16 ? 2 : 1;
  if (!dec || !enc || !f32fn) return;
  for (size_t off = 0; off < n; off += RED_BLOCK) {
    size_t m = n - off < RED_BLOCK ? n - off : RED_BLOCK;
    dec(t, (const char*)a + off * es, m);
    f32fn(t, t, m, sc);
    enc((char*)d + off * es, t, m);
  }
}
