/* Reproducible combination (src/reduce/repro.c) against an independent reference: the exact sum as a
 * two's-complement big integer in units of 2^-1100, rounded by comparing the exact distances to the
 * representable neighbours of an approximation (ties to even; overflow as IEEE defines it), for every
 * floating type, adversarial and random inputs. ORDER against a left-to-right loop written here. */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "chorus.h"
#include "../src/reduce/reduce.h"
#include "runner.h"

static const int ftypes[] = {ncclFloat64, ncclFloat32, ncclFloat16, ncclBfloat16, ncclFloat8e4m3, ncclFloat8e5m2};
#define NFT 6

struct tf { int mbits, ebits, bias, bits, ieee; };
static struct tf tf_of(int t) {
  switch (t) {
    case ncclFloat64: return (struct tf){52, 11, 1023, 64, 1};
    case ncclFloat32: return (struct tf){23, 8, 127, 32, 1};
    case ncclFloat16: return (struct tf){10, 5, 15, 16, 1};
    case ncclBfloat16: return (struct tf){7, 8, 127, 16, 1};
    case ncclFloat8e5m2: return (struct tf){2, 5, 15, 8, 1};
    default: return (struct tf){3, 4, 7, 8, 0};
  }
}
static int is_nan(struct tf f, uint64_t u) {
  uint64_t e = (u >> f.mbits) & ((1ull << f.ebits) - 1), m = u & ((1ull << f.mbits) - 1);
  if (f.ieee) return e == (1ull << f.ebits) - 1 && m;
  return e == (1ull << f.ebits) - 1 && m == (1ull << f.mbits) - 1;
}
static int is_inf(struct tf f, uint64_t u) {
  uint64_t e = (u >> f.mbits) & ((1ull << f.ebits) - 1), m = u & ((1ull << f.mbits) - 1);
  return f.ieee && e == (1ull << f.ebits) - 1 && !m;
}

/* ---- big integers: two's complement, 96 x 32 bits, unit 2^-1100 ---- */
#define BN 96
#define UNIT 1100
typedef struct { uint32_t d[BN]; } big;
static void big_add_shifted(big* a, uint64_t man, int shift, int neg) {
  big t = {{0}};
  for (int b = 0; b < 64; b++)
    if ((man >> b) & 1) t.d[(shift + b) / 32] |= 1u << ((shift + b) % 32);
  if (neg) { /* t = -t */
    uint64_t c = 1;
    for (int i = 0; i < BN; i++) { c += (uint32_t)~t.d[i]; t.d[i] = (uint32_t)c; c >>= 32; }
  }
  uint64_t c = 0;
  for (int i = 0; i < BN; i++) { c += (uint64_t)a->d[i] + t.d[i]; a->d[i] = (uint32_t)c; c >>= 32; }
}
static int big_neg(const big* a) { return (int)(a->d[BN - 1] >> 31); }
static big big_abs(big a) {
  if (!big_neg(&a)) return a;
  uint64_t c = 1;
  for (int i = 0; i < BN; i++) { c += (uint32_t)~a.d[i]; a.d[i] = (uint32_t)c; c >>= 32; }
  return a;
}
static big big_sub(big a, const big* b) {
  uint64_t c = 1;
  for (int i = 0; i < BN; i++) { c += (uint64_t)a.d[i] + (uint32_t)~b->d[i]; a.d[i] = (uint32_t)c; c >>= 32; }
  return a;
}
static int big_cmp(const big* a, const big* b) { /* magnitudes of nonnegative values */
  for (int i = BN - 1; i >= 0; i--)
    if (a->d[i] != b->d[i]) return a->d[i] > b->d[i] ? 1 : -1;
  return 0;
}
static int big_zero(const big* a) {
  for (int i = 0; i < BN; i++)
    if (a->d[i]) return 0;
  return 1;
}
static double big_approx(const big* a) {
  big m = big_abs(*a);
  double v = 0;
  for (int i = BN - 1; i >= 0; i--) v += ldexp((double)m.d[i], 32 * i - UNIT); /* no overflow on the way */
  return big_neg(a) ? -v : v;
}

/* value of finite bits u as a big integer (times k, a small positive integer) */
static big value_of(struct tf f, uint64_t u, int k) {
  big r = {{0}};
  uint64_t e = (u >> f.mbits) & ((1ull << f.ebits) - 1), m = u & ((1ull << f.mbits) - 1);
  int neg = (int)((u >> (f.bits - 1)) & 1);
  uint64_t man = e ? m | 1ull << f.mbits : m;
  int lsb = (e ? (int)e : 1) - f.bias - f.mbits;
  for (int j = 0; j < k; j++) big_add_shifted(&r, man, lsb + UNIT, neg);
  return r;
}

