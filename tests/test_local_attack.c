/* What another user of the machine can reach (docs/SECURITY.md, "Local attackers"): folders and files
 * planted in a shared /tmp before Chorus writes its dumps and traces, and a flood of refused requests
 * on the descriptor socket. The attacker is uid 65534 in a forked child; the victim folder is a fresh
 * world-writable sticky folder, as /tmp is. Needs root to switch users; skipped otherwise. */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <grp.h>
#include <fcntl.h>
#include <pthread.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include "chorus.h"
#include "comm/comm.h"
#include "fault/stall.h"
#include "misc/log.h"
#include "misc/param.h"
#include "misc/safefile.h"
#include "misc/utils.h"
#include "observe/observe.h"
#include "runner.h"
#include "transport/transport.h"

#define NOBODY 65534

static int need_root(void) {
  if (geteuid() == 0) return 1;
  printf("    SKIP: switching to uid %d (the attacker) needs root\n", NOBODY);
  return 0;
}

/* A fresh folder like /tmp: root's, mode 1777. */
static void shared_tmp(char* dir, size_t len) {
  snprintf(dir, len, "/tmp/chorus-la-XXXXXX");
  ASSERT(mkdtemp(dir) != NULL);
  ASSERT(chmod(dir, 01777) == 0);
}

/* Runs fn(arg) as uid/gid 65534 in a child; 1 if it returned 0, else 0 (the test fails). */
static int as_nobody(int (*fn)(void*), void* arg) {
  pid_t pid = fork();
  ASSERT(pid >= 0);
  if (pid == 0) {
    /* No supplementary groups either: root's would let the attacker reach what 65534 cannot. */
    if (setgroups(0, NULL) != 0 || setresgid(NOBODY, NOBODY, NOBODY) != 0 || setresuid(NOBODY, NOBODY, NOBODY) != 0)
      _exit(77);
    umask(0);
    _exit(fn(arg));
  }
  int st = 0;
  ASSERT(waitpid(pid, &st, 0) == pid);
  ASSERT(WIFEXITED(st) && WEXITSTATUS(st) != 77);
  if (WEXITSTATUS(st) != 0) rt_fail(__FILE__, __LINE__, "the attacker's setup failed (%d)", WEXITSTATUS(st));
  return WEXITSTATUS(st) == 0;
}

static int files_in(const char* dir) {
  DIR* d = opendir(dir);
  if (!d) return -1;
  int n = 0;
  for (struct dirent* e; (e = readdir(d));) n += strcmp(e->d_name, ".") && strcmp(e->d_name, "..");
  closedir(d);
  return n;
}

static ncclComm_t one_rank(void) {
  ncclUniqueId id;
  ncclComm_t comm = NULL;
  NCCL_OK(ncclGetUniqueId(&id));
  NCCL_OK(ncclCommInitRank(&comm, 1, id, 0));
  return comm;
}

/* ---- the flight recorder's folder ---- */

enum plant { P_DIR_0777, P_SYMLINK, P_TMP_FILE, P_TMP_FIFO };
struct plant_arg {
  enum plant kind;
  char dir[256], target[256], tmpname[600];
};

/* A link goes in a folder of the attacker's (not sticky), so that no fs.protected_symlinks setting of
 * the kernel stops root following it: Chorus must refuse it itself. */
static int plant_link(void* p) {
  struct plant_arg* a = p;
  char evil[300];
  snprintf(evil, sizeof(evil), "%s", a->dir);
  *strrchr(evil, '/') = 0;
  if (mkdir(evil, 0755) != 0 && errno != EEXIST) return 5;
  return symlink(a->target, a->dir) == 0 ? 0 : 1;
}

static int plant(void* p) {
  struct plant_arg* a = p;
  if (a->kind == P_SYMLINK) return plant_link(p);
  if (mkdir(a->dir, 0777) != 0) return 2;
  if (a->kind == P_TMP_FILE) {
    int fd = open(a->tmpname, O_WRONLY | O_CREAT | O_EXCL, 0666);
    return fd >= 0 && close(fd) == 0 ? 0 : 3;
  }
  if (a->kind == P_TMP_FIFO) return mkfifo(a->tmpname, 0666) == 0 ? 0 : 4;
  return 0;
}

