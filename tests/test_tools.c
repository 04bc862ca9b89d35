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
#include "tools_util.h"

/* ------------------------------------------------------------------- perf: command line ---- */

TEST(perf_args, help) {
  cmd_result r = tu_perf("all_reduce_perf", "-h", NULL);
  EXPECT_EQ(r.status, 0);
  EXPECT_HAS(r.out, "USAGE: all_reduce_perf");
  EXPECT_HAS(r.out, "[-b,--minbytes <min size in bytes>]");
  EXPECT_HAS(r.out, "[-np,--np <N>]");
  tu_cmd_free(&r);
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
    cmd_result r = tu_perf("all_reduce_perf", cases[i][0], NULL);
    if (r.status != 255) rt_fail(__FILE__, __LINE__, "'%s': exit %d, want 255", cases[i][0], r.status);
    EXPECT_HAS(r.err, cases[i][1]);
    EXPECT_HAS(r.err, "Run 'all_reduce_perf -h'");
    EXPECT_EQ(strlen(r.out), 0);
    tu_cmd_free(&r);
  }
}

TEST(perf_args, size_suffixes) {
  cmd_result r = tu_perf("all_reduce_perf", "-b 0.5K -e 2k -f 2 -n 1 -w 0 -c 0", NULL);
  EXPECT_EQ(r.status, 0);
  EXPECT_HAS(r.out, "minBytes 512 maxBytes 2048 step: 2(factor)");
  EXPECT_EQ(tu_count_str(r.out, "float     sum"), 3); /* 512, 1024, 2048 */
  EXPECT_HAS(r.out, "   N/A\n");                    /* -c 0: not checked */
  tu_cmd_free(&r);
  r = tu_perf("all_reduce_perf", "-b 1K -e 3K -i 1K -n 1 -w 0", NULL); /* additive steps */
  EXPECT_EQ(r.status, 0);
  EXPECT_HAS(r.out, "step: 1024(bytes)");
  EXPECT_HAS(r.out, "\n        3072           768");
  tu_cmd_free(&r);
}

/* ------------------------------------------------------------------- perf: output format ---- */

static const char* const golden_header[3] = {
    "#                                                              out-of-place                       in-place          ",
    "#       size         count      type   redop    root     time   algbw   busbw  #wrong     time   algbw   busbw  #wrong ",
    "#        (B)    (elements)                               (us)  (GB/s)  (GB/s)             (us)  (GB/s)  (GB/s)         ",
};

