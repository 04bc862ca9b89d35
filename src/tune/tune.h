/* Algorithm/protocol choice: NCCL_ALGO/NCCL_PROTO parsing (tune/parse.c), the cost model and the
 * choice (tune/choose.c), tuner plugins (tune/tuner_plugin.c). */
#ifndef CH_TUNE_H
#define CH_TUNE_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "../comm/work.h"

/* Algorithm and protocol choice (tune/choose.c): the one place that decides, and logs why. */
/* Whether any two ranks talk over the network, alike on every rank (tune/choose.c). */
int tune_uses_net(const struct ncclComm* comm);
/* NCCL_SOCKET_NTHREADS x NCCL_NSOCKS_PERTHREAD (threads 1..16, at most CH_MAX_CHANNELS sockets). */
int tune_net_socks(void);
void tune_init(struct ncclComm* comm);
/* The hosts as the cost model sees them (tune/shape.c): comm->tune_hosts ... tune_pof2_share. */
void tune_shape(struct ncclComm* comm);
/* repro: the reproducible level the call must honour (CH_REPRO_*, tune_repro_level); under one only the
 * algorithms that do (Owner, Direct) are candidates. */
void tune_choose(struct ncclComm* comm, int func, size_t bytes, int repro, struct tune_choice* out);
/* The level a call of func on type must honour: the communicator's for floating-point reductions on
 * several ranks, else CH_REPRO_OFF (integers are exact already). */
int tune_repro_level(const struct ncclComm* comm, int func, int type);
/* CHORUS_REPRODUCIBLE's value ("off", "order", "exact", any case; empty: off) as a level, or
 * CH_INVALID_USAGE with a WARN. */
ch_status tune_parse_repro(const char* value, int* level);
/* Names of misc/names.h, "?" for a value that has none. */
const char* tune_proto_name(int proto); /* "LL", "LL128", "Simple" */
/* Whether NCCL_ALGO leaves some collective an algorithm that uses the per-peer connections (RecDbl,
 * Rabenseifner, Tree): then those are connected with the rings (group.c). The same on every rank. */
int tune_peer_algos(const struct ncclComm* comm);
const char* tune_func_name(int func);   /* "AllReduce", ... */

/* Mask index per collective: NCCL's prefixable functions 0..4 (Broadcast..AllReduce), then send/recv
 * (and what AlltoAll/Gather/Scatter become), which take only the prefixless entry. */
#define TUNE_P2P 5
#define TUNE_NMASK 6
static inline int tune_mask_index(int func) { return func >= 0 && func < TUNE_P2P ? func : TUNE_P2P; }

/* Algorithm mask bits: bits 0..ALGO_COUNT-1 are enum ch_algo; NCCL algorithms Chorus does not run
 * follow (accepted by NCCL_ALGO, never chosen): CH_ALGO_NCCL_ONLY_LIST, misc/names.h. */
#define TUNE_NCCL_ONLY CH_NALGO_NCCL_ONLY /* CollNetDirect, CollNetChain, NVLS, NVLSTree, PAT */
#define TUNE_ALGO_NBITS (ALGO_COUNT + TUNE_NCCL_ONLY)
_Static_assert(TUNE_ALGO_NBITS == CH_NALGO_BITS, "a name for every algorithm bit");
#define TUNE_MALFORMED (-1ll) /* packed value of a string that does not parse */

/* Parse an NCCL_ALGO (is_algo) or NCCL_PROTO value into one mask per TUNE_* index. Empty or NULL:
 * everything allowed. On a malformed value: WARN naming env, value and the fault; CH_INVALID_USAGE. */
ch_status tune_parse(const char* env, const char* value, int is_algo, unsigned masks[TUNE_NMASK]);
/* Name of mask bit b (algorithms: TUNE_ALGO_NBITS bits; protocols: CH_NPROTO). */
const char* tune_bit_name(int is_algo, int b);
/* All masks of one kind in one integer (for comparing across ranks), and back to text: "Ring,Direct"
 * when every collective has the same mask, else "broadcast:Ring;...;allreduce:Ring,Exchange". */
int64_t tune_mask_pack(int is_algo, const unsigned masks[TUNE_NMASK]);
void tune_mask_format(int is_algo, int64_t packed, char* out, size_t cap);

/* What comm_agree compares: the packed masks, or TUNE_MALFORMED when the value did not parse. */
int64_t tune_agree_value(const struct ncclComm* comm, int is_algo);
/* After comm_agree: CH_INVALID_USAGE (already reported) when NCCL_ALGO/NCCL_PROTO did not parse. */
ch_status tune_check(struct ncclComm* comm);
/* When a call is checked: CH_INVALID_USAGE with a WARN when NCCL_ALGO/NCCL_PROTO leave `func`
 * nothing Chorus can run on this communicator. */
ch_status tune_check_call(struct ncclComm* comm, int func, int type);
/* Per-call selection (ncclCollConfig_t.algSelection, tune/select.c): a mask with bit
 * algo * CH_NPROTO + proto per algorithm x protocol pair allowed; 0: automatic. */
#define TUNE_SEL_BITS 22
/* Parse NCCL's grammar into bits 0..20 (Chorus's pairs) and 32.. (NCCL's that Chorus does not run).
 * Returns 0, or -1 with the fault in why. */
