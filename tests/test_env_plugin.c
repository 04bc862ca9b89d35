/* NCCL's environment plugin (NCCL_ENV_PLUGIN, misc/env_plugin.c) with the stub of tests/env_stub, whose
 * getEnv(X) answers the real environment's CHORUS_TEST_ENVP_X and hides everything else: parameters,
 * NCCL_DEBUG* (which configure the logging that reports the loading itself), a communicator's choice
 * and the parameter API take the plugin's values; v2 is preferred to v1; it is loaded once per process,
 * also by many threads at once, given NCCL 2.31.2 and a logger, and finalized at exit; "none", a
 * missing library, one that is no env plugin and a failing init leave the environment in charge with
 * a WARN; NCCL_ENV_PLUGIN may come from the config file. */
#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "comm/comm.h"
#include "misc/env_plugin.h"
#include "misc/log.h"
#include "misc/param.h"
#include "misc/utils.h"
#include "tune/tune.h"
#include "runner.h"

static const char* const STUB_VARS[] = {"CHORUS_TEST_ENVP_CHORUS_TIMEOUT",
                                        "CHORUS_TEST_ENVP_NCCL_DEBUG",
                                        "CHORUS_TEST_ENVP_NCCL_DEBUG_SUBSYS",
                                        "CHORUS_TEST_ENVP_NCCL_DEBUG_FILE",
                                        "CHORUS_TEST_ENVP_NCCL_ALGO",
                                        "CHORUS_TEST_ENVP_NCCL_PROTO",
                                        "CHORUS_TEST_ENVP_FAIL_INIT",
                                        "CHORUS_TEST_ENVP_OUT",
                                        "NCCL_DEBUG",
                                        "NCCL_DEBUG_SUBSYS",
                                        "NCCL_DEBUG_FILE",
                                        "NCCL_CONF_FILE",
                                        NULL};

/* NCCL_ENV_PLUGIN=lib (NULL: unset), loaded afresh by the next parameter read. */
static void use_env_plugin(const char* lib) {
  if (lib) setenv("NCCL_ENV_PLUGIN", lib, 1);
  else unsetenv("NCCL_ENV_PLUGIN");
  envp_reset_for_tests();
  param_reset();
}

static void clean_env(void) {
  for (int i = 0; STUB_VARS[i]; i++) unsetenv(STUB_VARS[i]);
  setenv("NCCL_CONF_FILE", "/dev/null", 1); /* no ~/.nccl.conf of the machine's */
}

/* The stub's own count of calls (it is loaded already: RTLD_NOLOAD finds that copy). */
static const char* stub_report(const char* lib) {
  void* h = dlopen(lib, RTLD_NOW | RTLD_NOLOAD);
  if (!h) return "(not loaded)";
  const char* (*report)(void) = (const char* (*)(void))dlsym(h, "chorus_env_stub_report");
  const char* r = report ? report() : "(no report)";
  dlclose(h);
  return r;
}

static const char* source_of(enum param_id id) {
  struct param_info pi;
  param_describe(id, &pi);
  return pi.source;
}

static char* slurp(const char* path) {
  static char text[1 << 16];
  FILE* f = fopen(path, "r");
  size_t n = f ? fread(text, 1, sizeof(text) - 1, f) : 0;
  text[n] = 0;
  if (f) fclose(f);
  return text;
}

