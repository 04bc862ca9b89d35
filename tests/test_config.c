/* ncclConfig_t from every NCCL header 2.19..2.31 (api/config.c): each field is read only when the
 * caller's version has it and it lies within the caller's size; a wrong magic, an impossible size or
 * version, or an out-of-range value is refused with a WARN naming it; maxP2pPeers caps the per-peer
 * pool (NCCL_P2P_MAX_PEERS over it, as in NCCL), minCTAs/maxCTAs bound the channels, commName names
 * the communicator. ncclCollConfig_t (2.31) is checked the same way; its algSelection chooses the
 * call's algorithm and protocol (or is refused / falls back), its userProfilerTag is recorded. */
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "chorus.h"

#include "algo/algo.h"
#include "api/api.h"
#include "comm/comm.h"
#include "misc/param.h"
#include "observe/observe.h"
#include "tune/tune.h"
#include "runner.h"

/* Each header's struct: the version its initializer writes and sizeof on LP64. */
static const struct {
  unsigned version;
  size_t size;
  const char* last; /* its last field */
} headers[] = {
    {NCCL_VERSION(2, 14, 3), 24, "blocking"},           {NCCL_VERSION(2, 17, 1), 40, "netName"},
    {NCCL_VERSION(2, 19, 3), 48, "splitShare"},         {NCCL_VERSION(2, 25, 1), 48, "splitShare"},
    {NCCL_VERSION(2, 26, 2), 48, "trafficClass"},       {NCCL_VERSION(2, 27, 3), 72, "nvlsCTAs"},
    {NCCL_VERSION(2, 28, 9), 80, "nvlinkCentricSched"}, {NCCL_VERSION(2, 29, 7), 88, "numRmaCtx"},
    {NCCL_VERSION(2, 30, 3), 96, "maxP2pPeers"},        {NCCL_VERSION(2, 30, 7), 96, "graphStreamOrdering"},
    {NCCL_VERSION(2, 31, 2), 112, "hostCftMode"},
};

/* A config as that header's program would build it: fields it has set to valid non-default values,
 * everything past its fields (padding included) filled with a value no field accepts. */
static void make(ncclConfig_t* c, unsigned version, size_t size) {
  memset(c, 0x7b, sizeof(*c)); /* 0x7b7b7b7b: out of range for every checked field */
  c->size = size;
  c->magic = NCCL_API_MAGIC;
  c->version = version;
  c->blocking = 1;
  c->cgaClusterSize = 2;
  c->minCTAs = 1;
  c->maxCTAs = 2;
  c->netName = NULL;
  if (size >= 44) c->splitShare = 0;
  if (version >= NCCL_VERSION(2, 26, 0)) c->trafficClass = 5;
  if (version >= NCCL_VERSION(2, 27, 0)) {
    c->commName = "cfg";
    c->collnetEnable = 0, c->CTAPolicy = NCCL_CTA_POLICY_ZERO, c->shrinkShare = 0, c->nvlsCTAs = 3;
  }
  if (version >= NCCL_VERSION(2, 28, 0)) c->nChannelsPerNetPeer = 4, c->nvlinkCentricSched = 0;
  if (version >= NCCL_VERSION(2, 29, 0)) c->graphUsageMode = 1, c->numRmaCtx = 2;
  if (version >= NCCL_VERSION(2, 30, 0)) c->maxP2pPeers = 6;
  if (version >= NCCL_VERSION(2, 30, 5)) c->graphStreamOrdering = 0;
  if (version >= NCCL_VERSION(2, 31, 0))
    c->launchOrderImplicit = 1, c->numRmaSig = 2, c->rmaEagerInit = 1, c->hostCftMode = ncclHostCftDisable;
}

