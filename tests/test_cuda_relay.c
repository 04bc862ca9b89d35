/* The relay (gpu/relay.c): ranks of one host on different GPUs (the stand-in driver's FAKE_CUDA_UUID
 * puts a process "on another GPU") or with CHORUS_CUDA_RELAY=1 run their collectives through pinned
 * host memory every rank maps, chunk by chunk, each GPU reducing (the stand-in runs the kernels on the
 * CPU). Calls span several chunks with a ring of two entries, so entries are refilled within a call and
 * across calls of different kinds; expected values in closed form. */
#define _GNU_SOURCE
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "chorus.h"
#include "comm/comm.h"
#include "gpu/gpu.h"
#include "misc/param.h"
#include "nccl.h"
#include "cuda_gpu_util.h"
#include "runner.h"

#define M 70001 /* elements per rank: five 64 KiB chunks of floats, the last one short */

struct relay_arg {
  int apart;    /* process ranks: odd ranks "on another GPU" */
  int relay;    /* the communicator must (1) or must not (0) relay */
};

static void* dev_bytes(size_t n) {
  uintptr_t d = 0;
  ASSERT(fk.alloc(&d, n) == 0);
  return (void*)d;
}

static ncclComm_t relay_rank(int rank, int nranks, ncclUniqueId id, const struct relay_arg* ra, cudaStream_t* s) {
  if (ra->apart && rank % 2) setenv("FAKE_CUDA_UUID", "01", 1);
  ncclComm_t comm = open_rank(rank, nranks, id, 0x9000, s);
  struct gpu_comm* g = comm->gpu;
  EXPECT_EQ(g != NULL && g->relay, ra->relay);
  return comm;
}

