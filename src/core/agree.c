/* Settings that decide how ranks talk to each other (FIFO sizes, protocols, algorithms, channels,
 * size thresholds) must be equal on every rank: a difference hangs or corrupts a call, far from its
 * cause. They are compared once at init, in one bootstrap allgather, and a difference is reported
 * by name on every rank. Settings that only shape this rank's own work (spinning, streaming stores,
 * logging) may differ and are not compared. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../misc/log.h"
#include "../misc/param.h"
#include "../misc/utils.h"
#include "../comm/work.h"
#include "../tune/topo.h"
#include "../tune/tune.h"
#include "exec.h"
#include "init.h"

enum agree_fmt { AG_INT, AG_PROTO_MASK, AG_ALGO_MASK };

/* A one-sided count of the config as it takes effect: NCCL's default 1 when unset (api/window.c). */
static int rma_count(int v) { return v == NCCL_CONFIG_UNDEF_INT ? 1 : v; }

/* One row per setting: the name a user can act on, how to print it, and its value as this rank uses
 * it (after defaults and rounding, so equivalent spellings agree). Add new settings here only. */
#define AGREE_TABLE(X)                                                                              \
  X("NCCL_PROTO", AG_PROTO_MASK, tune_agree_value(c, 0))                                            \
  X("NCCL_ALGO", AG_ALGO_MASK, tune_agree_value(c, 1))                                              \
  X("NCCL_TUNER_PLUGIN (a tuner plugin loaded)", AG_INT, c->tuner != NULL)                          \
  X("NCCL_SOCKET_NTHREADS x NCCL_NSOCKS_PERTHREAD (sockets per peer)", AG_INT, c->tune_net ? tune_net_socks() : 1) \
  X("NCCL_MAX_NCHANNELS/NCCL_MIN_NCHANNELS/ncclConfig_t.minCTAs,maxCTAs (channel count)", AG_INT, c->nchannels) \
  X("NCCL_MIN_NCHANNELS/ncclConfig_t.minCTAs", AG_INT, UT_MIN(c->min_nchannels, c->nchannels))      \
  X("NCCL_BUFFSIZE", AG_INT, c->sizes.buff[PROTO_SIMPLE])                                           \
  X("NCCL_LL_BUFFSIZE", AG_INT, c->sizes.buff[PROTO_LL])                                            \
  X("NCCL_LL128_BUFFSIZE", AG_INT, c->sizes.buff[PROTO_LL128])                                      \
  X("CHORUS_P2P_MEM (per-peer FIFO bytes)", AG_INT, c->p2p_sizes.buff[PROTO_SIMPLE])             \
  X("NCCL_SHM_DISABLE", AG_INT, param_int(PARAM_SHM_DISABLE) != 0)                                  \
  X("NCCL_P2P_DISABLE", AG_INT, param_int(PARAM_P2P_DISABLE) != 0)                                  \
  X("CHORUS_EXCHANGE_MAX_BYTES", AG_INT, c->exchange_max_bytes)                                     \
  X("CHORUS_DIRECT_MIN_BYTES", AG_INT, c->direct_min_bytes)                                         \
  X("CHORUS_SHM_DIRECT_MIN_BYTES", AG_INT, c->shm_direct_min_bytes)                                 \
  X("CHORUS_CMA", AG_INT, param_int(PARAM_CMA) != 0)                                                 \
  X("ncclConfig_t.numRmaCtx (one-sided contexts; unset: 1)", AG_INT, rma_count(c->config.numRmaCtx))   \
  X("ncclConfig_t.numRmaSig (one-sided signals; unset: 1)", AG_INT, rma_count(c->config.numRmaSig))   \
  X("CHORUS_CMA_MIN_BYTES", AG_INT, param_int(PARAM_CMA_MIN_BYTES))                                  \
  X("CHORUS_RING_ORDER", AG_INT, topo_ring_order())                                                 \
  X("CHORUS_TREE_PER_RANK", AG_INT, param_int(PARAM_TREE_PER_RANK) != 0)                            \
  X("CHORUS_TUNE_FILE (cost model constants)", AG_INT, tune_model_hash())                          \
  X("CHORUS_CUDA_DIRECT", AG_INT, param_int(PARAM_CUDA_DIRECT) != 0)                                \
  X("CHORUS_REPRODUCIBLE (0 off, 1 order, 2 exact)", AG_INT, c->repro)                              \
  X("CHORUS_WIRE_FORMAT (0 off, 1 bf16, 2 fp16, 3 fp8e4m3, 4 fp8e5m2, 5 mx8; +256 forced)", AG_INT, c->wire) \
  X("CHORUS_WIRE_HOPS (0 net, 1 all)", AG_INT, c->wire_all)

