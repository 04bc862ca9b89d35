/* Security of the bootstrap (docs/SECURITY.md): SHA-256/HMAC vectors, job secrets, impostors of
 * another uid, ranks with different secrets, hostile bytes and idle connections at the root and at
 * a rank, and first contact with a rank that has exited. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <limits.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "bootstrap/boot_internal.h"
#include "bootstrap/bootstrap.h"
#include "misc/log.h"
#include "misc/param.h"
#include "misc/sha256.h"
#include "misc/socket.h"
#include "misc/utils.h"
#include "chorus.h"
#include "runner.h"

#define SEC 1000000000ull

static uint64_t now_ms(void) { return ut_now_ns() / 1000000; }

static void hex(const unsigned char* d, size_t n, char* out) {
  for (size_t i = 0; i < n; i++) snprintf(out + 2 * i, 3, "%02x", d[i]);
}

static void unhex(const char* s, unsigned char* out, size_t* n) {
  size_t k = 0;
  for (; s[0] && s[1]; s += 2) {
    unsigned v;
    sscanf(s, "%2x", &v);
    out[k++] = (unsigned char)v;
  }
  *n = k;
}

/* ---- SHA-256 (FIPS 180-4 examples) and HMAC-SHA256 (RFC 4231) ---- */

TEST(security, sha256_hmac_vectors) {
  unsigned char d[32];
  char h[65];
  sha256("abc", 3, d);
  hex(d, 32, h);
  EXPECT(!strcmp(h, "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"));
  sha256("", 0, d);
  hex(d, 32, h);
  EXPECT(!strcmp(h, "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"));
  const char* m2 = "abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq";
  sha256(m2, strlen(m2), d);
  hex(d, 32, h);
  EXPECT(!strcmp(h, "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1"));
  struct sha256 s; /* a million 'a', fed in uneven pieces */
  sha256_init(&s);
  char a[1000];
  memset(a, 'a', sizeof(a));
  for (int i = 0, left = 1000000; left > 0; i++) {
    int n = 1 + (i * 37) % 997;
    if (n > left) n = left;
    sha256_update(&s, a, (size_t)n);
    left -= n;
  }
  sha256_final(&s, d);
  hex(d, 32, h);
  EXPECT(!strcmp(h, "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0"));

  static const struct {
    const char *key, *data, *mac; /* hex */
  } v[] = {
      {"0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b", "4869205468657265",
       "b0344c61d8db38535ca8afceaf0bf12b881dc200c9833da726e9376c2e32cff7"},
      {"4a656665", "7768617420646f2079612077616e7420666f72206e6f7468696e673f",
       "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843"},
      {"aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa",
       "dddddddddddddddddddddddddddddddddddddddddddddddddddddddddddddddddddddddddddddddddddddddddddddddddddd",
       "773ea91e36800e46854db8ebd09181a72959098b3ef8c122d9635514ced565fe"},
      {"0102030405060708090a0b0c0d0e0f10111213141516171819",
       "cdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcd",
       "82558a389a443c0ea4cc819899f2083a85f0faa3e578f8077a2e3ff46729665b"},
      {"0c0c0c0c0c0c0c0c0c0c0c0c0c0c0c0c0c0c0c0c", "546573742057697468205472756e636174696f6e",
       "a3b6167473100ee06e0c796c2955552b"}, /* case 5: truncated to 128 bits */
      {"aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"
       "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa",
       "54657374205573696e67204c6172676572205468616e20426c6f636b2d53697a65204b6579202d2048617368204b6579204669727374",
       "60e431591ee0b67f0d8a26aacbf5b77f8e0bc6213728c5140546040f0ee37f54"},
      {"aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"
       "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa",
       "5468697320697320612074657374207573696e672061206c6172676572207468616e20626c6f636b2d73697a65206b657920616e642061"
       "206c6172676572207468616e20626c6f636b2d73697a6520646174612e20546865206b6579206e6565647320746f20626520686173686564"
       "206265666f7265206265696e6720757365642062792074686520484d414320616c676f726974686d2e",
       "9b09ffa71b942fcb27635fbcd5b0e944bfdc63644f0713938a7f51535c3a35e2"},
  };
  for (size_t i = 0; i < sizeof(v) / sizeof(v[0]); i++) {
    unsigned char key[200], data[300], mac[32];
    size_t kn, dn;
    unhex(v[i].key, key, &kn);
    unhex(v[i].data, data, &dn);
    const void* parts[2] = {data, data + dn / 3}; /* split: the MAC covers the concatenation */
    size_t lens[2] = {dn / 3, dn - dn / 3};
    hmac_sha256(key, kn, 2, parts, lens, mac);
    hex(mac, 32, h);
    if (strncmp(h, v[i].mac, strlen(v[i].mac)) != 0) rt_fail(__FILE__, __LINE__, "RFC 4231 case %zu: %s", i + 1, h);
  }
  EXPECT(ct_memcmp("abcd", "abcd", 4) == 0);
  EXPECT(ct_memcmp("abcd", "abce", 4) != 0);
}

/* ---- secrets from the environment ---- */

static void id_key(const void* id128, struct boot_key* k) {
  struct boot_id id;
  memcpy(&id, id128, sizeof(id));
  memcpy(k->k, id.key, 32);
  k->mode = id.mode;
}