TEST(perf_output, golden_layout) {
  cmd_result r = tu_perf("all_reduce_perf", "-b 8 -e 64 -f 2 -n 2 -w 1", NULL);
  ASSERT_EQ(r.status, 0);
  char l[512];
  const char* o = r.out;
  EXPECT(tu_line_at(o, 0, l, sizeof l) && strstr(l, "# Chorus perf tests (nccl-tests 2.19.6 format) nccl-headers=") == l);
  EXPECT(tu_line_at(o, 1, l, sizeof l) && strcmp(l, "# Collective test starting: all_reduce_perf") == 0);
  EXPECT(tu_line_at(o, 2, l, sizeof l) &&
         strcmp(l, "# nThread 1 nGpus 1 minBytes 8 maxBytes 64 step: 2(factor) warmup iters: 1 iters: 2 agg iters: 1 "
                   "validation: 1 graph: 0 unalign: 0") == 0);
  EXPECT(tu_line_at(o, 3, l, sizeof l) && strcmp(l, "#") == 0);
  EXPECT(tu_line_at(o, 4, l, sizeof l) && strcmp(l, "# Using devices") == 0);
  int rank = -1, group = -1, pid = 0, dev = -1;
  char host[128] = "", name[64] = "";
  EXPECT(tu_line_at(o, 5, l, sizeof l) &&
         sscanf(l, "#  Rank %d Group %d Pid %d on %127s device %d [0000:00:00] %63s", &rank, &group, &pid, host, &dev,
                name) == 6);
  EXPECT(rank == 0 && group == 0 && pid > 0 && dev == 0 && strcmp(name, "host") == 0);
  EXPECT(strncmp(l, "#  Rank  0 Group  0 Pid ", 24) == 0);
  EXPECT(tu_line_at(o, 6, l, sizeof l) && strcmp(l, "#") == 0);
  for (int i = 0; i < 3; i++) {
    if (!tu_line_at(o, 7 + i, l, sizeof l) || strcmp(l, golden_header[i]) != 0)
      rt_fail(__FILE__, __LINE__, "header line %d:\n got  '%s'\n want '%s'", i, l, golden_header[i]);
  }
  /* Rows: "%12li  %12li  %8s  %6s  %6s" then twice "  %7s  %6s  %6s  %6g": 118 characters. */
  const long sizes[4] = {8, 16, 32, 64};
  for (int i = 0; i < 4; i++) {
    ASSERT(tu_line_at(o, 10 + i, l, sizeof l));
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
  EXPECT(tu_line_at(o, 14, l, sizeof l) && strcmp(l, "# Out of bounds values : 0 OK") == 0);
  EXPECT(tu_line_at(o, 15, l, sizeof l) && strncmp(l, "# Avg bus bandwidth    : ", 25) == 0);
  EXPECT(tu_line_at(o, 16, l, sizeof l) && strcmp(l, "#") == 0);
  EXPECT(tu_line_at(o, 17, l, sizeof l) && strcmp(l, "# Collective test concluded: all_reduce_perf") == 0);
  EXPECT(tu_line_at(o, 18, l, sizeof l) && strcmp(l, "#") == 0);
  EXPECT(tu_line_at(o, 19, l, sizeof l) && strcmp(l, "") == 0);
  EXPECT(tu_line_at(o, 20, l, sizeof l) && strcmp(l, "") == 0); /* text ends with "#\n\n" */
  tu_cmd_free(&r);
}

TEST(perf_output, op_and_root_columns) {
  char l[512];
  cmd_result r = tu_perf("broadcast_perf", "-b 64 -e 64 -n 1 -w 0", NULL); /* rooted: op "none", root 0 */
  EXPECT_EQ(r.status, 0);
  EXPECT(tu_line_at(r.out, 10, l, sizeof l) &&
         strncmp(l, "          64            16     float    none       0", 52) == 0);
  tu_cmd_free(&r);
  r = tu_perf("hypercube_perf", "-b 64 -e 64 -n 1 -w 0", NULL); /* blank op */
  EXPECT_EQ(r.status, 0);
  EXPECT(tu_line_at(r.out, 10, l, sizeof l) &&
         strncmp(l, "          64            16     float              -1", 52) == 0);
  tu_cmd_free(&r);
  r = tu_perf("reduce_perf", "-b 64 -e 64 -n 1 -w 0 -o all -d double", NULL); /* every op in turn */
  EXPECT_EQ(r.status, 0);
  const char* ops[] = {"sum", "prod", "max", "min", "avg", "mulsum"};
  for (int i = 0; i < 6; i++) {
    char want[64];
    snprintf(want, sizeof want, "    double  %6s       0", ops[i]);
    EXPECT_HAS(r.out, want);
  }
  tu_cmd_free(&r);
}

TEST(perf_output, json_and_plots) {
  char* dir = tu_make_tmpdir();
  char json[PATH_MAX], svg[PATH_MAX], svg2[PATH_MAX], base[PATH_MAX], args[3 * PATH_MAX];
  snprintf(json, sizeof json, "%s/r.json", dir);
  snprintf(svg, sizeof svg, "%s/r.svg", dir);
  snprintf(svg2, sizeof svg2, "%s/all.svg", dir);
  snprintf(base, sizeof base, "%s/baseline.txt", dir);
  snprintf(args, sizeof args, "-b 8 -e 32 -f 2 -n 1 -w 0 -J %s --plot %s", json, svg);
  cmd_result r = tu_perf("all_reduce_perf", args, NULL);
  EXPECT_EQ(r.status, 0);
  char want[PATH_MAX + 64];
  snprintf(want, sizeof want, "# Writing JSON output to %s\n", json);
  EXPECT(strncmp(r.out, want, strlen(want)) == 0); /* first line, as nccl-tests */
  tu_cmd_free(&r);
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
  EXPECT_EQ(tu_count_str(text, "\"out_of_place\":{\"time\":"), 3);
  EXPECT_EQ(tu_count_str(text, "\"nwrong\":0.000000"), 6);
  EXPECT_HAS(text, "\"out_of_bounds\":{\"count\":0,\"okay\":\"true\"}");
  EXPECT_HAS(text, "\"average_bus_bandwidth\":{\"bandwidth\":");
  EXPECT_HAS(text, "\"errors\":[]");
  /* An existing file is never overwritten: the next run writes r.json.0. */
  r = tu_perf("all_reduce_perf", args, NULL);
  snprintf(want, sizeof want, "# Writing JSON output to %s.0\n", json);
  EXPECT(strncmp(r.out, want, strlen(want)) == 0);
  tu_cmd_free(&r);

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
  r = tu_run(30, NULL, tu_bin("chorus-plot"), "-o", svg2, "-t", "test plot", label_json, base, (char*)NULL);
  EXPECT_EQ(r.status, 0);
  tu_cmd_free(&r);
  f = fopen(svg2, "r");
  ASSERT(f != NULL);
  n = fread(text, 1, sizeof text - 1, f);
  fclose(f);
  text[n] = '\0';
  EXPECT_HAS(text, ">chorus</text>");
  EXPECT_HAS(text, ">Open MPI 4.1.4 shared memory (btl vader)</text>");
  EXPECT_HAS(text, ">test plot</text>");
  r = tu_run(30, NULL, tu_bin("chorus-plot"), "-o", svg2, (char*)NULL); /* no inputs: usage error */
  EXPECT_EQ(r.status, 2);
  tu_cmd_free(&r);
  char cmd[PATH_MAX + 16];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
  EXPECT_EQ(system(cmd), 0);
  free(dir);
}

/* ------------------------------------------------------------------- perf: validation ---- */

TEST(perf_check, corrupted_result_is_caught) {
  static const char* const env[] = {"CHORUS_PERF_CORRUPT=1", NULL};
  cmd_result r = tu_perf("all_reduce_perf", "-b 64 -e 256 -f 2 -n 1 -w 0", env);
  EXPECT_EQ(r.status, 7); /* nccl-tests' testNumResults */
  EXPECT_HAS(r.out, "# Out of bounds values : 6 FAILED"); /* 3 sizes x 2 placements */
  char l[512];
  long w1 = -1, w2 = -1;
  EXPECT(tu_line_at(r.out, 10, l, sizeof l) &&
         sscanf(l, "%*d %*d %*s %*s %*d %*f %*f %*f %ld %*f %*f %*f %ld", &w1, &w2) == 2 && w1 == 1 && w2 == 1);
  tu_cmd_free(&r);
  /* Across threads: the wrong element of rank 0 is counted once, by the whole job. */
  r = tu_perf("all_gather_perf", "-t 2 -b 256 -e 256 -n 1 -w 0", env);
  EXPECT_EQ(r.status, 7);
  EXPECT_HAS(r.out, "# Out of bounds values : 2 FAILED");
  tu_cmd_free(&r);
}

/* --wire: every hop compressed (threads, and the tuning log says so), results checked within the
 * format's bound and 0 wrong for every format and the five collectives that compress; a bad format
 * refused. (CHORUS_PERF_CORRUPT's
 * low-byte flip lies within the bound: the bound itself is tested in test_wire.c.) */
TEST_T(perf_check, wire_formats_checked_within_bound, 180) {
  /* the TUNING lines say the format was used: a check within the bound of exact results proves nothing */
  static const char* const env[] = {"CHORUS_WIRE_HOPS=all", "NCCL_DEBUG=INFO", "NCCL_DEBUG_SUBSYS=TUNING", NULL};
  static const char* const fmts[] = {"bf16!", "fp16!", "fp8e4m3!", "fp8e5m2!", "mx8!"};
  static const char* const tools[] = {"all_reduce_perf", "reduce_scatter_perf", "all_gather_perf", "broadcast_perf",
                                      "reduce_perf"};
  for (int f = 0; f < 5; f++)
    for (int t = 0; t < 5; t++) {
      char args[160];
      snprintf(args, sizeof args, "-t 3 -b 8 -e 256K -f 32 -n 1 -w 0 --wire %s", fmts[f]);
      cmd_result r = tu_perf(tools[t], args, env);
      EXPECT_EQ(r.status, 0);
      EXPECT_HAS(r.out, "# Out of bounds values : 0 OK");
      char used[48];
      snprintf(used, sizeof used, "wire format %.*s on all hops", (int)strlen(fmts[f]) - 1, fmts[f]);
      EXPECT_HAS(r.out, used);
      if (r.status) rt_fail(__FILE__, __LINE__, "%s %s:\n%s%s", tools[t], args, r.out, r.err);
      tu_cmd_free(&r);
    }
  cmd_result r = tu_perf("all_reduce_perf", "--wire fp4", NULL);
  EXPECT(r.status != 0);
  EXPECT_HAS(r.err, "invalid wire format 'fp4'");
  tu_cmd_free(&r);
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
    cmd_result r = tu_perf("alltoallv_perf", args[i], NULL);
    if (r.status != 0 || !strstr(r.out, "# Out of bounds values : 0 OK"))
      rt_fail(__FILE__, __LINE__, "alltoallv_perf %s: exit %d\n%s%s", args[i], r.status, r.out, r.err);
    EXPECT_HAS(r.out, "# Split: ");
    EXPECT_HAS(r.out, strstr(args[i], "--grouped 1") ? "exchanged by grouped ncclSend/ncclRecv" : "by ncclAllToAllv");
    EXPECT_HAS(r.out, "0      N/A     N/A     N/A     N/A\n"); /* #wrong 0, then no in-place form */
    tu_cmd_free(&r);
  }
  static const char* const corrupt[] = {"CHORUS_PERF_CORRUPT=1", NULL};
  cmd_result r = tu_perf("alltoallv_perf", "-t 3 -b 1K -e 4K -f 4 -n 1 -w 0", corrupt);
  EXPECT_EQ(r.status, 7);
  EXPECT_HAS(r.out, "# Out of bounds values : 2 FAILED"); /* 2 sizes, out of place only */
  tu_cmd_free(&r);
  r = tu_perf("alltoallv_perf", "--split pareto", NULL);
  EXPECT_EQ(r.status, 255);
  EXPECT_HAS(r.err, "invalid split 'pareto': expected zipf or uniform");
  tu_cmd_free(&r);
  r = tu_perf("alltoall_perf", "--grouped 1", NULL);
  EXPECT_EQ(r.status, 255);
  EXPECT_HAS(r.err, "--grouped: only alltoallv_perf takes it");
  tu_cmd_free(&r);
  static const char* const dev[] = {"CHORUS_CUDA_LIBRARY=" CHORUS_FAKE_CUDA, NULL};
  static const char* const dargs[] = {"--device -t 2 -g 2 -b 0 -e 4K -f 8 -n 1 -w 1 -d all",
                                      "--device -np 3 -b 0 -e 64K -f 8 -n 1 -w 1 --grouped 1"};
  for (size_t i = 0; i < sizeof(dargs) / sizeof(dargs[0]); i++) {
    r = tu_perf("alltoallv_perf", dargs[i], dev);
    if (r.status != 0 || !strstr(r.out, "# Out of bounds values : 0 OK"))
      rt_fail(__FILE__, __LINE__, "alltoallv_perf %s: exit %d\n%s%s", dargs[i], r.status, r.out, r.err);
    tu_cmd_free(&r);
  }
}

