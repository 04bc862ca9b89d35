/* NCCL-compatible logging. Lines look like NCCL's so users' grep/awk tooling keeps working:
 *   host:pid:tid [rank] NCCL INFO message
 *   host:pid:tid [rank] misc/socket.c:123 NCCL WARN message
 * Each line goes out in one write(2), under a lock, so lines of threads and processes never mix. */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <strings.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "chorus.h"
#include "log.h"
#include "param.h"
#include "safefile.h"

int log_level_cached = -1;
unsigned log_mask = LOG_INIT | LOG_BOOTSTRAP | LOG_ENV;

static pthread_mutex_t log_lock = PTHREAD_MUTEX_INITIALIZER;
static int log_fd = STDOUT_FILENO;
static int version_printed;

static pthread_mutex_t err_lock = PTHREAD_MUTEX_INITIALIZER;
static char last_error[2048];

static __thread int in_init; /* reading parameters from log_init may log; do not recurse */
static __thread int thread_rank = -1;
static __thread struct log_err_sink* thread_sink; /* owner thread only */

static const struct {
  const char* name;
  unsigned mask;
} subsys_names[] = {
    {"INIT", LOG_INIT},   {"COLL", LOG_COLL},       {"P2P", LOG_P2P},         {"SHM", LOG_SHM},
    {"NET", LOG_NET},     {"GRAPH", LOG_GRAPH},     {"TUNING", LOG_TUNING},   {"ENV", LOG_ENV},
    {"ALLOC", LOG_ALLOC}, {"ALLOC_HOST", LOG_ALLOC_HOST}, {"CALL", LOG_CALL}, {"PROXY", LOG_PROXY},
    {"NVLS", LOG_NVLS},   {"BOOTSTRAP", LOG_BOOTSTRAP}, {"REG", LOG_REG},    {"PROFILE", LOG_PROFILE},
    {"RAS", LOG_RAS},     {"DESTROY", LOG_DESTROY}, {"ALL", (unsigned)LOG_ALL},
};

int log_parse_level(const char* s) {
  if (!s[0]) return LOG_NONE;
  if (!strcasecmp(s, "VERSION")) return LOG_VERSION;
  if (!strcasecmp(s, "WARN")) return LOG_WARN;
  if (!strcasecmp(s, "INFO")) return LOG_INFO;
  if (!strcasecmp(s, "ABORT")) return LOG_ABORT;
  if (!strcasecmp(s, "TRACE")) return LOG_TRACE;
  return LOG_NONE;
}

/* "INIT,NET" selects; "^INIT,NET" selects everything else; "ALL" everything. In 64 bits, as NCCL
 * keeps the mask (the parameter API reports it so); logging uses the low 32. */
