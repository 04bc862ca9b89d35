/* The ABI facts as Chorus's own header states them (relative include: never CUDA's nccl.h). */
#include <string.h>

#include "../../include/nccl.h"
#include "abi_facts.h"

void abi_ours_enums(long long out[ABI_NENUMS]) {
  ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
  ncclSimInfo_t sim = NCCL_SIM_INFO_INITIALIZER;
  const long long v[] = {ABI_ENUMS(ABI_VALUE)};
  memcpy(out, v, sizeof(v));
}

void abi_ours_layout(long long out[ABI_NLAYOUT]) {
  ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
  ncclSimInfo_t sim = NCCL_SIM_INFO_INITIALIZER;
  const long long v[] = {ABI_LAYOUT(ABI_VALUE)};
  memcpy(out, v, sizeof(v));
}

long long abi_ours_timeout_value(void) { return ncclTimeout; }
