/* CUDA device buffers through host memory: the host path cannot read device memory, so a call whose
 * buffers are device memory runs on host copies. Its CUDA stream is synchronised first (the call is
 * ordered after the work queued on it), the input is copied to host memory, the call runs there like
 * any host call, and the result is copied back before the group returns (every call on a non-Chorus
 * stream completes before returning, so work queued on the stream afterwards sees it). Correct, not
 * fast: device kernels and CUDA IPC are the fast path (not in this build).
 * Ownership: a stage belongs to its task, made by the calling thread in api_coll.c and finished by
 * the same thread when its group closes (group.c). */
#include <stdint.h>
#include <stdlib.h>

#include "../cuda/cudrv.h"
#include "../misc/log.h"
#include "enqueue.h"

struct stage {
  char* block[2];  /* host copies: one block when the two buffers overlap (in place), else one each */
  void* dev_recv;  /* where the result goes back to */
  char* host_recv; /* the result, in host memory */
  size_t recv_bytes;
};

/* Bytes of sendbuff and recvbuff a call spans (count is per rank for the gathering kinds). */
static void extents(const struct ch_task* t, int nranks, size_t* sb, size_t* rb) {
  size_t one = t->count * red_type_size(t->type), all = one * (size_t)nranks;
  switch (t->func) {
    case FUNC_ALLGATHER: case FUNC_GATHER: *sb = one, *rb = all; break;
    case FUNC_REDUCESCATTER: case FUNC_SCATTER: *sb = all, *rb = one; break;
    case FUNC_ALLTOALL: *sb = *rb = all; break;
    default: *sb = *rb = one; break;
  }
}

static void stage_free(struct stage* st) {
  free(st->block[0]);
  free(st->block[1]);
  free(st);
}

ch_status stage_in(struct ch_task* t, int needs_send, int needs_recv, const char* fn) {
  size_t sb, rb;
  extents(t, t->comm->nranks, &sb, &rb);
  if (!needs_send) sb = 0;
  if (!needs_recv) rb = 0;
  uintptr_t s = (uintptr_t)t->sendbuff, r = (uintptr_t)t->recvbuff;
  ch_status e = CH_OK;
  struct stage* st = calloc(1, sizeof(*st));
  if (!st) goto oom;
  CHECK_GOTO(cudrv_stream_sync(t->stream), e, fail); /* the inputs are written */
  if (sb && rb && s < r + rb && r < s + sb) { /* in place, or overlapping: one block keeps the layout */
    uintptr_t lo = s < r ? s : r, hi = s + sb > r + rb ? s + sb : r + rb;
    if (!(st->block[0] = malloc(hi - lo))) goto oom;
    t->sendbuff = st->block[0] + (s - lo);
    st->host_recv = st->block[0] + (r - lo);
  } else {
    if (sb && !(st->block[0] = malloc(sb))) goto oom;
    if (rb && !(st->block[1] = malloc(rb))) goto oom;
    if (sb) t->sendbuff = st->block[0];
    st->host_recv = st->block[1];
  }
  if (sb) CHECK_GOTO(cudrv_copy_dtoh((void*)(uintptr_t)t->sendbuff, (const void*)s, sb), e, fail);
  if (rb) {
    st->dev_recv = t->recvbuff;
    st->recv_bytes = rb;
    t->recvbuff = st->host_recv;
  }
  t->stage = st;
  INFO(LOG_COLL, "%s: device buffers staged through %zu + %zu bytes of host memory", fn, sb, rb);
  return CH_OK;
oom:
  WARN("%s: out of memory for host copies of device buffers (%zu + %zu bytes, rank %d)", fn, sb, rb, t->comm->rank);
  e = CH_SYSTEM;
fail:
  if (st) stage_free(st);
  t->sendbuff = (const void*)s, t->recvbuff = (void*)r;
  return e;
}

ch_status stage_out(struct ch_task* t, int ok) {
  struct stage* st = t->stage;
  if (!st) return CH_OK;
  t->stage = NULL;
  ch_status s = ok && st->recv_bytes ? cudrv_copy_htod(st->dev_recv, st->host_recv, st->recv_bytes) : CH_OK;
  stage_free(st);
  return s;
}
