/* How a benchmark process joins a job and runs its threads.
 *
 *  - Under a launcher (chorusrun, mpirun, srun, torchrun): rank and world size come from the
 *    environment (chorusEnvRankInfo) and the communicator from chorusInitFromEnv. With -t/-g > 1
 *    that communicator only hands out a fresh unique id for the processes x threads x ranks job.
 *  - With -np N (ours): this process forks N workers, creates the unique id and passes it to them
 *    through pipes, then supervises them: the first failure ends the others.
 *  - Otherwise one process runs threads x ranks in-process (ncclGroupStart, ncclCommInitRank for
 *    each rank, ncclGroupEnd, as nccl-tests does). */
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include "harness.h"
#include "output.h"

static int64_t rss_bytes(const char* key) {
  FILE* f = fopen("/proc/self/status", "r");
  if (!f) return 0;
  char line[256];
  long long kb = 0;
  size_t n = strlen(key);
  while (fgets(line, sizeof line, f))
    if (strncmp(line, key, n) == 0) sscanf(line + n, " %lld", &kb);
  fclose(f);
  return kb * 1024;
}

static double mem_available(void) {
  FILE* f = fopen("/proc/meminfo", "r");
  if (!f) return -1;
  char line[256];
  long long kb = -1;
  while (fgets(line, sizeof line, f))
    if (strncmp(line, "MemAvailable:", 13) == 0) sscanf(line + 13, " %lld", &kb);
  fclose(f);
  return kb < 0 ? -1 : (double)kb * 1024;
}

/* ---------------------------------------------------------------- -np: fork and supervise ---- */

static pid_t* sup_pids;
static int sup_n;

static void sup_forward(int sig) {
  for (int i = 0; i < sup_n; i++)
    if (sup_pids[i] > 0) kill(sup_pids[i], sig);
}

static void sup_signal_all(int sig, const int* alive) {
  for (int i = 0; i < sup_n; i++)
    if (alive[i]) kill(sup_pids[i], sig);
}

/* Returns -1 in a worker (which goes on as process ctx->proc), or the exit code in the supervisor. */
static int fork_workers(perf_ctx* ctx) {
  int n = ctx->o.np;
  int* wfd = calloc((size_t)n, sizeof(int));
  int* alive = calloc((size_t)n, sizeof(int));
  sup_pids = calloc((size_t)n, sizeof(pid_t));
  if (!wfd || !alive || !sup_pids) {
    fprintf(stderr, "%s: out of memory\n", ctx->prog);
    return PERF_INTERNAL;
  }
  fflush(stdout);
  for (int i = 0; i < n; i++) {
    int p[2];
    if (pipe(p) != 0) {
      fprintf(stderr, "%s: pipe: %s\n", ctx->prog, strerror(errno));
      sup_n = i, sup_signal_all(SIGKILL, alive);
      return PERF_INTERNAL;
    }
    pid_t pid = fork();
    if (pid < 0) {
      fprintf(stderr, "%s: fork: %s\n", ctx->prog, strerror(errno));
      sup_n = i, sup_signal_all(SIGKILL, alive);
      return PERF_INTERNAL;
    }
    if (pid == 0) {
      prctl(PR_SET_PDEATHSIG, SIGTERM); /* do not outlive the supervisor */
      for (int k = 0; k < i; k++) close(wfd[k]);
      close(p[1]);
      ssize_t got = 0;
      while (got < (ssize_t)sizeof(ctx->id)) {
        ssize_t r = read(p[0], (char*)&ctx->id + got, sizeof(ctx->id) - (size_t)got);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) _exit(PERF_INTERNAL); /* the supervisor failed before sending the id */
        got += r;
      }
      close(p[0]);
      ctx->proc = ctx->local_proc = i;
      ctx->nprocs = n;
      free(wfd), free(alive);
      return -1;
    }
    close(p[0]);
    wfd[i] = p[1];
    sup_pids[i] = pid;
    alive[i] = 1;
  }
  sup_n = n;
  struct sigaction sa = {0};
  sa.sa_handler = sup_forward;
  sigaction(SIGINT, &sa, NULL);
  sigaction(SIGTERM, &sa, NULL);
  signal(SIGPIPE, SIG_IGN);

  /* The id (and with it the bootstrap root) belongs to the supervisor, which outlives every worker. */
  ncclResult_t r = ncclGetUniqueId(&ctx->id);
  if (r != ncclSuccess) {
    fprintf(stderr, "%s: ncclGetUniqueId failed: %s\n", ctx->prog, ncclGetErrorString(r));
    sup_signal_all(SIGKILL, alive);
  } else {
    for (int i = 0; i < n; i++) {
      if (write(wfd[i], &ctx->id, sizeof(ctx->id)) != (ssize_t)sizeof(ctx->id)) { /* worker died: seen below */
      }
      close(wfd[i]);
    }
  }

  int rc = r == ncclSuccess ? PERF_OK : PERF_NCCL, left = n, first = -1;
  uint64_t deadline = 0; /* after the first failure: when to escalate */
  int stage = 0;         /* 0 running, 1 waiting for the rest, 2 sent SIGTERM, 3 sent SIGKILL */
  while (left > 0) {
    int st;
    pid_t pid = waitpid(-1, &st, WNOHANG);
    if (pid < 0 && errno != EINTR) break;
    if (pid > 0) {
      int i = 0;
      while (i < n && sup_pids[i] != pid) i++;
      if (i == n) continue;
      alive[i] = 0;
      left--;
      int code = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
      if (WIFSIGNALED(st) && stage < 2)
        fprintf(stderr, "%s: process %d (pid %d) killed by signal %d (%s)\n", ctx->prog, i, (int)pid, WTERMSIG(st),
                strsignal(WTERMSIG(st)));
      if (code != 0 && first < 0) {
        first = i, rc = code;
        stage = 1, deadline = perf_now_ns() + 2000000000ull; /* let the others fail on their own first */
      }
      continue;
    }
    if (stage > 0 && stage < 3 && perf_now_ns() > deadline) {
      if (stage == 1)
        fprintf(stderr, "%s: process %d failed (exit code %d); stopping the %d remaining processes\n", ctx->prog, first,
                rc, left);
      sup_signal_all(stage == 1 ? SIGTERM : SIGKILL, alive);
      stage++;
      deadline = perf_now_ns() + 2000000000ull;
    }
    usleep(10000);
  }
  free(wfd), free(alive);
  return rc;
}

