/* chorus-sim: the library's algorithm schedules run for up to 65,536 ranks over a simulated transport
 * (tools/sim.c): checks that each delivers every element exactly once, predicts each algorithm's time
 * from a link model, and shows what the library's own choice (tune_predict, tune/choose.c, on a
 * communicator made up for the purpose) would pick. docs/SCALE.md describes the model and its limits. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>

#include "nccl.h"
#include "sim.h"
#include "../src/comm/comm.h"
#include "../src/misc/param.h"
#include "../src/misc/utils.h"
#include "../src/tune/tune.h"

static void usage(FILE* f) {
  fprintf(f, "usage: chorus-sim [options]\n"
             "  --ranks LIST        rank counts (default 8,64,1024,65536)\n"
             "  --per-host N        ranks per host, rank r on host r / N (default 8)\n"
             "  --coll LIST         allreduce, allgather, reducescatter or all (default allreduce)\n"
             "  --sizes LIST        bytes, with K/M/G suffixes (default 8,64K,1M,256M); AllGather and\n"
             "                      ReduceScatter: the whole result / input, as nccl-tests count it\n"
             "  --algos LIST        ring, tree, recdbl, rabenseifner (default: all Chorus has for the collective);\n"
             "                      recdblag: a what-if AllGather of log2(n) rounds (not Chorus's; PAT's latency)\n"
             "  --proto NAME        LL, LL128 or Simple (default Simple: the network carries only Simple)\n"
             "  --check             check delivery exactly once for each algorithm and rank count\n"
             "  --check-budget N    check only runs of at most N steps (default 1e8; ring AllReduce on n ranks\n"
             "                      takes n(2n-1))\n"
             "  --budget N          timing: simulate at most N steps per cell, coarsening the FIFO step\n"
             "                      beyond (default 2e7); ring algorithms simulate one host by symmetry first\n"
             "  --intra-lat US --intra-bw B/US --inter-lat US --inter-bw B/US --nic-bw B/US --host-bw B/US\n"
             "                      the link model (default: the cost model's constants, tune/model.c, or\n"
             "                      CHORUS_TUNE_FILE's; bandwidths in bytes per microsecond = MB/s; --host-bw:\n"
             "                      all hops inside one host share it, default unlimited)\n"
             "  --esize N           element size in bytes (default 4: float)\n"
             "  --csv               one line per cell instead of the table\n");
}

static int parse_size(const char* s, size_t* out) {
  char* end;
  errno = 0;
  double v = strtod(s, &end);
  if (errno || end == s || v < 0) return -1;
  double m = 1;
  if (*end == 'K' || *end == 'k') m = 1024, end++;
  else if (*end == 'M' || *end == 'm') m = 1024.0 * 1024, end++;
  else if (*end == 'G' || *end == 'g') m = 1024.0 * 1024 * 1024, end++;
  if (*end == 'i') end++;
  if (*end == 'B' || *end == 'b') end++;
  if (*end) return -1;
  *out = (size_t)(v * m);
  return 0;
}

/* Comma-separated list into out[], at most cap; returns the count or -1. */
static int parse_list(const char* s, size_t* out, int cap) {
  char buf[1024];
  snprintf(buf, sizeof buf, "%s", s);
  int k = 0;
  for (char* t = strtok(buf, ","); t; t = strtok(NULL, ",")) {
    if (k == cap || parse_size(t, &out[k])) return -1;
    k++;
  }
  return k;
}

static void fmt_us(double us, char* b, size_t n) {
  if (us < 1000) snprintf(b, n, "%.3g us", us);
  else if (us < 1e6) snprintf(b, n, "%.3g ms", us / 1e3);
  else snprintf(b, n, "%.3g s", us / 1e6);
}

static void fmt_bytes(size_t v, char* b, size_t n) {
  if (v >= (1u << 30) && v % (1u << 30) == 0) snprintf(b, n, "%zuG", v >> 30);
  else if (v >= (1u << 20) && v % (1u << 20) == 0) snprintf(b, n, "%zuM", v >> 20);
  else if (v >= 1024 && v % 1024 == 0) snprintf(b, n, "%zuK", v >> 10);
  else snprintf(b, n, "%zu", v);
}

