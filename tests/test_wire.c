/* Compressed wire formats (docs/WIRE.md): the encodings against their definitions (error bound of one
 * rounding, idempotence, special values, layout), then collectives that use them, against a float64
 * reference and the bound for the hops their values crossed, every rank with the same bits. */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "chorus.h"
#include "coll_util.h"
#include "../src/reduce/reduce.h"
#include "../src/reduce/wire.h"
#include "../src/misc/param.h"
#include "runner.h"

static const int fmts[] = {WIRE_BF16, WIRE_FP16, WIRE_E4M3, WIRE_E5M2, WIRE_MX8};
#define NF 5

static uint64_t rng = 88172645463325252ull;
static uint32_t rnd32(void) {
  rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
  return (uint32_t)(rng >> 16);
}
/* Values of mixed signs and magnitudes 2^lo .. 2^hi. */
static float rnd_val(int lo, int hi) {
  float m = 1.0f + (float)(rnd32() & 0xffffff) / 16777216.0f;
  int e = lo + (int)(rnd32() % (uint32_t)(hi - lo + 1));
  return (rnd32() & 1 ? -1.0f : 1.0f) * ldexpf(m, e);
}
/* The exponents each format holds without overflow (e4m3 and e5m2 have no scale). */
static void range_of(int f, int* lo, int* hi) {
  *lo = -30, *hi = 30;
  if (f == WIRE_E4M3) *lo = -12, *hi = 7;
  if (f == WIRE_E5M2) *lo = -20, *hi = 14;
  if (f == WIRE_FP16) *lo = -28, *hi = 14;
}

/* One rounding of n values: within rel |x| + grp amax(group) + tiny, and a second rounding changes
 * nothing, bit for bit. */
static void check_rounding(int f, int type, const float* x, size_t n) {
  double rel, grp, tiny;
  wire_error(f, &rel, &grp, &tiny);
  size_t es = red_type_size(type);
  char* buf = malloc(n * es);
  char* w = malloc(wire_bytes(f, type, n));
  float* y = malloc(n * sizeof(float));
  float* xin = malloc(n * sizeof(float));
  ASSERT(buf && w && y && xin);
  red_from_float(type, buf, x, n); /* bfloat16 input: the values as that type holds them */
  red_to_float(type, xin, buf, n);
  wire_encode(f, type, w, buf, n);
  wire_decode(f, type, buf, w, n);
  red_to_float(type, y, buf, n);
  double extra = type == ncclBfloat16 ? 0x1p-8 : 0.0; /* the decoded value rounded back to bfloat16 */
  for (size_t i = 0; i < n; i++) {
    double amax = 0;
    size_t g0 = i / WIRE_GROUP * WIRE_GROUP;
    for (size_t k = g0; k < n && k < g0 + WIRE_GROUP; k++) amax = fmax(amax, fabs((double)xin[k]));
    double err = fabs((double)y[i] - (double)xin[i]);
    double b = (rel + extra) * fabs((double)xin[i]) + grp * amax + tiny;
    if (!(err <= b)) {
      rt_fail(__FILE__, __LINE__, "%s on %s: x=%a rounds to %a, error %g > bound %g", wire_name(f), red_type_name(type), xin[i], y[i],
             err, b);
      break;
    }
  }
  /* idempotent */
  char* again = malloc(n * es);
  ASSERT(again);
  memcpy(again, buf, n * es);
  wire_round(f, type, again, n);
  EXPECT(memcmp(again, buf, n * es) == 0);
  free(again), free(buf), free(w), free(y), free(xin);
}

TEST(wire, rounding_bound_and_idempotent) {
  enum { N = 4099 }; /* not a multiple of a group or a block */
  float* x = malloc(N * sizeof(float));
  ASSERT(x);
  for (int k = 0; k < NF; k++) {
    int f = fmts[k], lo, hi;
    range_of(f, &lo, &hi);
    for (int i = 0; i < N; i++) x[i] = rnd_val(lo, hi);
    for (int i = 0; i < N; i += 97) x[i] = 0.0f;
    check_rounding(f, ncclFloat32, x, N);
    if (wire_applies(f, ncclBfloat16)) check_rounding(f, ncclBfloat16, x, N);
    /* mx8: groups of one magnitude and of wide spread, tiny and huge */
    if (f == WIRE_MX8) {
      for (int i = 0; i < N; i++) x[i] = rnd_val(90 + (i / 32) % 20, 100 + (i / 32) % 20);
      check_rounding(f, ncclFloat32, x, N);
      for (int i = 0; i < N; i++) x[i] = rnd_val(-140, -120);
      check_rounding(f, ncclFloat32, x, N);
    }
  }
  free(x);
}

