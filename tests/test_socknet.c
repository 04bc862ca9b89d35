/* Chorus's socket network behind NCCL's net interface (net/sock_net.c), as a table: its wire decoders
 * (handles, hellos, message headers) with the values each must refuse, then a connection in one
 * process on lo: messages of many sizes, grouped receives matched by tag, a message larger than its
 * receive, a peer that closes, a stranger's connection to the listener, bad arguments. The fabric
 * transport over it is tested in test_fabric.c (the _socknet variants). */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "misc/param.h"
#include "net/sock_net.h"
#include "runner.h"

static const ncclNet_v12_t* T = &ch_sock_net;

static uint64_t now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* ---- wire ---- */

static struct sn_handle v4_handle(void) {
  struct sn_handle h;
  memset(&h, 0, sizeof(h));
  h.addr.sin.sin_family = AF_INET;
  h.addr.sin.sin_port = htons(4242);
  h.addr.sin.sin_addr.s_addr = htonl(0x0a000001);
  h.nonce = 0x1122334455667788ull;
  return h;
}

TEST(socknet, handle_roundtrip_and_refusals) {
  unsigned char buf[NCCL_NET_HANDLE_MAXSIZE];
  struct sn_handle h = v4_handle(), out;
  const char* why = NULL;
  ASSERT(sn_handle_encode(&h, buf, sizeof(buf)) == 0);
  ASSERT(sn_handle_decode(buf, sizeof(buf), &out, &why) == 0);
  EXPECT(out.addr.sin.sin_family == AF_INET && out.addr.sin.sin_port == htons(4242));
  EXPECT(out.addr.sin.sin_addr.s_addr == htonl(0x0a000001) && out.nonce == h.nonce);

  struct sn_handle h6;
  memset(&h6, 0, sizeof(h6));
  h6.addr.sin6.sin6_family = AF_INET6;
  h6.addr.sin6.sin6_port = htons(7);
  h6.addr.sin6.sin6_addr.s6_addr[15] = 1;
  h6.addr.sin6.sin6_scope_id = 3;
  ASSERT(sn_handle_encode(&h6, buf, sizeof(buf)) == 0);
  ASSERT(sn_handle_decode(buf, sizeof(buf), &out, &why) == 0);
  EXPECT(out.addr.sin6.sin6_family == AF_INET6 && out.addr.sin6.sin6_scope_id == 3);
  EXPECT(out.addr.sin6.sin6_addr.s6_addr[15] == 1);

  /* each corruption refused, with a reason, and nothing left in out */
  struct { int at; unsigned char v; const char* expect; } bad[] = {
      {0, 0x00, "magic"}, {4, 2, "version"}, {6, 5, "family"}, {8, 0, "port"}, {10, 1, "reserved"},
      {20, 1, "IPv6 bytes"}, {12, 1, "IPv6 bytes"}};
  for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
    ASSERT(sn_handle_encode(&h, buf, sizeof(buf)) == 0);
    buf[bad[i].at] = bad[i].v;
    if (bad[i].at == 8) buf[9] = 0;
    why = NULL;
    EXPECT(sn_handle_decode(buf, sizeof(buf), &out, &why) == -1);
    EXPECT(why != NULL);
    EXPECT(out.addr.sa.sa_family == 0 && out.nonce == 0);
  }
  EXPECT(sn_handle_decode(buf, SN_HANDLE_BYTES - 1, &out, &why) == -1);
  h.addr.sin.sin_addr.s_addr = htonl(INADDR_ANY);
  ASSERT(sn_handle_encode(&h, buf, sizeof(buf)) == 0);
  EXPECT(sn_handle_decode(buf, sizeof(buf), &out, &why) == -1 && strstr(why, "wildcard"));
  h.addr.sa.sa_family = AF_UNIX;
  EXPECT(sn_handle_encode(&h, buf, sizeof(buf)) == -1);
}

