/* Argument checking of the public API: every bad value is refused with the NCCL error code, without
 * crashing and without waiting for peers. Public API only. */
#include <string.h>

#include "nccl.h"
#include "runner.h"

/* A one-rank communicator, the cheapest valid comm for argument checks. */
static ncclComm_t one_rank_comm(void) {
  ncclUniqueId id;
  ncclComm_t comm = NULL;
  NCCL_OK(ncclGetUniqueId(&id));
  NCCL_OK(ncclCommInitRank(&comm, 1, id, 0));
  ASSERT(comm != NULL);
  return comm;
}

TEST_T(api, get_version, 10) {
  int v = 0;
  EXPECT_EQ(ncclGetVersion(NULL), ncclInvalidArgument);
  NCCL_OK(ncclGetVersion(&v));
  EXPECT_EQ(v, NCCL_VERSION_CODE);
}

TEST_T(api, error_strings, 10) {
  const char* s[ncclNumResults];
  for (int r = 0; r < ncclNumResults; r++) {
    s[r] = ncclGetErrorString((ncclResult_t)r);
    ASSERT(s[r] != NULL);
    EXPECT(strlen(s[r]) > 0);
    for (int q = 0; q < r; q++)
      if (!strcmp(s[q], s[r])) rt_fail(__FILE__, __LINE__, "codes %d and %d share the string \"%s\"", q, r, s[r]);
  }
  /* NCCL's own texts for the codes programs print most. */
  EXPECT(!strcmp(s[ncclSuccess], "no error"));
  EXPECT(strstr(s[ncclInvalidArgument], "invalid argument") != NULL);
  EXPECT(strstr(s[ncclInvalidUsage], "invalid usage") != NULL);
  EXPECT(strstr(s[ncclInProgress], "in progress") != NULL);
  EXPECT(strstr(s[ncclTimeout], "timeout") != NULL);
  /* Unknown values get a string too, never NULL. */
  const int unknown[] = {ncclNumResults, 42, -1, 0x7fffffff};
  for (size_t i = 0; i < sizeof(unknown) / sizeof(unknown[0]); i++) {
    const char* u = ncclGetErrorString((ncclResult_t)unknown[i]);
    ASSERT(u != NULL);
    EXPECT(strstr(u, "unknown") != NULL);
  }
}

TEST_T(api, null_comm, 10) {
  int n = -7;
  ncclResult_t async = ncclSuccess;
  float buf[4] = {0};
  EXPECT_EQ(ncclCommCount(NULL, &n), ncclInvalidArgument);
  EXPECT_EQ(ncclCommUserRank(NULL, &n), ncclInvalidArgument);
  EXPECT_EQ(ncclCommCuDevice(NULL, &n), ncclInvalidArgument);
  EXPECT_EQ(ncclCommGetAsyncError(NULL, &async), ncclInvalidArgument);
  EXPECT_EQ(n, -7); /* nothing written on failure */
  EXPECT_EQ(ncclAllReduce(buf, buf, 4, ncclFloat, ncclSum, NULL, NULL), ncclInvalidArgument);
  EXPECT_EQ(ncclBroadcast(buf, buf, 4, ncclFloat, 0, NULL, NULL), ncclInvalidArgument);
  EXPECT_EQ(ncclSend(buf, 4, ncclFloat, 0, NULL, NULL), ncclInvalidArgument);
  /* NCCL itself treats Destroy/Abort(NULL) as a no-op returning ncclSuccess; Chorus may refuse it
   * instead. Either way: no crash and no other code. */
  ncclResult_t r = ncclCommDestroy(NULL);
  EXPECT(r == ncclInvalidArgument || r == ncclSuccess);
  r = ncclCommAbort(NULL);
  EXPECT(r == ncclInvalidArgument || r == ncclSuccess);
}

TEST_T(api, init_bad_ranks, 20) {
  ncclUniqueId id;
  ncclComm_t comm = NULL;
  NCCL_OK(ncclGetUniqueId(&id));
  EXPECT_EQ(ncclCommInitRank(&comm, 0, id, 0), ncclInvalidArgument);
  EXPECT_EQ(ncclCommInitRank(&comm, -1, id, 0), ncclInvalidArgument);
  EXPECT_EQ(ncclCommInitRank(&comm, 2, id, -1), ncclInvalidArgument);
  EXPECT_EQ(ncclCommInitRank(&comm, 2, id, 2), ncclInvalidArgument);
  EXPECT_EQ(ncclCommInitRank(&comm, 2, id, 5), ncclInvalidArgument);
  EXPECT_EQ(ncclCommInitAll(NULL, 2, NULL), ncclInvalidArgument);
  ncclComm_t comms[2] = {NULL, NULL};
  EXPECT_EQ(ncclCommInitAll(comms, 0, NULL), ncclInvalidArgument);
  EXPECT_EQ(ncclCommInitAll(comms, -1, NULL), ncclInvalidArgument);
  EXPECT(comm == NULL);
  /* The id was not consumed by the refused calls: a valid job can still use it. */
  NCCL_OK(ncclCommInitRank(&comm, 1, id, 0));
  NCCL_OK(ncclCommDestroy(comm));
}