TEST(env_plugin, v2_serves_every_parameter) {
  clean_env();
  setenv("CHORUS_TIMEOUT", "99", 1); /* the real environment's: hidden by the plugin */
  setenv("CHORUS_TEST_ENVP_CHORUS_TIMEOUT", "77", 1);
  setenv("CHORUS_SPIN_COUNT", "5", 1); /* only in the real environment: the default */
  char out[128];
  snprintf(out, sizeof(out), "/tmp/chorus-envp-out-%d", (int)getpid());
  unlink(out);
  setenv("CHORUS_TEST_ENVP_OUT", out, 1);
  use_env_plugin(CHORUS_ENV_STUB);
  EXPECT_EQ(param_int(PARAM_TIMEOUT), 77);
  EXPECT_EQ(param_int(PARAM_SPIN_COUNT), 2000);
  EXPECT(strcmp(source_of(PARAM_TIMEOUT), "env plugin") == 0);
  EXPECT(strcmp(source_of(PARAM_ENV_PLUGIN), "environment") == 0); /* where values come from: not through it */
  ncclParamHandle_t h = NULL;
  int64_t v = 0;
  NCCL_OK(ncclParamBind(&h, "CHORUS_TIMEOUT"));
  NCCL_OK(ncclParamGetI64(h, &v));
  EXPECT_EQ(v, 77);
  const char* r = stub_report(CHORUS_ENV_STUB);
  if (!strstr(r, "inits=1 ") || !strstr(r, "version=2.31.2 suffix='' logger=1") || strstr(r, "gets=0 "))
    rt_fail(__FILE__, __LINE__, "stub report: %s", r);
  param_reset(); /* values are read again, the plugin is not */
  EXPECT_EQ(param_int(PARAM_TIMEOUT), 77);
  EXPECT(strstr(stub_report(CHORUS_ENV_STUB), "inits=1 ") != NULL);
  use_env_plugin(NULL); /* finalized (and unloaded) by the reset */
  if (!strstr(slurp(out), "finalize pid=")) rt_fail(__FILE__, __LINE__, "no finalize in %s: %s", out, slurp(out));
  unlink(out);
  unsetenv("CHORUS_TIMEOUT"), unsetenv("CHORUS_SPIN_COUNT");
}

/* NCCL_DEBUG* come through the plugin: the lines of its loading (its own logger's among them) wait
 * until logging is configured from it, whether the first read is logging's own or another's. */
TEST(env_plugin, v2_serves_nccl_debug) {
  char path[128];
  snprintf(path, sizeof(path), "/tmp/chorus-envp-log-%d.log", (int)getpid());
  for (int first_is_log = 1; first_is_log >= 0; first_is_log--) {
    clean_env();
    unlink(path);
    setenv("CHORUS_TEST_ENVP_NCCL_DEBUG", "INFO", 1);
    setenv("CHORUS_TEST_ENVP_NCCL_DEBUG_SUBSYS", "INIT,ENV", 1);
    setenv("CHORUS_TEST_ENVP_NCCL_DEBUG_FILE", path, 1);
    use_env_plugin(CHORUS_ENV_STUB);
    if (first_is_log) INFO(LOG_INIT, "the test's first line");
    else EXPECT_EQ(param_int(PARAM_TIMEOUT), 1800); /* loads the plugin; its lines print once the log is set */
    INFO(LOG_INIT, "the test's last line");
    log_reset(); /* closes the file */
    const char* text = slurp(path);
    const char* want[] = {"env stub: init for NCCL 2.31.2 suffix=''",
                          "env plugin chorus-env-stub (ncclEnvPlugin_v2) loaded from " CHORUS_ENV_STUB,
                          "NCCL_ENV_PLUGIN set by environment to " CHORUS_ENV_STUB, "the test's last line"};
    for (size_t i = 0; i < sizeof(want) / sizeof(want[0]); i++)
      if (!strstr(text, want[i]))
        rt_fail(__FILE__, __LINE__, "first read %s: log lacks \"%s\":\n%s",
                first_is_log ? "logging's" : "a parameter's", want[i], text);
  }
  unlink(path);
  use_env_plugin(NULL);
}

TEST(env_plugin, v1_plugin) {
  clean_env();
  setenv("CHORUS_TEST_ENVP_CHORUS_TIMEOUT", "66", 1);
  use_env_plugin(CHORUS_ENV_STUB_V1);
  EXPECT_EQ(param_int(PARAM_TIMEOUT), 66);
  const char* r = stub_report(CHORUS_ENV_STUB_V1); /* v1's init: no logger */
  if (!strstr(r, "inits=1 ") || !strstr(r, "version=2.31.2 suffix='' logger=0")) rt_fail(__FILE__, __LINE__, "%s", r);
  use_env_plugin(NULL);
}

