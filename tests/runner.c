/* Chorus test runner (see runner.h). Each test runs in a forked child that leads its own process
 * group, so a timeout can kill the test together with every rank process it forked. */
#define _GNU_SOURCE
#include "runner.h"

#include <ftw.h>
#include <sys/stat.h>
#include <dirent.h>
#include <errno.h>
#include <fnmatch.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

struct rt_test {
  const char* suite;
  const char* name;
  rt_test_fn fn;
  int timeout_s;
};

static struct rt_test* tests;
static int ntests, cap_tests;

static int failures;                 /* this process's failures (atomic: rank threads share it) */
static uint64_t test_deadline_ns;    /* when the runner kills the current test */
static const char* cur_mode = "main";
static __thread int cur_rank = -1;   /* rank of this thread/process inside rt_run_*, for messages */

void rt_register(const char* suite, const char* name, rt_test_fn fn, int timeout_s) {
  if (ntests == cap_tests) {
    cap_tests = cap_tests ? 2 * cap_tests : 64;
    tests = realloc(tests, (size_t)cap_tests * sizeof(*tests));
    if (!tests) abort();
  }
  tests[ntests++] = (struct rt_test){suite, name, fn, timeout_s};
}

static uint64_t now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static void sleep_ms(int ms) {
  struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
  while (nanosleep(&ts, &ts) == -1 && errno == EINTR) {}
}

/* One write(2) per message so lines from concurrent ranks do not interleave. */
static void say(const char* fmt, ...) __attribute__((format(printf, 1, 2)));
static void say(const char* fmt, ...) {
  char buf[2048];
  va_list ap;
  va_start(ap, fmt);
  int n = vsnprintf(buf, sizeof(buf), fmt, ap);
  va_end(ap);
  if (n < 0) return;
  if ((size_t)n >= sizeof(buf)) n = sizeof(buf) - 1;
  fflush(stdout);
  for (int off = 0; off < n;) {
    ssize_t w = write(STDOUT_FILENO, buf + off, (size_t)(n - off));
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) break;
    off += (int)w;
  }
}

static void vfail(const char* file, int line, const char* fmt, va_list ap) {
  char msg[1536], who[64] = "";
  vsnprintf(msg, sizeof(msg), fmt, ap);
  if (cur_rank >= 0) snprintf(who, sizeof(who), "[%s rank %d] ", cur_mode, cur_rank);
  __atomic_add_fetch(&failures, 1, __ATOMIC_RELAXED);
  const char* base = strrchr(file, '/'); /* CMake passes absolute paths */
  say("    %s:%d: %s%s\n", base ? base + 1 : file, line, who, msg);
}

void rt_fail(const char* file, int line, const char* fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vfail(file, line, fmt, ap);
  va_end(ap);
}

/* Ends the test child (or, in process mode, this rank). _exit: no atexit handlers racing with
 * library threads that may still run. */
void rt_fail_fatal(const char* file, int line, const char* fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vfail(file, line, fmt, ap);
  va_end(ap);
  fflush(stdout);
  _exit(1);
}

int rt_failures(void) { return __atomic_load_n(&failures, __ATOMIC_RELAXED); }

const char* rt_mode(void) { return cur_mode; }

/* ---- multi-rank helpers ---- */

struct rank_arg {
  int rank, nranks;
  ncclUniqueId id;
  rt_rank_fn fn;
  void* arg;
};

static void* rank_thread(void* p) {
  struct rank_arg* a = p;
  cur_rank = a->rank;
  a->fn(a->rank, a->nranks, a->id, a->arg);
  return NULL;
}

static void get_id(ncclUniqueId* id) {
  ncclResult_t r = ncclGetUniqueId(id);
  if (r != ncclSuccess) rt_fail_fatal(__FILE__, __LINE__, "ncclGetUniqueId -> %d (%s)", (int)r, ncclGetErrorString(r));
}

