/* libFuzzer target: the reproducible combination (reduce/repro.c) decodes the raw values peers send to
 * a block's owner (any bits: NaN payloads, infinities, subnormals, e4m3's missing Inf). Beyond "no
 * crash and no out-of-bounds read" (each rank's values sit in a buffer of exactly their size), it checks
 * the properties the levels promise: EXACT sum and avg, and MAX/MIN, give the same bits whatever the
 * order of the ranks, and with an identity rank added (-0 for sum, NaN for max and min); every level
 * gives the same bits in place as out of place.
 * Input layout: byte 0: type (6 float types); byte 1: ranks - 1 (low 4 bits: 1..16); byte 2: kind
 * (sum, prod, max, min, avg) and level; then the ranks' values, count = what is left / (ranks x size). */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "nccl.h"
#include "reduce/reduce.h"

#define CHECK_OR_ABORT(cond) \
  do {                       \
    if (!(cond)) abort();    \
  } while (0)

static const int types[6] = {ncclFloat64, ncclFloat32, ncclFloat16, ncclBfloat16, ncclFloat8e4m3, ncclFloat8e5m2};
static const uint64_t qnans[6] = {0x7ff8000000000000ull, 0x7fc00000u, 0x7e00u, 0x7fc0u, 0x7fu, 0x7eu};
static const int kinds[5] = {RED_SUM, RED_PROD, RED_MAX, RED_MIN, RED_SUMPOSTDIV};

int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 3) return 0;
  int ti = data[0] % 6, type = types[ti], n = (data[1] & 15) + 1, kind = kinds[(data[2] & 7) % 5];
  int level = (data[2] >> 3) & 1 ? CH_REPRO_EXACT : CH_REPRO_ORDER;
  size_t es = red_type_size(type), count = (size - 3) / ((size_t)n * es);
  if (count == 0 || count > 4096) return 0;
  struct red_op op = {.kind = kind, .type = type, .divisor = kind == RED_SUMPOSTDIV ? (uint64_t)n : 0};
  if (kind == RED_SUMPOSTDIV && level == CH_REPRO_ORDER) op.kind = kind = RED_SUM; /* ORDER's avg is a premulsum */
  size_t bytes = count * es;
  char* rank[17];
  struct red_contrib in[17], rev[17];
  for (int k = 0; k < n; k++) {
    rank[k] = malloc(bytes);
    CHECK_OR_ABORT(rank[k]);
    memcpy(rank[k], data + 3 + (size_t)k * bytes, bytes);
    in[k] = (struct red_contrib){rank[k], NULL};
    rev[n - 1 - k] = in[k];
  }
  char *out = malloc(bytes), *other = malloc(bytes), *inplace = malloc(bytes), *zero = malloc(bytes);
  CHECK_OR_ABORT(out && other && inplace && zero);
  CHECK_OR_ABORT(red_repro_combine(level, &op, out, in, n, count));
  /* in place: the result written over rank 0's values */
  memcpy(inplace, rank[0], bytes);
  struct red_contrib first = in[0];
  in[0].p = inplace;
  CHECK_OR_ABORT(red_repro_combine(level, &op, inplace, in, n, count));
  in[0] = first;
  CHECK_OR_ABORT(memcmp(out, inplace, bytes) == 0);
  int order_free = kind == RED_MAX || kind == RED_MIN || (level == CH_REPRO_EXACT && kind != RED_PROD);
  if (order_free) {
    CHECK_OR_ABORT(red_repro_combine(level, &op, other, rev, n, count));
    CHECK_OR_ABORT(memcmp(out, other, bytes) == 0);
  }
  if (order_free && kind != RED_SUMPOSTDIV && n < 17) {
    /* an identity rank: -0 for sum; NaN for max and min (it loses to any number) */
    uint64_t id = kind == RED_SUM ? 1ull << (8 * es - 1) : qnans[ti];
    for (size_t i = 0; i < count; i++) memcpy(zero + i * es, &id, es); /* little-endian: the low bytes */
    in[n] = (struct red_contrib){zero, NULL};
    CHECK_OR_ABORT(red_repro_combine(level, &op, other, in, n + 1, count));
    CHECK_OR_ABORT(memcmp(out, other, bytes) == 0);
  }
  for (int k = 0; k < n; k++) free(rank[k]);
  free(out);
  free(other);
  free(inplace);
  free(zero);
  return 0;
}
