/* The scale simulator (tools/sim.c, chorus-sim, docs/SCALE.md): the library's schedules deliver every
 * element exactly once at rank counts the other suites never reach (non-powers of two, several
 * hosts), its trees are tune/trees.c's, and its time model agrees with itself and with the cost
 * model's closed form where both apply. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "comm/comm.h"
#include "misc/param.h"
#include "runner.h"
#include "sim.h"
#include "tune/topo.h"

static int check(int func, int algo, int n, int per_host, size_t count, size_t chunk) {
  struct sim_cfg cfg = {.n = n,
                        .per_host = per_host,
                        .func = func,
                        .algo = algo,
                        .proto = PROTO_SIMPLE,
                        .count = count,
                        .esize = 4,
                        .chunk = chunk,
                        .check = 1,
                        .periodic = -1};
  sim_link_from_model(PROTO_SIMPLE, &cfg.link);
  struct sim_result r;
  if (sim_run(&cfg, &r) != 0) {
    rt_fail(__FILE__, __LINE__, "%s %s on %d ranks: %s", algo_name(algo), algo_fname(func), n, r.why);
    return 0;
  }
  if (!r.ok)
    rt_fail(__FILE__, __LINE__, "%s %s on %d ranks (%d per host, %zu elements, step %zu): %s", algo_name(algo),
            algo_fname(func), n, per_host, count, chunk, r.why);
  return r.ok;
}

TEST(sim, allreduce_delivers_exactly_once) {
  static const int ns[] = {3, 5, 6, 8, 12, 17, 24, 37, 64, 100, 129, 256};
  static const int algos[] = {ALGO_RING, ALGO_RECDBL, ALGO_RABEN, ALGO_TREE};
  for (size_t k = 0; k < sizeof(ns) / sizeof(ns[0]); k++)
    for (int a = 0; a < 4; a++) {
      int n = ns[k];
      /* blocks of every size, a partial last step, and several steps per block */
      check(FUNC_ALLREDUCE, algos[a], n, 8, 8 * (size_t)n + 13, 16);
      check(FUNC_ALLREDUCE, algos[a], n, 3, 3, 8);                   /* fewer elements than ranks */
      check(FUNC_ALLREDUCE, algos[a], n, 1, 40 * (size_t)n + 5, 64); /* one rank per host: trees over ranks */
    }
}

TEST(sim, allgather_reducescatter_deliver_exactly_once) {
  static const int ns[] = {2, 3, 7, 8, 16, 24, 61, 128};
  for (size_t k = 0; k < sizeof(ns) / sizeof(ns[0]); k++) {
    check(FUNC_ALLGATHER, ALGO_RING, ns[k], 8, 37, 16);
    check(FUNC_REDUCESCATTER, ALGO_RING, ns[k], 8, 37, 16);
    check(FUNC_ALLGATHER, ALGO_RING, ns[k], 4, 1, 8);
    check(FUNC_REDUCESCATTER, ALGO_RING, ns[k], 4, 1, 8);
    if ((ns[k] & (ns[k] - 1)) == 0) check(FUNC_ALLGATHER, SIM_ALGO_RDAG, ns[k], 8, 37, 16); /* the what-if */
  }
}

/* The recursive algorithms at a large count of ranks: their steps grow as n log n. */
TEST_T(sim, recursive_algorithms_at_4096_ranks, 180) {
  check(FUNC_ALLREDUCE, ALGO_RECDBL, 4096, 8, 4096 + 40, 1024);
  check(FUNC_ALLREDUCE, ALGO_RABEN, 1024 + 300, 8, 8 * 1024 + 3, 1024); /* every block non-empty */
  check(FUNC_ALLREDUCE, ALGO_RABEN, 4096 + 1000, 8, 100, 16);
  check(FUNC_ALLREDUCE, ALGO_TREE, 4000, 8, 100, 16);
}

/* sim_trees builds, for one rank and in O(1), what comm_build_trees builds at init. */
TEST(sim, trees_are_comm_build_trees) {
  static const int ns[] = {3, 5, 16, 24, 67, 130};
  static const int ph[] = {1, 3, 8};
  unsetenv("CHORUS_TREE_PER_RANK");
  param_reset();
  for (size_t k = 0; k < sizeof(ns) / sizeof(ns[0]); k++)
    for (size_t h = 0; h < sizeof(ph) / sizeof(ph[0]); h++) {
      int n = ns[k], per = ph[h];
      struct ncclComm* c = calloc(1, sizeof(*c));
      ASSERT(c);
      c->peers = calloc((size_t)n, sizeof(*c->peers));
      ASSERT(c->peers);
      c->nranks = n;
      for (int r = 0; r < n; r++) c->peers[r].host_hash = 7 + (uint64_t)(r / per);
      for (int r = 0; r < n; r++) {
        c->rank = r;
        ASSERT(comm_build_trees(c) == CH_OK);
        struct algo_tree t[2];
        int nt, depth;
        sim_trees(n, per, r, t, &nt, &depth);
        EXPECT_EQ(nt, c->ntrees);
        EXPECT_EQ(depth, c->tree_depth);
        for (int i = 0; i < nt && i < c->ntrees; i++) {
          EXPECT_EQ(t[i].up, c->trees[i].up);
          EXPECT_EQ(t[i].ndown, c->trees[i].ndown);
          for (int d = 0; d < t[i].ndown && d < c->trees[i].ndown; d++) EXPECT_EQ(t[i].down[d], c->trees[i].down[d]);
        }
      }
      free(c->peers);
      free(c);
    }
}

