/* Chorus's public headers in a strict C99 program (no GNU extensions, -Wpedantic). */
#include "../../include/chorus.h"
#include "../../include/nccl.h"

int main(void) {
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  ncclSimInfo_t sim = NCCL_SIM_INFO_INITIALIZER;
  int version = 0;
  if (ncclGetVersion(&version) != ncclSuccess || version != NCCL_VERSION_CODE) return 1;
  return config.size == sizeof(ncclConfig_t) && sim.size == sizeof(ncclSimInfo_t) ? 0 : 1;
}
