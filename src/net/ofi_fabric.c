/* The libfabric side of the OFI network: loading libfabric at run time (dlopen, never linked), choosing
 * the provider and its devices once per process, opening each device's endpoint lazily, reading the
 * completion queue and handing each completion to its request, the address vector and registrations.
 * The table itself (comms, requests, the connection protocol) is in ofi.c. */
#define _GNU_SOURCE /* realpath, strdup */
#ifdef CHORUS_HAVE_LIBFABRIC

#include <dlfcn.h>
#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../misc/log.h"
#include "../misc/socket.h"
#include "../misc/param.h"
#include "../misc/utils.h"
#include "ofi.h"

#define OFI_CQ_BATCH 16  /* entries per fi_cq_read */
#define OFI_CQ_ROUNDS 4  /* reads per progress call: "a few", so test stays short */
#define OFI_MIN_TAG_BITS 34 /* 32-bit ids, the control bit above them, one spare */

struct ofi_api ofi_fn;

/* Set once inside ofi_once (pthread_once), read-only afterwards. */
static pthread_once_t ofi_once_ctl = PTHREAD_ONCE_INIT;
static int ofi_ok;                /* 1 when a provider and at least one device were found */
static char ofi_why[512];         /* why not, when !ofi_ok */
static char ofi_prov[64];         /* the chosen provider ("tcp;ofi_rxm") */
static int ofi_rdma;              /* ch_ofi_is_rdma's answer */
static int ofi_ndev;
static struct ofi_dev ofi_devs[CH_NET_MAX_DEVS];

/* ------------------------------------------------------------------------------------------------ */
/* Provider ranking                                                                                  */

/* The part of "core;utility" before the ';'. */
static void prov_core(const char* prov, char* out, size_t len) {
  snprintf(out, len, "%s", prov);
  char* semi = strchr(out, ';');
  if (semi) *semi = '\0';
}

/* Lower is better; -1: never chosen unless FI_PROVIDER names it. Real RDMA first, then tcp, then
 * providers we do not know (better than nothing, worse than tcp because untested). */
static int prov_rank(const char* prov) {
  static const char* const rdma[] = {"efa", "verbs", "cxi", "psm3", "opx", "psm2"};
  static const char* const excluded[] = {"sockets", "udp", "shm", "net"};
  char core[64];
  prov_core(prov, core, sizeof(core));
  int util_rxd = strstr(prov, ";ofi_rxd") != NULL; /* rxm before rxd over the same core */
  for (size_t i = 0; i < sizeof(excluded) / sizeof(excluded[0]); i++)
    if (!strcmp(core, excluded[i])) return -1;
  for (size_t i = 0; i < sizeof(rdma) / sizeof(rdma[0]); i++)
    if (!strcmp(core, rdma[i])) return (int)i * 2 + util_rxd;
  if (!strcmp(core, "tcp")) return strchr(prov, ';') ? 20 : 21; /* on 1.17 tcp's RDM is tcp;ofi_rxm */
  return 30;
}

static int prov_is_rdma(const char* prov) {
  static const char* const plain[] = {"tcp", "sockets", "udp", "shm", "net"};
  char core[64];
  prov_core(prov, core, sizeof(core));
  for (size_t i = 0; i < sizeof(plain) / sizeof(plain[0]); i++)
    if (!strcmp(core, plain[i])) return 0;
  return 1;
}

/* Tag bits the provider leaves us: mem_tag_format's leading zero bits are reserved (aws-ofi-nccl's rule). */
static int tag_bits(const struct fi_info* fi) {
  uint64_t fmt = fi->ep_attr ? fi->ep_attr->mem_tag_format : 0;
  return fmt ? 64 - __builtin_clzll(fmt) : 64;
}

/* ------------------------------------------------------------------------------------------------ */
/* Loading and choosing                                                                              */

