/* The RMA path of the OFI network (CHORUS_OFI_RMA; its protocol is described at the top of ofi.c): the
 * receivers' CQ-data connection ids and the dispatch of an RMA write's remote CQ data to its waiting
 * receive, the sender's clear-to-send receives, and isend/irecv's rendezvous: clear-to-sends sent and
 * checked, writes posted with fi_writedata. Apart from ofi.c (the table, comms, requests, the tagged
 * path) so that neither file grows past a readable size; the two share struct ofi_comm and the request
 * helpers through ofi.h. */
#define _GNU_SOURCE
#ifdef CHORUS_HAVE_LIBFABRIC

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../misc/log.h"
#include "ofi.h"

/* CTS receives a sendComm keeps posted: as many as NCCL has receives in flight (NCCL_STEPS). More CTSs
 * wait in the provider as unexpected messages until a receive is posted again; posting OFI_NREQS per
 * comm exhausted rxm's receive queue when many comms share the endpoint (ranks as threads), and a comm
 * that could post none never saw its CTSs. */
#define OFI_CTS_POSTED 8

/* ---- the RMA path's connection ids (receivers) ---- */

/* Gives recvComm r an id for CQ data; 0, or -1 when the device has none free (or no memory). */
int ofi_rma_attach(struct ofi_comm* r) {
  struct ofi_dev* d = r->dev;
  int res = -1;
  pthread_mutex_lock(&d->rma_mu);
  if (!d->rma_tab) d->rma_tab = calloc(OFI_RMA_IDS, sizeof(*d->rma_tab));
  for (uint32_t k = 0; d->rma_tab && k < OFI_RMA_IDS; k++) {
    uint32_t id = (d->rma_next + k) % OFI_RMA_IDS; /* round robin: an id is reused as late as possible */
    if (d->rma_tab[id]) continue;
    d->rma_tab[id] = r;
    r->cq_id = (uint16_t)id;
    d->rma_next = id + 1;
    res = 0;
    break;
  }
  pthread_mutex_unlock(&d->rma_mu);
  return res;
}

/* From now on no CQ data reaches c: its id is free, its waiting receives are no longer the provider's
 * (nothing was posted for them), so close does not wait for them. */
void ofi_rma_detach(struct ofi_comm* c) {
  struct ofi_dev* d = c->dev;
  if (!c->rma || c->kind != OFI_RECV) return;
  pthread_mutex_lock(&d->rma_mu);
  if (d->rma_tab && d->rma_tab[c->cq_id] == c) d->rma_tab[c->cq_id] = NULL;
  for (int i = 0; i < OFI_NREQS; i++) {
    if (!c->reqs[i].rma_wait) continue;
    c->reqs[i].rma_wait = 0;
    __atomic_store_n(&c->reqs[i].state, 0, __ATOMIC_RELAXED);
  }
  pthread_mutex_unlock(&d->rma_mu);
}

/* A request that waits for CQ data stops waiting (its CTS failed; the caller puts it back). */
void ofi_rma_unwait(struct ofi_req* r) {
  pthread_mutex_lock(&r->comm->dev->rma_mu);
  r->rma_wait = 0;
  pthread_mutex_unlock(&r->comm->dev->rma_mu);
}

void ofi_rma_arrived(struct ofi_dev* d, uint64_t data) {
  static int warned;
  uint16_t id = (uint16_t)data, seq = (uint16_t)(data >> 16);
  uint32_t size = (uint32_t)(data >> 32);
  struct ofi_req* r = NULL;
  pthread_mutex_lock(&d->rma_mu);
  struct ofi_comm* c = d->rma_tab ? d->rma_tab[id] : NULL;
  for (int i = 0; c && i < OFI_NREQS && !r; i++)
    if (c->reqs[i].rma_wait && c->reqs[i].rma_seq == seq) r = &c->reqs[i];
  if (r) {
    r->rma_wait = 0;
    if (size > r->posted) { /* the sender checked against our CTS: a forged or corrupted entry */
      r->len = r->posted;
      r->olen = size - r->posted;
      r->err = FI_ETRUNC;
      __atomic_store_n(&r->state, OFI_REQ_FAILED, __ATOMIC_RELEASE);
    } else {
      r->len = size;
      __atomic_store_n(&r->state, OFI_REQ_DONE, __ATOMIC_RELEASE);
    }
  }
  pthread_mutex_unlock(&d->rma_mu);
  if (!r && !__atomic_exchange_n(&warned, 1, __ATOMIC_RELAXED))
    WARN("NET/OFI: an RMA write's completion on %s (connection %u, sequence %u, %u bytes) matches no waiting "
         "receive: dropped (a closed connection's late write?); later ones are dropped silently", d->name, id, seq,
         size);
}

/* ---- clear-to-sends and writes ---- */

/* Sender, RMA path: keeps OFI_CTS_POSTED CTS receives posted, in slot order (the provider matches
 * receives of one tag in posting order, so slot cts_head always holds the next CTS to arrive). */
