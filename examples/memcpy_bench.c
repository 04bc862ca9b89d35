/* The reference the performance targets are stated against: one core's memcpy of a buffer of the
 * given size (default 64 MiB), best of several runs, in GB/s (1e9 bytes per second). Then the same
 * copy from and to another process by cross-memory attach (process_vm_readv/writev, 128 KiB per call as
 * Direct's CHORUS_CMA=1 path makes them): the kernel's copy, which decides whether that path beats the
 * FIFOs on this machine (docs/PERFORMANCE.md).
 *   build/bin/memcpy_bench [bytes] [runs] */
#define _GNU_SOURCE /* process_vm_readv */
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/uio.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static double now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

/* Best time of runs copies of bytes between here and the same address in pid, 128 KiB per call. */
static double cma_best(pid_t pid, char* here, char* there, size_t bytes, int runs, int write) {
  const size_t blk = 128u << 10;
  double best = 1e30;
  for (int i = 0; i < runs; i++) {
    double t0 = now();
    for (size_t o = 0; o < bytes; o += blk) {
      size_t m = bytes - o < blk ? bytes - o : blk;
      struct iovec l = {here + o, m}, r = {there + o, m};
      if ((write ? process_vm_writev(pid, &l, 1, &r, 1, 0) : process_vm_readv(pid, &l, 1, &r, 1, 0)) != (ssize_t)m)
        return -errno;
    }
    double t = now() - t0;
    if (t < best) best = t;
  }
  return best;
}

int main(int argc, char** argv) {
  size_t bytes = argc > 1 ? strtoull(argv[1], NULL, 0) : (size_t)64 << 20;
  int runs = argc > 2 ? atoi(argv[2]) : 10;
  char *a = malloc(bytes), *b = malloc(bytes);
  if (!a || !b || runs < 1) {
    fprintf(stderr, "usage: memcpy_bench [bytes] [runs]\n");
    return 1;
  }
  memset(a, 1, bytes);
  memset(b, 2, bytes); /* both touched: no page faults in the timed copies */
  double best = 1e30;
  for (int i = 0; i < runs; i++) {
    double t0 = now();
    memcpy(b, a, bytes);
    double t = now() - t0;
    if (t < best) best = t;
    a[i % bytes] = b[(i * 7) % bytes]; /* keep the copy observable */
  }
  printf("memcpy %zu bytes: %.2f GB/s (best of %d: %.1f us)\n", bytes, (double)bytes / best / 1e9, runs, best * 1e6);
  pid_t child = fork(); /* a's pages are the child's own once it writes them */
  if (child == 0) {
    memset(a, 3, bytes);
    pause();
    _exit(0);
  }
  usleep(200000);
  for (int write = 0; child > 0 && write < 2; write++) {
    double t = cma_best(child, b, a, bytes, runs, write);
    if (t < 0) printf("process_vm_%s: %s\n", write ? "writev" : "readv", strerror((int)-t));
    else
      printf("process_vm_%s %zu bytes: %.2f GB/s (best of %d; %.0f%% of memcpy)\n", write ? "writev" : "readv", bytes,
             (double)bytes / t / 1e9, runs, 100 * best / t);
  }
  if (child > 0) {
    kill(child, SIGKILL);
    waitpid(child, NULL, 0);
  }
  free(a);
  free(b);
  return 0;
}