static int ofi_load(void) {
  const char* lib = param_str(PARAM_FABRIC_LIBRARY);
  void* h = dlopen(lib, RTLD_NOW | RTLD_LOCAL);
  if (!h) {
    snprintf(ofi_why, sizeof(ofi_why), "cannot load %s: %s; install libfabric1 (or set CHORUS_FABRIC_LIBRARY)",
             lib, dlerror());
    return -1;
  }
  struct { const char* name; void** slot; } syms[] = {
      {"fi_getinfo", (void**)&ofi_fn.getinfo},   {"fi_freeinfo", (void**)&ofi_fn.freeinfo},
      {"fi_dupinfo", (void**)&ofi_fn.dupinfo},   {"fi_fabric", (void**)&ofi_fn.fabric},
      {"fi_strerror", (void**)&ofi_fn.strerror},
  };
  for (size_t i = 0; i < sizeof(syms) / sizeof(syms[0]); i++) {
    *syms[i].slot = dlsym(h, syms[i].name);
    if (!*syms[i].slot) {
      snprintf(ofi_why, sizeof(ofi_why), "%s has no symbol %s: not a libfabric library", lib, syms[i].name);
      dlclose(h);
      return -1;
    }
  }
  return 0; /* h stays open for the life of the process: endpoints point into it */
}

static struct fi_info* ofi_hints(void) {
  struct fi_info* h = ofi_fn.dupinfo(NULL); /* fi_allocinfo() */
  if (!h) return NULL;
  /* No FI_LOCAL_COMM/FI_REMOTE_COMM: on 1.17 asking them hides shm and changes nothing else we need. */
  h->caps = FI_TAGGED | FI_MSG;
  h->mode = FI_CONTEXT | FI_CONTEXT2;
  h->ep_attr->type = FI_EP_RDM;
  h->domain_attr->mr_mode = FI_MR_LOCAL | FI_MR_VIRT_ADDR | FI_MR_ALLOCATED | FI_MR_PROV_KEY | FI_MR_ENDPOINT;
  h->domain_attr->threading = FI_THREAD_SAFE;
  h->domain_attr->control_progress = FI_PROGRESS_UNSPEC;
  h->domain_attr->data_progress = FI_PROGRESS_UNSPEC; /* EFA claims AUTO without providing it (rdma.md 5.5) */
  /* Sends on one comm share one tag: only send-after-send order keeps them matched in posting order. */
  h->tx_attr->msg_order = FI_ORDER_SAS;
  h->rx_attr->msg_order = FI_ORDER_SAS;
  return h;
}

/* fi_getinfo at the newest API version this libfabric accepts (1.17 is what the headers describe). */
static int ofi_getinfo(struct fi_info* hints, struct fi_info** out) {
  static const uint32_t versions[] = {FI_VERSION(1, 17), FI_VERSION(1, 11), FI_VERSION(1, 6)};
  int rc = -FI_ENOSYS;
  for (size_t i = 0; i < sizeof(versions) / sizeof(versions[0]) && rc == -FI_ENOSYS; i++)
    rc = ofi_fn.getinfo(versions[i], NULL, NULL, 0, hints, out);
  return rc;
}

/* Is a better than b as the one fi_info of a domain? IPv4 first, then plain over FI_COLLECTIVE variants. */
static int info_better(const struct fi_info* a, const struct fi_info* b) {
  int a4 = a->addr_format == FI_SOCKADDR_IN, b4 = b->addr_format == FI_SOCKADDR_IN;
  if (a4 != b4) return a4;
  int ac = (a->caps & FI_COLLECTIVE) != 0, bc = (b->caps & FI_COLLECTIVE) != 0;
  return !ac && bc;
}

/* The distinct providers offered, for messages. */
static void offered_list(const struct fi_info* list, char* buf, size_t len) {
  buf[0] = '\0';
  size_t used = 0;
  for (const struct fi_info* fi = list; fi; fi = fi->next) {
    const char* p = fi->fabric_attr->prov_name;
    int seen = 0;
    for (const struct fi_info* g = list; g != fi; g = g->next) seen |= !strcmp(g->fabric_attr->prov_name, p);
    if (seen || used >= len) continue;
    int n = snprintf(buf + used, len - used, "%s%s", used ? ", " : "", p);
    if (n > 0) used += (size_t)n;
  }
}

