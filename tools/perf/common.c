/* The measuring loop of the benchmarks, run by every thread for its ranks (nccl-tests' TimeTest and
 * BenchTime): warm up, time out-of-place then in-place for each size, combine times and wrong
 * element counts across all ranks, and let rank 0 print.
 *
 * There is no MPI: results are combined across threads and processes with the library itself, by
 * grouped ncclSend/ncclRecv (perf_team below), which also serves as the barrier. */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "harness.h"
#include "output.h"

uint64_t perf_now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static pthread_mutex_t fail_lock = PTHREAD_MUTEX_INITIALIZER;

/* A failed call: report it like nccl-tests and end the process. Other ranks of the job are most
 * likely blocked inside the library waiting for us, so unwinding them is not attempted; the
 * launcher (chorusrun, -np, mpirun) sees our exit and ends the rest. */
void perf_fail_msg(perf_ctx* ctx, int code, const char* fmt, ...) {
  pthread_mutex_lock(&fail_lock); /* the first failing thread reports; others wait for _exit */
  char host[256] = "?", msg[1024];
  gethostname(host, sizeof host);
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  if (ctx->is_main) out_abort(msg); /* ends a half-printed row, closes the JSON file */
  fflush(stdout);
  fprintf(stderr, "%s: %s\n", host, msg);
  fprintf(stderr, " .. %s pid %d: Test failure (exit code %d)\n", host, (int)getpid(), code);
  fflush(stderr);
  _exit(code);
}

void perf_fail_nccl(perf_ctx* ctx, ncclResult_t r, const char* what, const char* file, int line) {
  const char* last = ncclGetLastError(NULL);
  const char* base = strrchr(file, '/');
  perf_fail_msg(ctx, PERF_NCCL, "Test NCCL failure %s:%d '%s' (%s)%s%s", base ? base + 1 : file, line,
                ncclGetErrorString(r), what,
                last && *last ? ": " : "", last && *last ? last : "");
}

#define CK(call) PERF_NCCL_CHECK(th->ctx, call)

static void mark_progress(perf_thread* th) {
  uint64_t* n = &th->ctx->progress[th->thread].n;
  __atomic_store_n(n, __atomic_load_n(n, __ATOMIC_RELAXED) + 1, __ATOMIC_RELAXED);
}

/* ---- bookkeeping between ranks ----
 * Times, error counts, the barrier, device records and the unique id travel by grouped
 * ncclSend/ncclRecv over binomial trees rooted at rank 0 (log2(n) rounds, a few peers per rank), as
 * nccl-tests moves them over MPI. Never by a collective: NCCL_ALGO and NCCL_PROTO restrict those per
 * collective (NCCL_ALGO=Tree leaves AllGather no algorithm), and they must restrict only the
 * operation being timed. Send/recv take no algorithm, and of NCCL_PROTO only its entry without a
 * collective, which every collective without an entry of its own shares: only an entry that leaves the
 * transports no protocol ("^LL,LL128,Simple;allreduce:Simple", or "LL;allreduce:Simple" where the
 * network carries Simple only) stops the bookkeeping while the timed call could run.
 * All on the synchronous NULL stream: a group is done when ncclGroupEnd returns. A round is one group
 * over the team's ranks of this thread, which may be each other's peers. */
#define TEAM_CK(t, call) PERF_NCCL_CHECK((t)->ctx, call)

/* Rank 0 ends with op over every rank's n doubles, in its buffer; tmp: nlocal * n doubles. */
static void team_reduce(const perf_team* t, double* base, size_t stride, int n, ncclRedOp_t op, double* tmp) {
  for (int k = 1; k < t->nranks; k <<= 1) {
    TEAM_CK(t, ncclGroupStart());
    for (int i = 0; i < t->nlocal; i++) {
      int r = t->rank0 + i;
      if (r % (2 * k) == k) TEAM_CK(t, ncclSend(base + i * stride, (size_t)n, ncclFloat64, r - k, t->comms[i], NULL));
      else if (r % (2 * k) == 0 && r + k < t->nranks)
        TEAM_CK(t, ncclRecv(tmp + (size_t)i * n, (size_t)n, ncclFloat64, r + k, t->comms[i], NULL));
    }
    TEAM_CK(t, ncclGroupEnd());
    for (int i = 0; i < t->nlocal; i++) {
      int r = t->rank0 + i;
      if (r % (2 * k) || r + k >= t->nranks) continue;
      double *x = base + i * stride, *y = tmp + (size_t)i * n;
      for (int j = 0; j < n; j++)
        x[j] = op == ncclMax ? (y[j] > x[j] ? y[j] : x[j]) : op == ncclMin ? (y[j] < x[j] ? y[j] : x[j]) : x[j] + y[j];
    }
  }
}

