/* Tuner plugins as NCCL loads them: NCCL_TUNER_PLUGIN names (plugins/tuner-csv, built into build/lib),
 * its getCollInfo overriding the cost model (algorithm, protocol, channels), what is logged, a missing
 * plugin, agreement across ranks, and a v6 tuner's getChunkSize (tests/tuner_stub). */
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

void tt_set(const char* name, const char* value); /* test_tuning.c */

/* ---- tuner plugins (plugins/tuner-csv, built into build/lib) ---- */

TEST(tuning, tuner_library_names) {
  char c[2][512];
  EXPECT_EQ(tuner_candidates("", c), 1);
  EXPECT(!strcmp(c[0], "libnccl-tuner.so"));
  EXPECT_EQ(tuner_candidates("none", c), 0);
  EXPECT_EQ(tuner_candidates("NONE", c), 0);
  EXPECT_EQ(tuner_candidates("csv", c), 2);
  EXPECT(!strcmp(c[0], "csv") && !strcmp(c[1], "libnccl-tuner-csv.so"));
  EXPECT_EQ(tuner_candidates("/opt/x/libnccl-tuner-csv.so", c), 1);
  EXPECT_EQ(tuner_candidates("libmytuner.so.1", c), 1);
  EXPECT_EQ(tuner_candidates("mytuner.so", c), 1);
}

/* The example plugin next to the test binary; NULL (after saying so) when it was not built. */
/* Also test_tuning.c's (agreement). */
const char* tt_csv_plugin(void) {
  static char path[PATH_MAX + 64];
  char exe[PATH_MAX];
  ssize_t n = readlink("/proc/self/exe", exe, sizeof(exe) - 1);
  if (n <= 0) return NULL;
  exe[n] = 0;
  char* slash = strrchr(exe, '/');
  if (!slash) return NULL;
  *slash = 0;
  snprintf(path, sizeof(path), "%s/../lib/libnccl-tuner-csv.so", exe);
  if (access(path, R_OK) != 0) {
    printf("    SKIP: %s not built (plugins/tuner-csv)\n", path);
    return NULL;
  }
  return path;
}

/* Rules into a file of this test (pid), named by NCCL_TUNER_CONFIG_FILE. */
static void use_rules(const char* rules) {
  static char path[64];
  snprintf(path, sizeof(path), "/tmp/chorus-tuner-%d.csv", (int)getpid());
  FILE* f = fopen(path, "w");
  ASSERT(f);
  fputs(rules, f);
  fclose(f);
  tt_set("NCCL_TUNER_CONFIG_FILE", path);
}

struct want_choice {
  int func;
  size_t bytes;
  int algo, proto, nch; /* nch 0: not checked */
};

static void plugin_body(int rank, int nranks, ncclUniqueId id, void* arg) {
  const struct want_choice* w = arg;
  ncclComm_t comm;
  NCCL_OK(ncclCommInitRank(&comm, nranks, id, rank));
  for (; w->bytes; w++) {
    struct tune_choice how;
    tune_choose(comm, w->func, w->bytes, CH_REPRO_OFF, &how);
    if (how.algo != w->algo || how.proto != w->proto || (w->nch && how.nch != w->nch))
      rt_fail(__FILE__, __LINE__, "%s rank %d, tuner %s, %s %zu bytes: %s/%s/%d ch, want %s/%s/%d", rt_mode(), rank,
              tuner_name(comm), tune_func_name(w->func), w->bytes, algo_name(how.algo), tune_proto_name(how.proto),
              how.nch, algo_name(w->algo), tune_proto_name(w->proto), w->nch);
  }
  /* and the calls run with what the plugin chose */
  float* v = malloc(sizeof(float) << 16); /* per rank: ranks may be threads */
  ASSERT(v);
  const size_t counts[] = {1, 1000, 1 << 16};
  for (int c = 0; c < 3; c++) {
    for (size_t i = 0; i < counts[c]; i++) v[i] = (float)(rank + (int)(i % 7));
    NCCL_OK(ncclAllReduce(v, v, counts[c], ncclFloat, ncclSum, comm, NULL));
    for (size_t i = 0; i < counts[c]; i++)
      if (v[i] != (float)(nranks * (int)(i % 7) + nranks * (nranks - 1) / 2)) {
        rt_fail(__FILE__, __LINE__, "rank %d count %zu: v[%zu] = %g", rank, counts[c], i, v[i]);
        break;
      }
    for (size_t i = 0; i < counts[c]; i++) v[i] = rank == 0 ? (float)i : -1.0f;
    NCCL_OK(ncclBroadcast(v, v, counts[c], ncclFloat, 0, comm, NULL));
    for (size_t i = 0; i < counts[c]; i++)
      if (v[i] != (float)i) {
        rt_fail(__FILE__, __LINE__, "rank %d broadcast count %zu: v[%zu] = %g", rank, counts[c], i, v[i]);
        break;
      }
  }
  free(v);
  NCCL_OK(ncclCommDestroy(comm));
}

