/* Counters: calls, bytes, errors and time spent waiting per communicator, and bytes and waiting per
 * peer, readable at any time (chorusCommGetCounters, the stall query service) and printable in
 * Prometheus' text format. The engine adds to them with relaxed atomics (core/plan.c); bytes per peer
 * are summed here from the connections that reach it, so the per-step path adds to one word only. */
#include <stdarg.h>
#include <stdio.h>

#include "../misc/utils.h"
#include "observe.h"

void obs_counters(const struct ncclComm* comm, struct obs_ctr* out) {
  out->calls = atomic_load_explicit(&comm->ctr_calls, memory_order_relaxed) +
               atomic_load_explicit(&comm->ctr_noop, memory_order_relaxed);
  out->bytes = atomic_load_explicit(&comm->ctr_bytes, memory_order_relaxed);
  out->wait_ns = atomic_load_explicit(&comm->ctr_wait_ns, memory_order_relaxed);
  out->errors = atomic_load_explicit(&comm->ctr_errors, memory_order_relaxed);
}

static uint64_t moved(const struct conn* c, int peer) {
  /* c->peer and bytes outlive a connection the pool released (core/pool.c); an unused one holds 0 */
  return c->peer == peer ? atomic_load_explicit(&c->bytes, memory_order_relaxed) : 0;
}

void obs_peer_counters(const struct ncclComm* comm, int peer, struct obs_peer_ctr* out) {
  out->sent = out->received = out->wait_ns = out->put_bytes = out->signals = 0;
  if (peer < 0 || peer >= comm->nranks) return;
  for (int c = 0; c < comm->nchannels; c++) {
    out->sent += moved(&comm->channels[c].send, peer);
    out->received += moved(&comm->channels[c].recv, peer);
  }
  if (comm->p2p) {
    const struct ch_p2p* p[2] = {&comm->p2p[peer], &comm->p2p[comm->nranks + peer]};
    for (int k = 0; k < 2; k++) out->sent += moved(&p[k]->send, peer), out->received += moved(&p[k]->recv, peer);
  }
  if (comm->wait_ns_peer) out->wait_ns = atomic_load_explicit(&comm->wait_ns_peer[peer], memory_order_relaxed);
  if (comm->rma_ctr) {
    out->put_bytes = atomic_load_explicit(&comm->rma_ctr[peer], memory_order_relaxed);
    out->signals = atomic_load_explicit(&comm->rma_ctr[comm->nranks + peer], memory_order_relaxed);
  }
}

static size_t put(char* out, size_t cap, size_t at, const char* fmt, ...) __attribute__((format(printf, 4, 5)));
static size_t put(char* out, size_t cap, size_t at, const char* fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  int k = vsnprintf(at < cap ? out + at : NULL, at < cap ? cap - at : 0, fmt, ap);
  va_end(ap);
  return at + (k > 0 ? (size_t)k : 0);
}

/* One family: its HELP and TYPE once, then a sample per communicator (and per peer). */
enum { F_CALLS, F_BYTES, F_WAIT, F_ERRORS, F_PEER_SENT, F_PEER_RECV, F_PEER_WAIT, F_PEER_PUT, F_PEER_SIG, F_COUNT };
static const struct {
  const char *name, *help;
  int per_peer, seconds;
} fam[F_COUNT] = {
    {"chorus_calls_total", "Calls finished on the communicator (collectives, sends and receives).", 0, 0},
    {"chorus_bytes_total", "Data of those calls: count times type size, as each call gave them.", 0, 0},
    {"chorus_wait_seconds_total", "Time this rank's engine waited for peers inside calls.", 0, 1},
    {"chorus_errors_total", "Calls that failed.", 0, 0},
    {"chorus_peer_sent_bytes_total", "Payload bytes sent to the peer over connections.", 1, 0},
    {"chorus_peer_received_bytes_total", "Payload bytes received from the peer over connections.", 1, 0},
    {"chorus_peer_wait_seconds_total", "Time this rank waited on the peer (data from it or room in its FIFO).", 1, 1},
    {"chorus_peer_put_bytes_total", "Bytes this rank put into the peer's windows (ncclPutSignal).", 1, 0},
    {"chorus_peer_signals_total", "Signals this rank sent to the peer (ncclPutSignal, ncclSignal).", 1, 0},
};

