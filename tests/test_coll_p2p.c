/* Point-to-point and groups: ring exchanges that deadlock unless grouped, all-pairs exchanges with a
 * different count per pair, self send/recv, message order between two ranks, many collectives and
 * send/recv in one group, nested groups; and host streams (calls queued in order, then synchronized). */
#include <string.h>

#include "chorus.h"
#include "misc/param.h"
#include "coll_util.h"
#include "runner.h"

#define BIG ((size_t)(1u << 20) + 7) /* far more than a FIFO holds: a blocked send cannot complete alone */


/* ---- ring exchanges (every shift, self included) ---- */

static void shifts_body(int rank, int nranks, ncclUniqueId id, void* arg) {
  size_t count = *(const size_t*)arg;
  ncclComm_t comm = cu_comm_init(rank, nranks, id);
  const int types[] = {ncclFloat32, ncclInt8, ncclBfloat16};
  uint32_t seed = 100;
  for (int t = 0; t < 3; t++)
    for (int shift = 0; shift < nranks; shift++, seed++) {
      struct cu_case c = {CU_SENDRECV, types[t], 0, count, 0, shift, seed};
      cu_run_case(comm, &c, NULL);
    }
  NCCL_OK(ncclCommDestroy(comm));
  cu_finish();
}

TEST_T(coll_p2p, ring_exchange_small, 60) {
  static size_t counts[] = {0, 1, 4099};
  for (int i = 0; i < 3; i++) {
    rt_run_both(2, shifts_body, &counts[i]);
    rt_run_both(3, shifts_body, &counts[i]);
  }
  rt_run_threads(8, shifts_body, &counts[2]);
  rt_run_threads(1, shifts_body, &counts[2]);
}

TEST_T(coll_p2p, ring_exchange_big, 120) {
  size_t big = BIG;
  rt_run_both(2, shifts_body, &big);
  rt_run_both(4, shifts_body, &big);
  rt_run_threads(1, shifts_body, &big);
}

/* ---- all pairs, a different count for each (sender, receiver) ---- */

static size_t pair_count(int from, int to) { return (size_t)((from * 7 + to * 3) % 5) * 1013 + (size_t)(from == to); }

static void all_pairs_body(int rank, int nranks, ncclUniqueId id, void* arg) {
  (void)arg;
  ncclComm_t comm = cu_comm_init(rank, nranks, id);
  char** sb = calloc((size_t)nranks, sizeof(char*));
  char** rb = calloc((size_t)nranks, sizeof(char*));
  ASSERT(sb && rb);
  for (int round = 0; round < 2; round++) {
    int type = round ? ncclFloat16 : ncclInt64;
    size_t es = cu_type_size(type);
    for (int p = 0; p < nranks; p++) {
      sb[p] = malloc(pair_count(rank, p) * es + 1);
      rb[p] = malloc(pair_count(p, rank) * es + 1);
      ASSERT(sb[p] && rb[p]);
      cu_fill_pattern(sb[p], type, pair_count(rank, p), rank, p, (uint32_t)round);
      memset(rb[p], 0xee, pair_count(p, rank) * es);
    }
    /* Receives first in one round, sends first in the other: order inside a group must not matter. */
    NCCL_OK(ncclGroupStart());
    for (int k = 0; k < 2 * nranks; k++) {
      int p = k % nranks, is_send = (k < nranks) == (round == 0);
      if (is_send) NCCL_OK(ncclSend(sb[p], pair_count(rank, p), (ncclDataType_t)type, p, comm, NULL));
      else NCCL_OK(ncclRecv(rb[p], pair_count(p, rank), (ncclDataType_t)type, p, comm, NULL));
    }
    NCCL_OK(ncclGroupEnd());
    for (int p = 0; p < nranks; p++) {
      long at = cu_check_pattern(rb[p], type, pair_count(p, rank), p, rank, (uint32_t)round);
      if (at >= 0)
        cu_failf("all pairs %s: data from rank %d (%zu elements) wrong from element %ld", cu_type_name(type), p,
                 pair_count(p, rank), at);
      free(sb[p]);
      free(rb[p]);
    }
  }
  free(sb);
  free(rb);
  NCCL_OK(ncclCommDestroy(comm));
  cu_finish();
}

