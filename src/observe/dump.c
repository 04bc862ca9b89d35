/* Flight recorder dumps: one text file per rank and communicator, replaced by each new dump, that
 * chorus-info --flight reads with the other ranks' files (docs/OBSERVE.md has the format). Written to
 * a temporary name and renamed, so a reader never sees half a file. Rendered in memory first, so that a
 * caller holding a lock (fault/stall_job.c) does the file I/O after letting go of it. */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdatomic.h>
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
#include "observe.h"

const char* fr_status_word(int status) {
  switch (status) {
    case CH_OK: return "ok";
    case 1: return "cuda";
    case CH_SYSTEM: return "system";
    case CH_INTERNAL: return "internal";
    case CH_INVALID_ARG: return "invalid-argument";
    case CH_INVALID_USAGE: return "invalid-usage";
    case CH_REMOTE: return "remote";
    case CH_IN_PROGRESS: return "in-progress";
    case CH_TIMEOUT: return "timeout";
    case CH_ABORTED: return "aborted";
    default: return "unknown";
  }
}

static const char* fr_exec_word(int exec) {
  static const char* const w[] = {"host", "host-stream", "staging", "kernel"}; /* enum ch_exec */
  return exec >= 0 && exec < (int)(sizeof(w) / sizeof(w[0])) ? w[exec] : "?";
}

static char default_dir[512];
static pthread_once_t dir_once = PTHREAD_ONCE_INIT;
static void dir_init(void) {
  const char* tmp = getenv("TMPDIR");
  snprintf(default_dir, sizeof(default_dir), "%s/chorus-dump-%u", tmp && tmp[0] == '/' ? tmp : "/tmp",
           (unsigned)getuid());
}

const char* obs_dump_dir(void) {
  const char* d = param_str(PARAM_DUMP_DIR);
  if (d[0]) return d;
  pthread_once(&dir_once, dir_init);
  return default_dir;
}

static void put_entry(FILE* f, const struct fr_entry* e, const struct obs_timebase* tb) {
  const char* algo = e->algo >= 0 ? ch_algo_name(e->algo) : NULL;
  const char* proto = e->proto >= 0 ? ch_proto_name(e->proto) : NULL;
  const char* type = ch_type_name(e->type);
  const char* op = e->func == FUNC_REDUCE || e->func == FUNC_REDUCESCATTER || e->func == FUNC_ALLREDUCE
                       ? ch_op_name(e->op) : "-";
  int rma = e->func >= FR_FUNC_PUTSIGNAL; /* the peer in root's column; no datatype for a signal or a wait */
  int rooted = e->func == FUNC_BROADCAST || e->func == FUNC_REDUCE || e->func == FUNC_SEND || e->func == FUNC_RECV ||
               e->func == FUNC_GATHER || e->func == FUNC_SCATTER || rma;
  if (rma && !type) type = "-";
  /* tag: the 17th column, after what readers of the first 16 take (tools/flight.c) */
  fprintf(f, "%llu %llu %s %s %s %d %llu %s %s %d %s %s %s %llu %llu %llu %llx\n", (unsigned long long)e->id,
          (unsigned long long)e->seq, fr_func_name(e->func) ? fr_func_name(e->func) : "?", type ? type : "?",
          op ? op : "?", rooted ? e->root : -1, (unsigned long long)e->count, algo ? algo : "-", proto ? proto : "-", e->nch,
          fr_exec_word(e->exec), fr_state_names[e->state], e->state >= FR_DONE ? fr_status_word(e->status) : "-",
          (unsigned long long)obs_job_ns(tb, e->t_enq), (unsigned long long)obs_job_ns(tb, e->t_start),
          (unsigned long long)obs_job_ns(tb, e->t_end), (unsigned long long)e->tag);
}

