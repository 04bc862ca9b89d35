/* Settings that must agree across ranks (src/core/agree.c, issue 9 item 10): a rank with another
 * NCCL_BUFFSIZE, NCCL_PROTO or CHORUS_DIRECT_MIN_BYTES makes every rank's init fail with
 * ncclInvalidUsage, and each rank's log names the setting, the values and the ranks (it used to hang
 * or corrupt the first call). Ranks are processes, each with its own environment. */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "misc/log.h"
#include "misc/param.h"
#include "runner.h"

struct env_case {
  const char* env[4][3]; /* per rank (up to 4): up to 3 "NAME=VALUE" */
  ncclResult_t want;
  const char* lines[3]; /* each must appear in every rank's log (NULL: none) */
};

/* Apply this rank's variables and log WARNs to a file of its own. */
static void set_env(const struct env_case* ec, int rank, char* log_path, size_t cap) {
  for (int i = 0; i < 3 && ec->env[rank][i]; i++) {
    char buf[256];
    snprintf(buf, sizeof(buf), "%s", ec->env[rank][i]);
    char* eq = strchr(buf, '=');
    ASSERT(eq);
    *eq = 0;
    setenv(buf, eq + 1, 1);
  }
  snprintf(log_path, cap, "/tmp/chorus-agree-%d.log", (int)getpid());
  unlink(log_path);
  setenv("NCCL_DEBUG", "WARN", 1);
  setenv("NCCL_DEBUG_FILE", log_path, 1);
  param_reset();
  log_reset();
}

static char* slurp(const char* path) {
  FILE* f = fopen(path, "r");
  if (!f) return NULL;
  static char buf[1 << 16];
  size_t n = fread(buf, 1, sizeof(buf) - 1, f);
  buf[n] = 0;
  fclose(f);
  return buf;
}

static void agree_body(int rank, int nranks, ncclUniqueId id, void* arg) {
  const struct env_case* ec = arg;
  char path[128];
  set_env(ec, rank, path, sizeof(path));
  ncclComm_t comm = NULL;
  ncclResult_t r = ncclCommInitRank(&comm, nranks, id, rank);
  if (r != ec->want)
    rt_fail(__FILE__, __LINE__, "rank %d: ncclCommInitRank -> %d (%s), want %d", rank, (int)r, ncclGetErrorString(r),
            (int)ec->want);
  if (r == ncclSuccess) {
    float v[300];
    for (int i = 0; i < 300; i++) v[i] = (float)(rank + i);
    NCCL_OK(ncclAllReduce(v, v, 300, ncclFloat, ncclSum, comm, NULL));
    for (int i = 0; i < 300; i++)
      if (v[i] != (float)(nranks * i + nranks * (nranks - 1) / 2)) {
        rt_fail(__FILE__, __LINE__, "rank %d: v[%d] = %g", rank, i, v[i]);
        break;
      }
    NCCL_OK(ncclCommDestroy(comm));
  }
  const char* log = slurp(path);
  int differs = 0;
  for (const char* p = log; p && (p = strstr(p, "differs across ranks")); p++) differs++;
  int nlines = 0;
  for (int i = 0; i < 3 && ec->lines[i]; i++) {
    nlines++;
    if (!log || !strstr(log, ec->lines[i]))
      rt_fail(__FILE__, __LINE__, "rank %d: the log lacks \"%s\"; it has:\n%s", rank, ec->lines[i], log ? log : "");
  }
  if (differs != nlines) rt_fail(__FILE__, __LINE__, "rank %d: %d 'differs' lines, want %d:\n%s", rank, differs, nlines, log ? log : "");
  unlink(path);
}

TEST_T(agree, buffsize_differs, 30) {
  struct env_case ec = {{{"NCCL_BUFFSIZE=2097152"}, {"NCCL_BUFFSIZE=4194304"}, {NULL}, {"NCCL_BUFFSIZE=2097152"}},
                        ncclInvalidUsage,
                        {"NCCL_BUFFSIZE differs across ranks: 2097152 on ranks 0,2-3, 4194304 on rank 1"}};
  rt_run_procs(4, agree_body, &ec);
}

TEST_T(agree, proto_differs, 30) {
  struct env_case ec = {{{NULL}, {"NCCL_PROTO=^LL128"}, {"NCCL_PROTO=LL128"}},
                        ncclInvalidUsage,
                        {"NCCL_PROTO differs across ranks: LL,LL128,Simple on rank 0, LL,Simple on rank 1, LL128 on rank 2"}};
  rt_run_procs(3, agree_body, &ec);
}

/* The reproducible level decides connections and algorithms: set differently, init fails naming it
 * (chorusCommSetReproducible cannot be compared at init: see docs/REPRODUCIBLE.md). */
TEST_T(agree, reproducible_differs, 30) {
  struct env_case ec = {{{"CHORUS_REPRODUCIBLE=order"}, {"CHORUS_REPRODUCIBLE=order"}, {NULL}},
                        ncclInvalidUsage,
                        {"CHORUS_REPRODUCIBLE (0 off, 1 order, 2 exact) differs across ranks: 1 on ranks 0-1, 0 on rank 2"}};
  rt_run_procs(3, agree_body, &ec);
}

/* Socket striping shapes the channel count of a communicator that uses the network (only there). */
TEST_T(agree, sockets_differ_over_the_network, 30) {
  struct env_case ec = {{{"NCCL_SHM_DISABLE=1", "NCCL_P2P_DISABLE=1", "NCCL_NSOCKS_PERTHREAD=4"},
                         {"NCCL_SHM_DISABLE=1", "NCCL_P2P_DISABLE=1"}},
                        ncclInvalidUsage,
                        {"NCCL_SOCKET_NTHREADS x NCCL_NSOCKS_PERTHREAD (sockets per peer) differs across ranks: 4 on "
                         "rank 0, 1 on rank 1",
                         "(channel count) differs across ranks: 4 on rank 0, 1 on rank 1"}};
  rt_run_procs(2, agree_body, &ec);
  struct env_case local = {{{"NCCL_NSOCKS_PERTHREAD=4"}, {NULL}}, ncclSuccess, {NULL}};
  rt_run_procs(2, agree_body, &local);
}

/* Several settings at once: one line each; the FIFO-shaping ones and a size threshold. */
TEST_T(agree, several_differ, 30) {
  struct env_case ec = {{{"CHORUS_DIRECT_MIN_BYTES=4096", "NCCL_LL_BUFFSIZE=524288"},
                         {"CHORUS_DIRECT_MIN_BYTES=-1"}},
                        ncclInvalidUsage,
                        {"CHORUS_DIRECT_MIN_BYTES differs across ranks: 4096 on rank 0, -1 on rank 1",
                         "NCCL_LL_BUFFSIZE differs across ranks: 524288 on rank 0, 262144 on rank 1"}};
  rt_run_procs(2, agree_body, &ec);
}

/* Values are compared as used: other spellings of the same setting agree, and settings that shape
 * only a rank's own work may differ. */
TEST_T(agree, equivalent_settings_agree, 30) {
  struct env_case ec = {{{"NCCL_PROTO=simple,ll,LL128", "NCCL_BUFFSIZE=-1", "CHORUS_STREAM_MIN_BYTES=4096"},
                         {"NCCL_BUFFSIZE=2097152", "CHORUS_SPIN_US=0"}},
                        ncclSuccess,
                        {NULL}};
  rt_run_procs(2, agree_body, &ec);
}
