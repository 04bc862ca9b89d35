/* Rank side of the rendezvous: the unique id, joining at the root, and building the peer state.
 *
 * Unique id (128 bytes): {magic, 256-bit key, root address, fixed flag, key mode}. Normally the
 * process calling boot_get_unique_id hosts the root and the key is random. With NCCL_COMM_ID every
 * process computes the id on its own, so the key comes from CHORUS_SECRET_FILE / CHORUS_SECRET
 * (the same on every rank), or, without them, from the address: then the key is public and only
 * the same-uid rule protects the job on this host (docs/SECURITY.md). */
#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "chorus.h"
#include "../misc/log.h"
#include "../misc/param.h"
#include "../misc/utils.h"
#include "boot_internal.h"

_Static_assert(sizeof(struct boot_id) <= 128, "unique id must fit in NCCL_UNIQUE_ID_BYTES");

#define BOOT_REPORT_GRACE_NS 1000000000ull /* wait this long past our deadline for the root's report */

/* Fixed root address: the key comes from the environment so every process agrees. */
static ch_status id_fixed(const char* hostport, struct boot_id* id) {
  char a[64];
  struct boot_key key;
  CHECK(sock_parse_addr(hostport, &id->root));
  CHECK(boot_key_from_env(hostport, &key));
  memcpy(id->key, key.k, sizeof(id->key));
  id->mode = key.mode;
  memset(&key, 0, sizeof(key));
  id->fixed = 1;
  INFO(LOG_BOOTSTRAP, "Bootstrap root at %s (%s); rank 0 will host it", hostport, sock_addr_str(&id->root, a, sizeof(a)));
  return CH_OK;
}

ch_status boot_id_from_addr(const char* hostport, void* id128) {
  struct boot_id id;
  memset(&id, 0, sizeof(id));
  id.magic = BOOT_ID_MAGIC;
  CHECK(id_fixed(hostport, &id));
  memset(id128, 0, 128);
  memcpy(id128, &id, sizeof(id));
  return CH_OK;
}

ch_status boot_get_unique_id(void* id128) {
  const char* comm_id = param_str(PARAM_COMM_ID);
  if (comm_id[0]) return boot_id_from_addr(comm_id, id128);
  return boot_get_random_id(id128);
}

ch_status boot_get_random_id(void* id128) {
  struct boot_id id;
  memset(&id, 0, sizeof(id));
  id.magic = BOOT_ID_MAGIC;
  union sock_addr addr;
  struct boot_key key;
  CHECK(boot_key_random(&key));
  memcpy(id.key, key.k, sizeof(id.key));
  id.mode = key.mode;
  CHECK(sock_find_interface(NULL, NULL, 0, &addr));
  CHECK(boot_root_start(&addr, id.magic, &key, &id.root));
  memset(&key, 0, sizeof(key));
  memset(id128, 0, 128);
  memcpy(id128, &id, sizeof(id));
  return CH_OK;
}

static void fill_info(struct boot_rank_info* info, int rank, int nranks, const union sock_addr* listen_addr) {
  memset(info, 0, sizeof(*info));
  info->rank = rank;
  info->nranks = nranks;
  info->lib_version = CHORUS_VERSION_CODE;
  info->wire_version = (int32_t)param_int(PARAM_WIRE_VERSION);
  info->pid = (int32_t)getpid();
  info->host_hash = ut_host_hash();
  info->proc_nonce = ut_proc_nonce();
  info->pid_ns = ut_pid_ns();
  snprintf(info->host_id, sizeof(info->host_id), "%s", ut_host_id());
  snprintf(info->hostname, sizeof(info->hostname), "%s", ut_hostname());
  info->listen_addr = *listen_addr;
  boot_query_addr(listen_addr, &info->query_addr); /* same interface: wherever peers reach us */
  ut_cpu_mask(info->cpus, BOOT_CPU_WORDS);
}

static void id_key(const struct boot_id* id, struct boot_key* key) {
  memcpy(key->k, id->key, sizeof(key->k));
  key->mode = id->mode;
}

