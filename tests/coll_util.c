/* Helpers of the collective tests (see coll_util.h). Expected values are closed forms over the input
 * patterns below; nothing here calls the library's own reduction or conversion code. */
#include <unistd.h>
#include "coll_util.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "chorus.h"
#include "misc/param.h"
#include "runner.h"

static const char* coll_names[CU_NCOLLS] = {"AllReduce", "Broadcast", "Bcast",   "Reduce", "AllGather",
                                            "ReduceScatter", "AlltoAll", "Gather", "Scatter", "SendRecv"};
static const char* op_names[CU_NOPS] = {"sum", "prod", "max", "min", "avg", "premulsum(host)", "premulsum(dev)"};
static const char* type_names[ncclNumTypes] = {"int8",  "uint8", "int32", "uint32", "int64", "uint64",
                                               "half",  "float", "double", "bfloat16", "f8e4m3", "f8e5m2"};

const char* cu_coll_name(int coll) { return coll >= 0 && coll < CU_NCOLLS ? coll_names[coll] : "?"; }
const char* cu_op_name(int op) { return op >= 0 && op < CU_NOPS ? op_names[op] : "?"; }
const char* cu_type_name(int type) { return type >= 0 && type < ncclNumTypes ? type_names[type] : "?"; }
int cu_coll_reduces(int c) { return c == CU_ALLREDUCE || c == CU_REDUCE || c == CU_REDUCESCATTER; }
int cu_coll_has_root(int c) {
  return c == CU_BROADCAST || c == CU_BCAST || c == CU_REDUCE || c == CU_GATHER || c == CU_SCATTER;
}
int cu_coll_has_inplace(int c) { return c != CU_ALLTOALL && c != CU_SENDRECV && c != CU_BCAST; }

/* ---- elements ---- */

size_t cu_type_size(int type) {
  switch (type) {
    case ncclInt8: case ncclUint8: case ncclFloat8e4m3: case ncclFloat8e5m2: return 1;
    case ncclFloat16: case ncclBfloat16: return 2;
    case ncclInt32: case ncclUint32: case ncclFloat32: return 4;
    default: return 8;
  }
}

int cu_type_is_float(int type) { return type >= ncclFloat16 && type != ncclInt64 && type != ncclUint64; }
int cu_type_is_signed(int type) {
  return type == ncclInt8 || type == ncclInt32 || type == ncclInt64 || cu_type_is_float(type);
}

int64_t cu_exact_limit(int type) {
  switch (type) {
    case ncclInt8: return 127;
    case ncclUint8: return 255;
    case ncclFloat16: return 2048;
    case ncclBfloat16: return 256;
    case ncclFloat8e4m3: return 16;
    case ncclFloat8e5m2: return 8;
    default: return 1 << 24;
  }
}

/* Small IEEE-style binary formats: exponent bits, stored mantissa bits, bias. */
struct fmt { int ebits, mbits, bias; };
static int small_float_fmt(int type, struct fmt* f) {
  switch (type) {
    case ncclFloat16: *f = (struct fmt){5, 10, 15}; return 1;
    case ncclBfloat16: *f = (struct fmt){8, 7, 127}; return 1;
    case ncclFloat8e4m3: *f = (struct fmt){4, 3, 7}; return 1;
    case ncclFloat8e5m2: *f = (struct fmt){5, 2, 15}; return 1;
    default: return 0;
  }
}

/* Exact encoding of a finite value with no rounding: aborts the test if v is not representable. */
static uint32_t fmt_encode(const struct fmt* f, double v) {
  uint32_t sign = v < 0 ? 1u : 0u, bits;
  double a = fabs(v);
  if (a == 0) {
    bits = 0;
  } else {
    int e;
    double m = frexp(a, &e); /* a = m * 2^e, m in [0.5, 1) */
    int exp = e - 1 + f->bias;
    double frac = (2 * m - 1) * ldexp(1.0, f->mbits);
    if (exp <= 0 || exp >= (1 << f->ebits) - 1 || frac != floor(frac))
      rt_fail_fatal(__FILE__, __LINE__, "test bug: %g is not exact in a %d/%d float", v, f->ebits, f->mbits);
    bits = ((uint32_t)exp << f->mbits) | (uint32_t)frac;
  }
  return bits | sign << (f->ebits + f->mbits);
}

