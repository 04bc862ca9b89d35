/*
 * Chorus: the NCCL host API (API level NCCL 2.28.9), implemented on host memory.
 *
 * Names, signatures, enum values and macros follow NCCL exactly so that a program written
 * for NCCL compiles and links against libchorus unchanged. Chorus's own version and
 * extensions live in chorus.h. This header is valid C99/C11 and C++.
 */
#ifndef NCCL_H_
#define NCCL_H_

#include <limits.h>
#include <stddef.h>
#include <stdint.h>

#define NCCL_MAJOR 2
#define NCCL_MINOR 28
#define NCCL_PATCH 9
#define NCCL_SUFFIX ""

#define NCCL_VERSION_CODE 22809
#define NCCL_VERSION(X, Y, Z) \
  (((X) <= 2 && (Y) <= 8) ? (X) * 1000 + (Y) * 100 + (Z) : (X) * 10000 + (Y) * 100 + (Z))

/* Host code passes streams as opaque handles. This is the CUDA toolkit's own definition, so the
 * two headers can be included together in either order. NULL means "complete before returning";
 * chorusStreamCreate (chorus.h) makes host streams that run calls in the background. */
#if !defined(__DRIVER_TYPES_H__) && !defined(CHORUS_CUDA_STREAM_DEFINED)
#define CHORUS_CUDA_STREAM_DEFINED
typedef struct CUstream_st* cudaStream_t;
#endif

