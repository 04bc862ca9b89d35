/* Calls through host memory captured into CUDA graphs (staging/staging.c's stage_capture): ranks with no
 * GPU path between them (CHORUS_CUDA_DIRECT=0, CHORUS_CUDA_RELAY=0 stand in for ranks on different
 * hosts) capture collectives on their streams and replay them many times, new inputs each time, with
 * eager calls on the same stream in between and no synchronisation: the stand-in driver records what
 * a capturing stream is given and queues it again at each launch. Expected values in closed form. */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cuda_gpu_util.h"
#include "misc/param.h"
#include "runner.h"

#define GN 5000

/* Rank r's input for replay k, element i. */
static float in_val(int r, int k, size_t i) { return (float)(r * 7 + k * 3 + (int)(i % 101)); }

/* AllReduce captured out of place, Broadcast in place from rank 1; replayed 5 times with new inputs
 * copied in on the stream, an eager AllReduce on the same stream after each replay. */
static void replay_body(int rank, int nranks, ncclUniqueId id, void* arg) {
  size_t n = arg ? (size_t)(uintptr_t)arg : GN;
  cudaStream_t s;
  ncclComm_t comm = open_rank(rank, nranks, id, 0xa000, &s);
  float *x = dev_alloc(n), *y = dev_alloc(n), *z = dev_alloc(n), *bc = dev_alloc(n);
  float* src = malloc(5 * n * sizeof(float));
  float* bsrc = malloc(5 * n * sizeof(float));
  float (*zs)[8] = calloc(5, sizeof(*zs));
  ASSERT(src && bsrc && zs);
  for (int k = 0; k < 5; k++)
    for (size_t i = 0; i < n; i++) src[k * n + i] = in_val(rank, k, i), bsrc[k * n + i] = rank == 1 ? (float)(k * 1000 + i % 977) : -1.0f;
  /* an eager call first: the pool and connections exist before the capture, as in training loops */
  for (size_t i = 0; i < n; i++) z[i] = 1.0f;
  NCCL_OK(ncclAllReduce(z, z, n, ncclFloat32, ncclSum, comm, s));
  EXPECT_EQ(fk.sync(s), 0);
  fk.begin_capture(s);
  NCCL_OK(ncclAllReduce(x, y, n, ncclFloat32, ncclSum, comm, s));
  NCCL_OK(ncclBroadcast(bc, bc, n, ncclFloat32, 1, comm, s));
  void* graph = fk.end_capture(s);
  ASSERT(graph != NULL);
  EXPECT(fk.graph_ops(graph) >= 8); /* per call: copies in and back (none of 0 bytes), host node, wait, reset */
  float* zk = malloc(5 * n * sizeof(float));
  ASSERT(zk);
  for (int k = 0; k < 5; k++) {
    EXPECT_EQ(fk.copy(s, x, src + k * n, n * sizeof(float)), 0);
    EXPECT_EQ(fk.copy(s, bc, bsrc + k * n, n * sizeof(float)), 0);
    EXPECT_EQ(fk.graph_launch(graph, s), 0);
    /* eager, right behind the replay on the same stream: z doubles (times nranks) each time */
    NCCL_OK(ncclAllReduce(z, z, n, ncclFloat32, ncclSum, comm, s));
    EXPECT_EQ(fk.copy(s, zk + k * n, y, n * sizeof(float)), 0); /* this replay's result, in stream order */
    EXPECT_EQ(fk.copy(s, src + k * n, bc, n * sizeof(float)), 0); /* reuse src[k] for the broadcast's */
  }
  EXPECT_EQ(fk.sync(s), 0);
  for (int k = 0; k < 5; k++)
    for (size_t i = 0; i < n; i++) {
      float want = 0;
      for (int r = 0; r < nranks; r++) want += in_val(r, k, i);
      EXPECT(zk[k * n + i] == want);
      EXPECT(src[k * n + i] == (float)(k * 1000 + i % 977));
    }
  float zw = 1.0f;
  for (int k = 0; k < 6; k++) zw *= (float)nranks;
  for (size_t i = 0; i < n; i++) EXPECT(z[i] == zw);
  fk.graph_destroy(graph);
  free(src), free(bsrc), free(zs), free(zk);
  fk.free((uintptr_t)x), fk.free((uintptr_t)y), fk.free((uintptr_t)z), fk.free((uintptr_t)bc);
  NCCL_OK(ncclCommDestroy(comm));
}

