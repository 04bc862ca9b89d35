/* The scale simulator's engine (sim.h). Every simulated rank holds the struct ch_op the library would
 * build for it (one channel: part = the whole vector) and walks algo_nsteps / algo_step exactly as the
 * engine does; a primitive's send lands in a FIFO of CH_STEPS slots on the connection to its peer (the
 * ring neighbour, or prim.in_peer / out_peer for the per-peer algorithms), its receive takes the
 * oldest step there, and a full FIFO holds the sender back, as transport FIFOs do.
 *
 * Time: ranks run in order of their clocks (a heap), so the NICs are granted in time order. A
 * primitive starts when its rank is free, its input has arrived and its output slot is free; a send
 * of b bytes occupies the rank for b / bw (and both hosts' NICs for b / nic_bw when it crosses hosts)
 * and arrives a later: per hop a + b / bw, the cost model's form (tune/choose.c), with the steps of
 * one message overlapping the latency of the previous.
 *
 * Check: element e of a rank's input stands for key(rank, e), a 64-bit hash; a message carries, per
 * element, the sum of the keys it combines and how many post-ops were applied; the result must equal
 * the sum over exactly the contributions it should hold, with one post-op for reductions. A source
 * read from the input must be premultiplied, one read from the result (a partial sum) must not. */
#include "sim.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../src/misc/param.h"
#include "../src/tune/topo.h"
#include "../src/tune/tune.h"

#define SB ((uintptr_t)1 << 40) /* where the input "lives": pointers are decoded, never read */
#define RB ((uintptr_t)1 << 41)

const char* sim_algo_name(int algo) { return algo == SIM_ALGO_RDAG ? "RecDblAG" : algo_name(algo); }

int sim_has(int func, int algo, int n) {
  if (algo == SIM_ALGO_RDAG) return func == FUNC_ALLGATHER && n >= 2 && (n & (n - 1)) == 0;
  if (algo == ALGO_RING) return func == FUNC_ALLREDUCE || func == FUNC_ALLGATHER || func == FUNC_REDUCESCATTER;
  if (algo == ALGO_RECDBL || algo == ALGO_RABEN || algo == ALGO_TREE) return func == FUNC_ALLREDUCE && n > 2;
  return 0;
}

size_t sim_default_chunk(int algo, int proto, size_t esize) {
  static const enum param_id ids[CH_NPROTO] = {PARAM_LL_BUFFSIZE, PARAM_LL128_BUFFSIZE, PARAM_BUFFSIZE};
  static const size_t p2p_cap[CH_NPROTO] = {64u << 10, 256u << 10, 512u << 10}; /* core/init.c */
  size_t min = (size_t)CH_STEPS * 4096, b = (size_t)param_int(ids[proto]);
  if (b < min) b = min;
  b = (b + min - 1) / min * min;
  if (algo_uses_peers(algo) && b > p2p_cap[proto]) b = p2p_cap[proto];
  return prim_step_elems(proto, b / CH_STEPS, esize);
}

void sim_link_from_model(int proto, struct sim_link* l) {
  const struct tune_model* m = tune_model_get();
  l->a_intra = m->step_us[proto];
  l->bw_intra = m->copy_bw * m->proto_eff[proto] / 2.0; /* two copies per byte: into and out of the FIFO */
  l->a_inter = m->net_step_us;
  l->bw_inter = m->net_bw;
  l->nic_bw = m->net_bw;
  l->host_bw = 0; /* not in the cost model: chorus-sim --host-bw */
}

/* tune/trees.c's comm_build_trees for hosts of per_host consecutive ranks (the rings' grouping then
 * keeps rank order, so each host is a chain r, r+1, ...), computed for one rank without the O(n^2)
 * ring grouping; tests/test_sim.c compares it with comm_build_trees. */
