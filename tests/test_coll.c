/* Collectives on one machine: every collective at every rank count, as threads and as processes, with
 * in-place and out-of-place buffers and counts 0, 1, nranks-1 and 4099 (divisible by nothing useful).
 * Types x ops are crossed in test_coll_types.c, protocols in test_coll_proto.c, point-to-point, groups
 * and streams in test_coll_p2p.c, failures in test_coll_fault.c. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "coll_util.h"
#include "misc/param.h"
#include "runner.h"


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

/* ---- counts above 2^31 elements (suite coll_huge: ~4.3 GB of memory, tens of seconds) ---- */

#define HUGE_COUNT (((size_t)1 << 31) + 64)

struct huge_arg {
  int8_t* buf[2];
};

/* AllReduce inputs: rank r holds base(i) + r; base differs by 17 past 2^31, so data read or written at
 * an offset truncated to 32 bits shows. Sums stay in [-59, 95]. */
static void huge_fill(int8_t* b, int rank) {
  int m = 0;
  for (size_t i = 0; i < HUGE_COUNT; i++) {
    b[i] = (int8_t)(m - 30 + (i >> 31 ? 17 : 0) + rank);
    if ((m += 7) >= 61) m -= 61;
  }
}

static size_t huge_check_sum(const int8_t* b) {
  int m = 0;
  for (size_t i = 0; i < HUGE_COUNT; i++) {
    if (b[i] != (int8_t)(2 * (m - 30 + (i >> 31 ? 17 : 0)) + 1)) return i;
    if ((m += 7) >= 61) m -= 61;
  }
  return HUGE_COUNT;
}

static inline int8_t huge_pattern(size_t i) { return (int8_t)(i * 13 + (i >> 31) * 101 + (i >> 12)); }

static void huge_body(int rank, int nranks, ncclUniqueId id, void* arg) {
  struct huge_arg* h = arg;
  int8_t* b = h->buf[rank];
  ncclComm_t comm = cu_comm_init(rank, nranks, id);
  /* Broadcast in place from rank 1. */
  if (rank == 1) for (size_t i = 0; i < HUGE_COUNT; i++) b[i] = huge_pattern(i);
  else memset(b, 0, HUGE_COUNT);
  NCCL_OK(ncclBroadcast(b, b, HUGE_COUNT, ncclInt8, 1, comm, NULL));
  for (size_t i = 0; i < HUGE_COUNT; i++)
    if (b[i] != huge_pattern(i)) {
      rt_fail(__FILE__, __LINE__, "Broadcast int8 count=2^31+64: element %zu is %d, expected %d", i, b[i], huge_pattern(i));
      break;
    }
  /* AllReduce sum in place. */
  huge_fill(b, rank);
  NCCL_OK(ncclAllReduce(b, b, HUGE_COUNT, ncclInt8, ncclSum, comm, NULL));
  size_t at = huge_check_sum(b);
  if (at != HUGE_COUNT) rt_fail(__FILE__, __LINE__, "AllReduce int8 sum count=2^31+64: element %zu is %d", at, b[at]);
  NCCL_OK(ncclCommDestroy(comm));
}

static long long mem_available_kb(void) {
  FILE* f = fopen("/proc/meminfo", "r");
  if (!f) return -1;
  char line[256];
  long long kb = -1;
  while (fgets(line, sizeof(line), f))
    if (sscanf(line, "MemAvailable: %lld kB", &kb) == 1) break;
  fclose(f);
  return kb;
}

TEST_T(coll_huge, int8_2g_plus_64, 300) {
#if defined(__SANITIZE_THREAD__) || defined(__SANITIZE_ADDRESS__)
  /* The regular build runs it; instrumented, 2 GiB of int8 took 2 minutes of CI's 30. */
  printf("    skipped: 2 GiB buffers are too slow under a sanitizer\n");
  return;
#endif
  long long avail = mem_available_kb();
  if (avail >= 0 && avail < (5ll << 20)) {
    printf("    skipped: needs about 5 GiB of available memory, %lld MiB available\n", avail >> 10);
    return;
  }
  struct huge_arg h = {{malloc(HUGE_COUNT), malloc(HUGE_COUNT)}};
  if (!h.buf[0] || !h.buf[1]) {
    printf("    skipped: cannot allocate 2 x %zu bytes\n", HUGE_COUNT);
    free(h.buf[0]);
    free(h.buf[1]);
    return;
  }
  setenv("NCCL_MIN_NCHANNELS", "1", 1);
  setenv("NCCL_MAX_NCHANNELS", "1", 1);
  param_reset();
  rt_run_threads(2, huge_body, &h);
  free(h.buf[0]);
  free(h.buf[1]);
}

/* ---- teardown right after the last step ---- */

/* With LL the receiver never reads the sender's tail counter, so a receiver may finish, destroy its
 * communicator and free its FIFO while the sender is still publishing its last step into it. Many short
 * lives of a communicator make that window likely; the sanitizer builds (make test-asan) report it. */
static void short_life_body(int rank, int nranks, ncclUniqueId id, void* arg) {
  (void)arg;
  ncclComm_t comm = cu_comm_init(rank, nranks, id);
  struct cu_case c = {CU_ALLREDUCE, ncclFloat32, CU_SUM, 8, 0, 0, 90};
  cu_run_case(comm, &c, NULL);
  NCCL_OK(ncclCommDestroy(comm));
  cu_finish();
}

TEST_T(coll_threads, destroy_after_last_step, 120) {
  cu_force_proto("LL");
  for (int i = 0; i < 200 && rt_failures() == 0; i++) rt_run_threads(2, short_life_body, NULL);
}