TEST(config, every_header_version) {
  for (size_t i = 0; i < sizeof(headers) / sizeof(headers[0]); i++) {
    ncclConfig_t c, out;
    unsigned v = headers[i].version;
    make(&c, v, headers[i].size);
    if (comm_parse_config(&c, &out) != CH_OK) {
      rt_fail(__FILE__, __LINE__, "version %u size %zu refused: %s", v, headers[i].size, ncclGetLastError(NULL));
      continue;
    }
    EXPECT_EQ(out.blocking, 1);
    EXPECT_EQ(out.cgaClusterSize, v >= NCCL_VERSION(2, 17, 0) ? 2 : NCCL_CONFIG_UNDEF_INT);
    EXPECT_EQ(out.maxCTAs, v >= NCCL_VERSION(2, 17, 0) ? 2 : NCCL_CONFIG_UNDEF_INT);
    EXPECT_EQ(out.splitShare, headers[i].size >= 44 ? 0 : NCCL_CONFIG_UNDEF_INT);
    /* Padding of older headers (trafficClass before 2.26, graphStreamOrdering in 2.30.3) is not read. */
    EXPECT_EQ(out.trafficClass, v >= NCCL_VERSION(2, 26, 0) ? 5 : NCCL_CONFIG_UNDEF_INT);
    EXPECT(v >= NCCL_VERSION(2, 27, 0) ? out.commName && !strcmp(out.commName, "cfg") : out.commName == NULL);
    EXPECT_EQ(out.nvlsCTAs, v >= NCCL_VERSION(2, 27, 0) ? 3 : NCCL_CONFIG_UNDEF_INT);
    EXPECT_EQ(out.nChannelsPerNetPeer, v >= NCCL_VERSION(2, 28, 0) ? 4 : NCCL_CONFIG_UNDEF_INT);
    EXPECT_EQ(out.numRmaCtx, v >= NCCL_VERSION(2, 29, 0) ? 2 : NCCL_CONFIG_UNDEF_INT);
    EXPECT_EQ(out.maxP2pPeers, v >= NCCL_VERSION(2, 30, 0) ? 6 : NCCL_CONFIG_UNDEF_INT);
    EXPECT_EQ(out.graphStreamOrdering, v >= NCCL_VERSION(2, 30, 5) ? 0 : NCCL_CONFIG_UNDEF_INT);
    EXPECT_EQ(out.hostCftMode, v >= NCCL_VERSION(2, 31, 0) ? (int)ncclHostCftDisable : NCCL_CONFIG_UNDEF_INT);
  }
}

/* A newer version in a smaller struct (a program's own partial copy): only what the size covers. */
TEST(config, size_limits_what_is_read) {
  ncclConfig_t c, out;
  make(&c, NCCL_VERSION(2, 31, 2), offsetof(ncclConfig_t, blocking) + sizeof(int));
  ASSERT(comm_parse_config(&c, &out) == CH_OK);
  EXPECT_EQ(out.blocking, 1);
  EXPECT_EQ(out.cgaClusterSize, NCCL_CONFIG_UNDEF_INT);
  EXPECT_EQ(out.maxP2pPeers, NCCL_CONFIG_UNDEF_INT);
  EXPECT(out.commName == NULL);
}

static void expect_refused(ncclConfig_t* c, const char* name) {
  ncclConfig_t out;
  EXPECT_EQ(comm_parse_config(c, &out), CH_INVALID_ARG);
  const char* e = ncclGetLastError(NULL);
  if (!strstr(e, name)) rt_fail(__FILE__, __LINE__, "the WARN does not name %s: \"%s\"", name, e);
}

