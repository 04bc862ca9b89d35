/* An elastic training loop: ranks average a gradient each step and apply it; a rank that dies is
 * replaced and the job goes on, without a restart.
 *
 *   build/bin/chorusrun -n 4 --respawn 2 build/bin/elastic [steps] [kill-step:kill-rank,...]
 *
 * Default: 20 steps; at step 5 rank 1 dies (SIGKILL, in the middle of an AllReduce), at step 12 the
 * last rank (the first replacement) dies. After each death:
 *   1. every survivor's call fails with ncclRemoteError; chorusCommGetLostRank names the dead rank;
 *   2. the survivors shrink it away (ncclCommShrink, NCCL_SHRINK_ABORT): ranks after it move down one;
 *   3. chorusrun --respawn starts a replacement (CHORUS_RESPAWN=k for the k-th); the new rank 0 asks for
 *      a grow id (ncclCommGetUniqueId) and leaves it, with the step to resume at, in CHORUS_ELASTIC_DIR;
 *   4. survivors and replacement grow back to the full size (ncclCommGrow; the replacement is the last
 *      rank), rank 0 broadcasts its step and weights to all (some survivors may have finished the step
 *      that failed on others), and the job goes on from there.
 * At the end every rank checks its weights against the closed form and prints one line; exit 0. */
#define _GNU_SOURCE
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "chorus.h"
#include "nccl.h"

#define COUNT (1 << 20) /* floats per gradient: large enough that a death lands inside a call */
#define MAX_KILLS 8

