/* Command line of the *_perf benchmarks: nccl-tests' flags, defaults and size suffixes, plus a few
 * opt-in flags of ours (-np, --stream, --plot). Bad values are refused with a message naming the
 * flag and the value, and exit code 255 (nccl-tests returns -1 from main for bad sizes; it silently
 * falls back to a default for a bad -d/-o and exits 0 on an unknown option, which hides typos in
 * scripts, so we refuse those too). */
#include <errno.h>
#include <getopt.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common.h"
#include "../../src/misc/names.h"

/* nccl-tests' spelling: the library's built-in ops, then "mulsum" (ncclRedOpCreatePreMulSum) */
#define PERF_OP_NAME_(op, name, test_name) [op] = test_name,
const char* const perf_op_names[PERF_NUM_OPS] = {CH_OP_LIST(PERF_OP_NAME_)};
#undef PERF_OP_NAME_
_Static_assert(PERF_NUM_OPS == CH_NOPS && PERF_OP_MULSUM == ncclNumOps, "an op index per name");

/* "a, b, c or all": what -o and -d accept. */
static const char* expected(const char* (*name)(int), int n, char* buf, size_t cap) {
  size_t len = 0;
  buf[0] = 0;
  for (int i = 0; i < n; i++) {
    int w = snprintf(buf + len, cap - len, "%s%s", i ? ", " : "", name(i));
    if (w > 0) len = len + (size_t)w < cap ? len + (size_t)w : cap - 1;
  }
  snprintf(buf + len, cap - len, " or all");
  return buf;
}

static const char* prog;

static int usage_error(const char* fmt, ...) __attribute__((format(printf, 1, 2)));
static int usage_error(const char* fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  fprintf(stderr, "%s: ", prog);
  vfprintf(stderr, fmt, ap);
  va_end(ap);
  fprintf(stderr, "\nRun '%s -h' for the list of options.\n", prog);
  return PERF_BAD_ARGS;
}

static void usage(const perf_coll* coll) {
  printf("USAGE: %s\n"
         "\t[-t,--nthreads <num threads>]                 threads per process (default 1)\n"
         "\t[-g,--ngpus <ranks per thread>]               ranks per thread; each \"GPU\" is a rank (default 1)\n"
         "\t[-b,--minbytes <min size in bytes>]           suffixes K, M, G (x1024) (default 32M)\n"
         "\t[-e,--maxbytes <max size in bytes>]           (default 32M)\n"
         "\t[-i,--stepbytes <increment size>]             used when -f <= 1 (default 1M)\n"
         "\t[-f,--stepfactor <increment factor>]          (default 1: additive steps)\n"
         "\t[-n,--iters <iteration count>]                (default 20)\n"
         "\t[-m,--agg_iters <aggregated iteration count>] (default 1)\n"
         "\t[-w,--warmup_iters <warmup iteration count>]  (default 1)\n"
         "\t[-N,--run_cycles <cycle count>]               0 = run forever (default 1)\n"
         "\t[-p,--parallel_init <0/1>]                    each thread creates its own communicators\n"
         "\t[-c,--check <check iteration count>]          0 disables validation (default 1)\n"
         "\t[-o,--op <sum/prod/min/max/avg/mulsum/all>]   (default sum)\n"
         "\t[-d,--datatype <nccltype/all>]                int8 uint8 int32 uint32 int64 uint64 half float\n"
         "\t                                              double bfloat16 f8e4m3 f8e5m2 (default float)\n"
         "\t[-r,--root <root/all>]                        -1 or all: every root in turn (default 0)\n"
         "\t[-z,--blocking <0/1/2/3>]                     wait (and barrier) after each operation\n"
         "\t[-y,--stream_null <0/1>]                      1: NULL stream even with --stream\n"
         "\t[-T,--timeout <time in seconds>]              fail with exit code 4 if an operation hangs\n"
         "\t[-G,--cudagraph <num graph launches>]         accepted; host memory has no graphs\n"
         "\t[-C,--report_cputime <0/1>]                   time issuing only (useful with --stream)\n"
         "\t[-S,--report_timestamps <0/1>]                add a timestamp column\n"
         "\t[-J,--output_file <file.json>]                also write the results as JSON\n"
         "\t[-a,--average <0/1/2/3>]                      time across ranks: rank 0/avg/min/max (default 1)\n"
         "\t[-R,--local_register <0/1/2>]                 register buffers (1) or symmetric windows (2)\n"
         "\t[-x,--cta_policy <0/1/2>]                     passed in ncclConfig_t\n"
         "\t[-D,--device_implementation <0>]              only 0: there are no device kernels\n"
         "\t[-V,--device_cta_count <number>]              accepted, unused\n"
         "\t[-M,--memory_report <0/1>]                    report host memory used\n"
         "\t[-u,--unalign <elements>]                     offset the buffers by this many elements\n"
         "\t[-I,--per_iter_timing <0/1>]                  add i_min i_max i_p99 i_cv%% columns\n"
         "\t[-K,--per_iter_skip <count>]                  leave the first iterations out of -I\n"
         "\t[-h,--help]\n"
         "Chorus additions (opt-in):\n"
         "\t[-np,--np <N>]                                fork N local processes (ranks = N x t x g)\n"
         "\t[--stream]                                    issue on host streams (chorusStreamCreate)\n"
         "\t[--device]                                    CUDA device buffers and a CUDA stream per rank\n"
         "\t[--plot <file.svg>]                           draw busbw and time against size\n"
         "\t[--wire <fmt>]                                compressed network hops (CHORUS_WIRE_FORMAT, docs/WIRE.md):\n"
         "\t                                              results checked within its error bound\n",
         prog);
  if (coll->flags & PERF_SPLITS)
    printf("Uneven exchanges:\n"
           "\t[--split <zipf/uniform>]                      block sizes by distance to the peer: Zipf (1/k, shuffled\n"
           "\t                                              by --seed) or all alike (default zipf)\n"
           "\t[--seed <n>]                                  which distances get the large blocks (default 1)\n"
           "\t[--grouped <0/1>]                             1: grouped ncclSend/ncclRecv instead of ncclAllToAllv\n");
  printf("Under chorusrun, mpirun, srun or torchrun each process takes its rank from the environment.\n");
}