/* A communicator as tune_init sees one: n ranks, rank r on host r / per_host, one process each (no
 * clique: Direct, which needs one host, is left out), the trees and channels init.c would give it. */
static struct ncclComm* synth_comm(int n, int per_host) {
  struct ncclComm* c = calloc(1, sizeof(*c));
  if (!c || !(c->peers = calloc((size_t)n, sizeof(*c->peers)))) return NULL;
  c->nranks = n, c->rank = 0;
  for (int r = 0; r < n; r++) {
    c->peers[r].rank = r, c->peers[r].nranks = n;
    c->peers[r].host_hash = 1000 + (uint64_t)(r / per_host);
    c->peers[r].proc_nonce = 1 + (uint64_t)r;
  }
  c->nnodes = (n + per_host - 1) / per_host;
  /* core/init.c's channel count */
  int maxc = (int)UT_MAX(1, UT_MIN(CH_MAX_CHANNELS, param_int(PARAM_MAX_NCHANNELS)));
  c->nchannels = UT_MAX(maxc, (int)UT_MIN(CH_MAX_CHANNELS, param_int(PARAM_MIN_NCHANNELS)));
  if (tune_uses_net(c)) c->nchannels = UT_MAX(c->nchannels, tune_net_socks());
  sim_trees(n, per_host, 0, c->trees, &c->ntrees, &c->tree_depth);
  tune_init(c);
  return c;
}

static void synth_free(struct ncclComm* c) {
  if (!c) return;
  tune_fini(c);
  free(c->peers);
  free(c);
}

static const int algos_all[] = {ALGO_RING, ALGO_TREE, ALGO_RECDBL, ALGO_RABEN};
#define NALGOS 5 /* the four, and the what-if RecDblAG when asked for */

static int algo_by_name(const char* s) {
  if (!strcasecmp(s, "ring")) return ALGO_RING;
  if (!strcasecmp(s, "tree")) return ALGO_TREE;
  if (!strcasecmp(s, "recdbl")) return ALGO_RECDBL;
  if (!strcasecmp(s, "rabenseifner") || !strcasecmp(s, "raben")) return ALGO_RABEN;
  if (!strcasecmp(s, "recdblag")) return SIM_ALGO_RDAG;
  return -1;
}

/* Elements per rank block for `bytes` of func on n ranks (at least one). */
static size_t count_of(int func, size_t bytes, int n, size_t esize) {
  size_t c = func == FUNC_ALLREDUCE ? bytes / esize : bytes / esize / (size_t)n;
  return c ? c : 1;
}

