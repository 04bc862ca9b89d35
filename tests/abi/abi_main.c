/* A program written against NVIDIA's nccl.h (from the CUDA toolkit), linked with libchorus instead of
 * libnccl: it must run, and every enum value, struct size and layout it was compiled with must be the
 * one Chorus's header states (abi_ours.c). */
#include <nccl.h>

#include <stdio.h>
#include <string.h>

#include "abi_facts.h"

#ifndef __DRIVER_TYPES_H__
#error "abi_main.c must be compiled against CUDA's nccl.h (which includes cuda_runtime.h), not Chorus's"
#endif

static int failures;

#define CHECK(cond)                                                     \
  do {                                                                  \
    if (!(cond)) {                                                      \
      printf("FAIL %s:%d: %s\n", __FILE__, __LINE__, #cond);            \
      failures++;                                                       \
    }                                                                   \
  } while (0)
#define NCCL_CHECK(call)                                                                \
  do {                                                                                  \
    ncclResult_t r_ = (call);                                                           \
    if (r_ != ncclSuccess) {                                                            \
      printf("FAIL %s:%d: %s -> %d (%s)\n", __FILE__, __LINE__, #call, (int)r_,         \
             ncclGetErrorString(r_));                                                   \
      failures++;                                                                       \
      return;                                                                           \
    }                                                                                   \
  } while (0)

static int compare(const char* what, const char* const* names, const long long* theirs, const long long* ours,
                   int n) {
  int bad = 0;
  for (int i = 0; i < n; i++) {
    if (theirs[i] == ours[i]) continue;
    printf("%s mismatch: %s is %lld in CUDA's nccl.h, %lld in Chorus's\n", what, names[i], theirs[i], ours[i]);
    bad++;
  }
  return bad;
}

static void check_headers(void) {
  ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
  ncclSimInfo_t sim = NCCL_SIM_INFO_INITIALIZER;
  static const char* const enum_names[] = {ABI_ENUMS(ABI_NAME)};
  static const char* const layout_names[] = {ABI_LAYOUT(ABI_NAME)};
  const long long theirs_enums[] = {ABI_ENUMS(ABI_VALUE)};
  const long long theirs_layout[] = {ABI_LAYOUT(ABI_VALUE)};
  long long ours_enums[ABI_NENUMS], ours_layout[ABI_NLAYOUT];
  abi_ours_enums(ours_enums);
  abi_ours_layout(ours_layout);

  failures += compare("enum/macro", enum_names, theirs_enums, ours_enums, ABI_NENUMS);
  /* ncclTimeout is newer than 2.28 headers: ours must carry the value NCCL 2.30 assigned. */
  CHECK(abi_ours_timeout_value() == 8);

  int same_version = theirs_layout[0] == ours_layout[0];
  int bad = compare(same_version ? "layout" : "layout (other NCCL version, not an error)", layout_names,
                    theirs_layout, ours_layout, ABI_NLAYOUT);
  if (same_version) failures += bad;
  printf("CUDA's nccl.h is NCCL %d.%d.%d; compared %d enum/macro facts and %d layout facts\n", NCCL_MAJOR,
         NCCL_MINOR, NCCL_PATCH, (int)ABI_NENUMS, same_version ? (int)ABI_NLAYOUT : 0);
}

static void check_calls(void) {
  int version = 0;
  NCCL_CHECK(ncclGetVersion(&version));
  CHECK(version >= NCCL_VERSION(2, 28, 0));
  printf("ncclGetVersion: %d\n", version);

  const char* s = ncclGetErrorString(ncclInvalidArgument);
  CHECK(s != NULL && strlen(s) > 0);
  CHECK(ncclGetVersion(NULL) == ncclInvalidArgument);

  ncclUniqueId id;
  memset(&id, 0, sizeof(id));
  NCCL_CHECK(ncclGetUniqueId(&id));
  ncclComm_t comm = NULL;
  NCCL_CHECK(ncclCommInitRank(&comm, 1, id, 0));
  int count = 0, rank = -1;
  NCCL_CHECK(ncclCommCount(comm, &count));
  NCCL_CHECK(ncclCommUserRank(comm, &rank));
  CHECK(count == 1);
  CHECK(rank == 0);

  float in[64], out[64];
  for (int i = 0; i < 64; i++) in[i] = (float)i * 0.5f, out[i] = -1.0f;
  cudaStream_t stream = NULL; /* CUDA's own type: NULL = complete before returning */
  NCCL_CHECK(ncclAllReduce(in, out, 64, ncclFloat, ncclSum, comm, stream));
  NCCL_CHECK(ncclAllReduce(in, in, 64, ncclFloat, ncclMax, comm, stream)); /* in place */
  for (int i = 0; i < 64; i++) {
    if (out[i] != (float)i * 0.5f || in[i] != (float)i * 0.5f) {
      printf("FAIL: allreduce element %d: out %g in %g, expected %g\n", i, out[i], in[i], (float)i * 0.5f);
      failures++;
      break;
    }
  }
  ncclResult_t async = ncclInternalError;
  NCCL_CHECK(ncclCommGetAsyncError(comm, &async));
  CHECK(async == ncclSuccess);
  NCCL_CHECK(ncclCommDestroy(comm));
}

int main(void) {
  check_headers();
  check_calls();
  printf("%s: %d failure(s)\n", failures ? "FAIL" : "OK", failures);
  return failures ? 1 : 0;
}
