/* Text for each status. The strings follow ncclGetErrorString so the API layer can return them as-is. */
#include <string.h>

#include "log.h"
#include "status.h"

const char* ch_status_str(ch_status s) {
  switch ((int)s) {
    case CH_OK: return "no error";
    case 1: return "unhandled cuda error (run with NCCL_DEBUG=INFO for details)";
    case CH_SYSTEM: return "unhandled system error (run with NCCL_DEBUG=INFO for details)";
    case CH_INTERNAL: return "internal error - please report this issue to the Chorus developers";
    case CH_INVALID_ARG: return "invalid argument (run with NCCL_DEBUG=WARN for details)";
    case CH_INVALID_USAGE: return "invalid usage (run with NCCL_DEBUG=WARN for details)";
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
