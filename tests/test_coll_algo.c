/* Each algorithm forced with NCCL_ALGO (Tree: AllReduce, Broadcast and Reduce) gives Ring's results (closed form, inputs that make sums exact)
 * for every collective it serves, nranks 1..16 as threads and as processes; with several FIFO steps
 * per call (small FIFOs, large counts) and every protocol; all ranks bit-identical on inexact inputs;
 * and a group that mixes it with send/recv on the same connections still right (it runs Ring then). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "coll_util.h"
#include "tune/topo.h"
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

/* NCCL_ALGO=allreduce:<algo> (for Tree also Broadcast and Reduce) and the protocol, for communicators
 * created afterwards. */
static void force(const char* algo, const char* proto) {
  char v[64];
  snprintf(v, sizeof(v), "allreduce:%s%s", algo, strcmp(algo, "Tree") ? "" : ";broadcast:Tree;reduce:Tree");
  set_env("NCCL_ALGO", v);
  cu_force_proto(proto); /* re-reads the parameters */
}

/* The collectives an algorithm serves. */
static unsigned served(const char* algo) {
  return 1u << CU_ALLREDUCE | (strcmp(algo, "Tree") ? 0 : 1u << CU_BROADCAST | 1u << CU_BCAST | 1u << CU_REDUCE);
}

static void run(int nranks, int procs, struct cu_sweep* sw) {
  if (procs) rt_run_procs(nranks, cu_sweep_body, sw);
  else rt_run_threads(nranks, cu_sweep_body, sw);
}

