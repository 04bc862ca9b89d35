/* NCCL's network plugin ABI (ncclNet versions 10, 11 and 12), declared here so that a plugin built for
 * NCCL loads into Chorus unchanged and Chorus's own plugin (libnccl-net-chorus.so) loads into NCCL.
 * Layouts, names and constants follow NCCL's plugin headers (src/include/plugin/nccl_net.h and
 * net/net_v1x.h); the facts are collected in docs/CLUSTER.md, "Network plugins". Version 12 is the
 * interface the proxy talks to (ncclNet_t); the loader adapts 10 and 11 to it. */
#ifndef CH_NET_ABI_H
#define CH_NET_ABI_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <nccl.h>

#include "../misc/log_abi.h"

#ifdef __cplusplus
extern "C" {
#endif

#define NCCL_NET_HANDLE_MAXSIZE 128
#define NCCL_MAX_NET_SIZE_BYTES (1ull << 40) /* largest single transfer a plugin may report */
#define NCCL_NET_OPTIONAL_RECV_COMPLETION 0x1
#define NCCL_NET_MULTI_REQUEST 0x2
#define NCCL_PTR_HOST 0x1
#define NCCL_PTR_CUDA 0x2
#define NCCL_PTR_DMABUF 0x4
#define NCCL_NET_MAX_REQUESTS 32 /* requests in flight a comm must hold (per grouped receive slot) */
#define NCCL_NET_TRAFFIC_CLASS_UNDEF -1
#define NCCL_NET_ATTR_UNDEF -1
#define NCCL_NET_ID_UNDEF -1
#define NCCL_NET_MAX_DEVS_PER_NIC_V11 4 /* also v10 */
#define NCCL_NET_MAX_DEVS_PER_NIC_V12 8

typedef enum {
  NCCL_NET_DEVICE_HOST = 0, NCCL_NET_DEVICE_UNPACK = 1, NCCL_NET_DEVICE_GIN_PROXY = 2, NCCL_NET_DEVICE_GIN_GDAKI = 3,
  NCCL_NET_DEVICE_GIN_GPI = 4
} ncclNetDeviceType;
#define NCCL_NET_DEVICE_INVALID_VERSION 0x0

/* Device offload (not used by Chorus: it passes NULL, asking for none). Same layout v7..v12. */
typedef struct {
  ncclNetDeviceType netDeviceType;
  int netDeviceVersion;
  void* handle;
  size_t size;
  int needsProxyProgress;
} ncclNetDeviceHandle_v12_t;
typedef ncclNetDeviceHandle_v12_t ncclNetDeviceHandle_v11_t;
typedef ncclNetDeviceHandle_v12_t ncclNetDeviceHandle_v10_t;

/* The profiler's network event callback (Chorus passes NULL: no events). */
typedef ncclResult_t (*ncclProfilerCallback_t)(void** eHandle, int type, void* pHandle, int64_t pluginId,
                                               void* extData);

typedef struct { int trafficClass; } ncclNetCommConfig_v12_t;
typedef ncclNetCommConfig_v12_t ncclNetCommConfig_v11_t;
typedef ncclNetCommConfig_v12_t ncclNetCommConfig_v10_t;

typedef struct { int ndevs; int devs[NCCL_NET_MAX_DEVS_PER_NIC_V12]; } ncclNetVDeviceProps_v12_t;
typedef struct { int ndevs; int devs[NCCL_NET_MAX_DEVS_PER_NIC_V11]; } ncclNetVDeviceProps_v11_t;
typedef ncclNetVDeviceProps_v11_t ncclNetVDeviceProps_v10_t;

/* The fields every version has, in this order; each version appends (see the three below). */
#define CH_NET_PROPS_COMMON(vprops)                                                                          \
  char* name;        /* for logs; NCCL_NET_* names match it */                                               \
  char* pciPath;     /* /sys PCI path of the NIC, or NULL for a virtual one */                                \
  uint64_t guid;     /* devices with one guid share a port */                                                \
  int ptrSupport;    /* NCCL_PTR_HOST | NCCL_PTR_CUDA | NCCL_PTR_DMABUF */                                   \
  int regIsGlobal;   /* a registration is not tied to a comm */                                              \
  int forceFlush;    /* flush every receive into GPU memory */                                               \
  int speed;         /* Mbit/s */                                                                            \
  int port;                                                                                                  \
  float latency;     /* microseconds */                                                                      \
  int maxComms;                                                                                              \
  int maxRecvs;      /* largest n of a grouped irecv */                                                      \
  ncclNetDeviceType netDeviceType;                                                                           \
  int netDeviceVersion;                                                                                      \
  vprops vProps;                                                                                             \
  size_t maxP2pBytes;                                                                                        \
  size_t maxCollBytes;
typedef struct {
  CH_NET_PROPS_COMMON(ncclNetVDeviceProps_v12_t)
  int maxMultiRequestSize;
  int16_t railId;
  int16_t planeId;
} ncclNetProperties_v12_t;
typedef struct {
  CH_NET_PROPS_COMMON(ncclNetVDeviceProps_v11_t)
  int maxMultiRequestSize;
} ncclNetProperties_v11_t;
typedef struct {
  CH_NET_PROPS_COMMON(ncclNetVDeviceProps_v10_t)
} ncclNetProperties_v10_t;

typedef struct {
  int32_t maxConcurrentPeers, minConcurrentPeers, maxFlowsPerPeer, minFlowsPerPeer;
} ncclNetCommAttr_v12_t;
typedef struct {
  ncclNetCommAttr_v12_t sendCommAttr, recvCommAttr;
  uint32_t op, algo, proto;
} ncclNetAttr_v12_t;
typedef ncclNetAttr_v12_t ncclNetAttr_v11_t;

/* The function table, in NCCL's order. Contracts (docs/CLUSTER.md): listen/connect/accept never block
 * (a NULL comm with success means "call again"); isend/irecv return a NULL request to say "not now";
 * test never blocks and frees the request when done; messages on one comm match in posting order. */
#define CH_NET_TABLE_TAIL(props, devh, vprops)                                                                \
  ncclResult_t (*accept)(void* listenComm, void** recvComm, devh** recvDevComm);                              \
  ncclResult_t (*regMr)(void* comm, void* data, size_t size, int type, void** mhandle);                       \
  ncclResult_t (*regMrDmaBuf)(void* comm, void* data, size_t size, int type, uint64_t offset, int fd,          \
                              void** mhandle);                                                                \
  ncclResult_t (*deregMr)(void* comm, void* mhandle);                                                         \
  ncclResult_t (*isend)(void* sendComm, void* data, size_t size, int tag, void* mhandle, void* phandle,        \
                        void** request);                                                                      \
  ncclResult_t (*irecv)(void* recvComm, int n, void** data, size_t* sizes, int* tags, void** mhandles,         \
                        void** phandles, void** request);                                                     \
  ncclResult_t (*iflush)(void* recvComm, int n, void** data, int* sizes, void** mhandles, void** request);     \
  ncclResult_t (*test)(void* request, int* done, int* sizes);                                                 \
  ncclResult_t (*closeSend)(void* sendComm);                                                                  \
  ncclResult_t (*closeRecv)(void* recvComm);                                                                  \
  ncclResult_t (*closeListen)(void* listenComm);                                                              \
  ncclResult_t (*getDeviceMr)(void* comm, void* mhandle, void** dptr_mhandle);                                \
  ncclResult_t (*irecvConsumed)(void* recvComm, int n, void* request);                                        \
  ncclResult_t (*makeVDevice)(int* d, vprops* props);

typedef struct {
  const char* name;
  ncclResult_t (*init)(void** ctx, uint64_t commId, ncclNetCommConfig_v12_t* config, ncclDebugLogger_t logFunction,
                       ncclProfilerCallback_t profFunction);
  ncclResult_t (*devices)(int* ndev);
  ncclResult_t (*getProperties)(int dev, ncclNetProperties_v12_t* props);
  ncclResult_t (*listen)(void* ctx, int dev, void* handle, void** listenComm);
  ncclResult_t (*connect)(void* ctx, int dev, void* handle, void** sendComm, ncclNetDeviceHandle_v12_t** sendDevComm);
  CH_NET_TABLE_TAIL(ncclNetProperties_v12_t, ncclNetDeviceHandle_v12_t, ncclNetVDeviceProps_v12_t)
  ncclResult_t (*finalize)(void* ctx);
  ncclResult_t (*setNetAttr)(void* ctx, ncclNetAttr_v12_t* netAttr);
} ncclNet_v12_t;

typedef struct {
  const char* name;
  ncclResult_t (*init)(void** ctx, uint64_t commId, ncclNetCommConfig_v11_t* config, ncclDebugLogger_t logFunction,
                       ncclProfilerCallback_t profFunction);
  ncclResult_t (*devices)(int* ndev);
  ncclResult_t (*getProperties)(int dev, ncclNetProperties_v11_t* props);
  ncclResult_t (*listen)(void* ctx, int dev, void* handle, void** listenComm);
  ncclResult_t (*connect)(void* ctx, int dev, void* handle, void** sendComm, ncclNetDeviceHandle_v11_t** sendDevComm);
  CH_NET_TABLE_TAIL(ncclNetProperties_v11_t, ncclNetDeviceHandle_v11_t, ncclNetVDeviceProps_v11_t)
  ncclResult_t (*finalize)(void* ctx);
  ncclResult_t (*setNetAttr)(void* ctx, ncclNetAttr_v11_t* netAttr);
} ncclNet_v11_t;

/* v10: init once per process (no ctx), the traffic class passed to connect. */
typedef struct {
  const char* name;
  ncclResult_t (*init)(ncclDebugLogger_t logFunction, ncclProfilerCallback_t profFunction);
  ncclResult_t (*devices)(int* ndev);
  ncclResult_t (*getProperties)(int dev, ncclNetProperties_v10_t* props);
  ncclResult_t (*listen)(int dev, void* handle, void** listenComm);
  ncclResult_t (*connect)(int dev, ncclNetCommConfig_v10_t* config, void* handle, void** sendComm,
                          ncclNetDeviceHandle_v10_t** sendDevComm);
  CH_NET_TABLE_TAIL(ncclNetProperties_v10_t, ncclNetDeviceHandle_v10_t, ncclNetVDeviceProps_v10_t)
} ncclNet_v10_t;

/* Copies the fields every properties version has, from p to o (different versions), o zeroed first;
 * vProps are cut to the 4 devices of v10/v11 (a count from a plugin is clamped, never trusted). */
#define CH_NET_PROPS_COPY_COMMON(o, p)                                                                  \
  do {                                                                                                 \
    memset((o), 0, sizeof(*(o)));                                                                      \
    (o)->name = (p)->name, (o)->pciPath = (p)->pciPath, (o)->guid = (p)->guid;                         \
    (o)->ptrSupport = (p)->ptrSupport, (o)->regIsGlobal = (p)->regIsGlobal;                            \
    (o)->forceFlush = (p)->forceFlush, (o)->speed = (p)->speed, (o)->port = (p)->port;                 \
    (o)->latency = (p)->latency, (o)->maxComms = (p)->maxComms, (o)->maxRecvs = (p)->maxRecvs;         \
    (o)->netDeviceType = (p)->netDeviceType, (o)->netDeviceVersion = (p)->netDeviceVersion;            \
    int nd_ = (p)->vProps.ndevs < 0 ? 0 : (p)->vProps.ndevs;                                           \
    if (nd_ > NCCL_NET_MAX_DEVS_PER_NIC_V11) nd_ = NCCL_NET_MAX_DEVS_PER_NIC_V11;                      \
    (o)->vProps.ndevs = nd_;                                                                           \
    for (int i_ = 0; i_ < nd_; i_++) (o)->vProps.devs[i_] = (p)->vProps.devs[i_];                      \
    (o)->maxP2pBytes = (p)->maxP2pBytes, (o)->maxCollBytes = (p)->maxCollBytes;                        \
  } while (0)

typedef ncclNet_v12_t ncclNet_t;
typedef ncclNetProperties_v12_t ncclNetProperties_t;

#ifdef __cplusplus
}
#endif
#endif
