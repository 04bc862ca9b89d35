/* Descriptor passing between processes of one host: no pid, descriptor number or /proc/<pid> path
 * is ever taken from a peer.
 *
 * Memfds that peers in other processes must map are exported under a random token. One thread of
 * this process listens on the abstract unix socket "\0chorus-fd-<proc nonce>"; a peer connects, sends
 * the token and gets the descriptor by SCM_RIGHTS. The kernel tells each side who the other is
 * (SO_PEERCRED): only processes of our own user are served, and an importer only accepts an answer
 * from a server of its own user. The importer then checks that what it got is a sealed Chorus memfd
 * of exactly the expected size carrying the token in its header before mapping it. This works across
 * PID namespaces; abstract sockets are per network namespace, so ranks on one host must share it.
 *
 * The server thread starts with the first export and is joined when the last export is withdrawn,
 * at fork (the child gets its own, under its own nonce, when it exports) and at library unload. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include "../misc/log.h"
#include "../misc/param.h"
#include "../misc/utils.h"
#include "transport.h"


/* ------------------------------------------------------------------ exported memfds ---- */

struct fd_ent {
  uint64_t token;
  int fd;         /* owned by the exporter, open until it withdraws the token */
  uint64_t bytes; /* size of the segment */
  struct fd_ent* next;
};

#define REQ_MAGIC 0x43484f5255534644ull /* "CHORUSFD" */
struct fd_req {
  uint64_t magic;
  uint64_t token;
};
struct fd_rep {
  int32_t status; /* 0: a descriptor follows; else an errno value */
  int32_t pad;
  uint64_t bytes;
};

/* srv_mu orders starting and stopping the server (held across the join); fd_mu guards the list and
 * is the only lock the server thread takes. Lock order: srv_mu, then fd_mu. */
static pthread_mutex_t srv_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_mutex_t fd_mu = PTHREAD_MUTEX_INITIALIZER;
static struct fd_ent* fd_list; /* fd_mu */
static int srv_live;           /* srv_mu: a server thread runs */
static int srv_listen = -1, srv_stop = -1; /* srv_mu; the thread only reads them */
static pthread_t srv_thread;
static pthread_once_t hooks_once = PTHREAD_ONCE_INIT;

static void sock_name(uint64_t nonce, struct sockaddr_un* a, socklen_t* len) {
  memset(a, 0, sizeof(*a));
  a->sun_family = AF_UNIX;
  int n = snprintf(a->sun_path + 1, sizeof(a->sun_path) - 1, "chorus-fd-%016llx", (unsigned long long)nonce);
  *len = (socklen_t)(offsetof(struct sockaddr_un, sun_path) + 1 + (size_t)n);
}

