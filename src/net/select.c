/* Which network serves this process (net.h), decided once as NCCL decides (src/plugin/net.cc):
 * candidates in order are the external plugin (NCCL_NET_PLUGIN, net_plugin.c), the built-in OFI network
 * (ofi.c) and Socket (the socket transport: no table). Each must init, report at least one device and
 * pass the property checks NCCL's proxy makes (maxP2pBytes in (0, 1 TiB], a host device).
 *
 * NCCL_NET unset: a plugin that starts is chosen; else OFI, but only on a real RDMA provider (as NCCL's
 * IB needs an HCA: over plain TCP the socket transport is as fast and needs nothing); else Socket.
 * NCCL_NET set: only the network of that name (case-insensitive) may serve; if it cannot start, every
 * call fails with CH_INVALID_USAGE and a WARN naming what is missing. */
#include <dirent.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "../misc/log.h"
#include "../misc/utils.h"
#include "../misc/param.h"
#include "net.h"
#include "select_test.h"
#include "sock_net.h"

#define NET_PLUGIN_MAX_ENTRIES 14 /* NCCL_NET_MAX_PLUGINS 16 minus the 2 internal ones */



/* Whether the host has a device an RDMA provider of libfabric could use: verbs, EFA, usNIC, OPA
 * (all under /sys/class/infiniband) or Slingshot (cxi). FI_PROVIDER set counts as yes: the user
 * named one. */
static int rdma_hardware(void) {
  if (getenv("FI_PROVIDER")) return 1;
  static const char* const dirs[] = {"/sys/class/infiniband", "/sys/class/cxi"};
  for (size_t k = 0; k < sizeof(dirs) / sizeof(dirs[0]); k++) {
    DIR* d = opendir(dirs[k]);
    if (!d) continue;
    struct dirent* e;
    int found = 0;
    while (!found && (e = readdir(d)) != NULL) found = e->d_name[0] != '.';
    closedir(d);
    if (found) return 1;
  }
  return 0;
}

static pthread_mutex_t sel_mu = PTHREAD_MUTEX_INITIALIZER;
static int decided; /* under sel_mu; read with acquire after */
static ch_status sel_status;
static int have_net;
static struct ch_net sel_net;
static char sel_warn[1024]; /* the WARN repeated by every failing call */
static char sel_desc[1024]; /* ch_net_describe */

void ch_net_logger(ncclDebugLogLevel level, unsigned long flags, const char* file, int line, const char* fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  log_plugin_v("net plugin", LOG_TRACE, (int)level, flags, file, line, fmt, ap);
  va_end(ap);
}

/* Starts one candidate: init, devices, properties. 0 with *n filled, else -1 and why (n->ctx finalized). */
static int start(struct ch_net* n, char* why, size_t why_len) {
  const ncclNet_t* t = n->net;
  ncclNetCommConfig_v12_t config = {NCCL_NET_TRAFFIC_CLASS_UNDEF};
  n->ctx = NULL;
  ncclResult_t rc = t->init(&n->ctx, 0, &config, ch_net_logger, NULL);
  if (rc != ncclSuccess) {
    snprintf(why, why_len, "init returned %d", (int)rc);
    return -1;
  }
  int ndev = 0;
  rc = t->devices(&ndev);
  if (rc != ncclSuccess || ndev <= 0) {
    if (rc != ncclSuccess)
      snprintf(why, why_len, "devices returned %d", (int)rc);
    else
      snprintf(why, why_len, "no devices");
    goto fail;
  }
  if (ndev > CH_NET_MAX_DEVS) {
    INFO(LOG_INIT | LOG_NET, "NET/%s: %d devices; Chorus uses the first %d", n->name, ndev, CH_NET_MAX_DEVS);
    ndev = CH_NET_MAX_DEVS;
  }
  for (int d = 0; d < ndev; d++) {
    ncclNetProperties_t* p = &n->props[d];
    memset(p, 0, sizeof(*p));
    rc = t->getProperties(d, p);
    if (rc != ncclSuccess) {
      snprintf(why, why_len, "getProperties(%d) returned %d", d, (int)rc);
      goto fail;
    }
    const char* dn = p->name ? p->name : "?";
    if (p->maxP2pBytes == 0 || p->maxP2pBytes > NCCL_MAX_NET_SIZE_BYTES) {
      snprintf(why, why_len, "device %d (%s) reports maxP2pBytes %zu, outside (0, 1 TiB]", d, dn, p->maxP2pBytes);
      goto fail;
    }
    if (p->netDeviceType != NCCL_NET_DEVICE_HOST) {
      snprintf(why, why_len, "device %d (%s) is of type %d, not a host device (NCCL_NET_DEVICE_HOST)", d, dn,
               (int)p->netDeviceType);
      goto fail;
    }
    if (!(p->ptrSupport & NCCL_PTR_HOST)) {
      snprintf(why, why_len, "device %d (%s) cannot send from host memory (ptrSupport 0x%x)", d, dn, p->ptrSupport);
      goto fail;
    }
  }
  n->ndev = ndev;
  return 0;
fail:
  if (t->finalize) t->finalize(n->ctx);
  n->ctx = NULL;
  return -1;
}

