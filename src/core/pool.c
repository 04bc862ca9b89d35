/* The pool of per-peer connections: send/recv, AlltoAll, Gather and Scatter connect each peer they
 * meet (set 0 of comm->p2p), and a rank with a thousand peers cannot keep a FIFO for every one. At most
 * comm->p2p_cap peers keep live connections; at a call boundary the least recently used idle ones
 * are released, and the next call that needs one makes it again (comm_connect).
 *
 * Releasing needs both ends to agree: the FIFO is shared memory both map, and a sender may post a
 * message (one that fits the FIFO) long before its receiver asks for it. Each FIFO has one `pool` word
 * (transport.h): each end adds the messages a group will move over it before the group runs
 * (tp_pool_reserve), and an end that wants the connection gone closes it with one compare-exchange
 * that succeeds only when both ends have reserved the same number of messages (tp_pool_close) and
 * this end has no plan in flight. So a message never lands in a FIFO its receiver has let go of:
 * either the sender's reservation comes first (the close fails and is tried again at a later
 * boundary), or the close does (the reservation sees it, this end drops its side, and both ends
 * meet in comm_connect for the same message, as for a first connection: the k-th send to a peer is
 * its k-th receive from us, on every rank alike). No message and no wait: a rank's budget is its own
 * (CHORUS_P2P_PEERS need not agree: FIFOs are sized from CHORUS_P2P_MEM and the rank count alone), an abort never finds a release half done, and a mismatched call
 * finds the connection exactly as before (reservations that never balance only keep it live). Memory
 * is freed when the last end unmaps it: the closing end at once, the other when it next reaches a
 * call boundary with per-peer work (pool_before_connect gives back what peers closed).
 *
 * Network connections are pooled another way: their FIFOs are each end's own memory, so a peer over
 * budget keeps its connection (a socket) and its idle FIFOs give their pages back (tp_conn_trim): no
 * word from the peer, nothing to make again, zero pages on the next use (`trim` peers below). The
 * peers of RecDbl, Rabenseifner and Tree (set 1, made with the rings, log2 n of them) stay. */
#include <stdlib.h>
#include <string.h>

#include "../misc/log.h"
#include "../misc/param.h"
#include "../misc/utils.h"
#include "host_stream.h"
#include "pool.h"

static int poolable(const struct ncclComm* comm, int p) {
  return p != comm->rank && !(tp_flags(comm->peer_tp[p]) & TP_F_NETWORK);
}
static int trimmable(const struct ncclComm* comm, int p) {
  return p != comm->rank && (tp_flags(comm->peer_tp[p]) & TP_F_NETWORK) && tp_conn_can_trim(comm->peer_tp[p]);
}
static int pooled(const struct ncclComm* comm, int p) { return poolable(comm, p) || trimmable(comm, p); }

static int live(const struct ch_p2p* x) { return x->send.connected || x->recv.connected; }

/* A pooled peer that holds memory now: a live connection, or a network one whose pages are resident. */
static int holds(const struct ncclComm* comm, int p) {
  return poolable(comm, p) ? live(&comm->p2p[p]) : trimmable(comm, p) && comm->p2p_resident[p];
}

/* Drop this end of a closed connection; its byte counter and peer stay (chorusCommGetPeerCounters). */
static void drop(struct ch_p2p* x, int recv) {
  struct conn* c = recv ? &x->recv : &x->send;
  uint64_t bytes = atomic_load_explicit(&c->bytes, memory_order_relaxed);
  int peer = c->peer;
  tp_conn_free(c);
  c->peer = peer;
  atomic_store_explicit(&c->bytes, bytes, memory_order_relaxed);
  if (recv) x->recv_acked = 0;
}

static int idle_now(struct ncclComm* comm) {
  return !atomic_load(&comm->unticketed) && atomic_load(&comm->done_ticket) == atomic_load(&comm->next_ticket);
}

