/* Communicator creation and teardown internals: the init job (bootstrap, peers, channels), split,
 * and the state checks every API call makes. */
#define _GNU_SOURCE /* memfd_create */
#include <errno.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "chorus.h"
#include "../misc/log.h"
#include "../misc/param.h"
#include "../misc/utils.h"
#include "../comm/work.h"
#include "../tune/topo.h"
#include "../tune/tune.h"
#include "../fault/stall.h"
#include "connect.h"
#include "exec.h"
#include "../observe/observe.h"
#include "init.h"
#include "pool.h"
#include "plan.h"

ch_status comm_check(const struct ncclComm* comm, const char* fn) {
  if (!comm) {
    WARN("%s: comm is NULL", fn);
    return CH_INVALID_ARG;
  }
  if (comm->magic != CH_COMM_MAGIC) {
    WARN("%s: comm %p is not a valid communicator (destroyed, or never initialised)", fn, (const void*)comm);
    return CH_INVALID_ARG;
  }
  if (comm_inherited(comm)) {
    WARN("%s: communicator %p was made by process %d, which forked this one (pid %d): a forked child cannot "
         "use it (its threads and connections stayed with the parent; NCCL's cannot either): make a "
         "communicator in the child", fn, (const void*)comm, comm->pid, (int)getpid());
    return CH_INVALID_USAGE;
  }
  return CH_OK;
}

int comm_inherited(const struct ncclComm* comm) {
  return comm && comm->magic == CH_COMM_MAGIC && comm->proc_nonce != ut_proc_nonce();
}

/* The comm this thread entered last (owner thread only): a nested enter of it costs no atomic. */
static _Thread_local struct ncclComm* entered_comm;
static _Thread_local char thread_token; /* its address names this thread in comm->owner */

static int enter_shared(struct ncclComm* comm, struct comm_guard* g) {
  /* Dekker pair with ncclCommAbort (both seq_cst): either abort sees us in `users` and waits, or we
   * see its flag and leave without touching anything else. */
  atomic_fetch_add(&comm->users, 1);
  g->exclusive = 0;
  if (!__atomic_load_n(&comm->abort_flag, __ATOMIC_SEQ_CST) && !atomic_load(&comm->dead)) return 1;
  atomic_fetch_sub(&comm->users, 1);
  return 0;
}

static void enter_done(struct ncclComm* comm, struct comm_guard* g) {
  g->prev_comm = entered_comm;
  g->prev_sink = log_set_error_sink(&comm->last_error);
  entered_comm = comm;
}

int comm_try_enter(struct ncclComm* comm, struct comm_guard* g) {
  g->comm = comm;
  g->nested = entered_comm == comm || atomic_load_explicit(&comm->owner, memory_order_relaxed) == (uintptr_t)&thread_token;
  if (g->nested) return 1; /* already counted, and abort waits for the outer leave */
  if (!enter_shared(comm, g)) return 0;
  enter_done(comm, g);
  return 1;
}

ch_status comm_enter(struct ncclComm* comm, struct comm_guard* g) {
  uintptr_t me = (uintptr_t)&thread_token, prev = 0;
  g->comm = comm;
  g->nested = atomic_load_explicit(&comm->owner, memory_order_relaxed) == me;
  if (g->nested) return CH_OK;
  /* The same Dekker pair as enter_shared, on `owner`; the compare-exchange also tells a second thread
   * using the comm at the same time (NCCL communicators are not thread-safe, except for abort and
   * the queries) from the owner. */
  if (!atomic_compare_exchange_strong(&comm->owner, &prev, me)) {
    if (__atomic_load_n(&comm->abort_flag, __ATOMIC_SEQ_CST) || atomic_load(&comm->dead)) goto aborted;
    WARN("rank %d: communicator %p is used by two threads at once; a communicator takes calls from one thread "
         "at a time (any thread may call ncclCommAbort and ncclCommGetAsyncError)", comm->rank, (void*)comm);
    return CH_INVALID_USAGE;
  }
  g->exclusive = 1;
  if (__atomic_load_n(&comm->abort_flag, __ATOMIC_SEQ_CST) || atomic_load(&comm->dead)) {
    atomic_store_explicit(&comm->owner, 0, memory_order_release);
    goto aborted;
  }
  enter_done(comm, g);
  return CH_OK;
aborted:
  WARN("rank %d: the communicator is being %s; it cannot be used", comm->rank,
       atomic_load(&comm->dead) ? "destroyed" : "aborted (ncclCommAbort)");
  return CH_ABORTED;
}