void sim_trees(int n, int per_host, int r, struct algo_tree trees[2], int* ntrees, int* depth) {
  int nn = (n + per_host - 1) / per_host, node = r / per_host, first = node * per_host;
  int last = first + per_host - 1 < n - 1 ? first + per_host - 1 : n - 1;
  int prev = r > first ? r - 1 : -1, next = r < last ? r + 1 : -1;
  int ppn = per_host < n ? per_host : n, b = 1, d = 0;
  while (nn > 1 && b * 2 < nn) b *= 2, d++;
  *depth = (nn > 1 ? 1 + d : 0) + ppn - 1;
  *ntrees = nn > 1 ? 2 : 1;
  for (int t = 0; t < *ntrees; t++) {
    struct algo_tree* tr = &trees[t];
    tr->ndown = 0;
    tr->up = prev;
    if (prev < 0) {
      int up, d0, d1;
      topo_dtree(nn, node, t, &up, &d0, &d1);
      tr->up = up >= 0 ? up * per_host : -1;
      if (d0 >= 0) tr->down[tr->ndown++] = d0 * per_host;
      if (d1 >= 0) tr->down[tr->ndown++] = d1 * per_host;
    }
    if (next >= 0) tr->down[tr->ndown++] = next;
  }
}

/* The what-if AllGather (SIM_ALGO_RDAG): round k swaps the 2^k blocks of this rank's aligned group
 * with the partner's group, chunk by chunk, a send then a receive (both ends alike, so a FIFO of any
 * depth suffices); round 0 also copies the rank's own block into place. */
static uint64_t rdag_round_chunks(const struct ch_op* op, int k) {
  size_t e = ((size_t)1 << k) * op->count;
  return (e + op->chunk - 1) / op->chunk;
}
static uint64_t rdag_nsteps(const struct ch_op* op) {
  uint64_t s = 0;
  for (int k = 0; (1 << k) < op->nranks; k++) s += 2 * rdag_round_chunks(op, k);
  return s;
}
static void rdag_step(const struct ch_op* op, uint64_t idx, struct prim* p) {
  int k = 0;
  uint64_t c;
  while (idx >= 2 * (c = rdag_round_chunks(op, k))) idx -= 2 * c, k++;
  size_t g = (size_t)1 << k, e = g * op->count, j = idx / 2, o = j * op->chunk;
  int r = op->rank, partner = r ^ (int)g;
  size_t mine = (size_t)r & ~(g - 1), theirs = mine ^ g;
  *p = (struct prim){0};
  p->peers = 1;
  p->nelem = algo_min(op->chunk, e - o);
  if (idx % 2 == 0) {
    p->send = 1, p->out_peer = partner;
    p->src = k == 0 ? op->sendbuff + o * op->esize : op->recvbuff + (mine * op->count + o) * op->esize;
    if (k == 0) p->dst = op->recvbuff + (mine * op->count + o) * op->esize;
  } else {
    p->recv = 1, p->in_peer = partner;
    p->dst = op->recvbuff + (theirs * op->count + o) * op->esize;
  }
}
static uint64_t sim_nsteps(const struct ch_op* op) {
  return op->algo == SIM_ALGO_RDAG ? rdag_nsteps(op) : algo_nsteps(op);
}
static void sim_step(const struct ch_op* op, uint64_t idx, struct prim* p) {
  if (op->algo == SIM_ALGO_RDAG) rdag_step(op, idx, p);
  else algo_step(op, idx, p);
}

/* ---- the simulated transport ---- */

struct smsg {
  double arrive;
  size_t nelem;
  uint64_t* key; /* check mode: per element, the sum of the contributions' keys */
  uint8_t* post; /* and the post-ops applied */
};

struct sconn {
  int src, dst;        /* simulated ranks */
  uint64_t head, tail; /* steps sent, steps received */
  struct smsg q[CH_STEPS];
  double freed[CH_STEPS]; /* when the receiver took the step that last used each slot */
  int recv_waits, send_waits;
};

struct rk {
  struct ch_op op;
  struct algo_tree trees[2];
  uint64_t idx, nidx;
  double clock;
  struct sconn** in; /* connections into this rank */
  int nin, capin;
  int inheap;
};

struct sim {
  const struct sim_cfg* cfg;
  int n, nsim, per_host, periodic;
  struct rk* r;
  int* ring; /* ring order (tune/rings.c) */
  int* pos;  /* position of each rank in it */
  double *nic_out, *nic_in, *mem;
  int* heap;
  int nheap;
  /* check mode */
  uint64_t* res_key; /* [nsim][rlen] */
  uint8_t* res_post;
  size_t rlen;
  uint64_t prims;
  int corrupted; /* cfg->corrupt has been applied */
  int failed;
  char* why;
};