#ifdef __cplusplus
extern "C" {
#endif

typedef struct ncclComm* ncclComm_t;
typedef struct ncclWindow_vidmem* ncclWindow_t;
#define NCCL_COMM_NULL NULL

#define NCCL_UNIQUE_ID_BYTES 128
typedef struct {
  char internal[NCCL_UNIQUE_ID_BYTES];
} ncclUniqueId;

typedef enum {
  ncclSuccess = 0,
  ncclUnhandledCudaError = 1,
  ncclSystemError = 2,
  ncclInternalError = 3,
  ncclInvalidArgument = 4,
  ncclInvalidUsage = 5,
  ncclRemoteError = 6,
  ncclInProgress = 7,
  ncclTimeout = 8, /* value from NCCL 2.30; Chorus reports deadlines with it */
  ncclNumResults = 9
} ncclResult_t;

#define NCCL_CONFIG_UNDEF_INT INT_MIN
#define NCCL_CONFIG_UNDEF_PTR NULL
#define NCCL_SPLIT_NOCOLOR -1
#define NCCL_UNDEF_FLOAT -1.0f

#define NCCL_WIN_DEFAULT 0x00
#define NCCL_WIN_COLL_SYMMETRIC 0x01
#define NCCL_WIN_REQUIRED_ALIGNMENT 4096

#define NCCL_CTA_POLICY_DEFAULT 0x00
#define NCCL_CTA_POLICY_EFFICIENCY 0x01
#define NCCL_CTA_POLICY_ZERO 0x02

#define NCCL_SHRINK_DEFAULT 0x00
#define NCCL_SHRINK_ABORT 0x01
#define NCCL_REVOKE_DEFAULT 0x00

/* Communicator configuration (NCCL 2.28 layout). Always start from NCCL_CONFIG_INITIALIZER:
 * the first three fields let the library accept structs from older headers. */
typedef struct ncclConfig_v22800 {
  size_t size;
  unsigned int magic;
  unsigned int version;
  int blocking;
  int cgaClusterSize;
  int minCTAs;
  int maxCTAs;
  const char* netName;
  int splitShare;
  int trafficClass;
  const char* commName;
  int collnetEnable;
  int CTAPolicy;
  int shrinkShare;
  int nvlsCTAs;
  int nChannelsPerNetPeer;
  int nvlinkCentricSched;
} ncclConfig_t;

#define NCCL_CONFIG_INITIALIZER                                                           \
  {                                                                                       \
    sizeof(ncclConfig_t), 0xcafebeef, NCCL_VERSION(NCCL_MAJOR, NCCL_MINOR, NCCL_PATCH),   \
        NCCL_CONFIG_UNDEF_INT, NCCL_CONFIG_UNDEF_INT, NCCL_CONFIG_UNDEF_INT,              \
        NCCL_CONFIG_UNDEF_INT, NCCL_CONFIG_UNDEF_PTR, NCCL_CONFIG_UNDEF_INT,              \
        NCCL_CONFIG_UNDEF_INT, NCCL_CONFIG_UNDEF_PTR, NCCL_CONFIG_UNDEF_INT,              \
        NCCL_CONFIG_UNDEF_INT, NCCL_CONFIG_UNDEF_INT, NCCL_CONFIG_UNDEF_INT,              \
        NCCL_CONFIG_UNDEF_INT, NCCL_CONFIG_UNDEF_INT                                      \
  }

typedef struct ncclSimInfo_v22200 {
  size_t size;
  unsigned int magic;
  unsigned int version;
  float estimatedTime;
} ncclSimInfo_t;

#define NCCL_SIM_INFO_INITIALIZER \
  { sizeof(ncclSimInfo_t), 0x74685283, NCCL_VERSION(NCCL_MAJOR, NCCL_MINOR, NCCL_PATCH), NCCL_UNDEF_FLOAT }

/* Reduction operations. Values >= ncclNumOps are created by ncclRedOpCreatePreMulSum. */
typedef enum { ncclNumOps_dummy = 5 } ncclRedOp_dummy_t;
typedef enum {
  ncclSum = 0,
  ncclProd = 1,
  ncclMax = 2,
  ncclMin = 3,
  ncclAvg = 4,
  ncclNumOps = 5,
  ncclMaxRedOp = 0x7fffffff >> (32 - 8 * sizeof(ncclRedOp_dummy_t))
} ncclRedOp_t;

typedef enum {
  ncclInt8 = 0,
  ncclChar = 0,
  ncclUint8 = 1,
  ncclInt32 = 2,
  ncclInt = 2,
  ncclUint32 = 3,
  ncclInt64 = 4,
  ncclUint64 = 5,
  ncclFloat16 = 6,
  ncclHalf = 6,
  ncclFloat32 = 7,
  ncclFloat = 7,
  ncclFloat64 = 8,
  ncclDouble = 8,
  ncclBfloat16 = 9,
  ncclFloat8e4m3 = 10,
  ncclFloat8e5m2 = 11,
  ncclNumTypes = 12
} ncclDataType_t;

typedef enum { ncclScalarDevice = 0, ncclScalarHostImmediate = 1 } ncclScalarResidence_t;

/* Every function has a p-prefixed twin for profiling interposition, as in NCCL. */
#define CHORUS_DECL(ret, name, args) \
  ret name args;                     \
  ret p##name args

/* Memory */
CHORUS_DECL(ncclResult_t, ncclMemAlloc, (void** ptr, size_t size));
CHORUS_DECL(ncclResult_t, ncclMemFree, (void* ptr));

/* Version, ids, errors */
CHORUS_DECL(ncclResult_t, ncclGetVersion, (int* version));
CHORUS_DECL(ncclResult_t, ncclGetUniqueId, (ncclUniqueId * uniqueId));
CHORUS_DECL(const char*, ncclGetErrorString, (ncclResult_t result));
CHORUS_DECL(const char*, ncclGetLastError, (ncclComm_t comm));
#if defined(__GNUC__)
__attribute__((deprecated("ncclResetDebugInit is not part of the supported API")))
#endif
void ncclResetDebugInit(void);
#if defined(__GNUC__)
__attribute__((deprecated("pncclResetDebugInit is not part of the supported API")))
#endif
void pncclResetDebugInit(void);

/* Communicators */
CHORUS_DECL(ncclResult_t, ncclCommInitRankConfig,
            (ncclComm_t * comm, int nranks, ncclUniqueId commId, int rank, ncclConfig_t* config));
CHORUS_DECL(ncclResult_t, ncclCommInitRank, (ncclComm_t * comm, int nranks, ncclUniqueId commId, int rank));
CHORUS_DECL(ncclResult_t, ncclCommInitAll, (ncclComm_t * comm, int ndev, const int* devlist));
CHORUS_DECL(ncclResult_t, ncclCommInitRankScalable,
            (ncclComm_t * newcomm, int nranks, int myrank, int nId, ncclUniqueId* commIds, ncclConfig_t* config));
CHORUS_DECL(ncclResult_t, ncclCommFinalize, (ncclComm_t comm));
CHORUS_DECL(ncclResult_t, ncclCommDestroy, (ncclComm_t comm));
CHORUS_DECL(ncclResult_t, ncclCommAbort, (ncclComm_t comm));
CHORUS_DECL(ncclResult_t, ncclCommRevoke, (ncclComm_t comm, int revokeFlags));
CHORUS_DECL(ncclResult_t, ncclCommSplit,
            (ncclComm_t comm, int color, int key, ncclComm_t* newcomm, ncclConfig_t* config));
CHORUS_DECL(ncclResult_t, ncclCommShrink,
            (ncclComm_t comm, int* excludeRanksList, int excludeRanksCount, ncclComm_t* newcomm,
             ncclConfig_t* config, int shrinkFlags));
CHORUS_DECL(ncclResult_t, ncclCommGetAsyncError, (ncclComm_t comm, ncclResult_t* asyncError));
CHORUS_DECL(ncclResult_t, ncclCommCount, (const ncclComm_t comm, int* count));
CHORUS_DECL(ncclResult_t, ncclCommCuDevice, (const ncclComm_t comm, int* device));
CHORUS_DECL(ncclResult_t, ncclCommUserRank, (const ncclComm_t comm, int* rank));

/* Buffer registration */
CHORUS_DECL(ncclResult_t, ncclCommRegister, (const ncclComm_t comm, void* buff, size_t size, void** handle));
CHORUS_DECL(ncclResult_t, ncclCommDeregister, (const ncclComm_t comm, void* handle));
CHORUS_DECL(ncclResult_t, ncclCommWindowRegister,
            (ncclComm_t comm, void* buff, size_t size, ncclWindow_t* win, int winFlags));
CHORUS_DECL(ncclResult_t, ncclCommWindowDeregister, (ncclComm_t comm, ncclWindow_t win));

/* Custom reduction operations */
CHORUS_DECL(ncclResult_t, ncclRedOpCreatePreMulSum,
            (ncclRedOp_t * op, void* scalar, ncclDataType_t datatype, ncclScalarResidence_t residence,
             ncclComm_t comm));
CHORUS_DECL(ncclResult_t, ncclRedOpDestroy, (ncclRedOp_t op, ncclComm_t comm));

/* Collectives. In-place: sendbuff == recvbuff (AllReduce, Reduce, Broadcast);
 * ReduceScatter: recvbuff == sendbuff + rank*recvcount; AllGather: sendbuff == recvbuff + rank*sendcount. */
CHORUS_DECL(ncclResult_t, ncclReduce,
            (const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype, ncclRedOp_t op,
             int root, ncclComm_t comm, cudaStream_t stream));
CHORUS_DECL(ncclResult_t, ncclBcast,
            (void* buff, size_t count, ncclDataType_t datatype, int root, ncclComm_t comm, cudaStream_t stream));
CHORUS_DECL(ncclResult_t, ncclBroadcast,
            (const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype, int root,
             ncclComm_t comm, cudaStream_t stream));
CHORUS_DECL(ncclResult_t, ncclAllReduce,
            (const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype, ncclRedOp_t op,
             ncclComm_t comm, cudaStream_t stream));
CHORUS_DECL(ncclResult_t, ncclReduceScatter,
            (const void* sendbuff, void* recvbuff, size_t recvcount, ncclDataType_t datatype, ncclRedOp_t op,
             ncclComm_t comm, cudaStream_t stream));
CHORUS_DECL(ncclResult_t, ncclAllGather,
            (const void* sendbuff, void* recvbuff, size_t sendcount, ncclDataType_t datatype, ncclComm_t comm,
             cudaStream_t stream));
CHORUS_DECL(ncclResult_t, ncclAlltoAll,
            (const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype, ncclComm_t comm,
             cudaStream_t stream));
CHORUS_DECL(ncclResult_t, ncclGather,
            (const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype, int root,
             ncclComm_t comm, cudaStream_t stream));
CHORUS_DECL(ncclResult_t, ncclScatter,
            (const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype, int root,
             ncclComm_t comm, cudaStream_t stream));

/* Point to point. Calls inside one group progress together. */
CHORUS_DECL(ncclResult_t, ncclSend,
            (const void* sendbuff, size_t count, ncclDataType_t datatype, int peer, ncclComm_t comm,
             cudaStream_t stream));
CHORUS_DECL(ncclResult_t, ncclRecv,
            (void* recvbuff, size_t count, ncclDataType_t datatype, int peer, ncclComm_t comm,
             cudaStream_t stream));

/* Groups */
CHORUS_DECL(ncclResult_t, ncclGroupStart, (void));
CHORUS_DECL(ncclResult_t, ncclGroupEnd, (void));
CHORUS_DECL(ncclResult_t, ncclGroupSimulateEnd, (ncclSimInfo_t * simInfo));

#undef CHORUS_DECL

#ifdef __cplusplus
}
#endif

#endif /* NCCL_H_ */
