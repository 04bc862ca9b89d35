/* TCP transport internals shared by tcp.c (setup, teardown, run by rank threads) and tcp_proxy.c
 * (the one progress thread of the process). */
#ifndef CH_TCP_H
#define CH_TCP_H

#include <stdatomic.h>
#include <stdint.h>

#include "../misc/socket.h"
#include "transport.h"

enum { TCP_PENDING = 0, TCP_BOUND = 1, TCP_CLOSED = 2, TCP_FAILED = 3 };

#define TCP_MAGIC 0x31307674656e6863ull /* "chnetv01" */
#define TCP_NONCE 16
#define TCP_MAC 32
#define TCP_BYE UINT64_MAX /* tcp_step.bytes of a sender that closes gracefully */
#define TCP_BYE_BYTE 'B'   /* what a receiver that closes gracefully writes back */
#define TCP_POISON (UINT64_MAX - 1) /* tcp_step.bytes: a struct xfer_poison follows (the call failed) */
#define TCP_POISON_BYTE 'P' /* what a receiver whose call failed writes back (fifo_ctrl.up) */

/* The sender's first and only flight of setup: it proves the job key without waiting for the
 * receiver (one thread may drive both ends). mac = HMAC(key, "chorus-net-v1" || hello up to mac ||
 * the offer's challenge || the receiver's listener address). The token is single-use (taken when
 * bound), so a recorded flight cannot be replayed. */
struct tcp_hello {
  uint64_t magic;
  uint64_t token; /* names the receiver's FIFO (from its offer) */
  int32_t from_rank, to_rank;
  unsigned char nonce[TCP_NONCE];
  unsigned char mac[TCP_MAC];
};
void tcp_hello_mac(const unsigned char* key, const struct tcp_hello* h, uint64_t challenge,
                   const union sock_addr* listener, unsigned char mac[TCP_MAC]);

/* Before every step's payload on the wire. */
struct tcp_step {
  uint64_t bytes; /* payload bytes (<= slot size), or TCP_BYE */
  struct xfer_hdr hdr;
};

/* One direction of one connection, as the proxy sees it. */
struct tcp_conn {
  /* Written by the creating rank thread before registration, read-only afterwards. */
  int is_send;
  int rank, peer;
  struct fifo_ctrl* ctrl; /* this side's FIFO (anonymous memory of this process, owned by struct conn) */
  char* buf;              /* Simple slots */
  size_t slot_bytes;
  uint64_t token, challenge; /* receiver: name of the FIFO and the sender's MAC challenge */
  union sock_addr listener;  /* receiver: our listener at setup (part of the MAC) */
  unsigned char key[32];
  int uid_mode;
  _Atomic int* async_err; /* the communicator's; valid until released (destroy waits for that) */
  _Atomic int* lost_rank; /* the communicator's (chorusCommGetLostRank): this peer, if its link fails first */
  const volatile int* abort; /* the communicator's abort flag: a closing sender stops flushing */
  struct log_err_sink* sink; /* the communicator's ncclGetLastError record (has its own lock) */
  union sock_addr remote; /* sender: set before registration; receiver: set by the proxy when bound */
  int peer_pid;           /* for messages (0: unknown) */
  char peer_host[64];

  /* Shared. state: proxy writes (release), ranks read. closing: rank sets under px lock. released:
   * proxy sets under px lock (cond broadcast); from then on the proxy never touches this record. */
  _Atomic int state;
  int closing;
  int released;

