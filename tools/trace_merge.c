/* chorus-info --trace DIR [OUT.json [OUT.svg]]: merges the ranks' CHORUS_TRACE files (DIR/chorus-trace-
 * <comm>-r<rank>.json, written by src/observe/trace.c one event per line) into one trace on one time
 * base (each file's ts are us from its own base_ns, a round 1000 s of the job's clock: rebased here
 * to the earliest), and draws the last calls as an SVG, a lane per rank, waiting in red, for people who
 * will not open a trace viewer. Reads only the format trace.c writes. */
#include <dirent.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../src/misc/safefile.h"
#include "flight.h"

struct span {
  int pid, wait;
  double ts, dur;
  long long seq;
  char name[32];
};

struct lane {
  int pid, sort;
  char label[96];
};

struct merge {
  struct span* s;
  int n, cap;
  struct lane* l;
  int nl, capl;
};

static const char* field(const char* line, const char* key) {
  const char* p = strstr(line, key);
  return p ? p + strlen(key) : NULL;
}

static int add_span(struct merge* m, const struct span* s) {
  if (m->n == m->cap) {
    int cap = m->cap ? 2 * m->cap : 4096;
    struct span* p = realloc(m->s, sizeof(*p) * (size_t)cap);
    if (!p) return -1;
    m->s = p, m->cap = cap;
  }
  m->s[m->n++] = *s;
  return 0;
}

static struct lane* lane_of(struct merge* m, int pid) {
  for (int i = 0; i < m->nl; i++)
    if (m->l[i].pid == pid) return &m->l[i];
  if (m->nl == m->capl) {
    int cap = m->capl ? 2 * m->capl : 64;
    struct lane* p = realloc(m->l, sizeof(*p) * (size_t)cap);
    if (!p) return NULL;
    m->l = p, m->capl = cap;
  }
  struct lane* l = &m->l[m->nl++];
  memset(l, 0, sizeof(*l));
  l->pid = pid, l->sort = pid;
  snprintf(l->label, sizeof(l->label), "pid %d", pid);
  return l;
}

/* One file: its events rebased by shift_us, appended to out; spans and lanes kept for the picture. */
static int merge_file(const char* path, double shift_us, FILE* out, int* first, struct merge* m) {
  FILE* f = fopen(path, "r");
  if (!f) return -1;
  char line[4096];
  while (fgets(line, sizeof(line), f)) {
    size_t k = strlen(line);
    while (k && (line[k - 1] == '\n' || line[k - 1] == ',')) line[--k] = 0;
    if (line[0] != '{' || strstr(line, "\"name\":\"end\"")) continue;
    const char* ts = field(line, "\"ts\":");
    const char* pidp = field(line, "\"pid\":");
    int pid = pidp ? atoi(pidp) : 0;
    fputs(*first ? "" : ",\n", out);
    *first = 0;
    if (ts) {
      double v = strtod(ts, NULL) + shift_us;
      const char* rest = strchr(ts, ',');
      fprintf(out, "%.*s%.3f%s", (int)(ts - line), line, v, rest ? rest : "}");
      const char* cat = field(line, "\"cat\":\"");
      const char* dur = field(line, "\"dur\":");
      const char* name = field(line, "\"name\":\"");
      if (cat && dur && (!strncmp(cat, "call\"", 5) || !strncmp(cat, "wait\"", 5)) && !strstr(line, "\"tid\":9000")) {
        struct span s = {.pid = pid, .wait = cat[0] == 'w', .ts = v, .dur = strtod(dur, NULL), .seq = -1};
        const char* seq = field(line, "\"seq\":");
        if (seq) s.seq = atoll(seq);
        if (name) {
          size_t j = 0;
          while (name[j] && name[j] != '"' && j + 1 < sizeof(s.name)) s.name[j] = name[j], j++;
          s.name[j] = 0;
        }
        if (add_span(m, &s) != 0) break;
      }
    } else {
      fputs(line, out);
      struct lane* l = lane_of(m, pid);
      const char* v;
      if (l && strstr(line, "\"process_name\"")) {
        const char* n = strstr(line, "\"args\":{\"name\":\"");
        if (n) {
          n += 16;
          size_t j = 0;
          while (n[j] && n[j] != '"' && j + 1 < sizeof(l->label)) l->label[j] = n[j], j++;
          l->label[j] = 0;
        }
      }
      if (l && strstr(line, "\"process_sort_index\"") && (v = field(line, "\"sort_index\":"))) l->sort = atoi(v);
    }
  }
  fclose(f);
  return 0;
}

