/* Tuner plugins with NCCL's ABI (tune/plugin_abi.h): NCCL_TUNER_PLUGIN names a library (a path, a library
 * name, or a bare name X for libnccl-tuner-X.so; unset: libnccl-tuner.so if present; "none": no
 * plugin). The newest interface it exports is used (ncclTunerPlugin_v6, v5, v4, v3: the cost-table
 * versions). Loaded once per process and shared by reference; init per communicator. A plugin that
 * does not load or init is reported and the communicator goes on without it. A v6 plugin's optional
 * getChunkSize sets the pipeline step of Ring and Tree calls (tuner_chunk). */
#include <dlfcn.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "../misc/log.h"
#include "../misc/param.h"
#include "../misc/plugin.h"
#include "../misc/utils.h"
#include "plugin_abi.h"
#include "tune.h"

struct tune_plugin {
  void* dl;
  int version; /* 3..6 */
  const void* iface; /* ncclTuner_vN_t */
  const char* name;  /* the plugin's own name */
  char path[512];    /* what dlopen accepted */
  int refs;          /* communicators using it (under once.mu) */
};

/* Process-wide: the loaded plugin and the last value that failed to load (reported once). */
static struct plugin_once once = PLUGIN_ONCE_INIT("NCCL_TUNER_PLUGIN", "tuner");

int tuner_candidates(const char* value, char out[2][512]) {
  if (!value || !*value) {
    snprintf(out[0], 512, "libnccl-tuner.so");
    return 1;
  }
  if (strcasecmp(value, "none") == 0) return 0;
  snprintf(out[0], 512, "%s", value);
  size_t len = strlen(value);
  int bare = !strchr(value, '/') && strncmp(value, "lib", 3) != 0 && !(len >= 3 && !strcmp(value + len - 3, ".so"));
  if (!bare) return 1;
  snprintf(out[1], 512, "libnccl-tuner-%s.so", value);
  return 2;
}

const char* tuner_name(const struct ncclComm* comm) {
  return comm->tuner ? comm->tuner->name : "(none)";
}

/* The logger handed to plugins: their WARN and INFO lines go where Chorus's go. */
static void plugin_log(ncclDebugLogLevel level, unsigned long flags, const char* file, int line, const char* fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  log_plugin_v("tuner", LOG_INFO, (int)level, flags, file, line, fmt, ap); /* its TRACE lines print as INFO */
  va_end(ap);
}

static void* load(const char* value, char path[512]) {
  char cand[2][512];
  int n = tuner_candidates(value, cand), k = 0;
  void* dl = plugin_open_logged(&once, LOG_INIT | LOG_TUNING, value, cand, n, &k);
  if (!dl) return NULL;
  static const char* syms[] = {"ncclTunerPlugin_v6", "ncclTunerPlugin_v5", "ncclTunerPlugin_v4", "ncclTunerPlugin_v3"};
  const void* iface = NULL;
  int version = 0;
  for (int i = 0; i < 4 && !iface; i++)
    if ((iface = dlsym(dl, syms[i]))) version = 6 - i;
  const char* name = iface ? *(const char* const*)iface : NULL; /* every version starts with its name */
  if (!iface || !name) {
    WARN("NCCL_TUNER_PLUGIN=%s: %s exports no ncclTunerPlugin_v6/v5/v4/v3 %s; continuing without a tuner plugin%s",
         value, cand[k], iface ? "name" : "symbol",
         dlsym(dl, "ncclTunerPlugin_v2") ? " (it has v2, which has no cost table: not supported)" : "");
    dlclose(dl);
    return NULL;
  }
  struct tune_plugin* p = calloc(1, sizeof(*p));
  if (!p) {
    WARN("tuner plugin %s: out of memory", cand[k]);
    dlclose(dl);
    return NULL;
  }
  p->dl = dl, p->version = version, p->iface = iface, p->name = name;
  snprintf(p->path, sizeof(p->path), "%.511s", cand[k]);
  snprintf(path, 512, "%s", cand[k]);
  INFO(LOG_INIT | LOG_TUNING, "tuner plugin %s (ncclTunerPlugin_v%d) loaded from %s", name, version, cand[k]);
  return p;
}

