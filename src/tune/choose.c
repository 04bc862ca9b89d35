/* The one place that chooses algorithm, protocol and channel count, and says why (NCCL_DEBUG=INFO,
 * NCCL_DEBUG_SUBSYS=TUNING). The choice is the cheapest prediction of a cost model in NCCL's form
 * (latency per step + bytes / bandwidth, per collective x algorithm x protocol x channels), among
 * what NCCL_ALGO/NCCL_PROTO allow and this communicator can run; a tuner plugin may edit the
 * predictions first (tune/tuner_plugin.c). docs/TUNING.md describes the model and where each constant
 * comes from. */
#include <stdio.h>
#include <string.h>
#include <strings.h>

#include "../misc/log.h"
#include "../misc/param.h"
#include "../misc/utils.h"
#include "../algo/algo.h"
#include "../reduce/wire.h"
#include "plugin_abi.h"
#include "tune.h"

/* The names are misc/names.h's; "?" for a value that has none. */
const char* tune_proto_name(int p) { return p >= 0 && p < CH_NPROTO ? ch_proto_name(p) : "?"; }
const char* tune_func_name(int f) { return f >= 0 && f < FUNC_COUNT ? ch_func_name(f) : "?"; }

/* Whether any two ranks of the communicator talk over the network, decided alike on every rank from
 * what all know: hosts, processes, and NCCL_SHM_DISABLE / NCCL_P2P_DISABLE (agreed at init). */
int tune_uses_net(const struct ncclComm* comm) {
  /* Rank 0's transport to each rank, by the transports' own probes: a pair of other ranks needs the
   * network only when one of them needs it to reach rank 0 too (other host, or no shared memory). */
  const struct boot_rank_info* r0 = &comm->peers[0];
  for (int r = 1; r < comm->nranks; r++) {
    const struct boot_rank_info* p = &comm->peers[r];
    struct tp_peer tp = {.same_host = p->host_hash == r0->host_hash};
    tp.same_proc = tp.same_host && p->proc_nonce == r0->proc_nonce;
    const char* why;
    if (tp_flags(tp_choose(&tp, &why)) & TP_F_NETWORK) return 1;
  }
  return 0;
}

int tune_net_socks(void) {
  int64_t threads = UT_MAX(1, UT_MIN(16, param_int(PARAM_SOCKET_NTHREADS)));
  int64_t socks = UT_MAX(1, UT_MIN((int64_t)CH_MAX_CHANNELS, param_int(PARAM_NSOCKS_PERTHREAD))); /* no overflow below */
  return (int)UT_MIN((int64_t)CH_MAX_CHANNELS, threads * socks);
}

static void tune_wire_init(struct ncclComm* comm);

void tune_init(struct ncclComm* comm) {
  comm->tune_bad = 0;
  /* A malformed value fails init, after comm_agree has compared it across ranks (tune_check). */
  if (tune_parse("NCCL_PROTO", param_str(PARAM_PROTO), 0, comm->proto_mask) != CH_OK) comm->tune_bad |= 1;
  if (tune_parse("NCCL_ALGO", param_str(PARAM_ALGO), 1, comm->algo_mask) != CH_OK) comm->tune_bad |= 2;
  /* LL/LL128 readiness rests on flags stored last with release order; a recv() into a slot gives no
   * such order (the proxy publishes whole slots through tail), and only Simple steps record their
   * size for the proxy. So a communicator that uses the network runs Simple only. */
  if (tune_parse_repro(param_str(PARAM_REPRODUCIBLE), &comm->repro) != CH_OK) comm->tune_bad |= 4;
  tune_wire_init(comm);
  comm->tune_net = tune_uses_net(comm);
  tune_shape(comm);
  comm->model = tune_model_get(); /* CHORUS_TUNE_FILE is looked up once per communicator */
  comm->proto_ok = comm->tune_net ? 1u << PROTO_SIMPLE : (1u << CH_NPROTO) - 1;
  comm->exchange_max_bytes = (size_t)param_int(PARAM_EXCHANGE_MAX_BYTES);
  comm->direct_min_bytes = (size_t)param_int(PARAM_DIRECT_MIN_BYTES);
  comm->nt_min_bytes = (size_t)param_int(PARAM_STREAM_MIN_BYTES);
  comm->shm_direct_min_bytes = (size_t)param_int(PARAM_SHM_DIRECT_MIN_BYTES);
  comm->min_nchannels = (int)UT_MAX(1, param_int(PARAM_MIN_NCHANNELS));
  if (comm->config.minCTAs != NCCL_CONFIG_UNDEF_INT) /* as NCCL: the larger of the two minimums */
    comm->min_nchannels = UT_MIN(comm->nchannels, UT_MAX(comm->min_nchannels, comm->config.minCTAs));
  comm->max_nchannels = (int)UT_MIN(comm->nchannels, UT_MAX(comm->min_nchannels, param_int(PARAM_MAX_NCHANNELS)));
  /* Striping over sockets (init.c): large calls may use that many channels, a socket each per peer. */
  if (comm->tune_net) comm->max_nchannels = UT_MAX(comm->max_nchannels, UT_MIN(comm->nchannels, tune_net_socks()));
  tuner_open(comm);
}

