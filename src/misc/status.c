/* Text for each status. The strings follow ncclGetErrorString so the API layer can return them as-is. */
#include <string.h>

#include "log.h"
#include "status.h"

/* NCCL_DEBUG is at least lv already: then "run with NCCL_DEBUG=... for details" would send the user to
 * what they did (the WARN or INFO lines are printed above the error). */
static int debug_at_least(int lv) {
  if (__atomic_load_n(&log_level_cached, __ATOMIC_ACQUIRE) < 0) log_init();
  return __atomic_load_n(&log_level_cached, __ATOMIC_ACQUIRE) >= lv;
}

const char* ch_status_str(ch_status s) {
  int info = debug_at_least(LOG_INFO), warn = debug_at_least(LOG_WARN);
  switch ((int)s) {
    case CH_OK: return "no error";
    case 1: return info ? "unhandled cuda error" : "unhandled cuda error (run with NCCL_DEBUG=INFO for details)";
    case CH_SYSTEM: return info ? "unhandled system error" : "unhandled system error (run with NCCL_DEBUG=INFO for details)";
    case CH_INTERNAL: return "internal error - please report this issue to the Chorus developers";
    case CH_INVALID_ARG: return warn ? "invalid argument" : "invalid argument (run with NCCL_DEBUG=WARN for details)";
    case CH_INVALID_USAGE: return warn ? "invalid usage" : "invalid usage (run with NCCL_DEBUG=WARN for details)";
    case CH_REMOTE: return "remote process exited or there was a network error";
    case CH_IN_PROGRESS: return "NCCL operation in progress";
    case CH_TIMEOUT: return "timeout";
    case CH_ABORTED: return "communicator aborted";
    default: return "unknown result code";
  }
}

void ch_trail(const char* file, int line, ch_status s) {
  if (s == CH_IN_PROGRESS) return;
  const char* at = file; /* the path under src/, whatever the checkout's */
  for (const char* p = strstr(file, "/src/"); p; p = strstr(p + 1, "/src/")) at = p + 5;
  INFO(LOG_ALL, "%s:%d -> %d (%s)", at, line, (int)s, ch_status_str(s));
}
