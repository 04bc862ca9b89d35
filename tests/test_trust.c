/* Nothing that crosses the bootstrap is an address or a descriptor (issue 9, items 1 and 2): forged
 * local and shm handles are refused with a WARN, a descriptor that is not a sealed Chorus memfd of the
 * expected size and token is refused, a process of another user gets nothing from the descriptor
 * server, and ranks in separate PID namespaces work over shared memory. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include "chorus.h"
#include "comm/comm.h"
#include "misc/utils.h"
#include "runner.h"

static const struct tp_sizes small = {{CH_STEPS * 4096, CH_STEPS * 4096, CH_STEPS * 4096}};

/* Both ends are this process (the peer's nonce is ours). */
static struct tp_ctx ctx_self(void) { return (struct tp_ctx){.peer_nonce = ut_proc_nonce()}; }

/* The impostor of the review sent ptr = 0x4141414141410000; the sender dereferenced it. Now such a
 * value is a token nobody published. */
TEST(trust, local_forged_token_refused) {
  struct conn recv = {0}, send = {0}, again = {0};
  struct tp_ctx x = ctx_self();
  struct tp_handle h, forged;
  recv.peer = 1, send.peer = 0, again.peer = 0;
  ASSERT_EQ(tp_local_recv_setup(&recv, &small, &h, &x), CH_OK);
  forged = h;
  forged.token = 0x4141414141410000ull;
  EXPECT_EQ(tp_local_send_connect(&send, &small, &forged, &x), CH_INVALID_USAGE);
  EXPECT(!send.connected);
  forged.token = 0;
  EXPECT_EQ(tp_local_send_connect(&send, &small, &forged, &x), CH_INVALID_USAGE);
  /* The real token works, once. */
  ASSERT_EQ(tp_local_send_connect(&send, &small, &h, &x), CH_OK);
  EXPECT(send.ctrl == recv.ctrl);
  EXPECT_EQ(tp_local_send_connect(&again, &small, &h, &x), CH_INVALID_USAGE);
  tp_conn_free(&send);
  tp_conn_free(&recv);
}

/* A FIFO that was withdrawn (its receiver left) is not found either: no use after free. */
TEST(trust, local_withdrawn_token_refused) {
  struct conn recv = {0}, send = {0};
  struct tp_ctx x = ctx_self();
  struct tp_handle h;
  ASSERT_EQ(tp_local_recv_setup(&recv, &small, &h, &x), CH_OK);
  tp_conn_free(&recv);
  EXPECT_EQ(tp_local_send_connect(&send, &small, &h, &x), CH_INVALID_USAGE);
}

TEST(trust, shm_forged_token_refused) {
  struct conn recv = {0}, send = {0};
  struct tp_ctx x = ctx_self();
  struct tp_handle h, forged;
  recv.peer = 1, send.peer = 0;
  ASSERT_EQ(tp_shm_recv_setup(&recv, &small, &h, &x), CH_OK);
  forged = h;
  forged.token ^= 1; /* a token the server never exported */
  EXPECT_EQ(tp_shm_send_connect(&send, &small, &forged, &x), CH_SYSTEM);
  forged = h;
  forged.nonce ^= 1; /* not the process the peer joined from */
  EXPECT_EQ(tp_shm_send_connect(&send, &small, &forged, &x), CH_REMOTE);
  EXPECT(!send.connected);
  ASSERT_EQ(tp_shm_send_connect(&send, &small, &h, &x), CH_OK);
  send.ctrl->size[3] = 12345; /* one segment, two mappings */
  EXPECT_EQ(recv.ctrl->size[3], 12345);
  tp_shm_ops.recv_done(&recv, 1, NULL, &x);
  tp_conn_free(&send);
  tp_conn_free(&recv);
}

/* Export fd (whose real size is `real`) with its header word = token (or not), and map it expecting
 * `asked` bytes: NULL unless it is what a Chorus peer would have exported. */
