/* stdout and JSON output of the benchmarks, in nccl-tests' layout (see output.h). */
#include "output.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "plot.h"

extern char** environ;

#define NCCL_TESTS_FORMAT "2.19.6" /* the nccl-tests release whose output we follow */

static const perf_opts* opts;
static const char* program;

/* ---- JSON writer: a stack of open containers, each remembering whether it has items yet ---- */
static FILE* jf;
static int jdepth, jafter_key;
static char jhas_items[32], jkind[32];

static void jprefix(void) {
  if (jafter_key) {
    jafter_key = 0;
  } else if (jdepth > 0) {
    if (jhas_items[jdepth - 1]) fputc(',', jf);
    jhas_items[jdepth - 1] = 1;
  }
}
static void jescaped(const char* s) {
  fputc('"', jf);
  for (; *s; s++) {
    unsigned char c = (unsigned char)*s;
    if (c == '"' || c == '\\') fprintf(jf, "\\%c", c);
    else if (c == '\n') fputs("\\n", jf);
    else if (c == '\t') fputs("\\t", jf);
    else if (c < 0x20) fprintf(jf, "\\u%04x", c);
    else fputc(c, jf);
  }
  fputc('"', jf);
}
static void jkey(const char* k) {
  if (!jf) return;
  jprefix();
  jescaped(k);
  fputc(':', jf);
  jafter_key = 1;
}
static void jopen(char c) {
  if (!jf) return;
  jprefix();
  fputc(c, jf);
  jkind[jdepth] = c;
  jhas_items[jdepth++] = 0;
}
static void jclose(char c) {
  if (!jf || jdepth == 0) return;
  (void)c; /* the bracket matching the open container is written, c documents the caller's intent */
  jdepth--;
  fputc(jkind[jdepth] == '{' ? '}' : ']', jf);
}
static void jstr(const char* s) {
  if (!jf) return;
  jprefix();
  jescaped(s ? s : "");
}
static void jint(long long v) {
  if (!jf) return;
  jprefix();
  fprintf(jf, "%lld", v);
}
static void jdouble(double v) {
  if (!jf) return;
  jprefix();
  if (isnan(v)) fputs("\"nan\"", jf);
  else if (isinf(v)) fputs(v > 0 ? "\"inf\"" : "\"-inf\"", jf);
  else fprintf(jf, "%f", v);
}
static void jnull(void) {
  if (!jf) return;
  jprefix();
  fputs("null", jf);
}
/* nccl-tests writes booleans as the strings "true"/"false"; readers of its files expect that. */
static void jbool(int v) { jstr(v ? "true" : "false"); }

static void now_str(char* buf, size_t n) {
  time_t t = time(NULL);
  struct tm tm;
  localtime_r(&t, &tm);
  strftime(buf, n, "%Y-%m-%d %H:%M:%S", &tm);
}

/* ---- rows kept for --plot ---- */
struct row {
  size_t bytes;
  char type[16], op[16];
  int root;
  double time[2], busbw[2];
  int places; /* placements measured: out of place, then in place */
};
static struct row* rows;
static int nrows, cap_rows, place_idx, row_open;

void out_init(const perf_opts* o, const char* prog) {
  opts = o;
  program = prog;
}

void out_json_open(const char* path, int argc, char** argv) {
  char* name = strdup(path);
  int tries = 0;
  FILE* f;
  /* "wx": never overwrite an earlier result; take the next free name.N instead. */
  while (name && !(f = fopen(name, "wx"))) {
    if (errno != EEXIST) {
      printf("# skipping json output; %s not accessible (%s)\n", name, strerror(errno));
      free(name);
      return;
    }
    free(name);
    name = malloc(strlen(path) + 16);
    if (name) sprintf(name, "%s.%d", path, tries++);
  }
  if (!name) return;
  printf("# Writing JSON output to %s\n", name);
  free(name);
  jf = f;
  char ts[64];
  now_str(ts, sizeof ts);
  int v = 0, cv = 0;
  ncclGetVersion(&v);
  chorusGetVersion(&cv);
  jopen('{');
  jkey("version"), jint(3);
  jkey("start_time"), jstr(ts);
  jkey("args"), jopen('[');
  for (int i = 0; i < argc; i++) jstr(argv[i]);
  jclose(']');
  /* Only the variables that can change results: the whole environment may hold secrets. */
  jkey("env"), jopen('[');
  for (char** e = environ; e && *e; e++)
    if (strncmp(*e, "NCCL_", 5) == 0 || strncmp(*e, "CHORUS_", 7) == 0) jstr(*e);
  jclose(']');
  jkey("nccl_version"), jint(v);
  jkey("chorus_version"), jint(cv);
  jkey("test"), jstr(program);
}

