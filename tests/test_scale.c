/* Many process ranks on this machine (issue 44, "A thousand ranks"): whole-library init and a
 * collective at the largest size that runs here in well under a minute, and the failures found on
 * the way to 256 ranks. */
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

#include "nccl.h"
#include "runner.h"

/* 128 processes on two CPUs: init (bootstrap gather, connections) and one AllReduce, exact. */
static void scale_rank(int rank, int nranks, ncclUniqueId id, void* arg) {
  (void)arg;
  ncclComm_t comm;
  NCCL_OK(ncclCommInitRank(&comm, nranks, id, rank));
  double* v = malloc(4 * sizeof(*v));
  ASSERT(v);
  for (int i = 0; i < 4; i++) v[i] = rank + i;
  NCCL_OK(ncclAllReduce(v, v, 4, ncclDouble, ncclSum, comm, NULL));
  for (int i = 0; i < 4; i++) EXPECT_EQ(v[i], (double)nranks * (nranks - 1) / 2 + (double)nranks * i);
  free(v);
  NCCL_OK(ncclCommDestroy(comm));
}

TEST_T(scale, init_allreduce_128_procs, 120) { rt_run_procs(128, scale_rank, NULL); }

/* A rank that did its part of a call and exited is no failure for a rank still waiting on another
 * one: before, every waiting rank checked every local pid, so at the end of all_reduce_perf at 256
 * ranks, ranks still in the last gather failed with "rank 1 has exited while rank 255 was waiting for
 * it in a collective". Here rank 0 sends to rank 1 and leaves; rank 2 sends to rank 1 1.5 s later. */
static void early_exit_rank(int rank, int nranks, ncclUniqueId id, void* arg) {
  (void)arg;
  ncclComm_t comm;
  NCCL_OK(ncclCommInitRank(&comm, nranks, id, rank));
  int x = rank + 10, y = 0, z = 0;
  if (rank == 0) {
    NCCL_OK(ncclSend(&x, 1, ncclInt32, 1, comm, NULL));
    _exit(0); /* gone at once, as a finished process is */
  } else if (rank == 1) {
    NCCL_OK(ncclRecv(&y, 1, ncclInt32, 0, comm, NULL));
    EXPECT_EQ(y, 10);
    NCCL_OK(ncclRecv(&z, 1, ncclInt32, 2, comm, NULL));
    EXPECT_EQ(z, 12);
  } else {
    usleep(1500000);
    NCCL_OK(ncclSend(&x, 1, ncclInt32, 1, comm, NULL));
  }
  NCCL_OK(ncclCommDestroy(comm));
}

TEST_T(scale, finished_rank_exits_while_others_wait, 60) { rt_run_procs(3, early_exit_rank, NULL); }

/* The same in a collective: rank 2 does its part of a Gather and exits while rank 0, the root, still
 * waits on rank 1, which is slow. Before, rank 0 checked the pid of every local rank while it waited
 * and failed naming rank 2 ("rank 2 (pid P on H) has exited while rank 0 was waiting for it in a
 * collective"); it checks only the ranks it waits on now (core/engine.c check_peers_alive). */
static void gather_exit_rank(int rank, int nranks, ncclUniqueId id, void* arg) {
  (void)arg;
  ncclComm_t comm;
  NCCL_OK(ncclCommInitRank(&comm, nranks, id, rank));
  int x = rank + 10, all[3] = {0, 0, 0};
  /* A first Gather sets the connections up: rank 0 must wait in the engine, not in their setup. */
  NCCL_OK(ncclGather(&x, all, 1, ncclInt32, 0, comm, NULL));
  if (rank == 1) usleep(2000000); /* rank 0 is waiting on us long after rank 2 left */
  NCCL_OK(ncclGather(&x, all, 1, ncclInt32, 0, comm, NULL));
  if (rank == 2) _exit(0); /* its part is done (the root received it): gone at once */
  if (rank == 0)
    for (int r = 0; r < nranks; r++) EXPECT_EQ(all[r], r + 10);
  NCCL_OK(ncclCommDestroy(comm));
}

