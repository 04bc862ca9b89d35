/* The cap on a rank's open bootstrap connections (bootstrap/peer_close.c): many ranks exchanging
 * messages in random orders through few connections, both sides closing one connection at once, a
 * peer that dies while a connection with it closes, and the close records checked as untrusted
 * input. Before the cap, every pair of ranks that ever exchanged a message kept a socket pair until
 * the communicator was destroyed, so N thread ranks of one process held about N^2 descriptors. */
#define _GNU_SOURCE
#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <linux/sockios.h>
#include <sys/ioctl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include "bootstrap/boot_internal.h"
#include "bootstrap/bootstrap.h"
#include "misc/log.h"
#include "misc/param.h"
#include "misc/socket.h"
#include "misc/utils.h"
#include "runner.h"

#define SEC 1000000000ull

static uint64_t now_ms(void) { return ut_now_ns() / 1000000; }

static void set_cap(const char* v) {
  setenv("CHORUS_BOOT_MAX_CONNS", v, 1);
  param_reset();
}

/* ---- many ranks, few connections ---- */

#define XR 5 /* rounds */
#define XM 3 /* messages to every peer per round: tags 100, 101, 100 */

/* The size of message k of `round` from `from` to `to`: mostly small, some larger than a socket
 * buffer (the sender then blocks and must read meanwhile), some over one segment. */
static size_t xsize(int from, int to, int round, int k) {
  unsigned h = (unsigned)(from * 31 + to * 17 + round * 7 + k * 3);
  return h % 23 == 0 ? 300000 : h % 5 == 0 ? 6000 : 16 + h % 200;
}

static void xshuffle(int* v, int n, unsigned* seed) {
  for (int i = 0; i < n; i++) v[i] = i;
  for (int i = n - 1; i > 0; i--) {
    int j = (int)(rand_r(seed) % (unsigned)(i + 1)), t = v[i];
    v[i] = v[j];
    v[j] = t;
  }
}

/* Every rank sends XM messages to every other rank in a random order, then receives them in another
 * random order, for XR rounds with no barrier between them: ranks drift apart, connections close and
 * open again all the time, and a message on a new connection can overtake one on a closing
 * connection. Each arrives intact, in order per tag, and no rank is ever reported lost. */
static void xchg_rank(int rank, int n, ncclUniqueId id, void* arg) {
  (void)arg;
  struct boot_state* b = NULL;
  ASSERT_EQ(boot_init(id.internal, rank, n, NULL, ut_now_ns() + 30 * SEC, &b, NULL), CH_OK);
  boot_set_deadline(b, ut_now_ns() + 100 * SEC);
  unsigned seed = (unsigned)rank * 7919u + 17u;
  int* order = malloc((size_t)n * sizeof(*order));
  unsigned char* buf = malloc(300000);
  ASSERT(order && buf);
  int peak = 0;
  for (int round = 0; round < XR; round++) {
    xshuffle(order, n, &seed);
    for (int i = 0; i < n; i++) {
      int p = order[i];
      if (p == rank) continue;
      for (int k = 0; k < XM; k++) {
        size_t sz = xsize(rank, p, round, k);
        memset(buf, (rank + k + round) & 0xff, sz);
        int32_t head[4] = {rank, p, round, k};
        memcpy(buf, head, sizeof(head));
        ASSERT_EQ(boot_send(b, p, 100 + (k & 1), buf, sz), CH_OK);
      }
    }
    xshuffle(order, n, &seed);
    for (int i = 0; i < n; i++) {
      int p = order[i];
      if (p == rank) continue;
      for (int k = 0; k < XM; k++) {
        size_t sz = xsize(p, rank, round, k);
        ASSERT_EQ(boot_recv(b, p, 100 + (k & 1), buf, sz), CH_OK);
        int32_t head[4];
        memcpy(head, buf, sizeof(head));
        if (head[0] != p || head[1] != rank || head[2] != round || head[3] != k ||
            buf[sz - 1] != ((p + k + round) & 0xff))
          rt_fail(__FILE__, __LINE__, "rank %d: message %d of round %d from rank %d is (%d, %d, %d, %d)", rank, k,
                  round, p, head[0], head[1], head[2], head[3]);
      }
    }
    struct boot_conn_stats st;
    boot_conn_stats(b, &st);
    if (st.open + st.closing > peak) peak = st.open + st.closing;
  }
  ASSERT_EQ(boot_barrier(b), CH_OK);
  struct boot_conn_stats st;
  boot_conn_stats(b, &st);
  EXPECT_EQ(st.cap, 12); /* 4 asked for, but never below 2*ceil(log2 32)+2 */
  /* Past the handshake, never over the cap. With ours waiting for their callees' proofs (which cannot
   * be closed yet) a little over it, while sends wait for those proofs and incoming ones arrive. */
  if (st.max_open > st.cap || st.max_held > 2 * st.cap)
    rt_fail(__FILE__, __LINE__, "rank %d had %d connections open, %d with those opening, cap %d", rank, st.max_open,
            st.max_held, st.cap);
  EXPECT(st.closed > 0);
  EXPECT(st.opened > (uint64_t)n); /* connections to the same ranks opened again */
  if (rank == 0)
    printf("    %s rank 0: cap %d, at most %d open (%d with those opening; with those closing, %d at a round's end), "
           "%llu opened, %llu closed\n",
           rt_mode(), st.cap, st.max_open, st.max_held, peak, (unsigned long long)st.opened,
           (unsigned long long)st.closed);
  free(order);
  free(buf);
  boot_close(b);
}

