/* ncclAllToAllv (issue 48): uneven (Zipf-like) counts with zeros, a rank that sends nothing, blocks
 * laid out with gaps and in another order on each side (gaps and tails left untouched), every datatype,
 * as threads and processes, over the network transport, in waves, on host streams, in a user's group,
 * on device buffers staged through host memory; the call as one entry of the recorder and counters;
 * the arguments it refuses, by name, with nothing written. Expected data in closed form (coll_util's
 * pattern of (sender, receiver, byte)). Mismatched counts: tests/test_mismatch.c. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "chorus.h"
#include "coll_util.h"
#include "misc/param.h"
#include "observe/observe.h"
#include "runner.h"

#define UNTOUCHED 0xee

/* Elements rank i sends to rank j: about big / (1 + k) for a rank k that moves with (i, j) (Zipf with
 * exponent 1), zero for about one pair in five; the last rank (of three or more) sends nothing. */
static size_t a2av_count(int i, int j, int n, size_t big, uint32_t seed) {
  if (n > 2 && i == n - 1) return 0;
  uint32_t h = (uint32_t)(i * 7 + j * 3) + seed;
  if (h % 5 == 2) return 0;
  return big / (1 + h % (uint32_t)(n + 3)) + (h % 3);
}
/* Gaps of 0..3 elements before each block; receive blocks laid out in reverse peer order. */
static size_t gap(int p, int side) { return (size_t)((p * 5 + side) % 4); }

struct layout {
  size_t sc[16], sd[16], rc[16], rd[16], sn, rn; /* counts, displacements, buffer lengths (elements) */
};

static void lay_out(struct layout* l, int rank, int n, size_t big, uint32_t seed) {
  ASSERT(n <= 16);
  l->sn = l->rn = 0;
  for (int p = 0; p < n; p++) {
    l->sc[p] = a2av_count(rank, p, n, big, seed);
    l->sd[p] = l->sn + gap(p, 0);
    l->sn = l->sd[p] + l->sc[p];
  }
  for (int p = n - 1; p >= 0; p--) {
    l->rc[p] = a2av_count(p, rank, n, big, seed);
    l->rd[p] = l->rn + gap(p, 1);
    l->rn = l->rd[p] + l->rc[p];
  }
  l->sn += 3, l->rn += 3; /* a tail nobody writes */
}

struct bufs {
  char *s, *r;
};

/* Send blocks hold the pattern of (rank, peer), gaps a byte no check expects; receive buffers start
 * UNTOUCHED. */
static void fill(struct bufs* b, const struct layout* l, int rank, int n, int type, uint32_t seed) {
  size_t es = cu_type_size(type);
  memset(b->s, 0x5a, l->sn * es);
  memset(b->r, UNTOUCHED, l->rn * es);
  for (int p = 0; p < n; p++) cu_fill_pattern(b->s + l->sd[p] * es, type, l->sc[p], rank, p, seed);
}

/* Each block from p holds p's pattern for us, every other byte is still UNTOUCHED; returns failures. */
static int check(const struct bufs* b, const struct layout* l, int rank, int n, int type, uint32_t seed,
                 const char* what) {
  size_t es = cu_type_size(type);
  int bad = 0;
  char* mark = calloc(l->rn * es + 1, 1);
  ASSERT(mark != NULL);
  for (int p = 0; p < n; p++) {
    long at = cu_check_pattern(b->r + l->rd[p] * es, type, l->rc[p], p, rank, seed);
    if (at >= 0) {
      cu_failf("%s %s: rank %d: block from rank %d (%zu elements) wrong from element %ld", what, cu_type_name(type),
               rank, p, l->rc[p], at);
      bad++;
    }
    memset(mark + l->rd[p] * es, 1, l->rc[p] * es);
  }
  for (size_t k = 0; k < l->rn * es; k++)
    if (!mark[k] && (unsigned char)b->r[k] != UNTOUCHED) {
      cu_failf("%s %s: rank %d: byte %zu outside every block was written", what, cu_type_name(type), rank, k);
      bad++;
      break;
    }
  free(mark);
  return bad;
}

