/* ncclCollConfig_t.algSelection (NCCL 2.31): a per-call choice among algorithm x protocol pairs, in
 * NCCL's grammar (its src/config/algorithm_parser.cc): blanks ignored; `,` separates terms (OR), `+`
 * joins factors (AND), `^` negates a factor; a factor is a tag matching every row whose name begins
 * with it, case-insensitive ("RING" is RING_LL, RING_LL128 and RING_SIMPLE). An unknown tag, a bare
 * `^`, an empty term or a term that selects nothing is a fault.
 *
 * The rows are NCCL's names where Chorus runs the pair (TREE_*, RING_*), Chorus's own algorithms in
 * the same form (EXCHANGE_*, DIRECT_*, RECDBL_*, RABENSEIFNER_*, OWNER_*), and NCCL's rows Chorus
 * does not run (CollNet, NVLS, PAT, the symmetric kernels), accepted so that a selection written for
 * NCCL parses, and never met on their own. */
#include <stdio.h>
#include <string.h>
#include <strings.h>

#include "../misc/log.h"
#include "../misc/utils.h"
#include "../algo/algo.h"
#include "tune.h"

_Static_assert(ALGO_COUNT * CH_NPROTO <= TUNE_SEL_BITS, "a selection bit per algorithm x protocol");

/* NCCL's rows that Chorus does not run: bits from 32 up in a parsed mask. */
static const char* const foreign[] = {
    "COLLNET_DIRECT_SIMPLE", "COLLNET_CHAIN_SIMPLE", "NVLS_SIMPLE", "NVLSTREE_SIMPLE", "PAT_SIMPLE",
    "SYMK_AGxLL_R", "SYMK_AGxLLMC_R", "SYMK_RSxTmaLD_AGxTmaST", "SYMK_RSxLD_AGxST", "SYMK_RSxLDMC_AGxSTMC",
    "SYMK_LL", "SYMK_LLMC", "SYMK_TmaST", "SYMK_ST", "SYMK_TmaSTMC", "SYMK_STMC", "SYMK_RailRing_LsaSTMC",
    "SYMK_TmaLD", "SYMK_LD", "SYMK_LDMC", "SYMK_RailA2A_LsaLD", "SYMK_RailA2A_LsaLDMC"};
#define NFOREIGN (sizeof(foreign) / sizeof(foreign[0]))
_Static_assert(NFOREIGN <= 32, "foreign rows fit above bit 32");

/* Row name of Chorus bit b ("RABENSEIFNER_LL128"). */
static void row_name(int b, char* out, size_t cap) {
  const char* a = ch_algo_name(b / CH_NPROTO);
  const char* p = ch_proto_name(b % CH_NPROTO);
  size_t n = 0;
  for (; a[n] && n + 1 < cap; n++) out[n] = a[n] >= 'a' && a[n] <= 'z' ? (char)(a[n] - 32) : a[n];
  snprintf(out + n, cap - n, "_%s", b % CH_NPROTO == PROTO_SIMPLE ? "SIMPLE" : p);
}

static uint64_t all_bits(void) {
  return ((1ull << (ALGO_COUNT * CH_NPROTO)) - 1) | (((1ull << NFOREIGN) - 1) << 32);
}

/* Rows whose name begins with tag[0, len). */
static uint64_t tag_mask(const char* tag, size_t len) {
  uint64_t m = 0;
  char name[48];
  for (int b = 0; b < ALGO_COUNT * CH_NPROTO; b++) {
    row_name(b, name, sizeof name);
    if (strlen(name) >= len && strncasecmp(name, tag, len) == 0) m |= 1ull << b;
  }
  for (size_t i = 0; i < NFOREIGN; i++)
    if (strlen(foreign[i]) >= len && strncasecmp(foreign[i], tag, len) == 0) m |= 1ull << (32 + i);
  return m;
}