#define CHECK(cmd)                                                                                            \
  do {                                                                                                        \
    ncclResult_t r_ = (cmd);                                                                                  \
    if (r_ != ncclSuccess) {                                                                                  \
      fprintf(stderr, "elastic: %s failed: %s (%s)\n", #cmd, ncclGetErrorString(r_), ncclGetLastError(NULL)); \
      exit(1);                                                                                                \
    }                                                                                                         \
  } while (0)

struct handoff { /* what a replacement needs: the grow id and the step to resume at */
  ncclUniqueId id;
  int step;
};

static void handoff_path(char* p, size_t n, const char* dir, int k) { snprintf(p, n, "%s/grow-%d", dir, k); }

static void handoff_put(const char* dir, int k, const struct handoff* h) {
  char tmp[4200], path[4200];
  snprintf(tmp, sizeof tmp, "%s/.grow-%d.%d", dir, k, (int)getpid());
  handoff_path(path, sizeof path, dir, k);
  FILE* f = fopen(tmp, "wb");
  if (!f || fwrite(h, sizeof(*h), 1, f) != 1 || fclose(f) != 0 || rename(tmp, path) != 0) { /* whole, or nothing */
    perror("elastic: writing the grow id");
    exit(1);
  }
}

static struct handoff handoff_get(const char* dir, int k) {
  char path[4200];
  handoff_path(path, sizeof path, dir, k);
  struct handoff h;
  for (int ms = 0; ms < 120000; ms += 10) {
    FILE* f = fopen(path, "rb");
    if (f) {
      size_t got = fread(&h, sizeof(h), 1, f);
      fclose(f);
      if (got == 1) return h;
    }
    usleep(10000);
  }
  fprintf(stderr, "elastic: no grow id in %s after 120 s\n", path);
  exit(1);
}

static void* die_soon(void* arg) {
  (void)arg;
  usleep(2000); /* inside the AllReduce just issued */
  raise(SIGKILL);
  return NULL;
}

/* Everyone takes rank 0's step and weights. The survivors need not agree before this: the dead rank may
 * have done its part of the failed step for some of them, who then finished it (and applied it). */
static int sync_state(ncclComm_t comm, float* w, int step) {
  int s = step;
  CHECK(ncclGroupStart());
  CHECK(ncclBroadcast(&s, &s, 1, ncclInt32, 0, comm, NULL));
  CHECK(ncclBroadcast(w, w, COUNT, ncclFloat, 0, comm, NULL));
  CHECK(ncclGroupEnd());
  return s;
}

int main(int argc, char** argv) {
  setvbuf(stdout, NULL, _IOLBF, 0); /* lines out before a SIGKILL */
  int steps = argc > 1 ? atoi(argv[1]) : 20;
  int kill_step[MAX_KILLS] = {5, 12}, kill_rank[MAX_KILLS] = {1, -1}, nkills = 2; /* -1: the last rank */
  if (argc > 2) {
    nkills = 0;
    for (char* t = strtok(argv[2], ","); t && nkills < MAX_KILLS; t = strtok(NULL, ","))
      if (sscanf(t, "%d:%d", &kill_step[nkills], &kill_rank[nkills]) == 2) nkills++;
  }
  int rank = 0, n = 1, lr, ln;
  CHECK(chorusEnvRankInfo(&rank, &n, &lr, &ln));
  const char* g = getenv("CHORUS_RESPAWN");
  const char* dir = getenv("CHORUS_ELASTIC_DIR");
  int deaths = g ? atoi(g) : 0; /* failures the job has been through, as this process knows them */
  if (nkills && !dir) {
    fprintf(stderr, "elastic: run under chorusrun --respawn K (CHORUS_ELASTIC_DIR is not set)\n");
    return 2;
  }

  float* w = calloc(COUNT, sizeof(float)); /* the weights */
  float* grad = malloc(COUNT * sizeof(float));
  ncclComm_t comm;
  int step = 0;
  if (deaths == 0) {
    CHECK(chorusInitFromEnv(&comm));
  } else { /* a replacement: the last rank of the grown communicator */
    struct handoff h = handoff_get(dir, deaths);
    CHECK(ncclCommGrow(NULL, n, &h.id, n - 1, &comm, NULL));
    rank = n - 1;
    step = sync_state(comm, w, h.step);
    printf("elastic: replacement %d joined as rank %d at step %d\n", deaths, rank, step);
  }

  while (step < steps) {
    for (int i = 0; i < COUNT; i++) grad[i] = (float)(1 + i % 7); /* every rank's gradient, alike */
    if (deaths < nkills && step == kill_step[deaths] && rank == (kill_rank[deaths] < 0 ? n - 1 : kill_rank[deaths])) {
      pthread_t t;
      pthread_create(&t, NULL, die_soon, NULL);
    }
    ncclResult_t r = ncclAllReduce(grad, grad, COUNT, ncclFloat, ncclSum, comm, NULL);
    if (r == ncclSuccess) {
      for (int i = 0; i < COUNT; i++) w[i] += grad[i] / (float)n;
      step++;
      continue;
    }
    if (r != ncclRemoteError) CHECK(r);
    /* A rank is gone: shrink it away, then grow back with its replacement, and redo this step. */
    int dead = -1;
    CHECK(chorusCommGetLostRank(comm, &dead));
    printf("elastic: rank %d: step %d failed, rank %d is gone; shrinking and growing back\n", rank, step, dead);
    ncclComm_t small, grown;
    CHECK(ncclCommShrink(comm, &dead, 1, &small, NULL, NCCL_SHRINK_ABORT));
    CHECK(ncclCommDestroy(comm));
    CHECK(ncclCommUserRank(small, &rank));
    deaths++;
    ncclUniqueId id;
    if (rank == 0) {
      struct handoff h = {.step = step};
      CHECK(ncclCommGetUniqueId(small, &id));
      h.id = id;
      handoff_put(dir, deaths, &h);
    }
    CHECK(ncclCommGrow(small, n, rank == 0 ? &id : NULL, -1, &grown, NULL));
    CHECK(ncclCommDestroy(small));
    comm = grown;
    step = sync_state(comm, w, step);
  }

  int bad = 0;
  for (int i = 0; i < COUNT && !bad; i++) bad = w[i] != (float)steps * (float)(1 + i % 7);
  printf("elastic: rank %d of %d: %d steps, %d rank(s) replaced, weights %s\n", rank, n, steps, deaths,
         bad ? "WRONG" : "as expected");
  CHECK(ncclCommDestroy(comm));
  free(w), free(grad);
  return bad;
}