TEST(config, refused_by_name) {
  ncclConfig_t c;
  make(&c, NCCL_VERSION(2, 31, 2), sizeof(c));
  c.magic = 0x12345678;
  expect_refused(&c, "magic");
  make(&c, NCCL_VERSION(2, 31, 2), sizeof(c) + 8); /* a header newer than any Chorus knows */
  expect_refused(&c, "size 120");
  make(&c, NCCL_VERSION(2, 31, 2), 12);
  expect_refused(&c, "size 12");
  make(&c, NCCL_VERSION(2, 12, 0), sizeof(c));
  expect_refused(&c, "version");
  /* Every checked field, alone out of range. */
  static const struct {
    size_t off;
    int bad;
    const char* name;
  } bad[] = {
      {offsetof(ncclConfig_t, blocking), 2, "blocking"},
      {offsetof(ncclConfig_t, cgaClusterSize), -1, "cgaClusterSize"},
      {offsetof(ncclConfig_t, minCTAs), 0, "minCTAs"},
      {offsetof(ncclConfig_t, maxCTAs), -3, "maxCTAs"},
      {offsetof(ncclConfig_t, splitShare), 7, "splitShare"},
      {offsetof(ncclConfig_t, collnetEnable), 2, "collnetEnable"},
      {offsetof(ncclConfig_t, CTAPolicy), 4, "CTAPolicy"},
      {offsetof(ncclConfig_t, shrinkShare), -1, "shrinkShare"},
      {offsetof(ncclConfig_t, nvlsCTAs), 0, "nvlsCTAs"},
      {offsetof(ncclConfig_t, nChannelsPerNetPeer), 65, "nChannelsPerNetPeer"},
      {offsetof(ncclConfig_t, nvlinkCentricSched), 3, "nvlinkCentricSched"},
      {offsetof(ncclConfig_t, graphUsageMode), 3, "graphUsageMode"},
      {offsetof(ncclConfig_t, numRmaCtx), -1, "numRmaCtx"},
      {offsetof(ncclConfig_t, maxP2pPeers), 0, "maxP2pPeers"},
      {offsetof(ncclConfig_t, graphStreamOrdering), 2, "graphStreamOrdering"},
      {offsetof(ncclConfig_t, launchOrderImplicit), 5, "launchOrderImplicit"},
      {offsetof(ncclConfig_t, numRmaSig), -2, "numRmaSig"},
      {offsetof(ncclConfig_t, rmaEagerInit), 2, "rmaEagerInit"},
      {offsetof(ncclConfig_t, hostCftMode), 0, "hostCftMode"},
  };
  for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
    make(&c, NCCL_VERSION(2, 31, 2), sizeof(c));
    memcpy((char*)&c + bad[i].off, &bad[i].bad, sizeof(int));
    expect_refused(&c, bad[i].name);
  }
  make(&c, NCCL_VERSION(2, 31, 2), sizeof(c));
  c.minCTAs = 4, c.maxCTAs = 2;
  expect_refused(&c, "minCTAs");
  /* Through the public call: nothing is made. */
  ncclUniqueId id;
  ncclComm_t comm = NULL;
  NCCL_OK(ncclGetUniqueId(&id));
  make(&c, NCCL_VERSION(2, 31, 2), sizeof(c));
  c.maxP2pPeers = -5;
  EXPECT_EQ(ncclCommInitRankConfig(&comm, 1, id, 0, &c), ncclInvalidArgument);
  EXPECT(comm == NULL);
}

/* n ranks in one thread, one group, each with cfg. */
static void init_all(ncclComm_t* comms, int n, ncclConfig_t* cfg) {
  ncclUniqueId id;
  NCCL_OK(ncclGetUniqueId(&id));
  NCCL_OK(ncclGroupStart());
  for (int r = 0; r < n; r++) NCCL_OK(ncclCommInitRankConfig(&comms[r], n, id, r, cfg));
  NCCL_OK(ncclGroupEnd());
}

static void destroy_all(ncclComm_t* comms, int n) {
  for (int r = 0; r < n; r++) NCCL_OK(ncclCommDestroy(comms[r]));
}

