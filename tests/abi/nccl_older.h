/* The public declarations of an older NCCL nccl.h, rebuilt for the ABI tests from what those headers
 * declare (names, signatures, enum values, struct layouts), in this project's words: a program
 * compiled against it is what a program built against NVIDIA's header of that version is to the
 * library. CHORUS_ABI_NCCL selects the version: 22809 (NCCL 2.28.9) or 23007 (NCCL 2.30.7). */
#ifndef CHORUS_ABI_NCCL_OLDER_H
#define CHORUS_ABI_NCCL_OLDER_H

#include <limits.h>
#include <stddef.h>
#include <stdint.h>

#include "nccl_calls.h"

#if CHORUS_ABI_NCCL != 22809 && CHORUS_ABI_NCCL != 23007
#error "CHORUS_ABI_NCCL must be 22809 or 23007"
#endif

#define NCCL_MAJOR 2
#if CHORUS_ABI_NCCL == 22809
#define NCCL_MINOR 28
#define NCCL_PATCH 9
#else
#define NCCL_MINOR 30
#define NCCL_PATCH 7
#endif
#define NCCL_SUFFIX ""
#define NCCL_VERSION_CODE CHORUS_ABI_NCCL
#define NCCL_VERSION(X, Y, Z) \
  (((X) <= 2 && (Y) <= 8) ? (X) * 1000 + (Y) * 100 + (Z) : (X) * 10000 + (Y) * 100 + (Z))

typedef struct CUstream_st* cudaStream_t;

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

/* 2.28 has no ncclTimeout: its ncclNumResults is 8. */
typedef enum {
  ncclSuccess = 0,
  ncclUnhandledCudaError = 1,
  ncclSystemError = 2,
  ncclInternalError = 3,
  ncclInvalidArgument = 4,
  ncclInvalidUsage = 5,
  ncclRemoteError = 6,
  ncclInProgress = 7,
#if CHORUS_ABI_NCCL >= 23000
  ncclTimeout = 8,
  ncclNumResults = 9
#else
  ncclNumResults = 8
#endif
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
#if CHORUS_ABI_NCCL >= 23000
#define NCCL_API_MAGIC 0xcafebeef
#define NCCL_WIN_STRICT_ORDERING 0x02
#endif

/* 2.28's config ends at nvlinkCentricSched; 2.30.7's adds four ints after it. */
typedef struct {
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
#if CHORUS_ABI_NCCL >= 23000
  int graphUsageMode;
  int numRmaCtx;
  int maxP2pPeers;
  int graphStreamOrdering;
#endif
} ncclConfig_t;

#if CHORUS_ABI_NCCL >= 23000
#define CHORUS_ABI_CONFIG_TAIL , INT_MIN, INT_MIN, INT_MIN, INT_MIN
#else
#define CHORUS_ABI_CONFIG_TAIL
#endif
#define NCCL_CONFIG_INITIALIZER                                                                              \
  {                                                                                                          \
    sizeof(ncclConfig_t), 0xcafebeef, NCCL_VERSION_CODE, INT_MIN, INT_MIN, INT_MIN, INT_MIN, NULL, INT_MIN, \
        INT_MIN, NULL, INT_MIN, INT_MIN, INT_MIN, INT_MIN, INT_MIN, INT_MIN CHORUS_ABI_CONFIG_TAIL            \
  }

typedef struct {
  size_t size;
  unsigned int magic;
  unsigned int version;
  float estimatedTime;
} ncclSimInfo_t;
#define NCCL_SIM_INFO_INITIALIZER { sizeof(ncclSimInfo_t), 0x74685283, NCCL_VERSION_CODE, NCCL_UNDEF_FLOAT }

typedef enum { ncclNumOps_dummy = 5 } ncclRedOp_dummy_t;
typedef enum {
  ncclSum = 0, ncclProd = 1, ncclMax = 2, ncclMin = 3, ncclAvg = 4, ncclNumOps = 5,
  ncclMaxRedOp = 0x7fffffff >> (32 - 8 * sizeof(ncclRedOp_dummy_t))
} ncclRedOp_t;
typedef enum {
  ncclInt8 = 0, ncclChar = 0, ncclUint8 = 1, ncclInt32 = 2, ncclInt = 2, ncclUint32 = 3, ncclInt64 = 4,
  ncclUint64 = 5, ncclFloat16 = 6, ncclHalf = 6, ncclFloat32 = 7, ncclFloat = 7, ncclFloat64 = 8,
  ncclDouble = 8, ncclBfloat16 = 9, ncclFloat8e4m3 = 10, ncclFloat8e5m2 = 11, ncclNumTypes = 12
} ncclDataType_t;
typedef enum { ncclScalarDevice = 0, ncclScalarHostImmediate = 1 } ncclScalarResidence_t;

#if CHORUS_ABI_NCCL >= 23000
#define NCCL_SUSPEND_MEM 0x01
typedef enum {
  ncclStatGpuMemSuspend = 0, ncclStatGpuMemSuspended = 1, ncclStatGpuMemPersist = 2, ncclStatGpuMemTotal = 3
} ncclCommMemStat_t;
typedef struct {
  int opCnt;
  int peer;
  int sigIdx;
  int ctx;
} ncclWaitSignalDesc_t;
typedef struct ncclParamHandle* ncclParamHandle_t;

#define ABI_CALLS(X) ABI_CALLS_2289(X) ABI_CALLS_2307(X)
#else
#define ABI_CALLS(X) ABI_CALLS_2289(X)
#endif

#define ABI_DECLARE(ret, name, params) \
  ret name params;                     \
  ret p##name params;
ABI_CALLS(ABI_DECLARE)
#undef ABI_DECLARE

#ifdef __cplusplus
}
#endif

#endif