static uint64_t key_of(struct tf f, uint64_t u) {
  uint64_t s = 1ull << (f.bits - 1), all = s | (s - 1);
  return u & s ? ~u & all : u | s;
}
static uint64_t bits_of_key(struct tf f, uint64_t k) {
  uint64_t s = 1ull << (f.bits - 1), all = s | (s - 1);
  return k & s ? k & ~s : ~k & all;
}
static uint64_t nearest_guess(int t, double d) {
  uint64_t u;
  switch (t) {
    case ncclFloat64: memcpy(&u, &d, 8); return u;
    case ncclFloat32: { float x = (float)d; uint32_t w; memcpy(&w, &x, 4); return w; }
    case ncclFloat16: return red_float_to_half((float)d);
    case ncclBfloat16: return red_float_to_bf16((float)d);
    case ncclFloat8e5m2: return red_float_to_e5m2((float)d);
    default: return red_float_to_e4m3((float)d);
  }
}

/* RN(S / div) in type t by exact comparison among neighbours of an approximation. */
static uint64_t ref_round(int t, const big* S, int div) {
  struct tf f = tf_of(t);
  uint64_t sign = 1ull << (f.bits - 1);
  if (big_zero(S)) return 0;
  uint64_t g = nearest_guess(t, big_approx(S) / div);
  if (is_nan(f, g)) g = 0;
  uint64_t maxfin = f.ieee ? (((1ull << f.ebits) - 2) << f.mbits) | ((1ull << f.mbits) - 1)
                           : (((1ull << f.ebits) - 1) << f.mbits) | ((1ull << f.mbits) - 2);
  int neg = big_neg(S);
  uint64_t best = 0;
  big bestd = {{0}};
  int have = 0;
  for (int dk = -3; dk <= 3; dk++) {
    uint64_t c = bits_of_key(f, key_of(f, g) + (uint64_t)(int64_t)dk);
    if (is_nan(f, c)) continue;
    if ((c & sign) != (neg ? sign : 0) && (c & ~sign)) continue; /* other sign: never nearer than 0 */
    big cv;
    if (is_inf(f, c)) { /* as 2^(emax+1): the unbounded-exponent rounding IEEE overflow follows */
      cv = (big){{0}};
      big_add_shifted(&cv, (uint64_t)div, (int)((1ull << f.ebits) - 1 - f.bias) + UNIT, neg);
    } else {
      cv = value_of(f, c, div);
    }
    big d = big_abs(big_sub(*S, &cv));
    int cmp = have ? big_cmp(&d, &bestd) : -1;
    int even = is_inf(f, c) || !(c & 1);
    if (cmp < 0 || (cmp == 0 && even)) best = c, bestd = d, have = 1;
  }
  if (!f.ieee && (best & ~sign) > maxfin) best = (best & sign) | maxfin;
  if (!(best & ~sign)) best = neg ? sign : 0; /* underflow to zero keeps the exact value's sign (IEEE) */
  return best;
}

/* Expected EXACT sum (div 1) or avg of the n values v[]. */
static uint64_t ref_exact(int t, const uint64_t* v, int n, int div) {
  struct tf f = tf_of(t);
  uint64_t sign = 1ull << (f.bits - 1), qnan[] = {0x7ff8000000000000ull, 0x7fc00000u, 0x7e00u, 0x7fc0u, 0x7fu, 0x7eu};
  uint64_t nan = qnan[t == ncclFloat64 ? 0 : t == ncclFloat32 ? 1 : t == ncclFloat16 ? 2 : t == ncclBfloat16 ? 3
                      : t == ncclFloat8e4m3 ? 4 : 5];
  int anynan = 0, pinf = 0, ninf = 0, allneg0 = 1;
  big S = {{0}};
  for (int k = 0; k < n; k++) {
    if (v[k] != sign) allneg0 = 0;
    if (is_nan(f, v[k])) anynan = 1;
    else if (is_inf(f, v[k])) *(v[k] & sign ? &ninf : &pinf) = 1;
    else {
      big x = value_of(f, v[k], 1);
      uint64_t c = 0;
      for (int i = 0; i < BN; i++) { c += (uint64_t)S.d[i] + x.d[i]; S.d[i] = (uint32_t)c; c >>= 32; }
    }
  }
  if (anynan || (pinf && ninf)) return nan;
  if (pinf || ninf) return (ninf ? sign : 0) | (((1ull << f.ebits) - 1) << f.mbits);
  if (big_zero(&S)) return allneg0 ? sign : 0;
  return ref_round(t, &S, div);
}