TEST(wire, special_values) {
  const float inf = INFINITY;
  float x[5] = {NAN, inf, -inf, 1e6f, -1e6f}, y[5];
  uint8_t w[128]; /* 64 mx8 values take 66 bytes */
  for (int k = 0; k < NF; k++) {
    int f = fmts[k];
    wire_encode(f, ncclFloat32, w, x, 5);
    wire_decode(f, ncclFloat32, y, w, 5);
    EXPECT(isnan(y[0]));
    if (f == WIRE_MX8) { /* a group with a NaN or an Inf is all NaN (the MX scale's NaN) */
      for (int i = 0; i < 5; i++) EXPECT(isnan(y[i]));
    } else if (f == WIRE_E4M3) { /* saturating: Inf and overflow give +-448 */
      EXPECT(y[1] == 448.0f && y[2] == -448.0f && y[3] == 448.0f && y[4] == -448.0f);
    } else if (f == WIRE_BF16) {
      EXPECT(y[1] == inf && y[2] == -inf && fabsf(y[3] - 1e6f) <= 1e6f / 256);
    } else { /* fp16 and e5m2 overflow to Inf */
      EXPECT(y[1] == inf && y[2] == -inf && y[3] == inf && y[4] == -inf);
    }
  }
  /* mx8: one group's NaN does not spread to the next; an all-zero group stays zero */
  float z[64] = {0};
  z[40] = NAN, z[41] = 3.0f;
  float o[64];
  wire_encode(WIRE_MX8, ncclFloat32, w, z, 64);
  wire_decode(WIRE_MX8, ncclFloat32, o, w, 64);
  for (int i = 0; i < 32; i++) EXPECT(o[i] == 0.0f);
  EXPECT(isnan(o[41]));
  /* huge values keep their scale: no saturation inside a group */
  float h[3] = {3e38f, -1e38f, 1.0f}, hy[3];
  wire_encode(WIRE_MX8, ncclFloat32, w, h, 3);
  wire_decode(WIRE_MX8, ncclFloat32, hy, w, 3);
  EXPECT(fabsf(hy[0] - 3e38f) <= 3e38f / 16 && fabsf(hy[1] + 1e38f) <= 1e38f / 16);
}

TEST(wire, parse_and_layout) {
  EXPECT_EQ(wire_parse("off"), WIRE_OFF);
  EXPECT_EQ(wire_parse(""), WIRE_OFF);
  EXPECT_EQ(wire_parse(NULL), WIRE_OFF);
  EXPECT_EQ(wire_parse("BF16"), WIRE_BF16);
  EXPECT_EQ(wire_parse("mx8!"), WIRE_MX8 | WIRE_FORCE);
  EXPECT_EQ(wire_parse("fp8e4m3"), WIRE_E4M3);
  EXPECT_EQ(wire_parse("fp8e5m2!"), WIRE_E5M2 | WIRE_FORCE);
  EXPECT_EQ(wire_parse("fp8"), -1);
  EXPECT_EQ(wire_parse("!"), -1);
  EXPECT_EQ(wire_parse("bf16!!"), -1);
  EXPECT_EQ(wire_bytes(WIRE_MX8, ncclFloat32, 1), 2u);
  EXPECT_EQ(wire_bytes(WIRE_MX8, ncclFloat32, 32), 33u);
  EXPECT_EQ(wire_bytes(WIRE_MX8, ncclFloat32, 33), 35u);
  EXPECT_EQ(wire_bytes(WIRE_BF16, ncclFloat32, 10), 20u);
  EXPECT_EQ(wire_bytes(WIRE_BF16, ncclBfloat16, 10), 20u); /* not compressed: bfloat16 stays */
  EXPECT_EQ(wire_bytes(WIRE_E4M3, ncclBfloat16, 10), 10u);
  EXPECT_EQ(wire_bytes(WIRE_MX8, ncclInt32, 10), 40u);
  EXPECT(!wire_applies(WIRE_FP16, ncclBfloat16) && !wire_applies(WIRE_BF16, ncclFloat64));
  /* encoding in pieces at multiples of 32 gives the bytes of one encoding */
  enum { N = 2000 };
  static float x[N];
  static uint8_t a[N * 2], b[N * 2];
  for (int i = 0; i < N; i++) x[i] = rnd_val(-10, 10);
  for (int k = 0; k < NF; k++) {
    int f = fmts[k];
    wire_encode(f, ncclFloat32, a, x, N);
    for (size_t at = 0; at < N; at += 1024)
      wire_encode(f, ncclFloat32, b + wire_bytes(f, ncclFloat32, at), x + at, at + 1024 <= N ? 1024 : N - at);
    EXPECT(memcmp(a, b, wire_bytes(f, ncclFloat32, N)) == 0);
  }
}