#define AG_COUNT_ROW(name, fmt, expr) +1
enum { AGREE_NROWS = 0 AGREE_TABLE(AG_COUNT_ROW) };

struct agree_row {
  const char* name;
  int fmt;
};
static const struct agree_row rows[AGREE_NROWS] = {
#define AG_ROW(name, fmt, expr) {name, fmt},
    AGREE_TABLE(AG_ROW)
#undef AG_ROW
};

/* What each rank sends: the number of rows (a build with another table is told apart) and values.
 * Values from peers are only compared and printed. */
struct agree_msg {
  uint32_t nrows;
  uint32_t pad;
  int64_t v[AGREE_NROWS];
  struct gpu_hello gpu; /* not a setting: carried for gpu_setup, which compares it itself */
  int32_t p2p_cap; /* not a setting either: may differ; the smallest sizes the waves (pool.h) */
  int32_t link_mbits; /* the speed of this rank's bootstrap interface (-1 unknown): the slowest known
                       * one is the link the automatic wire format weighs (api/wire_api.c) */
};

static void fill(const struct ncclComm* c, struct agree_msg* m) {
  memset(m, 0, sizeof(*m));
  m->nrows = AGREE_NROWS;
  int i = 0;
  /* size_t thresholds of -1 ("never"/"always") print as -1 through the int64_t cast */
#define AG_FILL(name, fmt, expr) m->v[i++] = (int64_t)(expr);
  AGREE_TABLE(AG_FILL)
#undef AG_FILL
}

/* Bounded append to out[cap] at *len. */
static void put(char* out, size_t cap, size_t* len, const char* fmt, ...) __attribute__((format(printf, 4, 5)));
static void put(char* out, size_t cap, size_t* len, const char* fmt, ...) {
  if (*len >= cap) return;
  va_list ap;
  va_start(ap, fmt);
  int n = vsnprintf(out + *len, cap - *len, fmt, ap);
  va_end(ap);
  if (n > 0) *len = UT_MIN(cap, *len + (size_t)n);
}

static void put_value(char* out, size_t cap, size_t* len, int fmt, int64_t v) {
  if (fmt == AG_INT) {
    put(out, cap, len, "%lld", (long long)v);
    return;
  }
  char text[512];
  tune_mask_format(fmt == AG_ALGO_MASK, v, text, sizeof(text));
  put(out, cap, len, "%s", text);
}

/* "0,2-3": the ranks whose row `row` holds value v. */
static int put_ranks(char* out, size_t cap, size_t* len, const struct agree_msg* all, int n, int row, int64_t v) {
  int count = 0;
  const char* sep = "";
  for (int r = 0; r < n; r++) {
    if (all[r].v[row] != v) continue;
    int e = r;
    while (e + 1 < n && all[e + 1].v[row] == v) e++;
    if (e == r) put(out, cap, len, "%s%d", sep, r);
    else put(out, cap, len, "%s%d-%d", sep, r, e);
    count += e - r + 1;
    sep = ",";
    r = e;
  }
  return count;
}

/* One WARN for a differing row: each distinct value (in order of first appearance) and its ranks. */
static void report(int row, const struct agree_msg* all, int n) {
  char text[1024], ranks[512];
  size_t len = 0, cap = sizeof(text);
  put(text, cap, &len, "%s differs across ranks:", rows[row].name);
  int shown = 0;
  for (int r = 0; r < n; r++) {
    int seen = 0;
    for (int q = 0; q < r && !seen; q++) seen = all[q].v[row] == all[r].v[row];
    if (seen) continue;
    if (shown == 8) {
      put(text, cap, &len, ", and more values");
      break;
    }
    put(text, cap, &len, "%s ", shown ? "," : "");
    put_value(text, cap, &len, rows[row].fmt, all[r].v[row]);
    size_t rlen = 0;
    int count = put_ranks(ranks, sizeof(ranks), &rlen, all, n, row, all[r].v[row]);
    put(text, cap, &len, " on rank%s %s", count == 1 ? "" : "s", ranks);
    shown++;
  }
  put(text, cap, &len, "; it must be the same on every rank");
  if (len >= cap - 1) memcpy(text + cap - 4, "...", 4);
  WARN("%s", text);
}

