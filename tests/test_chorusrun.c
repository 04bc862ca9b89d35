/* chorusrun and chorus-info run as a user would: environment, exit codes, signals, timeouts, hosts and
 * binding, respawn; chorus-info's calibration and options. Binaries as in test_tools.c. */

#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "chorus.h"
#include "tune/tune.h"
#include "misc/param.h"
#include "runner.h"
#include "tools_util.h"

/* ------------------------------------------------------------------- chorusrun ---- */

TEST(chorusrun, environment_and_tags) {
  cmd_result r = tu_run(30, NULL, tu_bin("chorusrun"), "-n", "3", "--tag-output", "sh", "-c",
                     "echo $RANK $WORLD_SIZE $LOCAL_RANK $LOCAL_WORLD_SIZE $NCCL_COMM_ID; echo e$RANK >&2",
                     (char*)NULL);
  EXPECT_EQ(r.status, 0);
  int port = -1;
  for (int i = 0; i < 3; i++) {
    char want[64], err[16];
    snprintf(want, sizeof want, "[%d] %d 3 %d 3 127.0.0.1:", i, i, i);
    const char* p = strstr(r.out, want);
    EXPECT(p != NULL);
    int pt = p ? atoi(p + strlen(want)) : -1;
    EXPECT(pt > 0 && pt < 65536 && (port < 0 || pt == port));
    port = pt;
    snprintf(err, sizeof err, "[%d] e%d\n", i, i);
    EXPECT_HAS(r.err, err);
  }
  tu_cmd_free(&r);
  /* An unterminated last line still comes out, tagged. */
  r = tu_run(30, NULL, tu_bin("chorusrun"), "-n", "1", "--tag-output", "printf", "tail", (char*)NULL);
  EXPECT(strcmp(r.out, "[0] tail\n") == 0);
  tu_cmd_free(&r);
}

TEST(chorusrun, failed_rank_exit_status) {
  cmd_result r = tu_run(30, NULL, tu_bin("chorusrun"), "-n", "3", "sh", "-c", "if [ $RANK = 1 ]; then exit 3; fi; sleep 20",
                     (char*)NULL);
  EXPECT_EQ(r.status, 3);
  EXPECT_HAS(r.err, "chorusrun: rank 1 (pid ");
  EXPECT_HAS(r.err, ") exited with status 3\n");
  EXPECT(r.secs < 10); /* the sleeping ranks were terminated */
  tu_cmd_free(&r);
}

TEST(chorusrun, killed_rank_signal) {
  cmd_result r = tu_run(30, NULL, tu_bin("chorusrun"), "-n", "3", "sh", "-c",
                     "if [ $RANK = 2 ]; then kill -KILL $$; fi; sleep 20", (char*)NULL);
  EXPECT_EQ(r.status, 128 + SIGKILL);
  EXPECT_HAS(r.err, "chorusrun: rank 2 (pid ");
  EXPECT_HAS(r.err, ") killed by signal SIGKILL\n");
  EXPECT(r.secs < 10);
  tu_cmd_free(&r);
}

/* A rank that exits cleanly while the others run is named once, as it happens (before the others'
 * later output), and the job goes on; ranks that finish together are not named. */
TEST(chorusrun, early_clean_exit_is_reported) {
  cmd_result r = tu_run(30, NULL, tu_bin("chorusrun"), "-n", "4", "sh", "-c",
                     "if [ $RANK = 2 ]; then exit 0; fi; sleep 2.5; echo late$RANK >&2", (char*)NULL);
  EXPECT_EQ(r.status, 0);
  const char* said = strstr(r.err, "chorusrun: rank 2 (pid ");
  EXPECT(said != NULL);
  EXPECT_HAS(r.err, ") exited with status 0 while 3 other ranks still run\n");
  EXPECT(said && !strstr(said + 1, "chorusrun: rank 2 (pid ")); /* once */
  const char* late = strstr(r.err, "late");
  EXPECT(said && late && said < late);
  tu_cmd_free(&r);
  r = tu_run(30, NULL, tu_bin("chorusrun"), "-n", "3", "sh", "-c", "sleep 0.2", (char*)NULL);
  EXPECT_EQ(r.status, 0);
  EXPECT(!strstr(r.err, "exited with status 0"));
  tu_cmd_free(&r);
}

/* A crash after the first failure is reported too (it may be the cause: a peer seeing the crashed
 * rank's sockets close can be reaped first); ranks ended by our SIGTERM are not. */