int boot_check_info(struct boot_rank_info* t, int slot, int nranks, char* why, size_t len) {
  int fam = t->listen_addr.sa.sa_family, qfam = t->query_addr.sa.sa_family;
  const char* bad = NULL;
  if (t->rank != slot || t->nranks != nranks) bad = "its rank or number of ranks";
  else if ((fam != AF_INET && fam != AF_INET6) || sock_addr_port(&t->listen_addr) == 0) bad = "its listen address";
  /* AF_UNSPEC: that process serves no stall queries */
  else if (qfam != AF_UNSPEC && ((qfam != AF_INET && qfam != AF_INET6) || sock_addr_port(&t->query_addr) == 0))
    bad = "its stall query address";
  else if (boot_text_field(t->hostname, sizeof(t->hostname)) != 0 || boot_text_field(t->host_id, sizeof(t->host_id)) != 0)
    bad = "a non-printable host name";
  if (bad) snprintf(why, len, "%s", bad);
  return bad ? -1 : 0;
}

/* After the gather: a loopback address only reaches ranks of its own host, so with ranks elsewhere
 * the job cannot connect. Every rank sees the same table, so every rank fails here, at once, with
 * one message. */
static ch_status check_loopback(const struct boot_rank_info* t, int nranks, int rank) {
  int other = -1; /* a rank on another host than rank 0, if any */
  for (int j = 1; j < nranks && other < 0; j++)
    if (t[j].host_hash != t[0].host_hash) other = j;
  if (other < 0) return CH_OK;
  for (int i = 0; i < nranks; i++) {
    if (!sock_addr_is_loopback(&t[i].listen_addr)) continue;
    int j = t[i].host_hash == t[0].host_hash ? other : 0;
    char a[64];
    WARN("Bootstrap rank %d: rank %d (host %s, id %.48s) advertises the loopback address %s, which rank %d on "
         "another host (%s, id %.48s) cannot reach: set NCCL_SOCKET_IFNAME for rank %d to an interface the other "
         "hosts can reach", rank, i, t[i].hostname, t[i].host_id, sock_addr_str(&t[i].listen_addr, a, sizeof(a)), j,
         t[j].hostname, t[j].host_id, i);
    return CH_INVALID_USAGE;
  }
  return CH_OK;
}

/* Exactly n bytes to or from the root, quietly: CH_REMOTE if it closed or reset the connection,
 * which before its ACCEPTED means it made room (root.c) and we connect again. */
static ch_status root_io(struct sock* s, void* buf, size_t n, int out, const struct sock_wait* w) {
  char* p = buf;
  while (n > 0) {
    ssize_t r = out ? send(s->fd, p, n, MSG_NOSIGNAL | MSG_DONTWAIT) : recv(s->fd, p, n, MSG_DONTWAIT);
    if (r > 0) {
      p += r;
      n -= (size_t)r;
      continue;
    }
    if (r < 0 && errno == EINTR) continue;
    if (r == 0 || (errno != EAGAIN && errno != EWOULDBLOCK)) return CH_REMOTE;
    ch_status st = sock_wait_check(w);
    if (st != CH_OK) return st;
    struct pollfd pf = {s->fd, (short)(out ? POLLOUT : POLLIN), 0};
    poll(&pf, 1, 10);
  }
  return CH_OK;
}

/* Client half of the handshake, then the join, up to the root's ACCEPTED (or its error report,
 * left unread in the socket for the caller: *rep holds its header). CH_REMOTE: cut off before the
 * root accepted us. */