static double fmt_decode(const struct fmt* f, int fnuz_e4m3, uint32_t bits) {
  uint32_t sign = bits >> (f->ebits + f->mbits) & 1u;
  uint32_t exp = bits >> f->mbits & ((1u << f->ebits) - 1);
  uint32_t man = bits & ((1u << f->mbits) - 1);
  double v;
  if (exp == 0) {
    v = ldexp((double)man, 1 - f->bias - f->mbits); /* subnormal */
  } else if (exp == (1u << f->ebits) - 1 && !fnuz_e4m3) {
    v = man ? NAN : INFINITY;
  } else if (fnuz_e4m3 && exp == 15 && man == 7) {
    v = NAN; /* e4m3 has no infinities; S.1111.111 is NaN */
  } else {
    v = ldexp(1.0 + (double)man / (double)(1u << f->mbits), (int)exp - f->bias);
  }
  return sign ? -v : v;
}

void cu_set(int type, void* buf, size_t i, double v) {
  struct fmt f;
  if (small_float_fmt(type, &f)) {
    uint32_t b = fmt_encode(&f, v);
    if (cu_type_size(type) == 2) ((uint16_t*)buf)[i] = (uint16_t)b;
    else ((uint8_t*)buf)[i] = (uint8_t)b;
    return;
  }
  switch (type) {
    case ncclInt8: ((int8_t*)buf)[i] = (int8_t)v; break;
    case ncclUint8: ((uint8_t*)buf)[i] = (uint8_t)v; break;
    case ncclInt32: ((int32_t*)buf)[i] = (int32_t)v; break;
    case ncclUint32: ((uint32_t*)buf)[i] = (uint32_t)v; break;
    case ncclInt64: ((int64_t*)buf)[i] = (int64_t)v; break;
    case ncclUint64: ((uint64_t*)buf)[i] = (uint64_t)v; break;
    case ncclFloat32: ((float*)buf)[i] = (float)v; break;
    case ncclFloat64: ((double*)buf)[i] = v; break;
  }
}

double cu_get(int type, const void* buf, size_t i) {
  struct fmt f;
  if (small_float_fmt(type, &f)) {
    uint32_t b = cu_type_size(type) == 2 ? ((const uint16_t*)buf)[i] : ((const uint8_t*)buf)[i];
    return fmt_decode(&f, type == ncclFloat8e4m3, b);
  }
  switch (type) {
    case ncclInt8: return ((const int8_t*)buf)[i];
    case ncclUint8: return ((const uint8_t*)buf)[i];
    case ncclInt32: return ((const int32_t*)buf)[i];
    case ncclUint32: return ((const uint32_t*)buf)[i];
    case ncclInt64: return (double)((const int64_t*)buf)[i];
    case ncclUint64: return (double)((const uint64_t*)buf)[i];
    case ncclFloat32: return ((const float*)buf)[i];
    case ncclFloat64: return ((const double*)buf)[i];
  }
  return NAN;
}

/* ---- inputs ---- */

static int64_t clamp64(int64_t v, int64_t lo, int64_t hi) { return v < lo ? lo : v > hi ? hi : v; }

/* A hash of the element index, so that no shift of data by whole chunks reproduces the pattern. */
static uint64_t mix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

/* A value in [-vmax, vmax] (signed types) or [0, vmax], varying with rank and index. */
static int64_t spread(int type, int64_t vmax, int rank, size_t i) {
  uint64_t h = mix(i) + (uint64_t)rank * 5u;
  if (cu_type_is_signed(type)) return (int64_t)(h % (uint64_t)(2 * vmax + 1)) - vmax;
  return (int64_t)(h % (uint64_t)(vmax + 1));
}

double cu_premul_scalar(int type) { return cu_type_is_signed(type) ? -2.0 : 2.0; }

