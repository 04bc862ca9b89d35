/* The cap on a rank's open bootstrap connections, their graceful close, and the order of messages
 * across connections.
 *
 * Why a cap: connections open on first use, and an AlltoAll's connection setup (core/connect.c)
 * talks to every rank, so without one every rank ends up with a socket per peer, and N thread ranks
 * of one process with about N^2 descriptors (issue 44). A rank keeps at most boot_conns_cap()
 * connections open, not counting those being closed; past it, opening or accepting one more closes
 * the least recently used idle one. The partners of the bootstrap's own allgather and barrier (the
 * ranks 2^k away, gather.c) go last, and the cap never drops below their number plus one more each
 * way, so the next allgather or barrier finds them connected whatever happened in between. Our own
 * connections whose callee has not proved itself yet count, but cannot be closed (idle()): while
 * every one is such, the next goes over the cap, so a send about to open one first waits for
 * answers (settle() in peer.c), as it does while more than half the cap are still closing.
 *
 * Closing without losing a message. There is no background thread and a send never waits for its
 * receiver, so messages may be in flight either way when a rank decides to close. The closer sends
 * BYE, sends nothing more there, and reads on. The other side reads BYE after everything sent before
 * it, stops sending there, answers BYE_ACK (after the message it may be writing there) and closes.
 * The closer closes on BYE_ACK, by then having read all the other side sent. If both send BYE at
 * once, each reads the other's BYE where it expected BYE_ACK, and closes. An EOF at a record boundary
 * after our BYE ends the close too (the other side answered by closing, or exited: in that case the
 * next send to it or wait for it finds out, as it would with no connection at all); a reset, or an
 * EOF inside a record, still means the peer is lost. BYE_ACK where we sent no BYE, or a record type we
 * do not know, breaks the protocol: the peer is dropped. Every record is read only past the
 * handshake, so nothing unauthenticated can close anything.
 *
 * Order. A later send to that peer opens a new connection at once, whose messages may arrive before
 * the last ones on the closing connection. Waiting for BYE_ACK before opening again would make a send
 * wait for the receiver's progress (one thread may drive several ranks: it could wait on itself), so
 * instead every message carries its number among those its sender sent to this receiver
 * (boot_msg_hdr.seq), and the receiver queues them by number and hands out only those whose
 * predecessors all arrived. A number already taken or queued, or too far ahead to be held, drops the
 * peer. */
#include <errno.h>
#include <limits.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>

#include "../misc/log.h"
#include "../misc/param.h"
#include "peer_internal.h"

/* Boot states alive in this process (one per rank and communicator): they share its descriptors. */
static atomic_int boot_live;

void boot_conns_init(struct boot_state* b) {
  int64_t k = param_int(PARAM_BOOT_MAX_CONNS);
  b->max_conns = k > INT_MAX ? INT_MAX : k < 1 ? 1 : (int)k;
  int lg = 0;
  while (lg < 31 && (1 << lg) < b->nranks) lg++;
  b->min_conns = 2 * lg + 2;
  struct rlimit rl;
  b->nofile = getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY ? (uint64_t)rl.rlim_cur : UINT64_MAX;
  atomic_fetch_add(&boot_live, 1);
}

void boot_conns_fini(struct boot_state* b) {
  (void)b;
  atomic_fetch_sub(&boot_live, 1);
}

/* CHORUS_BOOT_MAX_CONNS, lowered so that all boot states of the process fit in half its descriptors
 * (the rest is for transports, files and the application), but never below min_conns. */
static uint64_t share(const struct boot_state* b) {
  int live = atomic_load(&boot_live);
  return b->nofile / 2 / (uint64_t)(live > 0 ? live : 1);
}

int boot_conns_cap(const struct boot_state* b) {
  uint64_t sh = share(b);
  int cap = sh < (uint64_t)b->max_conns ? (int)sh : b->max_conns;
  return cap < b->min_conns ? b->min_conns : cap;
}

static int counted(const struct boot_conn* c) { return !c->dead && c->peer >= 0 && !c->bye_out && !c->bye_in; }

/* Connections with peers that are not closing: what the cap counts (ours in the handshake too). */
static int conns_open(const struct boot_state* b) {
  int n = 0;
  for (int i = 0; i < b->nconns; i++) n += counted(b->conns[i]);
  return n;
}

int boot_conns_closing(const struct boot_state* b) {
  int n = 0;
  for (int i = 0; i < b->nconns; i++) n += !b->conns[i]->dead && (b->conns[i]->bye_out || b->conns[i]->bye_in);
  return n;
}

