/* ncclCommQueryProperties (NCCL 2.29+, declared by NCCL in nccl_device/core.h and here in chorus.h).
 * Programs that use NCCL's device API ask it first whether the communicator supports it; Chorus has no
 * device API, GIN or multimem, and says so truthfully, so such a program takes its host path. The
 * caller's struct may come from any header 2.29..2.31: its layout grew at the end, with one exception
 * (2.29.2's ginType was one byte), so each field is written only when the caller's version has it and
 * its size reaches it. */
#include <stddef.h>
#include <string.h>

#include "../misc/log.h"
#include "../comm/comm.h"
#include "../core/init.h"
#include "api.h"
#include "chorus.h"

#define V(a, b, c) ((a)*10000 + (b)*100 + (c))

/* Set a field of the caller's struct if its size reaches it: p is the caller's, at most `size` bytes. */
#define PUT(p, size, field, value)                                                                  \
  do {                                                                                              \
    if (offsetof(ncclCommProperties_t, field) + sizeof((p)->field) <= (size)) (p)->field = (value); \
  } while (0)

CH_API(ncclResult_t, ncclCommQueryProperties, ncclComm_t comm, ncclCommProperties_t* props) {
  const char* fn = "ncclCommQueryProperties";
  ch_status s = comm_check(comm, fn);
  if (s != CH_OK) return ch_to_nccl(s);
  ARG_NONNULL(props, fn);
  if (props->magic != NCCL_API_MAGIC) {
    WARN("%s: props was not set up with NCCL_COMM_PROPERTIES_INITIALIZER (magic 0x%x, expected 0x%x)", fn, props->magic,
         (unsigned)NCCL_API_MAGIC);
    return ncclInvalidUsage;
  }
  unsigned v = props->version;
  size_t size = props->size;
  if (v > NCCL_VERSION_CODE) { /* a newer header's struct: its fields past ours are unknown here */
    WARN("%s: props comes from NCCL %u.%u.%u's header; this library is NCCL %d.%d.%d's", fn, v / 10000, v / 100 % 100,
         v % 100, NCCL_MAJOR, NCCL_MINOR, NCCL_PATCH);
    return ncclInvalidUsage;
  }
  if (v < V(2, 29, 0) || size < offsetof(ncclCommProperties_t, ginType) || size > sizeof(*props)) {
    WARN("%s: props has version %u and size %zu; expected a struct from NCCL 2.29..%d.%d's header (%zu..%zu "
         "bytes)",
         fn, v, size, NCCL_MAJOR, NCCL_MINOR, offsetof(ncclCommProperties_t, ginType), sizeof(*props));
    return ncclInvalidArgument;
  }
  struct comm_guard g;
  if (!comm_try_enter(comm, &g)) return ncclInvalidUsage; /* being aborted */
  s = comm_ensure_ready(comm);
  if (s == CH_OK) {
    PUT(props, size, rank, comm->rank);
    PUT(props, size, nRanks, comm->nranks);
    PUT(props, size, cudaDev, comm->local_rank); /* as ncclCommCuDevice reports it */
    PUT(props, size, nvmlDev, -1);               /* no GPU of the job is known by an NVML index */
    PUT(props, size, deviceApiSupport, false);
    PUT(props, size, multimemSupport, false);
    if (v <= V(2, 29, 2)) {
      /* ginType was a byte, right after multimemSupport: NONE is 0 either way. */
      size_t at = offsetof(ncclCommProperties_t, multimemSupport) + 1;
      if (at < size) ((unsigned char*)props)[at] = 0;
    } else {
      PUT(props, size, ginType, NCCL_GIN_TYPE_NONE);
      PUT(props, size, nLsaTeams, 0);
      PUT(props, size, hostRmaSupport, false);
      PUT(props, size, railedGinType, NCCL_GIN_TYPE_NONE);
    }
    if (v >= V(2, 31, 0)) {
      PUT(props, size, commHash, comm->comm_hash);
      PUT(props, size, ginMinStride, 0);
      PUT(props, size, ginConnectionType, NCCL_GIN_CONNECTION_NONE);
      if (offsetof(ncclCommProperties_t, ginSupport) + sizeof(props->ginSupport) <= size)
        memset(props->ginSupport, 0, sizeof(props->ginSupport));
      PUT(props, size, devCommRuntimeVersionSize, 0);
    }
  }
  comm_leave(&g);
  return ch_to_nccl(s);
}
