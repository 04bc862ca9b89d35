/* Plan reuse: a repeated call runs the previous call's plan again (src/core/plan.c). What may change
 * between repeats (buffers, in-place or not, op, PreMulSum scalar) must change the result; what is
 * in the key (count, type, root) must not be confused; a call in between must not break the cache. */
#include <pthread.h>
#include <string.h>

#include "chorus.h"
#include "comm/comm.h"
#include "core/exec.h"
#include "runner.h"

#define N 1000 /* not a multiple of 2, 3 or 64: every algorithm has ragged parts */

/* Rank r contributes r + 1 + i % 7 + k at element i of repeat k: small integers, exact in float. */
static float val(int r, int i, int k) { return (float)(r + 1 + i % 7 + k); }

/* Element i of repeat k reduced with op over n ranks; premul: sum of (r + 2) * value (the scalars). */
static float expect(ncclRedOp_t op, int premul, int n, int i, int k) {
  float acc = op == ncclProd ? 1.0f : 0.0f;
  for (int r = 0; r < n; r++) {
    float v = val(r, i, k);
    if (premul) acc += (float)(r + 2) * v;
    else if (op == ncclMax) acc = v > acc ? v : acc; /* values are positive */
    else if (op == ncclProd) acc *= v;
    else acc += v;
  }
  return acc;
}

static void repeat_body(int rank, int nranks, ncclUniqueId id, void* arg) {
  int use_stream = arg != NULL;
  ncclComm_t comm;
  NCCL_OK(ncclCommInitRank(&comm, nranks, id, rank));
  cudaStream_t stream = NULL;
  if (use_stream) NCCL_OK(chorusStreamCreate(&stream));
  static _Thread_local float a[2][N], b[2][N], small[8];
  for (int k = 0; k < 24; k++) {
    /* A stream call can take a plan made by a NULL-stream call. */
    cudaStream_t st = use_stream && k % 2 ? stream : NULL;
    int which = k % 2, in_place = (k / 2) % 2;
    ncclRedOp_t ops[4] = {ncclSum, ncclMax, ncclProd, ncclSum};
    ncclRedOp_t op = ops[(k / 4) % 4];
    int premul = (k / 4) % 4 == 3;
    float* send = a[which];
    float* recv = in_place ? a[which] : b[which];
    for (int i = 0; i < N; i++) send[i] = val(rank, i, k % 3);
    memset(b[which], 0xff, sizeof(b[which]));
    float scalar = (float)(rank + 2); /* differs per rank and is applied to that rank's input only */
    if (premul) NCCL_OK(ncclRedOpCreatePreMulSum(&op, &scalar, ncclFloat, ncclScalarHostImmediate, comm));
    NCCL_OK(ncclAllReduce(send, recv, N, ncclFloat, op, comm, st));
    if (st) NCCL_OK(chorusStreamSynchronize(st));
    if (premul) NCCL_OK(ncclRedOpDestroy(op, comm));
    int bad = 0;
    for (int i = 0; i < N && bad < 3; i++) {
      float want = expect(ops[(k / 4) % 4], premul, nranks, i, k % 3);
      if (recv[i] != want) {
        rt_fail(__FILE__, __LINE__, "%s repeat %d rank %d [%d] = %g, want %g", rt_mode(), k, rank, i, recv[i], want);
        bad++;
      }
    }
    /* Every third repeat, calls whose key differs by one field come in between. */
    if (k % 3 == 2) {
      for (int i = 0; i < 8; i++) small[i] = (float)(rank + 1);
      NCCL_OK(ncclAllReduce(small, small, 7, ncclFloat, ncclSum, comm, st)); /* count */
      int root = k % nranks;
      float bc[8];
      for (int i = 0; i < 8; i++) bc[i] = rank == root ? (float)(10 * root + i) : -1.f;
      NCCL_OK(ncclBroadcast(bc, bc, 8, ncclFloat, root, comm, st)); /* root in the key */
      if (st) NCCL_OK(chorusStreamSynchronize(st));
      EXPECT(small[6] == (float)(nranks * (nranks + 1) / 2));
      for (int i = 0; i < 8; i++) EXPECT(bc[i] == (float)(10 * root + i));
    }
  }
  if (stream) NCCL_OK(chorusStreamDestroy(stream));
  NCCL_OK(ncclCommDestroy(comm));
}

