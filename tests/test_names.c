/* The name tables of misc/names.h: every value of every enum has a name, what is printed parses back,
 * the counts and numbers are NCCL's where NCCL has the same enum, and the messages built from the
 * tables read as they did when each file spelled its own names. */
#include <stdio.h>
#include <string.h>

#include "algo/algo.h"
#include "misc/log.h"
#include "misc/names.h"
#include "reduce/reduce.h"
#include "tune/plugin_abi.h"
#include "tune/tune.h"
#include "runner.h"

#define EXPECT_STR(got, want)                                                                       \
  do {                                                                                              \
    const char *g_ = (got), *w_ = (want);                                                           \
    if (!g_ || strcmp(g_, w_))                                                                      \
      rt_fail(__FILE__, __LINE__, "%s: \"%s\", want \"%s\"", #got, g_ ? g_ : "(null)", w_);         \
  } while (0)

static int named(const char* s) { return s && s[0]; }

/* tune_parse of value gives mask `want` at every index (fn < 0) or at fn only (others: everything). */
static void expect_parses(const char* value, int is_algo, int fn, unsigned want) {
  unsigned m[TUNE_NMASK], all = (1u << (is_algo ? TUNE_ALGO_NBITS : CH_NPROTO)) - 1;
  ch_status s = tune_parse(is_algo ? "NCCL_ALGO" : "NCCL_PROTO", value, is_algo, m);
  if (s != CH_OK) {
    rt_fail(__FILE__, __LINE__, "%s: '%s' does not parse: %s", is_algo ? "NCCL_ALGO" : "NCCL_PROTO", value,
            log_last_error());
    return;
  }
  for (int i = 0; i < TUNE_NMASK; i++) {
    unsigned w = fn < 0 || i == fn ? want : all;
    if (m[i] != w) rt_fail(__FILE__, __LINE__, "'%s': mask %d is %#x, want %#x", value, i, m[i], w);
  }
}

/* The same name in lower and upper case. */
static void cases_of(const char* name, char* lo, char* up, size_t cap) {
  size_t i = 0;
  for (; name[i] && i + 1 < cap; i++) {
    char c = name[i];
    lo[i] = c >= 'A' && c <= 'Z' ? (char)(c - 'A' + 'a') : c;
    up[i] = c >= 'a' && c <= 'z' ? (char)(c - 'a' + 'A') : c;
  }
  lo[i] = up[i] = 0;
}

TEST(names, datatypes) {
  EXPECT_EQ(CH_NTYPES, ncclNumTypes);
  for (int t = 0; t < ncclNumTypes; t++) {
    EXPECT(named(ch_type_name(t)));
    EXPECT(named(ch_type_test_name(t)));
    EXPECT(ch_type_bytes(t) > 0);
    EXPECT_EQ(red_type_size(t), ch_type_bytes(t));
    EXPECT_EQ(red_type_is_float(t), ch_type_is_float(t));
    EXPECT_STR(red_type_name(t), ch_type_test_name(t));
    EXPECT_EQ(ch_type_test_parse(ch_type_test_name(t)), t); /* the perf tools' -d */
    for (int u = 0; u < t; u++) /* names tell types apart */
      EXPECT(strcmp(ch_type_name(u), ch_type_name(t)) && strcmp(ch_type_test_name(u), ch_type_test_name(t)));
  }
  EXPECT(!ch_type_name(-1) && !ch_type_name(ncclNumTypes) && !ch_type_test_name(ncclNumTypes));
  EXPECT_EQ(ch_type_test_parse("float17"), -1);
  EXPECT_EQ(ch_type_test_parse("Float"), -1); /* nccl-tests compares exactly */
  EXPECT_STR(red_type_name(ncclFloat16), "half");
  EXPECT_STR(red_type_name(ncclFloat32), "float");
  EXPECT_STR(red_type_name(ncclNumTypes), "invalid");
  EXPECT_STR(ch_type_name(ncclFloat32), "float32");
  EXPECT_STR(ch_type_name(ncclFloat8e4m3), "fp8e4m3");
  EXPECT_STR(ch_type_test_name(ncclFloat8e4m3), "f8e4m3");
  EXPECT_EQ(ch_type_bytes(ncclFloat64), 8);
  EXPECT(!ch_type_is_float(ncclUint64) && ch_type_is_float(ncclBfloat16));
}

TEST(names, reduction_ops) {
  EXPECT_EQ(CH_NOPS, ncclNumOps + 1); /* NCCL's built-in ops, then PreMulSum */
  for (int op = 0; op <= ncclNumOps; op++) {
    EXPECT(named(ch_op_name(op)));
    EXPECT(named(ch_op_test_name(op)));
    EXPECT_EQ(ch_op_test_parse(ch_op_test_name(op)), op); /* the perf tools' -o */
  }
  static const char* const nccl_tests[] = {"sum", "prod", "max", "min", "avg", "mulsum"};
  for (int op = 0; op <= ncclNumOps; op++) EXPECT_STR(ch_op_test_name(op), nccl_tests[op]);
  EXPECT_STR(ch_op_name(ncclSum), "sum");
  EXPECT_STR(ch_op_name(ncclAvg), "avg");
  EXPECT_STR(ch_op_name(ncclNumOps), "premulsum");
  EXPECT_STR(ch_op_name(ncclNumOps + 17), "premulsum"); /* every op ncclRedOpCreatePreMulSum makes */
  EXPECT(!ch_op_name(-1) && !ch_op_test_name(ncclNumOps + 1));
  EXPECT_EQ(ch_op_test_parse("mean"), -1);
}

TEST(names, functions) {
  EXPECT_EQ(CH_NFUNCS, FUNC_COUNT);
  EXPECT_EQ(FUNC_BROADCAST, ncclFuncBroadcast);
  EXPECT_EQ(FUNC_REDUCE, ncclFuncReduce);
  EXPECT_EQ(FUNC_ALLGATHER, ncclFuncAllGather);
  EXPECT_EQ(FUNC_REDUCESCATTER, ncclFuncReduceScatter);
  EXPECT_EQ(FUNC_ALLREDUCE, ncclFuncAllReduce);
  EXPECT_EQ(FUNC_SENDRECV, ncclFuncSendRecv);
  EXPECT_EQ(FUNC_SEND, ncclFuncSend);
  EXPECT_EQ(FUNC_RECV, ncclFuncRecv);
  EXPECT((int)ncclNumFuncs <= (int)FUNC_COUNT);
  for (int f = 0; f < FUNC_COUNT; f++) {
    char api[64];
    EXPECT(named(ch_func_name(f)) && named(ch_func_text(f)));
    EXPECT_STR(tune_func_name(f), ch_func_name(f));
    snprintf(api, sizeof(api), "nccl%s", ch_func_name(f));
    EXPECT_STR(algo_fname(f), api);
    EXPECT_EQ(ch_func_parse(ch_func_name(f), strlen(ch_func_name(f))), f);
  }
  EXPECT_STR(algo_fname(FUNC_ALLREDUCE), "ncclAllReduce");
  EXPECT_STR(algo_fname(FUNC_ALLTOALL), "ncclAlltoAll");
  EXPECT_STR(algo_fname(-1), "?");
  EXPECT_STR(algo_fname(FUNC_COUNT), "?");
  EXPECT_STR(tune_func_name(FUNC_COUNT), "?");
  EXPECT_STR(ch_func_text(FUNC_SENDRECV), "Send/Recv");
  /* The collectives NCCL_ALGO/NCCL_PROTO entries name, in any case; send/recv take no entry. */
  for (int f = 0; f < TUNE_P2P; f++) {
    char v[64], lo[32], up[32];
    cases_of(tune_func_name(f), lo, up, sizeof(lo));
    snprintf(v, sizeof(v), "%s:Ring", tune_func_name(f));
    expect_parses(v, 1, f, 1u << ALGO_RING);
    snprintf(v, sizeof(v), "%s:ring", lo);
    expect_parses(v, 1, f, 1u << ALGO_RING);
    snprintf(v, sizeof(v), " %s : simple", up);
    expect_parses(v, 0, f, 1u << PROTO_SIMPLE);
  }
  unsigned m[TUNE_NMASK];
  EXPECT_EQ(tune_parse("NCCL_ALGO", "send:ring", 1, m), CH_INVALID_USAGE);
  EXPECT(strstr(log_last_error(), "unknown collective 'send' (known: Broadcast, Reduce, AllGather, ReduceScatter, "
                                  "AllReduce)"));
}

TEST(names, algorithms) {
  EXPECT_EQ(CH_NALGO, ALGO_COUNT);
  EXPECT_EQ(CH_NALGO_BITS, TUNE_ALGO_NBITS);
  /* NCCL's algorithms each once, under NCCL's numbers; Chorus's own have none */
  int seen[NCCL_NUM_ALGORITHMS] = {0}, nccl = 0;
  for (int b = 0; b < TUNE_ALGO_NBITS; b++) {
    int id = ch_algo_nccl_id(b);
    if (id < 0) continue;
    ASSERT(id < NCCL_NUM_ALGORITHMS);
    seen[id]++, nccl++;
  }
  EXPECT_EQ(nccl, NCCL_NUM_ALGORITHMS);
  for (int id = 0; id < NCCL_NUM_ALGORITHMS; id++) EXPECT_EQ(seen[id], 1);
  EXPECT_EQ(ALGO_TREE, NCCL_ALGO_TREE);
  EXPECT_EQ(ALGO_RING, NCCL_ALGO_RING);
  EXPECT_EQ(ch_algo_nccl_id(ALGO_TREE), NCCL_ALGO_TREE);
  EXPECT_EQ(ch_algo_nccl_id(ALGO_RING), NCCL_ALGO_RING);
#define NCCL_ONLY_ID_(id, name, num) EXPECT_EQ(num, NCCL_ALGO_##id);
  CH_ALGO_NCCL_ONLY_LIST(NCCL_ONLY_ID_)
#undef NCCL_ONLY_ID_
  for (int b = 0; b < TUNE_ALGO_NBITS; b++) {
    const char* n = tune_bit_name(1, b);
    char lo[32], up[32];
    EXPECT(named(n) && strcmp(n, "?"));
    if (b < ALGO_COUNT) EXPECT_STR(algo_name(b), n);
    /* what logs print is what NCCL_ALGO accepts, NCCL-only names included (never chosen) */
    cases_of(n, lo, up, sizeof(lo));
    expect_parses(n, 1, -1, 1u << b);
    expect_parses(lo, 1, -1, 1u << b);
    expect_parses(up, 1, -1, 1u << b);
  }
  EXPECT_STR(algo_name(ALGO_RABEN), "Rabenseifner");
  EXPECT_STR(algo_name(ALGO_COUNT), "?"); /* NCCL-only bits are no algorithm Chorus runs */
  EXPECT_STR(algo_name(-1), "?");
  EXPECT_STR(tune_bit_name(1, ALGO_COUNT), "CollNetDirect");
  EXPECT_STR(tune_bit_name(1, TUNE_ALGO_NBITS), "?");
  unsigned m[TUNE_NMASK];
  EXPECT_EQ(tune_parse("NCCL_ALGO", "ring,hyper", 1, m), CH_INVALID_USAGE);
  EXPECT(strstr(log_last_error(), "unknown algorithm 'hyper' (known: Tree, Ring, CollNetDirect, CollNetChain, NVLS, "
                                  "NVLSTree, PAT, Exchange, Direct, RecDbl, Rabenseifner, Owner)"));
}

TEST(names, protocols) {
  EXPECT_EQ(CH_NPROTOS, CH_NPROTO);
  EXPECT_EQ(CH_NPROTO, NCCL_NUM_PROTOCOLS);
#define NCCL_PROTO_ID_(id, name) EXPECT_EQ(PROTO_##id, NCCL_PROTO_##id);
  CH_PROTO_LIST(NCCL_PROTO_ID_)
#undef NCCL_PROTO_ID_
  for (int p = 0; p < CH_NPROTO; p++) {
    const char* n = tune_proto_name(p);
    char lo[32], up[32];
    EXPECT(named(n) && strcmp(n, "?"));
    EXPECT_STR(tune_bit_name(0, p), n);
    cases_of(n, lo, up, sizeof(lo));
    expect_parses(n, 0, -1, 1u << p);
    expect_parses(lo, 0, -1, 1u << p);
    expect_parses(up, 0, -1, 1u << p);
  }
  EXPECT_STR(tune_proto_name(PROTO_LL128), "LL128");
  EXPECT_STR(tune_proto_name(CH_NPROTO), "?");
  unsigned m[TUNE_NMASK];
  EXPECT_EQ(tune_parse("NCCL_PROTO", "ll256", 0, m), CH_INVALID_USAGE);
  EXPECT(strstr(log_last_error(), "unknown protocol 'll256' (known: LL, LL128, Simple)"));
}

/* Calls as mismatch reports describe them (algo_call_text), header fields as a peer may send them. */
TEST(names, call_descriptions) {
  struct {
    struct xfer_hdr h;
    const char* want;
  } cases[] = {
      {{.func = FUNC_ALLREDUCE, .count = 1048576, .type = ncclFloat32, .op = ncclSum, .seq = 17},
       "AllReduce(1048576 x float32, sum) #17"},
      {{.func = FUNC_REDUCESCATTER, .count = 4, .type = ncclBfloat16, .op = ncclNumOps + 3, .seq = 2},
       "ReduceScatter(4 x bfloat16, premulsum) #2"},
      {{.func = FUNC_REDUCE, .count = 8, .type = ncclInt8, .op = ncclMax, .root = 1, .seq = 5},
       "Reduce(8 x int8, max, root 1) #5"},
      {{.func = FUNC_BROADCAST, .count = 4, .type = ncclInt32, .root = 1, .seq = 3}, "Broadcast(4 x int32, root 1) #3"},
      {{.func = FUNC_ALLGATHER, .count = 2, .type = ncclFloat8e5m2, .seq = 9}, "AllGather(2 x fp8e5m2) #9"},
      {{.func = FUNC_SENDRECV, .count = 8, .type = ncclFloat32}, "Send/Recv(8 x float32)"},
      {{.func = FUNC_ALLTOALL, .count = 3, .type = ncclUint64}, "AlltoAll(3 x uint64 per rank)"},
      {{.func = FUNC_GATHER, .count = 10, .type = ncclFloat16, .root = 2}, "Gather(10 x float16, root 2)"},
      {{.func = FUNC_SCATTER, .count = 10, .type = 99, .root = 0}, "Scatter(10 x invalid type, root 0)"},
      {{.func = FUNC_SEND, .count = 1, .type = ncclFloat64}, "an unknown call (6)"},
      {{.func = 1000, .count = 1}, "an unknown call (1000)"},
  };
  for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
    char text[128];
    algo_call_text(text, sizeof(text), &cases[i].h);
    EXPECT_STR(text, cases[i].want);
  }
}
