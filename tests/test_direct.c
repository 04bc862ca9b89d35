/* Direct AllReduce between processes on ncclMemAlloc buffers (algo/direct_allreduce.c): results for
 * every type and op, the fallback when some rank's buffer is plain memory, more buffers than the
 * mapping cache holds, and that Direct really ran (its done word moves only on that path). */
#include <dirent.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "coll_util.h"
#include "comm/comm.h"
#include "comm/work.h"
#include "misc/param.h"
#include "tune/tune.h"
#include "runner.h"

static void direct_everywhere(void) {
  setenv("CHORUS_SHM_DIRECT_MIN_BYTES", "0", 1);
  cu_force_proto(NULL); /* also re-reads the parameters */
}

static void sweep(int nranks) {
  direct_everywhere();
  cu_memalloc = 1;
  struct cu_sweep sw = {.colls = 1u << CU_ALLREDUCE, .big = {300007}};
  rt_run_procs(nranks, cu_sweep_body, &sw);
}
TEST_T(direct, procs_2_all_types_ops, 120) { sweep(2); }
TEST_T(direct, procs_3_all_types_ops, 120) { sweep(3); }
TEST_T(direct, procs_4_all_types_ops, 180) { sweep(4); }

/* Did the last AllReduce on comm run Direct? */
static int ran_direct(ncclComm_t comm) {
  return comm->clique && atomic_load(&comm->clique->slot[comm->rank].done) == comm->seq + 1;
}

/* arg != NULL: rank 1 receives into plain memory, so every rank must fall back to FIFOs. */
static void mixed_body(int rank, int nranks, ncclUniqueId id, void* arg) {
  ncclComm_t comm = cu_comm_init(rank, nranks, id);
  const size_t n = 100003;
  float *send = NULL, *recv = NULL;
  NCCL_OK(ncclMemAlloc((void**)&send, n * sizeof(float)));
  int plain = arg && rank == 1;
  if (plain) recv = malloc(n * sizeof(float));
  else NCCL_OK(ncclMemAlloc((void**)&recv, n * sizeof(float)));
  for (int rep = 0; rep < 3; rep++) {
    for (size_t i = 0; i < n; i++) send[i] = (float)(rank + 1 + (int)(i % 5) + rep);
    NCCL_OK(ncclAllReduce(send, recv, n, ncclFloat, ncclSum, comm, NULL));
    EXPECT_EQ(ran_direct(comm), !arg);
    for (size_t i = 0; i < n; i++) {
      float want = (float)(nranks * (nranks + 1) / 2 + nranks * ((int)(i % 5) + rep));
      if (recv[i] != want) {
        rt_fail(__FILE__, __LINE__, "rank %d rep %d [%zu] = %g, want %g", rank, rep, i, recv[i], want);
        break;
      }
    }
  }
  if (plain) free(recv);
  else NCCL_OK(ncclMemFree(recv));
  NCCL_OK(ncclMemFree(send));
  NCCL_OK(ncclCommDestroy(comm));
}
TEST(direct, all_memalloc_runs_direct) {
  direct_everywhere();
  rt_run_procs(2, mixed_body, NULL);
}
TEST(direct, one_plain_buffer_falls_back) {
  direct_everywhere();
  rt_run_procs(3, mixed_body, (void*)1);
}

/* 4 ranks (3 above): the fallback on a power of two. */
TEST(direct, one_plain_buffer_falls_back_4) {
  direct_everywhere();
  rt_run_procs(4, mixed_body, (void*)1);
}

/* The fallback on the channels the model gives Ring (standby ops on channels 1..3, core/plan.c),
 * each call three times (the plan reused: standby ops stay the fallback, the Direct op goes back to
 * Direct), and with every buffer from ncclMemAlloc the standby ops skip. */
/* The choice behind it: Direct, else Ring on the 4 channels (so the calls below take standby ops). */
static void fallback_choice_body(int rank, int nranks, ncclUniqueId id, void* arg) {
  (void)arg;
  ncclComm_t comm = cu_comm_init(rank, nranks, id);
  struct tune_choice ch;
  tune_predict(comm, FUNC_ALLREDUCE, 100003 * sizeof(float), CH_REPRO_OFF, &ch);
  EXPECT_EQ(ch.algo, ALGO_DIRECT);
  EXPECT_EQ(ch.fb_nch, 4);
  NCCL_OK(ncclCommDestroy(comm));
}

