/* Stall queries: a small per-process service that answers "what is this rank doing" while the rank's
 * own thread is blocked inside a collective (the bootstrap's peer connections are only read by the
 * rank's own thread, so they cannot serve this). One listener per bootstrap interface, each with a
 * thread that accepts and hands every connection to a short-lived worker thread, so a slow or silent
 * client delays nobody. Workers are bounded, and the owner comes first: a connection from another
 * uid of this host (or one whose owner is unknown) gets QUERY_HELLO_OTHER_NS to prove itself, and
 * at most QUERY_MAX_PER_UID of them per uid and QUERY_MAX_OTHERS in all wait at once; when every
 * worker is taken, a connection from our own uid cuts off one that has not proven itself yet
 * (another uid's first, then one of ours silent for QUERY_SILENT_NS). docs/SECURITY.md, "Floods
 * from another local user".
 *
 * Handshake (the key never travels; nothing from the client is used before its proof checked out):
 *   client -> hello {magic, BOOT_KIND_QUERY, arg = request kind, to_rank = 1 if it proves a key,
 *             nranks = request bytes (<= QUERY_MAX_REQ), nonce_c}
 *   server -> nonce_s
 *   client -> HMAC(key, "chorus-query-v1 client" || hello || nonce_s) (zeros without a key), request
 *   server -> {status, len, HMAC(key, "chorus-query-v1 server" || hello || nonce_s || reply)}, reply
 * The server tries the keys of the jobs it serves. A client that claims a key and proves none is
 * rejected. A client without a key is admitted only from this host and our uid (it could read the
 * ranks' memory anyway), and then sees every job of this process; the reply then carries no MAC and
 * the client checks the server's uid instead. BOOT_AUTH_UID keys (public) also need that uid check
 * for local connections, as everywhere in the bootstrap. */
#define _GNU_SOURCE /* accept4 */
#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include "../misc/log.h"
#include "../misc/param.h"
#include "../misc/sha256.h"
#include "../misc/utils.h"
#include "boot_internal.h"

#define QUERY_MAX_LISTENERS 4
#define QUERY_MAX_WORKERS 8 /* live workers; as many more may be draining after a cut */
#define QUERY_MAX_OTHERS 4  /* workers for other uids of this host, all together */
#define QUERY_MAX_PER_UID 2 /* ... and for one of them */
#define QUERY_HELLO_OTHER_NS (500 * UT_NS_PER_MS) /* their handshake must be done by then */
#define QUERY_SILENT_NS (200 * UT_NS_PER_MS)      /* one of ours not authenticated by then may be cut for another */
#define QUERY_MAX_KEYS 64
#define QUERY_HELLO_NS (2ull * UT_NS_PER_S) /* handshake and request must arrive by then */
#define QUERY_REPLY_NS (5ull * UT_NS_PER_S) /* the handler and the reply, past the request */

enum { QST_KEYED = 1, QST_LOCAL = 2 };
struct query_reply_hdr {
  uint32_t status; /* QST_* */
  uint32_t len;    /* reply bytes that follow, <= BOOT_QUERY_MAX_REPLY */
  unsigned char mac[BOOT_MAC];
};

/* Under q_lock: listeners (sockets kept for the process's life, so an advertised address stays
 * valid; closed only in a fork child), keys (refcounted by the communicators that serve them), the
 * handler, the number of communicators served (q_users: listener threads run while it is above 0,
 * so a process without communicators has no thread of ours). q_life serializes starting and
 * stopping the threads. Workers count themselves in q_workers. */
