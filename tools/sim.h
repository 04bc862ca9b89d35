/* The scale simulator (chorus-sim, docs/SCALE.md): runs the library's own algorithm schedules
 * (algo_step in src/algo/, rings from tune/rings.c, trees as tune/trees.c builds them) for many ranks
 * over a transport that only records moves. It checks that every element reaches every rank it
 * should exactly once (symbolically: each element carries a sum of per-contribution keys, no data),
 * and predicts the time of a schedule from a link model (latency and bandwidth inside a host and
 * between hosts, a NIC per host shared by its ranks) by an event-driven run of the same steps. */
#ifndef CH_SIM_H
#define CH_SIM_H

#include <stddef.h>
#include <stdint.h>

#include "../src/algo/algo.h"

/* Microseconds and bytes per microsecond. A hop of b bytes costs a + b / bw on its link; between
 * hosts the sender's and the receiver's NICs (nic_bw each) also carry it, one transfer at a time. */
struct sim_link {
  double a_intra, bw_intra;
  double a_inter, bw_inter;
  double nic_bw;
  double host_bw; /* inside a host: the bytes of all its ranks' hops share this (0: no limit), as its
                   * memory bandwidth is shared */
};

struct sim_cfg {
  int n, per_host; /* ranks; ranks per host (rank r on host r / per_host) */
  int func, algo, proto;
  size_t count; /* elements: AllReduce the vector, AllGather/ReduceScatter one rank's block */
  size_t esize;
  size_t chunk;    /* elements per FIFO step; 0: Chorus's for the algorithm and protocol */
  int check;       /* track every element's contributions (check mode: no periodic run, no coarsening) */
  int periodic;    /* 1: force, -1: forbid, 0: when the steps exceed the budget (ring algorithms) */
  uint64_t budget; /* timing: primitive steps to simulate at most (0: no limit); the FIFO step is
                    * coarsened (doubled) until the run fits */
  struct sim_link link;
  /* Tests of the check itself: 1 counts rank n-1's first local contribution twice, 2 loses the first
   * step rank 0 receives (its payload is replaced by nothing), 3 drops the premultiplication of rank
   * n-1's first step from its input. */
  int corrupt;
};

struct sim_result {
  int ok;         /* delivered exactly once (check mode), finished without deadlock (both) */
  char why[256];  /* when not ok */
  double us;      /* completion time of the last rank */
  uint64_t prims; /* primitive steps simulated */
  int coarsen;    /* factor the FIFO step was multiplied by (1: Chorus's own) */
  int periodic;   /* 1: one host's ranks were simulated, the others by the ring's symmetry */
  size_t chunk;   /* elements per FIFO step used */
};

/* 0 on success (res->ok says whether the schedule was right), -1 when the configuration is not one
 * Chorus runs (why in res->why). */
int sim_run(const struct sim_cfg* cfg, struct sim_result* res);

/* Not Chorus's: a what-if AllGather with log2(n) latency, recursive doubling over a power of two (each
 * round swaps all blocks gathered so far with the rank differing in one bit), standing in for NCCL's
 * PAT, which Chorus lacks (docs/SCALE.md). Only in the simulator. */
#define SIM_ALGO_RDAG 100
const char* sim_algo_name(int algo);

/* Whether Chorus has algo for func on n ranks (the simulator's view: Ring everywhere; RecDbl,
 * Rabenseifner and Tree for AllReduce). */
int sim_has(int func, int algo, int n);

/* Rank r's trees as tune/trees.c builds them for ranks r / per_host on hosts (hosts in order, ranks
 * of a host in a chain); *depth as comm->tree_depth. */
void sim_trees(int n, int per_host, int r, struct algo_tree trees[2], int* ntrees, int* depth);

/* Elements per FIFO step Chorus uses for algo/proto (the rings' FIFO, or the per-peer one). */
size_t sim_default_chunk(int algo, int proto, size_t esize);

/* The link model from the cost model's constants in use (CHORUS_TUNE_FILE or tune/model.c's
 * defaults): inside a host a hop is step_us[proto] + bytes x 2 copies / (copy_bw x proto_eff[proto]),
 * between hosts net_step_us + bytes / net_bw, and a NIC carries net_bw. */
void sim_link_from_model(int proto, struct sim_link* link);

#endif