/* Avg inputs are nranks * g so that both the float form (premultiply by 1/nranks) and the integer
 * form (sum, then divide) are exact. |g| <= 2: 21 * fl32(1/7) does not round back to 3 in fp32. */
static int64_t avg_g(int type, int nranks, int rank, size_t i) {
  int64_t lim = cu_exact_limit(type), n = nranks;
  int64_t gmax = clamp64(cu_type_is_float(type) ? lim / n : lim / (n * n), 1, 2);
  return spread(type, gmax, rank, i);
}

double cu_red_input(int type, int op, int nranks, int rank, size_t i) {
  int64_t lim = cu_exact_limit(type);
  switch (op) {
    case CU_PROD: {
      /* Magnitudes 1 or 2 (2 on ranks r = -h mod 3: at most 3 twos for 8 ranks, so int8 cannot
       * overflow), negative on some ranks, and an occasional 0. */
      uint64_t h = mix(i);
      double v = (h + (uint64_t)rank) % 3 == 0 ? 2 : 1;
      if (cu_type_is_signed(type) && ((h >> 8) + 2 * (uint64_t)rank) % 5 == 0) v = -v;
      if ((h >> 16) % 13 == 0 && (uint64_t)rank == (h >> 24) % (uint64_t)nranks) v = 0;
      return v;
    }
    case CU_AVG:
      return (double)(nranks * avg_g(type, nranks, rank, i));
    default: /* sum, max, min, premulsum: |partial sums| <= nranks * vmax <= the exact limit */
      return (double)spread(type, clamp64(lim / nranks, 1, 3), rank, i);
  }
}

double cu_red_expect(int type, int op, int nranks, size_t i) {
  double acc = 0;
  for (int r = 0; r < nranks; r++) {
    double x = cu_red_input(type, op, nranks, r, i);
    switch (op) {
      case CU_SUM: acc += x; break;
      case CU_PROD: acc = r ? acc * x : x; break;
      case CU_MAX: acc = r ? fmax(acc, x) : x; break;
      case CU_MIN: acc = r ? fmin(acc, x) : x; break;
      case CU_AVG: acc += (double)avg_g(type, nranks, r, i); break;
      default: acc += cu_premul_scalar(type) * x; break;
    }
  }
  return acc;
}

static inline uint8_t pattern_byte(int rank, int block, size_t byte, uint32_t seed) {
  uint32_t h = (uint32_t)rank * 0x9e3779b1u ^ (uint32_t)block * 0x85ebca77u ^ seed * 0xc2b2ae3du;
  h ^= (uint32_t)byte * 0x27d4eb2fu + (uint32_t)(byte >> 8) * 0x165667b1u;
  h ^= h >> 15;
  return (uint8_t)(h ^ h >> 8);
}

void cu_fill_pattern(void* buf, int type, size_t count, int rank, int block, uint32_t seed) {
  uint8_t* p = buf;
  size_t n = count * cu_type_size(type);
  for (size_t b = 0; b < n; b++) p[b] = pattern_byte(rank, block, b, seed);
}

long cu_check_pattern(const void* buf, int type, size_t count, int rank, int block, uint32_t seed) {
  const uint8_t* p = buf;
  size_t es = cu_type_size(type), n = count * es;
  for (size_t b = 0; b < n; b++)
    if (p[b] != pattern_byte(rank, block, b, seed)) return (long)(b / es);
  return -1;
}

/* ---- messages and environment ---- */

void cu_case_str(const struct cu_case* c, char* buf, size_t n) {
  char root[32] = "";
  if (cu_coll_has_root(c->coll)) snprintf(root, sizeof(root), " root=%d", c->root);
  if (c->coll == CU_SENDRECV) snprintf(root, sizeof(root), " shift=%d", c->root);
  snprintf(buf, n, "%s %s%s%s count=%zu %s%s proto=%s", cu_coll_name(c->coll), cu_type_name(c->type),
           cu_coll_reduces(c->coll) ? " " : "", cu_coll_reduces(c->coll) ? cu_op_name(c->op) : "", c->count,
           c->inplace ? "in-place" : "out-of-place", root, cu_proto());
}