TEST_T(tuning, tuner_plugin_forces_ring_over_exchange_and_direct, 90) {
  const char* lib = tt_csv_plugin();
  if (!lib) return;
  /* without the plugin: Exchange (2 processes), Direct (threads and >= 256 KiB) */
  struct want_choice none[] = {{FUNC_ALLREDUCE, 4096, ALGO_EXCHANGE, PROTO_SIMPLE, 0}, {0, 0, 0, 0, 0}};
  rt_run_procs(2, plugin_body, none);
  tt_set("NCCL_TUNER_PLUGIN", lib);
  use_rules("# collective,minbytes,maxbytes,algorithm,protocol\n"
            "allreduce, 0, -1, ring, simple\n");
  struct want_choice ring[] = {{FUNC_ALLREDUCE, 8, ALGO_RING, PROTO_SIMPLE, 0},
                               {FUNC_ALLREDUCE, 4096, ALGO_RING, PROTO_SIMPLE, 0},
                               {FUNC_ALLREDUCE, 1 << 20, ALGO_RING, PROTO_SIMPLE, 0},
                               {FUNC_BROADCAST, 8, ALGO_RING, PROTO_LL, 0}, /* no rule: the model's */
                               {0, 0, 0, 0, 0}};
  rt_run_both(2, plugin_body, ring);
}

/* Tree is in NCCL's table too: a plugin that picks it for AllReduce gets it (and exact results). */
TEST_T(tuning, tuner_plugin_forces_tree, 90) {
  const char* lib = tt_csv_plugin();
  if (!lib) return;
  tt_set("NCCL_TUNER_PLUGIN", lib);
  /* A line longer than the plugin's buffer is skipped whole (its tail, a Ring rule here, was parsed as
   * a line of its own), and a count past int refused (4294967299 wrapped into 3: a rule for these 3 ranks). */
  static char rules[2048];
  char pad[511];
  memset(pad, 'x', 510), pad[510] = 0; /* '#' and these fill the 511 bytes fgets takes; the rest is the tail */
  snprintf(rules, sizeof(rules), "#%sallreduce,0,-1,ring,simple\nallreduce,0,-1,ring,simple,1,1,4294967299\n"
           "allreduce,0,-1,tree,simple\n", pad);
  use_rules(rules);
  struct want_choice tree[] = {{FUNC_ALLREDUCE, 8, ALGO_TREE, PROTO_SIMPLE, 1},
                               {FUNC_ALLREDUCE, 1 << 20, ALGO_TREE, PROTO_SIMPLE, 1},
                               {FUNC_BROADCAST, 8, ALGO_RING, PROTO_LL, 0},
                               {0, 0, 0, 0, 0}};
  rt_run_both(3, plugin_body, tree);
}

