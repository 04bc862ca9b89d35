/* Fabric transport internals shared by fabric.c (setup and teardown, run by rank threads) and
 * fabric_proxy.c (the process's fabric progress thread, and the rank-side fast paths).
 *
 * The transport drives any ncclNet_t (net/net.h: Chorus's libfabric network or an external NCCL net
 * plugin) as NCCL's proxy does: the receiver listens and ships the plugin's opaque handle through
 * the authenticated bootstrap; the sender connects; each side registers its own FIFO once and every
 * Simple step is one message: the payload followed by a trailer (struct tcp_step: byte count and
 * the call's header), so that the receiver checks every step against its own call, as on sockets.
 * A trailer with TCP_POISON carries the sender's failed call (struct xfer_poison) instead of a
 * payload; TCP_BYE says the sender closed in order. Both end the stream.
 *
 * A network's links are one-way, so each connection has a way back: the sender also listens, its
 * handle rides in the connection's answer (back_handle), and the receiver connects to it. It carries
 * the receiver's poison record (its call failed: the sender stops waiting for credits) and its
 * goodbye (a later failure of the link is then an orderly close), in the same message format. */
#ifndef CH_FABRIC_H
#define CH_FABRIC_H

#include <stdatomic.h>
#include <stdint.h>

#include "../net/net.h"
#include "tcp.h"

enum { FAB_PENDING = 0, FAB_BOUND = 1, FAB_CLOSED = 2, FAB_FAILED = 3 };
#define FAB_TRAILER sizeof(struct tcp_step)

struct fab_conn {
  /* Written by the creating rank thread before registration, read-only afterwards. */
  int is_send;
  int rank, peer, dev;
  struct fifo_ctrl* ctrl;
  char* buf;          /* Simple slots, `stride` apart: payload (up to cap) + trailer */
  size_t cap, stride;
  char* ctl;          /* sender: [struct xfer_poison | trailer] of a poison message; in `mem` */
  void* mem;          /* the whole block (ctrl, slots, ctl), registered once */
  size_t mem_bytes;
  const struct ch_net* net;
  unsigned char handle[TP_BLOB_BYTES]; /* sender: the receiver's listen handle (connect retries) */
  _Atomic int* async_err; /* the communicator's; valid until released (destroy waits for that) */
  _Atomic int* lost_rank; /* the communicator's (chorusCommGetLostRank): this peer, if its link fails first */
  const volatile int* abort;
  struct log_err_sink* sink;
  int peer_pid;
  char peer_host[64];
  uint64_t connect_deadline; /* connect/accept must finish by then */
  union sock_addr probe_addr; /* the peer process's query service (AF_UNSPEC: none): liveness checks */

  /* Liveness (proxy thread only). A network may say nothing of a dead peer to a receive that waits
   * for it: while our rank waits on this connection and nothing has moved for a second, the proxy
   * connects to the peer process's query service (bootstrap/query.c) every few seconds. Refused:
   * the process is gone; no answer within CHORUS_NET_LINK_TIMEOUT_MS: its host is. */
  int probe_fd;
  uint64_t probe_deadline, next_probe;
  uint64_t unreach_since; /* the first probe that found no route, until one gets through (0: none) */
  _Atomic uint64_t last_move; /* ns of the last step moved, written by whoever holds busy */
  _Atomic uint64_t last_wait; /* ns our rank last polled this connection waiting for it */

  /* state: written by whoever holds busy (or the proxy for failures), release; ranks read it.
   * closing: rank sets under fx lock; released: proxy sets under fx lock (cond broadcast), from then on
   * the proxy never touches the record. */
  _Atomic int state;
  int closing;
  int released;

  /* Everything below belongs to whoever holds busy: the proxy, or a rank on a fast path (the sender
   * handing steps to the network after its post, the receiver testing while it waits). */
  _Atomic int busy;
  void* comm;  /* sendComm / recvComm, once established */
  void* lcomm; /* receiver: the listen comm until accepted */
  void* mh;    /* registration of mem */
  uint64_t posted, done; /* messages handed to the network / completed (steps until a poison or bye) */
  void* req[CH_STEPS];
  int poison_state; /* 0 none, 1 sending (sender: down record; receiver: the sender's came), 2 done */
  void* preq;       /* the poison or bye send in flight */
  int bye_state;    /* sender closing: 0 not sent, 1 in flight, 2 done */
  uint64_t drain_deadline; /* closing: the flush (sender) or the wait for the sender's goodbye (receiver) */
  uint64_t back_deadline;  /* closing: the goodbyes on the way back */
  struct fab_conn* next; /* fx lock (lists) */

  /* The way back. back_handle: sender, its listen handle (written before registration); receiver,
   * the sender's, written by the rank in recv_done before it sets back_wanted (release). The rest is
   * under busy like the fields above. back_state: 0 being set up, 1 up, 2 over (a record or goodbye
   * crossed, it failed, or there is none). */
  unsigned char back_handle[TP_BLOB_BYTES];
  int back_offered; /* sender: it listens for a way back (written once before registration) */
  _Atomic int back_wanted;
  void* bcomm;  /* sender: the recvComm of the way back; receiver: its sendComm */
  void* blcomm; /* sender: the listen comm until accepted */
  void* bmh;    /* registration of mem on bcomm */
  void* breq;   /* sender: the receive posted on the way back; receiver: its send in flight */
  int back_state;
  int peer_bye; /* sender: the receiver said goodbye */
  int up_sent;  /* receiver: 1 its poison record is on the way back, 2 it left */
};
#define FAB_BACK_OFF 2048 /* sender: where in ctl the way back's message lands */

/* fabric_proxy.c */
/* Hand n to the progress thread (started on first use); it establishes the connection if needed. */
ch_status fab_register(struct fab_conn* n);
/* Ask the proxy to let n go (flush, goodbye, close) without waiting; then wait until it has. */
void fab_closing(struct fab_conn* n);
int fab_unregister(struct fab_conn* n); /* 1 once let go; 0 after a minute (n must then be leaked) */
void fab_kick(void);
/* A waiting receiver moves its connection itself; 1 if a step arrived. */
int fab_poll(struct fab_conn* n);
/* Record a failure of n (once, logged with the peer, its host and the network), tell the communicator
 * and the ranks behind its other links. Caller holds n->busy (or is the proxy). */
void fab_fail(struct fab_conn* n, const char* op, ncclResult_t r);

/* fabric_wire.c: a message from the peer, of `size` bytes at msg, in a buffer of `limit` bytes: a step
 * (cap > 0: a payload of at most cap bytes whose trailer announces exactly that), a poison record, a
 * goodbye, or FAB_MSG_BAD with *why (cap 0: the way back, where steps never come). *tr holds the
 * trailer, *payload the bytes before it. */
enum { FAB_MSG_BAD = 0, FAB_MSG_STEP, FAB_MSG_POISON, FAB_MSG_BYE };
int fab_msg_decode(const void* msg, int size, size_t limit, size_t cap, struct tcp_step* tr, uint64_t* payload,
                   char* why, size_t why_len);

#endif