void perf_team_bcast(const perf_team* t, char* base, size_t stride, size_t bytes) {
  int top = 1;
  while (top < t->nranks) top <<= 1;
  for (int k = top / 2; k >= 1; k >>= 1) {
    TEAM_CK(t, ncclGroupStart());
    for (int i = 0; i < t->nlocal; i++) {
      int r = t->rank0 + i;
      if (r % (2 * k) == 0 && r + k < t->nranks)
        TEAM_CK(t, ncclSend(base + i * stride, bytes, ncclUint8, r + k, t->comms[i], NULL));
      else if (r % (2 * k) == k)
        TEAM_CK(t, ncclRecv(base + i * stride, bytes, ncclUint8, r - k, t->comms[i], NULL));
    }
    TEAM_CK(t, ncclGroupEnd());
  }
}

/* Rank 0 ends with every rank's `bytes`, in rank order, in its buffer. Each buffer holds nranks x bytes
 * with its rank's own first: before round k a rank that takes part holds ranks [r, r + k). */
static void team_gather(const perf_team* t, char* base, size_t stride, size_t bytes) {
  for (int k = 1; k < t->nranks; k <<= 1) {
    TEAM_CK(t, ncclGroupStart());
    for (int i = 0; i < t->nlocal; i++) {
      int r = t->rank0 + i, held;
      if (r % (2 * k) == k) { /* ranks [r, r + k), fewer at the end */
        held = t->nranks - r < k ? t->nranks - r : k;
        TEAM_CK(t, ncclSend(base + i * stride, (size_t)held * bytes, ncclUint8, r - k, t->comms[i], NULL));
      } else if (r % (2 * k) == 0 && r + k < t->nranks) {
        held = t->nranks - (r + k) < k ? t->nranks - (r + k) : k;
        TEAM_CK(t, ncclRecv(base + i * stride + (size_t)k * bytes, (size_t)held * bytes, ncclUint8, r + k,
                            t->comms[i], NULL));
      }
    }
    TEAM_CK(t, ncclGroupEnd());
  }
}

static perf_team team_of(perf_thread* th) {
  return (perf_team){.ctx = th->ctx, .comms = th->comms, .nlocal = th->nlocal, .rank0 = th->rank0,
                     .nranks = th->ctx->nranks};
}

/* Every local rank's n doubles (scratch) become their combination (op: sum, min or max) over all ranks. */
static void combine(perf_thread* th, int n, ncclRedOp_t op) {
  perf_team t = team_of(th);
  size_t stride = (size_t)th->scratch_len;
  team_reduce(&t, th->scratch, stride, n, op, th->inbox);
  perf_team_bcast(&t, (char*)th->scratch, stride * sizeof(double), (size_t)n * sizeof(double));
  mark_progress(th);
}

static void barrier(perf_thread* th) {
  for (int i = 0; i < th->nlocal; i++) th->scratch[(size_t)i * th->scratch_len] = 0;
  combine(th, 1, ncclSum);
}

/* Every local rank contributes x[0..n); each becomes its combination over all ranks
 * (-a: 0 rank 0's value, 1 average, 2 minimum, 3 maximum). */
static void combine_values(perf_thread* th, double* x, int n, int how) {
  for (int i = 0; i < th->nlocal; i++)
    for (int k = 0; k < n; k++)
      th->scratch[(size_t)i * th->scratch_len + k] = (how == 0 && th->rank0 + i != 0) ? 0 : x[k];
  combine(th, n, how == 2 ? ncclMin : how == 3 ? ncclMax : ncclSum);
  for (int k = 0; k < n; k++) x[k] = how == 1 ? th->scratch[k] / th->ctx->nranks : th->scratch[k];
}

static void complete(perf_thread* th) {
  for (int i = 0; i < th->nlocal; i++)
    if (th->ctx->o.device) perf_cuda_sync(th->ctx, th->streams[i]); /* NULL: the legacy stream */
    else if (th->streams[i]) CK(chorusStreamSynchronize(th->streams[i]));
  mark_progress(th);
}