TEST_T(cuda_stage_graph, capture_and_replay_2_procs, 60) {
  load_staged("4194304");
  rt_run_procs(2, replay_body, NULL);
}

TEST_T(cuda_stage_graph, capture_and_replay_3_threads, 60) {
  load_staged("4194304");
  rt_run_threads(3, replay_body, NULL);
}

/* A call large enough for pieces: each piece is captured as a call of its own. */
TEST_T(cuda_stage_graph, captured_in_pieces_2_threads, 60) {
  load_staged("65536");
  rt_run_threads(2, replay_body, (void*)(uintptr_t)100003);
}

/* Groups captured: two AllReduces in one group, an AlltoAll, and a ring of Send/Recv (pipeline
 * parallelism's step) in one group; replayed 3 times with new inputs. */
#define GB 1000 /* elements a block */
static void group_body(int rank, int nranks, ncclUniqueId id, void* arg) {
  (void)arg;
  cudaStream_t s;
  ncclComm_t comm = open_rank(rank, nranks, id, 0xa100, &s);
  size_t an = (size_t)GB * nranks;
  float *x = dev_alloc(GB), *y = dev_alloc(GB), *a = dev_alloc(an), *b = dev_alloc(an), *snd = dev_alloc(GB),
        *rcv = dev_alloc(GB);
  float *in = malloc(3 * (2 * GB + an + GB) * sizeof(float)), *out = malloc(3 * (2 * GB + an + GB) * sizeof(float));
  ASSERT(in && out);
  size_t per = 2 * GB + an + GB; /* one replay's inputs: x, y, a, snd (and outputs: x, y, b, rcv) */
  for (int k = 0; k < 3; k++) {
    float* p = in + k * per;
    for (size_t i = 0; i < GB; i++) p[i] = (float)(rank + k), p[GB + i] = (float)(rank * 10 + k + 1);
    for (size_t i = 0; i < an; i++) p[2 * GB + i] = (float)(rank * 100000 + k * 10000 + i); /* block j to rank j */
    for (size_t i = 0; i < GB; i++) p[2 * GB + an + i] = (float)(rank * 1000 + k * 100 + i % 100);
  }
  int next = (rank + 1) % nranks, prev = (rank + nranks - 1) % nranks;
  fk.begin_capture(s);
  NCCL_OK(ncclGroupStart());
  NCCL_OK(ncclAllReduce(x, x, GB, ncclFloat32, ncclSum, comm, s));
  NCCL_OK(ncclAllReduce(y, y, GB, ncclFloat32, ncclMax, comm, s));
  NCCL_OK(ncclGroupEnd());
  NCCL_OK(ncclAlltoAll(a, b, GB, ncclFloat32, comm, s));
  NCCL_OK(ncclGroupStart());
  NCCL_OK(ncclSend(snd, GB, ncclFloat32, next, comm, s));
  NCCL_OK(ncclRecv(rcv, GB, ncclFloat32, prev, comm, s));
  NCCL_OK(ncclGroupEnd());
  void* graph = fk.end_capture(s);
  ASSERT(graph != NULL);
  for (int k = 0; k < 3; k++) {
    float* p = in + k * per;
    EXPECT_EQ(fk.copy(s, x, p, GB * sizeof(float)), 0);
    EXPECT_EQ(fk.copy(s, y, p + GB, GB * sizeof(float)), 0);
    EXPECT_EQ(fk.copy(s, a, p + 2 * GB, an * sizeof(float)), 0);
    EXPECT_EQ(fk.copy(s, snd, p + 2 * GB + an, GB * sizeof(float)), 0);
    EXPECT_EQ(fk.graph_launch(graph, s), 0);
    float* q = out + k * per;
    EXPECT_EQ(fk.copy(s, q, x, GB * sizeof(float)), 0);
    EXPECT_EQ(fk.copy(s, q + GB, y, GB * sizeof(float)), 0);
    EXPECT_EQ(fk.copy(s, q + 2 * GB, b, an * sizeof(float)), 0);
    EXPECT_EQ(fk.copy(s, q + 2 * GB + an, rcv, GB * sizeof(float)), 0);
  }
  EXPECT_EQ(fk.sync(s), 0);
  for (int k = 0; k < 3; k++) {
    float* q = out + k * per;
    float sum = 0;
    for (int r = 0; r < nranks; r++) sum += (float)(r + k);
    for (size_t i = 0; i < GB; i++) {
      EXPECT(q[i] == sum);
      EXPECT(q[GB + i] == (float)((nranks - 1) * 10 + k + 1));
      EXPECT(q[2 * GB + an + i] == (float)(prev * 1000 + k * 100 + i % 100));
    }
    for (int r = 0; r < nranks; r++) /* block r of b: rank r's block `rank` */
      for (size_t i = 0; i < GB; i++)
        EXPECT(q[2 * GB + (size_t)r * GB + i] == (float)(r * 100000 + k * 10000 + (size_t)rank * GB + i));
  }
  fk.graph_destroy(graph);
  free(in), free(out);
  fk.free((uintptr_t)x), fk.free((uintptr_t)y), fk.free((uintptr_t)a), fk.free((uintptr_t)b);
  fk.free((uintptr_t)snd), fk.free((uintptr_t)rcv);
  NCCL_OK(ncclCommDestroy(comm));
}

