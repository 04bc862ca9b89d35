/* A complete NCCL program: each process sums a vector with every other rank.
 * Build (from the repository root, after `make`):
 *   cc examples/allreduce.c -I build/include -L build/lib -lchorus -Wl,-rpath,$PWD/build/lib -o allreduce
 * Run:  build/bin/chorusrun -n 4 ./allreduce */
#include <stdio.h>
#include <stdlib.h>

#include "nccl.h"

#define CHECK(cmd)                                                                   \
  do {                                                                               \
    ncclResult_t r = (cmd);                                                          \
    if (r != ncclSuccess) {                                                          \
      fprintf(stderr, "%s failed: %s (%s)\n", #cmd, ncclGetErrorString(r), ncclGetLastError(NULL)); \
      return 1;                                                                      \
    }                                                                                \
  } while (0)

int main(void) {
  /* chorusrun (like torchrun) exports RANK, WORLD_SIZE and NCCL_COMM_ID: with NCCL_COMM_ID set, every
   * rank can make the unique id itself and rank 0 hosts the rendezvous at that address. */
  const char* r = getenv("RANK");
  const char* n = getenv("WORLD_SIZE");
  int rank = r ? atoi(r) : 0, nranks = n ? atoi(n) : 1;

  ncclUniqueId id;
  ncclComm_t comm;
  CHECK(ncclGetUniqueId(&id));
  CHECK(ncclCommInitRank(&comm, nranks, id, rank));

  size_t count = 1 << 20;
  float* buf = malloc(count * sizeof(float));
  for (size_t i = 0; i < count; i++) buf[i] = (float)(rank + 1);

  /* Host memory, NULL stream: the call has finished when it returns. */
  CHECK(ncclAllReduce(buf, buf, count, ncclFloat, ncclSum, comm, NULL));

  float expect = nranks * (nranks + 1) / 2.0f;
  int ok = buf[0] == expect && buf[count - 1] == expect;
  printf("rank %d of %d: buf[0] = %g (expected %g)\n", rank, nranks, buf[0], expect);
  CHECK(ncclCommDestroy(comm));
  free(buf);
  return ok ? 0 : 1;
}
