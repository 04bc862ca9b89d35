/* Logging that honours NCCL_DEBUG, NCCL_DEBUG_SUBSYS and NCCL_DEBUG_FILE (%h host, %p pid). */
#ifndef CH_LOG_H
#define CH_LOG_H

#include <pthread.h>
#include <stdarg.h>
#include <stdint.h>
#include <string.h>

enum log_level { LOG_NONE = 0, LOG_VERSION = 1, LOG_WARN = 2, LOG_INFO = 3, LOG_ABORT = 4, LOG_TRACE = 5 };

/* Subsystem masks: NCCL's values, plus our own above them. */
enum log_subsys {
  LOG_INIT = 0x1, LOG_COLL = 0x2, LOG_P2P = 0x4, LOG_SHM = 0x8, LOG_NET = 0x10, LOG_GRAPH = 0x20,
  LOG_TUNING = 0x40, LOG_ENV = 0x80, LOG_ALLOC = 0x100, LOG_CALL = 0x200, LOG_PROXY = 0x400,
  LOG_NVLS = 0x800, LOG_BOOTSTRAP = 0x1000, LOG_REG = 0x2000, LOG_PROFILE = 0x4000, LOG_RAS = 0x8000,
  LOG_DESTROY = 0x10000, LOG_ALLOC_HOST = 0x20000, LOG_ALL = ~0
};

extern int log_level_cached;   /* -1 until log_init ran */
extern unsigned log_mask;

void log_init(void);
/* NCCL_DEBUG's value as a log_level (LOG_NONE when empty or unknown), NCCL_DEBUG_SUBSYS's as a mask. */
int log_parse_level(const char* s);
uint64_t log_parse_subsys(const char* s);
/* Forget the configuration (closes NCCL_DEBUG_FILE); the next message reads the parameters again
 * (ncclResetDebugInit, param_reset). */
void log_reset(void);
void log_msg(int level, unsigned subsys, const char* file, int line, const char* fmt, ...)
    __attribute__((format(printf, 5, 6)));
/* The body of the logger NCCL hands its plugins (ncclDebugLogger_t; level: NCCL's ncclDebugLogLevel,
 * whose values are log_level's): a plugin's WARN (and ABORT) lines always go where Chorus's go, its INFO
 * and TRACE lines when NCCL_DEBUG and NCCL_DEBUG_SUBSYS ask for them, printed at trace_as (TRACE) or
 * INFO; `who` names the source when the plugin gives no file. */
void log_plugin_v(const char* who, int trace_as, int level, unsigned long flags, const char* file, int line,
                  const char* fmt, va_list ap) __attribute__((format(printf, 7, 0)));
/* Lines that cannot be logged when they are made: the environment plugin's, while it is loaded or
 * answers (misc/env_plugin.c), when logging would read parameters through it. log_defer keeps the
 * line (at most 16 wait; a WARN is the last error at once); log_flush_deferred logs the waiting lines
 * as log_msg would, and does nothing while this thread configures logging (log_init flushes at its end). */
void log_defer(int level, unsigned subsys, const char* file, int line, const char* fmt, ...)
    __attribute__((format(printf, 5, 6)));
void log_defer_v(int level, unsigned subsys, const char* file, int line, const char* fmt, va_list ap)
    __attribute__((format(printf, 5, 0)));
void log_flush_deferred(void);
/* Text of the most recent WARN, whether printed or not (ncclGetLastError). */
const char* log_last_error(void);
/* Per-communicator record of the last WARN (ncclGetLastError(comm)). A thread inside a call on a
 * communicator points its sink there, so each WARN lands in the process record and in that comm's.
 * The mutex guards `text`: any thread may write (the one in a call) or read (ncclGetLastError). */
struct log_err_sink {
  pthread_mutex_t mu;
  char text[1024];
};
void log_sink_init(struct log_err_sink* s);
void log_sink_destroy(struct log_err_sink* s);
/* Make s this thread's sink (NULL: none); returns the previous one, for nesting. */
struct log_err_sink* log_set_error_sink(struct log_err_sink* s);
/* A copy of s's text, valid until this thread's next call. */
const char* log_sink_text(struct log_err_sink* s);
/* Rank/device shown in every line of this thread, like NCCL's [cudaDev]; -1 hides it. */
void log_set_thread_rank(int rank);

#define WARN(...) log_msg(LOG_WARN, LOG_ALL, __FILE__, __LINE__, __VA_ARGS__)
#define INFO(subsys, ...)                                                         \
  do {                                                                            \
    if (__atomic_load_n(&log_level_cached, __ATOMIC_ACQUIRE) < 0) log_init();     \
    if (__atomic_load_n(&log_level_cached, __ATOMIC_ACQUIRE) >= LOG_INFO &&        \
        (__atomic_load_n(&log_mask, __ATOMIC_RELAXED) & (unsigned)(subsys)))       \
      log_msg(LOG_INFO, (unsigned)(subsys), __FILE__, __LINE__, __VA_ARGS__);     \
  } while (0)

#endif
