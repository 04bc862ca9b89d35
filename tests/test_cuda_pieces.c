/* Large calls on staged device buffers run in pieces (staging/staging.c's stage_pieces): ranks with a CUDA
 * context but no GPU path between them (here CHORUS_CUDA_DIRECT=0 and CHORUS_CUDA_RELAY=0 stand in
 * for ranks on different hosts) split an AllReduce, Reduce, Broadcast, AllGather or ReduceScatter
 * past CHORUS_CUDA_STAGE_PIECE into calls of that size, alike on every rank whatever its buffers. Each piece copies its input on
 * the pool's input stream, forked from the call's stream. The stand-in driver counts copies: two per
 * staged piece. Expected values in closed form. */
#define _GNU_SOURCE
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cuda_gpu_util.h"
#include "misc/param.h"
#include "runner.h"

#define PIECE_STR "65536"           /* CHORUS_CUDA_STAGE_PIECE: 16384 floats */
#define PN 100003                   /* floats: 7 pieces, the last one short */
#define PIECES ((PN + 16383) / 16384)

static float value(int rank, size_t i) { return (float)((rank + 1) * 3 + (int)(i % 1021)); }

/* AllReduce out of place and in place, Broadcast from rank 1, Reduce to rank 0 (whose peers pass no
 * recvbuff): each in pieces, each checked. host: this rank's buffers are host memory. */
static void steps(ncclComm_t comm, cudaStream_t s, int rank, int nranks, int host, int pieced) {
  float *a = any_alloc(PN, host), *b = any_alloc(PN, host);
  for (size_t i = 0; i < PN; i++) a[i] = value(rank, i);
  int c0 = fk.copies();
  NCCL_OK(ncclAllReduce(a, b, PN, ncclFloat32, ncclSum, comm, s));
  EXPECT_EQ(fk.sync(s), 0);
  if (!host) EXPECT(fk.copies() - c0 >= 2 * (pieced ? PIECES : 1)); /* other thread ranks copy too */
  float sum = 0;
  for (int r = 0; r < nranks; r++) sum += (float)((r + 1) * 3);
  for (size_t i = 0; i < PN; i++) EXPECT(b[i] == sum + (float)nranks * (float)(i % 1021));
  NCCL_OK(ncclAllReduce(a, a, PN, ncclFloat32, ncclMax, comm, s));
  EXPECT_EQ(fk.sync(s), 0);
  for (size_t i = 0; i < PN; i++) EXPECT(a[i] == value(nranks - 1, i));
  for (size_t i = 0; i < PN; i++) b[i] = rank == 1 ? (float)i : -1.0f;
  NCCL_OK(ncclBroadcast(b, b, PN, ncclFloat32, 1, comm, s));
  EXPECT_EQ(fk.sync(s), 0);
  for (size_t i = 0; i < PN; i++) EXPECT(b[i] == (float)i);
  NCCL_OK(ncclReduce(b, rank == 0 ? a : NULL, PN, ncclFloat32, ncclSum, 0, comm, s));
  EXPECT_EQ(fk.sync(s), 0);
  if (rank == 0)
    for (size_t i = 0; i < PN; i++) EXPECT(a[i] == (float)nranks * (float)i);
  any_free(a, host), any_free(b, host);
}

static void procs_body(int rank, int nranks, ncclUniqueId id, void* arg) {
  (void)arg;
  load_staged(PIECE_STR);
  cudaStream_t s;
  ncclComm_t comm = open_rank(rank, nranks, id, 0x9000, &s);
  steps(comm, s, rank, nranks, 0, 1);
  NCCL_OK(ncclCommDestroy(comm));
}

TEST_T(cuda_pieces, allreduce_reduce_broadcast_2_procs, 60) {
  setenv("CHORUS_CUDA_STAGE_REDUCE", "0", 1); /* the CPU reduces: a copy back per piece, counted */
  rt_run_procs(2, procs_body, NULL);
}

/* AllGather and ReduceScatter in pieces (a slice of every rank's block each, BN floats a block),
 * out of place and in place; host: this rank's buffers are host memory. */