TEST_T(tuning, tuner_plugin_forces_protocol_and_channels, 90) {
  const char* lib = tt_csv_plugin();
  if (!lib) return;
  tt_set("NCCL_TUNER_PLUGIN", lib);
  tt_set("NCCL_MAX_NCHANNELS", "2");
  use_rules("allreduce,0,100000,ring,ll\n"
            "allreduce,100001,-1,ring,ll128,2\n"
            "broadcast,0,-1,ring,simple\n"
            "allgather,0,-1,tree,simple\n" /* Tree: not available here, so the model decides */
            "bogus,line\n");              /* reported by the plugin, ignored */
  struct want_choice w[] = {{FUNC_ALLREDUCE, 4096, ALGO_RING, PROTO_LL, 1},
                            {FUNC_ALLREDUCE, 1 << 18, ALGO_RING, PROTO_LL128, 2},
                            {FUNC_BROADCAST, 8, ALGO_RING, PROTO_SIMPLE, 0},
                            {FUNC_ALLGATHER, 8, ALGO_RING, PROTO_LL, 0},
                            {0, 0, 0, 0, 0}};
  rt_run_both(2, plugin_body, w);
}

/* The TUNING log names the plugin, the choice and the prediction. */
static void log_body(int rank, int nranks, ncclUniqueId id, void* arg) {
  (void)arg;
  char path[128];
  snprintf(path, sizeof(path), "/tmp/chorus-tuning-log-%d.log", (int)getpid());
  unlink(path);
  setenv("NCCL_DEBUG", "INFO", 1);
  setenv("NCCL_DEBUG_SUBSYS", "TUNING", 1);
  setenv("NCCL_DEBUG_FILE", path, 1);
  param_reset();
  log_reset();
  ncclComm_t comm;
  NCCL_OK(ncclCommInitRank(&comm, nranks, id, rank));
  float v[1024] = {0};
  NCCL_OK(ncclAllReduce(v, v, 1024, ncclFloat, ncclSum, comm, NULL));
  NCCL_OK(ncclCommDestroy(comm));
  log_reset();
  static char text[1 << 15];
  FILE* f = fopen(path, "r");
  size_t n = f ? fread(text, 1, sizeof(text) - 1, f) : 0;
  text[n] = 0;
  if (f) fclose(f);
  const char* want[] = {"tuner plugin csv (ncclTunerPlugin_v6) loaded from", "tuner-csv: 1 rule(s) from",
                        "tuner-csv: allreduce 4096 bytes: rule of line 1 -> ring/ll",
                        "AllReduce 4096 bytes: algorithm Ring, protocol LL, 1 channel(s), predicted "};
  for (int i = 0; i < 4; i++)
    if (!strstr(text, want[i])) rt_fail(__FILE__, __LINE__, "rank %d: log lacks \"%s\":\n%s", rank, want[i], text);
  if (!strstr(text, "(tuner plugin csv)")) rt_fail(__FILE__, __LINE__, "rank %d: no tuner source in:\n%s", rank, text);
  unlink(path);
}

TEST_T(tuning, tuner_choice_is_logged, 60) {
  const char* lib = tt_csv_plugin();
  if (!lib) return;
  tt_set("NCCL_TUNER_PLUGIN", lib);
  use_rules("allreduce,0,-1,ring,ll\n");
  rt_run_procs(2, log_body, NULL);
}

static void missing_body(int rank, int nranks, ncclUniqueId id, void* arg) {
  ncclComm_t comm;
  NCCL_OK(ncclCommInitRank(&comm, nranks, id, rank));
  EXPECT(comm->tuner == NULL);
  const char* err = ncclGetLastError(NULL);
  for (const char* const* w = arg; *w; w++)
    if (!strstr(err, *w)) rt_fail(__FILE__, __LINE__, "rank %d: last error \"%s\" lacks \"%s\"", rank, err, *w);
  float v[16];
  for (int i = 0; i < 16; i++) v[i] = 1;
  NCCL_OK(ncclAllReduce(v, v, 16, ncclFloat, ncclSum, comm, NULL));
  EXPECT(v[15] == (float)nranks);
  NCCL_OK(ncclCommDestroy(comm));
}

