/* ncclCommRevoke and ncclCommShrink: the survivors of a failure build a communicator without the dead
 * ranks and carry on; revoke ends blocked calls and refuses new collectives but allows shrink. */
#include <pthread.h>
#include <string.h>
#include <unistd.h>

#include "runner.h"

static void allreduce_check(ncclComm_t comm, int rank, int n, const char* what) {
  int v[32];
  for (int i = 0; i < 32; i++) v[i] = rank + i;
  NCCL_OK(ncclAllReduce(v, v, 32, ncclInt32, ncclSum, comm, NULL));
  for (int i = 0; i < 32; i++)
    if (v[i] != n * i + n * (n - 1) / 2) {
      rt_fail(__FILE__, __LINE__, "%s: [%d] = %d, want %d", what, i, v[i], n * i + n * (n - 1) / 2);
      return;
    }
}

/* Rank nranks-1 dies after a first AllReduce; the others see ncclRemoteError, shrink it away and
 * run on the new communicator. */
static void death_body(int rank, int nranks, ncclUniqueId id, void* arg) {
  int flags = (int)(intptr_t)arg;
  ncclComm_t comm, small = NULL;
  NCCL_OK(ncclCommInitRank(&comm, nranks, id, rank));
  allreduce_check(comm, rank, nranks, "before");
  int dead = nranks - 1;
  if (rank == dead) _exit(0); /* gone without a word */
  int v = 1;
  ncclResult_t r = ncclAllReduce(&v, &v, 1, ncclInt32, ncclSum, comm, NULL);
  EXPECT_EQ(r, ncclRemoteError);
  NCCL_OK(ncclCommShrink(comm, &dead, 1, &small, NULL, flags));
  ASSERT(small != NULL);
  int n2 = 0, r2 = -1;
  NCCL_OK(ncclCommCount(small, &n2));
  NCCL_OK(ncclCommUserRank(small, &r2));
  EXPECT_EQ(n2, nranks - 1);
  EXPECT_EQ(r2, rank);
  allreduce_check(small, rank, nranks - 1, "after shrink");
  NCCL_OK(ncclCommDestroy(small));
  NCCL_OK(ncclCommDestroy(comm));
}

TEST_T(shrink, after_a_rank_died, 60) { rt_run_procs(3, death_body, (void*)(intptr_t)NCCL_SHRINK_DEFAULT); }
TEST_T(shrink, after_a_rank_died_abort_flag, 60) { rt_run_procs(4, death_body, (void*)(intptr_t)NCCL_SHRINK_ABORT); }

/* A live rank left out: it never calls shrink (nor anything else that needs the others). */
static void exclude_live_body(int rank, int nranks, ncclUniqueId id, void* arg) {
  (void)arg;
  ncclComm_t comm, small = NULL;
  NCCL_OK(ncclCommInitRank(&comm, nranks, id, rank));
  if (rank != 1) {
    int out = 1;
    NCCL_OK(ncclCommShrink(comm, &out, 1, &small, NULL, NCCL_SHRINK_DEFAULT));
    allreduce_check(small, rank < 1 ? rank : rank - 1, nranks - 1, "shrunk");
    NCCL_OK(ncclCommDestroy(small));
  }
  NCCL_OK(ncclCommDestroy(comm));
}

TEST_T(shrink, excludes_a_live_rank, 60) { rt_run_both(4, exclude_live_body, NULL); }

struct blocked {
  ncclComm_t comm;
  ncclResult_t r;
};

static void* blocked_call(void* arg) {
  struct blocked* b = arg;
  int v[8] = {0};
  b->r = ncclAllReduce(v, v, 8, ncclInt32, ncclSum, b->comm, NULL);
  return NULL;
}

/* Rank 0 is blocked in an AllReduce rank 1 never joins; another thread revokes. The blocked call ends,
 * new collectives are refused, and after rank 1 revokes too both shrink (nobody excluded) and go on. */
static void revoke_body(int rank, int nranks, ncclUniqueId id, void* arg) {
  (void)arg;
  ncclComm_t comm, fresh = NULL;
  NCCL_OK(ncclCommInitRank(&comm, nranks, id, rank));
  allreduce_check(comm, rank, nranks, "before");
  if (rank == 0) {
    struct blocked b = {comm, ncclSuccess};
    pthread_t t;
    ASSERT(pthread_create(&t, NULL, blocked_call, &b) == 0);
    usleep(300 * 1000);
    NCCL_OK(ncclCommRevoke(comm, NCCL_REVOKE_DEFAULT));
    pthread_join(t, NULL);
    EXPECT_EQ(b.r, ncclInvalidUsage);
  } else {
    NCCL_OK(ncclCommRevoke(comm, NCCL_REVOKE_DEFAULT));
  }
  int v = 0;
  EXPECT_EQ(ncclAllReduce(&v, &v, 1, ncclInt32, ncclSum, comm, NULL), ncclInvalidUsage);
  EXPECT(strstr(ncclGetLastError(comm), "revoked") != NULL);
  NCCL_OK(ncclCommShrink(comm, NULL, 0, &fresh, NULL, NCCL_SHRINK_DEFAULT));
  allreduce_check(fresh, rank, nranks, "after revoke and shrink");
  NCCL_OK(ncclCommDestroy(fresh));
  NCCL_OK(ncclCommDestroy(comm));
}

TEST_T(shrink, revoke_then_shrink, 60) { rt_run_both(2, revoke_body, NULL); }

TEST_T(shrink, bad_arguments, 30) {
  ncclComm_t comms[3], out = (ncclComm_t)0x1;
  NCCL_OK(ncclCommInitAll(comms, 3, NULL));
  int self = 0, range = 3, dup[2] = {1, 1};
  EXPECT_EQ(ncclCommShrink(comms[0], &self, 1, &out, NULL, 0), ncclInvalidUsage);
  EXPECT(out == NULL);
  EXPECT_EQ(ncclCommShrink(comms[0], &range, 1, &out, NULL, 0), ncclInvalidArgument);
  EXPECT_EQ(ncclCommShrink(comms[0], dup, 2, &out, NULL, 0), ncclInvalidArgument);
  EXPECT_EQ(ncclCommShrink(comms[0], NULL, 1, &out, NULL, 0), ncclInvalidArgument);
  EXPECT_EQ(ncclCommShrink(comms[0], NULL, 0, &out, NULL, 7), ncclInvalidArgument);
  EXPECT_EQ(ncclCommShrink(comms[0], NULL, 0, NULL, NULL, 0), ncclInvalidArgument);
  EXPECT_EQ(ncclCommRevoke(comms[0], 5), ncclInvalidArgument);
  for (int i = 0; i < 3; i++) NCCL_OK(ncclCommDestroy(comms[i]));
}
