/* chorus-info: version, every tunable with its value, default and source, and what this host offers
 * (CPUs, NUMA nodes, network interfaces, shared memory). Links the library's internals for the
 * parameter table. `chorus-info --stall HOST:PORT` asks a running job's process for the stall report
 * of its communicators (the address each rank logs at NCCL_DEBUG=INFO, and every stall report names). */
#include <dirent.h>
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/statvfs.h>

#include "flight.h"
#include "chorus.h"
#include "../src/bootstrap/boot_internal.h"
#include "../src/fault/stall.h"
#include "../src/cuda/cudrv.h"
#include "../src/misc/names.h"
#include "../src/misc/param.h"
#include "../src/misc/socket.h"
#include "../src/misc/utils.h"
#include "../src/net/net.h"
#include "../src/tune/tune.h"
#include "../src/core/pool.h"
#include "../src/observe/observe.h"
#include "calibrate.h"

static void print_numa(void) {
  DIR* d = opendir("/sys/devices/system/node");
  int found = 0;
  if (d) {
    struct dirent* e;
    while ((e = readdir(d))) {
      int id;
      if (sscanf(e->d_name, "node%d", &id) != 1) continue;
      char path[300], cpus[256] = "";
      snprintf(path, sizeof(path), "/sys/devices/system/node/%s/cpulist", e->d_name);
      FILE* f = fopen(path, "r");
      if (f) {
        if (fgets(cpus, sizeof(cpus), f)) cpus[strcspn(cpus, "\n")] = 0;
        fclose(f);
      }
      printf("  numa node %d: cpus %s\n", id, cpus);
      found = 1;
    }
    closedir(d);
  }
  if (!found) printf("  numa: not reported by this kernel (one node assumed)\n");
}

/* Job key for --stall: CHORUS_SECRET_FILE / CHORUS_SECRET as the ranks read them; else, with
 * NCCL_COMM_ID, that job's public key; else none (the service then admits only our uid, locally). */
static int query(const char* hostport, uint32_t kind) {
  union sock_addr a;
  if (sock_parse_addr(hostport, &a) != CH_OK) {
    fprintf(stderr, "chorus-info: cannot parse address %s (HOST:PORT expected)\n", hostport);
    return 2;
  }
  struct boot_key key;
  int keyed = getenv("CHORUS_SECRET") || param_str(PARAM_SECRET_FILE)[0] || param_str(PARAM_COMM_ID)[0];
  if (keyed && boot_key_from_env(param_str(PARAM_COMM_ID), &key) != CH_OK) return 2; /* logged */
  size_t cap = BOOT_QUERY_MAX_REPLY, got = 0;
  char* out = malloc(cap + 1);
  char why[200];
  if (!out) return 1;
  ch_status st = boot_query(&a, keyed ? &key : NULL, kind, NULL, 0, out, cap, &got,
                            ut_now_ns() + 5000000000ull, NULL, why, sizeof(why));
  memset(&key, 0, sizeof(key));
  if (st != CH_OK) {
    fprintf(stderr, "chorus-info: query to %s failed: %s\n", hostport, why);
    free(out);
    return 1;
  }
  for (size_t i = 0; i < got; i++) /* text from another process: printable lines only */
    if (out[i] != '\n' && ((unsigned char)out[i] < 0x20 || (unsigned char)out[i] > 0x7e)) out[i] = '?';
  out[got] = '\0';
  fputs(out, stdout);
  free(out);
  return 0;
}

/* A plugin's library as the library looks for it (NCCL's rule: unset, the default name if present;
 * "none", off; else the value, then libnccl-KIND-VALUE.so): what it found, into out. */
static const char* plugin_found(const char* kind, const char* spec, char* out, size_t cap) {
  char names[2][256];
  if (!strcmp(spec, "none")) return "off (none)";
  if (spec[0]) snprintf(names[0], sizeof(names[0]), "%s", spec);
  else snprintf(names[0], sizeof(names[0]), "libnccl-%s.so", kind);
  snprintf(names[1], sizeof(names[1]), "libnccl-%s-%s.so", kind, spec);
  for (int i = 0; i < (spec[0] ? 2 : 1); i++) {
    void* h = dlopen(names[i], RTLD_LAZY | RTLD_LOCAL);
    if (h) {
      dlclose(h);
      snprintf(out, cap, "%s", names[i]);
      return out;
    }
  }
  if (spec[0]) snprintf(out, cap, "%s not found", spec);
  else snprintf(out, cap, "none found");
  return out;
}