int fr_render(struct ncclComm* comm, const char* reason, struct fr_text* out) {
  memset(out, 0, sizeof(*out));
  if (!comm->fr) return -1;
  FILE* f = open_memstream(&out->buf, &out->len);
  if (!f) return -1;
  struct fr_entry* e;
  uint64_t recorded;
  uint64_t skipped;
  int n = fr_snapshot(comm, &e, &recorded, &skipped);
  struct obs_timebase tb;
  obs_timebase(comm, &tb);
  const struct boot_rank_info* me = comm->peers ? &comm->peers[comm->rank] : NULL;
  fprintf(f, "# chorus flight recorder 1\n");
  fprintf(f, "comm %016llx\nrank %d\nnranks %d\nhost %s\npid %d\nreason %s\n", (unsigned long long)comm->comm_hash,
          comm->rank, comm->nranks, me ? me->hostname : "?", (int)getpid(), reason);
  if (comm->name[0]) fprintf(f, "name %s\n", comm->name); /* ncclConfig_t.commName */
  fprintf(f, "dumped_ns %llu\nclock_offset_ns %lld\ncapacity %d\nrecorded %llu\nnot_recorded %llu\nseq %llu\n",
          (unsigned long long)obs_job_ns(&tb, obs_ticks()), (long long)comm->clock_offset_ns, fr_capacity(comm),
          (unsigned long long)recorded, (unsigned long long)skipped, (unsigned long long)atomic_load(&comm->seq));
  fprintf(f, "# id seq func type op root count algo proto nch exec state status enqueued_ns started_ns ended_ns tag\n");
  for (int i = 0; i < n; i++) put_entry(f, &e[i], &tb);
  free(e);
  int bad = ferror(f);
  bad |= fclose(f) != 0;
  if (bad) {
    free(out->buf);
    memset(out, 0, sizeof(*out));
    return -1;
  }
  snprintf(out->name, sizeof(out->name), "chorus-fr-%016llx-r%d.txt", (unsigned long long)comm->comm_hash, comm->rank);
  snprintf(out->reason, sizeof(out->reason), "%s", reason);
  out->rank = comm->rank, out->calls = n;
  return 0;
}

int fr_render_first(struct ncclComm* comm, const char* reason, struct fr_text* out) {
  memset(out, 0, sizeof(*out));
  if (!comm->fr || atomic_exchange(&comm->fr_dumped, 1)) return -1;
  return fr_render(comm, reason, out);
}

/* An unusable folder is a setting (or another user's doing) that every later dump would hit too. */
static atomic_int dir_warned;

ch_status fr_write(struct fr_text* t, char* path, size_t len) {
  if (path && len) path[0] = 0;
  if (!t->buf) return CH_SYSTEM;
  const char* dir = obs_dump_dir();
  char why[256];
  ch_status st = CH_SYSTEM;
  struct sf_file out;
  int dfd = sf_dir(dir, 1, NULL, why, sizeof(why));
  if (dfd < 0) {
    if (!atomic_exchange(&dir_warned, 1))
      WARN("flight recorder: not writing dumps to %s: %s (CHORUS_DUMP_DIR names where dumps go)", dir, why);
    else INFO(LOG_INIT, "flight recorder: not writing dumps to %s: %s", dir, why);
    goto out;
  }
  if (sf_open_in(&out, dfd, t->name) != 0) {
    WARN("flight recorder: cannot create a file in %s: %s", dir, strerror(errno));
    goto out;
  }
  fwrite(t->buf, 1, t->len, out.f);
  if (sf_commit(&out) != 0) {
    WARN("flight recorder: writing %s/%s failed: %s", dir, t->name, strerror(errno));
    goto out;
  }
  INFO(LOG_INIT, "rank %d: flight recorder (%d calls) written to %s/%s (%s)", t->rank, t->calls, dir, t->name,
       t->reason);
  if (path && len) snprintf(path, len, "%s/%s", dir, t->name);
  st = CH_OK;
out:
  if (dfd >= 0) close(dfd);
  free(t->buf);
  t->buf = NULL;
  return st;
}

ch_status fr_dump(struct ncclComm* comm, const char* reason, char* path, size_t len) {
  struct fr_text t;
  if (fr_render(comm, reason, &t) != 0) {
    if (path && len) path[0] = 0;
    return comm->fr ? CH_SYSTEM : CH_OK; /* CHORUS_FLIGHT_RECORDER=0: nothing to write */
  }
  return fr_write(&t, path, len);
}

void fr_dump_first(struct ncclComm* comm, const char* reason) {
  struct fr_text t;
  if (fr_render_first(comm, reason, &t) == 0) (void)fr_write(&t, NULL, 0);
}
