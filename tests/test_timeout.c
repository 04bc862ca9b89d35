/* Timeouts: a call that makes no progress for the communicator's timeout (chorusCommSetTimeout or
 * CHORUS_TIMEOUT) returns ncclTimeout, sets the async error and leaves a stall report naming what it
 * waits for, instead of hanging. Rank 1 is alive but never makes its side of the call. */
#include <pthread.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "chorus.h"
#include "misc/param.h"
#include "runner.h"

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

enum what { T_ALLREDUCE, T_SEND, T_ENV };

static void stuck_body(int rank, int nranks, ncclUniqueId id, void* arg) {
  enum what w = (enum what)(intptr_t)arg;
  if (w == T_ENV && !strcmp(rt_mode(), "procs")) { /* each process reads its own environment */
    setenv("CHORUS_TIMEOUT", "1", 1);
    param_reset();
  }
  ncclComm_t comm;
  NCCL_OK(ncclCommInitRank(&comm, nranks, id, rank));
  if (w != T_ENV || strcmp(rt_mode(), "procs")) NCCL_OK(chorusCommSetTimeout(comm, 1.0));
  float buf[256] = {0};
  /* Connected first (a first call would time out in connection setup instead: see T_SEND). */
  if (w != T_SEND) NCCL_OK(ncclAllReduce(buf, buf, 256, ncclFloat, ncclSum, comm, NULL));
  if (rank == 1) {
    usleep(4 * 1000 * 1000); /* alive, but busy elsewhere: never joins rank 0's call */
    NCCL_OK(ncclCommAbort(comm));
    return;
  }
  double t0 = now_s();
  ncclResult_t r = w == T_SEND ? ncclSend(buf, 256, ncclFloat, 1, comm, NULL)
                               : ncclAllReduce(buf, buf, 256, ncclFloat, ncclSum, comm, NULL);
  double took = now_s() - t0;
  EXPECT_EQ(r, ncclTimeout);
  if (took < 0.9 || took > 3.5) rt_fail(__FILE__, __LINE__, "the call returned after %.2f s (timeout 1 s)", took);
  ncclResult_t as = ncclSuccess;
  NCCL_OK(ncclCommGetAsyncError(comm, &as));
  if (w != T_SEND) EXPECT_EQ(as, ncclTimeout); /* connection setup failing is not an async error */
  const char* e = ncclGetLastError(comm);
  if (w == T_SEND) EXPECT(strstr(e, "rank 1") != NULL);
  else if (!strstr(e, "no progress for")) rt_fail(__FILE__, __LINE__, "no stall report; last error: %s", e);
  NCCL_OK(ncclCommAbort(comm));
}

TEST_T(timeout, allreduce_peer_never_calls, 40) { rt_run_both(2, stuck_body, (void*)(intptr_t)T_ALLREDUCE); }
TEST_T(timeout, first_send_peer_never_receives, 40) { rt_run_both(2, stuck_body, (void*)(intptr_t)T_SEND); }
TEST_T(timeout, from_environment, 40) { rt_run_procs(2, stuck_body, (void*)(intptr_t)T_ENV); }

TEST_T(timeout, bad_values_refused, 20) {
  ncclUniqueId id;
  ncclComm_t comm;
  NCCL_OK(ncclGetUniqueId(&id));
  NCCL_OK(ncclCommInitRank(&comm, 1, id, 0));
  EXPECT_EQ(chorusCommSetTimeout(comm, -1), ncclInvalidArgument);
  EXPECT_EQ(chorusCommSetTimeout(NULL, 1), ncclInvalidArgument);
  NCCL_OK(chorusCommSetTimeout(comm, 0)); /* none */
  float v = 2;
  NCCL_OK(ncclAllReduce(&v, &v, 1, ncclFloat, ncclSum, comm, NULL));
  EXPECT(v == 2);
  NCCL_OK(ncclCommDestroy(comm));
}

/* CHORUS_DUMP_SIGNAL: a rank blocked in a call logs what it waits for when signalled, then the
 * job-wide summary, and goes on. */
static void* signal_later(void* arg) {
  (void)arg;
  usleep(300 * 1000);
  kill(getpid(), SIGUSR1);
  return NULL;
}

static void dump_body(int rank, int nranks, ncclUniqueId id, void* arg) {
  (void)arg;
  setenv("CHORUS_DUMP_SIGNAL", "SIGUSR1", 1);
  param_reset();
  ncclComm_t comm;
  NCCL_OK(ncclCommInitRank(&comm, nranks, id, rank));
  float buf[256];
  for (int i = 0; i < 256; i++) buf[i] = 1;
  NCCL_OK(ncclAllReduce(buf, buf, 256, ncclFloat, ncclSum, comm, NULL)); /* connected */
  if (rank == 1) usleep(1000 * 1000);
  pthread_t t;
  if (rank == 0) ASSERT(pthread_create(&t, NULL, signal_later, NULL) == 0);
  NCCL_OK(ncclAllReduce(buf, buf, 256, ncclFloat, ncclSum, comm, NULL));
  EXPECT(buf[0] == 4.0f);
  if (rank == 0) {
    pthread_join(t, NULL);
    const char* e = ncclGetLastError(comm);
    /* The last WARN is the job-wide summary (fault/stall_job.c): rank 1 has not reached call #2. */
    if (!strstr(e, "on request") || !strstr(e, "AllReduce #2 (1 KiB): rank 0 waiting, rank 1 last completed #1"))
      rt_fail(__FILE__, __LINE__, "no report naming rank 1; last error: %s", e);
  }
  NCCL_OK(ncclCommDestroy(comm));
}

TEST_T(timeout, dump_on_signal, 40) { rt_run_procs(2, dump_body, NULL); }
