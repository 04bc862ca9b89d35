/* Algorithm/protocol choice (issue 12, "Choice"): NCCL_ALGO/NCCL_PROTO in NCCL's full syntax, the
 * cost model keeping the choices made before it, agreement across ranks, errors for malformed or
 * unrunnable settings, ncclGroupSimulateEnd; tuner plugins are test_tuner_plugin.c's. */
#define _GNU_SOURCE
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "chorus.h"
#include "comm/comm.h"
#include "tune/tune.h"
#include "misc/log.h"
#include "misc/param.h"
#include "misc/utils.h"
#include "runner.h"

#define B(a) (1u << (a))
#define ALL_PROTO 7u
#define ALL_ALGO ((1u << TUNE_ALGO_NBITS) - 1)
#define NCCL_ONLY(k) (1u << (ALGO_COUNT + (k))) /* CollNetDirect 0 ... PAT 4 */

/* Set (value) or unset (NULL) a variable and forget cached parameters; test_tuner_plugin.c uses it too. */
void tt_set(const char* name, const char* value) {
  if (value) setenv(name, value, 1);
  else unsetenv(name);
  param_reset();
}

/* ---- parser ---- */

struct parse_case {
  const char* value;
  int is_algo;
  unsigned want[TUNE_NMASK]; /* Broadcast, Reduce, AllGather, ReduceScatter, AllReduce, send/recv */
};

TEST(tuning, parse_every_form) {
  const unsigned R = B(ALGO_RING), T = B(ALGO_TREE), X = B(ALGO_EXCHANGE), D = B(ALGO_DIRECT);
  const unsigned CD = NCCL_ONLY(0), CC = NCCL_ONLY(1), NV = NCCL_ONLY(2), NT = NCCL_ONLY(3), PAT = NCCL_ONLY(4);
  const unsigned LL = B(PROTO_LL), L128 = B(PROTO_LL128), S = B(PROTO_SIMPLE);
  const unsigned A = ALL_ALGO, P = ALL_PROTO;
  const struct parse_case cases[] = {
      {NULL, 1, {A, A, A, A, A, A}},
      {"", 1, {A, A, A, A, A, A}},
      {"  ", 1, {A, A, A, A, A, A}},
      {"Ring", 1, {R, R, R, R, R, R}},
      {"ring", 1, {R, R, R, R, R, R}},
      {"RING,tree", 1, {R | T, R | T, R | T, R | T, R | T, R | T}},
      {" ring , Tree ", 1, {R | T, R | T, R | T, R | T, R | T, R | T}},
      {"^ring", 1, {A & ~R, A & ~R, A & ~R, A & ~R, A & ~R, A & ~R}},
      {"^", 1, {A, A, A, A, A, A}},
      {"CollNetDirect,CollNetChain,NVLS,NVLSTree,PAT", 1,
       {CD | CC | NV | NT | PAT, CD | CC | NV | NT | PAT, CD | CC | NV | NT | PAT, CD | CC | NV | NT | PAT,
        CD | CC | NV | NT | PAT, CD | CC | NV | NT | PAT}},
      {"exchange,DIRECT", 1, {X | D, X | D, X | D, X | D, X | D, X | D}},
      /* per collective: unprefixed entries (first only) apply to all, later entries override */
      {"allreduce:tree,ring;broadcast:ring", 1, {R, A, A, A, T | R, A}},
      {"AllReduce:Exchange", 1, {A, A, A, A, X, A}},
      {"ring;allreduce:^ring", 1, {R, R, R, R, A & ~R, R}},
      {"ring,collnetdirect;allreduce:tree,collnetdirect;broadcast:ring", 1, {R, R | CD, R | CD, R | CD, T | CD, R | CD}},
      {"reduce:ring;allgather:ring;reducescatter:ring;allreduce:ring", 1, {A, R, R, R, R, A}},
      {"allreduce:ring;allreduce:tree", 1, {A, A, A, A, T, A}}, /* the later entry wins */
      {"ring ; allreduce : tree", 1, {R, R, R, R, T, R}},
      /* empty entries and names are skipped, as NCCL's strtok-based parser does */
      {"ring,", 1, {R, R, R, R, R, R}},
      {",ring", 1, {R, R, R, R, R, R}},
      {"ring,,tree", 1, {R | T, R | T, R | T, R | T, R | T, R | T}},
      {"ring;;allreduce:tree", 1, {R, R, R, R, T, R}},
      {"ring;", 1, {R, R, R, R, R, R}},

      {"LL", 0, {LL, LL, LL, LL, LL, LL}},
      {"ll128,SIMPLE", 0, {L128 | S, L128 | S, L128 | S, L128 | S, L128 | S, L128 | S}},
      {"^LL128", 0, {LL | S, LL | S, LL | S, LL | S, LL | S, LL | S}},
      {"LL,Simple;allreduce:^LL", 0, {LL | S, LL | S, LL | S, LL | S, L128 | S, LL | S}},
      {"^LL128;allreduce:LL128", 0, {LL | S, LL | S, LL | S, LL | S, L128, LL | S}},
      {"broadcast:simple", 0, {S, P, P, P, P, P}},
  };
  for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
    const struct parse_case* c = &cases[i];
    unsigned m[TUNE_NMASK];
    ch_status s = tune_parse(c->is_algo ? "NCCL_ALGO" : "NCCL_PROTO", c->value, c->is_algo, m);
    if (s != CH_OK) {
      rt_fail(__FILE__, __LINE__, "'%s': status %d", c->value ? c->value : "(null)", (int)s);
      continue;
    }
    for (int f = 0; f < TUNE_NMASK; f++)
      if (m[f] != c->want[f])
        rt_fail(__FILE__, __LINE__, "'%s' [%d]: mask 0x%x, want 0x%x", c->value ? c->value : "(null)", f, m[f],
                c->want[f]);
  }
}