TEST_T(cuda_stage_graph, groups_alltoall_and_sendrecv_3_procs, 60) {
  load_staged("4194304");
  rt_run_procs(3, group_body, NULL);
}

/* A group of a capturing stream's call and another stream's: refused by name; the streams work on. */
static void mixed_body(int rank, int nranks, ncclUniqueId id, void* arg) {
  (void)arg;
  cudaStream_t s;
  ncclComm_t comm = open_rank(rank, nranks, id, 0xa300, &s);
  cudaStream_t s2 = (cudaStream_t)((uintptr_t)s + 0x1000);
  float *x = dev_alloc(GN), *y = dev_alloc(GN);
  for (size_t i = 0; i < GN; i++) x[i] = 1.0f, y[i] = 2.0f;
  fk.begin_capture(s);
  NCCL_OK(ncclGroupStart());
  NCCL_OK(ncclAllReduce(x, x, GN, ncclFloat32, ncclSum, comm, s));
  NCCL_OK(ncclAllReduce(y, y, GN, ncclFloat32, ncclSum, comm, s2));
  EXPECT_EQ(ncclGroupEnd(), ncclInvalidUsage);
  EXPECT(strstr(ncclGetLastError(comm), "other streams") != NULL);
  fk.graph_destroy(fk.end_capture(s));
  NCCL_OK(ncclAllReduce(x, x, GN, ncclFloat32, ncclSum, comm, s));
  EXPECT_EQ(fk.sync(s), 0);
  for (size_t i = 0; i < GN; i++) EXPECT(x[i] == (float)nranks);
  fk.free((uintptr_t)x), fk.free((uintptr_t)y);
  NCCL_OK(ncclCommDestroy(comm));
}

TEST_T(cuda_stage_graph, group_with_another_stream_refused_2_threads, 60) {
  load_staged("4194304");
  rt_run_threads(2, mixed_body, NULL);
}

/* Rank 0 replays, rank 1 never does: rank 0's replay fails after CHORUS_TIMEOUT, its stream goes on
 * past the graph, and both abort; then every pinned block of the pools and graphs is freed. */
