/* The network interface under the fabric transport (transport/fabric.c): NCCL's ncclNet_t (version
 * 12, net_abi.h), served either by Chorus's own libfabric implementation (ofi.c, name "OFI") or by an
 * external NCCL net plugin (net_plugin.c: NCCL_NET_PLUGIN, versions 12, 11 and 10 adapted to 12). The
 * socket transport (transport/tcp.c) is the "Socket" row: it needs no table, so choosing it means
 * "no ch_net".
 *
 * Which network serves this process is decided once (select.c), from NCCL_NET and NCCL_NET_PLUGIN as
 * NCCL decides: external plugins in list order, then OFI, then Socket; NCCL_NET keeps only the one
 * of that name. Every rank of a job must choose alike (the transport kinds are compared at connect). */
#ifndef CH_NET_NET_H
#define CH_NET_NET_H

#include "../misc/status.h"
#include "net_abi.h"

#define CH_NET_MAX_DEVS 16

struct ch_net {
  const ncclNet_t* net; /* the table (an adapter's for plugins of versions 10 and 11) */
  void* ctx;            /* from init, once per process; shared by every communicator */
  int ndev;             /* usable devices (NICs, rails), at most CH_NET_MAX_DEVS */
  ncclNetProperties_t props[CH_NET_MAX_DEVS];
  char name[64];   /* the table's name ("OFI", a plugin's), for logs and NCCL_NET */
  char origin[256]; /* "built in (libfabric <provider>)" or the plugin's file and version, for logs */
  int version;      /* the plugin ABI version in use (12 for the built-in one) */
};

/* The network of this process: *out = NULL when the socket transport serves (the default without an
 * RDMA provider or a plugin). Decided at the first call (thread-safe), then the same answer. An
 * error (with a WARN naming what is missing) only when NCCL_NET names a network that cannot start. */
ch_status ch_net_get(const struct ch_net** out);
/* For chorus-info: what was chosen, or why not (a static or process-lifetime string). */
const char* ch_net_describe(void);

/* The built-in libfabric network (ofi.c): the table, and whether libfabric could be loaded at all
 * (0 with *why set: no libfabric.so.1, no provider, built without libfabric's headers). */
extern const ncclNet_v12_t ch_ofi_net;
/* Loads libfabric and picks the provider; 0 on success, else -1 with *why (static or lifetime text). */
int ch_ofi_available(const char** why);
/* 1 when the provider chosen is a real RDMA one (not tcp, sockets, udp, shm, net): OFI is then the
 * default network, as NCCL's IB is when an HCA is present. */
int ch_ofi_is_rdma(void);
/* The libfabric provider chosen, for messages ("tcp;ofi_rxm"), or "" before ch_ofi_available. */
const char* ch_ofi_provider(void);

/* External plugins (net_plugin.c). Opens the first library of NCCL_NET_PLUGIN's list (or libnccl-net.so
 * when unset; none: no plugin) that exports a version Chorus supports, newest first. 0 and *out when
 * one loaded; -1 with *why when none did (not found, no symbol, or none asked for: *why NULL). */
int ch_net_plugin_open(const char* spec, const ncclNet_t** out, int* version, char* origin, size_t origin_len,
                       const char** why);

/* The logger plugins receive: NCCL's signature, printed through Chorus's NCCL_DEBUG settings. */
void ch_net_logger(ncclDebugLogLevel level, unsigned long flags, const char* file, int line, const char* fmt, ...);

#endif