TEST(tuning, parse_malformed_is_a_clear_error) {
  const struct {
    const char* value;
    int is_algo;
    const char* why; /* must appear in the WARN */
  } cases[] = {
      {"foo", 1, "unknown algorithm 'foo'"},
      {"allreduce:,", 1, "names nothing"},
      {";;^", 1, "entry 3 has no 'collective:' prefix"}, /* as NCCL: its first token is not at the start */
      {";ring;allreduce:tree", 1, "entry 2 has no 'collective:' prefix"},
      {"ring;tree", 1, "entry 2 has no 'collective:' prefix"},
      {"allreduce:ring;tree", 1, "entry 2 has no 'collective:' prefix"},
      {"sendrecv:ring", 1, "unknown collective 'sendrecv'"},
      {"allreduc:ring", 1, "unknown collective 'allreduc'"},
      {":ring", 1, "unknown collective ''"},
      {"allreduce:", 1, "names nothing"},
      {"allreduce:ring:tree", 1, "more than one ':'"},
      {"ring^", 1, "unknown algorithm 'ring^'"},
      {"ll256", 0, "unknown protocol 'll256'"},
      {"ring", 0, "unknown protocol 'ring'"},
      {"LL;allreduce:Tree", 0, "unknown protocol 'Tree'"},
      {"simple", 1, "unknown algorithm 'simple'"},
  };
  for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
    unsigned m[TUNE_NMASK];
    const char* env = cases[i].is_algo ? "NCCL_ALGO" : "NCCL_PROTO";
    ch_status s = tune_parse(env, cases[i].value, cases[i].is_algo, m);
    if (s != CH_INVALID_USAGE) rt_fail(__FILE__, __LINE__, "%s='%s': status %d, want invalid usage", env, cases[i].value, (int)s);
    char head[128];
    snprintf(head, sizeof(head), "%s=%s is malformed", env, cases[i].value);
    const char* err = log_last_error();
    if (!strstr(err, head) || !strstr(err, cases[i].why))
      rt_fail(__FILE__, __LINE__, "%s='%s': error \"%s\", want \"%s\" and \"%s\"", env, cases[i].value, err, head,
              cases[i].why);
  }
}

TEST(tuning, mask_text_for_reports) {
  unsigned m[TUNE_NMASK];
  char text[512];
  ASSERT_EQ(tune_parse("NCCL_PROTO", "^LL128", 0, m), CH_OK);
  tune_mask_format(0, tune_mask_pack(0, m), text, sizeof(text));
  EXPECT(!strcmp(text, "LL,Simple"));
  ASSERT_EQ(tune_parse("NCCL_ALGO", "ring;allreduce:exchange,ring", 1, m), CH_OK);
  tune_mask_format(1, tune_mask_pack(1, m), text, sizeof(text));
  EXPECT(!strcmp(text, "Broadcast:Ring;Reduce:Ring;AllGather:Ring;ReduceScatter:Ring;AllReduce:Ring,Exchange"));
  /* spellings that mean the same pack the same */
  unsigned m2[TUNE_NMASK];
  ASSERT_EQ(tune_parse("NCCL_ALGO", " RING ; AllReduce:Ring,Exchange", 1, m2), CH_OK);
  EXPECT(tune_mask_pack(1, m) == tune_mask_pack(1, m2));
  tune_mask_format(1, TUNE_MALFORMED, text, sizeof(text));
  EXPECT(!strcmp(text, "(malformed)"));
  /* a small buffer truncates, never overflows */
  char tiny[8];
  tune_mask_format(1, tune_mask_pack(1, m), tiny, sizeof(tiny));
  EXPECT(strlen(tiny) < sizeof(tiny));
}

/* ---- the default model keeps the choices made before it (the rules of the previous version of tune/choose.c), among
 * the algorithms that existed then (those added since are excluded; their choice is tested below) ---- */

static void old_choose(struct ncclComm* comm, int func, size_t bytes, unsigned pm, unsigned am, struct tune_choice* out) {
  int p;
  if (bytes <= 64 && (pm & B(PROTO_LL))) p = PROTO_LL;
  else if (pm & B(PROTO_SIMPLE)) p = PROTO_SIMPLE;
  else p = (pm & B(PROTO_LL128)) ? PROTO_LL128 : PROTO_LL;
  int nch = (int)UT_MIN((size_t)comm->max_nchannels, UT_MAX((size_t)comm->min_nchannels, bytes >> 20));
  int exch = func == FUNC_ALLREDUCE && comm->nranks == 2 && (am & B(ALGO_EXCHANGE)) && bytes <= comm->exchange_max_bytes;
  int direct = func == FUNC_ALLREDUCE && comm->clique && (am & B(ALGO_DIRECT)) &&
               bytes >= (comm->clique->procs ? comm->shm_direct_min_bytes : comm->direct_min_bytes);
  out->fallback = exch ? ALGO_EXCHANGE : ALGO_RING;
  out->algo = direct ? ALGO_DIRECT : out->fallback;
  out->proto = p;
  out->nch = direct ? 1 : UT_MAX(1, UT_MIN(nch, comm->nchannels));
  size_t out_bytes = func == FUNC_ALLGATHER ? bytes * (size_t)comm->nranks : bytes;
  out->nt = out_bytes >= comm->nt_min_bytes;
}