static void relay_body(int rank, int nranks, ncclUniqueId id, void* arg) {
  const struct relay_arg* ra = arg;
  cudaStream_t s;
  ncclComm_t comm = relay_rank(rank, nranks, id, ra, &s);
  int n = nranks, kernels0 = fk.kernels();
  size_t all = (size_t)M * n;
  float *a = dev_alloc(all), *b = dev_alloc(all);
  /* AllReduce, out of place */
  for (size_t i = 0; i < all; i++) a[i] = (float)(rank + (int)(i % 1000)), b[i] = -1;
  NCCL_OK(ncclAllReduce(a, b, M, ncclFloat32, ncclSum, comm, s));
  ASSERT_EQ(fk.sync(s), 0);
  for (int i = 0; i < M; i++) EXPECT(b[i] == (float)(n * (n - 1) / 2 + n * (i % 1000)));
  for (int i = M; i < M + 8; i++) EXPECT(b[i] == -1); /* nothing past the count */
  /* AllReduce of bytes in place (1-byte elements, sums wrap), then Max of int32 in place */
  uint8_t* u = dev_bytes((size_t)M + 3);
  for (int i = 0; i < M + 3; i++) u[i] = (uint8_t)(rank * 50 + i);
  NCCL_OK(ncclAllReduce(u, u, (size_t)M + 3, ncclUint8, ncclSum, comm, s));
  ASSERT_EQ(fk.sync(s), 0);
  for (int i = 0; i < M + 3; i++) EXPECT(u[i] == (uint8_t)(50 * n * (n - 1) / 2 + n * i));
  int32_t* ia = (int32_t*)a;
  for (int i = 0; i < M; i++) ia[i] = rank == (i % n) ? 1000000 + i : i;
  NCCL_OK(ncclAllReduce(ia, ia, M, ncclInt32, ncclMax, comm, s));
  ASSERT_EQ(fk.sync(s), 0);
  for (int i = 0; i < M; i++) EXPECT(ia[i] == 1000000 + i);
  /* ReduceScatter, out of place: block `rank` of the sum */
  for (size_t j = 0; j < all; j++) a[j] = (float)(rank * 3 + (int)(j % 977));
  NCCL_OK(ncclReduceScatter(a, b, M, ncclFloat32, ncclSum, comm, s));
  ASSERT_EQ(fk.sync(s), 0);
  for (int i = 0; i < M; i++) EXPECT(b[i] == (float)(3 * n * (n - 1) / 2 + n * (int)(((size_t)rank * M + i) % 977)));
  /* AllGather in place: my block sits at rank * M */
  for (int i = 0; i < M; i++) a[(size_t)rank * M + i] = (float)(rank * 1000 + i % 500);
  NCCL_OK(ncclAllGather(a + (size_t)rank * M, a, M, ncclFloat32, comm, s));
  ASSERT_EQ(fk.sync(s), 0);
  for (int r = 0; r < n; r++)
    for (int i = 0; i < M; i++) EXPECT(a[(size_t)r * M + i] == (float)(r * 1000 + i % 500));
  /* Broadcast from the last rank, out of place */
  for (int i = 0; i < M; i++) a[i] = (float)(rank * 7 + i % 300);
  NCCL_OK(ncclBroadcast(a, b, M, ncclFloat32, n - 1, comm, s));
  ASSERT_EQ(fk.sync(s), 0);
  for (int i = 0; i < M; i++) EXPECT(b[i] == (float)((n - 1) * 7 + i % 300));
  /* Reduce (Avg of int32) to rank 0: the others' receive buffers stay as they were */
  for (int i = 0; i < M; i++) ia[i] = rank * 4 + i % 100, ((int32_t*)b)[i] = -5;
  NCCL_OK(ncclReduce(ia, b, M, ncclInt32, ncclAvg, 0, comm, s));
  ASSERT_EQ(fk.sync(s), 0);
  for (int i = 0; i < M; i++) EXPECT(((int32_t*)b)[i] == (rank == 0 ? 2 * (n - 1) + i % 100 : -5));
  int relayed = fk.kernels() - kernels0;
  /* PreMulSum (every rank's scalar from the bridge), then Send/Recv (not relayed: through host memory
   * on the same communicator) */
  double scalar = (double)(rank + 1);
  ncclRedOp_t op;
  NCCL_OK(ncclRedOpCreatePreMulSum(&op, &scalar, ncclFloat64, ncclScalarHostImmediate, comm));
  double* da = (double*)a;
  for (int i = 0; i < 500; i++) da[i] = (double)i;
  NCCL_OK(ncclAllReduce(da, da, 500, ncclFloat64, op, comm, s));
  ASSERT_EQ(fk.sync(s), 0);
  for (int i = 0; i < 500; i++) EXPECT(da[i] == (double)(n * (n + 1) / 2) * i);
  NCCL_OK(ncclRedOpDestroy(op, comm));
  for (int i = 0; i < 1000; i++) a[i] = (float)(rank * 10000 + i);
  NCCL_OK(ncclGroupStart());
  NCCL_OK(ncclSend(a, 1000, ncclFloat32, (rank + 1) % n, comm, s));
  NCCL_OK(ncclRecv(b, 1000, ncclFloat32, (rank + n - 1) % n, comm, s));
  NCCL_OK(ncclGroupEnd());
  ASSERT_EQ(fk.sync(s), 0);
  for (int i = 0; i < 1000; i++) EXPECT(b[i] == (float)(((rank + n - 1) % n) * 10000 + i));
  /* Each rank's kernels: one per chunk of its reductions (the stand-in counts every process's own) */
  if (ra->relay) EXPECT(relayed >= 5 * 3 + 2);
  else EXPECT_EQ(relayed, 0);
  NCCL_OK(ncclCommDestroy(comm));
  EXPECT_EQ(fk.free((uintptr_t)a), 0);
  EXPECT_EQ(fk.free((uintptr_t)b), 0);
  EXPECT_EQ(fk.free((uintptr_t)u), 0);
}

/* Chunks of 64 KiB, two at a time per rank: every call refills the ring. */
static void small_ring(const char* relay) {
  setenv("CHORUS_CUDA_RELAY_CHUNK", "65536", 1);
  setenv("CHORUS_CUDA_RELAY_DEPTH", "2", 1);
  if (relay) setenv("CHORUS_CUDA_RELAY", relay, 1);
  else unsetenv("CHORUS_CUDA_RELAY");
  param_reset();
}

