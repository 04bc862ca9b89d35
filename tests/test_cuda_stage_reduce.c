/* Reductions of ranks that stage device buffers through host memory run on the GPU (staging/staging.c's
 * stage_reduce_way): host memory only moves the inputs (an AllGather, a Gather to the root, or an
 * AlltoAll then an AllGather of the reduced blocks) and Chorus's kernel combines them, which the
 * stand-in driver runs on the CPU and counts. CHORUS_CUDA_DIRECT=0 and CHORUS_CUDA_RELAY=0 stand in
 * for ranks on different hosts. Expected values in closed form. */
#define _GNU_SOURCE
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cuda_gpu_util.h"
#include "misc/param.h"
#include "runner.h"

#define SMALL 1001  /* 3 ranks: (n - 2) x 4004 bytes, gathered */
#define LARGE 40001 /* 3 ranks: split (an AlltoAll of 13333-element blocks, a tail of 2 gathered) */

static float value(int rank, size_t i) { return (float)((rank + 1) * 3 + (int)(i % 1021)); }
static float sum_of(int nranks, size_t i) {
  float s = 0;
  for (int r = 0; r < nranks; r++) s += value(r, i);
  return s;
}

/* AllReduce out of place and in place (sum, max, avg of int32), ReduceScatter out of place and in
 * place, Reduce to the last rank; kernels counted where this rank is a process of its own (procs).
 * host: this rank's buffers are host memory (its CPU combines). */
static void steps(ncclComm_t comm, cudaStream_t s, int rank, int nranks, size_t count, int host, int procs) {
  size_t all = count * (size_t)nranks;
  float *a = any_alloc(all, host), *b = any_alloc(all, host);
  for (size_t i = 0; i < count; i++) a[i] = value(rank, i);
  int k0 = fk.kernels();
  NCCL_OK(ncclAllReduce(a, b, count, ncclFloat32, ncclSum, comm, s));
  EXPECT_EQ(fk.sync(s), 0);
  if (procs) EXPECT(fk.kernels() > k0); /* procs: device buffers */
  for (size_t i = 0; i < count; i++) EXPECT(b[i] == sum_of(nranks, i));
  NCCL_OK(ncclAllReduce(a, a, count, ncclFloat32, ncclMax, comm, s));
  EXPECT_EQ(fk.sync(s), 0);
  for (size_t i = 0; i < count; i++) EXPECT(a[i] == value(nranks - 1, i));
  int32_t* ia = (int32_t*)a;
  for (size_t i = 0; i < count; i++) ia[i] = rank * 4 + (int32_t)(i % 100);
  NCCL_OK(ncclAllReduce(ia, ia, count, ncclInt32, ncclAvg, comm, s));
  EXPECT_EQ(fk.sync(s), 0);
  for (size_t i = 0; i < count; i++) EXPECT(ia[i] == 2 * (nranks - 1) + (int32_t)(i % 100));
  /* ReduceScatter: rank r gets the sum over ranks q of q's block r */
  for (size_t i = 0; i < all; i++) a[i] = value(rank, i);
  NCCL_OK(ncclReduceScatter(a, b, count, ncclFloat32, ncclSum, comm, s));
  EXPECT_EQ(fk.sync(s), 0);
  for (size_t i = 0; i < count; i++) EXPECT(b[i] == sum_of(nranks, (size_t)rank * count + i));
  NCCL_OK(ncclReduceScatter(a, a + (size_t)rank * count, count, ncclFloat32, ncclSum, comm, s)); /* in place */
  EXPECT_EQ(fk.sync(s), 0);
  for (size_t i = 0; i < count; i++) EXPECT(a[(size_t)rank * count + i] == sum_of(nranks, (size_t)rank * count + i));
  /* Reduce to the last rank; the others' receive buffers are not touched */
  int root = nranks - 1;
  for (size_t i = 0; i < count; i++) a[i] = value(rank, i), b[i] = -5.0f;
  k0 = fk.kernels();
  NCCL_OK(ncclReduce(a, b, count, ncclFloat32, ncclSum, root, comm, s));
  EXPECT_EQ(fk.sync(s), 0);
  for (size_t i = 0; i < count; i++) EXPECT(b[i] == (rank == root ? sum_of(nranks, i) : -5.0f));
  if (procs && rank != root) EXPECT_EQ(fk.kernels(), k0); /* gathered at the root, or on the CPU (large) */
  any_free(a, host), any_free(b, host);
}