/* Read /sys/class/net/<name>/speed and resolve its device link; virtual or missing: defaults. */
static void dev_sysfs(struct ofi_dev* d) {
  char path[PATH_MAX];
  int s = sock_iface_speed_mbits(d->name);
  d->speed = s > 0 ? s : 10000;
  snprintf(path, sizeof(path), "/sys/class/net/%s/device", d->name);
  d->pci_path = realpath(path, NULL);
}

/* Adds fi (of the chosen provider) as a device, or as a better fi_info of a domain already listed. */
static void add_device(const struct fi_info* fi) {
  const char* dom = fi->domain_attr->name ? fi->domain_attr->name : "";
  if (tag_bits(fi) < OFI_MIN_TAG_BITS) return;
  for (int i = 0; i < ofi_ndev; i++) {
    if (strcmp(ofi_devs[i].name, dom)) continue;
    if (info_better(fi, ofi_devs[i].info)) {
      struct fi_info* copy = ofi_fn.dupinfo(fi);
      if (copy) {
        ofi_fn.freeinfo(ofi_devs[i].info);
        ofi_devs[i].info = copy;
      }
    }
    return;
  }
  if (ofi_ndev >= CH_NET_MAX_DEVS) return;
  struct fi_info* copy = ofi_fn.dupinfo(fi);
  if (!copy) return;
  struct ofi_dev* d = &ofi_devs[ofi_ndev++];
  d->info = copy;
  snprintf(d->name, sizeof(d->name), "%s", dom);
}

/* Drops "lo" when another domain exists (loopback entries leak through interface filters), then
 * numbers the devices and fills what is fixed from now on. */
static void finish_devices(void) {
  if (ofi_ndev > 1) {
    for (int i = 0; i < ofi_ndev; i++) {
      if (strcmp(ofi_devs[i].name, "lo")) continue;
      ofi_fn.freeinfo(ofi_devs[i].info);
      memmove(&ofi_devs[i], &ofi_devs[i + 1], sizeof(ofi_devs[0]) * (size_t)(ofi_ndev - i - 1));
      ofi_ndev--;
      break;
    }
  }
  for (int i = 0; i < ofi_ndev; i++) {
    struct ofi_dev* d = &ofi_devs[i];
    d->index = i;
    int bits = tag_bits(d->info);
    int ctrl_pos = bits > 60 ? 60 : bits - 1;
    d->ctrl_bit = 1ull << ctrl_pos;
    d->cts_bit = 1ull << 32; /* below ctrl_bit (bits >= 34), above every 32-bit id */
    /* NCCL's tag in the bits between the CTS bit and ctrl_bit: 27 of them with a 64-bit tag format;
     * fewer than 8 and grouped receives are off (maxRecvs 1) and the tag is not carried. */
    int width = ctrl_pos - OFI_TAG_SHIFT;
    d->tag_mask = width >= 8 ? (1ull << width) - 1 : 0;
    d->next_id = 1;
    d->next_key = 1;
    pthread_mutex_init(&d->mu, NULL);
    pthread_mutex_init(&d->rma_mu, NULL);
    pthread_mutex_init(&d->cq_mu, NULL);
    dev_sysfs(d);
  }
}

static void log_choice(const char* reason) {
  char list[1024] = "";
  size_t used = 0;
  for (int i = 0; i < ofi_ndev && used < sizeof(list); i++) {
    const struct fi_info* fi = ofi_devs[i].info;
    int n = snprintf(list + used, sizeof(list) - used, "%s%d:%s(%s, %d Mbit/s, %s progress)", i ? " " : "", i,
                     ofi_devs[i].name, fi->addr_format == FI_SOCKADDR_IN    ? "IPv4"
                                       : fi->addr_format == FI_SOCKADDR_IN6 ? "IPv6"
                                                                            : "native address",
                     ofi_devs[i].speed, fi->domain_attr->data_progress == FI_PROGRESS_AUTO ? "auto" : "manual");
    if (n > 0) used += (size_t)n;
  }
  INFO(LOG_NET, "NET/OFI: provider %s (%s), %s, devices %s", ofi_prov, reason,
       ofi_rdma ? "RDMA" : "not RDMA", list);
}

