/* ncclConfig_t of every NCCL header from 2.19 to 2.31, and ncclCollConfig_t (2.31), read and checked.
 *
 * A config's size says how many bytes the caller's header gave the struct and its version which
 * header that was. Fields are only ever appended, so each sits at the same offset in every header
 * that has it: a field is read when the caller's version has it and it lies within the caller's size;
 * otherwise it keeps its default. Two fields sit in what older headers left as padding (trafficClass
 * before 2.26, graphStreamOrdering in 2.30.3/2.30.4): the version, not the size, tells them apart.
 * docs/COMPATIBILITY.md has the table of what each field does in Chorus. */
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "../misc/log.h"
#include "../misc/param.h"
#include "../misc/utils.h"
#include "api.h"

/* How a field's value is checked (NCCL_CONFIG_UNDEF_INT always passes: the default). */
enum cfg_check { CK_ANY, CK_BOOL, CK_POS, CK_NONNEG, CK_CTA, CK_MODE3, CK_NCHAN, CK_CFT };

/* X(field, NCCL version whose header added it, check, effect in Chorus: NULL = honoured, else why not).
 * The two pointer fields are handled apart (netName 2.17, commName 2.27). */
#define CFG_INT_FIELDS(X)                                                                                    \
  X(blocking, 21400, CK_BOOL, NULL)                                                                          \
  X(cgaClusterSize, 21700, CK_NONNEG, "Chorus's kernels use no thread-block clusters")                       \
  X(minCTAs, 21700, CK_POS, NULL)                                                                            \
  X(maxCTAs, 21700, CK_POS, NULL)                                                                            \
  X(splitShare, 21800, CK_BOOL, "a split child always has resources of its own")                             \
  X(trafficClass, 22600, CK_ANY, "no InfiniBand traffic classes: sockets and libfabric pick their own")      \
  X(collnetEnable, 22700, CK_BOOL, "no CollNet (in-network reduction)")                                      \
  X(CTAPolicy, 22700, CK_CTA, "no CTA scheduling policies: host threads and Chorus's kernels run each call") \
  X(shrinkShare, 22700, CK_BOOL, "a shrunk child always has resources of its own")                           \
  X(nvlsCTAs, 22700, CK_POS, "no NVLink SHARP")                                                              \
  X(nChannelsPerNetPeer, 22800, CK_NCHAN,                                                                    \
    "network channels per peer come from NCCL_SOCKET_NTHREADS x "                                            \
    "NCCL_NSOCKS_PERTHREAD")                                                                                 \
  X(nvlinkCentricSched, 22800, CK_BOOL, "no NVLink-centric scheduling")                                      \
  X(graphUsageMode, 22900, CK_MODE3, "captured and plain calls may always mix (docs/CUDA.md)")               \
  X(numRmaCtx, 22900, CK_NONNEG, NULL)                                                                       \
  X(maxP2pPeers, 23000, CK_POS, NULL)                                                                        \
  X(graphStreamOrdering, 23005, CK_BOOL, "captured calls always run in their stream's order")                \
  X(launchOrderImplicit, 23100, CK_BOOL, "calls of one communicator always run in issue order")              \
  X(numRmaSig, 23100, CK_NONNEG, NULL)                                                                       \
  X(rmaEagerInit, 23100, CK_BOOL, "the signals are made by the first window registration either way")       \
  X(hostCftMode, 23100, CK_CFT, "no host-side collective fallback: Chorus runs collectives on the host anyway")

static int check_value(int v, enum cfg_check ck) {
  if (v == NCCL_CONFIG_UNDEF_INT) return 1;
  switch (ck) {
    case CK_ANY: return 1;
    case CK_BOOL: return v == 0 || v == 1;
    case CK_POS: return v > 0;
    case CK_NONNEG: return v >= 0;
    case CK_CTA: return v >= 0 && v <= (NCCL_CTA_POLICY_EFFICIENCY | NCCL_CTA_POLICY_ZERO);
    case CK_MODE3: return v >= 0 && v <= 2;
    case CK_NCHAN: return v > 0 && v <= 64; /* NCCL's MAXCHANNELS */
    case CK_CFT: return v >= ncclHostCftEnable && v <= ncclHostCftFallback;
  }
  return 0;
}