static int count_live(struct ncclComm* comm) {
  int k = 0;
  for (int p = 0; p < comm->nranks; p++) k += holds(comm, p);
  return k;
}

/* What readers on other threads see of the pool (chorusCommGetMemory): peers holding memory, and of
 * them the network ones. */
static int publish(struct ncclComm* comm) {
  int k = 0, net = 0;
  for (int p = 0; p < comm->nranks; p++)
    if (holds(comm, p)) k++, net += trimmable(comm, p);
  atomic_store_explicit(&comm->p2p_live, k, memory_order_relaxed);
  atomic_store_explicit(&comm->p2p_net_resident, net, memory_order_relaxed);
  return k;
}

/* Only from evict(), which runs with no plan of comm in flight (idle_now): tp_conn_trim's condition. */
static void trim(struct ncclComm* comm, int p) {
  struct ch_p2p* x = &comm->p2p[p];
  int s = !x->send.connected || tp_conn_trim(&x->send), r = !x->recv.connected || tp_conn_trim(&x->recv);
  if (!s || !r) return; /* a slot still in use: the next boundary tries again */
  comm->p2p_resident[p] = 0;
  atomic_fetch_add_explicit(&comm->p2p_trimmed, 1, memory_order_relaxed);
  INFO(LOG_P2P, "rank %d: gave back the network FIFO pages of rank %d (CHORUS_P2P_PEERS=%d peers)", comm->rank, p,
       comm->p2p_cap);
}

struct cand {
  uint64_t lru;
  int peer;
};
static int by_lru(const void* a, const void* b) {
  const struct cand *x = a, *y = b;
  return x->lru < y->lru ? -1 : x->lru > y->lru ? 1 : x->peer - y->peer;
}

/* Close least recently used peers not needed now until `over` are gone (or none is idle). */
static void evict(struct ncclComm* comm, int over) {
  int n = comm->nranks, nc = 0;
  struct cand* c = malloc(sizeof(*c) * (size_t)n);
  if (!c) return; /* stays over budget until the next boundary */
  for (int p = 0; p < n; p++)
    if (holds(comm, p) && !comm->p2p_count[p] && !comm->p2p_count[n + p]) c[nc++] = (struct cand){comm->p2p_lru[p], p};
  qsort(c, (size_t)nc, sizeof(*c), by_lru);
  for (int i = 0; i < nc && over > 0; i++) {
    struct ch_p2p* x = &comm->p2p[c[i].peer];
    if (trimmable(comm, c[i].peer)) {
      trim(comm, c[i].peer);
      over -= !comm->p2p_resident[c[i].peer];
      continue;
    }
    int s = !x->send.connected || tp_pool_close(&x->send), r = !x->recv.connected || tp_pool_close(&x->recv);
    if (s && x->send.connected) drop(x, 0);
    if (r && x->recv.connected) drop(x, 1);
    if (!live(x)) {
      over--;
      atomic_fetch_add_explicit(&comm->p2p_released, 1, memory_order_relaxed);
      INFO(LOG_P2P, "rank %d: released the connections with rank %d (CHORUS_P2P_PEERS=%d live peers)", comm->rank,
           c[i].peer, comm->p2p_cap);
    }
  }
  free(c);
}

/* Whether a peer that only the previous wave needed has not yet reserved what this rank has. A peer
 * ahead (it reserved for a later call of its own) is not waited for: this rank must get there first. */
static int last_wave_behind(struct ncclComm* comm) {
  int n = comm->nranks;
  for (int p = 0; p < n; p++) {
    struct ch_p2p* x = &comm->p2p[p];
    if (comm->p2p_lru[p] != comm->p2p_clock - 1 || !poolable(comm, p) || comm->p2p_count[p] || comm->p2p_count[n + p])
      continue;
    if ((x->send.connected && tp_pool_behind(&x->send, 1)) || (x->recv.connected && tp_pool_behind(&x->recv, 0)))
      return 1;
  }
  return 0;
}