static const char* sweep_protos[] = {NULL, "LL", "LL128", "Simple", "^LL", "^Simple", "LL,LL128", "^LL128"};
#define ADDED "RecDbl,Rabenseifner,Tree"
static const char* sweep_algos[] = {"^" ADDED, "Ring", "^Exchange," ADDED, "Direct", "Exchange", "Ring,Direct"};
#define NSP (sizeof(sweep_protos) / sizeof(sweep_protos[0]))
#define NSA (sizeof(sweep_algos) / sizeof(sweep_algos[0]))

static void sweep_body(int rank, int nranks, ncclUniqueId id, void* arg) {
  (void)arg;
  ncclComm_t comm;
  NCCL_OK(ncclCommInitRank(&comm, nranks, id, rank));
  const size_t sizes[] = {0, 1, 8, 63, 64, 65, 128, 4096, 65536, (256 << 10) - 1, 256 << 10, (256 << 10) + 1,
                          1 << 20, (3 << 20) + 5, 64 << 20};
  unsigned pm = comm->proto_mask[FUNC_ALLREDUCE] & comm->proto_ok;
  unsigned am = comm->algo_mask[FUNC_ALLREDUCE];
  for (int f = 0; f < FUNC_ALLTOALL; f++)
    for (size_t s = 0; s < sizeof(sizes) / sizeof(sizes[0]); s++) {
      struct tune_choice a, b;
      memset(&a, 0, sizeof(a)), memset(&b, 0, sizeof(b));
      tune_choose(comm, f, sizes[s], CH_REPRO_OFF, &a);
      old_choose(comm, f, sizes[s], pm ? pm : B(PROTO_SIMPLE), am, &b);
      if (a.algo != b.algo || a.proto != b.proto || a.nch != b.nch || a.fallback != b.fallback || a.nt != b.nt)
        rt_fail(__FILE__, __LINE__, "%s x%d, NCCL_PROTO=%s NCCL_ALGO=%s, %s %zu bytes: %s/%s/%d ch (fallback %s), "
                "before the model %s/%s/%d ch (fallback %s)", rt_mode(), nranks, param_str(PARAM_PROTO),
                param_str(PARAM_ALGO), tune_func_name(f), sizes[s], algo_name(a.algo), tune_proto_name(a.proto),
                a.nch, algo_name(a.fallback), algo_name(b.algo), tune_proto_name(b.proto), b.nch,
                algo_name(b.fallback));
    }
  NCCL_OK(ncclCommDestroy(comm));
}

static void sweep(int nranks, int procs) {
  for (size_t p = 0; p < NSP; p++)
    for (size_t a = 0; a < NSA; a++) {
      tt_set("NCCL_PROTO", sweep_protos[p]);
      tt_set("NCCL_ALGO", sweep_algos[a]);
      if (procs) rt_run_procs(nranks, sweep_body, NULL);
      else rt_run_threads(nranks, sweep_body, NULL);
    }
}

TEST_T(tuning, default_model_keeps_choices_threads, 120) {
  sweep(2, 0);
  sweep(3, 0);
}
TEST_T(tuning, default_model_keeps_choices_procs, 240) {
  sweep(2, 1);
  sweep(3, 1);
}
TEST_T(tuning, default_model_keeps_choices_channels_net, 120) {
  tt_set("NCCL_ALGO", "^" ADDED);
  tt_set("NCCL_MAX_NCHANNELS", "4");
  tt_set("NCCL_MIN_NCHANNELS", "2");
  rt_run_procs(2, sweep_body, NULL);
  tt_set("NCCL_MAX_NCHANNELS", NULL);
  tt_set("NCCL_MIN_NCHANNELS", NULL);
  tt_set("NCCL_SHM_DISABLE", "1"); /* processes then talk over the network transport: Simple only */
  rt_run_procs(2, sweep_body, NULL);
}

/* RecDbl takes small AllReduces from 3 ranks up (fewer hops than the ring), Ring the large ones; over
 * the network (hops ~100x dearer) up to larger sizes; Tree small Broadcasts and Reduces there. */
static void recdbl_body(int rank, int nranks, ncclUniqueId id, void* arg) {
  (void)arg;
  ncclComm_t comm;
  NCCL_OK(ncclCommInitRank(&comm, nranks, id, rank));
  struct tune_choice a;
  tune_choose(comm, FUNC_ALLREDUCE, 8, CH_REPRO_OFF, &a);
  EXPECT_EQ(a.algo, ALGO_RECDBL);
  EXPECT_EQ(a.nch, 1);
  tune_choose(comm, FUNC_ALLREDUCE, 64 << 20, CH_REPRO_OFF, &a);
  EXPECT(a.algo != ALGO_RECDBL);
  tune_choose(comm, FUNC_ALLGATHER, 8, CH_REPRO_OFF, &a); /* AllReduce only */
  EXPECT_EQ(a.algo, ALGO_RING);
  /* Tree Broadcast/Reduce: small messages across the network only */
  tune_choose(comm, FUNC_BROADCAST, 8, CH_REPRO_OFF, &a);
  EXPECT_EQ(a.algo, comm->tune_net ? ALGO_TREE : ALGO_RING);
  tune_choose(comm, FUNC_REDUCE, 8, CH_REPRO_OFF, &a);
  EXPECT_EQ(a.algo, comm->tune_net ? ALGO_TREE : ALGO_RING);
  tune_choose(comm, FUNC_REDUCE, 4 << 20, CH_REPRO_OFF, &a);
  EXPECT_EQ(a.algo, ALGO_RING);
  tune_choose(comm, FUNC_ALLREDUCE, 16384, CH_REPRO_OFF, &a);
  if (comm->tune_net) EXPECT_EQ(a.algo, ALGO_RECDBL);
  else EXPECT(a.algo != ALGO_RECDBL);
  NCCL_OK(ncclCommDestroy(comm));
}