#define CU_MAX_SHOWN 12
static _Thread_local int shown, hidden;

void cu_failf(const char* fmt, ...) {
  if (shown >= CU_MAX_SHOWN) {
    hidden++;
    return;
  }
  shown++;
  char msg[1024];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof(msg), fmt, ap);
  va_end(ap);
  rt_fail(__FILE__, __LINE__, "%s", msg);
}

void cu_finish(void) {
  if (hidden) rt_fail(__FILE__, __LINE__, "%d more failure(s) on this rank not shown", hidden);
  shown = hidden = 0;
}

void cu_force_proto(const char* proto) {
  if (proto) setenv("NCCL_PROTO", proto, 1);
  else unsetenv("NCCL_PROTO");
  param_reset();
}

const char* cu_proto(void) {
  const char* p = getenv("NCCL_PROTO");
  return p && *p ? p : "auto";
}

ncclComm_t cu_comm_init(int rank, int nranks, ncclUniqueId id) {
  ncclComm_t comm = NULL;
  NCCL_OK(ncclCommInitRank(&comm, nranks, id, rank));
  ASSERT(comm != NULL);
  return comm;
}

/* ---- running one case ---- */

#define GUARD 64        /* bytes checked on each side of every buffer */
#define GUARD_BYTE 0xcd
#define UNTOUCHED 0xee  /* receive buffers start as this; parts no rank may write keep it */


int cu_memalloc;

static char* gbuf_alloc(struct cu_gbuf* g, size_t bytes) {
  g->bytes = bytes;
  if (cu_memalloc) {
    void* p = NULL;
    NCCL_OK(ncclMemAlloc(&p, bytes + 2 * GUARD));
    g->base = p;
  } else {
    g->base = malloc(bytes + 2 * GUARD);
  }
  ASSERT(g->base != NULL);
  memset(g->base, GUARD_BYTE, GUARD);
  memset(g->base + GUARD, UNTOUCHED, bytes);
  memset(g->base + GUARD + bytes, GUARD_BYTE, GUARD);
  return g->base + GUARD;
}

static int gbuf_check_free(struct cu_gbuf* g, const char* what, const char* cs) {
  int bad = 0;
  if (!g->base) return 0;
  for (size_t i = 0; i < GUARD; i++) {
    if ((unsigned char)g->base[i] != GUARD_BYTE || (unsigned char)g->base[GUARD + g->bytes + i] != GUARD_BYTE) {
      cu_failf("%s: bytes around %s were overwritten", cs, what);
      bad = 1;
      break;
    }
  }
  if (cu_memalloc) NCCL_OK(ncclMemFree(g->base));
  else free(g->base);
  g->base = NULL;
  return bad;
}

static int untouched(const char* p, size_t bytes) {
  for (size_t i = 0; i < bytes; i++)
    if ((unsigned char)p[i] != UNTOUCHED) return 0;
  return 1;
}

/* Element counts of the send and receive regions of a collective. */
static void region_counts(const struct cu_case* c, int n, size_t* scount, size_t* rcount) {
  size_t k = c->count, nk = (size_t)n * c->count;
  switch (c->coll) {
    case CU_ALLGATHER: case CU_GATHER: *scount = k, *rcount = nk; break;
    case CU_REDUCESCATTER: case CU_SCATTER: *scount = nk, *rcount = k; break;
    case CU_ALLTOALL: *scount = *rcount = nk; break;
    default: *scount = *rcount = k; break;
  }
}

static void fill_send(const struct cu_case* c, int rank, int n, char* send, size_t scount) {
  if (cu_coll_reduces(c->coll)) {
    for (size_t i = 0; i < scount; i++) cu_set(c->type, send, i, cu_red_input(c->type, c->op, n, rank, i));
    return;
  }
  size_t blk = c->count * cu_type_size(c->type);
  switch (c->coll) {
    case CU_ALLTOALL: case CU_SCATTER:
      for (int p = 0; p < n; p++) cu_fill_pattern(send + (size_t)p * blk, c->type, c->count, rank, p, c->seed);
      break;
    default: cu_fill_pattern(send, c->type, c->count, rank, 0, c->seed); break;
  }
}

