/* CUDA buffers without a GPU: the library classifies buffers only in a process that has the CUDA
 * driver loaded; device memory then runs on host copies (staging.c), mixed kinds are refused by
 * name, and managed memory is ordered after the call's CUDA stream. A stand-in driver (cuda_stub/fake_cuda.c) plays
 * libcuda.so.1: tests mark host ranges as device or managed memory. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cuda/cudrv.h"
#include "misc/param.h"
#include "chorus.h"
#include "nccl.h"
#include "runner.h"

static void (*mark)(const void*, size_t, int);
static int (*syncs)(void), (*copies)(void), (*ctx_depth)(void);

/* As an application that uses CUDA: the driver is loaded (and, unless told, initialised). */
static void load_fake(int init) {
  void* h = dlopen(CHORUS_FAKE_CUDA, RTLD_NOW | RTLD_GLOBAL);
  ASSERT(h != NULL);
  *(void**)&mark = dlsym(h, "fake_cuda_mark");
  *(void**)&syncs = dlsym(h, "fake_cuda_syncs");
  *(void**)&copies = dlsym(h, "fake_cuda_copies");
  *(void**)&ctx_depth = dlsym(h, "fake_cuda_ctx_depth");
  int (*cu_init)(unsigned) = (int (*)(unsigned))dlsym(h, "cuInit");
  ASSERT(mark && syncs && copies && ctx_depth && cu_init);
  if (init) EXPECT_EQ(cu_init(0), 0);
  setenv("CHORUS_CUDA_LIBRARY", CHORUS_FAKE_CUDA, 1);
  param_reset();
}

static ncclComm_t one_rank(void) {
  ncclUniqueId id;
  ncclComm_t comm = NULL;
  NCCL_OK(ncclGetUniqueId(&id));
  NCCL_OK(ncclCommInitRank(&comm, 1, id, 0));
  return comm;
}

TEST_T(cuda, no_driver_host_path, 30) {
  setenv("CHORUS_CUDA_LIBRARY", "libchorus-no-such-driver.so", 1);
  param_reset();
  EXPECT_EQ(cudrv_present(), 0);
  ncclComm_t comm = one_rank();
  float a[4] = {1, 2, 3, 4}, b[4] = {0};
  NCCL_OK(ncclAllReduce(a, b, 4, ncclFloat32, ncclSum, comm, NULL));
  EXPECT(b[3] == 4.0f);
  NCCL_OK(ncclCommDestroy(comm));
}

/* Device buffers run on host copies: the stream first, one copy in, one copy back, each in the
 * buffer's context (the calling thread has none current here). */
TEST_T(cuda, device_buffers_staged, 30) {
  load_fake(1);
  EXPECT_EQ(cudrv_present(), 1);
  ncclComm_t comm = one_rank();
  static float a[64], b[64]; /* host memory the fake driver calls device memory */
  for (int i = 0; i < 64; i++) a[i] = (float)i;
  mark(a, sizeof(a), 1);
  mark(b, sizeof(b), 1);
  EXPECT_EQ(cudrv_classify(a + 3, NULL), CU_MEM_DEVICE);
  cudaStream_t cuda_stream = (cudaStream_t)(uintptr_t)0x5000;
  NCCL_OK(ncclAllReduce(a, b, 64, ncclFloat32, ncclSum, comm, cuda_stream));
  EXPECT_EQ(syncs(), 1);
  EXPECT_EQ(copies(), 2);
  EXPECT_EQ(ctx_depth(), 0);
  for (int i = 0; i < 64; i++) EXPECT(b[i] == (float)i);
  NCCL_OK(ncclAllReduce(b, b, 64, ncclFloat32, ncclProd, comm, NULL)); /* in place */
  EXPECT_EQ(copies(), 4);
  for (int i = 0; i < 64; i++) EXPECT(b[i] == (float)i);
  NCCL_OK(ncclCommDestroy(comm));
}

TEST_T(cuda, mixed_or_host_stream_refused, 30) {
  load_fake(1);
  ncclComm_t comm = one_rank();
  static float host[64], dev[64];
  mark(dev, sizeof(dev), 1);
  EXPECT_EQ(ncclAllReduce(host, dev, 64, ncclFloat32, ncclSum, comm, NULL), ncclInvalidArgument);
  EXPECT(strstr(ncclGetLastError(comm), "host memory but recvbuff") != NULL);
  EXPECT_EQ(ncclGroupStart(), ncclSuccess); /* in a group: refused at the call, the group reports it too */
  EXPECT_EQ(ncclBroadcast(dev, host, 64, ncclFloat32, 0, comm, NULL), ncclInvalidArgument);
  EXPECT(ncclGroupEnd() != ncclSuccess);
  cudaStream_t ours;
  NCCL_OK(chorusStreamCreate(&ours));
  EXPECT_EQ(ncclAllReduce(dev, dev, 64, ncclFloat32, ncclSum, comm, ours), ncclInvalidArgument);
  EXPECT(strstr(ncclGetLastError(comm), "Chorus host stream") != NULL);
  NCCL_OK(chorusStreamDestroy(ours));
  for (int i = 0; i < 64; i++) EXPECT(dev[i] == 0.0f && host[i] == 0.0f); /* nothing written */
  NCCL_OK(ncclCommDestroy(comm));
}

/* Three thread ranks, every buffer device memory: AllGather in place, ReduceScatter, Broadcast and a
 * ring of Send/Recv in a group; closed-form results. */
