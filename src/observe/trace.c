/* The timeline: with CHORUS_TRACE=DIR each rank writes DIR/chorus-trace-<comm>-r<rank>.json, in the
 * Chrome trace-event format (a JSON array of events; Perfetto and chrome://tracing open it, also
 * unterminated after a crash): a span per call with its arguments and choices (from the flight
 * recorder's entry), a span for each wait of the engine naming the peer, a span per operation on each
 * channel or peer connection, and the network proxy's busy periods on a track of their own. Times are
 * the job's clock (rank 0's realtime, aligned at init), in us from a base written in the file's
 * metadata, so that chorus-info --trace merges the ranks' files into one.
 *
 * Events are kept in memory and appended to the file when the buffer fills and when the comm is freed.
 * Who touches what: call, wait and operation events are added by the thread running the comm's plans
 * (one at a time: tickets), the buffer and file only by that thread and by comm_free (when no plan
 * runs). The proxy's events go to a per-process buffer under its own lock (trace_proxy_span). */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "../misc/log.h"
#include "../misc/names.h"
#include "../misc/param.h"
#include "../misc/safefile.h"
#include "../misc/utils.h"
#include "../transport/transport.h"
#include "observe.h"

#define TRACE_BUF 8192
enum { EV_CALL, EV_WAIT, EV_OP };

struct trace_ev {
  int kind;
  uint64_t t0, t1; /* ticks */
  union {
    struct fr_entry call;
    struct {
      int peer;
    } wait;
    struct {
      int func, algo, proto, channel, peer;
      uint64_t bytes;
    } op;
  } u;
};

struct obs_trace {
  FILE* f;
  char path[600];
  int pid; /* in the trace: one per (comm, rank) */
  uint64_t base_ns; /* job time of ts 0 */
  int n;
  unsigned channels_named, peers_named_at; /* thread_name metadata written for these tracks */
  char* peer_named;                        /* [nranks] */
  struct trace_ev ev[TRACE_BUF];
};

static void trace_proxy_start(void); /* the proxy's track (below) */

static int trace_pid(const struct ncclComm* comm) { return (int)((comm->comm_hash >> 8 & 0x3fff) << 16) + comm->rank; }

static void meta(struct obs_trace* t, const char* what, int tid, const char* key, const char* val, int num) {
  if (val)
    fprintf(t->f, "{\"name\":\"%s\",\"ph\":\"M\",\"pid\":%d,\"tid\":%d,\"args\":{\"%s\":\"%s\"}},\n", what, t->pid, tid,
            key, val);
  else
    fprintf(t->f, "{\"name\":\"%s\",\"ph\":\"M\",\"pid\":%d,\"tid\":%d,\"args\":{\"%s\":%d}},\n", what, t->pid, tid,
            key, num);
}