TEST_T(config, max_p2p_peers_caps_the_pool, 60) {
  enum { N = 6 };
  ncclComm_t comms[N];
  ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
  cfg.maxP2pPeers = 2;
  init_all(comms, N, &cfg);
  for (int r = 0; r < N; r++) EXPECT_EQ(comms[r]->p2p_cap, 2);
  destroy_all(comms, N);
  /* Above the rank count: the rank count. */
  cfg.maxP2pPeers = 100;
  init_all(comms, N, &cfg);
  EXPECT_EQ(comms[0]->p2p_cap, N);
  destroy_all(comms, N);
  /* NCCL's variable overrides the config, as in NCCL; CHORUS_P2P_PEERS only stands in for an unset one. */
  setenv("NCCL_P2P_MAX_PEERS", "3", 1);
  setenv("CHORUS_P2P_PEERS", "1", 1);
  param_reset();
  cfg.maxP2pPeers = 2;
  init_all(comms, N, &cfg);
  EXPECT_EQ(comms[0]->p2p_cap, 3);
  destroy_all(comms, N);
  unsetenv("NCCL_P2P_MAX_PEERS");
  param_reset();
  cfg.maxP2pPeers = NCCL_CONFIG_UNDEF_INT;
  init_all(comms, N, &cfg);
  EXPECT_EQ(comms[0]->p2p_cap, 1);
  destroy_all(comms, N);
}

TEST_T(config, ctas_bound_the_channels_and_name_is_kept, 60) {
  enum { N = 3 };
  ncclComm_t comms[N];
  ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
  char name[] = "trainer\x01-pg";
  cfg.commName = name;
  cfg.minCTAs = 4;
  cfg.maxCTAs = 4;
  init_all(comms, N, &cfg);
  memset(name, 'x', sizeof(name) - 1); /* the caller's string need not outlive the call */
  for (int r = 0; r < N; r++) {
    EXPECT_EQ(comms[r]->nchannels, 4);
    EXPECT_EQ(comms[r]->min_nchannels, 4);
    EXPECT(!strcmp(comms[r]->name, "trainer?-pg"));
    EXPECT(comms[r]->config.commName == comms[r]->name);
  }
  destroy_all(comms, N);
  cfg.commName = NULL;
  cfg.minCTAs = NCCL_CONFIG_UNDEF_INT;
  setenv("NCCL_MAX_NCHANNELS", "8", 1);
  param_reset();
  cfg.maxCTAs = 2; /* caps what NCCL_MAX_NCHANNELS allows */
  init_all(comms, N, &cfg);
  EXPECT_EQ(comms[0]->nchannels, 2);
  EXPECT_EQ(comms[0]->name[0], '\0');
  destroy_all(comms, N);
}

TEST(config, coll_config_checked) {
  ncclCollConfig_t c = NCCL_COLLCONFIG_INITIALIZER, out;
  EXPECT_EQ(coll_parse_config(NULL, "t", &out), CH_OK);
  EXPECT_EQ(out.forceAlgSelection, 1);
  EXPECT_EQ(coll_parse_config(&c, "t", &out), CH_OK);
  c.userProfilerTag = 7;
  c.algSelection = "Ring";
  EXPECT_EQ(coll_parse_config(&c, "t", &out), CH_OK);
  EXPECT_EQ(out.userProfilerTag, 7);
  static const struct {
    size_t off;
    int bad;
    const char* name;
  } bad[] = {
      {offsetof(ncclCollConfig_t, minCTAs), 0, "minCTAs"},
      {offsetof(ncclCollConfig_t, maxCTAs), -1, "maxCTAs"},
      {offsetof(ncclCollConfig_t, nvlsCTAs), 0, "nvlsCTAs"},
      {offsetof(ncclCollConfig_t, cgaClusterSize), -1, "cgaClusterSize"},
      {offsetof(ncclCollConfig_t, forceAlgSelection), 2, "forceAlgSelection"},
      {offsetof(ncclCollConfig_t, forceAlgSelection), INT_MIN, "forceAlgSelection"},
      {offsetof(ncclCollConfig_t, CTAPolicy), 8, "CTAPolicy"},
  };
  for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
    ncclCollConfig_t b = NCCL_COLLCONFIG_INITIALIZER;
    memcpy((char*)&b + bad[i].off, &bad[i].bad, sizeof(int));
    EXPECT_EQ(coll_parse_config(&b, "t", &out), CH_INVALID_ARG);
    if (!strstr(ncclGetLastError(NULL), bad[i].name))
      rt_fail(__FILE__, __LINE__, "WARN does not name %s: %s", bad[i].name, ncclGetLastError(NULL));
  }
  ncclCollConfig_t b = NCCL_COLLCONFIG_INITIALIZER;
  b.magic = 1;
  EXPECT_EQ(coll_parse_config(&b, "t", &out), CH_INVALID_ARG);
  b = c;
  b.size = 32;
  EXPECT_EQ(coll_parse_config(&b, "t", &out), CH_INVALID_ARG);
  b = c;
  b.size = sizeof(b) + 16; /* a newer header's: its extra fields are left unread */
  EXPECT_EQ(coll_parse_config(&b, "t", &out), CH_OK);
}