TEST_T(coll_p2p, all_pairs, 60) {
  rt_run_both(2, all_pairs_body, NULL);
  rt_run_both(3, all_pairs_body, NULL);
  rt_run_both(5, all_pairs_body, NULL);
  rt_run_threads(8, all_pairs_body, NULL);
}

/* ---- message order: several sends to one peer match the receives in call order ---- */

static void order_body(int rank, int nranks, ncclUniqueId id, void* arg) {
  (void)arg;
  ncclComm_t comm = cu_comm_init(rank, nranks, id);
  const size_t sizes[4] = {BIG, 17, 0, 70001};
  float* b[4];
  for (int m = 0; m < 4; m++) {
    b[m] = malloc(sizes[m] * sizeof(float) + 4);
    ASSERT(b[m]);
    if (rank == 0) cu_fill_pattern(b[m], ncclFloat32, sizes[m], 0, m, 7);
    else memset(b[m], 0xee, sizes[m] * sizeof(float));
  }
  /* In one group, then again as separate blocking calls (the receiver posts while the sender waits). */
  for (int grouped = 1; grouped >= 0; grouped--) {
    if (grouped) NCCL_OK(ncclGroupStart());
    for (int m = 0; m < 4; m++) {
      if (rank == 0) NCCL_OK(ncclSend(b[m], sizes[m], ncclFloat32, 1, comm, NULL));
      else NCCL_OK(ncclRecv(b[m], sizes[m], ncclFloat32, 0, comm, NULL));
    }
    if (grouped) NCCL_OK(ncclGroupEnd());
    if (rank == 1)
      for (int m = 0; m < 4; m++) {
        long at = cu_check_pattern(b[m], ncclFloat32, sizes[m], 0, m, 7);
        if (at >= 0) cu_failf("%s message %d (%zu floats) wrong from element %ld", grouped ? "grouped" : "blocking", m, sizes[m], at);
        memset(b[m], 0xee, sizes[m] * sizeof(float));
      }
  }
  for (int m = 0; m < 4; m++) free(b[m]);
  NCCL_OK(ncclCommDestroy(comm));
  cu_finish();
}

TEST_T(coll_p2p, message_order, 60) { rt_run_both(2, order_body, NULL); }

/* Blocking pairs without a group: rank 0 sends then receives, rank 1 receives then sends. */
static void pingpong_body(int rank, int nranks, ncclUniqueId id, void* arg) {
  (void)arg;
  ncclComm_t comm = cu_comm_init(rank, nranks, id);
  float* a = malloc(BIG * sizeof(float));
  ASSERT(a);
  cu_fill_pattern(a, ncclFloat32, BIG, rank, 0, 3);
  for (int it = 0; it < 3; it++) {
    if (rank == 0) {
      NCCL_OK(ncclSend(a, BIG, ncclFloat32, 1, comm, NULL));
      NCCL_OK(ncclRecv(a, BIG, ncclFloat32, 1, comm, NULL));
    } else {
      NCCL_OK(ncclRecv(a, BIG, ncclFloat32, 0, comm, NULL));
      NCCL_OK(ncclSend(a, BIG, ncclFloat32, 0, comm, NULL));
    }
  }
  /* The data went 0 -> 1 -> 0 three times: both now hold rank 0's pattern. */
  long at = cu_check_pattern(a, ncclFloat32, BIG, 0, 0, 3);
  if (at >= 0) cu_failf("ping-pong data wrong from element %ld", at);
  free(a);
  NCCL_OK(ncclCommDestroy(comm));
  cu_finish();
}

TEST_T(coll_p2p, blocking_pingpong, 60) { rt_run_both(2, pingpong_body, NULL); }

/* ---- many collectives and send/recv in one group ---- */