/* -z 1 and 2: wait for each operation (1: and for every rank's) before the next. */
static void wait_blocking(perf_thread* th) {
  if (th->ctx->o.blocking != 1 && th->ctx->o.blocking != 2) return;
  complete(th);
  if (th->ctx->o.blocking == 1) barrier(th);
}

/* One size step: counts and the bytes each op's buffers span (for the per-iteration shift). */
struct step {
  perf_layout lay;
  ncclDataType_t type;
  int op, root;
  size_t span;
};

static void set_step(perf_thread* th, struct step* s, size_t bytes) {
  int elt = perf_type_size(s->type);
  th->ctx->coll->layout(bytes / (size_t)elt, th->ctx->nranks, elt, &s->lay);
  size_t m = s->lay.send_count > s->lay.recv_count ? s->lay.send_count : s->lay.recv_count;
  s->span = m * (size_t)elt;
}

/* host: the buffers' host copies (--device), where data is made and checked. */
static void make_buf(perf_thread* th, const struct step* s, int li, int in_place, size_t shift, perf_buf* b,
                     int host) {
  size_t elt = (size_t)perf_type_size(s->type);
  memset(b, 0, sizeof(*b));
  b->rank = th->rank0 + li;
  b->nranks = th->ctx->nranks;
  b->root = s->root < 0 ? 0 : s->root;
  b->op = s->op;
  b->in_place = in_place;
  b->type = s->type;
  b->lay = s->lay;
  b->count = s->lay.param_count;
  b->opts = &th->ctx->o;
  shift += (size_t)th->ctx->o.unalign * elt; /* -u: misalign by whole elements */
  b->recv_base = (host ? th->hrecv : th->recv)[li] + shift;
  if (in_place) {
    b->send = b->recv_base + (size_t)b->rank * s->lay.send_inplace * elt;
    b->recv = b->recv_base + (size_t)b->rank * s->lay.recv_inplace * elt;
  } else {
    b->send = (host ? th->hsend : th->send)[li] + shift;
    b->recv = b->recv_base;
  }
  if (th->ctx->o.reg == 2 && !host) {
    b->recv_win = th->handles[2 * li + 1];
    b->recv_off = (size_t)(b->recv - th->recv[li]);
  }
}

/* Issue the operation on every local rank (nccl-tests' startColl). Iterations move the buffers by
 * whole spans within the allocation so consecutive iterations do not reuse the same cache lines.
 * in_group: inside the group of -m operations, where -z waits after the group instead (a barrier's
 * send/recv would join the group, and waiting inside it waits for nothing). */
static void start_op(perf_thread* th, const struct step* s, int in_place, int iter, int in_group) {
  perf_ctx* ctx = th->ctx;
  size_t steps = s->span ? ctx->o.max_bytes / s->span : 1;
  size_t shift = s->span * ((size_t)iter % (steps ? steps : 1));
  int rounds = ctx->coll->nrounds ? ctx->coll->nrounds(ctx->nranks) : 1;
  ncclRedOp_t ops[th->nlocal];
  for (int r = 0; r < rounds; r++) {
    if (th->nlocal > 1) CK(ncclGroupStart());
    for (int i = 0; i < th->nlocal; i++) {
      perf_buf b;
      make_buf(th, s, i, in_place, shift, &b, 0);
      ops[i] = s->op < 0 ? ncclSum : (ncclRedOp_t)s->op;
      if (s->op == PERF_OP_MULSUM) {
        char scalar[8];
        perf_mulsum_scalar(scalar, s->type, b.rank);
        CK(ncclRedOpCreatePreMulSum(&ops[i], scalar, s->type, ncclScalarHostImmediate, th->comms[i]));
      }
      CK(ctx->coll->run(&b, ops[i], th->comms[i], th->streams[i], r));
    }
    if (th->nlocal > 1) CK(ncclGroupEnd());
    /* Destroyed once the group has been issued: NCCL allows it, and it never races the enqueue. */
    if (s->op == PERF_OP_MULSUM)
      for (int i = 0; i < th->nlocal; i++) CK(ncclRedOpDestroy(ops[i], th->comms[i]));
  }
  if (!in_group) wait_blocking(th);
  mark_progress(th); /* -T: a long loop of quick operations is progress */
}