TEST(socknet, hello_and_message_headers) {
  unsigned char m[SN_HELLO_BYTES];
  const char* why;
  sn_hello_encode(77, m);
  EXPECT(sn_hello_check(m, 77, &why) == 0);
  EXPECT(sn_hello_check(m, 78, &why) == -1 && strstr(why, "nonce"));
  m[0] ^= 1;
  EXPECT(sn_hello_check(m, 77, &why) == -1);

  unsigned char h[SN_MSG_BYTES];
  int tags[3] = {5, 6, 5};
  size_t caps[3] = {100, 200, 300};
  unsigned char filled[3] = {0, 0, 0};
  int idx, tag;
  uint64_t size;
  sn_msg_encode(5, 100, h);
  ASSERT(sn_msg_decode(h, &tag, &size, &why) == 0 && tag == 5 && size == 100);
  EXPECT(sn_group_pick(3, tags, caps, filled, tag, size, &idx, &why) == 0 && idx == 0);
  filled[0] = 1; /* the second buffer of tag 5 takes the next one */
  EXPECT(sn_group_pick(3, tags, caps, filled, 5, 300, &idx, &why) == 0 && idx == 2);
  EXPECT(sn_group_pick(3, tags, caps, filled, 6, 201, &idx, &why) == -1 && strstr(why, "larger") && idx == -1);
  EXPECT(sn_group_pick(3, tags, caps, filled, 9, 1, &idx, &why) == 1 && idx == -1); /* a later receive's */
  filled[2] = 1;
  EXPECT(sn_group_pick(3, tags, caps, filled, 5, 1, &idx, &why) == 1); /* both of tag 5 filled already */
  EXPECT(sn_group_pick(3, tags, caps, filled, 6, (uint64_t)-1, &idx, &why) == -1); /* a size no buffer has */
  EXPECT(sn_group_pick(0, tags, caps, filled, 6, 0, &idx, &why) == -1);
  EXPECT(sn_group_pick(SN_MAX_RECVS + 1, tags, caps, filled, 6, 0, &idx, &why) == -1);
  sn_msg_encode(6, 0, h);
  h[1] ^= 0x40; /* out of step */
  EXPECT(sn_msg_decode(h, &tag, &size, &why) == -1 && strstr(why, "magic"));
}

/* ---- one connection on lo ---- */

struct pair {
  void *ctx, *lc, *sc, *rc, *smh, *rmh;
  char handle[NCCL_NET_HANDLE_MAXSIZE];
};

static void pair_open(struct pair* p) {
  setenv("NCCL_SOCKET_IFNAME", "lo", 1);
  param_reset();
  memset(p, 0, sizeof(*p));
  ASSERT(T->init(&p->ctx, 0, NULL, NULL, NULL) == ncclSuccess);
  int n = 0;
  ASSERT(T->devices(&n) == ncclSuccess && n >= 1);
  ncclNetProperties_v12_t props;
  ASSERT(T->getProperties(0, &props) == ncclSuccess);
  EXPECT(props.maxRecvs == SN_MAX_RECVS && props.ptrSupport == NCCL_PTR_HOST && !strcmp(props.name, "lo"));
  ASSERT(T->listen(p->ctx, 0, p->handle, &p->lc) == ncclSuccess && p->lc);
  uint64_t end = now_ns() + 10000000000ull;
  while (!p->sc || !p->rc) {
    if (!p->sc) ASSERT(T->connect(p->ctx, 0, p->handle, &p->sc, NULL) == ncclSuccess);
    if (!p->rc) ASSERT(T->accept(p->lc, &p->rc, NULL) == ncclSuccess);
    ASSERT(now_ns() < end);
  }
  ASSERT(T->regMr(p->sc, NULL, 0, NCCL_PTR_HOST, &p->smh) == ncclSuccess && p->smh);
  ASSERT(T->regMr(p->rc, NULL, 0, NCCL_PTR_HOST, &p->rmh) == ncclSuccess);
}

static void pair_close(struct pair* p) {
  if (p->sc) EXPECT(T->closeSend(p->sc) == ncclSuccess);
  if (p->rc) EXPECT(T->closeRecv(p->rc) == ncclSuccess);
  EXPECT(T->closeListen(p->lc) == ncclSuccess);
  EXPECT(T->finalize(p->ctx) == ncclSuccess);
}

/* Tests both requests until both are done (or one fails: its result); sizes of the receive. */
static ncclResult_t wait_both(void* sreq, void* rreq, int* rsizes) {
  int sd = sreq == NULL, rd = rreq == NULL, sz[SN_MAX_RECVS];
  uint64_t end = now_ns() + 10000000000ull;
  while (!sd || !rd) {
    ncclResult_t r;
    if (!sd && (r = T->test(sreq, &sd, sz)) != ncclSuccess) return r;
    if (!rd && (r = T->test(rreq, &rd, rsizes)) != ncclSuccess) return r;
    if (now_ns() > end) return ncclInternalError;
  }
  return ncclSuccess;
}