size_t obs_prometheus(struct ncclComm* const* comms, int n, char* out, size_t cap) {
  size_t at = 0;
  if (cap) out[0] = '\0';
  for (int f = 0; f < F_COUNT; f++) {
    at = put(out, cap, at, "# HELP %s %s\n# TYPE %s counter\n", fam[f].name, fam[f].help, fam[f].name);
    for (int i = 0; i < n; i++) {
      const struct ncclComm* c = comms[i];
      char labels[128];
      snprintf(labels, sizeof(labels), "comm=\"%016llx\",rank=\"%d\",nranks=\"%d\"", (unsigned long long)c->comm_hash,
               c->rank, c->nranks);
      if (!fam[f].per_peer) {
        struct obs_ctr t;
        obs_counters(c, &t);
        uint64_t v = f == F_CALLS ? t.calls : f == F_BYTES ? t.bytes : f == F_WAIT ? t.wait_ns : t.errors;
        if (fam[f].seconds) at = put(out, cap, at, "%s{%s} %.9f\n", fam[f].name, labels, (double)v / UT_NS_PER_S);
        else at = put(out, cap, at, "%s{%s} %llu\n", fam[f].name, labels, (unsigned long long)v);
        continue;
      }
      for (int p = 0; p < c->nranks; p++) {
        if (p == c->rank) continue;
        struct obs_peer_ctr pc;
        obs_peer_counters(c, p, &pc);
        uint64_t v = f == F_PEER_SENT ? pc.sent : f == F_PEER_RECV ? pc.received : f == F_PEER_WAIT ? pc.wait_ns
                   : f == F_PEER_PUT  ? pc.put_bytes : pc.signals;
        if (!v) continue; /* peers this rank never talked to: a 1000-rank comm stays readable */
        if (fam[f].seconds)
          at = put(out, cap, at, "%s{%s,peer=\"%d\"} %.9f\n", fam[f].name, labels, p, (double)v / UT_NS_PER_S);
        else at = put(out, cap, at, "%s{%s,peer=\"%d\"} %llu\n", fam[f].name, labels, p, (unsigned long long)v);
      }
    }
  }
  /* Memory per rank (observe/memory.c): gauges, per communicator and of its process. */
  static const struct {
    const char *name, *help;
  } mem[] = {
      {"chorus_memory_p2p_peers", "Peers with live per-peer connections (send/recv, AlltoAll, Gather, Scatter)."},
      {"chorus_memory_p2p_peers_max", "The most peers with live per-peer connections at once."},
      {"chorus_memory_p2p_peers_cap", "Most per-peer connections kept (CHORUS_P2P_PEERS or CHORUS_P2P_MEM)."},
      {"chorus_memory_p2p_fifo_bytes", "Bytes of one per-peer FIFO."},
      {"chorus_memory_p2p_recv_fifo_bytes", "Per-peer receive FIFOs this rank made."},
      {"chorus_memory_p2p_send_fifo_bytes", "Per-peer send FIFOs (the peers') this rank maps."},
      {"chorus_memory_p2p_released", "Peers whose connections the pool released (counter)."},
      {"chorus_memory_p2p_made", "Per-peer connections made after init (counter)."},
      {"chorus_memory_p2p_net_resident", "Network peers whose per-peer FIFO pages are resident."},
      {"chorus_memory_p2p_net_trimmed", "Times the pool gave back a network peer's idle FIFO pages (counter)."},
      {"chorus_memory_ring_fifo_bytes", "Receive FIFOs of the rings and of RecDbl/Rabenseifner/Tree."},
      {"chorus_memory_process_shmem_bytes", "Resident shared memory of the rank's process (RssShmem)."},
      {"chorus_memory_process_private_bytes", "Resident private memory of the rank's process (RssAnon)."},
      {"chorus_memory_process_pinned_bytes", "Pinned and locked memory of the rank's process (VmPin + VmLck)."},
      {"chorus_memory_process_fds", "Open descriptors of the rank's process."},
      {"chorus_memory_process_threads", "Threads of the rank's process."},
  };
  enum { NMEM = sizeof(mem) / sizeof(mem[0]) };
  struct obs_proc_mem pm;
  obs_proc_memory(&pm);
  for (int f = 0; f < NMEM; f++) {
    at = put(out, cap, at, "# HELP %s %s\n# TYPE %s gauge\n", mem[f].name, mem[f].help, mem[f].name);
    for (int i = 0; i < n; i++) {
      const struct ncclComm* c = comms[i];
      struct obs_mem m;
      obs_comm_memory(c, &m);
      const uint64_t v[NMEM] = {m.p2p_peers, m.p2p_peers_max, m.p2p_cap, m.p2p_fifo, m.p2p_recv_bytes,
                                m.p2p_send_bytes, m.p2p_released, m.p2p_made, m.net_resident, m.net_trimmed, m.ring_bytes, pm.shmem,
                                pm.priv, pm.pinned, pm.fds, pm.threads};
      at = put(out, cap, at, "%s{comm=\"%016llx\",rank=\"%d\",nranks=\"%d\"} %llu\n", mem[f].name,
               (unsigned long long)c->comm_hash, c->rank, c->nranks, (unsigned long long)v[f]);
    }
  }
  return at;
}