static ch_status handshake_root(struct sock* s, const struct boot_key* key, const struct boot_join* j,
                                const struct sock_wait* w, const char* root_name, struct boot_reply* rep) {
  char why[160];
  int rank = j->info.rank;
  if (boot_uid_check(key, s->fd, &s->addr, why, sizeof(why)) != 0) {
    WARN("Bootstrap rank %d: the bootstrap root at %s is not ours: it is %s", rank, root_name, why);
    return CH_INVALID_USAGE;
  }
  struct boot_hello h;
  CHECK(boot_hello_init(&h, BOOT_KIND_JOIN, (uint32_t)sizeof(struct boot_rank_info), 0, (uint32_t)j->info.nranks));
  ch_status st = root_io(s, &h, sizeof(h), 1, w);
  struct boot_srv_proof sp;
  if (st == CH_OK) st = root_io(s, &sp, sizeof(sp), 0, w);
  if (st != CH_OK) return st;
  if (!boot_mac_ok(key, 1, &h, sp.nonce, sp.mac)) {
    WARN("Bootstrap rank %d: the bootstrap root at %s does not know this job's secret: the ranks were started with "
         "different secrets (CHORUS_SECRET / CHORUS_SECRET_FILE set on some ranks only, or to different values), "
         "or another program listens there", rank, root_name);
    return CH_INVALID_USAGE;
  }
  struct boot_cli_proof cp;
  boot_mac(key, 0, &h, sp.nonce, cp.mac);
  st = root_io(s, &cp, sizeof(cp), 1, w);
  if (st == CH_OK) st = root_io(s, (void*)j, sizeof(*j), 1, w);
  if (st == CH_OK) st = root_io(s, rep, sizeof(*rep), 0, w);
  return st;
}

/* Connect to the root and get past its ACCEPTED. A connection the root cuts off before that (it
 * makes room when a flood fills it: root.c) is made again, with backoff, until the deadline. */
static ch_status connect_root(const struct boot_id* id, const struct boot_key* key, struct boot_join* j,
                              const struct sock_wait* w, uint64_t deadline_ns, const char* root_name, struct sock* root,
                              struct boot_reply* rep) {
  int rank = j->info.rank;
  uint64_t t0 = ut_now_ns(), backoff_ms = 10;
  for (int attempt = 1;; attempt++) {
    ch_status st = sock_connect(&id->root, root, w);
    if (st != CH_OK) {
      if (st == CH_ABORTED) INFO(LOG_BOOTSTRAP, "Bootstrap rank %d: aborted while connecting to the root", rank);
      else WARN("Bootstrap rank %d could not reach bootstrap root at %s%s", rank, root_name,
                st == CH_TIMEOUT ? " before its deadline" : st == CH_REMOTE ? " (connection refused)" : "");
      return st;
    }
    uint64_t now = ut_now_ns();
    j->timeout_ms = deadline_ns ? (deadline_ns > now ? (deadline_ns - now) / 1000000 : 0) + 1 : 0;
    st = handshake_root(root, key, j, w, root_name, rep);
    if (st != CH_REMOTE) return st;
    sock_close(root);
    if (attempt == 1 || attempt % 10 == 0)
      INFO(LOG_BOOTSTRAP, "Bootstrap rank %d: root %s closed our connection before accepting it (attempt %d; a "
           "flood of connections at the root?): connecting again", rank, root_name, attempt);
    /* Backoff with jitter, so ranks cut off together do not come back together. */
    unsigned char rnd = 0;
    (void)ut_random(&rnd, 1);
    uint64_t until = ut_now_ns() + (backoff_ms + backoff_ms * rnd / 256) * 1000000ull;
    if (backoff_ms < 500) backoff_ms *= 2;
    while (ut_now_ns() < until && (st = sock_wait_check(w)) == CH_OK) usleep(5000);
    if (st == CH_TIMEOUT)
      WARN("Bootstrap rank %d: bootstrap root %s closed our connection before accepting it %d times in %.1f s, "
           "until the init deadline (CHORUS_INIT_TIMEOUT): a flood of connections at the root? see its log",
           rank, root_name, attempt, (double)(ut_now_ns() - t0) / 1e9);
    if (st != CH_OK) return st;
  }
}

/* One join in progress: at our own root, or a link join at the previous block's root. */
struct root_join {
  struct sock s;
  struct boot_reply rep;
  char name[64];
  int link;
};

