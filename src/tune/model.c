/* The cost model's constants: built-in defaults (each says where its value comes from) and the file
 * `chorus-info --calibrate` writes from measurements on the machine at hand (CHORUS_TUNE_FILE). The
 * file is untrusted text: known names only, finite values in a plausible range, or init fails. */
#include <errno.h>
#include <math.h>
#include <stddef.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>

#include "../misc/log.h"
#include "../misc/param.h"
#include "../misc/utils.h"
#include "tune.h"

/* "measured": from a figure in docs/PERFORMANCE.md, named; "placeholder": not measured, chosen to keep
 * the choices made before the model existed. */
static const struct tune_model defaults = {
    /* measured: `chorus-info --calibrate` on the 2-CPU build machine, 2026-11-23, three runs (spread in
     * brackets): one-hop AllReduce between 2 processes, 8 B: LL 0.27 [0.27-0.28], LL128 0.40
     * [0.38-0.41], Simple 0.39 us; 1 MiB: Simple 105-109 us = 19.3-20.0 GB/s through the FIFO (the
     * fastest protocol: copy_bw), LL 0.41 and LL128 0.48 of it. A plain memcpy of one core measured
     * 6.9 GB/s in the same runs: a FIFO hop overlaps the two ranks' copies, so memcpy does not
     * predict it. docs/PERFORMANCE.md, "Cost model constants". */
    .step_us = {0.27, 0.40, 0.39},
    .copy_bw = 19400.0,
    .proto_eff = {0.41, 0.48, 1.0},
    .direct_us = 0.10,   /* placeholder: below one FIFO step, so CHORUS_DIRECT_MIN_BYTES is the switch */
    .chan_gain = 0.0,    /* placeholder: channel scaling not measured (NCCL_MAX_NCHANNELS defaults to 1) */
    .chan_bytes = 1u << 20, /* placeholder: the rule used before the model */
    .ll_max_bytes = 64,  /* measured: protocols tie up to 64-128 B, Simple wins from 512 B (protocol table) */
    .ll_penalty = 1024.0,
    /* measured: same calibration runs, loopback TCP between 2 processes: 8 B 28.0-29.4 us, 4 MiB
     * 2.5-3.7 ms (1.1-1.7 GB/s) */
    .net_step_us = 29.0,
    .net_bw = 1400.0,
};

/* One loaded model per value of CHORUS_TUNE_FILE seen by this process (tests change it between
 * communicators; a job sets it once). Entries are immutable once published and never freed, so a
 * reader may keep the pointer; `current` is the last one looked up (atomic), `all` a list under lock. */
struct loaded {
  char path[256]; /* longer values are refused */
  struct tune_model m;
  ch_status status;
  char why[1024]; /* when status is not CH_OK: logged by every init that fails on it (tune_check) */
  struct loaded* next;
};
static struct loaded* _Atomic current;
static struct loaded* all;
static pthread_mutex_t load_lock = PTHREAD_MUTEX_INITIALIZER;

/* The file's names: where each value goes and the range it must fall in. */
struct key {
  const char* name;
  size_t off;
  int is_size; /* size_t field (else double) */
  double lo, hi;
};
#define D(field, lo, hi) {#field, offsetof(struct tune_model, field), 0, lo, hi}
#define Z(field, lo, hi) {#field, offsetof(struct tune_model, field), 1, lo, hi}
/* Per protocol: "step_us.LL", ... named from the protocol table (misc/names.h). */
#define STEP_US(v, name) {"step_us." name, offsetof(struct tune_model, step_us[PROTO_##v]), 0, 0.001, 1e5},
#define PROTO_EFF(v, name) {"proto_eff." name, offsetof(struct tune_model, proto_eff[PROTO_##v]), 0, 0.001, 1},
static const struct key keys[] = {
    CH_PROTO_LIST(STEP_US)
    D(copy_bw, 1, 1e7),
    CH_PROTO_LIST(PROTO_EFF)
    D(direct_us, 0, 1e5),
    D(chan_gain, 0, 1),
    Z(chan_bytes, 1, 1e12),
    Z(ll_max_bytes, 0, 1e12),
    D(ll_penalty, 1, 1e9),
    D(net_step_us, 0.001, 1e6),
    D(net_bw, 1, 1e7),
};
#define NKEYS (sizeof(keys) / sizeof(keys[0]))