void comm_leave(struct comm_guard* g) {
  if (g->nested) return;
  entered_comm = g->prev_comm;
  log_set_error_sink(g->prev_sink);
  /* Last touch: abort may free comm right after. */
  if (g->exclusive) atomic_store_explicit(&g->comm->owner, 0, memory_order_release);
  else atomic_fetch_sub(&g->comm->users, 1);
}

void comm_join_init(struct ncclComm* comm) {
  if (atomic_exchange(&comm->init_thread_live, 0)) pthread_join(comm->init_thread, NULL);
}

ch_status comm_ensure_ready(struct ncclComm* comm) {
  int st;
  for (uint64_t i = 0; (st = atomic_load(&comm->init_state)) == ncclInProgress; i++) {
    if (__atomic_load_n(&comm->abort_flag, __ATOMIC_ACQUIRE)) return CH_ABORTED;
    ut_backoff(i);
  }
  if (st != ncclSuccess) {
    WARN("rank %d: communicator initialisation failed earlier (%s); it cannot be used", comm->rank,
         ncclGetErrorString((ncclResult_t)st));
    return CH_INVALID_USAGE;
  }
  int as = atomic_load(&comm->async_result);
  if (as != ncclSuccess) {
    /* Its cause was logged where it was seen (naming a peer, a host, an errno) into this comm's last
     * error: a later call repeats it there instead of replacing it with a message that names nothing. */
    static const char tag[] = "communicator has an earlier asynchronous error";
    char cause[sizeof(comm->last_error.text)];
    snprintf(cause, sizeof(cause), "%s", log_sink_text(&comm->last_error));
    if (!strstr(cause, tag))
      WARN("rank %d: %s (%s): %s; destroy or abort it", comm->rank, tag, ncclGetErrorString((ncclResult_t)as),
           cause[0] ? cause : "its cause was not recorded");
    return (ch_status)as;
  }
  return CH_OK;
}

void comm_set_async_error(struct ncclComm* comm, ch_status s) {
  int expected = ncclSuccess;
  /* An abort is the caller's own doing, not an asynchronous failure of the communicator. */
  if (s != CH_OK && s != CH_ABORTED) atomic_compare_exchange_strong(&comm->async_result, &expected, (int)s);
  /* Streams of ranks on one GPU may wait for a peer that will not come: let them through. */
  if (s != CH_OK && s != CH_ABORTED && ch_comm_hooks.failed) ch_comm_hooks.failed(comm);
}

ch_status comm_alloc(struct ncclComm** out, int nranks, int rank, const ncclConfig_t* config) {
  struct ncclComm* comm = calloc(1, sizeof(*comm));
  if (!comm) {
    WARN("out of memory allocating a communicator");
    return CH_SYSTEM;
  }
  comm->magic = CH_COMM_MAGIC;
  comm->proc_nonce = ut_proc_nonce();
  comm->pid = (int)getpid();
  atomic_init(&comm->refs, 1);
  atomic_init(&comm->init_gate, 1); /* begun, unless deferred to a group's end (group_defer_init) */
  atomic_init(&comm->lost_rank, -1);
  comm->nranks = nranks;
  comm->rank = rank;
  comm->config = *config;
  /* The caller's strings need not outlive this call: the name is kept (cut to fit, printable and free
   * of quotes and backslashes, so that logs, dumps and JSON traces carry it as is), and the config keeps
   * pointers into the comm only. */
  if (config->commName) {
    size_t i = 0;
    for (; i < sizeof(comm->name) - 1 && config->commName[i]; i++) {
      char c = config->commName[i];
      comm->name[i] = c >= 0x20 && c < 0x7f && c != '"' && c != '\\' ? c : '?';
    }
    comm->name[i] = '\0';
  }
  comm->config.commName = comm->name[0] ? comm->name : NULL;
  comm->config.netName = NULL; /* without effect (api/config.c) */
  /* The device a CUDA application made the comm for is its creating thread's current context, as
   * NCCL takes it (cudaGetDevice); init may go on in another thread. */
  comm->cuda_ctx = cudrv_present() ? cudrv_current_ctx() : NULL;
  comm->blocking = config->blocking;
  log_sink_init(&comm->last_error);
  int64_t timeout_s = param_int(PARAM_TIMEOUT);
  atomic_store(&comm->timeout_ns, timeout_s > 0 ? (uint64_t)timeout_s * UT_NS_PER_S : 0);
  atomic_store(&comm->init_state, ncclInProgress);
  *out = comm;
  return CH_OK;
}