static pthread_mutex_t q_lock = PTHREAD_MUTEX_INITIALIZER, q_life = PTHREAD_MUTEX_INITIALIZER;
static struct {
  struct sock s;
  pthread_t thread;
  int running;
} q_listen[QUERY_MAX_LISTENERS];
static int q_nlisten, q_users;
static int q_stop_fd = -1; /* eventfd: readable while listener threads are to exit */
static struct {
  struct boot_key key;
  int refs;
} q_keys[QUERY_MAX_KEYS];
static boot_query_handler q_handler;
static _Atomic int q_workers;
/* Under q_lock: one per worker thread. The listener fills a free slot and may cut a busy one
 * (cut = 1, atomic, read by the worker's waits; and shutdown(fd), under q_lock, so the worker wakes
 * at once); the worker sets authed when its client proved itself, and frees the slot and closes fd
 * under q_lock, so a cut never reaches a reused descriptor. */
enum { Q_OWNER, Q_OTHER, Q_REMOTE };
static struct q_slot {
  int busy, fd, cls; /* Q_* */
  uid_t uid;         /* Q_OTHER: its uid, or (uid_t)-1 when unknown */
  int authed, cut;
  uint64_t t0;
} q_slots[2 * QUERY_MAX_WORKERS];
static pthread_once_t q_once = PTHREAD_ONCE_INIT;

static void at_prepare(void) {
  pthread_mutex_lock(&q_life);
  pthread_mutex_lock(&q_lock);
}
static void at_parent(void) {
  pthread_mutex_unlock(&q_lock);
  pthread_mutex_unlock(&q_life);
}
/* A fork child has none of our threads: its inherited listeners would never be served (and the
 * parent's threads would answer for them), so it forgets them and starts its own when needed. */
static void at_child(void) {
  for (int i = 0; i < q_nlisten; i++) sock_close(&q_listen[i].s), q_listen[i].running = 0;
  q_nlisten = 0;
  q_users = 0;
  atomic_store(&q_workers, 0);
  memset(q_slots, 0, sizeof(q_slots));
  /* The eventfd is shared with the parent (and its other children): a stop written there would
   * wake, or be consumed by, the wrong process's threads. */
  if (q_stop_fd >= 0) close(q_stop_fd);
  q_stop_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  pthread_mutex_unlock(&q_lock);
  pthread_mutex_unlock(&q_life);
}
static void q_init(void) {
  q_stop_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  ut_atfork_register(at_prepare, at_parent, at_child);
}

static void mac_of(const struct boot_key* key, int server, const struct boot_hello* h, const unsigned char* nonce_s,
                   const void* body, size_t len, unsigned char mac[BOOT_MAC]) {
  static const char srv[] = "chorus-query-v1 server", cli[] = "chorus-query-v1 client";
  const void* parts[4] = {server ? srv : cli, h, nonce_s, body ? body : ""};
  size_t lens[4] = {sizeof(srv), sizeof(*h), BOOT_NONCE, server ? len : 0};
  hmac_sha256(key->k, sizeof(key->k), 4, parts, lens, mac);
}

/* Exactly n bytes, by the deadline; -1 on EOF, error, time out or abort (nothing logged: callers say what). */
static int io_all(int fd, void* buf, size_t n, uint64_t deadline, int out, const volatile int* abort) {
  char* p = buf;
  while (n > 0) {
    ssize_t r = out ? send(fd, p, n, MSG_NOSIGNAL | MSG_DONTWAIT) : recv(fd, p, n, MSG_DONTWAIT);
    if (r > 0) {
      p += r;
      n -= (size_t)r;
      continue;
    }
    if (r == 0 && !out) return -1;
    if (r < 0 && errno == EINTR) continue;
    if (r < 0 && errno != EAGAIN && errno != EWOULDBLOCK) return -1;
    uint64_t now = ut_now_ns();
    if (now >= deadline || (abort && __atomic_load_n(abort, __ATOMIC_RELAXED))) return -1; /* or cut (q_admit) */
    uint64_t left_ms = (deadline - now) / UT_NS_PER_MS + 1;
    struct pollfd pf = {fd, (short)(out ? POLLOUT : POLLIN), 0};
    if (poll(&pf, 1, (int)(left_ms > 100 ? 100 : left_ms)) < 0 && errno != EINTR) return -1;
  }
  return 0;
}

