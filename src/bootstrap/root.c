/* The bootstrap root: a detached thread that collects one boot_rank_info per rank, checks that the
 * ranks agree (nranks, library and wire versions) and sends each rank the address of its next rank
 * (struct boot_next: O(1) bytes per rank; the ranks gather the full table among themselves over
 * their authenticated connections, peer.c), or one error record that every rank prints. It serves one job and exits.
 * With several roots (ncclCommInitRankScalable) it serves one block of ranks and the first rank of the
 * next block (a link join, answered BOOT_REPLY_LINKED), whose address its last rank needs; as every
 * root checks the link rank too, agreement (nranks, versions, the ids' digest) chains over all blocks. A connection must pass the handshake
 * (boot_internal.h) within BOOT_HELLO_TIMEOUT_NS before anything else it sends is read; one that
 * fails is closed with a rate-limited WARN, so scanners and stale jobs cannot disturb the job.
 * Everything is bounded: connections that have not proven the secret (ROOT_MAX_UNAUTH), descriptors
 * (EMFILE pauses accepting instead of spinning), field values and text. A connection that proved the
 * secret is never dropped to make room: when the bound is reached, connections of other uids on this
 * host and connections that stalled (ROOT_STALL_NS without a byte) go first, and if there are none the
 * newcomer is refused. A rank cut off before it proved itself connects again (bootstrap.c), so a
 * flood costs members time, never their place (docs/SECURITY.md, "Floods from another local user"). */
#define _GNU_SOURCE /* accept4 */
#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../misc/log.h"
#include "../misc/param.h"
#include "../misc/utils.h"
#include "boot_internal.h"

#define ROOT_SEND_TIMEOUT_NS (5ull * 1000000000ull)
#define ROOT_FAILED_LINGER_NS (30ull * 1000000000ull) /* keep telling late joiners about a failure */
#define ROOT_MSG_LEN 1536
#define ROOT_MAX_UNAUTH 512 /* connections still in the handshake; under the usual 1024 descriptors */
#define ROOT_STALL_NS 250000000ull /* no byte for this long in the handshake: may be dropped to make room */
#define ROOT_UID_SCAN_NS 50000000ull /* owners of waiting connections are looked up at most this often */
#define ROOT_ACCEPT_PAUSE_NS 100000000ull     /* out of descriptors: stop accepting this long */
#define ROOT_MAX_TIMEOUT_MS (30ull * 86400000ull) /* a join's timeout is clamped to 30 days */

enum { RC_HELLO, RC_PROOF, RC_JOIN };

struct root_conn {
  int fd;
  int rank; /* -1 until its join is accepted */
  int slot; /* its index in infos/by_slot once joined: rank - first, or nblock for the link join */
  int state; /* RC_*: what is being read */
  uint64_t t0;
  uint64_t last; /* when its last handshake byte came (t0 before any) */
  int other_uid; /* 1: its owner is another uid on this host (from root_learn_uids) */
  union sock_addr peer;
  size_t got; /* bytes of the current state's record */
  struct boot_hello hello;
  unsigned char nonce_s[BOOT_NONCE];
  struct boot_cli_proof proof;
  struct boot_join join;
};

struct root {
  struct sock listener;
  uint64_t magic;
  struct boot_key key;
  uint64_t accept_paused_until;
  int warned_emfile;
  uint64_t uid_scan; /* when root_learn_uids last ran */
  int64_t timeout_s;
  uint64_t start, deadline; /* deadline: 0 until the first join */
  struct root_conn** conns;
  int nconns, cap;
  int nranks; /* -1 until the first join, which also sets the layout below */
  int nroots, iroot, first, nblock, nslots; /* our block: ranks first .. first + nblock - 1 (+ a link slot) */
  int link_rank;                            /* first rank of the next block (-1: one root) */
  uint64_t ids_digest;
  struct boot_rank_info* infos; /* by slot */
  struct root_conn** by_slot;
  int joined;
  /* After the answers: each joined rank's connection stays open until it sends BOOT_DONE_BYTE (it has
   * the table); one that closes first left during the table's gather, and every other rank is told at
   * once (a rank waiting for it may not know its address, so no EOF would ever reach it). */
  int watching;
  int done;
  ch_status fail_status; /* CH_OK, or the error every (late) joiner gets */
  char fail_msg[ROOT_MSG_LEN];
  char name[64]; /* our address, for messages */
};