static ch_status direct_setup(struct ncclComm* comm);
static void direct_release(struct ncclComm* comm);

/* A FIFO size; NCCL's "auto" values (-1, -2) mean the default. */
static size_t fifo_param(enum param_id id) {
  int64_t v = param_int(id);
  if (v <= 0) {
    struct param_info pi;
    param_describe(id, &pi);
    v = pi.default_int;
  }
  return (size_t)v;
}

/* The transport to each peer, once per communicator at INFO: "0:self 1:shm 2-5:net" (runs merged). */
static void log_peer_transports(const struct ncclComm* comm) {
  char buf[512];
  size_t at = 0;
  int n = comm->nranks;
  for (int r = 0; r < n && at < sizeof(buf) - 32;) {
    int k = comm->peer_tp[r], e = r;
    if (r != comm->rank)
      while (e + 1 < n && e + 1 != comm->rank && comm->peer_tp[e + 1] == k) e++;
    const char* name = r == comm->rank ? "self" : tp_name(k);
    int w = e > r ? snprintf(buf + at, sizeof(buf) - at, " %d-%d:%s", r, e, name)
                  : snprintf(buf + at, sizeof(buf) - at, " %d:%s", r, name);
    at += (size_t)UT_MAX(w, 0);
    r = e + 1;
  }
  if (at >= sizeof(buf) - 32) snprintf(buf + sizeof(buf) - 5, 5, "...");
  INFO(LOG_INIT | LOG_NET, "rank %d: transport per peer:%s", comm->rank, buf);
}

