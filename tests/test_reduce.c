/* Element-wise kernels (src/reduce/reduce.h): every type x every reduction kind with closed-form
 * expected values, aliasing, vector-loop tails, misalignment, wrap-around and NaN rules, and
 * exhaustive checks of the 16- and 8-bit float conversions against an independent double-precision
 * rounding reference. Calls the internal red_* functions directly. */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "../src/reduce/reduce.h"
#include "../src/reduce/reduce_impl.h"
#include "runner.h"

static const int all_types[] = {ncclInt8,    ncclUint8,  ncclInt32,    ncclUint32,
                                ncclInt64,   ncclUint64, ncclFloat16,  ncclFloat32,
                                ncclFloat64, ncclBfloat16, ncclFloat8e4m3, ncclFloat8e5m2};
#define NTYPES ((int)(sizeof(all_types) / sizeof(all_types[0])))

static int is_unsigned(int t) { return t == ncclUint8 || t == ncclUint32 || t == ncclUint64; }

/* Integers are handled as 64-bit patterns: signed types sign-extended, unsigned zero-extended. */
static uint64_t wrap_int(int t, uint64_t v) {
  switch (t) {
    case ncclInt8: return (uint64_t)(int64_t)(int8_t)(uint8_t)v;
    case ncclUint8: return (uint8_t)v;
    case ncclInt32: return (uint64_t)(int64_t)(int32_t)(uint32_t)v;
    case ncclUint32: return (uint32_t)v;
    default: return v;
  }
}

static void put_int(int t, void* p, size_t i, uint64_t v) {
  switch (red_type_size(t)) {
    case 1: ((uint8_t*)p)[i] = (uint8_t)v; break;
    case 4: ((uint32_t*)p)[i] = (uint32_t)v; break;
    default: ((uint64_t*)p)[i] = v; break;
  }
}
static uint64_t get_int(int t, const void* p, size_t i) {
  switch (red_type_size(t)) {
    case 1: return wrap_int(t, ((const uint8_t*)p)[i]);
    case 4: return wrap_int(t, ((const uint32_t*)p)[i]);
    default: return ((const uint64_t*)p)[i];
  }
}

/* Floats: stored by the library's own conversions (the values used are exact in every type). */
static void put_f(int t, void* p, size_t i, double v) {
  switch (t) {
    case ncclFloat16: ((uint16_t*)p)[i] = red_float_to_half((float)v); break;
    case ncclBfloat16: ((uint16_t*)p)[i] = red_float_to_bf16((float)v); break;
    case ncclFloat8e4m3: ((uint8_t*)p)[i] = red_float_to_e4m3((float)v); break;
    case ncclFloat8e5m2: ((uint8_t*)p)[i] = red_float_to_e5m2((float)v); break;
    case ncclFloat32: ((float*)p)[i] = (float)v; break;
    default: ((double*)p)[i] = v; break;
  }
}
static double get_f(int t, const void* p, size_t i) {
  switch (t) {
    case ncclFloat16: return red_half_to_float(((const uint16_t*)p)[i]);
    case ncclBfloat16: return red_bf16_to_float(((const uint16_t*)p)[i]);
    case ncclFloat8e4m3: return red_e4m3_to_float(((const uint8_t*)p)[i]);
    case ncclFloat8e5m2: return red_e5m2_to_float(((const uint8_t*)p)[i]);
    case ncclFloat32: return ((const float*)p)[i];
    default: return ((const double*)p)[i];
  }
}

/* Inputs: small integers so every sum/product/premul/quotient below is exact in every type. */
static int64_t in_a(int t, size_t i) { return (int64_t)((i * 7) % 5) - (is_unsigned(t) ? 0 : 2); }
static int64_t in_b(int t, size_t i) { return (int64_t)(i % 3) - (is_unsigned(t) ? 0 : 1); }

#define INT_SCALAR (-3)
#define FLOAT_SCALAR 0.5
#define INT_DIVISOR 3
#define FLOAT_DIVISOR 2