/* nccl-tests' sizes: a number (may be fractional) and an optional K/M/G suffix in units of 1024. */
static int parse_size(const char* s, size_t* out) {
  char* end;
  errno = 0;
  double v = strtod(s, &end);
  if (end == s || errno || !(v >= 0 && v <= 1e18)) return -1; /* also NaN and infinities */
  double unit = 1;
  if (*end) {
    switch (*end) {
      case 'K': case 'k': unit = 1024.0; break;
      case 'M': case 'm': unit = 1024.0 * 1024; break;
      case 'G': case 'g': unit = 1024.0 * 1024 * 1024; break;
      default: return -1;
    }
    end++;
  }
  if (*end || v * unit > 1e18) return -1;
  *out = (size_t)(v * unit);
  return 0;
}

static int parse_int(const char* s, long lo, long hi, int* out) {
  char* end;
  errno = 0;
  long v = strtol(s, &end, 0);
  if (end == s || *end || errno || v < lo || v > hi) return -1;
  *out = (int)v;
  return 0;
}

static const struct option longopts[] = {{"nthreads", required_argument, 0, 't'},
                                         {"ngpus", required_argument, 0, 'g'},
                                         {"minbytes", required_argument, 0, 'b'},
                                         {"maxbytes", required_argument, 0, 'e'},
                                         {"stepbytes", required_argument, 0, 'i'},
                                         {"stepfactor", required_argument, 0, 'f'},
                                         {"iters", required_argument, 0, 'n'},
                                         {"agg_iters", required_argument, 0, 'm'},
                                         {"warmup_iters", required_argument, 0, 'w'},
                                         {"run_cycles", required_argument, 0, 'N'},
                                         {"parallel_init", required_argument, 0, 'p'},
                                         {"check", required_argument, 0, 'c'},
                                         {"op", required_argument, 0, 'o'},
                                         {"datatype", required_argument, 0, 'd'},
                                         {"root", required_argument, 0, 'r'},
                                         {"blocking", required_argument, 0, 'z'},
                                         {"stream_null", required_argument, 0, 'y'},
                                         {"timeout", required_argument, 0, 'T'},
                                         {"cudagraph", required_argument, 0, 'G'},
                                         {"report_cputime", required_argument, 0, 'C'},
                                         {"report_timestamps", required_argument, 0, 'S'},
                                         {"output_file", required_argument, 0, 'J'},
                                         {"average", required_argument, 0, 'a'},
                                         {"local_register", required_argument, 0, 'R'},
                                         {"cta_policy", required_argument, 0, 'x'},
                                         {"device_implementation", required_argument, 0, 'D'},
                                         {"device_cta_count", required_argument, 0, 'V'},
                                         {"memory_report", required_argument, 0, 'M'},
                                         {"unalign", required_argument, 0, 'u'},
                                         {"per_iter_timing", required_argument, 0, 'I'},
                                         {"per_iter_skip", required_argument, 0, 'K'},
                                         {"help", no_argument, 0, 'h'},
                                         {"np", required_argument, 0, 1000},
                                         {"stream", no_argument, 0, 1001},
                                         {"plot", required_argument, 0, 1002},
                                         {"device", no_argument, 0, 1003},
                                         {"split", required_argument, 0, 1004},
                                         {"seed", required_argument, 0, 1005},
                                         {"grouped", required_argument, 0, 1006},
                                         {"wire", required_argument, 0, 1007},
                                         {0, 0, 0, 0}};

