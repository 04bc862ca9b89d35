/* What the benchmarks print: nccl-tests' header, table rows and footer on stdout, the same data as
 * JSON (-J, nccl-tests' version 3 layout) and as an SVG plot (--plot). Only the process holding
 * rank 0 calls these, from one thread. */
#ifndef CHORUS_PERF_OUTPUT_H
#define CHORUS_PERF_OUTPUT_H

#include <stdint.h>

#include "common.h"

/* One rank's line in "# Using devices", gathered from every process. */
typedef struct perf_devrec {
  int32_t rank, group, pid, device;
  char host[64];
} perf_devrec;

typedef struct perf_iterstats {
  double min, max, avg, p50, p95, p99, stdev; /* seconds */
  const double* times;                        /* every iteration, seconds */
  int n, skipped;
} perf_iterstats;

void out_init(const perf_opts* o, const char* prog);
/* Opens the -J file like nccl-tests (if it exists, tries name.0, name.1, ...). */
void out_json_open(const char* path, int argc, char** argv);
void out_device_report(const perf_devrec* recs, int nranks);
void out_mem_note(size_t max_bytes);
void out_table_header(void);
void out_row_start(size_t bytes, size_t count, const char* type, const char* op, int root);
/* wrong < 0 prints N/A. st may be NULL (no -I). */
void out_row_place(double time_us, double algbw, double busbw, int64_t wrong, int out_of_place,
                   const perf_iterstats* st);
/* The in-place columns of a benchmark without an in-place form: N/A. */
void out_row_no_place(void);
void out_row_end(int actual_iters, const char* name);
void out_skip_line(const char* text);
void out_footer(int errors, double avg_busbw, double min_bw);
void out_mem_report(int64_t init, int64_t user, int64_t coll);
/* Last lines: "#", then "# error: ..." or an empty line; closes the JSON file. */
void out_finish(const char* error);
/* Close the JSON file after a failure, recording why. */
void out_abort(const char* why);
/* --plot: busbw and time against size for every (type, op, root) and placement measured. */
int out_plot(const char* path);

void perf_fmt_num(double v, int width, char* out); /* nccl-tests' number fitting (getFloatStr) */

#endif
