/* Shared harness of the *_perf benchmarks. They mirror NVIDIA nccl-tests (flags, output columns,
 * bus-bandwidth factors, data validation, exit codes) on host memory: every "GPU" of nccl-tests is
 * one Chorus rank with malloc'ed buffers (--device: cuMemAlloc'ed ones and a CUDA stream, as nccl-tests). Ranks = processes x threads (-t) x ranks per thread (-g).
 *
 * A benchmark is one small file that fills a perf_coll and calls perf_main(). */
#ifndef CHORUS_PERF_COMMON_H
#define CHORUS_PERF_COMMON_H

#include <stddef.h>
#include <stdint.h>

#include "chorus.h"
#include "nccl.h"

/* Exit codes of nccl-tests (testResult_t), so scripts written for it keep working. */
enum perf_result {
  PERF_OK = 0,
  PERF_INTERNAL = 1,
  PERF_NCCL = 3,
  PERF_TIMEOUT = 4,
  PERF_NOT_IMPLEMENTED = 5,
  PERF_INVALID_USAGE = 6,
  PERF_WRONG = 7,       /* wrong results, or NCCL_TESTS_MIN_BW missed */
  PERF_BAD_ARGS = 255   /* nccl-tests returns -1 from main for bad arguments */
};

#define PERF_OP_MULSUM ncclNumOps /* op index 5: ncclRedOpCreatePreMulSum */
#define PERF_NUM_OPS 6
#define PERF_COPY (-1)            /* data-generator kind for collectives that only move data */

typedef struct perf_opts {
  int nthreads, ngpus;
  size_t min_bytes, max_bytes, step_bytes, step_factor;
  int iters, warmup, agg, cycles, parallel_init, check;
  int op;   /* op index, -1 = all */
  int type; /* ncclDataType_t, -1 = all */
  int root; /* -1 = all */
  int blocking, stream_null, timeout_s, graph, cputime, timestamps, average;
  int reg, cta_policy, dev_impl, dev_ctas, mem_report, unalign, per_iter, per_iter_skip;
  const char* json_path;
  /* Our own, all opt-in. */
  int np;            /* -np N: fork N local processes */
  int streams;       /* --stream: chorusStreamCreate instead of the NULL (synchronous) stream */
  int device;        /* --device: CUDA device buffers and a CUDA stream per rank (nccl-tests' way) */
  const char* plot_path;
  int corrupt;       /* CHORUS_PERF_CORRUPT=1: damage one element before each check (tests) */
  /* Uneven exchanges (PERF_SPLITS: alltoallv_perf). */
  int splits;    /* the benchmark takes the three below */
  int split;     /* --split: PERF_SPLIT_ZIPF (default) or PERF_SPLIT_UNIFORM */
  unsigned seed; /* --seed: which distances get the large blocks (the same on every rank) */
  int grouped;   /* --grouped 1: the same exchange as grouped ncclSend/ncclRecv */
} perf_opts;
enum { PERF_SPLIT_ZIPF, PERF_SPLIT_UNIFORM };

/* Element counts of one size step (nccl-tests' getCollByteCount). In-place offsets are per rank:
 * in place, send = recv + rank*send_inplace and recv = recv + rank*recv_inplace. */
typedef struct perf_layout {
  size_t send_count, recv_count, param_count, send_inplace, recv_inplace;
} perf_layout;

/* One rank's view of one operation. */
typedef struct perf_buf {
  int rank, nranks, root, op, in_place;
  ncclDataType_t type;
  size_t count;     /* the count argument of the call */
  perf_layout lay;
  char* send;       /* what the call gets (already placed for in-place) */
  char* recv;
  char* recv_base;  /* start of this rank's receive buffer */
  uint64_t seed;
  const perf_opts* opts;
  void* recv_win;     /* -R 2: the window of this rank's receive allocation (ncclWindow_t), else NULL */
  size_t recv_off;    /* recv's offset in that allocation (alike on every rank: buffers are symmetric) */
} perf_buf;

#define PERF_USES_OP 0x1    /* loops over -o and prints the op (else "none") */
#define PERF_USES_ROOT 0x2  /* uses -r (else root prints -1) */
#define PERF_POW2_ONLY 0x4  /* needs a power-of-two rank count */
#define PERF_OP_BLANK 0x8   /* prints an empty op column (hypercube) */
#define PERF_SPLITS 0x10    /* takes --split, --seed and --grouped (alltoallv) */
#define PERF_NO_INPLACE 0x20 /* has no in-place form: those columns print N/A */

