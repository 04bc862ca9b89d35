/* One status type for every layer; values equal ncclResult_t so the API maps them by a cast. */
#ifndef CH_STATUS_H
#define CH_STATUS_H

#include <errno.h>

typedef enum ch_status {
  CH_OK = 0,
  CH_SYSTEM = 2,        /* a system call failed (errno logged where seen) */
  CH_INTERNAL = 3,      /* a bug in Chorus */
  CH_INVALID_ARG = 4,   /* the caller passed a bad value */
  CH_INVALID_USAGE = 5, /* the caller used the API in a wrong order/state */
  CH_REMOTE = 6,        /* a peer died, closed a connection or disagreed */
  CH_IN_PROGRESS = 7,   /* nonblocking operation still running */
  CH_TIMEOUT = 8,       /* a deadline passed */
  /* Internal only, never returned as is: the communicator was aborted (ncclCommAbort) while the call
   * waited. The API layer turns it into the communicator's earlier error, if it has one, else
   * ncclInvalidUsage (an expected outcome, not a bug: no "please report"). */
  CH_ABORTED = 100
} ch_status;

const char* ch_status_str(ch_status s);

/* A failing CHECK's breadcrumb: "core/init.c:312 -> 5 (invalid usage ...)" at NCCL_DEBUG=INFO, as
 * NCCL's NCCLCHECK leaves one, so a failure deep in setup shows the path it took (status.c). */
void ch_trail(const char* file, int line, ch_status s);

/* Propagate a failure. The cause has been logged once where it was first seen; each CHECK it passes
 * through adds a breadcrumb (not for CH_IN_PROGRESS, which is no failure). */
#define CHECK(call)                                      \
  do {                                                   \
    ch_status ch_s_ = (call);                            \
    if (ch_s_ != CH_OK) {                                \
      ch_trail(__FILE__, __LINE__, ch_s_);               \
      return ch_s_;                                      \
    }                                                    \
  } while (0)

#define CHECK_GOTO(call, res, label)                     \
  do {                                                   \
    (res) = (call);                                      \
    if ((res) != CH_OK) {                                \
      ch_trail(__FILE__, __LINE__, (res));               \
      goto label;                                        \
    }                                                    \
  } while (0)

/* Run a system call, retrying on EINTR; on failure log the call and errno text. */
#define SYS_CHECK(expr, what)                                                       \
  do {                                                                              \
    int ch_r_;                                                                      \
    do { ch_r_ = (int)(expr); } while (ch_r_ == -1 && errno == EINTR);              \
    if (ch_r_ == -1) {                                                              \
      WARN("%s failed: %s", what, strerror(errno));                                 \
      return CH_SYSTEM;                                                             \
    }                                                                               \
  } while (0)

#endif
