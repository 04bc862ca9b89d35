/*
 * Chorus: the NCCL host API (API level NCCL 2.31.2), implemented on host memory.
 *
 * Names, signatures, enum values, struct layouts and macros follow NCCL 2.31.2's nccl.h exactly so
 * that a program written for NCCL compiles and links against libchorus unchanged; programs built
 * against older NCCL headers (2.19 on) link and run too. Which calls do what is listed in
 * docs/COMPATIBILITY.md. Chorus's own version and extensions live in chorus.h. This header is valid
 * C99/C11 and C++.
 */
#ifndef NCCL_H_
#define NCCL_H_

#include <limits.h>
#include <stddef.h>
#include <stdint.h>

#define NCCL_MAJOR 2
#define NCCL_MINOR 31
#define NCCL_PATCH 2
#define NCCL_SUFFIX ""

#define NCCL_VERSION_CODE 23102
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

/* The magic word of ncclConfig_t and ncclCollConfig_t (NCCL marks it for internal use). */
#define NCCL_API_MAGIC 0xcafebeef

/* ncclCommWindowRegister's winFlags */
#define NCCL_WIN_DEFAULT 0x00
#define NCCL_WIN_COLL_SYMMETRIC 0x01
#define NCCL_WIN_STRICT_ORDERING 0x02
#define NCCL_WIN_REQUIRED_ALIGNMENT 4096

/* ncclConfig_t.CTAPolicy and ncclCollConfig_t.CTAPolicy: bits */
#define NCCL_CTA_POLICY_DEFAULT 0x00
#define NCCL_CTA_POLICY_EFFICIENCY 0x01
#define NCCL_CTA_POLICY_ZERO 0x02

/* ncclCommShrink's shrinkFlags, ncclCommRevoke's revokeFlags */
#define NCCL_SHRINK_DEFAULT 0x00
#define NCCL_SHRINK_ABORT 0x01
#define NCCL_REVOKE_DEFAULT 0x00

/* ncclConfig_t.hostCftMode (NCCL 2.31) */
typedef enum {
  ncclHostCftDefault = NCCL_CONFIG_UNDEF_INT,
  ncclHostCftEnable = 1,
  ncclHostCftDisable = 2,
  ncclHostCftFallback = 3
} ncclHostCftMode_t;

/* Communicator configuration, NCCL 2.31 layout. Start from NCCL_CONFIG_INITIALIZER and set only the
 * fields wanted: size, magic and version say which header built the struct, so the library reads a
 * struct from an older header (2.14 on) field by field. New fields are only ever appended. What each
 * field does in Chorus: docs/COMPATIBILITY.md. */
typedef struct ncclConfig_v23100 {
  size_t size;
  unsigned int magic;
  unsigned int version;
  int blocking;            /* 2.14 */
  int cgaClusterSize;      /* 2.17 */
  int minCTAs;
  int maxCTAs;
  const char* netName;
  int splitShare;          /* 2.18 */
  int trafficClass;        /* 2.26 */
  const char* commName;    /* 2.27 */
  int collnetEnable;
  int CTAPolicy;
  int shrinkShare;
  int nvlsCTAs;
  int nChannelsPerNetPeer; /* 2.28 */
  int nvlinkCentricSched;
  int graphUsageMode;      /* 2.29 */
  int numRmaCtx;
  int maxP2pPeers;         /* 2.30.3 */
  int graphStreamOrdering; /* 2.30.7 */
  int launchOrderImplicit; /* 2.31 */
  int numRmaSig;
  int rmaEagerInit;
  int hostCftMode;
} ncclConfig_t;

#define NCCL_CONFIG_INITIALIZER                                                                        \
  {                                                                                                    \
    sizeof(ncclConfig_t), NCCL_API_MAGIC, NCCL_VERSION_CODE,                                           \
        NCCL_CONFIG_UNDEF_INT /* blocking */, NCCL_CONFIG_UNDEF_INT /* cgaClusterSize */,              \
        NCCL_CONFIG_UNDEF_INT /* minCTAs */, NCCL_CONFIG_UNDEF_INT /* maxCTAs */,                      \
        NCCL_CONFIG_UNDEF_PTR /* netName */, NCCL_CONFIG_UNDEF_INT /* splitShare */,                   \
        NCCL_CONFIG_UNDEF_INT /* trafficClass */, NCCL_CONFIG_UNDEF_PTR /* commName */,                \
        NCCL_CONFIG_UNDEF_INT /* collnetEnable */, NCCL_CONFIG_UNDEF_INT /* CTAPolicy */,              \
        NCCL_CONFIG_UNDEF_INT /* shrinkShare */, NCCL_CONFIG_UNDEF_INT /* nvlsCTAs */,                 \
        NCCL_CONFIG_UNDEF_INT /* nChannelsPerNetPeer */, NCCL_CONFIG_UNDEF_INT /* nvlinkCentricSched */, \
        NCCL_CONFIG_UNDEF_INT /* graphUsageMode */, NCCL_CONFIG_UNDEF_INT /* numRmaCtx */,             \
        NCCL_CONFIG_UNDEF_INT /* maxP2pPeers */, NCCL_CONFIG_UNDEF_INT /* graphStreamOrdering */,      \
        NCCL_CONFIG_UNDEF_INT /* launchOrderImplicit */, NCCL_CONFIG_UNDEF_INT /* numRmaSig */,        \
        NCCL_CONFIG_UNDEF_INT /* rmaEagerInit */, NCCL_CONFIG_UNDEF_INT /* hostCftMode */              \
  }