/* Every collective tool with `args`: exact results (exit 0, no wrong element). progress: a line per
 * tool as it starts and ends, so that a slow tool and a hung one look different in the log. */
static void every_tool_as(const char* args, const char* const* env, int progress) {
  static const char* tools[] = {"all_reduce_perf",     "all_gather_perf", "broadcast_perf", "reduce_perf",
                                "reduce_scatter_perf", "alltoall_perf",   "alltoallv_perf", "gather_perf",
                                "scatter_perf",        "sendrecv_perf",   "hypercube_perf"};
  for (size_t i = 0; i < sizeof(tools) / sizeof(tools[0]); i++) {
    double t0 = tu_now_s();
    if (progress) printf("    %s %s ...\n", tools[i], args), fflush(stdout);
    cmd_result r = tu_perf(tools[i], args, env);
    if (r.status != 0 || !strstr(r.out, "# Out of bounds values : 0 OK"))
      rt_fail(__FILE__, __LINE__, "%s %s: exit %d\n%s%s", tools[i], args, r.status, r.out, r.err);
    else if (progress) printf("    %s: ok in %.1f s\n", tools[i], tu_now_s() - t0), fflush(stdout);
    tu_cmd_free(&r);
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
  cmd_result r = tu_perf("all_reduce_perf", "--device -np 2 -g 2 -b 4 -e 64K -f 16 -n 1 -w 1 -d all -o all", env);
  if (r.status != 0 || !strstr(r.out, "# Out of bounds values : 0 OK"))
    rt_fail(__FILE__, __LINE__, "processes: exit %d\n%s%s", r.status, r.out, r.err);
  tu_cmd_free(&r);
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
    cmd_result r = tu_perf(procs[i][0], procs[i][1], NULL);
    if (r.status != 0 || !strstr(r.out, "# Out of bounds values : 0 OK"))
      rt_fail(__FILE__, __LINE__, "%s %s: exit %d\n%s%s", procs[i][0], procs[i][1], r.status, r.out, r.err);
    else printf("    %s %s: ok\n", procs[i][0], procs[i][1]), fflush(stdout);
    tu_cmd_free(&r);
  }
}