void boot_format_ranks(const unsigned char* flags, int n, unsigned char want, char* buf, size_t len) {
  size_t o = 0;
  buf[0] = '\0';
  for (int i = 0; i < n; i++) {
    if (flags[i] != want) continue;
    int j = i;
    while (j + 1 < n && flags[j + 1] == want) j++;
    char item[32];
    if (j == i) snprintf(item, sizeof(item), "%s%d", o ? "," : "", i);
    else snprintf(item, sizeof(item), "%s%d-%d", o ? "," : "", i, j);
    size_t il = strlen(item);
    if (o + il + 4 >= len) {
      if (o + 4 <= len) snprintf(buf + o, len - o, "...");
      return;
    }
    memcpy(buf + o, item, il + 1);
    o += il;
    i = j;
  }
}

/* Send everything within ROOT_SEND_TIMEOUT_NS; quietly give up on a dead or stuck rank. */
static int root_send(int fd, const void* data, size_t n) {
  const char* p = data;
  uint64_t end = ut_now_ns() + ROOT_SEND_TIMEOUT_NS;
  while (n > 0) {
    ssize_t w = send(fd, p, n, MSG_NOSIGNAL);
    if (w > 0) {
      p += w;
      n -= (size_t)w;
      continue;
    }
    if (w < 0 && errno == EINTR) continue;
    if (w < 0 && (errno == EAGAIN || errno == EWOULDBLOCK) && ut_now_ns() < end) {
      struct pollfd pf = {fd, POLLOUT, 0};
      poll(&pf, 1, 100);
      continue;
    }
    return -1;
  }
  return 0;
}

static void root_reply(struct root* r, struct root_conn* c, uint32_t type, ch_status st, const void* data, size_t len) {
  struct boot_reply rep = {type, (uint32_t)st, len};
  if (root_send(c->fd, &rep, sizeof(rep)) != 0 || root_send(c->fd, data, len) != 0) {
    char a[64];
    INFO(LOG_BOOTSTRAP, "Bootstrap root %s: could not send the %s to rank %d at %s", r->name,
         type == BOOT_REPLY_NEXT ? "next rank's address" : "error report", c->rank, sock_addr_str(&c->peer, a, sizeof(a)));
  }
}

static int slot_rank(const struct root* r, int slot) { return slot < r->nblock ? r->first + slot : r->link_rank; }

/* "3,5-7" for the ranks whose slot flag is `want` (flags by slot). */
static void root_format_slots(const struct root* r, const unsigned char* flags, unsigned char want, char* buf, size_t len) {
  unsigned char* g = malloc((size_t)r->nranks);
  if (!g) {
    snprintf(buf, len, "?");
    return;
  }
  memset(g, want ? 0 : 1, (size_t)r->nranks); /* ranks we do not serve: never listed */
  for (int i = 0; i < r->nslots; i++) g[slot_rank(r, i)] = flags[i];
  boot_format_ranks(g, r->nranks, want, buf, len);
  free(g);
}

static void root_drop(struct root* r, int idx) {
  struct root_conn* c = r->conns[idx];
  if (c->rank >= 0 && r->by_slot && r->by_slot[c->slot] == c) {
    r->by_slot[c->slot] = NULL;
    r->joined--;
  }
  close(c->fd);
  free(c);
  r->conns[idx] = r->conns[--r->nconns];
}

static void root_drop_conn(struct root* r, struct root_conn* c) {
  for (int i = 0; i < r->nconns; i++)
    if (r->conns[i] == c) {
      root_drop(r, i);
      return;
    }
}

/* Send the error to every joined rank (and to `extra`), close them, and remember it for late joiners. */
/* Root threads of this process inside root_fail (any thread reads it: boot_root_wait_reports). */
static _Atomic int roots_reporting;

static void root_fail(struct root* r, ch_status st, const char* msg, struct root_conn* extra) {
  atomic_fetch_add(&roots_reporting, 1);
  INFO(LOG_BOOTSTRAP, "Bootstrap root %s: failing the job: %s", r->name, msg);
  if (msg != r->fail_msg) snprintf(r->fail_msg, sizeof(r->fail_msg), "%s", msg); /* late joiners: msg is it */
  r->fail_status = st;
  /* Every report first, then the closes: a rank that reads its report may end this process. */
  for (int i = 0; i < r->nconns; i++) {
    struct root_conn* c = r->conns[i];
    if (c->rank >= 0 || c == extra) root_reply(r, c, BOOT_REPLY_ERROR, st, msg, strlen(msg));
  }
  for (int i = r->nconns - 1; i >= 0; i--)
    if (r->conns[i]->rank >= 0 || r->conns[i] == extra) root_drop(r, i);
  atomic_fetch_sub(&roots_reporting, 1);
}

