/* Definition helper for exported API functions: each gets default visibility and a p-prefixed alias
 * (NCCL's profiling interposition names). Status mapping to ncclResult_t happens only here. */
#ifndef CH_API_H
#define CH_API_H

#include "nccl.h"
#include "../misc/status.h"

#define CH_API(ret, name, ...)                                                               \
  __attribute__((visibility("default"))) ret p##name(__VA_ARGS__) __attribute__((alias(#name))); \
  __attribute__((visibility("default"))) ret name(__VA_ARGS__)

static inline ncclResult_t ch_to_nccl(ch_status s) { return (ncclResult_t)s; }

#endif
