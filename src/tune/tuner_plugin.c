/* Tuner plugins with NCCL's ABI (tune/plugin_abi.h): NCCL_TUNER_PLUGIN names a library (a path, a library
 * name, or a bare name X for libnccl-tuner-X.so; unset: libnccl-tuner.so if present; "none": no
 * plugin). The newest interface it exports is used (ncclTunerPlugin_v6, v5, v4, v3: the cost-table
 * versions). Loaded once per process and shared by reference; init per communicator. A plugin that
 * does not load or init is reported and the communicator goes on without it. */
#include <dlfcn.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "../misc/log.h"
#include "../misc/param.h"
#include "../misc/utils.h"
#include "plugin_abi.h"
#include "tune.h"

struct tune_plugin {
  void* dl;
  int version; /* 3..6 */
  const void* iface; /* ncclTuner_vN_t */
  const char* name;  /* the plugin's own name */
  char value[512];   /* NCCL_TUNER_PLUGIN it was loaded for */
  char path[512];    /* what dlopen accepted */
  int refs;          /* communicators using it (under mu) */
};

/* Process-wide: the loaded plugin and the last value that failed to load (reported once). Both only
 * under mu. */
static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static struct tune_plugin* loaded;
static char failed_value[512];
static int failed_valid;

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
  if (__atomic_load_n(&log_level_cached, __ATOMIC_ACQUIRE) < 0) log_init();
  int have = __atomic_load_n(&log_level_cached, __ATOMIC_ACQUIRE);
  int warn = level == NCCL_LOG_WARN || level == NCCL_LOG_ABORT;
  if (!warn && (level != NCCL_LOG_INFO && level != NCCL_LOG_TRACE)) return;
  if (!warn && (have < (int)level || !(__atomic_load_n(&log_mask, __ATOMIC_RELAXED) & (unsigned)flags))) return;
  char buf[1024];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(buf, sizeof(buf), fmt, ap);
  va_end(ap);
  log_msg(warn ? LOG_WARN : LOG_INFO, warn ? (unsigned)LOG_ALL : (unsigned)flags, file ? file : "tuner", line, "%s", buf);
}

static struct tune_plugin* load(const char* value) {
  char cand[2][512], err[2][256] = {"", ""};
  int n = tuner_candidates(value, cand), k = 0;
  void* dl = ut_plugin_open(cand, n, &k, err);
  if (!dl) {
    if (!*value) /* the default name: its absence is normal */
      INFO(LOG_INIT | LOG_TUNING, "no tuner plugin (%s: %s)", cand[0], err[0]);
    else if (n == 2)
      WARN("NCCL_TUNER_PLUGIN=%s: could not load %s (%s) nor %s (%s); continuing without a tuner plugin", value,
           cand[0], err[0], cand[1], err[1]);
    else
      WARN("NCCL_TUNER_PLUGIN=%s: could not load %s (%s); continuing without a tuner plugin", value, cand[0], err[0]);
    return NULL;
  }
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
  snprintf(p->value, sizeof(p->value), "%.511s", value);
  snprintf(p->path, sizeof(p->path), "%.511s", cand[k]);
  INFO(LOG_INIT | LOG_TUNING, "tuner plugin %s (ncclTunerPlugin_v%d) loaded from %s", name, version, cand[k]);
  return p;
}

static void put_ref(struct tune_plugin* p) {
  pthread_mutex_lock(&mu);
  if (--p->refs == 0) {
    if (loaded == p) loaded = NULL;
    dlclose(p->dl);
    free(p);
  }
  pthread_mutex_unlock(&mu);
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
  pthread_mutex_lock(&mu);
  struct tune_plugin* p = NULL;
  if (loaded && strcmp(loaded->value, value) == 0) {
    p = loaded;
  } else if (loaded) {
    WARN("NCCL_TUNER_PLUGIN=%s: this process already uses tuner plugin %s (NCCL_TUNER_PLUGIN=%s); "
         "this communicator goes without one", value, loaded->path, loaded->value);
  } else if (!(failed_valid && strcmp(failed_value, value) == 0)) {
    p = loaded = load(value);
    if (!p) snprintf(failed_value, sizeof(failed_value), "%s", value), failed_valid = 1;
  }
  if (p) p->refs++;
  pthread_mutex_unlock(&mu);
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
  if (comm->rank == 0)
    INFO(LOG_INIT | LOG_TUNING, "tuner plugin %s (v%d) decides among Ring/Tree entries for %d ranks", p->name,
         p->version, comm->nranks);
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