/* A test of process ranks: the stand-in, small_ring(relay), then body on `from` to `to` processes
 * (with ra: which odd ranks are on another GPU, whether they must relay). Nothing where the build has
 * no kernels. */
static void procs(const char* relay, struct relay_arg ra, rt_rank_fn body, int from, int to) {
  if (no_kernels()) return;
  load();
  small_ring(relay);
  for (int n = from; n <= to; n++) rt_run_procs(n, body, &ra);
}

TEST_T(cuda_relay, five_collectives_procs_on_two_gpus, 120) {
  procs(NULL, (struct relay_arg){.apart = 1, .relay = 1}, relay_body, 2, 4);
}

/* CHORUS_CUDA_RELAY=1: ranks on one GPU relay too (for comparisons). Processes and threads in tests
 * of their own: the stand-in's stream threads do not survive a fork. */
TEST_T(cuda_relay, forced_on_one_gpu_procs, 60) { procs("1", (struct relay_arg){.relay = 1}, relay_body, 2, 3); }

TEST_T(cuda_relay, forced_on_one_gpu_threads, 60) {
  if (no_kernels()) return;
  load();
  small_ring("1");
  struct relay_arg ra = {.relay = 1};
  for (int n = 2; n <= 3; n++) rt_run_threads(n, relay_body, &ra);
  EXPECT_EQ(fk.registered(), 0); /* the shared page and its rings given back */
}

/* CHORUS_CUDA_RELAY=0: ranks on different GPUs stage whole buffers through host memory, as before. */
TEST_T(cuda_relay, off_stages_through_the_host, 60) {
  setenv("CHORUS_CUDA_STAGE_REDUCE", "0", 1); /* the CPU reduces staged copies: no kernel at all */
  procs("0", (struct relay_arg){.apart = 1, .relay = 0}, relay_body, 2, 2);
}

/* Ranks that call with different counts: the bridge's check fails the communicator on every rank, by
 * name, and the streams waiting for pieces that never come are let through. */
static void mismatch_steps(ncclComm_t comm, cudaStream_t s, int rank, float* a, float* b) {
  NCCL_OK(ncclAllReduce(a, b, rank == 1 ? M + 20000 : M, ncclFloat32, ncclSum, comm, s));
  expect_failed(comm, ncclInvalidUsage, "differs");
}

static void mismatch_body(int rank, int nranks, ncclUniqueId id, void* arg) {
  cudaStream_t s;
  ncclComm_t comm = relay_rank(rank, nranks, id, arg, &s);
  float *a = dev_alloc((size_t)M + 20000), *b = dev_alloc((size_t)M + 20000);
  mismatch_steps(comm, s, rank, a, b);
  EXPECT_EQ(fk.sync(s), 0); /* the stream was let through */
  NCCL_OK(ncclCommDestroy(comm));
}

TEST_T(cuda_relay, count_mismatch_fails_every_rank, 60) {
  procs(NULL, (struct relay_arg){.apart = 1, .relay = 1}, mismatch_body, 2, 2);
}

/* A peer process dies while this rank's streams wait for its pieces (no host call is waiting, only the
 * GPU): the watcher finds it gone, fails the communicator naming it, and the streams run on. */
static void dead_peer_body(int rank, int nranks, ncclUniqueId id, void* arg) {
  cudaStream_t s;
  ncclComm_t comm = relay_rank(rank, nranks, id, arg, &s);
  dead_peer_steps(comm, s, rank, M);
}

TEST_T(cuda_relay, peer_dies_while_the_streams_wait, 60) {
  procs(NULL, (struct relay_arg){.apart = 1, .relay = 1}, dead_peer_body, 2, 2);
}

/* CHORUS_TIMEOUT: a peer whose stream never reaches the call (alive, held) fails the call on the
 * others once the timeout passes, instead of holding their streams for ever. */
static void held_peer_body(int rank, int nranks, ncclUniqueId id, void* arg) {
  cudaStream_t s;
  ncclComm_t comm = relay_rank(rank, nranks, id, arg, &s);
  held_peer_steps(comm, s, rank, M);
}

