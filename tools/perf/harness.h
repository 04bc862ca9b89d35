/* Internals shared by common.c (the measuring loop, one call per thread) and launch.c (processes,
 * communicators, threads). Not used by the collective files. */
#ifndef CHORUS_PERF_HARNESS_H
#define CHORUS_PERF_HARNESS_H

#include <pthread.h>
#include <stdint.h>

#include "common.h"

typedef struct perf_ctx {
  perf_opts o;
  const perf_coll* coll;
  const char* prog;
  int nprocs, proc, local_proc; /* processes of the job, ours, ours among those on this host */
  int nranks;                   /* nprocs * nthreads * ngpus */
  int is_main;                  /* this process holds rank 0 and prints */
  ncclUniqueId id;
  ncclComm_t* comms;            /* nthreads * ngpus, thread-major */
  size_t buf_bytes;             /* bytes of each send/recv buffer */
  double min_bw;                /* NCCL_TESTS_MIN_BW, or -1 */
  int64_t mem_base, mem_init, mem_user;
  double mem_cap;               /* largest maxBytes this host's memory allows, or -1 */
  pthread_barrier_t threads_met;
  /* per thread: operations finished so far (-T). Only the thread writes its own (relaxed atomic, a
   * counter and no clock read: 1 rank, 8 B went from 0.15-0.18 to 0.12 us, PERFORMANCE.md); the
   * watchdog reads them. Each on its own cache line, so threads do not slow each other down. */
  struct perf_progress { uint64_t n; char pad[56]; }* progress;
  int* busy;                    /* per thread: still measuring (atomic) */
  int result;                   /* exit code, set by thread 0 */
} perf_ctx;

typedef struct perf_thread {
  perf_ctx* ctx;
  int thread, nlocal, rank0; /* rank0: global rank of the first of our nlocal ranks */
  ncclComm_t* comms;
  cudaStream_t* streams;     /* NULL entries: synchronous calls */
  char** send;               /* per local rank, unalign offset applied */
  char** recv;
  void** allocs;             /* 2 per local rank */
  char** hsend;              /* --device: host copies of send/recv, where data is made and checked */
  char** hrecv;
  void** handles;            /* registrations (-R), 2 per local rank */
  double* scratch;           /* (nlocal + 2) * scratch_len doubles: combining results, -I times */
  double* inbox;             /* nlocal * scratch_len doubles: what peers send while combining */
  int scratch_len;
  int errors, bw_count;
  double bw_sum;
  pthread_t tid;
} perf_thread;

/* cuda.c (--device): the driver, opened at run time */
void perf_cuda_open(perf_ctx* ctx);
void perf_cuda_bind(perf_ctx* ctx, int local_rank); /* make its device's primary context current */
/* The device a thread of local index local_rank binds (all of its -g ranks share it). */
int perf_cuda_ordinal(int local_rank);
void* perf_cuda_alloc(perf_ctx* ctx, size_t bytes);
void perf_cuda_free(perf_ctx* ctx, void* p);
void perf_cuda_copy(perf_ctx* ctx, void* dst, const void* src, size_t bytes, int to_device);
cudaStream_t perf_cuda_stream(perf_ctx* ctx);
void perf_cuda_stream_destroy(perf_ctx* ctx, cudaStream_t s);
void perf_cuda_sync(perf_ctx* ctx, cudaStream_t s);

/* common.c */
void perf_thread_main(perf_thread* th);
/* Ranks [rank0, rank0 + nlocal) of a job of nranks, driven by one thread, each with its comm: what
 * bookkeeping between ranks (common.c) runs on. */
typedef struct perf_team {
  perf_ctx* ctx;
  ncclComm_t* comms;
  int nlocal, rank0, nranks;
} perf_team;
/* Rank 0's `bytes` at base to every rank's buffer (local rank i's at base + i * stride), by
 * ncclSend/ncclRecv: whatever NCCL_ALGO allows. */
void perf_team_bcast(const perf_team* t, char* base, size_t stride, size_t bytes);
/* launch.c: allocate (and register) the thread's buffers once maxBytes is final. */
void perf_thread_buffers(perf_thread* th);
uint64_t perf_now_ns(void);
void perf_fail_nccl(perf_ctx* ctx, ncclResult_t r, const char* what, const char* file, int line)
    __attribute__((noreturn));
void perf_fail_msg(perf_ctx* ctx, int code, const char* fmt, ...) __attribute__((noreturn, format(printf, 3, 4)));

#define PERF_NCCL_CHECK(ctx, call)                                                    \
  do {                                                                                \
    ncclResult_t r_ = (call);                                                         \
    if (r_ != ncclSuccess && r_ != ncclInProgress)                                    \
      perf_fail_nccl(ctx, r_, #call, __FILE__, __LINE__);                             \
  } while (0)

#endif