/* Checks `count` elements of a reduction result; elements start at index `first` of the inputs. */
static int check_reduced(const struct cu_case* c, int n, const char* buf, size_t first, size_t count, const char* cs) {
  int bad = 0;
  for (size_t j = 0; j < count; j++) {
    double got = cu_get(c->type, buf, j), want = cu_red_expect(c->type, c->op, n, first + j);
    if (got == want) continue;
    if (bad++ < 3) cu_failf("%s: element %zu is %g, expected %g", cs, j, got, want);
  }
  if (bad > 3) cu_failf("%s: %d of %zu elements wrong", cs, bad, count);
  return bad != 0;
}

static int check_block(const struct cu_case* c, const char* buf, int src_rank, int block, const char* cs,
                       const char* what) {
  long at = cu_check_pattern(buf, c->type, c->count, src_rank, block, c->seed);
  if (at < 0) return 0;
  cu_failf("%s: %s differs from rank %d's data from element %ld on", cs, what, src_rank, at);
  return 1;
}

static int check_recv(const struct cu_case* c, int rank, int n, const char* recv, const char* cs) {
  size_t k = c->count, blk = k * cu_type_size(c->type);
  int bad = 0;
  char what[64];
  switch (c->coll) {
    case CU_ALLREDUCE: return check_reduced(c, n, recv, 0, k, cs);
    case CU_REDUCESCATTER: return check_reduced(c, n, recv, (size_t)rank * k, k, cs);
    case CU_REDUCE:
      if (rank == c->root) return check_reduced(c, n, recv, 0, k, cs);
      if (!c->inplace && !untouched(recv, blk)) {
        cu_failf("%s: recvbuff of non-root rank was written", cs);
        return 1;
      }
      return 0;
    case CU_BROADCAST: case CU_BCAST: return check_block(c, recv, c->root, 0, cs, "recvbuff");
    case CU_ALLGATHER:
      for (int b = 0; b < n; b++) {
        snprintf(what, sizeof(what), "block %d of recvbuff", b);
        bad |= check_block(c, recv + (size_t)b * blk, b, 0, cs, what);
      }
      return bad;
    case CU_ALLTOALL:
      for (int b = 0; b < n; b++) {
        snprintf(what, sizeof(what), "block %d of recvbuff", b);
        bad |= check_block(c, recv + (size_t)b * blk, b, rank, cs, what);
      }
      return bad;
    case CU_GATHER:
      if (rank != c->root) {
        if (!c->inplace && !untouched(recv, (size_t)n * blk)) {
          cu_failf("%s: recvbuff of non-root rank was written", cs);
          return 1;
        }
        return 0;
      }
      for (int b = 0; b < n; b++) {
        snprintf(what, sizeof(what), "block %d of recvbuff", b);
        bad |= check_block(c, recv + (size_t)b * blk, b, 0, cs, what);
      }
      return bad;
    case CU_SCATTER: return check_block(c, recv, c->root, rank, cs, "recvbuff");
    case CU_SENDRECV: {
      int src = ((rank - c->root) % n + n) % n;
      return check_block(c, recv, src, 0, cs, "recvbuff");
    }
  }
  return 0;
}