static uint64_t mix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}
/* The contribution of rank q to logical element g (AllReduce: g < count; the others: g < n x count). */
static uint64_t key_of(int q, uint64_t g) { return mix64((uint64_t)q << 40 ^ g); }

__attribute__((format(printf, 2, 3))) static void fail(struct sim* s, const char* fmt, ...) {
  if (s->failed++) return;
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(s->why, 256, fmt, ap);
  va_end(ap);
}

static int sim_rank_of(const struct sim* s, int rank) { return s->periodic ? rank % s->nsim : rank; }
static int host_of(const struct sim* s, int rank) { return rank / s->per_host; }

static struct sconn* conn_get(struct sim* s, int src, int dst, int make) {
  struct rk* d = &s->r[dst];
  for (int i = 0; i < d->nin; i++)
    if (d->in[i]->src == src) return d->in[i];
  if (!make) return NULL;
  if (d->nin == d->capin) {
    d->capin = d->capin ? 2 * d->capin : 2;
    d->in = realloc(d->in, sizeof(*d->in) * (size_t)d->capin);
    if (!d->in) abort();
  }
  struct sconn* c = calloc(1, sizeof(*c));
  if (!c) abort();
  c->src = src, c->dst = dst;
  d->in[d->nin++] = c;
  return c;
}

/* A heap of runnable simulated ranks by clock. */
static int heap_less(const struct sim* s, int a, int b) {
  double ca = s->r[a].clock, cb = s->r[b].clock;
  return ca < cb || (ca == cb && a < b);
}
static void heap_push(struct sim* s, int i) {
  if (s->r[i].inheap) return;
  s->r[i].inheap = 1;
  int k = s->nheap++;
  s->heap[k] = i;
  while (k > 0 && heap_less(s, s->heap[k], s->heap[(k - 1) / 2])) {
    int p = (k - 1) / 2, t = s->heap[p];
    s->heap[p] = s->heap[k], s->heap[k] = t, k = p;
  }
}
static int heap_pop(struct sim* s) {
  int top = s->heap[0];
  s->heap[0] = s->heap[--s->nheap];
  for (int k = 0;;) {
    int l = 2 * k + 1, m = k;
    if (l < s->nheap && heap_less(s, s->heap[l], s->heap[m])) m = l;
    if (l + 1 < s->nheap && heap_less(s, s->heap[l + 1], s->heap[m])) m = l + 1;
    if (m == k) break;
    int t = s->heap[m];
    s->heap[m] = s->heap[k], s->heap[k] = t, k = m;
  }
  s->r[top].inheap = 0;
  return top;
}

/* The value of a source element of rank `rank` (check mode). */
static void src_val(const struct sim* s, int i, int rank, uintptr_t at, uint64_t* key, uint8_t* post) {
  const struct sim_cfg* c = s->cfg;
  if (at >= RB) {
    size_t e = (at - RB) / c->esize;
    *key = s->res_key[(size_t)i * s->rlen + e], *post = s->res_post[(size_t)i * s->rlen + e];
    return;
  }
  size_t e = (at - SB) / c->esize;
  *post = 0;
  *key = key_of(rank, c->func == FUNC_ALLGATHER ? (uint64_t)rank * c->count + e : e);
}