/* ---------------------------------------------------------------- communicators and threads ---- */

static void init_ranks(perf_ctx* ctx, int first, int count) {
  int per_proc = ctx->o.nthreads * ctx->o.ngpus;
  if (count > 1) PERF_NCCL_CHECK(ctx, ncclGroupStart());
  for (int k = first; k < first + count; k++) {
    int rank = ctx->proc * per_proc + k;
    if (ctx->o.cta_policy >= 0) {
      ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
      cfg.CTAPolicy = ctx->o.cta_policy;
      PERF_NCCL_CHECK(ctx, ncclCommInitRankConfig(&ctx->comms[k], ctx->nranks, ctx->id, rank, &cfg));
    } else {
      PERF_NCCL_CHECK(ctx, ncclCommInitRank(&ctx->comms[k], ctx->nranks, ctx->id, rank));
    }
  }
  if (count > 1) PERF_NCCL_CHECK(ctx, ncclGroupEnd());
}

/* Under a launcher: the environment's communicator, or a new id spread through it. */
static void init_from_env(perf_ctx* ctx) {
  if (ctx->o.nthreads * ctx->o.ngpus == 1) {
    PERF_NCCL_CHECK(ctx, chorusInitFromEnv(&ctx->comms[0]));
    return;
  }
  ncclComm_t boot;
  PERF_NCCL_CHECK(ctx, chorusInitFromEnv(&boot));
  /* Spread rank 0's id by send/recv, as all bookkeeping (common.c): NCCL_ALGO may rule out collectives. */
  perf_team t = {.ctx = ctx, .comms = &boot, .nlocal = 1};
  PERF_NCCL_CHECK(ctx, ncclCommUserRank(boot, &t.rank0));
  PERF_NCCL_CHECK(ctx, ncclCommCount(boot, &t.nranks));
  memset(&ctx->id, 0, sizeof(ctx->id));
  if (t.rank0 == 0) PERF_NCCL_CHECK(ctx, ncclGetUniqueId(&ctx->id));
  perf_team_bcast(&t, (char*)&ctx->id, 0, sizeof(ctx->id));
  PERF_NCCL_CHECK(ctx, ncclCommFinalize(boot));
  PERF_NCCL_CHECK(ctx, ncclCommDestroy(boot));
  if (!ctx->o.parallel_init) init_ranks(ctx, 0, ctx->o.nthreads * ctx->o.ngpus);
}