struct obs_trace* trace_open(struct ncclComm* comm) {
  const char* dir = param_str(PARAM_TRACE);
  if (!dir[0]) return NULL;
  struct obs_trace* t = calloc(1, sizeof(*t));
  if (!t || !(t->peer_named = calloc((size_t)comm->nranks, 1))) {
    free(t);
    WARN("CHORUS_TRACE: out of memory; no trace for rank %d", comm->rank);
    return NULL;
  }
  char fname[64], why[256];
  snprintf(fname, sizeof(fname), "chorus-trace-%016llx-r%d.json", (unsigned long long)comm->comm_hash, comm->rank);
  snprintf(t->path, sizeof(t->path), "%s/%s", dir, fname);
  /* Missing folders made 0700, an existing one used only if nobody else can touch our files in it
   * (misc/safefile.h); an older trace of this name is replaced, unless the folder is shared. */
  int shared = 1;
  int dfd = sf_dir(dir, 1, &shared, why, sizeof(why));
  int fd = dfd >= 0 ? sf_create(dfd, fname, 0, !shared) : -1;
  if (dfd >= 0 && fd < 0) snprintf(why, sizeof(why), "cannot create %s: %s", fname, strerror(errno));
  if (dfd >= 0) close(dfd);
  t->f = fd >= 0 ? fdopen(fd, "w") : NULL;
  if (!t->f) {
    WARN("CHORUS_TRACE: not writing to %s: %s; no trace for rank %d", dir, fd >= 0 ? strerror(errno) : why, comm->rank);
    if (fd >= 0) close(fd);
    free(t->peer_named);
    free(t);
    return NULL;
  }
  struct obs_timebase tb;
  obs_timebase(comm, &tb);
  uint64_t now = obs_job_ns(&tb, obs_ticks());
  t->base_ns = now - now % (1000 * UT_NS_PER_S); /* a round 1000 s: small numbers in the file, same on most ranks */
  t->pid = trace_pid(comm);
  const struct boot_rank_info* me = &comm->peers[comm->rank];
  char name[160];
  snprintf(name, sizeof(name), "rank %d/%d (comm %04llx%s%.40s, %.63s pid %d)", comm->rank, comm->nranks,
           (unsigned long long)(comm->comm_hash & 0xffff), comm->name[0] ? " " : "", comm->name, me->hostname,
           (int)getpid());
  fprintf(t->f, "[\n");
  meta(t, "process_name", 0, "name", name, 0);
  meta(t, "process_sort_index", 0, "sort_index", NULL, comm->rank);
  meta(t, "thread_name", 0, "name", "calls", 0);
  fprintf(t->f,
          "{\"name\":\"chorus\",\"ph\":\"M\",\"pid\":%d,\"tid\":0,\"args\":{\"comm\":\"%016llx\",\"rank\":%d,"
          "\"nranks\":%d,\"base_ns\":%llu,\"clock_offset_ns\":%lld,\"host\":\"%.63s\",\"os_pid\":%d,"
          "\"comm_name\":\"%s\"}},\n",
          t->pid, (unsigned long long)comm->comm_hash, comm->rank, comm->nranks, (unsigned long long)t->base_ns,
          (long long)comm->clock_offset_ns, me->hostname, (int)getpid(), comm->name);
  INFO(LOG_INIT, "rank %d: tracing to %s", comm->rank, t->path);
  trace_proxy_start();
  return t;
}

/* ns since the file's base, and its text as us with 3 decimals ("12.345"): integer formatting, since
 * printf's %f was most of the cost of a traced 8 B call. */
static int64_t rel_ns(const struct obs_trace* t, const struct obs_timebase* tb, uint64_t ticks) {
  return (int64_t)(obs_job_ns(tb, ticks) - t->base_ns);
}
static const char* us_text(int64_t ns, char* buf, size_t len) {
  const char* sign = ns < 0 ? "-" : "";
  uint64_t a = ns < 0 ? (uint64_t)-ns : (uint64_t)ns;
  snprintf(buf, len, "%s%llu.%03u", sign, (unsigned long long)(a / UT_NS_PER_US), (unsigned)(a % UT_NS_PER_US));
  return buf;
}