static int cmp_lane(const void* a, const void* b) {
  const struct lane *x = a, *y = b;
  return x->sort != y->sort ? (x->sort < y->sort ? -1 : 1) : (x->pid < y->pid ? -1 : x->pid > y->pid);
}

static const char* color_of(const char* name) {
  static const struct { const char *n, *c; } pal[] = {{"AllReduce", "#4e79a7"}, {"AllGather", "#59a14f"},
      {"ReduceScatter", "#f28e2b"}, {"Broadcast", "#b07aa1"}, {"Reduce", "#edc948"}, {"Send", "#76b7b2"},
      {"Recv", "#9c755f"}};
  for (size_t i = 0; i < sizeof(pal) / sizeof(pal[0]); i++)
    if (!strcmp(name, pal[i].n)) return pal[i].c;
  return "#bab0ac";
}

/* Time a rank spent waiting inside span c: its wait spans that start within c. */
static double waited_in(const struct merge* m, const struct span* c) {
  double w = 0;
  for (int i = 0; i < m->n; i++) {
    const struct span* s = &m->s[i];
    if (s->wait && s->pid == c->pid && s->ts >= c->ts && s->ts <= c->ts + c->dur) w += s->dur;
  }
  return w;
}

/* Two pictures of the last collectives (up to 40), a lane per rank. Above, the timeline: each call a
 * bar, its waits red. Below, per call: each rank's time in it, as a share of the longest rank's, the
 * waiting part red; the rank that did not wait is the one the others waited for. */