struct arg {
  size_t count;
  int host_rank; /* this rank passes host buffers (-1: none) */
};

static void body(int rank, int nranks, ncclUniqueId id, void* p) {
  const struct arg* a = p;
  cudaStream_t s;
  ncclComm_t comm = open_rank(rank, nranks, id, 0xb000, &s);
  steps(comm, rank == a->host_rank ? NULL : s, rank, nranks, a->count, rank == a->host_rank, 0);
  NCCL_OK(ncclCommDestroy(comm));
}

static void procs_body(int rank, int nranks, ncclUniqueId id, void* p) {
  const struct arg* a = p;
  load_staged("0");
  cudaStream_t s;
  ncclComm_t comm = open_rank(rank, nranks, id, 0xb100, &s);
  steps(comm, s, rank, nranks, a->count, 0, 1);
  NCCL_OK(ncclCommDestroy(comm));
}

TEST_T(cuda_stage_reduce, gathered_and_split_3_procs, 60) {
  if (no_kernels()) return;
  rt_run_procs(3, procs_body, &(struct arg){.count = SMALL, .host_rank = -1});
  rt_run_procs(3, procs_body, &(struct arg){.count = LARGE, .host_rank = -1});
}

TEST_T(cuda_stage_reduce, two_procs, 60) {
  if (no_kernels()) return;
  rt_run_procs(2, procs_body, &(struct arg){.count = LARGE, .host_rank = -1});
}

/* Rank 1 passes host buffers: it makes the same calls, its CPU combining what they bring. */
TEST_T(cuda_stage_reduce, host_buffers_on_one_rank_3_threads, 60) {
  if (no_kernels()) return;
  load_staged("0");
  rt_run_threads(3, body, &(struct arg){.count = SMALL, .host_rank = 1});
  rt_run_threads(3, body, &(struct arg){.count = LARGE, .host_rank = 1});
}

/* Large calls in pieces, each piece split (3 ranks) or gathered (2). */
TEST_T(cuda_stage_reduce, in_pieces_3_threads, 60) {
  if (no_kernels()) return;
  load_staged("65536");
  rt_run_threads(3, body, &(struct arg){.count = 100003, .host_rank = -1});
  rt_run_threads(2, body, &(struct arg){.count = 100003, .host_rank = -1});
}

/* The pinned budget is smaller than a call: it completes before returning, its CPU combining. */
TEST_T(cuda_stage_reduce, synchronous_calls_combine_on_the_cpu_2_threads, 60) {
  if (no_kernels()) return;
  load_staged("0");
  setenv("CHORUS_CUDA_STAGING_MAX_BYTES", "4096", 1);
  param_reset();
  int k0 = fk.kernels();
  rt_run_threads(2, body, &(struct arg){.count = LARGE, .host_rank = -1});
  EXPECT_EQ(fk.kernels(), k0);
}

/* One rank turns it off (CHORUS_CUDA_STAGE_REDUCE=0): off on every rank, the CPUs reduce. */
static void off_body(int rank, int nranks, ncclUniqueId id, void* p) {
  if (rank == 1) setenv("CHORUS_CUDA_STAGE_REDUCE", "0", 1);
  load_staged("0");
  int k0 = fk.kernels();
  cudaStream_t s;
  ncclComm_t comm = open_rank(rank, nranks, id, 0xb200, &s);
  steps(comm, s, rank, nranks, ((const struct arg*)p)->count, 0, 0);
  EXPECT_EQ(fk.kernels(), k0);
  NCCL_OK(ncclCommDestroy(comm));
}

TEST_T(cuda_stage_reduce, off_on_one_rank_is_off_on_all_2_procs, 60) {
  if (no_kernels()) return;
  rt_run_procs(2, off_body, &(struct arg){.count = LARGE, .host_rank = -1});
}

