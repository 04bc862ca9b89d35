/* NCCL's profiler plugin ABI, versions 5, 6 and 7 (NCCL 2.28, 2.29 and 2.31 on), declared here so
 * that a profiler built for NCCL loads into Chorus unchanged. A plugin exports a data object of type
 * ncclProfiler_v7_t named "ncclProfiler_v7" (or the v6 or v5 one); the host calls init once per
 * communicator and then starts, stops and annotates events through it. Layouts follow NCCL's
 * src/include/plugin/profiler/profiler_v5.h, profiler_v6.h and profiler_v7.h; the offsets are pinned
 * by the static asserts at the end, so a wrong edit fails the build. observe/profiler.c is the host side;
 * tests/profiler_stub is a plugin built from this header. */
#ifndef CH_PROFILER_ABI_H
#define CH_PROFILER_ABI_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>
#include <nccl.h>

#include "../misc/log_abi.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Event kinds, one bit each: a descriptor's type is one of them, and the activation mask (an int the
 * plugin writes through the pointer init receives) is an OR of those it wants. */
enum {
  ncclProfileGroup = (1 << 0),        /* one launched plan (the v4-era group) */
  ncclProfileColl = (1 << 1),         /* one collective of a plan */
  ncclProfileP2p = (1 << 2),          /* one send or receive of a plan */
  ncclProfileProxyOp = (1 << 3),      /* the network proxy's part of a call on one channel and peer */
  ncclProfileProxyStep = (1 << 4),    /* one network transfer of a ProxyOp */
  ncclProfileProxyCtrl = (1 << 5),    /* the proxy thread's own sleeps and wakeups */
  ncclProfileKernelCh = (1 << 6),     /* a kernel's work on one channel, GPU-timed */
  ncclProfileNetPlugin = (1 << 7),    /* events a net plugin reports */
  ncclProfileGroupApi = (1 << 8),     /* v5+: an outermost group as the application called it */
  ncclProfileCollApi = (1 << 9),      /* v5+: one collective API call */
  ncclProfileP2pApi = (1 << 10),      /* v5+: one ncclSend/ncclRecv (or a peer's part of AlltoAll...) */
  ncclProfileKernelLaunch = (1 << 11), /* v5+: the launch of a plan's kernel */
  ncclProfileCeColl = (1 << 12),      /* v6: copy-engine collectives and their parts */
  ncclProfileCeSync = (1 << 13),
  ncclProfileCeBatch = (1 << 14),
  ncclProfileKernelPhase = (1 << 15), /* v7: a phase of a kernel's work on one channel (needs KernelCh) */
};

/* States an open event may report (recordEventState). One enum serves every version. 0-7 have not
 * been emitted since v4; 25-30 are declared by v6 but NCCL emits none of them. */
typedef enum {
  ncclProfilerProxyOpSendPosted = 0,
  ncclProfilerProxyOpSendRemFifoWait = 1,
  ncclProfilerProxyOpSendTransmitted = 2,
  ncclProfilerProxyOpSendDone = 3,
  ncclProfilerProxyOpRecvPosted = 4,
  ncclProfilerProxyOpRecvReceived = 5,
  ncclProfilerProxyOpRecvTransmitted = 6,
  ncclProfilerProxyOpRecvDone = 7,
  ncclProfilerProxyOpInProgress_v4 = 19,
  ncclProfilerProxyStepSendGPUWait = 8,
  ncclProfilerProxyStepSendPeerWait_v4 = 20,
  ncclProfilerProxyStepSendWait = 9,
  ncclProfilerProxyStepRecvWait = 10,
  ncclProfilerProxyStepRecvFlushWait = 11,
  ncclProfilerProxyStepRecvGPUWait = 12,
  ncclProfilerProxyCtrlIdle = 13,
  ncclProfilerProxyCtrlActive = 14,
  ncclProfilerProxyCtrlSleep = 15,
  ncclProfilerProxyCtrlWakeup = 16,
  ncclProfilerProxyCtrlAppend = 17,
  ncclProfilerProxyCtrlAppendEnd = 18,
  ncclProfilerNetPluginUpdate = 21,
  ncclProfilerKernelChStop = 22,
  ncclProfilerGroupStartApiStop = 23, /* GroupApi: the calls of the group have been queued */
  ncclProfilerGroupEndApiStart = 24,  /* GroupApi: ncclGroupEnd began */
  ncclProfilerCeCollStart = 25,
  ncclProfilerCeCollComplete = 26,
  ncclProfilerCeSyncStart = 27,
  ncclProfilerCeSyncComplete = 28,
  ncclProfilerCeBatchStart = 29,
  ncclProfilerCeBatchComplete = 30,
  ncclProfilerKernelPhaseStop = 31, /* v7: a KernelPhase ended (its GPU time in kernelCh.pTimer) */
} ncclProfilerEventState_t;
typedef ncclProfilerEventState_t ncclProfilerEventState_v5_t;
typedef ncclProfilerEventState_t ncclProfilerEventState_v6_t;
typedef ncclProfilerEventState_t ncclProfilerEventState_v7_t;