void boot_root_wait_reports(uint64_t max_ns) {
  uint64_t t0 = ut_now_ns();
  for (uint64_t i = 0; atomic_load(&roots_reporting) > 0 && ut_now_ns() - t0 < max_ns; i++) ut_backoff(i);
}

static void appendf(char* buf, size_t len, const char* fmt, ...) __attribute__((format(printf, 3, 4)));
static void appendf(char* buf, size_t len, const char* fmt, ...) {
  size_t o = strlen(buf);
  if (o + 1 >= len) return;
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(buf + o, len - o, fmt, ap);
  va_end(ap);
}

static int32_t field_of(const struct boot_rank_info* info, size_t off) {
  int32_t v;
  memcpy(&v, (const char*)info + off, sizeof(v));
  return v;
}

/* Append "field differs between ranks: v1 on ranks a-b (host), v2 on rank c (host)" if it does. */
static void root_check_field(struct root* r, const char* field, size_t off, char* msg, size_t len) {
  int n = r->nslots;
  int32_t v0 = field_of(&r->infos[0], off);
  int differs = 0;
  for (int i = 1; i < n && !differs; i++) differs = field_of(&r->infos[i], off) != v0;
  if (!differs) return;
  unsigned char* seen = calloc((size_t)n, 1);
  unsigned char* mark = malloc((size_t)n);
  if (seen && mark) {
    appendf(msg, len, "%s%s differs between ranks:", msg[0] ? "; " : "", field);
    int groups = 0;
    for (int i = 0; i < n; i++) {
      if (seen[i]) continue;
      int32_t v = field_of(&r->infos[i], off);
      for (int j = 0; j < n; j++) {
        mark[j] = field_of(&r->infos[j], off) == v;
        seen[j] |= mark[j];
      }
      char ranks[256];
      root_format_slots(r, mark, 1, ranks, sizeof(ranks));
      int plural = strpbrk(ranks, ",-") != NULL;
      appendf(msg, len, "%s %d on rank%s %s (%s)", groups++ ? "," : "", v, plural ? "s" : "", ranks,
              r->infos[i].hostname);
    }
  }
  free(seen);
  free(mark);
}

static void root_complete(struct root* r) {
  sock_close(&r->listener); /* free the port (NCCL_COMM_ID) before anyone learns the job is done */
  char msg[ROOT_MSG_LEN] = "";
  root_check_field(r, "library version", offsetof(struct boot_rank_info, lib_version), msg, sizeof(msg));
  root_check_field(r, "wire version", offsetof(struct boot_rank_info, wire_version), msg, sizeof(msg));
  if (msg[0]) {
    char full[ROOT_MSG_LEN + 64];
    snprintf(full, sizeof(full), "Bootstrap: ranks are incompatible: %s", msg);
    root_fail(r, CH_INVALID_USAGE, full, NULL);
  } else {
    INFO(LOG_BOOTSTRAP, "Bootstrap root %s: all %d ranks of its block (root %d of %d, ranks %d-%d%s) joined in %.1f ms",
         r->name, r->nslots, r->iroot, r->nroots, r->first, r->first + r->nblock - 1, r->nroots > 1 ? ", and the link" : "",
         (double)(ut_now_ns() - r->start) / 1e6);
    for (int i = 0; i < r->nblock; i++) {
      struct boot_next nx;
      memset(&nx, 0, sizeof(nx));
      nx.rank = r->first + i;
      nx.nranks = r->nranks;
      nx.next = r->infos[(i + 1) % r->nslots].listen_addr; /* one root: the last rank's next is rank 0 */
      nx.next_pid = r->infos[(i + 1) % r->nslots].pid; /* and who it is, for messages */
      memcpy(nx.next_host, r->infos[(i + 1) % r->nslots].hostname, sizeof(nx.next_host)); /* checked at join */
      root_reply(r, r->by_slot[i], BOOT_REPLY_NEXT, CH_OK, &nx, sizeof(nx));
    }
    if (r->nslots > r->nblock) root_reply(r, r->by_slot[r->nblock], BOOT_REPLY_LINKED, CH_OK, NULL, 0);
    for (int i = r->nconns - 1; i >= 0; i--) /* connections that never joined have nothing to watch */
      if (r->conns[i]->rank < 0) root_drop(r, i);
    r->watching = r->nconns > 0;
    if (r->watching) return;
  }
  r->done = 1;
}