#define SR 3
#define SC 1000
static float g_buf[SR][SR * SC], g_rs[SR][SC], g_p2p[SR][2][SC];

static void staged_body(int rank, int nranks, ncclUniqueId id, void* arg) {
  (void)arg;
  ncclComm_t comm;
  NCCL_OK(ncclCommInitRank(&comm, nranks, id, rank));
  float* ag = g_buf[rank];
  for (int i = 0; i < SC; i++) ag[rank * SC + i] = (float)(rank * SC + i);
  NCCL_OK(ncclAllGather(ag + rank * SC, ag, SC, ncclFloat32, comm, NULL));
  for (int i = 0; i < SR * SC; i++) EXPECT(ag[i] == (float)i);
  NCCL_OK(ncclReduceScatter(ag, g_rs[rank], SC, ncclFloat32, ncclSum, comm, NULL));
  for (int i = 0; i < SC; i++) EXPECT(g_rs[rank][i] == (float)(SR * (rank * SC + i)));
  NCCL_OK(ncclBroadcast(g_rs[rank], g_rs[rank], SC, ncclFloat32, 1, comm, NULL));
  for (int i = 0; i < SC; i++) EXPECT(g_rs[rank][i] == (float)(SR * (SC + i)));
  for (int i = 0; i < SC; i++) g_p2p[rank][0][i] = (float)(rank * 10 + i);
  NCCL_OK(ncclGroupStart());
  NCCL_OK(ncclSend(g_p2p[rank][0], SC, ncclFloat32, (rank + 1) % nranks, comm, NULL));
  NCCL_OK(ncclRecv(g_p2p[rank][1], SC, ncclFloat32, (rank + nranks - 1) % nranks, comm, NULL));
  NCCL_OK(ncclGroupEnd());
  int from = (rank + nranks - 1) % nranks;
  for (int i = 0; i < SC; i++) EXPECT(g_p2p[rank][1][i] == (float)(from * 10 + i));
  NCCL_OK(ncclCommDestroy(comm));
}

TEST_T(cuda, device_buffers_staged_3_threads, 60) {
  load_fake(1);
  mark(g_buf, sizeof(g_buf), 1);
  mark(g_rs, sizeof(g_rs), 1);
  mark(g_p2p, sizeof(g_p2p), 1);
  rt_run_threads(SR, staged_body, NULL);
  EXPECT(copies() > 0);
}

TEST_T(cuda, managed_memory_waits_for_the_stream, 30) {
  load_fake(1);
  ncclComm_t comm = one_rank();
  float* a = malloc(256 * sizeof(float));
  float* b = malloc(256 * sizeof(float));
  ASSERT(a && b);
  for (int i = 0; i < 256; i++) a[i] = (float)i;
  mark(a, 256 * sizeof(float), 2);
  mark(b, 256 * sizeof(float), 2);
  EXPECT_EQ(cudrv_classify(a, NULL), CU_MEM_MANAGED);
  cudaStream_t cuda_stream = (cudaStream_t)(uintptr_t)0x5000; /* a CUDA stream: not a Chorus host stream */
  NCCL_OK(ncclAllReduce(a, b, 256, ncclFloat32, ncclSum, comm, cuda_stream));
  EXPECT_EQ(syncs(), 1); /* ordered after the stream's queued work */
  for (int i = 0; i < 256; i++) EXPECT(b[i] == (float)i);
  float h[4] = {0}, g[4];
  NCCL_OK(ncclAllReduce(h, g, 4, ncclFloat32, ncclSum, comm, cuda_stream)); /* host buffers: no sync */
  EXPECT_EQ(syncs(), 1);
  free(a), free(b);
  NCCL_OK(ncclCommDestroy(comm));
}

/* An application that loaded the driver but never initialised it has no device memory. */
TEST_T(cuda, driver_not_initialised, 30) {
  load_fake(0);
  ncclComm_t comm = one_rank();
  float a[8] = {2}, b[8];
  mark(b, sizeof(b), 1);
  EXPECT_EQ(cudrv_classify(b, NULL), CU_MEM_HOST);
  NCCL_OK(ncclAllReduce(a, b, 8, ncclFloat32, ncclSum, comm, NULL));
  EXPECT(b[0] == 2.0f);
  NCCL_OK(ncclCommDestroy(comm));
}

TEST_T(cuda, chorus_info_reports_the_driver, 30) {
  char self[PATH_MAX], cmd[PATH_MAX * 2];
  const char* dir = getenv("CHORUS_BIN_DIR");
  if (!dir || !*dir) {
    ssize_t n = readlink("/proc/self/exe", self, sizeof(self) - 1);
    self[n > 0 ? n : 0] = 0;
    char* slash = strrchr(self, '/');
    if (slash) *slash = 0;
    dir = self;
  }
  snprintf(cmd, sizeof(cmd), "CHORUS_CUDA_LIBRARY=%s %s/chorus-info --brief", CHORUS_FAKE_CUDA, dir);
  FILE* f = popen(cmd, "r");
  ASSERT(f != NULL);
  char line[1024], found[1024] = "";
  while (fgets(line, sizeof(line), f))
    if (strstr(line, "CUDA:")) snprintf(found, sizeof(found), "%s", line);
  EXPECT_EQ(pclose(f), 0);
  printf("    %s", found);
  EXPECT(strstr(found, "driver 13.0, 1 device(s): 0: Fake GPU (tests)") != NULL);
}