static const char* check_text(enum cfg_check ck) {
  switch (ck) {
    case CK_ANY: return "any value";
    case CK_BOOL: return "0 or 1";
    case CK_POS: return "a value > 0";
    case CK_NONNEG: return "a value >= 0";
    case CK_CTA: return "a mask of NCCL_CTA_POLICY_EFFICIENCY (1) and NCCL_CTA_POLICY_ZERO (2)";
    case CK_MODE3: return "0, 1 or 2";
    case CK_NCHAN: return "1 to 64";
    case CK_CFT: return "ncclHostCftEnable (1), ncclHostCftDisable (2) or ncclHostCftFallback (3)";
  }
  return "?";
}

/* The integer fields, generated from the table above. */
static const struct cfg_field {
  const char* name;
  size_t off;
  unsigned since;
  enum cfg_check ck;
  const char* effect;
} int_fields[] = {
#define CFG_ROW(f, since, ck, effect) {#f, offsetof(ncclConfig_t, f), since, ck, effect},
    CFG_INT_FIELDS(CFG_ROW)
#undef CFG_ROW
};
#define NINT_FIELDS (sizeof(int_fields) / sizeof(int_fields[0]))

/* Does the caller's struct (size, version) have the field at [off, off + len)? */
static int has_field(const ncclConfig_t* user, size_t off, size_t len, unsigned since) {
  return user->version >= since && off + len <= user->size;
}

static int get_int(const void* cfg, size_t off) {
  int v;
  memcpy(&v, (const char*)cfg + off, sizeof(v));
  return v;
}

/* The header's part of the struct every version has: size, magic, version, blocking. */
#define CFG_MIN_SIZE (offsetof(ncclConfig_t, blocking) + sizeof(int))

ch_status comm_parse_config(const ncclConfig_t* user, ncclConfig_t* out) {
  static const ncclConfig_t def = NCCL_CONFIG_INITIALIZER;
  *out = def;
  if (user) {
    if (user->magic != NCCL_API_MAGIC) {
      WARN("ncclConfig_t: magic is 0x%x, not 0x%x: the config was not initialized with NCCL_CONFIG_INITIALIZER",
           user->magic, NCCL_API_MAGIC);
      return CH_INVALID_ARG;
    }
    if (user->size < CFG_MIN_SIZE || user->size > sizeof(ncclConfig_t)) {
      WARN("ncclConfig_t: size %zu is not that of any NCCL header's config (%zu to %zu bytes; this library "
           "knows NCCL %d.%d.%d's)",
           user->size, (size_t)CFG_MIN_SIZE, sizeof(ncclConfig_t), NCCL_MAJOR, NCCL_MINOR, NCCL_PATCH);
      return CH_INVALID_ARG;
    }
    if (user->version < (unsigned)NCCL_VERSION(2, 14, 0)) {
      WARN("ncclConfig_t: version %u is older than the first NCCL with ncclConfig_t (2.14, %d)", user->version,
           NCCL_VERSION(2, 14, 0));
      return CH_INVALID_ARG;
    }
    out->version = user->version;
    for (size_t i = 0; i < NINT_FIELDS; i++) {
      const struct cfg_field* f = &int_fields[i];
      if (!has_field(user, f->off, sizeof(int), f->since)) continue;
      int v = get_int(user, f->off);
      if (!check_value(v, f->ck)) {
        WARN("ncclConfig_t.%s is %d: it must be %s (or NCCL_CONFIG_UNDEF_INT)", f->name, v, check_text(f->ck));
        return CH_INVALID_ARG;
      }
      memcpy((char*)out + f->off, &v, sizeof(v));
    }
    if (has_field(user, offsetof(ncclConfig_t, netName), sizeof(void*), NCCL_VERSION(2, 17, 0)))
      out->netName = user->netName;
    if (has_field(user, offsetof(ncclConfig_t, commName), sizeof(void*), NCCL_VERSION(2, 27, 0)))
      out->commName = user->commName;
    if (out->minCTAs != NCCL_CONFIG_UNDEF_INT && out->maxCTAs != NCCL_CONFIG_UNDEF_INT && out->minCTAs > out->maxCTAs) {
      WARN("ncclConfig_t.minCTAs (%d) is larger than ncclConfig_t.maxCTAs (%d)", out->minCTAs, out->maxCTAs);
      return CH_INVALID_ARG;
    }
  }
  /* NCCL's variables override the config, as in NCCL; values NCCL ignores are ignored here too. */
  if (out->blocking == NCCL_CONFIG_UNDEF_INT) out->blocking = 1;
  int64_t blocking = param_int(PARAM_COMM_BLOCKING);
  if (blocking == 0 || blocking == 1) out->blocking = (int)blocking;
  int64_t peers = param_int(PARAM_P2P_MAX_PEERS);
  if (peers > 0) out->maxP2pPeers = (int)UT_MIN(peers, (int64_t)INT32_MAX);
  return CH_OK;
}