/* A joined rank's connection is readable after the answers: its "done", or its end. */
static void root_watch_read(struct root* r, struct root_conn* c) {
  unsigned char b = 0;
  ssize_t n = recv(c->fd, &b, 1, 0);
  if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) return;
  if (n == 1 && b == BOOT_DONE_BYTE) {
    root_drop_conn(r, c);
  } else {
    const struct boot_rank_info* in = &r->infos[c->slot];
    char msg[ROOT_MSG_LEN];
    snprintf(msg, sizeof(msg), "Bootstrap: rank %d (pid %d on %s) left while the ranks gathered their table (it exited "
             "or was killed, or its init failed: see its log)", c->rank, in->pid, in->hostname);
    root_drop_conn(r, c);
    root_fail(r, CH_REMOTE, msg, NULL); /* every rank still gathering; the job cannot complete */
  }
  if (r->nconns == 0) r->done = 1;
}

static void root_timeout(struct root* r) {
  if (r->fail_status == CH_OK && r->joined > 0) {
    unsigned char* present = calloc((size_t)r->nslots, 1);
    if (present) {
      for (int i = 0; i < r->nslots; i++) present[i] = r->by_slot[i] != NULL;
      char joined[512], missing[512], msg[ROOT_MSG_LEN], block[128] = "";
      root_format_slots(r, present, 1, joined, sizeof(joined));
      root_format_slots(r, present, 0, missing, sizeof(missing));
      if (r->nroots > 1)
        snprintf(block, sizeof(block), " (root %d of %d, serving ranks %d-%d and linking rank %d)", r->iroot, r->nroots,
                 r->first, r->first + r->nblock - 1, r->link_rank);
      snprintf(msg, sizeof(msg),
               "Bootstrap timed out after %.1f s at root %s%s: %d of %d ranks joined (ranks %s); missing ranks %s of %d",
               (double)(ut_now_ns() - r->start) / 1e9, r->name, block, r->joined, r->nslots, joined, missing, r->nranks);
      root_fail(r, CH_TIMEOUT, msg, NULL);
      free(present);
    }
  }
  r->done = 1;
}

