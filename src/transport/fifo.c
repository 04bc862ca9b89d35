/* What every transport shares: the FIFO layout, sleeping/waking on its counters, and teardown; plus
 * the local (same-process) transport. */
#include <linux/futex.h>
#include <sys/mman.h>
#include <stdlib.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>
#include <string.h>

#include "../misc/log.h"
#include "../misc/param.h"
#include "../misc/utils.h"
#include "transport.h"

static size_t align_page(size_t n) { return UT_ALIGN_UP(n, 4096); }

size_t tp_fifo_bytes(const struct tp_sizes* sz) {
  size_t n = align_page(sizeof(struct fifo_ctrl));
  for (int p = 0; p < CH_NPROTO; p++) n += align_page(sz->buff[p]);
  return n;
}

void tp_fifo_layout(struct conn* c, void* mem, const struct tp_sizes* sz) {
  char* p = mem;
  c->ctrl = (struct fifo_ctrl*)p;
  p += align_page(sizeof(struct fifo_ctrl));
  for (int i = 0; i < CH_NPROTO; i++) {
    c->buff[i] = p;
    c->slot_bytes[i] = sz->buff[i] / CH_STEPS;
    p += align_page(sz->buff[i]);
  }
}

void tp_conn_poison(struct conn* c, int we_send, const struct xfer_poison* rec) {
  if (!c->connected || !c->ctrl) return;
  /* The other end may sleep on the counter it waits for; over the network the proxy carries it. */
  if (xfer_poison_put(we_send ? &c->ctrl->down : &c->ctrl->up, rec)) tp_ops_of(c->transport)->wake(c, we_send);
}

int tp_conn_poisoned(const struct conn* c, int we_send, struct xfer_poison* out) {
  if (!c->connected || !c->ctrl) return 0;
  const struct xfer_poison* p = we_send ? &c->ctrl->up : &c->ctrl->down;
  if (!xfer_poison_is_set(p)) return 0;
  xfer_poison_copy(out, p);
  atomic_store_explicit(&out->set, 1, memory_order_relaxed);
  return 1;
}

#define POOL_MASK 0x7fffffffull
int tp_pool_reserve(struct conn* c, int we_send, int count) {
  _Atomic uint64_t* w = &c->ctrl->pool;
  uint64_t v = atomic_load(w);
  for (;;) {
    if (v & TP_POOL_CLOSED) return 0;
    int sh = we_send ? 0 : 32;
    uint64_t n = (((v >> sh) & POOL_MASK) + (uint64_t)count) & POOL_MASK;
    uint64_t nv = (v & ~(POOL_MASK << sh)) | n << sh;
    if (atomic_compare_exchange_weak(w, &v, nv)) return 1;
  }
}

int tp_pool_close(struct conn* c) {
  _Atomic uint64_t* w = &c->ctrl->pool;
  uint64_t v = atomic_load(w);
  for (;;) {
    if (v & TP_POOL_CLOSED) return 1;
    if ((v & POOL_MASK) != ((v >> 32) & POOL_MASK)) return 0; /* a message one end has not reached */
    if (atomic_compare_exchange_weak(w, &v, v | TP_POOL_CLOSED)) return 1;
  }
}

int tp_pool_closed(const struct conn* c) {
  return (atomic_load(&((struct conn*)c)->ctrl->pool) & TP_POOL_CLOSED) != 0;
}

int tp_pool_behind(const struct conn* c, int we_send) {
  uint64_t v = atomic_load(&((struct conn*)c)->ctrl->pool);
  if (v & TP_POOL_CLOSED) return 0;
  uint64_t ours = (v >> (we_send ? 0 : 32)) & POOL_MASK, theirs = (v >> (we_send ? 32 : 0)) & POOL_MASK;
  uint64_t ahead = (ours - theirs) & POOL_MASK; /* the counts wrap at 31 bits */
  return ahead != 0 && ahead < (POOL_MASK >> 1);
}

const char* tp_name(int kind) { return kind >= 0 && kind < TP_COUNT ? tp_table[kind]->name : "?"; }

/* NCCL's rules: NCCL_P2P_DISABLE keeps threads of one process off their direct (here: heap) path,
 * NCCL_SHM_DISABLE keeps processes off shared memory; what is left is the network. */
static int local_can_connect(const struct tp_peer* p, const char** why) {
  if (p->self) return *why = "self", 1;
  return p->same_proc && !param_int(PARAM_P2P_DISABLE) && (*why = "threads of one process", 1);
}
static int shm_can_connect(const struct tp_peer* p, const char** why) {
  return p->same_host && !param_int(PARAM_SHM_DISABLE) && (*why = "processes of one host", 1);
}

int tp_choose(const struct tp_peer* p, const char** why) {
  int k = 0; /* the last row has no probe: it takes any peer (tests: net.transport_priority_list) */
  while (tp_table[k]->can_connect && !tp_table[k]->can_connect(p, why)) k++;
  if (!tp_table[k]->can_connect) *why = p->same_host ? "NCCL_SHM_DISABLE / NCCL_P2P_DISABLE" : "another host";
  return k;
}

