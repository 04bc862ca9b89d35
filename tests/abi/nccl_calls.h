/* The calls of each NCCL header version, with NCCL's signatures, as X-macro lists: X(ret, name, params).
 * Types are named only, so a list expands against whichever header declared them (tests/abi/
 * nccl_older.h for 2.28.9 and 2.30.7, include/nccl.h for 2.31.2). Each version's list adds to the one
 * before: a program of that version references every entry. */
#ifndef CHORUS_ABI_NCCL_CALLS_H
#define CHORUS_ABI_NCCL_CALLS_H

/* NCCL 2.28.9 */
#define ABI_CALLS_2289(X)                                                                                       \
  X(ncclResult_t, ncclMemAlloc, (void** ptr, size_t size))                                                      \
  X(ncclResult_t, ncclMemFree, (void* ptr))                                                                     \
  X(ncclResult_t, ncclGetVersion, (int* version))                                                               \
  X(ncclResult_t, ncclGetUniqueId, (ncclUniqueId * uniqueId))                                                   \
  X(ncclResult_t, ncclCommInitRankConfig, (ncclComm_t * comm, int nranks, ncclUniqueId commId, int rank,        \
                                           ncclConfig_t* config))                                               \
  X(ncclResult_t, ncclCommInitRank, (ncclComm_t * comm, int nranks, ncclUniqueId commId, int rank))             \
  X(ncclResult_t, ncclCommInitAll, (ncclComm_t * comm, int ndev, const int* devlist))                           \
  X(ncclResult_t, ncclCommFinalize, (ncclComm_t comm))                                                          \
  X(ncclResult_t, ncclCommDestroy, (ncclComm_t comm))                                                           \
  X(ncclResult_t, ncclCommAbort, (ncclComm_t comm))                                                             \
  X(ncclResult_t, ncclCommRevoke, (ncclComm_t comm, int revokeFlags))                                           \
  X(ncclResult_t, ncclCommSplit, (ncclComm_t comm, int color, int key, ncclComm_t* newcomm, ncclConfig_t* config)) \
  X(ncclResult_t, ncclCommShrink, (ncclComm_t comm, int* excludeRanksList, int excludeRanksCount,               \
                                   ncclComm_t* newcomm, ncclConfig_t* config, int shrinkFlags))                 \
  X(ncclResult_t, ncclCommInitRankScalable, (ncclComm_t * newcomm, int nranks, int myrank, int nId,             \
                                             ncclUniqueId* commIds, ncclConfig_t* config))                      \
  X(const char*, ncclGetErrorString, (ncclResult_t result))                                                     \
  X(const char*, ncclGetLastError, (ncclComm_t comm))                                                           \
  X(void, ncclResetDebugInit, (void))                                                                           \
  X(ncclResult_t, ncclCommGetAsyncError, (ncclComm_t comm, ncclResult_t * asyncError))                          \
  X(ncclResult_t, ncclCommCount, (const ncclComm_t comm, int* count))                                           \
  X(ncclResult_t, ncclCommCuDevice, (const ncclComm_t comm, int* device))                                       \
  X(ncclResult_t, ncclCommUserRank, (const ncclComm_t comm, int* rank))                                         \
  X(ncclResult_t, ncclCommRegister, (const ncclComm_t comm, void* buff, size_t size, void** handle))            \
  X(ncclResult_t, ncclCommDeregister, (const ncclComm_t comm, void* handle))                                    \
  X(ncclResult_t, ncclCommWindowRegister, (ncclComm_t comm, void* buff, size_t size, ncclWindow_t* win,         \
                                           int winFlags))                                                       \
  X(ncclResult_t, ncclCommWindowDeregister, (ncclComm_t comm, ncclWindow_t win))                                \
  X(ncclResult_t, ncclRedOpCreatePreMulSum, (ncclRedOp_t * op, void* scalar, ncclDataType_t datatype,           \
                                             ncclScalarResidence_t residence, ncclComm_t comm))                 \
  X(ncclResult_t, ncclRedOpDestroy, (ncclRedOp_t op, ncclComm_t comm))                                          \
  X(ncclResult_t, ncclReduce, (const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype,     \
                               ncclRedOp_t op, int root, ncclComm_t comm, cudaStream_t stream))                 \
  X(ncclResult_t, ncclBcast, (void* buff, size_t count, ncclDataType_t datatype, int root, ncclComm_t comm,     \
                              cudaStream_t stream))                                                             \
  X(ncclResult_t, ncclBroadcast, (const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype,  \
                                  int root, ncclComm_t comm, cudaStream_t stream))                              \
  X(ncclResult_t, ncclAllReduce, (const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype,  \
                                  ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream))                        \
  X(ncclResult_t, ncclReduceScatter, (const void* sendbuff, void* recvbuff, size_t recvcount,                   \
                                      ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm,                 \
                                      cudaStream_t stream))                                                     \
  X(ncclResult_t, ncclAllGather, (const void* sendbuff, void* recvbuff, size_t sendcount,                       \
                                  ncclDataType_t datatype, ncclComm_t comm, cudaStream_t stream))               \
  X(ncclResult_t, ncclAlltoAll, (const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype,   \
                                 ncclComm_t comm, cudaStream_t stream))                                         \
  X(ncclResult_t, ncclGather, (const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype,     \
                               int root, ncclComm_t comm, cudaStream_t stream))                                 \
  X(ncclResult_t, ncclScatter, (const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype,    \
                                int root, ncclComm_t comm, cudaStream_t stream))                                \
  X(ncclResult_t, ncclSend, (const void* sendbuff, size_t count, ncclDataType_t datatype, int peer,             \
                             ncclComm_t comm, cudaStream_t stream))                                             \
  X(ncclResult_t, ncclRecv, (void* recvbuff, size_t count, ncclDataType_t datatype, int peer, ncclComm_t comm,  \
                             cudaStream_t stream))                                                              \
  X(ncclResult_t, ncclGroupStart, (void))                                                                       \
  X(ncclResult_t, ncclGroupEnd, (void))                                                                         \
  X(ncclResult_t, ncclGroupSimulateEnd, (ncclSimInfo_t * simInfo))


