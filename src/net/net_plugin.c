/* External NCCL net plugins (net.h, net_abi.h). NCCL_NET_PLUGIN names a comma list of libraries (a path,
 * a library name, or a bare name X for libnccl-net-X.so; unset: libnccl-net.so if present; "none": no
 * plugin), tried in order as NCCL does (src/plugin/plugin_open.cc). The first one that opens and exports
 * ncclNetPlugin_v12, _v11 or _v10 (newest first) is used. Versions 11 and 10 are served through the
 * adapter tables below, which present them as version 12, the interface the fabric transport talks to;
 * their defaults are NCCL's adapters' (src/plugin/net/net_v10.cc, net_v11.cc). One plugin per process:
 * the library stays loaded for the life of the process and the adapters are static. */
#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "../misc/log.h"
#include "../misc/utils.h"
#include "net.h"

#define NET_PLUGIN_MAX_ENTRIES 14 /* NCCL_NET_MAX_PLUGINS 16 minus the 2 internal ones */

/* ---- v11 -> v12: the function table is the same but for the properties' vProps (4 devices) and the
 * fields v12 appended (railId, planeId). ---- */

static const ncclNet_v11_t* v11;
static ncclNet_v12_t adapt11;

/* The fields every version has (p: a v10 or v11 properties struct, whose vProps hold 4 devices). */
#define PROPS_COMMON_UP(o, p)                                                                          \
  do {                                                                                                 \
    CH_NET_PROPS_COPY_COMMON(o, p);                                                                    \
    (o)->maxMultiRequestSize = 1; /* NCCL's default for plugins older than v11 */                      \
    (o)->railId = NCCL_NET_ID_UNDEF, (o)->planeId = NCCL_NET_ID_UNDEF;                                 \
  } while (0)

static ncclResult_t a11_getProperties(int dev, ncclNetProperties_v12_t* props) {
  ncclNetProperties_v11_t p;
  memset(&p, 0, sizeof(p));
  ncclResult_t rc = v11->getProperties(dev, &p);
  if (rc != ncclSuccess) return rc;
  PROPS_COMMON_UP(props, &p);
  props->maxMultiRequestSize = p.maxMultiRequestSize;
  return ncclSuccess;
}

/* A fused device of more than 4 physical ones cannot be expressed to a v10/v11 plugin. */
static ncclResult_t vprops_down(const ncclNetVDeviceProps_v12_t* in, ncclNetVDeviceProps_v11_t* out) {
  if (in->ndevs < 0 || in->ndevs > NCCL_NET_MAX_DEVS_PER_NIC_V11) {
    WARN("net plugin: a virtual device of %d NICs was asked for; this plugin's interface allows at most %d",
         in->ndevs, NCCL_NET_MAX_DEVS_PER_NIC_V11);
    return ncclInvalidArgument;
  }
  memset(out, 0, sizeof(*out));
  out->ndevs = in->ndevs;
  for (int i = 0; i < in->ndevs; i++) out->devs[i] = in->devs[i];
  return ncclSuccess;
}

static ncclResult_t a11_makeVDevice(int* d, ncclNetVDeviceProps_v12_t* props) {
  ncclNetVDeviceProps_v11_t p;
  ncclResult_t rc = vprops_down(props, &p);
  return rc != ncclSuccess ? rc : v11->makeVDevice(d, &p);
}

static ncclResult_t a11_finalize(void* ctx) { return v11->finalize ? v11->finalize(ctx) : ncclSuccess; }

static void adapt_v11(const ncclNet_v11_t* n) {
  v11 = n;
  ncclNet_v12_t* a = &adapt11;
  memset(a, 0, sizeof(*a));
  a->name = n->name, a->init = n->init, a->devices = n->devices, a->getProperties = a11_getProperties;
  a->listen = n->listen, a->connect = n->connect, a->accept = n->accept, a->regMr = n->regMr;
  a->regMrDmaBuf = n->regMrDmaBuf, a->deregMr = n->deregMr, a->isend = n->isend, a->irecv = n->irecv;
  a->iflush = n->iflush, a->test = n->test, a->closeSend = n->closeSend, a->closeRecv = n->closeRecv;
  a->closeListen = n->closeListen, a->getDeviceMr = n->getDeviceMr, a->irecvConsumed = n->irecvConsumed;
  a->makeVDevice = n->makeVDevice ? a11_makeVDevice : NULL;
  a->finalize = a11_finalize, a->setNetAttr = n->setNetAttr;
}