/* Every nccl<Coll>Config runs its collective, and a bad config fails it before anything is queued. */
TEST_T(config, coll_config_calls, 60) {
  enum { N = 2, C = 8 };
  ncclComm_t comms[N];
  init_all(comms, N, NULL);
  ncclCollConfig_t cc = NCCL_COLLCONFIG_INITIALIZER;
  cc.algSelection = "Ring";
  cc.userProfilerTag = 1;
  float in[N][N * C], out[N][N * C];
  for (int r = 0; r < N; r++)
    for (int i = 0; i < N * C; i++) in[r][i] = (float)(r + 1), out[r][i] = -1.0f;
  NCCL_OK(ncclGroupStart());
  for (int r = 0; r < N; r++) NCCL_OK(ncclAllReduceConfig(in[r], out[r], C, ncclFloat, ncclSum, comms[r], NULL, &cc));
  NCCL_OK(ncclGroupEnd());
  for (int r = 0; r < N; r++)
    for (int i = 0; i < C; i++) EXPECT(out[r][i] == 3.0f);
      /* One group per call; inputs: rank r's every element is r + 1. */
#define EACH(call)                             \
  do {                                         \
    NCCL_OK(ncclGroupStart());                 \
    for (int r = 0; r < N; r++) NCCL_OK(call); \
    NCCL_OK(ncclGroupEnd());                   \
  } while (0)
  EACH(ncclBroadcastConfig(in[r], out[r], C, ncclFloat, 1, comms[r], NULL, &cc));
  for (int r = 0; r < N; r++) EXPECT(out[r][0] == 2.0f && out[r][C - 1] == 2.0f);
  EACH(ncclReduceConfig(in[r], out[r], C, ncclFloat, ncclMax, 0, comms[r], NULL, NULL));
  EXPECT(out[0][0] == 2.0f && out[0][C - 1] == 2.0f);
  EACH(ncclAllGatherConfig(in[r], out[r], C, ncclFloat, comms[r], NULL, &cc));
  for (int r = 0; r < N; r++) EXPECT(out[r][0] == 1.0f && out[r][C] == 2.0f);
  EACH(ncclReduceScatterConfig(in[r], out[r], C, ncclFloat, ncclSum, comms[r], NULL, &cc));
  for (int r = 0; r < N; r++) EXPECT(out[r][0] == 3.0f && out[r][C - 1] == 3.0f);
  /* AlltoAll, Gather and Scatter have no algorithm to select (as in NCCL): a tag only. */
  ncclCollConfig_t ct = NCCL_COLLCONFIG_INITIALIZER;
  ct.userProfilerTag = 2;
  EACH(ncclAlltoAllConfig(in[r], out[r], C / N, ncclFloat, comms[r], NULL, &ct));
  for (int r = 0; r < N; r++) EXPECT(out[r][0] == 1.0f && out[r][C / N] == 2.0f);
  EACH(ncclGatherConfig(in[r], out[r], C, ncclFloat, 0, comms[r], NULL, &ct));
  EXPECT(out[0][0] == 1.0f && out[0][C] == 2.0f);
  EACH(ncclScatterConfig(in[r], out[r], C, ncclFloat, 1, comms[r], NULL, &ct));
  for (int r = 0; r < N; r++) EXPECT(out[r][0] == 2.0f && out[r][C - 1] == 2.0f);
#undef EACH
  cc.maxCTAs = 0;
  EXPECT_EQ(ncclAllReduceConfig(in[0], out[0], C, ncclFloat, ncclSum, comms[0], NULL, &cc), ncclInvalidArgument);
  EXPECT(strstr(ncclGetLastError(NULL), "ncclAllReduceConfig") != NULL);
  destroy_all(comms, N);
}