/* Every type and op at counts 0, 1, n-1, 4099 and one that takes several steps. */
static void sweep(const char* algo, int nranks, int procs) {
  force(algo, NULL);
  struct cu_sweep sw = {.colls = served(algo), .types = few_types, .ntypes = 6, .ops = all_ops, .nops = 7,
                        .big = {70001}};
  if (nranks > 8) sw.types = float_t1, sw.ntypes = 1; /* 16 ranks on two cores: keep it short */
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
  /* 3-10x slower under a sanitizer: one type of each kernel family, the ops that take other paths */
  static const int san_types[] = {ncclFloat32, ncclInt8, ncclBfloat16};
  static const int san_ops[] = {CU_SUM, CU_AVG, CU_PREMUL_DEV};
  sw.types = san_types, sw.ntypes = nranks > 8 ? 1 : 3, sw.ops = san_ops, sw.nops = 3;
#endif
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

ALGO_N(Rabenseifner, 1)
ALGO_N(Rabenseifner, 2)
ALGO_N(Rabenseifner, 3)
ALGO_N(Rabenseifner, 4)
ALGO_N(Rabenseifner, 5)
ALGO_N(Rabenseifner, 6)
ALGO_N(Rabenseifner, 7)
ALGO_N(Rabenseifner, 8)
ALGO_N(Rabenseifner, 10)
ALGO_N(Rabenseifner, 15)
ALGO_N(Rabenseifner, 16)
ALGO_P(Rabenseifner, 2)
ALGO_P(Rabenseifner, 3)
ALGO_P(Rabenseifner, 6)
ALGO_P(Rabenseifner, 11)
ALGO_P(Rabenseifner, 16)

/* Tree: on one host the trees are a chain; CHORUS_TREE_PER_RANK=1 makes every rank a node of the double
 * binary tree, which exercises the trees between hosts over shared memory and threads. */
static void tree_sweep(int per_rank, int nranks, int procs) {
  set_env("CHORUS_TREE_PER_RANK", per_rank ? "1" : NULL);
  sweep("Tree", nranks, procs);
}
#define TREE_N(n) TEST_T(coll_algo, Tree_threads_##n, 90) { tree_sweep(1, n, 0); }
#define TREE_P(n) TEST_T(coll_algo, Tree_procs_##n, 120) { tree_sweep(1, n, 1); }
TREE_N(1)
TREE_N(2)
TREE_N(3)
TREE_N(4)
TREE_N(5)
TREE_N(6)
TREE_N(7)
TREE_N(8)
TREE_N(10)
TREE_N(13)
TREE_N(16)
TREE_P(2)
TREE_P(3)
TREE_P(6)
TREE_P(9)
TREE_P(16)
TEST_T(coll_algo, Tree_chain_threads_5, 90) { tree_sweep(0, 5, 0); }
TEST_T(coll_algo, Tree_chain_procs_4, 90) { tree_sweep(0, 4, 1); }

/* Tree Reduce: ranks other than the root may pass no recvbuff (NCCL allows it); interior ranks keep
 * their partial results in the communicator's scratch. Several FIFO steps (small FIFOs). */
static void reduce_null_body(int rank, int nranks, ncclUniqueId id, void* arg) {
  (void)arg;
  ncclComm_t comm = cu_comm_init(rank, nranks, id);
  const size_t count = 100003;
  int32_t* in = malloc(count * sizeof(int32_t));
  int32_t* out = malloc(count * sizeof(int32_t));
  for (int root = 0; root < nranks; root += 3) {
    for (size_t i = 0; i < count; i++) in[i] = (int32_t)(i % 1000) * (rank + 1);
    NCCL_OK(ncclReduce(in, rank == root ? out : NULL, count, ncclInt32, ncclSum, root, comm, NULL));
    if (rank != root) continue;
    for (size_t i = 0; i < count; i++)
      if (out[i] != (int32_t)(i % 1000) * nranks * (nranks + 1) / 2) {
        rt_fail(__FILE__, __LINE__, "root %d element %zu: %d", root, i, out[i]);
        break;
      }
  }
  free(in), free(out);
  NCCL_OK(ncclCommDestroy(comm));
}

TEST_T(coll_algo, Tree_reduce_without_recvbuff, 90) {
  set_env("CHORUS_TREE_PER_RANK", "1");
  set_env("NCCL_BUFFSIZE", "65536");
  force("Tree", NULL);
  rt_run_threads(7, reduce_null_body, NULL);
  rt_run_procs(6, reduce_null_body, NULL);
}

/* Processes claiming hosts (NCCL_HOSTID), talking over the network transport: binary trees between
 * hosts and a chain inside each. 6 ranks on hosts a a b b c c, 5 on a b a b c. */
static void hosts_body(int rank, int nranks, ncclUniqueId id, void* arg) {
  char h[32];
  snprintf(h, sizeof(h), "algo-test-host-%d", nranks == 6 ? rank / 2 : (rank == 4 ? 2 : rank % 2));
  set_env("NCCL_HOSTID", h);
  param_reset();
  cu_sweep_body(rank, nranks, id, arg);
}

static void across_hosts(const char* algo) {
  force(algo, NULL);
  struct cu_sweep sw = {.colls = served(algo), .types = float_t1, .ntypes = 1, .ops = all_ops, .nops = 7,
                        .big = {70001}};
  rt_run_procs(6, hosts_body, &sw);
  rt_run_procs(5, hosts_body, &sw);
}
TEST_T(coll_algo, Tree_across_hosts, 180) { across_hosts("Tree"); }
TEST_T(coll_algo, RecDbl_across_hosts, 180) { across_hosts("RecDbl"); }
TEST_T(coll_algo, Rabenseifner_across_hosts, 180) { across_hosts("Rabenseifner"); }

/* The trees themselves: each node but the root has a parent that lists it as a child, every node is
 * reached from the root, and (n even, NCCL's mirror) no node has children in both trees. */
TEST(coll_algo, double_binary_tree_shape) {
  for (int n = 1; n <= 64; n++) {
    int interior[2][64] = {{0}};
    for (int t = 0; t < 2; t++) {
      int roots = 0, reached = 0;
      for (int r = 0; r < n; r++) {
        int up, d[2];
        topo_dtree(n, r, t, &up, &d[0], &d[1]);
        interior[t][r] = d[0] >= 0 || d[1] >= 0;
        if (up < 0) {
          roots++;
          continue;
        }
        int u2, c[2];
        topo_dtree(n, up, t, &u2, &c[0], &c[1]);
        if (c[0] != r && c[1] != r) rt_fail(__FILE__, __LINE__, "n=%d tree %d: %d's parent %d does not list it", n, t, r, up);
      }
      /* walk up from every node: reaches the root within n hops */
      for (int r = 0; r < n; r++) {
        int x = r, hops = 0, up = 0, a, b;
        while (hops <= n) {
          topo_dtree(n, x, t, &up, &a, &b);
          if (up < 0) break;
          x = up, hops++;
        }
        reached += hops <= n;
      }
      EXPECT_EQ(roots, 1);
      EXPECT_EQ(reached, n);
    }
    for (int r = 0; n % 2 == 0 && r < n; r++)
      if (interior[0][r] && interior[1][r]) rt_fail(__FILE__, __LINE__, "n=%d: node %d has children in both trees", n, r);
  }
}

/* Each protocol, with small FIFOs: 1M+7 floats cross hundreds of steps. */
static void protos(const char* algo, int nranks, int procs) {
  set_env("NCCL_BUFFSIZE", "32768");
  set_env("NCCL_LL_BUFFSIZE", "32768");
  set_env("NCCL_LL128_BUFFSIZE", "32768");
  static const char* names[] = {"LL", "LL128", "Simple"};
  for (int p = 0; p < 3; p++) {
    force(algo, names[p]);
    struct cu_sweep sw = {.colls = served(algo), .types = float_t1, .ntypes = 1, .ops = sum1, .nops = 1,
                          .big = {(1u << 20) + 7}, .only_big = 1};
    run(nranks, procs, &sw);
  }
}
TEST_T(coll_algo, RecDbl_protocols_threads_5, 120) { protos("RecDbl", 5, 0); }
TEST_T(coll_algo, RecDbl_protocols_procs_4, 120) { protos("RecDbl", 4, 1); }
TEST_T(coll_algo, Rabenseifner_protocols_threads_6, 120) { protos("Rabenseifner", 6, 0); }
TEST_T(coll_algo, Rabenseifner_protocols_procs_3, 120) { protos("Rabenseifner", 3, 1); }
TEST_T(coll_algo, Tree_protocols_threads_5, 120) {
  set_env("CHORUS_TREE_PER_RANK", "1");
  protos("Tree", 5, 0);
}
TEST_T(coll_algo, Tree_protocols_procs_4, 120) {
  set_env("CHORUS_TREE_PER_RANK", "1");
  protos("Tree", 4, 1);
}

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

/* Threads, then processes, with `algo` forced (Tree: every rank a node of its trees). */
static void run_algo(const char* algo, rt_rank_fn body, int nthreads, int nprocs) {
  set_env("CHORUS_TREE_PER_RANK", strcmp(algo, "Tree") ? NULL : "1");
  force(algo, NULL);
  rt_run_threads(nthreads, body, NULL);
  rt_run_procs(nprocs, body, NULL);
}

TEST_T(coll_algo, RecDbl_bit_identical, 120) { run_algo("RecDbl", identical_body, 6, 7); }
TEST_T(coll_algo, Rabenseifner_bit_identical, 120) { run_algo("Rabenseifner", identical_body, 6, 5); }
TEST_T(coll_algo, Tree_bit_identical, 120) { run_algo("Tree", identical_body, 6, 7); }

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

TEST_T(coll_algo, RecDbl_group_with_send_recv, 60) { run_algo("RecDbl", mixed_body, 5, 4); }
TEST_T(coll_algo, Rabenseifner_group_with_send_recv, 60) { run_algo("Rabenseifner", mixed_body, 5, 4); }
TEST_T(coll_algo, Tree_group_with_send_recv, 60) { run_algo("Tree", mixed_body, 5, 4); }
