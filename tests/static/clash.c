/* A program that links libchorus.a and defines functions under the names of the library's internal
 * ones, with signatures of its own. The static library exports only the API, so this must link (no
 * duplicate symbols), the program's calls must reach its own functions and the library's calls its own
 * (an AllReduce over 2 ranks driven from this thread, on host memory, NULL stream). */
#include <stdio.h>
#include <stdlib.h>

#include "nccl.h"

/* The library has functions of these names (src/core, src/util, ...): these are the program's. */
__attribute__((noinline)) int plan_build(void) { return 42; }
__attribute__((noinline)) const char* log_init(int x) { return x == 7 ? "mine" : "?"; }
__attribute__((noinline)) double stream_create(double a, double b) { return a * b; }
__attribute__((noinline)) unsigned sha256_init(unsigned v) { return v ^ 0x5a5a5a5au; }

#define CHECK(cmd)                                                                                   \
  do {                                                                                               \
    ncclResult_t r_ = (cmd);                                                                         \
    if (r_ != ncclSuccess) {                                                                         \
      fprintf(stderr, "%s failed: %s (%s)\n", #cmd, ncclGetErrorString(r_), ncclGetLastError(NULL)); \
      return 1;                                                                                      \
    }                                                                                                \
  } while (0)

enum { NRANKS = 2, COUNT = 100003 };

int main(void) {
  int bad = 0;
  if (plan_build() != 42) bad = fprintf(stderr, "plan_build: not the program's\n");
  if (log_init(7)[0] != 'm') bad = fprintf(stderr, "log_init: not the program's\n");
  if (stream_create(1.5, 4.0) != 6.0) bad = fprintf(stderr, "stream_create: not the program's\n");
  if (sha256_init(0x5a5a5a5au) != 0) bad = fprintf(stderr, "sha256_init: not the program's\n");

  ncclComm_t comms[NRANKS];
  CHECK(ncclCommInitAll(comms, NRANKS, NULL));
  double* buf[NRANKS];
  for (int r = 0; r < NRANKS; r++) {
    buf[r] = malloc(COUNT * sizeof(double));
    if (!buf[r]) return 1;
    for (size_t i = 0; i < COUNT; i++) buf[r][i] = (double)(r + 1) * (double)i; /* rank r: (r+1)*i */
  }
  /* One thread drives both ranks: a group, so neither call waits for the other. */
  CHECK(ncclGroupStart());
  for (int r = 0; r < NRANKS; r++) CHECK(ncclAllReduce(buf[r], buf[r], COUNT, ncclFloat64, ncclSum, comms[r], NULL));
  CHECK(ncclGroupEnd());
  /* sum over r of (r+1)*i = i * NRANKS*(NRANKS+1)/2, exact in double */
  for (int r = 0; r < NRANKS; r++) {
    for (size_t i = 0; i < COUNT; i++) {
      double expect = (double)i * (NRANKS * (NRANKS + 1) / 2);
      if (buf[r][i] != expect) {
        fprintf(stderr, "rank %d: buf[%zu] = %g, expected %g\n", r, i, buf[r][i], expect);
        bad = 1;
        break;
      }
    }
    CHECK(ncclCommDestroy(comms[r]));
    free(buf[r]);
  }
  /* Again after the library ran: still the program's own. */
  if (plan_build() != 42 || log_init(7)[0] != 'm' || stream_create(2.0, 2.0) != 4.0 || sha256_init(1) != 0x5a5a5a5bu)
    bad = fprintf(stderr, "the program's functions changed\n");
  if (bad) return 1;
  printf("static_link_clash: AllReduce over %d ranks of %d doubles correct; plan_build/log_init/stream_create/"
         "sha256_init are the program's\n", NRANKS, COUNT);
  return 0;
}
