/* Ranks of one host whose device buffers are not shared directly (on different GPUs, or
 * CHORUS_CUDA_RELAY=1): collectives relay through pinned host memory that every rank maps (the rings
 * after the shared page's boards, gpu.h), chunk by chunk, with no host thread on the data's way.
 *
 * A call is cut into pieces of one ring entry each (ReduceScatter, AlltoAll, Scatter's root: a slice of
 * every block side by side). Each
 * rank's own CUDA stream copies its input's pieces into its ring (the copy engine, device to host)
 * and counts them in its `in` word. The rank's consuming stream (relay_stream) waits for the
 * producers' `in`, then reduces the piece from every ring with Chorus's kernel straight into the
 * rank's own receive buffer (AllReduce, ReduceScatter, Reduce's root), or copies what it needs there
 * (AllGather, AlltoAll, Gather's root, Broadcast, Scatter: host to device), and counts it in its
 * `used` word. A producer refills an entry only once
 * every rank has used the piece before in it. Copies in, reductions and copies out of different
 * pieces overlap; the host only queues work, and the CPU never touches the data.
 *
 * What the ranks must agree on (function, count, type, op, root) is checked by the bridge through the
 * exchange of descriptions the direct path uses (gpu/resolve.c); a difference fails the communicator,
 * which lets every stream past its waits (gpu_unblock) and voids the tables its kernels read. Memory
 * stays safe meanwhile: every offset comes from this rank's own call and stays within the ring
 * entries, which are alike on every rank (rank 0's chunk and depth).
 *
 * Fields: relay_next is advanced by the comm's owner at launch and read by gpu_unblock (any thread);
 * the words are written by streams (and gpu_unblock), read by streams. */
#include <stddef.h>
#include <string.h>

#include "../misc/log.h"
#include "../misc/utils.h"
#include "../algo/algo.h"
#include "gpu.h"

ch_status gpu_relay_setup(struct gpu_comm* g) {
  CHECK(cudev_stream_new(&g->relay_stream, g->ctx));
  for (int i = 0; i < 2; i++) CHECK(cudrv_event_new(&g->relay_ev[i], g->ctx));
  return CH_OK;
}

void gpu_relay_free(struct gpu_comm* g) {
  for (int i = 0; i < 2; i++)
    if (g->relay_ev[i]) cudrv_event_free(g->relay_ev[i], g->ctx), g->relay_ev[i] = NULL;
  if (g->relay_stream) cudev_stream_free(g->relay_stream, g->ctx), g->relay_stream = NULL;
}

static struct gpu_relay_words* words(struct gpu_comm* g, int r) {
  return (struct gpu_relay_words*)((char*)g->seg + gpu_relay_off(g->n, r));
}

void gpu_relay_unblock(struct gpu_comm* g) {
  if (!g->relay || !g->seg) return;
  /* Far ahead of any piece a peer waits for: its numbers differ from this rank's by less than this
   * only where the calls matched so far (a mismatch is found within one call). */
  uint32_t v = atomic_load_explicit(&g->relay_next, memory_order_acquire) + 0x40000000u;
  for (int r = 0; r < g->n; r++) {
    atomic_store_explicit(&words(g, r)->in, v, memory_order_release);
    atomic_store_explicit(&words(g, r)->used, v, memory_order_release);
  }
}

static void* word_dev(struct gpu_comm* g, int r, int used) {
  size_t field = used ? offsetof(struct gpu_relay_words, used) : offsetof(struct gpu_relay_words, in);
  return (char*)g->seg_dev + gpu_relay_off(g->n, r) + field;
}
static size_t ring(const struct gpu_comm* g, int r, uint32_t piece) {
  return gpu_ring_off(g->n, r, piece % g->relay_depth, g->relay_chunk, g->relay_depth);
}

/* The bridge, once every rank's call is checked (gpu/resolve.c): this rank's table for call c, every
 * peer's ring as mapped here and its own receive buffer (its own input's entry is written per piece:
 * reduce_piece). */
void gpu_relay_table(struct gpu_comm* g, const struct gpu_call* c, struct dev_table* tab) {
  for (int r = 0; r < g->n; r++) {
    /* not this rank's own entry: only its consuming stream writes that one (a failure lets the stream
     * past its wait for this table while the bridge may still be here) */
    if (r != g->rank) tab->buf[DEV_SEND][r] = (uintptr_t)g->seg_dev + ring(g, r, 0);
    tab->scalar[r] = c->all[r].scalar; /* PreMulSum: each rank's (only ever multiplies data) */
  }
  tab->buf[DEV_RECV][g->rank] = (uintptr_t)c->ptr[DEV_RECV];
}