static int check_one(int func, int algo, int n, int per_host, int proto, size_t esize, double budget) {
  struct sim_cfg cfg = {.n = n,
                        .per_host = per_host,
                        .func = func,
                        .algo = algo,
                        .proto = proto,
                        .esize = esize,
                        .check = 1,
                        .periodic = -1};
  sim_link_from_model(proto, &cfg.link);
  /* Enough elements that every rank's block is non-empty and some steps are partial, within ~512 MB
   * of results; a small FIFO step so that the schedules loop over several chunks. */
  size_t mem = (size_t)512 << 20, per = func == FUNC_ALLGATHER ? (size_t)n : 1;
  size_t want = func == FUNC_ALLREDUCE ? 8 * (size_t)n + 13 : 21;
  size_t cap = mem / (9 * (size_t)n * per);
  cfg.count = want < cap ? want : cap;
  if (!cfg.count) { /* an AllGather's results hold n x n blocks */
    printf("  %-13s %-13s %6d ranks: not checked (%d x %d result blocks do not fit 512 MB)\n", tune_func_name(func),
           sim_algo_name(algo), n, n, n);
    return 0;
  }
  cfg.chunk = (cfg.count / 8 + 15) / 16 * 16; /* about 8 steps per vector, a multiple of 8 elements */
  if (cfg.chunk < 16) cfg.chunk = 16;
  /* Steps this check would take: estimated from one rank's count (ranks differ little). */
  double steps = 0;
  if (algo == ALGO_RING) steps = (double)n * (func == FUNC_ALLREDUCE ? 2.0 * n : n) * 2;
  else steps = (double)n * 64 * 4;
  const char* fn = tune_func_name(func);
  if (steps > budget) {
    printf("  %-13s %-13s %6d ranks: not checked (about %.2g steps; --check-budget)\n", fn, sim_algo_name(algo), n,
           steps);
    return 0;
  }
  struct sim_result r;
  struct timespec t0, t1;
  clock_gettime(CLOCK_MONOTONIC, &t0);
  sim_run(&cfg, &r);
  clock_gettime(CLOCK_MONOTONIC, &t1);
  double s = (double)(t1.tv_sec - t0.tv_sec) + (double)(t1.tv_nsec - t0.tv_nsec) / 1e9;
  printf("  %-13s %-13s %6d ranks, %zu elements%s: %s (%llu steps, %.1f s)%s%s\n", fn, sim_algo_name(algo), n,
         cfg.count, func == FUNC_ALLREDUCE ? "" : " per rank", r.ok ? "exactly once" : "FAILED",
         (unsigned long long)r.prims, s, r.ok ? "" : ": ", r.ok ? "" : r.why);
  fflush(stdout);
  return r.ok ? 0 : 1;
}