typedef struct perf_coll {
  const char* name; /* "all_reduce": the program is all_reduce_perf */
  int flags;
  void (*layout)(size_t count, int nranks, int elt, perf_layout* l);
  /* busbw factor; algbw bytes come from alg_bytes(count, elt, nranks) */
  double (*alg_bytes)(size_t count, int elt, int nranks);
  double (*bus_factor)(int nranks);
  void (*init)(const perf_buf* b);        /* fill inputs, clear outputs */
  int64_t (*check)(const perf_buf* b);    /* wrong elements; -1 = not checkable (prints N/A) */
  /* One rank's share of the operation; round < nrounds (hypercube has lg n rounds, one group each). */
  ncclResult_t (*run)(const perf_buf* b, ncclRedOp_t op, ncclComm_t comm, cudaStream_t s, int round);
  int (*nrounds)(int nranks); /* NULL = 1 */
} perf_coll;

int perf_main(int argc, char** argv, const perf_coll* coll);

/* ---- args.c ---- */
/* -1: go on; otherwise exit with the returned code (0 after -h, 255 after a usage error). */
int perf_parse_args(int argc, char** argv, perf_opts* o, const perf_coll* coll);
extern const char* const perf_op_names[PERF_NUM_OPS];

/* ---- data.c: inputs whose reductions are exact in every type, and their checks ---- */
/* Wire formats (docs/WIRE.md): the index of a CHORUS_WIRE_FORMAT value (0 off), -1 if it does not
 * parse; perf_wire_use makes the checks of float32/bfloat16 results accept its documented error. */
int perf_wire_parse(const char* s);
void perf_wire_use(const char* s);
/* A copied block (Broadcast, AllGather) as perf_check_fill, within one rounding of the wire format. */
int64_t perf_check_copied(const void* buf, size_t n, ncclDataType_t t, uint64_t seed, size_t idx0, int rank,
                          int nranks);
int perf_type_size(ncclDataType_t t);
const char* perf_type_name(ncclDataType_t t);
int perf_type_parse(const char* s);  /* -1 all, -2 unknown */
/* kind = op index for reduction inputs, PERF_COPY for moved data. */
void perf_fill(void* buf, size_t n, ncclDataType_t t, int kind, uint64_t seed, size_t idx0, int rank,
               int nranks);
/* Wrong elements of buf against perf_fill(...) with the same arguments. */
int64_t perf_check_fill(const void* buf, size_t n, ncclDataType_t t, int kind, uint64_t seed, size_t idx0,
                        int rank, int nranks);
/* Wrong elements of buf against the reduction (op) of every rank's perf_fill at idx0... */
int64_t perf_check_reduced(const void* buf, size_t n, ncclDataType_t t, int op, uint64_t seed, size_t idx0,
                           int nranks);
int64_t perf_check_zero(const void* buf, size_t n, ncclDataType_t t);
/* Scalar for ncclRedOpCreatePreMulSum: 1 on even ranks, 2 on odd ones. */
void perf_mulsum_scalar(void* out, ncclDataType_t t, int rank);
void perf_encode(void* out, ncclDataType_t t, double v);
double perf_decode(const void* in, ncclDataType_t t);

/* ---- helpers for the collective files ---- */
/* Copy within one rank's buffers in the order of stream s (device memory with --device). */
ncclResult_t perf_copy(void* dst, const void* src, size_t bytes, cudaStream_t s);
size_t perf_per_rank_count(size_t count, int nranks, int elt); /* (N/n) rounded down to 16 bytes */
static inline char* perf_at(char* p, size_t elems, ncclDataType_t t) {
  return p + elems * (size_t)perf_type_size(t);
}
void perf_zero(void* p, size_t elems, ncclDataType_t t);
/* Layouts shared by several collectives: n = count for all ranks ("flat"), or b = per-rank count
 * with the full buffer n*b on the gathering/scattering side. */
void perf_layout_flat(size_t count, int nranks, int elt, perf_layout* l);
void perf_layout_gather(size_t count, int nranks, int elt, perf_layout* l);  /* send b, recv n*b */
void perf_layout_scatter(size_t count, int nranks, int elt, perf_layout* l); /* send n*b, recv b */
/* Gathered data: each rank sends its block of the copy pattern; receivers hold every rank's block. */
void perf_init_gathered(const perf_buf* b);
int64_t perf_check_gathered(const perf_buf* b);
double perf_bytes_flat(size_t count, int elt, int nranks);  /* count*elt */
double perf_bytes_ranks(size_t count, int elt, int nranks); /* count*nranks*elt */
double perf_factor_one(int nranks);                         /* 1 */
double perf_factor_ring(int nranks);                        /* (n-1)/n */

#endif