/* At enqueue: whether this rank's buffer p can be read and written by its kernels and copies (device
 * memory of the communicator's context, aligned to its elements), said in its description so that
 * every rank's bridge fails the call alike, naming it. */
void gpu_relay_describe(struct gpu_comm* g, const void* p, size_t esize, struct gpu_buf_desc* d) {
  uintptr_t base;
  size_t size;
  void* ctx = NULL;
  int dev = -1, cu = cudev_describe(p, &ctx, &dev, &base, &size, &d->id);
  d->present = 1;
  d->foreign = cu || (ctx ? ctx != g->ctx : dev != g->ordinal);
  d->misaligned = esize && (uintptr_t)p % esize;
}

static int usable(const struct gpu_call* c, int b) {
  return !c->ptr[b] || (!c->mine.buf[b].foreign && !c->mine.buf[b].misaligned);
}

/* The kernel reducing one piece (elements at `off` of every rank's block, `len` of them) from the
 * peers' ring entries and this rank's own input, in its device memory, into its receive buffer: so
 * the GPU reads over PCIe only what the peers sent (on 2 ranks as much as it copied out, each way at
 * once). Job offsets are one for all sources, so the stream itself first points the table's entry
 * for this rank at its input, moved back by the ring entry's offset (two 32-bit writes, in order
 * before the kernel). */
static ch_status reduce_piece(struct gpu_comm* g, struct gpu_memops* o, const struct gpu_call* c, uint32_t piece,
                              size_t off, size_t len, size_t block) {
  size_t E = red_type_size(c->type), entry = ring(g, 0, piece) - ring(g, 0, 0);
  size_t in_entry = c->func == FUNC_REDUCESCATTER ? (size_t)g->rank * len * E : 0;
  uint64_t mine = (uintptr_t)c->ptr[DEV_SEND] + ((size_t)g->rank * block + off) * E - entry - in_entry;
  char* own = (char*)gpu_table_dev(g, c->seq) + offsetof(struct dev_table, buf) + (size_t)g->rank * sizeof(uint64_t);
  gpu_memop(o, own, (uint32_t)mine, 0); /* buf[DEV_SEND][rank], little-endian halves */
  gpu_memop(o, own + 4, (uint32_t)(mine >> 32), 0);
  CHECK(gpu_flush(o));
  struct dev_args a;
  gpu_args_init(g, c, &a);
  uint32_t all = g->n == 32 ? 0xffffffffu : (1u << g->n) - 1;
  /* the ring entry's offset is alike in every rank's ring */
  gpu_job(&a, DEV_REDUCE, all, DEV_SEND, entry + in_entry, 1u << g->rank, DEV_RECV, off * E, len);
  return gpu_launch_jobs(g, &a, g->stage_dev, c->seq, g->relay_stream);
}

/* A call's stream part. Its pieces are queued interleaved (piece k's copy in on the call's stream,
 * then piece k's consumption on the consuming stream), so that even where the two streams share one
 * hardware queue (CUDA_DEVICE_MAX_CONNECTIONS=1) the order they were queued in can run: each wait
 * there is for a piece queued before it, here or at a peer. */
