/* Text for each status. The strings follow ncclGetErrorString so the API layer can return them as-is. */
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