static void put_ref(struct tune_plugin* p) {
  pthread_mutex_lock(&once.mu);
  if (--p->refs == 0) {
    plugin_once_forget(&once, p);
    dlclose(p->dl);
    free(p);
  }
  pthread_mutex_unlock(&once.mu);
}

void tuner_open(struct ncclComm* comm) {
  comm->tuner = NULL, comm->tuner_ctx = NULL;
  const char* value = param_str(PARAM_TUNER_PLUGIN);
  char cand[2][512];
  if (strlen(value) >= sizeof(cand[0])) { /* it would be cut: a name no file has, compared cut */
    WARN("NCCL_TUNER_PLUGIN is longer than %zu characters: this communicator goes without a tuner plugin",
         sizeof(cand[0]) - 1);
    return;
  }
  if (tuner_candidates(value, cand) == 0) return;
  pthread_mutex_lock(&once.mu);
  struct tune_plugin* p = plugin_once_get(&once, value, load);
  if (p) p->refs++;
  pthread_mutex_unlock(&once.mu);
  if (!p) return;

  /* Hosts play NVLink domains' part: ranks of one host share memory. */
  ncclNvlDomainInfo_v6_t dom = {comm->nnodes, comm->nranks, 0};
  for (int r = 0; r < comm->nranks; r++) {
    int same = 0;
    for (int q = 0; q < comm->nranks; q++) same += comm->peers[q].host_hash == comm->peers[r].host_hash;
    if (same < dom.minRanksPerNvlDomain) dom.minRanksPerNvlDomain = same;
    if (same > dom.maxRanksPerNvlDomain) dom.maxRanksPerNvlDomain = same;
  }
  /* NCCL's model constants do not apply to Chorus's model: zeros, and edits are ignored. */
  ncclTunerConstants_v6_t consts;
  memset(&consts, 0, sizeof(consts));
  void* ctx = NULL;
  ncclResult_t rc;
  size_t nr = (size_t)comm->nranks, nn = (size_t)comm->nnodes;
  switch (p->version) {
    case 6: rc = ((const ncclTuner_v6_t*)p->iface)->init(&ctx, comm->comm_hash, nr, nn, plugin_log, &dom, &consts); break;
    case 5: rc = ((const ncclTuner_v5_t*)p->iface)->init(&ctx, comm->comm_hash, nr, nn, plugin_log, &dom, &consts); break;
    case 4: rc = ((const ncclTuner_v4_t*)p->iface)->init(nr, nn, plugin_log, &ctx); break;
    default: rc = ((const ncclTuner_v3_t*)p->iface)->init(nr, nn, plugin_log, &ctx); break;
  }
  if (rc != ncclSuccess) {
    WARN("tuner plugin %s (%s): init for %d ranks returned %d; this communicator goes without it", p->name, p->path,
         comm->nranks, (int)rc);
    put_ref(p);
    return;
  }
  comm->tuner = p, comm->tuner_ctx = ctx;
  atomic_store(&comm->tuner_failed, 0);
  atomic_store(&comm->tuner_chunk_warned, 0);
  int chunks = p->version == 6 && ((const ncclTuner_v6_t*)p->iface)->getChunkSize;
  if (comm->rank == 0)
    INFO(LOG_INIT | LOG_TUNING, "tuner plugin %s (v%d) decides among Ring/Tree entries%s for %d ranks", p->name,
         p->version, chunks ? " and their chunk size" : "", comm->nranks);
}

void tuner_close(struct ncclComm* comm) {
  struct tune_plugin* p = comm->tuner;
  if (!p) return;
  ncclResult_t rc;
  switch (p->version) {
    case 6: rc = ((const ncclTuner_v6_t*)p->iface)->finalize(comm->tuner_ctx); break;
    case 5: rc = ((const ncclTuner_v5_t*)p->iface)->finalize(comm->tuner_ctx); break;
    case 4: rc = ((const ncclTuner_v4_t*)p->iface)->destroy(comm->tuner_ctx); break;
    default: rc = ((const ncclTuner_v3_t*)p->iface)->destroy(comm->tuner_ctx); break;
  }
  if (rc != ncclSuccess) WARN("tuner plugin %s: finalize returned %d", p->name, (int)rc);
  comm->tuner = NULL, comm->tuner_ctx = NULL;
  put_ref(p);
}