static void mixed_group_body(int rank, int nranks, ncclUniqueId id, void* arg) {
  int nested = arg != NULL;
  ncclComm_t comm = cu_comm_init(rank, nranks, id);
  const struct cu_case cases[] = {
      {CU_ALLREDUCE, ncclFloat32, CU_SUM, 4099, 0, 0, 1},
      {CU_SENDRECV, ncclInt32, 0, BIG, 0, 1, 2},
      {CU_BROADCAST, ncclFloat16, 0, 5000, 0, nranks - 1, 3},
      {CU_ALLGATHER, ncclInt8, 0, 777, 1, 0, 4},
      {CU_REDUCESCATTER, ncclBfloat16, CU_PREMUL_DEV, 1001, 0, 0, 5},
      {CU_SENDRECV, ncclFloat64, 0, 3000, 0, nranks > 2 ? 2 : 0, 6},
      {CU_ALLTOALL, ncclUint8, 0, 333, 0, 0, 7},
      {CU_REDUCE, ncclInt64, CU_MAX, 2049, 1, nranks / 2, 8},
      {CU_GATHER, ncclFloat8e4m3, 0, 100, 1, 0, 9},
      {CU_SCATTER, ncclUint32, 0, 100, 0, nranks - 1, 10},
      {CU_ALLREDUCE, ncclFloat8e5m2, CU_AVG, 64, 1, 0, 11},
      {CU_SENDRECV, ncclUint64, 0, 1, 0, 0, 12}, /* self */
      {CU_BCAST, ncclInt32, 0, 4099, 1, 0, 13},
  };
  enum { NC = sizeof(cases) / sizeof(cases[0]) };
  struct cu_run runs[NC];
  for (int i = 0; i < NC; i++) cu_prepare(&runs[i], comm, &cases[i]);
  NCCL_OK(ncclGroupStart());
  for (int i = 0; i < NC; i++) {
    /* Nested: every call sits in groups of its own inside the outer one (depth up to 3). */
    if (nested) NCCL_OK(ncclGroupStart());
    if (nested && i % 2) NCCL_OK(ncclGroupStart());
    ncclResult_t r = cu_issue(&runs[i], NULL);
    if (r != ncclSuccess) rt_fail_fatal(__FILE__, __LINE__, "%s in a group: %s", runs[i].cs, ncclGetErrorString(r));
    if (nested && i % 2) NCCL_OK(ncclGroupEnd());
    if (nested) NCCL_OK(ncclGroupEnd());
  }
  NCCL_OK(ncclGroupEnd());
  for (int i = 0; i < NC; i++) cu_check(&runs[i]);
  NCCL_OK(ncclCommDestroy(comm));
  cu_finish();
}

TEST_T(coll_p2p, mixed_group, 90) {
  rt_run_both(2, mixed_group_body, NULL);
  rt_run_both(3, mixed_group_body, NULL);
  rt_run_threads(5, mixed_group_body, NULL);
  rt_run_threads(1, mixed_group_body, NULL);
}

/* The mixed group with each peer algorithm forced (RecDbl, Rabenseifner, Tree run beside the group's
 * sends and receives, on FIFOs of their own), on 3 and 5 ranks. */
TEST_T(coll_p2p, mixed_group_peer_algos, 180) {
  static const char* algos[] = {"allreduce:recdbl", "allreduce:rabenseifner", "allreduce:tree;broadcast:tree;reduce:tree"};
  for (int a = 0; a < 3; a++) {
    setenv("NCCL_ALGO", algos[a], 1);
    setenv("CHORUS_DIRECT_MIN_BYTES", "-1", 1);
    param_reset();
    rt_run_both(3, mixed_group_body, NULL);
    rt_run_threads(5, mixed_group_body, NULL);
  }
}

/* Ranks 0 and 1 group an AllReduce with a send between them; rank 2 calls it alone. Each rank chooses
 * the algorithm alike (RecDbl here): ranks whose group had sends and receives used to switch to Ring
 * on their own, and all waited for each other until CHORUS_TIMEOUT. */