TEST(direct, fallback_on_several_channels) {
  direct_everywhere();
  setenv("NCCL_MIN_NCHANNELS", "4", 1); /* 4 channels for the 400 KB calls */
  cu_force_proto(NULL);
  rt_run_procs(3, fallback_choice_body, NULL);
  rt_run_procs(3, mixed_body, (void*)1);
  rt_run_procs(2, mixed_body, NULL);
  unsetenv("NCCL_MIN_NCHANNELS");
  cu_force_proto(NULL);
}

/* 18 ranks, each with a send and a receive allocation: one call maps 34 peer buffers, more than the
 * 32 mappings a small communicator keeps; it used to unmap one the call still used (SIGSEGV). */
TEST_T(direct, one_call_maps_more_buffers_than_32, 120) {
  direct_everywhere();
  rt_run_procs(18, mixed_body, NULL);
}

/* 40 allocations, more than the 32 mappings a rank keeps: old ones are unmapped and remapped. */
static void many_body(int rank, int nranks, ncclUniqueId id, void* arg) {
  (void)arg;
  ncclComm_t comm = cu_comm_init(rank, nranks, id);
  enum { NB = 40, N = 4099 };
  int* bufs[NB];
  for (int b = 0; b < NB; b++) NCCL_OK(ncclMemAlloc((void**)&bufs[b], N * sizeof(int)));
  for (int round = 0; round < 2; round++)
    for (int b = 0; b < NB; b++) {
      for (int i = 0; i < N; i++) bufs[b][i] = rank * 1000 + b + i;
      NCCL_OK(ncclAllReduce(bufs[b], bufs[b], N, ncclInt32, ncclSum, comm, NULL));
      EXPECT(ran_direct(comm));
      int want0 = 1000 * nranks * (nranks - 1) / 2 + nranks * b;
      EXPECT_EQ(bufs[b][0], want0);
      EXPECT_EQ(bufs[b][N - 1], want0 + nranks * (N - 1));
    }
  for (int b = 0; b < NB; b++) NCCL_OK(ncclMemFree(bufs[b]));
  NCCL_OK(ncclCommDestroy(comm));
}
TEST(direct, more_buffers_than_mappings) {
  direct_everywhere();
  rt_run_procs(2, many_body, NULL);
}

/* Replace every ncclMemAlloc memfd of this process by /dev/null (same descriptor numbers). */
static void poison_memfds(void) {
  DIR* d = opendir("/proc/self/fd");
  ASSERT(d != NULL);
  int nul = open("/dev/null", O_RDWR | O_CLOEXEC), hit = 0;
  ASSERT(nul >= 0);
  for (struct dirent* e; (e = readdir(d));) {
    char path[300], link[128];
    snprintf(path, sizeof(path), "/proc/self/fd/%s", e->d_name);
    ssize_t k = readlink(path, link, sizeof(link) - 1);
    if (k <= 0) continue;
    link[k] = '\0';
    if (strncmp(link, "/memfd:chorus-mem", 17) == 0) hit += dup2(nul, atoi(e->d_name)) >= 0;
  }
  closedir(d);
  close(nul);
  ASSERT(hit >= 2);
}

/* Rank 1's buffers stop being reachable (their memfd descriptors now name /dev/null, which rank 1's
 * descriptor server hands over): rank 0 refuses what it gets, and both ranks must return an error
 * instead of waiting for each other. */
static void unmappable_body(int rank, int nranks, ncclUniqueId id, void* arg) {
  (void)arg;
  ncclComm_t comm = cu_comm_init(rank, nranks, id);
  const size_t n = 1 << 16;
  float *send = NULL, *recv = NULL;
  NCCL_OK(ncclMemAlloc((void**)&send, n * sizeof(float)));
  NCCL_OK(ncclMemAlloc((void**)&recv, n * sizeof(float)));
  for (size_t i = 0; i < n; i++) send[i] = 1.0f;
  if (rank == 1) poison_memfds();
  ncclResult_t r = ncclAllReduce(send, recv, n, ncclFloat, ncclSum, comm, NULL);
  EXPECT_EQ(r, ncclSystemError);
  NCCL_OK(ncclMemFree(recv));
  NCCL_OK(ncclMemFree(send));
  ncclCommAbort(comm);
}
TEST(direct, unmappable_buffer_fails_on_every_rank) {
  direct_everywhere();
  rt_run_procs(2, unmappable_body, NULL);
}

