/* Job keys, the connection handshake's proofs, the same-uid rule for jobs without a secret, and
 * rate-limited warnings about rejected connections. */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "../misc/log.h"
#include "../misc/param.h"
#include "../misc/sha256.h"
#include "../misc/utils.h"
#include "boot_internal.h"

#define SECRET_FILE_MAX 4096

ch_status boot_key_random(struct boot_key* key) {
  key->mode = BOOT_AUTH_SECRET;
  return ut_random(key->k, sizeof(key->k));
}

/* key = SHA-256(label || 0 || text): different labels keep a secret and a public address apart. */
static void derive(struct boot_key* key, const char* label, const void* text, size_t n) {
  struct sha256 s;
  sha256_init(&s);
  sha256_update(&s, label, strlen(label) + 1);
  sha256_update(&s, text, n);
  sha256_final(&s, key->k);
}

static ch_status read_secret_file(const char* path, struct boot_key* key) {
  int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
  if (fd < 0) {
    WARN("CHORUS_SECRET_FILE %s cannot be opened: %s", path, strerror(errno));
    return CH_INVALID_USAGE;
  }
  struct stat st;
  if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    WARN("CHORUS_SECRET_FILE %s is not a regular file", path);
    close(fd);
    return CH_INVALID_USAGE;
  }
  if (st.st_mode & 077) {
    WARN("CHORUS_SECRET_FILE %s is readable or writable by group or others (mode %03o): refusing it; chmod 600 it",
         path, (unsigned)(st.st_mode & 0777));
    close(fd);
    return CH_INVALID_USAGE;
  }
  if (st.st_uid != geteuid()) {
    WARN("CHORUS_SECRET_FILE %s belongs to uid %u, not to us (uid %u): refusing it", path, (unsigned)st.st_uid,
         (unsigned)geteuid());
    close(fd);
    return CH_INVALID_USAGE;
  }
  char buf[SECRET_FILE_MAX + 1];
  size_t n = 0;
  for (;;) {
    ssize_t r = read(fd, buf + n, sizeof(buf) - n);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) break;
    n += (size_t)r;
    if (n == sizeof(buf)) break;
  }
  close(fd);
  if (n > SECRET_FILE_MAX) {
    WARN("CHORUS_SECRET_FILE %s is larger than %d bytes", path, SECRET_FILE_MAX);
    return CH_INVALID_USAGE;
  }
  while (n > 0 && (buf[n - 1] == '\n' || buf[n - 1] == '\r' || buf[n - 1] == ' ' || buf[n - 1] == '\t')) n--;
  if (n < 16) {
    WARN("CHORUS_SECRET_FILE %s holds %zu bytes: a secret needs at least 16 (32 random hex digits, say)", path, n);
    return CH_INVALID_USAGE;
  }
  derive(key, "chorus-secret-v1", buf, n);
  memset(buf, 0, sizeof(buf));
  key->mode = BOOT_AUTH_SECRET;
  INFO(LOG_BOOTSTRAP, "Bootstrap: job secret from CHORUS_SECRET_FILE %s", path);
  return CH_OK;
}

ch_status boot_key_from_env(const char* hostport, struct boot_key* key) {
  memset(key, 0, sizeof(*key));
  const char* file = param_str(PARAM_SECRET_FILE);
  if (file[0]) return read_secret_file(file, key);
  const char* secret = getenv("CHORUS_SECRET"); /* not in the parameter table: chorus-info prints values */
  if (secret && secret[0]) {
    size_t n = strlen(secret);
    if (n < 16) {
      WARN("CHORUS_SECRET holds %zu characters: a secret needs at least 16 (32 random hex digits, say)", n);
      return CH_INVALID_USAGE;
    }
    derive(key, "chorus-secret-v1", secret, n);
    key->mode = BOOT_AUTH_SECRET;
    INFO(LOG_BOOTSTRAP, "Bootstrap: job secret from CHORUS_SECRET");
    return CH_OK;
  }
  derive(key, "chorus-public-v1", hostport, strlen(hostport));
  key->mode = BOOT_AUTH_UID;
  INFO(LOG_BOOTSTRAP, "Bootstrap: no CHORUS_SECRET or CHORUS_SECRET_FILE: admitting only uid %u on this host, "
       "and anyone from other hosts (see docs/SECURITY.md)", (unsigned)geteuid());
  return CH_OK;
}