/* Connect and join at root `id` (its own key); the answer is read by join_wait. */
static ch_status join_open(const struct boot_id* id, const struct boot_rank_info* me, int nroots, int iroot, int link,
                           const volatile int* abort, uint64_t deadline_ns, struct root_join* rj) {
  sock_addr_str(&id->root, rj->name, sizeof(rj->name));
  rj->s.fd = -1;
  rj->link = link;
  struct sock_wait w = {abort, deadline_ns};
  struct boot_key key;
  id_key(id, &key);
  struct boot_join j;
  memset(&j, 0, sizeof(j));
  j.info = *me;
  j.nroots = (uint32_t)nroots;
  j.iroot = (uint32_t)iroot;
  j.link = (uint32_t)link;
  ch_status st = connect_root(id, &key, &j, &w, deadline_ns, rj->name, &rj->s, &rj->rep);
  memset(&key, 0, sizeof(key));
  if (st != CH_OK && rj->s.fd >= 0) {
    if (st == CH_ABORTED) INFO(LOG_BOOTSTRAP, "Bootstrap rank %d: aborted while joining at the root", me->rank);
    else if (st != CH_INVALID_USAGE)
      WARN("Bootstrap rank %d: lost the connection to bootstrap root %s while joining (a rejected connection: see the "
           "root's log)", me->rank, rj->name);
    sock_close(&rj->s);
  }
  return st;
}

/* Wait for the root's answer to a join: where our next rank listens (next; a link join gets none),
 * or the root's error report. */
static ch_status join_wait(struct root_join* rj, const struct boot_rank_info* me, const volatile int* abort,
                           uint64_t deadline_ns, union sock_addr* next, struct boot_rank_info* next_info) {
  int rank = me->rank, nranks = me->nranks;
  const char* root_name = rj->name;
  struct boot_reply rep = rj->rep;
  char* text = NULL;
  ch_status st = CH_OK;
  /* The root reports a timeout by our deadline: give its report a moment to arrive. */
  struct sock_wait wr = {abort, deadline_ns ? deadline_ns + BOOT_REPORT_GRACE_NS : 0};
  if (rep.type == BOOT_REPLY_ACCEPTED) CHECK_GOTO(sock_recv_all(&rj->s, &rep, sizeof(rep), &wr), st, fail);
  if (rep.type == BOOT_REPLY_ERROR && rep.len < 65536) {
    text = calloc(1, rep.len + 1);
    if (!text) {
      st = CH_SYSTEM;
      goto fail;
    }
    CHECK_GOTO(sock_recv_all(&rj->s, text, rep.len, &wr), st, fail);
    if (abort && *abort) { /* our own abort came first: the job's failure is its echo (a rank left) */
      st = CH_ABORTED;
      goto out;
    }
    for (char* c = text; *c; c++)
      if ((unsigned char)*c < 0x20 || (unsigned char)*c > 0x7e) *c = '?';
    WARN("%s", text); /* the same report on every rank */
    st = (rep.status == CH_INVALID_USAGE || rep.status == CH_TIMEOUT || rep.status == CH_REMOTE) ? (ch_status)rep.status
                                                                                                : CH_INTERNAL;
    goto out;
  }
  struct boot_next nx;
  uint32_t want = rj->link ? BOOT_REPLY_LINKED : BOOT_REPLY_NEXT;
  size_t want_len = rj->link ? 0 : sizeof(nx);
  if (rep.type != want || rep.len != want_len) {
    WARN("Bootstrap rank %d: unexpected answer from root %s (type %u, %llu bytes; a root of another Chorus "
         "version?)", rank, root_name, rep.type, (unsigned long long)rep.len);
    st = CH_INTERNAL;
    goto out;
  }
  if (rj->link) goto out;
  CHECK_GOTO(sock_recv_all(&rj->s, &nx, sizeof(nx), &wr), st, fail);
  int fam = nx.next.sa.sa_family;
  if (nx.rank != rank || nx.nranks != nranks || (fam != AF_INET && fam != AF_INET6) || sock_addr_port(&nx.next) == 0) {
    WARN("Bootstrap rank %d: root %s sent an invalid answer (rank %d of %d, next rank's address family %d)", rank,
         root_name, nx.rank, nx.nranks, fam);
    st = CH_INTERNAL;
    goto out;
  }
  *next = nx.next;
  /* For messages only, until the table brings the entry itself (checked then): printable, bounded. */
  nx.next_host[sizeof(nx.next_host) - 1] = 0;
  for (char* c = nx.next_host; *c; c++)
    if ((unsigned char)*c < 0x20 || (unsigned char)*c > 0x7e) *c = '?';
  next_info->pid = nx.next_pid > 0 ? nx.next_pid : 0;
  memcpy(next_info->hostname, nx.next_host, sizeof(next_info->hostname));
  goto out;
fail:
  if (st == CH_ABORTED) INFO(LOG_BOOTSTRAP, "Bootstrap rank %d: aborted while waiting at the root", rank);
  else if (st == CH_TIMEOUT)
    WARN("Bootstrap rank %d timed out waiting at bootstrap root %s for the other ranks of its %s (no report from the "
         "root)", rank, root_name, rj->link ? "previous block (it links that block to its own)" : "block");
  else
    WARN("Bootstrap rank %d: lost the connection to bootstrap root %s before all ranks joined (a rejected "
         "connection: see the root's log)", rank, root_name);
out:
  free(text);
  if (st != CH_OK) sock_close(&rj->s); /* answered: kept open for the root's watch (root.c, BOOT_DONE_BYTE) */
  return st;
}