#define BN 40009
static void block_steps(ncclComm_t comm, cudaStream_t s, int rank, int nranks, int host) {
  size_t all = (size_t)nranks * BN;
  float *a = any_alloc(all, host), *b = any_alloc(all, host);
  for (size_t i = 0; i < BN; i++) a[i] = value(rank, i);
  size_t unit = (size_t)nranks * sizeof(float), per = 65536 / unit; /* stage_pieces, for 2 and 3 ranks */
  per = (per + 1023) / 1024 * 1024;
  int pieces = (int)((BN + per - 1) / per), c0 = fk.copies();
  NCCL_OK(ncclAllGather(a, b, BN, ncclFloat32, comm, s));
  EXPECT_EQ(fk.sync(s), 0);
  if (!host) EXPECT(fk.copies() - c0 >= pieces * (1 + nranks)); /* in, then a copy back per block */
  for (int r = 0; r < nranks; r++)
    for (size_t i = 0; i < BN; i++) EXPECT(b[(size_t)r * BN + i] == value(r, i));
  for (size_t i = 0; i < all; i++) b[i] = i / BN == (size_t)rank ? value(rank, i % BN + 7) : -1.0f;
  NCCL_OK(ncclAllGather(b + (size_t)rank * BN, b, BN, ncclFloat32, comm, s)); /* in place */
  EXPECT_EQ(fk.sync(s), 0);
  for (int r = 0; r < nranks; r++)
    for (size_t i = 0; i < BN; i++) EXPECT(b[(size_t)r * BN + i] == value(r, i + 7));
  /* ReduceScatter: rank r gets the sum over ranks q of q's block r, value(q, r*BN + i) */
  for (size_t i = 0; i < all; i++) a[i] = value(rank, i);
  float base = 0;
  for (int q = 0; q < nranks; q++) base += (float)((q + 1) * 3);
  NCCL_OK(ncclReduceScatter(a, b, BN, ncclFloat32, ncclSum, comm, s));
  EXPECT_EQ(fk.sync(s), 0);
  for (size_t i = 0; i < BN; i++)
    EXPECT(b[i] == base + (float)nranks * (float)(((size_t)rank * BN + i) % 1021));
  NCCL_OK(ncclReduceScatter(a, a + (size_t)rank * BN, BN, ncclFloat32, ncclSum, comm, s)); /* in place */
  EXPECT_EQ(fk.sync(s), 0);
  for (size_t i = 0; i < BN; i++)
    EXPECT(a[(size_t)rank * BN + i] == base + (float)nranks * (float)(((size_t)rank * BN + i) % 1021));
  any_free(a, host), any_free(b, host);
}

static void blocks_body(int rank, int nranks, ncclUniqueId id, void* arg) {
  int mixed = arg != NULL && rank == 1;
  if (!arg) load_staged(PIECE_STR); /* processes */
  cudaStream_t s;
  ncclComm_t comm = open_rank(rank, nranks, id, 0x9600, &s);
  block_steps(comm, mixed ? NULL : s, rank, nranks, mixed);
  NCCL_OK(ncclCommDestroy(comm));
}

TEST_T(cuda_pieces, allgather_reducescatter_2_procs, 60) { rt_run_procs(2, blocks_body, NULL); }

TEST_T(cuda_pieces, allgather_reducescatter_host_and_device_buffers_3_threads, 60) {
  load_staged(PIECE_STR);
  rt_run_threads(3, blocks_body, (void*)1);
}

/* Rank 1 passes host buffers: it pieces its calls too (the choice is the communicator's), so the
 * ranks still meet call for call. */
static void mixed_body(int rank, int nranks, ncclUniqueId id, void* arg) {
  (void)arg;
  cudaStream_t s;
  ncclComm_t comm = open_rank(rank, nranks, id, 0x9100, &s);
  steps(comm, rank == 1 ? NULL : s, rank, nranks, rank == 1, 1);
  NCCL_OK(ncclCommDestroy(comm));
}

TEST_T(cuda_pieces, host_and_device_buffers_3_threads, 60) {
  load_staged(PIECE_STR);
  rt_run_threads(3, mixed_body, NULL);
}

/* The pool holds two pieces' blocks: later pieces wait for earlier ones to hand theirs back, many calls
 * in flight on the stream. */
static void pool_body(int rank, int nranks, ncclUniqueId id, void* arg) {
  (void)arg;
  cudaStream_t s;
  ncclComm_t comm = open_rank(rank, nranks, id, 0x9200, &s);
  float* x = dev_alloc(PN);
  for (size_t i = 0; i < PN; i++) x[i] = 1.0f;
  for (int it = 0; it < 5; it++) NCCL_OK(ncclAllReduce(x, x, PN, ncclFloat32, ncclSum, comm, s));
  EXPECT_EQ(fk.sync(s), 0);
  float want = 1.0f;
  for (int it = 0; it < 5; it++) want *= (float)nranks;
  for (size_t i = 0; i < PN; i++) EXPECT(x[i] == want);
  fk.free((uintptr_t)x);
  NCCL_OK(ncclCommDestroy(comm));
}