static void lone_peer_body(int rank, int nranks, ncclUniqueId id, void* arg) {
  (void)arg;
  ncclComm_t comm = cu_comm_init(rank, nranks, id);
  float buf[8], p2p[8];
  for (int rep = 0; rep < 3; rep++) {
    for (int i = 0; i < 8; i++) buf[i] = (float)(rank + 1 + rep), p2p[i] = (float)(rank * 10 + i);
    if (rank < 2) {
      NCCL_OK(ncclGroupStart());
      NCCL_OK(ncclAllReduce(buf, buf, 8, ncclFloat32, ncclSum, comm, NULL));
      if (rank == 0) NCCL_OK(ncclSend(p2p, 8, ncclFloat32, 1, comm, NULL));
      else NCCL_OK(ncclRecv(p2p, 8, ncclFloat32, 0, comm, NULL));
      NCCL_OK(ncclGroupEnd());
    } else {
      NCCL_OK(ncclAllReduce(buf, buf, 8, ncclFloat32, ncclSum, comm, NULL));
    }
    for (int i = 0; i < 8; i++) EXPECT(buf[i] == (float)(nranks * (nranks + 1) / 2 + nranks * rep));
    if (rank == 1)
      for (int i = 0; i < 8; i++) EXPECT(p2p[i] == (float)i);
  }
  NCCL_OK(ncclCommDestroy(comm));
}
TEST_T(coll_p2p, group_with_sends_on_some_ranks_only, 60) {
  setenv("NCCL_ALGO", "allreduce:recdbl", 1);
  setenv("CHORUS_DIRECT_MIN_BYTES", "-1", 1);
  setenv("CHORUS_TIMEOUT", "20", 1);
  param_reset();
  rt_run_both(3, lone_peer_body, NULL);
}

TEST_T(coll_p2p, nested_groups, 90) {
  static int nested = 1;
  rt_run_both(2, mixed_group_body, &nested);
  rt_run_both(4, mixed_group_body, &nested);
}

/* Inner ncclGroupEnd must not launch: with a big send launched alone every rank would block in it. */
static void nested_ring_body(int rank, int nranks, ncclUniqueId id, void* arg) {
  (void)arg;
  ncclComm_t comm = cu_comm_init(rank, nranks, id);
  struct cu_run run;
  struct cu_case c = {CU_SENDRECV, ncclFloat32, 0, BIG, 0, 1, 21};
  cu_prepare(&run, comm, &c);
  int to = (rank + 1) % nranks, from = (rank + nranks - 1) % nranks;
  NCCL_OK(ncclGroupStart());
  NCCL_OK(ncclGroupStart());
  NCCL_OK(ncclGroupStart());
  NCCL_OK(ncclSend(run.send, BIG, ncclFloat32, to, comm, NULL));
  NCCL_OK(ncclGroupEnd());
  NCCL_OK(ncclGroupEnd());
  NCCL_OK(ncclGroupStart());
  NCCL_OK(ncclRecv(run.recv, BIG, ncclFloat32, from, comm, NULL));
  NCCL_OK(ncclGroupEnd());
  NCCL_OK(ncclGroupEnd());
  cu_check(&run);
  NCCL_OK(ncclCommDestroy(comm));
  cu_finish();
}

TEST_T(coll_p2p, nested_ring, 60) {
  rt_run_both(2, nested_ring_body, NULL);
  rt_run_both(3, nested_ring_body, NULL);
}

/* ---- self send/recv ---- */

static void self_body(int rank, int nranks, ncclUniqueId id, void* arg) {
  (void)arg;
  ncclComm_t comm = cu_comm_init(rank, nranks, id);
  const size_t counts[] = {0, 1, 4099, BIG};
  for (int i = 0; i < 4; i++) {
    struct cu_case c = {CU_SENDRECV, i % 2 ? ncclFloat16 : ncclUint8, 0, counts[i], 0, 0, (uint32_t)(30 + i)};
    cu_run_case(comm, &c, NULL);
  }
  /* Receive posted before the send, in one group. */
  float* a = malloc(4099 * sizeof(float));
  float* b = malloc(4099 * sizeof(float));
  ASSERT(a && b);
  cu_fill_pattern(a, ncclFloat32, 4099, rank, 0, 40);
  NCCL_OK(ncclGroupStart());
  NCCL_OK(ncclRecv(b, 4099, ncclFloat32, rank, comm, NULL));
  NCCL_OK(ncclSend(a, 4099, ncclFloat32, rank, comm, NULL));
  NCCL_OK(ncclGroupEnd());
  long at = cu_check_pattern(b, ncclFloat32, 4099, rank, 0, 40);
  if (at >= 0) cu_failf("self recv-then-send: wrong from element %ld", at);
  free(a);
  free(b);
  NCCL_OK(ncclCommDestroy(comm));
  cu_finish();
}

TEST_T(coll_p2p, self_sendrecv, 60) {
  rt_run_threads(1, self_body, NULL);
  rt_run_both(3, self_body, NULL);
}

/* ---- host streams ---- */