static void root_join(struct root* r, struct root_conn* c) {
  struct boot_join j = c->join;
  struct boot_rank_info* in = &j.info;
  char a[64], msg[ROOT_MSG_LEN];
  sock_addr_str(&c->peer, a, sizeof(a));
  uint64_t now = ut_now_ns();
  if (r->fail_status != CH_OK) {
    root_fail(r, r->fail_status, r->fail_msg, c);
    return;
  }
  /* Text is printed and sent back: terminated and printable, or the join is refused. */
  int bad_text = boot_text_field(in->hostname, sizeof(in->hostname)) != 0;
  bad_text |= boot_text_field(in->host_id, sizeof(in->host_id)) != 0;
  int fam = in->listen_addr.sa.sa_family;
  if (bad_text || (fam != AF_INET && fam != AF_INET6) || sock_addr_port(&in->listen_addr) == 0) {
    WARN("Bootstrap root %s: rank %d at %s sent a malformed join (%s); dropping it", r->name, in->rank, a,
         bad_text ? "non-printable host name" : "bad listen address");
    snprintf(msg, sizeof(msg), "Bootstrap: root %s refused a malformed join from %s", r->name, a);
    root_reply(r, c, BOOT_REPLY_ERROR, CH_INVALID_USAGE, msg, strlen(msg));
    root_drop_conn(r, c);
    return;
  }
  if (in->nranks <= 0 || in->nranks > BOOT_MAX_RANKS || in->rank < 0 || in->rank >= in->nranks) {
    snprintf(msg, sizeof(msg), "Bootstrap: rank %d (host %s pid %d) is out of range for nranks %d (at most %d ranks)",
             in->rank, in->hostname, in->pid, in->nranks, BOOT_MAX_RANKS);
    root_reply(r, c, BOOT_REPLY_ERROR, CH_INVALID_USAGE, msg, strlen(msg));
    root_drop_conn(r, c);
    return;
  }
  if (j.nroots < 1 || j.nroots > (uint32_t)in->nranks || j.iroot >= j.nroots || j.link > 1 || (j.link && j.nroots < 2)) {
    snprintf(msg, sizeof(msg), "Bootstrap: rank %d (host %s pid %d) sent a malformed join (root %u of %u ids, link %u)",
             in->rank, in->hostname, in->pid, j.iroot, j.nroots, j.link);
    root_reply(r, c, BOOT_REPLY_ERROR, CH_INVALID_USAGE, msg, strlen(msg));
    root_drop_conn(r, c);
    return;
  }
  if (r->nranks < 0) {
    int nr = in->nranks, nroots = (int)j.nroots, iroot = (int)j.iroot;
    r->nroots = nroots;
    r->iroot = iroot;
    r->first = boot_root_first(iroot, nr, nroots);
    r->nblock = boot_root_first(iroot + 1, nr, nroots) - r->first;
    r->nslots = r->nblock + (nroots > 1);
    r->link_rank = nroots > 1 ? boot_root_first(iroot + 1, nr, nroots) % nr : -1;
    r->ids_digest = in->ids_digest;
    r->infos = calloc((size_t)r->nslots, sizeof(*r->infos));
    r->by_slot = calloc((size_t)r->nslots, sizeof(*r->by_slot));
    if (!r->infos || !r->by_slot) {
      WARN("Bootstrap root %s: out of memory for %d ranks", r->name, r->nslots);
      r->done = 1;
      return;
    }
    r->nranks = nr;
    r->deadline = r->timeout_s > 0 ? now + (uint64_t)r->timeout_s * 1000000000ull : 0;
  }
  if (in->nranks != r->nranks) {
    unsigned char* present = calloc((size_t)r->nslots, 1);
    char ranks[256] = "?";
    if (present) {
      for (int i = 0; i < r->nslots; i++) present[i] = r->by_slot[i] != NULL;
      root_format_slots(r, present, 1, ranks, sizeof(ranks));
      free(present);
    }
    snprintf(msg, sizeof(msg), "Bootstrap: ranks disagree on the number of ranks: nranks=%d on ranks %s, nranks=%d on rank %d (host %s pid %d)",
             r->nranks, ranks, in->nranks, in->rank, in->hostname, in->pid);
    root_fail(r, CH_INVALID_USAGE, msg, c);
    r->deadline = now + ROOT_FAILED_LINGER_NS;
    return;
  }
  /* The ids decide the blocks: a rank given other ids (or in another order) joins the wrong root or
   * computes another block. Every joiner of this root must have the first one's list. */
  if (in->ids_digest != r->ids_digest || (int)j.nroots != r->nroots || in->nids != r->nroots) {
    const struct boot_rank_info* f = NULL;
    for (int i = 0; i < r->nslots && !f; i++)
      if (r->by_slot[i]) f = &r->infos[i];
    snprintf(msg, sizeof(msg), "Bootstrap: ranks were given different lists of unique ids: rank %d (host %s pid %d) "
             "has %u ids, rank %d (host %s pid %d) joined root %s with %d ids and another list; "
             "ncclCommInitRankScalable needs the same commIds, in the same order, on every rank", in->rank,
             in->hostname, in->pid, j.nroots, f ? f->rank : -1, f ? f->hostname : "?", f ? f->pid : -1, r->name, r->nroots);
    root_fail(r, CH_INVALID_USAGE, msg, c);
    r->deadline = now + ROOT_FAILED_LINGER_NS;
    return;
  }
  int slot = j.link ? (in->rank == r->link_rank ? r->nblock : -1)
                    : (in->rank >= r->first && in->rank < r->first + r->nblock ? in->rank - r->first : -1);
  if (slot < 0 || (int)j.iroot != r->iroot) {
    snprintf(msg, sizeof(msg), "Bootstrap: rank %d (host %s pid %d) joined root %s%s, which serves ranks %d-%d (root %d of "
             "%d) and links rank %d", in->rank, in->hostname, in->pid, r->name, j.link ? " as a link" : "",
             r->first, r->first + r->nblock - 1, r->iroot, r->nroots, r->link_rank);
    root_reply(r, c, BOOT_REPLY_ERROR, CH_INVALID_USAGE, msg, strlen(msg));
    root_drop_conn(r, c);
    return;
  }
  struct root_conn* prev = r->by_slot[slot];
  if (prev) {
    struct boot_rank_info* p = &r->infos[slot];
    snprintf(msg, sizeof(msg), "Bootstrap: rank %d joined twice: already joined from host %s pid %d, now from host %s pid %d; "
             "check the rank passed to ncclCommInitRank", in->rank, p->hostname, p->pid, in->hostname, in->pid);
    root_reply(r, c, BOOT_REPLY_ERROR, CH_INVALID_USAGE, msg, strlen(msg));
    root_drop_conn(r, c);
    return;
  }
  if (j.timeout_ms) { /* report before the earliest rank gives up on its own */
    if (j.timeout_ms > ROOT_MAX_TIMEOUT_MS) j.timeout_ms = ROOT_MAX_TIMEOUT_MS;
    uint64_t d = now + j.timeout_ms * 1000000ull;
    if (!r->deadline || d < r->deadline) r->deadline = d;
  }
  r->infos[slot] = *in;
  r->by_slot[slot] = c;
  c->rank = in->rank;
  c->slot = slot;
  r->joined++;
  INFO(LOG_BOOTSTRAP, "Bootstrap root %s: rank %d joined%s from %s (%d/%d)", r->name, in->rank, j.link ? " as the link" : "",
       a, r->joined, r->nslots);
  if (r->joined == r->nslots) root_complete(r);
}

