/* Entry points of NCCL 2.28 and later that Chorus answers without doing their work: the device API
 * (nccl_device.h, which Chorus does not ship). Programs built against a newer NCCL import them whether
 * or not they call them (PyTorch 2.15's libtorch_cuda.so binds them when it loads: without them,
 * `LD_PRELOAD=libnccl.so.2` of Chorus would fail `import torch`). Each takes NCCL's arguments and
 * refuses by name instead of crashing (docs/COMPATIBILITY.md lists them). */
#include <stdint.h>

#include "../misc/log.h"
#include "../comm/comm.h"
#include "../core/init.h"
#include "api.h"

static ncclResult_t refuse(ncclComm_t comm, const char* fn, const char* why) {
  if (comm && comm_check(comm, fn) != CH_OK) return ncclInvalidArgument;
  WARN("%s is not supported by Chorus yet (%s)", fn, why);
  return ncclInvalidUsage;
}

/* The device API (nccl_device.h): kernels that communicate from the GPU. */
CH_API(ncclResult_t, ncclDevCommCreate, ncclComm_t comm, const void* reqs, void* outDevComm) {
  (void)reqs, (void)outDevComm;
  return refuse(comm, "ncclDevCommCreate", "the device API (nccl_device.h)");
}

CH_API(ncclResult_t, ncclDevCommDestroy, ncclComm_t comm, const void* devComm) {
  (void)devComm;
  return refuse(comm, "ncclDevCommDestroy", "the device API (nccl_device.h)");
}

/* Their arguments are not read: only their names are known here. */
CH_API(ncclResult_t, ncclGetPeerDevicePointer, void) {
  return refuse(NULL, "ncclGetPeerDevicePointer", "the device API (nccl_device.h)");
}

CH_API(ncclResult_t, ncclGetLsaMultimemDevicePointer, void) {
  return refuse(NULL, "ncclGetLsaMultimemDevicePointer", "the device API (nccl_device.h)");
}
