/* SVG charts for the benchmarks: two panels side by side (bus bandwidth, time) against message
 * size, both on log-log axes, with a legend under them. Plain SVG 1.1, no scripts or fonts. */
#include "plot.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The one implementation of safe output files (misc/safefile.c, built into these tools by
 * tools/CMakeLists.txt: they link only the public library, which does not export it). */
#include "../../src/misc/safefile.h"

#define W 1140
#define PW 460 /* panel plot area */
#define PH 340
#define TOP 70
#define LEFT0 85
#define LEFT1 (LEFT0 + PW + 105)

static const char* const palette[] = {"#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd",
                                      "#8c564b", "#e377c2", "#17becf", "#7f7f7f", "#bcbd22"};
#define NCOLORS (int)(sizeof(palette) / sizeof(palette[0]))

static const char* color_of(const plot_series* s, int k) {
  int c = s[k].color >= 0 ? s[k].color : k;
  return palette[c % NCOLORS];
}

int plot_add(plot_series* s, double size, double busbw, double time_us) {
  if ((s->n & (s->n - 1)) == 0) { /* grow at 0, 1, 2, 4, 8, ... */
    size_t cap = s->n ? (size_t)s->n * 2 : 8;
    double* a = realloc(s->size, cap * sizeof(double));
    if (a) s->size = a;
    double* b = realloc(s->busbw, cap * sizeof(double));
    if (b) s->busbw = b;
    double* c = realloc(s->time, cap * sizeof(double));
    if (c) s->time = c;
    if (!a || !b || !c) return -1;
  }
  s->size[s->n] = size;
  s->busbw[s->n] = busbw;
  s->time[s->n] = time_us;
  s->n++;
  return 0;
}

void plot_free(plot_series* s) {
  free(s->size);
  free(s->busbw);
  free(s->time);
  s->size = s->busbw = s->time = NULL;
  s->n = 0;
}

static void esc(FILE* f, const char* s) {
  for (; *s; s++) {
    if (*s == '&') fputs("&amp;", f);
    else if (*s == '<') fputs("&lt;", f);
    else if (*s == '>') fputs("&gt;", f);
    else if (*s == '"') fputs("&quot;", f);
    else fputc(*s, f);
  }
}

/* 1536 -> "1.5K", 1048576 -> "1M"; binary units for sizes, decimal for the y axes. */
static void label_num(double v, int binary, char* out, size_t n) {
  const double k = binary ? 1024.0 : 1000.0;
  const char* suf[] = {"", "K", "M", "G", "T", "P"};
  int i = 0;
  while (fabs(v) >= k && i < 5) v /= k, i++;
  if (v == floor(v)) snprintf(out, n, "%.0f%s", v, suf[i]);
  else snprintf(out, n, "%.3g%s", v, suf[i]);
}

struct axis {
  double lo, hi; /* log10 of the ends */
};

static double xpos(const struct axis* a, double v, int left) {
  return left + (log10(v) - a->lo) / (a->hi - a->lo) * PW;
}
static double ypos(const struct axis* a, double v) { return TOP + PH - (log10(v) - a->lo) / (a->hi - a->lo) * PH; }

/* Range of the positive values of one field over all series, widened to whole units. */
static int data_range(const plot_series* s, int ns, int field, double* lo, double* hi) {
  *lo = INFINITY, *hi = -INFINITY;
  for (int k = 0; k < ns; k++)
    for (int i = 0; i < s[k].n; i++) {
      double v = field == 0 ? s[k].size[i] : field == 1 ? s[k].busbw[i] : s[k].time[i];
      double x = s[k].size[i];
      if (!(v > 0) || !(x > 0) || !isfinite(v)) continue;
      if (v < *lo) *lo = v;
      if (v > *hi) *hi = v;
    }
  return *lo <= *hi;
}

static void x_axis(FILE* f, const struct axis* xa, int left) {
  /* Ticks on powers of two, at most about 8 of them. */
  int e0 = (int)floor(xa->lo / log10(2.0) + 1e-9), e1 = (int)ceil(xa->hi / log10(2.0) - 1e-9);
  int step = (e1 - e0 + 7) / 8;
  if (step < 1) step = 1;
  for (int e = e0; e <= e1; e++) {
    double v = ldexp(1.0, e);
    double x = xpos(xa, v, left);
    if (x < left - 0.5 || x > left + PW + 0.5) continue;
    int major = (e - e0) % step == 0;
    fprintf(f, "<line x1='%.1f' y1='%d' x2='%.1f' y2='%d' stroke='%s'/>\n", x, TOP, x, TOP + PH,
            major ? "#d0d0d0" : "#eeeeee");
    if (!major) continue;
    char lab[32];
    label_num(v, 1, lab, sizeof lab);
    fprintf(f, "<line x1='%.1f' y1='%d' x2='%.1f' y2='%d' stroke='black'/>\n", x, TOP + PH, x, TOP + PH + 5);
    fprintf(f, "<text x='%.1f' y='%d' text-anchor='middle'>%s</text>\n", x, TOP + PH + 19, lab);
  }
  fprintf(f, "<text x='%d' y='%d' text-anchor='middle'>message size (bytes)</text>\n", left + PW / 2, TOP + PH + 40);
}

