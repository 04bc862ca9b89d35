/* broadcast_perf: ncclBroadcast from -r (every root in turn with -r -1). busbw = algbw: the root's
 * link carries every byte once. */
#include "common.h"

static void init(const perf_buf* b) {
  /* In place the buffer is both input (root) and output (others): only the root holds data. */
  if (b->rank == b->root) perf_fill(b->send, b->count, b->type, PERF_COPY, b->seed, 0, b->root, b->nranks);
  if (!b->in_place || b->rank != b->root) perf_zero(b->recv, b->count, b->type);
}

static int64_t check(const perf_buf* b) {
  return perf_check_copied(b->recv, b->count, b->type, b->seed, 0, b->root, b->nranks);
}

static ncclResult_t run(const perf_buf* b, ncclRedOp_t op, ncclComm_t comm, cudaStream_t s, int round) {
  (void)op, (void)round;
  return ncclBroadcast(b->send, b->recv, b->count, b->type, b->root, comm, s);
}

static const perf_coll coll = {"broadcast", PERF_USES_ROOT, perf_layout_flat, perf_bytes_flat, perf_factor_one,
                               init, check, run, NULL};

int main(int argc, char** argv) { return perf_main(argc, argv, &coll); }