int tuner_get_coll_info(struct ncclComm* comm, int func, size_t bytes, float* table, int* nch) {
  struct tune_plugin* p = comm->tuner;
  float** t = (float**)(void*)table; /* NCCL passes float[numAlgo][numProto] cast to float**, so do we */
  ncclResult_t rc;
  switch (p->version) {
    case 6: rc = ((const ncclTuner_v6_t*)p->iface)->getCollInfo(comm->tuner_ctx, (ncclFunc_t)func, bytes, 1, t,
                 NCCL_NUM_ALGORITHMS, NCCL_NUM_PROTOCOLS, 0, nch); break;
    case 5: rc = ((const ncclTuner_v5_t*)p->iface)->getCollInfo(comm->tuner_ctx, (ncclFunc_t)func, bytes, 1, t,
                 NCCL_NUM_ALGORITHMS, NCCL_NUM_PROTOCOLS, 0, nch); break;
    case 4: rc = ((const ncclTuner_v4_t*)p->iface)->getCollInfo(comm->tuner_ctx, (ncclFunc_t)func, bytes, 1, t,
                 NCCL_NUM_ALGORITHMS, NCCL_NUM_PROTOCOLS, 0, nch); break;
    default: rc = ((const ncclTuner_v3_t*)p->iface)->getCollInfo(comm->tuner_ctx, (ncclFunc_t)func, bytes, 1, t,
                 NCCL_NUM_ALGORITHMS, NCCL_NUM_PROTOCOLS, nch); break;
  }
  return (int)rc;
}

/* NCCL clamps a chunk larger than its buffer allows and rounds it to its grain; here a step is a FIFO
 * slot, whose size every rank shares, so an answer that does not fit one (or splits an element) is
 * refused whole, and the slot's own size is kept. Every rank must get the same answer, as in NCCL:
 * both ends of a connection walk the same steps (docs/ARCHITECTURE.md, "Invariants"). */
size_t tuner_chunk(struct ncclComm* comm, int func, size_t bytes, size_t esize, const struct tune_choice* how) {
  struct tune_plugin* p = comm->tuner;
  if (!p || p->version < 6 || esize == 0 || (how->algo != ALGO_RING && how->algo != ALGO_TREE)) return 0;
  const ncclTuner_v6_t* t = p->iface;
  if (!t->getChunkSize) return 0;
  size_t step = tune_step_elems(comm, 1, how->algo, how->proto, esize) * esize, chunk = step;
  size_t nccl_bytes = bytes * (func == FUNC_ALLGATHER || func == FUNC_REDUCESCATTER ? (size_t)comm->nranks : 1);
  /* the same numbering: NCCL_ALGO_TREE/RING are ALGO_TREE/RING, NCCL_PROTO_* are PROTO_* */
  ncclResult_t rc =
      t->getChunkSize(comm->tuner_ctx, (ncclFunc_t)func, nccl_bytes, how->algo, how->proto, how->nch, &chunk);
  if (rc == ncclSuccess && chunk == step) return 0;
  if (rc == ncclSuccess && chunk > 0 && chunk % esize == 0 && chunk < step) return chunk;
  int first = 0;
  if (atomic_compare_exchange_strong(&comm->tuner_chunk_warned, &first, 1)) {
    if (rc != ncclSuccess)
      WARN("tuner plugin %s: getChunkSize(%s, %zu bytes, %s/%s) returned %d; using %zu-byte steps (reported once)",
           p->name, tune_func_name(func), nccl_bytes, algo_name(how->algo), tune_proto_name(how->proto), (int)rc, step);
    else
      WARN("tuner plugin %s: getChunkSize(%s, %zu bytes, %s/%s) chose %zu bytes, which is %s; using %zu-byte steps "
           "(reported once)",
           p->name, tune_func_name(func), nccl_bytes, algo_name(how->algo), tune_proto_name(how->proto), chunk,
           chunk == 0      ? "0"
           : chunk % esize ? "not a whole number of elements"
                           : "more than a FIFO step holds",
           step);
  }
  return 0;
}
