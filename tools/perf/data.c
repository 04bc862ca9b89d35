/* Test data whose collective results are known exactly, whatever order the library reduces in.
 *
 * Every element is a small integer (or a power of two for prod) chosen by hashing (seed, index,
 * rank), bounded so that any partial sum or product stays exactly representable in the element
 * type: integer sums never wrap, float sums never round. Results can then be compared bit for bit.
 * Only avg on floating types is compared with a tolerance, because a library may scale each input by
 * 1/n before summing (as NCCL does), which rounds. The expected values are computed on the fly, so
 * no "expected" buffer is needed. */
#include <math.h>
#include <string.h>
#include <strings.h>

#include "common.h"
#include "../../src/misc/names.h"

/* Names are the library's (src/misc/names.h): nccl-tests' spelling, "float", "half". */
struct tinfo {
  int size, is_float, is_signed;
  double limit; /* largest magnitude whose integers (and sums up to it) are exact */
  int ebits, mbits;
};

static const struct tinfo types[ncclNumTypes] = {
    [ncclInt8] = {1, 0, 1, 127, 0, 0},
    [ncclUint8] = {1, 0, 0, 255, 0, 0},
    [ncclInt32] = {4, 0, 1, 1 << 20, 0, 0},
    [ncclUint32] = {4, 0, 0, 1 << 20, 0, 0},
    [ncclInt64] = {8, 0, 1, 1 << 20, 0, 0},
    [ncclUint64] = {8, 0, 0, 1 << 20, 0, 0},
    [ncclFloat16] = {2, 1, 1, 2048, 5, 10},
    [ncclFloat32] = {4, 1, 1, 1 << 24, 8, 23},
    [ncclFloat64] = {8, 1, 1, 1 << 24, 11, 52},
    [ncclBfloat16] = {2, 1, 1, 256, 8, 7},
    [ncclFloat8e4m3] = {1, 1, 1, 16, 4, 3},
    [ncclFloat8e5m2] = {1, 1, 1, 8, 5, 2},
};

/* ---- wire formats: the error bound of docs/WIRE.md, per rounding (rel |x| + grp amax + tiny) ---- */
static const struct {
  const char* name;
  double rel, grp, tiny;
} wires[] = {{"off", 0, 0, 0},
             {"bf16", 0x1p-8, 0, 0x1p-134},
             {"fp16", 0x1p-11, 0, 0x1p-25},
             {"fp8e4m3", 0x1p-4, 0, 0x1p-10},
             {"fp8e5m2", 0x1p-3, 0, 0x1p-17},
             {"mx8", 0x1p-4, 0x1p-10 / 224.0, 0x1p-137}};
static int wire_on; /* index into wires, 0: results compared bit for bit */

int perf_wire_parse(const char* s) {
  if (!s || !*s) return 0;
  size_t n = strlen(s) - (s[strlen(s) - 1] == '!');
  for (int i = 0; i < (int)(sizeof wires / sizeof wires[0]); i++)
    if (strlen(wires[i].name) == n && strncasecmp(s, wires[i].name, n) == 0) return i;
  return -1;
}

void perf_wire_use(const char* s) {
  int w = perf_wire_parse(s);
  wire_on = w > 0 ? w : 0;
}

/* Whether a result of type t may carry the wire format's error (the library compresses float32, and
 * bfloat16 with the 8-bit formats; the bound is loose enough to cover both). */
static int wire_tolerant(ncclDataType_t t) { return wire_on && (t == ncclFloat32 || t == ncclBfloat16); }

/* The type's generator parameters; under a wire format whose values have a small range (fp16, the fp8
 * formats) float32 and bfloat16 data keep within the integers that format holds exactly, as they do
 * for data of that type (mx8 scales per group: any range). */
static struct tinfo tinfo_of(ncclDataType_t t) {
  struct tinfo ti = types[t];
  static const int as[] = {0, ncclBfloat16, ncclFloat16, ncclFloat8e4m3, ncclFloat8e5m2, 0};
  if (wire_tolerant(t) && as[wire_on] && types[as[wire_on]].limit < ti.limit) ti.limit = types[as[wire_on]].limit;
  return ti;
}

