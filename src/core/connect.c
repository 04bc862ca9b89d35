/* Establishing connections: which transport reaches a peer, and the two-phase handshake over the
 * bootstrap that wires a receiver's FIFO to its sender. */
#include <stdlib.h>
#include <string.h>

#include "../misc/log.h"
#include "../comm/comm.h"
#include "connect.h"
#include "init.h"

#define TAG_RING (BOOT_TAG_CONNECT)
#define TAG_P2P (BOOT_TAG_CONNECT + CH_MAX_CHANNELS)
#define TAG_ACK (BOOT_TAG_CONNECT + CH_MAX_CHANNELS + 1)
#define TAG_APEER (BOOT_TAG_CONNECT + CH_MAX_CHANNELS + 2)

/* The per-peer connection sets: 0, sends and receives (need[0..n)); 1, the peers of RecDbl,
 * Rabenseifner and Tree (need[n+1..2n+1), marked with the rings). Apart, so that a group's sends and
 * receives, whose lanes run in no fixed order with a collective, never share a FIFO with its steps;
 * every phase walks set 1 before set 0, so both ends agree on the order of their messages. */
static struct ch_p2p* peer_set(struct ncclComm* comm, int set) { return comm->p2p + (set ? comm->nranks : 0); }
static const char* set_need(const struct ncclComm* comm, const char* need, int set) {
  return set ? need + comm->nranks + 1 : need;
}
static int set_tag(int set) { return set ? TAG_APEER : TAG_P2P; }

static void tp_ctx_of(struct ncclComm* comm, int peer, struct tp_ctx* x) {
  const struct boot_key* key = boot_secret(comm->boot);
  x->rank = comm->rank;
  x->listen_hint = &comm->peers[comm->rank].listen_addr;
  x->peer_addr = &comm->peers[peer].listen_addr;
  x->peer_query = &comm->peers[peer].query_addr;
  x->peer_nonce = comm->peers[peer].proc_nonce;
  x->key = key->k;
  x->uid_mode = key->mode == BOOT_AUTH_UID;
  x->async_err = &comm->async_result;
  x->lost_rank = &comm->lost_rank;
  x->abort = &comm->abort_flag;
  x->sink = &comm->last_error;
  x->peer_pid = comm->peers[peer].pid;
  x->peer_host = comm->peers[peer].hostname;
}

static ch_status recv_setup(struct ncclComm* comm, const struct tp_sizes* sz, struct conn* c, int peer,
                            struct tp_handle* h) {
  struct tp_ctx x;
  tp_ctx_of(comm, peer, &x);
  c->peer = peer;
  return tp_ops_of(comm->peer_tp[peer])->recv_setup(c, sz, h, &x);
}

/* h->kind was checked against the transport this rank chose for the peer (check_offer). */
static ch_status send_connect(struct ncclComm* comm, const struct tp_sizes* sz, struct conn* c, int peer,
                              const struct tp_handle* h) {
  struct tp_ctx x;
  tp_ctx_of(comm, peer, &x);
  c->peer = peer;
  return tp_ops_of(h->kind)->send_connect(c, sz, h, &x);
}

/* A rank talking to itself: one local FIFO serves both directions. */
static ch_status connect_self(struct ncclComm* comm) {
  struct ch_p2p* p = &comm->p2p[comm->rank];
  if (p->recv.connected) return CH_OK;
  struct tp_handle h;
  struct tp_ctx x;
  tp_ctx_of(comm, comm->rank, &x);
  p->recv.peer = comm->rank;
  CHECK(tp_local_recv_setup(&p->recv, &comm->p2p_sizes, &h, &x));
  p->send.peer = comm->rank;
  return tp_local_send_connect(&p->send, &comm->p2p_sizes, &h, &x);
}

/* ---- wire messages ----
 * A rank that fails its end of a connection still sends everything its peer waits for, marked
 * failed: otherwise the peer would wait for ever in the bootstrap. Both come from the wire: every
 * field is checked before use. */
struct conn_offer { /* receiver -> sender */
  int32_t status;   /* CH_OK, or why the receiver has no FIFO to offer */
  int32_t pad;
  struct tp_handle h; /* valid when status is CH_OK */
};
struct conn_ack { /* sender -> receiver, once it has attached (or failed to) */
  int32_t status;
  int32_t pad;
  struct tp_handle back; /* the transport's way back to the sender (back_handle), or zeros */
};

/* The status a rank reports for its peer's failure: the peer's own kind when the configuration was
 * wrong (the same on every rank), otherwise a remote error. */