void rt_run_threads(int nranks, rt_rank_fn fn, void* arg) {
  ncclUniqueId id;
  get_id(&id);
  struct rank_arg* a = calloc((size_t)nranks, sizeof(*a));
  pthread_t* th = calloc((size_t)nranks, sizeof(*th));
  if (!a || !th) rt_fail_fatal(__FILE__, __LINE__, "out of memory");
  const char* saved = cur_mode;
  cur_mode = "threads";
  for (int r = 0; r < nranks; r++) {
    a[r] = (struct rank_arg){r, nranks, id, fn, arg};
    int e = pthread_create(&th[r], NULL, rank_thread, &a[r]);
    if (e) rt_fail_fatal(__FILE__, __LINE__, "pthread_create for rank %d: %s", r, strerror(e));
  }
  for (int r = 0; r < nranks; r++) pthread_join(th[r], NULL);
  cur_mode = saved;
  free(th);
  free(a);
}

/* A failure the runner itself found (a rank process that failed or hung). */
static void rank_failed(int rank, pid_t pid, const char* why) {
  __atomic_add_fetch(&failures, 1, __ATOMIC_RELAXED);
  say("    procs rank %d (pid %d) %s\n", rank, (int)pid, why);
}

static void describe_status(int st, char* out, size_t n) {
  if (WIFEXITED(st))
    snprintf(out, n, "exited with status %d", WEXITSTATUS(st));
  else if (WIFSIGNALED(st))
    snprintf(out, n, "killed by signal %d (%s)", WTERMSIG(st), strsignal(WTERMSIG(st)));
  else
    snprintf(out, n, "stopped (status 0x%x)", st);
}

/* Under AddressSanitizer (GCC 12's runtime) a fork while another thread holds the allocator lock leaves
 * the child deadlocked in its first malloc, and ThreadSanitizer kills a child of a multi-threaded fork
 * that starts a thread. Give lingering library threads of earlier jobs (a bootstrap root finishing its
 * watch, say) a moment to end so that we fork a single-threaded process. */
static void quiesce_before_fork(void) {
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
  for (int i = 0; i < 400 && rt_count_threads() > 1; i++) sleep_ms(5);
#endif
}

/* Ranks are forked before the unique id exists and read it from a pipe: ncclGetUniqueId may start the
 * bootstrap root thread here, and forking with fewer threads running is safer (see above). */
void rt_run_procs(int nranks, rt_rank_fn fn, void* arg) {
  int idpipe[2];
  pid_t* pids = calloc((size_t)nranks, sizeof(*pids));
  int* done = calloc((size_t)nranks, sizeof(*done));
  if (!pids || !done) rt_fail_fatal(__FILE__, __LINE__, "out of memory");
  if (pipe(idpipe) != 0) rt_fail_fatal(__FILE__, __LINE__, "pipe: %s", strerror(errno));
  quiesce_before_fork();
  fflush(stdout);
  fflush(stderr);
  for (int r = 0; r < nranks; r++) {
    pid_t p = fork();
    if (p < 0) rt_fail_fatal(__FILE__, __LINE__, "fork for rank %d: %s", r, strerror(errno));
    if (p == 0) {
      ncclUniqueId id;
      close(idpipe[1]);
      size_t got = 0;
      while (got < sizeof(id)) {
        ssize_t n = read(idpipe[0], (char*)&id + got, sizeof(id) - got);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) _exit(3); /* no id: the parent reports why */
        got += (size_t)n;
      }
      close(idpipe[0]);
      failures = 0; /* a rank reports only its own failures */
      cur_mode = "procs";
      cur_rank = r;
      fn(r, nranks, id, arg);
      fflush(stdout);
      _exit(rt_failures() ? 1 : 0);
    }
    pids[r] = p;
  }
  close(idpipe[0]);
  ncclUniqueId id;
  ncclResult_t res = ncclGetUniqueId(&id);
  if (res != ncclSuccess) {
    rt_fail(__FILE__, __LINE__, "ncclGetUniqueId -> %d (%s)", (int)res, ncclGetErrorString(res));
  } else {
    /* Writes of 128 bytes to a pipe are atomic, so each rank reads one whole id. */
    for (int r = 0; r < nranks; r++)
      if (write(idpipe[1], &id, sizeof(id)) != (ssize_t)sizeof(id))
        rt_fail(__FILE__, __LINE__, "writing the id for the ranks: %s", strerror(errno));
  }
  close(idpipe[1]);
  /* Wait until shortly before the runner's own kill, so we can still say which rank hung. */
  uint64_t margin = 500000000ull, limit = test_deadline_ns ? test_deadline_ns - margin : 0;
  int left = nranks, ms = 1;
  while (left > 0) {
    for (int r = 0; r < nranks; r++) {
      if (done[r]) continue;
      int st;
      pid_t w = waitpid(pids[r], &st, WNOHANG);
      if (w == 0) continue;
      done[r] = 1;
      left--;
      char why[128];
      if (w < 0) {
        snprintf(why, sizeof(why), "could not be waited for: %s", strerror(errno));
        rank_failed(r, pids[r], why);
      } else if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) {
        describe_status(st, why, sizeof(why));
        rank_failed(r, pids[r], why);
      }
    }
    if (left == 0) break;
    if (limit && now_ns() >= limit) {
      for (int r = 0; r < nranks; r++) {
        if (done[r]) continue;
        kill(pids[r], SIGKILL);
        waitpid(pids[r], NULL, 0);
        rank_failed(r, pids[r], "did not finish before the test timeout: killed");
      }
      break;
    }
    sleep_ms(ms);
    if (ms < 10) ms++;
  }
  free(done);
  free(pids);
}

