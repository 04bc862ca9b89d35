/* Internals of the built-in libfabric network, shared by ofi.c (the ncclNet_v12_t table: comms,
 * requests, the connection protocol) and ofi_fabric.c (loading libfabric, choosing the provider and
 * its devices, the per-device endpoint, completion dispatch, registration). Only those two include it.
 *
 * Concurrency model. Each device has one endpoint shared by every comm of the process (the provider is
 * FI_THREAD_SAFE). dev->mu guards the lazy opening and the device's counters and address cache;
 * dev->cq_mu serialises CQ reads. One thread's CQ read completes any thread's request: it finds the
 * request through op_context and publishes its result with a release store of `state`; the owner
 * reads `state` with acquire. A comm itself is used by one thread at a time (the caller's promise). */
#ifndef CH_NET_OFI_H
#define CH_NET_OFI_H

#ifdef CHORUS_HAVE_LIBFABRIC

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

#include <rdma/fabric.h>
#include <rdma/fi_cm.h>
#include <rdma/fi_domain.h>
#include <rdma/fi_endpoint.h>
#include <rdma/fi_errno.h>
#include <rdma/fi_tagged.h>

#include "net.h"

#define OFI_NAME_MAX 56     /* endpoint name bytes in a handle (aws-ofi-nccl's MAX_EP_ADDR) */

/* The libfabric entry points that are real symbols (dlsym); everything else is inline in the headers. */
struct ofi_api {
  int (*getinfo)(uint32_t, const char*, const char*, uint64_t, const struct fi_info*, struct fi_info**);
  void (*freeinfo)(struct fi_info*);
  struct fi_info* (*dupinfo)(const struct fi_info*);
  int (*fabric)(struct fi_fabric_attr*, struct fid_fabric**, void*);
  const char* (*strerror)(int);
};
extern struct ofi_api ofi_fn; /* filled once by ch_ofi_available, read-only afterwards */

enum ofi_req_state { OFI_REQ_POSTED = 1, OFI_REQ_DONE = 2, OFI_REQ_FAILED = 3 };

/* One posted operation. `ctx` comes first: op_context points at the request itself, and the provider
 * owns ctx until the completion is read. */
struct ofi_req {
  struct fi_context2 ctx;
  int state;           /* enum ofi_req_state; the poster sets POSTED, the CQ reader DONE/FAILED (atomic) */
  int in_use;          /* 1 while handed out; only the comm's (one) calling thread touches it */
  const char* op;      /* "send", "recv", ... for messages; set by the poster */
  size_t posted;       /* bytes posted; set by the poster */
  struct ofi_comm* comm; /* owner; set at comm creation */
  /* Written by the CQ reader before the release store of state: */
  size_t len;          /* bytes moved */
  int err;             /* FI_E* (positive) of an error entry */
  size_t olen;         /* bytes dropped by a truncated receive */
  char errtext[160];   /* the provider's text for the error entry */
};

struct ofi_av_entry {
  uint8_t name[OFI_NAME_MAX];
  size_t len;
  fi_addr_t addr;
};

/* One device (a domain of the chosen provider). Fields above `mu` are set at selection and then read-only. */
struct ofi_dev {
  int index;
  struct fi_info* info;   /* this domain's fi_info (a fi_dupinfo copy) */
  char name[64];          /* domain name: props.name points here */
  char* pci_path;         /* realpath of /sys/class/net/<name>/device, or NULL */
  int speed;              /* Mbit/s */
  uint64_t ctrl_bit;      /* the tag bit that marks connection messages */

  pthread_mutex_t mu;     /* guards everything below except the CQ */
  int opened;             /* 1 once the objects below exist; 0 and open_err set when opening failed */
  int open_err;           /* ncclResult_t of a failed open, so later calls fail alike without retrying */
  struct fid_fabric* fabric;
  struct fid_domain* domain;
  struct fid_av* av;
  struct fid_cq* cq;
  struct fid_ep* ep;
  uint8_t ep_name[OFI_NAME_MAX];
  size_t ep_name_len;
  uint32_t next_id;       /* recvComm ids: data tag = id, connection tag = ctrl_bit | id */
  uint64_t next_key;      /* requested_key for registrations when the provider does not pick keys */
  struct ofi_av_entry* av_cache; /* peers inserted into av, each once (grows) */
  int av_count, av_cap;

  pthread_mutex_t cq_mu;  /* serialises fi_cq_read / fi_cq_readerr on cq */
  int cq_dead;            /* FI_E* once the CQ itself failed (overrun): every later wait fails (atomic) */
};

/* A registration (mhandle). mr is NULL where the provider needs none. */
struct ofi_mr {
  struct fid_mr* mr;
  void* desc;
};

/* ofi_fabric.c */
int ofi_ndevs(void);
struct ofi_dev* ofi_dev_get(int dev);                  /* NULL when out of range */
ncclResult_t ofi_dev_open(struct ofi_dev* d);          /* lazily creates the endpoint; idempotent */
void ofi_progress(struct ofi_dev* d);                  /* reads some completions, dispatches them */
ncclResult_t ofi_addr_insert(struct ofi_dev* d, const uint8_t* name, size_t len, fi_addr_t* out);
ncclResult_t ofi_mr_open(struct ofi_dev* d, void* buf, size_t len, struct ofi_mr* out);
void ofi_mr_close(struct ofi_mr* m);
const char* ofi_prov_name(void);
/* A printable form of an endpoint name (an IP:port for socket address formats). */
const char* ofi_name_str(const struct ofi_dev* d, const uint8_t* name, size_t len, char* buf, size_t buflen);

#endif /* CHORUS_HAVE_LIBFABRIC */
#endif