/* An in-place AllReduce of x (GN ones) on s, eager first (connected), then captured: the graph. */
static void* capture_ones(ncclComm_t comm, cudaStream_t s, float** x) {
  *x = dev_alloc(GN);
  for (size_t i = 0; i < GN; i++) (*x)[i] = 1.0f;
  NCCL_OK(ncclAllReduce(*x, *x, GN, ncclFloat32, ncclSum, comm, s));
  EXPECT_EQ(fk.sync(s), 0);
  fk.begin_capture(s);
  NCCL_OK(ncclAllReduce(*x, *x, GN, ncclFloat32, ncclSum, comm, s));
  return fk.end_capture(s);
}

static int g_replayed;
static void lonely_body(int rank, int nranks, ncclUniqueId id, void* arg) {
  (void)arg;
  cudaStream_t s;
  ncclComm_t comm = open_rank(rank, nranks, id, 0xa200, &s);
  float* x;
  void* graph = capture_ones(comm, s, &x);
  if (rank == 0) {
    EXPECT_EQ(fk.graph_launch(graph, s), 0);
    EXPECT_EQ(fk.sync(s), 0); /* returns: the failed replay let its stream go */
    EXPECT_EQ(async_error(comm), ncclTimeout);
    __atomic_store_n(&g_replayed, 1, __ATOMIC_RELEASE);
  } else {
    while (!__atomic_load_n(&g_replayed, __ATOMIC_ACQUIRE)) usleep(1000);
  }
  NCCL_OK(ncclCommAbort(comm));
  fk.graph_destroy(graph);
  fk.free((uintptr_t)x);
}

TEST_T(cuda_stage_graph, replay_without_its_peer_times_out, 60) {
  load_staged("4194304");
  setenv("CHORUS_TIMEOUT", "1", 1);
  param_reset();
  g_replayed = 0;
  rt_run_threads(2, lonely_body, NULL);
  for (int i = 0; i < 500 && fk.host_allocs() != 0; i++) usleep(10 * 1000); /* frees handed to the reaper */
  EXPECT_EQ(fk.host_allocs(), 0);
  unsetenv("CHORUS_TIMEOUT");
}

/* Rank 0 launches its capture on two streams at once while rank 1 never replays (the first replay's
 * plan stays under way): the second replay runs nothing and fails the communicator with
 * ncclInvalidUsage (it would restore a plan the bridge runs); after the abort both streams go on. */
static int g_overlapped;
static void overlap_body(int rank, int nranks, ncclUniqueId id, void* arg) {
  (void)arg;
  cudaStream_t s, s2 = (cudaStream_t)(uintptr_t)(0xa380 + 0x10 * rank);
  ncclComm_t comm = open_rank(rank, nranks, id, 0xa300, &s);
  float* x;
  void* graph = capture_ones(comm, s, &x);
  if (rank == 0) {
    EXPECT_EQ(fk.graph_launch(graph, s), 0);
    EXPECT_EQ(fk.graph_launch(graph, s2), 0); /* no order between the two */
    EXPECT_EQ(async_error(comm), ncclInvalidUsage);
    __atomic_store_n(&g_overlapped, 1, __ATOMIC_RELEASE);
  } else {
    while (!__atomic_load_n(&g_overlapped, __ATOMIC_ACQUIRE)) usleep(1000);
  }
  NCCL_OK(ncclCommAbort(comm));
  EXPECT_EQ(fk.sync(s), 0); /* both replays' streams were let go */
  EXPECT_EQ(fk.sync(s2), 0);
  fk.graph_destroy(graph);
  fk.free((uintptr_t)x);
}

TEST_T(cuda_stage_graph, replays_at_once_fail_the_communicator_2_threads, 60) {
#if defined(__SANITIZE_THREAD__)
  /* The two replays' input copies write one pinned block at once: the misuse this test makes. */
  printf("    skipped under ThreadSanitizer (the race is the point)\n");
  return;
#endif
  load_staged("4194304");
  g_overlapped = 0;
  rt_run_threads(2, overlap_body, NULL);
}

