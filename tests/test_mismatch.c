/* Calls that differ across ranks (issue 11; ncclAllToAllv's counts: issue 48): every kind of mismatch fails the call on every rank with
 * ncclInvalidUsage and a message naming both calls, for every protocol, as threads and processes;
 * nothing hangs (CHORUS_TIMEOUT would turn a hang into ncclTimeout, which fails the test). */
#define _GNU_SOURCE
#include <stdlib.h>
#include <string.h>

#include "chorus.h"
#include "coll_util.h"
#include "misc/log.h"
#include "misc/param.h"
#include "runner.h"

enum kind {
  K_COUNT,
  K_TYPE,
  K_OP,
  K_COLL,
  K_ORDER,
  K_ROOT_REDUCE,
  K_ROOT_BCAST,
  K_SENDRECV,
  K_SENDRECV_TYPE,
  K_GATHER_ROOT_VS_SEND,
  K_SEL,
  K_A2AV,
  K_A2AV_ZERO
};

struct mm {
  int kind;
  size_t count;
  const char* want[2]; /* substrings of every involved rank's last error */
  int may_pass;        /* some rank only sends in the call */
};

static int bad_rank(int nranks) { return nranks - 1; }

/* The call of this rank for the case; returns its result. */
static ncclResult_t run_call(const struct mm* m, int rank, int nranks, ncclComm_t comm, float* s, float* d) {
  int odd = rank == bad_rank(nranks);
  size_t n = m->count;
  switch (m->kind) {
    case K_COUNT: return ncclAllReduce(s, d, odd ? n - 1 : n, ncclFloat32, ncclSum, comm, NULL);
    case K_TYPE: return ncclAllReduce(s, d, n, odd ? ncclInt32 : ncclFloat32, ncclSum, comm, NULL);
    case K_OP: return ncclAllReduce(s, d, n, ncclFloat32, odd ? ncclMax : ncclSum, comm, NULL);
    case K_COLL:
      return odd ? ncclBroadcast(s, d, n, ncclFloat32, 0, comm, NULL) : ncclAllReduce(s, d, n, ncclFloat32, ncclSum, comm, NULL);
    case K_ORDER: {
      ncclResult_t a = odd ? ncclAllGather(s, d, n, ncclFloat32, comm, NULL) : ncclAllReduce(s, d, n, ncclFloat32, ncclSum, comm, NULL);
      if (a != ncclSuccess) return a;
      return odd ? ncclAllReduce(s, d, n, ncclFloat32, ncclSum, comm, NULL) : ncclAllGather(s, d, n, ncclFloat32, comm, NULL);
    }
    case K_ROOT_REDUCE: return ncclReduce(s, d, n, ncclFloat32, ncclSum, odd ? 1 : 0, comm, NULL);
    case K_ROOT_BCAST: {
      /* Each of two ranks names itself: no data reaches a rank that would check it, so the call can
       * return on both; the stray data makes the next call fail on both. */
      ncclResult_t a = ncclBroadcast(s, d, n, ncclFloat32, rank, comm, NULL);
      if (a != ncclSuccess) return a;
      return ncclAllGather(s, d, n, ncclFloat32, comm, NULL); /* a ring, unlike Direct AllReduce */
    }
    case K_SENDRECV:
    case K_SENDRECV_TYPE: {
      int peer = rank == 0 ? 1 : 0;
      if (rank > 1) return ncclInvalidUsage; /* not involved */
      ncclDataType_t t = m->kind == K_SENDRECV_TYPE && rank == 1 ? ncclInt32 : ncclFloat32;
      size_t cnt = m->kind == K_SENDRECV && rank == 1 ? n - 1 : n;
      NCCL_OK(ncclGroupStart());
      ncclSend(s, cnt, t, peer, comm, NULL);
      ncclRecv(d, cnt, t, peer, comm, NULL);
      return ncclGroupEnd();
    }
    case K_SEL: { /* ncclCollConfig_t.algSelection differs: part of what ranks compare (core/plan.c) */
      ncclCollConfig_t c = NCCL_COLLCONFIG_INITIALIZER;
      c.algSelection = odd ? "TREE_SIMPLE" : "RING_SIMPLE";
      return ncclAllReduceConfig(s, d, n, ncclFloat32, ncclSum, comm, NULL, &c);
    }
    case K_A2AV:
    case K_A2AV_ZERO: { /* rank 0's block for the odd rank: the odd rank expects one element less, or
                         * rank 0 sends it none */
      size_t c[8], sc[8], at[8];
      ASSERT(nranks <= 8);
      for (int p = 0; p < nranks; p++) c[p] = sc[p] = n, at[p] = (size_t)p * n;
      if (m->kind == K_A2AV && odd) c[0] = n - 1;
      if (m->kind == K_A2AV_ZERO && rank == 0) sc[bad_rank(nranks)] = 0;
      return ncclAllToAllv(s, sc, at, d, c, at, ncclFloat32, comm, NULL);
    }
    case K_GATHER_ROOT_VS_SEND:
      if (rank == 0) return ncclGather(s, d, n, ncclFloat32, 0, comm, NULL);
      return ncclSend(s, n + 1, ncclFloat32, 0, comm, NULL);
  }
  return ncclInternalError;
}

