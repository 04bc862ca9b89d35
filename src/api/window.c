/* Windows and one-sided calls (NCCL 2.29): ncclCommWindowRegister/Deregister, ncclWinGetUserPtr,
 * ncclPutSignal, ncclSignal, ncclWaitSignal, for ranks on one host (threads and processes).
 *
 * Registration is collective: every rank publishes its buffer (address, size, and the ncclMemAlloc
 * allocation it lies in, if any) in an allgather. The first registration also makes each rank's signal
 * block: numRmaCtx x numRmaSig x nranks counters in shareable memory, where rank p's signals to this
 * rank count at [ctx][sig][p]. A put writes straight into the target's buffer: by address between
 * threads; through a mapping of the target's ncclMemAlloc allocation between processes (made at
 * registration, held until deregistration); or by a cross-memory copy when CHORUS_CMA made one
 * possible (direct_cma.c's probe). Then it adds one to the target's counter with release order, so
 * the waiter that sees the count (acquire) sees the data: when a wait returns, every put it counted is
 * in the window. A put (NULL stream) is complete when it returns: the local buffer may be reused, and
 * puts to one peer land in issue order whatever NCCL_WIN_STRICT_ORDERING says. A host stream's call
 * runs in stream order (the stream is drained first, then the call runs). CUDA streams and windows
 * across hosts are refused by name.
 *
 * What peers published is checked before use (sizes against allocations, offsets against sizes); the
 * origin refuses a put past the end of the target's window, a window not registered on this comm, a
 * signal index or context out of range. Only the thread that calls on the comm touches its windows
 * (NCCL's rule for calls on one communicator); signal counters are atomics shared with peers. */
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "../misc/log.h"
#include "../misc/utils.h"
#include "../bootstrap/bootstrap.h"
#include "../comm/comm.h"
#include "../core/group.h"
#include "../core/host_stream.h"
#include "../core/init.h"
#include "../core/memreg.h"
#include "../transport/transport.h"
#include "api.h"
#include "chorus.h"
#include "rma.h"

/* Map rank k's allocation holding d (user bytes alloc, exported under token); NULL with a WARN. */
int rma_span_ok(uint64_t off, uint64_t bytes, uint64_t alloc) {
  return off <= alloc && bytes <= alloc - off && alloc <= (uint64_t)PTRDIFF_MAX - 8192; /* + the token page */
}

static char* map_peer(struct ncclComm* comm, int k, uint64_t token, uint64_t alloc, uint64_t off, uint64_t bytes,
                      void** base, size_t* mapped, const char* what) {
  if (!rma_span_ok(off, bytes, alloc)) {
    WARN("rank %d described %s of %llu bytes at offset %llu of a %llu-byte allocation: refused", k, what,
         (unsigned long long)bytes, (unsigned long long)off, (unsigned long long)alloc);
    return NULL;
  }
  *mapped = tp_mem_segment_bytes(alloc);
  *base = tp_fd_map(comm->peers[k].proc_nonce, token, *mapped, tp_mem_token_off(alloc), 0, k, what);
  return *base ? (char*)*base + off : NULL;
}

static void rma_free(struct ncclComm* comm) {
  struct rma_state* r = comm->rma;
  if (!r) return;
  for (int k = 0; r->maps && k < comm->nranks; k++)
    if (r->maps[k]) munmap(r->maps[k], r->map_bytes[k]);
  if (r->mine) ncclMemFree((void*)r->mine);
  free(r->seen), free(r->peer), free(r->maps), free(r->map_bytes), free(r);
  comm->rma = NULL;
}