/* What comes with a state (NULL for GroupApi's two states). */
typedef union {
  struct {
    size_t transSize;
  } proxyStep;
  struct {
    int appendedProxyOps;
  } proxyCtrl;
  struct {
    void* data;
  } netPlugin;
  struct {
    uint64_t pTimer;
  } kernelCh;
} ncclProfilerEventStateArgs_v5_t;
typedef ncclProfilerEventStateArgs_v5_t ncclProfilerEventStateArgs_v6_t;
/* v7 keeps the same four members; a KernelPhase's stop uses kernelCh too. */
typedef ncclProfilerEventStateArgs_v5_t ncclProfilerEventStateArgs_v7_t;

/* The members every version from 5 on has, in their order. Strings are static (they outlive the
 * event); a plugin copies what it keeps, since the descriptor lives on the caller's stack. */
#define CH_PROF_DESCR_V5_MEMBERS                                                                   \
  struct {                                                                                         \
    bool graphCaptured;                                                                            \
    int groupDepth; /* 1: a lone call (its implicit group); more: inside ncclGroupStart/End */     \
  } groupApi;                                                                                      \
  struct {                                                                                         \
    const char* func;                                                                              \
    size_t count;                                                                                  \
    const char* datatype;                                                                          \
    int root;                                                                                      \
    void* stream;                                                                                  \
    bool graphCaptured;                                                                            \
  } collApi;                                                                                       \
  struct {                                                                                         \
    const char* func;                                                                              \
    size_t count;                                                                                  \
    const char* datatype;                                                                          \
    void* stream;                                                                                  \
    bool graphCaptured;                                                                            \
  } p2pApi;                                                                                        \
  struct {                                                                                         \
    void* stream;                                                                                  \
  } kernelLaunch;                                                                                  \
  struct {                                                                                         \
    uint64_t seqNumber; /* per collective function and communicator, from 0 */                    \
    const char* func;                                                                              \
    void const* sendBuff;                                                                          \
    void* recvBuff;                                                                                \
    size_t count;                                                                                  \
    int root;                                                                                      \
    const char* datatype;                                                                          \
    uint8_t nChannels;                                                                             \
    uint8_t nWarps;                                                                                \
    const char* algo;                                                                              \
    const char* proto;                                                                             \
    void* parentGroup; /* the Group event's handle (parentObj is the CollApi's) */                 \
  } coll;                                                                                          \
  struct {                                                                                         \
    const char* func;                                                                              \
    void* buff;                                                                                    \
    const char* datatype;                                                                          \
    size_t count;                                                                                  \
    int peer;                                                                                      \
    uint8_t nChannels;                                                                             \
    void* parentGroup;                                                                             \
  } p2p;                                                                                           \
  struct {                                                                                         \
    pid_t pid; /* the process that made the op: compare before following parentObj */             \
    uint8_t channelId;                                                                             \
    int peer;                                                                                      \
    int nSteps;                                                                                    \
    int chunkSize;                                                                                 \
    int isSend;                                                                                    \
  } proxyOp;                                                                                       \
  struct {                                                                                         \
    int step;                                                                                      \
  } proxyStep;                                                                                     \
  struct {                                                                                         \
    uint8_t channelId;                                                                             \
    uint64_t pTimer;                                                                               \
  } kernelCh;                                                                                      \
  struct {                                                                                         \
    int64_t id;                                                                                    \
    void* data;                                                                                    \
  } netPlugin;

/* One event to start. parentObj is the handle startEvent gave for the parent (or NULL). */
typedef struct {
  uint64_t type; /* one ncclProfile* bit */
  void* parentObj;
  int rank;
  union {
    CH_PROF_DESCR_V5_MEMBERS
  };
} ncclProfilerEventDescr_v5_t;

