/* Chorus extensions to the NCCL API. Everything here is prefixed `chorus`. */
#ifndef CHORUS_H_
#define CHORUS_H_

#include "nccl.h"
#include <stddef.h>
#include <stdint.h>

#define CHORUS_MAJOR 0
#define CHORUS_MINOR 1
#define CHORUS_PATCH 0
#define CHORUS_VERSION_CODE (CHORUS_MAJOR * 10000 + CHORUS_MINOR * 100 + CHORUS_PATCH)
#define CHORUS_VERSION_STRING "0.1.0"

#ifdef __cplusplus
extern "C" {
#endif

/* Chorus's own version (ncclGetVersion reports the NCCL API level). */
ncclResult_t chorusGetVersion(int* version);

/* Host streams: a call issued on one returns at once and runs in the background, in issue order.
 * Failures are reported by ncclCommGetAsyncError and by chorusStreamSynchronize. Passing NULL as
 * the stream makes a call (or a group) complete before it returns. */
ncclResult_t chorusStreamCreate(cudaStream_t* stream);
ncclResult_t chorusStreamSynchronize(cudaStream_t stream);
/* ncclSuccess when everything issued so far has finished, ncclInProgress otherwise. */
ncclResult_t chorusStreamQuery(cudaStream_t stream);
ncclResult_t chorusStreamDestroy(cudaStream_t stream);

/* Initialise from the launcher's environment: chorusrun (NCCL_COMM_ID, RANK, WORLD_SIZE), torchrun
 * (MASTER_ADDR, MASTER_PORT, RANK, WORLD_SIZE), Open MPI (OMPI_COMM_WORLD_*), PMI/Slurm (PMI_RANK,
 * PMI_SIZE, SLURM_PROCID, SLURM_NTASKS). Rank 0 hosts the bootstrap root at the given address. */
ncclResult_t chorusInitFromEnv(ncclComm_t* comm);

/* How long a call on comm may wait without any progress before it fails with ncclTimeout, sets the
 * communicator's asynchronous error and prints a report of what each rank waits for (default:
 * CHORUS_TIMEOUT, 1800 s; 0 = never). Applies to calls issued afterwards, and to connection setup. */
ncclResult_t chorusCommSetTimeout(ncclComm_t comm, double seconds);
/* The job-wide state of comm's ranks, as the stall report that a timeout logs: a headline
 * ("stall report for comm ... (8 ranks): AllReduce #812 (64 MiB): ranks 0-6 waiting, rank 7 last
 * completed #811"), then one line per rank (in a call and waiting for whom, busy, idle and the last
 * call it completed, or not answering). Other processes' ranks are asked over the stall query service,
 * for at most about 2 s. Logs nothing on success. Any thread may call it, also while another is blocked
 * in a call on comm (a monitoring thread's question), and beside ncclCommAbort. text gets at most len
 * bytes, NUL-terminated (cut if longer; text may be NULL if len is 0); *needed (if needed is not NULL)
 * the whole report's length, without the NUL (the next report may differ). On any result but
 * ncclSuccess nothing is written; ncclInProgress while a nonblocking init is still running. */
ncclResult_t chorusCommStallReport(ncclComm_t comm, char* text, size_t len, size_t* needed);
/* Reproducible reductions (docs/REPRODUCIBLE.md) for floating-point AllReduce, ReduceScatter and
 * Reduce on comm: chorusReproOrder gives the same bits whatever the algorithm, protocol, channels,
 * message size or placement of the ranks, for a given rank count (ranks' values combined in rank
 * order; 16- and 8-bit types accumulate in fp32 and round once); chorusReproExact gives the correctly
 * rounded exact sum (avg: of the exact sum divided by nranks), so also the same for any rank count.
 * Default: CHORUS_REPRODUCIBLE (off). Collective: every rank of comm calls it with the same level,
 * before comm's first call (ncclInvalidUsage afterwards, or when the ranks' levels differ, on every
 * rank). Integer reductions are exact already: nothing changes for them. */
typedef enum { chorusReproOff = 0, chorusReproOrder = 1, chorusReproExact = 2 } chorusRepro_t;
ncclResult_t chorusCommSetReproducible(ncclComm_t comm, int level);
ncclResult_t chorusCommGetReproducible(ncclComm_t comm, int* level);
/* Compressed wire formats (docs/WIRE.md) for float32 and bfloat16 AllReduce, ReduceScatter, AllGather,
 * Broadcast and Reduce: the hops over the network (CHORUS_WIRE_HOPS=all: every hop) carry each value in
 * format, rounded to nearest even; the rest stays exact. Every rank of an AllReduce gets the same bits.
 * bfloat16 data compresses with the 8-bit formats only; other types never. chorusWireForce (or a
 * trailing "!" in the string) uses the format even where the cost model says the link outruns the
 * conversion. Refused (ncclInvalidUsage) under a reproducible level. */
typedef enum {
  chorusWireOff = 0,
  chorusWireBf16 = 1,
  chorusWireFp16 = 2,
  chorusWireFp8e4m3 = 3,
  chorusWireFp8e5m2 = 4,
  chorusWireMx8 = 5, /* 32 values share a power-of-two scale (OCP microscaling), each e4m3 */
  chorusWireForce = 0x100
} chorusWireFormat_t;
/* comm's format for the calls issued after it (default CHORUS_WIRE_FORMAT): "off", "bf16", "fp16",
 * "fp8e4m3", "fp8e5m2", "mx8", optionally with "!". Not collective, but every rank must set the same
 * before the calls it should apply to: calls whose formats differ fail as a mismatch naming both. */
ncclResult_t chorusCommSetWireFormat(ncclComm_t comm, const char* format);
/* Per call, through NCCL 2.31's vendor options: an ncclConfigExt_t with key.vendorId
 * CHORUS_CONFIG_EXT_VENDOR and key.optionId CHORUS_COLL_OPT_WIRE_FORMAT, val.i a chorusWireFormat_t
 * (| chorusWireForce), on the ext list of the nccl<Collective>Config call's ncclCollConfig_t; it
 * replaces comm's format for that call. Other vendors' options are ignored, as NCCL ignores ours. */
#define CHORUS_CONFIG_EXT_VENDOR 0x43484f52 /* "CHOR" */
#define CHORUS_COLL_OPT_WIRE_FORMAT 1
/* Counters of comm (docs/OBSERVE.md): calls finished, their data (count x type size as given), time this
 * rank waited for peers inside calls (waits longer than about 64 polls; a short wait is not timed), calls
 * failed. Per peer: payload bytes sent to it and received from it over connections (Direct's reads of
 * its buffers are not counted), time waited on it, and its one-sided calls: bytes put into its windows
 * (ncclPutSignal) and signals sent to it (ncclPutSignal and ncclSignal). Any thread, any time after
 * init, also while another thread is in a call on comm. */
typedef struct {
  uint64_t calls, bytes, waitNs, errors;
  uint64_t reserved[4];
} chorusCounters_t;
typedef struct {
  uint64_t bytesSent, bytesReceived, waitNs;
  uint64_t bytesPut, signalsSent; /* were reserved: the struct keeps its size */
  uint64_t reserved[3];
} chorusPeerCounters_t;
ncclResult_t chorusCommGetCounters(ncclComm_t comm, chorusCounters_t* counters);
ncclResult_t chorusCommGetPeerCounters(ncclComm_t comm, int peer, chorusPeerCounters_t* counters);
/* The same in Prometheus' text exposition format (chorus_calls_total{comm=...,rank=...} ...), as for
 * chorusCommStallReport: at most len bytes, NUL-terminated; *needed the whole text's length. */
ncclResult_t chorusCommMetrics(ncclComm_t comm, char* text, size_t len, size_t* needed);
/* Memory per rank (docs/SCALE.md "Memory per rank"). Set size to sizeof(chorusMemory_t) first: the call
 * fills only the fields that fit in size, so the struct may grow at its end. Per communicator: the
 * peers whose per-peer connections (send/recv, AlltoAll, Gather, Scatter) hold memory now (live local
 * connections, and network peers whose FIFO pages are resident: a network peer keeps its sockets after
 * giving its pages back), the most at once, the cap on them (CHORUS_P2P_PEERS, or what CHORUS_P2P_MEM
 * holds), one per-peer FIFO's bytes, the bytes of the
 * per-peer receive FIFOs this rank made and of the send FIFOs it maps, peers released (by this rank's
 * pool, or by the peer's, whose close this rank then gave back) and
 * connections it made, and the receive FIFOs of the rings and RecDbl/Rabenseifner/Tree. Per process
 * (from /proc/self, alike for every rank of the process): resident shared memory, private memory,
 * pinned (locked) memory, open descriptors, threads. Then the host memory suspend releases and keeps (below).
 * Any thread, beside a call on comm. */
typedef struct {
  size_t size;
  uint64_t p2pPeers, p2pPeersMax, p2pPeersCap, p2pFifoBytes, p2pRecvBytes, p2pSendBytes;
  uint64_t p2pReleased, p2pMade, ringBytes;
  uint64_t procShmemBytes, procPrivateBytes, procPinnedBytes, procFds, procThreads;
  /* Host memory this rank made for comm (what NCCL's ncclCommMemStats, which counts GPU memory, does
   * not): suspendBytes, what ncclCommSuspend(comm, NCCL_SUSPEND_MEM) would release now (pooled
   * per-peer receive FIFOs, the rings' and RecDbl/Rabenseifner/Tree receive FIFOs unless over the
   * network, reproducible-reduction scratch); persistBytes, what it keeps (scratch, the FIFOs that
   * stay); suspended, 1 while suspended (until ncclCommResume or the next call). */
  uint64_t suspendBytes, persistBytes, suspended;
  /* Network peers of the pool, which keep their connections: netPeersResident, those whose per-peer
   * FIFO pages are resident now (counted in p2pPeers' cap); netTrimmed, how many times idle ones gave
   * their pages back to stay within it. */
  uint64_t netPeersResident, netTrimmed;
} chorusMemory_t;
ncclResult_t chorusCommGetMemory(ncclComm_t comm, chorusMemory_t* mem);
/* Write comm's flight recorder (its last CHORUS_FLIGHT_RECORDER calls) now, to
 * CHORUS_DUMP_DIR/chorus-fr-<comm>-r<rank>.txt; path (if not NULL) gets the file's name, NUL-terminated
 * in len bytes. chorus-info --flight DIR reads every rank's file. ncclInvalidUsage when the recorder is
 * off (CHORUS_FLIGHT_RECORDER=0); ncclSystemError when the file cannot be written (a WARN says why). */
ncclResult_t chorusCommDumpFlightRecorder(ncclComm_t comm, char* path, size_t len);
/* ncclCommQueryProperties, NCCL's host-side question about a communicator, is declared by NCCL in
 * nccl_device/core.h, a CUDA header Chorus does not ship: the same struct, enums and call are declared
 * here for programs without it (include nccl_device.h before chorus.h to use NCCL's own). Layout of
 * NCCL 2.31.2; a struct made by 2.29's or 2.30's header (its size and version say which) is filled
 * only as far as it reaches. Chorus has no device API, GIN or multimem: those fields say so (false,
 * NONE, 0); rank, nRanks, cudaDev (as ncclCommCuDevice), nvmlDev (-1 without a GPU) and commHash
 * are the communicator's. */
#ifndef _NCCL_DEVICE_CORE_H_
#ifndef __cplusplus
#include <stdbool.h>
#endif
typedef enum {
  NCCL_GIN_CONNECTION_NONE,
  NCCL_GIN_CONNECTION_FULL,
  NCCL_GIN_CONNECTION_RAIL,
  NCCL_GIN_CONNECTION_CUSTOM_STRIDE
} ncclGinConnectionType_t;
typedef enum {
  NCCL_GIN_TYPE_NONE = 0,
  NCCL_GIN_TYPE_PROXY = 2,
  NCCL_GIN_TYPE_GDAKI = 3,
  NCCL_GIN_TYPE_GPI = 4,
  NCCL_GIN_TYPE_EFA_GDA = 5,
  NCCL_GIN_MAX_TYPES = 6
} ncclGinType_t;
typedef struct ncclCommProperties {
  size_t size;          /* set by NCCL_COMM_PROPERTIES_INITIALIZER */
  unsigned int magic;   /* NCCL_API_MAGIC */
  unsigned int version; /* the header's NCCL_VERSION_CODE */
  int rank, nRanks, cudaDev, nvmlDev;
  bool deviceApiSupport, multimemSupport;
  ncclGinType_t ginType;
  int nLsaTeams; /* from here on: 2.29.3 and later */
  bool hostRmaSupport;
  ncclGinType_t railedGinType;
  uint64_t commHash; /* from here on: 2.31 */
  int ginMinStride;
  ncclGinConnectionType_t ginConnectionType;
  bool ginSupport[64];
  size_t devCommRuntimeVersionSize;
} ncclCommProperties_t;
/* Every field named, so that -Wextra's missing-initializer warning stays quiet. */
#define NCCL_COMM_PROPERTIES_INITIALIZER                                                                    \
  {sizeof(ncclCommProperties_t), NCCL_API_MAGIC, NCCL_VERSION_CODE, 0, 0, 0, 0, false, false, NCCL_GIN_TYPE_NONE, 0, \
   false, NCCL_GIN_TYPE_NONE, 0, 0, NCCL_GIN_CONNECTION_NONE, {false}, 0}
ncclResult_t ncclCommQueryProperties(ncclComm_t comm, ncclCommProperties_t* props);
#endif
/* The first rank of comm that this rank learned is gone (its process exited, or its link failed: what
 * made a call fail with ncclRemoteError), or -1 while none is known. For the survivors' exclude list
 * of ncclCommShrink after one failure (examples/elastic.c); after several at once, ranks may know
 * different ones. Any thread, any time. */
ncclResult_t chorusCommGetLostRank(ncclComm_t comm, int* rank);
/* ncclAllToAllv, RCCL's and Meta's NCCLX's call (NCCL has none), with their signature: rank i sends
 * sendcounts[j] elements from sendbuff + sdispls[j] to rank j and receives recvcounts[j] elements from
 * rank j into recvbuff + rdispls[j]; counts and displacements in elements of datatype, one of each per
 * rank. Rank j's recvcounts[i] must equal rank i's sendcounts[j] (a difference fails the call with
 * ncclInvalidUsage on the ranks it reaches, naming both counts). Zero counts are allowed. Out of place
 * only: receive blocks may not overlap each other nor a send block (send blocks may overlap). The
 * arrays are read during the call only. Runs as a send and a receive per peer in one group, wherever
 * ncclSend/ncclRecv run (docs/COMPATIBILITY.md). */
ncclResult_t ncclAllToAllv(const void* sendbuff, const size_t sendcounts[], const size_t sdispls[], void* recvbuff,
                           const size_t recvcounts[], const size_t rdispls[], ncclDataType_t datatype, ncclComm_t comm,
                           cudaStream_t stream);
ncclResult_t pncclAllToAllv(const void* sendbuff, const size_t sendcounts[], const size_t sdispls[], void* recvbuff,
                            const size_t recvcounts[], const size_t rdispls[], ncclDataType_t datatype, ncclComm_t comm,
                            cudaStream_t stream);
/* Rank and world size the environment describes, without creating a communicator. */
ncclResult_t chorusEnvRankInfo(int* rank, int* nranks, int* localRank, int* localNranks);

#ifdef __cplusplus
}
#endif

#endif /* CHORUS_H_ */