TEST_T(tuning, recdbl_for_small_allreduce, 60) {
  rt_run_procs(4, recdbl_body, NULL);
  tt_set("NCCL_SHM_DISABLE", "1");
  rt_run_procs(4, recdbl_body, NULL);
}

/* ---- several hosts (tune/shape.c): the model across hosts, on a made-up communicator ---- */

/* hosts x per_host ranks, rank r on host r / per_host, one process each, as chorus-sim makes them;
 * tree_depth as comm_build_trees gives it (hosts a power of two here). */
static struct ncclComm* hosts_comm(int hosts, int per_host) {
  struct ncclComm* c = calloc(1, sizeof(*c));
  int n = hosts * per_host;
  ASSERT(c && (c->peers = calloc((size_t)n, sizeof(*c->peers))) != NULL);
  c->nranks = n, c->rank = 0, c->nnodes = hosts, c->nchannels = 1;
  for (int r = 0; r < n; r++) {
    c->peers[r].rank = r, c->peers[r].nranks = n;
    c->peers[r].host_hash = 77 + (uint64_t)(r / per_host);
    c->peers[r].proc_nonce = 1 + (uint64_t)r;
  }
  int b = 1, d = 0;
  while (b * 2 < hosts) b *= 2, d++;
  c->tree_depth = (hosts > 1 ? 1 + d : 0) + per_host - 1;
  tune_init(c);
  return c;
}

static void hosts_free(struct ncclComm* c) {
  tune_fini(c);
  free(c->peers);
  free(c);
}

/* The model's prediction for AllReduce of `bytes` with NCCL_ALGO=allreduce:<algo>. */
static double forced_us(const char* algo, size_t bytes, int* chosen) {
  char v[64];
  snprintf(v, sizeof v, "allreduce:%s", algo);
  tt_set("NCCL_ALGO", v);
  struct ncclComm* c = hosts_comm(2, 8);
  struct tune_choice ch;
  double us = tune_predict(c, FUNC_ALLREDUCE, bytes, CH_REPRO_OFF, &ch);
  *chosen = ch.algo;
  hosts_free(c);
  return us;
}

static void expect_close(double got, double want, const char* what, size_t bytes) {
  if (!(got >= want * (1 - 1e-9) && got <= want * (1 + 1e-9)))
    rt_fail(__FILE__, __LINE__, "%s, %zu bytes: the model predicts %.6f us, the closed form %.6f us", what, bytes, got,
            want);
}

/* 2 hosts x 8 ranks: Ring for a large AllReduce, a logarithmic algorithm for a small one. Before, the
 * model gave each of a host's 8 ranks its own network bandwidth in Rabenseifner's round between the
 * hosts, and charged every ring hop as a network hop, so it chose Rabenseifner for large messages
 * where chorus-sim has Ring up to 8x faster (docs/SCALE.md). The predictions in closed form, from the
 * default constants: Simple inside a host (step s, two copies at copy_bw), net_step_us and net_bw
 * between hosts, where the 8 ranks of a host cross in the round at distance 8 and share the NIC. */
