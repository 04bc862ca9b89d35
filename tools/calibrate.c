/* chorus-info --calibrate: measure the cost model's constants on this machine and write them in
 * CHORUS_TUNE_FILE's format. Two ranks (threads of this process, talking through the same FIFOs and
 * transports processes use: NCCL_P2P_DISABLE=1) time a one-hop AllReduce (NCCL_ALGO=Exchange) per
 * protocol, small (the hop's latency) and large (its bandwidth); then over the network transport on
 * loopback; and one core's memcpy. The model (core/tuning.c) prices a one-hop AllReduce of b bytes at
 * step_us + 2 b / (copy_bw x proto_eff), and over the network at net_step_us + b / net_bw. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "nccl.h"
#include "../src/core/tune.h"
#include "../src/misc/param.h"
#include "calibrate.h"

static double now_us(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec * 1e6 + ts.tv_nsec / 1e3;
}

struct job {
  ncclUniqueId id;
  size_t bytes;
  int iters;
  double us[2]; /* per call, per rank */
  ncclResult_t res[2];
};
struct rank_arg {
  struct job* job;
  int rank;
};

static void* rank_main(void* p) {
  struct rank_arg* a = p;
  struct job* j = a->job;
  ncclComm_t comm;
  size_t count = j->bytes / sizeof(float);
  float* buf = calloc(count ? count : 1, sizeof(float));
  ncclResult_t r = buf ? ncclCommInitRank(&comm, 2, j->id, a->rank) : ncclSystemError;
  if (r == ncclSuccess) {
    for (int i = 0; i < 5 && r == ncclSuccess; i++) r = ncclAllReduce(buf, buf, count, ncclFloat, ncclSum, comm, NULL);
    double t0 = now_us();
    for (int i = 0; i < j->iters && r == ncclSuccess; i++)
      r = ncclAllReduce(buf, buf, count, ncclFloat, ncclSum, comm, NULL);
    j->us[a->rank] = (now_us() - t0) / j->iters;
    ncclCommDestroy(comm);
  }
  j->res[a->rank] = r;
  free(buf);
  return NULL;
}

/* One configuration: the environment for new communicators, then 2 ranks timing `bytes`. The best of
 * three runs (the least disturbed by other work on the machine). Returns -1 on failure. */
static double measure(const char* algo, const char* proto, int net, size_t bytes, int iters) {
  setenv("NCCL_ALGO", algo, 1);
  setenv("NCCL_PROTO", proto, 1);
  setenv("NCCL_P2P_DISABLE", "1", 1);
  setenv("NCCL_SHM_DISABLE", net ? "1" : "0", 1);
  setenv("CHORUS_EXCHANGE_MAX_BYTES", "1073741824", 1);
  unsetenv("CHORUS_TUNE_FILE");
  param_reset();
  double best = -1;
  for (int run = 0; run < 3; run++) {
    struct job j = {.bytes = bytes, .iters = iters};
    if (ncclGetUniqueId(&j.id) != ncclSuccess) return -1;
    pthread_t t[2];
    struct rank_arg a[2] = {{&j, 0}, {&j, 1}};
    for (int r = 0; r < 2; r++) pthread_create(&t[r], NULL, rank_main, &a[r]);
    for (int r = 0; r < 2; r++) pthread_join(t[r], NULL);
    if (j.res[0] != ncclSuccess || j.res[1] != ncclSuccess) return -1;
    double us = j.us[0] > j.us[1] ? j.us[0] : j.us[1];
    if (best < 0 || us < best) best = us;
  }
  return best;
}

static double memcpy_bw(void) {
  size_t n = 64u << 20;
  char *a = malloc(n), *b = malloc(n);
  if (!a || !b) return free(a), free(b), -1;
  memset(a, 1, n), memset(b, 2, n);
  double best = -1;
  for (int i = 0; i < 5; i++) {
    double t0 = now_us();
    memcpy(b, a, n);
    double bw = (double)n / (now_us() - t0);
    if (bw > best) best = bw;
  }
  free(a), free(b);
  return best;
}

int calibrate_main(const char* path) {
  static const char* pn[CH_NPROTO] = {"LL", "LL128", "Simple"};
  struct tune_model m = *tune_model_defaults();
  const size_t small = 8, large = 1u << 20, net_large = 4u << 20;
  printf("chorus-info --calibrate: 2 ranks, one-hop AllReduce (Exchange), best of 3 runs each\n");
  double bw = memcpy_bw();
  if (bw <= 0) return fprintf(stderr, "calibrate: out of memory\n"), 1;
  m.copy_bw = bw;
  printf("  memcpy, one core, 64 MiB: %.0f MB/s -> copy_bw = %.0f\n", bw, bw);
  for (int p = 0; p < CH_NPROTO; p++) {
    double ts = measure("allreduce:Exchange", pn[p], 0, small, 5000);
    double tl = measure("allreduce:Exchange", pn[p], 0, large, 100);
    if (ts < 0 || tl < 0) return fprintf(stderr, "calibrate: %s over shared memory failed\n", pn[p]), 1;
    m.step_us[p] = ts;
    double eff = 2.0 * (double)large / (m.copy_bw * (tl > ts ? tl - ts : tl));
    m.proto_eff[p] = eff > 1 ? 1 : eff;
    printf("  %-6s 8 B %.2f us, 1 MiB %.1f us -> step_us.%s = %.3g, proto_eff.%s = %.3g\n", pn[p], ts, tl, pn[p],
           m.step_us[p], pn[p], m.proto_eff[p]);
  }
  double ns = measure("allreduce:Exchange", "Simple", 1, small, 500);
  double nl = measure("allreduce:Exchange", "Simple", 1, net_large, 10);
  if (ns > 0 && nl > ns) {
    m.net_step_us = ns;
    m.net_bw = (double)net_large / (nl - ns);
    printf("  network (loopback TCP) 8 B %.1f us, 4 MiB %.0f us -> net_step_us = %.3g, net_bw = %.0f\n", ns, nl,
           m.net_step_us, m.net_bw);
  } else {
    printf("  network transport not measured (no usable interface?): defaults kept\n");
  }
  FILE* f = fopen(path, "w");
  if (!f) return perror(path), 1;
  time_t now = time(NULL);
  char when[64];
  strftime(when, sizeof(when), "%Y-%m-%d %H:%M:%S UTC", gmtime(&now));
  fprintf(f, "# Chorus cost model constants, measured by chorus-info --calibrate on %s\n", when);
  fprintf(f, "# Use: export CHORUS_TUNE_FILE=%s (every rank of a job must use the same values)\n", path);
  tune_model_write(f, &m);
  if (fclose(f) != 0) return perror(path), 1;
  printf("wrote %s; export CHORUS_TUNE_FILE=%s to use it\n", path, path);
  return 0;
}