void rt_run_both(int nranks, rt_rank_fn fn, void* arg) {
  rt_run_threads(nranks, fn, arg);
  rt_run_procs(nranks, fn, arg);
}

static int count_dir(const char* path) {
  DIR* d = opendir(path);
  if (!d) return -1;
  int n = 0;
  struct dirent* e;
  while ((e = readdir(d)) != NULL)
    if (e->d_name[0] != '.') n++;
  closedir(d);
  return n;
}

int rt_count_fds(void) {
  int n = count_dir("/proc/self/fd");
  return n < 0 ? -1 : n - 1; /* minus the descriptor opendir used */
}

int rt_count_threads(void) { return count_dir("/proc/self/task"); }

/* ---- the runner ---- */

static int matches(const struct rt_test* t, int npat, char** pat) {
  if (npat == 0) return 1;
  char full[256];
  snprintf(full, sizeof(full), "%s.%s", t->suite, t->name);
  for (int i = 0; i < npat; i++) {
    /* "suite" or "sui*" selects suites; anything with a dot matches suite.name. */
    const char* subject = strchr(pat[i], '.') ? full : t->suite;
    if (fnmatch(pat[i], subject, 0) == 0) return 1;
  }
  return 0;
}

/* Reap whatever orphans of finished tests were handed to us (we are their subreaper). */
static void reap_orphans(void) {
  while (waitpid(-1, NULL, WNOHANG) > 0) {}
}

/* Runs one test in a child; returns 1 when it passed. */
static int run_one(const struct rt_test* t, int timeout_s, int nofork) {
  char full[256], why[160] = "";
  snprintf(full, sizeof(full), "%s.%s", t->suite, t->name);
  say("[ RUN  ] %s\n", full);
  uint64_t t0 = now_ns(), deadline = t0 + (uint64_t)timeout_s * 1000000000ull;
  int ok;
  if (nofork) { /* for debuggers: no child, no timeout */
    t->fn();
    ok = rt_failures() == 0;
    if (!ok) snprintf(why, sizeof(why), "%d failure(s)", rt_failures());
  } else {
    fflush(stdout);
    fflush(stderr);
    pid_t pid = fork();
    if (pid < 0) {
      say("fork: %s\n", strerror(errno));
      return 0;
    }
    if (pid == 0) {
      setpgid(0, 0);
      test_deadline_ns = deadline;
      t->fn();
      fflush(stdout);
      exit(rt_failures() ? 1 : 0); /* exit, not _exit: sanitizers check for leaks at exit */
    }
    setpgid(pid, pid); /* also here, so the group exists before we may need to kill it */
    int st = 0, timed_out = 0, ms = 1;
    for (;;) {
      pid_t w = waitpid(pid, &st, WNOHANG);
      if (w == pid) break;
      if (w < 0 && errno != EINTR) {
        snprintf(why, sizeof(why), "waitpid: %s", strerror(errno));
        break;
      }
      if (now_ns() >= deadline) {
        timed_out = 1;
        kill(-pid, SIGKILL);
        waitpid(pid, &st, 0);
        break;
      }
      sleep_ms(ms);
      if (ms < 10) ms++;
    }
    kill(-pid, SIGKILL); /* rank processes a failed test left behind */
    reap_orphans();
    if (timed_out)
      snprintf(why, sizeof(why), "TIMEOUT after %d s", timeout_s);
    else if (!why[0] && !(WIFEXITED(st) && WEXITSTATUS(st) == 0)) {
      if (WIFEXITED(st) && WEXITSTATUS(st) == 1)
        snprintf(why, sizeof(why), "failed");
      else
        describe_status(st, why, sizeof(why));
    }
    ok = why[0] == 0;
  }
  unsigned long long ms = (now_ns() - t0) / 1000000ull;
  if (ok)
    say("[  OK  ] %s (%llu ms)\n", full, ms);
  else
    say("[ FAIL ] %s (%llu ms): %s\n", full, ms, why);
  return ok;
}