TEST(security, secret_sources) {
  ncclUniqueId a, b, c;
  unsetenv("CHORUS_SECRET");
  unsetenv("CHORUS_SECRET_FILE");
  param_reset();
  ASSERT_EQ(boot_id_from_addr("127.0.0.1:1234", a.internal), CH_OK);
  struct boot_key ka, kb, kc;
  id_key(a.internal, &ka);
  EXPECT_EQ(ka.mode, BOOT_AUTH_UID); /* no secret: public key, same-uid rule */

  setenv("CHORUS_SECRET", "0123456789abcdef0123456789abcdef", 1);
  ASSERT_EQ(boot_id_from_addr("127.0.0.1:1234", b.internal), CH_OK);
  id_key(b.internal, &kb);
  EXPECT_EQ(kb.mode, BOOT_AUTH_SECRET);
  EXPECT(memcmp(ka.k, kb.k, 32) != 0);

  char path[] = "/tmp/chorus-secret-XXXXXX";
  int fd = mkstemp(path);
  ASSERT(fd >= 0);
  const char* text = "0123456789abcdef0123456789abcdef\n"; /* trailing newline ignored */
  ASSERT(write(fd, text, strlen(text)) == (ssize_t)strlen(text));
  close(fd);
  unsetenv("CHORUS_SECRET");
  setenv("CHORUS_SECRET_FILE", path, 1);
  param_reset();
  ASSERT_EQ(chmod(path, 0600), 0);
  ASSERT_EQ(boot_id_from_addr("127.0.0.1:1234", c.internal), CH_OK);
  id_key(c.internal, &kc);
  EXPECT_EQ(kc.mode, BOOT_AUTH_SECRET);
  EXPECT(memcmp(kb.k, kc.k, 32) == 0); /* same secret, same key, whichever way it came */

  ASSERT_EQ(chmod(path, 0644), 0);
  EXPECT_EQ(boot_id_from_addr("127.0.0.1:1234", c.internal), CH_INVALID_USAGE);
  EXPECT(strstr(log_last_error(), "readable or writable by group or others") != NULL);
  unlink(path);
  EXPECT_EQ(boot_id_from_addr("127.0.0.1:1234", c.internal), CH_INVALID_USAGE);
  unsetenv("CHORUS_SECRET_FILE");
  param_reset();
  setenv("CHORUS_SECRET", "short", 1);
  EXPECT_EQ(boot_id_from_addr("127.0.0.1:1234", c.internal), CH_INVALID_USAGE);
  unsetenv("CHORUS_SECRET");

  /* Random ids: fresh keys, never the public one. */
  ASSERT_EQ(boot_get_unique_id(a.internal), CH_OK);
  ASSERT_EQ(boot_get_unique_id(b.internal), CH_OK);
  id_key(a.internal, &ka);
  id_key(b.internal, &kb);
  EXPECT_EQ(ka.mode, BOOT_AUTH_SECRET);
  EXPECT(memcmp(ka.k, kb.k, 32) != 0);
}

/* ---- raw clients: what an impostor or a broken program can send ---- */

static int raw_connect(const union sock_addr* a) {
  struct sock s;
  struct sock_wait w = {NULL, ut_now_ns() + 5 * SEC};
  return sock_connect(a, &s, &w) == CH_OK ? s.fd : -1;
}

/* Read exactly n bytes within ms; returns bytes read (fewer on EOF/timeout). */
static size_t read_within(int fd, void* buf, size_t n, int ms) {
  size_t got = 0;
  uint64_t end = now_ms() + (uint64_t)ms;
  while (got < n && now_ms() < end) {
    struct pollfd p = {fd, POLLIN, 0};
    if (poll(&p, 1, 50) <= 0) continue;
    ssize_t r = recv(fd, (char*)buf + got, n - got, 0);
    if (r < 0 && (errno == EAGAIN || errno == EINTR)) continue;
    if (r <= 0) break;
    got += (size_t)r;
  }
  return got;
}

/* Join the root at `root` with `key` as far as it lets us. Returns: 0 closed before the root's
 * proof, 1 the root's proof did not check out with our key, 2 closed after our proof and join
 * (rejected), 3 got an error reply, 4 got its next rank (admitted). */
static int try_join(const union sock_addr* root, const struct boot_key* key, const struct boot_join* j) {
  int fd = raw_connect(root);
  if (fd < 0) return 0;
  struct boot_hello h;
  boot_hello_init(&h, BOOT_KIND_JOIN, sizeof(struct boot_rank_info), 0, (uint32_t)j->info.nranks);
  int res = 0;
  struct boot_srv_proof sp;
  if (send(fd, &h, sizeof(h), MSG_NOSIGNAL) != (ssize_t)sizeof(h) || read_within(fd, &sp, sizeof(sp), 3000) != sizeof(sp))
    goto out;
  res = 1;
  if (!boot_mac_ok(key, 1, &h, sp.nonce, sp.mac)) goto out;
  struct boot_cli_proof cp;
  boot_mac(key, 0, &h, sp.nonce, cp.mac);
  if (send(fd, &cp, sizeof(cp), MSG_NOSIGNAL) != (ssize_t)sizeof(cp)) goto out;
  res = 2;
  if (send(fd, j, sizeof(*j), MSG_NOSIGNAL) != (ssize_t)sizeof(*j)) goto out;
  struct boot_reply rep;
  int got = read_within(fd, &rep, sizeof(rep), 3000) == sizeof(rep);
  if (got && rep.type == BOOT_REPLY_ACCEPTED) got = read_within(fd, &rep, sizeof(rep), 3000) == sizeof(rep);
  if (got) res = rep.type == BOOT_REPLY_NEXT ? 4 : 3;
out:
  close(fd);
  return res;
}