/* ---- collectives ---- */

#define CN 5003 /* several steps of a small FIFO (NCCL_BUFFSIZE below), a partial group at the end */
#define MAXR 4
static float results[MAXR][CN]; /* threads: each rank's AllReduce result, compared bit for bit */

static float input_of(int rank, size_t i) {
  uint64_t s = (uint64_t)rank * 1000003u + i * 7919u + 17;
  s ^= s >> 13, s *= 0x9E3779B97F4A7C15ull, s ^= s >> 29;
  float m = 1.0f + (float)(s & 0xffff) / 65536.0f;
  int e = (int)((s >> 20) % 9) - 4;
  return ((s >> 40) & 1 ? -1.0f : 1.0f) * ldexpf(m, e);
}

/* Bound of an AllReduce / Reduce / ReduceScatter element whose partial sums crossed at most h roundings. */
static double sum_bound(int f, int n, size_t i, int h) {
  double rel, grp, tiny, s = 0, g = 0;
  wire_error(f, &rel, &grp, &tiny);
  size_t g0 = i / WIRE_GROUP * WIRE_GROUP; /* mx8 groups of the rank's values (a step may cut a group) */
  for (int r = 0; r < n; r++) {
    s += fabs((double)input_of(r, i));
    double a = 0;
    for (size_t k = g0 >= 32 ? g0 - 32 : 0; k < g0 + 64 && k < CN; k++) a = fmax(a, fabs((double)input_of(r, k)));
    g += a;
  }
  double grow = pow(1 + rel, h);
  return (grow - 1) * s + h * (grp * g * grow + tiny) + n * 0x1p-23 * s;
}

struct wcase {
  int fmt;
  int procs;
  int per_call; /* the format through ncclCollConfig_t's ext, not the communicator's */
};

static ncclResult_t allreduce(const float* x, float* y, size_t n, ncclComm_t comm, int fmt, int per_call) {
  if (!per_call) return ncclAllReduce(x, y, n, ncclFloat32, ncclSum, comm, NULL);
  ncclConfigExt_t e = {.next = NULL, .key = {CHORUS_CONFIG_EXT_VENDOR, CHORUS_COLL_OPT_WIRE_FORMAT}};
  e.val.i = fmt | chorusWireForce;
  ncclCollConfig_t c = NCCL_COLLCONFIG_INITIALIZER;
  c.ext = &e;
  return ncclAllReduceConfig(x, y, n, ncclFloat32, ncclSum, comm, NULL, &c);
}

static uint64_t sent_total(ncclComm_t comm, int n) {
  uint64_t s = 0;
  for (int r = 0; r < n; r++) {
    chorusPeerCounters_t pc;
    NCCL_OK(chorusCommGetPeerCounters(comm, r, &pc));
    s += pc.bytesSent;
  }
  return s;
}