ch_status tp_local_recv_setup(struct conn* c, const struct tp_sizes* sz, struct tp_handle* h, const struct tp_ctx* x) {
  (void)x;
  size_t bytes = tp_fifo_bytes(sz);
  void* mem = NULL;
  if (posix_memalign(&mem, 4096, bytes) != 0) {
    WARN("cannot allocate %zu bytes for a FIFO to rank %d", bytes, c->peer);
    return CH_SYSTEM;
  }
  memset(mem, 0, bytes);
  tp_fifo_layout(c, mem, sz);
  atomic_store(&c->ctrl->refs, 1);
  /* The sender finds the block by a token that only this process can resolve, never by an address. */
  uint64_t token = tp_local_publish(mem, &c->ctrl->refs);
  if (!token) {
    free(mem);
    WARN("out of memory publishing a FIFO for rank %d", c->peer);
    return CH_SYSTEM;
  }
  c->map_base = mem;
  c->map_bytes = bytes;
  c->fd = -1;
  c->token = token;
  c->transport = TP_LOCAL;
  c->connected = 1;
  memset(h, 0, sizeof(*h));
  h->kind = TP_LOCAL;
  h->bytes = bytes;
  h->token = token;
  return CH_OK;
}

ch_status tp_local_send_connect(struct conn* c, const struct tp_sizes* sz, const struct tp_handle* h,
                                const struct tp_ctx* x) {
  (void)x;
  if (h->bytes != tp_fifo_bytes(sz)) {
    WARN("FIFO size mismatch with rank %d: %llu vs %zu bytes (NCCL_BUFFSIZE differs between ranks?)", c->peer,
         (unsigned long long)h->bytes, tp_fifo_bytes(sz));
    return CH_INVALID_USAGE;
  }
  /* Takes a reference (before our ack lets the receiver go on) and withdraws the token. */
  void* mem = tp_local_lookup(h->token, 1);
  if (!mem) {
    WARN("rank %d offered a local FIFO that no thread of this process published (token %016llx): refused; "
         "is another process claiming to be rank %d?", c->peer, (unsigned long long)h->token, c->peer);
    return CH_INVALID_USAGE;
  }
  tp_fifo_layout(c, mem, sz);
  c->map_base = mem;
  c->fd = -1;
  c->token = 0;
  c->transport = TP_LOCAL;
  c->connected = 1;
  return CH_OK;
}

/* The futex is the counter's low half: it changes whenever the counter does (steps are small). */
static uint32_t* futex_word(_Atomic uint64_t* word) {
#if __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
  return (uint32_t*)word;
#else
  return (uint32_t*)word + 1;
#endif
}

void tp_wait(_Atomic uint64_t* word, _Atomic uint32_t* sleeping, uint64_t seen, int timeout_us) {
  atomic_store_explicit(sleeping, 1, memory_order_relaxed);
  atomic_thread_fence(memory_order_seq_cst);
  if (atomic_load_explicit(word, memory_order_relaxed) == seen) {
    struct timespec ts = {(time_t)(timeout_us / UT_US_PER_S), (long)(timeout_us % UT_US_PER_S * UT_NS_PER_US)};
    syscall(SYS_futex, futex_word(word), FUTEX_WAIT, (uint32_t)seen, &ts, NULL, 0);
  }
  atomic_store_explicit(sleeping, 0, memory_order_relaxed);
}

void tp_wake_slow(_Atomic uint64_t* word) { syscall(SYS_futex, futex_word(word), FUTEX_WAKE, 1 << 30, NULL, NULL, 0); }

void tp_conn_free(struct conn* c) {
  if (c->connected) tp_ops_of(c->transport)->free(c);
}

/* Local and shm FIFOs: the receiver's token (and shm descriptor) served only the handshake. */
static ch_status fifo_recv_done(struct conn* c, int attached, const struct tp_handle* back, const struct tp_ctx* x) {
  (void)attached, (void)back, (void)x;
  if (c->transport == TP_LOCAL) tp_local_withdraw(c->token);
  else tp_fd_withdraw(c->token);
  c->token = 0;
  if (c->fd >= 0) close(c->fd);
  c->fd = -1;
  return CH_OK;
}

static void fifo_wake(struct conn* c, int we_send) { tp_wake_slow(we_send ? &c->ctrl->tail : &c->ctrl->head); }

static void fifo_free(struct conn* c) {
  if (c->transport == TP_LOCAL) {
    tp_local_withdraw(c->token); /* first: a sender can no longer take a reference after this */
    /* A peer thread may still be posting its last step into this block: free it when both are done. */
    if (atomic_fetch_sub(&c->ctrl->refs, 1) == 1) free(c->map_base);
  } else if (c->map_base) {
    tp_fd_withdraw(c->token);
    munmap(c->map_base, c->map_bytes);
  }
  if (c->fd >= 0) close(c->fd);
  memset(c, 0, sizeof(*c));
  c->fd = -1;
}

const struct tp_ops tp_local_ops = {
    .name = "local",
    .can_connect = local_can_connect,
    .flags = TP_F_SAME_PROC | TP_F_SAME_HOST,
    .recv_setup = tp_local_recv_setup,
    .send_connect = tp_local_send_connect,
    .recv_done = fifo_recv_done,
    .wake = fifo_wake,
    .free = fifo_free,
};
const struct tp_ops tp_shm_ops = {
    .name = "shm",
    .can_connect = shm_can_connect,
    .flags = TP_F_SAME_HOST | TP_F_PID_WATCH,
    .recv_setup = tp_shm_recv_setup,
    .send_connect = tp_shm_send_connect,
    .recv_done = fifo_recv_done,
    .wake = fifo_wake,
    .free = fifo_free,
};

const struct tp_ops* const tp_table[TP_COUNT] = {[TP_LOCAL] = &tp_local_ops, [TP_SHM] = &tp_shm_ops, [TP_FAB] = &tp_fab_ops,
                                            [TP_TCP] = &tp_tcp_ops};
