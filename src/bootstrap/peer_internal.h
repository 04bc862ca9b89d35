/* The peer layer's state, shared by peer.c (connections, handshakes, reading, sending and receiving),
 * peer_close.c (the cap on open connections, their graceful close, and the order of messages across
 * connections) and gather.c (allgather and barrier, over boot_send and boot_recv only). Everything
 * here is owned by the thread calling into the boot_state: bootstrap calls on one state are
 * serialized, and there is no background thread. */
#ifndef CH_BOOT_PEER_INTERNAL_H
#define CH_BOOT_PEER_INTERNAL_H

#include <poll.h>
#include <stddef.h>
#include <stdint.h>

#include "boot_internal.h"

struct boot_msg {
  struct boot_msg* next;
  int tag;
  uint64_t seq; /* the sender's number for it (struct boot_msg_hdr) */
  size_t size;
  char data[];
};

enum { CS_SRV_HELLO, CS_SRV_PROOF, CS_CLI_WAIT, CS_OPEN };

struct boot_conn {
  int fd;
  int peer;  /* client side: the rank we called; server side: -1 until authenticated */
  int state; /* CS_* */
  int dead;  /* EOF, error or closed; freed by reap() outside of send loops */
  uint64_t t0;
  union sock_addr addr;
  struct boot_hello hello;      /* ours (client) or theirs (server) */
  struct boot_peer_proof proof; /* the other side's proof, being read */
  size_t got;                   /* bytes of the handshake record being read */
  size_t hdr_got;
  struct boot_msg_hdr hdr;
  struct boot_msg* cur; /* message whose payload is arriving */
  size_t cur_got;
  int can_send;  /* ours (we send right behind our proof), or theirs once our proof went out */
  uint64_t used; /* b->tick when it was opened or last carried a message: the least recent closes first */
  /* Graceful close (peer_close.c). bye_out: we sent BYE and send nothing more here; we read on until
   * the peer's BYE_ACK, its own BYE or an EOF. bye_in: the peer sent BYE; we answer BYE_ACK (after the
   * message we may be writing here: ack_due) and close. fin: nothing more is read here; closed once ctl
   * is out and no answer is due. */
  int bye_out, bye_in, fin, ack_due;
  int ctl_on;     /* ctl is queued: a BYE or BYE_ACK being sent */
  size_t ctl_off; /* bytes of it sent */
  struct boot_msg_hdr ctl;
};

struct boot_peer {
  struct boot_conn* send;
  struct boot_msg *head, *tail; /* ordered by seq; those below rseq may be received */
  size_t qbytes;                /* queued, not yet received */
  int qcount;
  uint64_t sseq;    /* messages sent to it */
  uint64_t rseq;    /* messages from it that arrived in order: every one numbered below is queued or taken */
  uint32_t out_gen; /* connections we opened to it */
  uint64_t in_gen;  /* the least connection count (boot_hello.gen) it may open to us next */
  int lost;         /* a connection with it failed: nothing more will come */
  char why[200];
  int pid; /* from the rank table (boot_name_peers), for messages; 0: unknown */
  char host[64];
};

struct boot_state {
  int rank, nranks;
  uint64_t magic;
  struct boot_key key;
  struct sock listener;
  union sock_addr* addrs;
  struct boot_peer* peers;
  struct boot_conn** conns;
  int nconns, cap;
  struct pollfd* pfds;
  int pcap;
  uint64_t accept_paused_until;
  int warned_emfile;
  const volatile int* abort;
  uint64_t deadline;
  /* What the owner's current bootstrap calls are for ("ncclAllReduce #1"), for a lost peer's message:
   * set and cleared by the thread that owns b around them (boot_set_context), read by that thread. */
  char context[96];
  /* The join connections to our root(s) while the table is gathered (-1: none; owned by boot_init,
   * which clears them here before closing them): readable means a report that the job failed. The
   * owner's thread only. `failed`: that report's status, returned by every later wait. */
  int root_fd[2];
  ch_status failed;
  /* The cap on open connections (peer_close.c). */
  struct boot_conn* writing; /* boot_send is writing a message on it: it is not closed meanwhile */
  uint64_t tick;             /* counts openings and messages, for `used` */
  int max_conns;             /* CHORUS_BOOT_MAX_CONNS when b was made */
  int min_conns;             /* 2*ceil(log2 nranks)+2: the allgather and barrier partners, one more each way */
  uint64_t nofile;           /* RLIMIT_NOFILE's soft limit when b was made */
  int max_open, max_held;    /* the most open (and those plus ours in the handshake) after a trim */
  int capped;                /* the cap was reached (said once) */
  uint64_t opened, closed;   /* connections opened (either side), and closed gracefully (either side) */
  uint64_t crossed;          /* closes where both sides sent BYE at once */
  uint64_t settled;          /* closes completed and handshakes of ours answered: what settle() waits for */
};

/* peer.c */
void boot_conn_kill(struct boot_state* b, struct boot_conn* c);
void boot_peer_lost(struct boot_state* b, int p, const char* why);
/* A rank broke the protocol on c: WARN naming it and why, the rank lost, c closed. */
void boot_conn_drop(struct boot_state* b, struct boot_conn* c, const char* why);
/* EOF or error e (0: EOF) on c: the rank lost, unless the connection was being closed or the rank has
 * another one; c closed. */
void boot_conn_eof(struct boot_state* b, struct boot_conn* c, int e);

/* peer_close.c */
/* Set b's cap up (boot_peers_create), and let its share of the process's descriptors go (boot_close). */
void boot_conns_init(struct boot_state* b);
void boot_conns_fini(struct boot_state* b);
/* The most connections b keeps open now. */
int boot_conns_cap(const struct boot_state* b);
/* Connections being closed (BYE sent or received), not closed yet. */
int boot_conns_closing(const struct boot_state* b);
/* Would one more connection go over the cap (none idle to close for it), or are more than half the cap
 * still closing? */
int boot_conns_full(const struct boot_state* b);
/* Close least recently used idle connections (not `keep`) until at most the cap are open; a
 * connection in the handshake, with part of a record read, or being written is never chosen. */
void boot_conns_trim(struct boot_state* b, const struct boot_conn* keep);
/* Send what is left of c's BYE or BYE_ACK without blocking; closes c once it is out and nothing more
 * is to be read. */
void boot_ctl_flush(struct boot_state* b, struct boot_conn* c);
/* A whole header that is not a message (c->hdr) arrived on c: act on it, or drop the peer. */
void boot_ctl_record(struct boot_state* b, struct boot_conn* c);
/* boot_send finished writing a message on c: answer a BYE that arrived meanwhile. */
void boot_conn_wrote(struct boot_state* b, struct boot_conn* c);
/* EOF or error e (0: EOF) on a connection being closed: 1 if that ends its close (said why, or
 * recorded the peer lost), 0 if c is not closing. */
int boot_closing_eof(struct boot_state* b, struct boot_conn* c, int e);
/* Is seq one the queue of p can take now (not taken already, not too far ahead)? */
int boot_seq_ok(const struct boot_peer* p, uint64_t seq);
/* Queue m (numbered m->seq) in order; -1 (m not queued) if that number is there already. */
int boot_enqueue(struct boot_peer* p, struct boot_msg* m);
/* The first message with tag that may be received now (all earlier ones from p arrived), or NULL. */
struct boot_msg* boot_take(struct boot_peer* p, int tag);

#endif