/* Everything after the peers are known (shared by init and split). */
static ch_status comm_setup(struct ncclComm* comm) {
  int n = comm->nranks, me = comm->rank;
  const struct boot_rank_info* mine = &comm->peers[me];
  CHECK(tp_net_config()); /* NCCL_NET naming a network that cannot start fails here, saying why */
  comm->peer_tp = calloc((size_t)n, sizeof(int));
  comm->p2p = calloc(2 * (size_t)n, sizeof(struct ch_p2p));
  if (!comm->peer_tp || !comm->p2p) return CH_SYSTEM;
  uint64_t* hosts = calloc((size_t)n, sizeof(uint64_t));
  if (!hosts) return CH_SYSTEM;
  int nhosts = 0;
  unsigned kinds_said = 0;
  comm->local_nranks = 0;
  for (int r = 0; r < n; r++) {
    const struct boot_rank_info* p = &comm->peers[r];
    int same_host = p->host_hash == mine->host_hash;
    if (same_host && r < me) comm->local_rank++;
    if (same_host) comm->local_nranks++;
    /* The first transport of the priority list whose probe accepts the peer (transport/fifo.c). */
    struct tp_peer tp = {.self = r == me, .same_host = same_host, .same_proc = same_host && p->proc_nonce == mine->proc_nonce};
    const char* why;
    int k = comm->peer_tp[r] = tp_choose(&tp, &why);
    if (!(kinds_said & (1u << k)) && r != me) {
      kinds_said |= 1u << k;
      INFO(LOG_INIT | LOG_NET, "rank %d: %s carries connections to peers such as rank %d (%s)", me, tp_name(k), r, why);
    }
    int h = 0;
    while (h < nhosts && hosts[h] != p->host_hash) h++;
    if (h == nhosts) hosts[nhosts++] = p->host_hash;
  }
  free(hosts);
  comm->nnodes = nhosts;
  /* A process that talks over the network also runs a proxy thread, which a spinning rank starves:
   * measured on 2 CPUs, 2 ranks over loopback, 8 B AllReduce: ~600 us with ranks spinning, ~22 us
   * with them yielding. Count one proxy per local process. */
  int threads = comm->local_nranks;
  for (int r = 0; r < n; r++) {
    if (!(tp_flags(comm->peer_tp[r]) & TP_F_NETWORK)) continue;
    for (int q = 0; q < n; q++) { /* local processes: one proxy each */
      int first = comm->peers[q].host_hash == mine->host_hash;
      for (int o = 0; o < q && first; o++)
        first = !(comm->peers[o].host_hash == mine->host_hash &&
                  comm->peers[o].proc_nonce == comm->peers[q].proc_nonce);
      threads += first;
    }
    break;
  }
  /* CPUs for this host's ranks: the union of their affinity masks, not ours alone (a launcher that
   * binds rank i to CPU i leaves each process one CPU, yet no two ranks share one: measured on 2
   * CPUs, 2 bound ranks, 8 B, 0.56-0.81 us yielding against 0.24-0.27 spinning); and the ranks
   * crowded onto my CPUs, those whose masks lie within mine, against how many mine are (two ranks
   * bound to CPU 0 beside an unbound one). */
  uint64_t cpus[BOOT_CPU_WORDS] = {0};
  int within = 0, ncpus = 0, nmine = 0;
  for (int r = 0; r < n; r++) {
    const uint64_t* m = comm->peers[r].cpus;
    if (comm->peers[r].host_hash != mine->host_hash) continue;
    int sub = 1;
    for (int w = 0; w < BOOT_CPU_WORDS; w++) cpus[w] |= m[w], sub &= !(m[w] & ~mine->cpus[w]);
    within += sub;
  }
  for (int w = 0; w < BOOT_CPU_WORDS; w++)
    ncpus += __builtin_popcountll(cpus[w]), nmine += __builtin_popcountll(mine->cpus[w]);
  comm->oversubscribed = ncpus ? threads > ncpus || (nmine && within > nmine) : threads > ut_ncpus();

  comm->sizes.buff[PROTO_SIMPLE] = fifo_param(PARAM_BUFFSIZE);
  comm->sizes.buff[PROTO_LL] = fifo_param(PARAM_LL_BUFFSIZE);
  comm->sizes.buff[PROTO_LL128] = fifo_param(PARAM_LL128_BUFFSIZE);
  static const char* names[CH_NPROTO] = {"NCCL_LL_BUFFSIZE", "NCCL_LL128_BUFFSIZE", "NCCL_BUFFSIZE"};
  for (int p = 0; p < CH_NPROTO; p++) {
    /* Every connection reserves its FIFO up front: an absurd size would eat the machine's memory. */
    if (comm->sizes.buff[p] > CH_MAX_FIFO_BYTES) {
      WARN("%s=%zu is larger than the %d MiB maximum per connection", names[p], comm->sizes.buff[p],
           (int)(CH_MAX_FIFO_BYTES >> 20));
      return CH_INVALID_ARG;
    }
    size_t min = (size_t)CH_STEPS * 4096;
    if (comm->sizes.buff[p] < min) comm->sizes.buff[p] = min;
    comm->sizes.buff[p] = UT_ALIGN_UP(comm->sizes.buff[p], min);
  }
  /* Send/recv may connect every pair (AlltoAll): a rank's per-peer receive FIFOs share CHORUS_P2P_MEM
   * bytes, so each is that divided by its peers (or by CHORUS_P2P_PEERS, the most it keeps), scaled
   * down from 832 KiB alike in every protocol to at least 8 slots of 4 KiB each. The same on every
   * rank (n and the two settings; CHORUS_P2P_MEM is compared at init). */
  pool_sizes(&comm->sizes, n, comm->config.maxP2pPeers, &comm->p2p_sizes, &comm->p2p_cap);
  comm->p2p_wave = comm->p2p_cap; /* lowered to every rank's smallest by comm_agree */
  size_t fifo = tp_fifo_bytes(&comm->p2p_sizes);
  int64_t mem = param_int(PARAM_P2P_MEM);
  comm->p2p_lru = calloc((size_t)n, sizeof(*comm->p2p_lru));
  comm->p2p_count = calloc(2 * (size_t)n, sizeof(*comm->p2p_count));
  comm->p2p_mark = calloc(2 * (size_t)n, 1);
  comm->p2p_resident = calloc((size_t)n, 1);
  if (!comm->p2p_lru || !comm->p2p_count || !comm->p2p_mark || !comm->p2p_resident) return CH_SYSTEM;
  INFO(LOG_INIT, "rank %d: per-peer FIFOs of %zu KiB (CHORUS_P2P_MEM=%lld), at most %d peers live (%s)", comm->rank,
       fifo >> 10, (long long)mem, comm->p2p_cap,
       comm->config.maxP2pPeers > 0 ? "ncclConfig_t.maxP2pPeers / NCCL_P2P_MAX_PEERS" : "CHORUS_P2P_PEERS");
  size_t scratch = 0;
  for (int p = 0; p < CH_NPROTO; p++)
    if (p != PROTO_SIMPLE) scratch = UT_MAX(scratch, prim_slot_payload(p, comm->sizes.buff[p] / CH_STEPS));
  comm->scratch = malloc(scratch);
  if (!comm->scratch) return CH_SYSTEM;
  comm->scratch_bytes = scratch;
  size_t pstep = 0;
  for (int p = 0; p < CH_NPROTO; p++) pstep = UT_MAX(pstep, prim_slot_payload(p, comm->p2p_sizes.buff[p] / CH_STEPS));
  comm->peer_step_bytes = pstep;
  comm->peer_scratch = malloc(pstep);
  if (!comm->peer_scratch) return CH_SYSTEM;

  int maxc = (int)UT_MAX(1, UT_MIN(CH_MAX_CHANNELS, param_int(PARAM_MAX_NCHANNELS)));
  int64_t minc = param_int(PARAM_MIN_NCHANNELS);
  /* ncclConfig_t.minCTAs raises the channel count as NCCL_MIN_NCHANNELS does, maxCTAs caps it (below) */
  if (comm->config.minCTAs != NCCL_CONFIG_UNDEF_INT) minc = UT_MAX(minc, comm->config.minCTAs);
  comm->nchannels = UT_MAX(maxc, (int)UT_MIN(CH_MAX_CHANNELS, minc));
  /* NCCL stripes a large network transfer over NCCL_SOCKET_NTHREADS x NCCL_NSOCKS_PERTHREAD sockets
   * per peer. Each channel has its own socket per peer, and a large call splits its data over its
   * channels: a communicator that uses the network gets that many channels, so those sockets carry
   * a large call in parallel (tune/choose.c lets large calls use them). */
  if (tune_uses_net(comm)) comm->nchannels = UT_MAX(comm->nchannels, tune_net_socks());
  if (comm->config.maxCTAs != NCCL_CONFIG_UNDEF_INT) comm->nchannels = UT_MIN(comm->nchannels, comm->config.maxCTAs);
  CHECK(comm_build_rings(comm)); /* tune/rings.c: ranks of one host contiguous */
  CHECK(comm_build_trees(comm)); /* tune/trees.c */
  tune_init(comm);
  CHECK(comm_agree(comm)); /* before anything whose steps depend on those settings (direct_setup) */
  CHECK(tune_check(comm)); /* NCCL_ALGO/NCCL_PROTO parsed (compared across ranks first) */
  CHECK(direct_setup(comm));
  ch_status gs = ch_comm_hooks.setup ? ch_comm_hooks.setup(comm, comm->gpu_hellos) : CH_OK; /* alike on every rank */
  free(comm->gpu_hellos);
  comm->gpu_hellos = NULL;
  CHECK(gs);
  CHECK(obs_clock_align(comm)); /* one time base for dumps and traces (several hosts only) */
  int64_t frn = param_int(PARAM_FLIGHT_RECORDER);
  if (frn <= 0 && (param_str(PARAM_TRACE)[0] || prof_wanted())) frn = 1024; /* traces and profilers read it */
  comm->fr = fr_create((int)UT_MIN(frn, 1 << 20));
  comm->trace = trace_open(comm);
  prof_comm_init(comm); /* NCCL_PROFILER_PLUGIN */
  comm->wait_ns_peer = calloc((size_t)n, sizeof(*comm->wait_ns_peer));
  comm->rma_ctr = calloc(2 * (size_t)n, sizeof(*comm->rma_ctr));
  if (!comm->wait_ns_peer || !comm->rma_ctr) return CH_SYSTEM;

  unsigned used = 0;
  for (int r = 0; r < n; r++)
    if (r != me) used |= 1u << comm->peer_tp[r];
  char kinds[64] = "";
  size_t at = 0;
  for (int k = 0; k < TP_COUNT; k++)
    if (used & (1u << k)) at += (size_t)snprintf(kinds + at, sizeof(kinds) - at, " %s", tp_name(k));
  log_peer_transports(comm);
  INFO(LOG_INIT,
       "Chorus %s (NCCL API %d.%d.%d): comm %p%s%s%s rank %d/%d on %s pid %d, %d local rank(s), %d host(s), "
       "%d channel(s), transports:%s",
       CHORUS_VERSION_STRING, NCCL_MAJOR, NCCL_MINOR, NCCL_PATCH, (void*)comm, comm->name[0] ? " \"" : "", comm->name,
       comm->name[0] ? "\"" : "", me, n, mine->hostname, mine->pid, comm->local_nranks, comm->nnodes, comm->nchannels,
       used ? kinds : " self");
  return CH_OK;
}

