/* ncclAllToAllv, RCCL's and NCCLX's call (they share its signature; NCCL has none): rank i sends
 * sendcounts[j] elements from sendbuff + sdispls[j] to rank j and receives recvcounts[j] elements
 * from rank j at recvbuff + rdispls[j], counts and displacements in elements of datatype.
 *
 * It is made here of a send and a receive per peer in one group, as AlltoAll's are in core/plan.c, so
 * every placement (threads, shared memory, the network, host streams, device buffers staged or on
 * one GPU), the waves of core/group.c and the connection pool apply unchanged. Zero counts are sent
 * too (a zero-byte message still takes one step, algo/p2p.c): both ends of every pair meet, and a pair
 * whose counts differ is a mismatch named by both counts (fault/mismatch.c) rather than a hang. Not
 * where device buffers of ranks sharing one GPU run on it (gpu_runs_p2p): a group there holds no sends
 * through host memory, which an empty one is; empty blocks are left out on every rank of such a
 * communicator, and a pair whose counts differ only by one of them being 0 waits until the timeout
 * (its stall report names the peer), while other differences are found on the GPU path.
 * Their headers carry origin AllToAllv and the pair (core/plan.c), so a plain ncclSend does not match
 * one either. In the flight recorder and the counters the call is one entry (ch_task.part). */
#include <stdint.h>
#include <stdlib.h>

#include "../misc/log.h"
#include "../cuda/cudrv.h"
#include "../comm/work.h"
#include "../core/group.h"
#include "../core/init.h"
#include "../gpu/gpu.h"
#include "api.h"
#include "nvtx.h"

#define FN "ncclAllToAllv"

/* One peer's block in one of the buffers, as byte addresses [lo, hi). */
struct range {
  uintptr_t lo, hi;
  int peer, recv;
};

static int by_lo(const void* a, const void* b) {
  const struct range *x = a, *y = b;
  return x->lo < y->lo ? -1 : x->lo > y->lo;
}

/* Peer p's block of a buffer: its displacement and count (checked so the block's end is an address),
 * into r when it is not empty. Returns 0 and WARNs for a bad block. */
static int block(const char* side, const void* buf, const size_t counts[], const size_t displs[], int p, size_t esize,
                 int rank, struct range* r) {
  const char* dname = side[0] == 's' ? "sdispls" : "rdispls";
  size_t c = counts[p], d = displs[p];
  if (c == 0) return 1;
  if (d > SIZE_MAX - c || d + c > (size_t)PTRDIFF_MAX / esize || (d + c) * esize > UINTPTR_MAX - (uintptr_t)buf) {
    WARN("%s: %s[%d] (%zu) + %scounts[%d] (%zu) elements of %zu bytes overflow the address space (rank %d)", FN, dname,
         p, d, side, p, c, esize, rank);
    return 0;
  }
  if (!buf) {
    WARN("%s: %sbuff is NULL but %scounts[%d] is %zu (rank %d)", FN, side, side, p, c, rank);
    return 0;
  }
  *r = (struct range){(uintptr_t)buf + d * esize, (uintptr_t)buf + (d + c) * esize, p, side[0] == 'r'};
  return 1;
}

static void say_overlap(const struct range* a, const struct range* b, size_t esize, int rank, const void* sendbuff,
                        const void* recvbuff) {
  const void* base[2] = {sendbuff, recvbuff};
  const char* what[2] = {"send", "receive"};
  size_t alo = (a->lo - (uintptr_t)base[a->recv]) / esize, ahi = (a->hi - (uintptr_t)base[a->recv]) / esize;
  size_t blo = (b->lo - (uintptr_t)base[b->recv]) / esize, bhi = (b->hi - (uintptr_t)base[b->recv]) / esize;
  WARN("%s: the %s block of rank %d (elements [%zu, %zu) of %sbuff) overlaps the %s block of rank %d (elements "
       "[%zu, %zu) of %sbuff): %s (rank %d)",
       FN, what[a->recv], a->peer, alo, ahi, a->recv ? "recv" : "send", what[b->recv], b->peer, blo, bhi,
       b->recv ? "recv" : "send",
       a->recv && b->recv ? "receive blocks must not overlap" : "ncclAllToAllv is out of place only", rank);
}