ch_status tune_parse_repro(const char* v, int* level) {
  static const char* names[] = {"off", "order", "exact"};
  if (!v || !*v) v = "off";
  for (int i = 0; i < 3; i++)
    if (ch_name_is(v, strlen(v), names[i], 1) && strlen(v) == strlen(names[i])) {
      *level = i;
      return CH_OK;
    }
  WARN("CHORUS_REPRODUCIBLE=%s: expected off, order or exact", v);
  return CH_INVALID_USAGE;
}

int tune_repro_level(const struct ncclComm* comm, int func, int type) {
  int reduces = func == FUNC_ALLREDUCE || func == FUNC_REDUCESCATTER || func == FUNC_REDUCE;
  return reduces && comm->nranks > 1 && red_type_is_float(type) ? comm->repro : CH_REPRO_OFF;
}

/* The algorithms that honour a reproducible level: Owner anywhere, Direct for AllReduce on one host
 * (both combine every rank's value of an element at one place, reduce/repro.c). */
static unsigned repro_algos(const struct ncclComm* comm, int func) {
  unsigned m = 1u << ALGO_OWNER;
  if (func == FUNC_ALLREDUCE && comm->clique && comm->nranks <= 64) m |= 1u << ALGO_DIRECT; /* see direct_allreduce.c */
  return m;
}

int64_t tune_agree_value(const struct ncclComm* comm, int is_algo) {
  if (comm->tune_bad & (is_algo ? 2 : 1)) return TUNE_MALFORMED;
  return tune_mask_pack(is_algo, is_algo ? comm->algo_mask : comm->proto_mask);
}

/* CHORUS_WIRE_FORMAT / CHORUS_WIRE_HOPS (a bad value, or a format with a reproducible level, fails init
 * after the ranks compared them: tune_check). */
static void tune_wire_init(struct ncclComm* comm) {
  const char* f = param_str(PARAM_WIRE_FORMAT), *h = param_str(PARAM_WIRE_HOPS);
  int w = wire_parse(f);
  if (w < 0) {
    WARN("CHORUS_WIRE_FORMAT=%.64s: not one of off, bf16, fp16, fp8e4m3, fp8e5m2, mx8 (a trailing ! forces it)", f);
    comm->tune_bad |= 8, w = 0;
  } else if (w && comm->repro) {
    WARN("CHORUS_WIRE_FORMAT=%.64s with CHORUS_REPRODUCIBLE=%s: a compressed wire format rounds partial results "
         "differently by placement, so it cannot be reproducible; unset one of them", f,
         comm->repro == CH_REPRO_EXACT ? "exact" : "order");
    comm->tune_bad |= 8, w = 0;
  }
  atomic_store(&comm->wire, w);
  comm->wire_all = h && strcasecmp(h, "all") == 0;
  if (h && *h && !comm->wire_all && strcasecmp(h, "net") != 0) {
    WARN("CHORUS_WIRE_HOPS=%.64s: not net or all", h);
    comm->tune_bad |= 8;
  }
}

ch_status tune_check(struct ncclComm* comm) {
  return comm->tune_bad || tune_model_status() != CH_OK ? CH_INVALID_USAGE : CH_OK;
}

void tune_fini(struct ncclComm* comm) { tuner_close(comm); }

/* Algorithms this communicator can run for func, whatever NCCL_ALGO says. Update when an algorithm
 * is added. */
unsigned tune_runnable_algos(const struct ncclComm* comm, int func) {
  unsigned m = 0;
  if (func < TUNE_P2P) m |= 1u << ALGO_RING;
  if (func == FUNC_ALLREDUCE && comm->nranks == 2) m |= 1u << ALGO_EXCHANGE;
  if (func == FUNC_ALLREDUCE && comm->clique) m |= 1u << ALGO_DIRECT;
  if (comm->nranks > 1 && func == FUNC_ALLREDUCE) m |= 1u << ALGO_RECDBL | 1u << ALGO_RABEN;
  if (comm->nranks > 1 && (func == FUNC_ALLREDUCE || func == FUNC_BROADCAST || func == FUNC_REDUCE))
    m |= 1u << ALGO_TREE;
  return m;
}