/* Direct algorithms need a clique: one slot per rank that all ranks can touch. When every rank is a
 * thread of this process, rank 0 allocates it on the heap and publishes it in the process-local
 * registry; when ranks are processes of one host, rank 0 creates a sealed memfd and exports it through
 * its descriptor server (transport/fdpass.c). Either way only a random token travels in the
 * bootstrap allgather: no address, pid or descriptor number. Rank 0 withdraws the token once every
 * rank has said whether it got the clique. */
static int clique_on_heap(const struct ncclComm* comm) {
  int threads = comm->nranks > 1;
  for (int r = 0; r < comm->nranks; r++) threads &= !!(tp_flags(comm->peer_tp[r]) & TP_F_SAME_PROC);
  return threads;
}

/* Every rank reads every peer's cookie (direct_cma.c); CMA is on only if all could. results: n words of
 * scratch. Not being able to is not an error: Direct's plain buffers then go through FIFOs. */
static ch_status cma_setup(struct ncclComm* comm, int published, int32_t* results) {
  int n = comm->nranks, bad = -1;
  struct direct_cma* d = calloc(1, sizeof(*d) + (size_t)n * sizeof(int32_t));
  int err = !published ? ENOMEM : !d ? ENOMEM : direct_cma_probe(comm->clique, n, comm->rank, d->pid, &bad);
  results[comm->rank] = err ? (bad < 0 ? -err : bad * 4096 + err) : 0; /* peer and errno, for the INFO */
  ch_status s = boot_allgather(comm->boot, results, sizeof(int32_t));
  int r = 0;
  while (s == CH_OK && r < n && results[r] == 0) r++;
  if (s == CH_OK && r == n) {
    d->min_bytes = (size_t)param_int(PARAM_CMA_MIN_BYTES);
    comm->cma = d;
    INFO(LOG_INIT, "comm %p rank %d: Direct AllReduce of %zu bytes and up between processes reaches buffers not "
         "from ncclMemAlloc by cross-memory copies (process_vm_readv/writev)", (void*)comm, comm->rank, d->min_bytes);
    return CH_OK;
  }
  free(d);
  if (s == CH_OK) { /* bounded: a value from a peer is only printed */
    int32_t v = results[r], peer = v > 0 ? v / 4096 : -1, e = v > 0 ? v % 4096 : -v;
    char who[32] = "";
    if (peer >= 0 && peer < n) snprintf(who, sizeof(who), " rank %d's memory", peer);
    INFO(LOG_INIT, "comm %p rank %d: no cross-memory copies: rank %d cannot read%s (%s; ptrace_scope, a "
         "seccomp filter or another pid namespace?): Direct AllReduce on buffers not from ncclMemAlloc goes "
         "through FIFOs", (void*)comm, comm->rank, r, who, strerror(e > 0 && e < 4096 ? e : EINVAL));
  }
  return s;
}

