/* The elastic loop (issue 46), shared by grow.elastic_kill_shrink_grow_twice (processes of one host)
 * and cluster.elastic_grow_across_hosts (processes on netns hosts): 4 ranks run AllReduces; in each
 * round the last rank dies in the middle of one (another of its threads ends the process); the
 * survivors get ncclRemoteError naming it, shrink it away (NCCL_SHRINK_ABORT), and a spare process
 * joins as the last rank through ncclCommGrow. Results are checked every time. Grow ids travel
 * through the caller's put/get (shared memory, or files). */
#ifndef CHORUS_TEST_ELASTIC_UTIL_H
#define CHORUS_TEST_ELASTIC_UTIL_H

#include "nccl.h"

#define ELASTIC_N 4
#define ELASTIC_ROUNDS 2

struct elastic_ids {
  void (*put)(void* ctx, int round, const ncclUniqueId* id); /* rank 0 after each shrink */
  ncclUniqueId (*get)(void* ctx, int round);                  /* the spare of that round */
  void* ctx;
};

/* Process proc of ELASTIC_N + ELASTIC_ROUNDS: procs below ELASTIC_N pass their communicator (rank proc),
 * spares pass NULL and join at round proc - ELASTIC_N + 1. Returns 1 for a process that lived to the
 * end (the victims never return). */
int elastic_run(ncclComm_t comm, int proc, const struct elastic_ids* ids);
/* An AllReduce of count ints checked against its closed form (rt_fail on a wrong value). */
ncclResult_t elastic_allreduce_check(ncclComm_t comm, int rank, int n, size_t count, const char* what);

#endif