int tune_peer_algos(const struct ncclComm* comm) {
  if (comm->nranks <= 2) return 0; /* run as Ring there (choose) */
  unsigned peer = 1u << ALGO_RECDBL | 1u << ALGO_RABEN | 1u << ALGO_TREE;
  for (int f = 0; f < TUNE_P2P; f++)
    if (comm->algo_mask[f] & tune_runnable_algos(comm, f) & peer) return 1;
  return 0;
}

static void put_names(unsigned m, int is_algo, int nbits, char* out, size_t cap) {
  size_t len = 0;
  out[0] = 0;
  for (int b = 0; b < nbits && len < cap; b++)
    if (m & (1u << b)) {
      int k = snprintf(out + len, cap - len, "%s%s", len ? "," : "", tune_bit_name(is_algo, b));
      if (k > 0) len += (size_t)k;
    }
  if (!out[0]) snprintf(out, cap, "none");
}

ch_status tune_check_call(struct ncclComm* comm, int func, int type) {
  if (comm->nranks == 1) return CH_OK; /* a local copy: nothing to choose */
  int i = tune_mask_index(func);
  const char* fn = tune_func_name(func);
  char a[160], b[160];

  if (!(comm->proto_mask[i] & comm->proto_ok)) {
    put_names(comm->proto_mask[i], 0, CH_NPROTO, a, sizeof(a));
    put_names(comm->proto_ok, 0, CH_NPROTO, b, sizeof(b));
    WARN("%s: NCCL_PROTO=%s leaves it no protocol this communicator can use (allowed for %s: %s; runnable: %s%s)",
         fn, param_str(PARAM_PROTO), fn, a, b, comm->proto_ok == 1u << PROTO_SIMPLE ?
         ", as the network transport carries only Simple" : "");
    return CH_INVALID_USAGE;
  }
  int repro = tune_repro_level(comm, func, type);
  if (repro && !(comm->algo_mask[i] & repro_algos(comm, func))) {
    put_names(comm->algo_mask[i], 1, TUNE_ALGO_NBITS, a, sizeof(a));
    put_names(repro_algos(comm, func), 1, TUNE_ALGO_NBITS, b, sizeof(b));
    WARN("%s: NCCL_ALGO=%s leaves it no algorithm that honours the reproducible level %s (allowed: %s; "
         "the ones that do here: %s); unset NCCL_ALGO or allow one of them", fn, param_str(PARAM_ALGO),
         repro == CH_REPRO_EXACT ? "exact" : "order", a, b);
    return CH_INVALID_USAGE;
  }
  if (repro) return CH_OK; /* Owner (or Direct) runs it, whatever else NCCL_ALGO allows */
  if (func < TUNE_P2P && !(comm->algo_mask[i] & tune_runnable_algos(comm, func))) {
    put_names(comm->algo_mask[i], 1, TUNE_ALGO_NBITS, a, sizeof(a));
    put_names(tune_runnable_algos(comm, func), 1, TUNE_ALGO_NBITS, b, sizeof(b));
    WARN("%s: NCCL_ALGO=%s leaves it no algorithm Chorus can run (allowed for %s: %s; Chorus runs %s here: "
         "CollNet, NVLS and PAT are not implemented, Tree serves AllReduce, Broadcast and Reduce, RecDbl and Rabenseifner AllReduce, "
         "Exchange needs 2 ranks, "
         "Direct one host, Owner the reproducible levels of CHORUS_REPRODUCIBLE only)",
         fn, param_str(PARAM_ALGO), fn, a, b);
    return CH_INVALID_USAGE;
  }
  return CH_OK;
}

/* Across hosts (tune/shape.c; chorus-sim, docs/SCALE.md): a hop within a host costs what it costs on
 * one host (the FIFO's step and copies, or the network transport's where ranks of a host use it), a
 * hop between hosts net_step_us, and its bytes go through the host's NIC, shared by the host's ranks
 * that cross at once (net_bw is what one connection moves, and the model assumes it fills a NIC).
 * b: the call's bytes; steps and traffic as predict_us has them on one host. */