TEST_T(scale, finished_rank_exits_during_gather, 60) { rt_run_procs(3, gather_exit_rank, NULL); }

/* Many thread ranks of one process: init, then an AllReduce, an AllGather, an AlltoAll and a Send/Recv
 * ring, each checked exactly. */
static void thread_calls_rank(int rank, int nranks, ncclUniqueId id, void* arg) {
  (void)arg;
  ncclComm_t comm;
  NCCL_OK(ncclCommInitRank(&comm, nranks, id, rank));
  int64_t s = rank + 1, sum = 0;
  NCCL_OK(ncclAllReduce(&s, &sum, 1, ncclInt64, ncclSum, comm, NULL));
  EXPECT_EQ(sum, (int64_t)nranks * (nranks + 1) / 2);
  int32_t* all = malloc((size_t)nranks * sizeof(*all));
  int32_t* out = malloc((size_t)nranks * sizeof(*out));
  ASSERT(all && out);
  int32_t mine = rank * 3 + 1;
  NCCL_OK(ncclAllGather(&mine, all, 1, ncclInt32, comm, NULL));
  int bad = 0;
  for (int r = 0; r < nranks; r++) bad += all[r] != r * 3 + 1;
  EXPECT_EQ(bad, 0);
  for (int r = 0; r < nranks; r++) all[r] = rank * 100000 + r; /* the piece for rank r */
  NCCL_OK(ncclAlltoAll(all, out, 1, ncclInt32, comm, NULL));
  for (int r = 0; r < nranks; r++) bad += out[r] != r * 100000 + rank;
  EXPECT_EQ(bad, 0);
  int32_t got = -1, next = (rank + 1) % nranks, prev = (rank + nranks - 1) % nranks;
  NCCL_OK(ncclGroupStart());
  NCCL_OK(ncclSend(&mine, 1, ncclInt32, next, comm, NULL));
  NCCL_OK(ncclRecv(&got, 1, ncclInt32, prev, comm, NULL));
  NCCL_OK(ncclGroupEnd());
  EXPECT_EQ(got, prev * 3 + 1);
  free(all);
  free(out);
  NCCL_OK(ncclCommDestroy(comm));
}

/* The most descriptors this process holds while thread ranks run, sampled every 50 ms. */
struct fd_watch {
  atomic_int stop;
  int peak;
};

static void* fd_sampler(void* p) {
  struct fd_watch* w = p;
  while (!atomic_load(&w->stop)) {
    int n = rt_count_fds();
    if (n > w->peak) w->peak = n;
    usleep(50000);
  }
  return NULL;
}

/* n thread ranks of thread_calls_rank; says how many descriptors the process held at most. The
 * descriptor limit is raised to what they need if the hard limit allows (a fresh machine's soft
 * limit is 1024). */
static void run_thread_calls(int n) {
  struct rlimit rl;
  rlim_t need = n <= 128 ? (rlim_t)n * 100 : 20000; /* more ranks share the bootstrap's half among them */
  if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < need &&
      (rl.rlim_max == RLIM_INFINITY || rl.rlim_max >= need)) {
    rl.rlim_cur = need;
    (void)setrlimit(RLIMIT_NOFILE, &rl);
  }
  if (getrlimit(RLIMIT_NOFILE, &rl) != 0 || rl.rlim_cur < need) {
    printf("    SKIP: %d thread ranks need a descriptor limit of %llu (ulimit -n; hard limit too low)\n", n,
           (unsigned long long)need);
    return;
  }
  struct fd_watch w = {0, 0};
  int before = rt_count_fds();
  pthread_t t;
  ASSERT(pthread_create(&t, NULL, fd_sampler, &w) == 0);
  rt_run_threads(n, thread_calls_rank, NULL);
  atomic_store(&w.stop, 1);
  pthread_join(t, NULL);
  printf("    %d thread ranks: at most %d descriptors (%d before)\n", n, w.peak, before);
}

TEST_T(scale, threads_all_calls_64, 60) { run_thread_calls(64); }
TEST_T(scale, threads_all_calls_96, 60) { run_thread_calls(96); }
TEST_T(scale, threads_all_calls_128, 120) { run_thread_calls(128); }