/* ncclCollConfig_t.algSelection in NCCL's grammar (tune/select.c): ',' OR, '+' AND, '^' NOT, names
 * matched from their start, case and blanks ignored. */
TEST(config, alg_selection_grammar) {
  uint64_t m;
  char why[200];
#define BIT(a, p) (1ull << ((a) * CH_NPROTO + (p)))
  const uint64_t ring = BIT(ALGO_RING, PROTO_LL) | BIT(ALGO_RING, PROTO_LL128) | BIT(ALGO_RING, PROTO_SIMPLE);
  EXPECT(tune_sel_parse("RING", &m, why, sizeof why) == 0 && m == ring);
  EXPECT(tune_sel_parse(" ring_Simple ", &m, why, sizeof why) == 0 && m == BIT(ALGO_RING, PROTO_SIMPLE));
  /* "RING_LL" is a prefix of RING_LL128 too, as in NCCL */
  EXPECT(tune_sel_parse("RING+^RING_LL", &m, why, sizeof why) == 0 && m == BIT(ALGO_RING, PROTO_SIMPLE));
  EXPECT(tune_sel_parse("TREE_LL128,RABENSEIFNER_SIMPLE,,", &m, why, sizeof why) == 0 &&
         m == (BIT(ALGO_TREE, PROTO_LL128) | BIT(ALGO_RABEN, PROTO_SIMPLE)));
  EXPECT(tune_sel_parse("^RING", &m, why, sizeof why) == 0 && !(m & ring) && (m & BIT(ALGO_TREE, PROTO_SIMPLE)));
  EXPECT(tune_sel_parse("NVLS,SYMK_LL", &m, why, sizeof why) == 0 && m && !(m & 0xffffffffull)); /* NCCL's only */
  const char* bad[] = {"BOGUS", "^", "RING,+", "RING+^RING", "RING+TREE", "RING;TREE"};
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) EXPECT(tune_sel_parse(bad[i], &m, why, sizeof why) != 0);
#undef BIT
}

/* The algorithm and protocol the flight recorder has for comm's last call. */
static void last_choice(ncclComm_t comm, int* algo, int* proto) {
  struct fr_entry* e = NULL;
  uint64_t rec, skip;
  int n = fr_snapshot(comm, &e, &rec, &skip);
  ASSERT(n > 0);
  *algo = e[n - 1].algo, *proto = e[n - 1].proto;
  free(e);
}