TEST(tuning, two_hosts_of_eight_ring_large_log_small) {
  tt_set("NCCL_TUNER_PLUGIN", "none");
  tt_set("NCCL_SHM_DISABLE", NULL);
  tt_set("NCCL_ALGO", NULL);
  struct ncclComm* c = hosts_comm(2, 8);
  EXPECT_EQ(c->tune_net, 1);
  EXPECT_EQ(c->tune_hosts, 2);
  EXPECT_EQ(c->tune_ppn, 8);
  EXPECT_EQ(c->tune_local_net, 0);
  EXPECT_EQ(c->tune_ring_cross, 2);
  EXPECT_EQ(c->tune_tree_net, 1);
  EXPECT_EQ(c->tune_fold_share, 0);
  const int share[4] = {0, 0, 0, 8}; /* distances 1, 2, 4 inside a host; 8 crosses, all 8 ranks */
  for (int k = 0; k < 4; k++) EXPECT_EQ(c->tune_pof2_share[k], share[k]);
  struct tune_choice ch;
  tune_predict(c, FUNC_ALLREDUCE, 8, CH_REPRO_OFF, &ch);
  if (ch.algo != ALGO_RECDBL && ch.algo != ALGO_RABEN && ch.algo != ALGO_TREE)
    rt_fail(__FILE__, __LINE__, "8-byte AllReduce on 2 hosts x 8: chose %s, not a logarithmic algorithm",
            algo_name(ch.algo));
  tune_predict(c, FUNC_ALLREDUCE, (size_t)256 << 20, CH_REPRO_OFF, &ch);
  EXPECT_EQ(ch.algo, ALGO_RING);
  tune_predict(c, FUNC_ALLGATHER, 8, CH_REPRO_OFF, &ch);
  EXPECT_EQ(ch.algo, ALGO_RING);
  hosts_free(c);

  const struct tune_model* m = tune_model_defaults();
  double s = m->step_us[PROTO_SIMPLE], lper = 2.0 / m->copy_bw, nlat = m->net_step_us, nper = 1.0 / m->net_bw;
  const size_t sizes[] = {8, 64 << 10, 1 << 20, (size_t)256 << 20};
  for (size_t z = 0; z < sizeof(sizes) / sizeof(sizes[0]); z++) {
    double b = (double)sizes[z];
    int a;
    /* Ring: 30 hops, 2 of every 16 between hosts; the network's rate paces the pipeline. */
    expect_close(forced_us("Ring", sizes[z], &a), 30.0 * 2 / 16 * nlat + 30.0 * 14 / 16 * s + b * 30 / 16 * nper,
                 "Ring", sizes[z]);
    EXPECT_EQ(a, ALGO_RING);
    /* RecDbl: 3 rounds inside a host, one between the hosts with 8 ranks on each NIC. */
    expect_close(forced_us("RecDbl", sizes[z], &a), 3 * (s + b * lper) + nlat + b * 8 * nper, "RecDbl", sizes[z]);
    EXPECT_EQ(a, ALGO_RECDBL);
    /* Rabenseifner: the same rounds twice with 2^k / 16 of the vector. */
    expect_close(forced_us("Rabenseifner", sizes[z], &a),
                 2 * (3 * s + b * 7.0 / 16 * lper + nlat + b * 8.0 / 16 * 8 * nper), "Rabenseifner", sizes[z]);
    EXPECT_EQ(a, ALGO_RABEN);
    /* Tree: one level between the hosts, a chain of 7 hops inside each; 4 x levels x bytes. */
    expect_close(forced_us("Tree", sizes[z], &a), 2 * (nlat + 7 * s) + b * 4 * nper, "Tree", sizes[z]);
    EXPECT_EQ(a, ALGO_TREE);
  }
  tt_set("NCCL_ALGO", NULL);
  tt_set("NCCL_TUNER_PLUGIN", NULL);
}

/* Direct between processes falls back, when some buffer is not from ncclMemAlloc, to what the model
 * would choose among Exchange and Ring, on Direct's one channel; Ring when NCCL_ALGO allows neither. */
static void fallback_body(int rank, int nranks, ncclUniqueId id, void* arg) {
  (void)arg;
  ncclComm_t comm;
  NCCL_OK(ncclCommInitRank(&comm, nranks, id, rank));
  const size_t sizes[] = {256 << 10, 1 << 20, 64 << 20};
  for (size_t s = 0; s < sizeof(sizes) / sizeof(sizes[0]); s++) {
    struct tune_choice a, b;
    unsigned keep = comm->algo_mask[FUNC_ALLREDUCE];
    tune_choose(comm, FUNC_ALLREDUCE, sizes[s], CH_REPRO_OFF, &a);
    comm->algo_mask[FUNC_ALLREDUCE] = keep & (B(ALGO_EXCHANGE) | B(ALGO_RING));
    if (!comm->algo_mask[FUNC_ALLREDUCE]) comm->algo_mask[FUNC_ALLREDUCE] = B(ALGO_RING);
    tune_choose(comm, FUNC_ALLREDUCE, sizes[s], CH_REPRO_OFF, &b);
    comm->algo_mask[FUNC_ALLREDUCE] = keep;
    if (a.algo != ALGO_DIRECT) continue; /* not chosen here (NCCL_ALGO) */
    EXPECT_EQ(a.fallback, nranks == 2 && sizes[s] <= comm->exchange_max_bytes ? ALGO_EXCHANGE : ALGO_RING);
    if (a.fallback != b.algo || a.proto != b.proto)
      rt_fail(__FILE__, __LINE__, "NCCL_ALGO=%s, %zu bytes: fallback %s/%s, without Direct %s/%s", param_str(PARAM_ALGO),
              sizes[s], algo_name(a.fallback), tune_proto_name(a.proto), algo_name(b.algo),
              tune_proto_name(b.proto));
  }
  NCCL_OK(ncclCommDestroy(comm));
}

TEST_T(tuning, direct_falls_back_to_exchange_or_ring, 90) {
  rt_run_procs(4, fallback_body, NULL);
  tt_set("NCCL_ALGO", "Ring,Direct");
  rt_run_procs(4, fallback_body, NULL);
  tt_set("NCCL_ALGO", "Direct");
  rt_run_procs(4, fallback_body, NULL);
  tt_set("NCCL_ALGO", NULL);
  rt_run_procs(2, fallback_body, NULL);
}

/* ---- errors: malformed at init, nothing runnable at the call ---- */

static void init_fails_body(int rank, int nranks, ncclUniqueId id, void* arg) {
  ncclComm_t comm = NULL;
  ncclResult_t r = ncclCommInitRank(&comm, nranks, id, rank);
  if (r != ncclInvalidUsage) rt_fail(__FILE__, __LINE__, "rank %d: init -> %d, want ncclInvalidUsage", rank, (int)r);
  if (!strstr(ncclGetLastError(NULL), (const char*)arg))
    rt_fail(__FILE__, __LINE__, "rank %d: last error \"%s\" lacks \"%s\"", rank, ncclGetLastError(NULL), (const char*)arg);
  if (r == ncclSuccess) ncclCommDestroy(comm);
}