static const char* long_name(int c) {
  for (const struct option* o = longopts; o->name; o++)
    if (o->val == c) return o->name;
  return "?";
}

/* Integer flags: where they go and their allowed range. */
struct int_flag {
  int c;
  size_t off;
  long lo, hi;
};
#define F(c, field, lo, hi) {c, offsetof(perf_opts, field), lo, hi}
static const struct int_flag int_flags[] = {
    F('t', nthreads, 1, 4096),
    F('g', ngpus, 1, 4096),
    F('n', iters, 1, 1L << 30),
    F('m', agg, 1, 1 << 20),
    F('w', warmup, 0, 1L << 30),
    F('N', cycles, 0, 1L << 30),
    F('p', parallel_init, 0, 1),
    F('c', check, 0, 1 << 20),
    F('z', blocking, 0, 3),
    F('y', stream_null, 0, 1),
    F('T', timeout_s, 0, 1L << 30),
    F('G', graph, 0, 1 << 20),
    F('C', cputime, 0, 1),
    F('S', timestamps, 0, 1),
    F('a', average, 0, 3),
    F('R', reg, 0, 2),
    F('x', cta_policy, 0, 2),
    F('D', dev_impl, 0, 0),
    F('V', dev_ctas, 1, 128),
    F('M', mem_report, 0, 1),
    F('u', unalign, 0, 1 << 20),
    F('I', per_iter, 0, 1),
    F('K', per_iter_skip, 0, 1L << 30),
    F(1000, np, 1, 4096),
    F(1006, grouped, 0, 1),
};
#undef F

static void defaults(perf_opts* o) {
  memset(o, 0, sizeof(*o));
  o->nthreads = o->ngpus = 1;
  o->min_bytes = o->max_bytes = 32u << 20;
  o->step_bytes = 1u << 20;
  o->step_factor = 1;
  o->iters = 20;
  o->warmup = 1;
  o->agg = 1;
  o->cycles = 1;
  o->check = 1;
  o->op = ncclSum;
  o->type = ncclFloat;
  o->average = 1;
  o->cta_policy = -1;
  o->dev_ctas = 16;
  o->seed = 1;
}