void out_device_report(const perf_devrec* recs, int nranks) {
  const perf_opts* o = opts;
  int v = 0, cv = 0;
  ncclGetVersion(&v);
  chorusGetVersion(&cv);
  printf("# Chorus perf tests (nccl-tests %s format) nccl-headers=%d nccl-library=%d chorus=%d.%d.%d\n",
         NCCL_TESTS_FORMAT, NCCL_VERSION_CODE, v, cv / 10000, cv / 100 % 100, cv % 100);
  printf("# Collective test starting: %s\n", program);
  printf("# nThread %d nGpus %d minBytes %zu maxBytes %zu step: %zu(%s) warmup iters: %d iters: %d agg iters: %d "
         "validation: %d graph: %d unalign: %d\n",
         o->nthreads, o->ngpus, o->min_bytes, o->max_bytes, o->step_factor > 1 ? o->step_factor : o->step_bytes,
         o->step_factor > 1 ? "factor" : "bytes", o->warmup, o->iters, o->agg, o->check, o->graph, o->unalign);
  if (o->blocking == 1) printf("# Blocking Enabled: wait and barrier after each inner iteration (-m) \n");
  if (o->blocking == 2) printf("# Blocking Enabled: wait after each inner iteration (-m), no barrier \n");
  if (o->blocking == 3)
    printf("# Blocking Enabled: wait and barrier after each outer iteration (-n); time excludes barrier \n");
  if (o->per_iter) {
    printf("# Per-Iteration Report: host clock timing; i_* uses max over ranks");
    if (o->per_iter_skip) printf("; summary skips first %d iterations", o->per_iter_skip);
    printf(" \n");
  }
  if (o->parallel_init) printf("# Parallel Init Enabled: threads call into NcclInitRank concurrently \n");
  if (o->streams && !o->stream_null) printf("# Host streams: operations are issued on chorusStreamCreate streams \n");
  if (o->splits)
    printf("# Split: %s (seed %u), the same on every rank; exchanged by %s \n",
           o->split == PERF_SPLIT_UNIFORM ? "uniform" : "zipf", o->seed,
           o->grouped ? "grouped ncclSend/ncclRecv (empty blocks skipped)" : "ncclAllToAllv");
  printf("#\n");
  if (jf) {
    jkey("config"), jopen('{');
    jkey("nthreads"), jint(o->nthreads);
    jkey("ngpus"), jint(o->ngpus);
    jkey("minimum_bytes"), jint((long long)o->min_bytes);
    jkey("maximum_bytes"), jint((long long)o->max_bytes);
    if (o->step_factor > 1) jkey("step_factor"), jint((long long)o->step_factor);
    else jkey("step_bytes"), jint((long long)o->step_bytes);
    jkey("warmup_iters"), jint(o->warmup);
    jkey("iterations"), jint(o->iters);
    jkey("aggregated_iterations"), jint(o->agg);
    jkey("validation"), jint(o->check);
    jkey("graph"), jint(o->graph);
    jkey("blocking_collectives"), jbool(o->blocking);
    jkey("per_iter_timing"), jbool(o->per_iter);
    jkey("per_iter_skip"), jint(o->per_iter_skip);
    jkey("parallel_init"), jbool(o->parallel_init);
    jkey("nranks"), jint(nranks);
    jkey("host_streams"), jbool(o->streams && !o->stream_null);
    if (o->splits) {
      jkey("split"), jstr(o->split == PERF_SPLIT_UNIFORM ? "uniform" : "zipf");
      jkey("split_seed"), jint(o->seed);
      jkey("grouped"), jbool(o->grouped);
    }
  }
  printf("# Using devices\n");
  if (jf) jkey("devices"), jopen('[');
  for (int i = 0; i < nranks; i++) {
    const perf_devrec* r = &recs[i];
    printf("#  Rank %2d Group %2d Pid %6d on %10s device %2d [%04x:%02x:%02x] %s\n", r->rank, r->group, r->pid, r->host,
           r->device, 0, 0, 0, "host");
    if (!jf) continue;
    jopen('{');
    jkey("rank"), jint(r->rank);
    jkey("group"), jint(r->group);
    jkey("pid"), jint(r->pid);
    jkey("hostname"), jstr(r->host);
    jkey("device"), jint(r->device);
    jkey("device_hex"), jstr("0000:00:00");
    jkey("device_info"), jstr("host");
    jclose('}');
  }
  if (jf) jclose(']'), jclose('}');
}

