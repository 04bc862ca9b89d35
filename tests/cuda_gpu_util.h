/* Shared by tests/test_cuda_gpu.c and test_cuda_gpu_fault.c: the stand-in driver's entry points (its
 * test hooks included) and the steps every rank of those tests takes. */
#ifndef CHORUS_TESTS_CUDA_GPU_UTIL_H
#define CHORUS_TESTS_CUDA_GPU_UTIL_H

#include <stdint.h>

#include "chorus.h"
#include "nccl.h"

#define N 1000 /* not a multiple of the ranks: AllReduce's shares are uneven */

struct cg_driver {
  int (*init)(unsigned);
  int (*retain)(void**, int);
  int (*set)(void*);
  int (*alloc)(uintptr_t*, size_t);
  int (*free)(uintptr_t);
  int (*sync)(void*);
  int (*kernels)(void);
  int (*hold)(void*, int*);
  int (*copy)(void*, void*, const void*, size_t);
  void (*mark)(const void*, size_t, int);
  int (*registered)(void);
  int (*stage_runs)(void);
  int (*destroy)(void*);
  void (*begin_capture)(void*);
  void* (*end_capture)(void*);
  int (*graph_launch)(void*, void*);
  int (*graph_ops)(void*);
  void (*graph_destroy)(void*);
  int (*copies)(void);      /* asynchronous and synchronous copies so far (this process) */
  int (*host_allocs)(void); /* pinned blocks allocated and not freed */
};
extern struct cg_driver fk; /* filled by load() */

/* A build without nvcc has no kernels: prints SKIP and returns 1. */
int no_kernels(void);
/* Loads the stand-in driver (CHORUS_FAKE_CUDA) and points CHORUS_CUDA_LIBRARY at it. */
void load(void);
/* load(), with device buffers staged through host memory, as between ranks on different hosts
 * (CHORUS_CUDA_DIRECT=0, CHORUS_CUDA_RELAY=0), in pieces of `piece` bytes (CHORUS_CUDA_STAGE_PIECE). */
void load_staged(const char* piece);
/* As a CUDA application's rank: the device's primary context current on this thread. */
void set_device(void);
/* A rank of a CUDA application: its device current, its communicator made, and (base != 0) a stream
 * of its own, base + 0x10 * rank. */
ncclComm_t open_rank(int rank, int nranks, ncclUniqueId id, uintptr_t base, cudaStream_t* s);
float* dev_alloc(size_t n);
/* n floats of device memory, or (host) of zeroed host memory; and giving them back. */
float* any_alloc(size_t n, int host);
void any_free(float* p, int host);
/* The communicator's asynchronous error, once one is set (up to 5 s). */
ncclResult_t async_error(ncclComm_t comm);
/* Every rank finds the failure itself (want, saying `why`), unless a peer's report reaches it first
 * (through the shared page: ncclRemoteError). */
void expect_failed(ncclComm_t comm, ncclResult_t want, const char* why);
/* How the kernels run: their tables read from host memory or from the stage kernel's copy in device
 * memory (CHORUS_CUDA_STAGE_BLOCKS: "0" always, a number beyond any grid never), and each rank's
 * kernel doing its part or rank 0's doing all (CHORUS_CUDA_ONE_KERNEL); NULL: as by default. */
void kernels_as(const char* stage_blocks, const char* one_kernel);

/* Steps shared by the direct path's tests and the relay's, once a rank's communicator is open on
 * stream s. three_steps: AlltoAll, Gather and Scatter of `count` elements a block, out of place and in
 * place, every root, expected values in closed form. dead_peer_steps: rank 1's stream never reaches an
 * AllReduce and its process exits; the others fail, naming it gone. held_peer_steps (CHORUS_TIMEOUT=1):
 * rank 1's stream is held for 1.5 s; rank 0 fails by the timeout. Both end with ncclCommAbort. */
void three_steps(ncclComm_t comm, cudaStream_t s, int rank, int nranks, size_t count);
void dead_peer_steps(ncclComm_t comm, cudaStream_t s, int rank, size_t count);
void held_peer_steps(ncclComm_t comm, cudaStream_t s, int rank, size_t count);

#endif
