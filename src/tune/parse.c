/* NCCL_ALGO / NCCL_PROTO in NCCL's syntax (its parser in src/graph/tuning.cc): `;`-separated entries, each
 * `[func:]list`; only the first entry may go without a function, and it then applies to every
 * collective (and, in Chorus, to send/recv); later entries override it for their function. A list is
 * comma-separated names, all case-insensitive; a leading `^` allows everything but the names.
 * Anything else (unknown name or function, empty name, a second prefixless entry) is an error. */
#include <stdio.h>
#include <string.h>

#include "../misc/log.h"
#include "../misc/utils.h"
#include "tune.h"

static int nnames(int is_algo) { return is_algo ? TUNE_ALGO_NBITS : CH_NPROTO; }

const char* tune_bit_name(int is_algo, int b) {
  const char* n = b >= 0 && b < nnames(is_algo) ? (is_algo ? ch_algo_name(b) : ch_proto_name(b)) : NULL;
  return n ? n : "?";
}

/* The names a fault lists as known: NCCL's algorithms in NCCL's numbering, then Chorus's own. */
static void known_names(int is_algo, char* out, size_t cap) {
  int order[TUNE_ALGO_NBITS], n = 0;
  if (!is_algo) {
    for (int b = 0; b < CH_NPROTO; b++) order[n++] = b; /* NCCL's, in its numbering */
  } else {
    for (int id = 0; id < TUNE_ALGO_NBITS; id++)
      for (int b = 0; b < TUNE_ALGO_NBITS; b++)
        if (ch_algo_nccl_id(b) == id) order[n++] = b;
    for (int b = 0; b < TUNE_ALGO_NBITS; b++)
      if (ch_algo_nccl_id(b) < 0) order[n++] = b;
  }
  size_t len = 0;
  out[0] = 0;
  for (int i = 0; i < n; i++) {
    int w = snprintf(out + len, cap - len, "%s%s", i ? ", " : "", tune_bit_name(is_algo, order[i]));
    if (w > 0) len = UT_MIN(cap - 1, len + (size_t)w);
  }
}

/* [s, e) without surrounding blanks. */
static void trim(const char** s, const char** e) {
  while (*s < *e && (**s == ' ' || **s == '\t')) (*s)++;
  while (*e > *s && ((*e)[-1] == ' ' || (*e)[-1] == '\t')) (*e)--;
}

/* One list ("ring,tree" or "^ll128") into *mask. Returns 0, or -1 with the fault written to why. */
static int parse_list(const char* s, const char* e, int is_algo, unsigned* mask, char* why, size_t cap) {
  unsigned all = (1u << nnames(is_algo)) - 1, listed = 0;
  trim(&s, &e);
  int invert = s < e && *s == '^';
  if (invert) s++;
  trim(&s, &e);
  if (s == e) {
    if (invert) { /* "^" alone excludes nothing */
      *mask = all;
      return 0;
    }
    snprintf(why, cap, "an entry names nothing");
    return -1;
  }
  for (const char* p = s; p <= e;) {
    const char* q = p;
    while (q < e && *q != ',') q++;
    const char *ts = p, *te = q;
    trim(&ts, &te);
    if (ts == te) { /* "ring,", ",ring": an empty name is skipped, as NCCL's strtok does */
      p = q + 1;
      continue;
    }
    int found = is_algo ? ch_algo_parse(ts, (size_t)(te - ts)) : ch_proto_parse(ts, (size_t)(te - ts));
    if (found < 0) {
      char known[160];
      known_names(is_algo, known, sizeof(known));
      snprintf(why, cap, "unknown %s '%.*s' (known: %s)", is_algo ? "algorithm" : "protocol", (int)(te - ts), ts,
               known);
      return -1;
    }
    listed |= 1u << found;
    p = q + 1;
  }
  if (!listed && !invert) {
    snprintf(why, cap, "an entry names nothing");
    return -1;
  }
  *mask = invert ? all & ~listed : listed;
  return 0;
}