/* Run rank i's next primitive: 1 done, 0 blocked (it is woken by the connection). */
static int step_one(struct sim* s, int i) {
  const struct sim_cfg* c = s->cfg;
  struct rk* me = &s->r[i];
  const struct ch_op* op = &me->op;
  struct prim p;
  sim_step(op, me->idx, &p);
  int rank = op->rank, n = s->n;
  int from = p.peers ? p.in_peer : s->ring[algo_mod(s->pos[rank] - 1, n)];
  int to = p.peers ? p.out_peer : s->ring[algo_mod(s->pos[rank] + 1, n)];
  struct sconn *cin = NULL, *cout = NULL;
  double t = me->clock;
  if (p.recv) {
    cin = conn_get(s, sim_rank_of(s, from), i, 1);
    if (cin->tail == cin->head) {
      cin->recv_waits = 1;
      return 0;
    }
    struct smsg* m = &cin->q[cin->tail % CH_STEPS];
    if (!s->periodic && m->nelem != p.nelem) {
      fail(s, "rank %d step %llu received %zu elements from rank %d where it expected %zu", rank,
           (unsigned long long)me->idx, m->nelem, from, p.nelem);
      return 0;
    }
    if (m->arrive > t) t = m->arrive;
  }
  if (p.send) {
    cout = conn_get(s, i, sim_rank_of(s, to), 1);
    if (cout->head - cout->tail >= CH_STEPS) {
      cout->send_waits = 1;
      return 0;
    }
    if (cout->head >= CH_STEPS && cout->freed[cout->head % CH_STEPS] > t) t = cout->freed[cout->head % CH_STEPS];
  }
  s->prims++;
  /* The data. */
  uint64_t* key = NULL;
  uint8_t* post = NULL;
  if (c->check && p.nelem) {
    key = malloc(p.nelem * sizeof(uint64_t));
    post = malloc(p.nelem);
    if (!key || !post) abort();
    int reduces = c->func != FUNC_ALLGATHER;
    int local = p.src && (p.reduce || !p.recv);
    int first_local = local && rank == n - 1 && !s->corrupted && (uintptr_t)p.src < RB;
    if (c->corrupt == 3 && first_local && p.premul) p.premul = 0, s->corrupted = 1;
    if (local && reduces) {
      int from_input = (uintptr_t)p.src < RB;
      if (from_input != (p.premul != 0))
        fail(s, "rank %d step %llu: a source read from its %s %s premultiplied", rank, (unsigned long long)me->idx,
             from_input ? "input" : "result", from_input ? "is not" : "is");
    }
    struct smsg* m = cin ? &cin->q[cin->tail % CH_STEPS] : NULL;
    if (c->corrupt == 1 && first_local) s->corrupted = 1; /* after this step's elements */
    for (size_t j = 0; j < p.nelem; j++) {
      uint64_t k = 0, lk = 0;
      uint8_t po = 0, lp = 0;
      if (m && !(c->corrupt == 2 && rank == 0 && cin->tail == 0)) k = m->key[j], po = m->post[j];
      if (local) {
        src_val(s, i, rank, (uintptr_t)p.src + j * c->esize, &lk, &lp);
        k += lk, po = (uint8_t)(po + lp);
        if (c->corrupt == 1 && first_local) k += lk;
      }
      if (p.postop) po++;
      key[j] = k, post[j] = po;
      if (p.dst) {
        size_t e = ((uintptr_t)p.dst - RB) / c->esize + j;
        if ((uintptr_t)p.dst < RB || e >= s->rlen) {
          fail(s, "rank %d step %llu writes outside its result (element %zu)", rank, (unsigned long long)me->idx, e);
          break;
        }
        s->res_key[(size_t)i * s->rlen + e] = k, s->res_post[(size_t)i * s->rlen + e] = po;
      }
    }
  }
  if (cin) {
    struct smsg* m = &cin->q[cin->tail % CH_STEPS];
    free(m->key), free(m->post);
    m->key = NULL, m->post = NULL;
    cin->freed[cin->tail % CH_STEPS] = t;
    cin->tail++;
    if (cin->send_waits) {
      cin->send_waits = 0;
      struct rk* w = &s->r[cin->src];
      if (w->clock < t) w->clock = t;
      heap_push(s, cin->src);
    }
  }
  if (cout) {
    double bytes = (double)p.nelem * (double)c->esize, start = t;
    int hs = host_of(s, rank), hd = host_of(s, to);
    int inter = hs != hd;
    if (inter) {
      if (s->periodic) hd = 0; /* the next host's NIC is this one's, shifted: the ring's symmetry */
      if (s->nic_out[hs] > start) start = s->nic_out[hs];
      if (s->nic_in[hd] > start) start = s->nic_in[hd];
      s->nic_out[hs] = s->nic_in[hd] = start + bytes / c->link.nic_bw;
    }
    double end = start + bytes / (inter ? c->link.bw_inter : c->link.bw_intra);
    if (!inter && c->link.host_bw > 0) { /* the host's ranks copy through one memory */
      double m0 = s->mem[hs] > start ? s->mem[hs] : start;
      s->mem[hs] = m0 + bytes / c->link.host_bw;
      if (s->mem[hs] > end) end = s->mem[hs];
    }
    struct smsg* m = &cout->q[cout->head % CH_STEPS];
    m->arrive = end + (inter ? c->link.a_inter : c->link.a_intra);
    m->nelem = p.nelem;
    m->key = key, m->post = post;
    key = NULL, post = NULL;
    cout->head++;
    t = end;
    if (cout->recv_waits) {
      cout->recv_waits = 0;
      struct rk* w = &s->r[cout->dst];
      if (w->clock < m->arrive) w->clock = m->arrive;
      heap_push(s, cout->dst);
    }
  }
  free(key), free(post);
  me->clock = t;
  me->idx++;
  return 1;
}