static void* dump_by_signal(void* arg) {
  (void)arg;
  stall_dump_all(STALL_DUMP_SIGNAL); /* as CHORUS_DUMP_SIGNAL does, under the registry's lock */
  return NULL;
}

/* Before: the folder was used as found. A 0777 folder of the attacker's got root's dumps (readable,
 * forgeable); a link to a folder of root's (as /etc) made root write there; a planted temporary file
 * was written and renamed into place; a planted FIFO blocked the dump thread in open() holding the
 * registry's lock, and ncclCommDestroy then waited for that lock for ever. Now the folder is
 * refused (WARN, no dump) and nothing is written anywhere. */
static void planted_dump_dir(enum plant kind) {
  if (!need_root()) return;
  char shared[64], victim[64];
  shared_tmp(shared, sizeof(shared));
  snprintf(victim, sizeof(victim), "/tmp/chorus-la-victim-XXXXXX");
  ASSERT(mkdtemp(victim) != NULL); /* root's own folder, 0700, as /etc would be */
  struct plant_arg a = {.kind = kind};
  snprintf(a.dir, sizeof(a.dir), "%s/chorus-dump-0", shared);
  snprintf(a.target, sizeof(a.target), "%s", victim);
  unsetenv("CHORUS_DUMP_DIR");
  setenv("TMPDIR", shared, 1); /* the default folder, $TMPDIR/chorus-dump-<uid> */
  if (kind == P_SYMLINK) {
    snprintf(a.dir, sizeof(a.dir), "%s/evil/dump", shared);
    setenv("CHORUS_DUMP_DIR", a.dir, 1);
  }
  param_reset();
  ncclComm_t comm = one_rank();
  snprintf(a.tmpname, sizeof(a.tmpname), "%s/chorus-fr-%016llx-r0.txt.%d.tmp", a.dir,
           (unsigned long long)comm->comm_hash, (int)getpid());
  ASSERT(as_nobody(plant, &a));
  EXPECT_EQ(strcmp(obs_dump_dir(), a.dir), 0);
  if (kind == P_TMP_FIFO) {
    pthread_t t;
    ASSERT(pthread_create(&t, NULL, dump_by_signal, NULL) == 0);
    usleep(200000);                 /* the dump thread reaches its open() */
    NCCL_OK(ncclCommDestroy(comm)); /* hung here for ever before */
    pthread_join(t, NULL);
    EXPECT_EQ(files_in(a.dir), 1); /* the FIFO alone */
  } else {
    char path[512] = "x";
    EXPECT_EQ(chorusCommDumpFlightRecorder(comm, path, sizeof(path)), ncclSystemError);
    EXPECT(strstr(ncclGetLastError(NULL), "not writing dumps") != NULL);
    EXPECT_EQ(path[0], 0);
    NCCL_OK(ncclCommDestroy(comm));
    EXPECT_EQ(files_in(victim), 0);
    if (kind != P_SYMLINK) EXPECT_EQ(files_in(a.dir), kind == P_DIR_0777 ? 0 : 1);
    struct stat st;
    if (kind == P_TMP_FILE) EXPECT(stat(a.tmpname, &st) == 0 && st.st_size == 0 && st.st_uid == NOBODY);
  }
}

TEST_T(security, local_dump_dir_other_users, 30) { planted_dump_dir(P_DIR_0777); }
TEST_T(security, local_dump_dir_symlink, 30) { planted_dump_dir(P_SYMLINK); }
TEST_T(security, local_dump_tmp_file_planted, 30) { planted_dump_dir(P_TMP_FILE); }
TEST_T(security, local_dump_fifo_no_hang, 30) { planted_dump_dir(P_TMP_FIFO); }

