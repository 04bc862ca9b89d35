/* NVTX ranges around the public calls, as NCCL makes them: domain "NCCL", each range named after the
 * API function ("ncclAllReduce") by a registered string. Only a process that names a tool in
 * NVTX_INJECTION64_PATH (Nsight Systems does) and uses CUDA loads it; NCCL_NVTX_DISABLE=1 turns the
 * ranges off. Without a tool a call costs one load and a branch. The protocol (nvtx.c) is NVTX 3's,
 * implemented here because its headers are not on every machine that builds Chorus. */
#ifndef CH_API_NVTX_H
#define CH_API_NVTX_H

#include <stdatomic.h>

#include "../algo/algo.h"

/* The ranges other than the collectives', numbered after FUNC_* (whose names are algo_fname's). */
#define NVTX_CALL_LIST(X)                                \
  X(GROUP_START, "ncclGroupStart")                       \
  X(GROUP_END, "ncclGroupEnd")                           \
  X(GROUP_SIMULATE_END, "ncclGroupSimulateEnd")          \
  X(COMM_INIT_RANK, "ncclCommInitRank")                  \
  X(COMM_INIT_RANK_CONFIG, "ncclCommInitRankConfig")     \
  X(COMM_INIT_RANK_SCALABLE, "ncclCommInitRankScalable") \
  X(COMM_INIT_ALL, "ncclCommInitAll")                    \
  X(COMM_SPLIT, "ncclCommSplit")                         \
  X(COMM_SHRINK, "ncclCommShrink")                       \
  X(COMM_FINALIZE, "ncclCommFinalize")                   \
  X(COMM_DESTROY, "ncclCommDestroy")                     \
  X(COMM_ABORT, "ncclCommAbort")                         \
  X(COMM_REVOKE, "ncclCommRevoke")                       \
  X(COMM_COUNT, "ncclCommCount")                         \
  X(COMM_USER_RANK, "ncclCommUserRank")                  \
  X(COMM_CU_DEVICE, "ncclCommCuDevice")

#define NVTX_CALL_ENUM_(id, name) NVTX_##id,
enum nvtx_call { NVTX_FIRST_CALL_ = FUNC_COUNT - 1, NVTX_CALL_LIST(NVTX_CALL_ENUM_) NVTX_NCALLS };
#undef NVTX_CALL_ENUM_

enum { NVTX_OFF = 1 }; /* nvtx_state once no range will ever be pushed (nvtx.c has the others) */
extern _Atomic int nvtx_state;

int nvtx_push(int id); /* 1 if a range was pushed (a tool is loaded) */
void nvtx_pop(void);

static inline int nvtx_begin(int id) {
  return atomic_load_explicit(&nvtx_state, memory_order_acquire) != NVTX_OFF && nvtx_push(id);
}
static inline void nvtx_end_(int* pushed) {
  if (*pushed) nvtx_pop();
}
/* A range over the rest of the enclosing block, popped on every way out of it (as NCCL's scoped
 * ranges, after the return value is computed): one line at the top of a function. */
#define NVTX_RANGE(id) __attribute__((cleanup(nvtx_end_), unused)) int nvtx_range_ = nvtx_begin(id)

#endif
