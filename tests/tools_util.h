/* Helpers of the tools' tests (test_tools.c, test_chorusrun.c): find a built binary, run a command with
 * its output captured and a timeout, look at the output. */
#ifndef CHORUS_TEST_TOOLS_UTIL_H
#define CHORUS_TEST_TOOLS_UTIL_H

#include <stddef.h>
#include <sys/types.h>

#include "runner.h"

typedef struct {
  int status; /* exit code, or 128 + signal */
  char* out;
  char* err;
  double secs;
} cmd_result;

#define EXPECT_HAS(text, needle)                                                                     \
  do {                                                                                               \
    if (!strstr((text), (needle))) rt_fail(__FILE__, __LINE__, "missing \"%s\" in:\n%s", (needle), (text)); \
  } while (0)

const char* tu_bin(const char* name);
double tu_now_s(void);
void tu_append(char** buf, size_t* len, const char* data, size_t n);
pid_t tu_start_cmd(const char* const* env, char* const* argv, int* out_fd, int* err_fd);
cmd_result tu_finish_cmd(pid_t pid, int out_fd, int err_fd, double t0, int timeout_s);
cmd_result tu_run_argv(int timeout_s, const char* const* env, char* const* argv);
cmd_result tu_run(int timeout_s, const char* const* env, const char* prog, ...);
cmd_result tu_perf(const char* tool, const char* args, const char* const* env);
void tu_cmd_free(cmd_result* r);
int tu_count_str(const char* hay, const char* needle);
const char* tu_line_at(const char* text, int i, char* buf, size_t n);
char* tu_make_tmpdir(void);

#endif
