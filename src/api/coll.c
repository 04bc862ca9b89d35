/* NCCL API: collectives, send/recv and groups. Every call is checked here, once, with a WARN that
 * names the function and the bad value; then route.c places it and queues it for the group layer. */
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
#include "nvtx.h"

static int has_op(int f) { return f == FUNC_ALLREDUCE || f == FUNC_REDUCE || f == FUNC_REDUCESCATTER; }
static int has_root(int f) { return f == FUNC_BROADCAST || f == FUNC_REDUCE || f == FUNC_GATHER || f == FUNC_SCATTER; }

/* The call's arguments, and which of its buffers this rank touches (*needs_send, *needs_recv); fn is
 * the API call WARNs name (a send of ncclAllToAllv's is that call's). */
static ch_status check_task(struct ch_task* t, const ncclCollConfig_t* cfg, const char* fn, int* needs_send_out,
                            int* needs_recv_out) {
  struct ncclComm* comm = t->comm; /* checked and entered by the caller */
  if (group_init_pending(comm)) {
    /* Waiting for that init here would wait for ever: it only starts at ncclGroupEnd. */
    WARN("%s: communicator %p is created in the same group (ncclCommInitRank* and collectives on the new "
         "communicator cannot share a group, as in NCCL); call ncclGroupEnd first", fn, (void*)comm);
    return CH_INVALID_USAGE;
  }
  CHECK(comm_ensure_ready(comm));
  if (atomic_load_explicit(&comm->revoked, memory_order_relaxed)) {
    WARN("%s: communicator %p was revoked (ncclCommRevoke); shrink, split or destroy it", fn, (void*)comm);
    return CH_INVALID_USAGE;
  }
  if (t->type < 0 || t->type >= ncclNumTypes) {
    WARN("%s: invalid datatype %d (valid: 0..%d)", fn, t->type, ncclNumTypes - 1);
    return CH_INVALID_ARG;
  }
  if (has_op(t->func)) CHECK(api_red_op(comm, t->op, t->type, &t->red));
  CHECK(tune_check_call(comm, t->func, t->type)); /* NCCL_ALGO/NCCL_PROTO leave it something to run */
  if (cfg) { /* checked here, as NCCL does, before AlltoAll/Gather/Scatter become sends and receives */
    CHECK(tune_sel_resolve(comm, t->func, t->type, cfg->algSelection, cfg->forceAlgSelection, &t->sel));
    t->user_tag = cfg->userProfilerTag;
  }
  CHECK(api_wire_for_call(comm, t, cfg, fn));
  if (has_root(t->func) && (t->root < 0 || t->root >= comm->nranks)) {
    WARN("%s: invalid root %d (nranks is %d)", fn, t->root, comm->nranks);
    return CH_INVALID_ARG;
  }
  if ((t->func == FUNC_SEND || t->func == FUNC_RECV) && (t->root < 0 || t->root >= comm->nranks)) {
    WARN("%s: invalid peer %d (nranks is %d)", fn, t->root, comm->nranks);
    return CH_INVALID_ARG;
  }
  *needs_send_out = *needs_recv_out = 0;
  if (t->count == 0) return CH_OK; /* touches no buffer */
  /* The largest buffer the call spans (a block per rank for the gathering kinds) must be addressable. */
  int per_rank = t->func == FUNC_ALLGATHER || t->func == FUNC_REDUCESCATTER || t->func == FUNC_ALLTOALL ||
                 t->func == FUNC_GATHER || t->func == FUNC_SCATTER;
  size_t esize = red_type_size(t->type), limit = (size_t)PTRDIFF_MAX / esize / (per_rank ? (size_t)comm->nranks : 1);
  if (t->count > limit) {
    WARN("%s: count %zu x %zu-byte %s%s overflows the address space (rank %d)", fn, t->count, esize,
         red_type_name(t->type), per_rank ? " per rank" : "", comm->rank);
    return CH_INVALID_ARG;
  }
  /* Which buffers this rank actually touches. */
  int rank = comm->rank;
  int needs_send = t->func != FUNC_RECV && !(t->func == FUNC_BROADCAST && rank != t->root) &&
                   !(t->func == FUNC_SCATTER && rank != t->root);
  int needs_recv = t->func != FUNC_SEND && !(t->func == FUNC_REDUCE && rank != t->root) &&
                   !(t->func == FUNC_GATHER && rank != t->root);
  if (needs_send && !t->sendbuff) {
    WARN("%s: sendbuff is NULL (count %zu, rank %d)", fn, t->count, rank);
    return CH_INVALID_ARG;
  }
  if (needs_recv && !t->recvbuff) {
    WARN("%s: recvbuff is NULL (count %zu, rank %d)", fn, t->count, rank);
    return CH_INVALID_ARG;
  }
  *needs_send_out = needs_send, *needs_recv_out = needs_recv;
  return CH_OK;
}

ch_status api_queue(struct ch_task* t, const ncclCollConfig_t* cfg, const char* fn) {
  int needs_send, needs_recv;
  ch_status s = check_task(t, cfg, fn, &needs_send, &needs_recv);
  if (s == CH_OK) return route_call(t, fn, needs_send, needs_recv); /* sets the group's error */
  group_set_error(s);
  return s;
}

