/* NVTX ranges (api/nvtx.c): in a process that uses CUDA (the stand-in driver, cuda_stub/fake_cuda.c)
 * and names a tool in NVTX_INJECTION64_PATH, every public call is one range, pushed and popped on the
 * calling thread, in domain "NCCL", named as NCCL names it ("ncclAllReduce"). The tool is a stand-in
 * (nvtx_stub/nvtx_stub.c) that writes what it is given to a file, one line per event; these tests read
 * that file back. Each test is its own process, so each loads the tool afresh. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "misc/param.h"
#include "nccl.h"
#include "runner.h"

static char out_path[256];

/* As a CUDA application: the driver is loaded and initialised (tests/README.md). */
static void load_fake_cuda(void) {
  void* h = dlopen(CHORUS_FAKE_CUDA, RTLD_NOW | RTLD_GLOBAL);
  ASSERT(h != NULL);
  int (*cu_init)(unsigned);
  *(void**)&cu_init = dlsym(h, "cuInit");
  ASSERT(cu_init != NULL);
  EXPECT_EQ(cu_init(0), 0);
  setenv("CHORUS_CUDA_LIBRARY", CHORUS_FAKE_CUDA, 1);
}

/* tool: NVTX_INJECTION64_PATH (NULL: unset); mode: the stand-in's CHORUS_TEST_NVTX_MODE. */
static void setup(const char* tool, const char* mode, int cuda) {
  const char* tmp = getenv("TMPDIR");
  snprintf(out_path, sizeof(out_path), "%s/chorus-nvtx-%d.txt", tmp && *tmp ? tmp : "/tmp", (int)getpid());
  unlink(out_path);
  setenv("CHORUS_TEST_NVTX_OUT", out_path, 1);
  setenv("CHORUS_TEST_NVTX_MODE", mode, 1);
  if (tool) setenv("NVTX_INJECTION64_PATH", tool, 1);
  else unsetenv("NVTX_INJECTION64_PATH");
  unsetenv("NCCL_NVTX_DISABLE");
  if (cuda) load_fake_cuda();
  else setenv("CHORUS_CUDA_LIBRARY", "libchorus-no-such-driver.so", 1);
  param_reset();
}

/* The calls a rank makes: ranges ncclCommInitRank, ncclAllReduce, ncclBroadcast, ncclGroupStart,
 * ncclSend, ncclRecv, ncclGroupEnd, ncclCommDestroy, in this order. */
#define RANK_SEQ(d)                                                                                                   \
  d ":ncclCommInitRank " d ":ncclAllReduce " d ":ncclBroadcast " d ":ncclGroupStart " d ":ncclSend " d ":ncclRecv " d \
    ":ncclGroupEnd " d ":ncclCommDestroy"
static void rank_body(int rank, int nranks, ncclUniqueId id, void* arg) {
  (void)arg;
  ncclComm_t comm;
  NCCL_OK(ncclCommInitRank(&comm, nranks, id, rank));
  float in[4], out[4];
  for (int i = 0; i < 4; i++) in[i] = (float)(rank + 1);
  NCCL_OK(ncclAllReduce(in, out, 4, ncclFloat, ncclSum, comm, NULL));
  EXPECT(out[3] == (float)(nranks * (nranks + 1) / 2));
  NCCL_OK(ncclBroadcast(in, out, 4, ncclFloat, 0, comm, NULL));
  EXPECT(out[3] == 1.0f);
  NCCL_OK(ncclGroupStart());
  NCCL_OK(ncclSend(in, 4, ncclFloat, (rank + 1) % nranks, comm, NULL));
  NCCL_OK(ncclRecv(out, 4, ncclFloat, (rank + nranks - 1) % nranks, comm, NULL));
  NCCL_OK(ncclGroupEnd());
  EXPECT(out[3] == (float)((rank + nranks - 1) % nranks + 1));
  NCCL_OK(ncclCommDestroy(comm));
}

/* The record, read back: per thread the ranges in push order ("DOMAIN:NAME ..."), every one popped
 * in the same domain, innermost first. */
#define MAX_THREADS 16
struct thr {
  int pid;
  long tid;
  char seq[2048];
  int depth;
  char open[16][64]; /* the domains of the ranges still open */
};
struct record {
  int lines, inits, bad, modules, malformed, domains, strings, nthreads;
  struct thr t[MAX_THREADS];
};

static struct thr* thread_of(struct record* r, int pid, long tid) {
  for (int i = 0; i < r->nthreads; i++)
    if (r->t[i].pid == pid && r->t[i].tid == tid) return &r->t[i];
  if (r->nthreads == MAX_THREADS) return NULL;
  struct thr* t = &r->t[r->nthreads++];
  memset(t, 0, sizeof(*t));
  t->pid = pid, t->tid = tid;
  return t;
}