static void* try_map(int fd, size_t real, size_t asked, int good_header) {
  ASSERT(fd >= 0);
  uint64_t token = tp_fd_export(fd, real);
  ASSERT(token != 0);
  uint64_t word = good_header ? token : token ^ 1;
  ASSERT(pwrite(fd, &word, sizeof(word), 0) == (ssize_t)sizeof(word));
  void* m = tp_fd_map(ut_proc_nonce(), token, asked, 0, 0, 0, "a test segment");
  tp_fd_withdraw(token);
  close(fd);
  return m;
}

static int sealed_memfd(const char* name, size_t bytes) {
  int fd = memfd_create(name, MFD_CLOEXEC | MFD_ALLOW_SEALING);
  if (fd >= 0 && (ftruncate(fd, (off_t)bytes) != 0 || fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW) != 0)) {
    close(fd);
    return -1;
  }
  return fd;
}

TEST(trust, non_chorus_fd_refused) {
  const size_t bytes = 8192;
  char tmpl[] = "/tmp/chorus-trust-XXXXXX";
  int file = mkstemp(tmpl);
  ASSERT(file >= 0);
  unlink(tmpl);
  ASSERT(ftruncate(file, (off_t)bytes) == 0);
  EXPECT(try_map(file, bytes, bytes, 1) == NULL); /* a regular file */
  EXPECT(try_map(sealed_memfd("other", bytes), bytes, bytes, 1) == NULL); /* someone else's memfd */
  int unsealed = memfd_create("chorus-x", MFD_CLOEXEC);
  ASSERT(unsealed >= 0 && ftruncate(unsealed, (off_t)bytes) == 0);
  EXPECT(try_map(unsealed, bytes, bytes, 1) == NULL);                             /* could shrink: SIGBUS */
  EXPECT(try_map(tp_memfd_new("chorus-x", bytes, 0), bytes, 2 * bytes, 1) == NULL); /* too small */
  EXPECT(try_map(tp_memfd_new("chorus-x", 2 * bytes, 0), 2 * bytes, bytes, 1) == NULL); /* not the one */
  EXPECT(try_map(tp_memfd_new("chorus-x", bytes, 0), bytes, bytes, 0) == NULL);   /* another token */
  void* m = try_map(tp_memfd_new("chorus-x", bytes, 0), bytes, bytes, 1);          /* the real thing */
  EXPECT(m != NULL);
  if (m) munmap(m, bytes);
}

/* A process of another user connects to our descriptor server and asks for a valid token: it gets
 * no descriptor (the server checks SO_PEERCRED), and the library's importer in that process refuses
 * to deal with a server of another user anyway. */