struct worker_arg {
  int fd;
  union sock_addr remote;
  struct q_slot* slot;
};

/* Decide whether a new connection gets a worker (a slot under q_lock), cutting off a waiting one if
 * our own uid needs the room. NULL: refused, with *why filled. */
static struct q_slot* q_admit(int fd, int cls, uid_t uid, char* why, size_t len) {
  uint64_t now = ut_now_ns();
  int live = 0, others = 0, same = 0;
  struct q_slot *free_slot = NULL, *victim = NULL;
  pthread_mutex_lock(&q_lock);
  for (int i = 0; i < 2 * QUERY_MAX_WORKERS; i++) {
    struct q_slot* q = &q_slots[i];
    if (!q->busy) {
      if (!free_slot) free_slot = q;
      continue;
    }
    if (q->cut) continue;
    live++;
    others += q->cls == Q_OTHER;
    same += q->cls == Q_OTHER && q->uid == uid;
    if (cls != Q_OWNER || __atomic_load_n(&q->authed, __ATOMIC_RELAXED)) continue; /* the worker stores it */
    /* Our own uid may cut another uid's waiting connection, else one of ours that stays silent. */
    int rank_q = q->cls == Q_OTHER ? 2 : q->cls == Q_OWNER && now - q->t0 > QUERY_SILENT_NS ? 1 : 0;
    int rank_v = !victim ? 0 : victim->cls == Q_OTHER ? 2 : 1;
    if (rank_q > rank_v || (rank_q && rank_q == rank_v && q->t0 < victim->t0)) victim = q;
  }
  struct q_slot* got = NULL;
  if (cls == Q_OTHER && (others >= QUERY_MAX_OTHERS || same >= QUERY_MAX_PER_UID)) {
    if (uid == (uid_t)-1) snprintf(why, len, "refused: %d stall queries of unknown owners are already waiting", same);
    else snprintf(why, len, "refused: uid %u already has %d stall queries waiting (another user's flood?)", (unsigned)uid, same);
  } else if (live >= QUERY_MAX_WORKERS && !victim) {
    snprintf(why, len, "refused: all %d workers are busy", QUERY_MAX_WORKERS);
  } else if (free_slot) {
    if (live >= QUERY_MAX_WORKERS) {
      __atomic_store_n(&victim->cut, 1, __ATOMIC_RELAXED);
      shutdown(victim->fd, SHUT_RDWR);
    }
    got = free_slot;
    *got = (struct q_slot){.busy = 1, .fd = fd, .cls = cls, .uid = uid, .t0 = now};
  } else {
    snprintf(why, len, "refused: workers cut off are still finishing");
  }
  pthread_mutex_unlock(&q_lock);
  return got;
}