/* The same call alternating between ncclMemAlloc and plain buffers: Direct, fallback, Direct again
 * (the reused plan must not stay on the fallback). */
static void toggle_body(int rank, int nranks, ncclUniqueId id, void* arg) {
  (void)arg;
  ncclComm_t comm = cu_comm_init(rank, nranks, id);
  const size_t n = 50001;
  float *shared = NULL, *plain = malloc(n * sizeof(float));
  ASSERT(plain != NULL);
  NCCL_OK(ncclMemAlloc((void**)&shared, n * sizeof(float)));
  for (int rep = 0; rep < 4; rep++) {
    float* buf = rep % 2 ? plain : shared;
    for (size_t i = 0; i < n; i++) buf[i] = (float)(rank + rep);
    NCCL_OK(ncclAllReduce(buf, buf, n, ncclFloat, ncclSum, comm, NULL));
    EXPECT_EQ(ran_direct(comm), rep % 2 == 0);
    float want = (float)(nranks * (nranks - 1) / 2 + nranks * rep);
    EXPECT(buf[0] == want && buf[n - 1] == want);
  }
  NCCL_OK(ncclMemFree(shared));
  free(plain);
  NCCL_OK(ncclCommDestroy(comm));
}
TEST(direct, fallback_then_direct_again) {
  direct_everywhere();
  rt_run_procs(2, toggle_body, NULL);
  rt_run_procs(4, toggle_body, NULL);
}

/* Item 11: calls that do not match across ranks (rank 1 passes twice the count, or doubles instead of
 * floats). Each rank's buffers hold exactly its own call: a Direct rank that used its own shape on a
 * peer's buffers would read and write past them (ASan: heap-buffer-overflow; processes: SIGSEGV or
 * silent corruption). Both ranks must return ncclInvalidUsage without touching the peer's memory,
 * and the bytes just past each receive buffer stay as they were. */
struct mismatch { int memalloc, by_type; };

static void mismatch_body(int rank, int nranks, ncclUniqueId id, void* arg) {
  const struct mismatch* mm = arg;
  ncclComm_t comm = cu_comm_init(rank, nranks, id);
  size_t count = 4096 * (mm->by_type ? 1 : (size_t)(rank + 1));
  ncclDataType_t type = mm->by_type && rank == 1 ? ncclFloat64 : ncclFloat32;
  size_t es = type == ncclFloat64 ? 8 : 4, bytes = count * es;
  char *send = NULL, *recv = NULL;
  if (mm->memalloc) {
    NCCL_OK(ncclMemAlloc((void**)&send, bytes));
    NCCL_OK(ncclMemAlloc((void**)&recv, bytes + 64));
  } else {
    send = malloc(bytes);
    recv = malloc(bytes + 64);
    ASSERT(send && recv);
  }
  memset(send, 1, bytes);
  memset(recv, 0x5a, bytes + 64);
  ncclResult_t r = ncclAllReduce(send, recv, count, type, ncclSum, comm, NULL);
  EXPECT_EQ(r, ncclInvalidUsage);
  for (size_t i = 0; i < bytes + 64; i++)
    if ((unsigned char)recv[i] != 0x5a) {
      rt_fail(__FILE__, __LINE__, "rank %d: recv[%zu] was written by a mismatched call", rank, i);
      break;
    }
  if (mm->memalloc) {
    NCCL_OK(ncclMemFree(send));
    NCCL_OK(ncclMemFree(recv));
  } else {
    free(send);
    free(recv);
  }
  ncclCommAbort(comm);
}