ncclResult_t ofi_cts_post_all(struct ofi_comm* c) {
  struct ofi_dev* d = c->dev;
  while (c->cts_posted < c->cts_head + OFI_CTS_POSTED) {
    int slot = (int)(c->cts_posted % OFI_NREQS);
    struct ofi_req* q = &c->cts_req[slot];
    ofi_req_reset(q, "clear-to-send receive", sizeof(c->cts_msg[slot]));
    ssize_t rc = fi_trecv(d->ep, &c->cts_msg[slot], sizeof(c->cts_msg[slot]), c->cts_mr.desc, FI_ADDR_UNSPEC,
                          d->cts_bit | c->cts_id, 0, &q->ctx);
    if (rc) {
      __atomic_store_n(&q->state, 0, __ATOMIC_RELAXED);
      if (rc == -FI_EAGAIN) { /* no room now: the next call posts it (reading the CQ frees some) */
        ofi_progress(d);
        return ncclSuccess;
      }
      WARN("NET/OFI: posting a clear-to-send receive on %s (provider %s) failed: %s", d->name, ofi_prov_name(),
           ofi_fn.strerror((int)-rc));
      return ncclSystemError;
    }
    c->cts_posted++;
  }
  return ncclSuccess;
}

/* An RMA send fails without reaching the provider: the reason goes to test()'s WARN. */
static void rma_fail(struct ofi_req* r, int err, const char* fmt, ...) __attribute__((format(printf, 3, 4)));
static void rma_fail(struct ofi_req* r, int err, const char* fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(r->errtext, sizeof(r->errtext), fmt, ap);
  va_end(ap);
  r->err = err;
  r->rma_deferred = 0;
  __atomic_store_n(&r->state, OFI_REQ_FAILED, __ATOMIC_RELEASE);
}

/* Sender, RMA path: posts the writes of accepted sends whose CTS has arrived, in order (sequence =
 * isend order = CTS arrival order). A CTS that fails its checks, or one too small for its send, fails
 * that send, and the connection: every later send fails too (the peers no longer agree). */
void ofi_rma_pump(struct ofi_comm* c) {
  struct ofi_dev* d = c->dev;
  int progressed = 0;
  if (!c->rma_err && ofi_cts_post_all(c) != ncclSuccess) c->rma_err = 1;
  while (c->pend_head < c->pend_tail) {
    struct ofi_req* r = c->pend[c->pend_head % OFI_NREQS];
    if (c->rma_err) {
      rma_fail(r, FI_EIO, "an earlier message on this connection failed");
      c->pend_head++;
      continue;
    }
    int slot = (int)(c->cts_head % OFI_NREQS);
    struct ofi_req* q = &c->cts_req[slot];
    int st = ofi_req_load_state(q);
    if (st != OFI_REQ_DONE && st != OFI_REQ_FAILED && !progressed) {
      ofi_progress(d);
      progressed = 1;
      st = ofi_req_load_state(q);
    }
    if (st != OFI_REQ_DONE && st != OFI_REQ_FAILED) break; /* its CTS is not here yet */
    c->rma_err = 1; /* unless all goes well below */
    c->pend_head++;
    struct ofi_cts cts;
    const char* bad = NULL;
    if (st == OFI_REQ_FAILED) {
      rma_fail(r, q->err, "receiving its clear-to-send failed: %s", q->errtext[0] ? q->errtext : "no provider detail");
      continue;
    }
    if (ofi_cts_decode(&c->cts_msg[slot], q->len, (uint16_t)c->seq, &cts, &bad)) {
      rma_fail(r, FI_EIO, "bad clear-to-send from the receiver (%zu bytes, magic 0x%x, sequence %u, expected %u): %s",
               q->len, cts.magic, cts.seq, (unsigned)(uint16_t)c->seq, bad);
      continue;
    }
    if (r->posted > cts.size) {
      rma_fail(r, FI_EMSGSIZE, "the receiver posted only %u bytes for message %u: the peers disagree on message "
               "sizes (truncation)", cts.size, cts.seq);
      continue;
    }
    ssize_t rc = fi_writedata(d->ep, r->rma_buf, r->posted, r->rma_desc,
                              ofi_rma_data(cts.cq_id, cts.seq, (uint32_t)r->posted), c->peer, cts.addr, cts.key,
                              &r->ctx);
    if (rc == -FI_EAGAIN) { /* the CTS stays at the head; the next call tries again */
      c->rma_err = 0;
      c->pend_head--;
      if (!progressed) ofi_progress(d);
      break;
    }
    if (rc) {
      rma_fail(r, (int)-rc, "posting the write failed");
      continue;
    }
    c->rma_err = 0;
    r->rma_deferred = 0; /* the provider's now */
    __atomic_store_n(&q->state, 0, __ATOMIC_RELAXED); /* consumed: the slot takes a new CTS receive */
    c->cts_head++;
    c->seq++;
  }
  if (!c->rma_err && ofi_cts_post_all(c) != ncclSuccess) c->rma_err = 1;
}

