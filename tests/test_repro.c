/* Reproducible combination (src/reduce/repro.c) against an independent reference: the exact sum as a
 * two's-complement big integer in units of 2^-1100, rounded by comparing the exact distances to the
 * representable neighbours of an approximation (ties to even; overflow as IEEE defines it), for every
 * floating type, adversarial and random inputs. ORDER against a left-to-right loop written here. */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

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