/* v6: the same, plus the copy-engine collectives' members at the end of the union. */
typedef struct {
  uint64_t type;
  void* parentObj;
  int rank;
  union {
    CH_PROF_DESCR_V5_MEMBERS
    struct {
      uint64_t seqNumber;
      const char* func;
      void const* sendBuff;
      void* recvBuff;
      size_t count;
      int root;
      const char* datatype;
      const char* syncStrategy;
      bool intraBatchSync;
      uint32_t batchSize;
      uint32_t numBatches;
      uint32_t ceSeqNum;
      void* stream;
    } ceColl;
    struct {
      bool isComplete;
      int nRanks;
    } ceCollSync;
    struct {
      int numOps;
      size_t totalBytes;
      bool useIntraSync;
    } ceCollBatch;
  };
} ncclProfilerEventDescr_v6_t;

/* v7: each v6 member as it was, with fields appended: the call's ncclCollConfig_t.userProfilerTag
 * (userTag, 0 when untagged) on the API events, Coll, P2p and ceColl; Coll also says which symmetric
 * kernel ran it (kernelVariant, NULL when none; isSymColl). One member is new: kernelPhase. Since
 * only appends changed, a v6 member reads the same bytes as its v7 counterpart (the asserts below). */
typedef struct {
  uint64_t type;
  void* parentObj;
  int rank;
  union {
    struct {
      bool graphCaptured;
      int groupDepth;
    } groupApi;
    struct {
      const char* func;
      size_t count;
      const char* datatype;
      int root;
      void* stream;
      bool graphCaptured;
      uint64_t userTag;
    } collApi;
    struct {
      const char* func;
      size_t count;
      const char* datatype;
      void* stream;
      bool graphCaptured;
      uint64_t userTag;
    } p2pApi;
    struct {
      void* stream;
    } kernelLaunch;
    struct {
      uint64_t seqNumber;
      const char* func;
      void const* sendBuff;
      void* recvBuff;
      size_t count;
      int root;
      const char* datatype;
      uint8_t nChannels;
      uint8_t nWarps;
      const char* algo;
      const char* proto;
      void* parentGroup;
      const char* kernelVariant;
      bool isSymColl;
      uint64_t userTag;
    } coll;
    struct {
      const char* func;
      void* buff;
      const char* datatype;
      size_t count;
      int peer;
      uint8_t nChannels;
      void* parentGroup;
      uint64_t userTag;
    } p2p;
    struct {
      pid_t pid;
      uint8_t channelId;
      int peer;
      int nSteps;
      int chunkSize;
      int isSend;
    } proxyOp;
    struct {
      int step;
    } proxyStep;
    struct {
      uint8_t channelId;
      uint64_t pTimer;
    } kernelCh;
    struct {
      int64_t id;
      void* data;
    } netPlugin;
    struct {
      uint64_t seqNumber;
      const char* func;
      void const* sendBuff;
      void* recvBuff;
      size_t count;
      int root;
      const char* datatype;
      const char* syncStrategy;
      bool intraBatchSync;
      uint32_t batchSize;
      uint32_t numBatches;
      uint32_t ceSeqNum;
      void* stream;
      uint64_t userTag;
    } ceColl;
    struct {
      bool isComplete;
      int nRanks;
    } ceCollSync;
    struct {
      int numOps;
      size_t totalBytes;
      bool useIntraSync;
    } ceCollBatch;
    struct {
      uint8_t channelId;
      uint8_t phaseId; /* 0: the opening barrier, 1: the computation, 2: the closing barrier */
      const char* phaseName;
      uint64_t pTimer; /* its start on the GPU's clock */
    } kernelPhase;
  };
} ncclProfilerEventDescr_v7_t;

/* The plugin's table. init: once per communicator (commId is the same on all its ranks; commName may
 * be ""); it may set *context to NULL, and may keep eActivationMask and change the mask at any time.
 * startEvent may leave *eHandle NULL (the host then skips stop and state for it). Handles are the
 * plugin's; the host passes them back as they are, also as parents after they were stopped. */