static ch_status remote_status(int32_t peer_status) {
  return peer_status == CH_INVALID_USAGE || peer_status == CH_INVALID_ARG ? CH_INVALID_USAGE : CH_REMOTE;
}

static const char* status_text(int32_t s) {
  return s == CH_OK || (s >= CH_SYSTEM && s <= CH_TIMEOUT) || s == CH_ABORTED ? ch_status_str((ch_status)s)
                                                                              : "unknown status";
}

/* ---- fault injection (tests only) ---- */
static struct ncclComm* _Atomic fault_comm;
static _Atomic int fault_where, fault_left, fault_status;

void comm_connect_inject_fault(struct ncclComm* comm, int where, int count, ch_status status) {
  atomic_store(&fault_where, where);
  atomic_store(&fault_status, (int)status);
  atomic_store(&fault_left, count);
  atomic_store(&fault_comm, comm);
}

static ch_status injected_fault(struct ncclComm* comm, int where, int peer) {
  if (atomic_load_explicit(&fault_comm, memory_order_relaxed) != comm || atomic_load(&fault_where) != where)
    return CH_OK;
  int left = atomic_load(&fault_left);
  while (left > 0 && !atomic_compare_exchange_weak(&fault_left, &left, left - 1)) {}
  if (left <= 0) return CH_OK;
  WARN("rank %d: injected fault in the %s end of the connection with rank %d (test hook)", comm->rank,
       where == CONNECT_FAULT_RECV ? "receiving" : "sending", peer);
  return (ch_status)atomic_load(&fault_status);
}

/* Receiver: create the FIFO for `peer` and offer it, or (this rank has failed) offer nothing. *st is
 * this communicator's status in this setup; the return value only says whether the bootstrap works. */
static ch_status offer(struct ncclComm* comm, const struct tp_sizes* sz, struct conn* c, int peer, int tag,
                       ch_status* st) {
  struct conn_offer o;
  memset(&o, 0, sizeof(o));
  if (*st == CH_OK) {
    ch_status s = injected_fault(comm, CONNECT_FAULT_RECV, peer);
    if (s == CH_OK) s = recv_setup(comm, sz, c, peer, &o.h); /* WARNs itself */
    if (s != CH_OK) *st = s;
  }
  if (*st != CH_OK) memset(&o.h, 0, sizeof(o.h));
  o.status = (int32_t)*st;
  return boot_send(comm->boot, peer, tag, &o, sizeof(o));
}

/* Sender: is this offer from `peer` usable? WARNs and returns the failure if not. */
static ch_status check_offer(struct ncclComm* comm, const struct tp_sizes* sz, int peer,
                             const struct conn_offer* o) {
  int me = comm->rank;
  if (o->status != CH_OK) {
    WARN("rank %d: rank %d could not set up its end of the connection from rank %d (%s); its log says why", me,
         peer, me, status_text(o->status));
    return remote_status(o->status);
  }
  if (o->h.kind < 0 || o->h.kind >= TP_COUNT || o->h.kind != comm->peer_tp[peer]) {
    WARN("rank %d: rank %d offered a FIFO of transport kind %d (%s), but rank %d reaches it by %s", me, peer,
         (int)o->h.kind, tp_name(o->h.kind), me, tp_name(comm->peer_tp[peer]));
    return CH_REMOTE;
  }
  size_t want = tp_fifo_bytes(sz);
  if (o->h.bytes != want) {
    WARN("rank %d: rank %d offered a %llu-byte FIFO, rank %d expects %zu bytes (NCCL_BUFFSIZE, NCCL_LL_BUFFSIZE "
         "or NCCL_LL128_BUFFSIZE differs between them?)", me, peer, (unsigned long long)o->h.bytes, me, want);
    return CH_INVALID_USAGE;
  }
  return CH_OK;
}

/* Sender: take the offer of `peer`, attach to its FIFO unless something failed, and always answer. */
static ch_status attach(struct ncclComm* comm, const struct tp_sizes* sz, struct conn* c, int peer, int tag,
                        ch_status* st) {
  struct conn_offer o;
  CHECK(boot_recv(comm->boot, peer, tag, &o, sizeof(o)));
  ch_status s = *st; /* this rank failed earlier: attach to nothing more, but answer */
  if (s == CH_OK) s = check_offer(comm, sz, peer, &o);
  if (s == CH_OK) s = injected_fault(comm, CONNECT_FAULT_SEND, peer);
  if (s == CH_OK) s = send_connect(comm, sz, c, peer, &o.h); /* WARNs itself */
  if (*st == CH_OK) *st = s;
  struct conn_ack a;
  memset(&a, 0, sizeof(a));
  a.status = (int32_t)s;
  if (s == CH_OK && tp_ops_of(c->transport)->back_handle) tp_ops_of(c->transport)->back_handle(c, &a.back);
  return boot_send(comm->boot, peer, TAG_ACK, &a, sizeof(a));
}

