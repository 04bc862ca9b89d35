/* Each algorithm forced with NCCL_ALGO gives Ring's results (closed form, inputs that make sums exact)
 * for every collective it serves, nranks 1..16 as threads and as processes; with several FIFO steps
 * per call (small FIFOs, large counts) and every protocol; all ranks bit-identical on inexact inputs;
 * and a group that mixes it with send/recv on the same connections still right (it runs Ring then). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "coll_util.h"
#include "misc/param.h"
#include "runner.h"

static const int all_ops[] = {CU_SUM, CU_PROD, CU_MAX, CU_MIN, CU_AVG, CU_PREMUL_HOST, CU_PREMUL_DEV};
static const int few_types[] = {ncclInt8, ncclUint32, ncclFloat16, ncclFloat32, ncclFloat64, ncclBfloat16};
static const int float_t1[] = {ncclFloat32};
static const int sum1[] = {CU_SUM};

static void set_env(const char* name, const char* value) {
  if (value) setenv(name, value, 1);
  else unsetenv(name);
}

/* NCCL_ALGO=allreduce:<algo> and the protocol, for communicators created afterwards. */
static void force(const char* algo, const char* proto) {
  char v[64];
  snprintf(v, sizeof(v), "allreduce:%s", algo);
  set_env("NCCL_ALGO", v);
  cu_force_proto(proto); /* re-reads the parameters */
}

static void run(int nranks, int procs, struct cu_sweep* sw) {
  if (procs) rt_run_procs(nranks, cu_sweep_body, sw);
  else rt_run_threads(nranks, cu_sweep_body, sw);
}

/* Every type and op at counts 0, 1, n-1, 4099 and one that takes several steps. */
static void sweep(const char* algo, int nranks, int procs) {
  force(algo, NULL);
  struct cu_sweep sw = {.colls = 1u << CU_ALLREDUCE, .types = few_types, .ntypes = 6, .ops = all_ops, .nops = 7,
                        .big = {70001}};
  if (nranks > 8) sw.types = float_t1, sw.ntypes = 1; /* 16 ranks on two cores: keep it short */
  run(nranks, procs, &sw);
}

