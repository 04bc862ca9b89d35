/* A program built against one NCCL header version, linked with libchorus: it references every call of
 * that header (so each must link), checks the header's ncclConfig_t layout against the sizes and
 * offsets that version has on LP64, and runs a one-rank communicator made with that header's
 * NCCL_CONFIG_INITIALIZER. Built once per version: -DCHORUS_ABI_NCCL=22809 (2.28.9) or 23007 (2.30.7)
 * against tests/abi/nccl_older.h, none for Chorus's own include/nccl.h (2.31.2); and, where a C++
 * compiler exists, each again as C++ (versions.cc). */
#ifdef CHORUS_ABI_NCCL
#include "nccl_older.h"
#else
#include "../../include/nccl.h"
#include "nccl_calls.h"
#define ABI_CALLS(X) ABI_CALLS_2289(X) ABI_CALLS_2307(X) ABI_CALLS_2312(X)
#endif

#include <stdio.h>
#include <string.h>

static int failures;
#define CHECK(cond)                                          \
  do {                                                       \
    if (!(cond)) {                                           \
      printf("FAIL %s:%d: %s\n", __FILE__, __LINE__, #cond); \
      failures++;                                            \
    }                                                        \
  } while (0)
#define NCCL_CHECK(call)                                                                                 \
  do {                                                                                                   \
    ncclResult_t r_ = (call);                                                                            \
    if (r_ != ncclSuccess) {                                                                             \
      printf("FAIL %s:%d: %s -> %d (%s)\n", __FILE__, __LINE__, #call, (int)r_, ncclGetErrorString(r_)); \
      failures++;                                                                                        \
      return;                                                                                            \
    }                                                                                                    \
  } while (0)

typedef void (*any_fn)(void);
#define ABI_REF(ret, name, params) {#name, (any_fn)name}, {"p" #name, (any_fn)p##name},
static const struct {
  const char* name;
  any_fn fn;
} calls[] = {ABI_CALLS(ABI_REF)};

/* Where every field of the config sits in the header this program was built with (LP64). */
static void check_layout(void) {
  CHECK(sizeof(void*) == 8); /* the offsets below are LP64's */
  CHECK(offsetof(ncclConfig_t, blocking) == 16);
  CHECK(offsetof(ncclConfig_t, netName) == 32);
  CHECK(offsetof(ncclConfig_t, splitShare) == 40);
  CHECK(offsetof(ncclConfig_t, trafficClass) == 44);
  CHECK(offsetof(ncclConfig_t, commName) == 48);
  CHECK(offsetof(ncclConfig_t, nvlsCTAs) == 68);
  CHECK(offsetof(ncclConfig_t, nvlinkCentricSched) == 76);
#if NCCL_VERSION_CODE == 22809
  CHECK(sizeof(ncclConfig_t) == 80);
  CHECK(ncclNumResults == 8);
#else
  CHECK(offsetof(ncclConfig_t, graphUsageMode) == 80);
  CHECK(offsetof(ncclConfig_t, maxP2pPeers) == 88);
  CHECK(offsetof(ncclConfig_t, graphStreamOrdering) == 92);
  CHECK(ncclTimeout == 8 && ncclNumResults == 9);
  CHECK(sizeof(ncclWaitSignalDesc_t) == 16);
#endif
#if NCCL_VERSION_CODE == 23007
  CHECK(sizeof(ncclConfig_t) == 96);
#elif NCCL_VERSION_CODE == 23102
  CHECK(offsetof(ncclConfig_t, launchOrderImplicit) == 96);
  CHECK(offsetof(ncclConfig_t, hostCftMode) == 108);
  CHECK(sizeof(ncclConfig_t) == 112);
  CHECK(offsetof(ncclCollConfig_t, ext) == 16);
  CHECK(offsetof(ncclCollConfig_t, algSelection) == 40);
  CHECK(offsetof(ncclCollConfig_t, userProfilerTag) == 56);
  CHECK(sizeof(ncclCollConfig_t) == 64);
  CHECK(sizeof(ncclConfigExt_t) == 24);
  CHECK(ncclHostCftDefault == NCCL_CONFIG_UNDEF_INT && ncclHostCftFallback == 3);
#endif
  CHECK(sizeof(ncclSimInfo_t) == 24);
}

static void check_calls(void) {
  for (size_t i = 0; i < sizeof(calls) / sizeof(calls[0]); i++)
    if (!calls[i].fn) printf("FAIL: %s did not link\n", calls[i].name), failures++;

  int version = 0;
  NCCL_CHECK(ncclGetVersion(&version));
  CHECK(version == 23102); /* the library's, whatever header the program was built with */

  ncclUniqueId id;
  NCCL_CHECK(ncclGetUniqueId(&id));
  ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
  cfg.blocking = 1;
  cfg.commName = "abi-versions";
  cfg.maxCTAs = 2;
#if NCCL_VERSION_CODE >= 23000
  cfg.maxP2pPeers = 1;
  cfg.graphStreamOrdering = 1;
#endif
  ncclComm_t comm = NULL;
  NCCL_CHECK(ncclCommInitRankConfig(&comm, 1, id, 0, &cfg));
  float in[16], out[16];
  for (int i = 0; i < 16; i++) in[i] = (float)i, out[i] = -1.0f;
  NCCL_CHECK(ncclAllReduce(in, out, 16, ncclFloat, ncclSum, comm, NULL));
  for (int i = 0; i < 16; i++) CHECK(out[i] == (float)i);
#if NCCL_VERSION_CODE >= 23000
  ncclParamHandle_t h = NULL;
  int64_t timeout = 0;
  NCCL_CHECK(ncclParamBind(&h, "CHORUS_TIMEOUT"));
  NCCL_CHECK(ncclParamGetI64(h, &timeout));
  CHECK(timeout > 0);
  CHECK(ncclParamBind(&h, "NCCL_NO_SUCH_KEY") == ncclInvalidArgument);
  uint64_t mem = 1;
  NCCL_CHECK(ncclCommMemStats(comm, ncclStatGpuMemTotal, &mem));
#endif
#if NCCL_VERSION_CODE >= 23100
  ncclCollConfig_t cc = NCCL_COLLCONFIG_INITIALIZER;
  cc.userProfilerTag = 42;
  for (int i = 0; i < 16; i++) out[i] = -1.0f;
  NCCL_CHECK(ncclAllReduceConfig(in, out, 16, ncclFloat, ncclMax, comm, NULL, &cc));
  for (int i = 0; i < 16; i++) CHECK(out[i] == (float)i);
  cc.magic = 0;
  CHECK(ncclAllReduceConfig(in, out, 16, ncclFloat, ncclMax, comm, NULL, &cc) == ncclInvalidArgument);
#endif
  NCCL_CHECK(ncclCommDestroy(comm));
}

int main(void) {
  check_layout();
  check_calls();
  printf("NCCL %d.%d.%d header (%s): %d calls referenced; %s: %d failure(s)\n", NCCL_MAJOR, NCCL_MINOR, NCCL_PATCH,
#ifdef __cplusplus
         "C++",
#else
         "C",
#endif
         (int)(sizeof(calls) / sizeof(calls[0])), failures ? "FAIL" : "OK", failures);
  return failures ? 1 : 0;
}