  /* Steps up to direct_max payload bytes are sent by the posting rank thread, and a waiting rank
   * receives from its socket itself (0: only the proxy moves data). */
  uint64_t direct_max;
  /* Receive side, direct_max > 0: who reads the socket. 0: the proxy (EPOLLIN in its set). 1: the
   * rank that waits on this FIFO (tp_tcp_poll); the proxy's set then holds EPOLLRDHUP only, so each
   * arriving step costs the proxy no wake-up and the proxy never competes with the polling rank for
   * the socket (or for its core). Changed only under busy: by the rank (takes it when it waits on
   * this FIFO, gives it back before it sleeps or waits on another one, and on a step larger than
   * direct_max or anything that is not a step) or by the proxy (the peer hung up: hup). */
  _Atomic int rank_reads;
  _Atomic int hup; /* proxy sets: the peer hung up or the socket failed; the rank no longer reads it */
  int big;         /* under busy: a step larger than direct_max came; the proxy reads until a small one */
  int hup_event;   /* proxy: an RDHUP/HUP/ERR edge came while the rank was reading */
  int epfd;        /* the proxy's epoll set (set when the proxy takes the record, before any use) */
  /* Receive side, under busy like off and cur: bytes read ahead of the step being filled. A rank
   * that waits for a step reads header and payload with one recv() into this buffer (two calls
   * otherwise); whoever reads next takes these bytes before the socket's. */
  size_t carry_off, carry_len;
  char carry[4096];
  int pending; /* proxy: carried bytes or a step in hand were left at its last pass (progress_recv) */
  /* step, off and cur belong to whoever holds busy: the proxy, or the rank (tp_proxy_post sending,
   * tp_tcp_poll receiving). */
  _Atomic int busy;

  /* Proxy thread only (the sender thread sets fd before registration), but see busy. */
  int fd;
  struct tcp_conn* next;
  uint64_t step;       /* next step to send / to fill */
  size_t off;          /* bytes of the current step moved (header + payload) */
  struct tcp_step cur; /* header of the current step */
  int rd_ready, wr_ready; /* no EAGAIN seen since the last epoll edge */
  int bye_seen;
  uint64_t drain_deadline; /* closing sender: give up flushing then */
  size_t bye_off;          /* closing (proxy): goodbye bytes written; a full socket buffer makes it wait */
  uint64_t bye_deadline;   /* closing (proxy): give up on the goodbye then */
  /* Poison (struct xfer_poison) of a failed call: 0 none, 1 sending our rank's record (sender side:
   * `down` as a TCP_POISON step; receiver side: `up` as TCP_POISON_BYTE + the record), 2 sent (a
   * sender sends no more steps). */
  int poison_state;
  struct xfer_poison pbuf; /* down record on its way out (sender) or in (receiver) */
  struct xfer_poison pup;  /* up record on its way out (receiver) or in (sender) */
  size_t pup_off;          /* bytes of 'P' + pup moved */
  int pup_in;              /* sender: reading an up record */
};

/* A rank waiting for data on c receives from the socket itself (CHORUS_NET_DIRECT_MAX_BYTES > 0)
 * instead of waiting for the proxy; 1 if a step (or part of one) arrived (tcp_proxy.c). */
int tp_tcp_poll(struct conn* c);
/* The rank stops waiting on c (it sleeps, or waits on another connection): the proxy reads it again. */
void tp_tcp_idle(struct conn* c);

/* tcp_link.c: one connection's stream, for the proxy thread (1 if anything moved) and for a rank
 * that just posted on send FIFO n (1 if steps are left for the proxy). */
int tcp_progress_send(struct tcp_conn* n);
int tcp_progress_recv(struct tcp_conn* n);
int tcp_send_direct(struct tcp_conn* n);

/* tcp_proxy.c */
/* A link of n's communicator failed: tell the ranks behind its other links (proxy thread). */
void proxy_fail_comm(struct tcp_conn* failed);
int proxy_comm_told(const struct tcp_conn* n);
/* Make sure the proxy runs and its listener exists (bound on hint's IP, port 0), then hand n over.
 * *listener receives the listener's address. */
ch_status proxy_register(struct tcp_conn* n, const union sock_addr* hint, union sock_addr* listener);
/* Ask the proxy to drop n (graceful bye, close) and wait until it no longer touches n or its FIFO. */
void proxy_unregister(struct tcp_conn* n);
/* The first half of that, without the wait (the transport's closing op). */
void proxy_closing(struct tcp_conn* n);
/* The process's net listener address, if a proxy runs (tests). */
int proxy_listener_addr(union sock_addr* out);

#endif
