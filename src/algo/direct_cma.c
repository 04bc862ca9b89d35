/* Direct AllReduce between processes on any buffer: cross-memory attach (process_vm_readv/writev).
 *
 * Buffers from ncclMemAlloc are mapped and read in place (direct_allreduce.c). Any other buffer (malloc,
 * a PyTorch tensor) cannot be mapped by a peer, but the kernel copies between two processes' memory in
 * one step when the caller may ptrace the other (same user; Yama's ptrace_scope 0; no seccomp filter
 * refusing it): the owner of a segment reads each peer's share of it straight into its block, reduces,
 * and writes the result straight into each peer's receive buffer. One copy each way, as the mapped path,
 * against a copy into and out of a FIFO.
 *
 * Which pid and address: each rank publishes its pid and the address of a random word (its cookie) in
 * its clique slot; at init every rank reads every peer's cookie through process_vm_readv at that pid and
 * address and compares it with the slot's. A rank that cannot (other pid namespace, ptrace refused, a
 * slot that lies) says why, and the ranks agree (init.c) to use CMA only if every probe succeeded. The
 * pids kept are the probed ones, copied to private memory: what a peer writes later is never used as a
 * pid. The addresses of each call's buffers come from the slots, as the mapped path's offsets do; the
 * kernel bounds them to the peer's own address space (EFAULT otherwise), and a failure fails the call on
 * every rank (done word), never a hang. */
#define _GNU_SOURCE /* process_vm_readv */
#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/uio.h>
#include <unistd.h>

#include "../misc/log.h"
#include "../misc/utils.h"
#include "algo.h"

void direct_cma_publish(struct direct_slot* mine, const uint64_t* cookie) {
  mine->cma_pid = (int32_t)getpid();
  mine->cma_cookie = *cookie;
  mine->cma_addr = (uint64_t)(uintptr_t)cookie;
}

int direct_cma_probe(const struct direct_clique* c, int n, int me, int32_t* pids, int* bad) {
  for (int k = 0; k < n; k++) {
    const struct direct_slot* s = &c->slot[k]; /* written before the allgather that preceded this */
    int32_t pid = s->cma_pid;
    uint64_t addr = s->cma_addr, cookie = s->cma_cookie, got = 0;
    pids[k] = pid;
    if (k == me) continue;
    struct iovec l = {&got, sizeof(got)}, r = {(void*)(uintptr_t)addr, sizeof(got)};
    errno = 0;
    ssize_t rc = pid > 0 ? process_vm_readv(pid, &l, 1, &r, 1, 0) : -1;
    if (rc != (ssize_t)sizeof(got) || got != cookie) {
      *bad = k;
      return rc < 0 && errno ? errno : EINVAL; /* EINVAL: it read something else (another pid namespace) */
    }
  }
  return 0;
}

/* The calling thread's blocks, kept between calls (a thread runs one plan at a time) and freed when it
 * exits. */
static pthread_key_t blk_key;
static pthread_once_t blk_once = PTHREAD_ONCE_INIT;
struct cma_blk {
  size_t bytes;
  char* p;
};
static void blk_free(void* v) {
  struct cma_blk* b = v;
  if (b) free(b->p);
  free(b);
}
static void blk_init(void) { (void)pthread_key_create(&blk_key, blk_free); }
static char* blocks(size_t bytes) {
  pthread_once(&blk_once, blk_init);
  struct cma_blk* b = pthread_getspecific(blk_key);
  if (!b) {
    if (!(b = calloc(1, sizeof(*b)))) return NULL;
    if (pthread_setspecific(blk_key, b) != 0) {
      free(b);
      return NULL;
    }
  }
  if (b->bytes < bytes) {
    free(b->p);
    b->bytes = 0;
    if (!(b->p = aligned_alloc(64, bytes))) return NULL;
    b->bytes = bytes;
  }
  return b->p;
}

/* Copy len bytes between here and pid's address `at`, whole (the kernel may stop short). */
static int cma_move(pid_t pid, char* here, uint64_t at, size_t len, int write) {
  while (len) {
    struct iovec l = {here, len}, r = {(void*)(uintptr_t)at, len};
    ssize_t k = write ? process_vm_writev(pid, &l, 1, &r, 1, 0) : process_vm_readv(pid, &l, 1, &r, 1, 0);
    if (k <= 0) {
      if (k < 0 && errno == EINTR) continue;
      return k < 0 ? errno : EIO;
    }
    here += k, at += (uint64_t)k, len -= (size_t)k;
  }
  return 0;
}

int direct_cma_copy(int pid, void* here, uint64_t there, size_t len, int write) {
  return cma_move((pid_t)pid, here, there, len, write);
}

#define CMA_BLOCK (128u << 10) /* per peer read and per result: a few syscalls per MiB, in L2 */

int direct_cma_segment(struct ch_op* op, const struct red_op* red, char** send, char** recv, const uint64_t* send_at,
                       const uint64_t* recv_at, size_t at, size_t len) {
  int n = op->nranks, me = op->rank, repro = op->ctx.repro && n <= 64;
  size_t es = op->esize;
  /* Reproducible levels combine every rank's value of an element at once: one block per rank. */
  size_t blk = repro ? UT_MAX((size_t)4096, (size_t)(1u << 20) / (size_t)n) : CMA_BLOCK;
  blk -= blk % (64 * es);
  char* base = blocks(repro ? blk * (size_t)(n + 1) : 2 * blk);
  if (!base) {
    WARN("AllReduce on rank %d: cannot allocate %zu bytes of blocks for cross-memory copies", me, 2 * blk);
    return ENOMEM;
  }
  char* acc = base; /* repro: the result; then one block per rank */
  char* tmp = base + blk;
  size_t per = blk / es;
  struct red_contrib in[64];
  for (size_t o = 0; o < len; o += per) {
    size_t m = len - o < per ? len - o : per, b = (at + o) * es, bytes = m * es;
    int err = 0, who = -1, wr = 0;
    if (repro) {
      for (int k = 0; k < n && !err; k++) {
        char* mine = tmp + (size_t)k * blk;
        if (!send[k] && (err = cma_move(op->cma->pid[k], mine, send_at[k] + b, bytes, 0))) who = k;
        in[k] = (struct red_contrib){send[k] ? send[k] + b : mine, &red[k]};
      }
      if (!err) (void)red_repro_combine(op->ctx.repro, &red[me], acc, in, n, m);
    } else {
      red_premul(&red[me], acc, send[me] + b, m);
      for (int k = 0; k < n && !err; k++) {
        if (k == me) continue;
        const char* src = send[k] ? send[k] + b : tmp;
        if (!send[k] && (err = cma_move(op->cma->pid[k], tmp, send_at[k] + b, bytes, 0))) who = k;
        if (!err) red_reduce(&red[k], acc, acc, src, m);
      }
      if (!err && red_has_postop(&red[me])) red_postop(&red[me], acc, acc, m);
    }
    for (int k = 0; k < n && !err; k++) {
      if (recv[k]) memcpy(recv[k] + b, acc, bytes);
      else if ((err = cma_move(op->cma->pid[k], acc, recv_at[k] + b, bytes, 1))) who = k, wr = 1;
    }
    if (err) {
      WARN("AllReduce seq %llu on rank %d: cannot %s rank %d's %s buffer (process_vm_%s): %s",
           (unsigned long long)op->ctx.hdr.seq + 1, me, wr ? "write" : "read", who, wr ? "receive" : "send",
           wr ? "writev" : "readv", strerror(err));
      return err;
    }
  }
  return 0;
}
