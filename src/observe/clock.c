/* One time base for a job's dumps and traces: rank 0's realtime clock. Ranks of one host read the same
 * kernel clock, so only hosts differ; each host's first rank measures its offset from rank 0 at init
 * as NTP does (send our time, get rank 0's, keep the exchange with the shortest round trip: the error is
 * at most half of it), then the offsets are shared with an allgather. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "../misc/log.h"
#include "../misc/param.h"
#include "../misc/utils.h"
#include "observe.h"

#define CLOCK_TAG ((1 << 29) + (1 << 28)) /* bootstrap tag of the exchanges (split.c uses 1 << 29 up) */
#define CLOCK_ROUNDS 5
#define CLOCK_MAX_OFFSET_NS (86400ll * (long long)UT_NS_PER_S)

/* This process's realtime clock in ns, plus CHORUS_CLOCK_SKEW_US (a testing aid that makes a host's
 * clock look wrong, so that the alignment can be seen to remove it). */
static uint64_t obs_real_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  return (uint64_t)ts.tv_sec * UT_NS_PER_S + (uint64_t)ts.tv_nsec +
         (uint64_t)(param_int(PARAM_CLOCK_SKEW_US) * (int64_t)UT_NS_PER_US);
}

int obs_tsc;
static uint64_t tsc0, mono0; /* a tick and a CLOCK_MONOTONIC time read together at obs_ticks_init */
static pthread_once_t ticks_once = PTHREAD_ONCE_INIT;

/* The TSC counts at one rate on every core, whatever the frequency and sleep states, only where the
 * CPU says so; elsewhere (or other architectures) ticks are ns. */
static void ticks_init(void) {
#if defined(__x86_64__)
  FILE* f = fopen("/proc/cpuinfo", "r");
  char line[4096];
  int c = 0, n = 0;
  while (f && fgets(line, sizeof(line), f) && !(c && n))
    if (!strncmp(line, "flags", 5)) c = strstr(line, " constant_tsc") != NULL, n = strstr(line, " nonstop_tsc") != NULL;
  if (f) fclose(f);
  obs_tsc = c && n;
  uint64_t m = ut_now_ns();
  tsc0 = obs_tsc ? __builtin_ia32_rdtsc() : m;
  mono0 = m;
#endif
}
void obs_ticks_init(void) { pthread_once(&ticks_once, ticks_init); }

/* ns per tick, from the ticks and the monotonic time passed since init (at least 20 ms of it). */
static double tick_rate(uint64_t* tick_now, uint64_t* mono_now) {
  obs_ticks_init();
  if (!obs_tsc) {
    *tick_now = *mono_now = ut_now_ns();
    return 1.0;
  }
  for (;;) {
    uint64_t m0 = ut_now_ns(), t = obs_ticks(), m1 = ut_now_ns();
    uint64_t m = m0 + (m1 - m0) / 2;
    if (m - mono0 >= 20 * UT_NS_PER_MS && t > tsc0) {
      *tick_now = t, *mono_now = m;
      return (double)(m - mono0) / (double)(t - tsc0);
    }
    struct timespec ts = {0, (long)(5 * UT_NS_PER_MS)};
    nanosleep(&ts, NULL); /* only a dump or trace in the first 20 ms of the process waits */
  }
}

void obs_timebase(const struct ncclComm* comm, struct obs_timebase* tb) {
  uint64_t t, m;
  tb->ns_per_tick = tick_rate(&t, &m);
  uint64_t m0 = ut_now_ns(), r = obs_real_ns(), m1 = ut_now_ns();
  int64_t mono_to_job = (int64_t)(r - (uint64_t)comm->clock_offset_ns) - (int64_t)(m0 + (m1 - m0) / 2);
  tb->tick0 = t;
  tb->mono0 = m;
  tb->job0 = (int64_t)m + mono_to_job;
}

/* Index of the first rank on rank r's host. */
static int host_leader(const struct ncclComm* comm, int r) {
  for (int q = 0; q < r; q++)
    if (comm->peers[q].host_hash == comm->peers[r].host_hash) return q;
  return r;
}

ch_status obs_clock_align(struct ncclComm* comm) {
  comm->clock_offset_ns = 0;
  if (comm->nnodes <= 1) return CH_OK;
  int n = comm->nranks, me = comm->rank;
  uint64_t t0 = ut_now_ns();
  int64_t mine = 0, best_rtt = -1;
  if (me == 0) {
    /* Answer each other host's leader in rank order: its pings carry nothing, the answer our time. */
    for (int r = 1; r < n; r++) {
      if (host_leader(comm, r) != r || comm->peers[r].host_hash == comm->peers[0].host_hash) continue;
      for (int k = 0; k < CLOCK_ROUNDS; k++) {
        uint64_t ping;
        CHECK(boot_recv(comm->boot, r, CLOCK_TAG, &ping, sizeof(ping)));
        uint64_t now = obs_real_ns();
        CHECK(boot_send(comm->boot, r, CLOCK_TAG, &now, sizeof(now)));
      }
    }
  } else if (host_leader(comm, me) == me && comm->peers[me].host_hash != comm->peers[0].host_hash) {
    for (int k = 0; k < CLOCK_ROUNDS; k++) {
      uint64_t a = obs_real_ns(), theirs;
      CHECK(boot_send(comm->boot, 0, CLOCK_TAG, &a, sizeof(a)));
      CHECK(boot_recv(comm->boot, 0, CLOCK_TAG, &theirs, sizeof(theirs)));
      uint64_t b = obs_real_ns();
      int64_t rtt = (int64_t)(b - a);
      if (best_rtt < 0 || rtt < best_rtt) best_rtt = rtt, mine = (int64_t)(a + (b - a) / 2 - theirs);
    }
  }
  int64_t* all = calloc((size_t)n, sizeof(int64_t));
  if (!all) return CH_SYSTEM;
  all[me] = mine;
  ch_status st = boot_allgather(comm->boot, all, sizeof(int64_t));
  if (st == CH_OK) {
    /* A peer's number: bounded before it enters any arithmetic. Clocks a day apart are not clocks. */
    int leader = host_leader(comm, me);
    int64_t v = all[leader];
    if (v > CLOCK_MAX_OFFSET_NS || v < -CLOCK_MAX_OFFSET_NS) {
      WARN("rank %d: the clock offset measured by rank %d is %lld ns (more than a day): dumps and traces of this "
           "host use its own clock", me, leader, (long long)v);
      v = 0;
    }
    comm->clock_offset_ns = v;
  }
  free(all);
  if (st == CH_OK) {
    char rtt[48] = ""; /* only the rank that measured knows the round trip */
    if (best_rtt >= 0) snprintf(rtt, sizeof(rtt), ", round trip %.3f ms", (double)best_rtt / UT_NS_PER_MS);
    INFO(LOG_INIT, "rank %d: clock %+.3f ms from rank 0's (measured by rank %d%s; alignment took %.2f ms)", me,
         (double)comm->clock_offset_ns / UT_NS_PER_MS, host_leader(comm, me), rtt,
         (double)(ut_now_ns() - t0) / UT_NS_PER_MS);
  }
  return st;
}
