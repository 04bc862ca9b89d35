/* What one launch of Chorus's device kernel does (src/cuda/kernels.cu), shared by the kernel, the host
 * side that fills it (gpu/call.c) and the tests' stand-in driver, which runs it on the CPU.
 *
 * Ranks that share one GPU read and write each other's buffers directly. A call's buffers are named
 * by (rank, send or recv): the pointer table, in mapped pinned host memory, holds their device
 * addresses in this process. It is filled by the host once every rank has said what its buffers are;
 * its `seq` is written last, and a kernel whose table does not carry its own seq (the exchange failed,
 * or the communicator was aborted) touches no memory. A kernel of many blocks reads a copy of the table
 * and of the failure words that the stage kernel (below) made in device memory just before it. A job
 * reads `count` elements at `src_off` bytes into the src_buf of every rank in src_mask, combines them (reduce: the call's operation, with its
 * pre-multiplication and post-division; otherwise exactly one source, copied) and writes the result at
 * dst_off bytes into the dst_buf of every rank in dst_mask. Per element, all reads come before all
 * writes, so a destination may be one of the sources (in place). */
#ifndef CHORUS_CUDA_DEVJOB_H
#define CHORUS_CUDA_DEVJOB_H

#include <stdint.h>

#define DEV_MAX_RANKS 32 /* ranks of a communicator that run calls on one GPU (masks are 32 bits) */
#define DEV_MAX_JOBS 32  /* Gather: one per source rank */

enum { DEV_SEND = 0, DEV_RECV = 1 };

struct dev_table {
  volatile uint32_t seq;
  uint32_t pad;
  uint64_t buf[2][DEV_MAX_RANKS]; /* device addresses: [DEV_SEND or DEV_RECV][rank] */
  /* PreMulSum: each rank's own scalar, which multiplies that rank's input (a double for floating
   * types, an int64_t for integers, as bits) */
  uint64_t scalar[DEV_MAX_RANKS];
};

/* A job's kind. DEV_PAIR (AlltoAll): src_mask = dst_mask = ranks a < b, src_off = the block size C
 * in bytes, dst_off = 0: the job reads send[a] + b*C and send[b] + a*C, then writes them to
 * recv[b] + a*C and recv[a] + b*C. Each block is touched by this one job, and each element read
 * before either is written, so a rank whose send and recv buffers are one (in place) is safe. */
enum { DEV_COPY = 0, DEV_REDUCE = 1, DEV_PAIR = 2 };

struct dev_job {
  uint32_t src_mask, dst_mask;
  uint8_t src_buf, dst_buf, reduce /* the kind */, pad[5];
  uint64_t src_off, dst_off; /* bytes */
  uint64_t count;            /* elements */
};

/* The kernel's one parameter. op_kind: enum red_kind (reduce/reduce.h); type: ncclDataType_t. */
struct dev_args {
  uint64_t table; /* device address of this call's struct dev_table */
  uint64_t fail[2]; /* device addresses of 32-bit words (or 0): nonzero once the communicator failed */
  uint32_t seq;
  int32_t type, op_kind, njobs;
  uint64_t divisor; /* RED_SUMPOSTDIV */
  int32_t unroll;   /* reductions: > 1, 4 (or 2) 16-byte vectors of each source in flight per thread (CHORUS_CUDA_UNROLL) */
  int32_t pad;
  struct dev_job job[DEV_MAX_JOBS];
};

/* The kernel of each type is named chorus_dev_<type number>: "chorus_dev_7" for ncclFloat32. */
#define DEV_KERNEL_PREFIX "chorus_dev_"
#define DEV_NTYPES 12

/* The stage kernel (one block), queued just before a kernel of many blocks: it copies the call's
 * table and the failure words from host memory into device memory, where that kernel then reads
 * them. A read of mapped host memory costs each block a round trip over PCIe, and on an H200 a
 * kernel of 512 blocks that each read the table took over a millisecond whatever its size. */
#define DEV_STAGE_KERNEL "chorus_stage"
#define DEV_STAGE DEV_NTYPES /* its index among the loaded kernels, after the types' */
struct dev_staged {
  struct dev_table table;
  uint32_t failed[2];
};
struct dev_stage_args {
  uint64_t table, fail[2]; /* as in dev_args: host memory mapped for the device (a fail word may be 0) */
  uint64_t dst;            /* device address of a struct dev_staged */
};

#ifndef __CUDACC__ /* host side only (C: kernels.cu, C++, does not need it) */
/* Append a job to a's list (the caller keeps a->njobs below DEV_MAX_JOBS): the direct path's, the
 * relay's and staging's kernels are all built from these. */
static inline struct dev_job* dev_job_add(struct dev_args* a, int reduce, uint32_t src_mask, int src_buf,
                                          uint64_t src_off, uint32_t dst_mask, int dst_buf, uint64_t dst_off,
                                          uint64_t count) {
  struct dev_job* j = &a->job[a->njobs++];
  *j = (struct dev_job){.reduce = (uint8_t)reduce, .src_mask = src_mask, .src_buf = (uint8_t)src_buf,
                        .src_off = src_off, .dst_mask = dst_mask, .dst_buf = (uint8_t)dst_buf,
                        .dst_off = dst_off, .count = count};
  return j;
}
#endif

#endif
