/* Each protocol forced with NCCL_PROTO (LL, LL128, Simple): every collective at small and large counts,
 * as threads and as processes. Large counts (1M+7 elements) cross many FIFO slots and, with LL, many
 * more steps than a slot ring holds. */
#include <string.h>

#include "coll_util.h"
#include "comm/work.h"
#include "runner.h"
#include "tune/tune.h"

static const char* protos[] = {"LL", "LL128", "Simple"};
static const int few_types[] = {ncclInt8, ncclFloat16, ncclFloat32, ncclFloat64, ncclBfloat16, ncclFloat8e4m3};
static const int few_ops[] = {CU_SUM, CU_PROD, CU_AVG, CU_PREMUL_DEV};
static const int float_t1[] = {ncclFloat32};
static const int sum1[] = {CU_SUM};

/* Small and medium counts: every type and op on few ranks, fewer on eight (the checks of eight ranks
 * sharing two cores would dominate the suite's time). */
static void proto_small(const char* proto, int nranks, int procs) {
  cu_force_proto(proto);
  struct cu_sweep sw = {.types = few_types, .ntypes = 6, .ops = few_ops, .nops = 4};
  if (nranks <= 3) sw = (struct cu_sweep){.big = {70001}};
  if (procs) rt_run_procs(nranks, cu_sweep_body, &sw);
  else rt_run_threads(nranks, cu_sweep_body, &sw);
}

/* 1M+7 elements through every collective, float sum. */
static void proto_big(const char* proto, int nranks, int procs) {
  cu_force_proto(proto);
  struct cu_sweep sw = {.types = float_t1, .ntypes = 1, .ops = sum1, .nops = 1, .big = {(1u << 20) + 7}, .only_big = 1};
  if (procs) rt_run_procs(nranks, cu_sweep_body, &sw);
  else rt_run_threads(nranks, cu_sweep_body, &sw);
}

#define PROTO_TESTS(p, i)                                                                      \
  TEST_T(coll_proto, p##_threads_2, 60) { proto_small(protos[i], 2, 0); }                      \
  TEST_T(coll_proto, p##_threads_3, 60) { proto_small(protos[i], 3, 0); }                      \
  TEST_T(coll_proto, p##_threads_8, 90) { proto_small(protos[i], 8, 0); }                      \
  TEST_T(coll_proto, p##_procs_3, 90) { proto_small(protos[i], 3, 1); }                        \
  TEST_T(coll_proto, p##_big_threads_3, 120) { proto_big(protos[i], 3, 0); }                   \
  TEST_T(coll_proto, p##_big_procs_4, 120) { proto_big(protos[i], 4, 1); }
PROTO_TESTS(LL, 0)
PROTO_TESTS(LL128, 1)
PROTO_TESTS(Simple, 2)

/* The forced protocol is the one the tuner picks, at every size. */
static void chosen_body(int rank, int nranks, ncclUniqueId id, void* arg) {
  int want = *(const int*)arg;
  ncclComm_t comm = cu_comm_init(rank, nranks, id);
  const size_t sizes[] = {8, 4096, 65536, 1 << 20, 64 << 20};
  for (size_t s = 0; s < sizeof(sizes) / sizeof(sizes[0]); s++) {
    struct tune_choice how = {.proto = -1};
    tune_choose(comm, FUNC_ALLREDUCE, sizes[s], CH_REPRO_OFF, &how);
    int proto = how.proto;
    if (proto != want) rt_fail(__FILE__, __LINE__, "NCCL_PROTO=%s: %zu bytes use protocol %d", cu_proto(), sizes[s], proto);
  }
  NCCL_OK(ncclCommDestroy(comm));
}

TEST_T(coll_proto, forced_is_chosen, 30) {
  const int ids[3] = {PROTO_LL, PROTO_LL128, PROTO_SIMPLE};
  for (int i = 0; i < 3; i++) {
    cu_force_proto(protos[i]);
    rt_run_threads(2, chosen_body, (void*)&ids[i]);
  }
}

/* ---- several channels, small FIFOs ---- */

static void set_env(const char* name, const char* value) {
  if (value) setenv(name, value, 1);
  else unsetenv(name);
}

/* Four rings: each collective is split four ways, so counts 0, 1 and nranks-1 leave channels empty. */
static void channels(int nranks, int procs, const char* proto) {
  set_env("NCCL_MIN_NCHANNELS", "4");
  set_env("NCCL_MAX_NCHANNELS", "4");
  cu_force_proto(proto); /* also re-reads the two above */
  static const int types[] = {ncclFloat32, ncclInt8, ncclFloat16};
  static const int ops[] = {CU_SUM, CU_MAX, CU_AVG};
  /* 1M+7 elements only with the default protocols (LL at that size is covered above, one channel). */
  struct cu_sweep sw = {.types = types, .ntypes = 3, .ops = ops, .nops = 3, .big = {proto ? 0 : (1u << 20) + 7}};
  if (procs) rt_run_procs(nranks, cu_sweep_body, &sw);
  else rt_run_threads(nranks, cu_sweep_body, &sw);
}

TEST_T(coll_proto, channels4_threads_3, 120) { channels(3, 0, NULL); }
TEST_T(coll_proto, channels4_threads_4_LL, 120) { channels(4, 0, "LL"); }
TEST_T(coll_proto, channels4_procs_2, 120) { channels(2, 1, NULL); }

/* FIFOs of a few KiB: every collective takes many steps around an 8-slot ring. */
static void small_fifos(int nranks, int procs, const char* proto) {
  set_env("NCCL_BUFFSIZE", "16384");
  set_env("NCCL_LL_BUFFSIZE", "4096");
  set_env("NCCL_LL128_BUFFSIZE", "16384");
  cu_force_proto(proto);
  static const int types[] = {ncclFloat64, ncclUint8, ncclBfloat16};
  static const int ops[] = {CU_SUM, CU_PREMUL_HOST};
  struct cu_sweep sw = {.types = types, .ntypes = 3, .ops = ops, .nops = 2, .big = {100003}};
  if (procs) rt_run_procs(nranks, cu_sweep_body, &sw);
  else rt_run_threads(nranks, cu_sweep_body, &sw);
}

TEST_T(coll_proto, small_fifos_LL_threads_3, 120) { small_fifos(3, 0, "LL"); }
TEST_T(coll_proto, small_fifos_LL128_threads_3, 120) { small_fifos(3, 0, "LL128"); }
TEST_T(coll_proto, small_fifos_Simple_procs_3, 120) { small_fifos(3, 1, "Simple"); }

/* Streaming stores forced for every result (CHORUS_STREAM_MIN_BYTES=1): every type and op, odd counts
 * (unaligned step ends), in-place and out-of-place, through each algorithm's final writes. */
static void streamed(int nranks, int procs) {
  setenv("CHORUS_STREAM_MIN_BYTES", "1", 1);
  cu_force_proto(NULL);
  struct cu_sweep sw = {.types = few_types, .ntypes = 6, .ops = few_ops, .nops = 4, .big = {70001}};
  if (procs) rt_run_procs(nranks, cu_sweep_body, &sw);
  else rt_run_threads(nranks, cu_sweep_body, &sw);
}
TEST_T(coll_proto, streaming_stores_threads_3, 90) { streamed(3, 0); }
TEST_T(coll_proto, streaming_stores_procs_2, 90) { streamed(2, 1); }