TEST_T(cuda_relay, stream_that_never_arrives_times_out, 60) {
  setenv("CHORUS_TIMEOUT", "1", 1); /* read at small_ring's param_reset */
  procs(NULL, (struct relay_arg){.apart = 1, .relay = 1}, held_peer_body, 2, 2);
}

/* Calls of every relayed kind back to back, no synchronisation between them: ring entries are
 * refilled while a peer may still be consuming the previous call, a Reduce's non-roots and a
 * Broadcast's non-roots count pieces they had no work for. Checked once at the end. */
static void burst_body(int rank, int nranks, ncclUniqueId id, void* arg) {
  cudaStream_t s;
  ncclComm_t comm = relay_rank(rank, nranks, id, arg, &s);
  int n = nranks;
  size_t all = (size_t)M * n;
  float *a = dev_alloc(all), *ar = dev_alloc(M), *bc = dev_alloc(M), *rd = dev_alloc(M), *rs = dev_alloc(M),
        *ag = dev_alloc(all);
  for (size_t i = 0; i < all; i++) a[i] = (float)(rank + (int)(i % 1000));
  for (int i = 0; i < M; i++) rd[i] = -5;
  for (int round = 0; round < 3; round++) {
    NCCL_OK(ncclAllReduce(a, ar, M, ncclFloat32, ncclSum, comm, s));
    NCCL_OK(ncclBroadcast(a, bc, M, ncclFloat32, n - 1, comm, s));
    NCCL_OK(ncclReduce(a, rd, M, ncclFloat32, ncclMax, 0, comm, s));
    NCCL_OK(ncclReduceScatter(a, rs, M, ncclFloat32, ncclSum, comm, s));
    NCCL_OK(ncclAllGather(a, ag, M, ncclFloat32, comm, s));
  }
  ASSERT_EQ(fk.sync(s), 0);
  for (int i = 0; i < M; i++) {
    EXPECT(ar[i] == (float)(n * (n - 1) / 2 + n * (i % 1000)));
    EXPECT(bc[i] == (float)(n - 1 + i % 1000));
    EXPECT(rd[i] == (rank == 0 ? (float)(n - 1 + i % 1000) : -5.0f));
    EXPECT(rs[i] == (float)(n * (n - 1) / 2 + n * (int)(((size_t)rank * M + i) % 1000)));
  }
  for (int r = 0; r < n; r++)
    for (int i = 0; i < M; i++) EXPECT(ag[(size_t)r * M + i] == (float)(r + i % 1000));
  NCCL_OK(ncclCommDestroy(comm));
}

TEST_T(cuda_relay, every_kind_back_to_back_procs, 60) {
  procs(NULL, (struct relay_arg){.apart = 1, .relay = 1}, burst_body, 2, 3);
}

/* One thread drives two ranks (ncclCommInitAll, CHORUS_CUDA_RELAY=1), each call a group over both,
 * more calls in flight than a communicator has table slots: nothing waits on the launching thread
 * for the GPU (the bridge fills the tables). */
TEST_T(cuda_relay, one_thread_two_ranks_many_in_flight, 60) {
  if (no_kernels()) return;
  load();
  small_ring("1");
  set_device();
  ncclComm_t comms[2];
  NCCL_OK(ncclCommInitAll(comms, 2, NULL));
  EXPECT(comms[0]->gpu && comms[0]->gpu->relay);
  cudaStream_t s[2] = {(cudaStream_t)0x9a00, (cudaStream_t)0x9a10};
  float* buf[2];
  for (int r = 0; r < 2; r++) {
    buf[r] = dev_alloc(1000);
    for (int i = 0; i < 1000; i++) buf[r][i] = (float)(r + i);
  }
  for (int k = 0; k < 2 * GPU_SLOTS + 10; k++) { /* max of both: the values stay */
    NCCL_OK(ncclGroupStart());
    for (int r = 0; r < 2; r++) NCCL_OK(ncclAllReduce(buf[r], buf[r], 1000, ncclFloat32, ncclMax, comms[r], s[r]));
    NCCL_OK(ncclGroupEnd());
  }
  for (int r = 0; r < 2; r++) ASSERT_EQ(fk.sync(s[r]), 0);
  for (int r = 0; r < 2; r++)
    for (int i = 0; i < 1000; i++) EXPECT(buf[r][i] == (float)(1 + i));
  for (int r = 0; r < 2; r++) NCCL_OK(ncclCommDestroy(comms[r]));
}