#define ALGO_N(a, n)                                                     \
  TEST_T(coll_algo, a##_threads_##n, 90) { sweep(#a, n, 0); }
#define ALGO_P(a, n)                                                     \
  TEST_T(coll_algo, a##_procs_##n, 120) { sweep(#a, n, 1); }

ALGO_N(RecDbl, 1)
ALGO_N(RecDbl, 2)
ALGO_N(RecDbl, 3)
ALGO_N(RecDbl, 4)
ALGO_N(RecDbl, 5)
ALGO_N(RecDbl, 6)
ALGO_N(RecDbl, 7)
ALGO_N(RecDbl, 8)
ALGO_N(RecDbl, 9)
ALGO_N(RecDbl, 11)
ALGO_N(RecDbl, 12)
ALGO_N(RecDbl, 13)
ALGO_N(RecDbl, 16)
ALGO_P(RecDbl, 2)
ALGO_P(RecDbl, 3)
ALGO_P(RecDbl, 5)
ALGO_P(RecDbl, 8)
ALGO_P(RecDbl, 12)
ALGO_P(RecDbl, 16)

/* Each protocol, with small FIFOs: 1M+7 floats cross hundreds of steps. */
static void protos(const char* algo, int nranks, int procs) {
  set_env("NCCL_BUFFSIZE", "32768");
  set_env("NCCL_LL_BUFFSIZE", "32768");
  set_env("NCCL_LL128_BUFFSIZE", "32768");
  static const char* names[] = {"LL", "LL128", "Simple"};
  for (int p = 0; p < 3; p++) {
    force(algo, names[p]);
    struct cu_sweep sw = {.colls = 1u << CU_ALLREDUCE, .types = float_t1, .ntypes = 1, .ops = sum1, .nops = 1,
                          .big = {(1u << 20) + 7}, .only_big = 1};
    run(nranks, procs, &sw);
  }
}
TEST_T(coll_algo, RecDbl_protocols_threads_5, 120) { protos("RecDbl", 5, 0); }
TEST_T(coll_algo, RecDbl_protocols_procs_4, 120) { protos("RecDbl", 4, 1); }

/* Inexact float inputs: every rank must hold the same bits (checked through an AllGather of results). */
static void identical_body(int rank, int nranks, ncclUniqueId id, void* arg) {
  (void)arg;
  ncclComm_t comm = cu_comm_init(rank, nranks, id);
  const size_t count = 3001;
  float* x = malloc(count * sizeof(float));
  float* all = malloc(count * sizeof(float) * (size_t)nranks);
  for (size_t i = 0; i < count; i++) x[i] = (float)sin(0.37 * (double)(i + 1) * (rank + 1)) * 1e3f / (float)(i + 3);
  NCCL_OK(ncclAllReduce(x, x, count, ncclFloat32, ncclSum, comm, NULL));
  /* The gather runs Ring (NCCL_ALGO names only allreduce); its copies are exact. */
  NCCL_OK(ncclAllGather(x, all, count, ncclFloat32, comm, NULL));
  for (int r = 0; r < nranks; r++)
    if (memcmp(all + (size_t)r * count, x, count * sizeof(float)) != 0) {
      rt_fail(__FILE__, __LINE__, "rank %d: rank %d's AllReduce result differs from mine (%s)", rank, r,
              param_str(PARAM_ALGO));
      break;
    }
  free(x);
  free(all);
  NCCL_OK(ncclCommDestroy(comm));
}

TEST_T(coll_algo, RecDbl_bit_identical, 120) {
  force("RecDbl", NULL);
  rt_run_threads(6, identical_body, NULL);
  rt_run_procs(7, identical_body, NULL);
}

/* A group with the collective and a send/recv ring shift on the same communicator. */
static void mixed_body(int rank, int nranks, ncclUniqueId id, void* arg) {
  (void)arg;
  ncclComm_t comm = cu_comm_init(rank, nranks, id);
  const size_t count = 1000;
  float *a = malloc(count * 4), *s = malloc(count * 4), *r = malloc(count * 4);
  for (size_t i = 0; i < count; i++) a[i] = (float)(i % 7 + rank), s[i] = (float)(rank * 1000 + i % 100);
  NCCL_OK(ncclGroupStart());
  NCCL_OK(ncclAllReduce(a, a, count, ncclFloat32, ncclSum, comm, NULL));
  NCCL_OK(ncclSend(s, count, ncclFloat32, (rank + 1) % nranks, comm, NULL));
  NCCL_OK(ncclRecv(r, count, ncclFloat32, (rank + nranks - 1) % nranks, comm, NULL));
  NCCL_OK(ncclAllReduce(a, a, count, ncclFloat32, ncclSum, comm, NULL));
  NCCL_OK(ncclGroupEnd());
  int from = (rank + nranks - 1) % nranks;
  for (size_t i = 0; i < count; i++) {
    double once = (double)(i % 7) * nranks + (double)nranks * (nranks - 1) / 2;
    if (a[i] != (float)(once * nranks) || r[i] != (float)(from * 1000 + i % 100)) {
      rt_fail(__FILE__, __LINE__, "rank %d element %zu: AllReduce twice %g (want %g), recv %g (want %d)", rank, i,
              a[i], once * nranks, r[i], (int)(from * 1000 + i % 100));
      break;
    }
  }
  free(a), free(s), free(r);
  NCCL_OK(ncclCommDestroy(comm));
}

TEST_T(coll_algo, RecDbl_group_with_send_recv, 60) {
  force("RecDbl", NULL);
  rt_run_threads(5, mixed_body, NULL);
  rt_run_procs(4, mixed_body, NULL);
}
