/* NCCL 2.31's collectives with a per-call configuration (nccl<Collective>Config). For now each checks
 * its ncclCollConfig_t (a WARN naming a bad field) and runs the plain collective: no field changes
 * what the call does yet (docs/COMPATIBILITY.md). A NULL config is the plain call, as in NCCL. */
#include "../misc/log.h"
#include "../core/group.h"
#include "api.h"

/* An algorithm selection is not acted on yet: say so once per process rather than at every call. */
static void note_unused(const ncclCollConfig_t* c, const char* fn) {
  static int told; /* atomic */
  if (c->algSelection && c->algSelection[0] && !__atomic_exchange_n(&told, 1, __ATOMIC_RELAXED))
    INFO(LOG_TUNING,
         "%s: ncclCollConfig_t.algSelection \"%.64s\" is not honoured by Chorus yet: the algorithm is "
         "chosen as for the plain call",
         fn, c->algSelection);
}

/* The config is checked first: a bad one fails the call, and the group it belongs to, as any bad
 * argument does, before anything is queued. */
static ch_status take(const ncclCollConfig_t* config, const char* fn) {
  ncclCollConfig_t c;
  ch_status s = coll_parse_config(config, fn, &c);
  if (s != CH_OK) {
    group_set_error(s);
    return s;
  }
  note_unused(&c, fn);
  return CH_OK;
}

#define TAKE(fn)                            \
  do {                                      \
    ch_status s_ = take(config, fn);        \
    if (s_ != CH_OK) return ch_to_nccl(s_); \
  } while (0)

CH_API(ncclResult_t, ncclAllReduceConfig, const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype,
       ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream, const ncclCollConfig_t* config) {
  TAKE("ncclAllReduceConfig");
  return ncclAllReduce(sendbuff, recvbuff, count, datatype, op, comm, stream);
}

CH_API(ncclResult_t, ncclBroadcastConfig, const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype,
       int root, ncclComm_t comm, cudaStream_t stream, const ncclCollConfig_t* config) {
  TAKE("ncclBroadcastConfig");
  return ncclBroadcast(sendbuff, recvbuff, count, datatype, root, comm, stream);
}

CH_API(ncclResult_t, ncclReduceConfig, const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype,
       ncclRedOp_t op, int root, ncclComm_t comm, cudaStream_t stream, const ncclCollConfig_t* config) {
  TAKE("ncclReduceConfig");
  return ncclReduce(sendbuff, recvbuff, count, datatype, op, root, comm, stream);
}

CH_API(ncclResult_t, ncclAllGatherConfig, const void* sendbuff, void* recvbuff, size_t sendcount,
       ncclDataType_t datatype, ncclComm_t comm, cudaStream_t stream, const ncclCollConfig_t* config) {
  TAKE("ncclAllGatherConfig");
  return ncclAllGather(sendbuff, recvbuff, sendcount, datatype, comm, stream);
}

CH_API(ncclResult_t, ncclReduceScatterConfig, const void* sendbuff, void* recvbuff, size_t recvcount,
       ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream, const ncclCollConfig_t* config) {
  TAKE("ncclReduceScatterConfig");
  return ncclReduceScatter(sendbuff, recvbuff, recvcount, datatype, op, comm, stream);
}

CH_API(ncclResult_t, ncclAlltoAllConfig, const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype,
       ncclComm_t comm, cudaStream_t stream, const ncclCollConfig_t* config) {
  TAKE("ncclAlltoAllConfig");
  return ncclAlltoAll(sendbuff, recvbuff, count, datatype, comm, stream);
}

CH_API(ncclResult_t, ncclGatherConfig, const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype,
       int root, ncclComm_t comm, cudaStream_t stream, const ncclCollConfig_t* config) {
  TAKE("ncclGatherConfig");
  return ncclGather(sendbuff, recvbuff, count, datatype, root, comm, stream);
}

CH_API(ncclResult_t, ncclScatterConfig, const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype,
       int root, ncclComm_t comm, cudaStream_t stream, const ncclCollConfig_t* config) {
  TAKE("ncclScatterConfig");
  return ncclScatter(sendbuff, recvbuff, count, datatype, root, comm, stream);
}