TEST(chorusrun, later_crash_is_reported) {
  cmd_result r = tu_run(30, NULL, tu_bin("chorusrun"), "-n", "3", "sh", "-c",
                     "trap '' TERM; if [ $RANK = 0 ]; then sleep 0.3; exit 1; fi; if [ $RANK = 1 ]; then sleep 0.6; "
                     "kill -SEGV $$; fi; sleep 20",
                     (char*)NULL);
  EXPECT_EQ(r.status, 1);
  EXPECT_HAS(r.err, ") also died: killed by signal SIGSEGV\n");
  EXPECT(!strstr(r.err, "rank 2 (pid ") || !strstr(r.err, "also died: killed by signal SIGKILL"));
  tu_cmd_free(&r);
}

TEST(chorusrun, first_rank_overflow_refused) {
  const char* const env[] = {"NCCL_COMM_ID=127.0.0.1:1", NULL};
  cmd_result r = tu_run(30, env, tu_bin("chorusrun"), "--first-rank", "2147483647", "--world-size", "5", "-n", "2", "true",
                     (char*)NULL);
  EXPECT_EQ(r.status, 2);
  EXPECT_HAS(r.err, "do not fit in a world of 5");
  tu_cmd_free(&r);
}

TEST(chorusrun, sigkill_after_grace) {
  /* Rank 1 ignores SIGTERM: it gets SIGKILL about 2 s after rank 0 failed. */
  cmd_result r = tu_run(30, NULL, tu_bin("chorusrun"), "-n", "2", "sh", "-c",
                     "trap '' TERM; if [ $RANK = 0 ]; then sleep 0.5; exit 5; fi; sleep 20", (char*)NULL);
  EXPECT_EQ(r.status, 5);
  EXPECT_HAS(r.err, "did not stop after SIGTERM");
  EXPECT(r.secs > 2 && r.secs < 10);
  tu_cmd_free(&r);
}

TEST(chorusrun, timeout_names_hung_rank) {
  cmd_result r = tu_run(30, NULL, tu_bin("chorusrun"), "-n", "3", "--timeout", "1", "sh", "-c",
                     "if [ $RANK = 2 ]; then sleep 20; fi", (char*)NULL);
  EXPECT_EQ(r.status, 124);
  EXPECT_HAS(r.err, "chorusrun: rank 2 (pid ");
  EXPECT_HAS(r.err, ") did not finish within 1 s\n");
  /* Ranks 0 and 1 finished: named at most as having exited early (early_clean_exit_is_reported). */
  const char* once = strstr(r.err, "did not finish");
  EXPECT(once && !strstr(once + 1, "did not finish"));
  EXPECT(r.secs < 10);
  tu_cmd_free(&r);
}

TEST(chorusrun, forwards_sigterm) {
  char* dir = tu_make_tmpdir();
  char script[PATH_MAX + 128];
  snprintf(script, sizeof script, "trap 'echo bye > %s/$RANK; kill $!; exit 0' TERM; echo ready; sleep 20 & wait",
           dir);
  char* argv[] = {(char*)tu_bin("chorusrun"), "-n", "2", "--tag-output", "sh", "-c", script, NULL};
  int o, e;
  double t0 = tu_now_s();
  pid_t pid = tu_start_cmd(NULL, argv, &o, &e);
  /* Wait for both ranks to be ready, then SIGTERM chorusrun alone (not its group). */
  char buf[4096] = "";
  size_t len = 0;
  while (tu_count_str(buf, "ready") < 2 && tu_now_s() - t0 < 20) {
    struct pollfd p = {o, POLLIN, 0};
    if (poll(&p, 1, 100) > 0) {
      ssize_t n = read(o, buf + len, sizeof buf - 1 - len);
      if (n <= 0) break;
      len += (size_t)n;
    }
    buf[len] = '\0';
  }
  EXPECT_EQ(tu_count_str(buf, "ready"), 2);
  kill(pid, SIGTERM);
  cmd_result r = tu_finish_cmd(pid, o, e, t0, 30);
  EXPECT_EQ(r.status, 128 + SIGTERM);
  EXPECT_HAS(r.err, "got SIGTERM, passing it to 2 running ranks");
  for (int i = 0; i < 2; i++) {
    char f[PATH_MAX + 16];
    snprintf(f, sizeof f, "%s/%d", dir, i);
    struct stat st;
    if (stat(f, &st) != 0) rt_fail(__FILE__, __LINE__, "rank %d did not get SIGTERM", i);
    unlink(f);
  }
  rmdir(dir);
  free(dir);
  tu_cmd_free(&r);
}