static ncclResult_t issue(const struct bufs* b, const struct layout* l, int type, ncclComm_t comm, cudaStream_t s) {
  return ncclAllToAllv(b->s, l->sc, l->sd, b->r, l->rc, l->rd, (ncclDataType_t)type, comm, s);
}

struct run {
  size_t big;    /* largest block about this */
  int all_types; /* every datatype, else four sizes */
  int stream;    /* on a chorusStreamCreate stream */
};

static void body(int rank, int nranks, ncclUniqueId id, void* arg) {
  const struct run* r = arg;
  ncclComm_t comm = cu_comm_init(rank, nranks, id);
  cudaStream_t s = NULL;
  if (r->stream) NCCL_OK(chorusStreamCreate(&s));
  static const int few[] = {ncclInt8, ncclFloat16, ncclFloat32, ncclFloat64};
  int nt = r->all_types ? ncclNumTypes : 4;
  for (int k = 0; k < nt; k++) {
    int type = r->all_types ? k : few[k];
    uint32_t seed = (uint32_t)(k * 11 + 1);
    struct layout l;
    lay_out(&l, rank, nranks, r->big, seed);
    size_t es = cu_type_size(type);
    struct bufs b = {malloc(l.sn * es), malloc(l.rn * es)};
    ASSERT(b.s && b.r);
    fill(&b, &l, rank, nranks, type, seed);
    NCCL_OK(issue(&b, &l, type, comm, s));
    if (s) NCCL_OK(chorusStreamSynchronize(s));
    check(&b, &l, rank, nranks, type, seed, r->stream ? "host stream" : "blocking");
    free(b.s);
    free(b.r);
  }
  if (s) NCCL_OK(chorusStreamDestroy(s));
  NCCL_OK(ncclCommDestroy(comm));
  cu_finish();
}

TEST_T(alltoallv, every_type_small, 90) {
  struct run r = {40, 1, 0};
  rt_run_both(3, body, &r);
  rt_run_both(2, body, &r);
  rt_run_threads(1, body, &r);
}

/* Blocks far larger than a FIFO: many steps per pair, and a sender that must wait for its receiver. */
TEST_T(alltoallv, large_blocks, 120) {
  struct run r = {300000, 0, 0};
  rt_run_both(4, body, &r);
}

TEST_T(alltoallv, eight_ranks_host_stream, 90) {
  struct run r = {5000, 0, 1};
  rt_run_threads(8, body, &r);
  rt_run_procs(3, body, &r);
}

/* Every peer over loopback TCP (each pair's header and data through the network proxy). */
TEST_T(alltoallv, network_transport, 120) {
  setenv("NCCL_P2P_DISABLE", "1", 1);
  setenv("NCCL_SHM_DISABLE", "1", 1);
  param_reset();
  struct run r = {20000, 0, 0};
  rt_run_procs(3, body, &r);
  unsetenv("NCCL_P2P_DISABLE");
  unsetenv("NCCL_SHM_DISABLE");
  param_reset();
}

/* More peers than a rank may keep connected: the group runs in waves (core/group.c). */
TEST_T(alltoallv, waves, 90) {
  setenv("CHORUS_P2P_PEERS", "2", 1);
  param_reset();
  struct run r = {3000, 0, 0};
  rt_run_threads(8, body, &r);
  unsetenv("CHORUS_P2P_PEERS");
  param_reset();
}

/* Two calls in the user's group with a send/recv ring between them, then counters and the recorder: each
 * AllToAllv is one call (bytes: what it sends), one entry named AllToAllv with the elements it sends. */