void perf_thread_buffers(perf_thread* th) {
  perf_ctx* ctx = th->ctx;
  size_t bytes = ctx->o.max_bytes + (size_t)ctx->o.unalign * 8 + 64;
  __atomic_store_n(&ctx->buf_bytes, bytes, __ATOMIC_RELAXED); /* every thread stores the same value */
  for (int i = 0; i < th->nlocal; i++) {
    for (int k = 0; k < 2; k++) {
      void* p = NULL;
      /* With -R, as nccl-tests: ncclMemAlloc, which other processes can map (single-copy collectives);
       * with --device it gives device memory (this thread has a current CUDA context). */
      if (ctx->o.reg) PERF_NCCL_CHECK(ctx, ncclMemAlloc(&p, bytes));
      else if (ctx->o.device) p = perf_cuda_alloc(ctx, bytes);
      else if (posix_memalign(&p, 64, bytes) != 0) perf_fail_msg(ctx, PERF_INTERNAL, "cannot allocate %zu bytes", bytes);
      if (!ctx->o.device) memset(p, 0, bytes); /* first touch by the thread that uses it */
      th->allocs[2 * i + k] = p;
    }
    th->send[i] = th->allocs[2 * i];
    th->recv[i] = th->allocs[2 * i + 1];
    if (ctx->o.device) { /* where data is made and checked (copied to and from the device) */
      th->hsend[i] = calloc(1, bytes);
      th->hrecv[i] = calloc(1, bytes);
      if (!th->hsend[i] || !th->hrecv[i]) perf_fail_msg(ctx, PERF_INTERNAL, "cannot allocate %zu bytes", bytes);
    }
  }
  if (ctx->o.reg == 2) PERF_NCCL_CHECK(ctx, ncclGroupStart());
  for (int i = 0; ctx->o.reg && i < th->nlocal; i++) {
    for (int k = 0; k < 2; k++) {
      if (ctx->o.reg == 1)
        PERF_NCCL_CHECK(ctx, ncclCommRegister(th->comms[i], th->allocs[2 * i + k], bytes, &th->handles[2 * i + k]));
      else
        PERF_NCCL_CHECK(ctx, ncclCommWindowRegister(th->comms[i], th->allocs[2 * i + k], bytes,
                                                    (ncclWindow_t*)&th->handles[2 * i + k], NCCL_WIN_COLL_SYMMETRIC));
    }
  }
  if (ctx->o.reg == 2) PERF_NCCL_CHECK(ctx, ncclGroupEnd());
  if (th->thread == 0) ctx->mem_user = (int64_t)bytes * 2 * ctx->o.nthreads * ctx->o.ngpus;
}

static void thread_cleanup(perf_thread* th) {
  perf_ctx* ctx = th->ctx;
  for (int i = 0; ctx->o.reg && i < th->nlocal; i++)
    for (int k = 0; k < 2; k++) {
      if (ctx->o.reg == 1) PERF_NCCL_CHECK(ctx, ncclCommDeregister(th->comms[i], th->handles[2 * i + k]));
      else PERF_NCCL_CHECK(ctx, ncclCommWindowDeregister(th->comms[i], (ncclWindow_t)th->handles[2 * i + k]));
    }
  for (int i = 0; i < th->nlocal; i++)
    if (th->streams[i] && ctx->o.device) perf_cuda_stream_destroy(ctx, th->streams[i]);
    else if (th->streams[i]) PERF_NCCL_CHECK(ctx, chorusStreamDestroy(th->streams[i]));
  /* Finalize together (it waits for the peers), then free locally. */
  if (th->nlocal > 1) PERF_NCCL_CHECK(ctx, ncclGroupStart());
  for (int i = 0; i < th->nlocal; i++) PERF_NCCL_CHECK(ctx, ncclCommFinalize(th->comms[i]));
  if (th->nlocal > 1) PERF_NCCL_CHECK(ctx, ncclGroupEnd());
  for (int i = 0; i < th->nlocal; i++) PERF_NCCL_CHECK(ctx, ncclCommDestroy(th->comms[i]));
  for (int i = 0; i < 2 * th->nlocal; i++) {
    if (ctx->o.reg) PERF_NCCL_CHECK(ctx, ncclMemFree(th->allocs[i]));
    else if (ctx->o.device) perf_cuda_free(ctx, th->allocs[i]);
    else free(th->allocs[i]);
  }
  for (int i = 0; ctx->o.device && i < th->nlocal; i++) free(th->hsend[i]), free(th->hrecv[i]);
}