static void body(int rank, int nranks, ncclUniqueId id, void* arg) {
  const struct mm* m = arg;
  ncclComm_t comm = cu_comm_init(rank, nranks, id);
  size_t cap = (m->count + 1) * (size_t)nranks;
  float* s = calloc(cap, sizeof(float));
  float* d = calloc(cap, sizeof(float));
  ASSERT(s && d);
  for (size_t i = 0; i < cap; i++) s[i] = (float)(rank + 1);
  int involved = !((m->kind == K_SENDRECV || m->kind == K_SENDRECV_TYPE) && rank > 1);
  if (involved) {
    ncclResult_t r = run_call(m, rank, nranks, comm, s, d);
    /* A rank that only sends may finish before anyone looks at its data (its steps wait in the FIFO):
     * then its next call, which waits, finds the communicator poisoned. */
    /* checked on the rank that received the odd data, which must fail */
    int receiver = m->kind == K_GATHER_ROOT_VS_SEND ? 0 : bad_rank(nranks);
    if (r == ncclSuccess && m->may_pass == 2 && rank != receiver) goto done;
    if (r == ncclSuccess && m->may_pass) r = ncclAllGather(s, d, 1, ncclFloat32, comm, NULL); /* a ring */
    if (r != ncclInvalidUsage)
      rt_fail(__FILE__, __LINE__, "rank %d (%s): the mismatched call returned %d (%s), expected ncclInvalidUsage", rank,
              rt_mode(), (int)r, ncclGetErrorString(r));
    const char* msg = ncclGetLastError(comm);
    for (int k = 0; k < 2 && m->want[k]; k++)
      if (!strstr(msg, m->want[k]))
        rt_fail(__FILE__, __LINE__, "rank %d: last error '%s' does not name '%s'", rank, msg, m->want[k]);
    /* One wording on every rank, whichever path found it (Direct's check, a receive, a poisoned link). */
    if (!strstr(msg, " called ") || !strstr(msg, ": calls on a communicator must match on every rank"))
      rt_fail(__FILE__, __LINE__, "rank %d: last error '%s' is not worded as every rank's", rank, msg);
    ncclResult_t as = ncclSuccess;
    NCCL_OK(ncclCommGetAsyncError(comm, &as));
    EXPECT_EQ((int)as, (int)ncclInvalidUsage);
    /* The communicator refuses further work (its FIFOs no longer line up across ranks). */
    r = ncclAllReduce(s, d, 1, ncclFloat32, ncclSum, comm, NULL);
    EXPECT(r != ncclSuccess);
  }
done:
  /* Destroy never waits on peers whose calls failed. */
  ncclCommDestroy(comm);
  free(s);
  free(d);
}