static void read_record(struct record* r) {
  memset(r, 0, sizeof(*r));
  FILE* f = fopen(out_path, "r");
  if (!f) return; /* the tool never wrote: never loaded */
  char line[600], dom[64], name[64];
  int pid, depth, m;
  unsigned size;
  long tid;
  while (fgets(line, sizeof(line), f)) {
    r->lines++;
    if (!strncmp(line, "init ", 5)) {
      r->inits++;
    } else if (!strncmp(line, "bad ", 4)) {
      r->bad++;
      rt_fail(__FILE__, __LINE__, "the tool says: %s", line);
    } else if (sscanf(line, "module %d %d %u", &pid, &m, &size) == 3) {
      static const unsigned sizes[7] = {0, 16, 9, 15, 7, 16, 7};
      r->modules++;
      if (strstr(line, "malformed") || m < 1 || m > 6 || size != sizes[m]) {
        r->malformed++;
        rt_fail(__FILE__, __LINE__, "callback table: %s", line);
      }
    } else if (sscanf(line, "domain %d %63s", &pid, name) == 2) {
      r->domains++;
      EXPECT(!strcmp(name, "NCCL"));
    } else if (sscanf(line, "string %d %63s %63s", &pid, dom, name) == 3) {
      r->strings++;
      EXPECT(!strcmp(dom, "NCCL"));
    } else if (sscanf(line, "push %d %ld %63s %63s %d", &pid, &tid, dom, name, &depth) == 5) {
      struct thr* t = thread_of(r, pid, tid);
      ASSERT(t != NULL);
      size_t n = strlen(t->seq);
      snprintf(t->seq + n, sizeof(t->seq) - n, "%s%s:%s", n ? " " : "", dom, name);
      ASSERT(t->depth < 16);
      snprintf(t->open[t->depth++], sizeof(t->open[0]), "%s", dom);
    } else if (sscanf(line, "pop %d %ld %63s %d", &pid, &tid, dom, &depth) == 4) {
      struct thr* t = thread_of(r, pid, tid);
      ASSERT(t != NULL);
      if (t->depth == 0) rt_fail(__FILE__, __LINE__, "pid %d thread %ld: a pop without a push", pid, tid);
      else if (strcmp(t->open[--t->depth], dom))
        rt_fail(__FILE__, __LINE__, "pid %d thread %ld: a range of domain %s popped in %s", pid, tid, t->open[t->depth],
                dom);
    } else {
      rt_fail(__FILE__, __LINE__, "unknown line in the record: %s", line);
    }
  }
  fclose(f);
  for (int i = 0; i < r->nthreads; i++)
    if (r->t[i].depth)
      rt_fail(__FILE__, __LINE__, "pid %d thread %ld: %d range(s) never popped (%s)", r->t[i].pid, r->t[i].tid,
              r->t[i].depth, r->t[i].seq);
}

/* nranks ranks ran rank_body, each in a thread of its own (in nprocs processes): each has exactly its
 * calls' ranges, in order, in domain d; each process loaded the tool once. */
static void expect_ranks(struct record* r, int nranks, int nprocs, const char* seq) {
  EXPECT_EQ(r->nthreads, nranks);
  for (int i = 0; i < r->nthreads; i++) {
    if (strcmp(r->t[i].seq, seq))
      rt_fail(__FILE__, __LINE__, "pid %d thread %ld ranges:\n      %s\n    expected:\n      %s", r->t[i].pid,
              r->t[i].tid, r->t[i].seq, seq);
  }
  EXPECT_EQ(r->inits, nprocs);
  EXPECT_EQ(r->bad, 0);
}

static void full_tool_ranks(int procs) {
  setup(CHORUS_NVTX_STUB, "full", 1);
  if (procs) rt_run_procs(2, rank_body, NULL);
  else rt_run_threads(2, rank_body, NULL);
  struct record r;
  read_record(&r);
  expect_ranks(&r, 2, procs ? 2 : 1, RANK_SEQ("NCCL"));
  int nprocs = procs ? 2 : 1;
  EXPECT_EQ(r.modules, 6 * nprocs); /* the stand-in asks for every module, as CUPTI does */
  EXPECT_EQ(r.malformed, 0);
  EXPECT_EQ(r.domains, nprocs);    /* "NCCL", once per process */
  EXPECT(r.strings >= 8 * nprocs); /* each name registered once; the ranges name them by handle */
  unlink(out_path);
}

TEST(nvtx, ranges_threads) { full_tool_ranks(0); }
TEST(nvtx, ranges_procs) { full_tool_ranks(1); }