/* Claim rank `from` at the listener of rank `to`. Returns 0 rejected (closed before the callee's
 * proof), 1 the callee proved itself (admitted, or at least answered). */
static int try_peer(const union sock_addr* at, const struct boot_key* key, int from, int to, int nranks) {
  int fd = raw_connect(at);
  if (fd < 0) return 0;
  struct {
    struct boot_hello h;
    struct boot_peer_proof p;
  } first;
  boot_hello_init(&first.h, BOOT_KIND_PEER, (uint32_t)from, (uint32_t)to, (uint32_t)nranks);
  boot_peer_mac(key, 0, &first.h, at, first.p.mac);
  int res = 0;
  struct boot_peer_proof sp;
  if (send(fd, &first, sizeof(first), MSG_NOSIGNAL) == (ssize_t)sizeof(first) &&
      read_within(fd, &sp, sizeof(sp), 3000) == sizeof(sp))
    res = 1;
  close(fd);
  return res;
}

static void fill_join(struct boot_join* j, int rank, int nranks) {
  memset(j, 0, sizeof(*j));
  j->info.rank = rank;
  j->info.nranks = nranks;
  j->info.lib_version = 1;
  j->nroots = 1; /* one id, as ncclCommInitRank has */
  j->info.nids = 1;
  snprintf(j->info.hostname, sizeof(j->info.hostname), "impostor");
  union sock_addr a;
  sock_parse_addr("127.0.0.1:9", &a);
  j->info.listen_addr = a;
}

/* ---- impostor of another uid ---- */

struct job {
  ncclUniqueId id;
  struct boot_rank_info* peers; /* from rank 0 */
  volatile int phase;           /* 1: rank 0 waits at the root; 2: all joined; 3: impostor done */
  ch_status st[3];
};

static void job_exercise(struct boot_state* b, int rank, int nranks) {
  int v[8] = {0};
  v[rank] = rank + 10;
  ASSERT_EQ(boot_allgather(b, v, sizeof(int)), CH_OK);
  for (int r = 0; r < nranks; r++) EXPECT_EQ(v[r], r + 10);
  ASSERT_EQ(boot_barrier(b), CH_OK);
}

static void* job_rank0(void* p) {
  struct job* j = p;
  struct boot_state* b = NULL;
  struct boot_rank_info* peers = NULL;
  __atomic_store_n(&j->phase, 1, __ATOMIC_RELEASE);
  j->st[0] = boot_init(j->id.internal, 0, 2, NULL, ut_now_ns() + 30 * SEC, &b, &peers);
  j->peers = peers; /* NULL on failure; published by phase 2 */
  __atomic_store_n(&j->phase, 2, __ATOMIC_RELEASE);
  if (j->st[0] != CH_OK) return NULL;
  /* Keep the bootstrap progressing (so the impostor's connection is seen) until it is done. */
  int x = 0;
  boot_set_deadline(b, ut_now_ns() + 30 * SEC);
  j->st[2] = boot_recv(b, 1, 77, &x, sizeof(x));
  if (j->st[2] == CH_OK) job_exercise(b, 0, 2);
  boot_close(b);
  return NULL;
}

static void* job_rank1(void* p) {
  struct job* j = p;
  struct boot_state* b = NULL;
  j->st[1] = boot_init(j->id.internal, 1, 2, NULL, ut_now_ns() + 30 * SEC, &b, NULL);
  if (j->st[1] != CH_OK) return NULL;
  while (__atomic_load_n(&j->phase, __ATOMIC_ACQUIRE) < 3) usleep(10000);
  int x = 5;
  EXPECT_EQ(boot_send(b, 0, 77, &x, sizeof(x)), CH_OK);
  job_exercise(b, 1, 2);
  boot_close(b);
  return NULL;
}

/* Fork a process that drops to uid/gid 65534 (nobody) and runs fn; returns its exit code, 77 if
 * it could not switch. */
