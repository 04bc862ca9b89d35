/* Suspend: what an idle communicator can do without is let go, and made again on demand.
 *
 * - Pooled per-peer connections (core/pool.c) close by both ends' agreement on their `pool` word, as
 *   the pool's own evictions do; one holding a message its receiver has not asked for stays live.
 * - The rings' FIFOs and those of RecDbl, Rabenseifner and Tree (set 1 of comm->p2p) are made with the
 *   first collective (connect.c, core/group.c's plan_needs) and nothing else releases them. They are
 *   released here only because suspend is collective: every rank has finished its calls (comm_wait_idle)
 *   before it passes the barrier, and a collective ends on a rank only once it has received all it
 *   is owed, so no FIFO holds a message. Each rank then clears rings_connected, and its next
 *   collective (the same call on every rank) makes them again, as the first one did. Not over the
 *   network (comm->tune_net, alike on every rank): a TCP connection's close and remake cost more than
 *   its small FIFO, and they stay.
 * - The reproducible reductions' scratch (plan_build makes it again) and the cached plan of the last
 *   collective (it names the FIFOs and the scratch).
 * What stays: the one-slot scratch buffers (init.c), the self connection, network connections, the
 * bootstrap, the ncclMemAlloc maps, and the CUDA staging pool (its captured graphs replay without
 * reconnecting). docs/COMPATIBILITY.md. */
#include <stdlib.h>

#include "../misc/log.h"
#include "../misc/utils.h"
#include "host_stream.h"
#include "plan.h"
#include "pool.h"
#include "suspend.h"

static void free_conn(struct conn* c) {
  tp_conn_closing(c);
  tp_conn_free(c);
}

ch_status comm_suspend(struct ncclComm* comm, struct suspend_report* out) {
  int n = comm->nranks;
  *out = (struct suspend_report){0};
  CHECK(comm_wait_idle(comm));
  uint64_t to = atomic_load(&comm->timeout_ns);
  boot_set_deadline(comm->boot, to ? ut_now_ns() + to : 0); /* a rank that never suspends: CHORUS_TIMEOUT */
  ch_status s = n > 1 ? boot_barrier(comm->boot) : CH_OK;
  boot_set_deadline(comm->boot, 0);
  if (s != CH_OK) {
    WARN("ncclCommSuspend: rank %d: not every rank of the %d reached ncclCommSuspend (%s); nothing was released "
         "(suspend is collective: every rank calls it)", comm->rank, n, ch_status_str(s));
    return s;
  }
  plan_free(atomic_exchange(&comm->reuse_plan, NULL));
  out->peers = pool_release_idle(comm);
  if (comm->rings_connected && !comm->tune_net) {
    for (int c = 0; c < comm->nchannels; c++) free_conn(&comm->channels[c].send), free_conn(&comm->channels[c].recv);
    for (int p = 0; comm->p2p && p < n; p++) {
      if (p == comm->rank) continue;
      free_conn(&comm_apeer(comm, p)->send);
      free_conn(&comm_apeer(comm, p)->recv);
      comm_apeer(comm, p)->recv_acked = 0;
    }
    comm->rings_connected = 0;
    out->rings = 1;
  }
  if (comm->repro_scratch) {
    out->repro = comm->peer_step_bytes * (size_t)n;
    free(comm->repro_scratch);
    comm->repro_scratch = NULL;
  }
  atomic_store(&comm->suspended, 1);
  return CH_OK;
}

int comm_resume(struct ncclComm* comm, const char* by) {
  if (!atomic_load_explicit(&comm->suspended, memory_order_relaxed)) return 0;
  atomic_store(&comm->suspended, 0);
  INFO(LOG_INIT, "rank %d: communicator %p resumed by %s (connections are made again as calls need them)",
       comm->rank, (void*)comm, by);
  return 1;
}
