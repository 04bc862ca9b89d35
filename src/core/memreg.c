/* ncclMemAlloc's allocations and ncclCommRegister's registrations, tracked so that freeing something
 * we did not hand out is an error with a message, not a crash in free(); and what Direct learns of a
 * buffer from them (mem_describe). The public calls are api/mem.c. */
#define _GNU_SOURCE /* memfd_create */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "../misc/log.h"
#include "../misc/param.h"
#include "../cuda/cudrv.h"
#include "../comm/work.h"
#include "memreg.h"

static pthread_mutex_t mem_mu = PTHREAD_MUTEX_INITIALIZER;
static struct ch_block* lists[2]; /* [MEMREG_ALLOCS], [MEMREG_REGS]: mem_mu */

/* mem_describe runs on every Direct call between processes, from any number of threads: each thread
 * remembers its last answers (hits and misses) and trusts them while alloc_gen is unchanged. Every
 * ncclMemAlloc and ncclMemFree bumps it (under mem_mu), so the common path reads one shared,
 * rarely written word and takes no lock. */
static _Atomic uint64_t alloc_gen = 1;
#define DESC_CACHE 4
struct desc_cache {
  uint64_t gen; /* 0: empty */
  uintptr_t lo, hi; /* the range asked about: [lo, hi) */
  struct direct_buf d;
};
static _Thread_local struct desc_cache desc_cache[DESC_CACHE];
static _Thread_local unsigned desc_next;

void memreg_track(int which, struct ch_block* b) {
  struct ch_block** list = &lists[which];
  pthread_mutex_lock(&mem_mu);
  b->next = *list;
  *list = b;
  if (which == MEMREG_ALLOCS) atomic_fetch_add_explicit(&alloc_gen, 1, memory_order_release);
  pthread_mutex_unlock(&mem_mu);
}

/* Remove the block matching ptr (allocations) or the handle itself (registrations). */
struct ch_block* memreg_untrack(int which, const void* key, int by_handle) {
  struct ch_block** list = &lists[which];
  pthread_mutex_lock(&mem_mu);
  struct ch_block* found = NULL;
  for (struct ch_block** p = list; *p; p = &(*p)->next) {
    if ((by_handle ? (const void*)*p : (*p)->ptr) == key) {
      found = *p;
      *p = found->next;
      break;
    }
  }
  if (found && which == MEMREG_ALLOCS) atomic_fetch_add_explicit(&alloc_gen, 1, memory_order_release);
  pthread_mutex_unlock(&mem_mu);
  return found;
}

int mem_describe(const void* buf, size_t bytes, struct direct_buf* out) {
  uintptr_t p = (uintptr_t)buf;
  uint64_t gen = atomic_load_explicit(&alloc_gen, memory_order_acquire);
  for (int i = 0; i < DESC_CACHE; i++) {
    struct desc_cache* e = &desc_cache[i];
    if (e->gen == gen && e->lo == p && e->hi == p + bytes) {
      *out = e->d;
      return out->token != 0;
    }
  }
  memset(out, 0, sizeof(*out));
  out->addr = (uint64_t)p;
  pthread_mutex_lock(&mem_mu);
  for (struct ch_block* b = lists[MEMREG_ALLOCS]; b; b = b->next) {
    uintptr_t base = (uintptr_t)b->ptr;
    if (b->fd >= 0 && p >= base && p - base <= b->size && bytes <= b->size - (p - base)) {
      if (!b->token) { /* first use by a peer process: export it (starts the descriptor server) */
        b->token = tp_fd_export(b->fd, b->seg);
        memcpy((char*)b->ptr + tp_mem_token_off(b->size), &b->token, sizeof(b->token));
      }
      out->token = b->token;
      out->alloc_bytes = b->size;
      out->off = p - base;
      break;
    }
  }
  pthread_mutex_unlock(&mem_mu);
  /* Stamped with the generation read before the lookup: a change since then makes it stale at once. */
  desc_cache[desc_next++ % DESC_CACHE] = (struct desc_cache){gen, p, p + bytes, *out};
  return out->token != 0;
}

/* A sealed memfd plus a token page, so that other local processes can map the buffer and collectives
 * on it need no FIFO copy (algo/direct_allreduce.c). Plain memory if the kernel has no memfd. */
void* memreg_alloc_shareable(size_t size, int* fd, size_t* seg) {
  *seg = tp_mem_segment_bytes(size);
  *fd = tp_memfd_new("chorus-mem", *seg, 0);
  if (*fd >= 0) {
    void* p = mmap(NULL, *seg, PROT_READ | PROT_WRITE, MAP_SHARED, *fd, 0);
    if (p != MAP_FAILED) return p;
    close(*fd);
  }
  *fd = -1;
  *seg = 0;
  void* p = NULL;
  return posix_memalign(&p, 4096, size) == 0 ? p : NULL; /* page-aligned like the mapping */
}
