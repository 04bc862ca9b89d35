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
