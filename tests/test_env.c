/* chorusEnvRankInfo / chorusInitFromEnv under the variables of each launcher: chorusrun and torchrun
 * (RANK, WORLD_SIZE, MASTER_ADDR/PORT), Open MPI (OMPI_COMM_WORLD_*), Slurm (SLURM_PROCID...). */
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "chorus.h"
#include "misc/param.h"
#include "runner.h"

static const char* const ALL_VARS[] = {"RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR",
                                       "MASTER_PORT", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE",
                                       "OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_SIZE", "PMI_RANK",
                                       "PMI_SIZE", "PMIX_RANK", "PMIX_NAMESPACE", "SLURM_PROCID", "SLURM_NTASKS",
                                       "SLURM_LOCALID", "SLURM_JOB_ID", "SLURM_STEP_ID", "NCCL_COMM_ID", "SLURM_NNODES",
                                       "SLURM_STEP_NUM_NODES", "PMI_ID", 0};

static void clear_env(void) {
  for (int i = 0; ALL_VARS[i]; i++) unsetenv(ALL_VARS[i]);
  param_reset();
}

static void setint(const char* k, int v) {
  char b[32];
  snprintf(b, sizeof(b), "%d", v);
  setenv(k, b, 1);
}

TEST(envinit, rank_info_from_each_launcher) {
  int r, n, lr, ln;
  clear_env();
  EXPECT_EQ(chorusEnvRankInfo(&r, &n, &lr, &ln), ncclInvalidUsage);
  setenv("RANK", "3", 1), setenv("WORLD_SIZE", "8", 1), setenv("LOCAL_RANK", "1", 1);
  NCCL_OK(chorusEnvRankInfo(&r, &n, &lr, &ln));
  EXPECT(r == 3 && n == 8 && lr == 1 && ln == 8);
  clear_env();
  setenv("OMPI_COMM_WORLD_RANK", "2", 1), setenv("OMPI_COMM_WORLD_SIZE", "4", 1);
  setenv("OMPI_COMM_WORLD_LOCAL_RANK", "0", 1), setenv("OMPI_COMM_WORLD_LOCAL_SIZE", "2", 1);
  NCCL_OK(chorusEnvRankInfo(&r, &n, &lr, &ln));
  EXPECT(r == 2 && n == 4 && lr == 0 && ln == 2);
  clear_env();
  setenv("SLURM_PROCID", "5", 1), setenv("SLURM_NTASKS", "6", 1), setenv("SLURM_LOCALID", "1", 1);
  NCCL_OK(chorusEnvRankInfo(&r, &n, &lr, &ln));
  EXPECT(r == 5 && n == 6 && lr == 1);
  clear_env();
  setenv("RANK", "4", 1), setenv("WORLD_SIZE", "4", 1); /* rank out of range */
  EXPECT_EQ(chorusEnvRankInfo(&r, &n, &lr, &ln), ncclInvalidUsage);
  clear_env();
  ncclComm_t comm;
  EXPECT_EQ(chorusInitFromEnv(&comm), ncclInvalidUsage);
  EXPECT_EQ(chorusInitFromEnv(NULL), ncclInvalidArgument);
}

static int free_port(void) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
  socklen_t len = sizeof(a);
  bind(fd, (struct sockaddr*)&a, sizeof(a));
  getsockname(fd, (struct sockaddr*)&a, &len);
  close(fd);
  return ntohs(a.sin_port);
}

/* Launcher values Chorus cannot use are refused with a WARN, never read as something else: a rank
 * number past int (it was rank 0 of 1), a MASTER_PORT with no next port or no number (65536, port
 * 1), a Slurm step over several nodes or a PMI_ID (a per-process id) without a root address (each
 * rank picked its own loopback root and init hung until its timeout). */