int pool_before_connect(struct ncclComm* comm, const struct ch_plan* pl) { return pool_before_wave(comm, pl, 0); }

int pool_before_wave(struct ncclComm* comm, const struct ch_plan* pl, uint64_t wait_ns) {
  int n = comm->nranks, any = 0, missing = 0;
  if (!comm->p2p_count) return 0;
  for (int k = 0; k < pl->nops && !any; k++) /* collectives only (the common case): nothing to clear */
    any = (pl->ops[k].func == FUNC_SEND || pl->ops[k].func == FUNC_RECV) && pooled(comm, pl->ops[k].root);
  if (!any) return 0;
  memset(comm->p2p_count, 0, sizeof(int) * 2 * (size_t)n);
  memset(comm->p2p_mark, 0, 2 * (size_t)n);
  for (int k = 0; k < pl->nops; k++) {
    const struct ch_op* op = &pl->ops[k];
    if ((op->func != FUNC_SEND && op->func != FUNC_RECV) || !pooled(comm, op->root)) continue;
    comm->p2p_count[(op->func == FUNC_RECV ? n : 0) + op->root]++;
  }
  comm->p2p_clock++;
  int idle = idle_now(comm);
  for (int p = 0; idle && p < n; p++) { /* what peers closed: give back our end */
    struct ch_p2p* x = &comm->p2p[p];
    if (!poolable(comm, p) || !live(x)) continue;
    if (x->send.connected && tp_pool_closed(&x->send)) drop(x, 0);
    if (x->recv.connected && tp_pool_closed(&x->recv)) drop(x, 1);
    /* Released by the peer's close: counted here too, so each end counts every release it made. */
    if (!live(x)) atomic_fetch_add_explicit(&comm->p2p_released, 1, memory_order_relaxed);
  }
  int fresh = 0;
  for (int p = 0; p < n; p++) {
    int cs = comm->p2p_count[p], cr = comm->p2p_count[n + p];
    if (!cs && !cr) continue;
    struct ch_p2p* x = &comm->p2p[p];
    comm->p2p_lru[p] = comm->p2p_clock;
    int keep = trimmable(comm, p); /* never closed: connected once (below), its pages resident from now on */
    if (keep) comm->p2p_resident[p] = 1;
    for (int d = 0; d < 2; d++) {
      struct conn* c = d ? &x->recv : &x->send;
      int cnt = d ? cr : cs;
      if (!cnt) continue;
      if (c->connected && (keep || tp_pool_reserve(c, !d, cnt))) continue;
      if (c->connected) { /* the peer closed it: both ends make it again for this message */
        if (!idle) comm_wait_idle(comm), idle = 1; /* a plan in flight may still read it */
        drop(x, d);
        if (!live(x)) atomic_fetch_add_explicit(&comm->p2p_released, 1, memory_order_relaxed);
      }
      comm->p2p_mark[d * n + p] = 1;
      missing = 1;
    }
    fresh += !live(x) && !keep; /* after any drop above: a peer that closed is made again too */
  }
  int over = count_live(comm) + fresh - comm->p2p_cap;
  if (idle && over > 0) evict(comm, over);
  /* The previous wave's peers may not have reserved the messages this rank sent them yet (a send that
   * fit its FIFO ends first): they will, in that same wave, so wait a while for them to catch up.
   * Only from a group's second wave on (wait_ns 0 for the first): an older connection may hold a
   * message that a later wave of this group will take. */
  uint64_t until = ut_now_ns() + wait_ns;
  for (uint64_t k = 0; idle && wait_ns && (over = count_live(comm) + fresh - comm->p2p_cap) > 0 &&
                       last_wave_behind(comm) && !__atomic_load_n(&comm->abort_flag, __ATOMIC_RELAXED) &&
                       ut_now_ns() < until;
       k++) {
    ut_backoff(k);
    evict(comm, over);
  }
  publish(comm);
  return missing;
}