/* Read what is available. Returns 0 to keep the connection, -1 to drop it. */
static int root_read(struct root* r, struct root_conn* c) {
  char a[64];
  if (c->rank >= 0) { /* a joined rank must stay quiet: data or EOF means it left */
    char x;
    ssize_t n = recv(c->fd, &x, 1, 0);
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) return 0;
    /* It died (or broke the protocol) after joining: the job cannot start. Say so now, naming it,
     * rather than let the others wait for the init timeout. */
    char msg[ROOT_MSG_LEN];
    const struct boot_rank_info* in = r->infos ? &r->infos[c->slot] : NULL;
    snprintf(msg, sizeof(msg), "Bootstrap: rank %d (pid %d on %s, %s) left after joining, before all %d ranks "
             "joined (it exited or was killed)", c->rank, in ? in->pid : -1, in ? in->hostname : "?",
             sock_addr_str(&c->peer, a, sizeof(a)), r->nranks);
    root_fail(r, CH_REMOTE, msg, NULL); /* drops c with the other joined ranks */
    return 1;
  }
  for (;;) {
    void* dst = c->state == RC_HELLO ? (void*)&c->hello : c->state == RC_PROOF ? (void*)&c->proof : (void*)&c->join;
    size_t need = c->state == RC_HELLO ? sizeof(c->hello) : c->state == RC_PROOF ? sizeof(c->proof) : sizeof(c->join);
    ssize_t n = recv(c->fd, (char*)dst + c->got, need - c->got, 0);
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return 0;
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      INFO(LOG_BOOTSTRAP, "Bootstrap root %s: ignoring connection from %s (closed %s)", r->name,
           sock_addr_str(&c->peer, a, sizeof(a)), c->state == RC_JOIN ? "before its join" : "during the handshake");
      return -1;
    }
    c->got += (size_t)n;
    c->last = ut_now_ns();
    if (c->got < need) continue;
    c->got = 0;
    char who[96];
    snprintf(who, sizeof(who), "Bootstrap root %s", r->name);
    if (c->state == RC_HELLO) {
      if (c->hello.magic != r->magic || c->hello.kind != BOOT_KIND_JOIN) {
        sock_warn_reject(who, &c->peer, "not a Chorus join of this version");
        return -1;
      }
      struct boot_srv_proof sp;
      if (ut_random(c->nonce_s, sizeof(c->nonce_s)) != CH_OK) return -1;
      memcpy(sp.nonce, c->nonce_s, sizeof(sp.nonce));
      boot_mac(&r->key, 1, &c->hello, c->nonce_s, sp.mac);
      if (root_send(c->fd, &sp, sizeof(sp)) != 0) return -1;
      c->state = RC_PROOF;
    } else if (c->state == RC_PROOF) {
      if (!boot_mac_ok(&r->key, 0, &c->hello, c->nonce_s, c->proof.mac)) {
        sock_warn_reject(who, &c->peer, "it does not know this job's secret (a different job or secret, or an impostor)");
        return -1;
      }
      if (c->hello.arg != sizeof(struct boot_rank_info)) {
        char msg[256];
        snprintf(msg, sizeof(msg), "Bootstrap: incompatible Chorus builds: rank info of %u bytes, root expects %zu",
                 c->hello.arg, sizeof(struct boot_rank_info));
        root_reply(r, c, BOOT_REPLY_ERROR, CH_INVALID_USAGE, msg, strlen(msg));
        return -1;
      }
      struct boot_reply ack = {BOOT_REPLY_ACCEPTED, CH_OK, 0}; /* from here on it is never dropped for room */
      if (root_send(c->fd, &ack, sizeof(ack)) != 0) return -1;
      c->state = RC_JOIN;
    } else {
      root_join(r, c); /* may drop c itself */
      return 1;
    }
  }
}

/* Connections that have not proven the job's secret: the ones a flood can make. */
static int root_unauth(const struct root* r) {
  int n = 0;
  for (int i = 0; i < r->nconns; i++) n += r->conns[i]->rank < 0 && r->conns[i]->state != RC_JOIN;
  return n;
}

