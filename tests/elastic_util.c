/* The elastic loop: see elastic_util.h. */
#include "elastic_util.h"

#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <unistd.h>

#include "chorus.h"
#include "runner.h"

ncclResult_t elastic_allreduce_check(ncclComm_t comm, int rank, int n, size_t count, const char* what) {
  int* v = malloc(count * sizeof(int));
  ASSERT(v != NULL);
  for (size_t i = 0; i < count; i++) v[i] = rank + (int)(i % 13);
  ncclResult_t r = ncclAllReduce(v, v, count, ncclInt32, ncclSum, comm, NULL);
  for (size_t i = 0; r == ncclSuccess && i < count; i++)
    if (v[i] != n * (int)(i % 13) + n * (n - 1) / 2) {
      rt_fail(__FILE__, __LINE__, "%s: rank %d [%zu] = %d, want %d", what, rank, i, v[i],
              n * (int)(i % 13) + n * (n - 1) / 2);
      break;
    }
  free(v);
  return r;
}

static void* die_soon(void* arg) {
  usleep((useconds_t)(intptr_t)arg);
  _exit(0); /* gone without a word, mid-call */
}

int elastic_run(ncclComm_t comm, int proc, const struct elastic_ids* ids) {
  const int n = ELASTIC_N;
  int round = 0; /* grows this process has seen */
  if (!comm) { /* a spare: joins as the last rank */
    round = proc - n + 1;
    ncclUniqueId gid = ids->get(ids->ctx, proc - n);
    NCCL_OK(ncclCommGrow(NULL, n, &gid, n - 1, &comm, NULL));
  }
  int rank = -1;
  NCCL_OK(ncclCommUserRank(comm, &rank));
  for (; round <= ELASTIC_ROUNDS; round++) {
    for (int it = 0; it < 3; it++) NCCL_OK(elastic_allreduce_check(comm, rank, n, 50000, "elastic loop"));
    if (round == ELASTIC_ROUNDS) break;
    if (rank == n - 1) { /* this round's victim */
      pthread_t t;
      pthread_create(&t, NULL, die_soon, (void*)(intptr_t)(2000 + 3000 * round));
      for (;;) elastic_allreduce_check(comm, rank, n, 1 << 20, "victim");
    }
    ncclResult_t r = ncclSuccess;
    for (int it = 0; r == ncclSuccess && it < 100000; it++)
      r = elastic_allreduce_check(comm, rank, n, 1 << 20, "until it dies");
    EXPECT_EQ(r, ncclRemoteError);
    int dead = -2;
    NCCL_OK(chorusCommGetLostRank(comm, &dead)); /* what a survivor knows, not what the test planned */
    EXPECT_EQ(dead, n - 1);
    ncclComm_t small = NULL, grown = NULL;
    NCCL_OK(ncclCommShrink(comm, &dead, 1, &small, NULL, NCCL_SHRINK_ABORT));
    NCCL_OK(ncclCommDestroy(comm));
    ncclUniqueId gid;
    if (rank == 0) {
      NCCL_OK(ncclCommGetUniqueId(small, &gid));
      ids->put(ids->ctx, round, &gid);
    }
    NCCL_OK(ncclCommGrow(small, n, rank == 0 ? &gid : NULL, -1, &grown, NULL));
    NCCL_OK(ncclCommDestroy(small));
    comm = grown;
  }
  NCCL_OK(ncclCommDestroy(comm));
  return 1;
}
