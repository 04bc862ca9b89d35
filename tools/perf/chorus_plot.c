/* chorus-plot: overlay benchmark results in one SVG (bus bandwidth and time against size).
 *
 *   chorus-plot -o out.svg [-t TITLE] [--in-place | --both] [LABEL=]FILE...
 *
 * FILE may be a JSON file written by a *_perf tool with -J, the stdout of a *_perf tool, or the
 * tables of a peer's baseline runner (Open MPI, Gloo; this project's development machines have one,
 * outside the repository: "## title" lines, then rows of "size(B) time(us) algbw busbw check"). LABEL= names the file's series in the legend. */
#include <errno.h>
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "json.h"
#include "plot.h"

static const char* prog = "chorus-plot";
static int want_oop = 1, want_ip = 0;

static plot_series* series;
static int nseries;

static int ncolors;

/* stem: what in-place and out-of-place lines of one source share (they share a color). */
static plot_series* find_series(const char* label, int dashed, const char* stem) {
  for (int i = 0; i < nseries; i++)
    if (strcmp(series[i].label, label) == 0) return &series[i];
  static char (*stems)[160];
  char (*st)[160] = realloc(stems, sizeof(*stems) * (size_t)(nseries + 1));
  if (!st) return NULL;
  stems = st;
  snprintf(stems[nseries], sizeof stems[0], "%s", stem);
  int color = -1;
  for (int i = 0; i < nseries && color < 0; i++)
    if (strcmp(stems[i], stem) == 0) color = series[i].color;
  if (color < 0) color = ncolors++;
  plot_series* ns = realloc(series, sizeof(*series) * (size_t)(nseries + 1));
  if (!ns) return NULL;
  series = ns;
  plot_series* s = &series[nseries++];
  memset(s, 0, sizeof(*s));
  snprintf(s->label, sizeof s->label, "%s", label);
  s->dashed = dashed;
  s->color = color;
  return s;
}

static char* read_all(const char* path) {
  FILE* f = fopen(path, "rb");
  if (!f) return NULL;
  size_t cap = 1 << 16, n = 0;
  char* buf = malloc(cap + 1);
  while (buf) {
    size_t r = fread(buf + n, 1, cap - n, f);
    n += r;
    if (n < cap) break;
    char* nb = realloc(buf, (cap *= 2) + 1);
    if (!nb) free(buf);
    buf = nb;
  }
  int e = ferror(f);
  fclose(f);
  if (!buf || e) return free(buf), NULL;
  buf[n] = '\0';
  return buf;
}

static const char* base_name(const char* path) {
  const char* s = strrchr(path, '/');
  return s ? s + 1 : path;
}

/* Label of one (type, op, root) combination and placement of a file; stem leaves the placement out. */
static void make_label(char* out, char* stem, size_t n, const char* base, const char* combo, int multi, int ip) {
  const char* place = ip ? ", in-place" : (want_ip ? ", out-of-place" : "");
  if (multi) snprintf(stem, n, "%s %s", base, combo);
  else snprintf(stem, n, "%s", base);
  snprintf(out, n, "%.*s%s", (int)(n - 16), stem, place);
}

static int load_json(const char* text, const char* path, const char* label) {
  char err[128];
  js* doc = js_parse(text, err, sizeof err);
  if (!doc) {
    fprintf(stderr, "%s: %s: not valid JSON: %s\n", prog, path, err);
    return -1;
  }
  const js* res = js_get(doc, "results");
  if (!res || res->type != JS_ARR) {
    fprintf(stderr, "%s: %s: no \"results\" list (is it a -J file of a *_perf tool?)\n", prog, path);
    js_free(doc);
    return -1;
  }
  char base[96];
  snprintf(base, sizeof base, "%s", label ? label : js_string(js_get(doc, "test"), base_name(path)));
  /* Several types/ops/roots in one file: say which in the labels. */
  char first[64] = "";
  int multi = 0;
  for (int i = 0; i < res->n; i++) {
    const js* r = &res->items[i];
    char combo[48];
    snprintf(combo, sizeof combo, "%s %s root %g", js_string(js_get(r, "type"), "?"), js_string(js_get(r, "redop"), ""),
             js_number(js_get(r, "root"), -1));
    if (i == 0) snprintf(first, sizeof first, "%s", combo);
    else if (strcmp(first, combo) != 0) multi = 1;
  }
  for (int i = 0; i < res->n; i++) {
    const js* r = &res->items[i];
    double size = js_number(js_get(r, "size"), 0);
    double root = js_number(js_get(r, "root"), -1);
    char combo[48];
    snprintf(combo, sizeof combo, "%s %s", js_string(js_get(r, "type"), "?"), js_string(js_get(r, "redop"), ""));
    if (root >= 0) snprintf(combo + strlen(combo), sizeof combo - strlen(combo), " root %g", root);
    for (int ip = 0; ip < 2; ip++) {
      if ((ip && !want_ip) || (!ip && !want_oop)) continue;
      const js* pl = js_get(r, ip ? "in_place" : "out_of_place");
      if (!pl || pl->type != JS_OBJ) continue;
      const js* t = js_get(pl, "time");
      if (!t) t = js_get(pl, "cpu_time");
      char lab[160], stem[160];
      make_label(lab, stem, sizeof lab, base, combo, multi, ip);
      plot_series* s = find_series(lab, ip, stem);
      if (!s || plot_add(s, size, js_number(js_get(pl, "bus_bw"), 0), js_number(t, 0))) return js_free(doc), -1;
    }
  }
  js_free(doc);
  return 0;
}