static int as_nobody(int (*fn)(void*), void* arg) {
  pid_t pid = fork();
  if (pid == 0) {
    if (setgroups(0, NULL) != 0 || setresgid(65534, 65534, 65534) != 0 || setresuid(65534, 65534, 65534) != 0) _exit(77);
    _exit(fn(arg));
  }
  int st = 0;
  waitpid(pid, &st, 0);
  return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

struct impostor {
  struct boot_key key;       /* what the impostor can know: the public key, or a wrong one */
  union sock_addr root, peer; /* rank 0's root and its listener */
  int at_root;
};

/* Exit 0 if rejected (nothing learned, nothing admitted), 1 if admitted. */
static int impostor_main(void* p) {
  struct impostor* im = p;
  if (im->at_root) {
    struct boot_join j;
    fill_join(&j, 1, 2);
    int r = try_join(&im->root, &im->key, &j);
    return r >= 3 ? 1 : 0;
  }
  return try_peer(&im->peer, &im->key, 1, 0, 2) ? 1 : 0;
}

static void impostor_job(int with_secret) {
  if (geteuid() != 0) {
    printf("    SKIP: switching to uid nobody needs root (running as uid %u)\n", (unsigned)geteuid());
    return;
  }
  char addr[64];
  struct sock l;
  union sock_addr lo;
  ASSERT_EQ(sock_parse_addr("127.0.0.1:0", &lo), CH_OK);
  ASSERT_EQ(sock_listen(&lo, &l), CH_OK);
  snprintf(addr, sizeof(addr), "127.0.0.1:%d", sock_addr_port(&l.addr));
  sock_close(&l);
  if (with_secret) setenv("CHORUS_SECRET", "a-job-secret-nobody-else-knows-0123", 1);
  else unsetenv("CHORUS_SECRET");
  unsetenv("CHORUS_SECRET_FILE");
  param_reset();
  struct job j;
  memset(&j, 0, sizeof(j));
  ASSERT_EQ(boot_id_from_addr(addr, j.id.internal), CH_OK);
  struct impostor im;
  memset(&im, 0, sizeof(im));
  /* The impostor knows everything public: the address, hence the key of a job without a secret. */
  unsetenv("CHORUS_SECRET");
  param_reset();
  ncclUniqueId pub;
  ASSERT_EQ(boot_id_from_addr(addr, pub.internal), CH_OK);
  id_key(pub.internal, &im.key);
  sock_parse_addr(addr, &im.root);

  pthread_t t0, t1;
  ASSERT(pthread_create(&t0, NULL, job_rank0, &j) == 0);
  while (__atomic_load_n(&j.phase, __ATOMIC_ACQUIRE) < 1) usleep(1000);
  usleep(200000); /* the root is up, waiting for rank 1 */
  im.at_root = 1;
  int rc = as_nobody(impostor_main, &im);
  if (rc == 77) {
    printf("    SKIP: cannot switch to uid 65534 here\n");
    im.at_root = 0;
  } else {
    EXPECT_EQ(rc, 0); /* rejected at the root */
  }
  ASSERT(pthread_create(&t1, NULL, job_rank1, &j) == 0);
  while (__atomic_load_n(&j.phase, __ATOMIC_ACQUIRE) < 2) usleep(1000);
  if (rc != 77 && j.peers) {
    im.at_root = 0;
    im.peer = j.peers[0].listen_addr;
    EXPECT_EQ(as_nobody(impostor_main, &im), 0); /* rejected by rank 0 */
    if (with_secret) {
      /* Without a secret, the same uid is admitted by design; with one, it must know the secret. */
      EXPECT_EQ(impostor_main(&im), 0);
      im.at_root = 1;
    }
  }
  __atomic_store_n(&j.phase, 3, __ATOMIC_RELEASE);
  pthread_join(t1, NULL);
  pthread_join(t0, NULL);
  EXPECT_EQ(j.st[0], CH_OK);
  EXPECT_EQ(j.st[1], CH_OK);
  EXPECT_EQ(j.st[2], CH_OK); /* the job completed normally */
  free(j.peers);
  unsetenv("CHORUS_SECRET");
}

TEST(security, impostor_other_uid_no_secret) { impostor_job(0); }
TEST(security, impostor_other_uid_with_secret) { impostor_job(1); }

/* ---- ranks with different secrets ---- */

static void secrets_rank(int rank, int nranks, ncclUniqueId id, void* arg) {
  const char* addr = arg;
  setenv("CHORUS_SECRET", rank == 2 ? "the-secret-of-another-job-xxxxxxxx" : "the-secret-of-this-job-yyyyyyyyyy", 1);
  param_reset();
  ncclUniqueId mine;
  ASSERT_EQ(boot_id_from_addr(addr, mine.internal), CH_OK);
  struct boot_state* b = NULL;
  /* Rank 2 fails at once when it reaches the root; the others report it missing at their deadline. */
  ch_status st = boot_init(mine.internal, rank, nranks, NULL, ut_now_ns() + (rank == 2 ? 20 : 3) * SEC, &b, NULL);
  if (rank == 2) {
    EXPECT_EQ(st, CH_INVALID_USAGE);
    if (!strstr(log_last_error(), "different secrets")) rt_fail(__FILE__, __LINE__, "rank 2 said: %s", log_last_error());
  } else {
    EXPECT_EQ(st, CH_TIMEOUT);
    if (!strstr(log_last_error(), "missing ranks 2 of 3"))
      rt_fail(__FILE__, __LINE__, "rank %d said: %s", rank, log_last_error());
  }
  if (st == CH_OK) boot_close(b);
}

TEST(security, different_secrets_fail_init) {
  static char addr[64];
  struct sock l;
  union sock_addr lo;
  ASSERT_EQ(sock_parse_addr("127.0.0.1:0", &lo), CH_OK);
  ASSERT_EQ(sock_listen(&lo, &l), CH_OK);
  snprintf(addr, sizeof(addr), "127.0.0.1:%d", sock_addr_port(&l.addr));
  sock_close(&l);
  rt_run_procs(3, secrets_rank, addr);
}

/* ---- hostile bytes at the root ---- */

static void plain_rank(int rank, int nranks, ncclUniqueId id, void* arg) {
  struct boot_state* b = NULL;
  ASSERT_EQ(boot_init(((ncclUniqueId*)arg)->internal, rank, nranks, NULL, ut_now_ns() + 20 * SEC, &b, NULL), CH_OK);
  job_exercise(b, rank, nranks);
  boot_close(b);
}

TEST_T(security, hostile_root_clients, 90) {
  ncclUniqueId id;
  ASSERT_EQ(boot_get_unique_id(id.internal), CH_OK);
  struct boot_id bid;
  memcpy(&bid, id.internal, sizeof(bid));
  struct boot_key key;
  id_key(id.internal, &key);
  const union sock_addr* root = &bid.root;
  unsigned char junk[512];
  for (size_t i = 0; i < sizeof(junk); i++) junk[i] = (unsigned char)(i * 131 + 7);
  int idle[200], nidle = 0;
  for (int i = 0; i < 200; i++) /* many idle connections: the root must not run out or stall */
    if ((idle[nidle] = raw_connect(root)) >= 0) nidle++;
  int fd;
  if ((fd = raw_connect(root)) >= 0) { /* garbage */
    EXPECT(send(fd, junk, sizeof(junk), MSG_NOSIGNAL) > 0);
    close(fd);
  }
  if ((fd = raw_connect(root)) >= 0) { /* truncated hello */
    EXPECT(send(fd, junk, 7, MSG_NOSIGNAL) == 7);
    close(fd);
  }
  struct boot_key wrong = key;
  wrong.k[0] ^= 1;
  struct boot_join j;
  fill_join(&j, 0, 3);
  EXPECT_EQ(try_join(root, &wrong, &j), 1); /* the root proves a key we do not have */
  EXPECT(strstr(log_last_error(), "does not know this job's secret") == NULL); /* nothing to log on the root yet */
  /* From here on the client knows the key: a broken program of this job, not an outsider. */
  fill_join(&j, 1, 3);
  j.info.hostname[3] = '\x1b'; /* a terminal escape */
  EXPECT_EQ(try_join(root, &key, &j), 3);
  fill_join(&j, 1, 1 << 30); /* nranks out of range */
  EXPECT_EQ(try_join(root, &key, &j), 3);
  fill_join(&j, 5, 3); /* rank out of range */
  EXPECT_EQ(try_join(root, &key, &j), 3);
  /* The real job of 3 ranks still completes, with the idle connections still open. */
  uint64_t t0 = now_ms();
  rt_run_threads(3, plain_rank, &id);
  EXPECT(now_ms() - t0 < 10000);
  for (int i = 0; i < nidle; i++) close(idle[i]);
}

/* A rank of the job that joins the root and then leaves (here one whose host name has no NUL) fails
 * the job at once for the others, naming it: waiting for the init timeout would only delay the same
 * failure. A later join (one with an absurd timeout, whose timeout_ms * 1e6 once overflowed) gets
 * the same report. */
static void late_rank(int rank, int nranks, ncclUniqueId id, void* arg) {
  (void)id, (void)nranks;
  struct boot_state* b = NULL;
  ch_status st = boot_init(((ncclUniqueId*)arg)->internal, rank, 3, NULL, ut_now_ns() + 20 * SEC, &b, NULL);
  EXPECT_EQ(st, CH_REMOTE);
  if (!strstr(log_last_error(), "rank 1 (pid") || !strstr(log_last_error(), "left after joining"))
    rt_fail(__FILE__, __LINE__, "rank %d said: %s", rank, log_last_error());
  if (st == CH_OK) boot_close(b);
}

TEST_T(security, joined_rank_leaving_fails_the_job, 60) {
  ncclUniqueId id;
  ASSERT_EQ(boot_get_unique_id(id.internal), CH_OK);
  struct boot_id bid;
  memcpy(&bid, id.internal, sizeof(bid));
  struct boot_key key;
  id_key(id.internal, &key);
  const union sock_addr* root = &bid.root;
  struct boot_join j;
  fill_join(&j, 1, 3);
  memset(j.info.hostname, 'A', sizeof(j.info.hostname)); /* no NUL anywhere */
  memset(j.info.host_id, 'B', sizeof(j.info.host_id));
  EXPECT_EQ(try_join(root, &key, &j), 2); /* admitted with the name cut short; waits, then leaves */
  /* A join with an absurd timeout (timeout_ms * 1e6 overflowed: the root gave up at once), then gone. */
  fill_join(&j, 2, 3);
  j.timeout_ms = UINT64_MAX;
  j.info.lib_version = CHORUS_VERSION_CODE;
  j.info.wire_version = (int32_t)param_int(PARAM_WIRE_VERSION);
  int fdj = raw_connect(root);
  ASSERT(fdj >= 0);
  {
    struct boot_hello h;
    boot_hello_init(&h, BOOT_KIND_JOIN, sizeof(struct boot_rank_info), 0, 3);
    struct boot_srv_proof sp;
    EXPECT(send(fdj, &h, sizeof(h), MSG_NOSIGNAL) == (ssize_t)sizeof(h));
    ASSERT(read_within(fdj, &sp, sizeof(sp), 3000) == sizeof(sp));
    struct boot_cli_proof cp;
    boot_mac(&key, 0, &h, sp.nonce, cp.mac);
    EXPECT(send(fdj, &cp, sizeof(cp), MSG_NOSIGNAL) == (ssize_t)sizeof(cp));
    EXPECT(send(fdj, &j, sizeof(j), MSG_NOSIGNAL) == (ssize_t)sizeof(j));
    usleep(200000);
    close(fdj); /* rank 2 is gone */
  }
  usleep(100000);
  uint64_t t0 = now_ms();
  rt_run_threads(1, late_rank, &id); /* rank 0 of the 3 */
  EXPECT(now_ms() - t0 < 5000);
}

/* Out of descriptors at the root: it must pause accepting, not spin, and recover. */
TEST_T(security, root_out_of_descriptors, 60) {
  ncclUniqueId id;
  ASSERT_EQ(boot_get_unique_id(id.internal), CH_OK);
  struct boot_id bid;
  memcpy(&bid, id.internal, sizeof(bid));
  struct rlimit old, low;
  ASSERT_EQ(getrlimit(RLIMIT_NOFILE, &old), 0);
  int base = rt_count_fds();
  low = old;
  low.rlim_cur = (rlim_t)base + 20;
  ASSERT_EQ(setrlimit(RLIMIT_NOFILE, &low), 0);
  /* Another process (its own descriptor table) connects 60 times: the root, limited to ~20 more
   * descriptors, runs out with connections still queued, so its listener stays readable. */
  pid_t kid = fork();
  if (kid == 0) {
    setrlimit(RLIMIT_NOFILE, &old);
    int fds[60];
    for (int i = 0; i < 60; i++) fds[i] = raw_connect(&bid.root);
    usleep(2500000);
    for (int i = 0; i < 60; i++)
      if (fds[i] >= 0) close(fds[i]);
    _exit(0);
  }
  ASSERT(kid > 0);
  usleep(500000);
  struct rusage r0, r1;
  getrusage(RUSAGE_SELF, &r0);
  uint64_t t0 = now_ms();
  usleep(1000000);
  getrusage(RUSAGE_SELF, &r1);
  double cpu = (double)(r1.ru_utime.tv_sec - r0.ru_utime.tv_sec + r1.ru_stime.tv_sec - r0.ru_stime.tv_sec) +
               (double)(r1.ru_utime.tv_usec - r0.ru_utime.tv_usec + r1.ru_stime.tv_usec - r0.ru_stime.tv_usec) / 1e6;
  double wall = (double)(now_ms() - t0) / 1e3;
  EXPECT(cpu < 0.5 * wall); /* a spinning poll loop takes a whole core */
  int st;
  waitpid(kid, &st, 0);
  ASSERT_EQ(setrlimit(RLIMIT_NOFILE, &old), 0);
  rt_run_threads(2, plain_rank, &id);
}

/* ---- hostile bytes at a rank ---- */

/* boot_init connects each rank to its gather partners (peer.c). The tests below need ranks that have
 * not talked yet (a raw connection claiming one, a first contact with one that left): they work on a
 * second bootstrap made from a table (as ncclCommSplit makes one), with no connection yet; its
 * listen addresses replace those in peers. The parent stays open until the test ends. */
static struct boot_state* unconnected(struct boot_state* parent, struct boot_rank_info* peers, int rank, int nranks) {
  struct sock l;
  if (boot_new_listener(parent, &l) != CH_OK) return NULL;
  union sock_addr* all = calloc((size_t)nranks, sizeof(*all));
  if (!all) return NULL;
  all[rank] = l.addr;
  struct boot_state* c = NULL;
  if (boot_allgather(parent, all, sizeof(*all)) == CH_OK &&
      boot_init_from_table(rank, nranks, boot_secret(parent), all, &l, NULL, &c) == CH_OK)
    for (int r = 0; r < nranks; r++) peers[r].listen_addr = all[r];
  free(all);
  return c;
}

static void peer_hostile_rank(int rank, int nranks, ncclUniqueId id, void* arg) {
  struct boot_state *parent = NULL, *b;
  struct boot_rank_info* peers = NULL;
  ASSERT_EQ(boot_init(id.internal, rank, nranks, NULL, ut_now_ns() + 20 * SEC, &parent, &peers), CH_OK);
  ASSERT((b = unconnected(parent, peers, rank, nranks)) != NULL);
  boot_set_deadline(b, ut_now_ns() + 20 * SEC);
  const struct boot_key* key = boot_secret(b);
  if (rank == 0) {
    int idle[100], nidle = 0;
    for (int i = 0; i < 100; i++)
      if ((idle[nidle] = raw_connect(&peers[1].listen_addr)) >= 0) nidle++;
    struct boot_key wrong = *key;
    wrong.k[5] ^= 0x40;
    EXPECT_EQ(try_peer(&peers[1].listen_addr, &wrong, 2, 1, nranks), 0); /* wrong key */
    EXPECT_EQ(try_peer(&peers[1].listen_addr, key, 7, 1, nranks), 0);    /* rank out of range */
    EXPECT_EQ(try_peer(&peers[1].listen_addr, key, 2, 0, nranks), 0);    /* meant for another rank */
    /* The listen address is part of the proof: one made for rank 2's listener fails at rank 1's. */
    {
      int fd = raw_connect(&peers[1].listen_addr);
      ASSERT(fd >= 0);
      struct {
        struct boot_hello h;
        struct boot_peer_proof p;
      } first;
      boot_hello_init(&first.h, BOOT_KIND_PEER, 2, 1, (uint32_t)nranks);
      boot_peer_mac(key, 0, &first.h, &peers[2].listen_addr, first.p.mac);
      EXPECT(send(fd, &first, sizeof(first), MSG_NOSIGNAL) == (ssize_t)sizeof(first));
      struct boot_peer_proof sp;
      EXPECT(read_within(fd, &sp, sizeof(sp), 3000) == 0);
      close(fd);
    }
    /* Rank 0 itself, on a raw connection with the key: an oversized header. */
    int fd = raw_connect(&peers[1].listen_addr);
    ASSERT(fd >= 0);
    struct {
      struct boot_hello h;
      struct boot_peer_proof p;
      struct boot_msg_hdr m;
    } msg;
    boot_hello_init(&msg.h, BOOT_KIND_PEER, 0, 1, (uint32_t)nranks);
    boot_peer_mac(key, 0, &msg.h, &peers[1].listen_addr, msg.p.mac);
    msg.m = (struct boot_msg_hdr){5, BOOT_REC_MSG, 1ull << 40, 0};
    EXPECT(send(fd, &msg, sizeof(msg), MSG_NOSIGNAL) == (ssize_t)sizeof(msg));
    /* A second connection claiming rank 0 is refused: rank 0 is connected already. */
    usleep(300000);
    EXPECT_EQ(try_peer(&peers[1].listen_addr, key, 0, 1, nranks), 0);
    int x = 1;
    EXPECT_EQ(boot_send(b, 2, 9, &x, sizeof(x)), CH_OK); /* rank 1 is busy being attacked: 2 carries on */
    close(fd);
    for (int i = 0; i < nidle; i++) close(idle[i]);
  } else if (rank == 1) {
    int x;
    uint64_t t0 = now_ms();
    EXPECT_EQ(boot_recv(b, 0, 5, &x, sizeof(x)), CH_REMOTE); /* the oversized message ended rank 0's link */
    EXPECT(strstr(log_last_error(), "bootstrap message of 1099511627776 bytes") != NULL);
    EXPECT(now_ms() - t0 < 10000);
    x = 3;
    EXPECT_EQ(boot_send(b, 2, 9, &x, sizeof(x)), CH_OK); /* and everyone else is fine */
    EXPECT_EQ(boot_recv(b, 2, 10, &x, sizeof(x)), CH_OK); /* stay until rank 0 is done with us */
  } else {
    int x = 0;
    EXPECT_EQ(boot_recv(b, 0, 9, &x, sizeof(x)), CH_OK);
    EXPECT_EQ(x, 1);
    EXPECT_EQ(boot_recv(b, 1, 9, &x, sizeof(x)), CH_OK);
    EXPECT_EQ(x, 3);
    EXPECT_EQ(boot_send(b, 1, 10, &x, sizeof(x)), CH_OK);
  }
  boot_close(b);
  boot_close(parent);
  free(peers);
}

TEST_T(security, hostile_peer_clients, 60) { rt_run_both(3, peer_hostile_rank, NULL); }

/* A peer that floods unexpected messages is cut off at BOOT_MAX_QUEUED_MSGS, not queued forever. */
static void flood_rank(int rank, int nranks, ncclUniqueId id, void* arg) {
  struct boot_state *parent = NULL, *b;
  struct boot_rank_info* peers = NULL;
  ASSERT_EQ(boot_init(id.internal, rank, nranks, NULL, ut_now_ns() + 20 * SEC, &parent, &peers), CH_OK);
  ASSERT((b = unconnected(parent, peers, rank, nranks)) != NULL);
  boot_set_deadline(b, ut_now_ns() + 20 * SEC);
  if (rank == 0) {
    int fd = raw_connect(&peers[1].listen_addr);
    ASSERT(fd >= 0);
    struct {
      struct boot_hello h;
      struct boot_peer_proof p;
    } first;
    boot_hello_init(&first.h, BOOT_KIND_PEER, 0, 1, (uint32_t)nranks);
    boot_peer_mac(boot_secret(b), 0, &first.h, &peers[1].listen_addr, first.p.mac);
    EXPECT(send(fd, &first, sizeof(first), MSG_NOSIGNAL) == (ssize_t)sizeof(first));
    struct boot_peer_proof sp; /* read it: closing with unread data would reset the connection */
    EXPECT(read_within(fd, &sp, sizeof(sp), 5000) == sizeof(sp));
    enum { N = BOOT_MAX_QUEUED_MSGS + 100 };
    struct boot_msg_hdr* h = calloc(N, sizeof(*h));
    ASSERT(h);
    for (int i = 0; i < N; i++) { /* empty messages nobody waits for, numbered in order */
      h[i].tag = 1000 + i;
      h[i].seq = (uint64_t)i;
    }
    size_t off = 0, len = N * sizeof(*h);
    while (off < len) { /* the receiver may cut us off part way */
      struct pollfd p = {fd, POLLOUT, 0};
      if (poll(&p, 1, 5000) <= 0) break;
      ssize_t w = send(fd, (char*)h + off, len - off, MSG_NOSIGNAL);
      if (w <= 0) break;
      off += (size_t)w;
    }
    free(h);
    close(fd); /* whatever rank 1 has not read by now comes after the limit */
  } else {
    int x = 0;
    EXPECT_EQ(boot_recv(b, 0, 5, &x, sizeof(x)), CH_REMOTE);
    if (!strstr(log_last_error(), "more unexpected bootstrap messages than we queue"))
      rt_fail(__FILE__, __LINE__, "rank 1 said: %s", log_last_error());
  }
  boot_close(b);
  boot_close(parent);
  free(peers);
}

TEST_T(security, unexpected_message_flood, 60) { rt_run_both(2, flood_rank, NULL); }

/* ---- first contact with a rank that has exited (issue item 9) ---- */

static void dead_peer_rank(int rank, int nranks, ncclUniqueId id, void* arg) {
  struct boot_state *parent = NULL, *b;
  struct boot_rank_info* peers = NULL;
  ASSERT_EQ(boot_init(id.internal, rank, nranks, NULL, ut_now_ns() + 20 * SEC, &parent, &peers), CH_OK);
  ASSERT((b = unconnected(parent, peers, rank, nranks)) != NULL);
  if (rank == 2) { /* leaves right after init, having talked to no one */
    boot_close(b);
    boot_close(parent);
    free(peers);
    return;
  }
  /* Wait until rank 2's listener is gone (a plain connect is refused). */
  for (int i = 0; i < 500; i++) {
    int fd = socket(peers[2].listen_addr.sa.sa_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
    int refused = connect(fd, &peers[2].listen_addr.sa, sizeof(peers[2].listen_addr)) != 0;
    close(fd);
    if (refused) break;
    usleep(10000);
  }
  boot_set_deadline(b, ut_now_ns() + 30 * SEC); /* the old code: a send retried ~60 s, a receive forever */
  uint64_t t0 = now_ms();
  int x = 1;
  if (rank == 0) EXPECT_EQ(boot_send(b, 2, 4, &x, sizeof(x)), CH_REMOTE);
  else EXPECT_EQ(boot_recv(b, 2, 4, &x, sizeof(x)), CH_REMOTE);
  uint64_t took = now_ms() - t0;
  EXPECT(took < 5000);
  const char* e = log_last_error();
  if (!strstr(e, "rank 2 at ") || !strstr(e, "Connection refused")) rt_fail(__FILE__, __LINE__, "rank %d said: %s", rank, e);
  boot_close(b);
  boot_close(parent);
  free(peers);
}

TEST_T(security, dead_peer_first_contact, 60) { rt_run_both(3, dead_peer_rank, NULL); }

/* ---- chorusrun hands its ranks a secret ---- */

static const char* self_exe(void) {
  static char p[PATH_MAX];
  ssize_t n = readlink("/proc/self/exe", p, sizeof p - 1);
  p[n > 0 ? n : 0] = '\0';
  return p;
}

/* Run by chorusrun (3 ranks): the job has a secret; a process of the same uid that knows only the
 * address cannot join it. Outside chorusrun it does nothing. */
TEST(security, under_chorusrun_rank) {
  const char* comm_id = getenv("NCCL_COMM_ID");
  const char* rank_s = getenv("RANK");
  if (!comm_id || !rank_s || !getenv("CHORUS_RUN_SECURITY_TEST")) {
    printf("    (a rank body for security.chorusrun_gives_secret)\n");
    return;
  }
  const char* secret = getenv("CHORUS_SECRET");
  ASSERT(secret && strlen(secret) >= 32);
  int rank = atoi(rank_s);
  ncclUniqueId id;
  param_reset();
  ASSERT_EQ(boot_id_from_addr(comm_id, id.internal), CH_OK);
  struct boot_state* b = NULL;
  struct boot_rank_info* peers = NULL;
  ASSERT_EQ(boot_init(id.internal, rank, 3, NULL, ut_now_ns() + 20 * SEC, &b, &peers), CH_OK);
  if (rank == 0) {
    /* What someone without the secret computes from the address alone. */
    unsetenv("CHORUS_SECRET");
    param_reset();
    ncclUniqueId pub;
    ASSERT_EQ(boot_id_from_addr(comm_id, pub.internal), CH_OK);
    struct boot_key k;
    id_key(pub.internal, &k);
    EXPECT_EQ(try_peer(&peers[1].listen_addr, &k, 2, 1, 3), 0);
  }
  job_exercise(b, rank, 3);
  boot_close(b);
  free(peers);
}

TEST_T(security, chorusrun_gives_secret, 60) {
  const char* dir = getenv("CHORUS_BIN_DIR");
  char run[PATH_MAX + 32];
  if (dir && *dir) snprintf(run, sizeof run, "%s/chorusrun", dir);
  else {
    snprintf(run, sizeof run, "%s", self_exe());
    char* slash = strrchr(run, '/');
    ASSERT(slash);
    snprintf(slash + 1, sizeof run - (size_t)(slash + 1 - run), "chorusrun");
  }
  if (access(run, X_OK) != 0) {
    printf("    SKIP: %s not built\n", run);
    return;
  }
  unsetenv("CHORUS_SECRET");
  unsetenv("CHORUS_SECRET_FILE");
  setenv("CHORUS_RUN_SECURITY_TEST", "1", 1);
  pid_t pid = fork();
  if (pid == 0) {
    int devnull = open("/dev/null", O_WRONLY);
    if (devnull >= 0) dup2(devnull, 1);
    execl(run, run, "-n", "3", self_exe(), "security.under_chorusrun_rank", (char*)NULL);
    _exit(127);
  }
  int st = 0;
  waitpid(pid, &st, 0);
  EXPECT(WIFEXITED(st) && WEXITSTATUS(st) == 0);
}