static double across_hosts_us(const struct ncclComm* comm, int func, int algo, int proto, double b, int nch,
                              double steps, double traffic) {
  const struct tune_model* m = comm->model;
  double nlat = m->net_step_us, nper = 1.0 / m->net_bw;
  double llat = comm->tune_local_net ? nlat : m->step_us[proto];
  double lper =
      comm->tune_local_net ? nper : 2.0 / (m->copy_bw * m->proto_eff[proto] * (1.0 + m->chan_gain * (nch - 1)));
  if (algo == ALGO_RING) { /* ring_cross of its n hops cross hosts, one rank a NIC; the slowest hop sets the pace */
    double cross = steps * comm->tune_ring_cross / comm->nranks;
    return cross * nlat + (steps - cross) * llat + b * traffic * (nper > lper ? nper : lper);
  }
  if (algo == ALGO_TREE && func == FUNC_ALLREDUCE) {
    /* One rank a host crosses, but the two trees' steps, interleaved chunk by chunk, do not pipeline
     * across the levels between hosts: chorus-sim gives 4 x levels x bytes / net_bw (12, 29 and 54 x
     * at 8, 128 and 8,192 hosts of 8 ranks), where the old form had 2. */
    int up = comm->tune_tree_net, local = comm->tree_depth - up;
    double bw = 4.0 * up * nper > 2.0 * lper ? 4.0 * up * nper : 2.0 * lper;
    return 2.0 * (up * nlat + local * llat) + b * bw;
  }
  /* RecDbl and Rabenseifner rounds, and Tree Broadcast/Reduce's binomial links (the same pairs): a
   * round at distance 2^k crosses hosts with tune_pof2_share[k] of a host's ranks at once. RecDbl
   * moves the whole vector every round, Rabenseifner 2^k / p of it twice (halving, then doubling);
   * the binomial tree's root sends the whole vector once a round. */
  struct algo_pof2 p = algo_pof2_of(0, comm->nranks);
  double t = 0;
  if (p.p != comm->nranks) { /* the folds: the whole vector in and out (Tree: one hop, its time in the rounds) */
    int s = comm->tune_fold_share;
    if (algo == ALGO_TREE) t += s ? nlat : llat;
    else t += 2.0 * (s ? nlat + b * s * nper : llat + b * lper);
  }
  for (int k = 0; k < p.log && k < 32; k++) {
    int s = comm->tune_pof2_share[k], reps = algo == ALGO_RABEN ? 2 : 1;
    double part = algo == ALGO_RABEN ? (double)(1u << k) / p.p : 1.0;
    t += reps * (s ? nlat + b * part * s * nper : llat + b * part * lper);
  }
  return t;
}

/* Per rank, in units of the call's bytes: steps (hops one after another), bytes moved, and copies per
 * byte moved (FIFO algorithms copy into and out of the FIFO; Direct reads peers' buffers in place).
 * net: hops cross the network transport (its latency and bandwidth replace the memory copy's). */