/* After a capture (graph mode), an eager call's ticket is drawn when its stream gets there. With the
 * stream held: a host-buffer call on the comm waits for it (order kept on both ranks), and
 * ncclCommDestroy waits for it; ncclCommAbort does not (the stream, let go later, drops the call). */
static int g_release[2];
static void* release_later(void* arg) {
  usleep(200 * 1000);
  __atomic_store_n((int*)arg, 1, __ATOMIC_RELEASE);
  return NULL;
}
static void held_body(int rank, int nranks, ncclUniqueId id, void* arg) {
  int abort = (uintptr_t)arg == 1, revoke = (uintptr_t)arg == 2;
  cudaStream_t s;
  ncclComm_t comm = open_rank(rank, nranks, id, 0xa400, &s);
  float* x = dev_alloc(GN);
  float h[64];
  for (size_t i = 0; i < GN; i++) x[i] = 1.0f;
  for (int i = 0; i < 64; i++) h[i] = (float)rank;
  fk.begin_capture(s);
  NCCL_OK(ncclAllReduce(x, x, GN, ncclFloat32, ncclSum, comm, s));
  fk.graph_destroy(fk.end_capture(s)); /* never replayed: graph mode stays */
  EXPECT_EQ(fk.hold(s, &g_release[rank]), 0);
  NCCL_OK(ncclAllReduce(x, x, GN, ncclFloat32, ncclSum, comm, s)); /* its ticket waits for the stream */
  pthread_t th;
  pthread_create(&th, NULL, release_later, &g_release[rank]);
  if (abort || revoke) {
    if (abort) NCCL_OK(ncclCommAbort(comm)); /* returns without the stream */
    else NCCL_OK(ncclCommRevoke(comm, NCCL_REVOKE_DEFAULT));
    EXPECT_EQ(__atomic_load_n(&g_release[rank], __ATOMIC_ACQUIRE), 0);
    pthread_join(th, NULL);
    EXPECT_EQ(fk.sync(s), 0); /* the stream went on: the call was dropped */
    if (revoke) {
      EXPECT_EQ(ncclAllReduce(x, x, GN, ncclFloat32, ncclSum, comm, s), ncclInvalidUsage); /* revoked */
      NCCL_OK(ncclCommDestroy(comm));
    }
  } else {
    NCCL_OK(ncclAllReduce(h, h, 64, ncclFloat32, ncclSum, comm, NULL)); /* after the device call, on both ranks */
    for (int i = 0; i < 64; i++) EXPECT(h[i] == (float)(nranks * (nranks - 1) / 2));
    NCCL_OK(ncclAllReduce(x, x, GN, ncclFloat32, ncclSum, comm, s));
    NCCL_OK(ncclCommDestroy(comm)); /* waits for the calls its stream is still to reach */
    pthread_join(th, NULL);
    EXPECT_EQ(fk.sync(s), 0);
    for (size_t i = 0; i < GN; i++) EXPECT(x[i] == (float)(nranks * nranks));
  }
  fk.free((uintptr_t)x);
}

TEST_T(cuda_stage_graph, eager_calls_wait_for_their_stream_after_a_capture, 60) {
  load_staged("4194304");
  g_release[0] = g_release[1] = 0;
  rt_run_threads(2, held_body, NULL);
}

TEST_T(cuda_stage_graph, abort_drops_calls_its_stream_has_not_reached, 60) {
  load_staged("4194304");
  g_release[0] = g_release[1] = 0;
  rt_run_threads(2, held_body, (void*)1);
}

TEST_T(cuda_stage_graph, revoke_drops_calls_its_stream_has_not_reached, 60) {
  load_staged("4194304");
  g_release[0] = g_release[1] = 0;
  rt_run_threads(2, held_body, (void*)2);
}
