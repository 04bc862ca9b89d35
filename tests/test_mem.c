/* Memory and registration API, ncclGroupSimulateEnd, and the two-rank AllReduce algorithms. */
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "comm/comm.h"
#include "comm/work.h"
#include "core/memreg.h"
#include "misc/param.h"
#include "runner.h"

TEST(mem, alloc_free_and_bad_pointers) {
  void* p = NULL;
  NCCL_OK(ncclMemAlloc(&p, 1 << 20));
  ASSERT(p != NULL);
  EXPECT_EQ((uintptr_t)p % 4096, 0);
  memset(p, 1, 1 << 20);
  NCCL_OK(ncclMemFree(p));
  EXPECT_EQ(ncclMemFree(p), ncclInvalidArgument); /* double free is reported, not a crash */
  int on_stack;
  EXPECT_EQ(ncclMemFree(&on_stack), ncclInvalidArgument);
  EXPECT_EQ(ncclMemFree(NULL), ncclSuccess);
  EXPECT_EQ(ncclMemAlloc(NULL, 16), ncclInvalidArgument);
  NCCL_OK(ncclMemAlloc(&p, 0));
  EXPECT(p == NULL);
}

static void reg_body(int rank, int nranks, ncclUniqueId id, void* arg) {
  (void)arg;
  ncclComm_t comm;
  NCCL_OK(ncclCommInitRank(&comm, nranks, id, rank));
  float buf[64];
  void* h = NULL;
  NCCL_OK(ncclCommRegister(comm, buf, sizeof(buf), &h));
  ASSERT(h != NULL);
  for (int i = 0; i < 64; i++) buf[i] = (float)(rank + 1);
  NCCL_OK(ncclAllReduce(buf, buf, 64, ncclFloat, ncclSum, comm, NULL));
  EXPECT(buf[63] == (float)(nranks * (nranks + 1) / 2));
  NCCL_OK(ncclCommDeregister(comm, h));
  EXPECT_EQ(ncclCommDeregister(comm, h), ncclInvalidArgument);
  EXPECT_EQ(ncclCommDeregister(comm, buf), ncclInvalidArgument);
  EXPECT_EQ(ncclCommRegister(comm, buf, sizeof(buf), NULL), ncclInvalidArgument);
  NCCL_OK(ncclCommDestroy(comm));
}

TEST(mem, register_deregister) { rt_run_both(2, reg_body, NULL); }

static void sim_body(int rank, int nranks, ncclUniqueId id, void* arg) {
  (void)arg;
  ncclComm_t comm;
  NCCL_OK(ncclCommInitRank(&comm, nranks, id, rank));
  float in[1024], out[1024];
  for (int i = 0; i < 1024; i++) in[i] = 1, out[i] = -1;
  ncclSimInfo_t sim = NCCL_SIM_INFO_INITIALIZER;
  NCCL_OK(ncclGroupStart());
  NCCL_OK(ncclAllReduce(in, out, 1024, ncclFloat, ncclSum, comm, NULL));
  NCCL_OK(ncclGroupSimulateEnd(&sim));
  EXPECT(sim.estimatedTime > 0);
  EXPECT(out[0] == -1 && out[1023] == -1); /* simulated, not run */
  ncclSimInfo_t bad = {0};
  NCCL_OK(ncclGroupStart());
  EXPECT_EQ(ncclGroupSimulateEnd(&bad), ncclInvalidArgument);
  NCCL_OK(ncclGroupEnd()); /* the group is still open after the rejected call */
  /* the communicator still works and the next call really runs */
  NCCL_OK(ncclAllReduce(in, out, 1024, ncclFloat, ncclSum, comm, NULL));
  EXPECT(out[0] == (float)nranks && out[1023] == (float)nranks);
  NCCL_OK(ncclCommDestroy(comm));
}

TEST(mem, group_simulate_end_does_not_run) { rt_run_threads(2, sim_body, NULL); }

/* Both two-rank algorithms, forced, give the closed-form result for every op, in and out of place,
 * with counts that leave partial chunks. */