TEST_T(tuning, malformed_fails_init, 60) {
  tt_set("NCCL_ALGO", "ring;tree");
  rt_run_both(2, init_fails_body, "NCCL_ALGO=ring;tree is malformed: entry 2 has no 'collective:' prefix");
  tt_set("NCCL_ALGO", NULL);
  tt_set("NCCL_PROTO", "allreduce:LL,LL129");
  rt_run_threads(3, init_fails_body, "NCCL_PROTO=allreduce:LL,LL129 is malformed: unknown protocol 'LL129'");
}

/* ---- CHORUS_TUNE_FILE: constants from chorus-info --calibrate ---- */

static const char* tune_file(const char* text) {
  static char path[64];
  static int seq; /* a new name per content: the library reads each file once per process */
  snprintf(path, sizeof(path), "/tmp/chorus-tune-%d-%d.conf", (int)getpid(), seq++);
  FILE* f = fopen(path, "w");
  ASSERT(f);
  fputs(text, f);
  fclose(f);
  return path;
}

TEST_T(tuning, tune_file_malformed_fails_init, 60) {
  tt_set("CHORUS_TUNE_FILE", tune_file("step_us.Simple = 0.5\nwarp_speed = 9\n"));
  rt_run_both(2, init_fails_body, "unknown constant \"warp_speed\"");
  tt_set("CHORUS_TUNE_FILE", tune_file("net_bw = -3\n"));
  rt_run_threads(2, init_fails_body, "net_bw = -3 is outside");
  tt_set("CHORUS_TUNE_FILE", tune_file("copy_bw 12\n"));
  rt_run_threads(2, init_fails_body, "line 1: expected \"name = number\"");
  tt_set("CHORUS_TUNE_FILE", "/nonexistent/chorus-tune.conf");
  rt_run_threads(2, init_fails_body, "/nonexistent/chorus-tune.conf cannot be read");
}

/* What chorus-info --calibrate writes reads back exactly (%.6g made chan_bytes 1048580), behind a
 * comment line longer than the reader's buffer (a long path in it split the line and failed init);
 * a directory is not a file (it read as an empty one). */
TEST_T(tuning, tune_file_round_trips, 60) {
  char path[64];
  snprintf(path, sizeof(path), "/tmp/chorus-tune-%d-rt.conf", (int)getpid());
  FILE* f = fopen(path, "w");
  ASSERT(f);
  fputc('#', f);
  for (int i = 0; i < 300; i++) fputc('x', f);
  fputc('\n', f);
  tune_model_write(f, tune_model_defaults());
  fclose(f);
  tt_set("CHORUS_TUNE_FILE", path);
  EXPECT_EQ(tune_model_status(), CH_OK);
  EXPECT(memcmp(tune_model_get(), tune_model_defaults(), sizeof(struct tune_model)) == 0);
  EXPECT_EQ(tune_model_get()->chan_bytes, (size_t)1 << 20);
  unlink(path);
  tt_set("CHORUS_TUNE_FILE", "/tmp");
  EXPECT_EQ(tune_model_status(), CH_INVALID_USAGE);
  tt_set("CHORUS_TUNE_FILE", NULL);
}

/* The file's constants drive the choice: hops made dear enough favour RecDbl up to large sizes. */
static void tune_file_body(int rank, int nranks, ncclUniqueId id, void* arg) {
  (void)arg;
  ncclComm_t comm;
  NCCL_OK(ncclCommInitRank(&comm, nranks, id, rank));
  EXPECT(tune_model_get()->step_us[PROTO_SIMPLE] == 500.0);
  struct tune_choice a;
  tune_choose(comm, FUNC_ALLREDUCE, 64 << 10, CH_REPRO_OFF, &a); /* Direct's threshold is higher */
  EXPECT_EQ(a.algo, ALGO_RECDBL);
  NCCL_OK(ncclCommDestroy(comm));
}

TEST_T(tuning, tune_file_is_used, 60) {
  tt_set("CHORUS_TUNE_FILE", tune_file("# comment\n\nstep_us.LL = 500\nstep_us.LL128 = 500\nstep_us.Simple = 500  # dear\n"));
  rt_run_procs(4, tune_file_body, NULL);
}

/* Ranks with different constants would choose differently: init fails on every rank. */
static void tune_file_differs_body(int rank, int nranks, ncclUniqueId id, void* arg) {
  if (rank == 1) tt_set("CHORUS_TUNE_FILE", (const char*)arg);
  init_fails_body(rank, nranks, id, "CHORUS_TUNE_FILE (cost model constants) differs");
}

TEST_T(tuning, tune_file_must_agree, 60) {
  rt_run_procs(2, tune_file_differs_body, (void*)tune_file("step_us.Simple = 2\n"));
}

struct call_case {
  int func;
  ncclResult_t want;
  const char* why; /* in the WARN when want is an error */
};

