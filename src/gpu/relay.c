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
   * only where the calls matched so far (a mismatch is found within one call). A captured call's
   * pieces count from 0, and a call has fewer than 2^28. */
  uint32_t v = atomic_load_explicit(&g->relay_next, memory_order_acquire) + 0x40000000u;
  for (int r = 0; r < g->n; r++) {
    atomic_store_explicit(&words(g, r)->in, v, memory_order_release);
    atomic_store_explicit(&words(g, r)->used, v, memory_order_release);
    atomic_store_explicit(&words(g, r)->gin, 0x40000000u, memory_order_release);
    atomic_store_explicit(&words(g, r)->gused, 0x40000000u, memory_order_release);
  }
}

/* Rank r's counter: `in` or `used`, or (graph) `gin` or `gused`. */
static void* word_dev(struct gpu_comm* g, int r, int used, int graph) {
  size_t field = graph ? (used ? offsetof(struct gpu_relay_words, gused) : offsetof(struct gpu_relay_words, gin))
                       : (used ? offsetof(struct gpu_relay_words, used) : offsetof(struct gpu_relay_words, in));
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
  /* a captured call's own table (and staging entry), else its ring slot's */
  char* tab = c->gc ? (char*)c->gc->tab_dev : (char*)gpu_table_dev(g, c->seq);
  char* own = tab + offsetof(struct dev_table, buf) + (size_t)g->rank * sizeof(uint64_t);
  gpu_memop(o, own, (uint32_t)mine, 0); /* buf[DEV_SEND][rank], little-endian halves */
  gpu_memop(o, own + 4, (uint32_t)(mine >> 32), 0);
  CHECK(gpu_flush(o));
  struct dev_args a;
  gpu_args_init(g, c, &a);
  if (c->gc) a.table = (uint64_t)(uintptr_t)tab, a.seq = c->gc->id;
  uint32_t all = g->n == 32 ? 0xffffffffu : (1u << g->n) - 1;
  /* the ring entry's offset is alike in every rank's ring */
  dev_job_add(&a, DEV_REDUCE, all, DEV_SEND, entry + in_entry, 1u << g->rank, DEV_RECV, off * E, len);
  return c->gc ? gpu_launch_jobs(g, &a, c->gc->staged_dev, 0, o->s) : gpu_launch_jobs(g, &a, g->stage_dev, c->seq, o->s);
}

/* How a call is cut and who does what (gpu_relay_queue, gpu_relay_queue_graph). */
struct relay_plan {
  int blocks;           /* per piece: a slice of each of n blocks (ReduceScatter, AlltoAll, Scatter), else 1 */
  size_t P;             /* elements per block slice */
  uint64_t K;           /* pieces */
  int ok;               /* both buffers usable: else only the counters move */
  int rooted, produce, reduce, copy_out;
};

static ch_status plan(struct gpu_comm* g, const struct gpu_call* c, struct relay_plan* p) {
  int n = g->n, me = g->rank, f = c->func;
  size_t E = red_type_size(c->type), C = c->count, align = E >= 16 ? 1 : 16 / E;
  /* A producer's piece holds a slice of each of its n blocks side by side where each rank takes
   * another block (ReduceScatter, AlltoAll, Scatter's root), else a slice of its one input. */
  p->blocks = f == FUNC_REDUCESCATTER || f == FUNC_ALLTOALL || f == FUNC_SCATTER ? n : 1;
  p->P = g->relay_chunk / (size_t)p->blocks / E / align * align;
  p->K = UT_DIV_UP(C, p->P);
  if (p->K > (1u << 28)) { /* the pieces' numbers are compared cyclically */
    WARN("%s: %zu elements are more than the relay's %llu chunks of %zu bytes (rank %d): raise CHORUS_CUDA_RELAY_CHUNK",
         algo_fname(f), C, (unsigned long long)(1u << 28), g->relay_chunk, me);
    return CH_INVALID_ARG;
  }
  /* A buffer the bridge will refuse (every rank fails, naming it) is not touched: only the counters move. */
  p->ok = usable(c, DEV_SEND) && usable(c, DEV_RECV);
  p->rooted = f == FUNC_BROADCAST || f == FUNC_SCATTER; /* only the root's ring holds data */
  p->produce = !p->rooted || me == c->root;
  p->reduce = f == FUNC_ALLREDUCE || f == FUNC_REDUCESCATTER || (f == FUNC_REDUCE && me == c->root);
  p->copy_out = f == FUNC_ALLGATHER || f == FUNC_ALLTOALL || p->rooted || (f == FUNC_GATHER && me == c->root);
  return CH_OK;
}

/* Piece k of the call (number `piece` in its counters, which are the graph's where `graph`): into this
 * rank's ring on stream `in` once every rank has used what was there (piece - R before it), then out
 * of the rings that hold it on stream `out`, counted in `used` even with nothing done. */