static double predict_us(const struct ncclComm* comm, int func, int algo, int proto, size_t bytes, int nch) {
  const struct tune_model* model = comm->model;
  int n = comm->nranks, net = comm->tune_net;
  double steps, traffic, copies = 2.0;
  double dn = n;
  if (algo == ALGO_DIRECT) {
    traffic = 2.0 * (dn - 1) / dn; /* read peers' inputs, write peers' outputs: its segment */
    return model->direct_us + (double)bytes * traffic / model->copy_bw;
  }
  if (algo == ALGO_OWNER) { /* a hop to the owners (and one back): the ring's bytes */
    steps = func == FUNC_REDUCESCATTER ? 1 : 2;
    traffic = func == FUNC_REDUCESCATTER ? dn - 1 : 2 * (dn - 1) / dn;
    if (net) return steps * model->net_step_us + (double)bytes * traffic / model->net_bw;
    return steps * model->step_us[proto] + (double)bytes * traffic * copies / (model->copy_bw * model->proto_eff[proto]);
  }
  if (n == 1) {
    steps = 0, traffic = 1, copies = 1; /* local copy */
  } else if (algo == ALGO_EXCHANGE) {
    steps = 1, traffic = 1;
  } else if (algo == ALGO_TREE && (func == FUNC_BROADCAST || func == FUNC_REDUCE)) {
    int p = 1, log = 0; /* binomial over the largest power of two p <= n, extra ranks folded */
    while (p * 2 <= n) p *= 2, log++;
    steps = log + (p != n ? 1 : 0), traffic = log; /* the root exchanges with log2(p) children */
  } else if (algo == ALGO_TREE) {
    /* up then down; each rank receives (or sends) its half from up to two children per tree, for
     * both halves: about twice the bytes per rank, and the whole up phase precedes the down phase */
    steps = 2.0 * comm->tree_depth, traffic = 2;
  } else if (algo == ALGO_RECDBL || algo == ALGO_RABEN) {
    int p = 1, log = 0;
    while (p * 2 <= n) p *= 2, log++;
    int fold = p != n ? 2 : 0; /* extra ranks: the whole vector in and out */
    if (algo == ALGO_RECDBL) steps = log + fold, traffic = steps; /* the whole vector every hop */
    else steps = 2 * log + fold, traffic = 2.0 * (p - 1) / p + fold;
  } else if (func == FUNC_ALLREDUCE) {
    steps = 2 * (dn - 1), traffic = 2 * (dn - 1) / dn;
  } else if (func == FUNC_ALLGATHER || func == FUNC_REDUCESCATTER) {
    steps = dn - 1, traffic = dn - 1; /* bytes: one rank's block */
  } else if (func == FUNC_BROADCAST || func == FUNC_REDUCE) {
    steps = dn - 1, traffic = 1; /* pipelined along the ring */
  } else if (func >= FUNC_ALLTOALL) {
    steps = dn - 1, traffic = dn - 1; /* a block to or from each peer */
  } else {
    steps = 1, traffic = 1; /* send/recv */
  }
  /* Several hosts: which hops cross them, and how many ranks share a NIC (one host: as before). */
  if (net && comm->tune_hosts > 1 && n > 2 && func < TUNE_P2P)
    return across_hosts_us(comm, func, algo, proto, (double)bytes, nch, steps, traffic);
  double bw = model->copy_bw * model->proto_eff[proto] * (1.0 + model->chan_gain * (nch - 1));
  if (net) return steps * model->net_step_us + (double)bytes * traffic / model->net_bw;
  return steps * model->step_us[proto] + (double)bytes * traffic * copies / bw;
}

/* What the choice compares (and a plugin sees): the prediction, with LL above its size penalised so
 * that it is taken only when nothing else is allowed. Logs and ncclGroupSimulateEnd get predict_us. */
static double cost_us(const struct ncclComm* comm, int func, int algo, int proto, size_t bytes, int nch) {
  const struct tune_model* model = comm->model;
  double t = predict_us(comm, func, algo, proto, bytes, nch);
  return proto == PROTO_LL && algo != ALGO_DIRECT && bytes > model->ll_max_bytes ? t * model->ll_penalty : t;
}

/* Algorithms allowed and runnable for this call. The size thresholds (CHORUS_EXCHANGE_MAX_BYTES,
 * CHORUS_*DIRECT_MIN_BYTES) bound where Chorus's own algorithms run; where they rule out everything
 * NCCL_ALGO allows, Ring runs the call (what Exchange and Direct fall back to). */
static unsigned eligible(const struct ncclComm* comm, int func, size_t bytes, int repro) {
  if (comm->nranks == 1 || func >= TUNE_P2P) return 1u << ALGO_RING;
  unsigned allow = comm->algo_mask[func] & tune_runnable_algos(comm, func), e = allow;
  if (repro) { /* only what honours the level; Owner whatever NCCL_ALGO says (tune_check_call refused that) */
    e = comm->algo_mask[func] & repro_algos(comm, func);
    if ((e & (1u << ALGO_DIRECT)) && bytes < (comm->clique->procs ? comm->shm_direct_min_bytes : comm->direct_min_bytes))
      e &= ~(1u << ALGO_DIRECT);
    return e ? e : 1u << ALGO_OWNER;
  }
  if (bytes > comm->exchange_max_bytes) e &= ~(1u << ALGO_EXCHANGE);
  if ((e & (1u << ALGO_DIRECT)) && bytes < (comm->clique->procs ? comm->shm_direct_min_bytes : comm->direct_min_bytes))
    e &= ~(1u << ALGO_DIRECT);
  /* Tree Broadcast/Reduce save hops, which cost little within a host: measured there, back-to-back
   * calls ran as fast or faster on Ring (the root's log2(n) sends per call weigh more); across
   * hosts Tree wins small messages (PERFORMANCE.md). Chosen there only, or when forced. */
  if ((func == FUNC_BROADCAST || func == FUNC_REDUCE) && !comm->tune_net && (e & ~(1u << ALGO_TREE)))
    e &= ~(1u << ALGO_TREE);
  return e ? e : 1u << ALGO_RING;
}