/* |got - want| within h roundings of partial results bounded by sum_abs (and each rank's values by
 * amax), plus the result's own rounding to t. */
static int wire_close(double got, double want, double sum_abs, double amax, int h, int nranks, ncclDataType_t t) {
  double rel = wires[wire_on].rel, grow = pow(1 + rel, h);
  double tol = (grow - 1) * sum_abs + h * (wires[wire_on].grp * amax * nranks * grow + wires[wire_on].tiny);
  tol += fabs(want) * (t == ncclBfloat16 ? 0x1p-8 : 0x1p-23);
  return fabs(got - want) <= tol;
}

int perf_type_size(ncclDataType_t t) { return (unsigned)t < ncclNumTypes ? types[t].size : 0; }
const char* perf_type_name(ncclDataType_t t) {
  const char* n = ch_type_test_name((int)t);
  return n ? n : "?";
}

int perf_type_parse(const char* s) {
  if (strcmp(s, "all") == 0) return -1;
  int t = ch_type_test_parse(s);
  return t >= 0 ? t : -2;
}

/* ---- small floats: half, bfloat16 and the two fp8 formats (e4m3 has no infinity, max 448) ---- */
static uint32_t enc_small(double v, int eb, int mb, int fn) {
  uint32_t sign = signbit(v) ? 1u : 0u, bits;
  int bias = (1 << (eb - 1)) - 1;
  uint32_t inf = fn ? 0x7E : ((1u << eb) - 1) << mb; /* e4m3 saturates at its largest finite */
  double a = fabs(v);
  if (isnan(a)) {
    bits = fn ? 0x7F : inf | (1u << (mb - 1));
  } else if (a == 0) {
    bits = 0;
  } else {
    int e;
    double f = frexp(a, &e); /* a = f * 2^e, f in [0.5, 1) */
    int biased = e - 1 + bias;
    if (biased >= 1) {
      uint64_t m = (uint64_t)nearbyint((f * 2 - 1) * (double)(1u << mb));
      bits = ((uint32_t)biased << mb) + (uint32_t)m; /* a mantissa carry bumps the exponent */
    } else {
      bits = (uint32_t)nearbyint(a / ldexp(1.0, 1 - bias - mb));
    }
    if (bits > inf) bits = inf;
  }
  return (sign << (eb + mb)) | bits;
}

static double dec_small(uint32_t bits, int eb, int mb, int fn) {
  int bias = (1 << (eb - 1)) - 1;
  uint32_t e = (bits >> mb) & ((1u << eb) - 1), m = bits & ((1u << mb) - 1);
  double v;
  if (fn && e == (1u << eb) - 1 && m == (1u << mb) - 1) v = NAN;
  else if (!fn && e == (1u << eb) - 1) v = m ? NAN : INFINITY;
  else if (e == 0) v = ldexp((double)m, 1 - bias - mb);
  else v = ldexp((double)((1u << mb) | m), (int)e - bias - mb);
  return (bits >> (eb + mb)) & 1 ? -v : v;
}

void perf_encode(void* out, ncclDataType_t t, double v) {
  switch (t) {
    case ncclInt8: { int8_t x = (int8_t)v; memcpy(out, &x, 1); break; }
    case ncclUint8: { uint8_t x = (uint8_t)v; memcpy(out, &x, 1); break; }
    case ncclInt32: { int32_t x = (int32_t)v; memcpy(out, &x, 4); break; }
    case ncclUint32: { uint32_t x = (uint32_t)v; memcpy(out, &x, 4); break; }
    case ncclInt64: { int64_t x = (int64_t)v; memcpy(out, &x, 8); break; }
    case ncclUint64: { uint64_t x = (uint64_t)v; memcpy(out, &x, 8); break; }
    case ncclFloat32: { float x = (float)v; memcpy(out, &x, 4); break; }
    case ncclFloat64: memcpy(out, &v, 8); break;
    case ncclFloat16:
    case ncclBfloat16: {
      uint16_t x = (uint16_t)enc_small(v, types[t].ebits, types[t].mbits, 0);
      memcpy(out, &x, 2);
      break;
    }
    case ncclFloat8e4m3:
    case ncclFloat8e5m2: {
      uint8_t x = (uint8_t)enc_small(v, types[t].ebits, types[t].mbits, t == ncclFloat8e4m3);
      memcpy(out, &x, 1);
      break;
    }
    default: break;
  }
}