/* Mark the waiting connections whose other end belongs to another uid of this host (one pass over
 * /proc/net/tcp{,6} for all of them, at most every ROOT_UID_SCAN_NS). */
static void root_learn_uids(struct root* r, uint64_t now) {
  if (r->uid_scan && now - r->uid_scan < ROOT_UID_SCAN_NS) return;
  r->uid_scan = now;
  int* fds = malloc((size_t)r->nconns * sizeof(*fds));
  uid_t* uids = malloc((size_t)r->nconns * sizeof(*uids));
  unsigned char* found = malloc((size_t)r->nconns);
  struct root_conn** who = malloc((size_t)r->nconns * sizeof(*who));
  int n = 0;
  if (fds && uids && found && who) {
    for (int i = 0; i < r->nconns; i++)
      if (r->conns[i]->rank < 0 && r->conns[i]->state != RC_JOIN && !r->conns[i]->other_uid)
        who[n] = r->conns[i], fds[n++] = r->conns[i]->fd;
    if (n) sock_peer_uids(fds, n, uids, found);
    for (int i = 0; i < n; i++) who[i]->other_uid = found[i] && uids[i] != geteuid();
  }
  free(fds);
  free(uids);
  free(found);
  free(who);
}

/* Make room among the unauthenticated connections: drop every one of another uid and every one
 * that stalled. Joined and authenticated connections are never candidates. Returns how many went. */
static int root_make_room(struct root* r, const char* why) {
  uint64_t now = ut_now_ns();
  root_learn_uids(r, now);
  int dropped = 0;
  char who[96], text[200];
  snprintf(who, sizeof(who), "Bootstrap root %s", r->name);
  for (int i = r->nconns - 1; i >= 0; i--) {
    struct root_conn* c = r->conns[i];
    if (c->rank >= 0 || c->state == RC_JOIN) continue;
    int stalled = now - c->last > ROOT_STALL_NS;
    if (!c->other_uid && !stalled) continue;
    snprintf(text, sizeof(text), "dropped to make room (%s): %s", why,
             c->other_uid ? "it belongs to another user" : "it sent nothing for 250 ms during the handshake");
    sock_warn_reject(who, &c->peer, text);
    root_drop(r, i);
    dropped++;
  }
  return dropped;
}

static void root_accept(struct root* r) {
  char who[96];
  snprintf(who, sizeof(who), "Bootstrap root %s", r->name);
  for (int k = 0; k < 256; k++) {
    union sock_addr peer;
    socklen_t len = sizeof(peer);
    memset(&peer, 0, sizeof(peer));
    int fd = accept4(r->listener.fd, &peer.sa, &len, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0) {
      if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM) {
        /* The connection stays queued and the listener readable: pause instead of spinning, and
         * free a descriptor held by a connection that has not joined. */
        if (!r->warned_emfile++)
          WARN("Bootstrap root %s: cannot accept connections: %s; pausing and dropping idle connections", r->name,
               strerror(errno));
        r->accept_paused_until = ut_now_ns() + ROOT_ACCEPT_PAUSE_NS;
        r->uid_scan = 0;
        root_make_room(r, "out of descriptors");
      }
      return;
    }
    sock_set_nodelay(fd); /* accepted sockets do not inherit it: the join's replies are records */
    char why[160];
    if (boot_uid_check(&r->key, fd, &peer, why, sizeof(why)) != 0) {
      sock_warn_reject(who, &peer, why);
      close(fd);
      continue;
    }
    if (root_unauth(r) >= ROOT_MAX_UNAUTH && root_make_room(r, "too many connections waiting to authenticate") == 0) {
      /* Every waiting connection is making progress: refuse the newcomer, which, if it is a rank,
       * connects again (bootstrap.c). */
      char text[96];
      snprintf(text, sizeof(text), "refused: %d connections are already authenticating", ROOT_MAX_UNAUTH);
      sock_warn_reject(who, &peer, text);
      close(fd);
      continue;
    }
    struct root_conn* c = calloc(1, sizeof(*c));
    if (r->nconns == r->cap) {
      int cap = r->cap ? r->cap * 2 : 16;
      struct root_conn** nc = realloc(r->conns, (size_t)cap * sizeof(*nc));
      if (nc) {
        r->conns = nc;
        r->cap = cap;
      }
    }
    if (!c || r->nconns == r->cap) {
      free(c);
      close(fd);
      continue;
    }
    c->fd = fd;
    c->rank = -1;
    c->state = RC_HELLO;
    c->t0 = c->last = ut_now_ns();
    c->peer = peer;
    r->conns[r->nconns++] = c;
  }
}