/* PreMulSum (each rank's scalar is its own) and a reproducible level reduce on the CPU. */
static void cpu_body(int rank, int nranks, ncclUniqueId id, void* p) {
  (void)p;
  load_staged("0");
  cudaStream_t s;
  ncclComm_t comm = open_rank(rank, nranks, id, 0xb300, &s);
  double* d = (double*)dev_alloc(2 * 500);
  for (int i = 0; i < 500; i++) d[i] = (double)i;
  double scalar = (double)(rank + 1);
  ncclRedOp_t op;
  NCCL_OK(ncclRedOpCreatePreMulSum(&op, &scalar, ncclFloat64, ncclScalarHostImmediate, comm));
  int k0 = fk.kernels();
  NCCL_OK(ncclAllReduce(d, d, 500, ncclFloat64, op, comm, s));
  EXPECT_EQ(fk.sync(s), 0);
  for (int i = 0; i < 500; i++) EXPECT(d[i] == (double)(nranks * (nranks + 1) / 2) * i);
  NCCL_OK(ncclRedOpDestroy(op, comm));
  ncclComm_t rc; /* a reproducible level is set before a communicator's first call */
  NCCL_OK(ncclCommSplit(comm, 0, rank, &rc, NULL));
  NCCL_OK(chorusCommSetReproducible(rc, 1));
  float* x = (float*)d;
  for (int i = 0; i < 1000; i++) x[i] = value(rank, (size_t)i);
  NCCL_OK(ncclAllReduce(x, x, 1000, ncclFloat32, ncclSum, rc, s));
  EXPECT_EQ(fk.sync(s), 0);
  for (int i = 0; i < 1000; i++) EXPECT(x[i] == sum_of(nranks, (size_t)i));
  EXPECT_EQ(fk.kernels(), k0);
  fk.free((uintptr_t)d);
  NCCL_OK(ncclCommDestroy(rc));
  NCCL_OK(ncclCommDestroy(comm));
}

TEST_T(cuda_stage_reduce, premulsum_and_reproducible_on_the_cpu_2_procs, 60) {
  if (no_kernels()) return;
  rt_run_procs(2, cpu_body, NULL);
}

/* Inside a group: a split AllReduce's AllGather is queued once the group has launched (it copies in
 * what the AlltoAll's kernel wrote), so the GPU reduces there too. */
static void group_body(int rank, int nranks, ncclUniqueId id, void* p) {
  (void)p;
  cudaStream_t s;
  ncclComm_t comm = open_rank(rank, nranks, id, 0xb500, &s);
  size_t all = (size_t)nranks * LARGE;
  float *a = dev_alloc(all), *b = dev_alloc(all), *c = dev_alloc(LARGE);
  for (size_t i = 0; i < all; i++) a[i] = value(rank, i);
  int k0 = fk.kernels();
  NCCL_OK(ncclGroupStart());
  NCCL_OK(ncclAllReduce(a, b, LARGE, ncclFloat32, ncclSum, comm, s));
  NCCL_OK(ncclReduceScatter(a, c, LARGE, ncclFloat32, ncclSum, comm, s));
  NCCL_OK(ncclGroupEnd());
  EXPECT_EQ(fk.sync(s), 0);
  EXPECT(fk.kernels() > k0);
  for (size_t i = 0; i < LARGE; i++) EXPECT(b[i] == sum_of(nranks, i));
  for (size_t i = 0; i < LARGE; i++) EXPECT(c[i] == sum_of(nranks, (size_t)rank * LARGE + i));
  fk.free((uintptr_t)a), fk.free((uintptr_t)b), fk.free((uintptr_t)c);
  NCCL_OK(ncclCommDestroy(comm));
}

TEST_T(cuda_stage_reduce, in_a_group_3_threads, 60) {
  if (no_kernels()) return;
  load_staged("0");
  rt_run_threads(3, group_body, NULL);
}

/* Rank 0 wraps its one AllReduce in a group (as ProcessGroupNCCL does), the others do not: the same
 * calls either way. */
static void one_grouped_body(int rank, int nranks, ncclUniqueId id, void* p) {
  (void)p;
  load_staged("0");
  cudaStream_t s;
  ncclComm_t comm = open_rank(rank, nranks, id, 0xb600, &s);
  float *a = dev_alloc(LARGE), *b = dev_alloc(LARGE);
  for (size_t i = 0; i < LARGE; i++) a[i] = value(rank, i);
  int k0 = fk.kernels();
  for (int it = 0; it < 2; it++) {
    if (rank == 0) NCCL_OK(ncclGroupStart());
    NCCL_OK(ncclAllReduce(a, b, LARGE, ncclFloat32, ncclSum, comm, s));
    if (rank == 0) NCCL_OK(ncclGroupEnd());
  }
  EXPECT_EQ(fk.sync(s), 0);
  EXPECT(fk.kernels() > k0);
  for (size_t i = 0; i < LARGE; i++) EXPECT(b[i] == sum_of(nranks, i));
  /* ncclAvg on floats (a PreMulSum by 1/n every rank knows): on the GPU too */
  k0 = fk.kernels();
  NCCL_OK(ncclAllReduce(a, b, LARGE, ncclFloat32, ncclAvg, comm, s));
  EXPECT_EQ(fk.sync(s), 0);
  EXPECT(fk.kernels() > k0);
  if (nranks == 2)
    for (size_t i = 0; i < LARGE; i++) EXPECT(b[i] == sum_of(nranks, i) / 2);
  fk.free((uintptr_t)a), fk.free((uintptr_t)b);
  NCCL_OK(ncclCommDestroy(comm));
}

