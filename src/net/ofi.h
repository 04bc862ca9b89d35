/* Internals of the built-in libfabric network, shared by ofi.c (the ncclNet_v12_t table: comms,
 * requests, the connection protocol), ofi_rma.c (the RMA path: clear-to-sends, writes, CQ-data
 * dispatch), ofi_wire.c (the wire decoders below) and ofi_fabric.c (loading libfabric, choosing the
 * provider and its devices, the per-device endpoint, completion dispatch, registration). Only those
 * include it, and fuzz/fuzz_ofi.c (the wire part).
 *
 * Concurrency model. Each device has one endpoint shared by every comm of the process (the provider is
 * FI_THREAD_SAFE). dev->mu guards the lazy opening and the device's counters and address cache;
 * dev->cq_mu serialises CQ reads. One thread's CQ read completes any thread's request: it finds the
 * request through op_context and publishes its result with a release store of `state`; the owner
 * reads `state` with acquire. A comm itself is used by one thread at a time (the caller's promise). */
#ifndef CH_NET_OFI_H
#define CH_NET_OFI_H

#include <stddef.h>
#include <stdint.h>

/* ------------------------------------------------------------------------------------------------ */
/* Wire formats and their decoders. Pure functions with no libfabric in them (defined in ofi_wire.c,
 * outside CHORUS_HAVE_LIBFABRIC), so that fuzz/fuzz_ofi.c builds and runs where libfabric-dev is
 * absent.                                                                                          */

#define OFI_MAX_RECVS 8              /* largest n of a grouped receive (maxRecvs) */
#define OFI_TAG_SHIFT 33             /* a data tag: id (32 bits), 0 (the CTS bit), the sender's NCCL tag */
#define OFI_NAME_MAX 56              /* endpoint name bytes in a handle (aws-ofi-nccl's MAX_EP_ADDR) */
#define OFI_HANDLE_MAGIC 0x4f464948u /* "OFIH" */
#define OFI_CTRL_MAGIC 0x4f464943u   /* "OFIC" */
#define OFI_CTS_MAGIC 0x4f464953u    /* "OFIS": a clear-to-send of the RMA path */
#define OFI_PROTO_VERSION 3          /* 2: handle flags, the sender's name and CTS id in the connection message;
                                       * 3: the sender's NCCL tag in data tags (grouped receives) */
#define OFI_WHO_MAX 64
#define OFI_FLAG_RMA 1u              /* handle and connection message: data moves by RMA write (rendezvous) */
#define OFI_FLAGS_KNOWN OFI_FLAG_RMA

/* What listen() writes into NCCL's handle (NCCL_NET_HANDLE_MAXSIZE bytes, the rest zero). Arrives from
 * the peer through the bootstrap: connect() decodes it with ofi_handle_decode before using any field. */
struct ofi_handle {
  uint32_t magic;
  uint16_t version;
  uint16_t name_len; /* 1..OFI_NAME_MAX */
  uint32_t addr_format;
  uint32_t id;       /* the listener's id: connection tag ctrl_bit | id, data tag id */
  uint64_t nonce;    /* echoed by the connection message, so a stale or stray sender is refused */
  uint32_t flags;    /* OFI_FLAG_*: the listener's choice of path for this connection (the receiver decides) */
  uint32_t reserved; /* 0 */
  uint8_t name[OFI_NAME_MAX];
};
#define OFI_HANDLE_HDR offsetof(struct ofi_handle, name) /* bytes before the name */

/* The connection message, sent by connect() on the listener's connection tag and decoded by accept()
 * with ofi_ctrl_decode. `who` (sender's host and pid) is only ever printed. With OFI_FLAG_RMA (the
 * sender echoes the handle's flags: it agreed) the receiver sends its clear-to-send messages to the
 * sender's endpoint `name` on the tag cts_bit | cts_id; without it name_len and cts_id may be 0. */