int tune_sel_parse(const char* sel, uint64_t* out, char* why, size_t cap);
/* "RING_SIMPLE,TREE_LL" ("automatic" for 0). */
void tune_sel_format(unsigned sel, char* out, size_t cap);
/* The selection a call of func on type honours (*out; 0: automatic). One that cannot be met on this
 * communicator: CH_INVALID_ARG with a WARN when force, else an INFO and 0. Set aside (0) where
 * NCCL_ALGO/NCCL_PROTO restrict func or a reproducible level applies. The same on every rank given
 * the same arguments. */
ch_status tune_sel_resolve(struct ncclComm* comm, int func, int type, const char* sel, int force, unsigned* out);
/* Algorithms this communicator can run for func, whatever NCCL_ALGO says (bits of enum ch_algo). */
unsigned tune_runnable_algos(const struct ncclComm* comm, int func);
/* tune_choose/tune_predict restricted to the pairs of sel (from tune_sel_resolve; 0: automatic).
 * esize: the datatype's bytes, for the step size a tuner plugin may choose (out->chunk; 0: none asked).
 * wire: the wire format the call may use (api_wire_for_call; 0: none): out->wire is it where an
 * algorithm that carries it is allowed, else 0. */
void tune_choose_sel(struct ncclComm* comm, int func, size_t bytes, size_t esize, int repro, unsigned sel, int wire,
                     struct tune_choice* out);
/* Elements per FIFO step of the connections algo runs on (coll: a collective; else a send or receive):
 * the rings' or the per-peer ones (RecDbl, Rabenseifner, Tree, sends and receives). */
size_t tune_step_elems(const struct ncclComm* comm, int coll, int algo, int proto, size_t esize);
double tune_predict_sel(struct ncclComm* comm, int func, size_t bytes, int repro, unsigned sel, int wire,
                        struct tune_choice* out);
/* The choice for a call and the model's predicted time (us) of what was chosen; tune_choose is this
 * plus the TUNING log line. */
double tune_predict(struct ncclComm* comm, int func, size_t bytes, int repro, struct tune_choice* out);
/* Release the tuner plugin context (comm_free). */
void tune_fini(struct ncclComm* comm);

/* The cost model's constants (tune/model.c): defaults measured and documented there, replaced by the
 * values of CHORUS_TUNE_FILE (written by `chorus-info --calibrate`) when that is set. Per protocol:
 * LL, LL128, Simple. Loaded once per process; read-only afterwards. */
struct tune_model {
  double step_us[CH_NPROTO];   /* latency of one FIFO step (one hop) */
  double copy_bw;              /* bytes per microsecond one core copies */
  double proto_eff[CH_NPROTO]; /* share of copy_bw a protocol delivers */
  double direct_us;            /* Direct: its arrive/done synchronisation, per call */
  double chan_gain;            /* bandwidth added per channel beyond the first (share of one) */
  size_t chan_bytes;           /* one channel per this many bytes (NCCL_MIN/MAX_NCHANNELS bound it) */
  size_t ll_max_bytes;         /* LL above this: prediction x ll_penalty (chosen only when alone) */
  double ll_penalty;
  double net_step_us;          /* one hop through the network transport (any protocol) */
  double net_bw;               /* bytes per microsecond through one network connection */
};
const struct tune_model* tune_model_get(void);
/* CH_OK, or CH_INVALID_USAGE with a WARN saying why when CHORUS_TUNE_FILE is set but unreadable or
 * malformed (the defaults are then in use). */
ch_status tune_model_status(void);
/* A hash of the constants in use (ranks compare it at init: different models choose differently). */
int64_t tune_model_hash(void);
/* Write the constants in CHORUS_TUNE_FILE's format ("name = value" lines) to f. */
void tune_model_write(FILE* f, const struct tune_model* m);
/* The built-in defaults. */
const struct tune_model* tune_model_defaults(void);

/* Tuner plugins (tune/tuner_plugin.c). A loaded plugin: one per process, shared by reference. */
struct tune_plugin;
/* Load NCCL_TUNER_PLUGIN (or libnccl-tuner.so if unset; "none" disables) and init it for comm.
 * Failure is reported (WARN with path and dlerror) and leaves comm->tuner NULL. */
void tuner_open(struct ncclComm* comm);
void tuner_close(struct ncclComm* comm);
/* Let the plugin edit table (float[NCCL_NUM_ALGORITHMS][NCCL_NUM_PROTOCOLS]) and *nch (0 = keep).
 * bytes as NCCL counts them. Returns 0 on success, else the plugin's error (caller falls back). */
int tuner_get_coll_info(struct ncclComm* comm, int func, size_t bytes, float* table, int* nch);
/* The bytes per FIFO step the plugin's getChunkSize (v6, optional) chooses for a call of func on
 * esize-byte elements that how describes (Ring or Tree only: NCCL's algorithms), checked: 0 when it has
 * none, keeps the default, or gives a size that is 0, not a multiple of esize or more than one step holds
 * (the first such answer, or error, is reported once per communicator). */
size_t tuner_chunk(struct ncclComm* comm, int func, size_t bytes, size_t esize, const struct tune_choice* how);
const char* tuner_name(const struct ncclComm* comm);
/* Library names tried for a value of NCCL_TUNER_PLUGIN, as NCCL resolves them: the value itself and,
 * for a bare name, libnccl-tuner-<name>.so. Returns how many (0: disabled). */
int tuner_candidates(const char* value, char out[2][512]);

#endif