static void call_body(int rank, int nranks, ncclUniqueId id, void* arg) {
  const struct call_case* cases = arg;
  ncclComm_t comm;
  NCCL_OK(ncclCommInitRank(&comm, nranks, id, rank));
  float v[64];
  for (const struct call_case* c = cases; c->why; c++) {
    for (int i = 0; i < 64; i++) v[i] = (float)(rank + 1);
    ncclResult_t r;
    switch (c->func) {
      case FUNC_ALLREDUCE: r = ncclAllReduce(v, v, 64, ncclFloat, ncclSum, comm, NULL); break;
      case FUNC_BROADCAST: r = ncclBroadcast(v, v, 64, ncclFloat, 0, comm, NULL); break;
      case FUNC_ALLGATHER: r = ncclAllGather(v, v, 64 / nranks, ncclFloat, comm, NULL); break;
      default: r = ncclReduce(v, v, 64, ncclFloat, ncclSum, 0, comm, NULL); break;
    }
    if (r != c->want)
      rt_fail(__FILE__, __LINE__, "rank %d NCCL_ALGO=%s NCCL_PROTO=%s %s: %d, want %d", rank, param_str(PARAM_ALGO),
              param_str(PARAM_PROTO), tune_func_name(c->func), (int)r, (int)c->want);
    else if (r != ncclSuccess && !strstr(ncclGetLastError(comm), c->why))
      rt_fail(__FILE__, __LINE__, "rank %d: \"%s\" lacks \"%s\"", rank, ncclGetLastError(comm), c->why);
    else if (c->func == FUNC_ALLREDUCE && r == ncclSuccess && v[63] != (float)(nranks * (nranks + 1) / 2))
      rt_fail(__FILE__, __LINE__, "rank %d: AllReduce gave %g", rank, v[63]);
  }
  NCCL_OK(ncclCommDestroy(comm));
}

TEST_T(tuning, unrunnable_fails_the_call, 90) {
  /* NVLS is NCCL's, not implemented here: every collective fails, naming why; Tree serves AllReduce,
   * Broadcast and Reduce only */
  tt_set("NCCL_ALGO", "NVLS");
  struct call_case nvls[] = {{FUNC_ALLREDUCE, ncclInvalidUsage, "NCCL_ALGO=NVLS leaves it no algorithm Chorus can run"},
                             {FUNC_BROADCAST, ncclInvalidUsage, "Broadcast: NCCL_ALGO=NVLS"},
                             {0, 0, NULL}};
  rt_run_both(2, call_body, nvls);
  tt_set("NCCL_ALGO", "Tree");
  struct call_case tree[] = {{FUNC_ALLREDUCE, ncclSuccess, ""},
                             {FUNC_BROADCAST, ncclSuccess, ""},
                             {FUNC_REDUCE, ncclSuccess, ""},
                             {FUNC_ALLGATHER, ncclInvalidUsage, "AllGather: NCCL_ALGO=Tree"},
                             {0, 0, NULL}};
  rt_run_both(2, call_body, tree);
  /* per collective: AllReduce on PAT fails, the others run Ring */
  tt_set("NCCL_ALGO", "allreduce:pat");
  struct call_case pat[] = {{FUNC_BROADCAST, ncclSuccess, ""},
                            {FUNC_ALLREDUCE, ncclInvalidUsage, "allowed for AllReduce: PAT"},
                            {FUNC_ALLGATHER, ncclSuccess, ""},
                            {FUNC_REDUCE, ncclSuccess, ""},
                            {0, 0, NULL}};
  rt_run_threads(2, call_body, pat);
  /* Exchange needs two ranks */
  tt_set("NCCL_ALGO", "allreduce:exchange");
  struct call_case exch3[] = {{FUNC_ALLREDUCE, ncclInvalidUsage, "Exchange needs 2 ranks"}, {0, 0, NULL}};
  rt_run_threads(3, call_body, exch3);
  struct call_case exch2[] = {{FUNC_ALLREDUCE, ncclSuccess, ""}, {FUNC_BROADCAST, ncclSuccess, ""}, {0, 0, NULL}};
  rt_run_procs(2, call_body, exch2);
  /* the network transport carries Simple only */
  tt_set("NCCL_ALGO", NULL);
  tt_set("NCCL_PROTO", "LL,LL128");
  tt_set("NCCL_SHM_DISABLE", "1");
  struct call_case net[] = {{FUNC_ALLREDUCE, ncclInvalidUsage, "the network transport carries only Simple"},
                            {0, 0, NULL}};
  rt_run_procs(2, call_body, net);
  tt_set("NCCL_PROTO", "broadcast:LL");
  struct call_case net2[] = {{FUNC_ALLREDUCE, ncclSuccess, ""},
                             {FUNC_BROADCAST, ncclInvalidUsage, "allowed for Broadcast: LL; runnable: Simple"},
                             {0, 0, NULL}};
  rt_run_procs(2, call_body, net2);
}

/* Forced choices are what tune_choose returns, per collective. */
static void forced_body(int rank, int nranks, ncclUniqueId id, void* arg) {
  (void)arg;
  ncclComm_t comm;
  NCCL_OK(ncclCommInitRank(&comm, nranks, id, rank));
  struct tune_choice how;
  const size_t sizes[] = {8, 4096, 1 << 20, 16 << 20};
  for (size_t s = 0; s < 4; s++) {
    tune_choose(comm, FUNC_ALLREDUCE, sizes[s], CH_REPRO_OFF, &how);
    EXPECT_EQ(how.algo, ALGO_RING);
    EXPECT_EQ(how.proto, PROTO_LL128);
    tune_choose(comm, FUNC_BROADCAST, sizes[s], CH_REPRO_OFF, &how);
    EXPECT_EQ(how.algo, ALGO_RING);
    EXPECT_EQ(how.proto, PROTO_SIMPLE);
  }
  float v[1000];
  for (int i = 0; i < 1000; i++) v[i] = (float)(rank + i);
  NCCL_OK(ncclAllReduce(v, v, 1000, ncclFloat, ncclSum, comm, NULL));
  for (int i = 0; i < 1000; i++)
    if (v[i] != (float)(nranks * i + nranks * (nranks - 1) / 2)) {
      rt_fail(__FILE__, __LINE__, "rank %d: v[%d] = %g", rank, i, v[i]);
      break;
    }
  NCCL_OK(ncclCommDestroy(comm));
}