struct ofi_ctrl {
  uint32_t magic;
  uint32_t id;
  uint64_t nonce;
  char who[OFI_WHO_MAX];
  uint16_t name_len;  /* 0..OFI_NAME_MAX; >= 1 with OFI_FLAG_RMA */
  uint16_t reserved;  /* 0 */
  uint32_t flags;     /* OFI_FLAG_*: what the sender agreed to (the handle's flags) */
  uint32_t cts_id;    /* the sender's id for its CTS tag; != 0 with OFI_FLAG_RMA */
  uint32_t reserved2; /* 0 */
  uint8_t name[OFI_NAME_MAX];
};

/* A clear-to-send of the RMA path: the receiver's irecv tells the sender where message `seq` goes. The
 * sender writes at most `size` bytes at `addr` (a virtual address with FI_MR_VIRT_ADDR, else an offset in
 * the region) with key `key`, with remote CQ data ofi_rma_data(cq_id, seq, bytes). Untrusted: decoded
 * by ofi_cts_decode before use. */
struct ofi_cts {
  uint32_t magic;
  uint16_t seq;   /* the message's sequence number on this connection (mod 2^16) */
  uint16_t cq_id; /* the receiver's id for the connection in CQ data */
  uint32_t size;  /* bytes the receive buffer holds (capped at 2^32-1) */
  uint32_t flags; /* 0 */
  uint64_t addr;
  uint64_t key;
};

/* Remote CQ data of an RMA write (8 bytes): the receiver's connection id, the sequence, the size. */
static inline uint64_t ofi_rma_data(uint16_t cq_id, uint16_t seq, uint32_t size) {
  return (uint64_t)cq_id | (uint64_t)seq << 16 | (uint64_t)size << 32;
}

/* Decodes a CTS of len bytes; accepts exactly sizeof(struct ofi_cts) bytes with the magic, flags 0 and
 * seq == expect_seq. Returns 0 with *out the message; else -1 with *why (static text) and *out holding the
 * bytes present (zero otherwise). why may be NULL. The size check against the send is the caller's. */
int ofi_cts_decode(const void* msg, size_t len, uint16_t expect_seq, struct ofi_cts* out, const char** why);

/* Writes h (header and its name_len name bytes) into buf of len bytes, zeroing the rest. Returns the
 * bytes that carry data (OFI_HANDLE_HDR + name_len), or 0 when len is too short or name_len is out of
 * range (nothing written then). */
size_t ofi_handle_encode(const struct ofi_handle* h, void* buf, size_t len);

/* Decodes a handle of len bytes from a peer; reads nothing past len and writes nothing but *out and
 * *why. Checks, in order: len covers the header, magic, version == `version`, 1 <= name_len <=
 * OFI_NAME_MAX, the name fits in len, addr_format == `addr_format`, name_len >= min_name_len (the
 * shortest name that address format has), id != 0, no unknown flags, reserved 0. Returns 0 with *out the handle (name bytes past
 * name_len zero); else -1 with *why (static text) and *out holding the header fields present (zero
 * otherwise, name empty), for the caller's message. why may be NULL. */
int ofi_handle_decode(const void* buf, size_t len, uint16_t version, uint32_t addr_format, size_t min_name_len,
                      struct ofi_handle* out, const char** why);

/* Decodes a connection message of len bytes (as received); reads nothing past len. Accepts exactly
 * sizeof(struct ofi_ctrl) bytes with the magic, id == expect_id and nonce == expect_nonce, no unknown
 * flags, reserved fields 0, name_len <= OFI_NAME_MAX, and with OFI_FLAG_RMA name_len >= 1 and cts_id != 0.
 * Returns 0 with *out the message, out->who NUL-terminated, cut at its first NUL, bytes outside printable
 * ASCII replaced by '?' and the rest zero, name bytes past name_len zero; else -1 with *why (static
 * text) and out's header (magic, id, nonce) holding the bytes present (zero otherwise; who and the
 * fields after it zero), for the caller's message. why may be NULL. */
int ofi_ctrl_decode(const void* msg, size_t len, uint32_t expect_id, uint64_t expect_nonce, struct ofi_ctrl* out,
                    const char** why);