void comm_config_report(const ncclConfig_t* cfg, int rank) {
  /* One line per field set to something Chorus does not act on, so that nobody wonders. */
  for (size_t i = 0; i < NINT_FIELDS; i++) {
    const struct cfg_field* f = &int_fields[i];
    int v = get_int(cfg, f->off);
    if (f->effect && v != NCCL_CONFIG_UNDEF_INT)
      INFO(LOG_INIT, "rank %d: ncclConfig_t.%s=%d accepted without effect: %s", rank, f->name, v, f->effect);
  }
  if (cfg->netName)
    INFO(LOG_INIT,
         "rank %d: ncclConfig_t.netName=\"%.64s\" accepted without effect: the network is chosen once "
         "per process (NCCL_NET)",
         rank, cfg->netName);
}

/* ncclCollConfig_t: 2.31 is the first header that has it, so any real one is at least that size; a
 * larger one comes from a newer header, whose fields beyond ours are left unread (as NCCL does). */
ch_status coll_parse_config(const ncclCollConfig_t* user, const char* fn, ncclCollConfig_t* out) {
  static const ncclCollConfig_t def = NCCL_COLLCONFIG_INITIALIZER;
  *out = def;
  if (!user) return CH_OK;
  if (user->magic != NCCL_API_MAGIC) {
    WARN("%s: ncclCollConfig_t magic is 0x%x, not 0x%x: the config was not initialized with "
         "NCCL_COLLCONFIG_INITIALIZER",
         fn, user->magic, NCCL_API_MAGIC);
    return CH_INVALID_ARG;
  }
  if (user->size < sizeof(ncclCollConfig_t)) {
    WARN("%s: ncclCollConfig_t size %zu is smaller than the first header's (%zu bytes, NCCL 2.31)", fn, user->size,
         sizeof(ncclCollConfig_t));
    return CH_INVALID_ARG;
  }
  memcpy(out, user, sizeof(*out));
  const struct {
    const char* name;
    int v;
    enum cfg_check ck;
  } f[] = {{"minCTAs", out->minCTAs, CK_POS},     {"maxCTAs", out->maxCTAs, CK_POS},
           {"nvlsCTAs", out->nvlsCTAs, CK_POS},   {"cgaClusterSize", out->cgaClusterSize, CK_NONNEG},
           {"CTAPolicy", out->CTAPolicy, CK_CTA}, {"forceAlgSelection", out->forceAlgSelection, CK_BOOL}};
  for (size_t i = 0; i < sizeof(f) / sizeof(f[0]); i++) {
    /* forceAlgSelection has no "unset": only 0 and 1 */
    int bad = !check_value(f[i].v, f[i].ck) || (i == 5 && f[i].v == NCCL_CONFIG_UNDEF_INT);
    if (bad) {
      WARN("%s: ncclCollConfig_t.%s is %d: it must be %s", fn, f[i].name, f[i].v, check_text(f[i].ck));
      return CH_INVALID_ARG;
    }
  }
  if (out->minCTAs != NCCL_CONFIG_UNDEF_INT && out->maxCTAs != NCCL_CONFIG_UNDEF_INT && out->minCTAs > out->maxCTAs) {
    WARN("%s: ncclCollConfig_t.minCTAs (%d) is larger than maxCTAs (%d)", fn, out->minCTAs, out->maxCTAs);
    return CH_INVALID_ARG;
  }
  return CH_OK;
}
