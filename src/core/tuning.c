/* The one place that chooses algorithm, protocol and channel count, and says why (NCCL_DEBUG=INFO,
 * NCCL_DEBUG_SUBSYS=TUNING). On a GPU, LL/LL128 save a fence and a flag round trip; on a CPU the
 * Simple tail counter costs one cache line and the per-line flags cost more than they save.
 * Measured with all_reduce_perf -np 2 (docs/PERFORMANCE.md): all three tie up to ~128 B (0.95 us),
 * and Simple wins from 512 B up (at 32 KiB: Simple 5.8 us, LL128 10.4 us, LL 13.7 us). So LL is used
 * only for tiny messages, and LL128 only when NCCL_PROTO excludes Simple. */
#include <string.h>
#include <strings.h>

#include "../misc/log.h"
#include "../misc/param.h"
#include "../misc/utils.h"
#include "enqueue.h"

static const char* proto_names[CH_NPROTO] = {"LL", "LL128", "Simple"};
static const char* algo_names[ALGO_COUNT] = {"Tree", "Ring", "Exchange", "Direct"};
static const char* func_names[FUNC_COUNT] = {"Broadcast", "Reduce", "AllGather", "ReduceScatter", "AllReduce",
                                             "SendRecv", "Send", "Recv", "AlltoAll", "Scatter", "Gather"};

const char* tune_proto_name(int p) { return p >= 0 && p < CH_NPROTO ? proto_names[p] : "?"; }
const char* tune_algo_name(int a) { return a >= 0 && a < ALGO_COUNT ? algo_names[a] : "?"; }
const char* tune_func_name(int f) { return f >= 0 && f < FUNC_COUNT ? func_names[f] : "?"; }

#define LL_MAX_BYTES 64u