TEST_T(tuning, missing_tuner_plugin_is_reported_not_fatal, 60) {
  tt_set("NCCL_TUNER_PLUGIN", "/nonexistent/libnccl-tuner-x.so");
  const char* path[] = {"NCCL_TUNER_PLUGIN=/nonexistent/libnccl-tuner-x.so: could not load /nonexistent/libnccl-tuner-x.so",
                        "No such file or directory", "continuing without a tuner plugin", NULL};
  rt_run_both(2, missing_body, path);
  tt_set("NCCL_TUNER_PLUGIN", "nosuchtuner");
  const char* name[] = {"could not load nosuchtuner (", "nor libnccl-tuner-nosuchtuner.so (", NULL};
  rt_run_procs(2, missing_body, name);
  /* a library that is not a tuner */
  tt_set("NCCL_TUNER_PLUGIN", "libm.so.6");
  const char* notuner[] = {"libm.so.6 exports no ncclTunerPlugin_v6/v5/v4/v3 symbol", NULL};
  rt_run_threads(2, missing_body, notuner);
}

/* ---- a v6 tuner's getChunkSize (tests/tuner_stub) ---- */

struct chunk_case {
  const char* algo;  /* what the stub makes win: "ring" or "tree" */
  const char* chunk; /* what getChunkSize answers (CHORUS_TEST_TUNER_CHUNK; NULL: unchanged) */
  size_t want;       /* the step bytes the call gets (0: a whole step, the default) */
  const char* warn;  /* the WARN it gives (once), or NULL */
};

/* The choice carries the checked chunk, the plan's ops use it, the calls stay exact, the TUNING line
 * says it, and a refused answer gives one WARN per communicator however many calls ask. */
static void chunk_body(int rank, int nranks, ncclUniqueId id, void* arg) {
  const struct chunk_case* c = arg;
  char log[128], out[128];
  snprintf(log, sizeof(log), "/tmp/chorus-tuner-chunk-%d.log", (int)getpid());
  snprintf(out, sizeof(out), "/tmp/chorus-tuner-chunk-%d.out", (int)getpid());
  unlink(log), unlink(out);
  setenv("NCCL_DEBUG", "INFO", 1);
  setenv("NCCL_DEBUG_SUBSYS", "TUNING", 1);
  setenv("NCCL_DEBUG_FILE", log, 1);
  setenv("CHORUS_TEST_TUNER_OUT", out, 1);
  param_reset();
  log_reset();
  ncclComm_t comm;
  NCCL_OK(ncclCommInitRank(&comm, nranks, id, rank));
  int algo = !strcmp(c->algo, "tree") ? ALGO_TREE : ALGO_RING;
  size_t step = tune_step_elems(comm, 1, algo, PROTO_SIMPLE, 4) * 4;
  struct tune_choice how;
  tune_choose_sel(comm, FUNC_ALLREDUCE, 1 << 20, 4, CH_REPRO_OFF, 0, 0, &how);
  EXPECT_EQ(how.algo, algo);
  EXPECT_EQ(how.proto, PROTO_SIMPLE);
  EXPECT_EQ(how.chunk, c->want);
  const size_t n = 1 << 16; /* 256 KiB: several steps of a small chunk */
  float* v = malloc(n * sizeof(float));
  ASSERT(v);
  for (int k = 0; k < 2; k++) { /* the second repeats the first: a reused plan keeps the chunk */
    for (size_t i = 0; i < n; i++) v[i] = (float)(rank + (int)(i % 7));
    NCCL_OK(ncclAllReduce(v, v, n, ncclFloat, ncclSum, comm, NULL));
    for (size_t i = 0; i < n; i++)
      if (v[i] != (float)(nranks * (int)(i % 7) + nranks * (nranks - 1) / 2)) {
        rt_fail(__FILE__, __LINE__, "rank %d call %d: v[%zu] = %g", rank, k, i, v[i]);
        break;
      }
  }
  free(v);
  struct ch_plan* plan = atomic_load(&comm->reuse_plan);
  if (plan && plan->nops > 0) EXPECT_EQ(plan->ops[0].chunk, (c->want ? c->want : step) / 4);
  else rt_fail(__FILE__, __LINE__, "rank %d: no plan kept to look at", rank);
  NCCL_OK(ncclCommDestroy(comm));
  log_reset();
  /* what the plugin was asked: AllReduce (4), its bytes, the algorithm, Simple (2), the channels, a step */
  FILE* f = fopen(out, "r");
  int fn = -1, fa = -1, fp = -1, fch = -1;
  size_t fb = 0, fin = 0;
  EXPECT(f && fscanf(f, "%d %zu %d %d %d %zu", &fn, &fb, &fa, &fp, &fch, &fin) == 6);
  if (f) fclose(f);
  EXPECT(fn == 4 && fb == (size_t)1 << 20 && fa == algo && fp == 2 && fch == how.nch && fin == step);
  static char text[1 << 16];
  f = fopen(log, "r");
  size_t len = f ? fread(text, 1, sizeof(text) - 1, f) : 0;
  text[len] = 0;
  if (f) fclose(f);
  char want[96];
  snprintf(want, sizeof(want), ", %zu-byte steps (tuner plugin's getChunkSize)", c->want);
  if (c->want && !strstr(text, want)) rt_fail(__FILE__, __LINE__, "rank %d: log lacks \"%s\":\n%s", rank, want, text);
  if (!c->want && strstr(text, "-byte steps (tuner"))
    rt_fail(__FILE__, __LINE__, "rank %d: a chunk logged:\n%s", rank, text);
  int warns = 0;
  for (const char* p = text; (p = strstr(p, "getChunkSize(")); p++) warns++;
  EXPECT_EQ(warns, c->warn ? 1 : 0);
  if (c->warn && !strstr(text, c->warn))
    rt_fail(__FILE__, __LINE__, "rank %d: log lacks \"%s\":\n%s", rank, c->warn, text);
  unlink(log), unlink(out);
}