static void fill_builtin(struct ch_net* n) {
  memset(n, 0, sizeof(*n));
  n->net = &ch_ofi_net, n->version = 12;
  snprintf(n->name, sizeof(n->name), "%s", ch_ofi_net.name ? ch_ofi_net.name : "OFI");
  snprintf(n->origin, sizeof(n->origin), "built in, libfabric %s", ch_ofi_provider());
}

static void decide(void) {
  const char* want = param_str(PARAM_NET);
  const char* spec = param_str(PARAM_NET_PLUGIN);
  struct ch_net cand;
  char why[512];
  char plug_why[1200] = ""; /* why no plugin serves, for messages ("" when none was asked for) */

  /* 1. The external plugins, in list order (each entry opened on its own, so that NCCL_NET can pick
   * a later one by name, and one that cannot start gives way to the next, as in NCCL). */
  int opened = 0;
  char list[1024];
  if (strcasecmp(spec, "none") == 0) {
    /* no plugin */
  } else if (strlen(spec) >= sizeof(list)) {
    ut_appendf(plug_why, sizeof(plug_why), "NCCL_NET_PLUGIN is longer than %zu characters", sizeof(list) - 1);
  } else {
    snprintf(list, sizeof(list), "%s", spec);
    char* save = NULL;
    int entries = 0;
    /* An unset NCCL_NET_PLUGIN is one pass with "" (libnccl-net.so). */
    for (char* e = *spec ? strtok_r(list, ",", &save) : list; e; e = *spec ? strtok_r(NULL, ",", &save) : NULL) {
      while (*e == ' ') e++;
      size_t len = strlen(e);
      while (len && e[len - 1] == ' ') e[--len] = '\0';
      if (!*e && *spec) continue;
      if (++entries > NET_PLUGIN_MAX_ENTRIES) {
        ut_appendf(plug_why, sizeof(plug_why), "entries after the %dth ignored (from %s)", NET_PLUGIN_MAX_ENTRIES, e);
        break;
      }
      memset(&cand, 0, sizeof(cand));
      const char* open_why = NULL;
      if (ch_net_plugin_open(e, &cand.net, &cand.version, cand.origin, sizeof(cand.origin), &open_why) != 0) {
        if (!open_why) continue;
        ut_appendf(plug_why, sizeof(plug_why), "%s", open_why);
        INFO(LOG_INIT | LOG_NET, "NET: no net plugin from NCCL_NET_PLUGIN entry \"%s\": %s", *e ? e : "(unset)",
             open_why);
        continue;
      }
      opened = 1;
      snprintf(cand.name, sizeof(cand.name), "%s", cand.net->name);
      if (*want && strcasecmp(want, cand.name) != 0) {
        ut_appendf(plug_why, sizeof(plug_why), "%s is named %s", cand.origin, cand.name);
        INFO(LOG_INIT | LOG_NET, "NET: plugin %s from %s not used: NCCL_NET=%s", cand.name, cand.origin, want);
        continue;
      }
      if (start(&cand, why, sizeof(why)) == 0) {
        sel_net = cand, have_net = 1;
        return;
      }
      if (*want) {
        snprintf(sel_warn, sizeof(sel_warn), "NCCL_NET=%s: net plugin %s from %s could not start: %s", want,
                 cand.name, cand.origin, why);
        return;
      }
      ut_appendf(plug_why, sizeof(plug_why), "%s: %s", cand.origin, why);
      INFO(LOG_INIT | LOG_NET, "NET: plugin %s from %s could not start (%s); falling back", cand.name, cand.origin,
           why);
    }
  }
  const char* plug_label = *spec ? spec : "(unset)";
  /* For chorus-info: the default library's absence is normal, not worth a mention. */
  const char* pd = *spec || opened ? plug_why : "";

  /* 2. The built-in OFI network. */
  int want_ofi = *want && strcasecmp(want, "OFI") == 0;
  if (!*want && !rdma_hardware()) {
    /* Unasked, libfabric would only find sockets (its tcp provider, which the socket transport beats):
     * its probe costs ~0.2 s of CPU per rank, 100 s of init for 1,024 ranks on 2 CPUs. */
    INFO(LOG_INIT | LOG_NET, "NET: no RDMA device in /sys/class/{infiniband,cxi}: OFI not probed (NCCL_NET=OFI or "
                             "FI_PROVIDER probes it)");
    snprintf(sel_desc, sizeof(sel_desc), "Socket (NCCL_NET unset; %s%s%sOFI: no RDMA device, not probed)",
             *pd ? "plugin: " : "", pd, *pd ? "; " : "");
    return; /* Socket */
  }
  if (!*want || want_ofi) {
    const char* ofi_why = NULL;
    if (ch_ofi_available(&ofi_why) != 0) {
      if (!ofi_why) ofi_why = "unavailable";
      if (want_ofi) {
        snprintf(sel_warn, sizeof(sel_warn), "NCCL_NET=OFI but libfabric cannot be used: %s", ofi_why);
        return;
      }
      INFO(LOG_INIT | LOG_NET, "NET: OFI not available (%s)", ofi_why);
      snprintf(sel_desc, sizeof(sel_desc), "Socket (NCCL_NET unset; %s%s%sOFI: %s)", *pd ? "plugin: " : "", pd,
               *pd ? "; " : "", ofi_why);
    } else if (!want_ofi && !ch_ofi_is_rdma()) {
      INFO(LOG_INIT | LOG_NET, "NET: OFI provider %s is not RDMA; the socket transport serves (NCCL_NET=OFI to use it)",
           ch_ofi_provider());
      snprintf(sel_desc, sizeof(sel_desc),
               "Socket (NCCL_NET unset; %s%s%sOFI: provider %s is not RDMA, NCCL_NET=OFI uses it)",
               *pd ? "plugin: " : "", pd, *pd ? "; " : "", ch_ofi_provider());
    } else {
      fill_builtin(&cand);
      if (start(&cand, why, sizeof(why)) == 0) {
        sel_net = cand, have_net = 1;
        return;
      }
      if (want_ofi) {
        snprintf(sel_warn, sizeof(sel_warn), "NCCL_NET=OFI but the OFI network (libfabric %s) could not start: %s",
                 ch_ofi_provider(), why);
        return;
      }
      INFO(LOG_INIT | LOG_NET, "NET: OFI (libfabric %s) could not start (%s); falling back to Socket", ch_ofi_provider(),
           why);
      snprintf(sel_desc, sizeof(sel_desc), "Socket (NCCL_NET unset; %s%s%sOFI: %s)", *pd ? "plugin: " : "", pd,
               *pd ? "; " : "", why);
    }
    return; /* Socket */
  }

  /* 3. Socket, asked for by name; or a name nothing here has. */
  if (strcasecmp(want, "Socket") == 0) {
    snprintf(sel_desc, sizeof(sel_desc), "Socket (NCCL_NET=%s)", want);
    return;
  }
  snprintf(sel_warn, sizeof(sel_warn), "NCCL_NET=%s: no net plugin of that name (NCCL_NET_PLUGIN=%s: %s)", want,
           plug_label, *plug_why ? plug_why : "none asked for");
}

