/* CUDA's runtime header first, then Chorus's nccl.h: one cudaStream_t type for both. */
#include <cuda_runtime.h>

#include "../../include/nccl.h"

typedef ncclResult_t (*allreduce_fn)(const void*, void*, size_t, ncclDataType_t, ncclRedOp_t, ncclComm_t,
                                     cudaStream_t);
allreduce_fn cuda_first_allreduce(void);
allreduce_fn cuda_first_allreduce(void) { return ncclAllReduce; }

int cuda_last_check(void);

int main(void) {
  cudaStream_t s = 0;
  (void)s;
  /* The function types seen from both include orders must be the same type. */
  return cuda_first_allreduce() == ncclAllReduce && cuda_last_check() == 0 ? 0 : 1;
}