static void draw(struct merge* m, FILE* svg) {
  qsort(m->l, (size_t)m->nl, sizeof(*m->l), cmp_lane);
  long long top = -1;
  double end = 0, begin = 1e300;
  for (int i = 0; i < m->n; i++) {
    if (!m->s[i].wait && m->s[i].seq > top) top = m->s[i].seq;
    if (m->s[i].ts + m->s[i].dur > end) end = m->s[i].ts + m->s[i].dur;
  }
  long long first = top < 40 ? 1 : top - 39, ncol = top >= first ? top - first + 1 : 0;
  for (int i = 0; i < m->n; i++)
    if (!m->s[i].wait && m->s[i].seq >= first && m->s[i].ts < begin) begin = m->s[i].ts;
  if (begin > end) begin = end;
  double span = end - begin > 1e-3 ? end - begin : 1e-3;
  int W = 1200, left = 230, lh = 28, top1 = 40, top2 = 90 + lh * m->nl, H = top2 + 40 + lh * m->nl;
  double px = (double)(W - left - 20) / span;
  fprintf(svg, "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%d\" height=\"%d\" font-family=\"sans-serif\" "
               "font-size=\"12\">\n<rect width=\"100%%\" height=\"100%%\" fill=\"white\"/>\n", W, H);
  fprintf(svg, "<text x=\"10\" y=\"20\" font-size=\"14\">Timeline of collectives #%lld-#%lld: %.1f ms "
               "(bars: calls, red: waiting for a peer)</text>\n", first, top, span / 1e3);
  for (int t = 0; t <= 5; t++) {
    double x = left + (double)t * (W - left - 20) / 5;
    fprintf(svg, "<line x1=\"%.1f\" y1=\"%d\" x2=\"%.1f\" y2=\"%d\" stroke=\"#ddd\"/><text x=\"%.1f\" y=\"%d\" "
                 "text-anchor=\"middle\" fill=\"#666\">+%.1f ms</text>\n", x, top1 - 5, x, top1 + lh * m->nl, x,
            top1 + lh * m->nl + 14, span * t / 5 / 1e3);
  }
  for (int li = 0; li < m->nl; li++) {
    int y = top1 + li * lh;
    fprintf(svg, "<text x=\"10\" y=\"%d\">%s</text>\n", y + 16, m->l[li].label);
    for (int pass = 0; pass < 2; pass++) /* calls, then their waits on top */
      for (int i = 0; i < m->n; i++) {
        const struct span* s = &m->s[i];
        if (s->pid != m->l[li].pid || s->wait != pass || s->ts + s->dur < begin) continue;
        double x = left + (s->ts - begin) * px, w = s->dur * px < 0.5 ? 0.5 : s->dur * px;
        if (pass)
          fprintf(svg, "<rect x=\"%.2f\" y=\"%d\" width=\"%.2f\" height=\"8\" fill=\"#e15759\"><title>%s %.1f us"
                       "</title></rect>\n", x, y + 14, w, s->name, s->dur);
        else
          fprintf(svg, "<rect x=\"%.2f\" y=\"%d\" width=\"%.2f\" height=\"20\" fill=\"%s\" stroke=\"white\" "
                       "stroke-width=\"0.5\"><title>%s #%lld: %.1f us</title></rect>\n",
                  x, y + 2, w, color_of(s->name), s->name, s->seq, s->dur);
      }
  }
  if (!ncol) {
    fprintf(svg, "</svg>\n");
    return;
  }
  fprintf(svg, "<text x=\"10\" y=\"%d\" font-size=\"14\">Per call: each rank's time in it (full cell: the "
               "longest rank's), red: waiting</text>\n", top2 - 20);
  double cw = (double)(W - left - 20) / (double)ncol;
  for (long long q = first; q <= top; q++) {
    double longest = 0;
    for (int i = 0; i < m->n; i++)
      if (!m->s[i].wait && m->s[i].seq == q && m->s[i].dur > longest) longest = m->s[i].dur;
    double x = left + (double)(q - first) * cw;
    if ((q - first) % 5 == 0)
      fprintf(svg, "<text x=\"%.1f\" y=\"%d\" fill=\"#666\">#%lld</text>\n", x, top2 + lh * m->nl + 16, q);
    for (int li = 0; li < m->nl && longest > 0; li++)
      for (int i = 0; i < m->n; i++) {
        const struct span* s = &m->s[i];
        if (s->wait || s->seq != q || s->pid != m->l[li].pid) continue;
        int y = top2 + li * lh;
        double h = 20.0 * s->dur / longest, wt = waited_in(m, s), hw = wt > s->dur ? h : 20.0 * wt / longest;
        fprintf(svg, "<rect x=\"%.2f\" y=\"%.2f\" width=\"%.2f\" height=\"%.2f\" fill=\"%s\"><title>rank lane %d, "
                     "%s #%lld: %.1f us, %.1f us waiting</title></rect>\n",
                x + 1, y + 22 - h, cw - 2, h, color_of(s->name), li, s->name, q, s->dur, wt);
        if (hw > 0.2)
          fprintf(svg, "<rect x=\"%.2f\" y=\"%.2f\" width=\"%.2f\" height=\"%.2f\" fill=\"#e15759\"/>\n", x + 1,
                  y + 22 - hw, cw - 2, hw);
      }
  }
  for (int li = 0; li < m->nl; li++)
    fprintf(svg, "<text x=\"10\" y=\"%d\">%s</text>\n", top2 + li * lh + 16, m->l[li].label);
  fprintf(svg, "</svg>\n");
}

