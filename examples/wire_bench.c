/* What each wire format's conversion costs on one core (docs/WIRE.md, "Measured"): encode and decode of a
 * float32 buffer (default 4 MiB), best of several runs, in GB/s of float32 data. Built with the library's
 * own objects and flags, as the data path runs them (src/reduce/wire.c).
 *   build/bin/wire_bench [bytes] [runs] */
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "nccl.h"
#include "reduce/wire.h"

static double now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

int main(int argc, char** argv) {
  size_t bytes = argc > 1 ? strtoull(argv[1], NULL, 0) : 4u << 20, n = bytes / sizeof(float);
  int runs = argc > 2 ? atoi(argv[2]) : 20;
  float *x = malloc(n * sizeof(float)), *y = malloc(n * sizeof(float));
  unsigned char* w = malloc(n * sizeof(float));
  if (!n || runs < 1 || !x || !y || !w) {
    fprintf(stderr, "usage: wire_bench [bytes >= 4] [runs >= 1]\n");
    return 2;
  }
  for (size_t i = 0; i < n; i++) x[i] = (float)((i * 2654435761u) % 100000) / 977.0f - 50.0f; /* mixed magnitudes */
  printf("# %zu bytes of float32, best of %d runs, GB/s of float32 data\n# format     encode   decode\n", bytes, runs);
  for (int f = WIRE_BF16; f < WIRE_COUNT; f++) {
    double te = 1e30, td = 1e30;
    for (int r = 0; r < runs; r++) {
      double t0 = now();
      wire_encode(f, ncclFloat32, w, x, n);
      double t1 = now();
      wire_decode(f, ncclFloat32, y, w, n);
      double t2 = now();
      te = t1 - t0 < te ? t1 - t0 : te;
      td = t2 - t1 < td ? t2 - t1 : td;
    }
    printf("  %-9s %7.2f  %7.2f\n", wire_name(f), (double)bytes / te / 1e9, (double)bytes / td / 1e9);
  }
  free(x), free(y), free(w);
  return 0;
}