/* Under sel_mu, once. */
static void decide_and_log(void) {
  sel_warn[0] = sel_desc[0] = '\0';
  have_net = 0;
  memset(&sel_net, 0, sizeof(sel_net));
  decide();
  if (!sel_warn[0] && !have_net && param_int(PARAM_SOCKET_NET) == 1) {
    /* Socket through the net interface (sock_net.c) instead of the socket transport's own row. */
    struct ch_net cand;
    char why[512];
    memset(&cand, 0, sizeof(cand));
    cand.net = &ch_sock_net, cand.version = 12;
    snprintf(cand.name, sizeof(cand.name), "%s", ch_sock_net.name);
    snprintf(cand.origin, sizeof(cand.origin), "built in, CHORUS_SOCKET_NET=1");
    if (start(&cand, why, sizeof(why)) == 0) sel_net = cand, have_net = 1;
    else snprintf(sel_warn, sizeof(sel_warn), "CHORUS_SOCKET_NET=1 but the Socket network could not start: %s", why);
  }
  if (sel_warn[0]) {
    sel_status = CH_INVALID_USAGE;
    snprintf(sel_desc, sizeof(sel_desc), "none: %s", sel_warn);
    return;
  }
  sel_status = CH_OK;
  if (!have_net) {
    if (!sel_desc[0]) snprintf(sel_desc, sizeof(sel_desc), "Socket");
    INFO(LOG_INIT | LOG_NET, "NET: using %s", sel_desc);
    return;
  }
  char devs[700] = "";
  char devs_speed[800] = "";
  for (int d = 0; d < sel_net.ndev; d++) {
    const ncclNetProperties_t* p = &sel_net.props[d];
    const char* dn = p->name ? p->name : "?";
    size_t u = strlen(devs), v = strlen(devs_speed);
    snprintf(devs + u, sizeof(devs) - u, " %s", dn);
    snprintf(devs_speed + v, sizeof(devs_speed) - v, " %d:%s (%d Mb/s)", d, dn, p->speed);
  }
  /* "OFI (built in, libfabric tcp;ofi_rxm)" or "X from /path/libnccl-net-x.so (ncclNetPlugin_v11)" */
  char who[400];
  if (sel_net.net == &ch_ofi_net || sel_net.net == &ch_sock_net)
    snprintf(who, sizeof(who), "%s (%s)", sel_net.name, sel_net.origin);
  else
    snprintf(who, sizeof(who), "%s from %s", sel_net.name, sel_net.origin);
  snprintf(sel_desc, sizeof(sel_desc), "%s, %d device%s:%s", who, sel_net.ndev, sel_net.ndev == 1 ? "" : "s", devs);
  INFO(LOG_INIT | LOG_NET, "NET: using %s, %d device%s:%s", who, sel_net.ndev, sel_net.ndev == 1 ? "" : "s",
       devs_speed);
}

static void ensure_decided(void) {
  if (__atomic_load_n(&decided, __ATOMIC_ACQUIRE)) return;
  pthread_mutex_lock(&sel_mu);
  if (!decided) {
    decide_and_log();
    __atomic_store_n(&decided, 1, __ATOMIC_RELEASE);
  }
  pthread_mutex_unlock(&sel_mu);
}

ch_status ch_net_get(const struct ch_net** out) {
  *out = NULL;
  ensure_decided();
  if (sel_status != CH_OK) {
    WARN("%s", sel_warn); /* once per failing call (a communicator's init), so its last error says why */
    return sel_status;
  }
  if (have_net) *out = &sel_net;
  return CH_OK;
}

const char* ch_net_describe(void) {
  ensure_decided();
  return sel_desc;
}

void ch_net_reset_for_tests(void) {
  pthread_mutex_lock(&sel_mu);
  if (decided && have_net && sel_net.net->finalize) sel_net.net->finalize(sel_net.ctx);
  __atomic_store_n(&decided, 0, __ATOMIC_RELEASE);
  have_net = 0, sel_status = CH_OK;
  pthread_mutex_unlock(&sel_mu);
}