static struct red_op make_op(int type, int kind) {
  struct red_op op = {.kind = kind, .type = type, .scalar_f = 1.0, .scalar_i = 1, .divisor = 1};
  if (kind == RED_PREMULSUM) op.scalar_f = FLOAT_SCALAR, op.scalar_i = INT_SCALAR;
  if (kind == RED_SUMPOSTDIV) op.divisor = red_type_is_float(type) ? FLOAT_DIVISOR : INT_DIVISOR;
  return op;
}

/* Closed form of the full reduce (+ postop) for element i. */
static double expect_f(int kind, double a, double b) {
  switch (kind) {
    case RED_SUM: return a + b;
    case RED_PROD: return a * b;
    case RED_MAX: return a > b ? a : b;
    case RED_MIN: return a < b ? a : b;
    case RED_PREMULSUM: return a + b * FLOAT_SCALAR;
    default: return (a + b) / FLOAT_DIVISOR;
  }
}
static uint64_t expect_i(int t, int kind, int64_t a, int64_t b) {
  switch (kind) {
    case RED_SUM: return wrap_int(t, (uint64_t)(a + b));
    case RED_PROD: return wrap_int(t, (uint64_t)(a * b));
    case RED_MAX: return wrap_int(t, (uint64_t)(a > b ? a : b));
    case RED_MIN: return wrap_int(t, (uint64_t)(a < b ? a : b));
    case RED_PREMULSUM: return wrap_int(t, (uint64_t)a + (uint64_t)b * (uint64_t)(int64_t)INT_SCALAR);
    default: return wrap_int(t, (uint64_t)((a + b) / INT_DIVISOR));
  }
}

/* A buffer of n elements at a chosen misalignment, surrounded by guard bytes. */
struct gbuf {
  unsigned char* base;
  void* p;
  size_t bytes;
};
#define GUARD 64
static void gb_init(struct gbuf* g, size_t n, size_t es, size_t misalign) {
  g->bytes = n * es;
  g->base = malloc(g->bytes + 2 * GUARD + 16);
  ASSERT(g->base != NULL);
  memset(g->base, 0xA5, g->bytes + 2 * GUARD + 16);
  g->p = g->base + GUARD + misalign * es;
}
static int gb_guards_ok(const struct gbuf* g) {
  const unsigned char* p = g->p;
  for (const unsigned char* q = g->base; q < p; q++)
    if (*q != 0xA5) return 0;
  for (const unsigned char* q = p + g->bytes; q < g->base + g->bytes + 2 * GUARD + 16; q++)
    if (*q != 0xA5) return 0;
  return 1;
}

enum { ALIAS_NONE, ALIAS_IN, ALIAS_LOCAL };