/* One AllReduce of rank + 1 on every element on each comm (cfg NULL: the plain call); its sums exact. */
static ncclResult_t allreduce_all(ncclComm_t* comms, int n, size_t count, const ncclCollConfig_t* cfg) {
  float* buf = malloc(sizeof(float) * count * 2 * (size_t)n);
  ASSERT(buf != NULL);
  for (int r = 0; r < n; r++)
    for (size_t i = 0; i < count; i++) buf[2 * count * r + i] = (float)(r + 1), buf[2 * count * r + count + i] = -1;
  ncclResult_t res = ncclGroupStart(), first = ncclSuccess;
  for (int r = 0; r < n; r++) {
    float* in = buf + 2 * count * r;
    res = cfg ? ncclAllReduceConfig(in, in + count, count, ncclFloat, ncclSum, comms[r], NULL, cfg)
              : ncclAllReduce(in, in + count, count, ncclFloat, ncclSum, comms[r], NULL);
    if (res != ncclSuccess && first == ncclSuccess) first = res;
  }
  res = ncclGroupEnd();
  if (first == ncclSuccess) first = res;
  if (first == ncclSuccess)
    for (int r = 0; r < n; r++)
      for (size_t i = 0; i < count; i++) EXPECT(buf[2 * count * r + count + i] == (float)(n * (n + 1) / 2));
  free(buf);
  return first;
}

/* A per-call selection decides the call's algorithm and protocol (seen in the flight recorder), an
 * impossible one is refused under forceAlgSelection=1 and falls back under 0, and the plan kept for
 * reuse does not carry a selection over to a later plain call. */
TEST_T(config, alg_selection_takes_effect, 90) {
  enum { N = 4, C = 4096 };
  ncclComm_t comms[N];
  init_all(comms, N, NULL);
  struct tune_choice autoc;
  tune_predict(comms[0], FUNC_ALLREDUCE, C * sizeof(float), CH_REPRO_OFF, &autoc);
  int algo, proto;
  NCCL_OK(allreduce_all(comms, N, C, NULL));
  last_choice(comms[0], &algo, &proto);
  EXPECT_EQ(algo, autoc.algo);
  /* Every pair Chorus runs for AllReduce here, one at a time, each exact. */
  /* "RING_LL" would be LL and LL128 (a prefix of both, as in NCCL) */
  static const char* const pairs[] = {"RING_SIMPLE", "RING_LL+^RING_LL128", "RING_LL128", "TREE_SIMPLE",
                                      "TREE_LL+^TREE_LL128",
                                      "RECDBL_SIMPLE", "RABENSEIFNER_LL128", "DIRECT_SIMPLE"};
  static const int want_algo[] = {ALGO_RING, ALGO_RING, ALGO_RING, ALGO_TREE, ALGO_TREE,
                                  ALGO_RECDBL, ALGO_RABEN, ALGO_DIRECT};
  static const int want_proto[] = {PROTO_SIMPLE, PROTO_LL, PROTO_LL128, PROTO_SIMPLE, PROTO_LL,
                                   PROTO_SIMPLE, PROTO_LL128, -1};
  ncclCollConfig_t cc = NCCL_COLLCONFIG_INITIALIZER;
  for (size_t k = 0; k < sizeof pairs / sizeof pairs[0]; k++) {
    cc.algSelection = pairs[k];
    for (int rep = 0; rep < 2; rep++) { /* the second reuses the first's plan */
      NCCL_OK(allreduce_all(comms, N, C, &cc));
      last_choice(comms[0], &algo, &proto);
      EXPECT_EQ(algo, want_algo[k]);
      if (want_proto[k] >= 0) EXPECT_EQ(proto, want_proto[k]);
    }
  }
  /* A plain call of the same shape after them: the automatic choice, not the last selection's plan. */
  cc.algSelection = autoc.algo == ALGO_RING ? "TREE_SIMPLE" : "RING_SIMPLE";
  NCCL_OK(allreduce_all(comms, N, C, &cc));
  NCCL_OK(allreduce_all(comms, N, C, NULL));
  last_choice(comms[0], &algo, &proto);
  EXPECT_EQ(algo, autoc.algo);
  /* Nothing Chorus runs (NVLS), nothing for this collective (Tree AllGather), bad syntax: refused by
   * name under forceAlgSelection=1, before anything is queued. */
  float x[N * 4] = {0}, y[N * 4];
  const char* impossible[] = {"NVLS", "PAT_SIMPLE", "BOGUS"};
  for (size_t k = 0; k < 3; k++) {
    cc.algSelection = impossible[k];
    EXPECT_EQ(ncclAllReduceConfig(x, y, 4, ncclFloat, ncclSum, comms[0], NULL, &cc), ncclInvalidArgument);
    EXPECT(strstr(ncclGetLastError(NULL), "algSelection") != NULL);
  }
  cc.algSelection = "TREE";
  EXPECT_EQ(ncclAllGatherConfig(x, y, 4, ncclFloat, comms[0], NULL, &cc), ncclInvalidArgument);
  EXPECT_EQ(ncclAlltoAllConfig(x, y, 1, ncclFloat, comms[0], NULL, &cc), ncclInvalidArgument);
  /* ... and the automatic choice under forceAlgSelection=0. */
  cc.forceAlgSelection = 0;
  cc.algSelection = "NVLS";
  NCCL_OK(allreduce_all(comms, N, C, &cc));
  last_choice(comms[0], &algo, &proto);
  EXPECT_EQ(algo, autoc.algo);
  destroy_all(comms, N);
}