static void set_timeouts(int s, int ms) {
  uint64_t ns = (uint64_t)ms * UT_NS_PER_MS;
  struct timeval tv = {(time_t)(ns / UT_NS_PER_S), (suseconds_t)(ns % UT_NS_PER_S / UT_NS_PER_US)};
  setsockopt(s, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  setsockopt(s, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
}

/* Refused askers, one WARN per uid a minute (like sock_warn_reject): another user can connect as
 * often as it likes, and must not be able to flood the log. Server thread only. */
#define REFUSED_SLOTS 8
#define REFUSED_QUIET_NS (60 * UT_NS_PER_S)
static struct {
  uid_t uid;
  uint64_t last;
} refused[REFUSED_SLOTS];

static void warn_refused(const struct ucred* cr) {
  uint64_t now = ut_now_ns();
  int slot = -1, oldest = 0;
  for (int i = 0; i < REFUSED_SLOTS; i++) {
    if (refused[i].last && refused[i].uid == cr->uid) slot = i;
    if (refused[i].last < refused[oldest].last) oldest = i;
  }
  if (slot >= 0 && now - refused[slot].last < REFUSED_QUIET_NS) {
    INFO(LOG_INIT | LOG_NET, "shared-memory descriptor request from pid %d uid %d refused", (int)cr->pid, (int)cr->uid);
    return;
  }
  slot = slot >= 0 ? slot : oldest;
  refused[slot].uid = cr->uid, refused[slot].last = now;
  WARN("shared-memory descriptor request from pid %d uid %d refused: only processes of user %d are served (further "
       "refusals of uid %d for 60 s are logged at INFO)",
       (int)cr->pid, (int)cr->uid, (int)geteuid(), (int)cr->uid);
}

static void serve_one(int c) {
  set_timeouts(c, 1000);
  struct ucred cr = {0, (uid_t)-1, (gid_t)-1};
  socklen_t cl = sizeof(cr);
  if (getsockopt(c, SOL_SOCKET, SO_PEERCRED, &cr, &cl) != 0 || cr.uid != geteuid()) {
    warn_refused(&cr); /* refused before anything is read: another uid cannot hold the server */
    return;
  }
  /* A rank of ours sends its request right after connect, but with hundreds of ranks on a few
   * CPUs it may not run again for over a second: wait as long as it waits for our answer
   * (fetch_fd), as a 1 s wait here cut such ranks off (EPIPE) at 256 ranks on 2 CPUs. */
  set_timeouts(c, 10000);
  struct fd_req rq;
  ssize_t got = -1;
  int64_t slices = param_int(PARAM_INIT_TIMEOUT) > 0 ? param_int(PARAM_INIT_TIMEOUT) / 10 + 1 : 1; /* as fetch_fd */
  for (int64_t k = 0; k < slices && got < 0; k++) /* our uid only (above): no stranger can hold us here */
    if ((got = recv(c, &rq, sizeof(rq), MSG_WAITALL)) < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) break;
  if (got != (ssize_t)sizeof(rq) || rq.magic != REQ_MAGIC) return;
  struct fd_rep rp = {ENOENT, 0, 0};
  int fd = -1;
  pthread_mutex_lock(&fd_mu);
  for (struct fd_ent* e = fd_list; e; e = e->next) {
    if (e->token != rq.token) continue;
    fd = fcntl(e->fd, F_DUPFD_CLOEXEC, 0); /* the exporter may close its own as soon as we unlock */
    rp.status = fd < 0 ? errno : 0;
    rp.bytes = e->bytes;
    break;
  }
  pthread_mutex_unlock(&fd_mu);
  /* Only our own uid gets here (SO_PEERCRED), and the usual cause is benign: a peer asking for a
   * segment this process withdrew when its init or connection failed. The asker logs its failure. */
  if (rp.status == ENOENT)
    INFO(LOG_INIT, "shared-memory descriptor request from pid %d for an unknown token refused", (int)cr.pid);
  struct iovec iov = {&rp, sizeof(rp)};
  union { struct cmsghdr h; char b[CMSG_SPACE(sizeof(int))]; } ctl;
  memset(&ctl, 0, sizeof(ctl));
  struct msghdr m = {.msg_iov = &iov, .msg_iovlen = 1};
  if (fd >= 0) {
    m.msg_control = ctl.b;
    m.msg_controllen = sizeof(ctl.b);
    struct cmsghdr* h = CMSG_FIRSTHDR(&m);
    h->cmsg_level = SOL_SOCKET;
    h->cmsg_type = SCM_RIGHTS;
    h->cmsg_len = CMSG_LEN(sizeof(int));
    memcpy(CMSG_DATA(h), &fd, sizeof(int));
  }
  (void)sendmsg(c, &m, MSG_NOSIGNAL);
  if (fd >= 0) close(fd);
}

static void* serve(void* arg) {
  (void)arg;
  for (;;) {
    struct pollfd p[2] = {{srv_listen, POLLIN, 0}, {srv_stop, POLLIN, 0}};
    if (poll(p, 2, -1) < 0) {
      if (errno == EINTR) continue;
      break;
    }
    if (p[1].revents) break;
    int c = accept4(srv_listen, NULL, NULL, SOCK_CLOEXEC);
    if (c < 0) {
      if (errno != EINTR && errno != ECONNABORTED) usleep(10000); /* do not spin (full descriptor table) */
      continue;
    }
    serve_one(c);
    close(c);
  }
  return NULL;
}

/* Caller holds srv_mu. */
static int srv_start(void) {
  struct sockaddr_un a;
  socklen_t len;
  uint64_t nonce = ut_proc_nonce();
  sock_name(nonce, &a, &len);
  int s = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (s < 0 || bind(s, (struct sockaddr*)&a, len) != 0 || listen(s, 128) != 0) {
    WARN("cannot listen on the abstract socket @chorus-fd-%016llx for shared-memory descriptors: %s",
         (unsigned long long)nonce, strerror(errno));
    if (s >= 0) close(s);
    return -1;
  }
  int ev = eventfd(0, EFD_CLOEXEC);
  if (ev < 0) {
    WARN("eventfd failed: %s", strerror(errno));
    close(s);
    return -1;
  }
  srv_listen = s, srv_stop = ev;
  int err = pthread_create(&srv_thread, NULL, serve, NULL);
  if (err != 0) {
    WARN("cannot start the shared-memory descriptor server thread: %s", strerror(err));
    close(s), close(ev);
    srv_listen = srv_stop = -1;
    return -1;
  }
  srv_live = 1;
  return 0;
}

/* Caller holds srv_mu. */
static void srv_halt(void) {
  if (!srv_live) return;
  uint64_t one = 1;
  if (write(srv_stop, &one, sizeof(one)) != (ssize_t)sizeof(one)) WARN("cannot stop the descriptor server");
  pthread_join(srv_thread, NULL);
  close(srv_listen), close(srv_stop);
  srv_listen = srv_stop = -1;
  srv_live = 0;
}

/* No lock may be held by a thread that does not exist in a fork child. The child has no server
 * thread and must not answer under its parent's name: it keeps the exports (its copies of the
 * descriptors are valid) and starts its own server, under its own nonce, when it next exports. */
static void at_prepare(void) { pthread_mutex_lock(&srv_mu), pthread_mutex_lock(&fd_mu); }
static void at_parent(void) { pthread_mutex_unlock(&fd_mu), pthread_mutex_unlock(&srv_mu); }
static void at_child(void) {
  if (srv_live) close(srv_listen), close(srv_stop);
  srv_listen = srv_stop = -1;
  srv_live = 0;
  at_parent();
}
static void install_fork_hooks(void) { ut_atfork_register(at_prepare, at_parent, at_child); }

__attribute__((destructor)) static void srv_unload(void) {
  pthread_mutex_lock(&srv_mu);
  srv_halt();
  pthread_mutex_unlock(&srv_mu);
}

uint64_t tp_fd_export(int fd, uint64_t bytes) {
  pthread_once(&hooks_once, install_fork_hooks);
  struct fd_ent* e = malloc(sizeof(*e));
  if (!e) return 0;
  e->token = tp_fresh_token();
  e->fd = fd;
  e->bytes = bytes;
  pthread_mutex_lock(&srv_mu);
  if (!srv_live && srv_start() != 0) {
    pthread_mutex_unlock(&srv_mu);
    free(e);
    return 0;
  }
  pthread_mutex_lock(&fd_mu);
  e->next = fd_list;
  fd_list = e;
  pthread_mutex_unlock(&fd_mu);
  pthread_mutex_unlock(&srv_mu);
  return e->token;
}

void tp_fd_withdraw(uint64_t token) {
  if (!token) return;
  pthread_mutex_lock(&srv_mu);
  pthread_mutex_lock(&fd_mu);
  struct fd_ent* found = NULL;
  for (struct fd_ent** p = &fd_list; *p; p = &(*p)->next) {
    if ((*p)->token != token) continue;
    found = *p;
    *p = found->next;
    break;
  }
  int none = fd_list == NULL;
  pthread_mutex_unlock(&fd_mu);
  free(found);
  if (none) srv_halt();
  pthread_mutex_unlock(&srv_mu);
}

/* ------------------------------------------------------------------ importing ---- */

static int fetch_fd(uint64_t nonce, uint64_t token, int peer, const char* what) {
  struct sockaddr_un a;
  socklen_t len;
  sock_name(nonce, &a, &len);
  int s = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (s < 0) {
    WARN("socket() for %s failed: %s", what, strerror(errno));
    return -1;
  }
  set_timeouts(s, 10000);
  if (connect(s, (struct sockaddr*)&a, len) != 0) {
    WARN("cannot reach rank %d's shared-memory descriptor server (@chorus-fd-%016llx) for %s: %s. Ranks on "
         "one host must share a network namespace to share memory; set NCCL_SHM_DISABLE=1 to use sockets",
         peer, (unsigned long long)nonce, what, strerror(errno));
    close(s);
    return -1;
  }
  struct ucred cr = {0, (uid_t)-1, (gid_t)-1};
  socklen_t cl = sizeof(cr);
  if (getsockopt(s, SOL_SOCKET, SO_PEERCRED, &cr, &cl) != 0 || cr.uid != geteuid()) {
    WARN("the descriptor server claiming to be rank %d's runs as uid %d, not as our uid %d: %s refused", peer,
         (int)cr.uid, (int)geteuid(), what);
    close(s);
    return -1;
  }
  struct fd_req rq = {REQ_MAGIC, token};
  struct fd_rep rp = {0, 0, 0};
  union { struct cmsghdr h; char b[CMSG_SPACE(sizeof(int) * 4)]; } ctl;
  struct iovec iov = {&rp, sizeof(rp)};
  struct msghdr m = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = ctl.b, .msg_controllen = sizeof(ctl.b)};
  ssize_t got = -1;
  /* The server is one thread of a rank that may be serving others first, and with a thousand ranks on
   * a few CPUs it may not run for many seconds (10 s was too short at 1,024 ranks on 2 CPUs): wait in
   * slices, as long as a rank waits for its peers at init (CHORUS_INIT_TIMEOUT). */
  int64_t slices = param_int(PARAM_INIT_TIMEOUT) > 0 ? param_int(PARAM_INIT_TIMEOUT) / 10 + 1 : 1;
  if (send(s, &rq, sizeof(rq), MSG_NOSIGNAL) == (ssize_t)sizeof(rq))
    for (int64_t k = 0; k < slices; k++) {
      got = recvmsg(s, &m, MSG_CMSG_CLOEXEC | MSG_WAITALL);
      if (got >= 0 || (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)) break;
    }
  int saved = errno, fd = -1;
  close(s);
  for (struct cmsghdr* h = got > 0 ? CMSG_FIRSTHDR(&m) : NULL; h; h = CMSG_NXTHDR(&m, h)) {
    if (h->cmsg_level != SOL_SOCKET || h->cmsg_type != SCM_RIGHTS) continue;
    size_t nfd = (h->cmsg_len - CMSG_LEN(0)) / sizeof(int);
    for (size_t i = 0; i < nfd; i++) {
      int f;
      memcpy(&f, CMSG_DATA(h) + i * sizeof(int), sizeof(int));
      if (fd < 0) fd = f;
      else close(f); /* we asked for one */
    }
  }
  if (got != (ssize_t)sizeof(rp) || rp.status != 0 || fd < 0) {
    WARN("rank %d did not hand over %s: %s", peer, what,
         got < 0 ? strerror(saved) : rp.status ? strerror(rp.status) : "short or empty answer");
    if (fd >= 0) close(fd);
    return -1;
  }
  return fd;
}

/* A sealed (no shrinking) Chorus memfd of exactly `bytes`: anything else is refused. */
static int check_fd(int fd, size_t bytes, int peer, const char* what) {
  struct stat st;
  memset(&st, 0, sizeof(st));
  char path[64], link[128] = "";
  snprintf(path, sizeof(path), "/proc/self/fd/%d", fd);
  ssize_t n = readlink(path, link, sizeof(link) - 1);
  if (n > 0) link[n] = '\0';
  int seals = fcntl(fd, F_GET_SEALS);
  const char* bad = NULL;
  if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) bad = "not a regular file";
  else if ((uint64_t)st.st_size != bytes) bad = "not of the expected size";
  else if (seals < 0 || !(seals & F_SEAL_SHRINK)) bad = "not a sealed memfd";
  else if (n > 0 && strncmp(link, "/memfd:chorus", 13) != 0) bad = "not a Chorus memfd";
  if (bad) {
    WARN("rank %d handed over %s that is %s (%s, %lld bytes, expected %zu): refused", peer, what, bad,
         n > 0 ? link : "?", (long long)st.st_size, bytes);
    return -1;
  }
  return 0;
}