TEST(socknet, messages_of_many_sizes) {
  struct pair p;
  pair_open(&p);
  static const size_t sizes[] = {0, 1, 7, 16, 4095, 4096, 4097, 65536, 1 << 20, 3 << 20};
  char* s = malloc(3 << 20);
  char* r = malloc((3 << 20) + 64);
  ASSERT(s && r);
  for (size_t k = 0; k < sizeof(sizes) / sizeof(sizes[0]); k++) {
    size_t n = sizes[k];
    for (size_t i = 0; i < n; i++) s[i] = (char)(i * 7 + k);
    memset(r, 0xEE, n + 64);
    void *sreq = NULL, *rreq = NULL;
    void* data = r;
    size_t cap = n + 64; /* the receive may be larger than the message */
    int tag = 3, got = -1;
    ASSERT(T->irecv(p.rc, 1, &data, &cap, &tag, &p.rmh, NULL, &rreq) == ncclSuccess && rreq);
    ASSERT(T->isend(p.sc, s, n, 3, p.smh, NULL, &sreq) == ncclSuccess && sreq);
    ASSERT(wait_both(sreq, rreq, &got) == ncclSuccess);
    EXPECT_EQ(got, (int)n);
    EXPECT(memcmp(s, r, n) == 0);
    EXPECT((unsigned char)r[n] == 0xEE); /* nothing written past the message */
  }
  /* many small messages in flight before any receive: they wait in the socket */
  void* sreqs[20];
  for (int i = 0; i < 20; i++) {
    s[i] = (char)i;
    ASSERT(T->isend(p.sc, s + i, 1, 3, p.smh, NULL, &sreqs[i]) == ncclSuccess && sreqs[i]);
  }
  for (int i = 0; i < 20; i++) {
    void* rreq = NULL;
    void* data = r + i;
    size_t cap = 1;
    int tag = 3, got = -1;
    ASSERT(T->irecv(p.rc, 1, &data, &cap, &tag, &p.rmh, NULL, &rreq) == ncclSuccess && rreq);
    ASSERT(wait_both(sreqs[i], rreq, &got) == ncclSuccess);
    EXPECT(got == 1 && r[i] == (char)i);
  }
  void* freq = NULL;
  ASSERT(T->iflush(p.rc, 1, NULL, NULL, NULL, &freq) == ncclSuccess && freq);
  int done = 0;
  EXPECT(T->test(freq, &done, NULL) == ncclSuccess && done);
  free(s), free(r);
  pair_close(&p);
}

TEST(socknet, grouped_receive_matches_tags) {
  struct pair p;
  pair_open(&p);
  enum { N = SN_MAX_RECVS };
  int bufs[N], tags[N], vals[N], sz[N];
  void* data[N];
  size_t caps[N];
  for (int i = 0; i < N; i++) data[i] = &bufs[i], caps[i] = sizeof(int), tags[i] = 100 + i, bufs[i] = -1;
  void* rreq = NULL;
  ASSERT(T->irecv(p.rc, N, data, caps, tags, NULL, NULL, &rreq) == ncclSuccess && rreq);
  void* sreq[N];
  for (int i = N - 1; i >= 0; i--) { /* in reverse tag order */
    vals[i] = 1000 + i;
    ASSERT(T->isend(p.sc, &vals[i], i % 2 ? sizeof(int) : 0, 100 + i, NULL, NULL, &sreq[i]) == ncclSuccess && sreq[i]);
  }
  for (int i = 0; i < N; i++) ASSERT(wait_both(sreq[i], i == 0 ? rreq : NULL, sz) == ncclSuccess);
  for (int i = 0; i < N; i++) {
    EXPECT_EQ(sz[i], i % 2 ? (int)sizeof(int) : 0);
    EXPECT_EQ(bufs[i], i % 2 ? 1000 + i : -1);
  }
  /* n out of range */
  EXPECT(T->irecv(p.rc, 0, data, caps, tags, NULL, NULL, &rreq) == ncclInvalidArgument);
  EXPECT(T->irecv(p.rc, N + 1, data, caps, tags, NULL, NULL, &rreq) == ncclInvalidArgument);
  void* mh = NULL;
  EXPECT(T->regMr(p.sc, bufs, sizeof(bufs), NCCL_PTR_CUDA, &mh) == ncclInvalidArgument && !mh);
  pair_close(&p);
}

/* Messages of one tag run ahead of another's (two senders sharing a comm): each goes to the oldest
 * receive with an unfilled buffer of its tag, and one whose receive is not posted yet waits for it. */
TEST(socknet, a_tag_running_ahead_waits_for_its_receive) {
  struct pair p;
  pair_open(&p);
  int a[3], b[3], vals[3] = {10, 11, 20};
  int stags[3] = {1, 1, 2}; /* the wire: A0, A1, B0 */
  void* sreq[3];
  for (int i = 0; i < 3; i++) ASSERT(T->isend(p.sc, &vals[i], sizeof(int), stags[i], NULL, NULL, &sreq[i]) == ncclSuccess && sreq[i]);
  int tags[2] = {1, 2}, sz[2];
  size_t caps[2] = {sizeof(int), sizeof(int)};
  void* g0[2] = {&a[0], &b[0]};
  void* g1[2] = {&a[1], &b[1]};
  void *r0 = NULL, *r1 = NULL;
  ASSERT(T->irecv(p.rc, 2, g0, caps, tags, NULL, NULL, &r0) == ncclSuccess && r0);
  /* group 0 cannot complete before group 1 is posted: B0 is behind A1 on the wire */
  int done = 0;
  for (int i = 0; i < 50 && !done; i++) {
    ASSERT(T->test(r0, &done, sz) == ncclSuccess);
    usleep(1000);
  }
  EXPECT(!done);
  ASSERT(T->irecv(p.rc, 2, g1, caps, tags, NULL, NULL, &r1) == ncclSuccess && r1);
  for (int i = 0; i < 3; i++) ASSERT(wait_both(sreq[i], NULL, sz) == ncclSuccess);
  ASSERT(wait_both(NULL, r0, sz) == ncclSuccess);
  EXPECT(a[0] == 10 && b[0] == 20 && sz[0] == (int)sizeof(int) && sz[1] == (int)sizeof(int));
  int vb = 21;
  void* sb = NULL;
  ASSERT(T->isend(p.sc, &vb, sizeof(int), 2, NULL, NULL, &sb) == ncclSuccess && sb);
  ASSERT(wait_both(sb, r1, sz) == ncclSuccess);
  EXPECT(a[1] == 11 && b[1] == 21);
  pair_close(&p);
}

