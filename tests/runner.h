/* Chorus test runner: every test runs in a forked child with a timeout, so a crash or a hang is a
 * failure of that test alone. Multi-rank helpers run the same body as threads of one process and as
 * separate processes. */
#ifndef CHORUS_TEST_RUNNER_H
#define CHORUS_TEST_RUNNER_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "nccl.h"

typedef void (*rt_test_fn)(void);
void rt_register(const char* suite, const char* name, rt_test_fn fn, int timeout_s);

#define TEST_T(suite, name, timeout_s)                                                   \
  static void test_##suite##_##name(void);                                               \
  __attribute__((constructor)) static void rt_reg_##suite##_##name(void) {               \
    rt_register(#suite, #name, test_##suite##_##name, timeout_s);                        \
  }                                                                                      \
  static void test_##suite##_##name(void)
#define TEST(suite, name) TEST_T(suite, name, 60)

/* Failure reporting: EXPECT records and continues, ASSERT ends the test (the child exits). */
void rt_fail(const char* file, int line, const char* fmt, ...) __attribute__((format(printf, 3, 4)));
void rt_fail_fatal(const char* file, int line, const char* fmt, ...) __attribute__((format(printf, 3, 4)));
int rt_failures(void);

#define EXPECT(c) \
  do { if (!(c)) rt_fail(__FILE__, __LINE__, "expected: %s", #c); } while (0)
#define ASSERT(c) \
  do { if (!(c)) rt_fail_fatal(__FILE__, __LINE__, "assertion failed: %s", #c); } while (0)
#define EXPECT_EQ(a, b)                                                                            \
  do { long long a_ = (long long)(a), b_ = (long long)(b);                                         \
       if (a_ != b_) rt_fail(__FILE__, __LINE__, "%s == %s: %lld != %lld", #a, #b, a_, b_); } while (0)
#define ASSERT_EQ(a, b)                                                                            \
  do { long long a_ = (long long)(a), b_ = (long long)(b);                                         \
       if (a_ != b_) rt_fail_fatal(__FILE__, __LINE__, "%s == %s: %lld != %lld", #a, #b, a_, b_); } while (0)
/* NCCL call that must succeed. */
#define NCCL_OK(call)                                                                              \
  do { ncclResult_t r_ = (call);                                                                   \
       if (r_ != ncclSuccess) rt_fail_fatal(__FILE__, __LINE__, "%s -> %d (%s)", #call, (int)r_,    \
                                            ncclGetErrorString(r_)); } while (0)

/* Multi-rank bodies. `id` is one unique id shared by all ranks of the run. A body signals failure
 * through EXPECT/ASSERT (in process mode each rank is its own child; in thread mode ASSERT ends
 * the whole test). */
typedef void (*rt_rank_fn)(int rank, int nranks, ncclUniqueId id, void* arg);
/* Run fn on nranks threads of this process; returns when all are done. */
void rt_run_threads(int nranks, rt_rank_fn fn, void* arg);
/* Fork nranks processes running fn; fails the test if any exits non-zero or is killed. */
void rt_run_procs(int nranks, rt_rank_fn fn, void* arg);
/* Both of the above, one after the other. */
void rt_run_both(int nranks, rt_rank_fn fn, void* arg);
/* Ranks of the current rt_run_* as in "threads" or "procs" (for messages). */
const char* rt_mode(void);

/* Count of open file descriptors and threads of this process (leak checks). */
int rt_count_fds(void);
int rt_count_threads(void);

#endif