static int numeric(const char* s) {
  char* end;
  strtod(s, &end);
  return end != s && *end == '\0';
}

/* stdout of a *_perf tool: rows "size count type [redop] root time algbw busbw wrong time algbw busbw wrong". */
static int load_perf_text(char* text, const char* path, const char* label) {
  const char* base = label ? label : base_name(path);
  char* save = NULL;
  for (char* line = strtok_r(text, "\n", &save); line; line = strtok_r(NULL, "\n", &save)) {
    if (line[0] == '#') continue;
    char* tok[32];
    int nt = 0;
    char* s2 = NULL;
    for (char* t = strtok_r(line, " \t", &s2); t && nt < 32; t = strtok_r(NULL, " \t", &s2)) tok[nt++] = t;
    if (nt < 12 || !numeric(tok[0]) || !numeric(tok[1])) continue;
    int k = 3;
    const char* op = "";
    if (!numeric(tok[3])) op = tok[k++];
    double root = atof(tok[k++]);
    if (nt < k + 8) continue;
    char combo[48];
    snprintf(combo, sizeof combo, "%s %s", tok[2], op);
    if (root >= 0) snprintf(combo + strlen(combo), sizeof combo - strlen(combo), " root %g", root);
    for (int ip = 0; ip < 2; ip++) {
      if ((ip && !want_ip) || (!ip && !want_oop)) continue;
      char lab[160], stem[160];
      make_label(lab, stem, sizeof lab, base, combo, 1, ip);
      plot_series* s = find_series(lab, ip, stem);
      if (!s || plot_add(s, atof(tok[0]), atof(tok[k + 4 * ip + 2]), atof(tok[k + 4 * ip]))) return -1;
    }
  }
  return 0;
}

/* A peer baseline table: "## <title>" starts a table; rows are "size time algbw busbw check". */
static int load_baseline(char* text, const char* path, const char* label) {
  char title[160];
  snprintf(title, sizeof title, "%s", label ? label : base_name(path));
  char* save = NULL;
  for (char* line = strtok_r(text, "\n", &save); line; line = strtok_r(NULL, "\n", &save)) {
    if (strncmp(line, "## ", 3) == 0) {
      if (label) snprintf(title, sizeof title, "%s: %s", label, line + 3);
      else snprintf(title, sizeof title, "%s", line + 3);
      continue;
    }
    if (line[0] == '#') continue;
    double size, t, alg, bus;
    char check[16];
    if (sscanf(line, "%lf %lf %lf %lf %15s", &size, &t, &alg, &bus, check) != 5) continue;
    plot_series* s = find_series(title, 0, title);
    if (!s || plot_add(s, size, bus, t)) return -1;
  }
  return 0;
}

static void usage(FILE* f) {
  fprintf(f,
          "usage: %s -o OUT.svg [-t TITLE] [--in-place | --both] [LABEL=]FILE...\n"
          "  FILE: JSON from a *_perf tool's -J, a *_perf tool's stdout, or the peers' baseline run.sh output.\n"
          "  LABEL=FILE names that file's lines in the legend.\n"
          "  --in-place: plot in-place results instead of out-of-place; --both: both.\n",
          prog);
}

int main(int argc, char** argv) {
  const char* out = NULL;
  const char* title = "Collective performance";
  static const struct option lo[] = {{"output", required_argument, 0, 'o'}, {"title", required_argument, 0, 't'},
                                     {"in-place", no_argument, 0, 1},       {"both", no_argument, 0, 2},
                                     {"help", no_argument, 0, 'h'},         {0, 0, 0, 0}};
  int c;
  while ((c = getopt_long(argc, argv, "o:t:h", lo, NULL)) != -1) {
    switch (c) {
      case 'o': out = optarg; break;
      case 't': title = optarg; break;
      case 1: want_oop = 0, want_ip = 1; break;
      case 2: want_oop = 1, want_ip = 1; break;
      case 'h': usage(stdout); return 0;
      default: usage(stderr); return 2;
    }
  }
  if (!out || optind >= argc) {
    fprintf(stderr, "%s: %s\n", prog, !out ? "-o OUT.svg is required" : "no input files");
    usage(stderr);
    return 2;
  }
  for (int i = optind; i < argc; i++) {
    const char* path = argv[i];
    char* label = NULL;
    char* eq = strchr(argv[i], '=');
    FILE* probe = fopen(path, "r");
    if (probe) fclose(probe);
    else if (eq) { /* LABEL=FILE, unless the whole argument names a file */
      label = strndup(argv[i], (size_t)(eq - argv[i]));
      path = eq + 1;
    }
    char* text = read_all(path);
    if (!text) {
      fprintf(stderr, "%s: cannot read %s: %s\n", prog, path, strerror(errno));
      return 1;
    }
    const char* p = text + strspn(text, " \t\r\n");
    int rc = *p == '{' ? load_json(text, path, label)
             : strstr(text, "# Collective test starting:") ? load_perf_text(text, path, label)
                                                           : load_baseline(text, path, label);
    free(text);
    free(label);
    if (rc) return 1;
  }
  int points = 0;
  for (int i = 0; i < nseries; i++) points += series[i].n;
  if (points == 0) fprintf(stderr, "%s: warning: no data points found in the inputs\n", prog);
  if (plot_svg(out, title, series, nseries) != 0) {
    fprintf(stderr, "%s: cannot write %s: %s\n", prog, out, strerror(errno));
    return 1;
  }
  for (int i = 0; i < nseries; i++) plot_free(&series[i]);
  free(series);
  return 0;
}
