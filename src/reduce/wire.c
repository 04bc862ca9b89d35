/* Wire formats (wire.h): encoders and decoders over the element-wise conversions of reduce.c, which
 * are vectorised (F16C/AVX2) and round to nearest even with exact subnormals. Data is converted in
 * blocks of BLK values through the stack, so any n works without allocation. */
#include <math.h>
#include <string.h>
#include <strings.h>

#include "nccl.h"
#include "reduce.h"
#include "wire.h"

#define BLK 256 /* values per block: a multiple of WIRE_GROUP */

static const struct {
  const char* name;
  int type; /* the NCCL type of one value on the wire (mx8: its elements) */
  size_t size;
} fmts[WIRE_COUNT] = {
    [WIRE_OFF] = {"off", -1, 0},
    [WIRE_BF16] = {"bf16", ncclBfloat16, 2},
    [WIRE_FP16] = {"fp16", ncclFloat16, 2},
    [WIRE_E4M3] = {"fp8e4m3", ncclFloat8e4m3, 1},
    [WIRE_E5M2] = {"fp8e5m2", ncclFloat8e5m2, 1},
    [WIRE_MX8] = {"mx8", ncclFloat8e4m3, 1},
};

const char* wire_name(int fmt) {
  fmt = WIRE_FMT(fmt);
  return fmt < WIRE_COUNT ? fmts[fmt].name : "?";
}

int wire_parse(const char* s) {
  if (!s || !*s) return WIRE_OFF;
  size_t n = strlen(s);
  int force = s[n - 1] == '!';
  if (force) n--;
  for (int f = 0; f < WIRE_COUNT; f++)
    if (strlen(fmts[f].name) == n && strncasecmp(s, fmts[f].name, n) == 0)
      return f == WIRE_OFF ? WIRE_OFF : f | (force ? WIRE_FORCE : 0);
  return -1;
}

int wire_applies(int fmt, int type) {
  fmt = WIRE_FMT(fmt);
  if (fmt == WIRE_OFF || fmt >= WIRE_COUNT) return 0;
  if (type == ncclFloat32) return 1;
  return type == ncclBfloat16 && fmts[fmt].size == 1;
}

size_t wire_bytes(int fmt, int type, size_t n) {
  fmt = WIRE_FMT(fmt);
  if (!wire_applies(fmt, type)) return n * red_type_size(type);
  return n * fmts[fmt].size + (fmt == WIRE_MX8 ? (n + WIRE_GROUP - 1) / WIRE_GROUP : 0);
}

/* 2^e as a float, for e in [-149, 127] (exact: subnormal below -126). */
static float pow2f(int e) {
  union {
    uint32_t u;
    float f;
  } v;
  v.u = e >= -126 ? (uint32_t)(e + 127) << 23 : 1u << (e + 149);
  return v.f;
}

/* Whole groups: fixed trip counts the compiler vectorises. Bit patterns of magnitudes order as the
 * magnitudes do (NaN above Inf above every finite value). */
static uint32_t group_amax(const float* x) {
  uint32_t u[WIRE_GROUP], amax = 0;
  memcpy(u, x, sizeof u);
  for (int j = 0; j < WIRE_GROUP; j++) {
    uint32_t a = u[j] & 0x7fffffffu;
    amax = a > amax ? a : amax;
  }
  return amax;
}
static void group_scale(float* restrict s, const float* restrict x, float f) {
  for (int j = 0; j < WIRE_GROUP; j++) s[j] = x[j] * f;
}
static void group_scale_inplace(float* x, float f) {
  for (int j = 0; j < WIRE_GROUP; j++) x[j] *= f;
}

/* Each group's scale byte (sc) and its values divided by the scale (s), for k <= BLK values. */
static void mx8_prep(float* restrict s, uint8_t* restrict sc, const float* restrict x, size_t k) {
  for (size_t g = 0, i = 0; g < k; g += WIRE_GROUP, i++) {
    size_t m = k - g < WIRE_GROUP ? k - g : WIRE_GROUP;
    uint32_t amax = m == WIRE_GROUP ? group_amax(x + g) : 0;
    for (size_t j = 0; m < WIRE_GROUP && j < m; j++) {
      uint32_t a;
      memcpy(&a, x + g + j, 4);
      a &= 0x7fffffffu;
      amax = a > amax ? a : amax;
    }
    if (amax >= 0x7f800000u) { /* NaN or Inf */
      sc[i] = 0xff;
      for (size_t j = 0; j < m; j++) s[g + j] = 0.0f;
      continue;
    }
    int e = -127;
    uint32_t be = amax >> 23, frac = amax & 0x7fffffu; /* amax = 1.frac 2^(be - 127) */
    if (be) e = (int)be - 135 + (frac > 0x600000u); /* 1.frac > 1.75: one more */
    e = e < -127 ? -127 : e;                       /* the scale's range; amax <= FLT_MAX keeps e <= 120 */
    sc[i] = (uint8_t)(e + 127);
    float inv = pow2f(-e); /* exact: a power of two */
    if (m == WIRE_GROUP) group_scale(s + g, x + g, inv);
    else for (size_t j = 0; j < m; j++) s[g + j] = x[g + j] * inv;
  }
}

/* mx8, k <= BLK float values. A group's scale is the smallest power of two 2^e with 448 * 2^e >= amax,
 * so every value fits e4m3 without saturating and amax / 2^e lies in (224, 448]. A group holding a NaN
 * or an Inf goes as scale 0xFF (the MX formats' NaN scale): all NaN. The values of a block are scaled
 * into one buffer and converted by one call (vectorised), then laid out [scale][32 values] per group. */