/* The ids' digest: their roots and modes, in order, and their number (never their keys). */
static uint64_t ids_digest(const struct boot_id* ids, int nids) {
  uint64_t h = ut_hash(&nids, sizeof(nids), 0x9e3779b97f4a7c15ull);
  for (int i = 0; i < nids; i++) {
    struct { union sock_addr root; uint32_t fixed, mode; } pub;
    memset(&pub, 0, sizeof(pub));
    pub.root = ids[i].root;
    pub.fixed = ids[i].fixed;
    pub.mode = ids[i].mode;
    h = ut_hash(&pub, sizeof(pub), h);
  }
  return h;
}

/* boot_allgather_learn hook for the rank table: each entry is checked as it arrives, before it is
 * forwarded or its address used. */
struct table_learn {
  struct boot_rank_info* t;
  const struct boot_rank_info* me;
};

static ch_status learn_infos(void* arg, struct boot_state* b, int lo, int count, int from) {
  struct table_learn* l = arg;
  int nranks = l->me->nranks;
  for (int k = 0; k < count; k++) {
    int i = ((lo + k) % nranks + nranks) % nranks;
    struct boot_rank_info* t = &l->t[i];
    char why[96];
    if (boot_check_info(t, i, nranks, why, sizeof(why)) != 0) {
      WARN("Bootstrap rank %d: the rank table entry for rank %d, received from rank %d, is invalid (%s)", l->me->rank,
           i, from, why);
      return CH_INTERNAL;
    }
    /* The root compared every rank it served; this catches what reached us some other way. */
    if (t->lib_version != l->me->lib_version || t->wire_version != l->me->wire_version) {
      WARN("Bootstrap: ranks are incompatible: rank %d (host %s pid %d) has library version %d and wire version %d, "
           "rank %d (host %s pid %d) has %d and %d", i, t->hostname, t->pid, t->lib_version, t->wire_version,
           l->me->rank, l->me->hostname, l->me->pid, l->me->lib_version, l->me->wire_version);
      return CH_INVALID_USAGE;
    }
    if (t->ids_digest != l->me->ids_digest || t->nids != l->me->nids) {
      WARN("Bootstrap: rank %d (host %s pid %d) was given a different list of unique ids (%d ids) than rank %d (host "
           "%s pid %d, %d ids): ncclCommInitRankScalable needs the same commIds, in the same order, on every rank",
           i, t->hostname, t->pid, t->nids, l->me->rank, l->me->hostname, l->me->pid, l->me->nids);
      return CH_INVALID_USAGE;
    }
    CHECK(boot_learn_addr(b, i, &t->listen_addr));
    boot_name_peer(b, i, t->pid, t->hostname); /* checked printable above */
  }
  return CH_OK;
}

ch_status boot_init(const void* id128, int rank, int nranks, const volatile int* abort, uint64_t deadline_ns,
                    struct boot_state** out, struct boot_rank_info** peers) {
  return boot_init_ids(id128, 1, rank, nranks, abort, deadline_ns, out, peers);
}