static void run(int nranks, const char* proto, struct mm m) {
  setenv("CHORUS_TIMEOUT", "30", 1);
  if (proto) setenv("NCCL_PROTO", proto, 1);
  param_reset();
  rt_run_both(nranks, body, &m);
  unsetenv("NCCL_PROTO");
  unsetenv("CHORUS_TIMEOUT");
  param_reset();
}

/* The first example, large (Simple, Direct between threads) and small, on every protocol. */
#define COUNT_WANT {"1048575 x float", "1048576 x float"}
TEST_T(mismatch, count_1m_2ranks, 60) { run(2, NULL, (struct mm){K_COUNT, 1048576, COUNT_WANT, 0}); }
TEST_T(mismatch, count_1m_3ranks, 60) { run(3, NULL, (struct mm){K_COUNT, 1048576, COUNT_WANT, 0}); }
TEST_T(mismatch, count_4_3_ll, 60) { run(2, "LL", (struct mm){K_COUNT, 4, {"3 x float", "4 x float"}, 0}); }
TEST_T(mismatch, count_4_3_ll128, 60) { run(3, "LL128", (struct mm){K_COUNT, 4, {"3 x float", "4 x float"}, 0}); }
TEST_T(mismatch, count_4_3_simple, 60) { run(3, "Simple", (struct mm){K_COUNT, 4, {"3 x float", "4 x float"}, 0}); }
/* Sizes on both sides of the LL threshold: the two ranks pick different protocols. */
TEST_T(mismatch, count_protocols_differ, 60) { run(2, NULL, (struct mm){K_COUNT, 17, {"16 x float", "17 x float"}, 0}); }
TEST_T(mismatch, type, 60) { run(3, NULL, (struct mm){K_TYPE, 1000, {"x int32", "x float"}, 0}); }
TEST_T(mismatch, type_ll, 60) { run(2, "LL", (struct mm){K_TYPE, 4, {"x int32", "x float"}, 0}); }
TEST_T(mismatch, op, 60) { run(3, NULL, (struct mm){K_OP, 1000, {"max", "sum"}, 0}); }
TEST_T(mismatch, op_ll, 60) { run(2, "LL", (struct mm){K_OP, 2, {"max", "sum"}, 0}); }
TEST_T(mismatch, broadcast_vs_allreduce, 60) { run(2, NULL, (struct mm){K_COLL, 1000, {"Broadcast", "AllReduce"}, 0}); }
TEST_T(mismatch, broadcast_vs_allreduce_3ranks, 60) { run(3, NULL, (struct mm){K_COLL, 8, {"Broadcast", "AllReduce"}, 0}); }
TEST_T(mismatch, order_of_two, 60) { run(3, NULL, (struct mm){K_ORDER, 256, {"AllGather", "AllReduce"}, 0}); }
TEST_T(mismatch, reduce_roots, 60) { run(3, NULL, (struct mm){K_ROOT_REDUCE, 100, {"Reduce(100 x float", "root 0"}, 1}); }
TEST_T(mismatch, broadcast_roots_found_next_call, 60) { run(2, NULL, (struct mm){K_ROOT_BCAST, 100, {"Broadcast", "root"}, 1}); }
TEST_T(mismatch, sendrecv_count, 60) { run(2, NULL, (struct mm){K_SENDRECV, 100, {"Send/Recv(99 x float", "Send/Recv(100 x float"}, 0}); }
TEST_T(mismatch, sendrecv_type_3ranks, 60) { run(3, NULL, (struct mm){K_SENDRECV_TYPE, 10, {"int32", "float"}, 0}); }
TEST_T(mismatch, alg_selection, 60) {
  run(3, NULL, (struct mm){K_SEL, 1000, {"algSelection Tree/Simple", "algSelection Ring/Simple"}, 0});
}
/* ncclAllToAllv: a pair whose counts differ is named by both counts, as the application gave them. The
 * receiving rank fails; a rank whose own blocks all matched may return (checked on the receiver). */