/* Past the handshake, able to carry our BYE, nothing half read or being written: safe to close. Our
 * own connection whose callee has not proved itself yet is not: until the callee has read our first
 * flight it may still drop the connection (BOOT_PEER_HELLO_NS, too many waiting), which is a lost
 * message only if we are there to see it; and a rank opens its next connection to the same callee
 * only after that one was accepted (boot_hello.gen must grow in the callee's order). */
static int idle(const struct boot_state* b, const struct boot_conn* c) {
  return counted(c) && c->state == CS_OPEN && c->can_send && c->hdr_got == 0 && !c->cur && c != b->writing &&
         !c->ctl_on;
}

/* Closing ones may take half the cap, or what the descriptor share leaves of it, at least 2. */
int boot_conns_full(const struct boot_state* b) {
  int cap = boot_conns_cap(b), limit = cap / 2;
  uint64_t sh = share(b);
  if (sh < (uint64_t)cap + (uint64_t)limit) limit = sh > (uint64_t)cap ? (int)(sh - (uint64_t)cap) : 0;
  if (limit < 2) limit = 2;
  if (boot_conns_closing(b) > limit) return 1;
  if (conns_open(b) < cap) return 0;
  for (int i = 0; i < b->nconns; i++)
    if (idle(b, b->conns[i])) return 0;
  return 1;
}

/* A rank 2^k away either way: an allgather and barrier partner. */
static int partner(const struct boot_state* b, int peer) {
  unsigned d = (unsigned)((peer - b->rank + b->nranks) % b->nranks), e = (unsigned)b->nranks - d;
  return (d & (d - 1)) == 0 || (e & (e - 1)) == 0;
}

static void ctl_queue(struct boot_state* b, struct boot_conn* c, uint32_t type) {
  memset(&c->ctl, 0, sizeof(c->ctl));
  c->ctl.type = type;
  c->ctl_off = 0;
  c->ctl_on = 1;
  boot_ctl_flush(b, c);
}

/* Its close is complete: nothing more to read, our record out, no answer owed. */
static void maybe_close(struct boot_state* b, struct boot_conn* c) {
  if (c->dead || !c->fin || c->ctl_on || c->ack_due) return;
  b->closed++;
  b->settled++;
  boot_conn_kill(b, c);
}

/* Start closing c: it carries nothing more from us. */
static void bye(struct boot_state* b, struct boot_conn* c) {
  struct boot_peer* p = &b->peers[c->peer];
  if (p->send == c) p->send = NULL;
  c->bye_out = 1;
  ctl_queue(b, c, BOOT_REC_BYE);
}

void boot_conns_trim(struct boot_state* b, const struct boot_conn* keep) {
  int cap = boot_conns_cap(b), open = conns_open(b);
  while (open > cap) {
    struct boot_conn* v = NULL;
    int vp = 0;
    for (int i = 0; i < b->nconns; i++) {
      struct boot_conn* c = b->conns[i];
      if (c == keep || !idle(b, c)) continue;
      int cp = partner(b, c->peer);
      if (!v || cp < vp || (cp == vp && c->used < v->used)) v = c, vp = cp;
    }
    if (!v) break; /* all busy: progress() tries again */
    if (!b->capped++)
      INFO(LOG_BOOTSTRAP,
           "Bootstrap rank %d: %d connections open, its cap (CHORUS_BOOT_MAX_CONNS %d, at least %d, "
           "%llu descriptors shared by %d bootstraps): closing the least recently used from now on",
           b->rank, open, cap, b->min_conns, (unsigned long long)b->nofile, atomic_load(&boot_live));
    open--;
    bye(b, v);
  }
  int past = 0;
  for (int i = 0; i < b->nconns; i++) past += counted(b->conns[i]) && b->conns[i]->state == CS_OPEN;
  if (past > b->max_open) b->max_open = past;
  if (open > b->max_held) b->max_held = open;
}