/* Picks the provider and its devices from fi_getinfo's list. */
static int ofi_choose(struct fi_info* list) {
  char offered[256], reason[384];
  offered_list(list, offered, sizeof(offered));
  /* libfabric's own variable, not a Chorus tunable: libfabric already filtered on it, we only learn
   * that the user chose, so nothing of what it kept is excluded. A "^..." list only excludes: rank. */
  const char* forced = getenv("FI_PROVIDER");
  const struct fi_info* best = NULL;
  if (forced && *forced && *forced != '^') {
    best = list;
    snprintf(reason, sizeof(reason), "FI_PROVIDER=%s", forced);
  } else {
    for (const struct fi_info* fi = list; fi; fi = fi->next) {
      int r = prov_rank(fi->fabric_attr->prov_name);
      if (r >= 0 && (!best || r < prov_rank(best->fabric_attr->prov_name))) best = fi;
    }
    snprintf(reason, sizeof(reason), "ranked first of: %s", offered);
  }
  if (!best) {
    snprintf(ofi_why, sizeof(ofi_why),
             "libfabric offers only %s for reliable tagged messages, which Chorus does not use by default "
             "(set FI_PROVIDER to one of them to force it)", offered);
    return -1;
  }
  snprintf(ofi_prov, sizeof(ofi_prov), "%s", best->fabric_attr->prov_name);
  ofi_rdma = prov_is_rdma(ofi_prov);
  for (const struct fi_info* fi = list; fi; fi = fi->next)
    if (!strcmp(fi->fabric_attr->prov_name, ofi_prov)) add_device(fi);
  finish_devices();
  if (ofi_ndev == 0) {
    snprintf(ofi_why, sizeof(ofi_why), "provider %s has no domain with %d tag bits (Chorus's protocol needs them)",
             ofi_prov, OFI_MIN_TAG_BITS);
    return -1;
  }
  log_choice(reason);
  return 0;
}

/* ------------------------------------------------------------------------------------------------ */
/* The RMA path (CHORUS_OFI_RMA)                                                                     */

#define OFI_RMA_CAPS (FI_RMA | FI_WRITE | FI_REMOTE_WRITE)

/* Can fi carry the RMA path: writes to remote regions with 8 bytes of remote CQ data (connection id,
 * sequence, size; 4-byte CQ data is not used), without FI_RX_CQ_DATA (which would need receives posted
 * for every write), and the tag bits of the tagged path (control messages)? */
static int rma_capable(const struct fi_info* fi) {
  uint64_t narrow = FI_READ | FI_WRITE | FI_REMOTE_READ | FI_REMOTE_WRITE;
  if (!(fi->caps & FI_RMA)) return 0;
  if ((fi->caps & narrow) && (fi->caps & (FI_WRITE | FI_REMOTE_WRITE)) != (FI_WRITE | FI_REMOTE_WRITE)) return 0;
  return fi->domain_attr->cq_data_size >= 8 && !(fi->mode & FI_RX_CQ_DATA) && tag_bits(fi) >= OFI_MIN_TAG_BITS;
}

/* After the provider and its devices were chosen (without RMA, so that the choice does not depend on
 * it): when CHORUS_OFI_RMA wants the RMA path, ask the chosen provider again with FI_RMA caps and take,
 * for every device, an fi_info of its domain and address format that can carry it. A device without
 * one keeps its tagged-only fi_info (its receivers choose the tagged path). */