static void* thread_entry(void* arg) {
  perf_thread* th = arg;
  perf_ctx* ctx = th->ctx;
  if (ctx->o.device) perf_cuda_bind(ctx, ctx->local_proc * ctx->o.nthreads + th->thread);
  if (ctx->o.parallel_init) init_ranks(ctx, th->thread * th->nlocal, th->nlocal);
  if (ctx->o.device && !ctx->o.stream_null)
    for (int i = 0; i < th->nlocal; i++) th->streams[i] = perf_cuda_stream(ctx);
  else if (ctx->o.streams && !ctx->o.stream_null)
    for (int i = 0; i < th->nlocal; i++) PERF_NCCL_CHECK(ctx, chorusStreamCreate(&th->streams[i]));
  perf_thread_main(th);
  thread_cleanup(th);
  return NULL;
}

/* -T: nccl-tests aborts when a stream does not finish in time; here any thread that makes no
 * progress for that long ends the process with exit code 4. */
static void* watchdog(void* arg) {
  perf_ctx* ctx = arg;
  uint64_t limit = (uint64_t)ctx->o.timeout_s * 1000000000ull;
  int nt = ctx->o.nthreads;
  uint64_t* seen = calloc((size_t)nt * 2, sizeof(uint64_t)); /* per thread: count, when it changed */
  if (!seen) perf_fail_msg(ctx, PERF_INTERNAL, "out of memory");
  for (int t = 0; t < nt; t++) seen[2 * t + 1] = perf_now_ns();
  for (;;) {
    usleep(50000);
    uint64_t now = perf_now_ns();
    for (int t = 0; t < nt; t++) {
      uint64_t p = __atomic_load_n(&ctx->progress[t].n, __ATOMIC_RELAXED);
      if (p != seen[2 * t]) seen[2 * t] = p, seen[2 * t + 1] = now;
      if (__atomic_load_n(&ctx->busy[t], __ATOMIC_RELAXED) && now - seen[2 * t + 1] > limit)
        perf_fail_msg(ctx, PERF_TIMEOUT, "Test timeout (%ds): thread %d (ranks %d-%d) made no progress",
                      ctx->o.timeout_s,
                      t, (ctx->proc * ctx->o.nthreads + t) * ctx->o.ngpus,
                      (ctx->proc * ctx->o.nthreads + t + 1) * ctx->o.ngpus - 1);
    }
  }
  return NULL;
}