/* The other public calls with ranges in NCCL (one rank); a split's child and a failed call too. */
TEST(nvtx, comm_calls) {
  setup(CHORUS_NVTX_STUB, "full", 1);
  ncclComm_t comm, child;
  int v;
  NCCL_OK(ncclCommInitAll(&comm, 1, NULL));
  NCCL_OK(ncclCommCount(comm, &v));
  NCCL_OK(ncclCommUserRank(comm, &v));
  NCCL_OK(ncclCommCuDevice(comm, &v));
  NCCL_OK(ncclCommSplit(comm, 0, 0, &child, NULL));
  float x = 1;
  NCCL_OK(ncclBcast(&x, 1, ncclFloat, 0, child, NULL)); /* ncclBroadcast's range, as in NCCL */
  EXPECT(ncclAllReduce(&x, &x, 1, ncclFloat, ncclSum, NULL, NULL) != ncclSuccess); /* popped on refusal */
  NCCL_OK(ncclCommFinalize(child));
  NCCL_OK(ncclCommDestroy(child));
  NCCL_OK(ncclCommAbort(comm));
  NCCL_OK(ncclCommDestroy(NULL));
  struct record r;
  read_record(&r);
  expect_ranks(&r, 1, 1,
               "NCCL:ncclCommInitAll NCCL:ncclCommCount NCCL:ncclCommUserRank NCCL:ncclCommCuDevice "
               "NCCL:ncclCommSplit NCCL:ncclBroadcast NCCL:ncclAllReduce NCCL:ncclCommFinalize NCCL:ncclCommDestroy "
               "NCCL:ncclCommAbort NCCL:ncclCommDestroy");
  unlink(out_path);
}

/* One rank makes its calls: the tool records nothing. */
static void one_rank_no_ranges(void) {
  rt_run_threads(1, rank_body, NULL);
  struct record r;
  read_record(&r);
  EXPECT_EQ(r.lines, 0);
}

/* NCCL_NVTX_DISABLE=1: the tool is never loaded, the calls work. */
TEST(nvtx, disabled) {
  setup(CHORUS_NVTX_STUB, "full", 1);
  setenv("NCCL_NVTX_DISABLE", "1", 1);
  param_reset();
  one_rank_no_ranges();
}

/* No NVTX_INJECTION64_PATH: nothing loaded. */
TEST(nvtx, no_tool) {
  setup(NULL, "full", 1);
  one_rank_no_ranges();
}

/* A tool named in a process without CUDA: no ranges (the host path makes none). Once the process
 * loads CUDA, the calls from then on get them: the library looks for the driver again at most once a
 * second (cudrv_present), hence the wait. */
TEST(nvtx, cuda_loaded_later) {
  setup(CHORUS_NVTX_STUB, "full", 0);
  one_rank_no_ranges();
  load_fake_cuda();
  param_reset();
  usleep(1100 * 1000);
  rt_run_threads(1, rank_body, NULL);
  struct record r;
  read_record(&r);
  expect_ranks(&r, 1, 1, RANK_SEQ("NCCL"));
  unlink(out_path);
}

/* A tool of the global calls only (no domains, no registered strings): the same ranges, in the
 * default domain ("-"), named by text. */
TEST(nvtx, global_calls_only) {
  setup(CHORUS_NVTX_STUB, "core", 1);
  rt_run_threads(1, rank_body, NULL);
  struct record r;
  read_record(&r);
  expect_ranks(&r, 1, 1, RANK_SEQ("-"));
  EXPECT_EQ(r.domains, 0);
  EXPECT_EQ(r.strings, 0);
  unlink(out_path);
}

/* A tool that accepts but fills no slot, and one that declines: loaded once, never called again,
 * and the calls work. */
static void tool_without_ranges(const char* mode) {
  setup(CHORUS_NVTX_STUB, mode, 1);
  rt_run_threads(2, rank_body, NULL);
  struct record r;
  read_record(&r);
  EXPECT_EQ(r.inits, 1);
  EXPECT_EQ(r.lines, 1);
  unlink(out_path);
}
TEST(nvtx, tool_fills_nothing) { tool_without_ranges("none"); }
TEST(nvtx, tool_declines) { tool_without_ranges("fail"); }

/* A path that cannot be loaded, and a library that is no NVTX tool: a WARN naming the path and the
 * loader's reason, and the calls work. */
static void bad_tool(const char* path, const char* why) {
  setup(path, "full", 1);
  rt_run_threads(1, rank_body, NULL);
  const char* e = ncclGetLastError(NULL);
  printf("    %s\n", e);
  EXPECT(strstr(e, "NVTX_INJECTION64_PATH=") && strstr(e, path) && strstr(e, why));
}
TEST(nvtx, tool_not_found) { bad_tool("/nonexistent/libchorus-nvtx-tool.so", "No such file"); }
TEST(nvtx, not_a_tool) { bad_tool(CHORUS_FAKE_CUDA, "InitializeInjectionNvtx2"); }