void boot_ctl_flush(struct boot_state* b, struct boot_conn* c) {
  while (c->ctl_on && !c->dead) {
    if (c->ctl_off == sizeof(c->ctl)) {
      c->ctl_on = 0;
      break;
    }
    ssize_t w = send(c->fd, (char*)&c->ctl + c->ctl_off, sizeof(c->ctl) - c->ctl_off, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (w > 0) {
      c->ctl_off += (size_t)w;
      continue;
    }
    if (w < 0 && errno == EINTR) continue;
    if (w < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return; /* progress() polls for room */
    /* The other end is gone: nothing more to send. */
    c->ctl_on = 0;
    boot_conn_eof(b, c, w < 0 ? errno : EPIPE);
    return;
  }
  maybe_close(b, c);
}

void boot_ctl_record(struct boot_state* b, struct boot_conn* c) {
  const struct boot_msg_hdr* h = &c->hdr;
  char why[200];
  if ((h->type != BOOT_REC_BYE && h->type != BOOT_REC_BYE_ACK) || h->tag != 0 || h->size != 0 || h->seq != 0) {
    snprintf(why, sizeof(why), "sent a bootstrap record of an unknown kind (type %u, tag %d, size %llu, number %llu)",
             h->type, h->tag, (unsigned long long)h->size, (unsigned long long)h->seq);
    return boot_conn_drop(b, c, why);
  }
  if (h->type == BOOT_REC_BYE_ACK && !c->bye_out)
    return boot_conn_drop(b, c, "answered a close of its bootstrap connection that we did not start");
  c->fin = 1; /* it sends nothing more here */
  b->crossed += h->type == BOOT_REC_BYE && c->bye_out;
  if (!c->bye_out) { /* its close: send nothing more here, and answer once our message is out */
    struct boot_peer* p = &b->peers[c->peer];
    if (p->send == c) p->send = NULL;
    c->bye_in = 1;
    if (c == b->writing) c->ack_due = 1;
    else return ctl_queue(b, c, BOOT_REC_BYE_ACK);
  }
  maybe_close(b, c);
}

void boot_conn_wrote(struct boot_state* b, struct boot_conn* c) {
  if (!c->ack_due || c->dead) return;
  c->ack_due = 0;
  ctl_queue(b, c, BOOT_REC_BYE_ACK);
}

int boot_closing_eof(struct boot_state* b, struct boot_conn* c, int e) {
  if (!c->bye_out && !c->bye_in) return 0;
  if (!c->fin && (e != 0 || c->hdr_got != 0)) return 0; /* reset, or cut inside a record: lost */
  if (!c->fin) INFO(LOG_BOOTSTRAP, "Bootstrap rank %d: rank %d closed a connection we were closing", b->rank, c->peer);
  c->ctl_on = c->ack_due = 0; /* the other end went first: nothing more to say */
  b->closed++;
  b->settled++;
  boot_conn_kill(b, c);
  return 1;
}

int boot_seq_ok(const struct boot_peer* p, uint64_t seq) {
  return seq >= p->rseq && seq - p->rseq < BOOT_MAX_QUEUED_MSGS;
}

int boot_enqueue(struct boot_peer* p, struct boot_msg* m) {
  if (m->seq < p->rseq) return -1; /* taken, or queued, already */
  struct boot_msg** pp = &p->head;
  if (p->tail && p->tail->seq < m->seq) pp = &p->tail->next; /* the usual case: in order */
  else
    while (*pp && (*pp)->seq < m->seq) pp = &(*pp)->next;
  if (*pp && (*pp)->seq == m->seq) return -1;
  m->next = *pp;
  *pp = m;
  if (!m->next) p->tail = m;
  p->qbytes += m->size;
  p->qcount++;
  for (const struct boot_msg* x = m; x && x->seq == p->rseq; x = x->next) p->rseq++;
  return 0;
}

struct boot_msg* boot_take(struct boot_peer* p, int tag) {
  struct boot_msg **pp = &p->head, *prev = NULL;
  for (struct boot_msg* m = p->head; m && m->seq < p->rseq; prev = m, pp = &m->next, m = m->next) {
    if (m->tag != tag) continue;
    *pp = m->next;
    if (p->tail == m) p->tail = prev;
    p->qbytes -= m->size;
    p->qcount--;
    return m;
  }
  return NULL;
}

int boot_close_idle(struct boot_state* b, int peer) {
  int n = 0;
  for (int i = 0; i < b->nconns; i++) {
    struct boot_conn* c = b->conns[i];
    if (c->peer == peer && idle(b, c)) bye(b, c), n++;
  }
  return n;
}

void boot_conn_stats(struct boot_state* b, struct boot_conn_stats* out) {
  memset(out, 0, sizeof(*out));
  for (int i = 0; i < b->nconns; i++) {
    const struct boot_conn* c = b->conns[i];
    out->open += counted(c) && c->state == CS_OPEN;
    out->opening += counted(c) && c->state == CS_CLI_WAIT;
    out->closing += !c->dead && (c->bye_out || c->bye_in);
  }
  out->max_open = b->max_open;
  out->max_held = b->max_held;
  out->cap = boot_conns_cap(b);
  out->opened = b->opened;
  out->closed = b->closed;
  out->crossed = b->crossed;
}
