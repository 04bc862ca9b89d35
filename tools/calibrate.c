/* chorus-info --calibrate: measure the cost model's constants on this machine and write them in
 * CHORUS_TUNE_FILE's format. Two ranks (processes, as a job runs them) time a one-hop AllReduce
 * (NCCL_ALGO=Exchange) per protocol, small (the hop's latency) and large (its bandwidth), over shared
 * memory and then over the network transport on loopback. The model (tune/choose.c) prices a one-hop
 * AllReduce of b bytes at step_us + 2 b / (copy_bw x proto_eff), and over the network at
 * net_step_us + b / net_bw: copy_bw is fitted so that the fastest protocol has proto_eff 1 (the rate
 * at which a rank moves data through a FIFO, which a plain memcpy of one core does not predict). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "nccl.h"
#include "../src/tune/tune.h"
#include "../src/misc/param.h"
#include "../src/misc/safefile.h"
#include "../src/misc/utils.h"
#include "calibrate.h"

static double now_us(void) { return (double)ut_now_ns() / 1e3; }

struct job {
  ncclUniqueId id;
  size_t bytes;
  int iters;
};

/* One rank (a child process): time the calls, write "result us" to fd. Rank 0 makes the unique id
 * and hands it to rank 1 through id_fd, so this (parent) process never starts a thread: a fork of a
 * process with threads may copy a lock some thread holds. */
static void rank_main(struct job* j, int rank, int id_fd, int fd) {
  param_reset(); /* the environment the parent set for this configuration */
  ncclComm_t comm;
  size_t count = j->bytes / sizeof(float);
  float* buf = calloc(count ? count : 1, sizeof(float));
  double us = -1;
  ncclResult_t r = buf ? ncclSuccess : ncclSystemError;
  if (r == ncclSuccess && rank == 0) {
    r = ncclGetUniqueId(&j->id);
    if (write(id_fd, &j->id, sizeof(j->id)) != (ssize_t)sizeof(j->id)) r = ncclSystemError;
  } else if (r == ncclSuccess && read(id_fd, &j->id, sizeof(j->id)) != (ssize_t)sizeof(j->id)) {
    r = ncclSystemError;
  }
  if (r == ncclSuccess) r = ncclCommInitRank(&comm, 2, j->id, rank);
  if (r == ncclSuccess) {
    for (int i = 0; i < 5 && r == ncclSuccess; i++) r = ncclAllReduce(buf, buf, count, ncclFloat, ncclSum, comm, NULL);
    double t0 = now_us();
    for (int i = 0; i < j->iters && r == ncclSuccess; i++)
      r = ncclAllReduce(buf, buf, count, ncclFloat, ncclSum, comm, NULL);
    us = (now_us() - t0) / j->iters;
    ncclCommDestroy(comm);
  }
  double out[2] = {(double)r, us};
  ssize_t w = write(fd, out, sizeof(out));
  (void)w;
  free(buf);
}

/* One configuration: the environment for the ranks, then 2 processes (as a job runs) timing `bytes`.
 * The best of three runs (the least disturbed by other work on the machine). Returns -1 on failure. */
