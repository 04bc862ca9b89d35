/* libFuzzer target: the checks a rank applies to a peer's window description (api/window.c, api/rma.h)
 * before mapping it and before every put into it. The description is the peer's word: a size, an
 * allocation and an offset that may wrap, lie past each other or ask for an impossible mapping. What
 * the checks accept must be a span inside the allocation whose end and mapping size (allocation plus
 * the token page) do not overflow, and a put they accept must end inside that span.
 * Input layout: a struct win_desc as the allgather delivers it, then a put's offset and byte count
 * (8 bytes each, host order). */
#include <stdint.h>
#include <string.h>

#include "api/rma.h"

#define CHECK_OR_ABORT(cond) \
  do {                       \
    if (!(cond)) __builtin_trap(); \
  } while (0)

int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  struct win_desc d;
  uint64_t put[2];
  if (size < sizeof d + sizeof put) return 0;
  memcpy(&d, data, sizeof d);
  memcpy(put, data + sizeof d, sizeof put);
  if (rma_span_ok(d.off, d.size, d.alloc)) {
    unsigned __int128 end = (unsigned __int128)d.off + d.size;
    CHECK_OR_ABORT(end <= d.alloc);
    CHECK_OR_ABORT(d.alloc + 8192 > d.alloc); /* the mapping's size does not wrap */
    if (rma_put_ok(put[0], put[1], d.size)) {
      unsigned __int128 pend = (unsigned __int128)d.off + put[0] + put[1];
      CHECK_OR_ABORT((unsigned __int128)put[0] + put[1] <= d.size && pend <= d.alloc);
    }
  }
  /* the signal block: [0, bytes) of the peer's allocation, bytes this rank's own (here the put's count) */
  if (rma_span_ok(0, put[1], d.sig_alloc)) CHECK_OR_ABORT(put[1] <= d.sig_alloc && d.sig_alloc + 8192 > d.sig_alloc);
  return 0;
}
