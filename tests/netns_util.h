/* Multi-host tests on one machine: the test side brings up network-namespace "hosts" with
 * tools/netns-cluster.sh, runs a suite of this runner binary as the ranks (one process per rank, on
 * those hosts), and reads the files the ranks leave in a shared directory. Used by test_cluster.c and
 * test_faults.c. One cluster per test process. */
#ifndef CHORUS_TEST_NETNS_UTIL_H
#define CHORUS_TEST_NETNS_UTIL_H

#include <stddef.h>
#include <sys/types.h>

/* system(3) of a formatted command; its exit status, or 128 + signal. */
int nn_sh(const char* fmt, ...) __attribute__((format(printf, 1, 2)));
/* Bring up `hosts` hosts with namespace prefix tag+pid; 0 (SKIP printed) when they cannot be made
 * here (not root, no script, no namespaces). Torn down at exit or by nn_down. */
int nn_up(const char* tag, int hosts);
/* The same with options for the script's `up` (e.g. "--rails 2 --rate 1gbit"; "" or NULL: none). */
int nn_up_opts(const char* tag, int hosts, const char* opts);
void nn_down(void);
/* The netns-cluster.sh path, and the directory the ranks write to (CHORUS_CLUSTER_DIR). */
const char* nn_script(void);
const char* nn_dir(void);
/* Start `run N [opts] --tag --timeout T <this binary> <suite.body>` in the background; wait for it. */
pid_t nn_start(const char* opts, int n, int timeout_s, const char* suite_body);
int nn_wait(pid_t pid);
static inline int nn_run(const char* opts, int n, int timeout_s, const char* suite_body) {
  return nn_wait(nn_start(opts, n, timeout_s, suite_body));
}
/* How many of ranks 0..n-1 left the file <stem><rank> (removed after counting if `consume`). */
int nn_count(const char* stem, int n, int consume);
/* Whether data moves between hosts: CHORUS_TEST_NET=1 yes, =0 no (SKIP printed); unset, 2 ranks run
 * `suite_body` (which writes nonet0 when the build has no network transport) and tell. */
int nn_net_enabled(const char* suite_body);

/* ---- the rank side (inside a host) ---- */
/* This rank's number, rank count and host, from the variables the script sets; 0 (and a note) when
 * not run by the script. */
int nn_rank(const char* suite, int* rank, int* n, int* host);
/* Write text (may be NULL) to <dir>/<stem><rank>; read it back (0 if absent). */
void nn_file(const char* stem, int rank, const char* text);
int nn_read(const char* stem, int rank, char* buf, size_t len);

#endif