TEST_T(tuning, per_collective_forcing_is_honoured, 60) {
  tt_set("NCCL_ALGO", "ring;allreduce:ring,tree");
  tt_set("NCCL_PROTO", "simple;allreduce:ll128");
  rt_run_both(2, forced_body, NULL);
}

/* ---- agreement across ranks (processes, each with its own environment) ---- */

struct agree_case {
  const char* algo[2];
  const char* lines[2];
  const char* var; /* what algo[] sets (NULL: NCCL_ALGO) */
};

static void agree_body(int rank, int nranks, ncclUniqueId id, void* arg) {
  const struct agree_case* c = arg;
  tt_set(c->var ? c->var : "NCCL_ALGO", c->algo[rank]);
  char path[128];
  snprintf(path, sizeof(path), "/tmp/chorus-tuning-%d.log", (int)getpid());
  unlink(path);
  setenv("NCCL_DEBUG", "WARN", 1);
  setenv("NCCL_DEBUG_FILE", path, 1);
  param_reset();
  log_reset();
  ncclComm_t comm = NULL;
  ncclResult_t r = ncclCommInitRank(&comm, nranks, id, rank);
  if (r != ncclInvalidUsage) rt_fail(__FILE__, __LINE__, "rank %d: init -> %d, want ncclInvalidUsage", rank, (int)r);
  if (r == ncclSuccess) ncclCommDestroy(comm);
  log_reset();
  static char text[1 << 14];
  FILE* f = fopen(path, "r");
  size_t n = f ? fread(text, 1, sizeof(text) - 1, f) : 0;
  text[n] = 0;
  if (f) fclose(f);
  for (int i = 0; i < 2 && c->lines[i]; i++)
    if (!strstr(text, c->lines[i])) rt_fail(__FILE__, __LINE__, "rank %d: log lacks \"%s\":\n%s", rank, c->lines[i], text);
  unlink(path);
}

TEST_T(tuning, per_collective_masks_must_agree, 60) {
  struct agree_case differ = {{"ring;allreduce:ring,exchange", "ring"},
                              {"NCCL_ALGO differs across ranks: Broadcast:Ring;Reduce:Ring;AllGather:Ring;"
                               "ReduceScatter:Ring;AllReduce:Ring,Exchange on rank 0, Ring on rank 1", NULL}, NULL};
  rt_run_procs(2, agree_body, &differ);
  struct agree_case malformed = {{"ring;tree", "ring"},
                                 {"NCCL_ALGO differs across ranks: (malformed) on rank 0, Ring on rank 1", NULL}, NULL};
  rt_run_procs(2, agree_body, &malformed);
}

/* ---- ncclGroupSimulateEnd ---- */

/* arg: NULL, or the reproducible level the communicator takes (its AllReduce then predicted as one
 * that honours it: Owner or Direct). */
static void sim_body(int rank, int nranks, ncclUniqueId id, void* arg) {
  ncclComm_t comm;
  NCCL_OK(ncclCommInitRank(&comm, nranks, id, rank));
  int level = arg ? *(int*)arg : CH_REPRO_OFF;
  if (level) NCCL_OK(chorusCommSetReproducible(comm, level));
  static float in[1 << 18], out[1 << 18];
  struct tune_choice how;
  double want = tune_predict(comm, FUNC_ALLREDUCE, sizeof(in), level, &how);
  if (level) EXPECT_EQ(how.algo, ALGO_OWNER);
  want += tune_predict(comm, FUNC_BROADCAST, 400, CH_REPRO_OFF, &how);
  ncclSimInfo_t sim = NCCL_SIM_INFO_INITIALIZER;
  NCCL_OK(ncclGroupStart());
  NCCL_OK(ncclAllReduce(in, out, 1 << 18, ncclFloat, ncclSum, comm, NULL));
  NCCL_OK(ncclBroadcast(in, out, 100, ncclFloat, 0, comm, NULL));
  NCCL_OK(ncclGroupSimulateEnd(&sim));
  if (!(sim.estimatedTime > 0) || sim.estimatedTime < (float)want * 0.999f || sim.estimatedTime > (float)want * 1.001f)
    rt_fail(__FILE__, __LINE__, "estimated %g us, the model predicts %g", (double)sim.estimatedTime, want);
  NCCL_OK(ncclCommDestroy(comm));
}

TEST(tuning, simulate_end_is_the_model) {
  rt_run_both(2, sim_body, NULL);
  /* Under a level the calls are predicted as plan_build will choose them: Owner here, where Ring
   * would run otherwise (Direct, which both would take, is ruled out so that they differ). */
  setenv("NCCL_ALGO", "allreduce:Ring,Owner", 1);
  param_reset();
  int level = CH_REPRO_ORDER;
  rt_run_both(3, sim_body, &level);
  unsetenv("NCCL_ALGO");
  param_reset();
}

const char* tt_csv_plugin(void); /* test_tuner_plugin.c */

TEST_T(tuning, tuner_loaded_must_agree, 60) {
  const char* lib = tt_csv_plugin();
  if (!lib) return;
  struct agree_case c = {{lib, "none"}, {"NCCL_TUNER_PLUGIN (a tuner plugin loaded) differs across ranks: 1 on rank 0, 0 on rank 1", NULL},
                         "NCCL_TUNER_PLUGIN"};
  rt_run_procs(2, agree_body, &c);
}