static void* worker(void* argp) {
  struct worker_arg a = *(struct worker_arg*)argp;
  free(argp);
  char why[200] = "";
  struct q_slot* slot = a.slot;
  const volatile int* cut = &slot->cut;
  /* Only another uid, known as such, is hurried: an owner not found is given the usual time. */
  uint64_t deadline =
      slot->t0 + (slot->cls == Q_OTHER && slot->uid != (uid_t)-1 ? QUERY_HELLO_OTHER_NS : QUERY_HELLO_NS);
  struct boot_hello h;
  unsigned char nonce_s[BOOT_NONCE], mac[BOOT_MAC];
  char req[BOOT_QUERY_MAX_REQ];
  char* reply = NULL;
  struct boot_key key;
  int keyed = 0;
  if (io_all(a.fd, &h, sizeof(h), deadline, 0, cut) != 0) goto quiet; /* closed or silent: nothing to say */
  if (h.magic != BOOT_ID_MAGIC || h.kind != BOOT_KIND_QUERY || h.to_rank > 1 || h.nranks > BOOT_QUERY_MAX_REQ) {
    snprintf(why, sizeof(why), "not a Chorus stall query of this version");
    goto reject;
  }
  if (ut_random(nonce_s, sizeof(nonce_s)) != CH_OK || io_all(a.fd, nonce_s, sizeof(nonce_s), deadline, 1, cut) != 0 ||
      io_all(a.fd, mac, sizeof(mac), deadline, 0, cut) != 0 || io_all(a.fd, req, h.nranks, deadline, 0, cut) != 0)
    goto quiet;
  if (h.to_rank == 1) { /* the client proves a key: one we serve, or it is out */
    pthread_mutex_lock(&q_lock);
    for (int i = 0; i < QUERY_MAX_KEYS && !keyed; i++) {
      if (!q_keys[i].refs) continue;
      unsigned char want[BOOT_MAC];
      mac_of(&q_keys[i].key, 0, &h, nonce_s, NULL, 0, want);
      if (ct_memcmp(want, mac, BOOT_MAC) == 0) key = q_keys[i].key, keyed = 1;
    }
    pthread_mutex_unlock(&q_lock);
    if (!keyed) {
      snprintf(why, sizeof(why), "a stall query that does not know the secret of any job in this process");
      goto reject;
    }
  }
  /* Without a key, or with a public one: only our uid on this host (other hosts: the key decides). */
  if (!keyed && slot->cls == Q_REMOTE) {
    snprintf(why, sizeof(why), "a stall query from another host without a job secret (set CHORUS_SECRET)");
    goto reject;
  }
  if ((!keyed || key.mode == BOOT_AUTH_UID) && slot->cls == Q_OTHER) {
    if (slot->uid == (uid_t)-1)
      snprintf(why, sizeof(why), "a connection from this host whose owner cannot be found in /proc/net/tcp "
               "(ask with the job's secret)");
    else if (keyed) /* a public key: the job really has no secret */
      snprintf(why, sizeof(why), "a process of uid %u (this job runs as uid %u and has no CHORUS_SECRET)",
               (unsigned)slot->uid, (unsigned)geteuid());
    else
      snprintf(why, sizeof(why), "a stall query without the job's secret from uid %u (without it only uid %u may ask)",
               (unsigned)slot->uid, (unsigned)geteuid());
    goto reject;
  }
  __atomic_store_n(&slot->authed, 1, __ATOMIC_RELAXED); /* under q_lock's readers: a stale 0 only cuts it */
  reply = malloc(BOOT_QUERY_MAX_REPLY);
  if (!reply) goto quiet;
  boot_query_handler fn;
  pthread_mutex_lock(&q_lock);
  fn = q_handler;
  pthread_mutex_unlock(&q_lock);
  size_t len = fn ? fn(keyed ? &key : NULL, h.arg, req, h.nranks, reply, BOOT_QUERY_MAX_REPLY) : 0;
  if (len > BOOT_QUERY_MAX_REPLY) len = BOOT_QUERY_MAX_REPLY;
  struct query_reply_hdr rh;
  memset(&rh, 0, sizeof(rh));
  rh.status = keyed ? QST_KEYED : QST_LOCAL;
  rh.len = (uint32_t)len;
  if (keyed) mac_of(&key, 1, &h, nonce_s, reply, len, rh.mac);
  deadline = ut_now_ns() + QUERY_REPLY_NS;
  if (io_all(a.fd, &rh, sizeof(rh), deadline, 1, NULL) == 0) io_all(a.fd, reply, len, deadline, 1, NULL);
  goto quiet;
reject:
  sock_warn_reject("Stall query service", &a.remote, why);
quiet:
  memset(&key, 0, sizeof(key));
  free(reply);
  pthread_mutex_lock(&q_lock);
  close(a.fd);
  slot->busy = 0;
  pthread_mutex_unlock(&q_lock);
  atomic_fetch_sub(&q_workers, 1);
  return NULL;
}