static void write_ev(struct ncclComm* comm, struct obs_trace* t, const struct obs_timebase* tb,
                     const struct trace_ev* e) {
  int64_t t0 = rel_ns(t, tb, e->t0), d = rel_ns(t, tb, e->t1) - t0;
  char ts[32], dur[32];
  us_text(t0, ts, sizeof(ts));
  us_text(d < 0 ? 0 : d, dur, sizeof(dur));
  if (e->kind == EV_CALL) {
    const struct fr_entry* c = &e->u.call;
    const char* fn = fr_func_name(c->func);
    const char* algo = c->algo >= 0 ? ch_algo_name(c->algo) : NULL;
    const char* proto = c->proto >= 0 ? ch_proto_name(c->proto) : NULL;
    const char* type = ch_type_name(c->type);
    char q[32];
    us_text(c->t_enq ? t0 - rel_ns(t, tb, c->t_enq) : 0, q, sizeof(q));
    fprintf(t->f,
            "{\"name\":\"%s\",\"cat\":\"call\",\"ph\":\"X\",\"pid\":%d,\"tid\":0,\"ts\":%s,\"dur\":%s,\"args\":"
            "{\"id\":%llu,\"seq\":%llu,\"count\":%llu,\"type\":\"%s\",\"op\":\"%s\",\"root\":%d,\"algo\":\"%s\","
            "\"proto\":\"%s\",\"nch\":%d,\"queued_us\":%s,\"status\":\"%s\",\"tag\":\"0x%llx\"}},\n",
            fn ? fn : "?", t->pid, ts, dur, (unsigned long long)c->id, (unsigned long long)c->seq,
            (unsigned long long)c->count, type ? type : "?",
            c->func == FUNC_ALLREDUCE || c->func == FUNC_REDUCE || c->func == FUNC_REDUCESCATTER ? ch_op_name(c->op) : "-",
            c->root,
            algo ? algo : "-", proto ? proto : "-", c->nch, q, fr_status_word(c->status),
            (unsigned long long)c->tag); /* userProfilerTag, as text: JSON numbers stop at 2^53 */
  } else if (e->kind == EV_WAIT) {
    char name[48];
    if (e->u.wait.peer >= 0) snprintf(name, sizeof(name), "wait for rank %d", e->u.wait.peer);
    else snprintf(name, sizeof(name), "wait");
    fprintf(t->f,
            "{\"name\":\"%s\",\"cat\":\"wait\",\"ph\":\"X\",\"pid\":%d,\"tid\":0,\"ts\":%s,\"dur\":%s,\"args\":"
            "{\"peer\":%d}},\n",
            name, t->pid, ts, dur, e->u.wait.peer);
  } else {
    int tid = e->u.op.peer >= 0 ? 1000 + e->u.op.peer : 1 + e->u.op.channel;
    if (e->u.op.peer >= 0 && e->u.op.peer < comm->nranks && !t->peer_named[e->u.op.peer]) {
      char n[32];
      snprintf(n, sizeof(n), "peer %d", e->u.op.peer);
      meta(t, "thread_name", tid, "name", n, 0);
      t->peer_named[e->u.op.peer] = 1;
    } else if (e->u.op.peer < 0 && e->u.op.channel < 32 && !(t->channels_named & (1u << e->u.op.channel))) {
      char n[32];
      snprintf(n, sizeof(n), "channel %d", e->u.op.channel);
      meta(t, "thread_name", tid, "name", n, 0);
      t->channels_named |= 1u << e->u.op.channel;
    }
    const char* fn = ch_func_name(e->u.op.func);
    const char* algo = e->u.op.algo >= 0 ? ch_algo_name(e->u.op.algo) : "-";
    char name[64];
    if (e->u.op.func == FUNC_SEND) snprintf(name, sizeof(name), "Send to %d", e->u.op.peer);
    else if (e->u.op.func == FUNC_RECV) snprintf(name, sizeof(name), "Recv from %d", e->u.op.peer);
    else snprintf(name, sizeof(name), "%s %s", fn ? fn : "?", algo ? algo : "-");
    fprintf(t->f,
            "{\"name\":\"%s\",\"cat\":\"op\",\"ph\":\"X\",\"pid\":%d,\"tid\":%d,\"ts\":%s,\"dur\":%s,\"args\":"
            "{\"bytes\":%llu,\"proto\":\"%s\"}},\n",
            name, t->pid, tid, ts, dur, (unsigned long long)e->u.op.bytes,
            ch_proto_name(e->u.op.proto) ? ch_proto_name(e->u.op.proto) : "-");
  }
}

static void flush(struct ncclComm* comm, struct obs_trace* t) {
  if (!t->n) return;
  struct obs_timebase tb;
  obs_timebase(comm, &tb);
  for (int i = 0; i < t->n; i++) write_ev(comm, t, &tb, &t->ev[i]);
  t->n = 0;
  fflush(t->f);
}

static struct trace_ev* add(struct ncclComm* comm) {
  struct obs_trace* t = comm->trace;
  if (t->n == TRACE_BUF) flush(comm, t);
  return &t->ev[t->n++];
}