static uint64_t rnd64(void) { return (uint64_t)rand() << 62 ^ (uint64_t)rand() << 31 ^ (uint64_t)rand(); }
/* Random finite values: any bits (whole range), or near a common exponent (gradient-like). */
static uint64_t random_value(int t, int mode) {
  struct tf f = tf_of(t);
  for (;;) {
    uint64_t u = rnd64() & ((f.bits == 64 ? 0 : 1ull << f.bits) - 1);
    if (mode == 1) { /* exponent within 6 binades of 1 */
      uint64_t e = (uint64_t)(f.bias - 3 + rand() % 7);
      u = (u & ~(((1ull << f.ebits) - 1) << f.mbits)) | e << f.mbits;
    }
    if (!is_nan(f, u) && !is_inf(f, u)) return u;
  }
}

static void put(int t, void* p, int i, uint64_t u) {
  size_t es = red_type_size(t);
  if (es == 8) memcpy((char*)p + 8 * i, &u, 8);
  else if (es == 4) { uint32_t w = (uint32_t)u; memcpy((char*)p + 4 * i, &w, 4); }
  else if (es == 2) { uint16_t w = (uint16_t)u; memcpy((char*)p + 2 * i, &w, 2); }
  else ((uint8_t*)p)[i] = (uint8_t)u;
}
static uint64_t get(int t, const void* p, int i) {
  uint64_t u = 0;
  memcpy(&u, (const char*)p + red_type_size(t) * (size_t)i, red_type_size(t));
  return u;
}

/* vals[k][i]: rank k's element i. Checks EXACT sum and avg for every element. */
#define MAXN 8
#define MAXE 64
static int check_exact(int t, uint64_t vals[MAXN][MAXE], int n, int ne) {
  uint64_t buf[MAXN][MAXE], out[MAXE];
  struct red_contrib in[MAXN];
  for (int k = 0; k < n; k++) {
    for (int i = 0; i < ne; i++) put(t, buf[k], i, vals[k][i]);
    in[k] = (struct red_contrib){buf[k], NULL};
  }
  int bad = 0;
  for (int avg = 0; avg < 2; avg++) {
    struct red_op op = {.kind = avg ? RED_SUMPOSTDIV : RED_SUM, .type = t, .divisor = avg ? (uint64_t)n : 0};
    red_repro_combine(CH_REPRO_EXACT, &op, out, in, n, (size_t)ne);
    for (int i = 0; i < ne && bad < 5; i++) {
      uint64_t v[MAXN];
      for (int k = 0; k < n; k++) v[k] = vals[k][i];
      uint64_t want = ref_exact(t, v, n, avg && n > 1 ? n : 1), got = get(t, out, i);
      if (want != got) {
        bad++;
        rt_fail(__FILE__, __LINE__, "%s %s n=%d element %d: got %#llx want %#llx (first inputs %#llx %#llx)",
                red_type_name(t), avg ? "avg" : "sum", n, i, (unsigned long long)got, (unsigned long long)want,
                (unsigned long long)v[0], (unsigned long long)v[1]);
      }
    }
  }
  return bad;
}

TEST_T(repro, exact_random_all_types, 120) {
  srand(7);
  static uint64_t vals[MAXN][MAXE];
  for (int ti = 0; ti < NFT; ti++)
    for (int n = 1; n <= MAXN; n++)
      for (int mode = 0; mode < 2; mode++)
        for (int rep = 0; rep < 20; rep++) {
          for (int k = 0; k < n; k++)
            for (int i = 0; i < MAXE; i++) vals[k][i] = random_value(ftypes[ti], mode);
          /* cancellation: the last rank takes back some of the first's values */
          for (int i = 0; n > 2 && i < MAXE; i += 3) vals[n - 1][i] = vals[0][i] ^ (1ull << (tf_of(ftypes[ti]).bits - 1));
          check_exact(ftypes[ti], vals, n, MAXE);
        }
}

static uint64_t f32(float x) { uint32_t u; memcpy(&u, &x, 4); return u; }
static uint64_t f64(double x) { uint64_t u; memcpy(&u, &x, 8); return u; }

/* One element, values given: EXACT sum bits. */
static uint64_t exact1(int t, const uint64_t* v, int n) {
  uint64_t buf[MAXN], out = 0;
  struct red_contrib in[MAXN];
  for (int k = 0; k < n; k++) put(t, &buf[k], 0, v[k]), in[k] = (struct red_contrib){&buf[k], NULL};
  struct red_op op = {.kind = RED_SUM, .type = t};
  red_repro_combine(CH_REPRO_EXACT, &op, &out, in, n, 1);
  return get(t, &out, 0);
}