static void* root_main(void* arg) {
  struct root* r = arg;
  struct pollfd* pfds = NULL;
  int pcap = 0;
  while (!r->done) {
    uint64_t now = ut_now_ns();
    if (r->deadline && now >= r->deadline) {
      if (!r->watching) root_timeout(r); /* watching: the ranks' own deadlines report it */
      break;
    }
    for (int i = r->nconns - 1; i >= 0; i--) /* hellos must come promptly */
      if (r->conns[i]->rank < 0 && now - r->conns[i]->t0 > BOOT_HELLO_TIMEOUT_NS) {
        char a[64];
        INFO(LOG_BOOTSTRAP, "Bootstrap root %s: dropping connection from %s (no join within 5 s)", r->name,
             sock_addr_str(&r->conns[i]->peer, a, sizeof(a)));
        root_drop(r, i);
      }
    int np = r->nconns + 1;
    if (np > pcap) {
      struct pollfd* p = realloc(pfds, (size_t)np * 2 * sizeof(*p));
      if (!p) break;
      pfds = p;
      pcap = np * 2;
    }
    int paused = r->accept_paused_until && now < r->accept_paused_until;
    pfds[0] = (struct pollfd){paused ? -1 : r->listener.fd, POLLIN, 0};
    struct root_conn** snap = r->conns; /* conns may be dropped while we walk; poll order = index order */
    int nsnap = r->nconns;
    for (int i = 0; i < nsnap; i++) pfds[i + 1] = (struct pollfd){snap[i]->fd, POLLIN, 0};
    int ms = 100;
    if (r->deadline) {
      uint64_t left = r->deadline > now ? (r->deadline - now) / 1000000 + 1 : 0;
      if (left < (uint64_t)ms) ms = (int)left;
    }
    int rc = poll(pfds, (nfds_t)np, ms);
    if (rc < 0 && errno != EINTR) {
      WARN("Bootstrap root %s: poll failed: %s", r->name, strerror(errno));
      break;
    }
    if (rc <= 0) continue;
    /* Collect the ready connections first: handling one may drop others. */
    struct root_conn** ready = malloc((size_t)np * sizeof(*ready));
    int nready = 0;
    if (!ready) break;
    for (int i = 0; i < nsnap; i++)
      if (pfds[i + 1].revents) ready[nready++] = snap[i];
    for (int k = 0; k < nready && !r->done; k++) {
      int idx = -1;
      for (int i = 0; i < r->nconns; i++)
        if (r->conns[i] == ready[k]) idx = i;
      if (idx < 0) continue; /* dropped meanwhile */
      if (r->watching && ready[k]->rank < 0) root_drop_conn(r, ready[k]); /* never joined: nothing to watch */
      else if (r->watching) root_watch_read(r, ready[k]);
      else if (root_read(r, ready[k]) < 0) root_drop_conn(r, ready[k]);
    }
    free(ready);
    if (r->listener.fd >= 0 && (pfds[0].revents & POLLIN) && !r->done) root_accept(r);
  }
  while (r->nconns > 0) root_drop(r, r->nconns - 1);
  sock_close(&r->listener);
  free(pfds);
  free(r->conns);
  free(r->infos);
  free(r->by_slot);
  memset(&r->key, 0, sizeof(r->key));
  free(r);
  return NULL;
}

ch_status boot_root_start(const union sock_addr* addr, uint64_t magic, const struct boot_key* key,
                          union sock_addr* bound) {
  struct root* r = calloc(1, sizeof(*r));
  if (!r) {
    WARN("Bootstrap root: out of memory");
    return CH_SYSTEM;
  }
  r->magic = magic;
  r->key = *key;
  r->nranks = -1;
  r->timeout_s = param_int(PARAM_INIT_TIMEOUT);
  r->start = ut_now_ns();
  ch_status st = sock_listen(addr, &r->listener);
  if (st != CH_OK) {
    free(r);
    return st;
  }
  sock_addr_str(&r->listener.addr, r->name, sizeof(r->name));
  *bound = r->listener.addr;
  pthread_attr_t attr;
  pthread_attr_init(&attr);
  pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
  pthread_t t;
  int e = pthread_create(&t, &attr, root_main, r);
  pthread_attr_destroy(&attr);
  if (e != 0) {
    WARN("Bootstrap root: pthread_create failed: %s", strerror(e));
    sock_close(&r->listener);
    free(r);
    return CH_SYSTEM;
  }
  INFO(LOG_BOOTSTRAP, "Bootstrap root listening on %s", r->name);
  return CH_OK;
}
