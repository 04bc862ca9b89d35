/* Small helpers: clock, randomness, hashing, host identity, CPU count and polite waiting. */
#define _GNU_SOURCE /* sched_getaffinity */
#include <stdarg.h>
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "log.h"
#include "param.h"
#include "utils.h"

uint64_t ut_now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * UT_NS_PER_S + (uint64_t)ts.tv_nsec;
}

static ch_status random_from_urandom(unsigned char* p, size_t n) {
  int fd = open("/dev/urandom", O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    WARN("open(/dev/urandom) failed: %s", strerror(errno));
    return CH_SYSTEM;
  }
  while (n > 0) {
    ssize_t r = read(fd, p, n);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) {
      WARN("read(/dev/urandom) failed: %s", r < 0 ? strerror(errno) : "end of file");
      close(fd);
      return CH_SYSTEM;
    }
    p += r;
    n -= (size_t)r;
  }
  close(fd);
  return CH_OK;
}

ch_status ut_random(void* buf, size_t n) {
  unsigned char* p = buf;
  while (n > 0) {
    ssize_t r = getrandom(p, n, 0);
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) return random_from_urandom(p, n); /* old kernel or seccomp: use the device */
    p += r;
    n -= (size_t)r;
  }
  return CH_OK;
}

/* Written by whichever thread first asks in a process (a lost race draws twice; both draws are
 * random, the last store wins before anyone compares). Re-drawn in a fork child by the atfork hook. */
static _Atomic uint64_t proc_nonce;
static pthread_once_t proc_nonce_once = PTHREAD_ONCE_INIT;
static void proc_nonce_child(void) { atomic_store(&proc_nonce, 0); }
static void proc_nonce_hook(void) { ut_atfork_register(NULL, NULL, proc_nonce_child); }

uint64_t ut_proc_nonce(void) {
  pthread_once(&proc_nonce_once, proc_nonce_hook);
  uint64_t v = atomic_load(&proc_nonce);
  while (v == 0) {
    uint64_t fresh = 0;
    if (ut_random(&fresh, sizeof(fresh)) != CH_OK) fresh = ut_hash(&v, sizeof(v), ut_now_ns() ^ (uint64_t)getpid());
    if (fresh == 0) continue;
    if (atomic_compare_exchange_strong(&proc_nonce, &v, fresh)) v = fresh;
  }
  return v;
}

uint64_t ut_pid_ns(void) {
  struct stat st;
  return stat("/proc/self/ns/pid", &st) == 0 ? (uint64_t)st.st_ino : 0;
}

uint64_t ut_hash(const void* data, size_t n, uint64_t seed) {
  const unsigned char* p = data;
  uint64_t h = 0xcbf29ce484222325ull ^ seed;
  for (size_t i = 0; i < n; i++) {
    h ^= p[i];
    h *= 0x100000001b3ull;
  }
  return h;
}

static pthread_once_t host_once = PTHREAD_ONCE_INIT;
static char host_name[256];
static char host_id[512];
static uint64_t host_hash;

static void host_init(void) {
  if (gethostname(host_name, sizeof(host_name) - 1) != 0) snprintf(host_name, sizeof(host_name), "unknown");
  host_name[sizeof(host_name) - 1] = '\0';

  const char* override = param_str(PARAM_HOSTID);
  if (override[0]) {
    snprintf(host_id, sizeof(host_id), "%s", override);
  } else {
    /* The boot id tells apart containers that share a hostname but not a kernel (and thus no shm). */
    char boot[64] = "";
    FILE* f = fopen("/proc/sys/kernel/random/boot_id", "re");
    if (f) {
      if (!fgets(boot, sizeof(boot), f)) boot[0] = '\0';
      fclose(f);
      boot[strcspn(boot, "\r\n")] = '\0';
    }
    snprintf(host_id, sizeof(host_id), "%s%s", host_name, boot);
  }
  host_hash = ut_hash(host_id, strlen(host_id), 0);
}

const char* ut_host_id(void) {
  pthread_once(&host_once, host_init);
  return host_id;
}

uint64_t ut_host_hash(void) {
  pthread_once(&host_once, host_init);
  return host_hash;
}