int perf_parse_args(int argc, char** argv, perf_opts* o, const perf_coll* coll) {
  prog = strrchr(argv[0], '/') ? strrchr(argv[0], '/') + 1 : argv[0];
  defaults(o);
  /* "-np N" is not a getopt short option (it would read as -n p): turn it into --np first. */
  for (int i = 1; i < argc; i++) {
    if (strcmp(argv[i], "--") == 0) break;
    if (strcmp(argv[i], "-np") == 0) argv[i] = "--np";
  }
  int cta_given = 0;
  opterr = 0;
  optind = 1;
  for (;;) {
    int c = getopt_long(argc, argv, ":t:g:b:e:i:f:n:m:w:N:p:c:o:d:r:z:y:T:G:C:S:J:a:R:x:D:V:M:u:I:K:h", longopts,
                        NULL);
    if (c == -1) break;
    if (c == '?') {
      if (optopt && optopt < 256) return usage_error("unknown option '-%c'", optopt);
      return usage_error("unknown option '%s'", argv[optind - 1]);
    }
    if (c == ':') {
      if (optopt && optopt < 256) return usage_error("option '-%c' (--%s) needs a value", optopt, long_name(optopt));
      return usage_error("option '%s' needs a value", argv[optind - 1]);
    }
    if (c >= 1004 && c <= 1006 && !(coll->flags & PERF_SPLITS))
      return usage_error("--%s: only alltoallv_perf takes it", long_name(c));
    const struct int_flag* f = NULL;
    for (size_t k = 0; k < sizeof(int_flags) / sizeof(int_flags[0]); k++)
      if (int_flags[k].c == c) f = &int_flags[k];
    if (f) {
      if (parse_int(optarg, f->lo, f->hi, (int*)((char*)o + f->off)) != 0) {
        if (c == 'D')
          return usage_error("-D %s: device implementations need GPU kernels; only -D 0 exists here", optarg);
        return usage_error("invalid value '%s' for --%s: expected an integer in [%ld, %ld]", optarg, long_name(c),
                           f->lo, f->hi);
      }
      if (c == 'x') cta_given = 1;
      continue;
    }
    switch (c) {
      case 'b':
        if (parse_size(optarg, &o->min_bytes))
          return usage_error("invalid size specified for 'minbytes': '%s'", optarg);
        break;
      case 'e':
        if (parse_size(optarg, &o->max_bytes))
          return usage_error("invalid size specified for 'maxbytes': '%s'", optarg);
        break;
      case 'i':
        if (parse_size(optarg, &o->step_bytes))
          return usage_error("invalid size specified for 'stepBytes': '%s'", optarg);
        break;
      case 'f': {
        int v;
        if (parse_int(optarg, 0, 1 << 20, &v)) return usage_error("invalid value '%s' for --stepfactor", optarg);
        o->step_factor = (size_t)v;
        break;
      }
      case 'o': {
        o->op = -2;
        if (strcmp(optarg, "all") == 0) o->op = -1;
        for (int k = 0; k < PERF_NUM_OPS; k++)
          if (strcmp(optarg, perf_op_names[k]) == 0) o->op = k;
        if (o->op == -2) {
          char names[128];
          return usage_error("invalid op '%s': expected %s", optarg,
                             expected(ch_op_test_name, PERF_NUM_OPS, names, sizeof(names)));
        }
        break;
      }
      case 'd':
        o->type = perf_type_parse(optarg);
        if (o->type == -2) {
          char names[160];
          return usage_error("invalid datatype '%s': expected %s", optarg,
                             expected(ch_type_test_name, ncclNumTypes, names, sizeof(names)));
        }
        break;
      case 'r':
        if (strcmp(optarg, "all") == 0) o->root = -1;
        else if (parse_int(optarg, -1, 1 << 30, &o->root))
          return usage_error("invalid root '%s': expected a rank, -1 or all", optarg);
        break;
      case 'J': {
        size_t n = strlen(optarg);
        if (n < 5 || strcmp(optarg + n - 5, ".json") != 0)
          return usage_error("output file '%s': only JSON output exists, name it *.json", optarg);
        o->json_path = optarg;
        break;
      }
      case 1001: o->streams = 1; break;
      case 1002: o->plot_path = optarg; break;
      case 1007: /* the library reads it at init; the checks take its bound (data.c) */
        if (perf_wire_parse(optarg) < 0)
          return usage_error("invalid wire format '%s': expected off, bf16, fp16, fp8e4m3, fp8e5m2 or mx8, a trailing ! to "
                             "force it", optarg);
        setenv("CHORUS_WIRE_FORMAT", optarg, 1);
        break;
      case 1003: o->device = 1; break;
      case 1004:
        if (strcmp(optarg, "zipf") == 0) o->split = PERF_SPLIT_ZIPF;
        else if (strcmp(optarg, "uniform") == 0) o->split = PERF_SPLIT_UNIFORM;
        else return usage_error("invalid split '%s': expected zipf or uniform", optarg);
        break;
      case 1005: {
        char* end;
        errno = 0;
        unsigned long v = strtoul(optarg, &end, 0);
        if (end == optarg || *end || errno || v > 0xffffffffUL || optarg[0] == '-')
          return usage_error("invalid value '%s' for --seed: expected an integer in [0, 4294967295]", optarg);
        o->seed = (unsigned)v;
        break;
      }
      case 'h': usage(coll); return PERF_OK;
      default: return usage_error("unhandled option");
    }
  }
  if (optind < argc) return usage_error("unexpected argument '%s'", argv[optind]);
  if (o->min_bytes > o->max_bytes)
    return usage_error("invalid sizes for 'minbytes' and 'maxbytes': %zu > %zu", o->min_bytes, o->max_bytes);
  if (o->step_factor <= 1 && o->step_bytes == 0 && o->min_bytes != o->max_bytes)
    return usage_error("-i 0 with -f %zu would never reach maxbytes", o->step_factor);
  if (o->per_iter_skip && !o->per_iter) return usage_error("-K (per_iter_skip) needs -I 1");
  if (o->per_iter_skip >= o->iters && o->per_iter)
    return usage_error("-K %d leaves no iteration of -n %d", o->per_iter_skip, o->iters);
  if (o->blocking == 3 && o->graph) return usage_error("-z 3 cannot be combined with -G");
  if (!cta_given) o->cta_policy = -1;
  o->splits = (coll->flags & PERF_SPLITS) != 0;
  const char* c = getenv("CHORUS_PERF_CORRUPT");
  o->corrupt = c && *c && strcmp(c, "0") != 0;
  return -1;
}