double perf_decode(const void* in, ncclDataType_t t) {
  switch (t) {
    case ncclInt8: { int8_t x; memcpy(&x, in, 1); return x; }
    case ncclUint8: { uint8_t x; memcpy(&x, in, 1); return x; }
    case ncclInt32: { int32_t x; memcpy(&x, in, 4); return x; }
    case ncclUint32: { uint32_t x; memcpy(&x, in, 4); return x; }
    case ncclInt64: { int64_t x; memcpy(&x, in, 8); return (double)x; }
    case ncclUint64: { uint64_t x; memcpy(&x, in, 8); return (double)x; }
    case ncclFloat32: { float x; memcpy(&x, in, 4); return x; }
    case ncclFloat64: { double x; memcpy(&x, in, 8); return x; }
    case ncclFloat16:
    case ncclBfloat16: { uint16_t x; memcpy(&x, in, 2); return dec_small(x, types[t].ebits, types[t].mbits, 0); }
    case ncclFloat8e4m3:
    case ncclFloat8e5m2: {
      uint8_t x;
      memcpy(&x, in, 1);
      return dec_small(x, types[t].ebits, types[t].mbits, t == ncclFloat8e4m3);
    }
    default: return NAN;
  }
}

/* ---- generators ---- */
static inline uint64_t mix(uint64_t seed, uint64_t idx, uint64_t rank) {
  uint64_t h = (seed + 1) * 0x9E3779B97F4A7C15ull ^ idx * 0xBF58476D1CE4E5B9ull ^ (rank + 1) * 0x94D049BB133111EBull;
  h ^= h >> 31;
  h *= 0xD6E8FEB86659FD93ull;
  h ^= h >> 32;
  return h;
}

/* Uniform integer in [-m, m] (signed) or [0, m]. */
static inline double pick(uint64_t h, double m, int is_signed) {
  uint64_t mm = (uint64_t)m;
  return is_signed ? (double)(h % (2 * mm + 1)) - (double)mm : (double)(h % (mm + 1));
}

/* avg: ranks contribute v+k, v-k pairs (and v for an unpaired last rank), so the sum is n*v and
 * every partial sum stays within (n+1)*m (signed) or (2n+1)*m (unsigned, where v >= k). */
static void avg_base(const struct tinfo* ti, uint64_t seed, size_t idx, int n, double* v, double* k) {
  double m = floor(ti->limit / (ti->is_signed ? n + 1.0 : 2.0 * n + 1));
  uint64_t h = mix(seed, idx, 0xFFFFFFFFu);
  *k = (double)((h >> 24) % ((uint64_t)m + 1));
  *v = ti->is_signed ? pick(h, m, 1) : *k + pick(h, m, 0);
}

static double gen(const struct tinfo* ti, int kind, uint64_t seed, size_t idx, int rank, int n) {
  uint64_t h = mix(seed, idx, (uint64_t)rank);
  switch (kind) {
    case ncclSum:
    case PERF_OP_MULSUM: {
      double smax = kind == PERF_OP_MULSUM ? 2 : 1;
      double m = floor(ti->limit / (n * smax));
      if (m >= 1) return pick(h, m, ti->is_signed);
      return (rank < ti->limit / smax && (h & 1)) ? 1 : 0; /* more ranks than exact integers */
    }
    case ncclProd: {
      int stride = n > 2 ? (n + 2) / 3 : 1; /* at most ~3 ranks per element differ from 1 */
      if ((size_t)(rank % stride) != idx % (size_t)stride) return 1;
      static const double fl[4] = {2, 0.5, -1, 1}, si[4] = {2, -1, 1, 2}, un[4] = {2, 1, 2, 1};
      return (ti->is_float ? fl : ti->is_signed ? si : un)[h & 3];
    }
    case ncclAvg: {
      double v, k;
      avg_base(ti, seed, idx, n, &v, &k);
      if (rank % 2 == 0 && rank + 1 < n) return v + k;
      return rank % 2 ? v - k : v;
    }
    default: /* max, min, copies */
      return pick(h, ti->limit, ti->is_signed);
  }
}