static void algo_body(int rank, int nranks, ncclUniqueId id, void* arg) {
  ncclComm_t comm;
  NCCL_OK(ncclCommInitRank(&comm, nranks, id, rank));
  const size_t counts[] = {0, 1, 7, 1000, 300001};
  for (size_t c = 0; c < sizeof(counts) / sizeof(counts[0]); c++) {
    size_t n = counts[c];
    double* a = malloc(sizeof(double) * (n + 1));
    double* b = malloc(sizeof(double) * (n + 1));
    for (int op = ncclSum; op <= ncclAvg; op++) {
      for (int inplace = 0; inplace < 2; inplace++) {
        for (size_t i = 0; i < n; i++) a[i] = (double)(rank + 1) * (double)(i % 5 + 1);
        double* out = inplace ? a : b;
        NCCL_OK(ncclAllReduce(a, out, n, ncclDouble, (ncclRedOp_t)op, comm, NULL));
        for (size_t i = 0; i < n; i++) {
          double v = (double)(i % 5 + 1), want;
          switch (op) {
            case ncclSum: want = 3 * v; break;
            case ncclProd: want = 2 * v * v; break;
            case ncclMax: want = 2 * v; break;
            case ncclMin: want = v; break;
            default: want = 1.5 * v; break;
          }
          if (out[i] != want) {
            rt_fail(__FILE__, __LINE__, "%s op %d count %zu inplace %d: [%zu] = %g, want %g", (const char*)arg, op,
                    n, inplace, i, out[i], want);
            break;
          }
        }
      }
    }
    free(a);
    free(b);
  }
  NCCL_OK(ncclCommDestroy(comm));
}

static void with_algo(const char* algo) {
  setenv("NCCL_ALGO", algo, 1); /* before any rank starts: the test child is still single-threaded */
  param_reset();
  rt_run_both(2, algo_body, (void*)algo);
}

TEST(mem, two_rank_ring) { with_algo("Ring"); }
TEST(mem, two_rank_exchange) { with_algo("Exchange"); }
TEST(mem, two_rank_direct) { with_algo("Direct"); } /* threads: Direct; processes: falls back */

/* PreMulSum scalars are per rank: result = sum over ranks of scalar_r * x_r. Every algorithm must
 * apply each rank's own scalar to that rank's data. */
static void premul_body(int rank, int nranks, ncclUniqueId id, void* arg) {
  (void)arg;
  ncclComm_t comm;
  NCCL_OK(ncclCommInitRank(&comm, nranks, id, rank));
  double scalar = rank + 1, want = 0;
  for (int r = 0; r < nranks; r++) want += (r + 1) * 2.0 * (r + 1); /* x_r = 2(r+1) */
  ncclRedOp_t op;
  NCCL_OK(ncclRedOpCreatePreMulSum(&op, &scalar, ncclDouble, ncclScalarHostImmediate, comm));
  const size_t counts[] = {1, 1000, 70001};
  for (int c = 0; c < 3; c++) {
    size_t n = counts[c];
    double* a = malloc(sizeof(double) * n);
    for (size_t i = 0; i < n; i++) a[i] = 2.0 * (rank + 1);
    NCCL_OK(ncclAllReduce(a, a, n, ncclDouble, op, comm, NULL));
    for (size_t i = 0; i < n; i++)
      if (a[i] != want) {
        rt_fail(__FILE__, __LINE__, "count %zu: [%zu] = %g, want %g", n, i, a[i], want);
        break;
      }
    free(a);
  }
  NCCL_OK(ncclRedOpDestroy(op, comm));
  NCCL_OK(ncclCommDestroy(comm));
}

TEST(mem, premulsum_scalar_per_rank) {
  rt_run_both(2, premul_body, NULL);
  rt_run_both(3, premul_body, NULL);
}

/* An absurd FIFO size is refused at init with a message, before any memory is reserved. */
static void huge_fifo_body(int rank, int nranks, ncclUniqueId id, void* arg) {
  (void)arg;
  ncclComm_t comm = NULL;
  EXPECT_EQ(ncclCommInitRank(&comm, nranks, id, rank), ncclInvalidArgument);
  EXPECT(strstr(ncclGetLastError(NULL), "NCCL_BUFFSIZE") != NULL);
}