/* One vendor option of a per-call config: a key (vendor id, option id) and a value, chained into a
 * list through next. NCCL ignores every option; Chorus reads its own (chorus.h:
 * CHORUS_CONFIG_EXT_VENDOR) and ignores the others. */
typedef struct ncclConfigExt {
  struct ncclConfigExt* next;
  struct {
    int vendorId;
    int optionId;
  } key;
  union {
    int i;
    const char* s;
    void* raw;
  } val;
} ncclConfigExt_t;

/* Per-call configuration of the nccl<Collective>Config calls (NCCL 2.31). Versioned and append-only
 * like ncclConfig_t: start from NCCL_COLLCONFIG_INITIALIZER. Every rank must pass the same values.
 * The caller owns the struct (and its ext list) for the duration of each call that uses it. */
typedef struct ncclCollConfig_v23100 {
  size_t size;
  unsigned int magic;
  unsigned int version;
  ncclConfigExt_t* ext;     /* vendor options, or NULL */
  int minCTAs;              /* NCCL_CONFIG_UNDEF_INT: the library chooses */
  int maxCTAs;
  int nvlsCTAs;
  int cgaClusterSize;
  const char* algSelection; /* NULL or "": automatic */
  int forceAlgSelection;    /* 1 (default): a selection nothing can satisfy is an error */
  int CTAPolicy;            /* NCCL_CONFIG_UNDEF_INT: the communicator's */
  uint64_t userProfilerTag; /* handed to profiler plugins as is; 0 = untagged; values with the top
                               bit set are reserved by NCCL */
} ncclCollConfig_t;

#define NCCL_COLLCONFIG_INITIALIZER                                                                 \
  {                                                                                                 \
    sizeof(ncclCollConfig_t), NCCL_API_MAGIC, NCCL_VERSION_CODE, NCCL_CONFIG_UNDEF_PTR /* ext */,   \
        NCCL_CONFIG_UNDEF_INT /* minCTAs */, NCCL_CONFIG_UNDEF_INT /* maxCTAs */,                   \
        NCCL_CONFIG_UNDEF_INT /* nvlsCTAs */, NCCL_CONFIG_UNDEF_INT /* cgaClusterSize */,           \
        NCCL_CONFIG_UNDEF_PTR /* algSelection */, 1 /* forceAlgSelection */,                        \
        NCCL_CONFIG_UNDEF_INT /* CTAPolicy */, 0 /* userProfilerTag */                              \
  }

typedef struct ncclSimInfo_v22200 {
  size_t size;
  unsigned int magic;
  unsigned int version;
  float estimatedTime;
} ncclSimInfo_t;

#define NCCL_SIM_INFO_INITIALIZER \
  { sizeof(ncclSimInfo_t), 0x74685283, NCCL_VERSION_CODE, NCCL_UNDEF_FLOAT }

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

/* ncclCommSuspend's flags: release the memory an idle communicator can do without. */
#define NCCL_SUSPEND_MEM 0x01

/* What ncclCommMemStats reports: bytes, except Suspended (1 while suspended, else 0). */
typedef enum {
  ncclStatGpuMemSuspend = 0,
  ncclStatGpuMemSuspended = 1,
  ncclStatGpuMemPersist = 2,
  ncclStatGpuMemTotal = 3
} ncclCommMemStat_t;

/* ncclWaitSignal: wait for opCnt signals from peer on (sigIdx, ctx). */
typedef struct {
  int opCnt;
  int peer;
  int sigIdx;
  int ctx;
} ncclWaitSignalDesc_t;

/* A bound parameter of the parameter API (ncclParamBind); owned by the library, never freed. */
typedef struct ncclParamHandle* ncclParamHandle_t;

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
CHORUS_DECL(ncclResult_t, ncclCommGetUniqueId, (ncclComm_t comm, ncclUniqueId * uniqueId));
CHORUS_DECL(ncclResult_t, ncclCommGrow,
            (ncclComm_t comm, int nRanks, const ncclUniqueId* uniqueId, int rank, ncclComm_t* newcomm,
             ncclConfig_t* config));
CHORUS_DECL(ncclResult_t, ncclCommSuspend, (ncclComm_t comm, int flags));
CHORUS_DECL(ncclResult_t, ncclCommResume, (ncclComm_t comm));
CHORUS_DECL(ncclResult_t, ncclCommMemStats, (ncclComm_t comm, ncclCommMemStat_t stat, uint64_t* value));
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
CHORUS_DECL(ncclResult_t, ncclWinGetUserPtr, (ncclComm_t comm, ncclWindow_t win, void** outUserPtr));

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