TEST(repro, exact_adversarial) {
  { uint64_t v[] = {f32(1e30f), f32(1), f32(-1e30f)}; EXPECT_EQ(exact1(ncclFloat32, v, 3), f32(1)); }
  { uint64_t v[] = {f32(1e8f), f32(1), f32(-1e8f), f32(1)}; EXPECT_EQ(exact1(ncclFloat32, v, 4), f32(2)); }
  { uint64_t v[] = {f32(3.4028235e38f), f32(3.4028235e38f), f32(-3.4028235e38f), f32(-3.4028235e38f)};
    EXPECT_EQ(exact1(ncclFloat32, v, 4), 0); } /* IEEE orders give inf, -inf, NaN or 0 */
  { uint64_t v[] = {f32(3.4028235e38f), f32(3.4028235e38f)}; EXPECT_EQ(exact1(ncclFloat32, v, 2), 0x7f800000u); }
  { uint64_t v[] = {f32(-0.0f), f32(-0.0f), f32(-0.0f)}; EXPECT_EQ(exact1(ncclFloat32, v, 3), 0x80000000u); }
  { uint64_t v[] = {f32(-0.0f), f32(0.0f)}; EXPECT_EQ(exact1(ncclFloat32, v, 2), 0); }
  { uint64_t v[] = {f32(5), f32(-5)}; EXPECT_EQ(exact1(ncclFloat32, v, 2), 0); }
  { uint64_t v[] = {f32(INFINITY), f32(-INFINITY)}; EXPECT_EQ(exact1(ncclFloat32, v, 2), 0x7fc00000u); }
  { uint64_t v[] = {f32(INFINITY), f32(1)}; EXPECT_EQ(exact1(ncclFloat32, v, 2), 0x7f800000u); }
  { uint64_t v[] = {0x7f800123u, 0xffc00456u, f32(1)}; EXPECT_EQ(exact1(ncclFloat32, v, 3), 0x7fc00000u); }
  { uint64_t v[] = {1, 1, 1, 1}; EXPECT_EQ(exact1(ncclFloat32, v, 4), 4); } /* min subnormal x 4 */
  { uint64_t v[] = {f64(1e308), f64(1e308), f64(-1e308), f64(-1e308), f64(0x1p-1074)};
    EXPECT_EQ(exact1(ncclFloat64, v, 5), 1); }
  { uint64_t v[] = {f64(1), f64(0x1p-1074), f64(-1)}; EXPECT_EQ(exact1(ncclFloat64, v, 3), 1); }
  /* bf16 double-rounding trap: 1 + 2^-8 + 2^-30 rounds to 1 + 2^-7 (0x3f81); via fp32, to 1 */
  { uint64_t v[] = {0x3f80, 0x3b80, 0x3080}; EXPECT_EQ(exact1(ncclBfloat16, v, 3), 0x3f81); }
  /* e4m3: 448 + 448 saturates to 448; e5m2 57344 + 57344 is Inf */
  { uint64_t v[] = {0x7e, 0x7e}; EXPECT_EQ(exact1(ncclFloat8e4m3, v, 2), 0x7e); }
  { uint64_t v[] = {0x7b, 0x7b}; EXPECT_EQ(exact1(ncclFloat8e5m2, v, 2), 0x7c); }
  /* fp16: 2048 + 1 is a tie, to even 2048; + 1 + 1 is exactly 2050 */
  { uint64_t v[] = {0x6800, 0x3c00}; EXPECT_EQ(exact1(ncclFloat16, v, 2), 0x6800); }
  { uint64_t v[] = {0x6800, 0x3c00, 0x3c00}; EXPECT_EQ(exact1(ncclFloat16, v, 3), 0x6801); }
}

TEST(repro, order_matches_left_to_right) {
  srand(11);
  float a[MAXN][MAXE], out[MAXE];
  uint16_t h[MAXN][MAXE], hout[MAXE];
  struct red_contrib in[MAXN], hin[MAXN];
  for (int n = 2; n <= MAXN; n++) {
    for (int k = 0; k < n; k++)
      for (int i = 0; i < MAXE; i++) {
        a[k][i] = (float)(rand() - RAND_MAX / 2) * 1e-3f * (float)(1 << (rand() % 20));
        h[k][i] = red_float_to_bf16(a[k][i]);
      }
    for (int k = 0; k < n; k++) in[k] = (struct red_contrib){a[k], NULL}, hin[k] = (struct red_contrib){h[k], NULL};
    struct red_op op = {.kind = RED_SUM, .type = ncclFloat32}, hop = {.kind = RED_SUM, .type = ncclBfloat16};
    red_repro_combine(CH_REPRO_ORDER, &op, out, in, n, MAXE);
    red_repro_combine(CH_REPRO_ORDER, &hop, hout, hin, n, MAXE);
    for (int i = 0; i < MAXE; i++) {
      volatile float s = a[0][i], hs = red_bf16_to_float(h[0][i]);
      for (int k = 1; k < n; k++) s = s + a[k][i], hs = hs + red_bf16_to_float(h[k][i]);
      EXPECT_EQ(f32(out[i]), f32(s));
      EXPECT_EQ(hout[i], red_float_to_bf16(hs)); /* fp32 accumulation, one rounding */
    }
  }
}