static void run_mismatch(int procs, int memalloc, int by_type) {
  setenv("CHORUS_DIRECT_MIN_BYTES", "0", 1);
  direct_everywhere();
  struct mismatch mm = {memalloc, by_type};
  if (procs) rt_run_procs(2, mismatch_body, &mm);
  else rt_run_threads(2, mismatch_body, &mm);
  unsetenv("CHORUS_DIRECT_MIN_BYTES");
}
TEST(direct, mismatch_count_threads) { run_mismatch(0, 0, 0); }
TEST(direct, mismatch_type_threads) { run_mismatch(0, 0, 1); }
TEST(direct, mismatch_count_procs) { run_mismatch(1, 1, 0); }
TEST(direct, mismatch_type_procs) { run_mismatch(1, 1, 1); }

/* Cross-memory copies (algo/direct_cma.c): buffers not from ncclMemAlloc, between processes, run
 * Direct when CHORUS_CMA is on and the kernel lets the ranks read each other (probed at init; where it
 * does not, as under Yama's ptrace_scope 1, every rank falls back and these tests check results only). */
static int cma_works(void) { return access("/proc/sys/kernel/yama/ptrace_scope", F_OK) != 0 || getenv("CHORUS_TEST_CMA"); }

static void cma_everywhere(const char* on) {
  setenv("CHORUS_CMA", on, 1);
  setenv("CHORUS_CMA_MIN_BYTES", "0", 1);
  direct_everywhere();
}

static void cma_sweep(int nranks) {
  cma_everywhere("1");
  cu_memalloc = 0;
  struct cu_sweep sw = {.colls = 1u << CU_ALLREDUCE, .big = {300007}};
  rt_run_procs(nranks, cu_sweep_body, &sw);
  unsetenv("CHORUS_CMA_MIN_BYTES");
}
TEST_T(direct, cma_procs_2_all_types_ops, 120) { cma_sweep(2); }
TEST_T(direct, cma_procs_3_all_types_ops, 180) { cma_sweep(3); }

/* Plain buffers (arg: how many ranks use ncclMemAlloc for theirs, from rank 0 up), in place and not,
 * several MiB (more than one copy block per peer); which path ran is checked where CMA is known to work. */
struct cma_arg {
  int memalloc_ranks, expect_direct, expect_cma; /* -1: not checked */
};
static void cma_body(int rank, int nranks, ncclUniqueId id, void* arg) {
  const struct cma_arg* a = arg;
  ncclComm_t comm = cu_comm_init(rank, nranks, id);
  const size_t n = (3u << 20) / sizeof(float) + 77;
  int mapped = rank < a->memalloc_ranks;
  float *send = NULL, *recv = NULL;
  if (mapped) {
    NCCL_OK(ncclMemAlloc((void**)&send, n * sizeof(float)));
    NCCL_OK(ncclMemAlloc((void**)&recv, n * sizeof(float)));
  } else {
    send = malloc(n * sizeof(float)), recv = malloc(n * sizeof(float));
  }
  for (int rep = 0; rep < 4; rep++) {
    int inplace = rep & 1;
    float* out = inplace ? send : recv;
    for (size_t i = 0; i < n; i++) send[i] = (float)(rank + 1 + (int)(i % 7) + rep);
    NCCL_OK(ncclAllReduce(send, out, n, ncclFloat, ncclSum, comm, NULL));
    if (a->expect_direct >= 0) EXPECT_EQ(ran_direct(comm), a->expect_direct);
    for (size_t i = 0; i < n; i++) {
      float want = (float)(nranks * (nranks + 1) / 2 + nranks * ((int)(i % 7) + rep));
      if (out[i] != want) {
        rt_fail(__FILE__, __LINE__, "rank %d rep %d [%zu] = %g, want %g", rank, rep, i, out[i], want);
        break;
      }
    }
  }
  if (a->expect_cma >= 0) EXPECT_EQ(comm->cma != NULL, a->expect_cma);
  if (mapped) {
    NCCL_OK(ncclMemFree(send));
    NCCL_OK(ncclMemFree(recv));
  } else {
    free(send), free(recv);
  }
  NCCL_OK(ncclCommDestroy(comm));
}
TEST_T(direct, cma_plain_buffers_run_direct, 120) {
  cma_everywhere("1");
  struct cma_arg a = {0, cma_works() ? 1 : -1, cma_works() ? 1 : -1};
  rt_run_procs(2, cma_body, &a);
  rt_run_procs(4, cma_body, &a);
  a.memalloc_ranks = 2; /* mapped and copied peers in one call */
  rt_run_procs(3, cma_body, &a);
  unsetenv("CHORUS_CMA_MIN_BYTES");
}
TEST_T(direct, cma_off_falls_back, 60) {
  cma_everywhere("0");
  struct cma_arg a = {0, 0, 0};
  rt_run_procs(3, cma_body, &a);
  unsetenv("CHORUS_CMA");
  unsetenv("CHORUS_CMA_MIN_BYTES");
}
/* Below CHORUS_CMA_MIN_BYTES the call falls back, on every rank alike. */
TEST_T(direct, cma_below_min_falls_back, 60) {
  cma_everywhere("1");
  setenv("CHORUS_CMA_MIN_BYTES", "67108864", 1);
  cu_force_proto(NULL);
  struct cma_arg a = {0, 0, cma_works() ? 1 : -1};
  rt_run_procs(2, cma_body, &a);
  unsetenv("CHORUS_CMA_MIN_BYTES");
}