TEST(envinit, unusable_launcher_values_refused) {
  int r, n, lr, ln;
  ncclComm_t comm;
  clear_env();
  setenv("RANK", "4294967296", 1), setenv("WORLD_SIZE", "4294967297", 1);
  EXPECT_EQ(chorusEnvRankInfo(&r, &n, &lr, &ln), ncclInvalidUsage);
  clear_env();
  setenv("RANK", "0", 1), setenv("WORLD_SIZE", "2", 1), setenv("MASTER_ADDR", "127.0.0.1", 1);
  setenv("MASTER_PORT", "65535", 1);
  EXPECT_EQ(chorusInitFromEnv(&comm), ncclInvalidUsage);
  setenv("MASTER_PORT", "abc", 1);
  EXPECT_EQ(chorusInitFromEnv(&comm), ncclInvalidUsage);
  clear_env();
  setenv("SLURM_PROCID", "1", 1), setenv("SLURM_NTASKS", "8", 1), setenv("SLURM_LOCALID", "0", 1);
  setenv("SLURM_JOB_ID", "4242", 1), setenv("SLURM_NNODES", "2", 1);
  EXPECT_EQ(chorusInitFromEnv(&comm), ncclInvalidUsage);
  clear_env();
  setenv("PMI_RANK", "1", 1), setenv("PMI_SIZE", "2", 1), setenv("PMI_ID", "1", 1);
  EXPECT_EQ(chorusInitFromEnv(&comm), ncclInvalidUsage);
  clear_env(); /* a bad RANK is refused, not replaced by another launcher's (torchrun inside srun) */
  setenv("RANK", "x1", 1), setenv("WORLD_SIZE", "2", 1), setenv("SLURM_PROCID", "1", 1), setenv("SLURM_NTASKS", "2", 1);
  EXPECT_EQ(chorusEnvRankInfo(&r, &n, &lr, &ln), ncclInvalidUsage);
  clear_env();
}

enum launcher { TORCHRUN, OPENMPI, SLURM, TORCHRUN6 };

/* Two processes initialise from the environment alone and sum their ranks. */
static void run_launcher(enum launcher l) {
  int port = free_port();
  char ns[64];
  snprintf(ns, sizeof(ns), "chorus-test-%d-%d", (int)getpid(), port);
  pid_t kids[2];
  for (int rank = 0; rank < 2; rank++) {
    kids[rank] = fork();
    if (kids[rank] == 0) {
      clear_env();
      if (l == TORCHRUN || l == TORCHRUN6) {
        setint("RANK", rank), setint("WORLD_SIZE", 2), setint("LOCAL_RANK", rank);
        setenv("MASTER_ADDR", l == TORCHRUN6 ? "::1" : "127.0.0.1", 1); /* IPv6: no brackets, as torchrun */
        setint("MASTER_PORT", port - 1);                                  /* root uses PORT + 1 */
      } else if (l == OPENMPI) {
        setint("OMPI_COMM_WORLD_RANK", rank), setint("OMPI_COMM_WORLD_SIZE", 2);
        setint("OMPI_COMM_WORLD_LOCAL_RANK", rank), setint("OMPI_COMM_WORLD_LOCAL_SIZE", 2);
        setenv("PMIX_NAMESPACE", ns, 1); /* one host: the root port derives from the job */
        setenv("SLURM_NNODES", "2", 1);  /* mpirun inside a 2-node allocation: its local size decides */
      } else {
        setint("SLURM_PROCID", rank), setint("SLURM_NTASKS", 2), setint("SLURM_LOCALID", rank);
        setenv("SLURM_JOB_ID", ns, 1), setenv("SLURM_STEP_ID", "0", 1);
      }
      param_reset();
      ncclComm_t comm;
      if (chorusInitFromEnv(&comm) != ncclSuccess) _exit(2);
      int x = rank + 1, n = 0, me = -1;
      if (ncclAllReduce(&x, &x, 1, ncclInt32, ncclSum, comm, NULL) != ncclSuccess) _exit(3);
      ncclCommCount(comm, &n), ncclCommUserRank(comm, &me);
      ncclCommDestroy(comm);
      _exit(x == 3 && n == 2 && me == rank ? 0 : 4);
    }
  }
  for (int rank = 0; rank < 2; rank++) {
    int st = 0;
    waitpid(kids[rank], &st, 0);
    if (!WIFEXITED(st) || WEXITSTATUS(st) != 0)
      rt_fail(__FILE__, __LINE__, "launcher %d: rank %d ended with status 0x%x", (int)l, rank, st);
  }
}

TEST_T(envinit, init_under_torchrun_vars, 30) { run_launcher(TORCHRUN); }
TEST_T(envinit, init_under_openmpi_vars, 30) { run_launcher(OPENMPI); }
TEST_T(envinit, init_under_slurm_vars, 30) { run_launcher(SLURM); }
TEST_T(envinit, init_under_torchrun_vars_ipv6, 30) {
  int fd = socket(AF_INET6, SOCK_STREAM, 0);
  struct sockaddr_in6 a = {.sin6_family = AF_INET6, .sin6_addr = IN6ADDR_LOOPBACK_INIT};
  int ok = fd >= 0 && bind(fd, (struct sockaddr*)&a, sizeof(a)) == 0;
  if (fd >= 0) close(fd);
  if (!ok) {
    printf("    skipped: no IPv6 loopback here\n");
    return;
  }
  run_launcher(TORCHRUN6);
}