TEST(chorusrun, usage_errors) {
  static const char* cases[][4] = {
      {"-n", "0", "true", "-n needs a positive number of ranks, got '0'"},
      {"-n", "two", "true", "-n needs a positive number of ranks, got 'two'"},
      {"-n", "2", NULL, "no program to run"},
      {"--bind", "socket", "true", "--bind takes none, core or numa, got 'socket'"},
      {"--timeout", "0", "true", "--timeout needs a positive number of seconds"},
      {"--bogus", "1", "true", "unknown option '--bogus'"},
      {"true", NULL, NULL, "the number of ranks (-n N) is required"},
  };
  for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
    cmd_result r = tu_run(10, NULL, tu_bin("chorusrun"), cases[i][0], cases[i][1], cases[i][2], (char*)NULL);
    if (r.status != 2) rt_fail(__FILE__, __LINE__, "case %zu: exit %d, want 2", i, r.status);
    EXPECT_HAS(r.err, cases[i][3]);
    EXPECT_HAS(r.err, "usage: chorusrun -n N");
    tu_cmd_free(&r);
  }
  cmd_result r = tu_run(10, NULL, tu_bin("chorusrun"), "-n", "2", "/nonexistent/program", (char*)NULL);
  EXPECT_EQ(r.status, 127);
  EXPECT_HAS(r.err, "chorusrun: cannot run '/nonexistent/program'");
  tu_cmd_free(&r);
}

TEST(chorusrun, hosts_and_binding) {
  cmd_result r = tu_run(10, NULL, tu_bin("chorusrun"), "--hosts", "nodeA,nodeB", "--per-host", "2", "--port", "29999", "prog",
                     "-x", "a b", (char*)NULL);
  EXPECT_EQ(r.status, 0);
  EXPECT_HAS(r.out, "# on nodeA: ranks 0-1\n");
  EXPECT_HAS(r.out, "# on nodeB: ranks 2-3\n");
  EXPECT_EQ(tu_count_str(r.out, "NCCL_COMM_ID=nodeA:29999 "), 2);
  EXPECT_HAS(r.out, " -n 2 --first-rank 0 --world-size 4 prog -x 'a b'\n");
  EXPECT_HAS(r.out, " -n 2 --first-rank 2 --world-size 4 prog -x 'a b'\n");
  tu_cmd_free(&r);
  /* What a printed line does on its host: ranks 2-3 of 4, local ranks 0-1. */
  static const char* const env[] = {"NCCL_COMM_ID=127.0.0.1:29999", NULL};
  r = tu_run(10, env, tu_bin("chorusrun"), "-n", "2", "--first-rank", "2", "--world-size", "4", "--tag-output", "sh", "-c",
          "echo $RANK/$WORLD_SIZE/$LOCAL_RANK/$LOCAL_WORLD_SIZE", (char*)NULL);
  EXPECT_HAS(r.out, "[2] 2/4/0/2\n");
  EXPECT_HAS(r.out, "[3] 3/4/1/2\n");
  tu_cmd_free(&r);
  r = tu_run(10, NULL, tu_bin("chorusrun"), "-n", "2", "--bind", "core", "--tag-output", "sh", "-c",
          "grep Cpus_allowed_list /proc/self/status", (char*)NULL);
  EXPECT_EQ(r.status, 0);
  const char* p = strstr(r.out, "[0] Cpus_allowed_list:");
  EXPECT(p && strcspn(p + 22, "-,\n") == strcspn(p + 22, "\n")); /* one CPU, no range or list */
  tu_cmd_free(&r);
}

/* chorus-info --calibrate measures and writes a file the library accepts as CHORUS_TUNE_FILE. */
TEST_T(chorus_info, calibrate_writes_a_usable_file, 120) {
  char* dir = tu_make_tmpdir();
  char path[PATH_MAX];
  snprintf(path, sizeof(path), "%s/tune.conf", dir);
  cmd_result r = tu_run(100, NULL, tu_bin("chorus-info"), "--calibrate", path, (char*)NULL);
  EXPECT_EQ(r.status, 0);
  EXPECT_HAS(r.out, "step_us.Simple");
  EXPECT_HAS(r.out, "wrote ");
  tu_cmd_free(&r);
  setenv("CHORUS_TUNE_FILE", path, 1);
  param_reset();
  EXPECT_EQ(tune_model_status(), CH_OK);
  EXPECT(tune_model_get()->step_us[PROTO_SIMPLE] > 0 && tune_model_get()->copy_bw > 0);
  unsetenv("CHORUS_TUNE_FILE");
  unlink(path);
  rmdir(dir);
  free(dir);
}

/* chorus-info's options: --version prints the version, --help names --brief, an unknown option is
 * named before the usage (exit 2); the default output leads with the summary, whose settings are the
 * ones set. */