TEST_T(cuda_pieces, through_a_pool_of_two_blocks, 60) {
  load_staged(PIECE_STR);
  setenv("CHORUS_CUDA_STAGING_MAX_BYTES", "131072", 1);
  param_reset();
  rt_run_threads(2, pool_body, NULL);
  unsetenv("CHORUS_CUDA_STAGING_MAX_BYTES");
}

/* The input is written on the call's stream after the call is issued, while the stream is held: the
 * pieces' input copies (on the input stream) must wait for it. */
static int g_release;
static void held_body(int rank, int nranks, ncclUniqueId id, void* arg) {
  (void)arg;
  cudaStream_t s;
  ncclComm_t comm = open_rank(rank, nranks, id, 0x9300, &s);
  float* x = dev_alloc(PN);
  float* src = calloc(PN, sizeof(float));
  ASSERT(src);
  for (size_t i = 0; i < PN; i++) x[i] = -1.0f, src[i] = (float)(rank + 1);
  EXPECT_EQ(fk.hold(s, &g_release), 0);
  EXPECT_EQ(fk.copy(s, x, src, PN * sizeof(float)), 0);
  NCCL_OK(ncclAllReduce(x, x, PN, ncclFloat32, ncclSum, comm, s));
  usleep(100 * 1000);
  __atomic_store_n(&g_release, 1, __ATOMIC_RELEASE);
  EXPECT_EQ(fk.sync(s), 0);
  float want = (float)(nranks * (nranks + 1) / 2);
  for (size_t i = 0; i < PN; i++) EXPECT(x[i] == want);
  free(src);
  fk.free((uintptr_t)x);
  NCCL_OK(ncclCommDestroy(comm));
}

TEST_T(cuda_pieces, inputs_wait_for_the_calls_stream, 60) {
  load_staged(PIECE_STR);
  g_release = 0;
  rt_run_threads(2, held_body, NULL);
}

/* Inside a group the pieces are one group's calls: right results, one stream. */
static void group_body(int rank, int nranks, ncclUniqueId id, void* arg) {
  (void)arg;
  cudaStream_t s;
  ncclComm_t comm = open_rank(rank, nranks, id, 0x9400, &s);
  float* x = dev_alloc(PN);
  for (size_t i = 0; i < PN; i++) x[i] = (float)(rank + 2);
  NCCL_OK(ncclGroupStart());
  NCCL_OK(ncclAllReduce(x, x, PN, ncclFloat32, ncclProd, comm, s));
  NCCL_OK(ncclGroupEnd());
  EXPECT_EQ(fk.sync(s), 0);
  for (size_t i = 0; i < PN; i++) EXPECT(x[i] == 6.0f);
  fk.free((uintptr_t)x);
  NCCL_OK(ncclCommDestroy(comm));
}

TEST_T(cuda_pieces, in_a_group_2_threads, 60) {
  load_staged(PIECE_STR);
  rt_run_threads(2, group_body, NULL);
}

/* CHORUS_CUDA_STAGE_PIECE=0, or a rank without a context at init: whole calls on every rank. */
static void whole_body(int rank, int nranks, ncclUniqueId id, void* arg) {
  int no_ctx = arg != NULL && rank == 1;
  cudaStream_t s = (cudaStream_t)(uintptr_t)(0x9500 + 0x10 * rank);
  ncclComm_t comm;
  if (no_ctx) NCCL_OK(ncclCommInitRank(&comm, nranks, id, rank));
  else comm = open_rank(rank, nranks, id, 0x9500, &s);
  steps(comm, no_ctx ? NULL : s, rank, nranks, no_ctx, 0);
  NCCL_OK(ncclCommDestroy(comm));
}

TEST_T(cuda_pieces, whole_calls_when_off, 60) {
  load_staged("0");
  int c0 = fk.copies();
  rt_run_threads(2, whole_body, NULL);
  EXPECT(fk.copies() - c0 <= 2 * 4 * 2); /* 4 calls a rank, at most 2 copies each (in pieces: 2 a piece) */
}

TEST_T(cuda_pieces, whole_calls_when_a_rank_has_no_context, 60) {
  load_staged(PIECE_STR);
  int c0 = fk.copies();
  rt_run_threads(2, whole_body, (void*)1);
  EXPECT(fk.copies() - c0 <= 2 * 4); /* rank 0's calls only, whole */
}

TEST_T(cuda_pieces, whole_calls_when_synchronous, 60) {
  load_staged(PIECE_STR);
  setenv("CHORUS_CUDA_ASYNC", "0", 1); /* pieces would each wait for the stream */
  param_reset();
  int c0 = fk.copies();
  rt_run_threads(2, whole_body, NULL);
  EXPECT(fk.copies() - c0 <= 2 * 4 * 2);
  unsetenv("CHORUS_CUDA_ASYNC");
}