void perf_fill(void* buf, size_t n, ncclDataType_t t, int kind, uint64_t seed, size_t idx0, int rank,
               int nranks) {
  struct tinfo tw = tinfo_of(t);
  const struct tinfo* ti = &tw;
  char* p = buf;
  for (size_t i = 0; i < n; i++, p += ti->size) perf_encode(p, t, gen(ti, kind, seed, idx0 + i, rank, nranks));
}

static inline int same_bits(const char* got, ncclDataType_t t, double want) {
  char w[8];
  perf_encode(w, t, want);
  return memcmp(got, w, (size_t)types[t].size) == 0;
}

int64_t perf_check_fill(const void* buf, size_t n, ncclDataType_t t, int kind, uint64_t seed, size_t idx0,
                        int rank, int nranks) {
  struct tinfo tw = tinfo_of(t);
  const struct tinfo* ti = &tw;
  const char* p = buf;
  int64_t wrong = 0;
  for (size_t i = 0; i < n; i++, p += ti->size)
    wrong += !same_bits(p, t, gen(ti, kind, seed, idx0 + i, rank, nranks));
  return wrong;
}

int64_t perf_check_reduced(const void* buf, size_t n, ncclDataType_t t, int op, uint64_t seed, size_t idx0,
                           int nranks) {
  struct tinfo tw = tinfo_of(t);
  const struct tinfo* ti = &tw;
  const char* p = buf;
  int64_t wrong = 0;
  for (size_t i = 0; i < n; i++, p += ti->size) {
    size_t idx = idx0 + i;
    double acc = gen(ti, op, seed, idx, 0, nranks), mag = fabs(acc);
    if (op == PERF_OP_MULSUM) acc = 0; /* redone below with the per-rank scalar */
    for (int r = op == PERF_OP_MULSUM ? 0 : 1; r < nranks; r++) {
      double x = gen(ti, op, seed, idx, r, nranks);
      if (fabs(x) > mag) mag = fabs(x);
      switch (op) {
        case ncclProd: acc *= x; break;
        case ncclMax: acc = x > acc ? x : acc; break;
        case ncclMin: acc = x < acc ? x : acc; break;
        case PERF_OP_MULSUM: acc += (r % 2 ? 2 : 1) * x; break;
        default: acc += x; break; /* sum, avg */
      }
    }
    if (wire_tolerant(t) && op != ncclProd && op != ncclMax && op != ncclMin) {
      double s = 0, amax = 0;
      for (int r = 0; r < nranks; r++) {
        double x = fabs(gen(ti, op, seed, idx, r, nranks)) * (op == PERF_OP_MULSUM && r % 2 ? 2 : 1);
        s += x, amax = x > amax ? x : amax;
      }
      /* every rank's values are within the generator's range: a group's largest too */
      double range = op == ncclAvg ? ti->limit : floor(ti->limit / nranks);
      if (op == ncclAvg) acc /= nranks, s /= nranks, range /= nranks;
      wrong += !wire_close(perf_decode(p, t), acc, s, range > amax ? range : amax, nranks, nranks, t);
      continue;
    }
    if (wire_tolerant(t)) { /* prod, max, min: each rounding relative to the result, or to the largest */
      double m = op == ncclProd ? fabs(acc) : mag;
      wrong += !wire_close(perf_decode(p, t), acc, m, ti->limit, nranks, 1, t);
      continue;
    }
    if (op == ncclAvg) {
      acc = ti->is_float ? acc / nranks : trunc(acc / nranks);
      if (ti->is_float && (nranks & (nranks - 1))) {
        /* Scaling by 1/n rounds when n is not a power of two (NCCL scales each input, then sums):
         * allow n+2 ulps of the largest input. With n a power of two every step is exact. */
        double got = perf_decode(p, t), ulp = ldexp(1.0, (int)floor(log2(mag > 1 ? mag : 1)) - ti->mbits);
        wrong += !(fabs(got - acc) <= (nranks + 2) * ulp);
        continue;
      }
    }
    wrong += !same_bits(p, t, acc);
  }
  return wrong;
}