ch_status comm_agree(struct ncclComm* comm) {
  int n = comm->nranks;
  if (n == 1) return CH_OK;
  struct agree_msg* all = calloc((size_t)n, sizeof(*all));
  if (!all) {
    WARN("out of memory comparing settings across %d ranks", n);
    return CH_SYSTEM;
  }
  fill(comm, &all[comm->rank]);
  if (ch_comm_hooks.hello) ch_comm_hooks.hello(comm, &all[comm->rank].gpu);
  all[comm->rank].p2p_cap = comm->p2p_cap;
  all[comm->rank].link_mbits = comm->peers ? sock_addr_speed_mbits(&comm->peers[comm->rank].listen_addr) : -1;
  ch_status s = boot_allgather(comm->boot, all, sizeof(*all));
  if (s == CH_OK && !(comm->gpu_hellos = calloc((size_t)n, sizeof(struct gpu_hello)))) {
    WARN("out of memory keeping %d ranks' CUDA hellos", n); /* gpu_setup's allgathers need every rank */
    s = CH_SYSTEM;
  }
  for (int r = 0; s == CH_OK && r < n; r++) comm->gpu_hellos[r] = all[r].gpu;
  comm->p2p_wave = comm->p2p_cap;
  for (int r = 0; s == CH_OK && r < n; r++) /* a peer's word, but only ever a size: bounded */
    if (all[r].p2p_cap >= 1 && all[r].p2p_cap < comm->p2p_wave) comm->p2p_wave = all[r].p2p_cap;
  comm->wire_link_mbs = 0;
  for (int r = 0; s == CH_OK && r < n; r++) { /* likewise bounded: only compared */
    int32_t m = all[r].link_mbits;
    if (m > 0 && m <= 10000000 && (comm->wire_link_mbs == 0 || m / 8 < comm->wire_link_mbs))
      comm->wire_link_mbs = m / 8 > 0 ? m / 8 : 1;
  }
  int bad = 0;
  for (int r = 0; s == CH_OK && r < n; r++) {
    if (all[r].nrows != AGREE_NROWS) {
      WARN("rank %d: rank %d compares %u settings at init, this rank %d: different Chorus builds?", comm->rank, r,
           all[r].nrows, AGREE_NROWS);
      s = CH_INVALID_USAGE;
    }
  }
  for (int i = 0; s == CH_OK && i < AGREE_NROWS; i++) {
    int differs = 0;
    for (int r = 1; r < n && !differs; r++) differs = all[r].v[i] != all[0].v[i];
    if (differs) report(i, all, n);
    bad |= differs;
  }
  free(all);
  return s == CH_OK && bad ? CH_INVALID_USAGE : s;
}

/* chorusCommSetReproducible on every rank: the levels compared in one bootstrap allgather before any
 * takes effect, so ranks that ask for different levels are told by name on every rank, instead of
 * running different algorithms and waiting for each other. */
ch_status comm_agree_repro(struct ncclComm* comm, int level) {
  int n = comm->nranks;
  if (n == 1) return CH_OK;
  int64_t* all = calloc((size_t)n, sizeof(*all));
  if (!all) {
    WARN("out of memory comparing reproducible levels across %d ranks", n);
    return CH_SYSTEM;
  }
  all[comm->rank] = level;
  ch_status s = boot_allgather(comm->boot, all, sizeof(*all));
  for (int r = 1; s == CH_OK && r < n; r++)
    if (all[r] != all[0]) {
      WARN("chorusCommSetReproducible: rank 0 asked for level %lld but rank %d for level %lld (0 off, 1 order, "
           "2 exact); every rank must set the same level: the communicator keeps level %d",
           (long long)all[0], r, (long long)all[r], comm->repro);
      s = CH_INVALID_USAGE;
    }
  free(all);
  return s;
}
