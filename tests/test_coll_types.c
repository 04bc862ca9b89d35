/* Every collective x every type x every reduction op (sum, prod, max, min, avg, PreMulSum with a host
 * and a "device" scalar), at every rank count as threads; a smaller cross as processes. Inputs are small
 * integers chosen so that every partial result is exact in the type (coll_util.c), so results are
 * checked for equality, fp8 included. */
#include "coll_util.h"
#include "runner.h"

#define TYPES_THREADS(n, to)                                                     \
  TEST_T(coll_types, threads_##n, to) {                                          \
    struct cu_sweep sw = {0};                                                    \
    rt_run_threads(n, cu_sweep_body, &sw);                                       \
  }
TYPES_THREADS(1, 60)
TYPES_THREADS(2, 60)
TYPES_THREADS(3, 60)
TYPES_THREADS(4, 90)
TYPES_THREADS(5, 90)
TYPES_THREADS(7, 120)
TYPES_THREADS(8, 120)

/* The full cross as processes (shared-memory FIFOs) at a few sizes. */
#define TYPES_PROCS(n, to)                                                       \
  TEST_T(coll_types, procs_##n, to) {                                            \
    struct cu_sweep sw = {0};                                                    \
    rt_run_procs(n, cu_sweep_body, &sw);                                         \
  }
TYPES_PROCS(2, 60)
TYPES_PROCS(3, 60)
TYPES_PROCS(5, 90)
TYPES_PROCS(8, 120)

/* PreMulSum op numbers are each rank's own: rank 0 made another op first, so the same call carries
 * number 6 there and 5 on rank 1. Through FIFOs (Direct off) this was taken for a mismatch. */
static void premul_numbers_body(int rank, int nranks, ncclUniqueId id, void* arg) {
  (void)arg;
  ncclComm_t comm;
  NCCL_OK(ncclCommInitRank(&comm, nranks, id, rank));
  float two = 2, three = 3, buf[64];
  ncclRedOp_t extra, op;
  if (rank == 0) NCCL_OK(ncclRedOpCreatePreMulSum(&extra, &three, ncclFloat32, ncclScalarHostImmediate, comm));
  NCCL_OK(ncclRedOpCreatePreMulSum(&op, &two, ncclFloat32, ncclScalarHostImmediate, comm));
  for (int rep = 0; rep < 3; rep++) { /* the repeats reuse the first call's plan */
    for (int i = 0; i < 64; i++) buf[i] = (float)(rank + 1);
    NCCL_OK(ncclAllReduce(buf, buf, 64, ncclFloat32, op, comm, NULL));
    for (int i = 0; i < 64; i++) EXPECT(buf[i] == (float)(nranks * (nranks + 1)));
  }
  NCCL_OK(ncclRedOpDestroy(op, comm));
  if (rank == 0) NCCL_OK(ncclRedOpDestroy(extra, comm));
  NCCL_OK(ncclCommDestroy(comm));
}
TEST_T(coll_types, premulsum_numbers_differ_across_ranks, 60) {
  setenv("CHORUS_DIRECT_MIN_BYTES", "-1", 1);
  rt_run_both(3, premul_numbers_body, NULL);
}