ncclResult_t api_submit(int func, const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t type,
                        ncclRedOp_t op, int root, ncclComm_t comm, cudaStream_t stream, const ncclCollConfig_t* cfg) {
  NVTX_RANGE(func); /* named after the API call, as NCCL's (ncclBcast's is "ncclBroadcast") */
  struct ch_task t = {.func = func, .sendbuff = sendbuff, .recvbuff = recvbuff, .count = count, .type = (int)type,
                      .op = (int)op, .root = root, .comm = comm, .stream = stream};
  struct comm_guard g;
  ch_status s = comm_check(comm, algo_fname(func));
  if (s == CH_OK && (s = comm_enter(comm, &g)) == CH_OK) {
    s = api_queue(&t, cfg, algo_fname(func));
    comm_leave(&g);
    return ch_to_nccl(s);
  }
  group_set_error(s);
  return ch_to_nccl(s);
}

CH_API(ncclResult_t, ncclAllReduce, const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype,
       ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream) {
  return api_submit(FUNC_ALLREDUCE, sendbuff, recvbuff, count, datatype, op, 0, comm, stream, NULL);
}
CH_API(ncclResult_t, ncclReduce, const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype,
       ncclRedOp_t op, int root, ncclComm_t comm, cudaStream_t stream) {
  return api_submit(FUNC_REDUCE, sendbuff, recvbuff, count, datatype, op, root, comm, stream, NULL);
}
CH_API(ncclResult_t, ncclBroadcast, const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype,
       int root, ncclComm_t comm, cudaStream_t stream) {
  return api_submit(FUNC_BROADCAST, sendbuff, recvbuff, count, datatype, ncclSum, root, comm, stream, NULL);
}
CH_API(ncclResult_t, ncclBcast, void* buff, size_t count, ncclDataType_t datatype, int root, ncclComm_t comm,
       cudaStream_t stream) {
  return api_submit(FUNC_BROADCAST, buff, buff, count, datatype, ncclSum, root, comm, stream, NULL);
}
CH_API(ncclResult_t, ncclAllGather, const void* sendbuff, void* recvbuff, size_t sendcount, ncclDataType_t datatype,
       ncclComm_t comm, cudaStream_t stream) {
  return api_submit(FUNC_ALLGATHER, sendbuff, recvbuff, sendcount, datatype, ncclSum, 0, comm, stream, NULL);
}
CH_API(ncclResult_t, ncclReduceScatter, const void* sendbuff, void* recvbuff, size_t recvcount,
       ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream) {
  return api_submit(FUNC_REDUCESCATTER, sendbuff, recvbuff, recvcount, datatype, op, 0, comm, stream, NULL);
}
CH_API(ncclResult_t, ncclAlltoAll, const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype,
       ncclComm_t comm, cudaStream_t stream) {
  return api_submit(FUNC_ALLTOALL, sendbuff, recvbuff, count, datatype, ncclSum, 0, comm, stream, NULL);
}
CH_API(ncclResult_t, ncclGather, const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype,
       int root, ncclComm_t comm, cudaStream_t stream) {
  return api_submit(FUNC_GATHER, sendbuff, recvbuff, count, datatype, ncclSum, root, comm, stream, NULL);
}
CH_API(ncclResult_t, ncclScatter, const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype,
       int root, ncclComm_t comm, cudaStream_t stream) {
  return api_submit(FUNC_SCATTER, sendbuff, recvbuff, count, datatype, ncclSum, root, comm, stream, NULL);
}
CH_API(ncclResult_t, ncclSend, const void* sendbuff, size_t count, ncclDataType_t datatype, int peer,
       ncclComm_t comm, cudaStream_t stream) {
  return api_submit(FUNC_SEND, sendbuff, NULL, count, datatype, ncclSum, peer, comm, stream, NULL);
}
CH_API(ncclResult_t, ncclRecv, void* recvbuff, size_t count, ncclDataType_t datatype, int peer, ncclComm_t comm,
       cudaStream_t stream) {
  return api_submit(FUNC_RECV, NULL, recvbuff, count, datatype, ncclSum, peer, comm, stream, NULL);
}

CH_API(ncclResult_t, ncclGroupStart, void) {
  NVTX_RANGE(NVTX_GROUP_START);
  return ch_to_nccl(group_start());
}
CH_API(ncclResult_t, ncclGroupEnd, void) {
  NVTX_RANGE(NVTX_GROUP_END);
  return ch_to_nccl(group_end());
}

CH_API(ncclResult_t, ncclGroupSimulateEnd, ncclSimInfo_t* simInfo) {
  NVTX_RANGE(NVTX_GROUP_SIMULATE_END);
  if (!simInfo) {
    WARN("ncclGroupSimulateEnd: simInfo is NULL");
    return ncclInvalidArgument;
  }
  if (simInfo->magic != 0x74685283) {
    WARN("ncclGroupSimulateEnd: simInfo not initialized via NCCL_SIM_INFO_INITIALIZER");
    return ncclInvalidArgument;
  }
  /* As in NCCL, the calls of the group are evaluated, not run. */
  float us = 0;
  ch_status s = group_simulate_end(&us);
  if (s == CH_OK) simInfo->estimatedTime = us;
  return ch_to_nccl(s);
}