static int check_case(int t, int kind, size_t n, int alias, size_t mis) {
  size_t es = red_type_size(t);
  int isf = red_type_is_float(t), bad = 0;
  struct red_op op = make_op(t, kind);
  struct gbuf a, b, d;
  gb_init(&a, n, es, mis);
  gb_init(&b, n, es, 0);
  gb_init(&d, n, es, mis); /* b stays aligned: a/d and b differ in alignment */
  for (size_t i = 0; i < n; i++) {
    if (isf) put_f(t, a.p, i, (double)in_a(t, i)), put_f(t, b.p, i, (double)in_b(t, i));
    else put_int(t, a.p, i, (uint64_t)in_a(t, i)), put_int(t, b.p, i, (uint64_t)in_b(t, i));
  }
  void* dst = d.p;
  const void *x = a.p, *y = b.p;
  if (alias == ALIAS_IN) memcpy(dst, a.p, n * es), x = dst;
  if (alias == ALIAS_LOCAL) memcpy(dst, b.p, n * es), y = dst;
  red_reduce(&op, dst, x, y, n);
  red_postop(&op, dst, dst, n);
  for (size_t i = 0; i < n && bad < 3; i++) {
    int ok;
    if (isf) ok = get_f(t, dst, i) == expect_f(kind, (double)in_a(t, i), (double)in_b(t, i));
    else ok = get_int(t, dst, i) == expect_i(t, kind, in_a(t, i), in_b(t, i));
    if (!ok) {
      rt_fail(__FILE__, __LINE__, "%s kind %d n %zu alias %d mis %zu: element %zu wrong",
              red_type_name(t), kind, n, alias, mis, i);
      bad++;
    }
  }
  if (!gb_guards_ok(&d)) rt_fail(__FILE__, __LINE__, "%s kind %d n %zu: wrote outside dst",
                                 red_type_name(t), kind, n), bad++;
  /* premul alone: b * scalar, in place and out of place. */
  if (kind == RED_PREMULSUM && !bad) {
    red_premul(&op, d.p, b.p, n);
    red_premul(&op, b.p, b.p, n);
    for (size_t i = 0; i < n && !bad; i++) {
      int ok;
      if (isf) ok = get_f(t, d.p, i) == (double)in_b(t, i) * FLOAT_SCALAR &&
                    get_f(t, b.p, i) == (double)in_b(t, i) * FLOAT_SCALAR;
      else ok = get_int(t, d.p, i) == wrap_int(t, (uint64_t)in_b(t, i) * (uint64_t)(int64_t)INT_SCALAR) &&
                get_int(t, b.p, i) == get_int(t, d.p, i);
      if (!ok) {
        rt_fail(__FILE__, __LINE__, "%s premul n %zu: element %zu wrong", red_type_name(t), n, i);
        bad++;
      }
    }
  }
  free(a.base), free(b.base), free(d.base);
  return bad;
}

static void all_cases(void) {
  static const size_t lens[] = {0, 1, 7, 33, 1000, 1003}; /* tails of 8- and 16-wide loops */
  for (int ti = 0; ti < NTYPES; ti++)
    for (int kind = RED_SUM; kind <= RED_SUMPOSTDIV; kind++)
      for (size_t li = 0; li < sizeof(lens) / sizeof(lens[0]); li++)
        for (int alias = ALIAS_NONE; alias <= ALIAS_LOCAL; alias++)
          for (size_t mis = 0; mis < 2; mis++)
            if (check_case(all_types[ti], kind, lens[li], alias, mis)) return;
}

TEST(reduce, all_types_kinds) { all_cases(); }

TEST(reduce, all_types_kinds_portable) {
  red_force_portable(1);
  all_cases();
  red_force_portable(0);
}

TEST(reduce, type_table) {
  static const size_t sizes[] = {1, 1, 4, 4, 8, 8, 2, 4, 8, 2, 1, 1};
  for (int t = 0; t < NTYPES; t++) EXPECT_EQ(red_type_size(t), sizes[t]);
  EXPECT_EQ(red_type_size(12), 0);
  EXPECT_EQ(red_type_size(-1), 0);
  EXPECT(strcmp(red_type_name(ncclBfloat16), "bfloat16") == 0);
  EXPECT(strcmp(red_type_name(ncclFloat8e4m3), "f8e4m3") == 0);
  EXPECT(strcmp(red_type_name(ncclHalf), "half") == 0);
  EXPECT(red_type_is_float(ncclFloat8e5m2) && !red_type_is_float(ncclUint64));
}