/* Receive blocks may not overlap each other nor any send block (a send block would be overwritten before
 * or while it is sent, as in place); send blocks may overlap each other (they are only read). In order of
 * start, a block overlaps an earlier one iff it starts before the furthest end of that kind so far. */
static ch_status check_overlap(struct range* r, int n, size_t esize, int rank, const void* sendbuff,
                               const void* recvbuff) {
  qsort(r, (size_t)n, sizeof(*r), by_lo);
  const struct range* far[2] = {NULL, NULL}; /* the send block and the receive block reaching furthest */
  for (int i = 0; i < n; i++) {
    for (int k = 0; k < 2; k++) {
      if (!far[k] || r[i].lo >= far[k]->hi || (!k && !r[i].recv)) continue; /* sends may share bytes */
      say_overlap(far[k], &r[i], esize, rank, sendbuff, recvbuff);
      return CH_INVALID_ARG;
    }
    if (!far[r[i].recv] || r[i].hi > far[r[i].recv]->hi) far[r[i].recv] = &r[i];
  }
  return CH_OK;
}

/* One call takes host buffers or CUDA buffers, not both (as api/route.c's place_call for the others);
 * its sends and receives are placed one by one, and each sees only one of them. */
static ch_status check_kinds(const void* sb, const void* rb, int rank) {
  static const char* kinds[3] = {"host memory", "CUDA device memory", "CUDA managed memory"};
  if (!sb || !rb || !cudrv_present()) return CH_OK;
  int ds, dr;
  enum cu_mem ks = cudrv_classify(sb, &ds), kr = cudrv_classify(rb, &dr);
  if ((ks == CU_MEM_DEVICE) == (kr == CU_MEM_DEVICE) || ks == CU_MEM_MANAGED || kr == CU_MEM_MANAGED) return CH_OK;
  WARN("%s: sendbuff %p is %s but recvbuff %p is %s: one call takes host buffers or CUDA buffers, not both "
       "(rank %d)",
       FN, sb, kinds[ks], rb, kinds[kr], rank);
  return CH_INVALID_ARG;
}

static ch_status check_args(const void* sendbuff, const size_t sendcounts[], const size_t sdispls[],
                            const void* recvbuff, const size_t recvcounts[], const size_t rdispls[], int type,
                            struct ncclComm* comm, size_t* total) {
  int n = comm->nranks, rank = comm->rank;
  if (type < 0 || type >= ncclNumTypes) {
    WARN("%s: invalid datatype %d (valid: 0..%d)", FN, type, ncclNumTypes - 1);
    return CH_INVALID_ARG;
  }
  const void* arrays[4] = {sendcounts, sdispls, recvcounts, rdispls};
  static const char* names[4] = {"sendcounts", "sdispls", "recvcounts", "rdispls"};
  for (int k = 0; k < 4; k++)
    if (!arrays[k]) {
      WARN("%s: %s is NULL (it needs an entry for each of the %d ranks; rank %d)", FN, names[k], n, rank);
      return CH_INVALID_ARG;
    }
  size_t esize = red_type_size(type);
  struct range* r = malloc(sizeof(*r) * 2 * (size_t)n);
  if (!r) {
    WARN("%s: out of memory checking the blocks of %d ranks (rank %d)", FN, n, rank);
    return CH_SYSTEM;
  }
  int nr = 0, sends = 0, recvs = 0;
  ch_status s = CH_OK;
  *total = 0;
  for (int p = 0; p < n && s == CH_OK; p++) {
    if (!block("send", sendbuff, sendcounts, sdispls, p, esize, rank, &r[nr]) ||
        !block("recv", recvbuff, recvcounts, rdispls, p, esize, rank, &r[nr + (sendcounts[p] != 0)]))
      s = CH_INVALID_ARG;
    nr += (sendcounts[p] != 0) + (recvcounts[p] != 0);
    sends |= sendcounts[p] != 0, recvs |= recvcounts[p] != 0;
    *total = sendcounts[p] > SIZE_MAX - *total ? SIZE_MAX : *total + sendcounts[p]; /* sends may overlap */
  }
  if (s == CH_OK) s = check_overlap(r, nr, esize, rank, sendbuff, recvbuff);
  free(r);
  if (s == CH_OK) s = check_kinds(sends ? sendbuff : NULL, recvs ? recvbuff : NULL, rank);
  return s;
}

