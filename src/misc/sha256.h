/* SHA-256 (FIPS 180-4) and HMAC-SHA256 (RFC 2104), for the bootstrap's challenge-response. Small
 * and dependency-free; not meant for bulk data. */
#ifndef CH_SHA256_H
#define CH_SHA256_H

#include <stddef.h>
#include <stdint.h>

#define SHA256_BYTES 32
#define SHA256_BLOCK 64

struct sha256 {
  uint32_t h[8];
  uint64_t len; /* bytes hashed so far */
  unsigned char buf[SHA256_BLOCK];
  size_t used;
};

void sha256_init(struct sha256* s);
void sha256_update(struct sha256* s, const void* data, size_t n);
void sha256_final(struct sha256* s, unsigned char out[SHA256_BYTES]);
void sha256(const void* data, size_t n, unsigned char out[SHA256_BYTES]);

/* HMAC over the concatenation of `nparts` pieces (parts[i], lens[i]). */
void hmac_sha256(const void* key, size_t key_len, int nparts, const void* const* parts, const size_t* lens,
                 unsigned char out[SHA256_BYTES]);

/* Compare n bytes in time independent of where they differ; 0 when equal. */
int ct_memcmp(const void* a, const void* b, size_t n);

#endif