int trace_main(int argc, char** argv) {
  const char* dir = argv[0];
  char out_json[4096], out_svg[4096];
  snprintf(out_json, sizeof(out_json), "%s", argc > 1 ? argv[1] : "");
  snprintf(out_svg, sizeof(out_svg), "%s", argc > 2 ? argv[2] : "");
  if (!out_json[0]) snprintf(out_json, sizeof(out_json), "%s/job.json", dir);
  if (!out_svg[0]) snprintf(out_svg, sizeof(out_svg), "%s/job.svg", dir);
  DIR* d = opendir(dir);
  if (!d) {
    fprintf(stderr, "chorus-info: cannot open %s\n", dir);
    return 2;
  }
  char** files = NULL;
  uint64_t* bases = NULL;
  int nf = 0;
  struct dirent* de;
  while ((de = readdir(d))) {
    size_t l = strlen(de->d_name);
    if (strncmp(de->d_name, "chorus-trace-", 13) || l < 6 || strcmp(de->d_name + l - 5, ".json")) continue;
    char** f2 = realloc(files, sizeof(char*) * (size_t)(nf + 1));
    uint64_t* b2 = realloc(bases, sizeof(uint64_t) * (size_t)(nf + 1));
    if (f2) files = f2;
    if (b2) bases = b2;
    if (!f2 || !b2) break;
    char path[4096];
    snprintf(path, sizeof(path), "%s/%s", dir, de->d_name);
    files[nf] = strdup(path);
    bases[nf] = 0;
    FILE* f = fopen(path, "r");
    char line[4096];
    while (f && fgets(line, sizeof(line), f) && !bases[nf]) {
      const char* b = strstr(line, "\"base_ns\":");
      if (b && strstr(line, "\"name\":\"chorus\"")) bases[nf] = strtoull(b + 10, NULL, 10);
    }
    if (f) fclose(f);
    if (files[nf] && bases[nf]) nf++;
    else fprintf(stderr, "chorus-info: %s is not a Chorus trace; skipped\n", path), free(files[nf]);
  }
  closedir(d);
  if (!nf) {
    printf("no Chorus traces (chorus-trace-*.json) in %s\n", dir);
    free(files), free(bases);
    return 1;
  }
  uint64_t base = bases[0];
  for (int i = 1; i < nf; i++) base = bases[i] < base ? bases[i] : base;
  /* Output names often point into a shared /tmp: created as the library's files are (misc/safefile.h). */
  struct sf_file oj, os;
  char why[256];
  if (sf_open_path(&oj, out_json, why, sizeof(why)) != 0) {
    fprintf(stderr, "chorus-info: cannot write %s: %s\n", out_json, why);
    for (int i = 0; i < nf; i++) free(files[i]);
    free(files), free(bases);
    return 2;
  }
  FILE* out = oj.f;
  struct merge m = {0};
  int first = 1;
  fprintf(out, "{\"displayTimeUnit\":\"ns\",\"otherData\":{\"chorus_base_ns\":%" PRIu64 "},\"traceEvents\":[\n", base);
  for (int i = 0; i < nf; i++) merge_file(files[i], (double)(bases[i] - base) / 1e3, out, &first, &m);
  fprintf(out, "\n]}\n");
  int bad = sf_commit(&oj) != 0;
  FILE* svg = sf_open_path(&os, out_svg, why, sizeof(why)) == 0 ? os.f : NULL;
  if (svg) {
    draw(&m, svg);
    bad |= sf_commit(&os) != 0;
  } else {
    fprintf(stderr, "chorus-info: cannot write %s: %s\n", out_svg, why);
  }
  printf("merged %d trace file(s) into %s (open it in https://ui.perfetto.dev or chrome://tracing); picture: %s\n",
         nf, out_json, svg ? out_svg : "(not written)");
  for (int i = 0; i < nf; i++) free(files[i]);
  free(files), free(bases), free(m.s), free(m.l);
  return bad || !svg ? 1 : 0;
}