static void group_body(int rank, int nranks, ncclUniqueId id, void* arg) {
  (void)arg;
  ncclComm_t comm = cu_comm_init(rank, nranks, id);
  struct layout l[2];
  struct bufs b[2];
  float ring_in = (float)rank, ring_out = -1;
  size_t sent = 0;
  for (int c = 0; c < 2; c++) {
    lay_out(&l[c], rank, nranks, 700, (uint32_t)c + 5);
    b[c] = (struct bufs){malloc(l[c].sn * 4), malloc(l[c].rn * 4)};
    ASSERT(b[c].s && b[c].r);
    fill(&b[c], &l[c], rank, nranks, ncclFloat32, (uint32_t)c + 5);
    for (int p = 0; p < nranks; p++) sent += l[c].sc[p];
  }
  NCCL_OK(ncclGroupStart());
  NCCL_OK(issue(&b[0], &l[0], ncclFloat32, comm, NULL));
  NCCL_OK(ncclSend(&ring_in, 1, ncclFloat32, (rank + 1) % nranks, comm, NULL));
  NCCL_OK(ncclRecv(&ring_out, 1, ncclFloat32, (rank + nranks - 1) % nranks, comm, NULL));
  NCCL_OK(issue(&b[1], &l[1], ncclFloat32, comm, NULL));
  NCCL_OK(ncclGroupEnd());
  for (int c = 0; c < 2; c++) check(&b[c], &l[c], rank, nranks, ncclFloat32, (uint32_t)c + 5, "grouped");
  EXPECT(ring_out == (float)((rank + nranks - 1) % nranks));
  chorusCounters_t k;
  NCCL_OK(chorusCommGetCounters(comm, &k));
  EXPECT_EQ(k.calls, 4);
  EXPECT_EQ(k.bytes, sent * 4 + 2 * 4);
  EXPECT_EQ(k.errors, 0);
  struct fr_entry* e = NULL;
  uint64_t recorded, skipped;
  int n = fr_snapshot(comm, &e, &recorded, &skipped), a2av = 0;
  ASSERT(n == 4 && e);
  for (int i = 0; i < n; i++) {
    if (e[i].func != FUNC_ALLTOALLV) continue;
    size_t want = 0;
    for (int p = 0; p < nranks; p++) want += l[a2av].sc[p];
    EXPECT_EQ(e[i].count, want);
    EXPECT_EQ(e[i].state, FR_DONE);
    EXPECT_EQ(e[i].root, -1);
    a2av++;
  }
  EXPECT_EQ(a2av, 2);
  EXPECT(e[0].func == FUNC_ALLTOALLV && e[3].func == FUNC_ALLTOALLV);
  free(e);
  for (int c = 0; c < 2; c++) free(b[c].s), free(b[c].r);
  NCCL_OK(ncclCommDestroy(comm));
  cu_finish();
}

TEST_T(alltoallv, in_a_group_counted_and_recorded_once, 60) { rt_run_both(3, group_body, NULL); }

/* All counts zero on every rank: nothing to move, buffers NULL; and on one rank only, its peers still
 * exchange with each other. */
static void zeros_body(int rank, int nranks, ncclUniqueId id, void* arg) {
  (void)arg;
  ncclComm_t comm = cu_comm_init(rank, nranks, id);
  size_t z[4] = {0}, c[4], d[4];
  NCCL_OK(ncclAllToAllv(NULL, z, z, NULL, z, z, ncclFloat64, comm, NULL));
  int idle = nranks - 1; /* sends and receives nothing */
  double in[4], out[4] = {-1, -1, -1, -1};
  for (int p = 0; p < nranks; p++) {
    c[p] = rank == idle || p == idle ? 0 : 1;
    d[p] = (size_t)p;
    in[p] = rank * 10 + p;
  }
  NCCL_OK(ncclAllToAllv(in, c, d, out, c, d, ncclFloat64, comm, NULL));
  for (int p = 0; p < nranks; p++) EXPECT(out[p] == (c[p] ? p * 10 + rank : -1));
  NCCL_OK(ncclCommDestroy(comm));
}

