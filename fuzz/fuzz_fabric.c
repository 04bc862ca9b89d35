/* libFuzzer target: the fabric transport's decoder of what a peer sends into a slot or on the way back
 * (transport/fabric_wire.c): a step (payload + trailer), a poison record or a goodbye, told apart and
 * bounded before use. The message is copied into a buffer of exactly its size, so ASan sees an
 * over-read; what the decoder accepts must be consistent with the sizes it was given, and a poison
 * record it accepts goes through the transport's own intake (xfer_poison_put) as it would.
 * Input layout: byte 0: bit 0 = the way back (no steps: cap 0); bytes 1-2: the slot's payload
 * capacity (little-endian; a step's payload must fit it); then the message. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "transport/fabric.h"

#define CHECK_OR_ABORT(cond) \
  do {                       \
    if (!(cond)) abort();    \
  } while (0)

int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 3 || size - 3 > (1u << 20)) return 0;
  int back = data[0] & 1;
  size_t cap = back ? 0 : (size_t)(data[1] | data[2] << 8);
  size_t len = size - 3;
  size_t limit = back ? 4096 : cap + sizeof(struct tcp_step);
  char* msg = malloc(len ? len : 1);
  CHECK_OR_ABORT(msg);
  if (len) memcpy(msg, data + 3, len);
  struct tcp_step tr;
  uint64_t payload;
  char why[160] = "";
  int kind = fab_msg_decode(msg, (int)len, limit, cap, &tr, &payload, why, sizeof(why));
  switch (kind) {
  case FAB_MSG_STEP:
    CHECK_OR_ABORT(!back && payload == tr.bytes && payload <= cap && payload + sizeof(tr) == len);
    break;
  case FAB_MSG_POISON: {
    CHECK_OR_ABORT(payload == sizeof(struct xfer_poison) && len <= limit);
    struct xfer_poison rec, into;
    memset(&into, 0, sizeof(into));
    memcpy(&rec, msg, sizeof(rec));
    xfer_poison_put(&into, &rec);
    break;
  }
  case FAB_MSG_BYE:
    CHECK_OR_ABORT(payload == 0 && len == sizeof(tr));
    break;
  default:
    CHECK_OR_ABORT(kind == FAB_MSG_BAD && why[0]);
  }
  free(msg);
  return 0;
}