TEST(trust, other_uid_gets_no_fd) {
  if (geteuid() != 0) {
    printf("    skipped: switching to uid nobody needs root\n");
    return;
  }
  int fd = tp_memfd_new("chorus-test", 4096, 0);
  ASSERT(fd >= 0);
  uint64_t token = tp_fd_export(fd, 4096), nonce = ut_proc_nonce();
  ASSERT(token != 0);
  ASSERT(pwrite(fd, &token, sizeof(token), 0) == (ssize_t)sizeof(token));
  pid_t pid = fork();
  ASSERT(pid >= 0);
  if (pid == 0) {
    if (setresgid(65534, 65534, 65534) != 0 || setresuid(65534, 65534, 65534) != 0) _exit(77);
    struct sockaddr_un a = {.sun_family = AF_UNIX};
    int n = snprintf(a.sun_path + 1, sizeof(a.sun_path) - 1, "chorus-fd-%016llx", (unsigned long long)nonce);
    int s = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (s < 0 || connect(s, (struct sockaddr*)&a, (socklen_t)(offsetof(struct sockaddr_un, sun_path) + 1 + n)) != 0)
      _exit(3);
    struct { uint64_t magic, token; } rq = {0x43484f5255534644ull, token};
    /* The server may already have hung up on us (EPIPE): then nothing can come back either. */
    (void)send(s, &rq, sizeof(rq), MSG_NOSIGNAL);
    char buf[64];
    union { struct cmsghdr h; char b[CMSG_SPACE(sizeof(int) * 4)]; } ctl;
    struct iovec iov = {buf, sizeof(buf)};
    struct msghdr m = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = ctl.b, .msg_controllen = sizeof(ctl.b)};
    ssize_t got = recvmsg(s, &m, 0);
    if (got > 0 && CMSG_FIRSTHDR(&m) != NULL) _exit(1); /* a descriptor came back */
    if (tp_fd_map(nonce, token, 4096, 0, 0, 0, "a test segment") != NULL) _exit(2);
    _exit(0);
  }
  int st = 0;
  ASSERT(waitpid(pid, &st, 0) == pid);
  tp_fd_withdraw(token);
  close(fd);
  if (WIFEXITED(st) && WEXITSTATUS(st) == 77) {
    printf("    skipped: cannot switch to uid 65534 here\n");
    return;
  }
  if (!WIFEXITED(st) || WEXITSTATUS(st) != 0)
    rt_fail(__FILE__, __LINE__, "the process of uid 65534: %s %d", WIFEXITED(st) ? "exit" : "signal",
            WIFEXITED(st) ? WEXITSTATUS(st) : WTERMSIG(st));
}

/* ---- ranks in separate PID namespaces (containers sharing the host network) ---- */

/* One rank of trust.pid_namespaces (started by it under `unshare --pid`); alone it does nothing. */
TEST(trust, ns_rank) {
  if (!getenv("CHORUS_TRUST_NS_RANK")) {
    printf("    (a rank of trust.pid_namespaces: nothing to do on its own)\n");
    return;
  }
  EXPECT(getpid() < 10); /* a fresh PID namespace: the other rank has the same small pid */
  ncclComm_t comm = NULL;
  NCCL_OK(chorusInitFromEnv(&comm));
  int rank = comm->rank, n = comm->nranks, peer = 1 - rank;
  ASSERT_EQ(n, 2);
  EXPECT_EQ(comm->peer_tp[peer], TP_SHM);
  const size_t count = 1 << 16;
  float *a = NULL, *b = malloc(count * sizeof(float)), *r = malloc(count * sizeof(float));
  ASSERT(b && r);
  NCCL_OK(ncclMemAlloc((void**)&a, count * sizeof(float)));
  for (int rep = 0; rep < 2; rep++) {
    float* buf = rep == 0 ? a : b; /* ncclMemAlloc: Direct through the descriptor servers; else Ring */
    for (size_t i = 0; i < count; i++) buf[i] = (float)(rank + 1 + (int)(i % 7));
    NCCL_OK(ncclAllReduce(buf, buf, count, ncclFloat, ncclSum, comm, NULL));
    if (rep == 0) EXPECT(comm->clique && atomic_load(&comm->clique->slot[rank].done) == comm->seq + 1);
    for (size_t i = 0; i < count; i++)
      if (buf[i] != (float)(3 + 2 * (int)(i % 7))) {
        rt_fail(__FILE__, __LINE__, "rank %d rep %d: [%zu] = %g", rank, rep, i, buf[i]);
        break;
      }
  }
  for (size_t i = 0; i < count; i++) b[i] = (float)(rank * 100000 + (int)i);
  NCCL_OK(ncclGroupStart());
  NCCL_OK(ncclSend(b, count, ncclFloat, peer, comm, NULL));
  NCCL_OK(ncclRecv(r, count, ncclFloat, peer, comm, NULL));
  NCCL_OK(ncclGroupEnd());
  for (size_t i = 0; i < count; i++)
    if (r[i] != (float)(peer * 100000 + (int)i)) {
      rt_fail(__FILE__, __LINE__, "rank %d: received [%zu] = %g", rank, i, r[i]);
      break;
    }
  NCCL_OK(ncclMemFree(a));
  free(b);
  free(r);
  NCCL_OK(ncclCommDestroy(comm));
}