/* Wrap-around, signedness of max/min, truncating division. */
TEST(reduce, integer_edges) {
  struct red_op op = {.kind = RED_SUM, .type = ncclInt8};
  int8_t a8[2] = {127, -128}, b8[2] = {1, -1}, d8[2];
  red_reduce(&op, d8, a8, b8, 2);
  EXPECT_EQ(d8[0], -128);
  EXPECT_EQ(d8[1], 127);
  uint8_t ua[2] = {255, 200}, ub[2] = {1, 100}, ud[2];
  op.type = ncclUint8;
  red_reduce(&op, ud, ua, ub, 2);
  EXPECT_EQ(ud[0], 0);
  EXPECT_EQ(ud[1], 44);
  op.kind = RED_MAX;
  red_reduce(&op, ud, ua, ub, 2);
  EXPECT_EQ(ud[0], 255);
  op.type = ncclInt8;
  op.kind = RED_MIN;
  red_reduce(&op, d8, a8, b8, 2);
  EXPECT_EQ(d8[0], 1);
  EXPECT_EQ(d8[1], -128);

  int32_t a32[3] = {INT32_MAX, 65536, -7}, b32[3] = {1, 65536, 0}, d32[3];
  op = (struct red_op){.kind = RED_SUM, .type = ncclInt32};
  red_reduce(&op, d32, a32, b32, 3);
  EXPECT_EQ(d32[0], INT32_MIN);
  op.kind = RED_PROD;
  red_reduce(&op, d32, a32, b32, 3);
  EXPECT_EQ(d32[1], 0);
  EXPECT_EQ(d32[2], 0);
  op = (struct red_op){.kind = RED_SUMPOSTDIV, .type = ncclInt32, .divisor = 3};
  EXPECT(red_has_postop(&op));
  red_postop(&op, d32, a32, 3);
  EXPECT_EQ(d32[0], INT32_MAX / 3);
  EXPECT_EQ(d32[2], -2); /* truncation toward zero */

  int64_t a64[3] = {INT64_MAX, INT64_MIN, -8}, b64[3] = {1, -1, 2}, d64[3];
  op = (struct red_op){.kind = RED_SUM, .type = ncclInt64};
  red_reduce(&op, d64, a64, b64, 3);
  EXPECT(d64[0] == INT64_MIN && d64[1] == INT64_MAX && d64[2] == -6);
  op = (struct red_op){.kind = RED_SUMPOSTDIV, .type = ncclInt64, .divisor = 3};
  red_postop(&op, d64, a64, 3);
  EXPECT(d64[1] == INT64_MIN / 3 && d64[2] == -2);
  op = (struct red_op){.kind = RED_PREMULSUM, .type = ncclInt64, .scalar_i = INT64_MIN};
  red_reduce(&op, d64, b64, b64, 3); /* d == neither, a == b */
  EXPECT(d64[0] == (int64_t)(1 + (uint64_t)INT64_MIN) && d64[2] == 2);

  uint64_t u64a[2] = {UINT64_MAX, 10}, u64b[2] = {UINT64_MAX, 20}, u64d[2];
  op = (struct red_op){.kind = RED_SUMPOSTDIV, .type = ncclUint64, .divisor = 3};
  red_reduce(&op, u64d, u64a, u64b, 2);
  red_postop(&op, u64d, u64d, 2);
  EXPECT(u64d[0] == (UINT64_MAX - 1) / 3 && u64d[1] == 10);
  op.kind = RED_MAX;
  red_reduce(&op, u64d, u64a, u64b, 2);
  EXPECT(u64d[0] == UINT64_MAX && u64d[1] == 20);
  op = (struct red_op){.kind = RED_SUMPOSTDIV, .type = ncclInt8, .divisor = 200};
  int8_t m8[2] = {-128, 127};
  red_postop(&op, m8, m8, 2);
  EXPECT(m8[0] == 0 && m8[1] == 0);
}

