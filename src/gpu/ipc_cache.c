/* A rank's cache of peers' allocations opened here (CUDA IPC): one lookup for the copier
 * (gpu/copier.c) and the bridge (gpu/resolve.c), which differ only in when an entry may be closed. */
#include "../misc/log.h"
#include "gpu.h"

static int cyc_before(uint32_t a, uint32_t b) { return (int32_t)(a - b) < 0; }

ch_status gpu_ipc_get(struct gpu_comm* g, struct gpu_ipc* cache, int r, const struct gpu_buf_desc* d,
                      const struct gpu_ipc_user* u, struct gpu_ipc** out) {
  struct gpu_ipc* e = NULL;
  for (int k = 0; k < GPU_IPC_CACHE && !e; k++)
    if (cache[k].base && cache[k].id == d->id) e = &cache[k];
  if (!e) {
    for (int k = 0; k < GPU_IPC_CACHE; k++) { /* an allocation at the same address was freed: close it */
      struct gpu_ipc* o = &cache[k];
      if (o->base && o->peer_base == d->base && u->idle(u->arg, o)) gpu_ipc_close(g->ctx, o->base), o->base = 0;
    }
    for (int k = 0; k < GPU_IPC_CACHE && !e; k++)
      if (!cache[k].base) e = &cache[k];
    if (!e) /* no free entry: the least recently used idle one (the first entry may be busy) */
      for (int k = 0; k < GPU_IPC_CACHE; k++)
        if (u->idle(u->arg, &cache[k]) && (!e || cyc_before(cache[k].last_seq, e->last_seq))) e = &cache[k];
    if (!e) {
      WARN("rank %d: %s use more than %d buffers of rank %d: wait for some (synchronise the stream)", u->rank, u->busy,
           GPU_IPC_CACHE, r);
      return CH_INVALID_USAGE;
    }
    if (e->base) gpu_ipc_close(g->ctx, e->base), e->base = 0;
    uintptr_t b = 0;
    size_t sz = 0;
    int cu = 0;
    if (gpu_ipc_open(g->ctx, g->comm->peers[r].proc_nonce, d->id, &d->h, &b, &sz, &cu) != CH_OK) {
      if (cu)
        WARN("rank %d: cannot open rank %d's device buffer through CUDA IPC: cuIpcOpenMemHandle: %s (%d)", u->rank, r,
             cudrv_errstr(cu), cu);
      return CH_SYSTEM;
    }
    e->id = d->id, e->peer_base = d->base, e->base = b, e->size = sz, e->pinned = 0;
  }
  *out = e;
  return CH_OK;
}