ch_status tune_parse(const char* env, const char* value, int is_algo, unsigned masks[TUNE_NMASK]) {
  unsigned all = (1u << nnames(is_algo)) - 1;
  for (int f = 0; f < TUNE_NMASK; f++) masks[f] = all;
  if (!value) return CH_OK;
  const char* end = value + strlen(value);
  char why[256] = "";
  int entry = 0;
  for (const char* p = value; p <= end; entry++) {
    const char* q = p;
    while (q < end && *q != ';') q++;
    const char *s = p, *e = q;
    trim(&s, &e);
    p = q + 1;
    if (s == e) continue; /* "ring;", "ring;;allreduce:tree": empty entries are skipped, as by NCCL's strtok */
    const char* colon = memchr(s, ':', (size_t)(e - s));
    int func = -1;
    if (colon) {
      const char *fs = s, *fe = colon;
      trim(&fs, &fe);
      func = ch_func_parse(fs, (size_t)(fe - fs));
      if (func >= TUNE_P2P) func = -1; /* send/recv take only the prefixless entry */
      if (func < 0) {
        char known[96] = "";
        for (int f = 0, len = 0; f < TUNE_P2P; f++) {
          int w = snprintf(known + len, sizeof(known) - (size_t)len, "%s%s", f ? ", " : "", tune_func_name(f));
          if (w > 0) len = (int)UT_MIN(sizeof(known) - 1, (size_t)(len + w));
        }
        snprintf(why, sizeof(why), "unknown collective '%.*s' (known: %s)", (int)(fe - fs), fs, known);
        goto bad;
      }
      s = colon + 1;
      if (memchr(s, ':', (size_t)(e - s))) {
        snprintf(why, sizeof(why), "entry %d has more than one ':'", entry + 1);
        goto bad;
      }
    } else if (entry > 0) { /* as NCCL: only an entry at the start ("^", not ";;^") may omit it */
      snprintf(why, sizeof(why), "entry %d has no 'collective:' prefix (only the first entry may omit it)",
               entry + 1);
      goto bad;
    }
    unsigned m;
    if (parse_list(s, e, is_algo, &m, why, sizeof(why)) != 0) goto bad;
    if (func >= 0) masks[func] = m;
    else
      for (int f = 0; f < TUNE_NMASK; f++) masks[f] = m;
  }
  return CH_OK;
bad:
  WARN("%s=%s is malformed: %s", env, value, why);
  return CH_INVALID_USAGE;
}

/* Packing: algorithms take TUNE_ALGO_NBITS bits per collective (send/recv not included: no algorithm
 * choice there), protocols CH_NPROTO bits per index. */
int64_t tune_mask_pack(int is_algo, const unsigned masks[TUNE_NMASK]) {
  int n = is_algo ? TUNE_P2P : TUNE_NMASK, w = nnames(is_algo);
  _Static_assert(TUNE_P2P * TUNE_ALGO_NBITS < 63 && TUNE_NMASK * CH_NPROTO < 63, "masks fit in an int64");
  int64_t v = 0;
  for (int f = 0; f < n; f++) v |= (int64_t)(masks[f] & ((1u << w) - 1)) << (f * w);
  return v;
}

static void put_list(unsigned m, int is_algo, char* out, size_t cap, size_t* len) {
  const char* sep = "";
  for (int b = 0; b < nnames(is_algo); b++) {
    if (!(m & (1u << b))) continue;
    int n = snprintf(out + *len, cap - *len, "%s%s", sep, tune_bit_name(is_algo, b));
    if (n > 0) *len = UT_MIN(cap - 1, *len + (size_t)n);
    sep = ",";
  }
  if (!*sep) {
    int n = snprintf(out + *len, cap - *len, "(none)");
    if (n > 0) *len = UT_MIN(cap - 1, *len + (size_t)n);
  }
}

void tune_mask_format(int is_algo, int64_t packed, char* out, size_t cap) {
  if (!cap) return;
  out[0] = 0;
  if (packed == TUNE_MALFORMED) {
    snprintf(out, cap, "(malformed)");
    return;
  }
  int n = is_algo ? TUNE_P2P : TUNE_NMASK, w = nnames(is_algo);
  unsigned m[TUNE_NMASK];
  int same = 1;
  for (int f = 0; f < n; f++) {
    m[f] = (unsigned)((packed >> (f * w)) & ((1 << w) - 1));
    same &= m[f] == m[0];
  }
  size_t len = 0;
  if (same) {
    put_list(m[0], is_algo, out, cap, &len);
    return;
  }
  for (int f = 0; f < n; f++) {
    int k = snprintf(out + len, cap - len, "%s%s:", f ? ";" : "", f < TUNE_P2P ? tune_func_name(f) : "send/recv");
    if (k > 0) len = UT_MIN(cap - 1, len + (size_t)k);
    put_list(m[f], is_algo, out, cap, &len);
  }
}