#define A2AV_WANT                                                             \
  {                                                                           \
    "AllToAllv(99 x float32 from rank 0 to rank 2)",                          \
        "rank 0's sendcounts[2] (100) must equal rank 2's recvcounts[0] (99)" \
  }
TEST_T(mismatch, alltoallv_counts, 60) { run(3, NULL, (struct mm){K_A2AV, 100, A2AV_WANT, 2}); }
TEST_T(mismatch, alltoallv_zero_sent, 60) {
  run(2, NULL,
      (struct mm){K_A2AV_ZERO,
                  1000,
                  {"AllToAllv(0 x float32 from rank 0 to rank 1)",
                   "rank 0's sendcounts[1] (0) must equal rank 1's recvcounts[0] (1000)"},
                  2});
}
TEST_T(mismatch, gather_vs_send, 60) { run(2, NULL, (struct mm){K_GATHER_ROOT_VS_SEND, 10, {"Gather(10 x float", "Send/Recv(11"}, 2}); }

/* The same over the network transport (loopback TCP, every peer through the proxy): the headers cross
 * the wire with each step, and the poison of a failed call is relayed by the proxies. */
static void run_net(int nranks, struct mm m) {
  setenv("NCCL_P2P_DISABLE", "1", 1);
  setenv("NCCL_SHM_DISABLE", "1", 1);
  run(nranks, NULL, m);
  unsetenv("NCCL_P2P_DISABLE");
  unsetenv("NCCL_SHM_DISABLE");
  param_reset();
}
TEST_T(mismatch_net, count_1m_3ranks, 90) { run_net(3, (struct mm){K_COUNT, 1048576, COUNT_WANT, 0}); }
TEST_T(mismatch_net, count_4_3, 90) { run_net(2, (struct mm){K_COUNT, 4, {"3 x float", "4 x float"}, 0}); }
TEST_T(mismatch_net, broadcast_vs_allreduce_3ranks, 90) {
  run_net(3, (struct mm){K_COLL, 8, {"Broadcast", "AllReduce"}, 0});
}
TEST_T(mismatch_net, reduce_roots, 90) { run_net(3, (struct mm){K_ROOT_REDUCE, 100, {"Reduce(100 x float", "root 0"}, 1}); }
TEST_T(mismatch_net, alltoallv_counts, 90) { run_net(3, (struct mm){K_A2AV, 100, A2AV_WANT, 2}); }
TEST_T(mismatch_net, sendrecv_count, 90) {
  run_net(2, (struct mm){K_SENDRECV, 100, {"Send/Recv(99 x float", "Send/Recv(100 x float"}, 0});
}

/* ncclGetErrorString suggests NCCL_DEBUG=WARN (INFO for system errors) only where it is not set so. */
static void set_debug(const char* v) {
  if (v) setenv("NCCL_DEBUG", v, 1);
  else unsetenv("NCCL_DEBUG");
  param_reset();
  log_reset();
}

TEST_T(mismatch, error_string_hint, 10) {
  set_debug(NULL);
  EXPECT(strstr(ncclGetErrorString(ncclInvalidUsage), "run with NCCL_DEBUG=WARN for details") != NULL);
  EXPECT(strstr(ncclGetErrorString(ncclSystemError), "run with NCCL_DEBUG=INFO for details") != NULL);
  set_debug("VERSION");
  EXPECT(strstr(ncclGetErrorString(ncclInvalidArgument), "NCCL_DEBUG=WARN") != NULL);
  set_debug("WARN");
  EXPECT(strcmp(ncclGetErrorString(ncclInvalidUsage), "invalid usage") == 0);
  EXPECT(strcmp(ncclGetErrorString(ncclInvalidArgument), "invalid argument") == 0);
  EXPECT(strstr(ncclGetErrorString(ncclSystemError), "NCCL_DEBUG=INFO") != NULL);
  set_debug("INFO");
  EXPECT(strcmp(ncclGetErrorString(ncclSystemError), "unhandled system error") == 0);
  EXPECT(strcmp(ncclGetErrorString(ncclInvalidUsage), "invalid usage") == 0);
  set_debug(NULL);
}