ch_status boot_init_ids(const void* ids128, int nids, int rank, int nranks, const volatile int* abort,
                        uint64_t deadline_ns, struct boot_state** out, struct boot_rank_info** peers) {
  *out = NULL;
  if (peers) *peers = NULL;
  if (nranks <= 0 || nranks > BOOT_MAX_RANKS || rank < 0 || rank >= nranks) {
    WARN("Bootstrap: invalid rank %d for nranks %d (at most %d ranks)", rank, nranks, BOOT_MAX_RANKS);
    return CH_INVALID_ARG;
  }
  if (nids < 1 || nids > nranks) { /* NCCL refuses these too (ncclCommInitRankDev) */
    WARN("Bootstrap rank %d: %d unique ids for %d ranks (1 to nranks ids)", rank, nids, nranks);
    return CH_INVALID_ARG;
  }
  struct boot_id* ids = calloc((size_t)nids, sizeof(*ids));
  if (!ids) {
    WARN("Bootstrap rank %d: out of memory for %d unique ids", rank, nids);
    return CH_SYSTEM;
  }
  for (int i = 0; i < nids; i++) {
    memcpy(&ids[i], (const char*)ids128 + (size_t)i * 128, sizeof(ids[i]));
    if (ids[i].magic != BOOT_ID_MAGIC || (ids[i].mode != BOOT_AUTH_SECRET && ids[i].mode != BOOT_AUTH_UID)) {
      WARN("Bootstrap rank %d: invalid unique id %d of %d (not made by ncclGetUniqueId of this Chorus version, or "
           "corrupted)", rank, i, nids);
      free(ids);
      return CH_INVALID_ARG;
    }
  }
  if (nids > 1 && ids[0].fixed) { /* NCCL_COMM_ID names one root: NCCL uses the first id only */
    if (rank == 0) INFO(LOG_BOOTSTRAP | LOG_ENV, "NCCL_COMM_ID cannot be used with more than one unique id: using the first");
    nids = 1;
  }
  int iroot = boot_root_of(rank, nranks, nids);
  /* The first rank of a block also joins the previous block's root: that block's last rank needs it. */
  int link_root = nids > 1 && boot_root_first(iroot, nranks, nids) == rank ? (iroot + nids - 1) % nids : -1;
  struct boot_id id = ids[iroot]; /* our root; rank-to-rank connections use the first id's key */
  struct root_join rj = {.s = {.fd = -1}}, lj = {.s = {.fd = -1}};
  int lj_answered = 0;
  uint64_t t0 = ut_now_ns();
  ch_status st;
  struct sock listener = {.fd = -1};
  struct boot_rank_info* table = NULL;
  union sock_addr addr;
  struct boot_rank_info me;
  union sock_addr* addrs = NULL;
  struct boot_key key;
  id_key(&ids[0], &key);
  CHECK_GOTO(sock_find_interface(&id.root, NULL, 0, &addr), st, out);
  CHECK_GOTO(sock_listen(&addr, &listener), st, out);
  if (id.fixed && rank == 0) {
    union sock_addr bound;
    CHECK_GOTO(boot_root_start(&id.root, id.magic, &key, &bound), st, out);
  }
  fill_info(&me, rank, nranks, &listener.addr);
  me.nids = nids;
  me.ids_digest = ids_digest(ids, nids);
  union sock_addr next;
  /* Both joins first, then both answers: a root answers once its whole block (and link) joined. */
  CHECK_GOTO(join_open(&id, &me, nids, iroot, 0, abort, deadline_ns, &rj), st, out);
  if (link_root >= 0) CHECK_GOTO(join_open(&ids[link_root], &me, nids, link_root, 1, abort, deadline_ns, &lj), st, out);
  if (link_root >= 0) {
    /* Whichever root answers first: a failure at either ends the join at once (we then leave the
     * other root, which tells its ranks), instead of after the other root's timeout. */
    struct sock_wait w = {abort, deadline_ns ? deadline_ns + BOOT_REPORT_GRACE_NS : 0};
    while (rj.rep.type == BOOT_REPLY_ACCEPTED && lj.rep.type == BOOT_REPLY_ACCEPTED && !lj_answered) {
      struct pollfd pf[2] = {{rj.s.fd, POLLIN, 0}, {lj.s.fd, POLLIN, 0}};
      if (poll(pf, 2, sock_wait_slice_ms(&w)) > 0 && pf[1].revents && !pf[0].revents) {
        CHECK_GOTO(join_wait(&lj, &me, abort, deadline_ns, NULL, NULL), st, out);
        lj_answered = 1; /* its connection stays open for the root's watch */
        break;
      }
      if (pf[0].revents) break;
      if ((st = sock_wait_check(&w)) != CH_OK) break; /* join_wait says what happened */
    }
  }
  struct boot_rank_info next_info;
  memset(&next_info, 0, sizeof(next_info));
  CHECK_GOTO(join_wait(&rj, &me, abort, deadline_ns, &next, &next_info), st, out);
  if (link_root >= 0 && !lj_answered) CHECK_GOTO(join_wait(&lj, &me, abort, deadline_ns, NULL, NULL), st, out);
  uint64_t t_join = ut_now_ns();

  /* We know our own address and our next rank's; the others arrive with the table. */
  addrs = calloc((size_t)nranks, sizeof(*addrs));
  table = calloc((size_t)nranks, sizeof(*table));
  if (!addrs || !table) {
    WARN("Bootstrap rank %d: out of memory for %d ranks", rank, nranks);
    st = CH_SYSTEM;
    goto out;
  }
  addrs[rank] = me.listen_addr;
  if (nranks > 1) addrs[(rank + 1) % nranks] = next;
  table[rank] = me;
  CHECK_GOTO(boot_peers_create(out, rank, nranks, ids[0].magic, &key, addrs, &listener, abort, deadline_ns), st, out);
  /* Who we and our next rank are, for messages about a peer lost before the table is complete. */
  boot_name_peer(*out, rank, me.pid, me.hostname);
  if (nranks > 1) boot_name_peer(*out, (rank + 1) % nranks, next_info.pid, next_info.hostname);
  /* Our root(s) tell us at once if a rank leaves while we gather (we may not know its address). */
  boot_watch_roots(*out, rj.s.fd, lj.s.fd);
  struct table_learn l = {table, &me};
  CHECK_GOTO(boot_allgather_learn(*out, table, sizeof(*table), learn_infos, &l), st, out);
  boot_watch_roots(*out, -1, -1);
  /* We have the table: the root stops watching us (best effort: it is closed next). Checks of the
   * table below fail every rank alike, each saying why, not as "a rank left". */
  const unsigned char done = BOOT_DONE_BYTE;
  if (rj.s.fd >= 0) (void)!send(rj.s.fd, &done, 1, MSG_NOSIGNAL);
  if (lj.s.fd >= 0) (void)!send(lj.s.fd, &done, 1, MSG_NOSIGNAL);
  CHECK_GOTO(check_loopback(table, nranks, rank), st, out);
  boot_set_deadline(*out, 0); /* the init deadline covers boot_init only; later calls get one through boot_set_deadline */
  INFO(LOG_BOOTSTRAP, "Bootstrap rank %d/%d: joined in %.2f ms (root %d of %d: %.2f ms, table gathered in %.2f ms)",
       rank, nranks, (double)(ut_now_ns() - t0) / 1e6, iroot, nids, (double)(t_join - t0) / 1e6,
       (double)(ut_now_ns() - t_join) / 1e6);
  if (peers) {
    *peers = table;
    table = NULL;
  }
out:
  if (st != CH_OK && *out) {
    boot_close(*out); /* before the root connections it may watch are closed below */
    *out = NULL;
  }
  if (st != CH_OK) boot_root_wait_reports(BOOT_REPORT_GRACE_NS);
  memset(&key, 0, sizeof(key));
  sock_close(&rj.s);
  sock_close(&lj.s);
  memset(ids, 0, (size_t)nids * sizeof(*ids));
  free(ids);
  free(addrs);
  free(table);
  sock_close(&listener);
  return st;
}

ch_status boot_init_from_table(int rank, int nranks, const struct boot_key* key, const union sock_addr* addrs,
                               struct sock* listener, const volatile int* abort, struct boot_state** out) {
  *out = NULL;
  if (nranks <= 0 || nranks > BOOT_MAX_RANKS || rank < 0 || rank >= nranks) {
    WARN("Bootstrap: invalid rank %d for nranks %d", rank, nranks);
    sock_close(listener);
    return CH_INVALID_ARG;
  }
  ch_status st = boot_peers_create(out, rank, nranks, BOOT_ID_MAGIC, key, addrs, listener, abort, 0);
  if (st != CH_OK) sock_close(listener);
  return st;
}
