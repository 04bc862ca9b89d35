/* Facts about nccl.h that a binary depends on, listed once and evaluated twice: in abi_main.c against
 * NVIDIA's header and in abi_ours.c against ours. Each X(expr) must compile with both headers.
 * The functions declaring these lists have `cfg` and `sim` in scope, set by the initializers. */
#ifndef CHORUS_ABI_FACTS_H
#define CHORUS_ABI_FACTS_H

/* Enum values and macros: must match whatever the NCCL version of the other header. */
#define ABI_ENUMS(X)                                                                               \
  X(ncclSuccess) X(ncclUnhandledCudaError) X(ncclSystemError) X(ncclInternalError)                 \
  X(ncclInvalidArgument) X(ncclInvalidUsage) X(ncclRemoteError) X(ncclInProgress)                  \
  X(ncclInt8) X(ncclChar) X(ncclUint8) X(ncclInt32) X(ncclInt) X(ncclUint32) X(ncclInt64)          \
  X(ncclUint64) X(ncclFloat16) X(ncclHalf) X(ncclFloat32) X(ncclFloat) X(ncclFloat64)              \
  X(ncclDouble) X(ncclBfloat16) X(ncclFloat8e4m3) X(ncclFloat8e5m2) X(ncclNumTypes)                \
  X(ncclSum) X(ncclProd) X(ncclMax) X(ncclMin) X(ncclAvg) X(ncclNumOps) X(ncclMaxRedOp)            \
  X(sizeof(ncclRedOp_t)) X(sizeof(ncclDataType_t)) X(sizeof(ncclResult_t))                         \
  X(ncclScalarDevice) X(ncclScalarHostImmediate)                                                   \
  X(NCCL_UNIQUE_ID_BYTES) X(sizeof(ncclUniqueId)) X(NCCL_SPLIT_NOCOLOR) X(NCCL_CONFIG_UNDEF_INT)   \
  X(NCCL_VERSION(2, 28, 9)) X(NCCL_VERSION(2, 8, 4)) X(sizeof(ncclComm_t))                         \
  X(cfg.magic) X(sim.magic)

/* Struct layouts and initializer contents: compared when both headers are the same NCCL version. */
#define ABI_LAYOUT(X)                                                                              \
  X(NCCL_VERSION_CODE) X(sizeof(ncclConfig_t)) X(sizeof(ncclSimInfo_t))                            \
  X(cfg.size) X(cfg.version) X(sim.size) X(sim.version)                                            \
  X(offsetof(ncclConfig_t, blocking)) X(offsetof(ncclConfig_t, cgaClusterSize))                    \
  X(offsetof(ncclConfig_t, minCTAs)) X(offsetof(ncclConfig_t, maxCTAs))                            \
  X(offsetof(ncclConfig_t, netName)) X(offsetof(ncclConfig_t, splitShare))                         \
  X(offsetof(ncclConfig_t, trafficClass)) X(offsetof(ncclConfig_t, commName))                      \
  X(offsetof(ncclConfig_t, collnetEnable)) X(offsetof(ncclConfig_t, CTAPolicy))                    \
  X(offsetof(ncclConfig_t, shrinkShare)) X(offsetof(ncclConfig_t, nvlsCTAs))                       \
  X(offsetof(ncclConfig_t, nChannelsPerNetPeer)) X(offsetof(ncclConfig_t, nvlinkCentricSched))     \
  X(cfg.blocking) X(cfg.cgaClusterSize) X(cfg.minCTAs) X(cfg.maxCTAs) X(cfg.splitShare)            \
  X(cfg.trafficClass) X(cfg.collnetEnable) X(cfg.CTAPolicy) X(cfg.shrinkShare) X(cfg.nvlsCTAs)     \
  X(cfg.nChannelsPerNetPeer) X(cfg.nvlinkCentricSched) X(cfg.netName == NULL)                      \
  X(cfg.commName == NULL)

#define ABI_VALUE(e) (long long)(e),
#define ABI_NAME(e) #e,
#define ABI_COUNT(e) +1

enum { ABI_NENUMS = 0 ABI_ENUMS(ABI_COUNT), ABI_NLAYOUT = 0 ABI_LAYOUT(ABI_COUNT) };

/* Implemented in abi_ours.c (compiled against Chorus's nccl.h). */
void abi_ours_enums(long long out[ABI_NENUMS]);
void abi_ours_layout(long long out[ABI_NLAYOUT]);
long long abi_ours_timeout_value(void);

#endif