typedef struct {
  const char* name;
  ncclResult_t (*init)(void** context, uint64_t commId, int* eActivationMask, const char* commName, int nNodes,
                       int nranks, int rank, ncclDebugLogger_t logfn);
  ncclResult_t (*startEvent)(void* context, void** eHandle, ncclProfilerEventDescr_v6_t* eDescr);
  ncclResult_t (*stopEvent)(void* eHandle);
  ncclResult_t (*recordEventState)(void* eHandle, ncclProfilerEventState_v6_t eState,
                                   ncclProfilerEventStateArgs_v6_t* eStateArgs);
  ncclResult_t (*finalize)(void* context);
} ncclProfiler_v6_t;

/* v7: v6's table with the v7 descriptor. */
typedef struct {
  const char* name;
  ncclResult_t (*init)(void** context, uint64_t commId, int* eActivationMask, const char* commName, int nNodes,
                       int nranks, int rank, ncclDebugLogger_t logfn);
  ncclResult_t (*startEvent)(void* context, void** eHandle, ncclProfilerEventDescr_v7_t* eDescr);
  ncclResult_t (*stopEvent)(void* eHandle);
  ncclResult_t (*recordEventState)(void* eHandle, ncclProfilerEventState_v7_t eState,
                                   ncclProfilerEventStateArgs_v7_t* eStateArgs);
  ncclResult_t (*finalize)(void* context);
} ncclProfiler_v7_t;

typedef struct {
  const char* name;
  ncclResult_t (*init)(void** context, uint64_t commId, int* eActivationMask, const char* commName, int nNodes,
                       int nranks, int rank, ncclDebugLogger_t logfn);
  ncclResult_t (*startEvent)(void* context, void** eHandle, ncclProfilerEventDescr_v5_t* eDescr);
  ncclResult_t (*stopEvent)(void* eHandle);
  ncclResult_t (*recordEventState)(void* eHandle, ncclProfilerEventState_v5_t eState,
                                   ncclProfilerEventStateArgs_v5_t* eStateArgs);
  ncclResult_t (*finalize)(void* context);
} ncclProfiler_v5_t;

#ifdef __cplusplus
}
#endif

/* The LP64 layout NCCL's headers give (x86-64, aarch64). */
#if !defined(__cplusplus) && defined(__LP64__)
#define CH_PROF_AT(T, m, off) _Static_assert(offsetof(T, m) == (off), #T "." #m " is not at " #off)
CH_PROF_AT(ncclProfilerEventDescr_v5_t, type, 0);
CH_PROF_AT(ncclProfilerEventDescr_v5_t, parentObj, 8);
CH_PROF_AT(ncclProfilerEventDescr_v5_t, rank, 16);
CH_PROF_AT(ncclProfilerEventDescr_v5_t, groupApi.groupDepth, 28);
CH_PROF_AT(ncclProfilerEventDescr_v5_t, collApi.root, 48);
CH_PROF_AT(ncclProfilerEventDescr_v5_t, collApi.graphCaptured, 64);
CH_PROF_AT(ncclProfilerEventDescr_v5_t, p2pApi.stream, 48);
CH_PROF_AT(ncclProfilerEventDescr_v5_t, p2pApi.graphCaptured, 56);
CH_PROF_AT(ncclProfilerEventDescr_v5_t, coll.seqNumber, 24);
CH_PROF_AT(ncclProfilerEventDescr_v5_t, coll.count, 56);
CH_PROF_AT(ncclProfilerEventDescr_v5_t, coll.root, 64);
CH_PROF_AT(ncclProfilerEventDescr_v5_t, coll.datatype, 72);
CH_PROF_AT(ncclProfilerEventDescr_v5_t, coll.nChannels, 80);
CH_PROF_AT(ncclProfilerEventDescr_v5_t, coll.nWarps, 81);
CH_PROF_AT(ncclProfilerEventDescr_v5_t, coll.algo, 88);
CH_PROF_AT(ncclProfilerEventDescr_v5_t, coll.proto, 96);
CH_PROF_AT(ncclProfilerEventDescr_v5_t, coll.parentGroup, 104);
CH_PROF_AT(ncclProfilerEventDescr_v5_t, p2p.count, 48);
CH_PROF_AT(ncclProfilerEventDescr_v5_t, p2p.peer, 56);
CH_PROF_AT(ncclProfilerEventDescr_v5_t, p2p.nChannels, 60);
CH_PROF_AT(ncclProfilerEventDescr_v5_t, p2p.parentGroup, 64);
CH_PROF_AT(ncclProfilerEventDescr_v5_t, proxyOp.channelId, 28);
CH_PROF_AT(ncclProfilerEventDescr_v5_t, proxyOp.isSend, 44);
CH_PROF_AT(ncclProfilerEventDescr_v5_t, kernelCh.pTimer, 32);
CH_PROF_AT(ncclProfilerEventDescr_v5_t, netPlugin.data, 32);
CH_PROF_AT(ncclProfilerEventDescr_v6_t, coll.parentGroup, 104);
CH_PROF_AT(ncclProfilerEventDescr_v6_t, p2p.parentGroup, 64);
CH_PROF_AT(ncclProfilerEventDescr_v6_t, ceColl.syncStrategy, 80);
CH_PROF_AT(ncclProfilerEventDescr_v6_t, ceColl.intraBatchSync, 88);
CH_PROF_AT(ncclProfilerEventDescr_v6_t, ceColl.batchSize, 92);
CH_PROF_AT(ncclProfilerEventDescr_v6_t, ceColl.ceSeqNum, 100);
CH_PROF_AT(ncclProfilerEventDescr_v6_t, ceColl.stream, 104);
CH_PROF_AT(ncclProfilerEventDescr_v6_t, ceCollSync.nRanks, 28);
CH_PROF_AT(ncclProfilerEventDescr_v6_t, ceCollBatch.totalBytes, 32);
CH_PROF_AT(ncclProfilerEventDescr_v6_t, ceCollBatch.useIntraSync, 40);
_Static_assert(sizeof(ncclProfilerEventDescr_v5_t) == 112 && sizeof(ncclProfilerEventDescr_v6_t) == 112,
               "profiler descriptors are 112 bytes in NCCL");
