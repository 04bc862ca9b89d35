/* Collectives on one machine: every collective at every rank count, as threads and as processes, with
 * in-place and out-of-place buffers and counts 0, 1, nranks-1 and 4099 (divisible by nothing useful).
 * Types x ops are crossed in test_coll_types.c, protocols in test_coll_proto.c, point-to-point, groups
 * and streams in test_coll_p2p.c, failures in test_coll_fault.c. */
#include <string.h>

#include "coll_util.h"
#include "runner.h"

/* coll_util.c is not one of the test_*.c files CMake collects; it is compiled as part of this one. */
#include "coll_util.c"

static const int float_t1[] = {ncclFloat32};
static const int sum_avg[] = {CU_SUM, CU_AVG};

/* Every collective, float sum and avg, threads. */
#define ALL_COLLS_THREADS(n)                                                     \
  TEST_T(coll_threads, all_colls_##n, 60) {                                      \
    struct cu_sweep sw = {.types = float_t1, .ntypes = 1, .ops = sum_avg, .nops = 2}; \
    rt_run_threads(n, cu_sweep_body, &sw);                                       \
  }
ALL_COLLS_THREADS(1)
ALL_COLLS_THREADS(2)
ALL_COLLS_THREADS(3)
ALL_COLLS_THREADS(4)
ALL_COLLS_THREADS(5)
ALL_COLLS_THREADS(7)
ALL_COLLS_THREADS(8)

/* The same as processes over shared memory. */
#define ALL_COLLS_PROCS(n)                                                       \
  TEST_T(coll_procs, all_colls_##n, 60) {                                        \
    struct cu_sweep sw = {.types = float_t1, .ntypes = 1, .ops = sum_avg, .nops = 2}; \
    rt_run_procs(n, cu_sweep_body, &sw);                                         \
  }
ALL_COLLS_PROCS(1)
ALL_COLLS_PROCS(2)
ALL_COLLS_PROCS(3)
ALL_COLLS_PROCS(4)
ALL_COLLS_PROCS(5)
ALL_COLLS_PROCS(7)
ALL_COLLS_PROCS(8)