void* tp_fd_map(uint64_t nonce, uint64_t token, size_t bytes, size_t token_off, int populate, int peer,
                const char* what) {
  int fd = fetch_fd(nonce, token, peer, what);
  if (fd < 0) return NULL;
  if (check_fd(fd, bytes, peer, what) != 0 || token_off + sizeof(uint64_t) > bytes) {
    close(fd);
    return NULL;
  }
  void* mem = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED | (populate ? MAP_POPULATE : 0), fd, 0);
  int saved = errno;
  close(fd);
  if (mem == MAP_FAILED) {
    WARN("mmap of %zu bytes of %s from rank %d failed: %s", bytes, what, peer, strerror(saved));
    return NULL;
  }
  uint64_t seen;
  memcpy(&seen, (char*)mem + token_off, sizeof(seen));
  if (seen != token) {
    WARN("%s from rank %d does not carry the token it was asked for: refused", what, peer);
    munmap(mem, bytes);
    return NULL;
  }
  return mem;
}

int tp_memfd_new(const char* name, size_t bytes, int reserve) {
  int fd = memfd_create(name, MFD_CLOEXEC | MFD_ALLOW_SEALING);
  if (fd < 0) return -1;
  int err = reserve ? posix_fallocate(fd, 0, (off_t)bytes) : (ftruncate(fd, (off_t)bytes) == 0 ? 0 : errno);
  if (err == 0 && fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) != 0) err = errno;
  if (err != 0) {
    close(fd);
    errno = err;
    return -1;
  }
  return fd;
}
