/* Routing a checked call: where it runs (place_call records the executor, core/exec.h), and how it
 * is queued: whole (queue_task), in pieces through the pinned pool (route_call), as a staged
 * reduction's data movement plus the GPU's combine (queue_reduction), or once the group has launched
 * (defer_task). The entry points and their checks are coll.c; this is their enqueue, as NCCL's
 * enqueue.c beside its collectives.cc. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "../misc/log.h"
#include "../misc/utils.h"
#include "../cuda/cudrv.h"
#include "../comm/work.h"
#include "../tune/tune.h"
#include "../core/exec.h"
#include "../core/group.h"
#include "../core/host_stream.h"
#include "../core/init.h"
#include "../gpu/gpu.h"
#include "../staging/staging.h"
#include "../observe/observe.h"
#include "api.h"

static int is_collective(int f) { return f != FUNC_SEND && f != FUNC_RECV && f != FUNC_SENDRECV; }

/* A piece of an AllGather or ReduceScatter, or a reduction's data movement (t->gpu_reduce), on host
 * buffers (its peers' are device memory, so every rank makes the same calls): its buffers are copied
 * to and from host memory laid out as the plan expects (the reduction combined there), and the call
 * completes before returning. */
static ch_status stage_host(struct ch_task* t, const char* fn, int needs_send, int needs_recv) {
  t->exec = EXEC_STAGE;
  return stage_in(t, needs_send, needs_recv, 1, fn);
}

/* Where the call runs (core/exec.h), decided here once and recorded in t->exec. CUDA buffers
 * (cuda/cudrv.h) are looked at only in a process that has the CUDA driver loaded. Device memory of
 * ranks sharing one GPU runs there (gpu/call.c); other device memory cannot be read by the host, so
 * such a call runs on host copies (staging/staging.c). Managed memory is host memory to us, once the work
 * queued on the call's CUDA stream (NULL: the legacy stream) is done, as NCCL orders a call after it.
 * One call takes buffers of one kind. Host buffers run on a Chorus host stream's thread when the call
 * names one, else on the calling thread. */
static ch_status place_call(struct ch_task* t, const char* fn, int needs_send, int needs_recv) {
  int ours = t->stream && stream_is_ours(t->stream);
  t->exec = ours ? EXEC_HOST_STREAM : EXEC_HOST;
  if (!cudrv_present()) return t->stride || t->gpu_reduce ? stage_host(t, fn, needs_send, needs_recv) : CH_OK;
  const void* bufs[2] = {needs_send ? t->sendbuff : NULL, needs_recv ? t->recvbuff : NULL};
  static const char* names[2] = {"sendbuff", "recvbuff"};
  static const char* kinds[3] = {"host memory", "CUDA device memory", "CUDA managed memory"};
  enum cu_mem k[2] = {CU_MEM_HOST, CU_MEM_HOST};
  int dev[2] = {-1, -1}, ndev = 0, nhost = 0, managed = 0;
  for (int i = 0; i < 2; i++) {
    if (!bufs[i]) continue;
    k[i] = cudrv_classify(bufs[i], &dev[i]);
    ndev += k[i] == CU_MEM_DEVICE, nhost += k[i] == CU_MEM_HOST, managed |= k[i] == CU_MEM_MANAGED;
  }
  if (ndev && nhost) {
    WARN("%s: sendbuff %p is %s but recvbuff %p is %s: one call takes host buffers or CUDA buffers, not both "
         "(rank %d)", fn, bufs[0], kinds[k[0]], bufs[1], kinds[k[1]], t->comm->rank);
    return CH_INVALID_ARG;
  }
  if (ndev && ours) {
    int i = k[0] == CU_MEM_DEVICE ? 0 : 1;
    WARN("%s: %s %p is CUDA device memory (device %d), but the stream is a Chorus host stream: pass the CUDA "
         "stream the buffers are used on (or NULL) (rank %d)", fn, names[i], bufs[i], dev[i], t->comm->rank);
    return CH_INVALID_ARG;
  }
  /* One rank, in place, on the GPU: the result is already there (a reduction of one, divided by one);
   * NCCL does nothing either. Only PreMulSum changes the data. */
  if (ndev && gpu_takes(t) && t->comm->nranks == 1 && is_collective(t->func) && t->sendbuff == t->recvbuff &&
      red_keeps_one(&t->red)) {
    t->noop = 1;
    return CH_OK;
  }
  if (ndev && gpu_takes(t)) {
    t->exec = EXEC_KERNEL;
    return gpu_in(t, needs_send, needs_recv, fn);
  }
  if (ndev) {
    t->exec = EXEC_STAGE;
    return stage_in(t, needs_send, needs_recv, 0, fn);
  }
  if (managed && !ours) CHECK(cudrv_stream_sync(t->stream));
  return t->stride || t->gpu_reduce ? stage_host(t, fn, needs_send, needs_recv) : CH_OK;
}

