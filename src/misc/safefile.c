/* Safe folders and files: every step works on descriptors (openat, mkdirat, renameat), so what was
 * checked is what gets written into, whatever another user renames meanwhile. safefile.h says why. */
#define _GNU_SOURCE
#include "safefile.h"

#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdint.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

static int fail(int err, char* why, size_t len, const char* fmt, ...) __attribute__((format(printf, 4, 5)));
static int fail(int err, char* why, size_t len, const char* fmt, ...) {
  if (why && len) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(why, len, fmt, ap);
    va_end(ap);
  }
  errno = err;
  return -1;
}

/* Nobody but root and this user can change what the folder holds. */
static int only_ours(const struct stat* st) {
  return (st->st_uid == 0 || st->st_uid == geteuid()) && !(st->st_mode & (S_IWGRP | S_IWOTH));
}

static int walk(const char* path, int create, int* shared, char* why, size_t len) {
  if (!path || !path[0]) return fail(ENOENT, why, len, "no folder named");
  int fd = open(path[0] == '/' ? "/" : ".", O_DIRECTORY | O_RDONLY | O_CLOEXEC);
  if (fd < 0) return fail(errno, why, len, "%s", strerror(errno));
  const char* p = path;
  char comp[256];
  for (;;) {
    while (*p == '/') p++;
    if (!*p) break;
    size_t n = strcspn(p, "/");
    if (n >= sizeof(comp)) {
      close(fd);
      return fail(ENAMETOOLONG, why, len, "a name in it is too long");
    }
    memcpy(comp, p, n), comp[n] = 0;
    p += n;
    int last = !p[strspn(p, "/")];
    int nfd = openat(fd, comp, O_DIRECTORY | O_NOFOLLOW | O_RDONLY | O_CLOEXEC);
    if (nfd < 0 && errno == ENOENT && create) {
      if (mkdirat(fd, comp, 0700) != 0 && errno != EEXIST) {
        int e = errno;
        close(fd);
        return fail(e, why, len, "cannot create %s: %s", comp, strerror(e));
      }
      nfd = openat(fd, comp, O_DIRECTORY | O_NOFOLLOW | O_RDONLY | O_CLOEXEC);
    }
    if (nfd < 0 && (errno == ELOOP || errno == ENOTDIR)) {
      int e = errno;
      struct stat ls, ps;
      if (fstatat(fd, comp, &ls, AT_SYMLINK_NOFOLLOW) == 0 && S_ISLNK(ls.st_mode)) {
        if (last) {
          close(fd);
          return fail(ELOOP, why, len, "it is a symbolic link");
        }
        if (fstat(fd, &ps) != 0 || !only_ours(&ps)) {
          close(fd);
          return fail(ELOOP, why, len, "%s is a symbolic link in a folder other users can write", comp);
        }
        nfd = openat(fd, comp, O_DIRECTORY | O_RDONLY | O_CLOEXEC);
      } else {
        errno = e;
      }
    }
    if (nfd < 0) {
      int e = errno;
      close(fd);
      return fail(e, why, len, "%s: %s", comp, strerror(e));
    }
    close(fd);
    fd = nfd;
  }
  struct stat st;
  if (fstat(fd, &st) != 0) {
    int e = errno;
    close(fd);
    return fail(e, why, len, "%s", strerror(e));
  }
  /* Nobody else may add, rename or remove entries: the folder is ours and only we write it, or it
   * is sticky (others may add names, never touch ours) and owned by root or us, as /tmp is. */
  uid_t me = geteuid();
  int open_to_others = (st.st_mode & (S_IWGRP | S_IWOTH)) != 0;
  if (st.st_uid != 0 && st.st_uid != me) {
    close(fd);
    return fail(EPERM, why, len, "it is owned by uid %u, not by this user (uid %u)", (unsigned)st.st_uid, (unsigned)me);
  }
  if (open_to_others && !(st.st_mode & S_ISVTX)) {
    close(fd);
    return fail(EPERM, why, len, "other users can write it (mode %04o, not sticky)", (unsigned)(st.st_mode & 07777));
  }
  if (shared) *shared = open_to_others;
  return fd;
}

int sf_dir(const char* path, int create, int* shared, char* why, size_t len) {
  return walk(path, create, shared, why, len);
}

int sf_parent_dir(const char* path, const char** base, char* why, size_t len) {
  const char* slash = strrchr(path, '/');
  *base = slash ? slash + 1 : path;
  if (!**base) return fail(EISDIR, why, len, "it names a folder, not a file");
  char dir[4096];
  if (!slash) snprintf(dir, sizeof(dir), ".");
  else if (slash == path) snprintf(dir, sizeof(dir), "/");
  else if ((size_t)(slash - path) >= sizeof(dir)) return fail(ENAMETOOLONG, why, len, "the name is too long");
  else memcpy(dir, path, (size_t)(slash - path)), dir[slash - path] = 0;
  return walk(dir, 0, NULL, why, len);
}