/* Max/min drop a single NaN (fmaxf rules); sums propagate NaN and Inf; overflow rules. */
TEST(reduce, float_specials) {
  float fa[4] = {NAN, 1.0f, NAN, -INFINITY}, fb[4] = {2.0f, NAN, NAN, INFINITY}, fd[4];
  struct red_op op = {.kind = RED_MAX, .type = ncclFloat32};
  red_reduce(&op, fd, fa, fb, 4);
  EXPECT(fd[0] == 2.0f && fd[1] == 1.0f && isnan(fd[2]) && fd[3] == INFINITY);
  op.kind = RED_MIN;
  red_reduce(&op, fd, fa, fb, 4);
  EXPECT(fd[0] == 2.0f && fd[1] == 1.0f && isnan(fd[2]) && fd[3] == -INFINITY);
  op.kind = RED_SUM;
  red_reduce(&op, fd, fa, fb, 4);
  EXPECT(isnan(fd[0]) && isnan(fd[1]) && isnan(fd[3]));

  double da[2] = {NAN, 3.0}, db[2] = {-1.0, NAN}, dd[2];
  op = (struct red_op){.kind = RED_MAX, .type = ncclFloat64};
  red_reduce(&op, dd, da, db, 2);
  EXPECT(dd[0] == -1.0 && dd[1] == 3.0);

  /* 16/8-bit: NaN in max, overflow of the sum. */
  static const int lowp[] = {ncclFloat16, ncclBfloat16, ncclFloat8e4m3, ncclFloat8e5m2};
  static const double maxv[] = {65504.0, 0x1.fep127, 448.0, 57344.0};
  for (int k = 0; k < 4; k++) {
    int t = lowp[k];
    unsigned char a[4], b[4], d[4 * 2];
    unsigned char xa[8], xb[8];
    put_f(t, xa, 0, NAN), put_f(t, xb, 0, 5.0);
    put_f(t, xa, 1, maxv[k]), put_f(t, xb, 1, maxv[k]);
    put_f(t, xa, 2, -maxv[k]), put_f(t, xb, 2, -maxv[k]);
    put_f(t, xa, 3, 1.0), put_f(t, xb, 3, NAN);
    memcpy(a, xa, sizeof a), memcpy(b, xb, sizeof b);
    op = (struct red_op){.kind = RED_MAX, .type = t};
    red_reduce(&op, xa, xa, xb, 4);
    EXPECT(get_f(t, xa, 0) == 5.0 && get_f(t, xa, 3) == 1.0);
    memcpy(xa, a, sizeof a), memcpy(xb, b, sizeof b);
    op.kind = RED_SUM;
    red_reduce(&op, d, xa, xb, 4);
    double over = t == ncclFloat8e4m3 ? 448.0 : INFINITY; /* e4m3 saturates */
    if (get_f(t, d, 1) != over || get_f(t, d, 2) != -over || !isnan(get_f(t, d, 0)) || !isnan(get_f(t, d, 3)))
      rt_fail(__FILE__, __LINE__, "%s: overflow/NaN sum wrong: %g %g %g %g", red_type_name(t),
              get_f(t, d, 0), get_f(t, d, 1), get_f(t, d, 2), get_f(t, d, 3));
  }
}

/* Identity premul/postop are copies (and no-ops in place); scalar 1 mod 2^8 is the identity. */
TEST(reduce, identity_copies) {
  for (int ti = 0; ti < NTYPES; ti++) {
    int t = all_types[ti];
    size_t es = red_type_size(t);
    unsigned char src[64 * 8], dst[64 * 8];
    for (size_t i = 0; i < sizeof src; i++) src[i] = (unsigned char)(i * 37 + 11);
    struct red_op op = {.kind = RED_PREMULSUM, .type = t, .scalar_f = 1.0, .scalar_i = 1, .divisor = 1};
    EXPECT(!red_has_premul(&op));
    memset(dst, 0, sizeof dst);
    red_premul(&op, dst, src, 64);
    EXPECT(memcmp(dst, src, 64 * es) == 0);
    op.kind = RED_SUMPOSTDIV;
    EXPECT(!red_has_postop(&op));
    memset(dst, 0, sizeof dst);
    red_postop(&op, dst, src, 64);
    EXPECT(memcmp(dst, src, 64 * es) == 0);
    red_postop(&op, dst, dst, 64);
    EXPECT(memcmp(dst, src, 64 * es) == 0);
    op.kind = RED_SUM;
    EXPECT(!red_has_premul(&op) && !red_has_postop(&op));
  }
  struct red_op op = {.kind = RED_PREMULSUM, .type = ncclUint8, .scalar_i = 257};
  EXPECT(!red_has_premul(&op));
  op.type = ncclInt32;
  EXPECT(red_has_premul(&op));
  op = (struct red_op){.kind = RED_PREMULSUM, .type = ncclFloat64, .scalar_f = 1.0 + 1e-12};
  EXPECT(red_has_premul(&op));
  op.type = ncclFloat32; /* rounds to 1.0f */
  EXPECT(!red_has_premul(&op));
}