TEST_T(alltoallv, zero_counts, 60) { rt_run_both(3, zeros_body, NULL); }

/* ---- refusals: by name, before anything moves, and the communicator still works after them ---- */

static void expect_refused(ncclResult_t got, ncclResult_t want, ncclComm_t comm, const char* text) {
  EXPECT_EQ(got, want);
  const char* msg = ncclGetLastError(comm);
  if (!strstr(msg, text)) rt_fail(__FILE__, __LINE__, "last error '%s' does not say '%s'", msg, text);
}

static void refusals_body(int rank, int nranks, ncclUniqueId id, void* arg) {
  (void)arg;
  ncclComm_t comm = cu_comm_init(rank, nranks, id);
  float in[8], out[8];
  for (int i = 0; i < 8; i++) in[i] = (float)(rank * 100 + i), out[i] = -1;
  size_t c[2] = {4, 4}, d[2] = {0, 4}, big[2] = {4, SIZE_MAX - 1}, near[2] = {0, 2};
  const char* null_names[4] = {"sendcounts is NULL", "sdispls is NULL", "recvcounts is NULL", "rdispls is NULL"};
  for (int k = 0; k < 4; k++)
    expect_refused(ncclAllToAllv(in, k == 0 ? NULL : c, k == 1 ? NULL : d, out, k == 2 ? NULL : c, k == 3 ? NULL : d,
                                 ncclFloat32, comm, NULL),
                   ncclInvalidArgument, comm, null_names[k]);
  expect_refused(ncclAllToAllv(in, c, d, out, c, d, (ncclDataType_t)99, comm, NULL), ncclInvalidArgument, comm,
                 "ncclAllToAllv: invalid datatype 99");
  expect_refused(
      ncclAllToAllv(in, c, big, out, c, d, ncclFloat32, comm, NULL), ncclInvalidArgument, comm,
      "sdispls[1] (18446744073709551614) + sendcounts[1] (4) elements of 4 bytes overflow the address space");
  expect_refused(ncclAllToAllv(in, big, d, out, c, d, ncclFloat32, comm, NULL), ncclInvalidArgument, comm,
                 "sdispls[1] (4) + sendcounts[1] (18446744073709551614)");
  expect_refused(ncclAllToAllv(NULL, c, d, out, c, d, ncclFloat32, comm, NULL), ncclInvalidArgument, comm,
                 "sendbuff is NULL but sendcounts[0] is 4");
  expect_refused(ncclAllToAllv(in, c, d, NULL, c, d, ncclFloat32, comm, NULL), ncclInvalidArgument, comm,
                 "recvbuff is NULL but recvcounts[0] is 4");
  expect_refused(ncclAllToAllv(in, c, d, out, c, near, ncclFloat32, comm, NULL), ncclInvalidArgument, comm,
                 "the receive block of rank 0 (elements [0, 4) of recvbuff) overlaps the receive block of rank 1 "
                 "(elements [2, 6) of recvbuff): receive blocks must not overlap");
  expect_refused(ncclAllToAllv(out, c, d, out, c, d, ncclFloat32, comm, NULL), ncclInvalidArgument, comm,
                 "ncclAllToAllv is out of place only");
  expect_refused(ncclAllToAllv(in, c, d, in + 6, c, d, ncclFloat32, comm, NULL), ncclInvalidArgument, comm,
                 "the send block of rank 1 (elements [4, 8) of sendbuff) overlaps the receive block of rank 0 "
                 "(elements [0, 4) of recvbuff)");
  NCCL_OK(ncclGroupStart()); /* in the user's group: refused at the call, and the group fails too */
  expect_refused(ncclAllToAllv(in, c, d, out, c, near, ncclFloat32, comm, NULL), ncclInvalidArgument, comm,
                 "receive blocks must not overlap");
  EXPECT(ncclGroupEnd() != ncclSuccess);
  EXPECT_EQ(ncclAllToAllv(in, c, d, out, c, d, ncclFloat32, NULL, NULL), ncclInvalidArgument);
  for (int i = 0; i < 8; i++) EXPECT(out[i] == -1.0f); /* nothing written */
  /* Send blocks may overlap: every peer gets elements [0, 4). Then a call as the first of a fresh group. */
  size_t same[2] = {0, 0};
  NCCL_OK(ncclAllToAllv(in, c, same, out, c, d, ncclFloat32, comm, NULL));
  for (int p = 0; p < nranks; p++)
    for (int i = 0; i < 4; i++) EXPECT(out[4 * p + i] == (float)(p * 100 + i));
  chorusCounters_t k;
  NCCL_OK(chorusCommGetCounters(comm, &k));
  EXPECT_EQ(k.calls, 1); /* refused calls never ran */
  EXPECT_EQ(k.errors, 0);
  NCCL_OK(ncclCommDestroy(comm));
}