/* NCCL syntax: comma list of names, a leading ^ excludes them. Unknown names are reported. */
static unsigned parse_mask(const char* env, const char* value, const char** names, int n) {
  unsigned all = (1u << n) - 1;
  if (!value || !*value) return all;
  int invert = value[0] == '^';
  unsigned mask = 0;
  char buf[256];
  strncpy(buf, value + invert, sizeof(buf) - 1);
  buf[sizeof(buf) - 1] = 0;
  for (char *save = NULL, *tok = strtok_r(buf, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
    int found = 0;
    for (int i = 0; i < n; i++)
      if (strcasecmp(tok, names[i]) == 0) mask |= 1u << i, found = 1;
    if (!found) WARN("%s: unknown value '%s' ignored", env, tok);
  }
  mask = invert ? all & ~mask : mask;
  if (!mask) {
    WARN("%s=%s leaves nothing enabled; ignoring it", env, value);
    mask = all;
  }
  return mask;
}

/* Whether any two ranks of the communicator talk over the network, decided alike on every rank from
 * what all know: hosts, processes, and NCCL_SHM_DISABLE / NCCL_P2P_DISABLE (agreed at init). */
static int uses_net(const struct ncclComm* comm) {
  int n = comm->nranks, procs = 0;
  if (n < 2) return 0;
  for (int r = 1; r < n; r++) {
    if (comm->peers[r].host_hash != comm->peers[0].host_hash) return 1;
    procs |= comm->peers[r].proc_nonce != comm->peers[0].proc_nonce;
  }
  int shm_off = param_int(PARAM_SHM_DISABLE) != 0, p2p_off = param_int(PARAM_P2P_DISABLE) != 0;
  return shm_off && (procs || p2p_off);
}

void tune_init(struct ncclComm* comm) {
  comm->proto_mask = parse_mask("NCCL_PROTO", param_str(PARAM_PROTO), proto_names, CH_NPROTO);
  /* LL/LL128 readiness rests on flags stored last with release order; a recv() into a slot gives no
   * such order (the proxy publishes whole slots through tail), and only Simple steps record their
   * size for the proxy. So a communicator that uses the network runs Simple only. */
  if (uses_net(comm)) {
    if (!(comm->proto_mask & (1u << PROTO_SIMPLE)) && comm->rank == 0)
      WARN("NCCL_PROTO=%s: the network transport carries only the Simple protocol; using Simple",
           param_str(PARAM_PROTO));
    comm->proto_mask = 1u << PROTO_SIMPLE;
  }
  /* Only rings exist so far: NCCL_ALGO may name Tree, which falls back to Ring with a note. */
  comm->algo_mask = parse_mask("NCCL_ALGO", param_str(PARAM_ALGO), algo_names, ALGO_COUNT);
  if (!(comm->algo_mask & ~(1u << ALGO_TREE)) && comm->rank == 0)
    INFO(LOG_TUNING, "NCCL_ALGO=%s: Tree is not implemented on host memory; using Ring", param_str(PARAM_ALGO));
  comm->exchange_max_bytes = (size_t)param_int(PARAM_EXCHANGE_MAX_BYTES);
  comm->direct_min_bytes = (size_t)param_int(PARAM_DIRECT_MIN_BYTES);
  comm->stream_min_bytes = (size_t)param_int(PARAM_STREAM_MIN_BYTES);
  comm->shm_direct_min_bytes = (size_t)param_int(PARAM_SHM_DIRECT_MIN_BYTES);
  comm->min_nchannels = (int)UT_MAX(1, param_int(PARAM_MIN_NCHANNELS));
  comm->max_nchannels = (int)UT_MIN(comm->nchannels, UT_MAX(comm->min_nchannels, param_int(PARAM_MAX_NCHANNELS)));
}

void tune_choose(struct ncclComm* comm, int func, size_t bytes, struct tune_choice* out) {
  unsigned m = comm->proto_mask;
  const char* why;
  int p;
  if (bytes <= LL_MAX_BYTES && (m & (1u << PROTO_LL))) {
    p = PROTO_LL, why = "latency-bound size";
  } else if (m & (1u << PROTO_SIMPLE)) {
    p = PROTO_SIMPLE, why = "bandwidth-bound size";
  } else {
    p = (m & (1u << PROTO_LL128)) ? PROTO_LL128 : PROTO_LL, why = "NCCL_PROTO excludes Simple";
  }
  if (m != (1u << CH_NPROTO) - 1) why = "restricted by NCCL_PROTO";
  int minc = comm->min_nchannels, maxc = comm->max_nchannels;
  int nch = (int)UT_MIN((size_t)maxc, UT_MAX((size_t)minc, bytes >> 20));
  /* Two ranks: Exchange takes one hop instead of two (see algo/exchange_allreduce.c). */
  int exch = func == FUNC_ALLREDUCE && comm->nranks == 2 && (comm->algo_mask & (1u << ALGO_EXCHANGE)) &&
             bytes <= comm->exchange_max_bytes;
  /* Ranks read each other's buffers (see algo/direct_allreduce.c): threads of one process always;
   * processes when every rank's buffers come from ncclMemAlloc, which is known only when the call
   * runs, so the FIFO algorithm is kept as the fallback. That check costs a round trip: only for
   * sizes where it is small. */
  int direct = func == FUNC_ALLREDUCE && comm->clique && (comm->algo_mask & (1u << ALGO_DIRECT)) &&
               bytes >= (comm->clique->procs ? comm->shm_direct_min_bytes : comm->direct_min_bytes);
  out->fallback = exch ? ALGO_EXCHANGE : ALGO_RING;
  out->algo = direct ? ALGO_DIRECT : out->fallback;
  out->proto = p;
  out->nch = direct ? 1 : UT_MAX(1, UT_MIN(nch, comm->nchannels)); /* Direct works on the whole vector */
  /* A result larger than the caches is not read back soon: stream it (coll/red_stream.c). */
  size_t out_bytes = func == FUNC_ALLGATHER ? bytes * (size_t)comm->nranks : bytes;
  out->stream = out_bytes >= comm->stream_min_bytes;
  INFO(LOG_TUNING, "%s %zu bytes: algorithm %s%s%s, protocol %s (%s), %d channel(s)%s",
       func < FUNC_COUNT ? func_names[func] : "?", bytes, algo_names[out->algo],
       direct && comm->clique->procs ? " if all buffers are from ncclMemAlloc, else " : "",
       direct && comm->clique->procs ? algo_names[out->fallback] : "", proto_names[p], why, out->nch,
       out->stream ? ", streaming stores" : "");
}