int main(int argc, char** argv) {
  size_t ranks[32], sizes[64];
  int nranks = parse_list("8,64,1024,65536", ranks, 32), nsizes = parse_list("8,64K,1M,256M", sizes, 64);
  int per_host = 8, proto = PROTO_SIMPLE, check = 0, csv = 0, funcs[3] = {FUNC_ALLREDUCE}, nfuncs = 1;
  int algos[NALGOS], nalgos = 0;
  size_t esize = 4;
  double budget = 2e7, check_budget = 1e8;
  double ov[6] = {-1, -1, -1, -1, -1, -1}; /* intra-lat, intra-bw, inter-lat, inter-bw, nic-bw, host-bw */
  static const char* ovn[6] = {"--intra-lat", "--intra-bw", "--inter-lat", "--inter-bw", "--nic-bw", "--host-bw"};
  for (int i = 1; i < argc; i++) {
    const char* a = argv[i];
    const char* v = i + 1 < argc ? argv[i + 1] : NULL;
    int used = 1, bad = 0;
    if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
      usage(stdout);
      return 0;
    } else if (!strcmp(a, "--check")) {
      check = 1, used = 0;
    } else if (!strcmp(a, "--csv")) {
      csv = 1, used = 0;
    } else if (!v) {
      bad = 1;
    } else if (!strcmp(a, "--ranks")) {
      bad = (nranks = parse_list(v, ranks, 32)) <= 0;
    } else if (!strcmp(a, "--sizes")) {
      bad = (nsizes = parse_list(v, sizes, 64)) <= 0;
    } else if (!strcmp(a, "--per-host")) {
      bad = (per_host = atoi(v)) < 1;
    } else if (!strcmp(a, "--esize")) {
      esize = (size_t)atoi(v), bad = esize < 1 || esize > 8;
    } else if (!strcmp(a, "--budget")) {
      budget = atof(v), bad = budget < 1;
    } else if (!strcmp(a, "--check-budget")) {
      check_budget = atof(v), bad = check_budget < 1;
    } else if (!strcmp(a, "--proto")) {
      proto = -1;
      for (int p = 0; p < CH_NPROTO; p++)
        if (!strcasecmp(v, tune_proto_name(p))) proto = p;
      bad = proto < 0;
    } else if (!strcmp(a, "--coll")) {
      nfuncs = 0;
      char buf[256];
      snprintf(buf, sizeof buf, "%s", v);
      for (char* t = strtok(buf, ","); t && !bad; t = strtok(NULL, ",")) {
        if (!strcasecmp(t, "all")) {
          funcs[0] = FUNC_ALLREDUCE, funcs[1] = FUNC_ALLGATHER, funcs[2] = FUNC_REDUCESCATTER, nfuncs = 3;
        } else if (nfuncs < 3 && !strcasecmp(t, "allreduce")) funcs[nfuncs++] = FUNC_ALLREDUCE;
        else if (nfuncs < 3 && !strcasecmp(t, "allgather")) funcs[nfuncs++] = FUNC_ALLGATHER;
        else if (nfuncs < 3 && !strcasecmp(t, "reducescatter")) funcs[nfuncs++] = FUNC_REDUCESCATTER;
        else bad = 1;
      }
      bad |= nfuncs == 0;
    } else if (!strcmp(a, "--algos")) {
      nalgos = 0;
      char buf[256];
      snprintf(buf, sizeof buf, "%s", v);
      for (char* t = strtok(buf, ","); t && !bad; t = strtok(NULL, ",")) {
        int al = algo_by_name(t);
        if (al < 0 || nalgos == NALGOS) bad = 1;
        else algos[nalgos++] = al;
      }
    } else {
      int k = 0;
      while (k < 6 && strcmp(a, ovn[k])) k++;
      if (k == 6) {
        fprintf(stderr, "chorus-sim: unknown option %s\n", a);
        usage(stderr);
        return 2;
      }
      ov[k] = atof(v), bad = ov[k] <= 0;
    }
    if (bad) {
      fprintf(stderr, "chorus-sim: bad or missing value for %s\n", a);
      return 2;
    }
    i += used;
  }
  for (int k = 0; k < nranks; k++)
    if (ranks[k] < 2 || ranks[k] > (1u << 20)) {
      fprintf(stderr, "chorus-sim: rank counts must be 2..1048576\n");
      return 2;
    }
  if (tune_model_status() != CH_OK) { /* the WARN is quiet unless NCCL_DEBUG asks: say it here */
    fprintf(stderr, "chorus-sim: %s\n", ncclGetLastError(NULL));
    return 1;
  }
  if (!nalgos)
    for (int k = 0; k < 4; k++) algos[nalgos++] = algos_all[k];

  struct sim_link link;
  sim_link_from_model(proto, &link);
  double* lv[6] = {&link.a_intra, &link.bw_intra, &link.a_inter, &link.bw_inter, &link.nic_bw, &link.host_bw};
  for (int k = 0; k < 6; k++)
    if (ov[k] > 0) *lv[k] = ov[k];
  if (ov[3] > 0 && ov[4] <= 0) link.nic_bw = link.bw_inter; /* one connection fills the NIC */

  int failures = 0;
  if (check) {
    printf("Delivery check (every element of every result holds exactly the contributions it should, one "
           "post-op for reductions; the input premultiplied once):\n");
    for (int f = 0; f < nfuncs; f++)
      for (int a = 0; a < nalgos; a++)
        for (int k = 0; k < nranks; k++)
          if (sim_has(funcs[f], algos[a], (int)ranks[k]))
            failures += check_one(funcs[f], algos[a], (int)ranks[k], per_host, proto, esize, check_budget);
    printf("\n");
  }

  const char* pth = param_str(PARAM_TUNE_FILE);
  if (!csv)
    printf("Link model%s: inside a host %.3g us + bytes / %.0f B/us; between hosts %.3g us + bytes / %.0f B/us, "
           "a NIC of %.0f B/us per host%s. Protocol %s, %d ranks per host, %zu-byte elements, one channel.\n",
           pth[0] ? " (CHORUS_TUNE_FILE)" : "", link.a_intra, link.bw_intra, link.a_inter, link.bw_inter, link.nic_bw,
           link.host_bw > 0 ? ", host memory shared" : "", tune_proto_name(proto), per_host, esize);
  else printf("coll,ranks,hosts,bytes,algo,sim_us,steps,coarsen,periodic,auto_algo,auto_proto,auto_model_us\n");
  for (int f = 0; f < nfuncs; f++) {
    int func = funcs[f];
    if (!csv) {
      printf("\n%s%s\n%7s %6s %6s", tune_func_name(func),
             func == FUNC_ALLREDUCE ? "" : " (size: the whole result/input, as nccl-tests count it)", "ranks", "hosts",
             "size");
      for (int a = 0; a < nalgos; a++) printf(" %13s", sim_algo_name(algos[a]));
      printf("   %-30s %s\n", "auto (tune/choose.c)", "best simulated");
    }
    for (int k = 0; k < nranks; k++) {
      int n = (int)ranks[k];
      struct ncclComm* comm = synth_comm(n, per_host);
      for (int z = 0; z < nsizes; z++) {
        size_t count = count_of(func, sizes[z], n, esize);
        double t[NALGOS];
        int best = -1;
        char cell[NALGOS][32];
        for (int a = 0; a < nalgos; a++) {
          t[a] = -1;
          snprintf(cell[a], sizeof cell[a], "-");
          if (!sim_has(func, algos[a], n)) continue;
          struct sim_cfg cfg = {.n = n,
                                .per_host = per_host,
                                .func = func,
                                .algo = algos[a],
                                .proto = proto,
                                .count = count,
                                .esize = esize,
                                .budget = (uint64_t)budget,
                                .link = link};
          struct sim_result r;
          if (sim_run(&cfg, &r) != 0) continue;
          if (!r.ok) {
            fprintf(stderr, "chorus-sim: %s %s on %d ranks: %s\n", sim_algo_name(algos[a]), tune_func_name(func), n,
                    r.why);
            failures++;
            continue;
          }
          t[a] = r.us;
          fmt_us(r.us, cell[a], sizeof cell[a]);
          if (r.coarsen > 1) snprintf(cell[a] + strlen(cell[a]), sizeof cell[a] - strlen(cell[a]), "~");
          if (best < 0 || r.us < t[best]) best = a;
          if (csv) {
            printf("%s,%d,%d,%zu,%s,%.3f,%llu,%d,%d", tune_func_name(func), n, comm ? comm->nnodes : 0, sizes[z],
                   sim_algo_name(algos[a]), r.us, (unsigned long long)r.prims, r.coarsen, r.periodic);
          }
          if (csv) printf(",,,\n");
        }
        char autos[64] = "?";
        double model = 0;
        struct tune_choice ch = {0};
        if (comm) {
          /* The library passes one rank's bytes (count x element size), as plan.c does. */
          model = tune_predict(comm, func, count * esize, 0, &ch);
          char m[32];
          fmt_us(model, m, sizeof m);
          int in_table = 0;
          for (int a = 0; a < nalgos; a++) in_table |= algos[a] == ch.algo && t[a] >= 0;
          snprintf(autos, sizeof autos, "%s%s/%s (model %s)", algo_name(ch.algo), in_table ? "" : "*",
                   tune_proto_name(ch.proto), m);
          if (csv)
            printf("%s,%d,%d,%zu,auto,,,,,%s,%s,%.3f\n", tune_func_name(func), n, comm->nnodes, sizes[z],
                   algo_name(ch.algo), tune_proto_name(ch.proto), model);
        }
        if (csv) continue;
        char sz[32];
        fmt_bytes(sizes[z], sz, sizeof sz);
        printf("%7d %6d %6s", n, (n + per_host - 1) / per_host, sz);
        for (int a = 0; a < nalgos; a++) printf(" %13s", cell[a]);
        printf("   %-30s %s", autos, best >= 0 ? sim_algo_name(algos[best]) : "-");
        if (best >= 0 && comm)
          for (int a = 0; a < nalgos; a++)
            if (algos[a] == ch.algo && t[a] >= 0 && a != best) printf(" (auto x%.2f)", t[a] / t[best]);
        printf("\n");
        fflush(stdout);
      }
      synth_free(comm);
    }
  }
  if (!csv)
    printf("\n~: the FIFO step was coarsened to fit --budget (pipeline fill overstated). *: not simulated "
           "(Direct and Exchange need one host or 2 ranks).\n");
  return failures ? 1 : 0;
}