static void* listener_main(void* arg) {
  int fd = (int)(intptr_t)arg;
  pthread_attr_t attr;
  pthread_attr_init(&attr);
  pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
  for (;;) {
    struct pollfd pf[2] = {{fd, POLLIN, 0}, {q_stop_fd, POLLIN, 0}};
    if (poll(pf, 2, -1) < 0 && errno != EINTR) break;
    if (pf[1].revents) break; /* boot_query_run: no communicator left to serve */
    if (!(pf[0].revents & POLLIN)) continue;
    union sock_addr remote;
    socklen_t len = sizeof(remote);
    memset(&remote, 0, sizeof(remote));
    int c = accept4(fd, &remote.sa, &len, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (c < 0) {
      if (errno == EBADF || errno == EINVAL || errno == ENOTSOCK) break; /* closed in a fork child */
      if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM) usleep(100000);
      continue;
    }
    int cls = sock_addr_is_local(&remote) ? Q_OTHER : Q_REMOTE;
    uid_t uid = (uid_t)-1;
    if (cls == Q_OTHER && sock_peer_uid(c, &uid) == 0 && uid == geteuid()) cls = Q_OWNER;
    char why[160];
    struct q_slot* slot = q_admit(c, cls, cls == Q_OTHER ? uid : 0, why, sizeof(why));
    if (!slot) { /* the client retries or reports it */
      if (cls == Q_OTHER) sock_warn_reject("Stall query service", &remote, why);
      close(c);
      continue;
    }
    atomic_fetch_add(&q_workers, 1);
    struct worker_arg* w = malloc(sizeof(*w));
    pthread_t t;
    if (w) *w = (struct worker_arg){c, remote, slot};
    if (!w || pthread_create(&t, &attr, worker, w) != 0) {
      free(w);
      pthread_mutex_lock(&q_lock);
      close(c);
      slot->busy = 0;
      pthread_mutex_unlock(&q_lock);
      atomic_fetch_sub(&q_workers, 1);
    }
  }
  pthread_attr_destroy(&attr);
  return NULL;
}

/* Under q_lock. A listener whose thread cannot start queues connections until the next try. */
static void start_threads(void) {
  for (int i = 0; i < q_nlisten; i++) {
    if (q_listen[i].running) continue;
    void* fd = (void*)(intptr_t)q_listen[i].s.fd;
    q_listen[i].running = pthread_create(&q_listen[i].thread, NULL, listener_main, fd) == 0;
  }
}

void boot_query_run(int delta) {
  pthread_once(&q_once, q_init);
  pthread_mutex_lock(&q_life);
  pthread_mutex_lock(&q_lock);
  q_users += delta;
  pthread_t join[QUERY_MAX_LISTENERS];
  int njoin = 0;
  if (q_users > 0) start_threads();
  if (q_users <= 0) {
    q_users = 0;
    for (int i = 0; i < q_nlisten; i++)
      if (q_listen[i].running) join[njoin++] = q_listen[i].thread, q_listen[i].running = 0;
    uint64_t one = 1;
    if (njoin && write(q_stop_fd, &one, sizeof(one)) != sizeof(one)) /* cannot fail: counter far from full */
      WARN("Stall query service: cannot stop its threads: %s", strerror(errno));
  }
  pthread_mutex_unlock(&q_lock);
  for (int i = 0; i < njoin; i++) pthread_join(join[i], NULL);
  if (njoin) {
    uint64_t v;
    ssize_t r = read(q_stop_fd, &v, sizeof(v)); /* re-armed: no listener thread runs to see it */
    (void)r;
    /* Workers end within their deadlines; give those answering right now a moment to finish, so a
     * process whose last communicator is gone soon has no thread of ours (fork-safe again). */
    for (int i = 0; i < 20 && atomic_load(&q_workers) > 0; i++) usleep(10000);
  }
  pthread_mutex_unlock(&q_life);
}