uint64_t log_parse_subsys(const char* s) {
  int invert = 0;
  if (s[0] == '^') {
    invert = 1;
    s++;
  }
  uint64_t mask = 0;
  char buf[512];
  snprintf(buf, sizeof(buf), "%s", s);
  char* save = NULL;
  for (char* tok = strtok_r(buf, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
    while (*tok == ' ') tok++;
    for (size_t i = 0; i < sizeof(subsys_names) / sizeof(subsys_names[0]); i++)
      if (!strcasecmp(tok, subsys_names[i].name))
        mask |= subsys_names[i].mask == (unsigned)LOG_ALL ? UINT64_MAX : subsys_names[i].mask;
  }
  return invert ? ~mask : mask;
}

/* Our own copy of the host name: ut_hostname() reads parameters, which may log (recursion). */
static char log_host[256];
static pthread_once_t log_host_once = PTHREAD_ONCE_INIT;
static void log_host_init(void) {
  if (gethostname(log_host, sizeof(log_host) - 1) != 0) snprintf(log_host, sizeof(log_host), "unknown");
  log_host[sizeof(log_host) - 1] = '\0';
}

/* Expand %h (hostname) and %p (pid) in NCCL_DEBUG_FILE. */
static void expand_path(const char* in, char* out, size_t len) {
  size_t o = 0;
  for (const char* p = in; *p && o + 1 < len; p++) {
    if (p[0] == '%' && p[1] == 'h') {
      pthread_once(&log_host_once, log_host_init);
      o += (size_t)snprintf(out + o, len - o, "%s", log_host);
      p++;
    } else if (p[0] == '%' && p[1] == 'p') {
      o += (size_t)snprintf(out + o, len - o, "%d", (int)getpid());
      p++;
    } else {
      out[o++] = *p;
    }
    if (o >= len) o = len - 1;
  }
  out[o] = '\0';
}


static void write_line(const char* line, size_t n) {
  while (n > 0) {
    ssize_t w = write(log_fd, line, n);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return;
    line += w;
    n -= (size_t)w;
  }
}

void log_init(void) {
  if (in_init) return;
  in_init = 1;
  int print_version = 0;
  pthread_mutex_lock(&log_lock);
  if (__atomic_load_n(&log_level_cached, __ATOMIC_ACQUIRE) < 0) {
    int level = log_parse_level(param_str(PARAM_DEBUG));
    unsigned mask = (unsigned)log_parse_subsys(param_str(PARAM_DEBUG_SUBSYS));
    const char* file = param_str(PARAM_DEBUG_FILE);
    if (file[0] && level > LOG_NONE) {
      char path[4096];
      expand_path(file, path, sizeof(path));
      /* Append rather than truncate: processes sharing one file name must not wipe each other. Often
       * in /tmp: a link or a file another user planted there is refused (misc/safefile.h), and the log
       * stays on stdout. */
      int fd = sf_append(path, 0644);
      if (fd >= 0) log_fd = fd;
    }
    __atomic_store_n(&log_mask, mask, __ATOMIC_RELAXED);
    __atomic_store_n(&log_level_cached, level, __ATOMIC_RELEASE);
    if (level >= LOG_VERSION && !version_printed) print_version = version_printed = 1;
  }
  pthread_mutex_unlock(&log_lock);
  in_init = 0;
  if (print_version)
    log_msg(LOG_VERSION, (unsigned)LOG_ALL, __FILE__, __LINE__, "Chorus %s (NCCL API %d.%d.%d)", CHORUS_VERSION_STRING,
            NCCL_MAJOR, NCCL_MINOR, NCCL_PATCH);
  log_flush_deferred(); /* lines made while the parameters above were read (the environment plugin's) */
}

void log_reset(void) {
  pthread_mutex_lock(&log_lock);
  if (log_fd != STDOUT_FILENO) close(log_fd);
  log_fd = STDOUT_FILENO;
  __atomic_store_n(&log_level_cached, -1, __ATOMIC_RELEASE);
  pthread_mutex_unlock(&log_lock);
}

/* "…/src/misc/socket.c" → "misc/socket.c": short, yet unambiguous across layers. */
static const char* short_file(const char* file) {
  const char* s = strstr(file, "/src/");
  if (s) {
    const char* next;
    while ((next = strstr(s + 1, "/src/"))) s = next;
    return s + 5;
  }
  const char* b = strrchr(file, '/');
  return b ? b + 1 : file;
}

void log_msg(int level, unsigned subsys, const char* file, int line, const char* fmt, ...) {
  if (__atomic_load_n(&log_level_cached, __ATOMIC_ACQUIRE) < 0 && !in_init) log_init();
  int cur = in_init ? LOG_NONE : __atomic_load_n(&log_level_cached, __ATOMIC_ACQUIRE);
  int print = cur >= level && (level != LOG_INFO || (__atomic_load_n(&log_mask, __ATOMIC_RELAXED) & subsys));
  if (level != LOG_WARN && !print) return;

  char msg[2048];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof(msg), fmt, ap);
  va_end(ap);

  if (level == LOG_WARN) {
    pthread_mutex_lock(&err_lock);
    snprintf(last_error, sizeof(last_error), "%s", msg);
    pthread_mutex_unlock(&err_lock);
    struct log_err_sink* sink = thread_sink;
    if (sink) {
      pthread_mutex_lock(&sink->mu);
      size_t len = strnlen(msg, sizeof(sink->text) - 1); /* truncated like the process record */
      memcpy(sink->text, msg, len);
      sink->text[len] = '\0';
      pthread_mutex_unlock(&sink->mu);
    }
  }
  if (!print) return;

  int tid = (int)syscall(SYS_gettid); /* not cached: a forked child must not show its parent's */
  pthread_once(&log_host_once, log_host_init);
  char host[256];
  snprintf(host, sizeof(host), "%s", log_host);
  host[strcspn(host, ".")] = '\0'; /* NCCL shows the short name */
  char rank[24] = "";
  if (thread_rank >= 0) snprintf(rank, sizeof(rank), " [%d]", thread_rank);
  const char* what = level == LOG_WARN ? "WARN" : level == LOG_TRACE ? "TRACE" : "INFO";
  char out[2560];
  int n;
  if (level == LOG_WARN)
    n = snprintf(out, sizeof(out), "%s:%d:%d%s %s:%d NCCL %s %s\n", host, (int)getpid(), tid, rank,
                 short_file(file), line, what, msg);
  else
    n = snprintf(out, sizeof(out), "%s:%d:%d%s NCCL %s %s\n", host, (int)getpid(), tid, rank, what, msg);
  if (n < 0) return;
  if ((size_t)n >= sizeof(out)) {
    n = (int)sizeof(out) - 1;
    out[n - 1] = '\n';
  }
  pthread_mutex_lock(&log_lock);
  write_line(out, (size_t)n);
  pthread_mutex_unlock(&log_lock);

  /* NCCL_DEBUG=ABORT: stop at the first warning, leaving a core to inspect. */
  if (level == LOG_WARN && cur == LOG_ABORT) abort();
}