/* A rank whose cross-memory copies the kernel refuses (a seccomp filter: what a container runtime's
 * profile does; root's CAP_SYS_PTRACE would pass ptrace_scope and dumpable checks): before init, every
 * rank's probe agrees CMA is off and the calls fall back; after init, the call fails on every rank with
 * ncclSystemError, without a hang. */
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <stddef.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
static void refuse_cma(void) {
  struct sock_filter f[] = {
      BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, nr)),
      BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, __NR_process_vm_readv, 2, 0),
      BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, __NR_process_vm_writev, 1, 0),
      BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
      BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ERRNO | (EPERM & SECCOMP_RET_DATA)),
  };
  struct sock_fprog prog = {(unsigned short)(sizeof(f) / sizeof(f[0])), f};
  ASSERT(prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) == 0);
  ASSERT(prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &prog) == 0);
}

static void refused_body(int rank, int nranks, ncclUniqueId id, void* arg) {
  int after_init = arg != NULL;
  if (rank == 1 && !after_init) refuse_cma();
  ncclComm_t comm = cu_comm_init(rank, nranks, id);
  const size_t n = (1u << 20) + 3;
  float* buf = malloc(n * sizeof(float));
  for (size_t i = 0; i < n; i++) buf[i] = 1.0f;
  NCCL_OK(ncclAllReduce(buf, buf, n, ncclFloat, ncclSum, comm, NULL));
  EXPECT_EQ(buf[n - 1], (float)nranks);
  if (!after_init) {
    EXPECT(comm->cma == NULL);
    EXPECT_EQ(ran_direct(comm), 0);
    NCCL_OK(ncclCommDestroy(comm));
  } else {
    if (cma_works()) EXPECT_EQ(ran_direct(comm), 1);
    if (rank == 1) refuse_cma();
    ncclResult_t r = ncclAllReduce(buf, buf, n, ncclFloat, ncclSum, comm, NULL);
    if (cma_works()) EXPECT_EQ(r, ncclSystemError);
    NCCL_OK(ncclCommAbort(comm));
  }
  free(buf);
}
TEST_T(direct, cma_refused_at_init_falls_back, 60) {
  cma_everywhere("1");
  rt_run_procs(3, refused_body, NULL);
}
TEST_T(direct, cma_refused_mid_job_fails_every_rank, 60) {
  cma_everywhere("1");
  rt_run_procs(3, refused_body, (void*)1);
}

/* Reproducible levels through cross-memory copies: every rank's block of a segment read at once. */
TEST_T(direct, cma_reproducible_levels, 120) {
  cma_everywhere("1");
  struct cma_arg a = {0, cma_works() ? 1 : -1, -1};
  setenv("CHORUS_REPRODUCIBLE", "order", 1);
  cu_force_proto(NULL);
  rt_run_procs(3, cma_body, &a);
  setenv("CHORUS_REPRODUCIBLE", "exact", 1);
  cu_force_proto(NULL);
  rt_run_procs(2, cma_body, &a);
  unsetenv("CHORUS_REPRODUCIBLE");
}