/* The first screen: what this build and host offer and what is set, before the long tables. */
/* Memory per rank (docs/SCALE.md): what a communicator's per-peer FIFOs take under the settings,
 * and this process's own figures (a running rank's: chorusCommGetMemory, chorus_memory_* metrics). */
static void print_memory(void) {
  struct tp_sizes ring;
  ring.buff[PROTO_SIMPLE] = (size_t)param_int(PARAM_BUFFSIZE);
  ring.buff[PROTO_LL] = (size_t)param_int(PARAM_LL_BUFFSIZE);
  ring.buff[PROTO_LL128] = (size_t)param_int(PARAM_LL128_BUFFSIZE);
  printf("\nMemory per rank\n");
  printf("  per-peer FIFOs (send/recv, AlltoAll, Gather, Scatter): CHORUS_P2P_MEM=%lld, CHORUS_P2P_PEERS=%lld\n",
         (long long)param_int(PARAM_P2P_MEM), (long long)param_int(PARAM_P2P_PEERS));
  static const int ns[] = {8, 64, 128, 256, 1024, 4096};
  for (int i = 0; i < (int)(sizeof(ns) / sizeof(ns[0])); i++) {
    struct tp_sizes p2p;
    int cap;
    pool_sizes(&ring, ns[i], (int)param_int(PARAM_P2P_MAX_PEERS), &p2p, &cap);
    size_t fifo = tp_fifo_bytes(&p2p);
    int live = cap < ns[i] - 1 ? cap : ns[i] - 1;
    printf("    %5d ranks: %4zu KiB a FIFO, at most %4d peers live, %6.1f MiB of receive FIFOs a rank%s\n", ns[i],
           fifo >> 10, cap, (double)fifo * live / 1048576.0, cap < ns[i] - 1 ? " (least recently used released)" : "");
  }
  struct obs_proc_mem pm;
  obs_proc_memory(&pm);
  printf("  this process: shared %.1f MiB, private %.1f MiB, pinned %.1f MiB, %llu descriptors, %llu threads\n",
         (double)pm.shmem / 1048576.0, (double)pm.priv / 1048576.0, (double)pm.pinned / 1048576.0,
         (unsigned long long)pm.fds, (unsigned long long)pm.threads);
  printf("  a running rank's: chorusCommGetMemory, or the chorus_memory_* gauges of chorusCommMetrics\n");
}

static void print_summary(void) {
  int v = 0;
  chorusGetVersion(&v);
  printf("Chorus %s (code %d), NCCL API %d.%d.%d\n", CHORUS_VERSION_STRING, v, NCCL_MAJOR, NCCL_MINOR, NCCL_PATCH);
  char cuda[1024];
  int has_cuda = cudrv_describe(cuda, sizeof(cuda)) == 0;
  char* nl = strchr(cuda, '\n');
  if (nl) *nl = 0; /* its first line; Host below has the rest */
  size_t fb = 0;
  cudev_fatbin(&fb);
  const char* why = NULL;
  int ofi = ch_ofi_available(&why) == 0;
  printf("Built in\n  CUDA driver loader: %s\n  device kernels: %s\n", cuda,
         fb ? cudev_fatbin_archs() : "none (device buffers go through host memory)");
  if (ofi) printf("  libfabric (OFI network): usable, provider %s\n", ch_ofi_provider());
  else printf("  libfabric (OFI network): no (%s)\n", why ? why : "unknown");
  char b[3][300];
  printf("  plugins: net %s, tuner %s, profiler %s\n", plugin_found("net", param_str(PARAM_NET_PLUGIN), b[0], sizeof(b[0])),
         plugin_found("tuner", param_str(PARAM_TUNER_PLUGIN), b[1], sizeof(b[1])),
         plugin_found("profiler", param_str(PARAM_PROFILER_PLUGIN), b[2], sizeof(b[2])));
  printf("Transports\n  threads of one process: shared buffers; processes of one host: shared memory;\n"
         "  hosts: sockets%s%s\n", ofi ? ", OFI" : "", has_cuda ? "; device buffers: CUDA" : "");
  printf("Settings that differ from the defaults\n");
  int n = 0;
  for (int id = 0; id < PARAM_COUNT; id++) {
    struct param_info pi;
    param_describe((enum param_id)id, &pi);
    if (!strcmp(pi.source, "default")) continue;
    if (pi.kind != P_STR) printf("  %s=%lld [%s]\n", pi.env, (long long)param_int((enum param_id)id), pi.source);
    else printf("  %s=%s [%s]\n", pi.env, param_str((enum param_id)id), pi.source);
    n++;
  }
  if (!n) printf("  none\n");
}