TEST_T(chorus_info, options_and_summary, 60) {
  cmd_result r = tu_run(20, NULL, tu_bin("chorus-info"), "--version", (char*)NULL);
  EXPECT_EQ(r.status, 0);
  EXPECT_HAS(r.out, CHORUS_VERSION_STRING);
  EXPECT(!strstr(r.out, "usage:"));
  tu_cmd_free(&r);
  r = tu_run(20, NULL, tu_bin("chorus-info"), "--help", (char*)NULL);
  EXPECT_EQ(r.status, 0);
  EXPECT_HAS(r.out, "--brief stops");
  tu_cmd_free(&r);
  r = tu_run(20, NULL, tu_bin("chorus-info"), "--frobnicate", (char*)NULL);
  EXPECT_EQ(r.status, 2);
  EXPECT_HAS(r.err, "chorus-info: unknown option '--frobnicate'\nusage: chorus-info");
  tu_cmd_free(&r);
  static const char* const env[] = {"NCCL_NET_PLUGIN=none", "CHORUS_TIMEOUT=77", NULL};
  r = tu_run(30, env, tu_bin("chorus-info"), (char*)NULL);
  EXPECT_EQ(r.status, 0);
  const char* summary[] = {"Chorus " CHORUS_VERSION_STRING, "\nBuilt in\n  CUDA driver loader: ", "\n  device kernels: ",
                           "\n  libfabric (OFI network): ", "\n  plugins: net off (none), tuner ", "\nTransports\n",
                           "\nSettings that differ from the defaults\n", "\n  CHORUS_TIMEOUT=77 [environment]\n",
                           "\nHost\n", "\nConfiguration ("};
  const char* at = r.out;
  for (size_t i = 0; i < sizeof(summary) / sizeof(summary[0]); i++) { /* in this order */
    const char* p = strstr(at, summary[i]);
    if (!p) rt_fail(__FILE__, __LINE__, "chorus-info: no '%s' after offset %d in:\n%s", summary[i], (int)(at - r.out), r.out);
    else at = p;
  }
  EXPECT(strncmp(r.out, "Chorus ", 7) == 0); /* the summary comes first */
  tu_cmd_free(&r);
}

/* --respawn: a rank that fails is started again (same RANK, CHORUS_RESPAWN=k), up to K times, with a
 * private CHORUS_ELASTIC_DIR every rank sees and that is gone afterwards; one more failure ends the job
 * as without it. Output of the replaced process and its replacement both come through, tagged. */
TEST(chorusrun, respawn_replaces_failed_ranks) {
  cmd_result r = tu_run(30, NULL, tu_bin("chorusrun"), "-n", "2", "--respawn", "2", "--tag-output", "sh", "-c",
                     "echo gen$CHORUS_RESPAWN dir$CHORUS_ELASTIC_DIR; test -d \"$CHORUS_ELASTIC_DIR\" || exit 9; "
                     "if [ $RANK = 1 ] && [ $CHORUS_RESPAWN -lt 2 ]; then exit 5; fi; sleep 0.3",
                     (char*)NULL);
  EXPECT_EQ(r.status, 0);
  EXPECT_HAS(r.out, "[1] gen0 dir");
  EXPECT_HAS(r.out, "[1] gen1 dir");
  EXPECT_HAS(r.out, "[1] gen2 dir");
  EXPECT_HAS(r.err, "exited with status 5; starting replacement 2 of 2\n");
  const char* d = strstr(r.out, "[0] gen0 dir");
  char dir[PATH_MAX] = "";
  if (d) sscanf(d + strlen("[0] gen0 dir"), "%4095s", dir);
  EXPECT(dir[0] == '/' && access(dir, F_OK) != 0); /* removed at the end */
  tu_cmd_free(&r);
  r = tu_run(30, NULL, tu_bin("chorusrun"), "-n", "2", "--respawn", "1", "sh", "-c",
          "if [ $RANK = 0 ]; then exit 4; fi; sleep 20", (char*)NULL);
  EXPECT_EQ(r.status, 4); /* the replacement failed too: no replacements left */
  EXPECT(r.secs < 10);
  tu_cmd_free(&r);
}

/* examples/elastic.c under chorusrun --respawn: two ranks die mid-AllReduce (SIGKILL), the survivors
 * shrink and grow back with a replacement each time, and every rank ends with the right weights. */
TEST_T(chorusrun, elastic_example_survives_two_deaths, 120) {
  cmd_result r = tu_run(100, NULL, tu_bin("chorusrun"), "-n", "4", "--respawn", "2", tu_bin("elastic"), (char*)NULL);
  if (r.status != 0) rt_fail(__FILE__, __LINE__, "exit %d:\n%s%s", r.status, r.out, r.err);
  EXPECT_EQ(tu_count_str(r.out, "20 steps, 2 rank(s) replaced, weights as expected"), 4);
  EXPECT_EQ(tu_count_str(r.err, "killed by signal SIGKILL; starting replacement"), 2);
  tu_cmd_free(&r);
}

/* put_perf: one-sided puts into ncclMemAlloc windows (-R 2 by default), every type, between processes
 * and between threads; data checked. */