/* A communicator takes its settings from the plugin: NCCL_ALGO and NCCL_PROTO set only there. */
static void comm_body(int rank, int nranks, ncclUniqueId id, void* arg) {
  (void)arg;
  ncclComm_t comm;
  NCCL_OK(ncclCommInitRank(&comm, nranks, id, rank));
  struct tune_choice how;
  tune_choose(comm, FUNC_ALLREDUCE, 1 << 20, CH_REPRO_OFF, &how);
  EXPECT_EQ(how.algo, ALGO_RING);
  EXPECT_EQ(how.proto, PROTO_LL);
  float x[64];
  for (int i = 0; i < 64; i++) x[i] = (float)(rank + 1);
  NCCL_OK(ncclAllReduce(x, x, 64, ncclFloat, ncclSum, comm, NULL));
  EXPECT(x[63] == (float)(nranks * (nranks + 1) / 2));
  NCCL_OK(ncclCommDestroy(comm));
}

TEST_T(env_plugin, communicator_settings_through_plugin, 60) {
  clean_env();
  setenv("CHORUS_TEST_ENVP_NCCL_ALGO", "Ring", 1);
  setenv("CHORUS_TEST_ENVP_NCCL_PROTO", "LL", 1);
  use_env_plugin(CHORUS_ENV_STUB);
  rt_run_both(3, comm_body, NULL);
  use_env_plugin(NULL);
}

/* Without a plugin the environment gives the values: after "none" silently, after a library that does
 * not load, is no env plugin or fails init with a WARN naming it. */
static void expect_environment(const char* warn) {
  EXPECT_EQ(param_int(PARAM_TIMEOUT), 99);
  EXPECT(strcmp(source_of(PARAM_TIMEOUT), "environment") == 0);
  if (warn && !strstr(log_last_error(), warn))
    rt_fail(__FILE__, __LINE__, "expected a WARN with \"%s\", last: %s", warn, log_last_error());
}

TEST(env_plugin, none_missing_and_failing_init) {
  clean_env();
  setenv("CHORUS_TIMEOUT", "99", 1);
  setenv("CHORUS_TEST_ENVP_CHORUS_TIMEOUT", "77", 1);
  use_env_plugin("none");
  expect_environment(NULL);
  use_env_plugin("NONE");
  expect_environment(NULL);
  use_env_plugin(NULL); /* libnccl-env.so is not there: silently none */
  expect_environment(NULL);
  EXPECT(strstr(log_last_error(), "ENV_PLUGIN") == NULL);
  use_env_plugin("/nonexistent/libnccl-env-x.so");
  expect_environment("NCCL_ENV_PLUGIN=/nonexistent/libnccl-env-x.so: could not load /nonexistent/libnccl-env-x.so (");
  use_env_plugin("nosuchenv");
  expect_environment("could not load nosuchenv (");
  EXPECT(strstr(log_last_error(), "nor libnccl-env-nosuchenv.so (") != NULL);
  use_env_plugin("libm.so.6");
  expect_environment("libm.so.6 exports neither ncclEnvPlugin_v2 nor ncclEnvPlugin_v1");
  setenv("CHORUS_TEST_ENVP_FAIL_INIT", "1", 1);
  use_env_plugin(CHORUS_ENV_STUB);
  expect_environment("env plugin chorus-env-stub (" CHORUS_ENV_STUB "): init returned 3; parameters are read from");
  use_env_plugin(NULL);
  unsetenv("CHORUS_TIMEOUT");
}

