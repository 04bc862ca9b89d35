/* ncclMemAlloc's allocations and ncclCommRegister's registrations (core/memreg.c), and what Direct
 * learns of a buffer from them. */
#ifndef CH_CORE_MEMREG_H
#define CH_CORE_MEMREG_H

#include "../comm/work.h"

/* A tracked block: an allocation (ncclMemAlloc) or a registration (ncclCommRegister). */
struct ch_block {
  void* ptr;
  size_t size;
  const struct ncclComm* comm; /* registrations only */
  int fd;                      /* allocations: the memfd behind it, -1 for plain memory */
  int device;                  /* allocations: CUDA device memory (cuMemAlloc) */
  size_t seg;                  /* allocations: bytes mapped (the user's, then the token page) */
  uint64_t token;              /* allocations: export token once a peer process may need it (0: not yet) */
  struct ch_block* next;
};
enum { MEMREG_ALLOCS = 0, MEMREG_REGS = 1 };
void memreg_track(int which, struct ch_block* b);
/* Remove the block matching key: its ptr (allocations) or the handle itself (by_handle). NULL: none. */
struct ch_block* memreg_untrack(int which, const void* key, int by_handle);
/* A sealed memfd plus a token page, so that other local processes can map the buffer (*fd >= 0,
 * *seg the bytes mapped); plain page-aligned memory if the kernel has no memfd (*fd = -1). */
void* memreg_alloc_shareable(size_t size, int* fd, size_t* seg);

/* Describe buf for direct algorithms (core/memreg.c): 1 if [buf, buf + bytes) lies in one memfd-backed
 * ncclMemAlloc allocation that other local processes can map, else 0 (out still has the address). */
int mem_describe(const void* buf, size_t bytes, struct direct_buf* out);

#endif