/* ---- v10 -> v12: init once per process (no ctx), listen without ctx, the traffic class passed to
 * connect, no finalize nor setNetAttr. ---- */

static const ncclNet_v10_t* v10;
static ncclNet_v12_t adapt10;
static pthread_mutex_t v10_mu = PTHREAD_MUTEX_INITIALIZER;
static const ncclNet_v10_t* v10_inited; /* the table whose init ran (under v10_mu) */
static ncclResult_t v10_init_rc;
static char v10_ctx; /* the dummy context every init returns */

static ncclResult_t a10_init(void** ctx, uint64_t commId, ncclNetCommConfig_v12_t* config,
                             ncclDebugLogger_t logFunction, ncclProfilerCallback_t profFunction) {
  pthread_mutex_lock(&v10_mu);
  if (v10_inited != v10) {
    v10_init_rc = v10->init(logFunction, profFunction);
    v10_inited = v10;
  }
  ncclResult_t rc = v10_init_rc;
  pthread_mutex_unlock(&v10_mu);
  if (rc == ncclSuccess) *ctx = &v10_ctx;
  return rc;
}

static ncclResult_t a10_getProperties(int dev, ncclNetProperties_v12_t* props) {
  ncclNetProperties_v10_t p;
  memset(&p, 0, sizeof(p));
  ncclResult_t rc = v10->getProperties(dev, &p);
  if (rc != ncclSuccess) return rc;
  PROPS_COMMON_UP(props, &p);
  return ncclSuccess;
}

static ncclResult_t a10_listen(void* ctx, int dev, void* handle, void** listenComm) {
  return v10->listen(dev, handle, listenComm);
}

static ncclResult_t a10_connect(void* ctx, int dev, void* handle, void** sendComm,
                                ncclNetDeviceHandle_v12_t** sendDevComm) {
  ncclNetCommConfig_v10_t config = {NCCL_NET_TRAFFIC_CLASS_UNDEF};
  return v10->connect(dev, &config, handle, sendComm, sendDevComm);
}

static ncclResult_t a10_makeVDevice(int* d, ncclNetVDeviceProps_v12_t* props) {
  ncclNetVDeviceProps_v10_t p;
  ncclResult_t rc = vprops_down(props, &p);
  return rc != ncclSuccess ? rc : v10->makeVDevice(d, &p);
}

static ncclResult_t a10_finalize(void* ctx) { return ncclSuccess; }

static void adapt_v10(const ncclNet_v10_t* n) {
  v10 = n;
  ncclNet_v12_t* a = &adapt10;
  memset(a, 0, sizeof(*a));
  a->name = n->name, a->init = a10_init, a->devices = n->devices, a->getProperties = a10_getProperties;
  a->listen = a10_listen, a->connect = a10_connect, a->accept = n->accept, a->regMr = n->regMr;
  a->regMrDmaBuf = n->regMrDmaBuf, a->deregMr = n->deregMr, a->isend = n->isend, a->irecv = n->irecv;
  a->iflush = n->iflush, a->test = n->test, a->closeSend = n->closeSend, a->closeRecv = n->closeRecv;
  a->closeListen = n->closeListen, a->getDeviceMr = n->getDeviceMr, a->irecvConsumed = n->irecvConsumed;
  a->makeVDevice = n->makeVDevice ? a10_makeVDevice : NULL;
  a->finalize = a10_finalize, a->setNetAttr = NULL;
}

/* ---- v12 with no finalize: NCCL would call it unchecked; the transport gets a no-op instead. ---- */

static ncclNet_v12_t adapt12;
static ncclResult_t a12_finalize(void* ctx) { return ncclSuccess; }

/* ---- Opening ---- */

/* The library names one entry of NCCL_NET_PLUGIN stands for: as given, then libnccl-net-<entry>.so
 * when the entry has no '/' and is not already lib*.so. */