/* userProfilerTag and the selection reach the flight recorder entry and its dump (17th column). */
TEST_T(config, user_tag_recorded, 30) {
  char dir[64];
  snprintf(dir, sizeof dir, "/tmp/collcfg-XXXXXX");
  ASSERT(mkdtemp(dir) != NULL);
  setenv("CHORUS_DUMP_DIR", dir, 1);
  param_reset();
  ncclComm_t comm;
  NCCL_OK(ncclCommInitAll(&comm, 1, NULL));
  ncclCollConfig_t cc = NCCL_COLLCONFIG_INITIALIZER;
  cc.userProfilerTag = 0xabc123;
  float v = 1, w = 0;
  NCCL_OK(ncclAllReduceConfig(&v, &w, 1, ncclFloat, ncclSum, comm, NULL, &cc));
  NCCL_OK(ncclAllReduce(&v, &w, 1, ncclFloat, ncclSum, comm, NULL)); /* untagged */
  struct fr_entry* e = NULL;
  uint64_t rec, skip;
  int n = fr_snapshot(comm, &e, &rec, &skip);
  ASSERT(n == 2);
  EXPECT_EQ(e[0].tag, (uint64_t)0xabc123);
  EXPECT_EQ(e[1].tag, (uint64_t)0);
  free(e);
  char path[512];
  NCCL_OK(chorusCommDumpFlightRecorder(comm, path, sizeof path));
  FILE* f = fopen(path, "r");
  ASSERT(f != NULL);
  char line[512];
  int tagged = 0, plain = 0;
  while (fgets(line, sizeof line, f)) {
    size_t len = strlen(line);
    tagged += len > 8 && !strcmp(line + len - 8, " abc123\n");
    plain += line[0] == '2' && len > 3 && !strcmp(line + len - 3, " 0\n");
  }
  fclose(f);
  EXPECT_EQ(tagged, 1);
  EXPECT_EQ(plain, 1);
  NCCL_OK(ncclCommDestroy(comm));
  unlink(path);
  rmdir(dir);
  unsetenv("CHORUS_DUMP_DIR");
  param_reset();
}

/* As in NCCL, NCCL_ALGO restricting the collective wins over a valid per-call selection. */
TEST_T(config, alg_selection_yields_to_nccl_algo, 60) {
  enum { N = 3, C = 256 };
  setenv("NCCL_ALGO", "allreduce:ring", 1);
  param_reset();
  ncclComm_t comms[N];
  init_all(comms, N, NULL);
  ncclCollConfig_t cc = NCCL_COLLCONFIG_INITIALIZER;
  cc.algSelection = "TREE_SIMPLE";
  NCCL_OK(allreduce_all(comms, N, C, &cc));
  int algo, proto;
  last_choice(comms[0], &algo, &proto);
  EXPECT_EQ(algo, ALGO_RING);
  destroy_all(comms, N);
  unsetenv("NCCL_ALGO");
  param_reset();
}