ch_status boot_hello_init(struct boot_hello* h, uint32_t kind, uint32_t arg, uint32_t to_rank, uint32_t nranks) {
  memset(h, 0, sizeof(*h));
  h->magic = BOOT_ID_MAGIC;
  h->kind = kind;
  h->arg = arg;
  h->to_rank = to_rank;
  h->nranks = nranks;
  return ut_random(h->nonce, sizeof(h->nonce));
}

void boot_mac(const struct boot_key* key, int server, const struct boot_hello* h,
              const unsigned char nonce_s[BOOT_NONCE], unsigned char mac[BOOT_MAC]) {
  static const char srv[] = "chorus-boot-v1 server", cli[] = "chorus-boot-v1 client";
  const void* parts[3] = {server ? srv : cli, h, nonce_s};
  size_t lens[3] = {sizeof(srv), sizeof(*h), BOOT_NONCE};
  hmac_sha256(key->k, sizeof(key->k), 3, parts, lens, mac);
}

int boot_mac_ok(const struct boot_key* key, int server, const struct boot_hello* h,
                const unsigned char nonce_s[BOOT_NONCE], const unsigned char mac[BOOT_MAC]) {
  unsigned char want[BOOT_MAC];
  boot_mac(key, server, h, nonce_s, want);
  return ct_memcmp(want, mac, BOOT_MAC) == 0;
}

void boot_peer_mac(const struct boot_key* key, int server, const struct boot_hello* h, const union sock_addr* server_addr,
                   unsigned char mac[BOOT_MAC]) {
  static const char srv[] = "chorus-peer-v1 server", cli[] = "chorus-peer-v1 client";
  unsigned char where[20] = {0}; /* family, port, address: no scope id (it differs between hosts) */
  where[0] = (unsigned char)server_addr->sa.sa_family;
  int port = sock_addr_port(server_addr);
  where[1] = (unsigned char)(port >> 8);
  where[2] = (unsigned char)port;
  if (server_addr->sa.sa_family == AF_INET) memcpy(where + 4, &server_addr->sin.sin_addr, 4);
  else if (server_addr->sa.sa_family == AF_INET6) memcpy(where + 4, &server_addr->sin6.sin6_addr, 16);
  const void* parts[3] = {server ? srv : cli, h, where};
  size_t lens[3] = {sizeof(srv), sizeof(*h), sizeof(where)};
  hmac_sha256(key->k, sizeof(key->k), 3, parts, lens, mac);
}

int boot_peer_mac_ok(const struct boot_key* key, int server, const struct boot_hello* h,
                     const union sock_addr* server_addr, const unsigned char mac[BOOT_MAC]) {
  unsigned char want[BOOT_MAC];
  boot_peer_mac(key, server, h, server_addr, want);
  return ct_memcmp(want, mac, BOOT_MAC) == 0;
}

int boot_uid_check(const struct boot_key* key, int fd, const union sock_addr* remote, char* why, size_t len) {
  if (key->mode != BOOT_AUTH_UID || !sock_addr_is_local(remote)) return 0;
  uid_t uid;
  if (sock_peer_uid(fd, &uid) != 0) {
    snprintf(why, len, "a connection from this host whose owner cannot be found in /proc/net/tcp "
             "(give the job a CHORUS_SECRET to run without this check)");
    return -1;
  }
  if (uid != geteuid()) {
    snprintf(why, len, "a process of uid %u (this job runs as uid %u and has no CHORUS_SECRET)", (unsigned)uid,
             (unsigned)geteuid());
    return -1;
  }
  return 0;
}

int boot_text_field(char* s, size_t size) {
  s[size - 1] = '\0';
  for (size_t i = 0; s[i]; i++)
    if ((unsigned char)s[i] < 0x20 || (unsigned char)s[i] > 0x7e) {
      s[i] = '\0';
      return -1;
    }
  return 0;
}