static void op_fill(struct sim* s, int i, int rank, size_t chunk) {
  const struct sim_cfg* c = s->cfg;
  struct rk* me = &s->r[i];
  struct ch_op* op = &me->op;
  memset(op, 0, sizeof(*op));
  op->func = c->func, op->algo = c->algo, op->proto = c->proto;
  op->sendbuff = (const char*)SB;
  op->recvbuff = (char*)RB;
  op->count = c->count, op->esize = c->esize;
  op->rank = rank, op->nranks = s->n;
  op->ring = s->ring, op->ring_index = s->pos[rank];
  op->part_off = 0, op->part_count = c->count;
  op->chunk = chunk;
  if (c->algo == ALGO_TREE) {
    int depth;
    sim_trees(s->n, s->per_host, rank, me->trees, &op->ntrees, &depth);
    op->trees = me->trees;
  }
  me->idx = 0;
  me->nidx = sim_nsteps(op);
}

static uint64_t total_steps(struct sim* s, size_t chunk) {
  uint64_t t = 0;
  for (int i = 0; i < s->nsim; i++) {
    op_fill(s, i, i, chunk);
    t += s->r[i].nidx;
  }
  return t;
}

int sim_run(const struct sim_cfg* c, struct sim_result* res) {
  memset(res, 0, sizeof(*res));
  if (c->n < 2 || c->per_host < 1 || !sim_has(c->func, c->algo, c->n) || c->esize == 0) {
    snprintf(res->why, sizeof(res->why), "Chorus does not run %s %s on %d ranks", sim_algo_name(c->algo),
             tune_func_name(c->func), c->n);
    return -1;
  }
  struct sim s = {.cfg = c, .n = c->n, .nsim = c->n, .per_host = c->per_host, .why = res->why};
  size_t chunk = c->chunk ? c->chunk : sim_default_chunk(c->algo, c->proto, c->esize);
  if (chunk < 8) chunk = 8;
  int n = c->n, nhosts = (n + c->per_host - 1) / c->per_host;
  s.ring = malloc(sizeof(int) * (size_t)n);
  s.pos = malloc(sizeof(int) * (size_t)n);
  s.r = calloc((size_t)n, sizeof(struct rk));
  s.heap = malloc(sizeof(int) * (size_t)n);
  s.nic_out = calloc((size_t)nhosts, sizeof(double));
  s.nic_in = calloc((size_t)nhosts, sizeof(double));
  s.mem = calloc((size_t)nhosts, sizeof(double));
  if (!s.ring || !s.pos || !s.r || !s.heap || !s.nic_out || !s.nic_in || !s.mem) abort();
  /* The rings' order (tune/rings.c). Hosts of consecutive ranks keep rank order; the grouping is
   * O(n^2), so it runs for what tests and --check need and is rank order beyond. */
  if (n <= 8192) {
    uint64_t* host = malloc(sizeof(uint64_t) * (size_t)n);
    if (!host) abort();
    for (int r = 0; r < n; r++) host[r] = (uint64_t)(r / c->per_host);
    topo_ring_order_fill(n, host, TOPO_ORDER_HOSTS, s.ring);
    free(host);
  } else {
    for (int r = 0; r < n; r++) s.ring[r] = r;
  }
  for (int q = 0; q < n; q++) s.pos[s.ring[q]] = q;

  int ringy = !algo_uses_peers(c->algo) && c->algo != SIM_ALGO_RDAG;
  int can_periodic = ringy && !c->check && n % c->per_host == 0 && n > c->per_host && c->periodic >= 0;
  uint64_t steps = total_steps(&s, chunk);
  if (can_periodic && (c->periodic > 0 || (c->budget && steps > c->budget))) {
    s.periodic = 1, s.nsim = c->per_host;
    steps = total_steps(&s, chunk);
  }
  res->coarsen = 1;
  while (!c->check && c->budget && steps > c->budget && chunk < ((size_t)1 << 40)) {
    chunk *= 2, res->coarsen *= 2;
    steps = total_steps(&s, chunk);
  }
  res->chunk = chunk, res->periodic = s.periodic;
  for (int i = 0; i < s.nsim; i++) op_fill(&s, i, i, chunk);

  if (c->check) {
    s.rlen = c->func == FUNC_ALLGATHER ? (size_t)n * c->count : c->count;
    s.res_key = calloc((size_t)s.nsim * s.rlen + 1, sizeof(uint64_t));
    s.res_post = calloc((size_t)s.nsim * s.rlen + 1, 1);
    if (!s.res_key || !s.res_post) {
      snprintf(res->why, sizeof(res->why), "no memory to check %d ranks x %zu elements", n, s.rlen);
      res->ok = 0;
      goto out;
    }
  }
  for (int i = 0; i < s.nsim; i++) heap_push(&s, i);
  while (s.nheap && !s.failed) {
    int i = heap_pop(&s);
    struct rk* me = &s.r[i];
    while (me->idx < me->nidx && !s.failed) {
      if (!step_one(&s, i)) break;
      if (s.nheap && me->clock > s.r[s.heap[0]].clock) { /* let an earlier rank take the NICs first */
        heap_push(&s, i);
        break;
      }
    }
  }
  res->prims = s.prims;
  res->ok = !s.failed;
  for (int i = 0; i < s.nsim && res->ok; i++) {
    if (s.r[i].clock > res->us) res->us = s.r[i].clock;
    if (s.r[i].idx < s.r[i].nidx) {
      snprintf(res->why, sizeof(res->why), "deadlock: rank %d stopped at step %llu of %llu", s.r[i].op.rank,
               (unsigned long long)s.r[i].idx, (unsigned long long)s.r[i].nidx);
      res->ok = 0;
    }
    for (int k = 0; k < s.r[i].nin && res->ok; k++)
      if (s.r[i].in[k]->head != s.r[i].in[k]->tail) {
        snprintf(res->why, sizeof(res->why), "rank %d left %llu step(s) from rank %d unread", s.r[i].op.rank,
                 (unsigned long long)(s.r[i].in[k]->head - s.r[i].in[k]->tail), s.r[i].in[k]->src);
        res->ok = 0;
      }
  }
  if (c->check && res->ok) { /* every result element: exactly the contributions it should hold */
    size_t cnt = c->count;
    uint64_t* want = NULL;
    if (c->func == FUNC_ALLREDUCE) {
      want = calloc(cnt + 1, sizeof(uint64_t));
      if (!want) abort();
      for (int q = 0; q < n; q++)
        for (size_t e = 0; e < cnt; e++) want[e] += key_of(q, e);
    }
    for (int i = 0; i < n && res->ok; i++) {
      for (size_t e = 0; e < s.rlen && res->ok; e++) {
        uint64_t w = 0;
        int wpost = c->func == FUNC_ALLGATHER ? 0 : 1;
        if (c->func == FUNC_ALLREDUCE) w = want[e];
        else if (c->func == FUNC_ALLGATHER) w = key_of((int)(e / cnt), e);
        else
          for (int q = 0; q < n; q++) w += key_of(q, (uint64_t)i * cnt + e);
        uint64_t got = s.res_key[(size_t)i * s.rlen + e];
        int gp = s.res_post[(size_t)i * s.rlen + e];
        if (got != w || gp != wpost) {
          snprintf(res->why, sizeof(res->why), "rank %d element %zu: %s (post-ops %d, want %d)", i, e,
                   got == w   ? "the right contributions"
                   : got == 0 ? "never written"
                              : "not exactly the contributions",
                   gp, wpost);
          res->ok = 0;
        }
      }
    }
    free(want);
  }
out:
  for (int i = 0; i < n; i++) {
    for (int k = 0; k < s.r[i].nin; k++) {
      for (int j = 0; j < CH_STEPS; j++) free(s.r[i].in[k]->q[j].key), free(s.r[i].in[k]->q[j].post);
      free(s.r[i].in[k]);
    }
    free(s.r[i].in);
  }
  free(s.r), free(s.ring), free(s.pos), free(s.heap), free(s.nic_out), free(s.nic_in), free(s.mem);
  free(s.res_key), free(s.res_post);
  return 0;
}
