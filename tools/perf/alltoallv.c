/* alltoallv_perf: ncclAllToAllv with uneven blocks (rccl-tests' alltoallv_perf, with a skew of our own).
 * Each rank sends S = n*b elements in all (b as alltoall_perf's count), split over its peers by the
 * distance d = (peer - rank) mod n: the block for distance d has about S * w(d) / sum(w) elements,
 * w a Zipf weight 1/(k+1) for the k that a seeded shuffle gives d (--split zipf, the default: a few
 * large blocks, many small ones, some empty), or S/n each (--split uniform: alltoall_perf's exchange).
 * The matrix is circulant, so every rank also receives S, and it is computed alike on every rank from
 * (S, n, --seed): counts agree. Blocks lie in peer order in both buffers. --grouped 1 runs the same
 * exchange as grouped ncclSend/ncclRecv, skipping empty blocks (as rccl-tests' fallback does).
 * algbw counts S elements, busbw = algbw * (n-1)/n, as rccl-tests. No in-place form. */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "common.h"
#include "zipf_split.h"

static void layout(size_t count, int n, int elt, perf_layout* l) {
  size_t b = perf_per_rank_count(count, n, elt);
  l->param_count = b;
  l->send_count = l->recv_count = b * (size_t)n;
  l->send_inplace = l->recv_inplace = 0;
}

/* One rank's view of a size step: the block per distance, and its arrays for the call. */
struct split {
  int rank, n, kind;
  unsigned seed;
  size_t total;
  size_t *by_dist, *sc, *sd, *rc, *rd; /* n each, one allocation */
};

static void blocks(struct split* s) {
  split_blocks(s->total, s->n, s->kind != PERF_SPLIT_UNIFORM, s->seed, s->by_dist);
}

/* Rank i's send displacement of its block for peer j: the blocks before it in peer order. */
static size_t send_displ(const struct split* s, int i, int j) {
  size_t at = 0;
  for (int q = 0; q < j; q++) at += s->by_dist[(q - i + s->n) % s->n];
  return at;
}

/* Cached per rank (a thread may drive several with -g): the timed loop computes nothing. Freed when
 * the thread ends (a key's destructor: the tool's rank threads exit before the process does). */
static __thread struct split* cache;
static __thread int ncache;
static pthread_key_t cache_key;
static pthread_once_t cache_once = PTHREAD_ONCE_INIT;
static void cache_free(void* unused) {
  (void)unused;
  for (int i = 0; i < ncache; i++) free(cache[i].by_dist);
  free(cache);
  cache = NULL, ncache = 0;
}
static void cache_key_make(void) { (void)pthread_key_create(&cache_key, cache_free); }

static const struct split* split_of(const perf_buf* b) {
  size_t total = b->count * (size_t)b->nranks;
  for (int i = 0; i < ncache; i++)
    if (cache[i].rank == b->rank) {
      if (cache[i].total == total) return &cache[i];
      free(cache[i].by_dist);
      memmove(&cache[i], &cache[i + 1], sizeof(*cache) * (size_t)(ncache - i - 1));
      ncache--;
      break;
    }
  pthread_once(&cache_once, cache_key_make);
  (void)pthread_setspecific(cache_key, (void*)1); /* any non-NULL value: the destructor frees this thread's */
  struct split* c = realloc(cache, sizeof(*cache) * (size_t)(ncache + 1));
  size_t* a = malloc(sizeof(size_t) * 5 * (size_t)b->nranks);
  if (!c || !a) abort();
  cache = c;
  int n = b->nranks, me = b->rank;
  struct split* s = &cache[ncache++];
  *s = (struct split){me, n, b->opts->split, b->opts->seed, total, a, a + n, a + 2 * n, a + 3 * n, a + 4 * n};
  blocks(s);
  for (int p = 0; p < n; p++) {
    s->sc[p] = s->by_dist[(p - me + n) % n], s->rc[p] = s->by_dist[(me - p + n) % n];
    s->sd[p] = p ? s->sd[p - 1] + s->sc[p - 1] : 0, s->rd[p] = p ? s->rd[p - 1] + s->rc[p - 1] : 0;
  }
  return s;
}

/* Rank r's send buffer is its pattern at indexes 0..S-1; the block from peer q sits at our rd[q]
 * and holds q's pattern from q's send displacement for us. */
static void init(const perf_buf* b) {
  perf_zero(b->recv, b->lay.recv_count, b->type);
  perf_fill(b->send, b->lay.send_count, b->type, PERF_COPY, b->seed, 0, b->rank, b->nranks);
}

static int64_t check(const perf_buf* b) {
  if (b->in_place) return -1;
  const struct split* s = split_of(b);
  int64_t wrong = 0;
  for (int q = 0; q < b->nranks; q++)
    wrong += perf_check_fill(perf_at(b->recv, s->rd[q], b->type), s->rc[q], b->type, PERF_COPY, b->seed,
                             send_displ(s, q, b->rank), q, b->nranks);
  return wrong;
}

static ncclResult_t run(const perf_buf* b, ncclRedOp_t op, ncclComm_t comm, cudaStream_t st, int round) {
  (void)op, (void)round;
  const struct split* s = split_of(b);
  if (!b->opts->grouped) return ncclAllToAllv(b->send, s->sc, s->sd, b->recv, s->rc, s->rd, b->type, comm, st);
  ncclResult_t r = ncclGroupStart(), e;
  if (r != ncclSuccess) return r;
  for (int p = 0; p < b->nranks && r == ncclSuccess; p++) {
    if (s->sc[p]) r = ncclSend(perf_at(b->send, s->sd[p], b->type), s->sc[p], b->type, p, comm, st);
    if (r == ncclSuccess && s->rc[p]) r = ncclRecv(perf_at(b->recv, s->rd[p], b->type), s->rc[p], b->type, p, comm, st);
  }
  e = ncclGroupEnd();
  return r != ncclSuccess ? r : e;
}

static const perf_coll coll = {
    "alltoallv", PERF_SPLITS | PERF_NO_INPLACE, layout, perf_bytes_ranks, perf_factor_ring, init, check, run, NULL};

int main(int argc, char** argv) { return perf_main(argc, argv, &coll); }