static void rma_upgrade(void) {
  int64_t want = param_int(PARAM_OFI_RMA);
  const char* why = NULL;
  if (want == 0) why = "off (CHORUS_OFI_RMA=0)";
  else if (want < 0 && !ofi_rdma) why = "off: not an RDMA provider (CHORUS_OFI_RMA=-1, the default; 1 turns it on)";
  struct fi_info* hints = why ? NULL : ofi_hints();
  struct fi_info* list = NULL;
  if (!why && hints) {
    hints->caps |= OFI_RMA_CAPS;
    free(hints->fabric_attr->prov_name);
    hints->fabric_attr->prov_name = strdup(ofi_prov);
    int rc = ofi_getinfo(hints, &list);
    if (rc) {
      why = "off: the provider offers no FI_RMA endpoint";
      list = NULL;
    }
  } else if (!why) {
    why = "off: fi_allocinfo failed";
  }
  if (hints) ofi_fn.freeinfo(hints);
  int on = 0;
  for (int i = 0; i < ofi_ndev && list; i++) {
    struct ofi_dev* d = &ofi_devs[i];
    const struct fi_info* best = NULL;
    for (const struct fi_info* fi = list; fi; fi = fi->next) {
      const char* dom = fi->domain_attr->name ? fi->domain_attr->name : "";
      if (strcmp(fi->fabric_attr->prov_name, ofi_prov) || strcmp(dom, d->name) ||
          fi->addr_format != d->info->addr_format || !rma_capable(fi))
        continue;
      if (!best || info_better(fi, best)) best = fi;
    }
    struct fi_info* copy = best ? ofi_fn.dupinfo(best) : NULL;
    if (!copy) continue;
    ofi_fn.freeinfo(d->info);
    d->info = copy;
    d->rma = 1;
    on++;
  }
  if (list) ofi_fn.freeinfo(list);
  if (!why && on < ofi_ndev)
    why = on ? "on for some devices only (the others lack FI_RMA, 8-byte CQ data, or need FI_RX_CQ_DATA)"
             : "off: no device has FI_RMA with 8-byte CQ data and without FI_RX_CQ_DATA";
  INFO(LOG_NET, "NET/OFI: RMA path (rendezvous by RMA write with remote CQ data) %s", why ? why : "on");
}

static void ofi_at_child(void);

static void ofi_init_once(void) {
  if (ofi_load()) return;
  struct fi_info* hints = ofi_hints();
  struct fi_info* list = NULL;
  if (!hints) {
    snprintf(ofi_why, sizeof(ofi_why), "fi_allocinfo failed (out of memory)");
    return;
  }
  int rc = ofi_getinfo(hints, &list);
  ofi_fn.freeinfo(hints);
  if (rc) {
    const char* forced = getenv("FI_PROVIDER"); /* libfabric's variable, quoted to explain the result */
    snprintf(ofi_why, sizeof(ofi_why),
             "fi_getinfo found no provider for reliable tagged messages (FI_EP_RDM, FI_TAGGED)%s%s: %s",
             forced ? " with FI_PROVIDER=" : "", forced ? forced : "", ofi_fn.strerror(-rc));
    return;
  }
  if (ofi_choose(list) == 0) ofi_ok = 1;
  ofi_fn.freeinfo(list);
  if (ofi_ok) rma_upgrade();
  if (ofi_ok) ut_atfork_register(NULL, NULL, ofi_at_child);
}

/* A fork child must not use the parent's endpoints (their descriptors and provider state are shared
 * with the parent; verbs and efa do not even allow it): it forgets every opened device, without closing
 * anything (that could disturb the parent's), and opens them anew when it connects. Its inherited
 * communicators are let go unused. The locks may have been held by a thread that is not in the child. */
static void ofi_at_child(void) {
  for (int i = 0; i < ofi_ndev; i++) {
    struct ofi_dev* d = &ofi_devs[i];
    pthread_mutex_init(&d->mu, NULL);
    pthread_mutex_init(&d->rma_mu, NULL);
    pthread_mutex_init(&d->cq_mu, NULL);
    d->opened = 0, d->open_err = 0, d->cq_dead = 0;
    d->fabric = NULL, d->domain = NULL, d->av = NULL, d->cq = NULL, d->ep = NULL;
    d->ep_name_len = 0;
    d->av_cache = NULL, d->av_count = d->av_cap = 0;
    d->rma_tab = NULL, d->rma_next = 0;
  }
  ofi_lists_at_child();
}

int ch_ofi_available(const char** why) {
  pthread_once(&ofi_once_ctl, ofi_init_once);
  if (ofi_ok) return 0;
  if (why) *why = ofi_why;
  return -1;
}

int ch_ofi_is_rdma(void) { return ch_ofi_available(NULL) == 0 && ofi_rdma; }

