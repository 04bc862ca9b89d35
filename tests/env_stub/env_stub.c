/* An environment plugin for tests/test_env_plugin.c, built against NCCL's ABI as Chorus declares it
 * (misc/env_abi.h): exports ncclEnvPlugin_v2 and ncclEnvPlugin_v1 (the host must take v2), or only
 * ncclEnvPlugin_v1 when built with STUB_V1. getEnv(NAME) answers the real environment's
 * CHORUS_TEST_ENVP_<NAME>, and nothing else: a variable set only under its own name is hidden, so a
 * value that takes effect came through the plugin. Environment, read at init:
 *
 *   CHORUS_TEST_ENVP_FAIL_INIT=1  init fails (ncclInternalError)
 *   CHORUS_TEST_ENVP_OUT=file     init and finalize each append a line to it ("init 2.31.2 suffix=''
 *                                 logger=1 pid=P", "finalize pid=P gets=N"); one write on O_APPEND
 *
 * chorus_env_stub_report (looked up by the test with dlsym) says how often each entry was called. */
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "misc/env_abi.h"

#define EXPORT __attribute__((visibility("default")))

static int inits, finalizes, gets; /* atomic */
static char versions[64];          /* written by init */
static int logger_given;

static void out_line(const char* text) {
  const char* out = getenv("CHORUS_TEST_ENVP_OUT");
  int fd = out && *out ? open(out, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0600) : -1;
  if (fd < 0) return;
  if (write(fd, text, strlen(text)) < 0) { /* a test's file: the test finds the line missing */ }
  close(fd);
}

static ncclResult_t init_common(uint8_t major, uint8_t minor, uint8_t patch, const char* suffix,
                                ncclDebugLogger_t log) {
  __atomic_fetch_add(&inits, 1, __ATOMIC_RELAXED);
  snprintf(versions, sizeof(versions), "%d.%d.%d suffix='%s'", major, minor, patch, suffix ? suffix : "(null)");
  logger_given = log != NULL;
  char line[160];
  snprintf(line, sizeof(line), "init %s logger=%d pid=%d\n", versions, logger_given, (int)getpid());
  out_line(line);
  if (log) log(NCCL_LOG_INFO, 0x80 /* NCCL_ENV */, __FILE__, __LINE__, "env stub: init for NCCL %s", versions);
  const char* f = getenv("CHORUS_TEST_ENVP_FAIL_INIT");
  if (f && *f == '1') {
    if (log) log(NCCL_LOG_WARN, ~0ul, __FILE__, __LINE__, "env stub: failing init as asked");
    return ncclInternalError;
  }
  return ncclSuccess;
}

#ifndef STUB_V1
static ncclResult_t init_v2(uint8_t major, uint8_t minor, uint8_t patch, const char* suffix, ncclDebugLogger_t log) {
  return init_common(major, minor, patch, suffix, log);
}
#endif
static ncclResult_t init_v1(uint8_t major, uint8_t minor, uint8_t patch, const char* suffix) {
  return init_common(major, minor, patch, suffix, NULL);
}

static ncclResult_t stub_finalize(void) {
  __atomic_fetch_add(&finalizes, 1, __ATOMIC_RELAXED);
  char line[96];
  snprintf(line, sizeof(line), "finalize pid=%d gets=%d\n", (int)getpid(), __atomic_load_n(&gets, __ATOMIC_RELAXED));
  out_line(line);
  return ncclSuccess;
}

static const char* stub_get(const char* name) {
  __atomic_fetch_add(&gets, 1, __ATOMIC_RELAXED);
  char key[256];
  if (!name || snprintf(key, sizeof(key), "CHORUS_TEST_ENVP_%s", name) >= (int)sizeof(key)) return NULL;
  return getenv(key); /* the environment's string: valid until the test changes that variable */
}

/* "inits=I finalizes=F gets=G version=<major.minor.patch suffix=''> logger=L" */
EXPORT const char* chorus_env_stub_report(void) {
  static char text[200];
  snprintf(text, sizeof(text), "inits=%d finalizes=%d gets=%d version=%s logger=%d",
           __atomic_load_n(&inits, __ATOMIC_RELAXED), __atomic_load_n(&finalizes, __ATOMIC_RELAXED),
           __atomic_load_n(&gets, __ATOMIC_RELAXED), versions, logger_given);
  return text;
}

#ifndef STUB_V1
EXPORT const ncclEnv_v2_t ncclEnvPlugin_v2 = {"chorus-env-stub", init_v2, stub_finalize, stub_get};
#endif
EXPORT const ncclEnv_v1_t ncclEnvPlugin_v1 = {"chorus-env-stub-v1", init_v1, stub_finalize, stub_get};