TEST_T(api, null_out_pointers, 20) {
  ncclUniqueId id;
  EXPECT_EQ(ncclGetUniqueId(NULL), ncclInvalidArgument);
  NCCL_OK(ncclGetUniqueId(&id));
  EXPECT_EQ(ncclCommInitRank(NULL, 1, id, 0), ncclInvalidArgument);
  ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
  EXPECT_EQ(ncclCommInitRankConfig(NULL, 1, id, 0, &cfg), ncclInvalidArgument);

  ncclComm_t comm = one_rank_comm();
  EXPECT_EQ(ncclCommCount(comm, NULL), ncclInvalidArgument);
  EXPECT_EQ(ncclCommUserRank(comm, NULL), ncclInvalidArgument);
  EXPECT_EQ(ncclCommCuDevice(comm, NULL), ncclInvalidArgument);
  EXPECT_EQ(ncclCommGetAsyncError(comm, NULL), ncclInvalidArgument);
  EXPECT_EQ(ncclCommSplit(comm, 0, 0, NULL, NULL), ncclInvalidArgument);
  /* The comm is unharmed by the refused calls. */
  int n = 0;
  NCCL_OK(ncclCommCount(comm, &n));
  EXPECT_EQ(n, 1);
  NCCL_OK(ncclCommDestroy(comm));
}

TEST_T(api, bad_config, 20) {
  ncclUniqueId id;
  ncclComm_t comm = NULL;
  NCCL_OK(ncclGetUniqueId(&id));
  ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
  cfg.magic = 0x12345678;
  EXPECT_EQ(ncclCommInitRankConfig(&comm, 1, id, 0, &cfg), ncclInvalidArgument);
  ncclConfig_t zero;
  memset(&zero, 0, sizeof(zero)); /* not from NCCL_CONFIG_INITIALIZER */
  EXPECT_EQ(ncclCommInitRankConfig(&comm, 1, id, 0, &zero), ncclInvalidArgument);
  EXPECT(comm == NULL);
  /* A good config after the bad ones works, and config == NULL means defaults. */
  ncclConfig_t good = NCCL_CONFIG_INITIALIZER;
  NCCL_OK(ncclCommInitRankConfig(&comm, 1, id, 0, &good));
  NCCL_OK(ncclCommDestroy(comm));
  NCCL_OK(ncclGetUniqueId(&id));
  NCCL_OK(ncclCommInitRankConfig(&comm, 1, id, 0, NULL));
  NCCL_OK(ncclCommDestroy(comm));
}

TEST_T(api, bad_collective_args, 20) {
  ncclComm_t comm = one_rank_comm();
  float buf[8] = {0}, out[8] = {0};
  const ncclDataType_t bad_types[] = {ncclNumTypes, (ncclDataType_t)-1, (ncclDataType_t)1000};
  for (size_t i = 0; i < sizeof(bad_types) / sizeof(bad_types[0]); i++) {
    EXPECT_EQ(ncclAllReduce(buf, out, 8, bad_types[i], ncclSum, comm, NULL), ncclInvalidArgument);
    EXPECT_EQ(ncclBroadcast(buf, out, 8, bad_types[i], 0, comm, NULL), ncclInvalidArgument);
    EXPECT_EQ(ncclAllGather(buf, out, 8, bad_types[i], comm, NULL), ncclInvalidArgument);
    EXPECT_EQ(ncclSend(buf, 8, bad_types[i], 0, comm, NULL), ncclInvalidArgument);
  }
  /* ncclNumOps and above are only valid once created by ncclRedOpCreatePreMulSum. */
  const ncclRedOp_t bad_ops[] = {ncclNumOps, (ncclRedOp_t)-1, (ncclRedOp_t)77, ncclMaxRedOp};
  for (size_t i = 0; i < sizeof(bad_ops) / sizeof(bad_ops[0]); i++) {
    EXPECT_EQ(ncclAllReduce(buf, out, 8, ncclFloat, bad_ops[i], comm, NULL), ncclInvalidArgument);
    EXPECT_EQ(ncclReduce(buf, out, 8, ncclFloat, bad_ops[i], 0, comm, NULL), ncclInvalidArgument);
    EXPECT_EQ(ncclReduceScatter(buf, out, 8, ncclFloat, bad_ops[i], comm, NULL), ncclInvalidArgument);
  }
  /* Roots and peers outside [0, nranks). */
  EXPECT_EQ(ncclBroadcast(buf, out, 8, ncclFloat, 1, comm, NULL), ncclInvalidArgument);
  EXPECT_EQ(ncclReduce(buf, out, 8, ncclFloat, ncclSum, -1, comm, NULL), ncclInvalidArgument);
  EXPECT_EQ(ncclSend(buf, 8, ncclFloat, 1, comm, NULL), ncclInvalidArgument);
  EXPECT_EQ(ncclRecv(out, 8, ncclFloat, -1, comm, NULL), ncclInvalidArgument);
  /* NULL buffers with a non-zero count. */
  EXPECT_EQ(ncclAllReduce(NULL, out, 8, ncclFloat, ncclSum, comm, NULL), ncclInvalidArgument);
  EXPECT_EQ(ncclAllReduce(buf, NULL, 8, ncclFloat, ncclSum, comm, NULL), ncclInvalidArgument);
  /* None of it touched the output or broke the comm. */
  for (int i = 0; i < 8; i++) EXPECT(out[i] == 0.0f);
  ncclResult_t async = ncclInternalError;
  NCCL_OK(ncclCommGetAsyncError(comm, &async));
  EXPECT_EQ(async, ncclSuccess);
  for (int i = 0; i < 8; i++) buf[i] = (float)i;
  NCCL_OK(ncclAllReduce(buf, out, 8, ncclFloat, ncclSum, comm, NULL));
  for (int i = 0; i < 8; i++) EXPECT(out[i] == (float)i);
  NCCL_OK(ncclCommDestroy(comm));
}