/* A chain of dependent calls queued on one stream, synchronized once: each reads what the one before
 * wrote, so any reordering or early return shows in the values. */
static void stream_chain_body(int rank, int nranks, ncclUniqueId id, void* arg) {
  (void)arg;
  ncclComm_t comm = cu_comm_init(rank, nranks, id);
  cudaStream_t st = NULL;
  NCCL_OK(chorusStreamCreate(&st));
  const size_t k = 4099, nk = (size_t)nranks * k;
  float *x = malloc(nk * sizeof(float)), *y = malloc(nk * sizeof(float)), *z = malloc(k * sizeof(float));
  float *w = malloc(nk * sizeof(float)), *v = malloc(nk * sizeof(float));
  ASSERT(x && y && z && w && v);
  for (size_t i = 0; i < nk; i++) x[i] = (float)(rank + 1 + (int)(i % 5));
  const int iters = 6; /* 6 in-place AllReduces multiply by nranks^6 */
  NCCL_OK(ncclAllReduce(x, y, nk, ncclFloat32, ncclSum, comm, st));
  for (int it = 0; it < iters; it++) NCCL_OK(ncclAllReduce(y, y, nk, ncclFloat32, ncclSum, comm, st));
  NCCL_OK(ncclReduceScatter(y, z, k, ncclFloat32, ncclSum, comm, st));
  NCCL_OK(ncclAllGather(z, w, k, ncclFloat32, comm, st));
  NCCL_OK(ncclGroupStart());
  NCCL_OK(ncclSend(w, nk, ncclFloat32, (rank + 1) % nranks, comm, st));
  NCCL_OK(ncclRecv(v, nk, ncclFloat32, (rank + nranks - 1) % nranks, comm, st));
  NCCL_OK(ncclGroupEnd());
  ncclResult_t q = chorusStreamQuery(st);
  EXPECT(q == ncclSuccess || q == ncclInProgress);
  NCCL_OK(chorusStreamSynchronize(st));
  EXPECT_EQ(chorusStreamQuery(st), ncclSuccess);
  /* x sums to S(i) = n(n+1)/2 + n*(i%5); each AllReduce in place multiplies by n, ReduceScatter once more. */
  double scale = 1;
  for (int it = 0; it < iters + 1; it++) scale *= nranks;
  int bad = 0;
  for (size_t i = 0; i < nk && bad < 3; i++) {
    double s = nranks * (nranks + 1) / 2.0 + nranks * (double)(i % 5);
    if ((double)y[i] != s * scale / nranks) bad++, cu_failf("stream chain: y[%zu] = %g, expected %g", i, y[i], s * scale / nranks);
    if ((double)w[i] != s * scale) bad++, cu_failf("stream chain: w[%zu] = %g, expected %g", i, w[i], s * scale);
    if ((double)v[i] != s * scale) bad++, cu_failf("stream chain: v[%zu] = %g, expected %g", i, v[i], s * scale);
  }
  NCCL_OK(chorusStreamDestroy(st));
  free(x), free(y), free(z), free(w), free(v);
  NCCL_OK(ncclCommDestroy(comm));
  cu_finish();
}

TEST_T(coll_p2p, stream_chain, 60) {
  rt_run_both(2, stream_chain_body, NULL);
  rt_run_both(3, stream_chain_body, NULL);
  rt_run_threads(1, stream_chain_body, NULL);
}

/* Every collective through a stream (cu_run_case synchronizes after each). */
TEST_T(coll_p2p, stream_all_colls, 60) {
  static const int types[] = {ncclFloat32, ncclFloat16};
  static const int ops[] = {CU_SUM, CU_MIN, CU_PREMUL_HOST};
  struct cu_sweep sw = {.types = types, .ntypes = 2, .ops = ops, .nops = 3, .stream = 1};
  rt_run_both(3, cu_sweep_body, &sw);
  rt_run_threads(4, cu_sweep_body, &sw);
}

