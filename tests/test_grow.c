/* ncclCommGetUniqueId and ncclCommGrow: new ranks join the ranks of a communicator (threads and
 * processes), every misuse is refused by name, and the elastic loop: a rank dies mid-call, the
 * survivors shrink it away and a replacement process joins through grow, twice in a row. */
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include "chorus.h"
#include "elastic_util.h"
#include "runner.h"

/* The coordinator hands its id to the new ranks here: memory shared by threads, and by processes
 * forked after it was mapped. */
struct box {
  _Atomic int ready[4];
  ncclUniqueId id[4];
};
static struct box* box_new(void) {
  struct box* b = mmap(NULL, sizeof(struct box), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  ASSERT(b != MAP_FAILED);
  memset(b, 0, sizeof(*b));
  return b;
}
static void box_put(struct box* b, int i, const ncclUniqueId* id) {
  b->id[i] = *id;
  atomic_store(&b->ready[i], 1);
}
static ncclUniqueId box_get(struct box* b, int i) {
  for (int k = 0; !atomic_load(&b->ready[i]); k++) {
    ASSERT(k < 60000); /* a minute */
    usleep(1000);
  }
  return b->id[i];
}

struct grow_arg {
  int m; /* ranks of the parent; the run's other ranks are new */
  struct box* box;
};

static void grow_body(int rank, int nranks, ncclUniqueId id, void* arg) {
  struct grow_arg* a = arg;
  ncclComm_t parent = NULL, child = NULL;
  ncclUniqueId gid;
  if (rank < a->m) {
    NCCL_OK(ncclCommInitRank(&parent, a->m, id, rank));
    NCCL_OK(elastic_allreduce_check(parent, rank, a->m, 1000, "parent"));
    if (rank == 0) {
      NCCL_OK(ncclCommGetUniqueId(parent, &gid));
      ncclUniqueId again;
      EXPECT_EQ(ncclCommGetUniqueId(parent, &again), ncclInvalidUsage); /* one unconsumed id at a time */
      box_put(a->box, 0, &gid);
    }
    NCCL_OK(ncclCommGrow(parent, nranks, rank == 0 ? &gid : NULL, -1, &child, NULL));
  } else {
    gid = box_get(a->box, 0);
    NCCL_OK(ncclCommGrow(NULL, nranks, &gid, rank, &child, NULL));
  }
  ASSERT(child != NULL);
  int n = 0, r = -1;
  NCCL_OK(ncclCommCount(child, &n));
  NCCL_OK(ncclCommUserRank(child, &r));
  EXPECT_EQ(n, nranks);
  EXPECT_EQ(r, rank);
  NCCL_OK(elastic_allreduce_check(child, rank, nranks, 1000, "grown"));
  NCCL_OK(elastic_allreduce_check(child, rank, nranks, 300000, "grown, large"));
  if (parent) {
    NCCL_OK(elastic_allreduce_check(parent, rank, a->m, 1000, "parent after the grow"));
    ncclComm_t again = NULL;
    if (rank == 0) EXPECT_EQ(ncclCommGrow(parent, nranks, &gid, -1, &again, NULL), ncclInvalidUsage); /* used */
    EXPECT(again == NULL);
    NCCL_OK(ncclCommDestroy(parent));
  }
  NCCL_OK(ncclCommDestroy(child));
}

static void run_grow(int m, int n, int procs) {
  struct grow_arg a = {m, box_new()};
  if (procs) rt_run_procs(n, grow_body, &a);
  else rt_run_threads(n, grow_body, &a);
  munmap(a.box, sizeof(*a.box));
}
TEST_T(grow, threads_2_to_4, 60) { run_grow(2, 4, 0); }
TEST_T(grow, procs_2_to_5, 60) { run_grow(2, 5, 1); }
TEST_T(grow, procs_1_to_2, 60) { run_grow(1, 2, 1); }
TEST_T(grow, threads_3_to_8, 60) { run_grow(3, 8, 0); }

/* Misuse among the existing ranks (no new rank comes): refused on every existing rank, by name, and the
 * parent still works. arg: 0 two coordinators, 1 none, 2 sizes disagree. */
static void misuse_body(int rank, int nranks, ncclUniqueId id, void* arg) {
  int how = (int)(intptr_t)arg;
  ncclComm_t parent = NULL, child = NULL;
  NCCL_OK(ncclCommInitRank(&parent, nranks, id, rank));
  ncclUniqueId gid;
  int has = how == 0 ? rank < 2 : how == 1 ? 0 : rank == 0;
  if (has) NCCL_OK(ncclCommGetUniqueId(parent, &gid));
  int size = how == 2 && rank == 1 ? nranks + 2 : nranks + 1;
  EXPECT_EQ(ncclCommGrow(parent, size, has ? &gid : NULL, -1, &child, NULL), ncclInvalidUsage);
  EXPECT(child == NULL);
  const char* want = how == 0 ? "both passed an id" : how == 1 ? "no existing rank passed the id" : "disagree";
  EXPECT(strstr(ncclGetLastError(parent), want) != NULL);
  NCCL_OK(elastic_allreduce_check(parent, rank, nranks, 100, "parent after a refused grow"));
  NCCL_OK(ncclCommDestroy(parent));
}
/* Processes only: a refused grow leaves its coordinator's id unconsumed, and the root behind it waits in
 * that process (for CHORUS_INIT_TIMEOUT) like any unused id's; in thread mode that would be the test's
 * own process, which the sanitizers then refuse to fork. */
TEST_T(grow, two_coordinators_refused, 60) { rt_run_procs(3, misuse_body, (void*)0); }
TEST_T(grow, no_coordinator_refused, 60) { rt_run_both(3, misuse_body, (void*)1); }
TEST_T(grow, sizes_disagree_refused, 60) { rt_run_procs(3, misuse_body, (void*)2); }

/* Arguments refused before anything is exchanged. */
static void args_body(int rank, int nranks, ncclUniqueId id, void* arg) {
  (void)arg;
  ncclComm_t parent = NULL, child = (ncclComm_t)1;
  NCCL_OK(ncclCommInitRank(&parent, nranks, id, rank));
  ncclUniqueId gid;
  memset(&gid, 0, sizeof(gid));
  EXPECT_EQ(ncclCommGrow(parent, nranks + 1, NULL, 0, &child, NULL), ncclInvalidArgument); /* rank != -1 */
  EXPECT(child == NULL);
  EXPECT_EQ(ncclCommGrow(parent, nranks, NULL, -1, &child, NULL), ncclInvalidArgument); /* not larger */
  EXPECT_EQ(ncclCommGrow(NULL, 4, NULL, 3, &child, NULL), ncclInvalidArgument);         /* new rank, no id */
  EXPECT_EQ(ncclCommGrow(NULL, 4, &gid, 4, &child, NULL), ncclInvalidArgument);         /* rank out of range */
  EXPECT_EQ(ncclCommGrow(parent, nranks + 1, NULL, -1, NULL, NULL), ncclInvalidArgument);
  EXPECT_EQ(ncclCommGetUniqueId(parent, NULL), ncclInvalidArgument);
  int lost = 7;
  NCCL_OK(chorusCommGetLostRank(parent, &lost));
  EXPECT_EQ(lost, -1); /* nobody is gone */
  EXPECT_EQ(chorusCommGetLostRank(parent, NULL), ncclInvalidArgument);
  /* An id this rank did not hand out: refused locally, before the exchange. */
  EXPECT_EQ(ncclCommGrow(parent, nranks + 1, &gid, -1, &child, NULL), ncclInvalidUsage);
  EXPECT(strstr(ncclGetLastError(parent), "did not hand out") != NULL);
  NCCL_OK(ncclCommRevoke(parent, NCCL_REVOKE_DEFAULT));
  EXPECT_EQ(ncclCommGrow(parent, nranks + 1, NULL, -1, &child, NULL), ncclInvalidUsage); /* revoked */
  NCCL_OK(ncclCommDestroy(parent));
}
TEST_T(grow, bad_arguments_refused, 30) { rt_run_threads(1, args_body, NULL); }

/* A new rank that never comes: the members' grow fails within CHORUS_INIT_TIMEOUT instead of hanging. */
static void absent_body(int rank, int nranks, ncclUniqueId id, void* arg) {
  (void)arg;
  ncclComm_t parent = NULL, child = NULL;
  NCCL_OK(ncclCommInitRank(&parent, nranks, id, rank));
  ncclUniqueId gid;
  if (rank == 0) NCCL_OK(ncclCommGetUniqueId(parent, &gid));
  time_t t0 = time(NULL);
  ncclResult_t r = ncclCommGrow(parent, nranks + 1, rank == 0 ? &gid : NULL, -1, &child, NULL);
  EXPECT(r != ncclSuccess);
  EXPECT(time(NULL) - t0 < 30);
  EXPECT(child == NULL);
  NCCL_OK(ncclCommDestroy(parent));
}
TEST_T(grow, new_rank_never_comes, 60) {
  setenv("CHORUS_INIT_TIMEOUT", "3", 1);
  rt_run_procs(2, absent_body, NULL);
  unsetenv("CHORUS_INIT_TIMEOUT");
}

/* The elastic loop (elastic_util.c), its spares' ids in a box. */
static void box_put_cb(void* ctx, int round, const ncclUniqueId* id) { box_put(ctx, round, id); }
static ncclUniqueId box_get_cb(void* ctx, int round) { return box_get(ctx, round); }
static void elastic_body(int proc, int nprocs, ncclUniqueId id, void* arg) {
  (void)nprocs;
  struct elastic_ids ids = {box_put_cb, box_get_cb, arg};
  ncclComm_t comm = NULL;
  if (proc < ELASTIC_N) NCCL_OK(ncclCommInitRank(&comm, ELASTIC_N, id, proc));
  elastic_run(comm, proc, &ids);
}
TEST_T(grow, elastic_kill_shrink_grow_twice, 120) {
  struct box* b = box_new();
  rt_run_procs(ELASTIC_N + ELASTIC_ROUNDS, elastic_body, b);
  munmap(b, sizeof(*b));
}
