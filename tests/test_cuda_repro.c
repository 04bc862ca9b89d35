/* Reproducible reductions on device buffers of ranks that share one GPU (the stand-in driver): they run
 * on host copies, not in kernels, so they give the bits host buffers give, and ORDER's definition. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "chorus.h"
#include "nccl.h"
#include "cuda_gpu_util.h"
#include "runner.h"

static float inexact(int rank, int i) { /* significands that make any other bracket show */
  uint32_t h = (uint32_t)(rank * 2654435761u) ^ (uint32_t)(i * 40503u);
  h ^= h >> 13, h *= 0x5bd1e995u, h ^= h >> 15;
  return (float)(int32_t)(h & 0xffffff) * (i % 3 ? 1e-3f : 1e3f) * (h & 0x1000000 ? -1.0f : 1.0f);
}

static void repro_body(int rank, int nranks, ncclUniqueId id, void* arg) {
  int level = *(int*)arg;
  cudaStream_t s;
  ncclComm_t comm = open_rank(rank, nranks, id, 0x7000, &s);
  NCCL_OK(chorusCommSetReproducible(comm, level));
  float *a = dev_alloc(N), *b = dev_alloc(N);
  float *ha = malloc(sizeof(float) * N), *hb = malloc(sizeof(float) * N);
  ASSERT(ha && hb);
  for (int i = 0; i < N; i++) a[i] = ha[i] = inexact(rank, i);
  int before = fk.kernels();
  NCCL_OK(ncclAllReduce(a, b, N, ncclFloat32, ncclSum, comm, s));
  ASSERT_EQ(fk.sync(s), 0);
  EXPECT_EQ(fk.kernels(), before); /* staged: the host's combination defines the bits */
  NCCL_OK(ncclAllReduce(ha, hb, N, ncclFloat32, ncclSum, comm, NULL));
  EXPECT(memcmp(b, hb, sizeof(float) * N) == 0);
  /* ... and it is the level that keeps the call off the GPU: the same call on a communicator without
   * one (a split child starts from CHORUS_REPRODUCIBLE, unset) runs a kernel */
  ncclComm_t plain;
  NCCL_OK(ncclCommSplit(comm, 0, rank, &plain, NULL));
  before = fk.kernels();
  NCCL_OK(ncclAllReduce(a, b, N, ncclFloat32, ncclSum, plain, s));
  ASSERT_EQ(fk.sync(s), 0);
  if (rank == 0) EXPECT(fk.kernels() > before); /* between processes rank 0's kernel may do every part */
  NCCL_OK(ncclCommDestroy(plain));
  for (int i = 0; level == chorusReproOrder && i < N; i++) {
    volatile float acc = inexact(0, i);
    for (int r = 1; r < nranks; r++) acc = acc + inexact(r, i);
    EXPECT(memcmp((const void*)&acc, &b[i], 4) == 0);
  }
  NCCL_OK(ncclCommDestroy(comm));
  EXPECT_EQ(fk.free((uintptr_t)a), 0);
  EXPECT_EQ(fk.free((uintptr_t)b), 0);
  free(ha);
  free(hb);
}

/* Threads and processes in tests of their own: the stand-in driver's stream threads do not survive
 * a fork (as with a real driver). */
TEST_T(cuda_repro, device_buffers_give_host_bits_threads, 60) {
  if (no_kernels()) return; /* without kernels every device call is staged: nothing to tell apart */
  load();
  for (int level = chorusReproOrder; level <= chorusReproExact; level++) rt_run_threads(3, repro_body, &level);
}
TEST_T(cuda_repro, device_buffers_give_host_bits_procs, 60) {
  if (no_kernels()) return;
  load();
  for (int level = chorusReproOrder; level <= chorusReproExact; level++) rt_run_procs(2, repro_body, &level);
}