TEST_T(bootstrap, capped_connections_random_exchange, 240) {
  set_cap("4");
  rt_run_threads(32, xchg_rank, NULL);
  rt_run_procs(32, xchg_rank, NULL);
}

/* ---- one connection, two ranks, closed from both ends or by a rank that dies ---- */

/* A barrier for the two ranks of a test, threads or processes. */
static pthread_barrier_t* shared_barrier(void) {
  pthread_barrier_t* bar = mmap(NULL, sizeof(*bar), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  ASSERT(bar != MAP_FAILED);
  pthread_barrierattr_t a;
  pthread_barrierattr_init(&a);
  pthread_barrierattr_setpshared(&a, PTHREAD_PROCESS_SHARED);
  ASSERT_EQ(pthread_barrier_init(bar, &a, 2), 0);
  pthread_barrierattr_destroy(&a);
  return bar;
}

static void sendi(struct boot_state* b, int peer, int tag, int v) {
  ASSERT_EQ(boot_send(b, peer, tag, &v, sizeof(v)), CH_OK);
}
static int recvi(struct boot_state* b, int peer, int tag) {
  int v = -1;
  ASSERT_EQ(boot_recv(b, peer, tag, &v, sizeof(v)), CH_OK);
  return v;
}

/* Both ranks decide to close their connection(s) at the same moment, each with two messages to the
 * other still unread on it, then send a third on a new connection. Each reads the other's BYE where
 * it waits for BYE_ACK and closes; the third message waits for the first two. */
static void both_close_rank(int rank, int n, ncclUniqueId id, void* arg) {
  pthread_barrier_t* bar = arg;
  struct boot_state* b = NULL;
  ASSERT_EQ(boot_init(id.internal, rank, n, NULL, ut_now_ns() + 20 * SEC, &b, NULL), CH_OK);
  boot_set_deadline(b, ut_now_ns() + 20 * SEC);
  int peer = 1 - rank;
  sendi(b, peer, 1, 10 + rank);
  EXPECT_EQ(recvi(b, peer, 1), 10 + peer); /* connected both ways */
  sendi(b, peer, 2, 100);
  sendi(b, peer, 2, 101);
  pthread_barrier_wait(bar); /* neither reads anything from here... */
  EXPECT(boot_close_idle(b, peer) >= 1);
  pthread_barrier_wait(bar); /* ...to here: both BYEs are on their way */
  sendi(b, peer, 2, 102);
  for (int k = 0; k < 3; k++) EXPECT_EQ(recvi(b, peer, 2), 100 + k);
  for (int k = 0; k < 3; k++) ASSERT_EQ(boot_barrier(b), CH_OK);
  struct boot_conn_stats st;
  boot_conn_stats(b, &st);
  EXPECT_EQ(st.closing, 0);
  EXPECT(st.closed >= 1);
  EXPECT(st.crossed >= 1);
  boot_close(b);
}

TEST(bootstrap, capped_connection_closed_from_both_ends) {
  pthread_barrier_t* bar = shared_barrier();
  rt_run_threads(2, both_close_rank, bar);
  pthread_barrier_destroy(bar);
  munmap(bar, sizeof(*bar));
  bar = shared_barrier();
  rt_run_procs(2, both_close_rank, bar);
}

/* Rank 0 starts closing its connection with rank 1, and rank 1 dies (a process exits; a thread rank
 * closes its bootstrap) before or after it answers. Rank 0, waiting for rank 1, still learns that it
 * is gone, within the liveness probe's few seconds: a close never hides a dead peer. */
struct die_arg {
  pthread_barrier_t* bar;
  int answer_first; /* rank 1 answers the BYE before it dies */
};

static void die_rank(int rank, int n, ncclUniqueId id, void* arg) {
  struct die_arg* a = arg;
  struct boot_state* b = NULL;
  ASSERT_EQ(boot_init(id.internal, rank, n, NULL, ut_now_ns() + 20 * SEC, &b, NULL), CH_OK);
  boot_set_deadline(b, ut_now_ns() + 20 * SEC);
  int peer = 1 - rank;
  sendi(b, peer, 1, rank);
  EXPECT_EQ(recvi(b, peer, 1), peer);
  pthread_barrier_wait(a->bar);
  if (rank == 0) EXPECT(boot_close_idle(b, 1) >= 1);
  pthread_barrier_wait(a->bar);
  if (rank == 1) {
    if (a->answer_first) { /* read the BYE and answer it */
      int x;
      boot_set_deadline(b, ut_now_ns() + SEC / 5);
      EXPECT_EQ(boot_recv(b, 0, 9, &x, sizeof(x)), CH_TIMEOUT);
    }
    if (rt_mode()[0] == 'p') _exit(rt_failures() ? 1 : 0); /* gone at once, as a crashed process is */
    boot_close(b);
    return;
  }
  uint64_t t0 = now_ms();
  int x;
  EXPECT_EQ(boot_recv(b, 1, 9, &x, sizeof(x)), CH_REMOTE);
  EXPECT(now_ms() - t0 < 5000);
  const char* e = log_last_error();
  if (!strstr(e, "rank 1") ||
      !(strstr(e, "Connection refused") || strstr(e, "closed its bootstrap connection") || strstr(e, "has exited")))
    rt_fail(__FILE__, __LINE__, "rank 0 (%s) said: %s", rt_mode(), e);
  boot_close(b);
}

TEST(bootstrap, capped_connection_peer_dies_while_closing) {
  for (int answer = 0; answer < 2; answer++) {
    struct die_arg a = {shared_barrier(), answer};
    rt_run_threads(2, die_rank, &a);
    pthread_barrier_destroy(a.bar);
    munmap(a.bar, sizeof(*a.bar));
    a.bar = shared_barrier();
    rt_run_procs(2, die_rank, &a);
    munmap(a.bar, sizeof(*a.bar));
  }
}

/* ---- the close records from the wire ---- */

/* Rank 0 of a 16-rank job whose other ranks "listen" on port 1 of loopback (nobody does), driven by
 * this thread; the test plays ranks 1.. over raw connections that prove the key. */
struct solo {
  struct boot_key key;
  union sock_addr addrs[16];
  struct boot_state* me;
};
#define SOLO_N 16
#define SOLO_IDLE (SOLO_N - 1) /* never claimed: a short wait for it drives rank 0 */

static void solo_make(struct solo* s) {
  ASSERT_EQ(boot_key_random(&s->key), CH_OK);
  union sock_addr any;
  struct sock l = {.fd = -1};
  ASSERT_EQ(sock_parse_addr("127.0.0.1:0", &any), CH_OK);
  ASSERT_EQ(sock_listen(&any, &l), CH_OK);
  for (int r = 1; r < SOLO_N; r++) ASSERT_EQ(sock_parse_addr("127.0.0.1:1", &s->addrs[r]), CH_OK);
  s->addrs[0] = l.addr;
  ASSERT_EQ(boot_peers_create(&s->me, 0, SOLO_N, BOOT_ID_MAGIC, &s->key, s->addrs, &l, NULL, 0), CH_OK);
}

/* Let rank 0 accept and read for ms (less than the liveness probe's second). */
static void solo_drive(struct solo* s, int ms) {
  int x;
  boot_set_deadline(s->me, ut_now_ns() + (uint64_t)ms * 1000000ull);
  (void)boot_recv(s->me, SOLO_IDLE, 0, &x, sizeof(x));
}

/* Receive a message from rank `from` within ms. */
static ch_status solo_recv(struct solo* s, int from, int tag, void* buf, size_t len, int ms) {
  boot_set_deadline(s->me, ut_now_ns() + (uint64_t)ms * 1000000ull);
  return boot_recv(s->me, from, tag, buf, len);
}

static size_t read_within(int fd, void* buf, size_t n, int ms) {
  size_t got = 0;
  uint64_t end = now_ms() + (uint64_t)ms;
  while (got < n && now_ms() < end) {
    struct pollfd p = {fd, POLLIN, 0};
    if (poll(&p, 1, 20) <= 0) continue;
    ssize_t r = recv(fd, (char*)buf + got, n - got, MSG_DONTWAIT);
    if (r < 0 && (errno == EAGAIN || errno == EINTR)) continue;
    if (r <= 0) break;
    got += (size_t)r;
  }
  return got;
}

/* A connection claiming rank `from` with connection count gen; -1 if rank 0 did not answer our proof. */
static int solo_connect(struct solo* s, int from, uint32_t gen) {
  struct sock c;
  struct sock_wait w = {NULL, ut_now_ns() + 5 * SEC};
  ASSERT_EQ(sock_connect(&s->addrs[0], &c, &w), CH_OK);
  struct {
    struct boot_hello h;
    struct boot_peer_proof p;
  } first;
  ASSERT_EQ(boot_hello_init(&first.h, BOOT_KIND_PEER, (uint32_t)from, 0, SOLO_N), CH_OK);
  first.h.gen = gen;
  boot_peer_mac(&s->key, 0, &first.h, &s->addrs[0], first.p.mac);
  ASSERT(send(c.fd, &first, sizeof(first), MSG_NOSIGNAL) == (ssize_t)sizeof(first));
  solo_drive(s, 100);
  struct boot_peer_proof sp;
  if (read_within(c.fd, &sp, sizeof(sp), 1000) != sizeof(sp) ||
      !boot_peer_mac_ok(&s->key, 1, &first.h, &s->addrs[0], sp.mac)) {
    close(c.fd);
    return -1;
  }
  return c.fd;
}

static void put_rec(int fd, int32_t tag, uint32_t type, uint64_t size, uint64_t seq, const void* data) {
  struct boot_msg_hdr h = {tag, type, size, seq};
  ASSERT(send(fd, &h, sizeof(h), MSG_NOSIGNAL) == (ssize_t)sizeof(h));
  if (size && data) ASSERT(send(fd, data, size, MSG_NOSIGNAL) == (ssize_t)size);
}

/* A connection whose peer died: the kernel keeps its unacknowledged count above 0 forever once the
 * reset arrives, and boot_close's flush waited on it for its whole 5 s (a survivor's ncclCommAbort in
 * faults.kill_during_init_3, once in CI). sock_unacked counts it as nothing in flight. */
TEST(bootstrap, reset_connection_has_nothing_in_flight) {
  union sock_addr lo;
  struct sock l, c, a;
  struct sock_wait w = {0};
  ASSERT_EQ(sock_parse_addr("127.0.0.1:0", &lo), CH_OK);
  ASSERT_EQ(sock_listen(&lo, &l), CH_OK);
  ASSERT_EQ(sock_connect(&l.addr, &c, &w), CH_OK);
  ASSERT_EQ(sock_accept(&l, &a, &w), CH_OK);
  sock_close(&a); /* the peer dies */
  sock_close(&l);
  char buf[1000] = {0};
  (void)send(c.fd, buf, sizeof(buf), MSG_NOSIGNAL); /* answered by a reset */
  usleep(100000);
  (void)send(c.fd, buf, sizeof(buf), MSG_NOSIGNAL); /* EPIPE: these bytes stay counted */
  int raw = 0;
  ASSERT_EQ(ioctl(c.fd, SIOCOUTQ, &raw), 0);
  if (raw <= 0) /* then what follows holds with or without the fix */
    printf("    SKIP: this kernel clears the unacknowledged count of a reset connection itself\n");
  ASSERT_EQ(sock_unacked(c.fd), 0);
  sock_close(&c);
}

/* The peer's side of a close, message numbers across connections, and replays. */
TEST(bootstrap, close_records_from_a_peer) {
  struct solo s;
  solo_make(&s);
  /* A BYE before the handshake is read as (part of) a hello, and refused like any junk. */
  {
    struct sock c;
    struct sock_wait w = {NULL, ut_now_ns() + 5 * SEC};
    ASSERT_EQ(sock_connect(&s.addrs[0], &c, &w), CH_OK);
    unsigned char junk[sizeof(struct boot_hello) + sizeof(struct boot_peer_proof)] = {0};
    ((struct boot_msg_hdr*)junk)->type = BOOT_REC_BYE;
    ASSERT(send(c.fd, junk, sizeof(junk), MSG_NOSIGNAL) == (ssize_t)sizeof(junk));
    solo_drive(&s, 100);
    char x;
    uint64_t t0 = now_ms();
    EXPECT_EQ(read_within(c.fd, &x, 1, 1000), 0); /* closed already, with no answer */
    EXPECT(now_ms() - t0 < 500);
    close(c.fd);
  }
  /* Rank 1 sends messages 0 and 2, then closes; message 1 comes on its next connection. */
  int fd = solo_connect(&s, 1, 0);
  ASSERT(fd >= 0);
  put_rec(fd, 5, BOOT_REC_MSG, 1, 0, "a");
  put_rec(fd, 5, BOOT_REC_MSG, 1, 2, "c");
  put_rec(fd, 0, BOOT_REC_BYE, 0, 0, NULL);
  char m = 0;
  EXPECT_EQ(solo_recv(&s, 1, 5, &m, 1, 300), CH_OK);
  EXPECT_EQ(m, 'a');
  struct boot_msg_hdr ack;
  EXPECT_EQ(read_within(fd, &ack, sizeof(ack), 1000), sizeof(ack));
  EXPECT_EQ(ack.type, BOOT_REC_BYE_ACK);
  EXPECT(ack.tag == 0 && ack.size == 0 && ack.seq == 0);
  EXPECT_EQ(solo_recv(&s, 1, 5, &m, 1, 200), CH_TIMEOUT); /* message 2 waits for message 1 */
  EXPECT_EQ(read_within(fd, &m, 1, 500), 0);              /* rank 0 closed its end after answering */
  close(fd);
  EXPECT_EQ(solo_connect(&s, 1, 0), -1); /* a replayed first flight */
  fd = solo_connect(&s, 1, 1);
  ASSERT(fd >= 0);
  EXPECT_EQ(solo_connect(&s, 1, 1), -1); /* and again */
  put_rec(fd, 5, BOOT_REC_MSG, 1, 1, "b");
  EXPECT_EQ(solo_recv(&s, 1, 5, &m, 1, 300), CH_OK);
  EXPECT_EQ(m, 'b');
  EXPECT_EQ(solo_recv(&s, 1, 5, &m, 1, 300), CH_OK);
  EXPECT_EQ(m, 'c');
  /* Rank 0 closes this one (as the cap would): BYE, our answer, then its EOF. */
  EXPECT_EQ(boot_close_idle(s.me, 1), 1);
  struct boot_msg_hdr bye;
  EXPECT_EQ(read_within(fd, &bye, sizeof(bye), 1000), sizeof(bye));
  EXPECT_EQ(bye.type, BOOT_REC_BYE);
  put_rec(fd, 5, BOOT_REC_MSG, 1, 3, "d"); /* sent before we saw its BYE: still delivered */
  put_rec(fd, 0, BOOT_REC_BYE_ACK, 0, 0, NULL);
  EXPECT_EQ(solo_recv(&s, 1, 5, &m, 1, 300), CH_OK);
  EXPECT_EQ(m, 'd');
  solo_drive(&s, 50);
  EXPECT_EQ(read_within(fd, &m, 1, 500), 0);
  close(fd);
  /* A rank may answer our BYE by closing, without BYE_ACK (it finished with the bootstrap): no loss. */
  fd = solo_connect(&s, 1, 2);
  ASSERT(fd >= 0);
  EXPECT_EQ(boot_close_idle(s.me, 1), 1);
  EXPECT_EQ(read_within(fd, &bye, sizeof(bye), 1000), sizeof(bye));
  put_rec(fd, 5, BOOT_REC_MSG, 1, 4, "e");
  close(fd);
  EXPECT_EQ(solo_recv(&s, 1, 5, &m, 1, 300), CH_OK);
  EXPECT_EQ(m, 'e');
  solo_drive(&s, 50); /* sees the EOF */
  fd = solo_connect(&s, 1, 3);
  ASSERT(fd >= 0);
  put_rec(fd, 5, BOOT_REC_MSG, 1, 5, "f");
  EXPECT_EQ(solo_recv(&s, 1, 5, &m, 1, 300), CH_OK);
  EXPECT_EQ(m, 'f');
  put_rec(fd, 0, BOOT_REC_BYE, 0, 0, NULL);
  EXPECT_EQ(read_within(fd, &ack, sizeof(ack), 200), 0); /* nothing until rank 0 reads on */
  solo_drive(&s, 50);
  EXPECT_EQ(read_within(fd, &ack, sizeof(ack), 1000), sizeof(ack));
  EXPECT_EQ(ack.type, BOOT_REC_BYE_ACK);
  close(fd);
  solo_drive(&s, 50);
  struct boot_conn_stats st;
  boot_conn_stats(s.me, &st);
  EXPECT_EQ(st.closed, 4);
  EXPECT_EQ(st.open + st.closing, 0);

  /* Records that break the protocol: each drops the rank that sent it, naming why. */
  struct {
    uint32_t type;
    int32_t tag;
    uint64_t size, seq;
    const char* why;
  } bad[] = {
      {BOOT_REC_BYE_ACK, 0, 0, 0, "answered a close of its bootstrap connection that we did not start"},
      {7, 0, 0, 0, "record of an unknown kind (type 7"},
      {BOOT_REC_BYE, 0, 8, 0, "record of an unknown kind (type 1"},
      {BOOT_REC_BYE, 3, 0, 0, "record of an unknown kind (type 1"},
      {BOOT_REC_MSG, 5, 1, 1ull << 40, "sent message number 1099511627776, but 0 is due"},
  };
  for (int i = 0; i < (int)(sizeof(bad) / sizeof(bad[0])); i++) {
    int from = 2 + i;
    fd = solo_connect(&s, from, 0);
    ASSERT(fd >= 0);
    put_rec(fd, bad[i].tag, bad[i].type, bad[i].size, bad[i].seq, bad[i].size ? "12345678" : NULL);
    EXPECT_EQ(solo_recv(&s, from, 5, &m, 1, 300), CH_REMOTE);
    if (!strstr(log_last_error(), bad[i].why)) rt_fail(__FILE__, __LINE__, "case %d said: %s", i, log_last_error());
    close(fd);
  }
  /* A message number used twice, on two connections. */
  int from = 2 + (int)(sizeof(bad) / sizeof(bad[0]));
  fd = solo_connect(&s, from, 0);
  ASSERT(fd >= 0);
  put_rec(fd, 5, BOOT_REC_MSG, 1, 1, "y");
  int fd2 = solo_connect(&s, from, 1);
  ASSERT(fd2 >= 0);
  put_rec(fd2, 5, BOOT_REC_MSG, 1, 1, "z");
  EXPECT_EQ(solo_recv(&s, from, 5, &m, 1, 300), CH_REMOTE);
  EXPECT(strstr(log_last_error(), "sent message number 1 twice") != NULL);
  close(fd);
  close(fd2);
  boot_close(s.me);
}

/* ---- descriptors of many thread ranks ---- */

struct fd_watch {
  atomic_int stop;
  int peak;
};

static void* fd_sampler(void* p) {
  struct fd_watch* w = p;
  while (!atomic_load(&w->stop)) {
    int n = rt_count_fds();
    if (n > w->peak) w->peak = n;
    usleep(50000);
  }
  return NULL;
}

/* The bootstrap traffic of an AlltoAll's connection setup (core/connect.c): an offer to every rank,
 * then each offer received and answered, then every answer received. */
static void setup_rank(int rank, int n, ncclUniqueId id, void* arg) {
  (void)arg;
  struct boot_state* b = NULL;
  ASSERT_EQ(boot_init(id.internal, rank, n, NULL, ut_now_ns() + 120 * SEC, &b, NULL), CH_OK);
  boot_set_deadline(b, ut_now_ns() + 150 * SEC);
  int64_t o[8] = {0};
  for (int p = 0; p < n; p++) {
    if (p == rank) continue;
    o[0] = rank * 100000 + p;
    ASSERT_EQ(boot_send(b, p, 7, o, sizeof(o)), CH_OK);
  }
  for (int p = 0; p < n; p++) {
    if (p == rank) continue;
    ASSERT_EQ(boot_recv(b, p, 7, o, sizeof(o)), CH_OK);
    EXPECT_EQ(o[0], p * 100000 + rank);
    o[0] = -o[0];
    ASSERT_EQ(boot_send(b, p, 8, o, sizeof(o)), CH_OK);
  }
  for (int p = 0; p < n; p++) {
    if (p == rank) continue;
    ASSERT_EQ(boot_recv(b, p, 8, o, sizeof(o)), CH_OK);
    EXPECT_EQ(o[0], -(rank * 100000 + p));
  }
  ASSERT_EQ(boot_barrier(b), CH_OK);
  struct boot_conn_stats st;
  boot_conn_stats(b, &st);
  if (st.max_open > st.cap)
    rt_fail(__FILE__, __LINE__, "rank %d had %d connections open, cap %d", rank, st.max_open, st.cap);
  if (rank == 0)
    printf("    rank 0: cap %d, at most %d open (%d with those opening), %llu opened, %llu closed\n", st.cap,
           st.max_open, st.max_held, (unsigned long long)st.opened, (unsigned long long)st.closed);
  boot_close(b);
}

/* Raise this process's descriptor limit to `need` if its hard limit allows; 0 if it cannot. */
static int fds_allowed(rlim_t need) {
  struct rlimit rl;
  if (getrlimit(RLIMIT_NOFILE, &rl) != 0) return 0;
  if (rl.rlim_cur >= need) return 1;
  if (rl.rlim_max != RLIM_INFINITY && rl.rlim_max < need) return 0;
  rl.rlim_cur = need;
  return setrlimit(RLIMIT_NOFILE, &rl) == 0;
}

static void setup_threads(int n) {
  if (!fds_allowed(20000)) {
    printf("    SKIP: %d thread ranks need a descriptor limit of 20000 (ulimit -n; hard limit too low)\n", n);
    return;
  }
  struct fd_watch w = {0, 0};
  pthread_t t;
  ASSERT(pthread_create(&t, NULL, fd_sampler, &w) == 0);
  uint64_t t0 = now_ms();
  rt_run_threads(n, setup_rank, NULL);
  atomic_store(&w.stop, 1);
  pthread_join(t, NULL);
  printf("    %d thread ranks: %llu ms, at most %d descriptors\n", n, (unsigned long long)(now_ms() - t0), w.peak);
}

/* 512 thread ranks of one process (issue 44): without the cap, N^2 = 262,144 descriptors. */
TEST_T(scale, boot_setup_traffic_512_threads, 300) { setup_threads(512); }