/* ------------------------------------------------------------------- perf: launch modes ---- */

TEST(perf_modes, threads_and_streams) {
  cmd_result r = tu_perf("all_reduce_perf", "-t 3 -b 8 -e 4K -f 4 -n 2 --stream -p 1", NULL);
  EXPECT_EQ(r.status, 0);
  EXPECT_HAS(r.out, "#  Rank  2 Group  0 Pid");
  EXPECT_HAS(r.out, "# Host streams:");
  EXPECT_HAS(r.out, "# Out of bounds values : 0 OK");
  tu_cmd_free(&r);
}

TEST(perf_modes, forked_processes) {
  cmd_result r = tu_perf("all_reduce_perf", "-np 3 -b 8 -e 4K -f 4 -n 2", NULL);
  EXPECT_EQ(r.status, 0);
  EXPECT_EQ(tu_count_str(r.out, "# Collective test starting"), 1); /* only rank 0 prints */
  EXPECT_EQ(tu_count_str(r.out, "#  Rank "), 3);
  EXPECT_HAS(r.out, "# Out of bounds values : 0 OK");
  tu_cmd_free(&r);
  static const char* const env[] = {"CHORUS_PERF_CORRUPT=1", NULL};
  r = tu_perf("all_reduce_perf", "-np 2 -b 64 -e 64 -n 1", env); /* the exit code comes through */
  EXPECT_EQ(r.status, 7);
  tu_cmd_free(&r);
}