static void init_data(perf_thread* th, const struct step* s, int in_place, uint64_t seed) {
  perf_ctx* ctx = th->ctx;
  for (int i = 0; i < th->nlocal; i++) {
    perf_buf b;
    make_buf(th, s, i, in_place, 0, &b, ctx->o.device);
    b.seed = seed;
    ctx->coll->init(&b);
    if (ctx->o.device) { /* whole buffers: in place, the input lies inside the receive buffer */
      perf_cuda_copy(ctx, th->send[i], th->hsend[i], ctx->buf_bytes, 1);
      perf_cuda_copy(ctx, th->recv[i], th->hrecv[i], ctx->buf_bytes, 1);
    }
  }
  mark_progress(th);
}

/* Wrong elements over our local ranks, -1 when this placement cannot be checked. */
static int64_t check_data(perf_thread* th, const struct step* s, int in_place, uint64_t seed) {
  int64_t wrong = 0, checkable = 0;
  for (int i = 0; i < th->nlocal; i++) {
    perf_buf b;
    if (th->ctx->o.device) perf_cuda_copy(th->ctx, th->hrecv[i], th->recv[i], th->ctx->buf_bytes, 0);
    make_buf(th, s, i, in_place, 0, &b, th->ctx->o.device);
    b.seed = seed;
    /* CHORUS_PERF_CORRUPT: damage rank 0's first result element, to prove validation works. */
    if (th->ctx->o.corrupt && b.rank == 0 && s->lay.recv_count > 0 && b.count > 0) b.recv[0] ^= 0x5A;
    int64_t w = th->ctx->coll->check(&b);
    if (w >= 0) wrong += w, checkable = 1;
  }
  mark_progress(th);
  return checkable ? wrong : -1;
}

static int cmp_double(const void* a, const void* b) {
  double x = *(const double*)a, y = *(const double*)b;
  return (x > y) - (x < y);
}

static void iter_stats(const double* t, int n, int skip, perf_iterstats* st, double* sorted) {
  int m = n - skip;
  memcpy(sorted, t + skip, sizeof(double) * (size_t)m);
  qsort(sorted, (size_t)m, sizeof(double), cmp_double);
  double sum = 0, var = 0;
  for (int i = 0; i < m; i++) sum += sorted[i];
  st->avg = sum / m;
  for (int i = 0; i < m; i++) var += (sorted[i] - st->avg) * (sorted[i] - st->avg);
  st->stdev = sqrt(var / m);
  st->min = sorted[0];
  st->max = sorted[m - 1];
  st->p50 = sorted[m / 2];
  int i95 = (m * 95 + 99) / 100 - 1, i99 = (m * 99 + 99) / 100 - 1; /* nearest rank */
  st->p95 = sorted[i95 < m ? i95 : m - 1];
  st->p99 = sorted[i99 < m ? i99 : m - 1];
  st->times = t;
  st->n = n;
  st->skipped = skip;
}

