/* Dispatch from an operation to its algorithm file. */
#include "algo.h"

uint64_t algo_nsteps(const struct ch_op* op) {
  if (op->algo == ALGO_DIRECT) return 3;
  if (op->func == FUNC_SEND || op->func == FUNC_RECV) return p2p_nsteps(op);
  if (op->nranks == 1) return local_nsteps(op);
  switch (op->func) {
    case FUNC_ALLREDUCE: return op->algo == ALGO_EXCHANGE ? exchange_allreduce_nsteps(op) : ring_allreduce_nsteps(op);
    case FUNC_ALLGATHER: return ring_allgather_nsteps(op);
    case FUNC_REDUCESCATTER: return ring_reducescatter_nsteps(op);
    case FUNC_BROADCAST: return ring_broadcast_nsteps(op);
    case FUNC_REDUCE: return ring_reduce_nsteps(op);
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
      else ring_allreduce_step(op, idx, p);
      break;
    case FUNC_ALLGATHER: ring_allgather_step(op, idx, p); break;
    case FUNC_REDUCESCATTER: ring_reducescatter_step(op, idx, p); break;
    case FUNC_BROADCAST: ring_broadcast_step(op, idx, p); break;
    case FUNC_REDUCE: ring_reduce_step(op, idx, p); break;
    default: break;
  }
}