void boot_query_set_handler(boot_query_handler fn) {
  pthread_once(&q_once, q_init);
  pthread_mutex_lock(&q_lock);
  q_handler = fn;
  pthread_mutex_unlock(&q_lock);
}

void boot_query_key(const struct boot_key* key, int delta) {
  pthread_mutex_lock(&q_lock);
  int slot = -1, free_slot = -1;
  for (int i = 0; i < QUERY_MAX_KEYS; i++) {
    if (q_keys[i].refs && q_keys[i].key.mode == key->mode && !memcmp(q_keys[i].key.k, key->k, sizeof(key->k))) slot = i;
    if (!q_keys[i].refs && free_slot < 0) free_slot = i;
  }
  if (slot < 0 && delta > 0 && free_slot >= 0) {
    slot = free_slot;
    q_keys[slot].key = *key;
  }
  if (slot >= 0) {
    q_keys[slot].refs += delta;
    if (q_keys[slot].refs <= 0) memset(&q_keys[slot], 0, sizeof(q_keys[slot]));
  }
  pthread_mutex_unlock(&q_lock);
}

void boot_query_addr(const union sock_addr* near, union sock_addr* out) {
  memset(out, 0, sizeof(*out)); /* AF_UNSPEC: no service */
  if (!param_int(PARAM_STALL_QUERY)) return;
  pthread_once(&q_once, q_init);
  union sock_addr a = *near;
  if (a.sa.sa_family == AF_INET) a.sin.sin_port = 0;
  else if (a.sa.sa_family == AF_INET6) a.sin6.sin6_port = 0;
  else return;
  pthread_mutex_lock(&q_lock);
  for (int i = 0; i < q_nlisten; i++) {
    const union sock_addr* l = &q_listen[i].s.addr;
    int same = l->sa.sa_family == a.sa.sa_family &&
               (a.sa.sa_family == AF_INET ? !memcmp(&l->sin.sin_addr, &a.sin.sin_addr, sizeof(a.sin.sin_addr))
                                          : !memcmp(&l->sin6.sin6_addr, &a.sin6.sin6_addr, sizeof(a.sin6.sin6_addr)));
    if (same) {
      *out = *l;
      pthread_mutex_unlock(&q_lock);
      return;
    }
  }
  char s[64];
  if (q_stop_fd >= 0 && q_nlisten < QUERY_MAX_LISTENERS && sock_listen(&a, &q_listen[q_nlisten].s) == CH_OK) {
    struct sock* ls = &q_listen[q_nlisten].s;
    q_listen[q_nlisten].running = 0;
    *out = ls->addr;
    q_nlisten++;
    if (q_users > 0) start_threads(); /* else the first communicator served starts it */
    INFO(LOG_INIT | LOG_BOOTSTRAP, "Stall query service of pid %d listening on %s (chorus-info --stall %s)",
         (int)getpid(), sock_addr_str(out, s, sizeof(s)), s);
  }
  pthread_mutex_unlock(&q_lock);
  if (out->sa.sa_family == AF_UNSPEC)
    INFO(LOG_INIT | LOG_BOOTSTRAP, "Stall query service not started on %s: stall reports show this process's "
         "ranks only", sock_addr_str(&a, s, sizeof(s)));
}

