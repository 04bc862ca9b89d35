/* The timeline across hosts (network-namespace hosts, tools/netns-cluster.sh): 4 ranks on 2 hosts, the
 * second host's clock made 250 ms wrong (CHORUS_CLOCK_SKEW_US): each rank's CHORUS_TRACE file, merged
 * by chorus-info --trace, is valid JSON with one span per call per rank; the offsets measured at init
 * are the skew within 1 ms (the namespaces share one kernel clock, so the skew is the whole truth);
 * and on the job's clock no rank leaves an AllReduce before every rank has entered it (1 ms allowed). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "chorus.h"
#include "comm/comm.h"
#include "flight.h"
#include "misc/param.h"
#include "netns_util.h"
#include "runner.h"

#define CALLS 30
#define SKEW_US 250000

TEST_T(cluster_obs, trace_2x2_skewed_clock, 300) {
  setenv("NCCL_DEBUG", "WARN", 1);
  if (!nn_up("ob", 2)) return;
  char dir[512];
  snprintf(dir, sizeof(dir), "%s/trace", nn_dir());
  nn_sh("mkdir -p %s", dir);
  setenv("CHORUS_TRACE", dir, 1);
  EXPECT_EQ(nn_run("", 4, 240, "cluster_obs_rank.traced_calls"), 0);
  unsetenv("CHORUS_TRACE");
  char json[600], svg[600];
  snprintf(json, sizeof(json), "%s/job.json", dir);
  snprintf(svg, sizeof(svg), "%s/job.svg", dir);
  char* argv[] = {dir, json, svg};
  ASSERT_EQ(trace_main(3, argv), 0);
  if (nn_sh("command -v python3 >/dev/null") == 0)
    EXPECT_EQ(nn_sh("python3 -c 'import json,sys; json.load(open(sys.argv[1]))' %s", json), 0);
  else
    printf("    SKIP: no python3 to parse the merged trace as JSON\n");
  /* Call spans: pid -> rank (the process_sort_index), then (rank, seq) -> end. */
  FILE* f = fopen(json, "r");
  ASSERT(f != NULL);
  double end[4][CALLS + 1] = {{0}}, start[4][CALLS + 1] = {{0}};
  int spans[4] = {0}, pids[4] = {0}, npid = 0;
  long long offset[4] = {0};
  char line[4096];
  while (fgets(line, sizeof(line), f)) {
    const char* p = strstr(line, "\"pid\":");
    int pid = p ? atoi(p + 6) : 0, r = -1;
    for (int i = 0; i < npid; i++) r = pids[i] == pid ? i : r;
    if (strstr(line, "\"name\":\"chorus\"")) {
      int rank = atoi(strstr(line, "\"rank\":") + 7);
      ASSERT(rank >= 0 && rank < 4 && npid < 4);
      pids[npid++] = pid;
      offset[rank] = atoll(strstr(line, "\"clock_offset_ns\":") + 18);
      continue;
    }
    if (!strstr(line, "\"cat\":\"call\"") || r < 0) continue;
    /* the rank of pid r: recovered below from the pid's low bits (trace.c: (hash bits << 16) + rank) */
    int rank = pid & 0xffff;
    long long seq = atoll(strstr(line, "\"seq\":") + 6);
    double ts = atof(strstr(line, "\"ts\":") + 5), dur = atof(strstr(line, "\"dur\":") + 6);
    if (!strstr(line, "\"name\":\"AllReduce\"") || seq < 1 || seq > CALLS || rank >= 4) continue;
    spans[rank]++;
    end[rank][seq] = ts + dur;
    start[rank][seq] = ts;
  }
  fclose(f);
  EXPECT_EQ(npid, 4);
  for (int r = 0; r < 4; r++) {
    if (spans[r] != CALLS) rt_fail(__FILE__, __LINE__, "rank %d: %d AllReduce spans, want %d", r, spans[r], CALLS);
    long long want = r % 2 ? SKEW_US * 1000ll : 0; /* interleaved: ranks 1 and 3 on the skewed host */
    if (llabs(offset[r] - want) > 1000000)
      rt_fail(__FILE__, __LINE__, "rank %d: measured clock offset %lld ns, want %lld within 1 ms", r, offset[r], want);
  }
  double spread = 0, acausal = -1e300;
  for (int s = 1; s <= CALLS; s++) {
    double last_in = -1e300, first_out = 1e300, lo = 1e300, hi = -1e300;
    for (int r = 0; r < 4; r++) {
      last_in = start[r][s] > last_in ? start[r][s] : last_in;
      first_out = end[r][s] < first_out ? end[r][s] : first_out;
      lo = end[r][s] < lo ? end[r][s] : lo, hi = end[r][s] > hi ? end[r][s] : hi;
    }
    if (last_in - first_out > acausal) acausal = last_in - first_out;
    if (s > 1 && hi - lo > spread) spread = hi - lo;
  }
  printf("    job clock: offsets %lld/%lld/%lld/%lld ns (skew %d ms on host 1); AllReduce ends within %.1f us; "
         "latest entry %.1f us %s the earliest exit\n", offset[0], offset[1], offset[2], offset[3], SKEW_US / 1000,
         spread, acausal < 0 ? -acausal : acausal, acausal < 0 ? "before" : "after");
  if (acausal > 1000) rt_fail(__FILE__, __LINE__, "a rank left a call %.1f us before another entered it", acausal);
  nn_down();
}

TEST_T(cluster_obs_rank, traced_calls, 200) {
  int rank, n, host;
  if (!nn_rank("cluster_obs", &rank, &n, &host)) return;
  setenv("CHORUS_CLOCK_SKEW_US", host == 1 ? "250000" : "0", 1);
  param_reset();
  ncclComm_t comm;
  NCCL_OK(chorusInitFromEnv(&comm));
  float buf[1024];
  for (int i = 0; i < 1024; i++) buf[i] = 1;
  for (int i = 0; i < CALLS; i++) NCCL_OK(ncclAllReduce(buf, buf, 1024, ncclFloat, ncclSum, comm, NULL));
  NCCL_OK(ncclCommDestroy(comm));
}