static void coll_body(int rank, int n, ncclUniqueId id, void* arg) {
  const struct wcase* wc = arg;
  ncclComm_t comm = cu_comm_init(rank, n, id);
  float* x = malloc(CN * sizeof(float));
  float* y = malloc(CN * sizeof(float));
  float* all = malloc((size_t)n * CN * sizeof(float));
  ASSERT(x && y && all);
  for (size_t i = 0; i < CN; i++) x[i] = input_of(rank, i);
  /* the bytes on the wire (the peer counters): the same algorithm, exact then compressed */
  uint64_t s0 = sent_total(comm, n);
  NCCL_OK(allreduce(x, y, CN, comm, chorusWireOff, 1));
  uint64_t s1 = sent_total(comm, n);
  NCCL_OK(allreduce(x, y, CN, comm, wc->fmt, wc->per_call));
  uint64_t s2 = sent_total(comm, n);
  double ratio = (double)(s2 - s1) / (double)(s1 - s0), want = wc->fmt <= WIRE_FP16 ? 0.5 : 33.0 / 128;
  if (wc->fmt == WIRE_E4M3 || wc->fmt == WIRE_E5M2) want = 0.25;
  if (!(fabs(ratio - want) < 0.02)) rt_fail(__FILE__, __LINE__, "%s: %.3f of the exact call's bytes sent, not %.3f",
                                            wire_name(wc->fmt), ratio, want);
  int bad = 0;
  for (size_t i = 0; i < CN && bad < 3; i++) {
    double exact = 0;
    for (int r = 0; r < n; r++) exact += (double)input_of(r, i);
    double err = fabs((double)y[i] - exact), b = sum_bound(wc->fmt, n, i, n);
    if (!(err <= b)) {
      bad++;
      rt_fail(__FILE__, __LINE__, "%s AllReduce (%s) rank %d element %zu: %.9g, exact %.9g, error %g > bound %g", wire_name(wc->fmt),
             rt_mode(), rank, i, (double)y[i], exact, err, b);
    }
  }
  /* the same bits on every rank: threads compare afterwards; processes gather the results exactly */
  if (!wc->procs) memcpy(results[rank], y, CN * sizeof(float));
  ncclConfigExt_t off = {.next = NULL, .key = {CHORUS_CONFIG_EXT_VENDOR, CHORUS_COLL_OPT_WIRE_FORMAT}};
  off.val.i = chorusWireOff;
  ncclCollConfig_t c = NCCL_COLLCONFIG_INITIALIZER;
  c.ext = &off;
  NCCL_OK(ncclAllGatherConfig(y, all, CN, ncclFloat32, comm, NULL, &c));
  for (int r = 0; r < n; r++) EXPECT(memcmp(all + (size_t)r * CN, y, CN * sizeof(float)) == 0);
  /* Broadcast and AllGather: one rounding from the source (which keeps its values rounded too) */
  double rel, grp, tiny;
  wire_error(wc->fmt, &rel, &grp, &tiny);
  NCCL_OK(ncclBroadcast(x, y, CN, ncclFloat32, 1, comm, NULL));
  for (size_t i = 0; i < CN; i++) {
    double v = (double)input_of(1, i), err = fabs((double)y[i] - v);
    if (!(err <= rel * fabs(v) + grp * 32 + tiny)) {
      EXPECT(err <= rel * fabs(v) + grp * 32 + tiny);
      break;
    }
  }
  NCCL_OK(ncclAllGather(x, all, CN, ncclFloat32, comm, NULL));
  for (int r = 0; r < n; r++)
    for (size_t i = 0; i < CN; i++) {
      double v = (double)input_of(r, i), err = fabs((double)all[(size_t)r * CN + i] - v);
      if (!(err <= rel * fabs(v) + grp * 32 + tiny)) {
        EXPECT(err <= rel * fabs(v) + grp * 32 + tiny);
        r = n;
        break;
      }
    }
  /* ReduceScatter and Reduce: a sum through at most n roundings */
  size_t per = CN / (size_t)n;
  for (size_t i = 0; i < CN; i++) all[i] = input_of(rank, i);
  NCCL_OK(ncclReduceScatter(all, y, per, ncclFloat32, ncclSum, comm, NULL));
  for (size_t k = 0; k < per; k++) {
    size_t i = (size_t)rank * per + k;
    double exact = 0;
    for (int r = 0; r < n; r++) exact += (double)input_of(r, i);
    if (!(fabs((double)y[k] - exact) <= sum_bound(wc->fmt, n, i, n))) {
      EXPECT(fabs((double)y[k] - exact) <= sum_bound(wc->fmt, n, i, n));
      break;
    }
  }
  NCCL_OK(ncclReduce(x, y, CN, ncclFloat32, ncclSum, 0, comm, NULL));
  for (size_t i = 0; rank == 0 && i < CN; i++) {
    double exact = 0;
    for (int r = 0; r < n; r++) exact += (double)input_of(r, i);
    if (!(fabs((double)y[i] - exact) <= sum_bound(wc->fmt, n, i, n))) {
      EXPECT(fabs((double)y[i] - exact) <= sum_bound(wc->fmt, n, i, n));
      break;
    }
  }
  /* integers are never compressed: exact */
  int32_t xi[64], yi[64];
  for (int i = 0; i < 64; i++) xi[i] = 1000003 * (rank + 1) + i;
  NCCL_OK(ncclAllReduce(xi, yi, 64, ncclInt32, ncclSum, comm, NULL));
  for (int i = 0; i < 64; i++) EXPECT_EQ(yi[i], 1000003 * (n * (n + 1) / 2) + n * i);
  free(x), free(y), free(all);
  NCCL_OK(ncclCommDestroy(comm));
}