/* The signal block of this rank and how it reaches every peer's (all: the allgathered descriptors). */
static ch_status rma_connect(struct ncclComm* comm, const struct win_desc* all) {
  struct rma_state* r = comm->rma;
  int n = comm->nranks;
  for (int k = 0; r->bytes && k < n; k++) { /* no signals (numRmaCtx or numRmaSig 0): nothing to reach */
    if (k == comm->rank) {
      r->peer[k] = r->mine;
    } else if (!rma_procs(comm)) {
      r->peer[k] = (_Atomic uint64_t*)(uintptr_t)all[k].sig_addr;
    } else {
      r->peer[k] = (_Atomic uint64_t*)map_peer(comm, k, all[k].sig_token, all[k].sig_alloc, 0, r->bytes, &r->maps[k],
                                               &r->map_bytes[k], "its signal block");
      if (!r->peer[k]) return CH_REMOTE;
    }
  }
  return CH_OK;
}

/* A window's mappings of its peers' allocations and its records (w may be partly made). */
static void win_free(const struct ncclComm* comm, struct ncclWindow_vidmem* w) {
  for (int k = 0; w->maps && k < comm->nranks; k++)
    if (w->maps[k]) munmap(w->maps[k], w->map_bytes[k]);
  w->magic = 0;
  free(w->d), free(w->at), free(w->maps), free(w->map_bytes), free(w);
}

void rma_release(struct ncclComm* comm) {
  for (struct ncclWindow_vidmem *w = comm->rma ? comm->rma->wins : NULL, *nx; w; w = nx) {
    nx = w->next;
    win_free(comm, w);
  }
  rma_free(comm);
}

static ch_status rma_setup(struct ncclComm* comm, struct win_desc* mine) {
  struct rma_state* r = calloc(1, sizeof(*r));
  int n = comm->nranks;
  if (!r) return CH_SYSTEM;
  comm->rma = r;
  /* NCCL's defaults (1 each) when unset; 0 turns one-sided calls off (rma_enter says so). */
  r->nctx = comm->config.numRmaCtx == NCCL_CONFIG_UNDEF_INT ? 1 : comm->config.numRmaCtx;
  r->nsig = comm->config.numRmaSig == NCCL_CONFIG_UNDEF_INT ? 1 : comm->config.numRmaSig;
  if (r->nctx < 0 || r->nsig < 0 || (size_t)r->nctx * (size_t)r->nsig > (1u << 16)) {
    WARN("ncclCommWindowRegister: numRmaCtx %d x numRmaSig %d signals: at most 65536", r->nctx, r->nsig);
    return CH_INVALID_ARG;
  }
  r->bytes = (size_t)r->nctx * (size_t)r->nsig * (size_t)n * sizeof(uint64_t);
  r->seen = calloc(r->bytes, 1);
  r->peer = calloc((size_t)n, sizeof(*r->peer));
  r->maps = calloc((size_t)n, sizeof(*r->maps));
  r->map_bytes = calloc((size_t)n, sizeof(*r->map_bytes));
  void* blk = NULL;
  if (!r->bytes) return CH_OK; /* no signals: nothing to share */
  if (!r->seen || !r->peer || !r->maps || !r->map_bytes || ncclMemAlloc(&blk, r->bytes) != ncclSuccess) {
    WARN("ncclCommWindowRegister: out of memory for %zu bytes of signals", r->bytes);
    return CH_SYSTEM;
  }
  memset(blk, 0, r->bytes);
  r->mine = blk;
  struct direct_buf d;
  mem_describe(blk, r->bytes, &d);
  mine->sig_token = rma_procs(comm) ? d.token : 0, mine->sig_alloc = d.alloc_bytes, mine->sig_addr = d.addr;
  if (rma_procs(comm) && !d.token) {
    WARN("ncclCommWindowRegister: cannot share the signal block with the other processes");
    return CH_SYSTEM;
  }
  return CH_OK;
}

