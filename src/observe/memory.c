/* Memory per rank (chorusCommGetMemory, the chorus_memory_* gauges, chorus-info's "Memory per rank"):
 * what a communicator holds in FIFOs, counted from its connections, and what the process holds, read
 * from /proc/self (every rank of a process reports the same process figures). docs/SCALE.md. */
#include <dirent.h>
#include <stdio.h>
#include <string.h>

#include "observe.h"

static uint64_t kb_field(const char* text, const char* key) {
  const char* p = strstr(text, key);
  unsigned long long v = 0;
  if (p && sscanf(p + strlen(key), " %llu", &v) == 1) return (uint64_t)v;
  return 0;
}

void obs_proc_memory(struct obs_proc_mem* out) {
  memset(out, 0, sizeof(*out));
  char buf[4096];
  FILE* f = fopen("/proc/self/status", "r");
  if (f) {
    size_t n = fread(buf, 1, sizeof(buf) - 1, f);
    buf[n] = '\0';
    fclose(f);
    out->shmem = kb_field(buf, "\nRssShmem:") << 10;
    out->priv = kb_field(buf, "\nRssAnon:") << 10;
    out->pinned = (kb_field(buf, "\nVmPin:") + kb_field(buf, "\nVmLck:")) << 10;
    out->threads = kb_field(buf, "\nThreads:");
  }
  DIR* d = opendir("/proc/self/fd");
  if (d) {
    for (struct dirent* e; (e = readdir(d));)
      if (e->d_name[0] != '.') out->fds++;
    closedir(d);
    if (out->fds) out->fds--; /* the directory's own descriptor */
  }
}

static uint64_t made_here(const struct conn* c) {
  /* receive FIFOs are this rank's memory; send FIFOs are the peer's, mapped here */
  return atomic_load_explicit(&((struct conn*)c)->connected, memory_order_acquire) ? c->map_bytes : 0;
}

void obs_comm_memory(const struct ncclComm* comm, struct obs_mem* out) {
  memset(out, 0, sizeof(*out));
  out->p2p_cap = (uint64_t)comm->p2p_cap;
  out->p2p_fifo = tp_fifo_bytes(&comm->p2p_sizes);
  /* The pool's own count, as its cap and high-water mark: live local connections and network peers whose
   * FIFO pages are resident (a network peer keeps its sockets after giving its pages back). */
  out->p2p_peers = (uint64_t)atomic_load_explicit(&((struct ncclComm*)comm)->p2p_live, memory_order_relaxed);
  out->p2p_peers_max = (uint64_t)atomic_load_explicit(&((struct ncclComm*)comm)->p2p_live_max, memory_order_relaxed);
  out->p2p_released = atomic_load_explicit(&((struct ncclComm*)comm)->p2p_released, memory_order_relaxed);
  out->p2p_made = atomic_load_explicit(&((struct ncclComm*)comm)->p2p_made, memory_order_relaxed);
  out->net_resident = (uint64_t)atomic_load_explicit(&((struct ncclComm*)comm)->p2p_net_resident, memory_order_relaxed);
  out->net_trimmed = atomic_load_explicit(&((struct ncclComm*)comm)->p2p_trimmed, memory_order_relaxed);
  for (int c = 0; c < comm->nchannels; c++) out->ring_bytes += made_here(&comm->channels[c].recv);
  uint64_t kept = 0, pooled = 0; /* receive FIFOs made here that a suspend keeps / releases */
  for (int p = 0; comm->p2p && p < comm->nranks; p++) {
    const struct ch_p2p* x = &comm->p2p[p];
    out->ring_bytes += p == comm->rank ? 0 : made_here(&comm->p2p[comm->nranks + p].recv);
    uint64_t own = made_here(&x->recv);
    if (p == comm->rank || (tp_flags(comm->peer_tp[p]) & TP_F_NETWORK)) kept += own; /* core/pool.c's poolable */
    else pooled += own;
    if (p == comm->rank) continue;
    int s = atomic_load_explicit(&((struct conn*)&x->send)->connected, memory_order_acquire);
    int r = atomic_load_explicit(&((struct conn*)&x->recv)->connected, memory_order_acquire);
    out->p2p_send_bytes += s ? out->p2p_fifo : 0;
    out->p2p_recv_bytes += r ? out->p2p_fifo : 0;
  }
  /* core/suspend.c: the rings and RecDbl/Rabenseifner/Tree FIFOs go unless some rank talks over the network */
  uint64_t rings = comm->tune_net ? 0 : out->ring_bytes;
  uint64_t repro = comm->repro_scratch ? comm->peer_step_bytes * (uint64_t)comm->nranks : 0;
  out->suspend_bytes = pooled + rings + repro;
  out->persist_bytes = kept + (out->ring_bytes - rings) + comm->scratch_bytes + comm->peer_step_bytes;
  out->suspended = (uint64_t)(atomic_load(&((struct ncclComm*)comm)->suspended) != 0);
}