/* What 2.29 and 2.30 added. */
#define ABI_CALLS_2307(X)                                                                                       \
  X(ncclResult_t, ncclCommGetUniqueId, (ncclComm_t comm, ncclUniqueId * uniqueId))                              \
  X(ncclResult_t, ncclCommGrow, (ncclComm_t comm, int nRanks, const ncclUniqueId* uniqueId, int rank,           \
                                 ncclComm_t* newcomm, ncclConfig_t* config))                                    \
  X(ncclResult_t, ncclCommSuspend, (ncclComm_t comm, int flags))                                                \
  X(ncclResult_t, ncclCommResume, (ncclComm_t comm))                                                            \
  X(ncclResult_t, ncclCommMemStats, (ncclComm_t comm, ncclCommMemStat_t stat, uint64_t* value))                 \
  X(ncclResult_t, ncclWinGetUserPtr, (ncclComm_t comm, ncclWindow_t win, void** outUserPtr))                    \
  X(ncclResult_t, ncclPutSignal, (const void* localbuff, size_t count, ncclDataType_t datatype, int peer,       \
                                  ncclWindow_t peerWin, size_t peerWinOffset, int sigIdx, int ctx,              \
                                  unsigned int flags, ncclComm_t comm, cudaStream_t stream))                    \
  X(ncclResult_t, ncclSignal, (int peer, int sigIdx, int ctx, unsigned int flags, ncclComm_t comm,              \
                               cudaStream_t stream))                                                            \
  X(ncclResult_t, ncclWaitSignal, (int nDesc, ncclWaitSignalDesc_t* signalDescs, ncclComm_t comm,               \
                                   cudaStream_t stream))                                                        \
  X(ncclResult_t, ncclParamBind, (ncclParamHandle_t * out, const char* key))                                    \
  X(ncclResult_t, ncclParamGetI8, (ncclParamHandle_t h, int8_t* out))                                           \
  X(ncclResult_t, ncclParamGetI16, (ncclParamHandle_t h, int16_t* out))                                         \
  X(ncclResult_t, ncclParamGetI32, (ncclParamHandle_t h, int32_t* out))                                         \
  X(ncclResult_t, ncclParamGetI64, (ncclParamHandle_t h, int64_t* out))                                         \
  X(ncclResult_t, ncclParamGetU8, (ncclParamHandle_t h, uint8_t* out))                                          \
  X(ncclResult_t, ncclParamGetU16, (ncclParamHandle_t h, uint16_t* out))                                        \
  X(ncclResult_t, ncclParamGetU32, (ncclParamHandle_t h, uint32_t* out))                                        \
  X(ncclResult_t, ncclParamGetU64, (ncclParamHandle_t h, uint64_t* out))                                        \
  X(ncclResult_t, ncclParamGetStr, (ncclParamHandle_t h, const char** out))                                     \
  X(ncclResult_t, ncclParamGet, (ncclParamHandle_t h, void* out, int maxLen, int* len))                         \
  X(ncclResult_t, ncclParamGetParameter, (const char* key, const char** value, int* valueLen))                  \
  X(ncclResult_t, ncclParamGetAllParameterKeys, (const char*** table, int* tableLen))                           \
  X(void, ncclParamDumpAll, (void))

/* What 2.31 added: the collectives with a per-call config. */
#define ABI_CALLS_2312(X)                                                                                       \
  X(ncclResult_t, ncclAllReduceConfig, (const void* sendbuff, void* recvbuff, size_t count,                     \
                                        ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm,               \
                                        cudaStream_t stream, const ncclCollConfig_t* config))                   \
  X(ncclResult_t, ncclBroadcastConfig, (const void* sendbuff, void* recvbuff, size_t count,                     \
                                        ncclDataType_t datatype, int root, ncclComm_t comm, cudaStream_t stream, \
                                        const ncclCollConfig_t* config))                                        \
  X(ncclResult_t, ncclReduceConfig, (const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype, \
                                     ncclRedOp_t op, int root, ncclComm_t comm, cudaStream_t stream,            \
                                     const ncclCollConfig_t* config))                                           \
  X(ncclResult_t, ncclAllGatherConfig, (const void* sendbuff, void* recvbuff, size_t sendcount,                 \
                                        ncclDataType_t datatype, ncclComm_t comm, cudaStream_t stream,          \
                                        const ncclCollConfig_t* config))                                        \
  X(ncclResult_t, ncclReduceScatterConfig, (const void* sendbuff, void* recvbuff, size_t recvcount,             \
                                            ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm,           \
                                            cudaStream_t stream, const ncclCollConfig_t* config))               \
  X(ncclResult_t, ncclAlltoAllConfig, (const void* sendbuff, void* recvbuff, size_t count,                      \
                                       ncclDataType_t datatype, ncclComm_t comm, cudaStream_t stream,           \
                                       const ncclCollConfig_t* config))                                         \
  X(ncclResult_t, ncclGatherConfig, (const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype, \
                                     int root, ncclComm_t comm, cudaStream_t stream,                            \
                                     const ncclCollConfig_t* config))                                           \
  X(ncclResult_t, ncclScatterConfig, (const void* sendbuff, void* recvbuff, size_t count,                       \
                                      ncclDataType_t datatype, int root, ncclComm_t comm, cudaStream_t stream,  \
                                      const ncclCollConfig_t* config))

#endif