/* Collectives with a per-call configuration (NCCL 2.31); config NULL is the plain call. */
CHORUS_DECL(ncclResult_t, ncclAllReduceConfig,
            (const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype, ncclRedOp_t op,
             ncclComm_t comm, cudaStream_t stream, const ncclCollConfig_t* config));
CHORUS_DECL(ncclResult_t, ncclBroadcastConfig,
            (const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype, int root,
             ncclComm_t comm, cudaStream_t stream, const ncclCollConfig_t* config));
CHORUS_DECL(ncclResult_t, ncclReduceConfig,
            (const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype, ncclRedOp_t op,
             int root, ncclComm_t comm, cudaStream_t stream, const ncclCollConfig_t* config));
CHORUS_DECL(ncclResult_t, ncclAllGatherConfig,
            (const void* sendbuff, void* recvbuff, size_t sendcount, ncclDataType_t datatype, ncclComm_t comm,
             cudaStream_t stream, const ncclCollConfig_t* config));
CHORUS_DECL(ncclResult_t, ncclReduceScatterConfig,
            (const void* sendbuff, void* recvbuff, size_t recvcount, ncclDataType_t datatype, ncclRedOp_t op,
             ncclComm_t comm, cudaStream_t stream, const ncclCollConfig_t* config));
CHORUS_DECL(ncclResult_t, ncclAlltoAllConfig,
            (const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype, ncclComm_t comm,
             cudaStream_t stream, const ncclCollConfig_t* config));
CHORUS_DECL(ncclResult_t, ncclGatherConfig,
            (const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype, int root,
             ncclComm_t comm, cudaStream_t stream, const ncclCollConfig_t* config));
CHORUS_DECL(ncclResult_t, ncclScatterConfig,
            (const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype, int root,
             ncclComm_t comm, cudaStream_t stream, const ncclCollConfig_t* config));

/* One-sided operations on windows (NCCL 2.29) */
CHORUS_DECL(ncclResult_t, ncclPutSignal,
            (const void* localbuff, size_t count, ncclDataType_t datatype, int peer, ncclWindow_t peerWin,
             size_t peerWinOffset, int sigIdx, int ctx, unsigned int flags, ncclComm_t comm,
             cudaStream_t stream));
CHORUS_DECL(ncclResult_t, ncclSignal,
            (int peer, int sigIdx, int ctx, unsigned int flags, ncclComm_t comm, cudaStream_t stream));
CHORUS_DECL(ncclResult_t, ncclWaitSignal,
            (int nDesc, ncclWaitSignalDesc_t* signalDescs, ncclComm_t comm, cudaStream_t stream));

/* Groups */
CHORUS_DECL(ncclResult_t, ncclGroupStart, (void));
CHORUS_DECL(ncclResult_t, ncclGroupEnd, (void));
CHORUS_DECL(ncclResult_t, ncclGroupSimulateEnd, (ncclSimInfo_t * simInfo));

/* Parameters (NCCL 2.30). A key is a setting's environment variable name (NCCL_DEBUG, CHORUS_TIMEOUT).
 * The typed getters read a parameter of exactly that type; strings come from ncclParamGetStr, any
 * type as bytes from ncclParamGet. Returned strings and tables belong to the library and stay valid
 * at least until the same call is made again on the same thread. */
CHORUS_DECL(ncclResult_t, ncclParamBind, (ncclParamHandle_t * out, const char* key));
CHORUS_DECL(ncclResult_t, ncclParamGetI8, (ncclParamHandle_t h, int8_t* out));
CHORUS_DECL(ncclResult_t, ncclParamGetI16, (ncclParamHandle_t h, int16_t* out));
CHORUS_DECL(ncclResult_t, ncclParamGetI32, (ncclParamHandle_t h, int32_t* out));
CHORUS_DECL(ncclResult_t, ncclParamGetI64, (ncclParamHandle_t h, int64_t* out));
CHORUS_DECL(ncclResult_t, ncclParamGetU8, (ncclParamHandle_t h, uint8_t* out));
CHORUS_DECL(ncclResult_t, ncclParamGetU16, (ncclParamHandle_t h, uint16_t* out));
CHORUS_DECL(ncclResult_t, ncclParamGetU32, (ncclParamHandle_t h, uint32_t* out));
CHORUS_DECL(ncclResult_t, ncclParamGetU64, (ncclParamHandle_t h, uint64_t* out));
CHORUS_DECL(ncclResult_t, ncclParamGetStr, (ncclParamHandle_t h, const char** out));
CHORUS_DECL(ncclResult_t, ncclParamGet, (ncclParamHandle_t h, void* out, int maxLen, int* len));
/* By key, as text. Only documented parameters are listed and dumped unless NCCL_PARAM_DUMP_ALL is true. */
CHORUS_DECL(ncclResult_t, ncclParamGetParameter, (const char* key, const char** value, int* valueLen));
CHORUS_DECL(ncclResult_t, ncclParamGetAllParameterKeys, (const char*** table, int* tableLen));
CHORUS_DECL(void, ncclParamDumpAll, (void));

#undef CHORUS_DECL

#ifdef __cplusplus
}
#endif

#endif /* NCCL_H_ */