/* A folder of our own still works: made 0700 with its parents, and dumps land in it. */
TEST_T(security, local_dump_dir_own, 30) {
  char base[64];
  snprintf(base, sizeof(base), "/tmp/chorus-la-own-XXXXXX");
  ASSERT(mkdtemp(base) != NULL);
  char dir[128];
  snprintf(dir, sizeof(dir), "%s/a/b", base);
  setenv("CHORUS_DUMP_DIR", dir, 1);
  param_reset();
  ncclComm_t comm = one_rank();
  char path[512];
  NCCL_OK(chorusCommDumpFlightRecorder(comm, path, sizeof(path)));
  NCCL_OK(chorusCommDumpFlightRecorder(comm, path, sizeof(path))); /* replaces the first */
  NCCL_OK(ncclCommDestroy(comm));
  struct stat st;
  EXPECT(stat(path, &st) == 0 && S_ISREG(st.st_mode) && (st.st_mode & 077) == 0);
  EXPECT(stat(dir, &st) == 0 && (st.st_mode & 07777) == 0700);
  EXPECT_EQ(files_in(dir), 1);
}

/* ---- the trace's folder ---- */

/* Before: CHORUS_TRACE=<a folder another user made, 0777> got the trace (hosts, pids, every call). */
TEST_T(security, local_trace_dir_other_users, 30) {
  if (!need_root()) return;
  char shared[64];
  shared_tmp(shared, sizeof(shared));
  struct plant_arg a = {.kind = P_DIR_0777};
  snprintf(a.dir, sizeof(a.dir), "%s/trace", shared);
  ASSERT(as_nobody(plant, &a));
  setenv("CHORUS_TRACE", a.dir, 1);
  param_reset();
  ncclComm_t comm = one_rank();
  EXPECT(strstr(ncclGetLastError(NULL), "CHORUS_TRACE: not writing") != NULL);
  NCCL_OK(ncclCommDestroy(comm));
  EXPECT_EQ(files_in(a.dir), 0);
}

/* docs/DIAGNOSING.md's walkthrough (issue 49.5): CHORUS_TRACE=/tmp/walk/trace on a fresh machine. Before:
 * "cannot write", since only the last folder was made. Now the missing ones are made, 0700. */
TEST_T(security, trace_makes_missing_parents, 30) {
  char base[64];
  snprintf(base, sizeof(base), "/tmp/chorus-la-walk-XXXXXX");
  ASSERT(mkdtemp(base) != NULL);
  char dir[160], walk[96];
  snprintf(walk, sizeof(walk), "%s/walk", base);
  snprintf(dir, sizeof(dir), "%s/trace", walk);
  setenv("CHORUS_TRACE", dir, 1);
  param_reset();
  ncclComm_t comm = one_rank();
  float x = 1;
  NCCL_OK(ncclAllReduce(&x, &x, 1, ncclFloat, ncclSum, comm, NULL));
  NCCL_OK(ncclCommDestroy(comm));
  EXPECT_EQ(files_in(dir), 1);
  struct stat st;
  EXPECT(stat(walk, &st) == 0 && (st.st_mode & 07777) == 0700);
  EXPECT(stat(dir, &st) == 0 && (st.st_mode & 07777) == 0700);
}

/* ---- the debug log and the tools' outputs ---- */

/* NCCL_DEBUG_FILE=/tmp/... where another user placed a link to a file of root's: the log is not
 * appended to the link's target (it goes to stdout). A tool's output (chorus-info --calibrate, a plot)
 * named there is not written through it either: in the attacker's folder it is refused, in the
 * sticky folder itself it replaces the link (a fresh file renamed over it). */