static ch_status piece_queue(struct gpu_comm* g, const struct gpu_call* c, const struct relay_plan* p, uint64_t k,
                             uint32_t piece, int graph, struct gpu_memops* in, struct gpu_memops* out) {
  int n = g->n, me = g->rank;
  size_t E = red_type_size(c->type), C = c->count, off = k * p->P, len = UT_MIN(p->P, C - off);
  uint32_t R = g->relay_depth;
  const char* send = c->ptr[DEV_SEND];
  char* recv = (char*)c->ptr[DEV_RECV];
  if (p->produce) {
    char* entry = (char*)g->seg + ring(g, me, piece);
    /* a graph's count starts at 0: its first R pieces find their entries free */
    for (int r = 0; r < n && (!graph || piece >= R); r++) gpu_memop(in, word_dev(g, r, 1, graph), piece - R + 1, 1);
    CHECK(gpu_flush(in));
    for (int b = 0; p->ok && b < p->blocks; b++)
      CHECK(cudrv_copy_async(1, entry + (size_t)b * len * E, (void*)(send + ((size_t)b * C + off) * E), len * E,
                             in->s, g->ctx));
    gpu_memop(in, word_dev(g, me, 0, graph), piece + 1, 0);
    CHECK(gpu_flush(in));
  }
  if (p->reduce || p->copy_out) {
    for (int r = 0; r < n; r++)
      if (!p->rooted || r == c->root) gpu_memop(out, word_dev(g, r, 0, graph), piece + 1, 1);
    CHECK(gpu_flush(out));
  }
  if (p->reduce && p->ok)
    CHECK(reduce_piece(g, out, c, piece, off, len, c->func == FUNC_REDUCESCATTER ? C : 0));
  for (int r = 0; p->copy_out && p->ok && r < n; r++) { /* from rank r's ring: its slice, or my block of it */
    if (p->rooted && r != c->root) continue;
    size_t from = p->blocks > 1 ? (size_t)me * len * E : 0;
    size_t to = p->rooted ? off : (size_t)r * C + off; /* AllGather, AlltoAll, Gather: block r of mine */
    CHECK(cudrv_copy_async(0, (char*)g->seg + ring(g, r, piece) + from, recv + to * E, len * E, out->s, g->ctx));
  }
  gpu_memop(out, word_dev(g, me, 1, graph), piece + 1, 0);
  return gpu_flush(out);
}

/* A call's stream part. Its pieces are queued interleaved (piece k's copy in on the call's stream,
 * then piece k's consumption on the consuming stream), so that even where the two streams share one
 * hardware queue (CUDA_DEVICE_MAX_CONNECTIONS=1) the order they were queued in can run: each wait
 * there is for a piece queued before it, here or at a peer. */
ch_status gpu_relay_queue(struct gpu_comm* g, const struct gpu_call* c) {
  struct relay_plan p;
  CHECK(plan(g, c, &p));
  uint32_t base = atomic_fetch_add_explicit(&g->relay_next, (uint32_t)p.K, memory_order_acq_rel);
  cudaStream_t u = c->stream, s = g->relay_stream;
  CHECK(gpu_follow(g, u));
  /* The consuming stream writes the receive buffer: after what the application queued before. */
  CHECK(cudrv_event_record(g->relay_ev[0], u, g->ctx));
  CHECK(cudrv_event_wait(s, g->relay_ev[0], g->ctx));
  struct gpu_memops in = {.g = g, .s = u}, out = {.g = g, .s = s};
  /* Kernels only once the bridge has checked every rank's call and filled the table (or failed). */
  if (p.reduce) gpu_memop(&out, (char*)g->priv_dev + offsetof(struct gpu_priv, ready), c->seq, 1);
  for (uint64_t k = 0; k < p.K; k++) CHECK(piece_queue(g, c, &p, k, base + (uint32_t)k, 0, &in, &out));
  /* What the application queues next on its stream comes after the consuming stream's part. */
  CHECK(cudrv_event_record(g->relay_ev[1], s, g->ctx));
  CHECK(cudrv_event_wait(u, g->relay_ev[1], g->ctx));
  if (!p.produce) gpu_memop(&in, word_dev(g, g->rank, 0, 0), base + (uint32_t)p.K, 0); /* numbered on alike */
  gpu_memop(&in, gpu_slot_done_dev(g, c->seq), c->seq, 0);
  CHECK(gpu_flush(&in));
  return gpu_done(g, u);
}

/* A call captured into a CUDA graph (its table filled at capture: gpu/call.c). A replay repeats the
 * numbers it was captured with, so its pieces cannot be numbered on from the eager calls': they count
 * from 0 in the graph counters (gin, gused), which each rank zeroes before a barrier through the
 * call's first pair of graph words (gpu.h) that no rank passes while another still uses the rings for
 * what came before on its stream (an eager call, or another replay); a second barrier, on the second
 * pair (one setting of gpu_unblock then lets a replay through both), keeps what comes after off the
 * rings until every rank is done. The rings are shared with eager calls, so a replay must be in stream
 * order with the communicator's other calls (as the direct path's must). All on the application's
 * stream: a capture holds only what is queued on its stream (and streams joined to it), and on one
 * stream each wait is for a piece queued before it, here or at a peer. */
ch_status gpu_relay_queue_graph(struct gpu_comm* g, const struct gpu_call* c) {
  struct relay_plan p;
  CHECK(plan(g, c, &p));
  struct gpu_memops o = {.g = g, .s = c->stream};
  gpu_memop(&o, word_dev(g, g->rank, 0, 1), 0, 0);
  gpu_memop(&o, word_dev(g, g->rank, 1, 1), 0, 0);
  for (int half = 0; half < 2; half++) { /* a barrier: the start's, then (after the pieces) the end's */
    gpu_graph_gather(g, c->gc->index + (uint32_t)half, &o);
    gpu_graph_release(g, c->gc->index + (uint32_t)half, &o);
    CHECK(gpu_flush(&o));
    for (uint64_t k = 0; half == 0 && k < p.K; k++) CHECK(piece_queue(g, c, &p, k, (uint32_t)k, 1, &o, &o));
  }
  return CH_OK;
}
