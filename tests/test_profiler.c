/* NCCL profiler plugins (observe/profiler.c): the stub plugin (profiler_stub/) checks the event stream
 * as it comes (every start has a stop, parents before children, ...) and writes one line per
 * communicator at finalize; the tests compare its counts and descriptors with the calls made, for
 * the v7, v6 and v5 builds, with ranks as threads and as processes, and check the activation mask's
 * gating, v7's userTag (ncclCollConfig_t.userProfilerTag), NCCL_PROFILER_PLUGIN's forms ("none", a
 * missing library) and a plugin whose init fails. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "comm/comm.h"
#include "misc/log.h"
#include "misc/param.h"
#include "observe/observe.h"
#include "runner.h"

static char out_dir[128], out_path[256];

/* Remove the stub's output of the previous use_plugin. */
static void done_plugin(void) {
  if (!out_dir[0]) return;
  unlink(out_path);
  rmdir(out_dir);
  out_dir[0] = 0;
}

/* A fresh output file for the stub, and NCCL_PROFILER_PLUGIN=lib (NULL: unset); mask NULL: the stub's
 * default (every kind). Forked rank processes inherit it. */
static void use_plugin(const char* lib, const char* mask) {
  done_plugin();
  snprintf(out_dir, sizeof(out_dir), "%s/chorus-prof-XXXXXX", getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp");
  if (!mkdtemp(out_dir)) rt_fail_fatal(__FILE__, __LINE__, "mkdtemp %s failed", out_dir);
  snprintf(out_path, sizeof(out_path), "%s/events.txt", out_dir);
  setenv("CHORUS_TEST_PROFILER_OUT", out_path, 1);
  if (lib) setenv("NCCL_PROFILER_PLUGIN", lib, 1);
  else unsetenv("NCCL_PROFILER_PLUGIN");
  if (mask) setenv("CHORUS_TEST_PROFILER_MASK", mask, 1);
  else unsetenv("CHORUS_TEST_PROFILER_MASK");
  param_reset();
}

/* The stub's line for (comm, rank), or 0. */
static int find_line(uint64_t hash, int rank, char* line, size_t cap) {
  FILE* f = fopen(out_path, "r");
  if (!f) return 0;
  char id[64], rk[32];
  snprintf(id, sizeof(id), " commId=%016llx ", (unsigned long long)hash);
  snprintf(rk, sizeof(rk), " rank=%d ", rank);
  int found = 0;
  while (!found && fgets(line, (int)cap, f)) found = strstr(line, id) && strstr(line, rk);
  fclose(f);
  return found;
}
static long num(const char* line, const char* key) {
  char k[32];
  snprintf(k, sizeof(k), " %s=", key);
  const char* p = strstr(line, k);
  return p ? strtol(p + strlen(k), NULL, 0) : -999;
}
static const char* str(const char* line, const char* key, char* out, size_t cap) {
  char k[32];
  snprintf(k, sizeof(k), " %s=", key);
  const char* p = strstr(line, k);
  size_t n = 0;
  if (p)
    for (p += strlen(k); p[n] && p[n] != ' ' && p[n] != '\n' && n + 1 < cap; n++) out[n] = p[n];
  out[n] = 0;
  return out;
}

struct want {
  int version, mask;                       /* mask: what the plugin sees at finalize */
  int group_api, coll_api, p2p_api, group, coll, p2p;
  int recorder_forced;                     /* CHORUS_FLIGHT_RECORDER=0: the recorder exists anyway */
};

/* The line of (hash, rank): found, the stub saw no error, nothing left open, and the counts. */
static void check_counts(uint64_t hash, int rank, const struct want* w, char* line, size_t cap) {
  if (!find_line(hash, rank, line, cap)) {
    rt_fail(__FILE__, __LINE__, "[%s rank %d] no profiler line for comm %016llx in %s", rt_mode(), rank,
            (unsigned long long)hash, out_path);
    line[0] = 0;
    return;
  }
  char err[256];
  if (num(line, "errors") != 0) rt_fail(__FILE__, __LINE__, "[%s rank %d] stub: %s", rt_mode(), rank, str(line, "err", err, sizeof(err)));
  EXPECT_EQ(num(line, "open"), 0);
  EXPECT_EQ(num(line, "other"), 0);
  EXPECT_EQ(num(line, "v"), w->version);
  EXPECT_EQ(num(line, "mask"), w->mask);
  EXPECT_EQ(num(line, "GroupApi"), w->group_api);
  EXPECT_EQ(num(line, "CollApi"), w->coll_api);
  EXPECT_EQ(num(line, "P2pApi"), w->p2p_api);
  EXPECT_EQ(num(line, "Group"), w->group);
  EXPECT_EQ(num(line, "Coll"), w->coll);
  EXPECT_EQ(num(line, "P2p"), w->p2p);
}

/* AllReduce x3, Broadcast, a grouped Send/Recv, AllGather: 6 plans, 5 collectives, 2 sends/receives. */
static void sequence_body(int rank, int nranks, ncclUniqueId id, void* arg) {
  const struct want* w = arg;
  ncclComm_t comm;
  NCCL_OK(ncclCommInitRank(&comm, nranks, id, rank));
  uint64_t hash = comm->comm_hash;
  EXPECT(comm->prof != NULL);
  if (w->recorder_forced) EXPECT(comm->fr != NULL);
  float buf[1024], out[4096];
  for (int i = 0; i < 1024; i++) buf[i] = 1;
  for (int k = 0; k < 3; k++) NCCL_OK(ncclAllReduce(buf, buf, 1024, ncclFloat, ncclSum, comm, NULL));
  EXPECT(buf[0] == (float)(nranks * nranks * nranks)); /* the calls still work */
  NCCL_OK(ncclBroadcast(buf, buf, 100, ncclFloat, 1, comm, NULL));
  NCCL_OK(ncclGroupStart());
  NCCL_OK(ncclSend(buf, 10, ncclFloat, (rank + 1) % nranks, comm, NULL));
  NCCL_OK(ncclRecv(out, 10, ncclFloat, (rank + nranks - 1) % nranks, comm, NULL));
  NCCL_OK(ncclGroupEnd());
  NCCL_OK(ncclAllGather(buf, out, 1024 / nranks, ncclFloat, comm, NULL));
  NCCL_OK(ncclCommDestroy(comm)); /* finalize: the stub writes its line */

  char line[8192], got[2048], want[512];
  check_counts(hash, rank, w, line, sizeof(line));
  if (!line[0]) return;
  if (w->coll) { /* in call order, with NCCL's spellings; AllGather and Broadcast in bytes */
    str(line, "colls", got, sizeof(got));
    const char* p = got;
    int ag = 1024 / nranks * 4;
    char exp[5][64];
    snprintf(exp[0], 64, "AllReduce:0:1024:ncclFloat32:");
    snprintf(exp[1], 64, "AllReduce:1:1024:ncclFloat32:");
    snprintf(exp[2], 64, "AllReduce:2:1024:ncclFloat32:");
    snprintf(exp[3], 64, "Broadcast:0:400:ncclInt8:1:");
    snprintf(exp[4], 64, "AllGather:0:%d:ncclInt8:", ag);
    for (int i = 0; i < 5; i++) {
      if (strncmp(p, exp[i], strlen(exp[i])) != 0) {
        rt_fail(__FILE__, __LINE__, "[%s rank %d] Coll %d: expected %s... in %s", rt_mode(), rank, i, exp[i], got);
        break;
      }
      p = strchr(p, ';');
      p = p ? p + 1 : "";
    }
  }
  if (w->p2p) {
    snprintf(want, sizeof(want), "Send:%d:10:ncclFloat32;Recv:%d:10:ncclFloat32;", (rank + 1) % nranks,
             (rank + nranks - 1) % nranks);
    if (strcmp(str(line, "p2ps", got, sizeof(got)), want) != 0)
      rt_fail(__FILE__, __LINE__, "[%s rank %d] P2p events %s, expected %s", rt_mode(), rank, got, want);
  }
  /* v7: plain calls are untagged (userTag 0); older plugins have no tags */
  const char* tags = w->version < 7 || !w->coll ? "" : w->p2p ? "c0;c0;c0;c0;p0;p0;c0;" : "c0;c0;c0;c0;c0;";
  if (strcmp(str(line, "tags", got, sizeof(got)), tags) != 0)
    rt_fail(__FILE__, __LINE__, "[%s rank %d] tags %s, expected %s", rt_mode(), rank, got, tags);
}

TEST(profiler, v7_events_threads_and_procs) {
  use_plugin(CHORUS_PROFILER_STUB_V7, NULL);
  struct want w = {7, 0x7fff, 6, 5, 2, 6, 5, 2, 0};
  rt_run_both(3, sequence_body, &w);
  done_plugin();
}

TEST(profiler, v6_events_threads_and_procs) {
  use_plugin(CHORUS_PROFILER_STUB, NULL);
  setenv("CHORUS_FLIGHT_RECORDER", "0", 1); /* the plugin needs the recorder: made anyway */
  param_reset();
  struct want w = {6, 0x7fff, 6, 5, 2, 6, 5, 2, 1};
  rt_run_both(3, sequence_body, &w);
  done_plugin();
}

TEST(profiler, v5_events_threads_and_procs) {
  use_plugin(CHORUS_PROFILER_STUB_V5, NULL);
  struct want w = {5, 0x0fff, 6, 5, 2, 6, 5, 2, 0}; /* a v5 plugin's mask loses the copy-engine bits */
  rt_run_both(2, sequence_body, &w);
  done_plugin();
}

/* NCCL's gating: a kind is emitted when its bit or a descendant's is set. */
TEST(profiler, activation_mask) {
  use_plugin(CHORUS_PROFILER_STUB, "0");
  struct want none = {6, 0, 0, 0, 0, 0, 0, 0, 0};
  rt_run_threads(2, sequence_body, &none);
  use_plugin(CHORUS_PROFILER_STUB, "0x2"); /* Coll: its ancestors too, no sends */
  struct want coll = {6, 2, 6, 5, 0, 6, 5, 0, 0};
  rt_run_procs(2, sequence_body, &coll);
  use_plugin(CHORUS_PROFILER_STUB, "0x100"); /* GroupApi alone */
  struct want group_api = {6, 0x100, 6, 0, 0, 0, 0, 0, 0};
  rt_run_threads(2, sequence_body, &group_api);
  done_plugin();
}

/* v7's KernelPhase (bit 15): a v7 plugin that asks for it gets KernelCh too, as NCCL turns it on, and
 * so every event that KernelCh's ancestors make; v6 and v5 plugins lose the bit they do not know (v5
 * the copy-engine bits too). */
TEST(profiler, kernel_phase_bit_by_version) {
  use_plugin(CHORUS_PROFILER_STUB_V7, "0x8000");
  struct want v7 = {7, 0x8040, 6, 5, 2, 6, 5, 2, 0}; /* KernelPhase | KernelCh */
  rt_run_threads(2, sequence_body, &v7);
  use_plugin(CHORUS_PROFILER_STUB, "0xffff");
  struct want v6 = {6, 0x7fff, 6, 5, 2, 6, 5, 2, 0};
  rt_run_procs(2, sequence_body, &v6);
  use_plugin(CHORUS_PROFILER_STUB_V5, "0xffff");
  struct want v5 = {5, 0x0fff, 6, 5, 2, 6, 5, 2, 0};
  rt_run_threads(2, sequence_body, &v5);
  done_plugin();
}

/* A v7 plugin gets each call's ncclCollConfig_t.userProfilerTag as userTag on its CollApi/P2pApi and
 * Coll/P2p (the stub checks that a task's tag is its API event's); a plain call, or a config left at
 * NCCL_COLLCONFIG_INITIALIZER, is 0. An AlltoAll's sends and receives carry its tag. */
static void tag_body(int rank, int nranks, ncclUniqueId id, void* arg) {
  int version = *(const int*)arg;
  ncclComm_t comm;
  NCCL_OK(ncclCommInitRank(&comm, nranks, id, rank));
  uint64_t hash = comm->comm_hash;
  float v[64];
  for (int i = 0; i < 64; i++) v[i] = 1;
  ncclCollConfig_t cfg = NCCL_COLLCONFIG_INITIALIZER;
  cfg.userProfilerTag = 0x1234abcdull;
  NCCL_OK(ncclAllReduceConfig(v, v, 64, ncclFloat, ncclSum, comm, NULL, &cfg));
  NCCL_OK(ncclAllReduce(v, v, 64, ncclFloat, ncclSum, comm, NULL)); /* untagged */
  EXPECT(v[63] == (float)(nranks * nranks));
  ncclCollConfig_t plain = NCCL_COLLCONFIG_INITIALIZER;
  NCCL_OK(ncclBroadcastConfig(v, v, 8, ncclFloat, 0, comm, NULL, &plain));
  NCCL_OK(ncclGroupStart()); /* one plan: each call keeps its own tag */
  cfg.userProfilerTag = 7;
  NCCL_OK(ncclAllReduceConfig(v, v, 16, ncclFloat, ncclSum, comm, NULL, &cfg));
  cfg.userProfilerTag = UINT64_C(0x7fffffffffffffff); /* the largest a user may give (the top bit is NCCL's) */
  NCCL_OK(ncclAllGatherConfig(v + 16, v + 32, 4, ncclFloat, comm, NULL, &cfg));
  NCCL_OK(ncclGroupEnd());
  float s[32], r[32];
  for (int i = 0; i < 32; i++) s[i] = (float)rank;
  cfg.userProfilerTag = 9;
  NCCL_OK(ncclAlltoAllConfig(s, r, 2, ncclFloat, comm, NULL, &cfg));
  for (int p = 0; p < nranks; p++) EXPECT(r[2 * p] == (float)p);
  NCCL_OK(ncclCommDestroy(comm));

  char line[8192], got[1024], want[1024];
  struct want w = {version, version == 5 ? 0x0fff : 0x7fff, 5, 5, 2 * nranks, 5, 5, 2 * nranks, 0};
  check_counts(hash, rank, &w, line, sizeof(line));
  if (!line[0]) return;
  want[0] = 0; /* older plugins' descriptors have no tag */
  int at =
      version < 7 ? 0 : snprintf(want, sizeof(want), "c%llu;c0;c0;c7;c%llu;", 0x1234abcdull, 0x7fffffffffffffffull);
  for (int p = 0; p < 2 * nranks && version == 7; p++) at += snprintf(want + at, sizeof(want) - (size_t)at, "p9;");
  if (strcmp(str(line, "tags", got, sizeof(got)), want) != 0)
    rt_fail(__FILE__, __LINE__, "[%s rank %d] tags %s, expected %s", rt_mode(), rank, got, want);
}

TEST(profiler, v7_user_tag_threads_and_procs) {
  use_plugin(CHORUS_PROFILER_STUB_V7, NULL);
  int v = 7;
  rt_run_both(3, tag_body, &v);
  done_plugin();
}

/* v6 and v5 plugins get the same tagged calls, their events as before. */
TEST(profiler, tagged_calls_reach_older_plugins) {
  use_plugin(CHORUS_PROFILER_STUB, NULL);
  int v6 = 6, v5 = 5;
  rt_run_procs(2, tag_body, &v6);
  use_plugin(CHORUS_PROFILER_STUB_V5, NULL);
  rt_run_threads(2, tag_body, &v5);
  done_plugin();
}

/* AlltoAll, Gather and Scatter are the sends and receives NCCL makes of them. */
static void decomposed_body(int rank, int nranks, ncclUniqueId id, void* arg) {
  (void)arg;
  ncclComm_t comm;
  NCCL_OK(ncclCommInitRank(&comm, nranks, id, rank));
  uint64_t hash = comm->comm_hash;
  float s[64], r[64];
  for (int i = 0; i < 64; i++) s[i] = (float)rank;
  NCCL_OK(ncclAlltoAll(s, r, 4, ncclFloat, comm, NULL));
  NCCL_OK(ncclGather(s, r, 4, ncclFloat, 1, comm, NULL));
  NCCL_OK(ncclScatter(s, r, 4, ncclFloat, 1, comm, NULL));
  NCCL_OK(ncclCommDestroy(comm));
  char want[1024] = "", line[8192], got[2048];
  size_t at = 0;
  for (int p = 0; p < nranks; p++) at += (size_t)snprintf(want + at, sizeof(want) - at, "Send:%d:4:ncclFloat32;Recv:%d:4:ncclFloat32;", p, p);
  at += (size_t)snprintf(want + at, sizeof(want) - at, "Send:1:4:ncclFloat32;");
  for (int p = 0; p < nranks && rank == 1; p++) at += (size_t)snprintf(want + at, sizeof(want) - at, "Recv:%d:4:ncclFloat32;", p);
  for (int p = 0; p < nranks && rank == 1; p++) at += (size_t)snprintf(want + at, sizeof(want) - at, "Send:%d:4:ncclFloat32;", p);
  snprintf(want + at, sizeof(want) - at, "Recv:1:4:ncclFloat32;");
  int n = 2 * nranks + 2 + (rank == 1 ? 2 * nranks : 0);
  struct want w = {6, 0x7fff, 3, 0, n, 3, 0, n, 0};
  check_counts(hash, rank, &w, line, sizeof(line));
  if (line[0] && strcmp(str(line, "p2ps", got, sizeof(got)), want) != 0)
    rt_fail(__FILE__, __LINE__, "[%s rank %d] P2p events %s, expected %s", rt_mode(), rank, got, want);
}

TEST(profiler, alltoall_gather_scatter_as_p2p) {
  use_plugin(CHORUS_PROFILER_STUB, NULL);
  rt_run_both(3, decomposed_body, NULL);
  done_plugin();
}

/* No plugin (missing, "none", failed init): the calls work, comm->prof is NULL, no line is written. */
static void without_body(int rank, int nranks, ncclUniqueId id, void* arg) {
  const char* warn = arg; /* the WARN each process must have seen, or NULL */
  ncclComm_t comm;
  NCCL_OK(ncclCommInitRank(&comm, nranks, id, rank));
  EXPECT(comm->prof == NULL);
  float x = 1;
  NCCL_OK(ncclAllReduce(&x, &x, 1, ncclFloat, ncclSum, comm, NULL));
  EXPECT(x == (float)nranks);
  NCCL_OK(ncclCommDestroy(comm));
  if (warn && strcmp(rt_mode(), "procs") == 0 && !strstr(log_last_error(), warn))
    rt_fail(__FILE__, __LINE__, "[procs rank %d] expected a WARN with \"%s\", last: %s", rank, warn, log_last_error());
  EXPECT(access(out_path, F_OK) != 0);
}

TEST(profiler, missing_library_warns_and_runs_on) {
  use_plugin("/nonexistent/libchorus-no-such-profiler.so", NULL);
  const char* warn = "NCCL_PROFILER_PLUGIN=/nonexistent/libchorus-no-such-profiler.so: could not load";
  rt_run_procs(2, without_body, (void*)warn); /* each process warns (before the test's own process loads) */
  rt_run_threads(2, without_body, NULL);
  EXPECT(strstr(log_last_error(), warn) != NULL);
  done_plugin();
}

TEST(profiler, none_and_default) {
  use_plugin("None", NULL); /* NCCL compares without case */
  setenv("CHORUS_FLIGHT_RECORDER", "0", 1);
  param_reset();
  rt_run_threads(2, without_body, NULL);
  use_plugin(NULL, NULL); /* libnccl-profiler.so is not there: silently none */
  rt_run_threads(2, without_body, NULL);
  EXPECT(strstr(log_last_error(), "PROFILER") == NULL);
  done_plugin();
}

static void recorder_off_body(int rank, int nranks, ncclUniqueId id, void* arg) {
  (void)arg;
  ncclComm_t comm;
  NCCL_OK(ncclCommInitRank(&comm, nranks, id, rank));
  EXPECT(comm->fr == NULL); /* "none" does not make the recorder */
  NCCL_OK(ncclCommDestroy(comm));
}

TEST(profiler, none_leaves_recorder_off) {
  use_plugin("none", NULL);
  setenv("CHORUS_FLIGHT_RECORDER", "0", 1);
  param_reset();
  rt_run_threads(2, recorder_off_body, NULL);
  done_plugin();
}

TEST(profiler, init_failure_warns_and_runs_on) {
  use_plugin(CHORUS_PROFILER_STUB, NULL);
  setenv("CHORUS_TEST_PROFILER_FAIL_INIT", "1", 1);
  rt_run_both(2, without_body, (void*)"returned 3; this communicator goes without it");
  EXPECT(strstr(log_last_error(), "init of communicator") != NULL);
  done_plugin();
}

TEST(profiler, library_names) {
  char c[2][512];
  EXPECT_EQ(prof_candidates("", c), 1);
  EXPECT(strcmp(c[0], "libnccl-profiler.so") == 0);
  EXPECT_EQ(prof_candidates("none", c), 0);
  EXPECT_EQ(prof_candidates("NONE", c), 0);
  EXPECT_EQ(prof_candidates("/opt/p/libx.so", c), 1);
  EXPECT(strcmp(c[0], "/opt/p/libx.so") == 0);
  EXPECT_EQ(prof_candidates("libinspector.so", c), 1); /* lib*.so: as it is only */
  EXPECT_EQ(prof_candidates("inspector", c), 2);
  EXPECT(strcmp(c[0], "inspector") == 0 && strcmp(c[1], "libnccl-profiler-inspector.so") == 0);
  EXPECT_EQ(prof_candidates("libinspector.so.1", c), 2);
  EXPECT(strcmp(c[1], "libnccl-profiler-libinspector.so.1.so") == 0);
}