/* Preference among equal predictions: Chorus's specialised algorithms first, Simple first. */
static const int algo_order[ALGO_COUNT] = {ALGO_DIRECT, ALGO_EXCHANGE, ALGO_RING, ALGO_RECDBL, ALGO_RABEN, ALGO_TREE,
                                           ALGO_OWNER};
static const int proto_order[CH_NPROTO] = {PROTO_SIMPLE, PROTO_LL128, PROTO_LL};

/* Cheapest entry of cost (negative: not available); 0 if none. */
static int cheapest(double cost[ALGO_COUNT][CH_NPROTO], int* algo, int* proto) {
  int found = 0;
  for (int i = 0; i < ALGO_COUNT; i++)
    for (int j = 0; j < CH_NPROTO; j++) {
      int a = algo_order[i], p = proto_order[j];
      if (cost[a][p] < 0) continue;
      if (!found || cost[a][p] < cost[*algo][*proto]) *algo = a, *proto = p, found = 1;
    }
  return found;
}

/* Ask the plugin (NCCL columns only: Chorus's own algorithms keep the model's predictions). Entries
 * Chorus cannot run stay unavailable whatever the plugin writes. Returns 1 if its table was used. */
static int consult_tuner(struct ncclComm* comm, int func, size_t bytes, double t[ALGO_COUNT][CH_NPROTO],
                         double cost[ALGO_COUNT][CH_NPROTO], int* nch) {
  float table[NCCL_NUM_ALGORITHMS][NCCL_NUM_PROTOCOLS];
  for (int a = 0; a < NCCL_NUM_ALGORITHMS; a++)
    for (int p = 0; p < NCCL_NUM_PROTOCOLS; p++) table[a][p] = (float)NCCL_ALGO_PROTO_IGNORE;
  static const int shown[] = {ALGO_TREE, ALGO_RING}; /* same ids in NCCL's table */
  for (int k = 0; k < 2; k++)
    for (int p = 0; p < CH_NPROTO; p++) table[shown[k]][p] = (float)t[shown[k]][p];
  size_t nccl_bytes = bytes * (func == FUNC_ALLGATHER || func == FUNC_REDUCESCATTER ? (size_t)comm->nranks : 1);
  int pnch = 0, rc = tuner_get_coll_info(comm, func, nccl_bytes, &table[0][0], &pnch);
  int first = 0;
  if (rc != 0) {
    if (atomic_compare_exchange_strong(&comm->tuner_failed, &first, 1))
      WARN("tuner plugin %s: getCollInfo(%s, %zu bytes) returned %d; using Chorus's own choice (reported once)",
           tuner_name(comm), tune_func_name(func), nccl_bytes, rc);
    return 0;
  }
  memcpy(cost, t, sizeof(double) * ALGO_COUNT * CH_NPROTO);
  for (int k = 0; k < 2; k++)
    for (int p = 0; p < CH_NPROTO; p++)
      if (t[shown[k]][p] >= 0) cost[shown[k]][p] = table[shown[k]][p] >= 0 ? table[shown[k]][p] : -1.0;
  int a, p;
  if (!cheapest(cost, &a, &p)) {
    if (atomic_compare_exchange_strong(&comm->tuner_failed, &first, 1))
      WARN("tuner plugin %s ruled out every entry Chorus can run for %s %zu bytes; using Chorus's own choice "
           "(reported once)", tuner_name(comm), tune_func_name(func), nccl_bytes);
    return 0;
  }
  if (pnch > 0) *nch = UT_MIN(pnch, comm->nchannels);
  return 1;
}

/* Direct works on the whole vector; RecDbl, Rabenseifner and Tree use the per-peer connections, one
 * set per pair. */
static int algo_one_channel(int algo) { return algo == ALGO_DIRECT || algo_uses_peers(algo); }

size_t tune_step_elems(const struct ncclComm* comm, int coll, int algo, int proto, size_t esize) {
  const struct tp_sizes* sz = coll && !algo_uses_peers(algo) ? &comm->sizes : &comm->p2p_sizes;
  return prim_step_elems(proto, sz->buff[proto] / CH_STEPS, esize ? esize : 1);
}

