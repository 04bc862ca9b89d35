/* Establishing connections: which transport reaches a peer, and the two-phase handshake over the
 * bootstrap that wires a receiver's FIFO to its sender. */
#include <stdlib.h>
#include <string.h>

#include "../misc/log.h"
#include "comm.h"

#define TAG_RING (BOOT_TAG_CONNECT)
#define TAG_P2P (BOOT_TAG_CONNECT + CH_MAX_CHANNELS)
#define TAG_ACK (BOOT_TAG_CONNECT + CH_MAX_CHANNELS + 1)

static ch_status recv_setup(struct ncclComm* comm, const struct tp_sizes* sz, struct conn* c, int peer,
                            struct tp_handle* h) {
  c->peer = peer;
  switch (comm->peer_tp[peer]) {
    case TP_LOCAL: return tp_local_recv_setup(c, sz, h);
    case TP_SHM: return tp_shm_recv_setup(c, sz, h);
    default:
      WARN("rank %d is on another host (%s) than rank %d (%s): the socket transport between hosts is not "
           "available in this version", peer, comm->peers[peer].hostname, comm->rank,
           comm->peers[comm->rank].hostname);
      return CH_INVALID_USAGE;
  }
}

static ch_status send_connect(struct ncclComm* comm, const struct tp_sizes* sz, struct conn* c, int peer,
                              const struct tp_handle* h) {
  c->peer = peer;
  if (h->kind != comm->peer_tp[peer]) {
    WARN("rank %d offered a %s FIFO but rank %d expected %s", peer, tp_name(h->kind), comm->rank,
         tp_name(comm->peer_tp[peer]));
    return CH_INTERNAL;
  }
  if (h->kind == TP_LOCAL) return tp_local_send_connect(c, sz, h);
  return tp_shm_send_connect(c, sz, h);
}

/* A rank talking to itself: one local FIFO serves both directions. */
static ch_status connect_self(struct ncclComm* comm) {
  struct ch_p2p* p = &comm->p2p[comm->rank];
  if (p->recv.connected) return CH_OK;
  struct tp_handle h;
  p->recv.peer = comm->rank;
  CHECK(tp_local_recv_setup(&p->recv, &comm->p2p_sizes, &h));
  p->send.peer = comm->rank;
  return tp_local_send_connect(&p->send, &comm->p2p_sizes, &h);
}

static ch_status phase_recv(struct ncclComm* comm, const char* need_send, const char* need_recv) {
  int n = comm->nranks;
  struct tp_handle h;
  if (need_send[n] && !comm->rings_connected) {
    for (int c = 0; c < comm->nchannels; c++) {
      struct ch_channel* ch = &comm->channels[c];
      if (ch->recv.connected) continue; /* an earlier attempt got this far */
      CHECK(recv_setup(comm, &comm->sizes, &ch->recv, ch->prev, &h));
      CHECK(boot_send(comm->boot, ch->prev, TAG_RING + c, &h, sizeof(h)));
    }
  }
  for (int p = 0; p < n; p++) {
    if (p == comm->rank) {
      if (need_send[p] || need_recv[p]) CHECK(connect_self(comm));
      continue;
    }
    if (!need_recv[p] || comm->p2p[p].recv.connected) continue;
    CHECK(recv_setup(comm, &comm->p2p_sizes, &comm->p2p[p].recv, p, &h));
    CHECK(boot_send(comm->boot, p, TAG_P2P, &h, sizeof(h)));
  }
  return CH_OK;
}

static ch_status phase_send(struct ncclComm* comm, const char* need_send, int rings) {
  int n = comm->nranks;
  struct tp_handle h;
  if (rings) {
    for (int c = 0; c < comm->nchannels; c++) {
      struct ch_channel* ch = &comm->channels[c];
      CHECK(boot_recv(comm->boot, ch->next, TAG_RING + c, &h, sizeof(h)));
      CHECK(send_connect(comm, &comm->sizes, &ch->send, ch->next, &h));
      CHECK(boot_send(comm->boot, ch->next, TAG_ACK, NULL, 0));
    }
    INFO(LOG_INIT, "rank %d: %d ring channel(s) connected, prev %d via %s, next %d via %s", comm->rank,
         comm->nchannels, comm->channels[0].prev, tp_name(comm->peer_tp[comm->channels[0].prev]),
         comm->channels[0].next, tp_name(comm->peer_tp[comm->channels[0].next]));
  }
  for (int p = 0; p < n; p++) {
    if (p == comm->rank || !need_send[p] || comm->p2p[p].send.connected) continue;
    CHECK(boot_recv(comm->boot, p, TAG_P2P, &h, sizeof(h)));
    CHECK(send_connect(comm, &comm->p2p_sizes, &comm->p2p[p].send, p, &h));
    CHECK(boot_send(comm->boot, p, TAG_ACK, NULL, 0));
    INFO(LOG_P2P, "rank %d -> rank %d connected via %s", comm->rank, p, tp_name(h.kind));
  }
  return CH_OK;
}

/* Receivers wait until their senders have mapped the FIFO: a rank that finishes its part early (a
 * broadcast root only sends) must not close the segment before its peer has opened it. Once mapped,
 * the receiver drops its descriptor: the memory lives as long as the mappings. */
static ch_status phase_ack(struct ncclComm* comm, const char* need_send, const char* need_recv, int rings) {
  if (rings) {
    for (int c = 0; c < comm->nchannels; c++) {
      struct ch_channel* ch = &comm->channels[c];
      CHECK(boot_recv(comm->boot, ch->prev, TAG_ACK, NULL, 0));
      tp_conn_release_fd(&ch->recv);
    }
    comm->rings_connected = 1;
  }
  for (int p = 0; p < comm->nranks; p++) {
    if (p == comm->rank || !need_recv[p] || comm->p2p[p].recv_acked) continue;
    CHECK(boot_recv(comm->boot, p, TAG_ACK, NULL, 0));
    tp_conn_release_fd(&comm->p2p[p].recv);
    comm->p2p[p].recv_acked = 1;
  }
  return CH_OK;
}

ch_status comm_connect(struct ncclComm** comms, int ncomms, char** need_send, char** need_recv) {
  int* rings = calloc((size_t)ncomms + 1, sizeof(int));
  if (!rings) return CH_SYSTEM;
  ch_status res = CH_OK;
  for (int i = 0; i < ncomms; i++) rings[i] = need_send[i][comms[i]->nranks] && !comms[i]->rings_connected;
  for (int i = 0; i < ncomms && res == CH_OK; i++) res = phase_recv(comms[i], need_send[i], need_recv[i]);
  for (int i = 0; i < ncomms && res == CH_OK; i++) res = phase_send(comms[i], need_send[i], rings[i]);
  for (int i = 0; i < ncomms && res == CH_OK; i++) res = phase_ack(comms[i], need_send[i], need_recv[i], rings[i]);
  free(rings);
  return res;
}

void comm_free_connections(struct ncclComm* comm) {
  for (int c = 0; c < comm->nchannels; c++) {
    tp_conn_free(&comm->channels[c].send);
    tp_conn_free(&comm->channels[c].recv);
  }
  if (comm->p2p) {
    for (int p = 0; p < comm->nranks; p++) {
      /* self: send and recv share one FIFO owned by recv */
      tp_conn_free(&comm->p2p[p].send);
      tp_conn_free(&comm->p2p[p].recv);
    }
  }
}