TEST(plan, repeated_call_two_ranks) { rt_run_both(2, repeat_body, NULL); }
TEST(plan, repeated_call_three_ranks) { rt_run_both(3, repeat_body, NULL); }
TEST(plan, repeated_call_one_rank) { rt_run_threads(1, repeat_body, NULL); }
TEST(plan, repeated_call_on_stream) { rt_run_both(2, repeat_body, (void*)1); }

/* ---- ncclCommAbort racing a call that completes (issue 9, item 5) ----
 * A caller thread runs one AllReduce on a one-rank communicator; as soon as that call holds its
 * ticket, another thread aborts the communicator, which frees it once the ticket is done. The call
 * must not touch the communicator after that (it used to store its plan into comm->reuse_plan just
 * after: heap-use-after-free under ASan, a race with the free under TSan, or a leaked plan). */
struct abort_race {
  ncclComm_t comm;
  int warm; /* run one call first, so the racing call takes the reuse path */
  ncclResult_t res;
};

static void* race_call(void* p) {
  struct abort_race* r = p;
  float v[4] = {1, 2, 3, 4};
  r->res = ncclAllReduce(v, v, 4, ncclFloat, ncclSum, r->comm, NULL);
  return NULL;
}

static void* race_abort(void* p) {
  struct abort_race* r = p;
  /* Abort waits only for calls that hold a ticket; entering the library later is the caller's bug. */
  while (atomic_load(&r->comm->next_ticket) == (uint64_t)r->warm) {}
  NCCL_OK(ncclCommAbort(r->comm));
  return NULL;
}

TEST_T(plan, abort_races_finishing_call, 120) {
  for (int it = 0; it < 2000; it++) {
    ncclUniqueId id;
    struct abort_race r = {NULL, it % 2, ncclSuccess};
    NCCL_OK(ncclGetUniqueId(&id));
    NCCL_OK(ncclCommInitRank(&r.comm, 1, id, 0));
    if (r.warm) {
      float w = 1;
      NCCL_OK(ncclAllReduce(&w, &w, 1, ncclFloat, ncclSum, r.comm, NULL));
      /* same key as the racing call below, so that one reuses this plan */
      float v[4] = {0};
      NCCL_OK(ncclAllReduce(v, v, 4, ncclFloat, ncclSum, r.comm, NULL));
      r.warm = 2; /* tickets taken so far */
    }
    pthread_t a, b;
    ASSERT(pthread_create(&a, NULL, race_call, &r) == 0);
    ASSERT(pthread_create(&b, NULL, race_abort, &r) == 0);
    pthread_join(a, NULL);
    pthread_join(b, NULL);
    /* Either the call finished first, or it saw the abort (reported as invalid usage). */
    if (r.res != ncclSuccess && r.res != ncclInvalidUsage)
      rt_fail(__FILE__, __LINE__, "iteration %d: the racing call -> %d (%s)", it, (int)r.res, ncclGetErrorString(r.res));
  }
}

/* Where a call runs is one table (core/exec.h): every executor has a row, in precedence order, and
 * only the host engine runs plans itself (launch NULL). */
TEST(plan, executor_table) {
  for (int e = 0; e < EXEC_COUNT; e++) ASSERT(ch_executors[e] != NULL && ch_executors[e]->name != NULL);
  EXPECT(ch_executors[EXEC_HOST]->launch == NULL);
  for (int e = EXEC_HOST + 1; e < EXEC_COUNT; e++) EXPECT(ch_executors[e]->launch != NULL);
  EXPECT(ch_executors[EXEC_STAGE]->finish != NULL && ch_executors[EXEC_KERNEL]->finish != NULL);
  EXPECT(ch_comm_hooks.setup != NULL && ch_comm_hooks.failed != NULL && ch_comm_hooks.teardown != NULL);
}