/* Deferred lines (log_defer). defer_mu is never held while logging or reading parameters. */
#define DEFER_MAX 16
struct deferred {
  int level, line;
  unsigned subsys;
  char file[128], text[512];
};
static pthread_mutex_t defer_mu = PTHREAD_MUTEX_INITIALIZER;
static struct deferred deferred[DEFER_MAX]; /* under defer_mu */
static int ndeferred;                       /* written under defer_mu; read atomically for the fast path */

void log_defer_v(int level, unsigned subsys, const char* file, int line, const char* fmt, va_list ap) {
  char text[sizeof(deferred[0].text)];
  vsnprintf(text, sizeof(text), fmt, ap);
  if (level == LOG_WARN) { /* ncclGetLastError has it now, printed or not */
    pthread_mutex_lock(&err_lock);
    snprintf(last_error, sizeof(last_error), "%s", text);
    pthread_mutex_unlock(&err_lock);
  }
  pthread_mutex_lock(&defer_mu);
  if (ndeferred < DEFER_MAX) {
    struct deferred* d = &deferred[ndeferred];
    d->level = level, d->subsys = subsys, d->line = line;
    snprintf(d->file, sizeof(d->file), "%s", file ? file : "?"); /* a plugin's __FILE__ may be unloaded later */
    memcpy(d->text, text, sizeof(text));
    __atomic_store_n(&ndeferred, ndeferred + 1, __ATOMIC_RELEASE);
  }
  pthread_mutex_unlock(&defer_mu);
}

void log_defer(int level, unsigned subsys, const char* file, int line, const char* fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  log_defer_v(level, subsys, file, line, fmt, ap);
  va_end(ap);
}

void log_flush_deferred(void) {
  static __thread int flushing; /* logging a line may configure logging, which flushes: the outer loop does */
  if (in_init || flushing || !__atomic_load_n(&ndeferred, __ATOMIC_ACQUIRE)) return;
  flushing = 1;
  while (__atomic_load_n(&ndeferred, __ATOMIC_ACQUIRE)) {
    struct deferred copy[DEFER_MAX];
    pthread_mutex_lock(&defer_mu);
    int n = ndeferred;
    memcpy(copy, deferred, sizeof(copy[0]) * (size_t)n);
    __atomic_store_n(&ndeferred, 0, __ATOMIC_RELEASE);
    pthread_mutex_unlock(&defer_mu);
    for (int i = 0; i < n; i++) log_msg(copy[i].level, copy[i].subsys, copy[i].file, copy[i].line, "%s", copy[i].text);
  }
  flushing = 0;
}

const char* log_last_error(void) {
  static __thread char copy[2048];
  pthread_mutex_lock(&err_lock);
  memcpy(copy, last_error, sizeof(copy));
  pthread_mutex_unlock(&err_lock);
  return copy;
}

void log_sink_init(struct log_err_sink* s) {
  pthread_mutex_init(&s->mu, NULL);
  s->text[0] = '\0';
}

void log_sink_destroy(struct log_err_sink* s) {
  if (thread_sink == s) thread_sink = NULL;
  pthread_mutex_destroy(&s->mu);
}

struct log_err_sink* log_set_error_sink(struct log_err_sink* s) {
  struct log_err_sink* prev = thread_sink;
  thread_sink = s;
  return prev;
}

const char* log_sink_text(struct log_err_sink* s) {
  static __thread char copy[sizeof(s->text)];
  pthread_mutex_lock(&s->mu);
  memcpy(copy, s->text, sizeof(copy));
  pthread_mutex_unlock(&s->mu);
  return copy;
}

void log_set_thread_rank(int rank) { thread_rank = rank; }

void log_plugin_v(const char* who, int trace_as, int level, unsigned long flags, const char* file, int line,
                  const char* fmt, va_list ap) {
  if (__atomic_load_n(&log_level_cached, __ATOMIC_ACQUIRE) < 0) log_init();
  int have = __atomic_load_n(&log_level_cached, __ATOMIC_ACQUIRE);
  int warn = level == LOG_WARN || level == LOG_ABORT;
  if (!warn && level != LOG_INFO && level != LOG_TRACE) return; /* NONE, VERSION */
  if (!warn && (have < level || !(__atomic_load_n(&log_mask, __ATOMIC_RELAXED) & (unsigned)flags))) return;
  char buf[1024];
  if (!fmt) return; /* a plugin's logger call without a format: nothing to print */
  vsnprintf(buf, sizeof(buf), fmt, ap);
  int lvl = warn ? LOG_WARN : level == LOG_TRACE ? trace_as : LOG_INFO;
  log_msg(lvl, warn ? (unsigned)LOG_ALL : (unsigned)flags, file ? file : who, line, "%s", buf);
}