TEST_T(alltoallv, refusals, 60) { rt_run_threads(2, refusals_body, NULL); }

/* ---- device buffers, staged through host memory (a stand-in CUDA driver, as tests/test_cuda.c) ---- */

static void (*mark_dev)(const void*, size_t, int);
static int (*cu_sync)(void*);

static void load_fake_cuda(void) {
  void* h = dlopen(CHORUS_FAKE_CUDA, RTLD_NOW | RTLD_GLOBAL);
  ASSERT(h != NULL);
  *(void**)&mark_dev = dlsym(h, "fake_cuda_mark");
  *(void**)&cu_sync = dlsym(h, "cuStreamSynchronize");
  int (*cu_init)(unsigned) = (int (*)(unsigned))dlsym(h, "cuInit");
  ASSERT(mark_dev && cu_sync && cu_init);
  EXPECT_EQ(cu_init(0), 0);
  setenv("CHORUS_CUDA_LIBRARY", CHORUS_FAKE_CUDA, 1);
  param_reset();
}

#define DR 3
#define DMAX 4096
static char dev_s[DR][DMAX * 8], dev_r[DR][DMAX * 8];
static float host_r[DMAX];

static void device_body(int rank, int nranks, ncclUniqueId id, void* arg) {
  (void)arg;
  ncclComm_t comm = cu_comm_init(rank, nranks, id);
  struct layout l;
  lay_out(&l, rank, nranks, 1000, 3);
  ASSERT(l.sn <= DMAX && l.rn <= DMAX);
  struct bufs b = {dev_s[rank], dev_r[rank]};
  fill(&b, &l, rank, nranks, ncclFloat64, 3);
  /* A CUDA stream per rank (ranks sharing a GPU need their own, as with NCCL), waited for. */
  cudaStream_t s = (cudaStream_t)(uintptr_t)(0x6000 + rank);
  NCCL_OK(issue(&b, &l, ncclFloat64, comm, s));
  EXPECT_EQ(cu_sync(s), 0);
  check(&b, &l, rank, nranks, ncclFloat64, 3, "device buffers");
  /* One call takes host buffers or device buffers, not both. */
  size_t one[DR] = {1, 1, 1}, at[DR] = {0, 1, 2};
  expect_refused(ncclAllToAllv(b.s, one, at, host_r, one, at, ncclFloat32, comm, s), ncclInvalidArgument, comm,
                 "is CUDA device memory but recvbuff");
  NCCL_OK(ncclCommDestroy(comm));
  cu_finish();
}

TEST_T(alltoallv, device_buffers_staged, 60) {
  load_fake_cuda();
  mark_dev(dev_s, sizeof(dev_s), 1);
  mark_dev(dev_r, sizeof(dev_r), 1);
  rt_run_threads(DR, device_body, NULL);
}