TEST_T(api, last_error, 20) {
  ncclUniqueId id;
  ncclComm_t comm = NULL;
  NCCL_OK(ncclGetUniqueId(&id));
  ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
  cfg.magic = 0;
  EXPECT_EQ(ncclCommInitRankConfig(&comm, 1, id, 0, &cfg), ncclInvalidArgument);
  const char* e = ncclGetLastError(NULL);
  ASSERT(e != NULL);
  EXPECT(strlen(e) > 0);
  char first[512];
  snprintf(first, sizeof(first), "%s", e);
  /* A different mistake replaces the text: it is the last WARN, not the first. */
  EXPECT_EQ(ncclCommInitRank(&comm, 2, id, 7), ncclInvalidArgument);
  e = ncclGetLastError(NULL);
  ASSERT(e != NULL);
  EXPECT(strlen(e) > 0);
  if (!strcmp(first, e)) rt_fail(__FILE__, __LINE__, "last error did not change: \"%s\"", e);
  if (!strstr(e, "7")) rt_fail(__FILE__, __LINE__, "last error does not name the bad rank 7: \"%s\"", e);
  /* The comm argument is ignored, as in NCCL. */
  comm = one_rank_comm();
  EXPECT(ncclGetLastError(comm) != NULL);
  NCCL_OK(ncclCommDestroy(comm));
}

/* NCCL 2.29+ entry points: suspend's arguments (api/suspend.c) and those Chorus answers without doing
 * their work (api/stubs.c). */
TEST_T(api, newer_entry_points, 20) {
  ncclComm_t comm = one_rank_comm();
  NCCL_OK(ncclCommSuspend(comm, 0)); /* nothing asked for: as NCCL, not suspended (tests/test_suspend.c) */
  EXPECT_EQ(ncclCommResume(comm), ncclInvalidUsage);
  uint64_t v = 7;
  NCCL_OK(ncclCommMemStats(comm, ncclStatGpuMemTotal, &v));
  EXPECT_EQ(v, 0);
  EXPECT_EQ(ncclCommMemStats(comm, (ncclCommMemStat_t)9, &v), ncclInvalidArgument);
  EXPECT_EQ(ncclCommMemStats(comm, ncclStatGpuMemSuspend, NULL), ncclInvalidArgument);
  ncclComm_t grown = comm;
  EXPECT_EQ(ncclCommGrow(comm, 2, NULL, 1, &grown, NULL), ncclInvalidArgument); /* rank must be -1 (test_grow.c) */
  EXPECT(grown == NULL);
  EXPECT(strstr(ncclGetLastError(NULL), "ncclCommGrow") != NULL);
  EXPECT_EQ(ncclSignal(0, 0, 0, 0, comm, NULL), ncclInvalidUsage);
  NCCL_OK(ncclCommDestroy(comm));
}

/* ncclCommQueryProperties: NCCL 2.31's layout (the offsets of nccl_device/core.h on LP64), the truth
 * about what Chorus has (no device API, GIN, multimem), and structs of older headers filled only as
 * far as they reach. */
