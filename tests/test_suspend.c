/* ncclCommSuspend, ncclCommResume and the memory figures (core/suspend.c, issue 45 part 6): every rank
 * suspends an idle communicator; the FIFOs it made and its scratch are released (chorusCommGetMemory,
 * ncclCommMemStats); a call on the suspended comm resumes it and gives exact results, as does an
 * explicit resume; bad flags, a second suspend and a resume of an active comm are refused; an abort of
 * a suspended comm works. suspend.figures_* print the figures docs/PERFORMANCE.md records. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "chorus.h"
#include "coll_util.h"
#include "runner.h"

#define COUNT 4096

/* An AllReduce of rank + 1 (exact: n(n+1)/2) and a send to the next rank, checked. */
static void calls(ncclComm_t comm, int rank, int n, float* sb, float* rb) {
  for (int i = 0; i < COUNT; i++) sb[i] = (float)(rank + 1);
  NCCL_OK(ncclAllReduce(sb, rb, COUNT, ncclFloat32, ncclSum, comm, NULL));
  for (int i = 0; i < COUNT; i++)
    if (rb[i] != (float)(n * (n + 1) / 2)) {
      cu_failf("AllReduce: element %d is %g, not %d", i, rb[i], n * (n + 1) / 2);
      break;
    }
  int to = (rank + 1) % n, from = (rank + n - 1) % n;
  cu_fill_pattern(sb, ncclFloat32, COUNT, rank, to, 7);
  NCCL_OK(ncclGroupStart());
  NCCL_OK(ncclSend(sb, COUNT, ncclFloat32, to, comm, NULL));
  NCCL_OK(ncclRecv(rb, COUNT, ncclFloat32, from, comm, NULL));
  NCCL_OK(ncclGroupEnd());
  long at = cu_check_pattern(rb, ncclFloat32, COUNT, from, rank, 7);
  if (at >= 0) cu_failf("data from rank %d wrong from element %ld", from, at);
}

static uint64_t stat_of(ncclComm_t comm, ncclCommMemStat_t s) {
  uint64_t v = 99;
  NCCL_OK(ncclCommMemStats(comm, s, &v));
  return v;
}

static void suspend_body(int rank, int n, ncclUniqueId id, void* arg) {
  (void)arg;
  ncclComm_t comm = cu_comm_init(rank, n, id);
  float* sb = malloc(COUNT * sizeof(float));
  float* rb = malloc(COUNT * sizeof(float));
  ASSERT(sb && rb);
  calls(comm, rank, n, sb, rb);
  chorusMemory_t before = cu_memory(comm);
  EXPECT(before.suspendBytes > 0);
  EXPECT_EQ(before.suspended, 0);
  EXPECT_EQ(stat_of(comm, ncclStatGpuMemSuspended), 0);
  EXPECT_EQ(ncclCommSuspend(comm, 0x6), ncclInvalidArgument); /* bits NCCL does not define */
  NCCL_OK(ncclCommSuspend(comm, 0));                           /* nothing asked for: not suspended */
  EXPECT_EQ(ncclCommResume(comm), ncclInvalidUsage);
  NCCL_OK(ncclCommSuspend(comm, NCCL_SUSPEND_MEM));
  chorusMemory_t after = cu_memory(comm);
  EXPECT_EQ(after.suspended, 1);
  EXPECT_EQ(stat_of(comm, ncclStatGpuMemSuspended), 1);
  EXPECT_EQ(stat_of(comm, ncclStatGpuMemTotal), 0); /* no device memory of Chorus's own */
  EXPECT_EQ(after.suspendBytes, 0);                 /* every send was received: all released */
  EXPECT_EQ(after.ringBytes, 0);
  EXPECT_EQ(after.p2pPeers, 0);
  EXPECT(after.persistBytes < before.persistBytes + before.suspendBytes);
  EXPECT_EQ(ncclCommSuspend(comm, NCCL_SUSPEND_MEM), ncclInvalidUsage); /* already suspended */
  /* A call resumes it: the connections are made again, the results exact. */
  calls(comm, rank, n, sb, rb);
  EXPECT_EQ(cu_memory(comm).suspended, 0);
  EXPECT(cu_memory(comm).ringBytes > 0);
  EXPECT_EQ(ncclCommResume(comm), ncclInvalidUsage); /* the call resumed it */
  /* Explicit resume, then calls; twice, so the re-made connections are released again. */
  for (int k = 0; k < 2; k++) {
    NCCL_OK(ncclCommSuspend(comm, NCCL_SUSPEND_MEM));
    NCCL_OK(ncclCommResume(comm));
    EXPECT_EQ(stat_of(comm, ncclStatGpuMemSuspended), 0);
    calls(comm, rank, n, sb, rb);
    calls(comm, rank, n, sb, rb);
  }
  free(sb);
  free(rb);
  NCCL_OK(ncclCommDestroy(comm));
  cu_finish();
}