static void set_env(const char* fmt, const char* hops, const char* algo) {
  if (fmt) setenv("CHORUS_WIRE_FORMAT", fmt, 1); else unsetenv("CHORUS_WIRE_FORMAT");
  if (hops) setenv("CHORUS_WIRE_HOPS", hops, 1); else unsetenv("CHORUS_WIRE_HOPS");
  if (algo) setenv("NCCL_ALGO", algo, 1); else unsetenv("NCCL_ALGO");
  setenv("NCCL_BUFFSIZE", "65536", 1); /* several steps per call */
  param_reset();
}
static void clear_env(void) {
  set_env(NULL, NULL, NULL);
  unsetenv("NCCL_BUFFSIZE");
  unsetenv("NCCL_SHM_DISABLE");
  param_reset();
}

/* Threads, every hop compressed (CHORUS_WIRE_HOPS=all), each format, Ring and Tree. */
TEST(wire_coll, every_hop_threads_bound_and_same_bits) {
  static const char* algos[] = {"Ring", "allreduce:Tree;broadcast:Tree;reduce:Tree", "allreduce:Rabenseifner"};
  for (int a = 0; a < 3; a++)
    for (int k = 0; k < NF; k++) {
      char v[32];
      snprintf(v, sizeof v, "%s!", wire_name(fmts[k]));
      set_env(v, "all", algos[a]);
      struct wcase wc = {fmts[k], 0, 0};
      for (int n = 3; n <= 4; n++) { /* 3: Rabenseifner folds a rank in */
        rt_run_threads(n, coll_body, &wc);
        for (int r = 1; r < n; r++) EXPECT(memcmp(results[r], results[0], sizeof results[0]) == 0);
      }
    }
  clear_env();
}

/* Processes over TCP (NCCL_SHM_DISABLE): the network hops compress; the format per call too. */
TEST(wire_coll, tcp_procs) {
  set_env("bf16!", NULL, "Ring");
  setenv("NCCL_SHM_DISABLE", "1", 1);
  param_reset();
  struct wcase wc = {WIRE_BF16, 1, 0};
  rt_run_procs(3, coll_body, &wc);
  set_env(NULL, NULL, "Ring");
  struct wcase pc = {WIRE_MX8, 1, 1};
  rt_run_procs(3, coll_body, &pc);
  clear_env();
}

/* Ranks whose calls compress differently fail the call as a mismatch naming both (the format rides
 * in the call's header), on every rank, instead of decoding each other's bytes. */
static void differ_body(int rank, int n, ncclUniqueId id, void* arg) {
  (void)arg;
  ncclComm_t comm = cu_comm_init(rank, n, id);
  float x[4096], y[4096];
  for (int i = 0; i < 4096; i++) x[i] = (float)i;
  if (rank == 0) NCCL_OK(chorusCommSetWireFormat(comm, "mx8!"));
  EXPECT(ncclAllReduce(x, y, 4096, ncclFloat32, ncclSum, comm, NULL) != ncclSuccess);
  /* the rank that saw the other's data names both formats; the others learn it from the poison */
  const char* why = ncclGetLastError(comm);
  if (!(why && (strstr(why, "wire bf16") || strstr(why, "wire mx8"))))
    rt_fail(__FILE__, __LINE__, "rank %d: the error does not name a wire format: %s", rank, why ? why : "(none)");
  NCCL_OK(ncclCommAbort(comm));
}
TEST(wire_coll, formats_differ_named) {
  set_env("bf16!", "all", "Ring");
  rt_run_threads(2, differ_body, NULL);
  rt_run_procs(3, differ_body, NULL);
  clear_env();
}