const char* ch_ofi_provider(void) { return ofi_prov; }

const char* ofi_prov_name(void) { return ofi_prov; }

int ofi_ndevs(void) { return ofi_ok ? ofi_ndev : 0; }

struct ofi_dev* ofi_dev_get(int dev) {
  if (!ofi_ok || dev < 0 || dev >= ofi_ndev) return NULL;
  return &ofi_devs[dev];
}

/* ------------------------------------------------------------------------------------------------ */
/* The device's objects                                                                              */

static void dev_close_objects(struct ofi_dev* d) {
  if (d->ep) fi_close(&d->ep->fid);
  if (d->cq) fi_close(&d->cq->fid);
  if (d->av) fi_close(&d->av->fid);
  if (d->domain) fi_close(&d->domain->fid);
  if (d->fabric) fi_close(&d->fabric->fid);
  d->ep = NULL, d->cq = NULL, d->av = NULL, d->domain = NULL, d->fabric = NULL;
}

#define OFI_OPEN_STEP(call, what)                                                                   \
  do {                                                                                              \
    int rc_ = (call);                                                                               \
    if (rc_) {                                                                                      \
      WARN("NET/OFI: %s on %s (provider %s) failed: %s", what, d->name, ofi_prov, ofi_fn.strerror(-rc_)); \
      goto fail;                                                                                    \
    }                                                                                               \
  } while (0)

/* Fabric, domain, AV, CQ and one RDM endpoint (fi_endpoint(3)'s order); caller holds d->mu. */
static ncclResult_t dev_open_locked(struct ofi_dev* d) {
  struct fi_av_attr av_attr = {.type = FI_AV_TABLE};
  int64_t cq_size = param_int(PARAM_OFI_CQ_SIZE);
  struct fi_cq_attr cq_attr = {.format = FI_CQ_FORMAT_TAGGED, .wait_obj = FI_WAIT_NONE,
                               .size = (size_t)(cq_size < 64 ? 64 : cq_size > (1 << 24) ? (1 << 24) : cq_size)};
  OFI_OPEN_STEP(ofi_fn.fabric(d->info->fabric_attr, &d->fabric, NULL), "fi_fabric");
  OFI_OPEN_STEP(fi_domain(d->fabric, d->info, &d->domain, NULL), "fi_domain");
  OFI_OPEN_STEP(fi_av_open(d->domain, &av_attr, &d->av, NULL), "fi_av_open");
  OFI_OPEN_STEP(fi_cq_open(d->domain, &cq_attr, &d->cq, NULL), "fi_cq_open");
  OFI_OPEN_STEP(fi_endpoint(d->domain, d->info, &d->ep, NULL), "fi_endpoint");
  OFI_OPEN_STEP(fi_ep_bind(d->ep, &d->av->fid, 0), "fi_ep_bind(av)");
  OFI_OPEN_STEP(fi_ep_bind(d->ep, &d->cq->fid, FI_TRANSMIT | FI_RECV), "fi_ep_bind(cq)");
  OFI_OPEN_STEP(fi_enable(d->ep), "fi_enable");
  d->ep_name_len = sizeof(d->ep_name);
  OFI_OPEN_STEP(fi_getname(&d->ep->fid, d->ep_name, &d->ep_name_len), "fi_getname (name over 56 bytes?)");
  INFO(LOG_NET, "NET/OFI: device %d (%s) open, CQ of %zu entries, endpoint name %zu bytes", d->index, d->name,
       cq_attr.size, d->ep_name_len);
  return ncclSuccess;
fail:
  dev_close_objects(d);
  return ncclSystemError;
}

ncclResult_t ofi_dev_open(struct ofi_dev* d) {
  pthread_mutex_lock(&d->mu);
  ncclResult_t res = ncclSuccess;
  if (!d->opened && !d->open_err) {
    res = dev_open_locked(d);
    if (res == ncclSuccess) __atomic_store_n(&d->opened, 1, __ATOMIC_RELEASE);
    else d->open_err = res; /* once: a device that cannot open will not open on the next comm either */
  } else if (!d->opened) {
    res = (ncclResult_t)d->open_err;
  }
  pthread_mutex_unlock(&d->mu);
  return res;
}