/* A printable form of an endpoint name: "ip:port" (family 4, len >= 16: a sockaddr_in), "[ip6]:port"
 * (family 6, len >= 28: a sockaddr_in6), else "<len>-byte address <first 8 bytes in hex>". Reads at
 * most len bytes; buf (buflen >= 1) is always NUL-terminated. Returns buf. */
const char* ofi_name_format(int family, const uint8_t* name, size_t len, char* buf, size_t buflen);

#ifdef CHORUS_HAVE_LIBFABRIC

#include <pthread.h>

#include <rdma/fabric.h>
#include <rdma/fi_cm.h>
#include <rdma/fi_domain.h>
#include <rdma/fi_endpoint.h>
#include <rdma/fi_errno.h>
#include <rdma/fi_rma.h>
#include <rdma/fi_tagged.h>

#include "net.h"

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
  /* An RMA receive waiting for its write's CQ data; both under dev->rma_mu: */
  int rma_wait;
  uint16_t rma_seq;
  /* An RMA send accepted before its CTS arrived (the comm's thread only): the write is posted later. */
  int rma_deferred;
  void* rma_buf;
  void* rma_desc;
  /* A grouped receive (n > 1, not on the RMA path; the comm's calling thread only): the head request,
   * the one returned, lists its n members (itself first); members are posted in order, those the
   * provider refused for now (FI_EAGAIN) by later tests. Each member keeps what its post needs. */
  int group_n, group_posted;
  struct ofi_req* group[OFI_MAX_RECVS];
  void* gbuf;
  void* gdesc;
  uint64_t gtag;
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
  uint64_t cts_bit;       /* the tag bit that marks clear-to-send messages (RMA path): bit 32 */
  uint64_t tag_mask;      /* NCCL tag bits a data tag carries above OFI_TAG_SHIFT, below ctrl_bit (0: none;
                           * then no grouped receives) */
  int rma;                /* 1: this device's receivers choose the RMA path (CHORUS_OFI_RMA and the
                           * provider); its endpoint then has FI_RMA caps and every registration FI_REMOTE_WRITE */

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

  pthread_mutex_t rma_mu; /* guards rma_tab and every recvComm's waiting RMA receives (taken under cq_mu) */
  struct ofi_comm** rma_tab; /* RMA recvComms by their 16-bit CQ-data id (65536 entries, allocated at first use) */
  uint32_t rma_next;      /* where the next id search starts */

  pthread_mutex_t cq_mu;  /* serialises fi_cq_read / fi_cq_readerr on cq */
  int cq_dead;            /* FI_E* once the CQ itself failed (overrun): every later wait fails (atomic) */
};

/* A registration (mhandle). mr is NULL where the provider needs none. */
struct ofi_mr {
  struct fid_mr* mr;
  void* desc;
  char* base;   /* the region: RMA addresses are offsets from base without FI_MR_VIRT_ADDR */
  size_t len;
  uint64_t key; /* fi_mr_key (RMA devices) */
};

/* Comms: ofi.c creates and frees them; ofi_rma.c runs their RMA path. */
#define OFI_NREQS 64                     /* requests per comm: NCCL needs 32 (NCCL_NET_MAX_REQUESTS) */
#define OFI_RMA_IDS 65536                /* CQ-data connection ids per device (16 bits) */
#define OFI_RMA_MAX 0xffffffffull        /* largest message of the RMA path (32-bit size in CQ data) */

enum ofi_kind { OFI_LISTEN = 1, OFI_SEND = 2, OFI_RECV = 3 };
enum ofi_stage { OFI_IDLE = 0, OFI_POSTED = 1, OFI_DONE = 2 }; /* of the connection message */

/* Listen, send and recv comms share one layout. Everything is touched only by the thread calling the
 * table on this comm, except the requests' results, which the CQ reader writes (see the top of this
 * file). */