const char* ut_hostname(void) {
  pthread_once(&host_once, host_init);
  return host_name;
}

int ut_ncpus(void) {
  cpu_set_t set;
  if (sched_getaffinity(0, sizeof(set), &set) == 0) {
    int n = CPU_COUNT(&set);
    if (n > 0) return n;
  }
  long n = sysconf(_SC_NPROCESSORS_ONLN);
  return n > 0 ? (int)n : 1;
}

void ut_cpu_mask(uint64_t* words, int nwords) {
  memset(words, 0, sizeof(uint64_t) * (size_t)nwords);
  cpu_set_t set;
  if (sched_getaffinity(0, sizeof(set), &set) != 0) return;
  for (int c = 0; c < CPU_SETSIZE && c < 64 * nwords; c++)
    if (CPU_ISSET(c, &set)) words[c / 64] |= 1ull << (c % 64);
}

/* Phases: spin (cheap wake-up when the partner is running on another core), then sched_yield (lets
 * a partner on the same core run), then sleeps growing to 64 us so dozens of waiting ranks on two
 * cores do not starve the ones doing work. */
#define UT_YIELD_ITERS 64
#define UT_MAX_SLEEP_NS 64000

void ut_backoff(uint64_t iter) {
  int64_t spin = param_int(PARAM_SPIN_COUNT);
  if (spin < 0) spin = 0;
  if (iter < (uint64_t)spin) {
    ut_cpu_relax();
    return;
  }
  iter -= (uint64_t)spin;
  if (iter < UT_YIELD_ITERS) {
    sched_yield();
    return;
  }
  iter -= UT_YIELD_ITERS;
  /* Double every 8 sleeps: 1, 2, 4 ... 64 us. */
  uint64_t ns = UT_NS_PER_US << (iter / 8 < 6 ? iter / 8 : 6);
  if (ns > UT_MAX_SLEEP_NS) ns = UT_MAX_SLEEP_NS;
  struct timespec ts = {0, (long)ns};
  nanosleep(&ts, NULL);
}

int ut_pid_alive(int pid) {
  if (kill(pid, 0) == -1 && errno == ESRCH) return 0;
  char path[64], buf[256];
  snprintf(path, sizeof(path), "/proc/%d/stat", pid);
  FILE* f = fopen(path, "r");
  if (!f) return 1; /* no /proc: trust kill() */
  size_t n = fread(buf, 1, sizeof(buf) - 1, f);
  fclose(f);
  buf[n] = 0;
  const char* close_paren = strrchr(buf, ')'); /* state follows "(comm) " */
  return !(close_paren && (close_paren[2] == 'Z' || close_paren[2] == 'X'));
}

void ut_appendf(char* buf, size_t cap, const char* fmt, ...) {
  size_t used = strlen(buf);
  if (used + 3 >= cap) return;
  if (used) memcpy(buf + used, "; ", 3), used += 2;
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(buf + used, cap - used, fmt, ap);
  va_end(ap);
}

int ut_plugin_names(const char* kind, const char* value, char out[2][512]) {
  if (!value || !*value) {
    snprintf(out[0], 512, "libnccl-%s.so", kind);
    return 1;
  }
  if (strcasecmp(value, "none") == 0) return 0;
  snprintf(out[0], 512, "%s", value);
  size_t len = strlen(value);
  int libso = strncmp(value, "lib", 3) == 0 && len >= 3 && strcmp(value + len - 3, ".so") == 0;
  if (strchr(value, '/') || libso) return 1; /* NCCL tries such a value as it is only */
  snprintf(out[1], 512, "libnccl-%s-%s.so", kind, value);
  return 2;
}

void* ut_plugin_open(char names[2][512], int n, int* which, char err[2][256]) {
  for (int k = 0; k < n; k++) {
    void* dl = dlopen(names[k], RTLD_NOW | RTLD_LOCAL);
    if (dl) {
      *which = k;
      return dl;
    }
    const char* e = dlerror();
    snprintf(err[k], 256, "%s", e ? e : "unknown error");
  }
  return NULL;
}