/* ------------------------------------------------------------------------------------------------ */
/* Completions                                                                                       */

static void req_finish(struct ofi_req* r, int state) { __atomic_store_n(&r->state, state, __ATOMIC_RELEASE); }

/* The error entry at the CQ's head goes to its request; caller holds d->cq_mu. */
static void read_error(struct ofi_dev* d) {
  struct fi_cq_err_entry e;
  memset(&e, 0, sizeof(e)); /* err_data_size 0: the provider lends its own err_data buffer */
  ssize_t rc = fi_cq_readerr(d->cq, &e, 0);
  if (rc < 0) return; /* raced with nothing (we hold cq_mu); nothing to dispatch */
  struct ofi_req* r = e.op_context;
  if (!r) {
    WARN("NET/OFI: %s reported an error with no operation attached: %s", ofi_prov, ofi_fn.strerror(e.err));
    return;
  }
  r->err = e.err < 0 ? -e.err : e.err ? e.err : FI_EOTHER; /* shm reports it negated */
  r->olen = e.olen;
  r->len = e.len;
  const char* text = fi_cq_strerror(d->cq, e.prov_errno, e.err_data, r->errtext, sizeof(r->errtext));
  if (text && text != r->errtext) snprintf(r->errtext, sizeof(r->errtext), "%s", text);
  else if (!text) r->errtext[0] = '\0';
  req_finish(r, OFI_REQ_FAILED);
}

void ofi_progress(struct ofi_dev* d) {
  /* Whoever holds the lock is reading for everyone: skip rather than queue behind it. */
  if (pthread_mutex_trylock(&d->cq_mu)) return;
  for (int round = 0; round < OFI_CQ_ROUNDS; round++) {
    struct fi_cq_tagged_entry e[OFI_CQ_BATCH];
    ssize_t n = fi_cq_read(d->cq, e, OFI_CQ_BATCH);
    if (n == -FI_EAGAIN) break;
    if (n == -FI_EAVAIL) {
      read_error(d);
      continue;
    }
    if (n < 0) {
      if (!__atomic_load_n(&d->cq_dead, __ATOMIC_RELAXED))
        WARN("NET/OFI: reading the completion queue of %s (provider %s) failed: %s; every operation on it fails "
             "(a larger CHORUS_OFI_CQ_SIZE avoids overruns)", d->name, ofi_prov, ofi_fn.strerror((int)-n));
      __atomic_store_n(&d->cq_dead, (int)-n, __ATOMIC_RELEASE);
      break;
    }
    for (ssize_t i = 0; i < n; i++) {
      if (e[i].flags & FI_REMOTE_CQ_DATA) { /* an RMA write landed: op_context is not ours (rdma.md 2.7) */
        ofi_rma_arrived(d, e[i].data);
        continue;
      }
      struct ofi_req* r = e[i].op_context;
      if (!r) continue;
      r->len = e[i].len;
      req_finish(r, OFI_REQ_DONE);
    }
    if (n < OFI_CQ_BATCH) break;
  }
  pthread_mutex_unlock(&d->cq_mu);
}

/* ------------------------------------------------------------------------------------------------ */
/* Addresses and registrations                                                                       */

ncclResult_t ofi_addr_insert(struct ofi_dev* d, const uint8_t* name, size_t len, fi_addr_t* out) {
  ncclResult_t res = ncclSuccess;
  pthread_mutex_lock(&d->mu);
  for (int i = 0; i < d->av_count; i++) {
    if (d->av_cache[i].len == len && !memcmp(d->av_cache[i].name, name, len)) {
      *out = d->av_cache[i].addr;
      goto out;
    }
  }
  fi_addr_t addr = FI_ADDR_NOTAVAIL;
  int n = fi_av_insert(d->av, name, 1, &addr, 0, NULL);
  if (n != 1 || addr == FI_ADDR_NOTAVAIL) {
    char buf[96];
    WARN("NET/OFI: fi_av_insert of peer %s on %s (provider %s) inserted %d addresses: %s",
         ofi_name_str(d, name, len, buf, sizeof(buf)), d->name, ofi_prov, n, n < 0 ? ofi_fn.strerror(-n) : "");
    res = ncclSystemError;
    goto out;
  }
  if (d->av_count == d->av_cap) {
    int cap = d->av_cap ? d->av_cap * 2 : 16;
    struct ofi_av_entry* grown = realloc(d->av_cache, sizeof(*grown) * (size_t)cap);
    if (!grown) goto done; /* no cache entry: a repeat connect inserts again, which is only wasteful */
    d->av_cache = grown, d->av_cap = cap;
  }
  memcpy(d->av_cache[d->av_count].name, name, len);
  d->av_cache[d->av_count].len = len;
  d->av_cache[d->av_count].addr = addr;
  d->av_count++;
done:
  *out = addr;
out:
  pthread_mutex_unlock(&d->mu);
  return res;
}