_Static_assert(sizeof(ncclProfilerEventStateArgs_v5_t) == 8, "state arguments are 8 bytes in NCCL");
/* v7: v6's members where they were (observe/profiler.c copies a v6 descriptor into a v7 one), then
 * the appended fields. */
CH_PROF_AT(ncclProfilerEventDescr_v7_t, rank, 16);
CH_PROF_AT(ncclProfilerEventDescr_v7_t, collApi.graphCaptured, 64);
CH_PROF_AT(ncclProfilerEventDescr_v7_t, collApi.userTag, 72);
CH_PROF_AT(ncclProfilerEventDescr_v7_t, p2pApi.graphCaptured, 56);
CH_PROF_AT(ncclProfilerEventDescr_v7_t, p2pApi.userTag, 64);
CH_PROF_AT(ncclProfilerEventDescr_v7_t, coll.nWarps, 81);
CH_PROF_AT(ncclProfilerEventDescr_v7_t, coll.parentGroup, 104);
CH_PROF_AT(ncclProfilerEventDescr_v7_t, coll.kernelVariant, 112);
CH_PROF_AT(ncclProfilerEventDescr_v7_t, coll.isSymColl, 120);
CH_PROF_AT(ncclProfilerEventDescr_v7_t, coll.userTag, 128);
CH_PROF_AT(ncclProfilerEventDescr_v7_t, p2p.parentGroup, 64);
CH_PROF_AT(ncclProfilerEventDescr_v7_t, p2p.userTag, 72);
CH_PROF_AT(ncclProfilerEventDescr_v7_t, proxyOp.isSend, 44);
CH_PROF_AT(ncclProfilerEventDescr_v7_t, netPlugin.data, 32);
CH_PROF_AT(ncclProfilerEventDescr_v7_t, ceColl.stream, 104);
CH_PROF_AT(ncclProfilerEventDescr_v7_t, ceColl.userTag, 112);
CH_PROF_AT(ncclProfilerEventDescr_v7_t, ceCollBatch.useIntraSync, 40);
CH_PROF_AT(ncclProfilerEventDescr_v7_t, kernelPhase.phaseId, 25);
CH_PROF_AT(ncclProfilerEventDescr_v7_t, kernelPhase.phaseName, 32);
CH_PROF_AT(ncclProfilerEventDescr_v7_t, kernelPhase.pTimer, 40);
_Static_assert(sizeof(ncclProfilerEventDescr_v7_t) == 136, "the v7 descriptor is 136 bytes in NCCL");
_Static_assert(offsetof(ncclProfiler_v7_t, finalize) == 40, "ncclProfiler_v7_t has six members");
#undef CH_PROF_AT
#endif

#endif