TEST_T(suspend, suspend_resume_4, 120) { rt_run_both(4, suspend_body, NULL); }

/* Suspended, then aborted (every rank): the abort frees what is left. */
static void abort_body(int rank, int n, ncclUniqueId id, void* arg) {
  (void)arg;
  ncclComm_t comm = cu_comm_init(rank, n, id);
  float* sb = malloc(COUNT * sizeof(float));
  float* rb = malloc(COUNT * sizeof(float));
  ASSERT(sb && rb);
  calls(comm, rank, n, sb, rb);
  NCCL_OK(ncclCommSuspend(comm, NCCL_SUSPEND_MEM));
  NCCL_OK(ncclCommAbort(comm));
  free(sb);
  free(rb);
  cu_finish();
}

TEST_T(suspend, abort_while_suspended, 60) { rt_run_both(3, abort_body, NULL); }

/* A call in flight on a CUDA-less host stream would be waited for; the plain case here: a rank that
 * suspends while its peers are still in their calls waits for them at the barrier. */
static void late_body(int rank, int n, ncclUniqueId id, void* arg) {
  (void)arg;
  ncclComm_t comm = cu_comm_init(rank, n, id);
  float* sb = malloc(COUNT * sizeof(float));
  float* rb = malloc(COUNT * sizeof(float));
  ASSERT(sb && rb);
  calls(comm, rank, n, sb, rb);
  if (rank == 0) usleep(300 * 1000);
  NCCL_OK(ncclCommSuspend(comm, NCCL_SUSPEND_MEM));
  EXPECT_EQ(cu_memory(comm).ringBytes, 0);
  calls(comm, rank, n, sb, rb);
  free(sb);
  free(rb);
  NCCL_OK(ncclCommDestroy(comm));
  cu_finish();
}

TEST_T(suspend, late_rank_waited_for, 60) { rt_run_both(3, late_body, NULL); }

/* The figures for docs/PERFORMANCE.md: rank 0's host memory before and after a suspend. */
static void figures_body(int rank, int n, ncclUniqueId id, void* arg) {
  (void)arg;
  ncclComm_t comm = cu_comm_init(rank, n, id);
  float* sb = malloc(COUNT * sizeof(float) * (size_t)n);
  float* rb = malloc(COUNT * sizeof(float) * (size_t)n);
  ASSERT(sb && rb);
  calls(comm, rank, n, sb, rb);
  for (int i = 0; i < COUNT * n; i++) sb[i] = 1.0f;
  NCCL_OK(ncclAlltoAll(sb, rb, COUNT, ncclFloat32, comm, NULL)); /* every peer's FIFOs */
  chorusMemory_t b = cu_memory(comm);
  NCCL_OK(ncclCommSuspend(comm, NCCL_SUSPEND_MEM));
  chorusMemory_t a = cu_memory(comm);
  if (rank == 0)
    printf("FIGURES ranks=%d before: suspend=%llu persist=%llu ring=%llu p2pRecv=%llu peers=%llu shmem=%llu | "
           "after: suspend=%llu persist=%llu ring=%llu p2pRecv=%llu peers=%llu shmem=%llu\n",
           n, (unsigned long long)b.suspendBytes, (unsigned long long)b.persistBytes, (unsigned long long)b.ringBytes,
           (unsigned long long)b.p2pRecvBytes, (unsigned long long)b.p2pPeers, (unsigned long long)b.procShmemBytes,
           (unsigned long long)a.suspendBytes, (unsigned long long)a.persistBytes, (unsigned long long)a.ringBytes,
           (unsigned long long)a.p2pRecvBytes, (unsigned long long)a.p2pPeers, (unsigned long long)a.procShmemBytes);
  fflush(stdout);
  EXPECT_EQ(a.suspendBytes, 0);
  calls(comm, rank, n, sb, rb);
  free(sb);
  free(rb);
  NCCL_OK(ncclCommDestroy(comm));
  cu_finish();
}

TEST_T(suspend, figures_2, 120) { rt_run_procs(2, figures_body, NULL); }
TEST_T(suspend, figures_8, 180) { rt_run_procs(8, figures_body, NULL); }
TEST_T(suspend, figures_16, 300) { rt_run_procs(16, figures_body, NULL); }
