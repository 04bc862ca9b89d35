/* The everyday tools, run as a user would: the *_perf benchmarks (flags, output layout, validation,
 * launch modes) and chorusrun (environment, exit codes, signals, timeouts). Binaries are found in
 * $CHORUS_BIN_DIR (set by ctest), else next to this test program (both live in build/bin).
 *
 * Suites: perf_args and chorusrun need no working collectives; perf_output, perf_check and
 * perf_modes run real collectives through the library. */
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

/* ------------------------------------------------------------------------------- helpers ---- */

static const char* bin(const char* name) {
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

typedef struct {
  int status; /* exit code, or 128 + signal */
  char* out;
  char* err;
  double secs;
} cmd_result;

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

static void append(char** buf, size_t* len, const char* data, size_t n) {
  char* nb = realloc(*buf, *len + n + 1);
  ASSERT(nb != NULL);
  memcpy(nb + *len, data, n);
  *len += n;
  nb[*len] = '\0';
  *buf = nb;
}

/* Start argv (env: extra NAME=VALUE entries or NULL) with stdout/stderr on pipes. */
static pid_t start_cmd(const char* const* env, char* const* argv, int* out_fd, int* err_fd) {
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
static cmd_result finish_cmd(pid_t pid, int out_fd, int err_fd, double t0, int timeout_s) {
  cmd_result r = {0};
  size_t ol = 0, el = 0;
  r.out = calloc(1, 1), r.err = calloc(1, 1);
  int fds[2] = {out_fd, err_fd};
  while (fds[0] >= 0 || fds[1] >= 0) {
    struct pollfd p[2] = {{fds[0], POLLIN, 0}, {fds[1], POLLIN, 0}};
    double left = t0 + timeout_s - now_s();
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
      if (n > 0) append(k ? &r.err : &r.out, k ? &el : &ol, buf, (size_t)n);
      else if (n == 0 || errno != EINTR) close(fds[k]), fds[k] = -1;
    }
  }
  for (int k = 0; k < 2; k++)
    if (fds[k] >= 0) close(fds[k]);
  int st = 0;
  while (waitpid(pid, &st, 0) < 0 && errno == EINTR) {}
  r.status = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
  r.secs = now_s() - t0;
  return r;
}

static cmd_result run_argv(int timeout_s, const char* const* env, char* const* argv) {
  int o, e;
  double t0 = now_s();
  pid_t pid = start_cmd(env, argv, &o, &e);
  return finish_cmd(pid, o, e, t0, timeout_s);
}

/* run(timeout, env, prog, args..., NULL) */
static cmd_result run(int timeout_s, const char* const* env, const char* prog, ...) {
  char* argv[64];
  int n = 0;
  argv[n++] = (char*)prog;
  va_list ap;
  va_start(ap, prog);
  for (char* a; n < 63 && (a = va_arg(ap, char*));) argv[n++] = a;
  va_end(ap);
  argv[n] = NULL;
  return run_argv(timeout_s, env, argv);
}

/* A benchmark with arguments given as one space-separated string. */
static cmd_result perf(const char* tool, const char* args, const char* const* env) {
  char* argv[64];
  char* copy = strdup(args);
  int n = 0;
  argv[n++] = (char*)bin(tool);
  for (char* s = NULL, *t = strtok_r(copy, " ", &s); t && n < 63; t = strtok_r(NULL, " ", &s)) argv[n++] = t;
  argv[n] = NULL;
  cmd_result r = run_argv(120, env, argv);
  free(copy);
  return r;
}

static void cmd_free(cmd_result* r) {
  free(r->out);
  free(r->err);
}

static int count_str(const char* hay, const char* needle) {
  int n = 0;
  for (const char* p = hay; (p = strstr(p, needle)); p += strlen(needle)) n++;
  return n;
}

/* Line i (0-based) of text, copied into buf. */
static const char* line_at(const char* text, int i, char* buf, size_t n) {
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

#define EXPECT_HAS(text, needle)                                                                     \
  do {                                                                                               \
    if (!strstr((text), (needle))) rt_fail(__FILE__, __LINE__, "missing \"%s\" in:\n%s", (needle), (text)); \
  } while (0)

static char* make_tmpdir(void) {
  char tmpl[] = "/tmp/chorus-tools-XXXXXX";
  char* d = mkdtemp(tmpl);
  ASSERT(d != NULL);
  return strdup(d);
}

/* ------------------------------------------------------------------- perf: command line ---- */

TEST(perf_args, help) {
  cmd_result r = perf("all_reduce_perf", "-h", NULL);
  EXPECT_EQ(r.status, 0);
  EXPECT_HAS(r.out, "USAGE: all_reduce_perf");
  EXPECT_HAS(r.out, "[-b,--minbytes <min size in bytes>]");
  EXPECT_HAS(r.out, "[-np,--np <N>]");
  cmd_free(&r);
}

TEST(perf_args, bad_values) {
  /* nccl-tests exits with -1 (255) on a bad size; we do so for every usage error, naming the value. */
  static const char* cases[][2] = {
      {"-b 12X", "invalid size specified for 'minbytes': '12X'"},
      {"-e -5", "invalid size specified for 'maxbytes': '-5'"},
      {"-b nan", "invalid size specified for 'minbytes': 'nan'"}, /* NaN to size_t was undefined */
      {"-e inf", "invalid size specified for 'maxbytes': 'inf'"},
      {"-i 1Q", "invalid size specified for 'stepBytes'"},
      {"-b 1M -e 1K", "invalid sizes for 'minbytes' and 'maxbytes': 1048576 > 1024"},
      {"-n abc", "invalid value 'abc' for --iters"},
      {"-t 0", "invalid value '0' for --nthreads"},
      {"-a 7", "invalid value '7' for --average"},
      {"-d float17", "invalid datatype 'float17'"},
      {"-o mean", "invalid op 'mean'"},
      {"-r x", "invalid root 'x'"},
      {"-q 1", "unknown option '-q'"},
      {"--bogus", "unknown option '--bogus'"},
      {"-b", "option '-b' (--minbytes) needs a value"},
      {"-J out.txt", "only JSON output exists"},
      {"-D 1", "device implementations need GPU kernels"},
      {"-K 2", "-K (per_iter_skip) needs -I 1"},
      {"-np 0", "invalid value '0' for --np"},
      {"-f 1 -i 0 -b 1K -e 2K", "would never reach maxbytes"},
      {"extra", "unexpected argument 'extra'"},
  };
  for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
    cmd_result r = perf("all_reduce_perf", cases[i][0], NULL);
    if (r.status != 255) rt_fail(__FILE__, __LINE__, "'%s': exit %d, want 255", cases[i][0], r.status);
    EXPECT_HAS(r.err, cases[i][1]);
    EXPECT_HAS(r.err, "Run 'all_reduce_perf -h'");
    EXPECT_EQ(strlen(r.out), 0);
    cmd_free(&r);
  }
}

TEST(perf_args, size_suffixes) {
  cmd_result r = perf("all_reduce_perf", "-b 0.5K -e 2k -f 2 -n 1 -w 0 -c 0", NULL);
  EXPECT_EQ(r.status, 0);
  EXPECT_HAS(r.out, "minBytes 512 maxBytes 2048 step: 2(factor)");
  EXPECT_EQ(count_str(r.out, "float     sum"), 3); /* 512, 1024, 2048 */
  EXPECT_HAS(r.out, "   N/A\n");                    /* -c 0: not checked */
  cmd_free(&r);
  r = perf("all_reduce_perf", "-b 1K -e 3K -i 1K -n 1 -w 0", NULL); /* additive steps */
  EXPECT_EQ(r.status, 0);
  EXPECT_HAS(r.out, "step: 1024(bytes)");
  EXPECT_HAS(r.out, "\n        3072           768");
  cmd_free(&r);
}

/* ------------------------------------------------------------------- perf: output format ---- */

static const char* const golden_header[3] = {
    "#                                                              out-of-place                       in-place          ",
    "#       size         count      type   redop    root     time   algbw   busbw  #wrong     time   algbw   busbw  #wrong ",
    "#        (B)    (elements)                               (us)  (GB/s)  (GB/s)             (us)  (GB/s)  (GB/s)         ",
};

TEST(perf_output, golden_layout) {
  cmd_result r = perf("all_reduce_perf", "-b 8 -e 64 -f 2 -n 2 -w 1", NULL);
  ASSERT_EQ(r.status, 0);
  char l[512];
  const char* o = r.out;
  EXPECT(line_at(o, 0, l, sizeof l) && strstr(l, "# Chorus perf tests (nccl-tests 2.19.6 format) nccl-headers=") == l);
  EXPECT(line_at(o, 1, l, sizeof l) && strcmp(l, "# Collective test starting: all_reduce_perf") == 0);
  EXPECT(line_at(o, 2, l, sizeof l) &&
         strcmp(l, "# nThread 1 nGpus 1 minBytes 8 maxBytes 64 step: 2(factor) warmup iters: 1 iters: 2 agg iters: 1 "
                   "validation: 1 graph: 0 unalign: 0") == 0);
  EXPECT(line_at(o, 3, l, sizeof l) && strcmp(l, "#") == 0);
  EXPECT(line_at(o, 4, l, sizeof l) && strcmp(l, "# Using devices") == 0);
  int rank = -1, group = -1, pid = 0, dev = -1;
  char host[128] = "", name[64] = "";
  EXPECT(line_at(o, 5, l, sizeof l) &&
         sscanf(l, "#  Rank %d Group %d Pid %d on %127s device %d [0000:00:00] %63s", &rank, &group, &pid, host, &dev,
                name) == 6);
  EXPECT(rank == 0 && group == 0 && pid > 0 && dev == 0 && strcmp(name, "host") == 0);
  EXPECT(strncmp(l, "#  Rank  0 Group  0 Pid ", 24) == 0);
  EXPECT(line_at(o, 6, l, sizeof l) && strcmp(l, "#") == 0);
  for (int i = 0; i < 3; i++) {
    if (!line_at(o, 7 + i, l, sizeof l) || strcmp(l, golden_header[i]) != 0)
      rt_fail(__FILE__, __LINE__, "header line %d:\n got  '%s'\n want '%s'", i, l, golden_header[i]);
  }
  /* Rows: "%12li  %12li  %8s  %6s  %6s" then twice "  %7s  %6s  %6s  %6g": 118 characters. */
  const long sizes[4] = {8, 16, 32, 64};
  for (int i = 0; i < 4; i++) {
    ASSERT(line_at(o, 10 + i, l, sizeof l));
    EXPECT_EQ(strlen(l), 118);
    long size, count, root, w1, w2;
    char type[16], op[16];
    double t1, a1, b1, t2, a2, b2;
    EXPECT_EQ(sscanf(l, "%ld %ld %15s %15s %ld %lf %lf %lf %ld %lf %lf %lf %ld", &size, &count, type, op, &root, &t1,
                     &a1, &b1, &w1, &t2, &a2, &b2, &w2), 13);
    EXPECT_EQ(size, sizes[i]);
    EXPECT_EQ(count, sizes[i] / 4);
    EXPECT(strcmp(type, "float") == 0 && strcmp(op, "sum") == 0 && root == -1 && w1 == 0 && w2 == 0);
    EXPECT(t1 > 0 && t2 > 0 && b1 == 0); /* one rank: busbw factor 2(n-1)/n = 0 */
    /* Columns are right-aligned at fixed places. */
    EXPECT(l[11] != ' ' && l[25] != ' ' && l[35] == 't' && l[43] == 'm' && l[51] == '1');
    EXPECT(l[84] == '0' && l[117] == '0');
  }
  EXPECT(line_at(o, 14, l, sizeof l) && strcmp(l, "# Out of bounds values : 0 OK") == 0);
  EXPECT(line_at(o, 15, l, sizeof l) && strncmp(l, "# Avg bus bandwidth    : ", 25) == 0);
  EXPECT(line_at(o, 16, l, sizeof l) && strcmp(l, "#") == 0);
  EXPECT(line_at(o, 17, l, sizeof l) && strcmp(l, "# Collective test concluded: all_reduce_perf") == 0);
  EXPECT(line_at(o, 18, l, sizeof l) && strcmp(l, "#") == 0);
  EXPECT(line_at(o, 19, l, sizeof l) && strcmp(l, "") == 0);
  EXPECT(line_at(o, 20, l, sizeof l) && strcmp(l, "") == 0); /* text ends with "#\n\n" */
  cmd_free(&r);
}

TEST(perf_output, op_and_root_columns) {
  char l[512];
  cmd_result r = perf("broadcast_perf", "-b 64 -e 64 -n 1 -w 0", NULL); /* rooted: op "none", root 0 */
  EXPECT_EQ(r.status, 0);
  EXPECT(line_at(r.out, 10, l, sizeof l) &&
         strncmp(l, "          64            16     float    none       0", 52) == 0);
  cmd_free(&r);
  r = perf("hypercube_perf", "-b 64 -e 64 -n 1 -w 0", NULL); /* blank op */
  EXPECT_EQ(r.status, 0);
  EXPECT(line_at(r.out, 10, l, sizeof l) &&
         strncmp(l, "          64            16     float              -1", 52) == 0);
  cmd_free(&r);
  r = perf("reduce_perf", "-b 64 -e 64 -n 1 -w 0 -o all -d double", NULL); /* every op in turn */
  EXPECT_EQ(r.status, 0);
  const char* ops[] = {"sum", "prod", "max", "min", "avg", "mulsum"};
  for (int i = 0; i < 6; i++) {
    char want[64];
    snprintf(want, sizeof want, "    double  %6s       0", ops[i]);
    EXPECT_HAS(r.out, want);
  }
  cmd_free(&r);
}

TEST(perf_output, json_and_plots) {
  char* dir = make_tmpdir();
  char json[PATH_MAX], svg[PATH_MAX], svg2[PATH_MAX], base[PATH_MAX], args[3 * PATH_MAX];
  snprintf(json, sizeof json, "%s/r.json", dir);
  snprintf(svg, sizeof svg, "%s/r.svg", dir);
  snprintf(svg2, sizeof svg2, "%s/all.svg", dir);
  snprintf(base, sizeof base, "%s/baseline.txt", dir);
  snprintf(args, sizeof args, "-b 8 -e 32 -f 2 -n 1 -w 0 -J %s --plot %s", json, svg);
  cmd_result r = perf("all_reduce_perf", args, NULL);
  EXPECT_EQ(r.status, 0);
  char want[PATH_MAX + 64];
  snprintf(want, sizeof want, "# Writing JSON output to %s\n", json);
  EXPECT(strncmp(r.out, want, strlen(want)) == 0); /* first line, as nccl-tests */
  cmd_free(&r);
  FILE* f = fopen(json, "r");
  ASSERT(f != NULL);
  char text[65536];
  size_t n = fread(text, 1, sizeof text - 1, f);
  fclose(f);
  text[n] = '\0';
  EXPECT(text[0] == '{' && n > 2 && strcmp(text + n - 2, "}\n") == 0);
  EXPECT_HAS(text, "\"version\":3");
  EXPECT_HAS(text, "\"config\":{\"nthreads\":1,\"ngpus\":1,\"minimum_bytes\":8,\"maximum_bytes\":32,\"step_factor\":2");
  EXPECT_HAS(text, "\"devices\":[{\"rank\":0,\"group\":0,\"pid\":");
  EXPECT_HAS(text, "\"results\":[{\"size\":8,\"count\":2,\"type\":\"float\",\"redop\":\"sum\",\"root\":\"    -1\"");
  EXPECT_EQ(count_str(text, "\"out_of_place\":{\"time\":"), 3);
  EXPECT_EQ(count_str(text, "\"nwrong\":0.000000"), 6);
  EXPECT_HAS(text, "\"out_of_bounds\":{\"count\":0,\"okay\":\"true\"}");
  EXPECT_HAS(text, "\"average_bus_bandwidth\":{\"bandwidth\":");
  EXPECT_HAS(text, "\"errors\":[]");
  /* An existing file is never overwritten: the next run writes r.json.0. */
  r = perf("all_reduce_perf", args, NULL);
  snprintf(want, sizeof want, "# Writing JSON output to %s.0\n", json);
  EXPECT(strncmp(r.out, want, strlen(want)) == 0);
  cmd_free(&r);

  f = fopen(svg, "r");
  ASSERT(f != NULL);
  n = fread(text, 1, sizeof text - 1, f);
  fclose(f);
  text[n] = '\0';
  EXPECT(strncmp(text, "<?xml", 5) == 0);
  EXPECT_HAS(text, "Bus bandwidth");
  EXPECT_HAS(text, "message size (bytes)");
  EXPECT_HAS(text, "all_reduce_perf float sum, in-place");
  EXPECT_HAS(text, "</svg>");

  /* chorus-plot overlays the JSON with a peer baseline table ("## title", then size time algbw busbw check). */
  f = fopen(base, "w");
  ASSERT(f != NULL);
  fprintf(f, "## Open MPI 4.1.4 shared memory (btl vader)\n# mpi allreduce nranks 1\n"
             "%12s %12s %10s %10s %8s\n%12d %12.2f %10.3f %10.3f %8s\n%12d %12.2f %10.3f %10.3f %8s\n",
          "size(B)", "time(us)", "algbw", "busbw", "check", 8, 1.5, 0.005, 0.005, "ok", 1024, 3.0, 0.3, 0.3, "ok");
  fclose(f);
  char label_json[PATH_MAX + 16];
  snprintf(label_json, sizeof label_json, "chorus=%s", json);
  r = run(30, NULL, bin("chorus-plot"), "-o", svg2, "-t", "test plot", label_json, base, (char*)NULL);
  EXPECT_EQ(r.status, 0);
  cmd_free(&r);
  f = fopen(svg2, "r");
  ASSERT(f != NULL);
  n = fread(text, 1, sizeof text - 1, f);
  fclose(f);
  text[n] = '\0';
  EXPECT_HAS(text, ">chorus</text>");
  EXPECT_HAS(text, ">Open MPI 4.1.4 shared memory (btl vader)</text>");
  EXPECT_HAS(text, ">test plot</text>");
  r = run(30, NULL, bin("chorus-plot"), "-o", svg2, (char*)NULL); /* no inputs: usage error */
  EXPECT_EQ(r.status, 2);
  cmd_free(&r);
  char cmd[PATH_MAX + 16];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
  EXPECT_EQ(system(cmd), 0);
  free(dir);
}

/* ------------------------------------------------------------------- perf: validation ---- */

TEST(perf_check, corrupted_result_is_caught) {
  static const char* const env[] = {"CHORUS_PERF_CORRUPT=1", NULL};
  cmd_result r = perf("all_reduce_perf", "-b 64 -e 256 -f 2 -n 1 -w 0", env);
  EXPECT_EQ(r.status, 7); /* nccl-tests' testNumResults */
  EXPECT_HAS(r.out, "# Out of bounds values : 6 FAILED"); /* 3 sizes x 2 placements */
  char l[512];
  long w1 = -1, w2 = -1;
  EXPECT(line_at(r.out, 10, l, sizeof l) &&
         sscanf(l, "%*d %*d %*s %*s %*d %*f %*f %*f %ld %*f %*f %*f %ld", &w1, &w2) == 2 && w1 == 1 && w2 == 1);
  cmd_free(&r);
  /* Across threads: the wrong element of rank 0 is counted once, by the whole job. */
  r = perf("all_gather_perf", "-t 2 -b 256 -e 256 -n 1 -w 0", env);
  EXPECT_EQ(r.status, 7);
  EXPECT_HAS(r.out, "# Out of bounds values : 2 FAILED");
  cmd_free(&r);
}

/* alltoallv_perf: the Zipf split (the default) and the uniform one, by ncclAllToAllv and as grouped
 * sends and receives, checked; no in-place columns; a wrong element caught; its options refused by
 * the other tools. Then on device buffers of ranks sharing the stand-in GPU (empty blocks left out
 * there: a group on the GPU holds no sends through host memory), threads and processes. */
TEST_T(perf_check, alltoallv_splits, 180) {
  static const char* const args[] = {"-t 3 -b 0 -e 64K -f 8 -n 1 -w 1", "-t 3 -b 0 -e 64K -f 8 -n 1 -w 1 --grouped 1",
                                     "-np 2 -g 2 -b 8 -e 1M -f 32 -n 1 -w 1 --split uniform --seed 9 -d all",
                                     "-t 4 -b 1K -e 1K -n 1 -w 0 --seed 3 --grouped 1 -d all"};
  for (size_t i = 0; i < sizeof(args) / sizeof(args[0]); i++) {
    cmd_result r = perf("alltoallv_perf", args[i], NULL);
    if (r.status != 0 || !strstr(r.out, "# Out of bounds values : 0 OK"))
      rt_fail(__FILE__, __LINE__, "alltoallv_perf %s: exit %d\n%s%s", args[i], r.status, r.out, r.err);
    EXPECT_HAS(r.out, "# Split: ");
    EXPECT_HAS(r.out, strstr(args[i], "--grouped 1") ? "exchanged by grouped ncclSend/ncclRecv" : "by ncclAllToAllv");
    EXPECT_HAS(r.out, "0      N/A     N/A     N/A     N/A\n"); /* #wrong 0, then no in-place form */
    cmd_free(&r);
  }
  static const char* const corrupt[] = {"CHORUS_PERF_CORRUPT=1", NULL};
  cmd_result r = perf("alltoallv_perf", "-t 3 -b 1K -e 4K -f 4 -n 1 -w 0", corrupt);
  EXPECT_EQ(r.status, 7);
  EXPECT_HAS(r.out, "# Out of bounds values : 2 FAILED"); /* 2 sizes, out of place only */
  cmd_free(&r);
  r = perf("alltoallv_perf", "--split pareto", NULL);
  EXPECT_EQ(r.status, 255);
  EXPECT_HAS(r.err, "invalid split 'pareto': expected zipf or uniform");
  cmd_free(&r);
  r = perf("alltoall_perf", "--grouped 1", NULL);
  EXPECT_EQ(r.status, 255);
  EXPECT_HAS(r.err, "--grouped: only alltoallv_perf takes it");
  cmd_free(&r);
  static const char* const dev[] = {"CHORUS_CUDA_LIBRARY=" CHORUS_FAKE_CUDA, NULL};
  static const char* const dargs[] = {"--device -t 2 -g 2 -b 0 -e 4K -f 8 -n 1 -w 1 -d all",
                                      "--device -np 3 -b 0 -e 64K -f 8 -n 1 -w 1 --grouped 1"};
  for (size_t i = 0; i < sizeof(dargs) / sizeof(dargs[0]); i++) {
    r = perf("alltoallv_perf", dargs[i], dev);
    if (r.status != 0 || !strstr(r.out, "# Out of bounds values : 0 OK"))
      rt_fail(__FILE__, __LINE__, "alltoallv_perf %s: exit %d\n%s%s", dargs[i], r.status, r.out, r.err);
    cmd_free(&r);
  }
}

/* Every collective tool with `args`: exact results (exit 0, no wrong element). progress: a line per
 * tool as it starts and ends, so that a slow tool and a hung one look different in the log. */
static void every_tool_as(const char* args, const char* const* env, int progress) {
  static const char* tools[] = {"all_reduce_perf",     "all_gather_perf", "broadcast_perf", "reduce_perf",
                                "reduce_scatter_perf", "alltoall_perf",   "alltoallv_perf", "gather_perf",
                                "scatter_perf",        "sendrecv_perf",   "hypercube_perf"};
  for (size_t i = 0; i < sizeof(tools) / sizeof(tools[0]); i++) {
    double t0 = now_s();
    if (progress) printf("    %s %s ...\n", tools[i], args), fflush(stdout);
    cmd_result r = perf(tools[i], args, env);
    if (r.status != 0 || !strstr(r.out, "# Out of bounds values : 0 OK"))
      rt_fail(__FILE__, __LINE__, "%s %s: exit %d\n%s%s", tools[i], args, r.status, r.out, r.err);
    else if (progress) printf("    %s: ok in %.1f s\n", tools[i], now_s() - t0), fflush(stdout);
    cmd_free(&r);
  }
}
static void every_tool(const char* args, const char* const* env) { every_tool_as(args, env, 0); }

TEST_T(perf_check, every_collective_every_type, 600) {
  /* Exact results for every type and op, with ranks spread over threads and ranks per thread. */
  every_tool("-t 2 -g 2 -b 0 -e 1K -f 8 -n 1 -w 1 -d all -o all -r all", NULL);
}

/* The same matrix on CUDA device buffers with a CUDA stream per rank (the stand-in driver): every
 * collective x type x op x root, in and out of place, 2 threads x 2 ranks, then 2 processes x 2 ranks. */
TEST_T(perf_check, every_collective_device_buffers, 900) {
  static const char* const env[] = {"CHORUS_CUDA_LIBRARY=" CHORUS_FAKE_CUDA, NULL};
  every_tool("--device -t 2 -g 2 -b 0 -e 1K -f 8 -n 1 -w 1 -d all -o all -r all", env);
  cmd_result r = perf("all_reduce_perf", "--device -np 2 -g 2 -b 4 -e 64K -f 16 -n 1 -w 1 -d all -o all", env);
  if (r.status != 0 || !strstr(r.out, "# Out of bounds values : 0 OK"))
    rt_fail(__FILE__, __LINE__, "processes: exit %d\n%s%s", r.status, r.out, r.err);
  cmd_free(&r);
}

/* The same on a real GPU, where one is visible (libcuda.so.1 loads and finds a device): two ranks per
 * thread share it, each with a CUDA stream; then two processes. Skipped elsewhere, saying so. */
TEST_T(perf_check, every_collective_real_gpu, 300) {
  void* h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  int (*cu_init)(unsigned) = h ? (int (*)(unsigned))dlsym(h, "cuInit") : NULL;
  int (*cu_count)(int*) = h ? (int (*)(int*))dlsym(h, "cuDeviceGetCount") : NULL;
  int ndev = 0;
  if (!cu_init || !cu_count || cu_init(0) != 0 || cu_count(&ndev) != 0 || ndev < 1) {
    printf("    SKIP: no CUDA driver with a device here (%s)\n", h ? "no device" : "libcuda.so.1 not found");
    return;
  }
  /* Two sizes (1000 B: shares that split unevenly; ~1 MiB: many blocks), each call once, checked on
   * the host: every type x op x root x placement. Three sizes took 65 s for the tools on an H200 (a
   * combination ~38 ms, whatever its size), the whole test 150 s; the stand-in driver runs size 0. */
  every_tool_as("--device -g 2 -b 1000 -e 1M -f 1024 -n 1 -w 0 -d all -o all -r all", NULL, 1);
  /* Processes (CUDA IPC): every type of AllReduce; sends and receives, each pair's copy on its lower
   * rank, on 2 and 3 processes (a ring of 3 has a pair whose receiver copies). */
  static const char* procs[][2] = {{"all_reduce_perf", "--device -np 2 -g 2 -b 1000 -e 1M -f 1024 -n 1 -w 0 -d all"},
                                   {"sendrecv_perf", "--device -np 2 -b 4 -e 4M -f 1024 -n 2 -w 1"},
                                   {"sendrecv_perf", "--device -np 3 -b 4 -e 4M -f 1024 -n 2 -w 1"},
                                   {"alltoall_perf", "--device -np 3 -b 12 -e 12M -f 1024 -n 2 -w 1"}};
  for (size_t i = 0; i < sizeof(procs) / sizeof(procs[0]); i++) {
    cmd_result r = perf(procs[i][0], procs[i][1], NULL);
    if (r.status != 0 || !strstr(r.out, "# Out of bounds values : 0 OK"))
      rt_fail(__FILE__, __LINE__, "%s %s: exit %d\n%s%s", procs[i][0], procs[i][1], r.status, r.out, r.err);
    else printf("    %s %s: ok\n", procs[i][0], procs[i][1]), fflush(stdout);
    cmd_free(&r);
  }
}

/* ------------------------------------------------------------------- perf: launch modes ---- */

TEST(perf_modes, threads_and_streams) {
  cmd_result r = perf("all_reduce_perf", "-t 3 -b 8 -e 4K -f 4 -n 2 --stream -p 1", NULL);
  EXPECT_EQ(r.status, 0);
  EXPECT_HAS(r.out, "#  Rank  2 Group  0 Pid");
  EXPECT_HAS(r.out, "# Host streams:");
  EXPECT_HAS(r.out, "# Out of bounds values : 0 OK");
  cmd_free(&r);
}

TEST(perf_modes, forked_processes) {
  cmd_result r = perf("all_reduce_perf", "-np 3 -b 8 -e 4K -f 4 -n 2", NULL);
  EXPECT_EQ(r.status, 0);
  EXPECT_EQ(count_str(r.out, "# Collective test starting"), 1); /* only rank 0 prints */
  EXPECT_EQ(count_str(r.out, "#  Rank "), 3);
  EXPECT_HAS(r.out, "# Out of bounds values : 0 OK");
  cmd_free(&r);
  static const char* const env[] = {"CHORUS_PERF_CORRUPT=1", NULL};
  r = perf("all_reduce_perf", "-np 2 -b 64 -e 64 -n 1", env); /* the exit code comes through */
  EXPECT_EQ(r.status, 7);
  cmd_free(&r);
}

TEST(perf_modes, under_chorusrun) {
  cmd_result r = run(120, NULL, bin("chorusrun"), "-n", "2", bin("all_reduce_perf"), "-t", "2", "-b", "8", "-e", "4K",
                     "-f", "4", "-n", "2", (char*)NULL);
  if (r.status != 0) rt_fail(__FILE__, __LINE__, "exit %d:\n%s%s", r.status, r.out, r.err);
  EXPECT_EQ(count_str(r.out, "# Collective test starting"), 1);
  EXPECT_EQ(count_str(r.out, "#  Rank "), 4); /* 2 processes x 2 threads */
  EXPECT_HAS(r.out, "# Out of bounds values : 0 OK");
  cmd_free(&r);
}

/* The harness's own exchanges (device records, the unique id under a launcher, times, error counts,
 * the barrier) are send/recv: NCCL_ALGO and NCCL_PROTO restrict only the operation being timed.
 * NCCL_ALGO=Tree leaves AllGather no algorithm, which once failed every tool before its first row. */
TEST_T(perf_modes, bookkeeping_ignores_nccl_algo, 180) {
  static const char* const tree[] = {"NCCL_ALGO=Tree", NULL};
  cmd_result r = run(120, tree, bin("chorusrun"), "-n", "3", bin("all_reduce_perf"), "-b", "8", "-e", "64K", "-f",
                     "4", "-n", "2", (char*)NULL);
  if (r.status != 0 || !strstr(r.out, "# Out of bounds values : 0 OK"))
    rt_fail(__FILE__, __LINE__, "chorusrun -n 3: exit %d\n%s%s", r.status, r.out, r.err);
  cmd_free(&r);
  /* threads under a launcher (the id goes to the other process first), -m and -z together */
  r = run(120, tree, bin("chorusrun"), "-n", "2", bin("all_reduce_perf"), "-t", "2", "-b", "8", "-e", "4K", "-f", "4",
          "-n", "2", "-m", "2", "-z", "1", (char*)NULL);
  if (r.status != 0 || !strstr(r.out, "# Out of bounds values : 0 OK"))
    rt_fail(__FILE__, __LINE__, "chorusrun -n 2 -t 2: exit %d\n%s%s", r.status, r.out, r.err);
  cmd_free(&r);
  static const char* const ll[] = {"NCCL_PROTO=LL", NULL};
  r = perf("broadcast_perf", "-t 3 -b 8 -e 64K -f 4 -n 2 -I 1", ll);
  if (r.status != 0 || !strstr(r.out, "# Out of bounds values : 0 OK"))
    rt_fail(__FILE__, __LINE__, "NCCL_PROTO=LL: exit %d\n%s%s", r.status, r.out, r.err);
  cmd_free(&r);
  /* the timed AllGather itself still obeys */
  r = perf("all_gather_perf", "-t 3 -b 8 -e 64 -n 1", tree);
  EXPECT_EQ(r.status, 3);
  EXPECT_HAS(r.err, "AllGather: NCCL_ALGO=Tree leaves it no algorithm");
  EXPECT_HAS(r.err, "ctx->coll->run");
  cmd_free(&r);
}

/* --device, nccl-tests' way: cuMemAlloc'ed buffers and a CUDA stream per rank, here with the stand-in
 * driver (tests/cuda_stub). Two ranks per thread, each on its own stream; then processes; then the
 * check must see a corrupted result through the device copies. */
TEST(perf_modes, device_buffers) {
  static const char* const env[] = {"CHORUS_CUDA_LIBRARY=" CHORUS_FAKE_CUDA, NULL};
  static const char* tools[] = {"all_reduce_perf", "all_gather_perf", "reduce_scatter_perf", "broadcast_perf",
                                "sendrecv_perf"};
  for (size_t i = 0; i < sizeof(tools) / sizeof(tools[0]); i++) {
    cmd_result r = perf(tools[i], "--device -g 2 -b 8 -e 64K -f 32 -n 2 -w 1", env);
    if (r.status != 0 || !strstr(r.out, "# Out of bounds values : 0 OK"))
      rt_fail(__FILE__, __LINE__, "%s: exit %d\n%s%s", tools[i], r.status, r.out, r.err);
    cmd_free(&r);
  }
  cmd_result r = perf("all_reduce_perf", "--device -np 2 -b 1K -e 1K -n 2", env);
  EXPECT_EQ(r.status, 0);
  EXPECT_HAS(r.out, "# Out of bounds values : 0 OK");
  cmd_free(&r);
  static const char* const bad[] = {"CHORUS_CUDA_LIBRARY=" CHORUS_FAKE_CUDA, "CHORUS_PERF_CORRUPT=1", NULL};
  r = perf("all_reduce_perf", "--device -b 1K -e 1K -n 1", bad);
  EXPECT_EQ(r.status, 7);
  cmd_free(&r);
  static const char* const none[] = {"CHORUS_CUDA_LIBRARY=libchorus-no-such-driver.so", NULL};
  r = perf("all_reduce_perf", "--device -b 8 -e 8 -n 1", none);
  EXPECT_EQ(r.status, 6); /* invalid usage: no driver, said so */
  EXPECT(strstr(r.out, "cannot open the CUDA driver") || strstr(r.err, "cannot open the CUDA driver"));
  cmd_free(&r);
}

/* ------------------------------------------------------------------- chorusrun ---- */

TEST(chorusrun, environment_and_tags) {
  cmd_result r = run(30, NULL, bin("chorusrun"), "-n", "3", "--tag-output", "sh", "-c",
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
  cmd_free(&r);
  /* An unterminated last line still comes out, tagged. */
  r = run(30, NULL, bin("chorusrun"), "-n", "1", "--tag-output", "printf", "tail", (char*)NULL);
  EXPECT(strcmp(r.out, "[0] tail\n") == 0);
  cmd_free(&r);
}

TEST(chorusrun, failed_rank_exit_status) {
  cmd_result r = run(30, NULL, bin("chorusrun"), "-n", "3", "sh", "-c", "if [ $RANK = 1 ]; then exit 3; fi; sleep 20",
                     (char*)NULL);
  EXPECT_EQ(r.status, 3);
  EXPECT_HAS(r.err, "chorusrun: rank 1 (pid ");
  EXPECT_HAS(r.err, ") exited with status 3\n");
  EXPECT(r.secs < 10); /* the sleeping ranks were terminated */
  cmd_free(&r);
}

TEST(chorusrun, killed_rank_signal) {
  cmd_result r = run(30, NULL, bin("chorusrun"), "-n", "3", "sh", "-c",
                     "if [ $RANK = 2 ]; then kill -KILL $$; fi; sleep 20", (char*)NULL);
  EXPECT_EQ(r.status, 128 + SIGKILL);
  EXPECT_HAS(r.err, "chorusrun: rank 2 (pid ");
  EXPECT_HAS(r.err, ") killed by signal SIGKILL\n");
  EXPECT(r.secs < 10);
  cmd_free(&r);
}

/* A rank that exits cleanly while the others run is named once, as it happens (before the others'
 * later output), and the job goes on; ranks that finish together are not named. */
TEST(chorusrun, early_clean_exit_is_reported) {
  cmd_result r = run(30, NULL, bin("chorusrun"), "-n", "4", "sh", "-c",
                     "if [ $RANK = 2 ]; then exit 0; fi; sleep 2.5; echo late$RANK >&2", (char*)NULL);
  EXPECT_EQ(r.status, 0);
  const char* said = strstr(r.err, "chorusrun: rank 2 (pid ");
  EXPECT(said != NULL);
  EXPECT_HAS(r.err, ") exited with status 0 while 3 other ranks still run\n");
  EXPECT(said && !strstr(said + 1, "chorusrun: rank 2 (pid ")); /* once */
  const char* late = strstr(r.err, "late");
  EXPECT(said && late && said < late);
  cmd_free(&r);
  r = run(30, NULL, bin("chorusrun"), "-n", "3", "sh", "-c", "sleep 0.2", (char*)NULL);
  EXPECT_EQ(r.status, 0);
  EXPECT(!strstr(r.err, "exited with status 0"));
  cmd_free(&r);
}

/* A crash after the first failure is reported too (it may be the cause: a peer seeing the crashed
 * rank's sockets close can be reaped first); ranks ended by our SIGTERM are not. */
TEST(chorusrun, later_crash_is_reported) {
  cmd_result r = run(30, NULL, bin("chorusrun"), "-n", "3", "sh", "-c",
                     "trap '' TERM; if [ $RANK = 0 ]; then sleep 0.3; exit 1; fi; if [ $RANK = 1 ]; then sleep 0.6; "
                     "kill -SEGV $$; fi; sleep 20",
                     (char*)NULL);
  EXPECT_EQ(r.status, 1);
  EXPECT_HAS(r.err, ") also died: killed by signal SIGSEGV\n");
  EXPECT(!strstr(r.err, "rank 2 (pid ") || !strstr(r.err, "also died: killed by signal SIGKILL"));
  cmd_free(&r);
}

TEST(chorusrun, first_rank_overflow_refused) {
  const char* const env[] = {"NCCL_COMM_ID=127.0.0.1:1", NULL};
  cmd_result r = run(30, env, bin("chorusrun"), "--first-rank", "2147483647", "--world-size", "5", "-n", "2", "true",
                     (char*)NULL);
  EXPECT_EQ(r.status, 2);
  EXPECT_HAS(r.err, "do not fit in a world of 5");
  cmd_free(&r);
}

TEST(chorusrun, sigkill_after_grace) {
  /* Rank 1 ignores SIGTERM: it gets SIGKILL about 2 s after rank 0 failed. */
  cmd_result r = run(30, NULL, bin("chorusrun"), "-n", "2", "sh", "-c",
                     "trap '' TERM; if [ $RANK = 0 ]; then sleep 0.5; exit 5; fi; sleep 20", (char*)NULL);
  EXPECT_EQ(r.status, 5);
  EXPECT_HAS(r.err, "did not stop after SIGTERM");
  EXPECT(r.secs > 2 && r.secs < 10);
  cmd_free(&r);
}

TEST(chorusrun, timeout_names_hung_rank) {
  cmd_result r = run(30, NULL, bin("chorusrun"), "-n", "3", "--timeout", "1", "sh", "-c",
                     "if [ $RANK = 2 ]; then sleep 20; fi", (char*)NULL);
  EXPECT_EQ(r.status, 124);
  EXPECT_HAS(r.err, "chorusrun: rank 2 (pid ");
  EXPECT_HAS(r.err, ") did not finish within 1 s\n");
  /* Ranks 0 and 1 finished: named at most as having exited early (early_clean_exit_is_reported). */
  const char* once = strstr(r.err, "did not finish");
  EXPECT(once && !strstr(once + 1, "did not finish"));
  EXPECT(r.secs < 10);
  cmd_free(&r);
}

TEST(chorusrun, forwards_sigterm) {
  char* dir = make_tmpdir();
  char script[PATH_MAX + 128];
  snprintf(script, sizeof script, "trap 'echo bye > %s/$RANK; kill $!; exit 0' TERM; echo ready; sleep 20 & wait",
           dir);
  char* argv[] = {(char*)bin("chorusrun"), "-n", "2", "--tag-output", "sh", "-c", script, NULL};
  int o, e;
  double t0 = now_s();
  pid_t pid = start_cmd(NULL, argv, &o, &e);
  /* Wait for both ranks to be ready, then SIGTERM chorusrun alone (not its group). */
  char buf[4096] = "";
  size_t len = 0;
  while (count_str(buf, "ready") < 2 && now_s() - t0 < 20) {
    struct pollfd p = {o, POLLIN, 0};
    if (poll(&p, 1, 100) > 0) {
      ssize_t n = read(o, buf + len, sizeof buf - 1 - len);
      if (n <= 0) break;
      len += (size_t)n;
    }
    buf[len] = '\0';
  }
  EXPECT_EQ(count_str(buf, "ready"), 2);
  kill(pid, SIGTERM);
  cmd_result r = finish_cmd(pid, o, e, t0, 30);
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
  cmd_free(&r);
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
    cmd_result r = run(10, NULL, bin("chorusrun"), cases[i][0], cases[i][1], cases[i][2], (char*)NULL);
    if (r.status != 2) rt_fail(__FILE__, __LINE__, "case %zu: exit %d, want 2", i, r.status);
    EXPECT_HAS(r.err, cases[i][3]);
    EXPECT_HAS(r.err, "usage: chorusrun -n N");
    cmd_free(&r);
  }
  cmd_result r = run(10, NULL, bin("chorusrun"), "-n", "2", "/nonexistent/program", (char*)NULL);
  EXPECT_EQ(r.status, 127);
  EXPECT_HAS(r.err, "chorusrun: cannot run '/nonexistent/program'");
  cmd_free(&r);
}

TEST(chorusrun, hosts_and_binding) {
  cmd_result r = run(10, NULL, bin("chorusrun"), "--hosts", "nodeA,nodeB", "--per-host", "2", "--port", "29999", "prog",
                     "-x", "a b", (char*)NULL);
  EXPECT_EQ(r.status, 0);
  EXPECT_HAS(r.out, "# on nodeA: ranks 0-1\n");
  EXPECT_HAS(r.out, "# on nodeB: ranks 2-3\n");
  EXPECT_EQ(count_str(r.out, "NCCL_COMM_ID=nodeA:29999 "), 2);
  EXPECT_HAS(r.out, " -n 2 --first-rank 0 --world-size 4 prog -x 'a b'\n");
  EXPECT_HAS(r.out, " -n 2 --first-rank 2 --world-size 4 prog -x 'a b'\n");
  cmd_free(&r);
  /* What a printed line does on its host: ranks 2-3 of 4, local ranks 0-1. */
  static const char* const env[] = {"NCCL_COMM_ID=127.0.0.1:29999", NULL};
  r = run(10, env, bin("chorusrun"), "-n", "2", "--first-rank", "2", "--world-size", "4", "--tag-output", "sh", "-c",
          "echo $RANK/$WORLD_SIZE/$LOCAL_RANK/$LOCAL_WORLD_SIZE", (char*)NULL);
  EXPECT_HAS(r.out, "[2] 2/4/0/2\n");
  EXPECT_HAS(r.out, "[3] 3/4/1/2\n");
  cmd_free(&r);
  r = run(10, NULL, bin("chorusrun"), "-n", "2", "--bind", "core", "--tag-output", "sh", "-c",
          "grep Cpus_allowed_list /proc/self/status", (char*)NULL);
  EXPECT_EQ(r.status, 0);
  const char* p = strstr(r.out, "[0] Cpus_allowed_list:");
  EXPECT(p && strcspn(p + 22, "-,\n") == strcspn(p + 22, "\n")); /* one CPU, no range or list */
  cmd_free(&r);
}

/* chorus-info --calibrate measures and writes a file the library accepts as CHORUS_TUNE_FILE. */
TEST_T(chorus_info, calibrate_writes_a_usable_file, 120) {
  char* dir = make_tmpdir();
  char path[PATH_MAX];
  snprintf(path, sizeof(path), "%s/tune.conf", dir);
  cmd_result r = run(100, NULL, bin("chorus-info"), "--calibrate", path, (char*)NULL);
  EXPECT_EQ(r.status, 0);
  EXPECT_HAS(r.out, "step_us.Simple");
  EXPECT_HAS(r.out, "wrote ");
  cmd_free(&r);
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
  cmd_result r = run(20, NULL, bin("chorus-info"), "--version", (char*)NULL);
  EXPECT_EQ(r.status, 0);
  EXPECT_HAS(r.out, CHORUS_VERSION_STRING);
  EXPECT(!strstr(r.out, "usage:"));
  cmd_free(&r);
  r = run(20, NULL, bin("chorus-info"), "--help", (char*)NULL);
  EXPECT_EQ(r.status, 0);
  EXPECT_HAS(r.out, "--brief stops");
  cmd_free(&r);
  r = run(20, NULL, bin("chorus-info"), "--frobnicate", (char*)NULL);
  EXPECT_EQ(r.status, 2);
  EXPECT_HAS(r.err, "chorus-info: unknown option '--frobnicate'\nusage: chorus-info");
  cmd_free(&r);
  static const char* const env[] = {"NCCL_NET_PLUGIN=none", "CHORUS_TIMEOUT=77", NULL};
  r = run(30, env, bin("chorus-info"), (char*)NULL);
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
  cmd_free(&r);
}

/* --respawn: a rank that fails is started again (same RANK, CHORUS_RESPAWN=k), up to K times, with a
 * private CHORUS_ELASTIC_DIR every rank sees and that is gone afterwards; one more failure ends the job
 * as without it. Output of the replaced process and its replacement both come through, tagged. */
TEST(chorusrun, respawn_replaces_failed_ranks) {
  cmd_result r = run(30, NULL, bin("chorusrun"), "-n", "2", "--respawn", "2", "--tag-output", "sh", "-c",
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
  cmd_free(&r);
  r = run(30, NULL, bin("chorusrun"), "-n", "2", "--respawn", "1", "sh", "-c",
          "if [ $RANK = 0 ]; then exit 4; fi; sleep 20", (char*)NULL);
  EXPECT_EQ(r.status, 4); /* the replacement failed too: no replacements left */
  EXPECT(r.secs < 10);
  cmd_free(&r);
}

/* examples/elastic.c under chorusrun --respawn: two ranks die mid-AllReduce (SIGKILL), the survivors
 * shrink and grow back with a replacement each time, and every rank ends with the right weights. */
TEST_T(chorusrun, elastic_example_survives_two_deaths, 120) {
  cmd_result r = run(100, NULL, bin("chorusrun"), "-n", "4", "--respawn", "2", bin("elastic"), (char*)NULL);
  if (r.status != 0) rt_fail(__FILE__, __LINE__, "exit %d:\n%s%s", r.status, r.out, r.err);
  EXPECT_EQ(count_str(r.out, "20 steps, 2 rank(s) replaced, weights as expected"), 4);
  EXPECT_EQ(count_str(r.err, "killed by signal SIGKILL; starting replacement"), 2);
  cmd_free(&r);
}

/* put_perf: one-sided puts into ncclMemAlloc windows (-R 2 by default), every type, between processes
 * and between threads; data checked. */
TEST_T(perf_check, put_perf_processes_and_threads, 120) {
  const char* args[] = {"-np 2 -b 8 -e 1M -f 8 -n 2 -w 1 -d all", "-t 3 -b 8 -e 64K -f 8 -n 2 -w 1"};
  for (int i = 0; i < 2; i++) {
    cmd_result r = perf("put_perf", args[i], NULL);
    if (r.status != 0 || !strstr(r.out, "# Out of bounds values : 0 OK"))
      rt_fail(__FILE__, __LINE__, "put_perf %s: exit %d\n%s%s", args[i], r.status, r.out, r.err);
    cmd_free(&r);
  }
}