void trace_calls(struct ncclComm* comm, uint64_t lo, uint64_t hi) {
  for (uint64_t id = lo; id && id <= hi; id++) {
    struct fr_entry e;
    /* A one-sided call made inside an open group has an id in its plan's range: it traced itself. */
    if (!fr_get(comm, id, &e) || !e.t_start || (lo != hi && e.func >= FR_FUNC_PUTSIGNAL)) continue;
    struct trace_ev* ev = add(comm);
    ev->kind = EV_CALL, ev->t0 = e.t_start, ev->t1 = e.t_end ? e.t_end : e.t_start, ev->u.call = e;
  }
}

void trace_wait(struct ncclComm* comm, int peer, uint64_t t0, uint64_t t1) {
  struct trace_ev* ev = add(comm);
  ev->kind = EV_WAIT, ev->t0 = t0, ev->t1 = t1, ev->u.wait.peer = peer;
}

void trace_op(struct ncclComm* comm, int func, int algo, int proto, int channel, int peer, uint64_t bytes, uint64_t t0,
              uint64_t t1) {
  struct trace_ev* ev = add(comm);
  ev->kind = EV_OP, ev->t0 = t0, ev->t1 = t1;
  ev->u.op.func = func, ev->u.op.algo = algo, ev->u.op.proto = proto, ev->u.op.channel = channel;
  ev->u.op.peer = peer, ev->u.op.bytes = bytes;
}

/* The network proxy's busy periods (transport/proxy.c calls tp_busy_hook, set while a trace is open):
 * one buffer per process, written into the file of whichever traced comm closes next. */
#define PROXY_BUF 65536
static pthread_mutex_t px_lock = PTHREAD_MUTEX_INITIALIZER;
static struct { uint64_t t0, t1; } px_span[PROXY_BUF];
static int px_n, px_lost, px_open;

static void proxy_busy(uint64_t t0, uint64_t t1) {
  pthread_mutex_lock(&px_lock);
  if (px_n < PROXY_BUF) px_span[px_n].t0 = t0, px_span[px_n++].t1 = t1;
  else px_lost++;
  pthread_mutex_unlock(&px_lock);
}

static void trace_proxy_start(void) {
  pthread_mutex_lock(&px_lock);
  if (px_open++ == 0) atomic_store(&tp_busy_hook, proxy_busy);
  pthread_mutex_unlock(&px_lock);
}

static void trace_proxy_flush(struct ncclComm* comm, FILE* f, int pid, uint64_t base_ns) {
  struct obs_timebase tb;
  obs_timebase(comm, &tb);
  pthread_mutex_lock(&px_lock);
  if (px_n)
    fprintf(f, "{\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":%d,\"tid\":9000,\"args\":{\"name\":\"network proxy\"}},\n", pid);
  for (int i = 0; i < px_n; i++) {
    char ts[32], dur[32];
    us_text((int64_t)(obs_mono_job_ns(&tb, px_span[i].t0) - base_ns), ts, sizeof(ts));
    us_text((int64_t)(px_span[i].t1 - px_span[i].t0), dur, sizeof(dur));
    fprintf(f, "{\"name\":\"moving data\",\"cat\":\"proxy\",\"ph\":\"X\",\"pid\":%d,\"tid\":9000,\"ts\":%s,"
            "\"dur\":%s,\"args\":{}},\n", pid, ts, dur);
  }
  if (px_lost) WARN("CHORUS_TRACE: %d busy periods of the network proxy were not kept (buffer full)", px_lost);
  px_n = px_lost = 0;
  if (--px_open == 0) atomic_store(&tp_busy_hook, NULL);
  pthread_mutex_unlock(&px_lock);
}

void trace_close(struct ncclComm* comm) {
  struct obs_trace* t = comm->trace;
  if (!t) return;
  flush(comm, t);
  trace_proxy_flush(comm, t->f, t->pid, t->base_ns);
  fprintf(t->f, "{\"name\":\"end\",\"ph\":\"M\",\"pid\":%d,\"tid\":0,\"args\":{}}\n]\n", t->pid);
  if (fclose(t->f) != 0) WARN("CHORUS_TRACE: writing %s failed: %s", t->path, strerror(errno));
  free(t->peer_named);
  free(t);
  comm->trace = NULL;
}
