/* NCCL 2.31's collectives with a per-call configuration (nccl<Collective>Config). Each checks its
 * ncclCollConfig_t (a WARN naming a bad field) and submits the collective with it: algSelection and
 * forceAlgSelection restrict the choice of algorithm and protocol (tune/select.c), userProfilerTag
 * goes to the flight recorder; the CTA fields are without effect (docs/COMPATIBILITY.md). A NULL
 * config is the plain call, as in NCCL. */
#include "../misc/log.h"
#include "../core/group.h"
#include "../algo/algo.h"
#include "api.h"

/* The config is checked first: a bad one fails the call, and the group it belongs to, as any bad
 * argument does, before anything is queued. */
static ch_status take(const ncclCollConfig_t* config, const char* fn, ncclCollConfig_t* c) {
  ch_status s = coll_parse_config(config, fn, c);
  if (s != CH_OK) group_set_error(s);
  return s;
}

/* c: the checked copy, which the call reads (the caller's may change once we return). */
#define TAKE(fn)                              \
  ncclCollConfig_t c;                         \
  do {                                        \
    ch_status s_ = take(config, fn, &c);      \
    if (s_ != CH_OK) return ch_to_nccl(s_);   \
  } while (0)

CH_API(ncclResult_t, ncclAllReduceConfig, const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype,
       ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream, const ncclCollConfig_t* config) {
  TAKE("ncclAllReduceConfig");
  return api_submit(FUNC_ALLREDUCE, sendbuff, recvbuff, count, datatype, op, 0, comm, stream, &c);
}

CH_API(ncclResult_t, ncclBroadcastConfig, const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype,
       int root, ncclComm_t comm, cudaStream_t stream, const ncclCollConfig_t* config) {
  TAKE("ncclBroadcastConfig");
  return api_submit(FUNC_BROADCAST, sendbuff, recvbuff, count, datatype, ncclSum, root, comm, stream, &c);
}

CH_API(ncclResult_t, ncclReduceConfig, const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype,
       ncclRedOp_t op, int root, ncclComm_t comm, cudaStream_t stream, const ncclCollConfig_t* config) {
  TAKE("ncclReduceConfig");
  return api_submit(FUNC_REDUCE, sendbuff, recvbuff, count, datatype, op, root, comm, stream, &c);
}

CH_API(ncclResult_t, ncclAllGatherConfig, const void* sendbuff, void* recvbuff, size_t sendcount,
       ncclDataType_t datatype, ncclComm_t comm, cudaStream_t stream, const ncclCollConfig_t* config) {
  TAKE("ncclAllGatherConfig");
  return api_submit(FUNC_ALLGATHER, sendbuff, recvbuff, sendcount, datatype, ncclSum, 0, comm, stream, &c);
}

CH_API(ncclResult_t, ncclReduceScatterConfig, const void* sendbuff, void* recvbuff, size_t recvcount,
       ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream, const ncclCollConfig_t* config) {
  TAKE("ncclReduceScatterConfig");
  return api_submit(FUNC_REDUCESCATTER, sendbuff, recvbuff, recvcount, datatype, op, 0, comm, stream, &c);
}

CH_API(ncclResult_t, ncclAlltoAllConfig, const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype,
       ncclComm_t comm, cudaStream_t stream, const ncclCollConfig_t* config) {
  TAKE("ncclAlltoAllConfig");
  return api_submit(FUNC_ALLTOALL, sendbuff, recvbuff, count, datatype, ncclSum, 0, comm, stream, &c);
}

CH_API(ncclResult_t, ncclGatherConfig, const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype,
       int root, ncclComm_t comm, cudaStream_t stream, const ncclCollConfig_t* config) {
  TAKE("ncclGatherConfig");
  return api_submit(FUNC_GATHER, sendbuff, recvbuff, count, datatype, ncclSum, root, comm, stream, &c);
}

CH_API(ncclResult_t, ncclScatterConfig, const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype,
       int root, ncclComm_t comm, cudaStream_t stream, const ncclCollConfig_t* config) {
  TAKE("ncclScatterConfig");
  return api_submit(FUNC_SCATTER, sendbuff, recvbuff, count, datatype, ncclSum, root, comm, stream, &c);
}