/* SIMD and portable low-precision paths agree bit for bit on random data, for every kind. */
static uint64_t rng_state = 0x9e3779b97f4a7c15ull;
static uint32_t rng(void) {
  rng_state ^= rng_state << 13, rng_state ^= rng_state >> 7, rng_state ^= rng_state << 17;
  return (uint32_t)(rng_state >> 16);
}

TEST(reduce, lowp_paths_agree) {
  static const int lowp[] = {ncclFloat16, ncclBfloat16, ncclFloat8e4m3, ncclFloat8e5m2};
  enum { N = 4107 }; /* 16-wide body, one 8-wide step, a 3-element tail */
  static unsigned char a[N * 2], b[N * 2], d1[N * 2], d2[N * 2];
  for (int k = 0; k < 4; k++) {
    int t = lowp[k];
    size_t es = red_type_size(t);
    for (size_t i = 0; i < N * es; i++) a[i] = (unsigned char)rng(), b[i] = (unsigned char)rng();
    for (int kind = RED_SUM; kind <= RED_SUMPOSTDIV; kind++) {
      struct red_op op = {.kind = kind, .type = t, .scalar_f = 0.3, .divisor = 3};
      red_force_portable(0);
      red_reduce(&op, d1, a, b, N);
      red_postop(&op, d1, d1, N);
      red_force_portable(1);
      red_reduce(&op, d2, a, b, N);
      red_postop(&op, d2, d2, N);
      red_force_portable(0);
      for (size_t i = 0; i < N; i++) {
        double x = get_f(t, d1, i), y = get_f(t, d2, i);
        if (memcmp(d1 + i * es, d2 + i * es, es) != 0 && !(isnan(x) && isnan(y))) {
          rt_fail(__FILE__, __LINE__, "%s kind %d: SIMD %g vs portable %g at %zu", red_type_name(t), kind,
                  x, y, i);
          break;
        }
      }
    }
  }
}


/* ---- conversions: exhaustive round trips and rounding against a double-precision reference ---- */

struct fmt {
  int type, bits, man, ebits, emin;
  uint32_t maxpat; /* largest finite positive pattern */
  int sat;         /* overflow saturates to the largest finite value (e4m3) instead of Inf */
};
static const struct fmt fmts[] = {
    {ncclFloat16, 16, 10, 5, -14, 0x7bff, 0},
    {ncclBfloat16, 16, 7, 8, -126, 0x7f7f, 0},
    {ncclFloat8e4m3, 8, 3, 4, -6, 0x7e, 1},
    {ncclFloat8e5m2, 8, 2, 5, -14, 0x7b, 0},
};

static float sdec(int t, uint32_t v) {
  switch (t) {
    case ncclFloat16: return red_half_to_float((uint16_t)v);
    case ncclBfloat16: return red_bf16_to_float((uint16_t)v);
    case ncclFloat8e4m3: return red_e4m3_to_float((uint8_t)v);
    default: return red_e5m2_to_float((uint8_t)v);
  }
}
static uint32_t senc(int t, float f) {
  switch (t) {
    case ncclFloat16: return red_float_to_half(f);
    case ncclBfloat16: return red_float_to_bf16(f);
    case ncclFloat8e4m3: return red_float_to_e4m3(f);
    default: return red_float_to_e5m2(f);
  }
}
static uint32_t load_pat(const struct fmt* f, const void* p, size_t i) {
  return f->bits == 16 ? ((const uint16_t*)p)[i] : ((const uint8_t*)p)[i];
}