/* Tries one library: 1 with the table set up, 0 with the reason appended to why. */
static int try_library(void* dl, const char* path, const ncclNet_t** out, int* version, char* origin,
                       size_t origin_len, char* why, size_t why_len) {
  static const char* const syms[] = {"ncclNetPlugin_v12", "ncclNetPlugin_v11", "ncclNetPlugin_v10"};
  for (int i = 0; i < 3; i++) {
    const void* t = dlsym(dl, syms[i]);
    if (!t) continue;
    const char* name = *(const char* const*)t; /* every version starts with its name */
    if (!name || !*name) {
      ut_appendf(why, why_len, "%s: %s has no name", path, syms[i]);
      return 0;
    }
    int v = 12 - i;
    if (v == 12) {
      const ncclNet_v12_t* n = t;
      if (n->finalize) {
        *out = n;
      } else {
        adapt12 = *n;
        adapt12.finalize = a12_finalize;
        *out = &adapt12;
      }
    } else if (v == 11) {
      adapt_v11(t);
      *out = &adapt11;
    } else {
      adapt_v10(t);
      *out = &adapt10;
    }
    *version = v;
    snprintf(origin, origin_len, "%s (%s)", path, syms[i]);
    return 1;
  }
  char older[32] = "";
  for (int v = 9; v >= 2 && !*older; v--) {
    char sym[32];
    snprintf(sym, sizeof(sym), "ncclNetPlugin_v%d", v);
    if (dlsym(dl, sym)) snprintf(older, sizeof(older), "%s", sym);
  }
  if (*older)
    ut_appendf(why, why_len, "%s exports %s only: Chorus supports v10 to v12", path, older);
  else
    ut_appendf(why, why_len, "%s exports no ncclNetPlugin_v12/v11/v10 symbol", path);
  return 0;
}

int ch_net_plugin_open(const char* spec, const ncclNet_t** out, int* version, char* origin, size_t origin_len,
                       const char** why) {
  static char whybuf[2048]; /* process lifetime: one decision per process (select.c) */
  whybuf[0] = '\0';
  *out = NULL, *why = NULL;
  if (!spec) spec = "";
  if (strcasecmp(spec, "none") == 0) return -1;
  char list[1024];
  if (strlen(spec) >= sizeof(list)) {
    snprintf(whybuf, sizeof(whybuf), "NCCL_NET_PLUGIN is longer than %zu characters", sizeof(list) - 1);
    *why = whybuf;
    return -1;
  }
  snprintf(list, sizeof(list), "%s", *spec ? spec : "libnccl-net.so");
  int entries = 0;
  char* save = NULL;
  for (char* e = strtok_r(list, ",", &save); e; e = strtok_r(NULL, ",", &save)) {
    while (*e == ' ') e++;
    size_t len = strlen(e);
    while (len && e[len - 1] == ' ') e[--len] = '\0';
    if (!*e) continue;
    if (++entries > NET_PLUGIN_MAX_ENTRIES) {
      ut_appendf(whybuf, sizeof(whybuf), "entries after the %dth ignored (from %s)", NET_PLUGIN_MAX_ENTRIES, e);
      break;
    }
    char cand[2][512];
    int n = ut_plugin_names("net", e, cand), k = 0;
    if (!n) continue; /* "none" among others: nothing to load for it */
    char err[2][256] = {"", ""};
    void* dl = ut_plugin_open(cand, n, &k, err);
    if (!dl) {
      if (n == 2)
        ut_appendf(whybuf, sizeof(whybuf), "cannot load %s (%s) nor %s (%s)", cand[0], err[0], cand[1], err[1]);
      else
        ut_appendf(whybuf, sizeof(whybuf), "cannot load %s (%s)", cand[0], err[0]);
      continue;
    }
    if (try_library(dl, cand[k], out, version, origin, origin_len, whybuf, sizeof(whybuf))) {
      INFO(LOG_INIT | LOG_NET, "net plugin %s (ncclNetPlugin_v%d) loaded from %s", (*out)->name, *version, cand[k]);
      if (whybuf[0]) INFO(LOG_INIT | LOG_NET, "net plugin: skipped before it: %s", whybuf);
      return 0; /* the library stays loaded for the life of the process */
    }
    dlclose(dl);
  }
  *why = whybuf[0] ? whybuf : "NCCL_NET_PLUGIN lists no library";
  return -1;
}
