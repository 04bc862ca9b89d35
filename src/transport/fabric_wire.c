/* The fabric transport's message decoder (fabric.h): what a peer sent into one of our slots, or on
 * the way back, told apart and checked whole before anything in it is believed. Pure: the caller's
 * bytes and sizes only, fuzzed by fuzz/fuzz_fabric.c. */
#include <stdio.h>
#include <string.h>

#include "fabric.h"

int fab_msg_decode(const void* msg, int size, size_t limit, size_t cap, struct tcp_step* tr, uint64_t* payload,
                   char* why, size_t why_len) {
  memset(tr, 0, sizeof(*tr));
  *payload = 0;
  if (size < (int)sizeof(*tr) || (size_t)size > limit) {
    snprintf(why, why_len, "a %d-byte message, not a step (at most %zu bytes)", size,
             cap ? cap + sizeof(*tr) : limit);
    return FAB_MSG_BAD;
  }
  uint64_t p = (uint64_t)size - sizeof(*tr);
  memcpy(tr, (const char*)msg + p, sizeof(*tr)); /* the trailer ends the message; no alignment assumed */
  *payload = p;
  if (tr->bytes == TCP_POISON && p == sizeof(struct xfer_poison)) return FAB_MSG_POISON;
  if (tr->bytes == TCP_BYE && p == 0) return FAB_MSG_BYE;
  if (cap && tr->bytes == p && p <= cap) return FAB_MSG_STEP;
  if (!cap)
    snprintf(why, why_len, "a %d-byte message, neither a poison record nor a goodbye", size);
  else
    snprintf(why, why_len, "a step announcing %llu bytes in a %llu-byte message (slot %zu bytes)",
             (unsigned long long)tr->bytes, (unsigned long long)p, cap);
  return FAB_MSG_BAD;
}