/* NCCL_ENV_PLUGIN in the config file loads it; what the plugin leaves unset the file still gives. */
TEST(env_plugin, named_in_config_file) {
  clean_env();
  char conf[128];
  snprintf(conf, sizeof(conf), "/tmp/chorus-envp-conf-%d", (int)getpid());
  FILE* f = fopen(conf, "w");
  ASSERT(f);
  fprintf(f, "NCCL_ENV_PLUGIN=%s\nCHORUS_SPIN_COUNT=33\nCHORUS_TIMEOUT=44\n", CHORUS_ENV_STUB);
  fclose(f);
  setenv("NCCL_CONF_FILE", conf, 1);
  setenv("CHORUS_TEST_ENVP_CHORUS_TIMEOUT", "55", 1);
  use_env_plugin(NULL);
  EXPECT_EQ(param_int(PARAM_TIMEOUT), 55);
  EXPECT_EQ(param_int(PARAM_SPIN_COUNT), 33);
  EXPECT(strcmp(source_of(PARAM_SPIN_COUNT), conf) == 0);
  EXPECT(strcmp(source_of(PARAM_ENV_PLUGIN), conf) == 0);
  unlink(conf);
  clean_env();
  use_env_plugin(NULL);
}

/* As NCCL: finalize at exit (a process that loaded it and returns from main, or calls exit). */
TEST(env_plugin, finalized_at_exit) {
  clean_env();
  char out[128];
  snprintf(out, sizeof(out), "/tmp/chorus-envp-out-%d", (int)getpid());
  unlink(out);
  setenv("CHORUS_TEST_ENVP_OUT", out, 1);
  setenv("NCCL_ENV_PLUGIN", CHORUS_ENV_STUB, 1);
  fflush(stdout);
  pid_t pid = fork();
  ASSERT(pid >= 0);
  if (pid == 0) {
    envp_reset_for_tests();
    param_reset();
    exit(param_int(PARAM_TIMEOUT) == 1800 ? 0 : 1);
  }
  int st = 0;
  waitpid(pid, &st, 0);
  EXPECT(WIFEXITED(st) && WEXITSTATUS(st) == 0);
  char want[2][96];
  snprintf(want[0], sizeof(want[0]), "init 2.31.2 suffix='' logger=1 pid=%d\n", (int)pid);
  snprintf(want[1], sizeof(want[1]), "finalize pid=%d gets=", (int)pid);
  const char* text = slurp(out);
  for (int i = 0; i < 2; i++)
    if (!strstr(text, want[i])) rt_fail(__FILE__, __LINE__, "%s lacks \"%s\":\n%s", out, want[i], text);
  unlink(out);
  clean_env();
  use_env_plugin(NULL);
}

static void* read_timeout(void* arg) {
  *(int64_t*)arg = param_int(PARAM_TIMEOUT);
  return NULL;
}

/* Many threads' first reads at once: one load, one init, every thread the plugin's value. */
TEST(env_plugin, threads_load_once) {
  clean_env();
  setenv("CHORUS_TEST_ENVP_CHORUS_TIMEOUT", "88", 1);
  use_env_plugin(CHORUS_ENV_STUB);
  pthread_t th[8];
  int64_t got[8];
  for (int i = 0; i < 8; i++) ASSERT(pthread_create(&th[i], NULL, read_timeout, &got[i]) == 0);
  for (int i = 0; i < 8; i++) pthread_join(th[i], NULL);
  for (int i = 0; i < 8; i++) EXPECT_EQ(got[i], 88);
  EXPECT(strstr(stub_report(CHORUS_ENV_STUB), "inits=1 ") != NULL);
  use_env_plugin(NULL);
}

TEST(env_plugin, library_names) {
  char c[2][512];
  EXPECT_EQ(ut_plugin_names("env", "", c), 1);
  EXPECT(strcmp(c[0], "libnccl-env.so") == 0);
  EXPECT_EQ(ut_plugin_names("env", "none", c), 0);
  EXPECT_EQ(ut_plugin_names("env", "myenv", c), 2);
  EXPECT(strcmp(c[0], "myenv") == 0 && strcmp(c[1], "libnccl-env-myenv.so") == 0);
  EXPECT_EQ(ut_plugin_names("env", "libnccl-env-myenv.so", c), 1);
  EXPECT_EQ(ut_plugin_names("env", "/opt/p/libnccl-env-myenv.so", c), 1);
}