int pool_count(const struct ncclComm* comm, const char* need_send, const char* need_recv) {
  int k = 0;
  for (int p = 0; p < comm->nranks; p++) k += (need_send[p] || need_recv[p]) && pooled(comm, p);
  return k;
}

void pool_after_connect(struct ncclComm* comm) {
  int n = comm->nranks;
  if (!comm->p2p_mark) return;
  for (int k = 0; k < 2 * n; k++) {
    if (!comm->p2p_mark[k]) continue;
    struct conn* c = k >= n ? &comm->p2p[k - n].recv : &comm->p2p[k].send;
    /* New: the peer reserves its side only after this same handshake, so it cannot have closed it. */
    if (c->connected) {
      if (poolable(comm, k % n)) tp_pool_reserve(c, k < n, comm->p2p_count[k]);
      atomic_fetch_add_explicit(&comm->p2p_made, 1, memory_order_relaxed);
    }
    comm->p2p_mark[k] = 0;
  }
  int now = publish(comm);
  if (now > atomic_load_explicit(&comm->p2p_live_max, memory_order_relaxed))
    atomic_store_explicit(&comm->p2p_live_max, now, memory_order_relaxed);
}

void pool_sizes(const struct tp_sizes* ring, int n, int max_peers, struct tp_sizes* out, int* cap) {
  static const size_t p2p_cap[CH_NPROTO] = {64u << 10, 256u << 10, 512u << 10};
  int64_t mem = param_int(PARAM_P2P_MEM), kpeers = param_int(PARAM_P2P_PEERS);
  int64_t npeers = UT_MAX(1, (int64_t)n - 1);
  size_t full = 0, quantum = (size_t)CH_STEPS * 4096;
  for (int p = 0; p < CH_NPROTO; p++) full += UT_MIN(ring->buff[p], p2p_cap[p]);
  double scale = mem > 0 ? (double)mem / (double)npeers / (double)full : 1.0;
  if (scale > 1.0) scale = 1.0;
  for (int p = 0; p < CH_NPROTO; p++) {
    size_t b = (size_t)((double)UT_MIN(ring->buff[p], p2p_cap[p]) * scale) / quantum * quantum;
    out->buff[p] = UT_MAX(b, quantum);
  }
  /* The cap: the communicator's maxP2pPeers, else CHORUS_P2P_PEERS, else as many FIFOs of that size
   * as CHORUS_P2P_MEM holds. Neither changes the FIFO size, so ranks need not agree on them. */
  if (max_peers > 0) kpeers = max_peers;
  size_t fifo = tp_fifo_bytes(out);
  *cap = kpeers > 0 ? (int)UT_MIN(kpeers, (int64_t)n)
                    : (int)UT_MIN((int64_t)n, UT_MAX(1, mem > 0 ? mem / (int64_t)fifo : (int64_t)n));
}

int pool_release_idle(struct ncclComm* comm) {
  int k = 0;
  for (int p = 0; comm->p2p && p < comm->nranks; p++) {
    struct ch_p2p* x = &comm->p2p[p];
    if (!poolable(comm, p) || !live(x)) continue;
    /* Closed by the peer (before or during our try) or by us: either way this end lets go. */
    int s = !x->send.connected || tp_pool_closed(&x->send) || tp_pool_close(&x->send) || tp_pool_closed(&x->send);
    int r = !x->recv.connected || tp_pool_closed(&x->recv) || tp_pool_close(&x->recv) || tp_pool_closed(&x->recv);
    if (s && x->send.connected) drop(x, 0);
    if (r && x->recv.connected) drop(x, 1);
    if (!live(x)) k++, atomic_fetch_add_explicit(&comm->p2p_released, 1, memory_order_relaxed);
  }
  publish(comm);
  return k;
}