/* Receiver: the sender's answer. The FIFO's descriptor is dropped once the sender has mapped it (or
 * will not); the memory lives as long as the mappings. Returns through *ok whether this connection
 * is complete. */
static ch_status take_ack(struct ncclComm* comm, int peer, struct conn* c, ch_status* st, int* ok) {
  struct conn_ack a;
  *ok = 0;
  CHECK(boot_recv(comm->boot, peer, TAG_ACK, &a, sizeof(a)));
  if (!c->connected) return CH_OK; /* we offered nothing: our failure, logged already */
  struct tp_ctx x;
  tp_ctx_of(comm, peer, &x);
  ch_status s = tp_ops_of(c->transport)->recv_done(c, a.status == CH_OK, &a.back, &x);
  if (a.status == CH_OK) {
    if (s == CH_OK) *ok = 1;
    else if (*st == CH_OK) *st = s;
  } else if (*st == CH_OK) {
    WARN("rank %d: rank %d could not attach to rank %d's FIFO (%s); its log says why", comm->rank, peer,
         comm->rank, status_text(a.status));
    *st = remote_status(a.status);
  }
  return CH_OK;
}

/* Phase 1: every receiver offers its FIFOs (or their failure). */
static ch_status phase_recv(struct ncclComm* comm, const char* need_send, const char* need_recv, int rings,
                            ch_status* st) {
  int n = comm->nranks;
  for (int c = 0; rings && c < comm->nchannels; c++) {
    struct ch_channel* ch = &comm->channels[c];
    tp_conn_free(&ch->recv); /* the sender expects a new offer for every channel */
    CHECK(offer(comm, &comm->sizes, &ch->recv, ch->prev, TAG_RING + c, st));
  }
  for (int set = 1; set >= 0; set--) {
    struct ch_p2p* ps = peer_set(comm, set);
    const char *ns = set_need(comm, need_send, set), *nr = set_need(comm, need_recv, set);
    for (int p = 0; p < n; p++) {
      if (p == comm->rank) {
        if (!set && *st == CH_OK && (ns[p] || nr[p])) *st = connect_self(comm);
        continue;
      }
      if (!nr[p] || ps[p].recv.connected) continue;
      CHECK(offer(comm, &comm->p2p_sizes, &ps[p].recv, p, set_tag(set), st));
    }
  }
  return CH_OK;
}

/* Phase 2: every sender takes its offers, attaches and answers. */
static ch_status phase_send(struct ncclComm* comm, const char* need_send, int rings, ch_status* st) {
  for (int c = 0; rings && c < comm->nchannels; c++) {
    struct ch_channel* ch = &comm->channels[c];
    tp_conn_free(&ch->send); /* from an earlier attempt that failed */
    CHECK(attach(comm, &comm->sizes, &ch->send, ch->next, TAG_RING + c, st));
  }
  if (rings && *st == CH_OK)
    INFO(LOG_INIT, "rank %d: %d ring channel(s) connected, prev %d via %s, next %d via %s", comm->rank,
         comm->nchannels, comm->channels[0].prev, tp_name(comm->peer_tp[comm->channels[0].prev]),
         comm->channels[0].next, tp_name(comm->peer_tp[comm->channels[0].next]));
  for (int set = 1; set >= 0; set--) {
    struct ch_p2p* ps = peer_set(comm, set);
    const char* ns = set_need(comm, need_send, set);
    for (int p = 0; p < comm->nranks; p++) {
      if (p == comm->rank || !ns[p] || ps[p].send.connected) continue;
      CHECK(attach(comm, &comm->p2p_sizes, &ps[p].send, p, set_tag(set), st));
      if (ps[p].send.connected)
        INFO(LOG_P2P, "rank %d -> rank %d connected via %s%s", comm->rank, p, tp_name(comm->peer_tp[p]),
             set ? " (for RecDbl, Rabenseifner, Tree)" : "");
    }
  }
  return CH_OK;
}

/* Phase 3: receivers wait until their senders have mapped the FIFO: a rank that finishes its part
 * early (a broadcast root only sends) must not close the segment before its peer has opened it. */