/* Many cases queued on one stream and in flight together (one synchronize), then checked. */
static void stream_batch_body(int rank, int nranks, ncclUniqueId id, void* arg) {
  (void)arg;
  ncclComm_t comm = cu_comm_init(rank, nranks, id);
  cudaStream_t st = NULL;
  NCCL_OK(chorusStreamCreate(&st));
  enum { NB = 2 * CU_NCOLLS };
  struct cu_run runs[NB];
  for (int i = 0; i < NB; i++) {
    struct cu_case c = {i % CU_NCOLLS, i < CU_NCOLLS ? ncclInt32 : ncclBfloat16, CU_SUM, i < CU_NCOLLS ? 4099 : 100000,
                        0, i % nranks, (uint32_t)(50 + i)};
    cu_prepare(&runs[i], comm, &c);
    ncclResult_t r = cu_issue(&runs[i], st);
    if (r != ncclSuccess) rt_fail_fatal(__FILE__, __LINE__, "%s on a stream: %s", runs[i].cs, ncclGetErrorString(r));
  }
  NCCL_OK(chorusStreamSynchronize(st));
  for (int i = 0; i < NB; i++) cu_check(&runs[i]);
  NCCL_OK(chorusStreamDestroy(st));
  NCCL_OK(ncclCommDestroy(comm));
  cu_finish();
}

TEST_T(coll_p2p, stream_batch, 60) {
  rt_run_both(2, stream_batch_body, NULL);
  rt_run_both(4, stream_batch_body, NULL);
}

/* ---- one thread driving every rank (ncclCommInitAll + a group), several communicators ---- */

TEST_T(coll_p2p, one_thread_all_ranks, 60) {
  enum { N = 4 };
  ncclComm_t comms[N];
  NCCL_OK(ncclCommInitAll(comms, N, NULL));
  for (int coll = 0; coll < CU_NCOLLS; coll++) {
    struct cu_run runs[N];
    struct cu_case c = {coll, coll % 2 ? ncclFloat16 : ncclInt32, CU_PREMUL_DEV, 4099, coll % 3 == 0, coll % N, (uint32_t)(60 + coll)};
    if (!cu_coll_has_inplace(coll)) c.inplace = 0;
    for (int r = 0; r < N; r++) cu_prepare(&runs[r], comms[r], &c);
    NCCL_OK(ncclGroupStart());
    for (int r = 0; r < N; r++) {
      ncclResult_t res = cu_issue(&runs[r], NULL);
      if (res != ncclSuccess) rt_fail_fatal(__FILE__, __LINE__, "%s for rank %d: %s", runs[r].cs, r, ncclGetErrorString(res));
    }
    NCCL_OK(ncclGroupEnd());
    for (int r = 0; r < N; r++) cu_check(&runs[r]);
  }
  for (int r = 0; r < N; r++) NCCL_OK(ncclCommDestroy(comms[r]));
  cu_finish();
}

/* Two communicators over the same ranks, used alternately and in one group: sequence numbers and
 * connections of one must not leak into the other. */
static void two_comms_body(int rank, int nranks, ncclUniqueId id, void* arg) {
  (void)arg;
  ncclComm_t a = cu_comm_init(rank, nranks, id), b = NULL;
  NCCL_OK(ncclCommSplit(a, 0, nranks - 1 - rank, &b, NULL)); /* same ranks, reversed order */
  ASSERT(b != NULL);
  for (int it = 0; it < 6; it++) {
    struct cu_case c = {it % 2 ? CU_ALLGATHER : CU_REDUCESCATTER, ncclFloat32, CU_SUM, 5000, 0, 0, (uint32_t)(70 + it)};
    cu_run_case(it % 3 ? a : b, &c, NULL);
  }
  struct cu_case ca = {CU_ALLREDUCE, ncclInt64, CU_PROD, 4099, 0, 0, 80}, cb = {CU_SENDRECV, ncclInt8, 0, BIG, 0, 1, 81};
  struct cu_run ra, rb;
  cu_prepare(&ra, a, &ca);
  cu_prepare(&rb, b, &cb);
  NCCL_OK(ncclGroupStart());
  NCCL_OK(cu_issue(&rb, NULL));
  NCCL_OK(cu_issue(&ra, NULL));
  NCCL_OK(ncclGroupEnd());
  cu_check(&ra);
  cu_check(&rb);
  NCCL_OK(ncclCommDestroy(b));
  NCCL_OK(ncclCommDestroy(a));
  cu_finish();
}

TEST_T(coll_p2p, two_comms, 60) {
  rt_run_both(2, two_comms_body, NULL);
  rt_run_both(3, two_comms_body, NULL);
}