/* A buffer the kernels cannot load whole elements from (one rank's, 2 bytes off): every rank fails the
 * call naming it, and nothing touches it. */
static void misaligned_body(int rank, int nranks, ncclUniqueId id, void* arg) {
  cudaStream_t s;
  ncclComm_t comm = relay_rank(rank, nranks, id, arg, &s);
  float* a = dev_alloc((size_t)M + 1);
  float* p = rank == 1 ? (float*)((char*)a + 2) : a;
  NCCL_OK(ncclAllReduce(p, p, M, ncclFloat32, ncclSum, comm, s));
  expect_failed(comm, ncclInvalidArgument, "not aligned");
  EXPECT_EQ(fk.sync(s), 0);
  NCCL_OK(ncclCommDestroy(comm));
}

TEST_T(cuda_relay, misaligned_buffer_fails_every_rank, 60) {
  procs(NULL, (struct relay_arg){.apart = 1, .relay = 1}, misaligned_body, 2, 2);
}

/* AlltoAll, Gather and Scatter relayed (a slice of each block side by side in a piece where each rank
 * takes another block), out of place and in place, every root. */
static void three_body(int rank, int nranks, ncclUniqueId id, void* arg) {
  cudaStream_t s;
  ncclComm_t comm = relay_rank(rank, nranks, id, arg, &s);
  int kernels0 = fk.kernels();
  three_steps(comm, s, rank, nranks, M);
  EXPECT_EQ(fk.kernels(), kernels0); /* copies only: no kernel */
  NCCL_OK(ncclCommDestroy(comm));
}

TEST_T(cuda_relay, alltoall_gather_scatter_procs, 60) {
  procs(NULL, (struct relay_arg){.apart = 1, .relay = 1}, three_body, 2, 3);
}

/* CUDA graphs on the relay: an AllReduce, a ReduceScatter and an AllGather (five pieces each through a
 * ring of two entries: entries refilled within the call) captured in one graph, a Broadcast and a
 * Reduce (ranks that produce or consume nothing) in a second, nothing run by the capture; both
 * replayed back to back with new inputs, an eager call queued right before or right after them
 * without a synchronisation between (it numbers its pieces on, the graphs count theirs from 0);
 * results in closed form every time. */
