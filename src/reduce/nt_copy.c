/* Streaming (non-temporal) stores for large results. A normal store first reads the destination line
 * into the cache (read-for-ownership), so writing a result nobody reads soon costs a read and a write
 * of memory. Streaming stores skip the read. Measured on the CI VM with two cores each writing
 * a+b into its own 64 MiB output: 5.1-6.6 GB/s per core with normal stores, 7.9-8.3 GB/s streamed. */
#include <stdint.h>
#include <string.h>

#include "reduce.h"

#if defined(__x86_64__)
#include <emmintrin.h>

void red_nt_copy(void* dst, const void* src, size_t bytes) {
  char* d = dst;
  const char* s = src;
  size_t head = (size_t)(-(uintptr_t)d & 63); /* whole lines only: a partial line would be read anyway */
  if (bytes < head + 64) {
    memcpy(d, s, bytes);
    return;
  }
  memcpy(d, s, head);
  d += head, s += head, bytes -= head;
  size_t body = bytes & ~(size_t)63;
  for (size_t i = 0; i < body; i += 64) {
    __m128i a = _mm_loadu_si128((const __m128i*)(s + i)), b = _mm_loadu_si128((const __m128i*)(s + i + 16));
    __m128i c = _mm_loadu_si128((const __m128i*)(s + i + 32)), e = _mm_loadu_si128((const __m128i*)(s + i + 48));
    _mm_stream_si128((__m128i*)(d + i), a);
    _mm_stream_si128((__m128i*)(d + i + 16), b);
    _mm_stream_si128((__m128i*)(d + i + 32), c);
    _mm_stream_si128((__m128i*)(d + i + 48), e);
  }
  memcpy(d + body, s + body, bytes - body);
}

/* Streaming stores are weakly ordered: fence before anything that publishes them. */
void red_nt_fence(void) { _mm_sfence(); }
#else
void red_nt_copy(void* dst, const void* src, size_t bytes) { memcpy(dst, src, bytes); }
void red_nt_fence(void) {}
#endif