static void refuse_body(int rank, int n, ncclUniqueId id, void* arg) {
  (void)arg;
  ncclComm_t comm = cu_comm_init(rank, n, id);
  float x[64] = {0}, y[64];
  /* a reproducible level and a format exclude each other (the level is set before the first call) */
  NCCL_OK(chorusCommSetReproducible(comm, chorusReproOrder));
  EXPECT_EQ(chorusCommSetWireFormat(comm, "bf16"), ncclInvalidUsage);
  EXPECT_EQ(chorusCommSetWireFormat(comm, "fp4"), ncclInvalidArgument);
  EXPECT_EQ(chorusCommSetWireFormat(NULL, "bf16"), ncclInvalidArgument);
  ncclConfigExt_t e = {.next = NULL, .key = {CHORUS_CONFIG_EXT_VENDOR, 7}};
  ncclCollConfig_t c = NCCL_COLLCONFIG_INITIALIZER;
  c.ext = &e;
  EXPECT_EQ(ncclAllReduceConfig(x, y, 64, ncclFloat32, ncclSum, comm, NULL, &c), ncclInvalidArgument); /* option 7 */
  e.key.optionId = CHORUS_COLL_OPT_WIRE_FORMAT, e.val.i = 42;
  EXPECT_EQ(ncclAllReduceConfig(x, y, 64, ncclFloat32, ncclSum, comm, NULL, &c), ncclInvalidArgument); /* format 42 */
  e.next = &e; /* a cycle: bounded */
  e.val.i = chorusWireBf16;
  EXPECT_EQ(ncclAllReduceConfig(x, y, 64, ncclFloat32, ncclSum, comm, NULL, &c), ncclInvalidArgument);
  e.next = NULL;
  ncclConfigExt_t other = {.next = &e, .key = {0x12345, 1}}; /* another vendor's: ignored */
  c.ext = &other;
  e.val.i = chorusWireOff;
  NCCL_OK(ncclAllReduceConfig(x, y, 64, ncclFloat32, ncclSum, comm, NULL, &c));
  c.ext = &e, e.val.i = chorusWireBf16 | chorusWireForce;
  EXPECT_EQ(ncclAllReduceConfig(x, y, 64, ncclFloat32, ncclSum, comm, NULL, &c), ncclInvalidUsage);
  NCCL_OK(chorusCommSetWireFormat(comm, "off"));
  NCCL_OK(ncclCommDestroy(comm));
}
TEST(wire_coll, refusals) {
  set_env(NULL, "all", NULL);
  rt_run_threads(2, refuse_body, NULL);
  /* at init: a bad value, a bad hop set, a format with a reproducible level */
  ncclComm_t comms[2];
  int devs[2] = {0, 1};
  set_env("fp7", NULL, NULL);
  EXPECT(ncclCommInitAll(comms, 2, devs) != ncclSuccess);
  set_env("bf16", "some", NULL);
  EXPECT(ncclCommInitAll(comms, 2, devs) != ncclSuccess);
  set_env("bf16", NULL, NULL);
  setenv("CHORUS_REPRODUCIBLE", "order", 1);
  param_reset();
  EXPECT(ncclCommInitAll(comms, 2, devs) != ncclSuccess);
  unsetenv("CHORUS_REPRODUCIBLE");
  clear_env();
}

/* bfloat16 data: the 8-bit formats compress it (the 16-bit ones would not: left exact), within the
 * bound plus bfloat16's own rounding of the result. */
static void bf16_body(int rank, int n, ncclUniqueId id, void* arg) {
  int f = *(const int*)arg;
  ncclComm_t comm = cu_comm_init(rank, n, id);
  enum { M = 3000 };
  static _Thread_local uint16_t x[M], y[M];
  float xf[M];
  for (int i = 0; i < M; i++) xf[i] = input_of(rank, (size_t)i);
  red_from_float(ncclBfloat16, x, xf, M);
  NCCL_OK(ncclAllReduce(x, y, M, ncclBfloat16, ncclSum, comm, NULL));
  double rel, grp, tiny;
  wire_error(f, &rel, &grp, &tiny);
  for (int i = 0; i < M; i++) {
    double exact = 0, s = 0;
    for (int r = 0; r < n; r++) {
      float v = red_bf16_to_float(red_float_to_bf16(input_of(r, (size_t)i)));
      exact += v, s += fabs(v);
    }
    double got = red_bf16_to_float(y[i]), b = (pow(1 + rel + 0x1p-8, n + 1) - 1) * s + n * (grp * 32 * n + tiny);
    if (!(fabs(got - exact) <= b)) {
      rt_fail(__FILE__, __LINE__, "%s bfloat16 AllReduce element %d: %g, exact %g, bound %g", wire_name(f), i, got,
              exact, b);
      break;
    }
  }
  NCCL_OK(ncclCommDestroy(comm));
}
TEST(wire_coll, bfloat16_data) {
  static const int f8[] = {WIRE_E4M3, WIRE_E5M2, WIRE_MX8};
  for (int k = 0; k < 3; k++) {
    char v[32];
    snprintf(v, sizeof v, "%s!", wire_name(f8[k]));
    set_env(v, "all", "Ring");
    rt_run_threads(3, bf16_body, (void*)&f8[k]);
  }
  clear_env();
}
