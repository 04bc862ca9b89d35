/* Shared-memory transport between processes of one host.
 *
 * The receiver creates an anonymous memfd (owner-only, never visible in /dev/shm), reserves its pages
 * with fallocate so a too-small tmpfs fails now with a clear message instead of SIGBUS later, maps it
 * and keeps the descriptor open until the connection is freed. The sender maps the same file through
 * /proc/<receiver pid>/fd/<fd>. Because the segment has no name, nothing survives the processes, even
 * after SIGKILL. */
#define _GNU_SOURCE
#include <fcntl.h>
#include <stdlib.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "../misc/log.h"
#include "transport.h"

ch_status tp_shm_recv_setup(struct conn* c, const struct tp_sizes* sz, struct tp_handle* h) {
  size_t bytes = tp_fifo_bytes(sz);
  int fd = memfd_create("chorus-fifo", MFD_CLOEXEC);
  if (fd < 0) {
    WARN("memfd_create for a FIFO from rank %d failed: %s", c->peer, strerror(errno));
    return CH_SYSTEM;
  }
  int err = posix_fallocate(fd, 0, (off_t)bytes);
  if (err != 0) {
    WARN("cannot reserve %zu bytes of shared memory for the FIFO from rank %d: %s. Shared memory is "
         "tmpfs-backed: give the container more (docker --shm-size=1g, or a larger memory limit), or "
         "lower NCCL_BUFFSIZE", bytes, c->peer, strerror(err));
    close(fd);
    return CH_SYSTEM;
  }
  void* mem = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (mem == MAP_FAILED) {
    WARN("mmap of %zu bytes of shared memory failed: %s", bytes, strerror(errno));
    close(fd);
    return CH_SYSTEM;
  }
  tp_fifo_layout(c, mem, sz);
  c->map_base = mem;
  c->map_bytes = bytes;
  c->fd = fd;
  c->transport = TP_SHM;
  c->connected = 1;
  memset(h, 0, sizeof(*h));
  h->kind = TP_SHM;
  h->pid = (int32_t)getpid();
  h->fd = fd;
  h->bytes = bytes;
  return CH_OK;
}

/* Map `bytes` of the memfd that process pid holds as descriptor fd. NULL (with a WARN naming `what`)
 * if it cannot be opened, is smaller than expected, or cannot be mapped. */
void* tp_shm_map_fd(int pid, int fd, size_t bytes, int populate, const char* what) {
  char path[64];
  snprintf(path, sizeof(path), "/proc/%d/fd/%d", pid, fd);
  int f = open(path, O_RDWR | O_CLOEXEC);
  if (f < 0) {
    WARN("cannot open %s of pid %d through %s: %s. Both processes must run as the same user and see "
         "each other's /proc (same PID namespace); set NCCL_SHM_DISABLE=1 to use sockets", what, pid, path,
         strerror(errno));
    return NULL;
  }
  struct stat st;
  if (fstat(f, &st) != 0 || (uint64_t)st.st_size < bytes) { /* not the memfd we were told about */
    WARN("%s is not the %zu-byte %s of pid %d", path, bytes, what, pid);
    close(f);
    return NULL;
  }
  void* mem = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED | (populate ? MAP_POPULATE : 0), f, 0);
  int saved = errno;
  close(f);
  if (mem == MAP_FAILED) {
    WARN("mmap of %zu bytes of the %s of pid %d failed: %s", bytes, what, pid, strerror(saved));
    return NULL;
  }
  return mem;
}

ch_status tp_shm_send_connect(struct conn* c, const struct tp_sizes* sz, const struct tp_handle* h) {
  size_t bytes = tp_fifo_bytes(sz);
  if (h->bytes != bytes) {
    WARN("FIFO size mismatch with rank %d: %llu vs %zu bytes (NCCL_BUFFSIZE differs between ranks?)", c->peer,
         (unsigned long long)h->bytes, bytes);
    return CH_INVALID_USAGE;
  }
  char what[64];
  snprintf(what, sizeof(what), "the FIFO of rank %d", c->peer);
  void* mem = tp_shm_map_fd((int)h->pid, (int)h->fd, bytes, 0, what);
  if (!mem) return CH_SYSTEM;
  tp_fifo_layout(c, mem, sz);
  c->map_base = mem;
  c->map_bytes = bytes;
  c->fd = -1;
  c->transport = TP_SHM;
  c->connected = 1;
  return CH_OK;
}

/* ---- peer allocations (direct algorithms) ---- */

#define MAP_CACHE_SLOTS 32

struct tp_map_entry {
  int pid;
  uint64_t serial;
  char* base;
  size_t bytes;
  uint64_t used; /* clock of the last lookup */
};
struct tp_map_cache {
  struct tp_map_entry e[MAP_CACHE_SLOTS];
  uint64_t clock;
};

struct tp_map_cache* tp_map_cache_new(void) { return calloc(1, sizeof(struct tp_map_cache)); }

void tp_map_cache_free(struct tp_map_cache* mc) {
  if (!mc) return;
  for (int i = 0; i < MAP_CACHE_SLOTS; i++)
    if (mc->e[i].base) munmap(mc->e[i].base, mc->e[i].bytes);
  free(mc);
}

char* tp_map_peer(struct tp_map_cache* mc, int pid, int fd, uint64_t serial, size_t bytes) {
  struct tp_map_entry* victim = &mc->e[0];
  mc->clock++;
  for (int i = 0; i < MAP_CACHE_SLOTS; i++) {
    struct tp_map_entry* e = &mc->e[i];
    if (e->base && e->pid == pid && e->serial == serial && e->bytes >= bytes) {
      e->used = mc->clock;
      return e->base;
    }
    if (!e->base || (victim->base && e->used < victim->used)) victim = e;
  }
  /* Populated now: one call instead of a page fault per 4 KiB on first use. */
  char* base = tp_shm_map_fd(pid, fd, bytes, 1, "ncclMemAlloc buffer");
  if (!base) return NULL;
  if (victim->base) munmap(victim->base, victim->bytes);
  *victim = (struct tp_map_entry){pid, serial, base, bytes, mc->clock};
  return base;
}