CH_API(ncclResult_t, ncclCommWindowRegister, ncclComm_t comm, void* buff, size_t size, ncclWindow_t* win,
       int winFlags) {
  const char* fn = "ncclCommWindowRegister";
  ch_status s = comm_check(comm, fn);
  if (s != CH_OK) return ch_to_nccl(s);
  ARG_NONNULL(win, fn);
  *win = NULL;
  if (!buff || !size) {
    WARN("%s: buffer %p of %zu bytes: a window needs memory", fn, buff, size);
    return ncclInvalidArgument;
  }
  if (winFlags & ~(NCCL_WIN_COLL_SYMMETRIC | NCCL_WIN_STRICT_ORDERING)) {
    WARN("%s: unknown winFlags 0x%x (NCCL_WIN_DEFAULT, NCCL_WIN_COLL_SYMMETRIC, NCCL_WIN_STRICT_ORDERING)", fn,
         (unsigned)winFlags);
    return ncclInvalidArgument;
  }
  /* Registration runs at once (NCCL defers it to the group's end): one thread registering windows of
   * two communicators in one group would wait for itself. */
  static _Thread_local uint64_t grp_epoch;
  static _Thread_local const struct ncclComm* grp_comm;
  if (group_depth() > 0) {
    if (grp_epoch == group_epoch() && grp_comm != comm) {
      WARN("%s: this thread already registered a window of communicator %p in this group; register each "
           "communicator's windows outside a group, or from its own thread",
           fn, (const void*)grp_comm);
      return ncclInvalidUsage;
    }
    grp_epoch = group_epoch(), grp_comm = comm;
  }
  struct comm_guard g;
  if ((s = comm_enter(comm, &g)) != CH_OK) return ch_to_nccl(s);
  struct ncclWindow_vidmem* w = NULL;
  struct win_desc* all = NULL;
  int32_t* ok = NULL;
  int n = comm->nranks;
  if ((s = comm_ensure_ready(comm)) != CH_OK) goto out;
  if (!comm->clique && n > 1) {
    WARN("%s: one-sided windows need every rank on one host for now (this communicator spans %d hosts)", fn,
         comm->nnodes);
    s = CH_INVALID_USAGE;
    goto out;
  }
  if ((s = comm_wait_idle(comm)) != CH_OK) goto out;
  all = calloc((size_t)n, sizeof(*all));
  ok = calloc((size_t)n, sizeof(*ok));
  w = calloc(1, sizeof(*w));
  if (!all || !ok || !w || !(w->at = calloc((size_t)n, sizeof(char*))) ||
      !(w->maps = calloc((size_t)n, sizeof(void*))) || !(w->map_bytes = calloc((size_t)n, sizeof(size_t)))) {
    s = CH_SYSTEM;
    goto out;
  }
  struct direct_buf d;
  mem_describe(buff, size, &d);
  struct win_desc* me = &all[comm->rank];
  *me = (struct win_desc){.addr = (uint64_t)(uintptr_t)buff,
                          .size = size,
                          .token = rma_procs(comm) ? d.token : 0,
                          .alloc = d.alloc_bytes,
                          .off = d.off};
  int first = comm->rma == NULL; /* every rank alike: registrations are collective */
  if (first && (s = rma_setup(comm, me)) != CH_OK) {
    rma_free(comm);
    goto out;
  }
  s = boot_allgather(comm->boot, all, sizeof(*all));
  /* The verdict on what the ranks published comes first, from the same table on every rank (a rank
   * that refused alone would leave, and the others fail to map what it withdrew). */
  for (int k = 0; s == CH_OK && k < n; k++)
    if (rma_procs(comm) && !all[k].token && !comm->cma) {
      WARN("%s: rank %d's window is not ncclMemAlloc memory, which other processes cannot map; allocate windows "
           "with ncclMemAlloc (or set CHORUS_CMA=1 where the kernel allows cross-memory copies)",
           fn, k);
      s = CH_INVALID_USAGE;
    }
  int verdict = s == CH_OK;
  if (s == CH_OK && first) s = rma_connect(comm, all);
  for (int k = 0; s == CH_OK && k < n; k++) {
    if (k == comm->rank || !rma_procs(comm)) {
      w->at[k] = k == comm->rank ? buff : (char*)(uintptr_t)all[k].addr;
    } else if (all[k].token) {
      w->at[k] = map_peer(comm, k, all[k].token, all[k].alloc, all[k].off, all[k].size, &w->maps[k], &w->map_bytes[k],
                          "its window");
      if (!w->at[k]) s = CH_REMOTE;
    }
  }
  /* Every rank says whether it reached every window and signal block: one outcome everywhere, and no
   * rank returns (and perhaps frees its window) while a peer still maps it. */
  if (verdict) {
    ok[comm->rank] = s == CH_OK;
    ch_status gs = boot_allgather(comm->boot, ok, sizeof(*ok));
    for (int k = 0; gs == CH_OK && s == CH_OK && k < n; k++)
      if (!ok[k]) {
        WARN("%s: rank %d could not reach every rank's window or signals (see its WARN): not registered", fn, k);
        s = CH_REMOTE;
      }
    if (gs != CH_OK) s = gs;
  }
  if (s != CH_OK && first) rma_free(comm); /* the next registration makes the signals again, on every rank */
  if (s != CH_OK) goto out;
  w->magic = WIN_MAGIC, w->comm = comm, w->user = buff, w->size = size, w->flags = winFlags, w->d = all;
  all = NULL;
  w->next = comm->rma->wins;
  comm->rma->wins = w;
  *win = w;
  w = NULL;
out:
  if (w) win_free(comm, w);
  free(all), free(ok);
  comm_leave(&g);
  return ch_to_nccl(s);
}