int tune_sel_parse(const char* sel, uint64_t* out, char* why, size_t cap) {
  char s[256];
  size_t n = 0;
  *out = 0;
  for (const char* p = sel; *p; p++) {
    if (*p == ' ' || *p == '\t' || *p == '\n' || *p == '\r') continue;
    if (n + 1 >= sizeof s) {
      snprintf(why, cap, "longer than %zu characters", sizeof s - 1);
      return -1;
    }
    s[n++] = *p;
  }
  s[n] = 0;
  uint64_t all = all_bits(), mask = 0;
  /* Empty terms ("a,,b", a trailing ',') and empty factors are skipped, as NCCL's strtok_r does. */
  char *tsave, *fsave;
  for (char* term = strtok_r(s, ",", &tsave); term; term = strtok_r(NULL, ",", &tsave)) {
    uint64_t tm = all;
    int factors = 0;
    for (char* f = strtok_r(term, "+", &fsave); f; f = strtok_r(NULL, "+", &fsave)) {
      int neg = *f == '^';
      const char* tag = f + neg;
      size_t len = strlen(tag);
      if (!len) {
        snprintf(why, cap, "a bare '^'");
        return -1;
      }
      uint64_t m = tag_mask(tag, len);
      if (!m) {
        snprintf(why, cap, "unknown name '%.*s' (names begin TREE, RING, EXCHANGE, DIRECT, RECDBL, RABENSEIFNER, "
                 "OWNER, COLLNET, NVLS, PAT or SYMK; then _LL, _LL128 or _SIMPLE)", (int)UT_MIN(len, 64), tag);
        return -1;
      }
      tm &= neg ? all & ~m : m;
      factors++;
    }
    if (!factors) {
      snprintf(why, cap, "a term names nothing");
      return -1;
    }
    if (!tm) {
      snprintf(why, cap, "a term selects nothing (its names exclude each other)");
      return -1;
    }
    mask |= tm;
  }
  *out = mask;
  return 0;
}

void tune_sel_format(unsigned sel, char* out, size_t cap) {
  size_t len = 0;
  out[0] = 0;
  for (int b = 0; b < ALGO_COUNT * CH_NPROTO && len + 1 < cap; b++)
    if (sel >> b & 1) {
      char name[48];
      row_name(b, name, sizeof name);
      int k = snprintf(out + len, cap - len, "%s%s", len ? "," : "", name);
      if (k > 0) len = len + (size_t)k < cap ? len + (size_t)k : cap - 1;
    }
  if (!out[0]) snprintf(out, cap, "automatic");
}

/* Said once per process and cause: a selection set aside for a reason that holds for every call. */
static void once(int* told, const char* fmt, const char* fn, const char* sel) {
  if (!__atomic_exchange_n(told, 1, __ATOMIC_RELAXED)) INFO(LOG_TUNING, fmt, fn, sel);
}

ch_status tune_sel_resolve(struct ncclComm* comm, int func, int type, const char* sel, int force, unsigned* out) {
  static int told_env, told_repro; /* atomic */
  *out = 0;
  if (!sel || !sel[0]) return CH_OK;
  const char* fn = tune_func_name(func);
  char why[200] = "";
  uint64_t m = 0;
  unsigned valid = 0;
  if (tune_sel_parse(sel, &m, why, sizeof why) == 0) {
    /* What this communicator can run for func: AlltoAll, Gather and Scatter (send/recv underneath)
     * have no choice to make, and NCCL too finds no selectable algorithm for them. */
    unsigned algos = func < TUNE_P2P ? tune_runnable_algos(comm, func) : 0;
    for (int a = 0; a < ALGO_COUNT; a++)
      for (int p = 0; p < CH_NPROTO; p++)
        if ((algos >> a & 1) && (comm->proto_ok >> p & 1)) valid |= 1u << (a * CH_NPROTO + p);
    if (!(m & valid))
      snprintf(why, sizeof why, "%s", func >= TUNE_P2P ? "it has no algorithm to choose" :
               "nothing it names runs this call on this communicator");
  }
  if (!(m & valid)) {
    char can[256];
    tune_sel_format(valid, can, sizeof can);
    if (force) {
      WARN("nccl%sConfig: ncclCollConfig_t.algSelection \"%.128s\" cannot be honoured for %s: %s (runnable here: "
           "%s); set forceAlgSelection=0 to fall back to the automatic choice", fn, sel, fn, why,
           valid ? can : "none");
      return CH_INVALID_ARG;
    }
    INFO(LOG_TUNING, "%s: algSelection \"%.128s\" cannot be honoured (%s); forceAlgSelection=0: automatic choice",
         fn, sel, why);
    return CH_OK;
  }
  /* As NCCL: NCCL_ALGO/NCCL_PROTO, when they restrict this collective, win over a per-call selection;
   * so does a reproducible level, which only its own algorithms honour. */
  int i = tune_mask_index(func);
  if (comm->algo_mask[i] != (1u << TUNE_ALGO_NBITS) - 1 || comm->proto_mask[i] != (1u << CH_NPROTO) - 1) {
    once(&told_env, "%s: algSelection \"%.128s\" set aside: NCCL_ALGO/NCCL_PROTO restrict this collective and "
         "take precedence, as in NCCL (reported once)", fn, sel);
    return CH_OK;
  }
  if (tune_repro_level(comm, func, type)) {
    once(&told_repro, "%s: algSelection \"%.128s\" set aside: CHORUS_REPRODUCIBLE chooses the algorithm "
         "(reported once)", fn, sel);
    return CH_OK;
  }
  *out = (unsigned)(m & valid);
  return CH_OK;
}