TEST(repro, premul_and_max_min) {
  /* premul: each rank's scalar applies to its own contribution, rounded, then the exact sum */
  float x[3] = {1.0f, 1.0f, 1.0f}, y[3] = {3.0f, 3.0f, 3.0f}, out[3];
  struct red_op px = {.kind = RED_PREMULSUM, .type = ncclFloat32, .scalar_f = 1.0 / 3}, py = px;
  py.scalar_f = 2.0;
  struct red_contrib in[2] = {{x, &px}, {y, &py}};
  struct red_op sum = {.kind = RED_PREMULSUM, .type = ncclFloat32};
  red_repro_combine(CH_REPRO_EXACT, &sum, out, in, 2, 3);
  EXPECT_EQ(f32(out[0]), f32((float)(1.0f / 3.0f) + 6.0f)); /* exact sum of two floats, rounded once */
  /* max/min: -0 below +0 in any order; NaN loses to numbers; all NaN: canonical */
  float z[4] = {-0.0f, 0.0f, NAN, NAN}, w[4] = {0.0f, -0.0f, 1.0f, NAN}, r[4];
  uint32_t weird = 0x7fc01234u;
  memcpy(&z[3], &weird, 4);
  struct red_contrib zin[2] = {{z, NULL}, {w, NULL}}, win[2] = {{w, NULL}, {z, NULL}};
  for (int lvl = CH_REPRO_ORDER; lvl <= CH_REPRO_EXACT; lvl++)
    for (int order = 0; order < 2; order++) {
      struct red_op mx = {.kind = RED_MAX, .type = ncclFloat32}, mn = {.kind = RED_MIN, .type = ncclFloat32};
      red_repro_combine(lvl, &mx, r, order ? win : zin, 2, 4);
      EXPECT_EQ(f32(r[0]), 0);
      EXPECT_EQ(f32(r[1]), 0);
      EXPECT_EQ(f32(r[2]), f32(1.0f));
      EXPECT_EQ(f32(r[3]), 0x7fc00000u);
      red_repro_combine(lvl, &mn, r, order ? win : zin, 2, 4);
      EXPECT_EQ(f32(r[0]), 0x80000000u);
      EXPECT_EQ(f32(r[1]), 0x80000000u);
    }
}

/* ---- collectives: every configuration gives the closed-form bits ---------------------------------
 * Inputs are inexact (random significands, mixed magnitudes, cancellation), so any other bracket
 * than the defined one shows. Every rank regenerates all ranks' inputs and computes the expected
 * result itself: ORDER as a left-to-right loop written here, EXACT with the big-integer reference
 * above. Each configuration (algorithm, protocol, FIFO size, channels, in place, threads or
 * processes, rank count) is checked against those, so all give the same bits. */
#include "coll_util.h"
#include "misc/param.h"

struct rc_case {
  int level, type, coll, inplace, env_level;
  size_t count;
  int pad; /* ranks from 2 up hold -0 (the identity) only: the multiset is ranks 0 and 1's values */
};

static uint64_t mix(uint64_t x) {
  x ^= x >> 33, x *= 0xff51afd7ed558ccdull, x ^= x >> 33, x *= 0xc4ceb9fe1a85ec53ull, x ^= x >> 33;
  return x;
}
/* Rank r's value of element i (bits of the type): gradient-like, with every 7th element cancelling
 * rank 0's value and every 11th spread over the whole range. */
static uint64_t rc_input(int type, int r, size_t i) {
  struct tf f = tf_of(type);
  if (r >= 1000) return 1ull << (f.bits - 1); /* padding: -0 */
  uint64_t h = mix((uint64_t)r * 0x9e3779b97f4a7c15ull + i * 0x632be59bd9b4e019ull + (uint64_t)type);
  uint64_t u;
  if (r > 0 && i % 7 == 0) return rc_input(type, 0, i) ^ (1ull << (f.bits - 1));
  if (i % 11 == 0) u = h & (f.bits == 64 ? ~0ull : (1ull << f.bits) - 1);
  else {
    uint64_t e = (uint64_t)(f.bias - 4 + (int)(h >> 58) % 9); /* within 9 binades of 1 */
    u = (h & ((1ull << f.mbits) - 1)) | e << f.mbits | (h >> 63) << (f.bits - 1);
  }
  if (is_nan(f, u) || is_inf(f, u)) u &= ~(1ull << (f.bits - 2)); /* clear the top exponent bit */
  return u;
}