static ncclResult_t issue(const struct cu_case* c, int rank, int n, const char* send, char* recv, ncclRedOp_t op,
                          ncclComm_t comm, cudaStream_t st) {
  size_t k = c->count;
  ncclDataType_t t = (ncclDataType_t)c->type;
  switch (c->coll) {
    case CU_ALLREDUCE: return ncclAllReduce(send, recv, k, t, op, comm, st);
    case CU_BROADCAST: return ncclBroadcast(send, recv, k, t, c->root, comm, st);
    case CU_BCAST: return ncclBcast(recv, k, t, c->root, comm, st);
    case CU_REDUCE: return ncclReduce(send, recv, k, t, op, c->root, comm, st);
    case CU_ALLGATHER: return ncclAllGather(send, recv, k, t, comm, st);
    case CU_REDUCESCATTER: return ncclReduceScatter(send, recv, k, t, op, comm, st);
    case CU_ALLTOALL: return ncclAlltoAll(send, recv, k, t, comm, st);
    case CU_GATHER: return ncclGather(send, recv, k, t, c->root, comm, st);
    case CU_SCATTER: return ncclScatter(send, recv, k, t, c->root, comm, st);
    case CU_SENDRECV: {
      /* Send to rank+shift, receive from rank-shift, in one group (a shift of 0 is a self exchange). */
      int to = (rank + c->root) % n, from = ((rank - c->root) % n + n) % n;
      ncclResult_t r = ncclGroupStart();
      if (r == ncclSuccess) r = ncclSend(send, k, t, to, comm, st);
      if (r == ncclSuccess) r = ncclRecv(recv, k, t, from, comm, st);
      ncclResult_t e = ncclGroupEnd();
      return r != ncclSuccess ? r : e;
    }
  }
  return ncclInvalidArgument;
}

void cu_prepare(struct cu_run* run, ncclComm_t comm, const struct cu_case* c) {
  memset(run, 0, sizeof(*run));
  run->c = *c;
  run->comm = comm;
  NCCL_OK(ncclCommUserRank(comm, &run->rank));
  NCCL_OK(ncclCommCount(comm, &run->n));
  int rank = run->rank, n = run->n;
  cu_case_str(c, run->cs, sizeof(run->cs));
  size_t es = cu_type_size(c->type), scount, rcount;
  region_counts(c, n, &scount, &rcount);
  size_t blk = c->count * es;
  run->scount = scount;

  char *send, *recv;
  int inplace = c->inplace || c->coll == CU_BCAST; /* Bcast has one buffer */
  if (inplace) {
    char* b = gbuf_alloc(&run->gr, (scount > rcount ? scount : rcount) * es);
    send = recv = b;
    if (c->coll == CU_ALLGATHER) send = b + (size_t)rank * blk;
    if (c->coll == CU_REDUCESCATTER) recv = b + (size_t)rank * blk;
    if (c->coll == CU_GATHER) send = b + (size_t)c->root * blk;
    if (c->coll == CU_SCATTER) recv = b + (size_t)c->root * blk;
  } else {
    send = gbuf_alloc(&run->gs, scount * es);
    recv = gbuf_alloc(&run->gr, rcount * es);
  }
  /* Data-moving collectives read sendbuff on the root only; other ranks' sendbuff stays as it is. */
  int reads_send = !((c->coll == CU_BROADCAST || c->coll == CU_BCAST || c->coll == CU_SCATTER) && rank != c->root);
  if (reads_send) fill_send(c, rank, n, send, scount);
  if (!inplace && scount) {
    run->orig = malloc(scount * es);
    ASSERT(run->orig != NULL);
    memcpy(run->orig, send, scount * es);
  }
  run->send = send;
  run->recv = recv;

  run->op = ncclSum;
  if (cu_coll_reduces(c->coll)) {
    static const ncclRedOp_t builtin[] = {ncclSum, ncclProd, ncclMax, ncclMin, ncclAvg};
    if (c->op < CU_PREMUL_HOST) {
      run->op = builtin[c->op];
    } else {
      cu_set(c->type, run->scalar, 0, cu_premul_scalar(c->type));
      NCCL_OK(ncclRedOpCreatePreMulSum(&run->op, run->scalar, (ncclDataType_t)c->type,
                                       c->op == CU_PREMUL_HOST ? ncclScalarHostImmediate : ncclScalarDevice, comm));
      run->custom_op = 1;
      /* A host-immediate scalar is read at creation: the caller may reuse its memory at once. A device
       * scalar must stay valid (NCCL reads it when the collective runs), so run->scalar is kept. */
      if (c->op == CU_PREMUL_HOST) memset(run->scalar, 0, sizeof(run->scalar));
    }
  }
}

ncclResult_t cu_issue(struct cu_run* run, cudaStream_t stream) {
  return issue(&run->c, run->rank, run->n, run->send, run->recv, run->op, run->comm, stream);
}

