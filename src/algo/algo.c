/* Dispatch from an operation to its algorithm file. */
#include <stdio.h>
#include <string.h>

#include "algo.h"
#include "../reduce/wire.h"

uint64_t algo_nsteps(const struct ch_op* op) {
  if (op->algo == ALGO_DIRECT) return 3;
  if (op->func == FUNC_SEND || op->func == FUNC_RECV) return p2p_nsteps(op);
  if (op->nranks == 1) return local_nsteps(op);
  if (op->algo == ALGO_OWNER) return owner_nsteps(op);
  switch (op->func) {
    case FUNC_ALLREDUCE:
      if (op->algo == ALGO_EXCHANGE) return exchange_allreduce_nsteps(op);
      if (op->algo == ALGO_RECDBL) return recdbl_allreduce_nsteps(op);
      if (op->algo == ALGO_TREE) return tree_allreduce_nsteps(op);
      if (op->algo == ALGO_RABEN) return raben_allreduce_nsteps(op);
      return ring_allreduce_nsteps(op);
    case FUNC_ALLGATHER: return ring_allgather_nsteps(op);
    case FUNC_REDUCESCATTER: return ring_reducescatter_nsteps(op);
    case FUNC_BROADCAST: return op->algo == ALGO_TREE ? tree_broadcast_nsteps(op) : ring_broadcast_nsteps(op);
    case FUNC_REDUCE: return op->algo == ALGO_TREE ? tree_reduce_nsteps(op) : ring_reduce_nsteps(op);
    default: return 0;
  }
}

void algo_step(const struct ch_op* op, uint64_t idx, struct prim* p) {
  *p = (struct prim){0};
  if (op->func == FUNC_SEND || op->func == FUNC_RECV) return p2p_step(op, idx, p);
  if (op->nranks == 1) return local_step(op, idx, p);
  if (op->algo == ALGO_OWNER) return owner_step(op, idx, p);
  switch (op->func) {
    case FUNC_ALLREDUCE:
      if (op->algo == ALGO_EXCHANGE) exchange_allreduce_step(op, idx, p);
      else if (op->algo == ALGO_RECDBL) recdbl_allreduce_step(op, idx, p);
      else if (op->algo == ALGO_TREE) tree_allreduce_step(op, idx, p);
      else if (op->algo == ALGO_RABEN) raben_allreduce_step(op, idx, p);
      else ring_allreduce_step(op, idx, p);
      break;
    case FUNC_ALLGATHER: ring_allgather_step(op, idx, p); break;
    case FUNC_REDUCESCATTER: ring_reducescatter_step(op, idx, p); break;
    case FUNC_BROADCAST:
      if (op->algo == ALGO_TREE) tree_broadcast_step(op, idx, p);
      else ring_broadcast_step(op, idx, p);
      break;
    case FUNC_REDUCE:
      if (op->algo == ALGO_TREE) tree_reduce_step(op, idx, p);
      else ring_reduce_step(op, idx, p);
      break;
    default: break;
  }
}

int algo_uses_peers(int algo) {
  return algo == ALGO_RECDBL || algo == ALGO_TREE || algo == ALGO_RABEN || algo == ALGO_OWNER;
}

const char* algo_name(int algo) { return algo >= 0 && algo < ALGO_COUNT ? ch_algo_name(algo) : "?"; }

void algo_peer_set(int rank, int n, const struct algo_tree* trees, int ntrees, char* mark) {
  if (n == 1) return;
  struct algo_pof2 me = algo_pof2_of(rank, n);
  if (me.fold >= 0) mark[me.fold] = 1;
  for (int k = 0; me.vrank >= 0 && k < me.log; k++) mark[algo_pof2_rank(me.vrank ^ (1 << k), n, me.p)] = 1;
  for (int t = 0; t < ntrees; t++) {
    if (trees[t].up >= 0) mark[trees[t].up] = 1;
    for (int c = 0; c < trees[t].ndown; c++) mark[trees[t].down[c]] = 1;
  }
}

/* Header fields come from peers: out-of-range values print as such. */
static const char* type_name(uint32_t t) {
  const char* n = t < ncclNumTypes ? ch_type_name((int)t) : NULL;
  return n ? n : "invalid type";
}

