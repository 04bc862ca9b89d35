/* Shared-memory transport between processes of one host.
 *
 * The receiver creates an anonymous sealed memfd (owner-only, never visible in /dev/shm), reserves its
 * pages with fallocate so a too-small tmpfs fails now with a clear message instead of SIGBUS later,
 * maps it, and exports it under a token (fdpass.c) until the sender has it. The sender fetches the
 * descriptor from the receiver's descriptor server, checks it and maps it. Because the segment has no
 * name, nothing survives the processes, even after SIGKILL. */
#define _GNU_SOURCE
#include <errno.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "../misc/log.h"
#include "../misc/utils.h"
#include "transport.h"

ch_status tp_shm_recv_setup(struct conn* c, const struct tp_sizes* sz, struct tp_handle* h, const struct tp_ctx* x) {
  (void)x;
  size_t bytes = tp_fifo_bytes(sz);
  int fd = tp_memfd_new("chorus-fifo", bytes, 1);
  if (fd < 0) {
    WARN("cannot create %zu bytes of shared memory for the FIFO from rank %d: %s. Shared memory is "
         "tmpfs-backed: give the container more (docker --shm-size=1g, or a larger memory limit), or "
         "lower NCCL_BUFFSIZE", bytes, c->peer, strerror(errno));
    return CH_SYSTEM;
  }
  void* mem = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (mem == MAP_FAILED) {
    WARN("mmap of %zu bytes of shared memory failed: %s", bytes, strerror(errno));
    close(fd);
    return CH_SYSTEM;
  }
  uint64_t token = tp_fd_export(fd, bytes);
  if (!token) {
    munmap(mem, bytes);
    close(fd);
    return CH_SYSTEM;
  }
  tp_fifo_layout(c, mem, sz);
  c->ctrl->token = token;
  c->map_base = mem;
  c->map_bytes = bytes;
  c->fd = fd;
  c->token = token;
  c->transport = TP_SHM;
  c->connected = 1;
  memset(h, 0, sizeof(*h));
  h->kind = TP_SHM;
  h->bytes = bytes;
  h->token = token;
  h->nonce = ut_proc_nonce();
  return CH_OK;
}

ch_status tp_shm_send_connect(struct conn* c, const struct tp_sizes* sz, const struct tp_handle* h,
                              const struct tp_ctx* x) {
  size_t bytes = tp_fifo_bytes(sz);
  if (h->nonce != x->peer_nonce) {
    /* Its descriptor server is named by the nonce: only the one process the peer joined from counts. */
    WARN("rank %d: rank %d offered a FIFO held by another process than the one it joined from", x->rank, c->peer);
    return CH_REMOTE;
  }
  if (h->bytes != bytes) {
    WARN("FIFO size mismatch with rank %d: %llu vs %zu bytes (NCCL_BUFFSIZE differs between ranks?)", c->peer,
         (unsigned long long)h->bytes, bytes);
    return CH_INVALID_USAGE;
  }
  char what[64];
  snprintf(what, sizeof(what), "the FIFO of rank %d", c->peer);
  void* mem = tp_fd_map(h->nonce, h->token, bytes, offsetof(struct fifo_ctrl, token), 0, c->peer, what);
  if (!mem) return CH_SYSTEM;
  tp_fifo_layout(c, mem, sz);
  c->map_base = mem;
  c->map_bytes = bytes;
  c->fd = -1;
  c->token = 0;
  c->transport = TP_SHM;
  c->connected = 1;
  return CH_OK;
}

/* ---- peer allocations (direct algorithms) ---- */

/* At least this many mappings are kept; and always more than one call maps (a send and a receive
 * buffer per peer), so the least recently used entry is never one the call still uses. */
#define MAP_CACHE_MIN_SLOTS 32

struct tp_map_entry {
  int rank;
  uint64_t token;
  char* base;
  size_t user;  /* the allocation's size as the user sees it */
  size_t bytes; /* of the mapping */
  uint64_t used; /* clock of the last lookup */
};
/* Owned by one communicator; used by the thread running its plans, one at a time. */
struct tp_map_cache {
  struct tp_map_entry* e; /* [nslots] */
  int nslots;
  uint64_t clock;
  int nranks;
  uint64_t nonces[]; /* [nranks] each rank's process nonce: names its descriptor server */
};

struct tp_map_cache* tp_map_cache_new(int nranks, const uint64_t* nonces) {
  struct tp_map_cache* mc = calloc(1, sizeof(*mc) + sizeof(uint64_t) * (size_t)nranks);
  if (!mc) return NULL;
  mc->nranks = nranks;
  mc->nslots = nranks * 2 + 1 > MAP_CACHE_MIN_SLOTS ? nranks * 2 + 1 : MAP_CACHE_MIN_SLOTS;
  if (!(mc->e = calloc((size_t)mc->nslots, sizeof(*mc->e)))) {
    free(mc);
    return NULL;
  }
  memcpy(mc->nonces, nonces, sizeof(uint64_t) * (size_t)nranks);
  return mc;
}

void tp_map_cache_free(struct tp_map_cache* mc) {
  if (!mc) return;
  for (int i = 0; i < mc->nslots; i++)
    if (mc->e[i].base) munmap(mc->e[i].base, mc->e[i].bytes);
  free(mc->e);
  free(mc);
}

char* tp_map_peer(struct tp_map_cache* mc, int rank, uint64_t token, size_t user_bytes) {
  if (rank < 0 || rank >= mc->nranks || user_bytes == 0 || user_bytes > ((size_t)1 << 48)) {
    WARN("rank %d described an ncclMemAlloc buffer of %zu bytes: refused", rank, user_bytes);
    return NULL;
  }
  struct tp_map_entry* victim = &mc->e[0];
  mc->clock++;
  for (int i = 0; i < mc->nslots; i++) {
    struct tp_map_entry* e = &mc->e[i];
    if (e->base && e->rank == rank && e->token == token && e->user == user_bytes) {
      e->used = mc->clock;
      return e->base;
    }
    if (!e->base || (victim->base && e->used < victim->used)) victim = e;
  }
  /* Populated now: one call instead of a page fault per 4 KiB on first use. */
  char what[80];
  snprintf(what, sizeof(what), "an ncclMemAlloc buffer (%zu bytes)", user_bytes);
  size_t bytes = tp_mem_segment_bytes(user_bytes);
  char* base = tp_fd_map(mc->nonces[rank], token, bytes, tp_mem_token_off(user_bytes), 1, rank, what);
  if (!base) return NULL;
  if (victim->base) munmap(victim->base, victim->bytes);
  *victim = (struct tp_map_entry){rank, token, base, user_bytes, bytes, mc->clock};
  return base;
}