static ch_status direct_setup(struct ncclComm* comm) {
  int n = comm->nranks, threads = clique_on_heap(comm), host = n > 1;
  for (int r = 0; r < n; r++) host &= !!(tp_flags(comm->peer_tp[r]) & TP_F_SAME_HOST);
  if (!host || param_int(PARAM_DIRECT_MIN_BYTES) < 0) return CH_OK;
  if (!threads && param_int(PARAM_SHM_DIRECT_MIN_BYTES) < 0) return CH_OK;
  uint64_t token = 0, *all = calloc((size_t)n, sizeof(uint64_t));
  if (!all) return CH_SYSTEM;
  ch_status s = CH_OK;
  size_t bytes = direct_clique_bytes(n);
  struct direct_clique* made = NULL; /* rank 0: the clique it created */
  int made_fd = -1;
  if (comm->rank == 0 && threads) {
    made = direct_clique_new(n);
    token = made ? tp_local_publish(made, &made->refs) : 0;
    if (!token) s = CH_SYSTEM;
  } else if (comm->rank == 0) {
    int fd = tp_memfd_new("chorus-clique", bytes, 0);
    void* m = fd < 0 ? MAP_FAILED : mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (m == MAP_FAILED) { /* not fatal: collectives use FIFOs, as they would without ncclMemAlloc */
      INFO(LOG_INIT, "cannot create the %zu-byte shared clique (%s): no direct algorithms", bytes, strerror(errno));
      if (fd >= 0) close(fd);
    } else if (!(token = tp_fd_export(fd, bytes))) { /* logged */
      munmap(m, bytes);
      close(fd);
    } else {
      made = m;
      made->n = n;
      made->procs = 1;
      made->token = token;
      made_fd = fd;
    }
  }
  all[comm->rank] = token;
  if (s == CH_OK) s = boot_allgather(comm->boot, all, sizeof(uint64_t));
  if (s == CH_OK && comm->rank == 0) {
    comm->clique = made;
  } else if (s == CH_OK && all[0] && threads) {
    comm->clique = tp_local_lookup(all[0], 0);
    if (!comm->clique)
      WARN("rank 0 offered a direct-algorithm clique that no thread of this process published: ignored; is "
           "another process claiming to be rank 0?");
  } else if (s == CH_OK && all[0]) {
    comm->clique = tp_fd_map(comm->peers[0].proc_nonce, all[0], bytes, offsetof(struct direct_clique, token), 0, 0,
                             "the direct-algorithm clique");
  }
  if (s == CH_OK && comm->clique && !threads) {
    for (int r = 0; r < n; r++) all[r] = comm->peers[r].proc_nonce;
    comm->maps = tp_map_cache_new(n, all);
    if (!comm->maps) s = CH_SYSTEM;
  }
  /* Cross-memory copies: my pid and a random word's address, for the peers' probe after the allgather
   * below. The word lives until the second allgather, which no rank passes before every probe is done. */
  uint64_t cookie = 0;
  int cma = s == CH_OK && comm->clique && !threads && param_int(PARAM_CMA) != 0 && ut_random(&cookie, sizeof(cookie)) == CH_OK;
  if (cma) direct_cma_publish(&comm->clique->slot[comm->rank], &cookie);
  /* Every rank must agree on having a clique (tuning picks Direct from it). */
  int32_t have = comm->clique != NULL, *haves = calloc((size_t)n, sizeof(int32_t));
  if (s == CH_OK && !haves) s = CH_SYSTEM;
  if (s == CH_OK) {
    haves[comm->rank] = have;
    s = boot_allgather(comm->boot, haves, sizeof(int32_t));
    for (int r = 0; s == CH_OK && r < n; r++) have &= haves[r];
  }
  if (s == CH_OK && have && !threads && param_int(PARAM_CMA) != 0) s = cma_setup(comm, cma, haves);
  free(haves);
  /* Everyone who will get the clique has it now. */
  if (threads) tp_local_withdraw(token);
  else tp_fd_withdraw(token);
  if (made_fd >= 0) close(made_fd);
  if (made && comm->clique != made) { /* rank 0's clique was never handed over */
    if (threads) direct_clique_release(made);
    else munmap(made, bytes);
  }
  if ((s != CH_OK || !have) && comm->clique) direct_release(comm);
  free(all);
  return s;
}

