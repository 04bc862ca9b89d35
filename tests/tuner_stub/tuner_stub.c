/* A tuner plugin for tests/test_tuning.c's chunk size tests, built against NCCL's ABI as Chorus declares
 * it (tune/plugin_abi.h): exports ncclTunerPlugin_v6 with getChunkSize. Environment, read at each call:
 *
 *   CHORUS_TEST_TUNER_ALGO   ring or tree: that algorithm's Simple entry costs 0 (wins where available)
 *   CHORUS_TEST_TUNER_CHUNK  what getChunkSize answers: a byte count, or "fail" (it returns
 *                            ncclInternalError); unset: the size it is given, unchanged
 *   CHORUS_TEST_TUNER_OUT    a file getChunkSize appends "func bytes algo proto nChannels chunk_in" to */
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "tune/plugin_abi.h"

#define EXPORT __attribute__((visibility("default")))

static ncclResult_t stub_init(void** ctx, uint64_t comm_id, size_t nranks, size_t nnodes, ncclDebugLogger_t log,
                              ncclNvlDomainInfo_v6_t* dom, ncclTunerConstants_v6_t* consts) {
  (void)comm_id, (void)nranks, (void)nnodes, (void)log, (void)dom, (void)consts;
  *ctx = NULL;
  return ncclSuccess;
}

static ncclResult_t stub_get_coll_info(void* ctx, ncclFunc_t coll, size_t nbytes, int pipe_ops, float** cost_table,
                                       int num_algo, int num_proto, int reg_buff, int* nchannels) {
  (void)ctx, (void)coll, (void)nbytes, (void)pipe_ops, (void)reg_buff, (void)nchannels;
  const char* a = getenv("CHORUS_TEST_TUNER_ALGO");
  int algo = !a ? -1 : !strcmp(a, "ring") ? NCCL_ALGO_RING : !strcmp(a, "tree") ? NCCL_ALGO_TREE : -1;
  float* table = (float*)(void*)cost_table; /* float[num_algo][num_proto] */
  if (algo >= 0 && algo < num_algo && NCCL_PROTO_SIMPLE < num_proto) {
    float* e = &table[algo * num_proto + NCCL_PROTO_SIMPLE];
    if (*e != (float)NCCL_ALGO_PROTO_IGNORE) *e = 0.0f;
  }
  return ncclSuccess;
}

static ncclResult_t stub_get_chunk_size(void* ctx, ncclFunc_t coll, size_t nbytes, int algo, int proto, int nchannels,
                                        size_t* chunk) {
  (void)ctx;
  const char* out = getenv("CHORUS_TEST_TUNER_OUT");
  int fd = out && *out ? open(out, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0600) : -1;
  if (fd >= 0) {
    char line[160];
    int n = snprintf(line, sizeof(line), "%d %zu %d %d %d %zu\n", (int)coll, nbytes, algo, proto, nchannels, *chunk);
    if (write(fd, line, (size_t)n) < 0) n = -1;
    close(fd);
  }
  const char* c = getenv("CHORUS_TEST_TUNER_CHUNK");
  if (c && !strcmp(c, "fail")) return ncclInternalError;
  if (c && *c) *chunk = (size_t)strtoull(c, NULL, 0);
  return ncclSuccess;
}

static ncclResult_t stub_finalize(void* ctx) {
  (void)ctx;
  return ncclSuccess;
}

EXPORT const ncclTuner_v6_t ncclTunerPlugin_v6 = {"chunk-stub", stub_init, stub_get_coll_info, stub_finalize,
                                                  stub_get_chunk_size};