/* Checked: place t (place_call) and queue it, or record it done when it has nothing to do. */
static ch_status queue_task(struct ch_task* t, const char* fn, int needs_send, int needs_recv) {
  struct ncclComm* comm = t->comm;
  const void* sendbuff = t->sendbuff; /* the application's: staging points t at host copies */
  void* recvbuff = t->recvbuff;
  ch_status s = place_call(t, fn, needs_send, needs_recv);
  if (s == CH_OK && t->stream && t->exec == EXEC_HOST)
    INFO(LOG_COLL, "%s: stream %p is not a Chorus host stream; the call completes before returning", fn,
         (void*)t->stream);
  if (s == CH_OK && t->noop) {
    fr_enqueue(comm, t, 1); /* recorded as done */
    obs_add(&comm->ctr_noop, 1);
    INFO(LOG_COLL, "%s: one rank, in place: nothing to do (comm %p)", fn, (void*)comm);
  } else if (s == CH_OK) {
    const char* as = algo_fname(t->func); /* a staged reduction's data movement runs as another function */
    INFO(LOG_COLL, "%s: opCount %llu sendbuff %p recvbuff %p count %zu datatype %d op %d root %d comm %p [nranks=%d]%s%s%s%s",
         fn, (unsigned long long)comm->seq, sendbuff, recvbuff, t->count, t->type, t->op, t->root, (void*)comm,
         comm->nranks, t->piece ? " (a piece)" : "", strcmp(as, fn) ? " as " : "", strcmp(as, fn) ? as : "",
         t->gpu_reduce ? ", reduced on the GPU" : "");
    s = enq_task(t);
  }
  if (s != CH_OK) group_set_error(s); /* not queued: the group must not run without it */
  return s;
}

/* A split reduction's AllGather inside a group: queued once the group has launched (core/group.c's
 * group_after), holding a reference on its comm until then. */
struct later_task {
  struct ch_task t;
  const char* fn;
  int needs_send, needs_recv;
};

static ch_status queue_later(void* arg, int run) {
  struct later_task* l = arg;
  struct ncclComm* comm = l->t.comm;
  ch_status s = CH_OK;
  if (run) {
    struct comm_guard g;
    if ((s = comm_check(comm, l->fn)) == CH_OK && (s = comm_enter(comm, &g)) == CH_OK) {
      s = queue_task(&l->t, l->fn, l->needs_send, l->needs_recv);
      comm_leave(&g);
    }
  }
  comm_unref(comm);
  free(l);
  return s;
}

static ch_status defer_task(const struct ch_task* t, const char* fn, int needs_send, int needs_recv) {
  struct later_task* l = malloc(sizeof(*l));
  if (!l) {
    WARN("%s: out of memory (rank %d)", fn, t->comm->rank);
    return CH_SYSTEM;
  }
  *l = (struct later_task){.t = *t, .fn = fn, .needs_send = needs_send, .needs_recv = needs_recv};
  atomic_fetch_add(&t->comm->refs, 1); /* an abort and destroy meanwhile leave comm to queue_later */
  ch_status s = group_after(queue_later, l);
  if (s != CH_OK) queue_later(l, 0);
  return s;
}

/* A staged reduction whose GPUs reduce (staging/staging.c's stage_reduce_way): host memory moves the
 * inputs, as calls of their own whose results the GPU combines (t->gpu_reduce). SPLIT, for an
 * AllReduce: nranks blocks of whole 64-byte lines, an AlltoAll of each rank's block, which its GPU
 * reduces in place in recvbuff, then an AllGather of the reduced blocks in place; the elements past
 * the blocks (the tail) gathered and reduced by every GPU. The tail goes first: it reads the input past the blocks, which the
 * other two never write (buffers that overlap without being one give undefined results, as in NCCL).
 * The AllGather's input is the kernel's output: it is copied on the call's stream (piece_ordered),
 * never on the input stream pieces use, and inside a group it is queued once the group has launched
 * (a group copies every input before any of its plans runs). A group of this one call so makes the
 * same calls as no group. Whole lines keep the kernel's loads over PCIe aligned. */