/* O_NONBLOCK only so that a FIFO cannot block the open; cleared for the writes. */
static int no_block_after(int fd) {
  if (fd >= 0) fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) & ~O_NONBLOCK);
  return fd;
}

int sf_create(int dirfd, const char* name, int flags, int replace) {
  int o = O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC | flags;
  int fd = openat(dirfd, name, o, 0600);
  if (fd < 0 && errno == EEXIST && replace && (unlinkat(dirfd, name, 0) == 0 || errno == ENOENT))
    fd = openat(dirfd, name, o, 0600);
  return no_block_after(fd);
}

int sf_open_in(struct sf_file* s, int dirfd, const char* name) {
  memset(s, 0, sizeof(*s));
  s->dirfd = dirfd;
  if (snprintf(s->name, sizeof(s->name), "%s", name) >= (int)sizeof(s->name)) return errno = ENAMETOOLONG, -1;
  static unsigned counter;
  int fd = -1;
  for (int tries = 0; fd < 0 && tries < 16; tries++) {
    /* Unpredictable enough that nobody can plant every name we might pick (a shared folder). */
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    unsigned r = (unsigned)ts.tv_nsec ^ (__atomic_add_fetch(&counter, 1, __ATOMIC_RELAXED) * 2654435761u);
    snprintf(s->tmp, sizeof(s->tmp), ".%s.%d.%08x.tmp", name, (int)getpid(), r);
    fd = sf_create(dirfd, s->tmp, 0, 0);
    if (fd < 0 && errno != EEXIST) break;
  }
  s->f = fd >= 0 ? fdopen(fd, "w") : NULL;
  if (!s->f) {
    int e = errno;
    if (fd >= 0) close(fd), unlinkat(dirfd, s->tmp, 0);
    errno = e;
    return -1;
  }
  return 0;
}

/* A folder nobody else can write holds nothing planted: there the name is used as given (it may be
 * a link the user made, /dev/stdout, a FIFO), and only a shared folder gets the strict treatment. */
static int trusted_dir(int dfd) {
  struct stat st;
  return fstat(dfd, &st) == 0 && only_ours(&st);
}

int sf_open_path(struct sf_file* s, const char* path, char* why, size_t len) {
  const char* base;
  int dfd = sf_parent_dir(path, &base, why, len);
  if (dfd < 0) return -1;
  if (trusted_dir(dfd)) {
    memset(s, 0, sizeof(*s));
    int fd = openat(dfd, base, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0666);
    s->f = fd >= 0 ? fdopen(fd, "w") : NULL;
    int e = errno;
    close(dfd);
    s->dirfd = -1;
    if (s->f) return 0;
    if (fd >= 0) close(fd);
    return fail(e, why, len, "%s", strerror(e));
  }
  if (sf_open_in(s, dfd, base) != 0) {
    int e = errno;
    close(dfd);
    return fail(e, why, len, "%s", strerror(e));
  }
  s->own_dir = 1;
  return 0;
}

static void drop_dir(struct sf_file* s) {
  if (s->own_dir) close(s->dirfd);
  s->own_dir = 0, s->dirfd = -1;
}

int sf_commit(struct sf_file* s) {
  int bad = ferror(s->f);
  bad |= fclose(s->f) != 0;
  s->f = NULL;
  int e = bad ? (errno ? errno : EIO) : 0;
  if (!s->tmp[0]) { /* written in place (sf_open_path, a private folder) */
    errno = e;
    return bad ? -1 : 0;
  }
  if (!bad && renameat(s->dirfd, s->tmp, s->dirfd, s->name) != 0) bad = 1, e = errno;
  if (bad) unlinkat(s->dirfd, s->tmp, 0);
  drop_dir(s);
  errno = e;
  return bad ? -1 : 0;
}

void sf_abandon(struct sf_file* s) {
  if (s->f) fclose(s->f);
  if (s->f && s->tmp[0]) unlinkat(s->dirfd, s->tmp, 0);
  s->f = NULL;
  drop_dir(s);
}

int sf_append(const char* path, int mode) {
  const char* base;
  char why[8];
  int dfd = sf_parent_dir(path, &base, why, sizeof(why));
  if (dfd < 0) return -1;
  int trusted = trusted_dir(dfd);
  int flags = O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC | (trusted ? 0 : O_NOFOLLOW | O_NONBLOCK);
  int fd = openat(dfd, base, flags, mode);
  int e = errno;
  close(dfd);
  struct stat st;
  if (fd >= 0 && !trusted && (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) || st.st_uid != geteuid())) {
    close(fd);
    errno = EPERM;
    return -1;
  }
  errno = e;
  return trusted ? fd : no_block_after(fd);
}