static void direct_release(struct ncclComm* comm) {
  if (comm->clique && !clique_on_heap(comm)) munmap(comm->clique, direct_clique_bytes(comm->nranks));
  else direct_clique_release(comm->clique);
  comm->clique = NULL;
  tp_map_cache_free(comm->maps);
  comm->maps = NULL;
  free(comm->cma);
  comm->cma = NULL;
}

ch_status comm_init_job(struct ncclComm* comm) {
  log_set_thread_rank(comm->rank);
  struct log_err_sink* prev_sink = log_set_error_sink(&comm->last_error);
  stall_install_signal();
  int64_t init_s = param_int(PARAM_INIT_TIMEOUT); /* 0 or less: no deadline, as the root reads it */
  uint64_t deadline = init_s > 0 ? ut_now_ns() + (uint64_t)init_s * UT_NS_PER_S : 0;
  uint64_t t0 = ut_now_ns();
  ch_status res = CH_OK;
  if (!comm->boot) { /* split comms arrive with their bootstrap and peers already made */
    comm->comm_hash = ut_hash(comm->init_id.internal, sizeof(comm->init_id.internal), 0x9e3779b97f4a7c15ull);
    if (comm->init_ids)
      res = boot_init_ids(comm->init_ids, comm->init_nids, comm->rank, comm->nranks, &comm->abort_flag, deadline,
                          &comm->boot, &comm->peers);
    else
      res = boot_init(comm->init_id.internal, comm->rank, comm->nranks, &comm->abort_flag, deadline, &comm->boot,
                      &comm->peers);
  }
  if (res == CH_OK) boot_name_peers(comm->boot, comm->peers); /* its failure reports name pid and host */
  if (res == CH_OK) res = comm_setup(comm);
  if (res == CH_OK) stall_register(comm); /* answers stall queries from here on (fault/stall_job.c) */
  if (res == CH_OK)
    INFO(LOG_INIT, "rank %d: init done in %.2f ms", comm->rank, (double)(ut_now_ns() - t0) / UT_NS_PER_MS);
  log_set_error_sink(prev_sink); /* before init_state: a waiter may free comm once it is set */
  atomic_store(&comm->init_state, res == CH_ABORTED ? (int)ncclInvalidUsage : (int)res);
  return res;
}

