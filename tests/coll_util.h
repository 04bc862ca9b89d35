/* Shared helpers of the collective tests (test_coll*.c): element encoding independent of the library's
 * own conversions, input patterns whose reductions are exact in every type, and one routine that runs
 * a collective on this rank and checks the result against a closed-form expectation. */
#ifndef CHORUS_TEST_COLL_UTIL_H
#define CHORUS_TEST_COLL_UTIL_H

#include <stddef.h>
#include <stdint.h>

#include "chorus.h"
#include "nccl.h"

/* Collectives, in the order the matrices walk them. */
enum cu_coll {
  CU_ALLREDUCE, CU_BROADCAST, CU_BCAST, CU_REDUCE, CU_ALLGATHER, CU_REDUCESCATTER,
  CU_ALLTOALL, CU_GATHER, CU_SCATTER, CU_SENDRECV, CU_NCOLLS
};
/* Reductions: the five built-in ops and PreMulSum with each scalar residence. */
enum cu_op { CU_SUM, CU_PROD, CU_MAX, CU_MIN, CU_AVG, CU_PREMUL_HOST, CU_PREMUL_DEV, CU_NOPS };

const char* cu_coll_name(int coll);
const char* cu_op_name(int op);
const char* cu_type_name(int type);
int cu_coll_reduces(int coll);     /* takes an op */
int cu_coll_has_root(int coll);
int cu_coll_has_inplace(int coll); /* NCCL defines an in-place form */

/* ---- elements ---- */
size_t cu_type_size(int type);
int cu_type_is_float(int type);
int cu_type_is_signed(int type);
/* Every integer of magnitude <= this is exact in the type (capped at 2^24 for wide types). */
int64_t cu_exact_limit(int type);
/* Store integer value v (must be exact in the type) as element i of buf; read element i as a double.
 * The 16- and 8-bit float codecs here are the tests' own, written from the format definitions. */
void cu_set(int type, void* buf, size_t i, double v);
/* CPU seconds (user + system) this process has used so far, or -1. */
double cu_proc_cpu_s(void);
double cu_get(int type, const void* buf, size_t i);

/* ---- inputs and expectations ---- */
/* Value rank `rank` contributes at element i for a reduction, chosen so every partial result of
 * the reduction is exact in the type for up to `nranks` ranks. */
double cu_red_input(int type, int op, int nranks, int rank, size_t i);
/* The exact result of reducing element i over all ranks. */
double cu_red_expect(int type, int op, int nranks, size_t i);
/* PreMulSum scalar for the type (2 for unsigned types, -2 otherwise). */
double cu_premul_scalar(int type);
/* Byte pattern of data-moving collectives: element i of rank `rank`'s block for peer `block`. */
void cu_fill_pattern(void* buf, int type, size_t count, int rank, int block, uint32_t seed);
/* Index of the first element differing from that pattern, or -1. */
long cu_check_pattern(const void* buf, int type, size_t count, int rank, int block, uint32_t seed);

/* ---- running one case ---- */
struct cu_case {
  int coll;      /* enum cu_coll */
  int type;      /* ncclDataType_t */
  int op;        /* enum cu_op (reductions only) */
  size_t count;  /* NCCL's count argument of that collective */
  int inplace;
  int root;      /* root, or for CU_SENDRECV the ring shift (send to rank+root) */
  uint32_t seed; /* varies the data between cases */
};

/* Runs the case on this rank (all ranks of comm call it with the same case) and checks the results,
 * including that nothing past the buffers and no input was written. Returns the number of failed
 * checks; prints at most a few lines per case. stream may be NULL or a chorusStreamCreate stream
 * (then the case synchronizes it). The call itself failing ends the test (NCCL_OK). */
int cu_run_case(ncclComm_t comm, const struct cu_case* c, cudaStream_t stream);
/* A matrix run by every rank: collectives x types x ops x counts x {out-of-place, in-place}, on one
 * communicator. Counts are 0, 1, nranks-1 and 4099 (unless only_big), then the big ones. Roots and
 * send/recv shifts rotate with the case number. Pass as the arg of rt_run_threads/procs/both. */
struct cu_sweep {
  unsigned colls;    /* bit mask of enum cu_coll; 0 = all */
  const int* types;  /* NULL = all twelve */
  int ntypes;
  const int* ops;    /* NULL = all of enum cu_op */
  int nops;
  size_t big[4];     /* extra counts, 0-terminated */
  int only_big;
  int stream;        /* issue on a chorusStreamCreate stream */
};
void cu_sweep_body(int rank, int nranks, ncclUniqueId id, void* arg);

/* The three phases of cu_run_case, for tests that put several cases in one group or on one stream:
 * prepare (buffers, inputs, op), issue (the NCCL call(s); returns the call's result), check (after
 * the group/stream has completed; frees everything). */
struct cu_gbuf {
  char* base; /* guard | data | guard */
  size_t bytes;
};
struct cu_run {
  struct cu_case c;
  ncclComm_t comm;
  int rank, n;
  char cs[192];
  struct cu_gbuf gs, gr;
  char *send, *recv, *orig;
  size_t scount;
  ncclRedOp_t op;
  int custom_op;
  unsigned char scalar[8];
};
void cu_prepare(struct cu_run* run, ncclComm_t comm, const struct cu_case* c);
ncclResult_t cu_issue(struct cu_run* run, cudaStream_t stream);
int cu_check(struct cu_run* run);

/* "AllReduce half sum count=4099 in-place root=0" for messages. */
void cu_case_str(const struct cu_case* c, char* buf, size_t n);

/* Failure lines are limited per rank (a broken collective would otherwise print thousands); call
 * cu_finish at the end of a rank body to report how many more failures were only counted. */
void cu_failf(const char* fmt, ...) __attribute__((format(printf, 1, 2)));
void cu_finish(void);

/* Nonzero: test buffers come from ncclMemAlloc (each a sub-range of its allocation, after a guard). */
extern int cu_memalloc;

/* ---- environment ---- */
/* Forces NCCL_PROTO (NULL: unset) for communicators created afterwards in this test process. */
void cu_force_proto(const char* proto);
/* NCCL_PROTO as currently forced ("auto" when unset), for messages. */
const char* cu_proto(void);
ncclComm_t cu_comm_init(int rank, int nranks, ncclUniqueId id);

/* chorusCommGetMemory of comm (fails the test if the call does). */
chorusMemory_t cu_memory(ncclComm_t comm);

#endif