/* isend on the RMA path: the request is accepted at once and holds the send until the CTS of its
 * sequence number arrives; this call, later isends and test() on the comm post the write (ofi_rma_pump). */
ncclResult_t ofi_rma_isend(struct ofi_comm* c, void* data, size_t size, void* desc, void** request) {
  if (c->rma_err) {
    WARN("NET/OFI: isend of %zu bytes to %s on %s: an earlier message on this connection failed", size, c->peer_str,
         c->dev->name);
    return ncclSystemError;
  }
  struct ofi_req* r = ofi_req_get(c);
  if (!r) {
    ofi_rma_pump(c);
    return ncclSuccess;
  }
  ofi_req_reset(r, "RMA write", size);
  r->rma_buf = data;
  r->rma_desc = desc;
  r->rma_deferred = 1;
  c->pend[c->pend_tail++ % OFI_NREQS] = r; /* at most OFI_NREQS requests exist: never overwrites */
  ofi_rma_pump(c);
  *request = r;
  return ncclSuccess;
}

/* irecv on the RMA path: nothing posted for the data; a CTS tells the sender where to write it. */
ncclResult_t ofi_rma_irecv(struct ofi_comm* c, void* data, size_t size, void* mhandle, void** request) {
  struct ofi_dev* d = c->dev;
  struct ofi_mh* mh;
  ncclResult_t res = ofi_mh_get(mhandle, &mh);
  if (res != ncclSuccess) return res;
  char* p = data;
  if (!mh || !mh->mr.mr) {
    WARN("NET/OFI: irecv of %zu bytes from %s on %s without a registration: the RMA path (CHORUS_OFI_RMA) needs "
         "receive buffers registered with regMr", size, c->peer_str, d->name);
    return ncclInternalError;
  }
  if (p < mh->mr.base || size > mh->mr.len || (size_t)(p - mh->mr.base) > mh->mr.len - size) {
    WARN("NET/OFI: irecv of %zu bytes at %p from %s: outside its registration (%zu bytes at %p)", size, data,
         c->peer_str, mh->mr.len, (void*)mh->mr.base);
    return ncclInvalidArgument;
  }
  struct ofi_req* r = ofi_req_get(c);
  if (!r) return ncclSuccess;
  int slot = (int)(r - c->reqs);
  struct ofi_req* q = &c->cts_req[slot];
  if (ofi_req_load_state(q) == OFI_REQ_POSTED) ofi_progress(d); /* the slot's previous CTS send must be done */
  int st = ofi_req_load_state(q);
  if (st == OFI_REQ_FAILED) {
    ofi_req_warn(q);
    __atomic_store_n(&q->state, 0, __ATOMIC_RELAXED);
    ofi_req_put(r);
    return ncclSystemError;
  }
  if (st == OFI_REQ_POSTED) {
    ofi_req_put(r);
    return __atomic_load_n(&d->cq_dead, __ATOMIC_ACQUIRE) ? ncclSystemError : ncclSuccess;
  }
  uint32_t cap = size > OFI_RMA_MAX ? (uint32_t)OFI_RMA_MAX : (uint32_t)size;
  struct ofi_cts* m = &c->cts_msg[slot];
  memset(m, 0, sizeof(*m));
  m->magic = OFI_CTS_MAGIC;
  m->seq = (uint16_t)c->seq;
  m->cq_id = c->cq_id;
  m->size = cap;
  /* Without FI_MR_VIRT_ADDR the target address is an offset in the region (rdma.md 2.2: on tcp;ofi_rxm a
   * virtual address fails silently). */
  m->addr = (d->info->domain_attr->mr_mode & FI_MR_VIRT_ADDR) ? (uint64_t)(uintptr_t)p : (uint64_t)(p - mh->mr.base);
  m->key = mh->mr.key;
  ofi_req_reset(r, "RMA receive", cap);
  pthread_mutex_lock(&d->rma_mu); /* before the CTS leaves: the write may land at once */
  r->rma_seq = m->seq;
  r->rma_wait = 1;
  pthread_mutex_unlock(&d->rma_mu);
  ofi_req_reset(q, "clear-to-send send", sizeof(*m));
  ssize_t rc = fi_tsend(d->ep, m, sizeof(*m), c->cts_mr.desc, c->peer, d->cts_bit | c->cts_id, &q->ctx);
  if (rc) {
    __atomic_store_n(&q->state, 0, __ATOMIC_RELAXED);
    ofi_rma_unwait(r);
    ofi_req_put(r);
    if (rc == -FI_EAGAIN) {
      ofi_progress(d);
      return ncclSuccess;
    }
    WARN("NET/OFI: posting a clear-to-send to %s on %s (provider %s) failed: %s", c->peer_str, d->name,
         ofi_prov_name(), ofi_fn.strerror((int)-rc));
    return ncclSystemError;
  }
  c->seq++;
  *request = r;
  return ncclSuccess;
}

#endif /* CHORUS_HAVE_LIBFABRIC */
