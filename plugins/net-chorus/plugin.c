/* Chorus's libfabric network (src/net/ofi.c) as an NCCL net plugin: libnccl-net-chorus.so, loaded by
 * NCCL (or by Chorus, or any host of NCCL's net ABI) with NCCL_NET_PLUGIN=chorus; built once more with
 * CH_PLUGIN_SOCKET as libnccl-net-chorus-socket.so, Chorus's socket network (src/net/sock_net.c, table
 * "Chorus-Socket": NCCL's own is "Socket"), which the harness drives where libfabric is absent. It exports the
 * ncclNetPlugin_v12 table and, for hosts of NCCL 2.26 and 2.27, v11 and v10 tables that convert the
 * properties down (src/net/net_abi.h). Nothing else is exported (net.map).
 *
 * The table is named "Chorus-OFI", not "OFI": NCCL_NET matches by name, and aws-ofi-nccl, the usual
 * libfabric plugin, must not be confused with this one (nor with Chorus's built-in OFI network when a
 * Chorus process loads this plugin). */
#include <pthread.h>
#include <string.h>

#include "../../src/net/net.h"
#include "../../src/net/sock_net.h"

#ifdef CH_PLUGIN_SOCKET
#define CH_NET_PLUGIN_NAME "Chorus-Socket"
#define CH_NET_TABLE ch_sock_net
#else
#define CH_NET_PLUGIN_NAME "Chorus-OFI"
#define CH_NET_TABLE ch_ofi_net
#endif
#define EXPORT __attribute__((visibility("default")))

EXPORT ncclNet_v12_t ncclNetPlugin_v12;
EXPORT ncclNet_v11_t ncclNetPlugin_v11;
EXPORT ncclNet_v10_t ncclNetPlugin_v10;

/* ---- v12 properties down to v11 and v10 (vProps of 4 devices; no railId/planeId; v10: no
 * maxMultiRequestSize): CH_NET_PROPS_COPY_COMMON (net_abi.h) ---- */

static ncclResult_t v11_getProperties(int dev, ncclNetProperties_v11_t* props) {
  ncclNetProperties_v12_t p;
  memset(&p, 0, sizeof(p));
  ncclResult_t rc = CH_NET_TABLE.getProperties(dev, &p);
  if (rc != ncclSuccess) return rc;
  CH_NET_PROPS_COPY_COMMON(props, &p);
  props->maxMultiRequestSize = p.maxMultiRequestSize;
  return ncclSuccess;
}

static ncclResult_t v10_getProperties(int dev, ncclNetProperties_v10_t* props) {
  ncclNetProperties_v12_t p;
  memset(&p, 0, sizeof(p));
  ncclResult_t rc = CH_NET_TABLE.getProperties(dev, &p);
  if (rc != ncclSuccess) return rc;
  CH_NET_PROPS_COPY_COMMON(props, &p);
  return ncclSuccess;
}

static ncclResult_t vprops_up(const ncclNetVDeviceProps_v11_t* in, ncclNetVDeviceProps_v12_t* out) {
  if (in->ndevs < 0 || in->ndevs > NCCL_NET_MAX_DEVS_PER_NIC_V11) return ncclInvalidArgument;
  memset(out, 0, sizeof(*out));
  out->ndevs = in->ndevs;
  for (int i = 0; i < in->ndevs; i++) out->devs[i] = in->devs[i];
  return ncclSuccess;
}

static ncclResult_t v11_makeVDevice(int* d, ncclNetVDeviceProps_v11_t* props) {
  ncclNetVDeviceProps_v12_t p;
  ncclResult_t rc = vprops_up(props, &p);
  return rc != ncclSuccess ? rc : CH_NET_TABLE.makeVDevice(d, &p);
}

/* ---- v10: init once per process; listen and connect without a context (the one init made) ---- */

static pthread_mutex_t v10_mu = PTHREAD_MUTEX_INITIALIZER;
static int v10_inited;
static ncclResult_t v10_rc;
static void* v10_ctx;

static ncclResult_t v10_init(ncclDebugLogger_t logFunction, ncclProfilerCallback_t profFunction) {
  pthread_mutex_lock(&v10_mu);
  if (!v10_inited) {
    ncclNetCommConfig_v12_t config = {NCCL_NET_TRAFFIC_CLASS_UNDEF};
    v10_rc = CH_NET_TABLE.init(&v10_ctx, 0, &config, logFunction, profFunction);
    v10_inited = 1;
  }
  ncclResult_t rc = v10_rc;
  pthread_mutex_unlock(&v10_mu);
  return rc;
}

static ncclResult_t v10_listen(int dev, void* handle, void** listenComm) {
  return CH_NET_TABLE.listen(v10_ctx, dev, handle, listenComm);
}

/* The traffic class of a v10 connect has no place in the v12 interface (it is init's there): dropped. */
static ncclResult_t v10_connect(int dev, ncclNetCommConfig_v10_t* config, void* handle, void** sendComm,
                                ncclNetDeviceHandle_v10_t** sendDevComm) {
  return CH_NET_TABLE.connect(v10_ctx, dev, handle, sendComm, sendDevComm);
}

static ncclResult_t v10_makeVDevice(int* d, ncclNetVDeviceProps_v10_t* props) {
  return v11_makeVDevice(d, props); /* same vProps type */
}

/* Filled when the library is loaded, before any host can look the tables up: CH_NET_TABLE is data of
 * another translation unit, not a constant expression. */
__attribute__((constructor)) static void fill_tables(void) {
  const ncclNet_v12_t* o = &CH_NET_TABLE;
  ncclNetPlugin_v12 = *o;
  ncclNetPlugin_v12.name = CH_NET_PLUGIN_NAME;

  ncclNet_v11_t* a = &ncclNetPlugin_v11;
  a->name = CH_NET_PLUGIN_NAME, a->init = o->init, a->devices = o->devices, a->getProperties = v11_getProperties;
  a->listen = o->listen, a->connect = o->connect, a->accept = o->accept, a->regMr = o->regMr;
  a->regMrDmaBuf = o->regMrDmaBuf, a->deregMr = o->deregMr, a->isend = o->isend, a->irecv = o->irecv;
  a->iflush = o->iflush, a->test = o->test, a->closeSend = o->closeSend, a->closeRecv = o->closeRecv;
  a->closeListen = o->closeListen, a->getDeviceMr = o->getDeviceMr, a->irecvConsumed = o->irecvConsumed;
  a->makeVDevice = o->makeVDevice ? v11_makeVDevice : NULL;
  a->finalize = o->finalize, a->setNetAttr = o->setNetAttr;

  ncclNet_v10_t* b = &ncclNetPlugin_v10;
  b->name = CH_NET_PLUGIN_NAME, b->init = v10_init, b->devices = o->devices, b->getProperties = v10_getProperties;
  b->listen = v10_listen, b->connect = v10_connect, b->accept = o->accept, b->regMr = o->regMr;
  b->regMrDmaBuf = o->regMrDmaBuf, b->deregMr = o->deregMr, b->isend = o->isend, b->irecv = o->irecv;
  b->iflush = o->iflush, b->test = o->test, b->closeSend = o->closeSend, b->closeRecv = o->closeRecv;
  b->closeListen = o->closeListen, b->getDeviceMr = o->getDeviceMr, b->irecvConsumed = o->irecvConsumed;
  b->makeVDevice = o->makeVDevice ? v10_makeVDevice : NULL;
}
