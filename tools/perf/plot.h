/* Minimal SVG line charts: bus bandwidth and time against message size, log scales on both axes,
 * one line per series, ticks labelled with K/M/G. Used by --plot and by chorus-plot. */
#ifndef CHORUS_PLOT_H
#define CHORUS_PLOT_H

typedef struct plot_series {
  char label[160];
  int n;
  double* size;  /* bytes */
  double* busbw; /* GB/s; a value <= 0 is not drawn */
  double* time;  /* microseconds; a value <= 0 is not drawn */
  int dashed;    /* in-place results: same color as their out-of-place line, dashed */
  int color;     /* palette index; -1 picks one by position */
} plot_series;

/* Writes the chart to path. Returns 0, or -1 with errno set. */
int plot_svg(const char* path, const char* title, const plot_series* s, int ns);

/* Append a point, growing the arrays. Returns -1 when out of memory. */
int plot_add(plot_series* s, double size, double busbw, double time_us);
void plot_free(plot_series* s);

#endif