static void y_axis(FILE* f, const struct axis* ya, int left, const char* title) {
  int d0 = (int)floor(ya->lo + 1e-9), d1 = (int)ceil(ya->hi - 1e-9);
  for (int d = d0; d <= d1; d++) {
    for (int m = 1; m <= 9; m++) {
      double v = m * pow(10.0, d);
      double y = ypos(ya, v);
      if (y < TOP - 0.5 || y > TOP + PH + 0.5) continue;
      fprintf(f, "<line x1='%d' y1='%.1f' x2='%d' y2='%.1f' stroke='%s'/>\n", left, y, left + PW, y,
              m == 1 ? "#d0d0d0" : "#f0f0f0");
      if (m != 1) continue;
      char lab[32];
      if (d < 0) snprintf(lab, sizeof lab, "%.*f", -d, v);
      else label_num(v, 0, lab, sizeof lab);
      fprintf(f, "<line x1='%d' y1='%.1f' x2='%d' y2='%.1f' stroke='black'/>\n", left - 5, y, left, y);
      fprintf(f, "<text x='%d' y='%.1f' text-anchor='end'>%s</text>\n", left - 8, y + 4, lab);
    }
  }
  fprintf(f, "<text transform='translate(%d,%d) rotate(-90)' text-anchor='middle'>%s</text>\n", left - 58,
          TOP + PH / 2, title);
}

static void panel(FILE* f, const plot_series* s, int ns, int field, int left, const char* title,
                  const struct axis* xa) {
  double lo, hi;
  fprintf(f, "<text x='%d' y='%d' text-anchor='middle' font-weight='bold'>%s</text>\n", left + PW / 2, TOP - 10,
          title);
  if (!data_range(s, ns, field, &lo, &hi) || !xa) {
    fprintf(f, "<rect x='%d' y='%d' width='%d' height='%d' fill='none' stroke='black'/>\n", left, TOP, PW, PH);
    fprintf(f, "<text x='%d' y='%d' text-anchor='middle'>no data</text>\n", left + PW / 2, TOP + PH / 2);
    return;
  }
  struct axis ya = {floor(log10(lo)), ceil(log10(hi))};
  if (ya.hi - ya.lo < 1) ya.hi = ya.lo + 1;
  x_axis(f, xa, left);
  y_axis(f, &ya, left, field == 1 ? "bus bandwidth (GB/s)" : "time (\xc2\xb5s)");
  fprintf(f, "<rect x='%d' y='%d' width='%d' height='%d' fill='none' stroke='black'/>\n", left, TOP, PW, PH);
  for (int k = 0; k < ns; k++) {
    const char* col = color_of(s, k);
    const double* v = field == 1 ? s[k].busbw : s[k].time;
    fprintf(f, "<polyline fill='none' stroke='%s' stroke-width='2'%s points='", col,
            s[k].dashed ? " stroke-dasharray='6,4'" : "");
    for (int i = 0; i < s[k].n; i++)
      if (v[i] > 0 && s[k].size[i] > 0 && isfinite(v[i]))
        fprintf(f, "%.1f,%.1f ", xpos(xa, s[k].size[i], left), ypos(&ya, v[i]));
    fprintf(f, "'/>\n");
    for (int i = 0; i < s[k].n; i++)
      if (v[i] > 0 && s[k].size[i] > 0 && isfinite(v[i]))
        fprintf(f, "<circle cx='%.1f' cy='%.1f' r='2.5' fill='%s'/>\n", xpos(xa, s[k].size[i], left), ypos(&ya, v[i]),
                col);
  }
}

int plot_svg(const char* path, const char* title, const plot_series* s, int ns) {
  int rows = (ns + 1) / 2;
  int h = TOP + PH + 60 + rows * 20 + 20;
  struct sf_file out;
  char why[256];
  if (sf_open_path(&out, path, why, sizeof(why)) != 0) return -1;
  FILE* f = out.f;
  fprintf(f, "<?xml version='1.0' encoding='UTF-8'?>\n");
  fprintf(f, "<svg xmlns='http://www.w3.org/2000/svg' width='%d' height='%d' viewBox='0 0 %d %d' "
             "font-family='Helvetica, Arial, sans-serif' font-size='12'>\n", W, h, W, h);
  fprintf(f, "<rect width='100%%' height='100%%' fill='white'/>\n");
  fprintf(f, "<text x='%d' y='28' text-anchor='middle' font-size='17' font-weight='bold'>", W / 2);
  esc(f, title ? title : "");
  fprintf(f, "</text>\n");
  double lo, hi;
  struct axis xa, *xp = NULL;
  if (data_range(s, ns, 0, &lo, &hi)) {
    xa.lo = floor(log10(lo) / log10(2.0)) * log10(2.0);
    xa.hi = ceil(log10(hi) / log10(2.0)) * log10(2.0);
    if (xa.hi - xa.lo < log10(2.0)) xa.hi = xa.lo + log10(2.0);
    xp = &xa;
  }
  panel(f, s, ns, 1, LEFT0, "Bus bandwidth (higher is better)", xp);
  panel(f, s, ns, 2, LEFT1, "Time per operation (lower is better)", xp);
  /* Legend: two columns under the panels. */
  int ly = TOP + PH + 62;
  for (int k = 0; k < ns; k++) {
    int x = 60 + (k % 2) * (W / 2), y = ly + (k / 2) * 20;
    fprintf(f, "<line x1='%d' y1='%d' x2='%d' y2='%d' stroke='%s' stroke-width='3'%s/>\n", x, y - 4, x + 30, y - 4,
            color_of(s, k), s[k].dashed ? " stroke-dasharray='6,4'" : "");
    fprintf(f, "<text x='%d' y='%d'>", x + 38, y);
    esc(f, s[k].label);
    fprintf(f, "</text>\n");
  }
  fprintf(f, "</svg>\n");
  return sf_commit(&out); /* -1 with errno set on a write error: the partial file is removed */
}