/* Independent decoding of a pattern's magnitude from the format's definition. */
static double ref_dec(const struct fmt* f, uint32_t p) {
  uint32_t e = (p >> f->man) & ((1u << f->ebits) - 1), m = p & ((1u << f->man) - 1);
  int bias = 1 - f->emin;
  uint32_t emax_field = (1u << f->ebits) - 1;
  if (f->type == ncclFloat8e4m3 ? (e == emax_field && m == 7) : (e == emax_field && m != 0)) return NAN;
  if (f->type != ncclFloat8e4m3 && e == emax_field) return INFINITY;
  if (e == 0) return ldexp((double)m, f->emin - f->man);
  return ldexp(1.0 + ldexp((double)m, -f->man), (int)e - bias);
}

/* Round-to-nearest-even of x into the format, in double arithmetic; returns the value. */
static double ref_round(const struct fmt* f, double x) {
  double maxfin = ref_dec(f, f->maxpat);
  if (isinf(x)) return f->sat ? copysign(maxfin, x) : x;
  if (x == 0) return x;
  int e;
  frexp(fabs(x), &e);
  int le = e - 1 < f->emin ? f->emin : e - 1;
  double ulp = ldexp(1.0, le - f->man);
  double v = nearbyint(fabs(x) / ulp) * ulp; /* exact division; nearbyint ties to even */
  if (v > maxfin) v = f->sat ? maxfin : INFINITY;
  return copysign(v, x);
}

/* The pattern of a reference value (values of positive patterns increase with the pattern). */
static uint32_t ref_pat(const struct fmt* f, double v) {
  uint32_t sign = signbit(v) ? 1u << (f->bits - 1) : 0, lo = 0, hi = f->maxpat;
  double a = fabs(v);
  if (isinf(a)) return sign | (((1u << f->ebits) - 1) << f->man);
  while (lo < hi) {
    uint32_t mid = (lo + hi) / 2;
    if (ref_dec(f, mid) < a) lo = mid + 1;
    else hi = mid;
  }
  return sign | lo;
}

static int nan_pat(const struct fmt* f, uint32_t p) {
  return isnan(ref_dec(f, p & ((1u << (f->bits - 1)) - 1)));
}

TEST(reduce, convert_roundtrip_exhaustive) {
  for (int k = 0; k < 4; k++) {
    const struct fmt* f = &fmts[k];
    uint32_t npat = 1u << f->bits, sbit = 1u << (f->bits - 1);
    int bad = 0;
    for (uint32_t p = 0; p < npat && bad < 5; p++) {
      float x = sdec(f->type, p);
      double r = ref_dec(f, p & (sbit - 1));
      uint32_t back = senc(f->type, x);
      int sign_ok = !!signbit(x) == !!(p & sbit), ok;
      if (isnan(r)) ok = isnan(x) && nan_pat(f, back) && (back & sbit) == (p & sbit) && sign_ok;
      else ok = fabs((double)x) == r && sign_ok && back == p;
      if (!ok)
        rt_fail(__FILE__, __LINE__, "%s: pattern %#x decodes to %a (reference %a), encodes back to %#x",
                red_type_name(f->type), p, (double)x, r, back), bad++;
    }
  }
}

/* Bulk conversions (SIMD and portable) match the scalar ones on every pattern. */
TEST(reduce, convert_bulk_decode) {
  static uint16_t pats[65536];
  static float out[65536];
  for (int port = 0; port < 2; port++) {
    red_force_portable(port);
    for (int k = 0; k < 4; k++) {
      const struct fmt* f = &fmts[k];
      uint32_t npat = 1u << f->bits;
      for (uint32_t p = 0; p < npat; p++) {
        if (f->bits == 16) pats[p] = (uint16_t)p;
        else ((uint8_t*)pats)[p] = (uint8_t)p;
      }
      red_to_float(f->type, out, pats, npat);
      for (uint32_t p = 0; p < npat; p++) {
        float s = sdec(f->type, p);
        int same = isnan(s) ? isnan(out[p]) && signbit(s) == signbit(out[p]) : memcmp(&s, &out[p], 4) == 0;
        if (!same) {
          rt_fail(__FILE__, __LINE__, "%s portable=%d: bulk decode of %#x gives %g, scalar %g",
                  red_type_name(f->type), port, p, out[p], s);
          break;
        }
      }
    }
  }
  red_force_portable(0);
}