void out_mem_note(size_t max_bytes) { printf("#\n# Reducing maxBytes to %zu due to memory limitation\n", max_bytes); }

void out_table_header(void) {
  const perf_opts* o = opts;
  const char* t = o->cputime ? "cputime" : "time";
  int tsw = o->timestamps ? 19 : 0;
  const char* tsl = o->timestamps ? "timestamp" : "";
  const char* tsf = o->timestamps ? "%Y-%m-%d %H:%M:%S" : "";
  printf("#\n");
  if (o->per_iter) {
    printf("# %10s  %12s  %8s  %6s  %6s              out-of-place (+ per-iteration)                                "
           "in-place (+ per-iteration)\n", "", "", "", "", "");
    printf("# %10s  %12s  %8s  %6s  %6s  %7s  %6s  %6s  %6s  %7s  %7s  %7s  %7s  %7s  %6s  %6s  %6s  %7s  %7s  %7s  "
           "%7s %*s\n", "size", "count", "type", "redop", "root", t, "algbw", "busbw", "#wrong", "i_min", "i_max",
           "i_p99", "i_cv%", t, "algbw", "busbw", "#wrong", "i_min", "i_max", "i_p99", "i_cv%", tsw, tsl);
    printf("# %10s  %12s  %8s  %6s  %6s  %7s  %6s  %6s  %6s  %7s  %7s  %7s  %7s  %7s  %6s  %6s  %6s  %7s  %7s  %7s  "
           "%7s %*s\n", "(B)", "(elements)", "", "", "", "(us)", "(GB/s)", "(GB/s)", "", "(us)", "(us)", "(us)", "(%)",
           "(us)", "(GB/s)", "(GB/s)", "", "(us)", "(us)", "(us)", "(%)", tsw, tsf);
  } else {
    printf("# %10s  %12s  %8s  %6s  %6s           out-of-place                       in-place          \n", "", "", "",
           "", "");
    printf("# %10s  %12s  %8s  %6s  %6s  %7s  %6s  %6s  %6s  %7s  %6s  %6s  %6s %*s\n", "size", "count", "type",
           "redop", "root", t, "algbw", "busbw", "#wrong", t, "algbw", "busbw", "#wrong", tsw, tsl);
    printf("# %10s  %12s  %8s  %6s  %6s  %7s  %6s  %6s  %6s  %7s  %6s  %6s  %6s %*s\n", "(B)", "(elements)", "", "",
           "", "(us)", "(GB/s)", "(GB/s)", "", "(us)", "(GB/s)", "(GB/s)", "", tsw, tsf);
  }
  if (jf) jkey("results"), jopen('[');
}

/* Fit a number in `width` characters: 2 decimals if they fit, then 1, then 0, then exponent form. */
void perf_fmt_num(double v, int width, char* out) {
  int digits = 0;
  for (double p = 1; v >= p && digits < 40; p *= 10) digits++;
  if (digits < width - 2) sprintf(out, "%*.2f", width, v);
  else if (digits < width - 1) sprintf(out, "%*.1f", width, v);
  else if (digits < width + 1) sprintf(out, "%*.0f", width, v);
  else if (width >= 7) sprintf(out, "%*.1e", width, v);
  else sprintf(out, "%*.0e", width, v);
}

void out_row_start(size_t bytes, size_t count, const char* type, const char* op, int root) {
  char rs[16];
  snprintf(rs, sizeof rs, "%6i", root);
  printf("%12zu  %12zu  %8s  %6s  %6s", bytes, count, type, op, rs);
  row_open = 1;
  if (jf) {
    jopen('{');
    jkey("size"), jint((long long)bytes);
    jkey("count"), jint((long long)count);
    jkey("type"), jstr(type);
    jkey("redop"), jstr(op);
    jkey("root"), jstr(rs);
  }
  if (nrows == cap_rows) {
    int nc = cap_rows ? 2 * cap_rows : 64;
    struct row* nr = realloc(rows, sizeof(*rows) * (size_t)nc);
    if (!nr) return;
    rows = nr, cap_rows = nc;
  }
  struct row* r = &rows[nrows++];
  memset(r, 0, sizeof(*r));
  r->bytes = bytes;
  snprintf(r->type, sizeof r->type, "%s", type);
  snprintf(r->op, sizeof r->op, "%s", op);
  r->root = root;
  place_idx = 0;
}