static double as_double(int type, uint64_t u) {
  switch (type) {
    case ncclFloat64: { double d; memcpy(&d, &u, 8); return d; }
    case ncclFloat32: { float x; uint32_t w = (uint32_t)u; memcpy(&x, &w, 4); return x; }
    case ncclFloat16: return red_half_to_float((uint16_t)u);
    case ncclBfloat16: return red_bf16_to_float((uint16_t)u);
    case ncclFloat8e5m2: return red_e5m2_to_float((uint8_t)u);
    default: return red_e4m3_to_float((uint8_t)u);
  }
}
/* ORDER's definition: rank order, accumulated in fp32 (in the type for fp32/fp64), one rounding. */
static uint64_t rc_order(int type, int n, size_t i) {
  if (type == ncclFloat64) {
    volatile double s = as_double(type, rc_input(type, 0, i));
    for (int r = 1; r < n; r++) s = s + as_double(type, rc_input(type, r, i));
    return f64(s);
  }
  volatile float s = (float)as_double(type, rc_input(type, 0, i));
  for (int r = 1; r < n; r++) s = s + (float)as_double(type, rc_input(type, r, i));
  return nearest_guess(type, s); /* from fp32: exact for fp32, the library's RNE narrowing otherwise */
}
static uint64_t rc_expect(const struct rc_case* c, int n, size_t i) {
  if (c->level == CH_REPRO_ORDER) return rc_order(c->type, n, i);
  uint64_t v[64];
  for (int r = 0; r < n; r++) v[r] = rc_input(c->type, r, i);
  return ref_exact(c->type, v, n, 1);
}

static void rc_body(int rank, int n, ncclUniqueId id, void* arg) {
  const struct rc_case* c = arg;
  ncclComm_t comm = cu_comm_init(rank, n, id);
  if (!c->env_level) NCCL_OK(chorusCommSetReproducible(comm, c->level));
  size_t es = red_type_size(c->type), cnt = c->count;
  size_t in_n = c->coll == CU_REDUCESCATTER ? cnt * (size_t)n : cnt;
  size_t out_n = c->coll == CU_REDUCESCATTER ? cnt : cnt;
  char* send = calloc(in_n, es);
  char* recv = calloc(in_n, es);
  ASSERT(send && recv);
  for (size_t i = 0; i < in_n; i++)
    put(c->type, send, (int)i, rc_input(c->type, c->pad && rank >= 2 ? 1000 : rank, i));
  if (c->inplace) memcpy(recv, send, in_n * es);
  const void* sb = c->inplace ? recv : send;
  if (c->coll == CU_ALLREDUCE)
    NCCL_OK(ncclAllReduce(sb, recv, cnt, c->type, ncclSum, comm, NULL));
  else if (c->coll == CU_REDUCESCATTER)
    NCCL_OK(ncclReduceScatter(sb, c->inplace ? recv + (size_t)rank * cnt * es : recv, cnt, c->type, ncclSum, comm,
                              NULL));
  else
    NCCL_OK(ncclReduce(sb, recv, cnt, c->type, ncclSum, (int)(c->count % (size_t)n), comm, NULL));
  int bad = 0;
  if (c->coll != CU_REDUCE || rank == (int)(c->count % (size_t)n)) {
    const char* out = c->coll == CU_REDUCESCATTER && c->inplace ? recv + (size_t)rank * cnt * es : recv;
    size_t base = c->coll == CU_REDUCESCATTER ? (size_t)rank * cnt : 0;
    for (size_t i = 0; i < out_n && bad < 3; i++) {
      /* padded: the exact sum of two ranks' values, whatever n */
      uint64_t want = rc_expect(c, c->pad ? 2 : n, base + i), got = get(c->type, out, (int)i);
      if (want != got) {
        bad++;
        rt_fail(__FILE__, __LINE__, "rank %d/%d %s %s level %d%s algo %s proto %s: element %zu got %#llx want %#llx",
                rank, n, cu_coll_name(c->coll), red_type_name(c->type), c->level, c->inplace ? " in place" : "",
                getenv("NCCL_ALGO") ? getenv("NCCL_ALGO") : "auto", cu_proto(), base + i,
                (unsigned long long)got, (unsigned long long)want);
      }
    }
  }
  free(send);
  free(recv);
  NCCL_OK(ncclCommDestroy(comm));
}

static void rc_env(const char* algo, const char* proto, const char* buffsize, const char* level) {
  if (algo) setenv("NCCL_ALGO", algo, 1); else unsetenv("NCCL_ALGO");
  if (buffsize) setenv("NCCL_BUFFSIZE", buffsize, 1); else unsetenv("NCCL_BUFFSIZE");
  if (level) setenv("CHORUS_REPRODUCIBLE", level, 1); else unsetenv("CHORUS_REPRODUCIBLE");
  cu_force_proto(proto);
}

/* Every layout of one level: algorithms (auto: Direct between threads, Owner otherwise), protocols,
 * FIFO sizes (chunking), in place, threads and processes, for the three reducing collectives. */