TEST(mem, absurd_buffsize_is_refused) {
  setenv("NCCL_BUFFSIZE", "4398046511104", 1); /* 4 TiB per FIFO */
  param_reset();
  rt_run_threads(2, huge_fifo_body, NULL);
}

/* Init and a collective on the new communicator in one group is refused (as in NCCL) instead of
 * waiting for an init that only starts at ncclGroupEnd; the communicator is still created. */
TEST_T(mem, init_and_collective_in_one_group, 20) {
  ncclUniqueId id;
  NCCL_OK(ncclGetUniqueId(&id));
  ncclComm_t comm = NULL;
  float x = 2;
  NCCL_OK(ncclGroupStart());
  NCCL_OK(ncclCommInitRank(&comm, 1, id, 0));
  EXPECT_EQ(ncclAllReduce(&x, &x, 1, ncclFloat, ncclSum, comm, NULL), ncclInvalidUsage);
  EXPECT_EQ(ncclGroupEnd(), ncclInvalidUsage);
  ASSERT(comm != NULL);
  NCCL_OK(ncclAllReduce(&x, &x, 1, ncclFloat, ncclSum, comm, NULL));
  EXPECT(x == 2);
  NCCL_OK(ncclCommDestroy(comm));
}

/* mem_describe (every Direct call between processes) answers from a per-thread cache: it must follow
 * allocations and frees, describe only ranges inside one allocation, and never hand out an address. */
TEST(mem, describe_follows_alloc_and_free) {
  char* p = NULL;
  NCCL_OK(ncclMemAlloc((void**)&p, 10000));
  struct direct_buf d, d2;
  for (int rep = 0; rep < 2; rep++) { /* the second answer comes from the cache */
    ASSERT(mem_describe(p + 100, 900, &d));
    EXPECT(d.token != 0);
    EXPECT_EQ(d.off, 100);
    EXPECT_EQ(d.alloc_bytes, 10000);
  }
  EXPECT(!mem_describe(p + 9000, 1001, &d2)); /* runs past the end */
  EXPECT_EQ(d2.token, 0);
  int on_stack[4];
  EXPECT(!mem_describe(on_stack, sizeof(on_stack), &d2));
  NCCL_OK(ncclMemFree(p));
  EXPECT(!mem_describe(p + 100, 900, &d2)); /* freed: the cached answer is gone */
  char* q = NULL;
  NCCL_OK(ncclMemAlloc((void**)&q, 10000));
  if (q == p) { /* the same range again: a new allocation, a new token */
    ASSERT(mem_describe(q + 100, 900, &d2));
    EXPECT(d2.token != d.token);
  }
  NCCL_OK(ncclMemFree(q));
}

/* Several threads describing while another allocates and frees (TSan: no race; every answer right). */
struct desc_arg { char* buf; _Atomic int* stop; int bad; };
static void* describe_loop(void* arg) {
  struct desc_arg* a = arg;
  struct direct_buf d;
  while (!atomic_load(a->stop))
    if (!mem_describe(a->buf + 64, 4096, &d) || d.off != 64 || d.alloc_bytes != 1 << 16) a->bad++;
  return NULL;
}
TEST(mem, describe_from_threads) {
  char* buf = NULL;
  NCCL_OK(ncclMemAlloc((void**)&buf, 1 << 16));
  _Atomic int stop = 0;
  pthread_t t[4];
  struct desc_arg args[4];
  for (int i = 0; i < 4; i++) {
    args[i] = (struct desc_arg){buf, &stop, 0};
    ASSERT(pthread_create(&t[i], NULL, describe_loop, &args[i]) == 0);
  }
  for (int i = 0; i < 200; i++) {
    void* p = NULL;
    NCCL_OK(ncclMemAlloc(&p, 4096));
    NCCL_OK(ncclMemFree(p));
  }
  atomic_store(&stop, 1);
  for (int i = 0; i < 4; i++) {
    pthread_join(t[i], NULL);
    EXPECT_EQ(args[i].bad, 0);
  }
  NCCL_OK(ncclMemFree(buf));
}
