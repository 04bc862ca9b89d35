/* Chorus's nccl.h first, then CUDA's runtime header: CUDA's typedef must not clash with ours. */
#include "../../include/nccl.h"

#include <cuda_runtime.h>

int cuda_last_check(void);
int cuda_last_check(void) {
  cudaStream_t s = NULL;
  struct CUstream_st* raw = s; /* both name the same struct */
  int version = 0;
  if (ncclGetVersion(&version) != ncclSuccess || version != NCCL_VERSION_CODE) return 1;
  return raw == NULL ? 0 : 1;
}
