// Chorus's public headers in a C++ program: declarations must have C linkage and be valid C++11.
#include "../../include/chorus.h"
#include "../../include/nccl.h"

#include <cstdio>

int main() {
  int version = 0, chorus_version = 0;
  if (ncclGetVersion(&version) != ncclSuccess || version != NCCL_VERSION_CODE) return 1;
  if (chorusGetVersion(&chorus_version) != ncclSuccess || chorus_version != CHORUS_VERSION_CODE) return 1;
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  ncclSimInfo_t sim = NCCL_SIM_INFO_INITIALIZER;
  ncclComm_t comm = NCCL_COMM_NULL;
  cudaStream_t stream = nullptr;
  ncclRedOp_t op = ncclSum;
  ncclDataType_t type = ncclBfloat16;
  (void)comm, (void)stream, (void)op, (void)type, (void)sim;
  if (config.size != sizeof(ncclConfig_t)) return 1;
  std::printf("C++ sees NCCL %d, Chorus %s; error string for %d: %s\n", version, CHORUS_VERSION_STRING,
              static_cast<int>(ncclInvalidArgument), ncclGetErrorString(ncclInvalidArgument));
  return 0;
}