static void chunk_run(int nranks, const struct chunk_case* c) {
  tt_set("CHORUS_TEST_TUNER_ALGO", c->algo);
  tt_set("CHORUS_TEST_TUNER_CHUNK", c->chunk);
  rt_run_procs(nranks, chunk_body, (void*)c);
}

TEST_T(tuning, tuner_chunk_size_sets_the_step, 90) {
  tt_set("NCCL_TUNER_PLUGIN", CHORUS_TUNER_STUB);
  struct chunk_case ring = {"ring", "4100", 4100, NULL}; /* 1025 floats: not a multiple of 8 elements */
  chunk_run(2, &ring);
  struct chunk_case tree = {"tree", "4096", 4096, NULL}; /* Tree's per-peer FIFOs: their own step */
  chunk_run(3, &tree);
  struct chunk_case keep = {"ring", NULL, 0, NULL}; /* the default given back: nothing to log */
  chunk_run(2, &keep);
  tt_set("CHORUS_TEST_TUNER_CHUNK", NULL);
}

TEST_T(tuning, tuner_chunk_size_refused_with_one_warn, 120) {
  tt_set("NCCL_TUNER_PLUGIN", CHORUS_TUNER_STUB);
  struct chunk_case zero = {"ring", "0", 0, "chose 0 bytes, which is 0; using "};
  chunk_run(2, &zero);
  struct chunk_case split = {"ring", "4098", 0, "chose 4098 bytes, which is not a whole number of elements"};
  chunk_run(2, &split);
  struct chunk_case big = {"ring", "1073741824", 0, "chose 1073741824 bytes, which is more than a FIFO step holds"};
  chunk_run(2, &big);
  struct chunk_case fail = {"ring", "fail", 0, "returned 3; using "};
  chunk_run(2, &fail);
  tt_set("CHORUS_TEST_TUNER_CHUNK", NULL);
}