int64_t perf_check_copied(const void* buf, size_t n, ncclDataType_t t, uint64_t seed, size_t idx0, int rank,
                          int nranks) {
  if (!wire_tolerant(t)) return perf_check_fill(buf, n, t, PERF_COPY, seed, idx0, rank, nranks);
  struct tinfo tw = tinfo_of(t);
  const struct tinfo* ti = &tw;
  const char* p = buf;
  int64_t wrong = 0;
  for (size_t i = 0; i < n; i++, p += ti->size) {
    double want = gen(ti, PERF_COPY, seed, idx0 + i, rank, nranks);
    wrong += !wire_close(perf_decode(p, t), want, fabs(want), ti->limit, 1, 1, t);
  }
  return wrong;
}

int64_t perf_check_zero(const void* buf, size_t n, ncclDataType_t t) {
  const char* p = buf;
  int64_t wrong = 0;
  size_t sz = (size_t)types[t].size;
  for (size_t i = 0; i < n; i++, p += sz) {
    int nz = 0;
    for (size_t j = 0; j < sz; j++) nz |= p[j];
    wrong += nz != 0;
  }
  return wrong;
}

void perf_mulsum_scalar(void* out, ncclDataType_t t, int rank) {
  memset(out, 0, 8);
  perf_encode(out, t, rank % 2 ? 2 : 1);
}

size_t perf_per_rank_count(size_t count, int nranks, int elt) {
  size_t per = count / (size_t)nranks;
  size_t align = elt < 16 ? (size_t)(16 / elt) : 1;
  return per & ~(align - 1);
}

void perf_zero(void* p, size_t elems, ncclDataType_t t) { memset(p, 0, elems * (size_t)perf_type_size(t)); }

void perf_layout_flat(size_t count, int nranks, int elt, perf_layout* l) {
  (void)nranks, (void)elt;
  l->send_count = l->recv_count = l->param_count = count;
  l->send_inplace = l->recv_inplace = 0;
}
void perf_layout_gather(size_t count, int nranks, int elt, perf_layout* l) {
  size_t b = perf_per_rank_count(count, nranks, elt);
  l->send_count = l->param_count = b;
  l->recv_count = b * (size_t)nranks;
  l->send_inplace = b; /* in place: send = recv + rank*b */
  l->recv_inplace = 0;
}

void perf_layout_scatter(size_t count, int nranks, int elt, perf_layout* l) {
  size_t b = perf_per_rank_count(count, nranks, elt);
  l->recv_count = l->param_count = b;
  l->send_count = b * (size_t)nranks;
  l->send_inplace = 0;
  l->recv_inplace = b; /* in place: recv = send + rank*b */
}

void perf_init_gathered(const perf_buf* b) {
  perf_zero(b->recv_base, b->lay.recv_count, b->type); /* first: in place the input lies inside */
  perf_fill(b->send, b->count, b->type, PERF_COPY, b->seed, (size_t)b->rank * b->count, b->rank, b->nranks);
}

int64_t perf_check_gathered(const perf_buf* b) {
  int64_t wrong = 0;
  for (int q = 0; q < b->nranks; q++)
    wrong += perf_check_copied(perf_at(b->recv, (size_t)q * b->count, b->type), b->count, b->type, b->seed,
                               (size_t)q * b->count, q, b->nranks);
  return wrong;
}

double perf_bytes_flat(size_t count, int elt, int nranks) { return (void)nranks, (double)count * elt; }
double perf_bytes_ranks(size_t count, int elt, int nranks) { return (double)count * elt * nranks; }
double perf_factor_one(int nranks) { return (void)nranks, 1.0; }
double perf_factor_ring(int nranks) { return (double)(nranks - 1) / nranks; }