TEST_T(cuda_stage_reduce, one_rank_grouped_3_procs_and_avg_2_procs, 60) {
  if (no_kernels()) return;
  rt_run_procs(3, one_grouped_body, NULL);
  rt_run_procs(2, one_grouped_body, NULL);
}

/* Where the CPU combines (a rank passing host buffers), 16-bit floats are carried in float across all
 * blocks and rounded once, as the kernel does, so every rank gets the same bits: 1 + 2^-8 + 2^-8 is
 * 1 + 2^-7 in bfloat16, where rounding after each addition would give 1. mixed: ranks 0 and 2 pass
 * device buffers (the kernel reduces there), else every rank host buffers. */
static void bf16_body(int rank, int nranks, ncclUniqueId id, void* p) {
  int dev = p != NULL && rank != 1;
  cudaStream_t s;
  ncclComm_t comm = open_rank(rank, nranks, id, 0xb700, &s);
  uint16_t h[64], *x = dev ? (uint16_t*)dev_alloc(32) : h;
  for (int i = 0; i < 64; i++) x[i] = rank == 0 ? 0x3f80 : 0x3b80; /* 1.0, 2^-8 */
  NCCL_OK(ncclAllReduce(x, x, 64, ncclBfloat16, ncclSum, comm, dev ? s : NULL));
  if (dev) EXPECT_EQ(fk.sync(s), 0);
  for (int i = 0; i < 64; i++) EXPECT_EQ(x[i], 0x3f81); /* 1 + 2^-7 */
  if (dev) fk.free((uintptr_t)x);
  NCCL_OK(ncclCommDestroy(comm));
}

TEST_T(cuda_stage_reduce, bits_alike_on_cpu_and_gpu_for_16_bit_floats_3_threads, 60) {
  if (no_kernels()) return;
  load_staged("0");
  rt_run_threads(3, bf16_body, NULL);
  rt_run_threads(3, bf16_body, (void*)1);
}

/* A split AllReduce captured into a CUDA graph and replayed with new inputs. */
static void graph_body(int rank, int nranks, ncclUniqueId id, void* p) {
  (void)p;
  cudaStream_t s;
  ncclComm_t comm = open_rank(rank, nranks, id, 0xb400, &s);
  float *x = dev_alloc(LARGE), *y = dev_alloc(LARGE);
  float* src = malloc(LARGE * sizeof(float));
  ASSERT(src);
  NCCL_OK(ncclAllReduce(x, y, LARGE, ncclFloat32, ncclSum, comm, s)); /* eager first: connected */
  EXPECT_EQ(fk.sync(s), 0);
  fk.begin_capture(s);
  NCCL_OK(ncclAllReduce(x, y, LARGE, ncclFloat32, ncclSum, comm, s));
  void* graph = fk.end_capture(s);
  ASSERT(graph != NULL);
  for (int k = 0; k < 3; k++) {
    for (size_t i = 0; i < LARGE; i++) src[i] = value(rank + k, i);
    EXPECT_EQ(fk.copy(s, x, src, LARGE * sizeof(float)), 0);
    EXPECT_EQ(fk.graph_launch(graph, s), 0);
    EXPECT_EQ(fk.sync(s), 0);
    for (size_t i = 0; i < LARGE; i++) {
      float want = 0;
      for (int r = 0; r < nranks; r++) want += value(r + k, i);
      EXPECT(y[i] == want);
    }
  }
  fk.graph_destroy(graph);
  free(src);
  fk.free((uintptr_t)x), fk.free((uintptr_t)y);
  NCCL_OK(ncclCommDestroy(comm));
}

TEST_T(cuda_stage_reduce, split_captured_and_replayed_3_threads, 60) {
  if (no_kernels()) return;
  load_staged("0");
  rt_run_threads(3, graph_body, NULL);
}