/* win, if it is a window of comm (else a WARN naming fn). */
struct ncclWindow_vidmem* rma_win_of(struct ncclComm* comm, ncclWindow_t win, const char* fn) {
  for (struct ncclWindow_vidmem* w = comm->rma ? comm->rma->wins : NULL; w; w = w->next)
    if (w == win && w->magic == WIN_MAGIC) return w;
  WARN("%s: window %p is not registered on communicator %p (deregistered, or another communicator's)", fn, (void*)win,
       (void*)comm);
  return NULL;
}

CH_API(ncclResult_t, ncclCommWindowDeregister, ncclComm_t comm, ncclWindow_t win) {
  const char* fn = "ncclCommWindowDeregister";
  ch_status s = comm_check(comm, fn);
  if (s != CH_OK) return ch_to_nccl(s);
  struct comm_guard g;
  if ((s = comm_enter(comm, &g)) != CH_OK) return ch_to_nccl(s);
  struct ncclWindow_vidmem* w = rma_win_of(comm, win, fn);
  if (!w) s = CH_INVALID_ARG;
  /* Collective: no peer may still put into it once anyone unmaps or reuses it. */
  int32_t* all = s == CH_OK ? calloc((size_t)comm->nranks, sizeof(int32_t)) : NULL;
  if (s == CH_OK && !all) s = CH_SYSTEM;
  if (s == CH_OK && (s = comm_wait_idle(comm)) == CH_OK) s = boot_allgather(comm->boot, all, sizeof(int32_t));
  free(all);
  if (w && s == CH_OK) {
    struct ncclWindow_vidmem** p = &comm->rma->wins;
    while (*p != w) p = &(*p)->next;
    *p = w->next;
    win_free(comm, w);
  }
  comm_leave(&g);
  return ch_to_nccl(s);
}

CH_API(ncclResult_t, ncclWinGetUserPtr, ncclComm_t comm, ncclWindow_t win, void** outUserPtr) {
  ch_status s = comm_check(comm, "ncclWinGetUserPtr");
  if (s != CH_OK) return ch_to_nccl(s);
  ARG_NONNULL(outUserPtr, "ncclWinGetUserPtr");
  *outUserPtr = NULL;
  struct ncclWindow_vidmem* w = rma_win_of(comm, win, "ncclWinGetUserPtr");
  if (!w) return ncclInvalidArgument;
  *outUserPtr = w->user;
  return ncclSuccess;
}