static ch_status parse_line(struct tune_model* model, char* line, int lineno, const char* path, char* why,
                            size_t wlen) {
  char* hash = strchr(line, '#');
  if (hash) *hash = '\0';
  char name[64];
  double v;
  char extra;
  if (sscanf(line, " %63[A-Za-z0-9_.] = %lf %c", name, &v, &extra) != 2) {
    for (char* c = line; *c; c++)
      if (*c != ' ' && *c != '\t' && *c != '\n' && *c != '\r') {
        snprintf(why, wlen, "CHORUS_TUNE_FILE %s line %d: expected \"name = number\"", path, lineno);
        return CH_INVALID_USAGE;
      }
    return CH_OK; /* blank or comment */
  }
  for (size_t k = 0; k < NKEYS; k++) {
    if (strcasecmp(name, keys[k].name) != 0) continue;
    if (!isfinite(v) || v < keys[k].lo || v > keys[k].hi) {
      snprintf(why, wlen, "CHORUS_TUNE_FILE %s line %d: %s = %g is outside [%g, %g]", path, lineno, keys[k].name, v,
               keys[k].lo, keys[k].hi);
      return CH_INVALID_USAGE;
    }
    char* at = (char*)model + keys[k].off;
    if (keys[k].is_size) *(size_t*)at = (size_t)v;
    else *(double*)at = v;
    return CH_OK;
  }
  snprintf(why, wlen, "CHORUS_TUNE_FILE %s line %d: unknown constant \"%s\" (chorus-info --calibrate writes the known ones)",
           path, lineno, name);
  return CH_INVALID_USAGE;
}

static void load(struct loaded* e) {
  e->m = defaults;
  e->status = CH_OK;
  if (!e->path[0]) return;
  FILE* f = fopen(e->path, "re");
  if (!f) {
    snprintf(e->why, sizeof(e->why), "CHORUS_TUNE_FILE %s cannot be read: %s", e->path, strerror(errno));
    e->status = CH_INVALID_USAGE;
    return;
  }
  char line[256];
  int lineno = 0, whole = 1;
  while (e->status == CH_OK && fgets(line, sizeof(line), f)) {
    int starts = whole; /* the previous piece ended its line: this one starts the next */
    whole = strchr(line, '\n') != NULL || feof(f);
    if (!starts) continue; /* the rest of a long line (a comment: a constant's line is short) */
    lineno++;
    if (!whole && line[strspn(line, " \t")] != '#') {
      snprintf(e->why, sizeof(e->why), "CHORUS_TUNE_FILE %s line %d: longer than %zu characters", e->path, lineno,
               sizeof(line) - 2);
      e->status = CH_INVALID_USAGE;
      break;
    }
    e->status = parse_line(&e->m, line, lineno, e->path, e->why, sizeof(e->why));
  }
  if (e->status == CH_OK && ferror(f)) { /* a directory opens, and reads fail (EISDIR) */
    snprintf(e->why, sizeof(e->why), "CHORUS_TUNE_FILE %s cannot be read: %s", e->path, strerror(errno));
    e->status = CH_INVALID_USAGE;
  }
  fclose(f);
  if (e->status != CH_OK) e->m = defaults; /* never half a file */
  else INFO(LOG_TUNING, "cost model constants from CHORUS_TUNE_FILE %s", e->path);
}

static const struct loaded too_long = {.status = CH_INVALID_USAGE,
                                       .why = "CHORUS_TUNE_FILE is longer than 255 characters"};

static const struct loaded* lookup(void) {
  const char* path = param_str(PARAM_TUNE_FILE);
  if (strlen(path) >= sizeof(too_long.path)) return &too_long;
  struct loaded* e = atomic_load_explicit(&current, memory_order_acquire);
  if (e && strcmp(e->path, path) == 0) return e;
  pthread_mutex_lock(&load_lock);
  for (e = all; e && strcmp(e->path, path) != 0; e = e->next) {}
  if (!e && (e = calloc(1, sizeof(*e))) != NULL) {
    snprintf(e->path, sizeof(e->path), "%s", path);
    load(e);
    e->next = all;
    all = e;
  }
  if (e) atomic_store_explicit(&current, e, memory_order_release);
  pthread_mutex_unlock(&load_lock);
  return e;
}

const struct tune_model* tune_model_get(void) {
  const struct loaded* e = lookup();
  return e && e->status == CH_OK ? &e->m : &defaults;
}

ch_status tune_model_status(void) {
  const struct loaded* e = lookup();
  if (!e) {
    WARN("out of memory reading CHORUS_TUNE_FILE");
    return CH_SYSTEM;
  }
  if (e->status != CH_OK) WARN("%s", e->why);
  return e->status;
}

const struct tune_model* tune_model_defaults(void) { return &defaults; }

int64_t tune_model_hash(void) {
  const struct tune_model* m = tune_model_get();
  uint64_t h = 0;
  for (size_t k = 0; k < NKEYS; k++) { /* values, not bytes: padding never counts */
    const char* at = (const char*)m + keys[k].off;
    double v = keys[k].is_size ? (double)*(const size_t*)at : *(const double*)at;
    h = ut_hash(&v, sizeof(v), h);
  }
  return (int64_t)(h >> 1);
}

void tune_model_write(FILE* f, const struct tune_model* m) {
  for (size_t k = 0; k < NKEYS; k++) {
    const char* at = (const char*)m + keys[k].off;
    /* Exactly what is read back: %.6g turned 1048576 into 1048580 (one channel fewer at 1 MiB multiples). */
    if (keys[k].is_size) fprintf(f, "%-18s = %zu\n", keys[k].name, *(const size_t*)at);
    else fprintf(f, "%-18s = %.17g\n", keys[k].name, *(const double*)at);
  }
}