static void rc_matrix(int level, int n, int procs, const int* types, int ntypes) {
  static const char* algos[] = {NULL, "Owner"};
  static const char* protos[] = {NULL, "LL", "LL128"};
  static const char* sizes[] = {NULL, "65536"};
  static const int colls[] = {CU_ALLREDUCE, CU_REDUCESCATTER, CU_REDUCE};
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
  /* 5-10x slower under a sanitizer, and EXACT's reference with it: one type, one FIFO size */
  int nsizes = 1;
  ntypes = 1;
#else
  int nsizes = 2;
#endif
  for (int a = 0; a < 2; a++)
    for (int p = 0; p < 3; p++)
      for (int s = 0; s < nsizes; s++)
        for (int t = 0; t < ntypes; t++)
          for (int k = 0; k < 3; k++) {
            rc_env(algos[a], protos[p], sizes[s], NULL);
            /* EXACT's reference (big integers, every element on every rank) is the slow part: fewer elements */
            size_t big = level == CH_REPRO_EXACT ? 12000 : 40000;
            struct rc_case c = {level, types[t], colls[k], (a + p + s) & 1, 0, 3001 + (size_t)s * big, 0};
            if (procs) rt_run_procs(n, rc_body, &c);
            else rt_run_threads(n, rc_body, &c);
          }
  rc_env(NULL, NULL, NULL, NULL);
}

static const int rc_types[] = {ncclFloat32, ncclBfloat16, ncclFloat64, ncclFloat16, ncclFloat8e4m3, ncclFloat8e5m2};
TEST_T(repro_coll, order_threads_4, 300) { rc_matrix(CH_REPRO_ORDER, 4, 0, rc_types, 3); }
TEST_T(repro_coll, order_threads_3, 300) { rc_matrix(CH_REPRO_ORDER, 3, 0, rc_types + 3, 3); }
TEST_T(repro_coll, order_procs_3, 300) { rc_matrix(CH_REPRO_ORDER, 3, 1, rc_types, 2); }
TEST_T(repro_coll, exact_threads_4, 300) { rc_matrix(CH_REPRO_EXACT, 4, 0, rc_types, 3); }
TEST_T(repro_coll, exact_threads_5, 300) { rc_matrix(CH_REPRO_EXACT, 5, 0, rc_types + 3, 3); }
TEST_T(repro_coll, exact_procs_2, 300) { rc_matrix(CH_REPRO_EXACT, 2, 1, rc_types, 2); }

/* The cases test_cluster.c runs on each rank across netns hosts (level from CHORUS_REPRODUCIBLE):
 * the three reducing collectives on two types, in place and not, one with several FIFO steps. */
void repro_cluster_cases(int rank, int n, ncclUniqueId id, int level);
void repro_cluster_cases(int rank, int n, ncclUniqueId id, int level) {
  static const int colls[] = {CU_ALLREDUCE, CU_REDUCESCATTER, CU_REDUCE};
  static const int types[] = {ncclFloat32, ncclBfloat16};
  for (int t = 0; t < 2; t++)
    for (int k = 0; k < 3; k++) {
      struct rc_case c = {level, types[t], colls[k], k == 1, 1, k == 0 ? 70001 : 3001, 0};
      rc_body(rank, n, id, &c);
    }
}

/* EXACT depends on the multiset of values only: the same two ranks' values padded with -0 on 2 to 6
 * ranks give the same bits (each checked against the exact sum of the two). */
TEST_T(repro_coll, exact_across_rank_counts, 300) {
  static const int colls[] = {CU_ALLREDUCE, CU_REDUCESCATTER, CU_REDUCE};
  for (int n = 2; n <= 6; n++)
    for (int t = 0; t < 3; t++)
      for (int k = 0; k < 3; k++) {
        struct rc_case c = {CH_REPRO_EXACT, rc_types[t], colls[k], k == 1, 0, 2003 + (size_t)n, 1};
        if (n == 4) rt_run_procs(n, rc_body, &c);
        else rt_run_threads(n, rc_body, &c);
      }
}

/* One communicator repeating a call (its plan is reused) alternately out of place and in place: the
 * step counts differ (Owner's in-place copy), every result still the definition's. */