static double sim_us(int func, int algo, int n, int per_host, size_t count, int periodic) {
  struct sim_cfg cfg = {.n = n,
                        .per_host = per_host,
                        .func = func,
                        .algo = algo,
                        .proto = PROTO_SIMPLE,
                        .count = count,
                        .esize = 4,
                        .periodic = periodic};
  sim_link_from_model(PROTO_SIMPLE, &cfg.link);
  struct sim_result r;
  ASSERT(sim_run(&cfg, &r) == 0);
  ASSERT(r.ok);
  EXPECT_EQ(r.periodic, periodic > 0);
  return r.us;
}

/* Ring timing for the large counts simulates one host and lets the ring's symmetry give the others;
 * it must give what the whole ring gives. */
TEST(sim, ring_symmetry_gives_the_whole_ring) {
  static const int ns[] = {16, 64, 512};
  static const size_t bytes[] = {8, 1 << 20, 64 << 20};
  for (int k = 0; k < 3; k++)
    for (int b = 0; b < 3; b++) {
      int funcs[3] = {FUNC_ALLREDUCE, FUNC_ALLGATHER, FUNC_REDUCESCATTER};
      for (int f = 0; f < 3; f++) {
        size_t count = funcs[f] == FUNC_ALLREDUCE ? bytes[b] / 4 : bytes[b] / 4 / (size_t)ns[k];
        if (!count) count = 1;
        double whole = sim_us(funcs[f], ALGO_RING, ns[k], 8, count, -1);
        double one = sim_us(funcs[f], ALGO_RING, ns[k], 8, count, 1);
        if (fabs(one - whole) > 0.01 * whole)
          rt_fail(__FILE__, __LINE__, "%s %d ranks %zu B: one host %.3f us, whole ring %.3f us", algo_fname(funcs[f]),
                  ns[k], bytes[b], one, whole);
      }
    }
}

/* Where the cost model's closed form is exact (a ring inside one host, one step per block; recursive
 * doubling on a power of two), the simulation gives it. */
TEST(sim, time_is_the_cost_model_where_both_apply) {
  struct sim_link l;
  sim_link_from_model(PROTO_SIMPLE, &l);
  int n = 8;
  double ring = sim_us(FUNC_ALLREDUCE, ALGO_RING, n, 8, 8 * (size_t)n, -1); /* 8 elements a block */
  double want = 2.0 * (n - 1) * (l.a_intra + 32.0 / l.bw_intra);
  EXPECT(fabs(ring - want) < 1e-6 * want);
  double rd = sim_us(FUNC_ALLREDUCE, ALGO_RECDBL, 16, 1, 2, -1); /* 16 hosts: every hop over the network */
  want = 4 * (l.a_inter + 8.0 / l.bw_inter);
  EXPECT(fabs(rd - want) < 1e-6 * want);
}

/* The check is not vacuous: a doubled contribution, a lost step and a missing premultiplication are
 * each caught, for every algorithm. */
TEST(sim, check_catches_broken_deliveries) {
  static const int algos[] = {ALGO_RING, ALGO_RECDBL, ALGO_RABEN, ALGO_TREE};
  for (int a = 0; a < 4; a++)
    for (int corrupt = 1; corrupt <= 3; corrupt++) {
      struct sim_cfg cfg = {.n = 12,
                            .per_host = 4,
                            .func = FUNC_ALLREDUCE,
                            .algo = algos[a],
                            .proto = PROTO_SIMPLE,
                            .count = 200,
                            .esize = 4,
                            .chunk = 16,
                            .check = 1,
                            .periodic = -1,
                            .corrupt = corrupt};
      sim_link_from_model(PROTO_SIMPLE, &cfg.link);
      struct sim_result r;
      ASSERT(sim_run(&cfg, &r) == 0);
      if (r.ok) rt_fail(__FILE__, __LINE__, "%s: corruption %d went unnoticed", algo_name(algos[a]), corrupt);
    }
  struct sim_cfg cfg = {.n = 9,
                        .per_host = 3,
                        .func = FUNC_REDUCESCATTER,
                        .algo = ALGO_RING,
                        .proto = PROTO_SIMPLE,
                        .count = 20,
                        .esize = 4,
                        .chunk = 8,
                        .check = 1,
                        .periodic = -1,
                        .corrupt = 1};
  sim_link_from_model(PROTO_SIMPLE, &cfg.link);
  struct sim_result r;
  ASSERT(sim_run(&cfg, &r) == 0);
  EXPECT(!r.ok);
  cfg.func = FUNC_ALLGATHER, cfg.corrupt = 2;
  ASSERT(sim_run(&cfg, &r) == 0);
  EXPECT(!r.ok);
}
