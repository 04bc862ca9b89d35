/* libFuzzer target: rank-table entries as a rank receives them from its peers during the bootstrap's
 * allgather (bootstrap.c learn_infos -> boot_check_info). Any bytes must be either refused with a
 * reason or accepted with every field later code relies on valid: rank and counts as expected, an
 * IPv4/IPv6 listen address with a port, a stall query address that is none or valid, and host names
 * terminated within their field and printable.
 *   bytes 0-3: slot, 4-7: nranks (as the receiver expects them); the rest: the entry */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "bootstrap/boot_internal.h"

static void check_text(const char* s, size_t n) {
  size_t len = strnlen(s, n);
  if (len == n) abort(); /* not terminated within its field */
  for (size_t i = 0; i < len; i++)
    if ((unsigned char)s[i] < 0x20 || (unsigned char)s[i] > 0x7e) abort();
}

int LLVMFuzzerTestOneInput(const unsigned char* data, size_t size) {
  if (size < 8) return 0;
  int32_t slot, nranks;
  memcpy(&slot, data, 4);
  memcpy(&nranks, data + 4, 4);
  struct boot_rank_info* t = malloc(sizeof(*t)); /* on the heap: ASan sees any read past the entry */
  if (!t) return 0;
  memset(t, 0, sizeof(*t));
  memcpy(t, data + 8, size - 8 < sizeof(*t) ? size - 8 : sizeof(*t));
  char why[96];
  if (boot_check_info(t, slot, nranks, why, sizeof(why)) == 0) {
    if (t->rank != slot || t->nranks != nranks) abort();
    int fam = t->listen_addr.sa.sa_family, qfam = t->query_addr.sa.sa_family;
    if ((fam != AF_INET && fam != AF_INET6) || sock_addr_port(&t->listen_addr) == 0) abort();
    if (qfam != AF_UNSPEC && qfam != AF_INET && qfam != AF_INET6) abort();
    check_text(t->hostname, sizeof(t->hostname));
    check_text(t->host_id, sizeof(t->host_id));
  } else if (strnlen(why, sizeof(why)) == 0 || strnlen(why, sizeof(why)) == sizeof(why)) {
    abort(); /* a refusal always says why */
  }
  free(t);
  return 0;
}