int cu_check(struct cu_run* run) {
  const struct cu_case* c = &run->c;
  size_t es = cu_type_size(c->type);
  if (run->custom_op) NCCL_OK(ncclRedOpDestroy(run->op, run->comm));
  int bad = check_recv(c, run->rank, run->n, run->recv, run->cs);
  if (run->orig && memcmp(run->orig, run->send, run->scount * es) != 0) {
    cu_failf("%s: sendbuff was modified", run->cs);
    bad++;
  }
  free(run->orig);
  run->orig = NULL;
  bad += gbuf_check_free(&run->gs, "sendbuff", run->cs);
  bad += gbuf_check_free(&run->gr, "recvbuff", run->cs);
  return bad;
}

int cu_run_case(ncclComm_t comm, const struct cu_case* c, cudaStream_t stream) {
  struct cu_run run;
  cu_prepare(&run, comm, c);
  ncclResult_t r = cu_issue(&run, stream);
  if (r != ncclSuccess)
    rt_fail_fatal(__FILE__, __LINE__, "%s: returned %d (%s)", run.cs, (int)r, ncclGetErrorString(r));
  if (stream) NCCL_OK(chorusStreamSynchronize(stream));
  return cu_check(&run);
}

/* ---- matrices ---- */

void cu_sweep_body(int rank, int nranks, ncclUniqueId id, void* arg) {
  const struct cu_sweep* sw = arg;
  static const int all_types[ncclNumTypes] = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11};
  static const int all_ops[CU_NOPS] = {0, 1, 2, 3, 4, 5, 6};
  const int* types = sw->types ? sw->types : all_types;
  const int* ops = sw->ops ? sw->ops : all_ops;
  int ntypes = sw->types ? sw->ntypes : ncclNumTypes, nops = sw->ops ? sw->nops : CU_NOPS;
  size_t counts[8];
  int ncounts = 0;
  if (!sw->only_big) {
    counts[ncounts++] = 0;
    counts[ncounts++] = 1;
    if (nranks > 2) counts[ncounts++] = (size_t)nranks - 1;
    counts[ncounts++] = 4099;
  }
  for (int i = 0; i < 4 && sw->big[i]; i++) counts[ncounts++] = sw->big[i];

  ncclComm_t comm = cu_comm_init(rank, nranks, id);
  cudaStream_t stream = NULL;
  if (sw->stream) NCCL_OK(chorusStreamCreate(&stream));
  uint32_t seed = 1;
  for (int coll = 0; coll < CU_NCOLLS; coll++) {
    if (sw->colls && !(sw->colls & (1u << coll))) continue;
    for (int ti = 0; ti < ntypes; ti++)
      for (int oi = 0; oi < (cu_coll_reduces(coll) ? nops : 1); oi++)
        for (int ci = 0; ci < ncounts; ci++)
          for (int inplace = 0; inplace <= cu_coll_has_inplace(coll); inplace++, seed++) {
            struct cu_case c = {coll, types[ti], ops[oi], counts[ci], inplace, (int)(seed % (uint32_t)nranks), seed};
            cu_run_case(comm, &c, stream);
          }
  }
  if (stream) NCCL_OK(chorusStreamDestroy(stream));
  NCCL_OK(ncclCommDestroy(comm));
  cu_finish();
}

double cu_proc_cpu_s(void) {
  FILE* f = fopen("/proc/self/stat", "r");
  if (!f) return -1;
  char buf[1024];
  size_t n = fread(buf, 1, sizeof(buf) - 1, f);
  fclose(f);
  buf[n] = 0;
  char* p = strrchr(buf, ')');
  unsigned long ut = 0, st = 0;
  if (!p || sscanf(p + 2, "%*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %lu %lu", &ut, &st) != 2) return -1;
  return (double)(ut + st) / (double)sysconf(_SC_CLK_TCK);
}

chorusMemory_t cu_memory(ncclComm_t comm) {
  chorusMemory_t m;
  memset(&m, 0, sizeof(m));
  m.size = sizeof(m);
  NCCL_OK(chorusCommGetMemory(comm, &m));
  return m;
}