static double measure(const char* algo, const char* proto, int net, size_t bytes, int iters) {
  setenv("NCCL_ALGO", algo, 1);
  setenv("NCCL_PROTO", proto, 1);
  setenv("NCCL_SHM_DISABLE", net ? "1" : "0", 1);
  setenv("CHORUS_EXCHANGE_MAX_BYTES", "1073741824", 1);
  unsetenv("CHORUS_TUNE_FILE");
  double best = -1;
  for (int run = 0; run < 3; run++) {
    struct job j = {.bytes = bytes, .iters = iters};
    int fds[2][2], idp[2];
    pid_t pid[2] = {-1, -1};
    if (pipe(idp) != 0) return -1;
    double worst = 0;
    int ok = 1;
    for (int r = 0; r < 2; r++) {
      if (pipe(fds[r]) != 0) return -1;
      fflush(stdout);
      pid[r] = fork();
      if (pid[r] == 0) {
        close(fds[r][0]);
        rank_main(&j, r, r == 0 ? idp[1] : idp[0], fds[r][1]);
        _exit(0);
      }
      close(fds[r][1]);
    }
    close(idp[0]), close(idp[1]); /* a rank that dies leaves its peer an EOF, not a hang */
    for (int r = 0; r < 2; r++) {
      double in[2] = {-1, -1};
      ok &= pid[r] > 0 && read(fds[r][0], in, sizeof(in)) == (ssize_t)sizeof(in) && in[0] == 0 && in[1] > 0;
      if (in[1] > worst) worst = in[1];
      close(fds[r][0]);
      if (pid[r] > 0) waitpid(pid[r], NULL, 0);
    }
    if (!ok) return -1;
    if (best < 0 || worst < best) best = worst;
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
  if (strlen(path) > 255) { /* the library refuses longer CHORUS_TUNE_FILE values: say so before measuring */
    fprintf(stderr, "chorus-info --calibrate: %s is longer than 255 characters: CHORUS_TUNE_FILE could not name it\n",
            path);
    return 1;
  }
  const char* pn[CH_NPROTO];
  for (int p = 0; p < CH_NPROTO; p++) pn[p] = ch_proto_name(p);
  char exchange[64]; /* NCCL_ALGO: one hop, whatever the size */
  snprintf(exchange, sizeof(exchange), "%s:%s", ch_func_name(FUNC_ALLREDUCE), ch_algo_name(ALGO_EXCHANGE));
  struct tune_model m = *tune_model_defaults();
  const size_t small = 8, large = 1u << 20, net_large = 4u << 20;
  printf("chorus-info --calibrate: 2 ranks, one-hop AllReduce (Exchange), best of 3 runs each\n");
  double ts[CH_NPROTO], tl[CH_NPROTO], best = 0;
  for (int p = 0; p < CH_NPROTO; p++) {
    ts[p] = measure(exchange, pn[p], 0, small, 5000);
    tl[p] = measure(exchange, pn[p], 0, large, 100);
    if (ts[p] < 0 || tl[p] <= ts[p]) return fprintf(stderr, "calibrate: %s over shared memory failed\n", pn[p]), 1;
    double rate = 2.0 * (double)large / (tl[p] - ts[p]);
    if (rate > best) best = rate;
  }
  m.copy_bw = best;
  printf("  memcpy, one core, 64 MiB: %.0f MB/s (for comparison); FIFO rate of the fastest protocol: %.0f MB/s\n",
         memcpy_bw(), best);
  for (int p = 0; p < CH_NPROTO; p++) {
    m.step_us[p] = ts[p];
    m.proto_eff[p] = 2.0 * (double)large / (tl[p] - ts[p]) / best;
    printf("  %-6s 8 B %.2f us, 1 MiB %.1f us -> step_us.%s = %.3g, proto_eff.%s = %.3g\n", pn[p], ts[p], tl[p],
           pn[p], m.step_us[p], pn[p], m.proto_eff[p]);
  }
  double ns = measure(exchange, pn[PROTO_SIMPLE], 1, small, 500);
  double nl = measure(exchange, pn[PROTO_SIMPLE], 1, net_large, 10);
  if (ns > 0 && nl > ns) {
    m.net_step_us = ns;
    m.net_bw = (double)net_large / (nl - ns);
    printf("  network (loopback TCP) 8 B %.1f us, 4 MiB %.0f us -> net_step_us = %.3g, net_bw = %.0f\n", ns, nl,
           m.net_step_us, m.net_bw);
  } else {
    printf("  network transport not measured (no usable interface?): defaults kept\n");
  }
  /* Checked like the library's own files (misc/safefile.h): the name may be in a shared /tmp. */
  struct sf_file out;
  char why[256];
  if (sf_open_path(&out, path, why, sizeof(why)) != 0)
    return fprintf(stderr, "chorus-info: cannot write %s: %s\n", path, why), 1;
  FILE* f = out.f;
  time_t now = time(NULL);
  char when[64];
  strftime(when, sizeof(when), "%Y-%m-%d %H:%M:%S UTC", gmtime(&now));
  fprintf(f, "# Chorus cost model constants, measured by chorus-info --calibrate on %s\n", when);
  fprintf(f, "# Use: export CHORUS_TUNE_FILE=%s (every rank of a job must use the same values)\n", path);
  tune_model_write(f, &m);
  if (sf_commit(&out) != 0) return perror(path), 1;
  printf("wrote %s; export CHORUS_TUNE_FILE=%s to use it\n", path, path);
  return 0;
}