static ch_status queue_reduction(struct ch_task* t, const char* fn, int needs_send, int needs_recv) {
  int way = stage_reduce_way(t);
  if (way == STAGE_RED_CPU) return queue_task(t, fn, needs_send, needs_recv);
  struct ch_task p = *t;
  p.gpu_reduce = 1;
  if (way == STAGE_RED_GATHER) {
    p.func = t->func == FUNC_REDUCE ? FUNC_GATHER : FUNC_ALLGATHER;
    return queue_task(&p, fn, needs_send, needs_recv);
  }
  p.func = FUNC_ALLTOALL;
  if (t->func == FUNC_REDUCESCATTER) return queue_task(&p, fn, needs_send, needs_recv);
  size_t n = (size_t)t->comm->nranks, esize = red_type_size(t->type), unit = 64 / esize;
  size_t C = t->count / n / unit * unit, tail = t->count - C * n;
  if (!C) { /* too small to split on whole lines: gathered (alike: from count and n) */
    p.func = FUNC_ALLGATHER;
    return queue_task(&p, fn, needs_send, needs_recv);
  }
  char* recv = t->recvbuff;
  ch_status s = CH_OK;
  if (tail) {
    struct ch_task q = p;
    q.func = FUNC_ALLGATHER, q.count = tail;
    q.sendbuff = (const char*)t->sendbuff + C * n * esize, q.recvbuff = recv + C * n * esize;
    s = queue_task(&q, fn, needs_send, needs_recv);
  }
  char* mine = recv + (size_t)t->comm->rank * C * esize; /* (queue_task points p at its host copies) */
  p.count = C, p.recvbuff = mine;
  if (s == CH_OK) s = queue_task(&p, fn, needs_send, needs_recv);
  struct ch_task g = *t;
  g.func = FUNC_ALLGATHER, g.count = C, g.sendbuff = mine, g.piece_ordered = 1;
  if (s == CH_OK) s = group_depth() ? defer_task(&g, fn, needs_send, needs_recv) : queue_task(&g, fn, needs_send, needs_recv);
  return s;
}

/* A large AllReduce, Reduce, Broadcast, AllGather or ReduceScatter on a communicator that stages
 * device buffers runs as pieces (staging/staging.c's stage_pieces: decided from the communicator and the
 * call, alike on every rank): each a call of its own, so that the copies of one overlap the transfer
 * of another. An AllGather's or ReduceScatter's piece takes the same slice of every rank's block. */
ch_status route_call(struct ch_task* t, const char* fn, int needs_send, int needs_recv) {
  size_t per = stage_pieces(t);
  if (!per) return queue_reduction(t, fn, needs_send, needs_recv);
  size_t esize = red_type_size(t->type), one = t->count * esize, all = one * (size_t)t->comm->nranks;
  int ag = t->func == FUNC_ALLGATHER, rs = t->func == FUNC_REDUCESCATTER;
  size_t sbytes = rs ? all : one, rbytes = ag ? all : one;
  /* Buffers that overlap other than in place (one buffer; AllGather's input its own block of the
   * result, ReduceScatter's result its own block of the input): a piece's input may be another's
   * result, so every input copy keeps the call's stream order (still in pieces: the peers make the
   * same calls). In place, a piece writes no part of a later piece's input. */
  uintptr_t sb = (uintptr_t)t->sendbuff, rb = (uintptr_t)t->recvbuff, mine = (uintptr_t)t->comm->rank * one;
  int in_place = ag ? sb == rb + mine : rs ? rb == sb + mine : sb == rb;
  int ordered = needs_send && needs_recv && !in_place && sb < rb + rbytes && rb < sb + sbytes;
  ch_status s = CH_OK;
  for (size_t off = 0, k = 0; off < t->count && s == CH_OK; off += per, k++) {
    struct ch_task p = *t;
    p.count = UT_MIN(per, t->count - off);
    p.piece = (int)k + 1;
    p.piece_ordered = ordered;
    p.stride = ag || rs ? t->count : 0;
    if (p.sendbuff) p.sendbuff = (const char*)t->sendbuff + off * esize;
    if (p.recvbuff) p.recvbuff = (char*)t->recvbuff + off * esize;
    s = queue_reduction(&p, fn, needs_send, needs_recv);
  }
  return s;
}
