/* chorusInitFromEnv: one call that works under chorusrun, torchrun, Open MPI (mpirun), PMI and Slurm.
 * Launcher variables describe the job rather than tune the library, so they are read here, in one
 * place, fresh on every call (not through the cached tunables table). */
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "chorus.h"
#include "../misc/log.h"
#include "../misc/param.h"
#include "../misc/utils.h"
#include "../bootstrap/bootstrap.h"
#include "api.h"

/* The first of names that is set: 1 with its value, 0 if none is set, -1 (WARNed) if it is not an int:
 * never a later launcher's variable instead, nor a silent rank 0 of 1. */
static int env_int(const char* const* names, int* out) {
  for (int i = 0; names[i]; i++) {
    const char* v = getenv(names[i]);
    if (v && *v) {
      char* end;
      errno = 0;
      long x = strtol(v, &end, 10);
      if (*end == 0 && errno == 0 && x >= INT_MIN && x <= INT_MAX) {
        *out = (int)x;
        return 1;
      }
      WARN("%s=%s is not a number Chorus can use", names[i], v);
      return -1;
    }
  }
  return 0;
}

static const char* const RANK_VARS[] = {"RANK", "OMPI_COMM_WORLD_RANK", "PMI_RANK", "PMIX_RANK", "SLURM_PROCID", 0};
static const char* const SIZE_VARS[] = {"WORLD_SIZE", "OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "SLURM_NTASKS", 0};
static const char* const LRANK_VARS[] = {"LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID",
                                         "SLURM_LOCALID", 0};
static const char* const LSIZE_VARS[] = {"LOCAL_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_SIZE", "MPI_LOCALNRANKS", 0};

CH_API(ncclResult_t, chorusEnvRankInfo, int* rank, int* nranks, int* localRank, int* localNranks) {
  int r, n, lr, ln;
  int hr = env_int(RANK_VARS, &r), hn = env_int(SIZE_VARS, &n);
  if (hr < 0 || hn < 0) return ncclInvalidUsage; /* WARNed */
  if (!hr || !hn) {
    /* Not an error by itself: tools ask this to learn whether a launcher started them. */
    INFO(LOG_INIT, "chorusEnvRankInfo: no launcher rank/size in the environment");
    return ncclInvalidUsage;
  }
  if (n < 1 || r < 0 || r >= n) {
    WARN("chorusEnvRankInfo: launcher says rank %d of %d, which is not valid", r, n);
    return ncclInvalidUsage;
  }
  int hlr = env_int(LRANK_VARS, &lr), hln = env_int(LSIZE_VARS, &ln);
  if (hlr < 0 || hln < 0) return ncclInvalidUsage; /* WARNed */
  if (!hlr) lr = r;
  if (!hln) ln = n;
  if (rank) *rank = r;
  if (nranks) *nranks = n;
  if (localRank) *localRank = lr;
  if (localNranks) *localNranks = ln;
  return ncclSuccess;
}

/* Where rank 0 runs the bootstrap root. */
static int root_address(int nranks, int local_nranks, int local_known, char* out, size_t len) {
  if (param_is_set(PARAM_COMM_ID)) {
    snprintf(out, len, "%s", param_str(PARAM_COMM_ID));
    return 1;
  }
  const char* addr = getenv("MASTER_ADDR");
  const char* port = getenv("MASTER_PORT");
  if (addr && port) {
    /* torchrun's own store listens on MASTER_PORT; the root takes the next port. */
    char* end;
    errno = 0;
    long p = strtol(port, &end, 10);
    if (!*port || *end || errno || p < 1 || p > 65534) {
      WARN("chorusInitFromEnv: MASTER_PORT=%s is not a port below 65535 (the bootstrap root takes the next one)",
           port);
      return -1;
    }
    int v6 = strchr(addr, ':') && addr[0] != '['; /* an IPv6 literal takes brackets before the port */
    snprintf(out, len, v6 ? "[%s]:%ld" : "%s:%ld", addr, p + 1);
    return 1;
  }
  /* Everything on this host (mpirun/srun on one node): derive a port from the job's identity. A
   * launcher that gave a local size said so; Slurm gives none, only how many nodes the step has
   * (an mpirun inside a multi-node allocation inherits SLURM_NNODES but says its local size). */
  int nodes = 1;
  const char* const NODE_VARS[] = {"SLURM_STEP_NUM_NODES", "SLURM_NNODES", 0};
  int one_host = nranks == local_nranks;
  if (one_host && !local_known && env_int(NODE_VARS, &nodes) != 0 && nodes != 1) one_host = 0;
  if (one_host) {
    /* PMI_ID is not one: under Hydra it is each process's own id. */
    const char* const JOB_VARS[] = {"PMIX_NAMESPACE", "OMPI_MCA_orte_jobid", "OMPI_MCA_ess_base_jobid",
                                    "SLURM_JOB_ID", 0};
    for (int i = 0; JOB_VARS[i]; i++) {
      const char* v = getenv(JOB_VARS[i]);
      if (!v || !*v) continue;
      char key[256];
      snprintf(key, sizeof(key), "%s/%s", v, getenv("SLURM_STEP_ID") ? getenv("SLURM_STEP_ID") : "");
      /* Below Linux's ephemeral range (32768-60999 by default): a port some connection took for itself
       * there made rank 0's bind fail now and then (envinit.init_under_openmpi_vars in CI). */
      snprintf(out, len, "127.0.0.1:%d", 20000 + (int)(ut_hash(key, strlen(key), 7) % 12000));
      return 1;
    }
  }
  return 0;
}

CH_API(ncclResult_t, chorusInitFromEnv, ncclComm_t* comm) {
  if (!comm) {
    WARN("chorusInitFromEnv: comm is NULL");
    return ncclInvalidArgument;
  }
  int rank, nranks, lr, ln;
  ncclResult_t r = chorusEnvRankInfo(&rank, &nranks, &lr, &ln);
  if (r != ncclSuccess) {
    WARN("chorusInitFromEnv: no launcher rank/size found: set RANK and WORLD_SIZE, or launch with chorusrun, "
         "torchrun, mpirun or srun");
    return r;
  }
  char addr[256];
  int unused, local_known = env_int(LSIZE_VARS, &unused) > 0;
  int found = root_address(nranks, ln, local_known, addr, sizeof(addr));
  if (found < 0) return ncclInvalidUsage; /* WARNed */
  if (!found) {
    WARN("chorusInitFromEnv: rank %d of %d cannot tell where the bootstrap root is: set NCCL_COMM_ID=host:port "
         "(or MASTER_ADDR and MASTER_PORT) to an address of rank 0's host", rank, nranks);
    return ncclInvalidUsage;
  }
  ncclUniqueId id;
  memset(&id, 0, sizeof(id));
  ch_status s = boot_id_from_addr(addr, id.internal);
  if (s != CH_OK) return ch_to_nccl(s);
  INFO(LOG_INIT, "chorusInitFromEnv: rank %d of %d (local %d of %d), root %s", rank, nranks, lr, ln, addr);
  const char* secret = getenv("CHORUS_SECRET");
  if (nranks != ln && !(secret && *secret) && !param_str(PARAM_SECRET_FILE)[0])
    INFO(LOG_INIT, "chorusInitFromEnv: this job spans hosts and has no CHORUS_SECRET or CHORUS_SECRET_FILE: ranks on "
         "other hosts are admitted without proof (docs/SECURITY.md)");
  return ncclCommInitRank(comm, nranks, id, rank);
}
