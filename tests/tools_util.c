/* Helpers of the tools' tests (tools_util.h). Binaries are found in $CHORUS_BIN_DIR (set by ctest), else
 * next to the test program (both live in build/bin). */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "tools_util.h"

const char* tu_bin(const char* name) {
  static char paths[8][PATH_MAX + 64];
  static int next;
  char* p = paths[next++ % 8];
  const char* dir = getenv("CHORUS_BIN_DIR");
  char self[PATH_MAX];
  if (!dir || !*dir) {
    ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
    self[n > 0 ? n : 0] = '\0';
    char* slash = strrchr(self, '/');
    if (slash) *slash = '\0';
    dir = n > 0 ? self : "build/bin";
  }
  snprintf(p, PATH_MAX + 64, "%.*s/%.60s", PATH_MAX - 1, dir, name);
  return p;
}


double tu_now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

void tu_append(char** buf, size_t* len, const char* data, size_t n) {
  char* nb = realloc(*buf, *len + n + 1);
  ASSERT(nb != NULL);
  memcpy(nb + *len, data, n);
  *len += n;
  nb[*len] = '\0';
  *buf = nb;
}

/* Start argv (env: extra NAME=VALUE entries or NULL) with stdout/stderr on pipes. */
pid_t tu_start_cmd(const char* const* env, char* const* argv, int* out_fd, int* err_fd) {
  int o[2], e[2];
  ASSERT(pipe(o) == 0 && pipe(e) == 0);
  pid_t pid = fork();
  ASSERT(pid >= 0);
  if (pid == 0) {
    setpgid(0, 0);
    dup2(o[1], 1), dup2(e[1], 2);
    close(o[0]), close(o[1]), close(e[0]), close(e[1]);
    int dn = open("/dev/null", O_RDONLY);
    if (dn >= 0) dup2(dn, 0);
    for (int i = 0; env && env[i]; i++) putenv(strdup(env[i]));
    execvp(argv[0], argv);
    fprintf(stderr, "exec %s: %s\n", argv[0], strerror(errno));
    _exit(127);
  }
  close(o[1]), close(e[1]);
  *out_fd = o[0], *err_fd = e[0];
  return pid;
}

/* Collect output until both pipes close, then the exit status; kill the whole group after timeout_s. */
cmd_result tu_finish_cmd(pid_t pid, int out_fd, int err_fd, double t0, int timeout_s) {
  cmd_result r = {0};
  size_t ol = 0, el = 0;
  r.out = calloc(1, 1), r.err = calloc(1, 1);
  int fds[2] = {out_fd, err_fd};
  while (fds[0] >= 0 || fds[1] >= 0) {
    struct pollfd p[2] = {{fds[0], POLLIN, 0}, {fds[1], POLLIN, 0}};
    double left = t0 + timeout_s - tu_now_s();
    if (left <= 0) {
      kill(-pid, SIGKILL);
      rt_fail(__FILE__, __LINE__, "command still running after %d s: killed", timeout_s);
      break;
    }
    if (poll(p, 2, (int)(left * 1000) + 1) < 0 && errno != EINTR) break;
    for (int k = 0; k < 2; k++) {
      if (fds[k] < 0 || !p[k].revents) continue;
      char buf[8192];
      ssize_t n = read(fds[k], buf, sizeof buf);
      if (n > 0) tu_append(k ? &r.err : &r.out, k ? &el : &ol, buf, (size_t)n);
      else if (n == 0 || errno != EINTR) close(fds[k]), fds[k] = -1;
    }
  }
  for (int k = 0; k < 2; k++)
    if (fds[k] >= 0) close(fds[k]);
  int st = 0;
  while (waitpid(pid, &st, 0) < 0 && errno == EINTR) {}
  r.status = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
  r.secs = tu_now_s() - t0;
  return r;
}

cmd_result tu_run_argv(int timeout_s, const char* const* env, char* const* argv) {
  int o, e;
  double t0 = tu_now_s();
  pid_t pid = tu_start_cmd(env, argv, &o, &e);
  return tu_finish_cmd(pid, o, e, t0, timeout_s);
}

/* tu_run(timeout, env, prog, args..., NULL) */
cmd_result tu_run(int timeout_s, const char* const* env, const char* prog, ...) {
  char* argv[64];
  int n = 0;
  argv[n++] = (char*)prog;
  va_list ap;
  va_start(ap, prog);
  for (char* a; n < 63 && (a = va_arg(ap, char*));) argv[n++] = a;
  va_end(ap);
  argv[n] = NULL;
  return tu_run_argv(timeout_s, env, argv);
}

/* A benchmark with arguments given as one space-separated string. */
cmd_result tu_perf(const char* tool, const char* args, const char* const* env) {
  char* argv[64];
  char* copy = strdup(args);
  int n = 0;
  argv[n++] = (char*)tu_bin(tool);
  for (char* s = NULL, *t = strtok_r(copy, " ", &s); t && n < 63; t = strtok_r(NULL, " ", &s)) argv[n++] = t;
  argv[n] = NULL;
  cmd_result r = tu_run_argv(120, env, argv);
  free(copy);
  return r;
}

void tu_cmd_free(cmd_result* r) {
  free(r->out);
  free(r->err);
}

int tu_count_str(const char* hay, const char* needle) {
  int n = 0;
  for (const char* p = hay; (p = strstr(p, needle)); p += strlen(needle)) n++;
  return n;
}

/* Line i (0-based) of text, copied into buf. */
const char* tu_line_at(const char* text, int i, char* buf, size_t n) {
  const char* p = text;
  while (i-- > 0 && p) {
    p = strchr(p, '\n');
    if (p) p++;
  }
  if (!p) return NULL;
  size_t len = strcspn(p, "\n");
  if (len >= n) len = n - 1;
  memcpy(buf, p, len);
  buf[len] = '\0';
  return buf;
}


char* tu_make_tmpdir(void) {
  char tmpl[] = "/tmp/chorus-tools-XXXXXX";
  char* d = mkdtemp(tmpl);
  ASSERT(d != NULL);
  return strdup(d);
}