/* nccl-tests' BenchTime for one placement; rank 0 prints its columns. */
static void bench(perf_thread* th, const struct step* s, int in_place) {
  perf_ctx* ctx = th->ctx;
  const perf_opts* o = &ctx->o;
  static __thread uint64_t rep;
  int total = o->iters * o->agg;
  if (o->check) init_data(th, s, in_place, 99);
  start_op(th, s, in_place, 0, 0);
  complete(th);
  barrier(th);

  /* scratch: nlocal combine areas, then the iteration times, then room to sort them */
  double* times = o->per_iter ? th->scratch + (size_t)th->scratch_len * th->nlocal : NULL;
  uint64_t excluded = 0, t0 = perf_now_ns();
  for (int it = 0; it < o->iters; it++) {
    uint64_t ti = times ? perf_now_ns() : 0; /* a clock read costs ~25 ns: only when it is used */
    if (o->agg > 1) CK(ncclGroupStart());
    for (int a = 0; a < o->agg; a++) start_op(th, s, in_place, it * o->agg + a, o->agg > 1);
    if (o->agg > 1) CK(ncclGroupEnd());
    if (o->agg > 1) wait_blocking(th);
    if (times || o->blocking == 3) complete(th);
    if (times) times[it] = (double)(perf_now_ns() - ti) * 1e-9;
    if (o->blocking == 3) {
      uint64_t b0 = perf_now_ns();
      barrier(th);
      excluded += perf_now_ns() - b0;
    }
  }
  double tm[2];
  tm[1] = (double)(perf_now_ns() - t0 - excluded) * 1e-9 / total; /* issue time only (-C) */
  complete(th);
  tm[0] = (double)(perf_now_ns() - t0 - excluded) * 1e-9 / total;
  combine_values(th, tm, 2, o->average);
  double sec = tm[0], cpu = tm[1];

  perf_iterstats st, *stp = NULL;
  if (times) {
    /* Slowest rank per iteration, as nccl-tests' i_* columns (max over GPUs and processes). */
    for (int i = 0; i < th->nlocal; i++)
      memcpy(th->scratch + (size_t)i * th->scratch_len, times, sizeof(double) * (size_t)o->iters);
    combine(th, o->iters, ncclMax);
    /* An outer iteration holds -m operations; report per operation, like the time column. */
    for (int i = 0; i < o->iters; i++) times[i] = th->scratch[i] / o->agg;
    iter_stats(times, o->iters, o->per_iter_skip, &st, times + th->scratch_len);
    stp = &st;
  }

  int elt = perf_type_size(s->type);
  double algbw = ctx->coll->alg_bytes(s->lay.param_count, elt, ctx->nranks) / 1e9 / sec;
  double busbw = algbw * ctx->coll->bus_factor(ctx->nranks);
  barrier(th);

  int64_t wrong = -1;
  rep++;
  for (int c = 0; c < o->check; c++) {
    init_data(th, s, in_place, rep);
    start_op(th, s, in_place, 0, 0);
    complete(th);
    int64_t w = check_data(th, s, in_place, rep);
    if (w < 0) break; /* not checkable: N/A, like nccl-tests */
    if (w > 0) th->errors++;
    for (int i = 0; i < th->nlocal; i++) th->scratch[(size_t)i * th->scratch_len] = i == 0 ? (double)w : 0;
    combine(th, 1, ncclSum);
    wrong = (int64_t)th->scratch[0];
    if (wrong) break;
  }
  if (ctx->is_main && th->thread == 0)
    out_row_place((o->cputime ? cpu : sec) * 1e6, algbw, busbw, wrong, !in_place, stp);
  th->bw_sum += busbw;
  th->bw_count++;
}

static size_t next_size(const perf_opts* o, size_t s) {
  if (o->step_factor > 1) return s ? s * o->step_factor : 1;
  return s + o->step_bytes;
}

static void time_test(perf_thread* th, ncclDataType_t type, int op, int root) {
  perf_ctx* ctx = th->ctx;
  const perf_opts* o = &ctx->o;
  struct step s = {.type = type, .op = op, .root = root};
  int printer = ctx->is_main && th->thread == 0;
  barrier(th);
  /* Warm up at every power of two from minbytes to maxbytes (nccl-tests since 2025). */
  for (size_t b = o->min_bytes; b <= o->max_bytes; b = b ? b * 2 : 1) {
    set_step(th, &s, b);
    for (int w = 0; w < o->warmup; w++) start_op(th, &s, 0, w, 0);
    complete(th);
    if (b > o->max_bytes / 2) break;
  }
  int flags = ctx->coll->flags;
  const char* opname = flags & PERF_OP_BLANK ? "" : flags & PERF_USES_OP ? perf_op_names[op] : "none";
  int proot = ctx->coll->flags & PERF_USES_ROOT ? root : -1;
  for (size_t b = o->min_bytes; b <= o->max_bytes; b = next_size(o, b)) {
    set_step(th, &s, b);
    if (printer) out_row_start(s.span, s.lay.param_count, perf_type_name(type), opname, proot);
    bench(th, &s, 0);
    if (!(flags & PERF_NO_INPLACE)) bench(th, &s, 1);
    else if (printer) out_row_no_place();
    if (printer) out_row_end(o->iters * o->agg, ctx->coll->name);
    if (next_size(o, b) <= b) break; /* overflow */
  }
}

