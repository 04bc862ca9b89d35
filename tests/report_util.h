/* Watching a call from beside it: a thread of a rank's process asks chorusCommStallReport until the
 * report says what the test expects, and a flag in shared memory (threads and forked processes alike)
 * lets the other ranks go on only then, so the call being reported stays blocked while it is read.
 * Used by test_stall.c and test_window.c. */
#ifndef CHORUS_TEST_REPORT_UTIL_H
#define CHORUS_TEST_REPORT_UTIL_H

#include <stdatomic.h>

#include "nccl.h"

/* A flag shared with processes forked after it is made (0 at first); free with ru_flag_free. */
atomic_int* ru_flag_new(void);
void ru_flag_free(atomic_int* flag);
/* Wait up to 20 s for the flag. */
void ru_flag_wait(atomic_int* flag);

struct ru_monitor;
/* Ask for comm's report every 20 ms until it holds `want` (or an error, or 15 s), then set *done. */
struct ru_monitor* ru_monitor_start(ncclComm_t comm, const char* want, atomic_int* done);
/* Join the thread; its last report (the caller frees it). */
char* ru_monitor_join(struct ru_monitor* m);

#endif
