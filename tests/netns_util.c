/* Multi-host test harness over tools/netns-cluster.sh (netns_util.h). */
#include "netns_util.h"

#include <errno.h>
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "nccl.h"
#include "chorus.h"
#include "runner.h"

/* The test process's one cluster (tests are forked one at a time). */
static char script[PATH_MAX], exe[PATH_MAX], dir[64];
static int is_up;

int nn_sh(const char* fmt, ...) {
  char cmd[2 * PATH_MAX + 512];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(cmd, sizeof(cmd), fmt, ap);
  va_end(ap);
  fflush(stdout);
  int st = system(cmd);
  return st == -1 ? -1 : WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

const char* nn_script(void) { return script; }
const char* nn_dir(void) { return dir; }

void nn_down(void) {
  if (!is_up) return;
  is_up = 0;
  nn_sh("%s down", script);
  if (dir[0]) nn_sh("rm -rf %s", dir);
}

int nn_up(const char* tag, int hosts) { return nn_up_opts(tag, hosts, NULL); }

int nn_up_opts(const char* tag, int hosts, const char* opts) {
  /* the script sits in tools/ next to this file's tests/ (CMake compiles with absolute paths) */
  const char* env = getenv("CHORUS_NETNS_SCRIPT");
  if (env) snprintf(script, sizeof(script), "%s", env);
  else {
    const char* slash = strrchr(__FILE__, '/');
    int d = slash ? (int)(slash - __FILE__) + 1 : 0;
    snprintf(script, sizeof(script), "%.*s../tools/netns-cluster.sh", d, __FILE__);
  }
  if (access(script, X_OK) != 0) {
    printf("    SKIP: %s not found (set CHORUS_NETNS_SCRIPT)\n", script);
    return 0;
  }
  ssize_t k = readlink("/proc/self/exe", exe, sizeof(exe) - 1);
  ASSERT(k > 0);
  exe[k] = 0;
  if (geteuid() != 0) {
    printf("    SKIP: network namespaces need root\n");
    return 0;
  }
  char prefix[16];
  snprintf(prefix, sizeof(prefix), "%.2s%d", tag, (int)(getpid() % 1000000));
  setenv("CHORUS_NETNS_PREFIX", prefix, 1);
  snprintf(dir, sizeof(dir), "/tmp/chorus-netns-%s", prefix);
  mkdir(dir, 0700);
  setenv("CHORUS_CLUSTER_DIR", dir, 1);
  is_up = 1;
  atexit(nn_down);
  int st = nn_sh("%s up %d %s", script, hosts, opts ? opts : "");
  if (st == 77) {
    nn_down();
    printf("    (the cluster script cannot make network namespaces here: its SKIP line above says why)\n");
    return 0;
  }
  ASSERT_EQ(st, 0);
  return 1;
}

pid_t nn_start(const char* opts, int n, int timeout_s, const char* suite_body) {
  char cmd[2 * PATH_MAX + 512];
  snprintf(cmd, sizeof(cmd), "%s run %d --tag --timeout %d %s %s %s", script, n, timeout_s, opts, exe, suite_body);
  fflush(stdout);
  pid_t pid = fork();
  ASSERT(pid >= 0);
  if (pid == 0) {
    execl("/bin/sh", "sh", "-c", cmd, (char*)NULL);
    _exit(127);
  }
  return pid;
}

int nn_wait(pid_t pid) {
  int st;
  while (waitpid(pid, &st, 0) < 0 && errno == EINTR) {}
  return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

int nn_count(const char* stem, int n, int consume) {
  int c = 0;
  for (int r = 0; r < n; r++) {
    char p[256];
    snprintf(p, sizeof(p), "%s/%s%d", dir, stem, r);
    c += access(p, F_OK) == 0;
    if (consume) unlink(p);
  }
  return c;
}

int nn_net_enabled(const char* suite_body) {
  const char* e = getenv("CHORUS_TEST_NET");
  if (e && *e == '0') {
    printf("    SKIP: CHORUS_TEST_NET=0\n");
    return 0;
  }
  if (e && *e == '1') return 1;
  nn_run("", 2, 120, suite_body);
  if (nn_count("nonet", 1, 1)) {
    printf("    SKIP: this build has no network transport between hosts (CHORUS_TEST_NET=1 forces the test)\n");
    return 0;
  }
  return 1;
}

int nn_rank(const char* suite, int* rank, int* n, int* host) {
  const char* h = getenv("CHORUS_NETNS_HOST");
  if (!h || !getenv("CHORUS_CLUSTER_DIR")) {
    printf("    (a rank body of suite \"%s\": runs under tools/netns-cluster.sh only)\n", suite);
    return 0;
  }
  if (host) *host = atoi(h);
  ASSERT_EQ(chorusEnvRankInfo(rank, n, NULL, NULL), ncclSuccess);
  return 1;
}

void nn_file(const char* stem, int rank, const char* text) {
  char p[256];
  snprintf(p, sizeof(p), "%s/%s%d", getenv("CHORUS_CLUSTER_DIR"), stem, rank);
  FILE* f = fopen(p, "w");
  if (f) {
    if (text) fputs(text, f);
    fclose(f);
  }
}

int nn_read(const char* stem, int rank, char* buf, size_t len) {
  char p[256];
  snprintf(p, sizeof(p), "%s/%s%d", getenv("CHORUS_CLUSTER_DIR"), stem, rank);
  FILE* f = fopen(p, "r");
  if (!f) return 0;
  size_t k = fread(buf, 1, len - 1, f);
  buf[k] = 0;
  fclose(f);
  return 1;
}