/* A per-call selection as ", algSelection Ring/Simple+Tree/LL" appended to b (bits: algorithm x
 * CH_NPROTO + protocol, tune/select.c; a peer's bits beyond the algorithms print as "?"). */
static void sel_text(char* b, size_t n, uint32_t sel) {
  size_t len = strlen(b);
  for (int k = 0; sel && len + 1 < n; k++, sel >>= 1) {
    if (!(sel & 1)) continue;
    const char* a = k / CH_NPROTO < ALGO_COUNT ? ch_algo_name(k / CH_NPROTO) : "?";
    int w = snprintf(b + len, n - len, "%s%s/%s", strstr(b, "algSelection") ? "+" : ", algSelection ", a,
                     ch_proto_name(k % CH_NPROTO));
    if (w > 0) len = len + (size_t)w < n ? len + (size_t)w : n - 1;
  }
}

/* Calls as messages name them (header fields come from peers: every one is bounded here):
 * "AllReduce(1048576 x float32, sum) #17", "Broadcast(4 x int32, root 1) #3", "Send/Recv(8 x float32)",
 * "AllToAllv(8 x float32 from rank 0 to rank 1)". */
void algo_call_text(char* b, size_t n, const struct xfer_hdr* h) {
  unsigned long long cnt = (unsigned long long)h->count, seq = (unsigned long long)h->seq;
  const char* ty = type_name(h->type & XFER_TYPE_MASK);
  int f = h->func < FUNC_COUNT ? (int)h->func : -1;
  const char* fn = ch_func_text(f);
  /* every op from ncclNumOps up is a PreMulSum */
  uint32_t base = h->op & ((1u << XFER_OP_REPRO_SHIFT) - 1);
  uint32_t level = (h->op >> XFER_OP_REPRO_SHIFT) & ((1u << (XFER_OP_SEL_SHIFT - XFER_OP_REPRO_SHIFT)) - 1);
  const char* op = ch_op_name(base < ncclNumOps ? (int)base : ncclNumOps);
  char lv[96];
  snprintf(lv, sizeof lv, "%s", level == 1 ? ", reproducible order" : level == 2 ? ", reproducible exact" : level ? ", ?" : "");
  sel_text(lv, sizeof lv, h->op >> XFER_OP_SEL_SHIFT);
  uint32_t wf = h->type >> XFER_TYPE_WIRE_SHIFT;
  if (wf) {
    size_t len = strlen(lv);
    snprintf(lv + len, sizeof lv - len, ", wire %s", wire_name((int)(wf & 0xff)));
  }
  switch (f) {
    case FUNC_ALLREDUCE:
    case FUNC_REDUCESCATTER: snprintf(b, n, "%s(%llu x %s, %s%s) #%llu", fn, cnt, ty, op, lv, seq); break;
    case FUNC_REDUCE: snprintf(b, n, "%s(%llu x %s, %s%s, root %d) #%llu", fn, cnt, ty, op, lv, h->root, seq); break;
    case FUNC_BROADCAST: snprintf(b, n, "%s(%llu x %s, root %d) #%llu", fn, cnt, ty, h->root, seq); break;
    case FUNC_ALLGATHER: snprintf(b, n, "%s(%llu x %s) #%llu", fn, cnt, ty, seq); break;
    case FUNC_SENDRECV: snprintf(b, n, "%s(%llu x %s)", fn, cnt, ty); break;
    case FUNC_ALLTOALL: snprintf(b, n, "%s(%llu x %s per rank)", fn, cnt, ty); break;
    case FUNC_ALLTOALLV: /* one pair's block: root sends it, op (the receiver's rank) takes it (core/plan.c) */
      snprintf(b, n, "%s(%llu x %s from rank %d to rank %d)", fn, cnt, ty, h->root, (int)h->op);
      break;
    case FUNC_GATHER:
    case FUNC_SCATTER: snprintf(b, n, "%s(%llu x %s, root %d)", fn, cnt, ty, h->root); break;
    default: snprintf(b, n, "an unknown call (%u)", (unsigned)h->func); break;
  }
}