ch_status boot_query(const union sock_addr* addr, const struct boot_key* key, uint32_t kind, const void* req, size_t len,
                     char* out, size_t cap, size_t* got, uint64_t deadline_ns, const volatile int* abort, char* why,
                     size_t whylen) {
  *got = 0;
  why[0] = '\0';
  if (len > BOOT_QUERY_MAX_REQ || (addr->sa.sa_family != AF_INET && addr->sa.sa_family != AF_INET6)) {
    snprintf(why, whylen, "no stall query service there");
    return CH_INVALID_ARG;
  }
  struct sock s = {.fd = -1};
  struct sock_wait w = {abort, deadline_ns};
  int err = 0;
  ch_status st = sock_connect_brief(addr, &s, &w, 200, &err);
  if (st != CH_OK) {
    snprintf(why, whylen, "%s", st == CH_TIMEOUT ? "no answer in time" : st == CH_ABORTED ? "aborted" : strerror(err));
    return st == CH_TIMEOUT ? CH_TIMEOUT : CH_REMOTE;
  }
  struct boot_hello h;
  unsigned char nonce_s[BOOT_NONCE], mac[BOOT_MAC] = {0};
  struct query_reply_hdr rh;
  st = CH_REMOTE;
  if (boot_hello_init(&h, BOOT_KIND_QUERY, kind, key ? 1 : 0, (uint32_t)len) != CH_OK) goto out;
  if (io_all(s.fd, &h, sizeof(h), deadline_ns, 1, abort) != 0 ||
      io_all(s.fd, nonce_s, sizeof(nonce_s), deadline_ns, 0, abort) != 0) {
    snprintf(why, whylen, "closed the connection or did not answer (not a Chorus stall query service?)");
    goto out;
  }
  if (key) mac_of(key, 0, &h, nonce_s, NULL, 0, mac);
  if (io_all(s.fd, mac, sizeof(mac), deadline_ns, 1, abort) != 0 ||
      (len && io_all(s.fd, (void*)req, len, deadline_ns, 1, abort) != 0) ||
      io_all(s.fd, &rh, sizeof(rh), deadline_ns, 0, abort) != 0) {
    snprintf(why, whylen, key ? "rejected the query: it does not know this secret (or no answer in time)"
                              : "rejected the query: without a secret only processes of the same user on the "
                                "same host may ask (set CHORUS_SECRET or CHORUS_SECRET_FILE)");
    goto out;
  }
  if (rh.len > cap || rh.len > BOOT_QUERY_MAX_REPLY || (rh.status != QST_KEYED && rh.status != QST_LOCAL) ||
      (rh.status == QST_KEYED && !key)) {
    snprintf(why, whylen, "sent an invalid answer (status %u, %u bytes)", rh.status, rh.len);
    goto out;
  }
  if (io_all(s.fd, out, rh.len, deadline_ns, 0, abort) != 0) {
    snprintf(why, whylen, "closed the connection in the middle of its answer");
    goto out;
  }
  if (rh.status == QST_KEYED) {
    unsigned char want[BOOT_MAC];
    mac_of(key, 1, &h, nonce_s, out, rh.len, want);
    if (ct_memcmp(want, rh.mac, BOOT_MAC) != 0) {
      snprintf(why, whylen, "answered without proving the job's secret");
      goto out;
    }
  }
  if (rh.status == QST_LOCAL || key->mode == BOOT_AUTH_UID) { /* trust rests on who runs the server */
    struct boot_key uidk = {.mode = BOOT_AUTH_UID};
    char w2[160];
    if (rh.status == QST_LOCAL && !sock_addr_is_local(addr)) {
      snprintf(why, whylen, "answered without a secret from another host");
      goto out;
    }
    uid_t owner;
    if (rh.status == QST_LOCAL && sock_addr_is_local(addr) && sock_peer_uid(s.fd, &owner) == 0 && owner != geteuid()) {
      snprintf(why, whylen, "is not ours: it is a process of uid %u, and we run as uid %u (an answer without the job's "
               "secret is trusted from our own uid only)", (unsigned)owner, (unsigned)geteuid());
      goto out;
    }
    if (boot_uid_check(&uidk, s.fd, addr, w2, sizeof(w2)) != 0) {
      snprintf(why, whylen, "is not ours: it is %s", w2);
      goto out;
    }
  }
  *got = rh.len;
  st = CH_OK;
out:
  if (st != CH_OK) *got = 0;
  sock_close(&s);
  return st;
}