TEST(perf_modes, under_chorusrun) {
  cmd_result r = tu_run(120, NULL, tu_bin("chorusrun"), "-n", "2", tu_bin("all_reduce_perf"), "-t", "2", "-b", "8", "-e", "4K",
                     "-f", "4", "-n", "2", (char*)NULL);
  if (r.status != 0) rt_fail(__FILE__, __LINE__, "exit %d:\n%s%s", r.status, r.out, r.err);
  EXPECT_EQ(tu_count_str(r.out, "# Collective test starting"), 1);
  EXPECT_EQ(tu_count_str(r.out, "#  Rank "), 4); /* 2 processes x 2 threads */
  EXPECT_HAS(r.out, "# Out of bounds values : 0 OK");
  tu_cmd_free(&r);
}

/* The harness's own exchanges (device records, the unique id under a launcher, times, error counts,
 * the barrier) are send/recv: NCCL_ALGO and NCCL_PROTO restrict only the operation being timed.
 * NCCL_ALGO=Tree leaves AllGather no algorithm, which once failed every tool before its first row. */
TEST_T(perf_modes, bookkeeping_ignores_nccl_algo, 180) {
  static const char* const tree[] = {"NCCL_ALGO=Tree", NULL};
  cmd_result r = tu_run(120, tree, tu_bin("chorusrun"), "-n", "3", tu_bin("all_reduce_perf"), "-b", "8", "-e", "64K", "-f",
                     "4", "-n", "2", (char*)NULL);
  if (r.status != 0 || !strstr(r.out, "# Out of bounds values : 0 OK"))
    rt_fail(__FILE__, __LINE__, "chorusrun -n 3: exit %d\n%s%s", r.status, r.out, r.err);
  tu_cmd_free(&r);
  /* threads under a launcher (the id goes to the other process first), -m and -z together */
  r = tu_run(120, tree, tu_bin("chorusrun"), "-n", "2", tu_bin("all_reduce_perf"), "-t", "2", "-b", "8", "-e", "4K", "-f", "4",
          "-n", "2", "-m", "2", "-z", "1", (char*)NULL);
  if (r.status != 0 || !strstr(r.out, "# Out of bounds values : 0 OK"))
    rt_fail(__FILE__, __LINE__, "chorusrun -n 2 -t 2: exit %d\n%s%s", r.status, r.out, r.err);
  tu_cmd_free(&r);
  static const char* const ll[] = {"NCCL_PROTO=LL", NULL};
  r = tu_perf("broadcast_perf", "-t 3 -b 8 -e 64K -f 4 -n 2 -I 1", ll);
  if (r.status != 0 || !strstr(r.out, "# Out of bounds values : 0 OK"))
    rt_fail(__FILE__, __LINE__, "NCCL_PROTO=LL: exit %d\n%s%s", r.status, r.out, r.err);
  tu_cmd_free(&r);
  /* the timed AllGather itself still obeys */
  r = tu_perf("all_gather_perf", "-t 3 -b 8 -e 64 -n 1", tree);
  EXPECT_EQ(r.status, 3);
  EXPECT_HAS(r.err, "AllGather: NCCL_ALGO=Tree leaves it no algorithm");
  EXPECT_HAS(r.err, "ctx->coll->run");
  tu_cmd_free(&r);
}