static void stats_json(const perf_iterstats* st, int oop) {
  double cv = st->avg > 0 ? st->stdev / st->avg * 100.0 : 0.0;
  jkey(oop ? "out_of_place_per_iter" : "in_place_per_iter"), jopen('{');
  jkey("skipped_iterations"), jint(st->skipped);
  jkey("min_us"), jdouble(st->min * 1e6);
  jkey("max_us"), jdouble(st->max * 1e6);
  jkey("avg_us"), jdouble(st->avg * 1e6);
  jkey("p50_us"), jdouble(st->p50 * 1e6);
  jkey("p95_us"), jdouble(st->p95 * 1e6);
  jkey("p99_us"), jdouble(st->p99 * 1e6);
  jkey("stdev_us"), jdouble(st->stdev * 1e6);
  jkey("cv_pct"), jdouble(cv);
  jkey("times_us"), jopen('[');
  for (int i = 0; i < st->n; i++) jdouble(st->times[i] * 1e6);
  jclose(']');
  jclose('}');
}

void out_row_place(double time_us, double algbw, double busbw, int64_t wrong, int oop, const perf_iterstats* st) {
  char ts[32], as[32], bs[32];
  perf_fmt_num(time_us, 7, ts);
  perf_fmt_num(algbw, 6, as);
  perf_fmt_num(busbw, 6, bs);
  if (wrong >= 0) printf("  %7s  %6s  %6s  %6g", ts, as, bs, (double)wrong);
  else printf("  %7s  %6s  %6s    N/A", ts, as, bs);
  if (st) {
    double cv = st->avg > 0 ? st->stdev / st->avg * 100.0 : 0.0;
    char a[32], b[32], c[32], d[32];
    perf_fmt_num(st->min * 1e6, 7, a);
    perf_fmt_num(st->max * 1e6, 7, b);
    perf_fmt_num(st->p99 * 1e6, 7, c);
    perf_fmt_num(cv, 7, d);
    printf("  %7s  %7s  %7s  %7s", a, b, c, d);
  }
  if (!oop && opts->timestamps) {
    char now[64];
    now_str(now, sizeof now);
    printf("%21s", now);
  }
  if (jf) {
    jkey(oop ? "out_of_place" : "in_place"), jopen('{');
    jkey(opts->cputime ? "cpu_time" : "time"), jdouble(time_us);
    jkey("alg_bw"), jdouble(algbw);
    jkey("bus_bw"), jdouble(busbw);
    jkey("nwrong");
    if (wrong >= 0) jdouble((double)wrong);
    else jnull();
    jclose('}');
    if (st) stats_json(st, oop);
  }
  if (nrows > 0 && place_idx < 2) {
    rows[nrows - 1].time[place_idx] = time_us;
    rows[nrows - 1].busbw[place_idx] = busbw;
    rows[nrows - 1].places = ++place_idx;
  }
}

void out_row_no_place(void) {
  printf("  %7s  %6s  %6s  %6s", "N/A", "N/A", "N/A", "N/A");
  if (opts->per_iter) printf("  %7s  %7s  %7s  %7s", "N/A", "N/A", "N/A", "N/A");
  if (opts->timestamps) {
    char now[64];
    now_str(now, sizeof now);
    printf("%21s", now);
  }
  if (jf) jkey("in_place"), jnull();
}

void out_row_end(int actual_iters, const char* name) {
  printf("\n");
  row_open = 0;
  fflush(stdout);
  if (jf) {
    jkey("actual_iterations"), jint(actual_iters);
    jkey("experiment_name"), jstr(name);
    jclose('}');
    fflush(jf);
  }
}

void out_skip_line(const char* text) { printf("%s\n", text); }

void out_footer(int errors, double avg_busbw, double min_bw) {
  if (jf) jclose(']'); /* results */
  printf("# %-20s : %d %s\n", "Out of bounds values", errors, errors ? "FAILED" : "OK");
  printf("# %-20s : %g %s\n", "Avg bus bandwidth", avg_busbw,
         min_bw < 0 ? "" : (avg_busbw < min_bw * 0.9 ? "FAILED" : "OK"));
  printf("#\n");
  printf("# Collective test concluded: %s\n", program);
  if (jf) {
    jkey("out_of_bounds"), jopen('{');
    jkey("count"), jint(errors);
    jkey("okay"), jbool(errors == 0);
    jclose('}');
    jkey("average_bus_bandwidth"), jopen('{');
    jkey("bandwidth"), jdouble(avg_busbw);
    jkey("okay");
    if (min_bw < 0) jstr("unchecked");
    else jbool(avg_busbw >= min_bw * 0.9);
    jclose('}');
  }
}

