/* Dispatch from an operation to its algorithm file. */
#include <stdio.h>

#include "algo.h"

uint64_t algo_nsteps(const struct ch_op* op) {
  if (op->algo == ALGO_DIRECT) return 3;
  if (op->func == FUNC_SEND || op->func == FUNC_RECV) return p2p_nsteps(op);
  if (op->nranks == 1) return local_nsteps(op);
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

int algo_uses_peers(int algo) { return algo == ALGO_RECDBL || algo == ALGO_TREE || algo == ALGO_RABEN; }

const char* algo_name(int algo) {
  static const char* names[] = {"Tree", "Ring", "Exchange", "Direct", "RecDbl", "Rabenseifner"};
  _Static_assert(sizeof(names) / sizeof(names[0]) == ALGO_COUNT, "a name for every algorithm");
  return algo >= 0 && algo < ALGO_COUNT ? names[algo] : "?";
}

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

static const char* type_name(uint32_t t) {
  static const char* names[] = {"int8",    "uint8",   "int32",   "uint32",   "int64",     "uint64",
                                "float16", "float32", "float64", "bfloat16", "fp8e4m3", "fp8e5m2"};
  return t < sizeof(names) / sizeof(names[0]) ? names[t] : "invalid type";
}

static const char* op_name(uint32_t op) {
  static const char* names[] = {"sum", "prod", "max", "min", "avg"};
  return op < sizeof(names) / sizeof(names[0]) ? names[op] : "premulsum";
}

/* Calls as messages name them (header fields come from peers: every one is bounded here):
 * "AllReduce(1048576 x float32, sum) #17", "Broadcast(4 x int32, root 1) #3", "Send/Recv(8 x float32)". */
void algo_call_text(char* b, size_t n, const struct xfer_hdr* h) {
  unsigned long long cnt = (unsigned long long)h->count, seq = (unsigned long long)h->seq;
  const char* ty = type_name(h->type);
  int f = h->func < FUNC_COUNT ? (int)h->func : -1;
  switch (f) {
    case FUNC_ALLREDUCE:
    case FUNC_REDUCESCATTER:
      snprintf(b, n, "%s(%llu x %s, %s) #%llu", f == FUNC_ALLREDUCE ? "AllReduce" : "ReduceScatter", cnt, ty,
               op_name(h->op), seq);
      break;
    case FUNC_REDUCE:
      snprintf(b, n, "Reduce(%llu x %s, %s, root %d) #%llu", cnt, ty, op_name(h->op), h->root, seq);
      break;
    case FUNC_BROADCAST: snprintf(b, n, "Broadcast(%llu x %s, root %d) #%llu", cnt, ty, h->root, seq); break;
    case FUNC_ALLGATHER: snprintf(b, n, "AllGather(%llu x %s) #%llu", cnt, ty, seq); break;
    case FUNC_SENDRECV: snprintf(b, n, "Send/Recv(%llu x %s)", cnt, ty); break;
    case FUNC_ALLTOALL: snprintf(b, n, "AlltoAll(%llu x %s per rank)", cnt, ty); break;
    case FUNC_GATHER:
    case FUNC_SCATTER:
      snprintf(b, n, "%s(%llu x %s, root %d)", f == FUNC_GATHER ? "Gather" : "Scatter", cnt, ty, h->root);
      break;
    default: snprintf(b, n, "an unknown call (%u)", (unsigned)h->func); break;
  }
}