static void mx8_enc(uint8_t* w, const float* x, size_t k) {
  float s[BLK];
  uint8_t e8[BLK], sc[BLK / WIRE_GROUP];
  mx8_prep(s, sc, x, k); /* an AVX2 build of it measured half as fast (2.9 against 5.9 GB/s) */
  red_from_float(ncclFloat8e4m3, e8, s, k);
  for (size_t g = 0, i = 0; g < k; g += WIRE_GROUP, i++) {
    size_t m = k - g < WIRE_GROUP ? k - g : WIRE_GROUP;
    w[0] = sc[i];
    memcpy(w + 1, e8 + g, m);
    w += 1 + m;
  }
}

static void mx8_dec(float* x, const uint8_t* w, size_t k) {
  uint8_t e8[BLK], sc[BLK / WIRE_GROUP];
  for (size_t g = 0, i = 0; g < k; g += WIRE_GROUP, i++) {
    size_t m = k - g < WIRE_GROUP ? k - g : WIRE_GROUP;
    sc[i] = w[0];
    memcpy(e8 + g, w + 1, m);
    w += 1 + m;
  }
  red_to_float(ncclFloat8e4m3, x, e8, k);
  for (size_t g = 0, i = 0; g < k; g += WIRE_GROUP, i++) {
    size_t m = k - g < WIRE_GROUP ? k - g : WIRE_GROUP;
    float f = sc[i] == 0xff ? NAN : pow2f((int)sc[i] - 127);
    if (m == WIRE_GROUP) group_scale_inplace(x + g, f);
    else for (size_t j = 0; j < m; j++) x[g + j] *= f;
  }
}

/* n float values, any n: the 16- and 8-bit formats in one conversion; mx8 a block of groups at a time. */
static void enc_f32(int fmt, uint8_t* w, const float* x, size_t n) {
  if (fmt != WIRE_MX8) {
    red_from_float(fmts[fmt].type, w, x, n);
    return;
  }
  for (size_t at = 0; at < n; at += BLK) mx8_enc(w + wire_bytes(fmt, ncclFloat32, at), x + at, n - at < BLK ? n - at : BLK);
}

static void dec_f32(int fmt, float* x, const uint8_t* w, size_t n) {
  if (fmt != WIRE_MX8) {
    red_to_float(fmts[fmt].type, x, w, n);
    return;
  }
  for (size_t at = 0; at < n; at += BLK) mx8_dec(x + at, w + wire_bytes(fmt, ncclFloat32, at), n - at < BLK ? n - at : BLK);
}

void wire_encode(int fmt, int type, void* wire, const void* src, size_t n) {
  fmt = WIRE_FMT(fmt);
  if (!wire_applies(fmt, type)) {
    memcpy(wire, src, n * red_type_size(type));
  } else if (type == ncclFloat32) {
    enc_f32(fmt, wire, src, n);
  } else {
    float x[BLK]; /* bfloat16: widen (exact), then encode */
    for (size_t at = 0; at < n; at += BLK) {
      size_t k = n - at < BLK ? n - at : BLK;
      red_to_float(ncclBfloat16, x, (const uint16_t*)src + at, k);
      enc_f32(fmt, (uint8_t*)wire + wire_bytes(fmt, type, at), x, k);
    }
  }
}

void wire_decode(int fmt, int type, void* dst, const void* wire, size_t n) {
  fmt = WIRE_FMT(fmt);
  if (!wire_applies(fmt, type)) {
    memcpy(dst, wire, n * red_type_size(type));
  } else if (type == ncclFloat32) {
    dec_f32(fmt, dst, wire, n);
  } else {
    float x[BLK]; /* bfloat16: e4m3 values times a power of two are bfloat16 values (but far subnormals) */
    for (size_t at = 0; at < n; at += BLK) {
      size_t k = n - at < BLK ? n - at : BLK;
      dec_f32(fmt, x, (const uint8_t*)wire + wire_bytes(fmt, type, at), k);
      red_from_float(ncclBfloat16, (uint16_t*)dst + at, x, k);
    }
  }
}

void wire_round(int fmt, int type, void* x, size_t n) {
  fmt = WIRE_FMT(fmt);
  if (!wire_applies(fmt, type)) return;
  size_t es = red_type_size(type);
  uint8_t w[BLK * 2 + BLK / WIRE_GROUP];
  for (size_t at = 0; at < n; at += BLK) {
    size_t k = n - at < BLK ? n - at : BLK;
    char* p = (char*)x + at * es;
    wire_encode(fmt, type, w, p, k);
    wire_decode(fmt, type, p, w, k);
  }
}

void wire_error(int fmt, double* rel, double* grp, double* tiny) {
  *rel = *grp = *tiny = 0.0;
  switch (WIRE_FMT(fmt)) {
    case WIRE_BF16: *rel = 0x1p-8, *tiny = 0x1p-134; break;
    case WIRE_FP16: *rel = 0x1p-11, *tiny = 0x1p-25; break;
    case WIRE_E4M3: *rel = 0x1p-4, *tiny = 0x1p-10; break;
    case WIRE_E5M2: *rel = 0x1p-3, *tiny = 0x1p-17; break;
    /* e4m3 values below its normal range (2^-6 of a scale 2^e <= amax / 224) are 2^-9 apart; the scale
     * stops at 2^-127 (groups below 2^-118 or so) */
    case WIRE_MX8: *rel = 0x1p-4, *grp = 0x1p-10 / 224.0, *tiny = 0x1p-137; break;
  }
}