static void usage(const char* argv0) {
  printf("usage: %s [--list] [--timeout S] [--no-fork] [PATTERN...]\n"
         "  PATTERN: SUITE, SUITE.NAME, or a glob of either (\"coll*\", \"comm.split*\")\n"
         "  --timeout S  use S seconds for every selected test instead of its own timeout\n"
         "  --no-fork    run tests in this process (for a debugger); no timeouts\n",
         argv0);
}

static int rm_entry(const char* p, const struct stat* st, int flag, struct FTW* ftw) {
  (void)st, (void)flag, (void)ftw;
  return remove(p);
}

int main(int argc, char** argv) {
  int list = 0, nofork = 0, timeout_override = 0, npat = 0;
  char** pat = argv + 1; /* patterns are compacted in place: npat never passes the index read */
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--list")) {
      list = 1;
    } else if (!strcmp(argv[i], "--no-fork")) {
      nofork = 1;
    } else if (!strcmp(argv[i], "--timeout") && i + 1 < argc) {
      timeout_override = atoi(argv[++i]);
      if (timeout_override <= 0) {
        fprintf(stderr, "--timeout needs a positive number of seconds\n");
        return 2;
      }
    } else if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) {
      usage(argv[0]);
      return 0;
    } else if (argv[i][0] == '-') {
      usage(argv[0]);
      return 2;
    } else {
      pat[npat++] = argv[i];
    }
  }

  int selected = 0;
  for (int i = 0; i < ntests; i++) {
    if (!matches(&tests[i], npat, pat)) continue;
    selected++;
    if (list) printf("%s.%s\n", tests[i].suite, tests[i].name);
  }
  if (list) return 0;
  if (selected == 0) {
    printf("no test matches\n0 passed, 0 failed\n");
    return 1;
  }

  setvbuf(stdout, NULL, _IOLBF, 0);
  /* Flight recorder dumps of tests that time out or fail on purpose go to a folder of this run. */
  static char dump_dir[64];
  if (!getenv("CHORUS_DUMP_DIR")) {
    snprintf(dump_dir, sizeof(dump_dir), "/tmp/chorus-tests-dump-XXXXXX");
    if (mkdtemp(dump_dir)) setenv("CHORUS_DUMP_DIR", dump_dir, 1);
    else dump_dir[0] = 0;
  }
  prctl(PR_SET_CHILD_SUBREAPER, 1); /* rank processes orphaned by a killed test come back to us */
  int passed = 0, failed = 0;
  char** failed_names = calloc((size_t)selected, sizeof(char*));
  if (!failed_names) return 2;
  for (int i = 0; i < ntests; i++) {
    if (!matches(&tests[i], npat, pat)) continue;
    int to = timeout_override ? timeout_override : tests[i].timeout_s;
    if (run_one(&tests[i], to, nofork)) {
      passed++;
    } else {
      char buf[256];
      snprintf(buf, sizeof(buf), "%s.%s", tests[i].suite, tests[i].name);
      failed_names[failed++] = strdup(buf);
    }
    if (nofork) failures = 0;
  }
  if (failed) {
    printf("failed tests:\n");
    for (int i = 0; i < failed; i++) printf("  %s\n", failed_names[i] ? failed_names[i] : "?");
  }
  printf("%d passed, %d failed\n", passed, failed);
  fflush(stdout);
  if (dump_dir[0]) nftw(dump_dir, rm_entry, 16, FTW_DEPTH | FTW_PHYS);
  for (int i = 0; i < failed; i++) free(failed_names[i]);
  free(failed_names);
  free(tests);
  return failed ? 1 : 0;
}