/* Check scalar and both bulk encoders on xs[0..n) against the reference. */
static int check_encode(const struct fmt* f, const float* xs, size_t n, void* buf) {
  int bad = 0;
  for (int path = 0; path < 3 && !bad; path++) {
    if (path > 0) {
      red_force_portable(path == 2);
      red_from_float(f->type, buf, xs, n);
    }
    for (size_t i = 0; i < n; i++) {
      uint32_t got = path == 0 ? senc(f->type, xs[i]) : load_pat(f, buf, i);
      int ok;
      if (isnan(xs[i])) ok = nan_pat(f, got) && !!(got >> (f->bits - 1)) == !!signbit(xs[i]);
      else ok = got == ref_pat(f, ref_round(f, (double)xs[i]));
      if (!ok) {
        rt_fail(__FILE__, __LINE__, "%s path %d: %a -> %#x, expected %#x", red_type_name(f->type), path,
                (double)xs[i], got, ref_pat(f, ref_round(f, (double)xs[i])));
        bad = 1;
        break;
      }
    }
  }
  red_force_portable(0);
  return bad;
}

/* Every midpoint between neighbours (ties), its float neighbours, every representable value, the
 * overflow threshold, and random fp32 patterns, with both signs. */
TEST_T(reduce, convert_rounding_reference, 120) {
  enum { NRAND = 1 << 18 };
  size_t cap = 65536 * 8 + NRAND + 64;
  float* xs = malloc(cap * sizeof(float));
  void* buf = malloc(cap * 2);
  ASSERT(xs && buf);
  for (int k = 0; k < 4; k++) {
    const struct fmt* f = &fmts[k];
    size_t n = 0;
    for (uint32_t p = 0; p <= f->maxpat; p++) {
      double lo = ref_dec(f, p);
      /* Above the largest finite value the next step would be one ulp up (2^(emax+1)). */
      double hi = p < f->maxpat ? ref_dec(f, p + 1) : lo + ldexp(1.0, (int)floor(log2(lo)) - f->man);
      float mid = (float)((lo + hi) / 2);
      ASSERT((double)mid == (lo + hi) / 2); /* midpoints are exact in fp32 for these formats */
      float c[4] = {mid, nextafterf(mid, INFINITY), nextafterf(mid, 0), (float)lo};
      for (int j = 0; j < 4; j++) xs[n++] = c[j], xs[n++] = -c[j];
    }
    static const float specials[] = {0.0f,  INFINITY, NAN,    0x1p-149f, 0x1p-126f,
                                     0x1.fffffep127f, 1e-30f, 1e30f};
    for (size_t j = 0; j < sizeof specials / sizeof specials[0]; j++)
      xs[n++] = specials[j], xs[n++] = -specials[j];
    for (int j = 0; j < NRAND; j++) {
      uint32_t u = rng();
      memcpy(&xs[n++], &u, 4);
    }
    ASSERT(n <= cap);
    if (check_encode(f, xs, n, buf)) break;
  }
  free(xs);
  free(buf);
}

/* Streaming copy: every destination misalignment and length around the 64-byte line, bytes around
 * the copied range untouched. */
TEST(reduce, stream_copy) {
  static unsigned char src[1024], dst[1024 + 128];
  for (int i = 0; i < 1024; i++) src[i] = (unsigned char)(i * 7 + 3);
  for (int off = 0; off < 64; off += 3)
    for (size_t len = 0; len <= 600; len += len < 140 ? 1 : 37) {
      memset(dst, 0xee, sizeof dst);
      red_nt_copy(dst + off, src + (off % 5), len);
      red_nt_fence();
      for (int i = 0; i < (int)sizeof dst; i++) {
        int in = i >= off && (size_t)(i - off) < len;
        unsigned want = in ? src[i - off + off % 5] : 0xee;
        if (dst[i] != want) {
          rt_fail(__FILE__, __LINE__, "off %d len %zu: byte %d = %u, want %u", off, len, i, dst[i], want);
          return;
        }
      }
    }
}