TEST_T(security, local_log_and_output_links, 30) {
  if (!need_root()) return;
  char shared[64], victim[64];
  shared_tmp(shared, sizeof(shared));
  snprintf(victim, sizeof(victim), "/tmp/chorus-la-victim-XXXXXX");
  int vfd = mkstemp(victim);
  ASSERT(vfd >= 0);
  close(vfd);
  struct plant_arg a = {.kind = P_SYMLINK}, b = {.kind = P_SYMLINK};
  snprintf(a.dir, sizeof(a.dir), "%s/evil/nccl.log", shared);
  snprintf(b.dir, sizeof(b.dir), "%s/out.json", shared);
  snprintf(a.target, sizeof(a.target), "%s", victim);
  snprintf(b.target, sizeof(b.target), "%s", victim);
  ASSERT(as_nobody(plant_link, &a));
  ASSERT(as_nobody(plant_link, &b));
  EXPECT(sf_append(a.dir, 0644) < 0);
  EXPECT(sf_append(b.dir, 0644) < 0);
  setenv("NCCL_DEBUG", "WARN", 1);
  setenv("NCCL_DEBUG_FILE", b.dir, 1);
  param_reset();
  log_reset();
  float x = 0;
  EXPECT_EQ(ncclSend(&x, 1, ncclFloat, 0, NULL, NULL), ncclInvalidArgument); /* a WARN */
  struct sf_file f;
  char why[256];
  EXPECT(sf_open_path(&f, a.dir, why, sizeof(why)) != 0 && strstr(why, "owned by uid 65534"));
  ASSERT(sf_open_path(&f, b.dir, why, sizeof(why)) == 0);
  fputs("ours\n", f.f);
  EXPECT(sf_commit(&f) == 0);
  struct stat st;
  EXPECT(stat(victim, &st) == 0 && st.st_size == 0);
  EXPECT(lstat(b.dir, &st) == 0 && S_ISREG(st.st_mode) && st.st_uid == 0 && st.st_size == 5);
  EXPECT_EQ(files_in(shared), 2); /* evil/ and out.json: no temporary file left */
  unlink(victim);
}

/* ---- the descriptor socket ---- */

static int probe_fd_server(void* p) {
  uint64_t nonce = *(uint64_t*)p;
  for (int i = 0; i < 5; i++) {
    struct sockaddr_un a = {.sun_family = AF_UNIX};
    int n = snprintf(a.sun_path + 1, sizeof(a.sun_path) - 1, "chorus-fd-%016llx", (unsigned long long)nonce);
    int s = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (s < 0 || connect(s, (struct sockaddr*)&a, (socklen_t)(offsetof(struct sockaddr_un, sun_path) + 1 + n)) != 0)
      return 1;
    char c;
    (void)recv(s, &c, 1, 0); /* until the server hangs up: it has logged the refusal */
    close(s);
  }
  return 0;
}

static int count_lines(const char* path, const char* a, const char* b) {
  FILE* f = fopen(path, "r");
  if (!f) return -1;
  char line[1024];
  int n = 0;
  while (fgets(line, sizeof(line), f)) n += strstr(line, a) && strstr(line, b);
  fclose(f);
  return n;
}

/* Before: every refused request on the descriptor-passing socket logged a WARN, so another user could
 * fill the log. Now one per uid a minute, the rest at INFO. */
TEST_T(security, local_fdpass_refusals_rate_limited, 30) {
  if (!need_root()) return;
  char log[64];
  snprintf(log, sizeof(log), "/tmp/chorus-la-log-XXXXXX");
  int lfd = mkstemp(log);
  ASSERT(lfd >= 0);
  close(lfd);
  setenv("NCCL_DEBUG", "WARN", 1);
  setenv("NCCL_DEBUG_FILE", log, 1);
  param_reset();
  log_reset();
  int fd = tp_memfd_new("chorus-test", 4096, 0);
  ASSERT(fd >= 0);
  uint64_t token = tp_fd_export(fd, 4096), nonce = ut_proc_nonce();
  ASSERT(token != 0);
  EXPECT(as_nobody(probe_fd_server, &nonce));
  tp_fd_withdraw(token);
  close(fd);
  EXPECT_EQ(count_lines(log, "WARN", "descriptor request from pid"), 1);
  unlink(log);
}

/* PyTorch's default puts dumps straight into /tmp (docs/OBSERVE.md): a sticky folder of root's is
 * used, the dump made under a fresh temporary name and renamed, readable by us alone. */
TEST_T(security, local_dump_into_sticky_tmp, 30) {
  char shared[64];
  shared_tmp(shared, sizeof(shared));
  setenv("CHORUS_DUMP_DIR", shared, 1);
  param_reset();
  ncclComm_t comm = one_rank();
  char path[512];
  NCCL_OK(chorusCommDumpFlightRecorder(comm, path, sizeof(path)));
  NCCL_OK(ncclCommDestroy(comm));
  struct stat st;
  EXPECT(lstat(path, &st) == 0 && S_ISREG(st.st_mode) && (st.st_mode & 077) == 0);
  EXPECT_EQ(files_in(shared), 1);
}
