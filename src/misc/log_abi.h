/* NCCL's logger callback as plugins see it (tuner and net plugins alike): the level numbering and the
 * printf-like function a plugin logs through. Shared so that both plugin ABIs can be included at once. */
#ifndef CH_LOG_ABI_H
#define CH_LOG_ABI_H

typedef enum {
  NCCL_LOG_NONE = 0, NCCL_LOG_VERSION = 1, NCCL_LOG_WARN = 2, NCCL_LOG_INFO = 3, NCCL_LOG_ABORT = 4,
  NCCL_LOG_TRACE = 5
} ncclDebugLogLevel;
/* flags: NCCL_DEBUG_SUBSYS bits (NCCL_INIT 0x1, ..., NCCL_NET 0x10, NCCL_TUNING 0x40, ...). */
typedef void (*ncclDebugLogger_t)(ncclDebugLogLevel level, unsigned long flags, const char* file, int line,
                                  const char* fmt, ...);

#endif
