/* Windows and one-sided calls (api/window.c registers, api/rma_ops.c puts, signals and waits). */
#ifndef CH_API_RMA_H
#define CH_API_RMA_H

#include <stdatomic.h>
#include <stdint.h>

#include "../comm/comm.h"

#define WIN_MAGIC 0x57494e444f57ull /* "WINDOW" */

/* What each rank publishes of a buffer (its window, or its signal block). */
struct win_desc {
  uint64_t addr, size;           /* in its own address space */
  uint64_t token, alloc, off;    /* its ncclMemAlloc allocation (token 0: none) and the buffer's offset */
  uint64_t sig_token, sig_alloc; /* first registration: its signal block's allocation */
  uint64_t sig_addr;
};

struct ncclWindow_vidmem {
  uint64_t magic;
  struct ncclComm* comm;
  void* user;
  size_t size;
  int flags;
  struct win_desc* d; /* per rank */
  char** at;          /* per rank: where its buffer is here (NULL: by cross-memory copy) */
  void** maps;        /* per rank: our mapping of its allocation, to unmap */
  size_t* map_bytes;
  struct ncclWindow_vidmem* next;
};

/* The signal blocks of comm (one per rank), made by its first window registration. */
struct rma_state {
  int nctx, nsig;
  _Atomic uint64_t* mine;  /* my block: counters peers add to */
  uint64_t* seen;          /* what my waits consumed, same shape */
  _Atomic uint64_t** peer; /* per rank: its block as reached here */
  void** maps;
  size_t* map_bytes;
  size_t bytes;
  struct ncclWindow_vidmem* wins;
};

static inline size_t sig_at(const struct rma_state* r, int nranks, int ctx, int sig, int from) {
  return ((size_t)ctx * (size_t)r->nsig + (size_t)sig) * (size_t)nranks + (size_t)from;
}

static inline int rma_procs(const struct ncclComm* comm) { return comm->clique && comm->maps; }

/* Whether a peer's description of a buffer (bytes at offset off of an allocation of alloc bytes) is
 * one that could be mapped: checked before anything of it is used (window.c). */
int rma_span_ok(uint64_t off, uint64_t bytes, uint64_t alloc);
/* Whether a put of bytes at offset off stays inside a peer's window of size bytes (its description). */
static inline int rma_put_ok(uint64_t off, uint64_t bytes, uint64_t size) { return off <= size && bytes <= size - off; }
/* win, if it is a window of comm (else a WARN naming fn, and NULL). */
struct ncclWindow_vidmem* rma_win_of(struct ncclComm* comm, ncclWindow_t win, const char* fn);
/* Windows and signal blocks of comm, at its destruction (no call runs on it any more). */
void rma_release(struct ncclComm* comm);

#endif