static void graph_body(int rank, int nranks, ncclUniqueId id, void* arg) {
  cudaStream_t s;
  ncclComm_t comm = relay_rank(rank, nranks, id, arg, &s);
  int n = nranks;
  size_t all = (size_t)M * n;
  float *a = dev_alloc(all), *ar = dev_alloc(M), *rs = dev_alloc(M), *ag = dev_alloc(all), *e = dev_alloc(M),
        *bc = dev_alloc(M), *rd = dev_alloc(M);
  for (int i = 0; i < M; i++) ar[i] = rs[i] = rd[i] = -1;
  void* graph[2];
  fk.begin_capture(s);
  NCCL_OK(ncclAllReduce(a, ar, M, ncclFloat32, ncclSum, comm, s));
  NCCL_OK(ncclReduceScatter(a, rs, M, ncclFloat32, ncclSum, comm, s));
  NCCL_OK(ncclAllGather(a, ag, M, ncclFloat32, comm, s));
  graph[0] = fk.end_capture(s);
  fk.begin_capture(s);
  NCCL_OK(ncclBroadcast(a, bc, M, ncclFloat32, n - 1, comm, s));
  NCCL_OK(ncclReduce(a, rd, M, ncclFloat32, ncclMax, 0, comm, s));
  graph[1] = fk.end_capture(s);
  ASSERT(graph[0] != NULL && graph[1] != NULL);
  EXPECT(fk.graph_ops(graph[0]) > 0 && fk.graph_ops(graph[1]) > 0);
  ASSERT_EQ(fk.sync(s), 0);
  for (int i = 0; i < M; i++) EXPECT(ar[i] == -1 && rs[i] == -1 && rd[i] == -1); /* captured, not run */
  for (int rep = 0; rep < 12; rep++) {
    for (size_t i = 0; i < all; i++) a[i] = (float)(rank + rep + (int)(i % 1000));
    int eager = rep % 3; /* 1: right after the replays, 2: right before them */
    if (eager == 2) NCCL_OK(ncclAllReduce(a, e, M, ncclFloat32, ncclMax, comm, s));
    ASSERT_EQ(fk.graph_launch(graph[0], s), 0);
    ASSERT_EQ(fk.graph_launch(graph[1], s), 0);
    if (eager == 1) NCCL_OK(ncclAllReduce(a, e, M, ncclFloat32, ncclMax, comm, s));
    ASSERT_EQ(fk.sync(s), 0);
    int bad = 0;
    for (int i = 0; i < M && !bad; i++) {
      float base = (float)(n * (n - 1) / 2 + n * rep), top = (float)(n - 1 + rep + i % 1000);
      bad = ar[i] != base + (float)(n * (i % 1000)) ||
            rs[i] != base + (float)(n * (int)(((size_t)rank * M + i) % 1000)) || bc[i] != top ||
            rd[i] != (rank == 0 ? top : -1.0f) || (eager && e[i] != top);
      for (int r = 0; r < n && !bad; r++) bad = ag[(size_t)r * M + i] != (float)(r + rep + i % 1000);
      if (bad) rt_fail(__FILE__, __LINE__, "rank %d replay %d [%d]: %g %g %g %g", rank, rep, i, ar[i], rs[i], bc[i], rd[i]);
    }
  }
  fk.graph_destroy(graph[0]), fk.graph_destroy(graph[1]);
  NCCL_OK(ncclCommDestroy(comm));
  fk.free((uintptr_t)a), fk.free((uintptr_t)ar), fk.free((uintptr_t)rs), fk.free((uintptr_t)ag), fk.free((uintptr_t)e);
  fk.free((uintptr_t)bc), fk.free((uintptr_t)rd);
}

TEST_T(cuda_relay, graph_capture_and_replay_procs, 120) {
  procs(NULL, (struct relay_arg){.apart = 1, .relay = 1}, graph_body, 2, 3);
}

/* A replay after the communicator failed (a count mismatch on an eager call) is let through once, on
 * every rank: its two barriers have a flag pair each, which the failure sets. */
static void graph_after_failure_body(int rank, int nranks, ncclUniqueId id, void* arg) {
  cudaStream_t s;
  ncclComm_t comm = relay_rank(rank, nranks, id, arg, &s);
  float *a = dev_alloc((size_t)M + 20000), *b = dev_alloc((size_t)M + 20000);
  fk.begin_capture(s);
  NCCL_OK(ncclAllReduce(a, b, M, ncclFloat32, ncclSum, comm, s));
  void* graph = fk.end_capture(s);
  ASSERT(graph != NULL);
  mismatch_steps(comm, s, rank, a, b);
  ASSERT_EQ(fk.graph_launch(graph, s), 0);
  EXPECT_EQ(fk.sync(s), 0); /* the replay was let through */
  fk.graph_destroy(graph);
  NCCL_OK(ncclCommDestroy(comm));
  fk.free((uintptr_t)a), fk.free((uintptr_t)b);
}

TEST_T(cuda_relay, graph_replay_after_a_failure_ends, 60) {
  procs(NULL, (struct relay_arg){.apart = 1, .relay = 1}, graph_after_failure_body, 2, 3);
}

TEST_T(cuda_relay, graph_capture_and_replay_threads, 60) {
  if (no_kernels()) return;
  load();
  small_ring("1");
  struct relay_arg ra = {.relay = 1};
  rt_run_threads(2, graph_body, &ra);
}
