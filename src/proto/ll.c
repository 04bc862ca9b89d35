/* LL and LL128 line formats. Only the last line's flag needs release/acquire order; other flags are
 * stored relaxed (they let a future reader consume lines as they arrive). */
#include <stdatomic.h>
#include <string.h>

#include "../transport/transport.h"
#include "proto.h"

static size_t line_bytes(int proto) { return proto == PROTO_LL ? LL_LINE_BYTES : LL128_LINE_BYTES; }
static size_t line_data(int proto) { return proto == PROTO_LL ? LL_LINE_DATA : LL128_LINE_DATA; }

static size_t nlines(int proto, size_t bytes) {
  size_t d = line_data(proto);
  size_t n = (bytes + d - 1) / d;
  return n ? n : 1; /* an empty step still carries a flag */
}

static _Atomic uint64_t* flag_at(int proto, const char* slot, size_t line) {
  return (_Atomic uint64_t*)(slot + line * line_bytes(proto) + line_data(proto));
}

/* LL fast path: whole 8-byte words, one data store and one flag store per line. */
static void ll_pack_words(char* slot, const char* data, size_t words, uint64_t flag, int last_release) {
  uint64_t* line = (uint64_t*)slot;
  for (size_t i = 0; i < words; i++) {
    uint64_t v;
    memcpy(&v, data + 8 * i, 8);
    line[2 * i] = v;
    if (i + 1 == words && last_release)
      atomic_store_explicit((_Atomic uint64_t*)&line[2 * i + 1], flag, memory_order_release);
    else
      atomic_store_explicit((_Atomic uint64_t*)&line[2 * i + 1], flag, memory_order_relaxed);
  }
}

void proto_pack(int proto, char* slot, const char* data, size_t bytes, uint64_t flag) {
  size_t n = nlines(proto, bytes), d = line_data(proto), lb = line_bytes(proto);
  if (proto == PROTO_LL && bytes % 8 == 0 && bytes) {
    ll_pack_words(slot, data, bytes / 8, flag, 1);
    return;
  }
  for (size_t i = 0; i < n; i++) {
    size_t off = i * d, len = bytes > off ? (bytes - off < d ? bytes - off : d) : 0;
    char* line = slot + i * lb;
    if (len) memcpy(line, data + off, len);
    atomic_store_explicit(flag_at(proto, slot, i), flag, i + 1 == n ? memory_order_release : memory_order_relaxed);
  }
}

void proto_unpack(int proto, const char* slot, char* data, size_t bytes) {
  size_t d = line_data(proto), lb = line_bytes(proto);
  if (proto == PROTO_LL) {
    const uint64_t* line = (const uint64_t*)slot;
    size_t words = bytes / 8;
    for (size_t i = 0; i < words; i++) memcpy(data + 8 * i, &line[2 * i], 8);
    if (bytes % 8) memcpy(data + 8 * words, &line[2 * words], bytes % 8);
    return;
  }
  if (proto == PROTO_LL128) {
    size_t full = bytes / LL128_LINE_DATA, i;
    for (i = 0; i < full; i++) memcpy(data + i * LL128_LINE_DATA, slot + i * LL128_LINE_BYTES, LL128_LINE_DATA);
    if (bytes % LL128_LINE_DATA) memcpy(data + i * LL128_LINE_DATA, slot + i * LL128_LINE_BYTES, bytes % LL128_LINE_DATA);
    return;
  }
  for (size_t off = 0, i = 0; off < bytes; off += d, i++) {
    size_t len = bytes - off < d ? bytes - off : d;
    memcpy(data + off, slot + i * lb, len);
  }
}

int proto_flag_ready(int proto, const char* slot, size_t bytes, uint64_t flag) {
  size_t last = nlines(proto, bytes) - 1;
  return atomic_load_explicit(flag_at(proto, slot, last), memory_order_acquire) == flag;
}