ch_status gpu_relay_queue(struct gpu_comm* g, const struct gpu_call* c) {
  int n = g->n, me = g->rank, f = c->func;
  size_t E = red_type_size(c->type), C = c->count, align = E >= 16 ? 1 : 16 / E;
  /* A producer's piece holds a slice of each of its n blocks side by side where each rank takes
   * another block (ReduceScatter, AlltoAll, Scatter's root), else a slice of its one input. */
  int blocks = f == FUNC_REDUCESCATTER || f == FUNC_ALLTOALL || f == FUNC_SCATTER ? n : 1;
  size_t P = g->relay_chunk / (size_t)blocks / E / align * align;
  uint64_t K = UT_DIV_UP(C, P);
  if (K > (1u << 28)) { /* the pieces' numbers are compared cyclically */
    WARN("%s: %zu elements are more than the relay's %llu chunks of %zu bytes (rank %d): raise CHORUS_CUDA_RELAY_CHUNK",
         algo_fname(f), C, (unsigned long long)(1u << 28), g->relay_chunk, me);
    return CH_INVALID_ARG;
  }
  uint32_t base = atomic_fetch_add_explicit(&g->relay_next, (uint32_t)K, memory_order_acq_rel), R = g->relay_depth;
  /* A buffer the bridge will refuse (every rank fails, naming it) is not touched: only the counters move. */
  int ok = usable(c, DEV_SEND) && usable(c, DEV_RECV);
  int rooted = f == FUNC_BROADCAST || f == FUNC_SCATTER; /* only the root's ring holds data */
  int produce = !rooted || me == c->root;
  int reduce = f == FUNC_ALLREDUCE || f == FUNC_REDUCESCATTER || (f == FUNC_REDUCE && me == c->root);
  int copy_out = f == FUNC_ALLGATHER || f == FUNC_ALLTOALL || rooted || (f == FUNC_GATHER && me == c->root);
  const char* send = c->ptr[DEV_SEND];
  char* recv = (char*)c->ptr[DEV_RECV];
  cudaStream_t u = c->stream, s = g->relay_stream;
  CHECK(gpu_follow(g, u));
  /* The consuming stream writes the receive buffer: after what the application queued before. */
  CHECK(cudrv_event_record(g->relay_ev[0], u, g->ctx));
  CHECK(cudrv_event_wait(s, g->relay_ev[0], g->ctx));
  struct gpu_memops in = {.g = g, .s = u}, out = {.g = g, .s = s};
  /* Kernels only once the bridge has checked every rank's call and filled the table (or failed). */
  if (reduce) gpu_memop(&out, (char*)g->priv_dev + offsetof(struct gpu_priv, ready), c->seq, 1);
  for (uint64_t k = 0; k < K; k++) {
    uint32_t piece = base + (uint32_t)k;
    size_t off = k * P, len = UT_MIN(P, C - off);
    if (produce) { /* into this rank's ring, once every rank has used what was there */
      char* entry = (char*)g->seg + ring(g, me, piece);
      for (int r = 0; r < n; r++) gpu_memop(&in, word_dev(g, r, 1), piece - R + 1, 1);
      CHECK(gpu_flush(&in));
      for (int b = 0; ok && b < blocks; b++)
        CHECK(cudrv_copy_async(1, entry + (size_t)b * len * E, (void*)(send + ((size_t)b * C + off) * E), len * E,
                               u, g->ctx));
      gpu_memop(&in, word_dev(g, me, 0), piece + 1, 0);
      CHECK(gpu_flush(&in));
    }
    if (reduce || copy_out) { /* out of the rings that hold it */
      for (int r = 0; r < n; r++)
        if (!rooted || r == c->root) gpu_memop(&out, word_dev(g, r, 0), piece + 1, 1);
      CHECK(gpu_flush(&out));
    }
    if (reduce && ok) CHECK(reduce_piece(g, &out, c, piece, off, len, f == FUNC_REDUCESCATTER ? C : 0));
    for (int r = 0; copy_out && ok && r < n; r++) { /* from rank r's ring: its slice, or my block of it */
      if (rooted && r != c->root) continue;
      size_t from = blocks > 1 ? (size_t)me * len * E : 0;
      size_t to = rooted ? off : (size_t)r * C + off; /* AllGather, AlltoAll, Gather: block r of mine */
      CHECK(cudrv_copy_async(0, (char*)g->seg + ring(g, r, piece) + from, recv + to * E, len * E, s, g->ctx));
    }
    gpu_memop(&out, word_dev(g, me, 1), piece + 1, 0); /* even with nothing done: the producers wait for it */
    CHECK(gpu_flush(&out));
  }
  /* What the application queues next on its stream comes after the consuming stream's part. */
  CHECK(cudrv_event_record(g->relay_ev[1], s, g->ctx));
  CHECK(cudrv_event_wait(u, g->relay_ev[1], g->ctx));
  if (!produce) gpu_memop(&in, word_dev(g, me, 0), base + (uint32_t)K, 0); /* numbered on alike */
  gpu_memop(&in, gpu_slot_done_dev(g, c->seq), c->seq, 0);
  CHECK(gpu_flush(&in));
  return gpu_done(g, u);
}