int main(int argc, char** argv) {
  int brief = argc > 1 && strcmp(argv[1], "--brief") == 0;
  if (argc == 3 && strcmp(argv[1], "--stall") == 0) return query(argv[2], STALL_Q_SUMMARY);
  if (argc == 3 && strcmp(argv[1], "--dump") == 0) return query(argv[2], STALL_Q_DUMP);
  if (argc == 3 && strcmp(argv[1], "--metrics") == 0) return query(argv[2], STALL_Q_METRICS);
  if (argc == 3 && strcmp(argv[1], "--flight") == 0) return flight_report(argv[2], stdout);
  if (argc >= 3 && argc <= 5 && strcmp(argv[1], "--trace") == 0) return trace_main(argc - 2, argv + 2);
  if (argc <= 3 && argc > 1 && strcmp(argv[1], "--calibrate") == 0)
    return calibrate_main(argc == 3 ? argv[2] : "chorus-tune.conf");
  if (argc == 2 && !strcmp(argv[1], "--version")) {
    printf("chorus-info (Chorus) %s\n", CHORUS_VERSION_STRING);
    return 0;
  }
  int help = argc == 2 && (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h"));
  if (argc > 1 && !brief) {
    FILE* o = help ? stdout : stderr;
    if (!help) {
      static const char* const known[] = {"--stall", "--dump", "--metrics", "--flight", "--trace", "--calibrate",
                                          "--brief", "--version"};
      int k = 0;
      for (size_t i = 0; i < sizeof(known) / sizeof(known[0]); i++) k |= !strcmp(argv[1], known[i]);
      fprintf(o, k ? "chorus-info: wrong arguments for '%s'\n" : "chorus-info: unknown option '%s'\n", argv[1]);
    }
    fprintf(o, "usage: chorus-info [--brief]\n  Prints a summary (version; what was built in: CUDA loader, kernels, "
           "libfabric,\n  plugins found; transports; settings that differ from the defaults), then the host's\n"
           "  topology, the names settings accept, and every setting. --brief stops after the host.\n"
           "       chorus-info --version\n  Prints the version.\n"
           "       chorus-info --stall HOST:PORT\n  Prints the stall report of a running job: HOST:PORT is a "
           "process's stall query address\n  (logged by each rank at NCCL_DEBUG=INFO, named in every stall "
           "report). The job's secret\n  comes from CHORUS_SECRET / CHORUS_SECRET_FILE; without one only the "
           "job's own user\n  on the same host may ask.\n"
           "       chorus-info --dump HOST:PORT\n  Makes every rank of that job write its flight recorder "
           "(CHORUS_DUMP_DIR on each host).\n"
           "       chorus-info --metrics HOST:PORT\n  Prints that process's counters in Prometheus' text format.\n"
           "       chorus-info --flight DIR\n  Reads every rank's flight recorder dump in DIR and says what "
           "happened job-wide:\n  the first call on which ranks diverged, the ranks that never entered a call "
           "the\n  others are in, the rank the others waited for.\n"
           "       chorus-info --trace DIR [OUT.json [OUT.svg]]\n  Merges the ranks' CHORUS_TRACE files in DIR "
           "into one trace (default DIR/job.json)\n  and draws it (default DIR/job.svg).\n"
           "       chorus-info --calibrate [FILE]\n  Measures the cost model's constants on this machine (a few "
           "seconds) and writes them\n  to FILE (default chorus-tune.conf) for CHORUS_TUNE_FILE.\n");
    return help ? 0 : 2;
  }
  print_summary();
  printf("\nHost\n");
  printf("  hostname %s, host id %s\n", ut_hostname(), ut_host_id());
  printf("  cpus online: %d\n", ut_ncpus());
  print_numa();
  struct statvfs sv;
  if (statvfs("/dev/shm", &sv) == 0)
    printf("  /dev/shm: %.1f MiB free of %.1f MiB (FIFOs use memfd; this matters for named fallbacks)\n",
           (double)sv.f_bavail * sv.f_frsize / 1048576.0, (double)sv.f_blocks * sv.f_frsize / 1048576.0);
  print_memory();
  char ifs[4096] = "";
  sock_list_interfaces(ifs, sizeof(ifs));
  printf("  network interfaces (usable for sockets):\n");
  if (!ifs[0]) printf("    none\n");
  for (char *save = NULL, *line = strtok_r(ifs, "\n", &save); line; line = strtok_r(NULL, "\n", &save))
    printf("    %s\n", line);
  char name[64];
  union sock_addr a;
  if (sock_find_interface(NULL, name, sizeof(name), &a) == CH_OK) {
    char buf[80];
    printf("  bootstrap would use: %s %s\n", name, sock_addr_str(&a, buf, sizeof(buf)));
  }
  char cuda[1024];
  int has_cuda = cudrv_describe(cuda, sizeof(cuda)) == 0;
  printf("  CUDA: %s\n", cuda);
  if (has_cuda)
    printf("    ranks that share one GPU: every collective and Send/Recv runs there (the kernels above,\n"
           "    peers' buffers through CUDA IPC); ranks on several GPUs or hosts: host copies in the call's\n"
           "    stream order; managed memory: used in place after the stream\n");
  if (brief) return 0;
  /* The names NCCL_ALGO and NCCL_PROTO accept, and the perf tools' -d and -o, from the one table
   * (misc/names.h) the library parses them with. */
  printf("\nNames\n");
  printf("  algorithms (NCCL_ALGO):");
  for (int b = 0; b < CH_NALGO_BITS; b++) printf(" %s%s", ch_algo_name(b), b >= CH_NALGO ? "*" : "");
  printf("   (*: accepted as NCCL does, never chosen)\n  protocols (NCCL_PROTO):");
  for (int p = 0; p < CH_NPROTOS; p++) printf(" %s", ch_proto_name(p));
  printf("\n  collectives of per-collective entries (\"allreduce:Ring\"):");
  for (int f = 0; f < TUNE_P2P; f++) printf(" %s", ch_func_name(f));
  printf("\n  datatypes (the perf tools' -d):");
  for (int d = 0; d < ncclNumTypes; d++) printf(" %s", ch_type_test_name(d));
  printf("\n  reduction ops (the perf tools' -o):");
  for (int o = 0; o < CH_NOPS; o++) printf(" %s", ch_op_test_name(o));
  printf("\n");
  printf("\nConfiguration (environment, or NCCL_ENV_PLUGIN's plugin, then NCCL_CONF_FILE / ~/.nccl.conf / /etc/nccl.conf)\n");
  for (int id = 0; id < PARAM_COUNT; id++) {
    struct param_info pi;
    param_describe((enum param_id)id, &pi);
    char val[160], def[64];
    if (pi.kind != P_STR) {
      snprintf(val, sizeof(val), "%lld", (long long)param_int((enum param_id)id));
      snprintf(def, sizeof(def), "%lld", (long long)pi.default_int);
    } else {
      snprintf(val, sizeof(val), "%s", param_str((enum param_id)id)[0] ? param_str((enum param_id)id) : "(unset)");
      snprintf(def, sizeof(def), "%s", pi.default_str[0] ? pi.default_str : "(unset)");
    }
    printf("  %-28s = %-20s default %-12s [%s]\n      %s\n", pi.env, val, def, pi.source, pi.help);
  }
  return 0;
}