struct ofi_comm {
  uint32_t magic;            /* OFI_COMM_MAGIC while alive: catches stale and foreign pointers */
  int kind;                  /* enum ofi_kind */
  struct ofi_dev* dev;
  uint32_t id;               /* data tag */
  fi_addr_t peer;            /* send: the receiver */
  char peer_str[96];         /* the peer, for messages */
  int stage;                 /* enum ofi_stage of ctrl_req */
  int warned;                /* listen: a bad connection message was reported already */
  struct ofi_handle handle;  /* listen: what it wrote; send: what connect was given (pending key) */
  struct ofi_ctrl ctrl;      /* listen: receive buffer; send: the message */
  struct ofi_mr ctrl_mr;
  struct ofi_req ctrl_req;
  struct ofi_comm* next;     /* on ofi_pending (connecting) or ofi_graveyard; under ofi_lists_mu */
  int req_next;              /* where ofi_req_get looks first */
  struct ofi_req* group_partial; /* recv: a grouped receive not wholly posted yet; every later receive
                              * waits for it (libfabric matches a tag's receives in posting order) */
  struct ofi_req reqs[OFI_NREQS];
  /* The RMA path (rma == 1, agreed at connect/accept). */
  int rma;
  uint32_t cts_id;           /* CTS tag cts_bit | cts_id: send: its own (receives); recv: the sender's */
  uint16_t cq_id;            /* recv: its id in CQ data (dev->rma_tab) */
  uint32_t seq;              /* send: the next isend's sequence; recv: the next irecv's */
  uint64_t cts_head;         /* send: CTSs consumed (the next isend reads slot cts_head % OFI_NREQS) */
  uint64_t cts_posted;       /* send: CTS receives posted, in slot order */
  uint64_t pend_head, pend_tail; /* send: accepted sends waiting for their CTS (pend[], in order) */
  struct ofi_req* pend[OFI_NREQS];
  int rma_err;               /* send: a message failed; every later one fails too */
  struct ofi_mr cts_mr;      /* cts_msg's registration */
  /* send: CTS receives (slot order = arrival order; OFI_CTS_POSTED of them posted); recv: CTS sends,
   * slot i for reqs[i]'s message */
  struct ofi_req cts_req[OFI_NREQS];
  struct ofi_cts cts_msg[OFI_NREQS];
};

struct ofi_mh {
  uint32_t magic;
  struct ofi_mr mr;
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
/* ofi.c: a fork child forgets the connects in progress and the graveyard of the parent (ofi_fabric.c calls it). */
void ofi_lists_at_child(void);
/* A printable form of an endpoint name (an IP:port for socket address formats). */
const char* ofi_name_str(const struct ofi_dev* d, const uint8_t* name, size_t len, char* buf, size_t buflen);

/* ofi.c: requests and registrations (used by ofi_rma.c) */
int ofi_req_load_state(struct ofi_req* r);                         /* r->state, acquire */
void ofi_req_reset(struct ofi_req* r, const char* op, size_t size); /* sets POSTED: call before posting */
struct ofi_req* ofi_req_get(struct ofi_comm* c);                   /* a free request of c, or NULL */
void ofi_req_put(struct ofi_req* r);
void ofi_req_warn(struct ofi_req* r);                              /* one WARN for a failed operation */
ncclResult_t ofi_mh_get(void* mhandle, struct ofi_mh** out);       /* checks an mhandle (NULL: none) */

/* ofi_rma.c: the RMA path (used by ofi.c, and ofi_rma_arrived by ofi_fabric.c) */
int ofi_rma_attach(struct ofi_comm* r);
void ofi_rma_detach(struct ofi_comm* c);
void ofi_rma_unwait(struct ofi_req* r);
/* An RMA write's remote CQ data arrived on d's CQ (called by the CQ reader, under d->cq_mu). */
void ofi_rma_arrived(struct ofi_dev* d, uint64_t data);
ncclResult_t ofi_cts_post_all(struct ofi_comm* c);
void ofi_rma_pump(struct ofi_comm* c);
ncclResult_t ofi_rma_isend(struct ofi_comm* c, void* data, size_t size, void* desc, void** request);
ncclResult_t ofi_rma_irecv(struct ofi_comm* c, void* data, size_t size, void* mhandle, void** request);

#endif /* CHORUS_HAVE_LIBFABRIC */
#endif
