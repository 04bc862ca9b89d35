/* Plan reuse: a repeated call runs the previous call's plan again (src/core/plan.c). What may change
 * between repeats (buffers, in-place or not, op, PreMulSum scalar) must change the result; what is
 * in the key (count, type, root) must not be confused; a call in between must not break the cache. */
#include <string.h>

#include "chorus.h"
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