/* What a queued call's group end may still touch (enq_task's references): freed with the last. */
void comm_unref(struct ncclComm* comm) {
  if (atomic_fetch_sub(&comm->refs, 1) != 1) return;
  if (ch_comm_hooks.release) ch_comm_hooks.release(comm); /* every ticket is done */
  log_sink_destroy(&comm->last_error);
  comm->magic = 0;
  free(comm);
}

/* Tear comm down; the struct goes now, or with the last call still queued in an open group (the
 * abort of a comm whose owner thread is between ncclGroupStart and ncclGroupEnd). */
void comm_free(struct ncclComm* comm) {
  atomic_store(&comm->dead, 1);
  stall_unregister(comm); /* before anything it reads goes */
  if (ch_comm_hooks.teardown) ch_comm_hooks.teardown(comm);
  free(comm->gpu_hellos);
  plan_free(atomic_exchange(&comm->reuse_plan, NULL)); /* the struct may outlive this (refs) */
  tune_fini(comm);
  comm_free_connections(comm);
  direct_release(comm);
  if (comm->boot) boot_close(comm->boot);
  if (comm->init_ids) memset(comm->init_ids, 0, (size_t)comm->init_nids * sizeof(*comm->init_ids)); /* keys */
  free(comm->init_ids);
  for (int c = 0; c < CH_MAX_CHANNELS; c++) free(comm->channels[c].ring);
  free(comm->peers);
  free(comm->peer_tp);
  free(comm->p2p);
  free(comm->scratch);
  free(comm->peer_scratch);
  free(comm->repro_scratch);
  comm->repro_scratch = NULL;
  trace_close(comm); /* no plan runs any more */
  prof_comm_fini(comm); /* finalize: no plan runs any more */
  fr_free(comm->fr); /* stall_unregister above: no dump reads it any more */
  comm->fr = NULL;
  free((void*)comm->wait_ns_peer);
  comm->wait_ns_peer = NULL;
  free((void*)comm->rma_ctr);
  comm->rma_ctr = NULL;
  free(comm->p2p_lru), free(comm->p2p_count), free(comm->p2p_mark), free(comm->p2p_resident);
  comm->p2p_lru = NULL, comm->p2p_count = NULL, comm->p2p_mark = NULL, comm->p2p_resident = NULL;
  comm->peers = NULL, comm->peer_tp = NULL, comm->p2p = NULL, comm->scratch = comm->peer_scratch = NULL;
  comm_unref(comm);
}
