/* libFuzzer target: the wire formats' decoders (reduce/wire.c) on bytes a peer sent. Any byte is a
 * value of some format (NaN, Inf, a scale of 0xFF included), so what is checked is that decoding reads
 * exactly wire_bytes(f, t, n) bytes and writes exactly n values (ASan sees both: each buffer is
 * allocated to its size), and that a decoded value passes a second hop unchanged (idempotence, which
 * the same-bits guarantee of AllReduce rests on), NaNs aside.
 * Input layout: byte 0: format (mod 5, + 1); byte 1: bit 0 = bfloat16 data (else float32); then the
 * wire bytes, as many values as they hold. */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "nccl.h"
#include "reduce/reduce.h"
#include "reduce/wire.h"

#define CHECK_OR_ABORT(cond) \
  do {                       \
    if (!(cond)) abort();    \
  } while (0)

int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 2 || size > (1u << 16)) return 0;
  int f = 1 + data[0] % 5, type = data[1] & 1 ? ncclBfloat16 : ncclFloat32;
  if (!wire_applies(f, type)) type = ncclFloat32;
  size_t avail = size - 2, n = 0;
  while (wire_bytes(f, type, n + 1) <= avail) n++; /* the values the bytes hold */
  if (n == 0) return 0;
  size_t wb = wire_bytes(f, type, n), es = red_type_size(type);
  uint8_t* w = malloc(wb);
  char* out = malloc(n * es);
  char* again = malloc(n * es);
  CHECK_OR_ABORT(w && out && again);
  memcpy(w, data + 2, wb);
  wire_decode(f, type, out, w, n);
  memcpy(again, out, n * es);
  wire_round(f, type, again, n);
  for (size_t i = 0; i < n; i++) {
    float a, b;
    if (type == ncclFloat32) memcpy(&a, out + 4 * i, 4), memcpy(&b, again + 4 * i, 4);
    else a = red_bf16_to_float(((uint16_t*)out)[i]), b = red_bf16_to_float(((uint16_t*)again)[i]);
    /* a NaN or Inf in an mx8 group turns the group to NaN on the next hop: compare the others */
    if (isnan(a) || isnan(b)) continue;
    CHECK_OR_ABORT(a == b);
  }
  free(w), free(out), free(again);
  return 0;
}