/* A send or receive of the call; part 1 stands for the whole call (ch_task.part). */
static ch_status queue_part(const struct ch_task* call, int func, int peer, const void* buf, size_t count, size_t esize,
                            size_t displ, int part) {
  struct ch_task t = *call; /* afresh: routing fills in where each part runs */
  t.func = func, t.root = peer, t.count = count, t.part = part;
  t.sendbuff = func == FUNC_SEND && count ? (const char*)buf + displ * esize : NULL;
  t.recvbuff = func == FUNC_RECV && count ? (char*)buf + displ * esize : NULL;
  return api_queue(&t, NULL, FN);
}

CH_API(ncclResult_t, ncclAllToAllv, const void* sendbuff, const size_t sendcounts[], const size_t sdispls[],
       void* recvbuff, const size_t recvcounts[], const size_t rdispls[], ncclDataType_t datatype, ncclComm_t comm,
       cudaStream_t stream) {
  NVTX_RANGE(FUNC_ALLTOALLV);
  struct comm_guard g;
  ch_status s = comm_check(comm, FN);
  if (s != CH_OK || (s = comm_enter(comm, &g)) != CH_OK) {
    group_set_error(s);
    return ch_to_nccl(s);
  }
  size_t total = 0;
  s = check_args(sendbuff, sendcounts, sdispls, recvbuff, recvcounts, rdispls, (int)datatype, comm, &total);
  if (s != CH_OK) {
    group_set_error(s); /* an enclosing group must not run without it */
    comm_leave(&g);
    return ch_to_nccl(s);
  }
  /* The first block with data stands for the call in the recorder (with its placement): 2 * p + recv. */
  int n = comm->nranks, lead = 0;
  while (lead < 2 * n && !(lead & 1 ? recvcounts : sendcounts)[lead / 2]) lead++;
  lead = lead < 2 * n ? lead : 0;
  size_t esize = red_type_size((int)datatype);
  struct ch_task t = {.type = (int)datatype,
                      .op = ncclSum,
                      .comm = comm,
                      .stream = stream,
                      .origin = FUNC_ALLTOALLV,
                      .origin_root = -1,
                      .call_count = total};
  int all = !gpu_runs_p2p(comm); /* empty blocks too: every pair meets */
  CHECK_GOTO(group_start(), s, out);
  for (int p = 0; p < n && s == CH_OK; p++) {
    if (all || sendcounts[p])
      s = queue_part(&t, FUNC_SEND, p, sendbuff, sendcounts[p], esize, sdispls[p], 2 * p == lead ? 1 : 2);
    if (s == CH_OK && (all || recvcounts[p]))
      s = queue_part(&t, FUNC_RECV, p, recvbuff, recvcounts[p], esize, rdispls[p], 2 * p + 1 == lead ? 1 : 2);
  }
  ch_status e = group_end(); /* outermost: runs the call (or drops its parts after a failed check) */
  if (s == CH_OK) s = e;
out:
  comm_leave(&g);
  return ch_to_nccl(s);
}