/* --device, nccl-tests' way: cuMemAlloc'ed buffers and a CUDA stream per rank, here with the stand-in
 * driver (tests/cuda_stub). Two ranks per thread, each on its own stream; then processes; then the
 * check must see a corrupted result through the device copies. */
TEST(perf_modes, device_buffers) {
  static const char* const env[] = {"CHORUS_CUDA_LIBRARY=" CHORUS_FAKE_CUDA, NULL};
  static const char* tools[] = {"all_reduce_perf", "all_gather_perf", "reduce_scatter_perf", "broadcast_perf",
                                "sendrecv_perf"};
  for (size_t i = 0; i < sizeof(tools) / sizeof(tools[0]); i++) {
    cmd_result r = tu_perf(tools[i], "--device -g 2 -b 8 -e 64K -f 32 -n 2 -w 1", env);
    if (r.status != 0 || !strstr(r.out, "# Out of bounds values : 0 OK"))
      rt_fail(__FILE__, __LINE__, "%s: exit %d\n%s%s", tools[i], r.status, r.out, r.err);
    tu_cmd_free(&r);
  }
  cmd_result r = tu_perf("all_reduce_perf", "--device -np 2 -b 1K -e 1K -n 2", env);
  EXPECT_EQ(r.status, 0);
  EXPECT_HAS(r.out, "# Out of bounds values : 0 OK");
  tu_cmd_free(&r);
  static const char* const bad[] = {"CHORUS_CUDA_LIBRARY=" CHORUS_FAKE_CUDA, "CHORUS_PERF_CORRUPT=1", NULL};
  r = tu_perf("all_reduce_perf", "--device -b 1K -e 1K -n 1", bad);
  EXPECT_EQ(r.status, 7);
  tu_cmd_free(&r);
  static const char* const none[] = {"CHORUS_CUDA_LIBRARY=libchorus-no-such-driver.so", NULL};
  r = tu_perf("all_reduce_perf", "--device -b 8 -e 8 -n 1", none);
  EXPECT_EQ(r.status, 6); /* invalid usage: no driver, said so */
  EXPECT(strstr(r.out, "cannot open the CUDA driver") || strstr(r.err, "cannot open the CUDA driver"));
  tu_cmd_free(&r);
}


TEST_T(perf_check, put_perf_processes_and_threads, 120) {
  const char* args[] = {"-np 2 -b 8 -e 1M -f 8 -n 2 -w 1 -d all", "-t 3 -b 8 -e 64K -f 8 -n 2 -w 1"};
  for (int i = 0; i < 2; i++) {
    cmd_result r = tu_perf("put_perf", args[i], NULL);
    if (r.status != 0 || !strstr(r.out, "# Out of bounds values : 0 OK"))
      rt_fail(__FILE__, __LINE__, "put_perf %s: exit %d\n%s%s", args[i], r.status, r.out, r.err);
    tu_cmd_free(&r);
  }
}