static double choose(struct ncclComm* comm, int func, size_t bytes, int repro, unsigned sel, int wire,
                     struct tune_choice* out, int* by_tuner) {
  const struct tune_model* model = comm->model;
  int n = comm->nranks, i = tune_mask_index(func);
  unsigned pm = comm->proto_mask[i] & comm->proto_ok, em = eligible(comm, func, bytes, repro);
  if (!pm) pm = 1u << PROTO_SIMPLE; /* only if tune_check_call was bypassed */
  /* A per-call selection (tune_sel_resolve: only pairs this communicator runs) replaces the masks and
   * Chorus's own size thresholds: the caller asked for these pairs at this size. */
  if (sel && n > 1 && func < TUNE_P2P) {
    em = pm = 0;
    for (int a = 0; a < ALGO_COUNT; a++)
      for (int p = 0; p < CH_NPROTO; p++)
        if (sel >> (a * CH_NPROTO + p) & 1) em |= 1u << a, pm |= 1u << p;
  } else {
    sel = 0;
  }
  /* A compressed wire format (api/wire_api.c decided the call may use one) runs on Ring, Tree or
   * Rabenseifner with Simple: each element's result is made at one rank, which keeps it as a hop
   * delivers it (proto/prims.c). RecDbl and Exchange make it at both ends of a pair from partial
   * results rounded in opposite directions, so the ranks' results would differ; Direct and Owner never
   * cross a network. */
  if (wire && n > 1) {
    unsigned wm = 0;
    static const int wa[3] = {ALGO_RING, ALGO_TREE, ALGO_RABEN};
    for (int k = 0; k < 3; k++)
      if ((em >> wa[k] & 1) && (pm >> PROTO_SIMPLE & 1) && (!sel || sel >> (wa[k] * CH_NPROTO + PROTO_SIMPLE) & 1))
        wm |= 1u << wa[k];
    /* Rabenseifner only where it is the one allowed: on 4 hosts at 1 Gbit/s, 64 MiB with mx8 it took
     * 340 ms against Ring's 281-290 (exact, the two tie at 849-872 ms; docs/WIRE.md) */
    if (wm & ~(1u << ALGO_RABEN)) wm &= ~(1u << ALGO_RABEN);
    if (wm) {
      em = wm, pm = 1u << PROTO_SIMPLE;
    } else {
      if (!(atomic_fetch_or(&comm->wire_noted, 2) & 2))
        INFO(LOG_TUNING, "%s: wire format %s not used: NCCL_ALGO/NCCL_PROTO or the call's algSelection allow none "
             "of Ring, Tree and Rabenseifner on Simple, which carry it (told once)", tune_func_name(func), wire_name(wire));
      wire = 0;
    }
  }
  out->wire = n > 1 ? wire : 0;
  int nch = (int)UT_MIN((size_t)comm->max_nchannels, UT_MAX((size_t)comm->min_nchannels, bytes / model->chan_bytes));
  nch = UT_MAX(1, UT_MIN(nch, comm->nchannels));
  double t[ALGO_COUNT][CH_NPROTO], cost[ALGO_COUNT][CH_NPROTO];
  for (int a = 0; a < ALGO_COUNT; a++)
    for (int p = 0; p < CH_NPROTO; p++)
      t[a][p] = ((em >> a) & (pm >> p) & 1) && (!sel || (sel >> (a * CH_NPROTO + p) & 1))
                    ? cost_us(comm, func, a, p, bytes, algo_one_channel(a) ? 1 : nch) : -1.0;
  /* A tuner plugin sees NCCL's algorithms only: nothing to ask when the level leaves none of them. */
  *by_tuner = !repro && comm->tuner && func < TUNE_P2P && n > 1 && consult_tuner(comm, func, bytes, t, cost, &nch);
  int algo = ALGO_RING, proto = PROTO_SIMPLE;
  cheapest(*by_tuner ? cost : t, &algo, &proto);
  /* Direct between processes runs another algorithm when some buffer is not from ncclMemAlloc (known
   * only when the call runs, on every rank alike): the cheaper of Exchange and Ring on the one
   * channel Direct's op has (Ring when NCCL_ALGO allows neither), on its best protocol. Not RecDbl,
   * Rabenseifner or Tree: where Direct is chosen (256 KiB up) the model predicts Rabenseifner
   * within 1% of Ring, so cannot tell them apart, and measured on 2 CPUs (4 processes) Ring was
   * 1.2-2x faster from 4 MiB; the 16-core single runs disagreed (docs/PERFORMANCE.md). */
  out->fallback = algo;
  if (algo == ALGO_DIRECT && repro) {
    out->fallback = ALGO_OWNER; /* the one other algorithm that honours the level */
  } else if (algo == ALGO_DIRECT) {
    unsigned fm = em & (1u << ALGO_EXCHANGE | 1u << ALGO_RING);
    if (!fm) fm = 1u << ALGO_RING;
    double fb[ALGO_COUNT][CH_NPROTO];
    for (int a = 0; a < ALGO_COUNT; a++)
      for (int p = 0; p < CH_NPROTO; p++)
        fb[a][p] = ((fm >> a) & (pm >> p) & 1) ? cost_us(comm, func, a, p, bytes, 1) : -1.0;
    cheapest(fb, &out->fallback, &proto);
  }
  /* On 2 ranks RecDbl, Rabenseifner and Tree are one link each way, the same steps as Ring, so they
   * run as Ring there and need no connections of their own (tune_peer_algos). */
  if (n == 2 && algo_uses_peers(algo) && algo != ALGO_OWNER) algo = out->fallback = ALGO_RING;
  out->algo = algo;
  out->repro = repro;
  out->proto = proto;
  out->chunk = 0; /* a whole step; tune_choose_sel asks a tuner plugin for less */
  out->nch = algo_one_channel(algo) ? 1 : nch;
  /* Direct between processes that falls back runs its fallback on the channels the model gives it
   * (standby ops, core/plan.c): on Direct's one channel, the 16-core machine's 4-256 MiB AllReduce
   * trailed forced Ring by 1.27-1.42x (PERFORMANCE.md). */
  out->fb_nch = algo == ALGO_DIRECT && comm->clique && comm->clique->procs && !algo_one_channel(out->fallback) ? nch : 1;
  /* A result larger than the caches is not read back soon: stream it (reduce/nt_copy.c). */
  size_t out_bytes = func == FUNC_ALLGATHER ? bytes * (size_t)n : bytes;
  out->nt = out_bytes >= comm->nt_min_bytes;
  return predict_us(comm, func, algo, proto, bytes, out->nch);
}