TEST_T(trust, pid_namespaces, 120) {
  if (system("unshare --pid --fork --mount-proc true >/dev/null 2>&1") != 0) {
    printf("    skipped: unshare --pid --fork --mount-proc is not permitted here\n");
    return;
  }
  char self[PATH_MAX];
  ssize_t k = readlink("/proc/self/exe", self, sizeof(self) - 1);
  ASSERT(k > 0);
  self[k] = '\0';
  int ls = socket(AF_INET, SOCK_STREAM, 0);
  struct sockaddr_in sa = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
  socklen_t sl = sizeof(sa);
  ASSERT(ls >= 0 && bind(ls, (struct sockaddr*)&sa, sizeof(sa)) == 0);
  ASSERT(getsockname(ls, (struct sockaddr*)&sa, &sl) == 0);
  char comm_id[64];
  snprintf(comm_id, sizeof(comm_id), "127.0.0.1:%d", ntohs(sa.sin_port));
  close(ls);
  pid_t pids[2];
  for (int r = 0; r < 2; r++) {
    pids[r] = fork();
    ASSERT(pids[r] >= 0);
    if (pids[r] == 0) {
      char rank[8];
      snprintf(rank, sizeof(rank), "%d", r);
      setenv("NCCL_COMM_ID", comm_id, 1);
      setenv("RANK", rank, 1);
      setenv("WORLD_SIZE", "2", 1);
      setenv("CHORUS_TRUST_NS_RANK", rank, 1);
      setenv("CHORUS_SHM_DIRECT_MIN_BYTES", "0", 1);
      execlp("unshare", "unshare", "--pid", "--fork", "--mount-proc", self, "trust.ns_rank", (char*)NULL);
      _exit(127);
    }
  }
  for (int r = 0; r < 2; r++) {
    int st = 0;
    ASSERT(waitpid(pids[r], &st, 0) == pids[r]);
    if (!WIFEXITED(st) || WEXITSTATUS(st) != 0)
      rt_fail(__FILE__, __LINE__, "rank %d in its own PID namespace: %s %d", r,
              WIFEXITED(st) ? "exit" : "signal", WIFEXITED(st) ? WEXITSTATUS(st) : WTERMSIG(st));
  }
}

/* ---- fork hooks (misc/atfork.c) ---- */

/* ut_atfork_register runs its rows as pthread_atfork runs its own: prepare in reverse registration
 * order, parent and child in registration order. */
static char fork_log[16];
static int fork_len;
static void note(char c) {
  if (fork_len < (int)sizeof(fork_log) - 1) fork_log[fork_len++] = c;
}
static void pa(void) { note('a'); }
static void pb(void) { note('b'); }
static void pc(void) { note('c'); }
static void xa(void) { note('A'); }
static void xb(void) { note('B'); }
static void xc(void) { note('C'); }

TEST(trust, fork_hooks_run_in_pthread_atfork_order) {
  ut_atfork_register(pa, xa, xa);
  ut_atfork_register(pb, NULL, xb); /* a NULL hook is skipped */
  ut_atfork_register(pc, xc, xc);
  fork_len = 0;
  pid_t pid = fork();
  ASSERT(pid >= 0);
  fork_log[fork_len] = '\0';
  if (pid == 0) _exit(strcmp(fork_log, "cbaABC") == 0 ? 0 : 1);
  int st = 0;
  ASSERT_EQ(waitpid(pid, &st, 0), pid);
  EXPECT(WIFEXITED(st) && WEXITSTATUS(st) == 0); /* the child saw "cbaABC" */
  if (strcmp(fork_log, "cbaAC") != 0) rt_fail(__FILE__, __LINE__, "parent saw \"%s\", not \"cbaAC\"", fork_log);
}