/* Registers host memory for sends and receives. For tagged messages only FI_MR_LOCAL makes a
 * descriptor necessary, so without it no registration is made: rxm registers what it needs itself, and
 * registering for it would only take MR keys (which tcp wants unique, rdma.md section 3). On an RMA
 * device every region is registered, whatever mr_mode says, as a possible target of the peer's writes
 * (FI_REMOTE_WRITE) and source of ours (FI_WRITE): the peer needs its key. */
ncclResult_t ofi_mr_open(struct ofi_dev* d, void* buf, size_t len, struct ofi_mr* out) {
  uint64_t mode = d->info->domain_attr->mr_mode;
  out->mr = NULL;
  out->desc = NULL;
  out->base = buf;
  out->len = len;
  out->key = 0;
  if (!(mode & FI_MR_LOCAL) && !d->rma) return ncclSuccess;
  uint64_t key = 0, access = FI_SEND | FI_RECV;
  if (d->rma) access |= FI_WRITE | FI_REMOTE_WRITE;
  if (!(mode & FI_MR_PROV_KEY)) { /* unique in the domain: the requested key is the key */
    pthread_mutex_lock(&d->mu);
    key = d->next_key++;
    pthread_mutex_unlock(&d->mu);
  }
  int rc = fi_mr_reg(d->domain, buf, len, access, 0, key, 0, &out->mr, NULL);
  if (rc) {
    WARN("NET/OFI: fi_mr_reg of %zu bytes at %p on %s (provider %s) failed: %s", len, buf, d->name, ofi_prov,
         ofi_fn.strerror(-rc));
    out->mr = NULL;
    return ncclSystemError;
  }
  if (mode & FI_MR_ENDPOINT) {
    rc = fi_mr_bind(out->mr, &d->ep->fid, 0);
    if (!rc) rc = fi_mr_enable(out->mr);
    if (rc) {
      WARN("NET/OFI: binding a registration to the endpoint of %s (provider %s) failed: %s", d->name, ofi_prov,
           ofi_fn.strerror(-rc));
      ofi_mr_close(out);
      return ncclSystemError;
    }
  }
  out->desc = fi_mr_desc(out->mr);
  if (d->rma) {
    out->key = fi_mr_key(out->mr);
    if (out->key == FI_KEY_NOTAVAIL) {
      WARN("NET/OFI: a registration on %s (provider %s) has no key to give the peer (FI_KEY_NOTAVAIL)", d->name,
           ofi_prov);
      ofi_mr_close(out);
      return ncclSystemError;
    }
  }
  return ncclSuccess;
}

void ofi_mr_close(struct ofi_mr* m) {
  if (m->mr) fi_close(&m->mr->fid);
  m->mr = NULL;
  m->desc = NULL;
}

const char* ofi_name_str(const struct ofi_dev* d, const uint8_t* name, size_t len, char* buf, size_t buflen) {
  uint32_t f = d->info->addr_format;
  return ofi_name_format(f == FI_SOCKADDR_IN ? 4 : f == FI_SOCKADDR_IN6 ? 6 : 0, name, len, buf, buflen);
}

#else
typedef int ofi_fabric_unused; /* ISO C wants a declaration in every file */
#endif /* CHORUS_HAVE_LIBFABRIC */