static ch_status phase_ack(struct ncclComm* comm, const char* need_recv, int rings, ch_status* st) {
  int all = 1, ok;
  for (int c = 0; rings && c < comm->nchannels; c++) {
    CHECK(take_ack(comm, comm->channels[c].prev, &comm->channels[c].recv, st, &ok));
    all &= ok;
  }
  if (rings && all && *st == CH_OK) comm->rings_connected = 1;
  for (int set = 1; set >= 0; set--) {
    struct ch_p2p* ps = peer_set(comm, set);
    const char* nr = set_need(comm, need_recv, set);
    for (int p = 0; p < comm->nranks; p++) {
      if (p == comm->rank || !nr[p] || ps[p].recv_acked) continue;
      CHECK(take_ack(comm, p, &ps[p].recv, st, &ok));
      ps[p].recv_acked = ok;
    }
  }
  return CH_OK;
}

/* After a failed setup, drop what is half made, so that a later attempt starts over: rings that
 * did not all connect, and receive FIFOs that no sender attached to. Connections that completed stay. */
static void drop_incomplete(struct ncclComm* comm, int rings) {
  for (int c = 0; rings && !comm->rings_connected && c < comm->nchannels; c++) {
    tp_conn_free(&comm->channels[c].send);
    tp_conn_free(&comm->channels[c].recv);
  }
  for (int k = 0; k < 2 * comm->nranks; k++) /* both sets */
    if (k != comm->rank && !comm->p2p[k].recv_acked) tp_conn_free(&comm->p2p[k].recv);
}

/* Each communicator goes through all three phases even when its own part failed (so its peers get
 * their answers); one whose bootstrap fails (a peer gone, an abort) stops there. A communicator whose
 * setup failed keeps the error (ncclCommGetAsyncError), as its peers may now be out of step. */
ch_status comm_connect(struct ncclComm** comms, int ncomms, char** need_send, char** need_recv) {
  int* rings = calloc((size_t)ncomms + 1, sizeof(int));
  ch_status* st = calloc((size_t)ncomms + 1, sizeof(ch_status));
  int* broken = calloc((size_t)ncomms + 1, sizeof(int));
  if (!rings || !st || !broken) {
    free(rings), free(st), free(broken);
    WARN("out of memory setting up connections");
    return CH_SYSTEM;
  }
  for (int i = 0; i < ncomms; i++) rings[i] = need_send[i][comms[i]->nranks] && !comms[i]->rings_connected;
  for (int i = 0; i < ncomms; i++) {
    ch_status h = phase_recv(comms[i], need_send[i], need_recv[i], rings[i], &st[i]);
    if (h != CH_OK) broken[i] = 1, st[i] = h;
  }
  for (int i = 0; i < ncomms; i++) {
    if (broken[i]) continue;
    ch_status h = phase_send(comms[i], need_send[i], rings[i], &st[i]);
    if (h != CH_OK) broken[i] = 1, st[i] = h;
  }
  for (int i = 0; i < ncomms; i++) {
    if (broken[i]) continue;
    ch_status h = phase_ack(comms[i], need_recv[i], rings[i], &st[i]);
    if (h != CH_OK) st[i] = h;
  }
  ch_status res = CH_OK;
  for (int i = 0; i < ncomms; i++) {
    if (st[i] == CH_OK) continue;
    drop_incomplete(comms[i], rings[i]);
    comm_set_async_error(comms[i], st[i]);
    if (res == CH_OK) res = st[i];
  }
  free(rings), free(st), free(broken);
  return res;
}

void comm_free_connections(struct ncclComm* comm) {
  for (int c = 0; c < comm->nchannels; c++) { /* every flush starts now: one 30 s budget, not one each */
    tp_conn_closing(&comm->channels[c].send);
    tp_conn_closing(&comm->channels[c].recv);
  }
  for (int k = 0; comm->p2p && k < 2 * comm->nranks; k++) { /* both sets */
    tp_conn_closing(&comm->p2p[k].send);
    tp_conn_closing(&comm->p2p[k].recv);
  }
  for (int c = 0; c < comm->nchannels; c++) {
    tp_conn_free(&comm->channels[c].send);
    tp_conn_free(&comm->channels[c].recv);
  }
  for (int k = 0; comm->p2p && k < 2 * comm->nranks; k++) {
    /* self: send and recv share one FIFO owned by recv */
    tp_conn_free(&comm->p2p[k].send);
    tp_conn_free(&comm->p2p[k].recv);
  }
}