#include <stddef.h>
#include "chorus.h"
_Static_assert(offsetof(ncclCommProperties_t, rank) == 16 && offsetof(ncclCommProperties_t, deviceApiSupport) == 32 &&
                   offsetof(ncclCommProperties_t, ginType) == 36 && offsetof(ncclCommProperties_t, hostRmaSupport) == 44 &&
                   offsetof(ncclCommProperties_t, commHash) == 56 && offsetof(ncclCommProperties_t, ginSupport) == 72 &&
                   offsetof(ncclCommProperties_t, devCommRuntimeVersionSize) == 136 && sizeof(ncclCommProperties_t) == 144,
               "ncclCommProperties_t has NCCL 2.31's layout");

TEST_T(api, query_properties, 20) {
  ncclComm_t comms[2];
  int devs[2] = {0, 0};
  NCCL_OK(ncclCommInitAll(comms, 2, devs));
  ncclCommProperties_t p[2];
  for (int r = 0; r < 2; r++) {
    ncclCommProperties_t q = NCCL_COMM_PROPERTIES_INITIALIZER;
    memset(&q.rank, 0x5a, sizeof(q) - offsetof(ncclCommProperties_t, rank));
    NCCL_OK(ncclCommQueryProperties(comms[r], &q));
    EXPECT_EQ(q.rank, r);
    EXPECT_EQ(q.nRanks, 2);
    EXPECT(!q.deviceApiSupport && !q.multimemSupport && !q.hostRmaSupport);
    EXPECT_EQ(q.ginType, NCCL_GIN_TYPE_NONE);
    EXPECT_EQ(q.railedGinType, NCCL_GIN_TYPE_NONE);
    EXPECT_EQ(q.nLsaTeams, 0);
    EXPECT_EQ(q.ginConnectionType, NCCL_GIN_CONNECTION_NONE);
    EXPECT_EQ(q.devCommRuntimeVersionSize, 0);
    for (int i = 0; i < 64; i++) EXPECT(!q.ginSupport[i]);
    p[r] = q;
  }
  EXPECT(p[0].commHash == p[1].commHash && p[0].commHash != 0);

  /* 2.29.7's struct ends before commHash: nothing past it is written. */
  ncclCommProperties_t old;
  memset(&old, 0x5a, sizeof(old));
  old.size = offsetof(ncclCommProperties_t, commHash), old.magic = NCCL_API_MAGIC, old.version = 22907;
  NCCL_OK(ncclCommQueryProperties(comms[1], &old));
  EXPECT(old.rank == 1 && old.ginType == NCCL_GIN_TYPE_NONE && !old.hostRmaSupport);
  const unsigned char* tail = (const unsigned char*)&old + offsetof(ncclCommProperties_t, commHash);
  for (size_t i = 0; i < sizeof(old) - offsetof(ncclCommProperties_t, commHash); i++) EXPECT_EQ(tail[i], 0x5a);
  /* 2.29.2's: ginType was the byte after multimemSupport, and the struct ended at 40 bytes. */
  memset(&old, 0x5a, sizeof(old));
  old.size = 40, old.magic = NCCL_API_MAGIC, old.version = 22902;
  NCCL_OK(ncclCommQueryProperties(comms[0], &old));
  EXPECT_EQ(((unsigned char*)&old)[34], 0);
  EXPECT_EQ(((unsigned char*)&old)[40], 0x5a);

  /* Refused by name: no initializer, a newer header's struct, a size no header had, NULL. */
  ncclCommProperties_t bad = NCCL_COMM_PROPERTIES_INITIALIZER;
  bad.magic = 0;
  EXPECT_EQ(ncclCommQueryProperties(comms[0], &bad), ncclInvalidUsage);
  EXPECT(strstr(ncclGetLastError(NULL), "NCCL_COMM_PROPERTIES_INITIALIZER") != NULL);
  bad = (ncclCommProperties_t)NCCL_COMM_PROPERTIES_INITIALIZER;
  bad.version = NCCL_VERSION_CODE + 1;
  EXPECT_EQ(ncclCommQueryProperties(comms[0], &bad), ncclInvalidUsage);
  bad = (ncclCommProperties_t)NCCL_COMM_PROPERTIES_INITIALIZER;
  bad.size = 4096;
  EXPECT_EQ(ncclCommQueryProperties(comms[0], &bad), ncclInvalidArgument);
  EXPECT_EQ(ncclCommQueryProperties(comms[0], NULL), ncclInvalidArgument);
  EXPECT_EQ(ncclCommQueryProperties(NULL, &p[0]), ncclInvalidArgument);
  for (int r = 0; r < 2; r++) NCCL_OK(ncclCommDestroy(comms[r]));
}