static void mem_str(int64_t amount, char* out, size_t n) {
  double a = (double)amount;
  const char* unit = " B";
  if (fabs(a) >= 1024.0 * 1024 * 1024) unit = " GB", a /= 1024.0 * 1024 * 1024;
  else if (fabs(a) >= 1024.0 * 1024) unit = " MB", a /= 1024.0 * 1024;
  else if (fabs(a) >= 1024.0) unit = " KB", a /= 1024.0;
  int prec = fabs(a) < 10.0 ? 2 : fabs(a) < 100.0 ? 1 : 0;
  snprintf(out, n, "%.*f%s", prec, a, unit);
}

void out_mem_report(int64_t init, int64_t user, int64_t coll) {
  char a[32], b[32], c[32], t[32];
  mem_str(init, a, sizeof a);
  mem_str(user, b, sizeof b);
  mem_str(coll, c, sizeof c);
  mem_str(init + user + coll, t, sizeof t);
  printf("# %-20s : Initialization %s | User-Allocated %s | Collective %s | Total  %s\n", "Host memory usage", a, b,
         c, t);
}

static void json_close_all(const char* error) {
  if (!jf) return;
  if (jafter_key) jnull();
  while (jdepth > 1) jclose(0); /* only after a failure in the middle of the results */
  jkey("errors"), jopen('[');
  if (error && *error) jstr(error);
  jclose(']');
  char ts[64];
  now_str(ts, sizeof ts);
  jkey("end_time"), jstr(ts);
  jclose('}');
  fputc('\n', jf);
  fclose(jf);
  jf = NULL;
}

void out_finish(const char* error) {
  printf("#\n");
  if (error && *error) printf("# error: %s\n", error);
  else printf("\n");
  fflush(stdout);
  json_close_all(error);
}

void out_abort(const char* why) {
  if (row_open) printf("\n"); /* end the half-printed row before the error lines */
  row_open = 0;
  json_close_all(why);
}

int out_plot(const char* path) {
  plot_series* s = NULL;
  int ns = 0, ncolors = 0;
  /* One series per (type, op, root) and placement, in the order first measured. */
  for (int i = 0; i < nrows; i++) {
    for (int p = 0; p < rows[i].places; p++) {
      char label[160], root[24] = "";
      if (rows[i].root >= 0) snprintf(root, sizeof root, " root %d", rows[i].root);
      snprintf(label, sizeof label, "%s %s%s%s%s, %s", program, rows[i].type, *rows[i].op ? " " : "", rows[i].op, root,
               p ? "in-place" : "out-of-place");
      int k;
      for (k = 0; k < ns; k++)
        if (strcmp(s[k].label, label) == 0) break;
      if (k == ns) {
        plot_series* n2 = realloc(s, sizeof(*s) * (size_t)(ns + 1));
        if (!n2) break;
        s = n2;
        memset(&s[ns], 0, sizeof(*s));
        snprintf(s[ns].label, sizeof s[ns].label, "%s", label);
        s[ns].dashed = p;
        /* One color per (type, op, root): the part of the label before ", <placement>". */
        size_t stem = (size_t)(strrchr(label, ',') - label);
        s[ns].color = -1;
        for (int j = 0; j < ns && s[ns].color < 0; j++)
          if (strncmp(s[j].label, label, stem) == 0 && s[j].label[stem] == ',') s[ns].color = s[j].color;
        if (s[ns].color < 0) s[ns].color = ncolors++;
        ns++;
      }
      plot_add(&s[k], (double)rows[i].bytes, rows[i].busbw[p], rows[i].time[p]);
    }
  }
  char title[128];
  snprintf(title, sizeof title, "%s (Chorus)", program);
  int rc = plot_svg(path, title, s, ns);
  if (rc != 0) fprintf(stderr, "%s: cannot write plot %s: %s\n", program, path, strerror(errno));
  for (int k = 0; k < ns; k++) plot_free(&s[k]);
  free(s);
  return rc;
}