double tune_predict_sel(struct ncclComm* comm, int func, size_t bytes, int repro, unsigned sel, int wire,
                        struct tune_choice* out) {
  int by_tuner;
  return choose(comm, func, bytes, repro, sel, wire, out, &by_tuner);
}

double tune_predict(struct ncclComm* comm, int func, size_t bytes, int repro, struct tune_choice* out) {
  return tune_predict_sel(comm, func, bytes, repro, 0, 0, out);
}

void tune_choose(struct ncclComm* comm, int func, size_t bytes, int repro, struct tune_choice* out) {
  tune_choose_sel(comm, func, bytes, 0, repro, 0, 0, out);
}

void tune_choose_sel(struct ncclComm* comm, int func, size_t bytes, size_t esize, int repro, unsigned sel, int wire,
                     struct tune_choice* out) {
  int by_tuner;
  double us = choose(comm, func, bytes, repro, sel, wire, out, &by_tuner);
  /* The plugin sees NCCL's algorithms only, as for the cost table; not under a reproducible level. */
  out->chunk =
      comm->tuner && !repro && func < TUNE_P2P && comm->nranks > 1 ? tuner_chunk(comm, func, bytes, esize, out) : 0;
  char ck[64] = "";
  if (out->chunk) snprintf(ck, sizeof ck, ", %zu-byte steps (tuner plugin's getChunkSize)", out->chunk);
  char sl[224] = "";
  if (sel && comm->nranks > 1 && func < TUNE_P2P) { /* as choose takes it */
    char names[180];
    tune_sel_format(sel, names, sizeof names);
    snprintf(sl, sizeof sl, ", per-call algSelection %s", names);
  }
  int note = out->algo == ALGO_DIRECT && comm->clique && comm->clique->procs;
  char fb[96] = "";
  if (note) snprintf(fb, sizeof fb, " if all buffers are from ncclMemAlloc, else %s on %d channel(s)",
                     algo_name(out->fallback), out->fb_nch);
  char wf[48] = "";
  if (out->wire) snprintf(wf, sizeof wf, ", wire format %s on %s hops", wire_name(out->wire),
                          comm->wire_all ? "all" : "network");
  INFO(LOG_TUNING, "%s %zu bytes: algorithm %s%s, protocol %s, %d channel(s), predicted %.2f us (%s%s%s)%s%s%s%s",
       tune_func_name(func), bytes, algo_name(out->algo), fb, tune_proto_name(out->proto), out->nch, us,
       by_tuner ? "tuner plugin " : "cost model", by_tuner ? tuner_name(comm) : "", sl,
       out->nt ? ", streaming stores" : "",
       repro == CH_REPRO_EXACT ? ", reproducible exact: Owner/Direct only"
       : repro                 ? ", reproducible order: Owner/Direct only"
                               : "",
       ck, wf);
}