static void gather_devices(perf_thread* th) {
  perf_ctx* ctx = th->ctx;
  int nr = ctx->nranks;
  /* per local rank: room for every rank's record (team_gather), its own first */
  perf_devrec* recs = calloc((size_t)th->nlocal * (size_t)nr, sizeof(*recs));
  if (!recs) perf_fail_msg(ctx, PERF_INTERNAL, "out of memory");
  char host[256] = "?";
  gethostname(host, sizeof host);
  for (int i = 0; i < th->nlocal; i++) {
    perf_devrec* mine = recs + (size_t)i * nr;
    mine->rank = th->rank0 + i;
    mine->pid = (int32_t)getpid();
    /* The device it runs on: a thread's -g ranks share its one GPU (nccl-tests gives each its own) */
    int local = ctx->local_proc * ctx->o.nthreads + th->thread;
    mine->device = ctx->o.device ? perf_cuda_ordinal(local) : local * ctx->o.ngpus + i;
    snprintf(mine->host, sizeof mine->host, "%.63s", host);
  }
  perf_team t = team_of(th);
  team_gather(&t, (char*)recs, (size_t)nr * sizeof(*recs), sizeof(*recs));
  mark_progress(th);
  for (int r = 0; r < nr; r++) recs[r].host[sizeof recs[r].host - 1] = '\0'; /* peers' text, printed below */
  if (ctx->is_main && th->thread == 0) out_device_report(recs, nr); /* rank 0's: all of them */
  free(recs);
}

static int is_pow2(int n) { return n > 0 && (n & (n - 1)) == 0; }

void perf_thread_main(perf_thread* th) {
  perf_ctx* ctx = th->ctx;
  const perf_opts* o = &ctx->o;
  const perf_coll* coll = ctx->coll;
  int printer = ctx->is_main && th->thread == 0;

  /* Every rank must sweep the same sizes, so the memory cap is the smallest over all processes. */
  double cap[1] = {ctx->mem_cap < 0 ? 1e300 : ctx->mem_cap};
  combine_values(th, cap, 1, 2);
  gather_devices(th);
  if (th->thread == 0 && cap[0] < (double)o->max_bytes) {
    if (printer) out_mem_note((size_t)cap[0]);
    ctx->o.max_bytes = (size_t)cap[0];
    if (ctx->o.min_bytes > ctx->o.max_bytes) ctx->o.min_bytes = ctx->o.max_bytes;
  }
  pthread_barrier_wait(&ctx->threads_met);
  perf_thread_buffers(th);
  if (printer) out_table_header();

  int t0 = o->type < 0 ? 0 : o->type, t1 = o->type < 0 ? ncclNumTypes - 1 : o->type;
  int op0 = o->op < 0 ? 0 : o->op, op1 = o->op < 0 ? PERF_NUM_OPS - 1 : o->op;
  if (!(coll->flags & PERF_USES_OP)) op0 = op1 = PERF_COPY;
  int r0 = o->root, r1 = o->root;
  if (!(coll->flags & PERF_USES_ROOT)) r0 = r1 = -1;
  else if (o->root < 0) r0 = 0, r1 = ctx->nranks - 1;
  if ((coll->flags & PERF_USES_ROOT) && o->root >= ctx->nranks)
    perf_fail_msg(ctx, PERF_INVALID_USAGE, "root %d is not a rank: there are %d ranks", o->root, ctx->nranks);

  if ((coll->flags & PERF_POW2_ONLY) && !is_pow2(ctx->nranks)) {
    if (printer) {
      char line[64];
      snprintf(line, sizeof line, "nRanks %d is not a power of 2, skipping", ctx->nranks);
      out_skip_line(line);
    }
  } else {
    for (int cycle = 0; o->cycles == 0 || cycle < o->cycles; cycle++)
      for (int t = t0; t <= t1; t++)
        for (int op = op0; op <= op1; op++)
          for (int r = r0; r <= r1; r++) time_test(th, (ncclDataType_t)t, op, r);
  }

  /* Out of bounds values: checks that found wrong elements, summed over threads and processes. */
  for (int i = 0; i < th->nlocal; i++) th->scratch[(size_t)i * th->scratch_len] = i == 0 ? th->errors : 0;
  combine(th, 1, ncclSum);
  int errors = (int)th->scratch[0];
  if (printer) {
    double avg = th->bw_count ? th->bw_sum / th->bw_count : 0;
    out_footer(errors, avg, ctx->min_bw);
    ctx->result = errors || (ctx->min_bw >= 0 && avg < 0.9 * ctx->min_bw) ? PERF_WRONG : PERF_OK;
  } else if (th->thread == 0) {
    ctx->result = errors ? PERF_WRONG : PERF_OK;
  }
  __atomic_store_n(&ctx->busy[th->thread], 0, __ATOMIC_RELAXED);
}
