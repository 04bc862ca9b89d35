/* SHA-256 per FIPS 180-4 section 6.2, HMAC per RFC 2104. */
#include <string.h>

#include "sha256.h"

static const uint32_t K[64] = {
    0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4, 0xab1c5ed5,
    0xd807aa98, 0x12835b01, 0x243185be, 0x550c7dc3, 0x72be5d74, 0x80deb1fe, 0x9bdc06a7, 0xc19bf174,
    0xe49b69c1, 0xefbe4786, 0x0fc19dc6, 0x240ca1cc, 0x2de92c6f, 0x4a7484aa, 0x5cb0a9dc, 0x76f988da,
    0x983e5152, 0xa831c66d, 0xb00327c8, 0xbf597fc7, 0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967,
    0x27b70a85, 0x2e1b2138, 0x4d2c6dfc, 0x53380d13, 0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85,
    0xa2bfe8a1, 0xa81a664b, 0xc24b8b70, 0xc76c51a3, 0xd192e819, 0xd6990624, 0xf40e3585, 0x106aa070,
    0x19a4c116, 0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a, 0x5b9cca4f, 0x682e6ff3,
    0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208, 0x90befffa, 0xa4506ceb, 0xbef9a3f7, 0xc67178f2};

static uint32_t ror(uint32_t x, int n) { return (x >> n) | (x << (32 - n)); }

static void block(uint32_t h[8], const unsigned char* p) {
  uint32_t w[64];
  for (int t = 0; t < 16; t++)
    w[t] = (uint32_t)p[4 * t] << 24 | (uint32_t)p[4 * t + 1] << 16 | (uint32_t)p[4 * t + 2] << 8 | p[4 * t + 3];
  for (int t = 16; t < 64; t++) {
    uint32_t s0 = ror(w[t - 15], 7) ^ ror(w[t - 15], 18) ^ (w[t - 15] >> 3);
    uint32_t s1 = ror(w[t - 2], 17) ^ ror(w[t - 2], 19) ^ (w[t - 2] >> 10);
    w[t] = w[t - 16] + s0 + w[t - 7] + s1;
  }
  uint32_t a = h[0], b = h[1], c = h[2], d = h[3], e = h[4], f = h[5], g = h[6], k = h[7];
  for (int t = 0; t < 64; t++) {
    uint32_t t1 = k + (ror(e, 6) ^ ror(e, 11) ^ ror(e, 25)) + ((e & f) ^ (~e & g)) + K[t] + w[t];
    uint32_t t2 = (ror(a, 2) ^ ror(a, 13) ^ ror(a, 22)) + ((a & b) ^ (a & c) ^ (b & c));
    k = g, g = f, f = e, e = d + t1, d = c, c = b, b = a, a = t1 + t2;
  }
  h[0] += a, h[1] += b, h[2] += c, h[3] += d, h[4] += e, h[5] += f, h[6] += g, h[7] += k;
}

void sha256_init(struct sha256* s) {
  static const uint32_t H0[8] = {0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a,
                                 0x510e527f, 0x9b05688c, 0x1f83d9ab, 0x5be0cd19};
  memcpy(s->h, H0, sizeof(H0));
  s->len = 0;
  s->used = 0;
}

void sha256_update(struct sha256* s, const void* data, size_t n) {
  const unsigned char* p = data;
  s->len += n;
  while (n > 0) {
    if (s->used == 0 && n >= SHA256_BLOCK) {
      block(s->h, p);
      p += SHA256_BLOCK, n -= SHA256_BLOCK;
      continue;
    }
    size_t k = SHA256_BLOCK - s->used;
    if (k > n) k = n;
    memcpy(s->buf + s->used, p, k);
    s->used += k, p += k, n -= k;
    if (s->used == SHA256_BLOCK) {
      block(s->h, s->buf);
      s->used = 0;
    }
  }
}

void sha256_final(struct sha256* s, unsigned char out[SHA256_BYTES]) {
  uint64_t bits = s->len * 8;
  unsigned char pad[SHA256_BLOCK + 8] = {0x80};
  size_t padn = (s->used < 56 ? 56 : 120) - s->used; /* to 56 mod 64, then the 64-bit length */
  for (int i = 0; i < 8; i++) pad[padn + (size_t)i] = (unsigned char)(bits >> (56 - 8 * i));
  sha256_update(s, pad, padn + 8);
  for (int i = 0; i < 8; i++) {
    out[4 * i] = (unsigned char)(s->h[i] >> 24);
    out[4 * i + 1] = (unsigned char)(s->h[i] >> 16);
    out[4 * i + 2] = (unsigned char)(s->h[i] >> 8);
    out[4 * i + 3] = (unsigned char)s->h[i];
  }
  memset(s, 0, sizeof(*s));
}

void sha256(const void* data, size_t n, unsigned char out[SHA256_BYTES]) {
  struct sha256 s;
  sha256_init(&s);
  sha256_update(&s, data, n);
  sha256_final(&s, out);
}

void hmac_sha256(const void* key, size_t key_len, int nparts, const void* const* parts, const size_t* lens,
                 unsigned char out[SHA256_BYTES]) {
  unsigned char k[SHA256_BLOCK] = {0}, pad[SHA256_BLOCK], inner[SHA256_BYTES];
  if (key_len > SHA256_BLOCK) sha256(key, key_len, k); /* long keys are hashed first */
  else if (key_len) memcpy(k, key, key_len);
  struct sha256 s;
  for (int i = 0; i < SHA256_BLOCK; i++) pad[i] = k[i] ^ 0x36;
  sha256_init(&s);
  sha256_update(&s, pad, sizeof(pad));
  for (int i = 0; i < nparts; i++) sha256_update(&s, parts[i], lens[i]);
  sha256_final(&s, inner);
  for (int i = 0; i < SHA256_BLOCK; i++) pad[i] = k[i] ^ 0x5c;
  sha256_init(&s);
  sha256_update(&s, pad, sizeof(pad));
  sha256_update(&s, inner, sizeof(inner));
  sha256_final(&s, out);
  memset(k, 0, sizeof(k));
  memset(pad, 0, sizeof(pad));
}

int ct_memcmp(const void* a, const void* b, size_t n) {
  const volatile unsigned char *x = a, *y = b;
  unsigned char d = 0;
  for (size_t i = 0; i < n; i++) d |= (unsigned char)(x[i] ^ y[i]);
  return d != 0;
}