TEST(socknet, oversized_message_fails_the_comm) {
  struct pair p;
  pair_open(&p);
  char s[64] = {0}, r[16];
  void *sreq = NULL, *rreq = NULL, *data = r;
  size_t cap = sizeof(r);
  int tag = 1, got;
  ASSERT(T->irecv(p.rc, 1, &data, &cap, &tag, NULL, NULL, &rreq) == ncclSuccess && rreq);
  ASSERT(T->isend(p.sc, s, sizeof(s), 1, NULL, NULL, &sreq) == ncclSuccess && sreq);
  EXPECT(wait_both(sreq, rreq, &got) == ncclRemoteError);
  /* the comm stays failed: later calls say so */
  EXPECT(T->irecv(p.rc, 1, &data, &cap, &tag, NULL, NULL, &rreq) == ncclRemoteError);
  pair_close(&p);
}

TEST(socknet, closed_peer_fails_the_receive) {
  struct pair p;
  pair_open(&p);
  char r[16];
  void *rreq = NULL, *data = r;
  size_t cap = sizeof(r);
  int tag = 1, got;
  ASSERT(T->irecv(p.rc, 1, &data, &cap, &tag, NULL, NULL, &rreq) == ncclSuccess && rreq);
  ASSERT(T->closeSend(p.sc) == ncclSuccess);
  p.sc = NULL;
  EXPECT(wait_both(NULL, rreq, &got) == ncclRemoteError);
  pair_close(&p);
}

TEST(socknet, stranger_is_turned_away) {
  setenv("NCCL_SOCKET_IFNAME", "lo", 1);
  param_reset();
  void *ctx = NULL, *lc = NULL, *rc = NULL, *sc = NULL;
  char handle[NCCL_NET_HANDLE_MAXSIZE];
  ASSERT(T->init(&ctx, 0, NULL, NULL, NULL) == ncclSuccess);
  ASSERT(T->listen(ctx, 0, handle, &lc) == ncclSuccess);
  struct sn_handle h;
  const char* why;
  ASSERT(sn_handle_decode(handle, sizeof(handle), &h, &why) == 0);
  /* A connection with a hello of the wrong nonce, then one that closes before its hello. */
  for (int k = 0; k < 2; k++) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    ASSERT(fd >= 0 && connect(fd, &h.addr.sa, sizeof(h.addr.sin)) == 0);
    unsigned char m[SN_HELLO_BYTES];
    sn_hello_encode(h.nonce + 1, m);
    if (k == 0) ASSERT(write(fd, m, sizeof(m)) == (ssize_t)sizeof(m));
    usleep(20000);
    EXPECT(T->accept(lc, &rc, NULL) == ncclSuccess && rc == NULL);
    close(fd);
    usleep(20000);
    EXPECT(T->accept(lc, &rc, NULL) == ncclSuccess && rc == NULL);
  }
  /* The real peer still gets in. */
  uint64_t end = now_ns() + 10000000000ull;
  while (!sc || !rc) {
    if (!sc) ASSERT(T->connect(ctx, 0, handle, &sc, NULL) == ncclSuccess);
    if (!rc) ASSERT(T->accept(lc, &rc, NULL) == ncclSuccess);
    ASSERT(now_ns() < end);
  }
  EXPECT(T->closeSend(sc) == ncclSuccess && T->closeRecv(rc) == ncclSuccess && T->closeListen(lc) == ncclSuccess);
  /* A handle of garbage is refused before anything is opened. */
  memset(handle, 0x5a, sizeof(handle));
  EXPECT(T->connect(ctx, 0, handle, &sc, NULL) == ncclInvalidArgument);
  EXPECT(T->accept(NULL, &rc, NULL) == ncclInvalidArgument);
  EXPECT(T->finalize(ctx) == ncclSuccess);
}