static int run_process(perf_ctx* ctx, int env_mode, int local_procs, int argc, char** argv) {
  const perf_opts* o = &ctx->o;
  int nt = o->nthreads, nl = o->ngpus, per_proc = nt * nl;
  ctx->nranks = ctx->nprocs * per_proc;
  ctx->is_main = ctx->proc == 0;
  if (ctx->is_main && o->json_path) out_json_open(o->json_path, argc, argv);
  const char* mb = getenv("NCCL_TESTS_MIN_BW");
  ctx->min_bw = mb ? atof(mb) : -1;
  /* Two buffers per rank on this host, and 1 GiB left for everything else. */
  double avail = mem_available(); /* -1: unknown, then no cap; less than 1 GiB: the smallest cap */
  ctx->mem_cap = avail < 0 ? -1 : (avail - (double)(1u << 30)) / (2.0 * local_procs * per_proc);
  if (avail >= 0 && ctx->mem_cap < 64) ctx->mem_cap = 64;

  ctx->comms = calloc((size_t)per_proc, sizeof(ncclComm_t));
  ctx->progress = aligned_alloc(64, (size_t)nt * sizeof(*ctx->progress));
  if (ctx->progress) memset(ctx->progress, 0, (size_t)nt * sizeof(*ctx->progress));
  ctx->busy = calloc((size_t)nt, sizeof(int));
  perf_thread* th = calloc((size_t)nt, sizeof(*th));
  if (!ctx->comms || !ctx->progress || !ctx->busy || !th) perf_fail_msg(ctx, PERF_INTERNAL, "out of memory");
  for (int t = 0; t < nt; t++) ctx->busy[t] = 1;
  pthread_barrier_init(&ctx->threads_met, NULL, (unsigned)nt);
  pthread_t wd;
  if (o->timeout_s > 0) {
    pthread_create(&wd, NULL, watchdog, ctx);
    pthread_detach(wd);
  }

  ctx->mem_base = rss_bytes("VmRSS:");
  if (o->device) perf_cuda_open(ctx);
  if (o->device && !o->parallel_init) perf_cuda_bind(ctx, ctx->local_proc * nt); /* the inits run here */
  if (env_mode) init_from_env(ctx);
  else if (!o->parallel_init) init_ranks(ctx, 0, per_proc);
  ctx->mem_init = rss_bytes("VmRSS:") - ctx->mem_base;

  int scratch_len = o->iters > 16 ? o->iters : 16;
  for (int t = 0; t < nt; t++) {
    perf_thread* x = &th[t];
    x->ctx = ctx;
    x->thread = t;
    x->nlocal = nl;
    x->rank0 = (ctx->proc * nt + t) * nl;
    x->comms = ctx->comms + t * nl;
    x->streams = calloc((size_t)nl, sizeof(cudaStream_t));
    x->send = calloc((size_t)nl, sizeof(char*));
    x->recv = calloc((size_t)nl, sizeof(char*));
    x->allocs = calloc(2 * (size_t)nl, sizeof(void*));
    x->hsend = calloc((size_t)nl, sizeof(char*));
    x->hrecv = calloc((size_t)nl, sizeof(char*));
    x->handles = calloc(2 * (size_t)nl, sizeof(void*));
    x->scratch_len = scratch_len;
    x->scratch = calloc((size_t)(nl + 2) * (size_t)scratch_len, sizeof(double));
    x->inbox = calloc((size_t)nl * (size_t)scratch_len, sizeof(double));
    if (!x->streams || !x->send || !x->recv || !x->allocs || !x->hsend || !x->hrecv || !x->handles || !x->scratch ||
        !x->inbox)
      perf_fail_msg(ctx, PERF_INTERNAL, "out of memory");
  }
  for (int t = 1; t < nt; t++)
    if (pthread_create(&th[t].tid, NULL, thread_entry, &th[t]) != 0)
      perf_fail_msg(ctx, PERF_INTERNAL, "cannot start thread %d", t);
  thread_entry(&th[0]);
  for (int t = 1; t < nt; t++) pthread_join(th[t].tid, NULL);

  if (ctx->is_main) {
    if (o->mem_report) {
      int64_t peak = rss_bytes("VmHWM:") - ctx->mem_base - ctx->mem_init - ctx->mem_user;
      out_mem_report(ctx->mem_init, ctx->mem_user, peak > 0 ? peak : 0);
    }
    out_finish(NULL); /* errors end the run earlier, with their own message */
    if (o->plot_path && out_plot(o->plot_path) == 0) fprintf(stderr, "# Plot written to %s\n", o->plot_path);
  }
  for (int t = 0; t < nt; t++) {
    free(th[t].streams), free(th[t].send), free(th[t].recv);
    free(th[t].allocs), free(th[t].handles), free(th[t].scratch), free(th[t].inbox);
    free(th[t].hsend), free(th[t].hrecv);
  }
  free(th);
  free(ctx->comms);
  return ctx->result;
}

int perf_main(int argc, char** argv, const perf_coll* coll) {
  setlinebuf(stdout);
  static perf_ctx ctx; /* static: the watchdog and failure paths reach it from any thread */
  ctx.coll = coll;
  ctx.prog = strrchr(argv[0], '/') ? strrchr(argv[0], '/') + 1 : argv[0];
  int rc = perf_parse_args(argc, argv, &ctx.o, coll);
  if (rc >= 0) return rc;
  perf_wire_use(getenv("CHORUS_WIRE_FORMAT")); /* set here, or by --wire */
  out_init(&ctx.o, ctx.prog);
  ctx.nprocs = 1;

  int erank = 0, enranks = 1, elocal = 0, elocaln = 1, env_mode = 0, local_procs = 1;
  if (chorusEnvRankInfo(&erank, &enranks, &elocal, &elocaln) == ncclSuccess && enranks > 1) {
    if (ctx.o.np) {
      fprintf(stderr, "%s: -np cannot be used under a launcher (this process is rank %d of %d)\n", ctx.prog, erank,
              enranks);
      return PERF_BAD_ARGS;
    }
    env_mode = 1;
    ctx.proc = erank, ctx.nprocs = enranks, ctx.local_proc = elocal;
    local_procs = elocaln > 0 ? elocaln : 1;
  } else if (ctx.o.np) {
    rc = fork_workers(&ctx);
    if (rc >= 0) return rc; /* supervisor */
    local_procs = ctx.nprocs;
  } else {
    PERF_NCCL_CHECK(&ctx, ncclGetUniqueId(&ctx.id));
  }
  return run_process(&ctx, env_mode, local_procs, argc, argv);
}