static void alternate_body(int rank, int n, ncclUniqueId id, void* arg) {
  const struct rc_case* c = arg;
  ncclComm_t comm = cu_comm_init(rank, n, id);
  NCCL_OK(chorusCommSetReproducible(comm, c->level));
  size_t es = red_type_size(c->type);
  char* send = calloc(c->count, es);
  char* recv = calloc(c->count, es);
  ASSERT(send && recv);
  for (int round = 0; round < 6; round++) {
    int inplace = round & 1;
    for (size_t i = 0; i < c->count; i++) put(c->type, send, (int)i, rc_input(c->type, rank, i));
    if (inplace) memcpy(recv, send, c->count * es);
    NCCL_OK(ncclAllReduce(inplace ? recv : send, recv, c->count, c->type, ncclSum, comm, NULL));
    int bad = 0;
    for (size_t i = 0; i < c->count && bad < 3; i++)
      if (get(c->type, recv, (int)i) != rc_expect(c, n, i)) {
        bad++;
        rt_fail(__FILE__, __LINE__, "rank %d round %d%s: element %zu differs", rank, round, inplace ? " (in place)" : "", i);
      }
  }
  free(send);
  free(recv);
  NCCL_OK(ncclCommDestroy(comm));
}
TEST_T(repro_coll, plan_reused_in_place_and_not, 120) {
  rc_env("allreduce:Owner", NULL, NULL, NULL);
  for (int level = CH_REPRO_ORDER; level <= CH_REPRO_EXACT; level++)
    for (int t = 0; t < 2; t++) {
      struct rc_case c = {level, t ? ncclBfloat16 : ncclFloat32, CU_ALLREDUCE, 0, 0, 2 + (size_t)t * 5000, 0};
      rt_run_threads(3, alternate_body, &c);
      rt_run_procs(2, alternate_body, &c);
    }
  rc_env(NULL, NULL, NULL, NULL);
}

/* CHORUS_REPRODUCIBLE takes effect like the call (no chorusCommSetReproducible), and Direct between
 * processes on ncclMemAlloc buffers is not exercised here (test_direct covers Direct itself). */
TEST_T(repro_coll, env_level_procs_4, 120) {
  rc_env(NULL, NULL, NULL, "exact");
  struct rc_case c = {CH_REPRO_EXACT, ncclFloat32, CU_ALLREDUCE, 0, 1, 100003, 0};
  rt_run_procs(4, rc_body, &c);
  rc_env(NULL, NULL, NULL, "order");
  c.level = CH_REPRO_ORDER, c.type = ncclBfloat16;
  rt_run_threads(4, rc_body, &c);
  rc_env(NULL, NULL, NULL, NULL);
}

/* NCCL_ALGO forcing only algorithms that cannot honour the level is refused with a message; setting
 * the level after the first call is refused too. */
static void refuse_body(int rank, int n, ncclUniqueId id, void* arg) {
  (void)arg;
  ncclComm_t comm = cu_comm_init(rank, n, id);
  NCCL_OK(chorusCommSetReproducible(comm, chorusReproOrder));
  float x[8] = {1, 2, 3, 4, 5, 6, 7, 8}, y[8];
  EXPECT_EQ(ncclAllReduce(x, y, 8, ncclFloat32, ncclSum, comm, NULL), ncclInvalidUsage);
  /* integers are exact already: any algorithm serves them */
  int xi[8] = {1, 2, 3, 4, 5, 6, 7, 8}, yi[8];
  NCCL_OK(ncclAllReduce(xi, yi, 8, ncclInt32, ncclSum, comm, NULL));
  EXPECT_EQ(yi[7], 8 * n);
  EXPECT_EQ(chorusCommSetReproducible(comm, chorusReproExact), ncclInvalidUsage);
  EXPECT_EQ(chorusCommSetReproducible(comm, 7), ncclInvalidArgument);
  int lvl = -1;
  NCCL_OK(chorusCommGetReproducible(comm, &lvl));
  EXPECT_EQ(lvl, chorusReproOrder);
  NCCL_OK(ncclCommDestroy(comm));
}
/* Ranks that ask for different levels are all told (the call compares them), and keep the level they
 * had: the next call still runs, on every rank alike. */
static void differ_body(int rank, int n, ncclUniqueId id, void* arg) {
  (void)arg;
  ncclComm_t comm = cu_comm_init(rank, n, id);
  EXPECT_EQ(chorusCommSetReproducible(comm, rank == 1 ? chorusReproExact : chorusReproOrder), ncclInvalidUsage);
  int lvl = -1;
  NCCL_OK(chorusCommGetReproducible(comm, &lvl));
  EXPECT_EQ(lvl, chorusReproOff);
  float x[5] = {1, 2, 3, 4, 5};
  NCCL_OK(ncclAllReduce(x, x, 5, ncclFloat32, ncclSum, comm, NULL));
  EXPECT(x[4] == 5.0f * (float)n);
  NCCL_OK(ncclCommDestroy(comm));
}
TEST(repro_coll, levels_differ_refused) {
  rt_run_threads(3, differ_body, NULL);
  rt_run_procs(2, differ_body, NULL);
}

TEST(repro_coll, forced_ring_refused) {
  rc_env("Ring", NULL, NULL, NULL);
  rt_run_threads(3, refuse_body, NULL);
  rc_env(NULL, NULL, NULL, "sometimes");
  ncclComm_t comms[2];
  int devs[2] = {0, 1};
  EXPECT(ncclCommInitAll(comms, 2, devs) != ncclSuccess); /* a malformed level fails init */
  rc_env(NULL, NULL, NULL, NULL);
}
