/* Flight recorder dumps: one text file per rank and communicator, replaced by each new dump, that
 * chorus-info --flight reads with the other ranks' files (docs/OBSERVE.md has the format). Written to
 * a temporary name and renamed, so a reader never sees half a file. */
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

/* mkdir -p, the folders we make private (0700): dumps name hosts, pids and call shapes. */
static int make_dir(const char* path) {
  char p[512];
  if (snprintf(p, sizeof(p), "%s", path) >= (int)sizeof(p)) return -1;
  for (char* s = p + 1; *s; s++) {
    if (*s != '/') continue;
    *s = 0;
    if (mkdir(p, 0700) != 0 && errno != EEXIST) return -1;
    *s = '/';
  }
  return mkdir(p, 0700) != 0 && errno != EEXIST ? -1 : 0;
}

static void put_entry(FILE* f, const struct fr_entry* e, const struct obs_timebase* tb) {
  const char* algo = e->algo >= 0 ? ch_algo_name(e->algo) : NULL;
  const char* proto = e->proto >= 0 ? ch_proto_name(e->proto) : NULL;
  const char* type = ch_type_name(e->type);
  const char* op = e->func == FUNC_REDUCE || e->func == FUNC_REDUCESCATTER || e->func == FUNC_ALLREDUCE
                       ? ch_op_name(e->op) : "-";
  int rooted = e->func == FUNC_BROADCAST || e->func == FUNC_REDUCE || e->func == FUNC_SEND || e->func == FUNC_RECV ||
               e->func == FUNC_GATHER || e->func == FUNC_SCATTER;
  fprintf(f, "%llu %llu %s %s %s %d %llu %s %s %d %s %s %s %llu %llu %llu\n", (unsigned long long)e->id,
          (unsigned long long)e->seq, ch_func_name(e->func) ? ch_func_name(e->func) : "?", type ? type : "?",
          op ? op : "?", rooted ? e->root : -1, (unsigned long long)e->count, algo ? algo : "-", proto ? proto : "-", e->nch,
          fr_exec_word(e->exec), fr_state_names[e->state], e->state >= FR_DONE ? fr_status_word(e->status) : "-",
          (unsigned long long)obs_job_ns(tb, e->t_enq), (unsigned long long)obs_job_ns(tb, e->t_start),
          (unsigned long long)obs_job_ns(tb, e->t_end));
}

ch_status fr_dump(struct ncclComm* comm, const char* reason, char* path, size_t len) {
  if (!comm->fr) {
    if (path && len) path[0] = 0;
    return CH_OK; /* CHORUS_FLIGHT_RECORDER=0 */
  }
  const char* dir = obs_dump_dir();
  char file[600], tmp[640];
  snprintf(file, sizeof(file), "%s/chorus-fr-%016llx-r%d.txt", dir, (unsigned long long)comm->comm_hash, comm->rank);
  snprintf(tmp, sizeof(tmp), "%s.%d.tmp", file, (int)getpid());
  if (make_dir(dir) != 0) {
    WARN("flight recorder: cannot create %s: %s (CHORUS_DUMP_DIR names where dumps go)", dir, strerror(errno));
    return CH_SYSTEM;
  }
  struct fr_entry* e;
  uint64_t recorded;
  uint64_t skipped;
  int n = fr_snapshot(comm, &e, &recorded, &skipped);
  int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_NOFOLLOW | O_CLOEXEC, 0600);
  FILE* f = fd >= 0 ? fdopen(fd, "w") : NULL;
  if (!f) {
    WARN("flight recorder: cannot write %s: %s", tmp, strerror(errno));
    if (fd >= 0) close(fd);
    free(e);
    return CH_SYSTEM;
  }
  struct obs_timebase tb;
  obs_timebase(comm, &tb);
  const struct boot_rank_info* me = comm->peers ? &comm->peers[comm->rank] : NULL;
  fprintf(f, "# chorus flight recorder 1\n");
  fprintf(f, "comm %016llx\nrank %d\nnranks %d\nhost %s\npid %d\nreason %s\n", (unsigned long long)comm->comm_hash,
          comm->rank, comm->nranks, me ? me->hostname : "?", (int)getpid(), reason);
  fprintf(f, "dumped_ns %llu\nclock_offset_ns %lld\ncapacity %d\nrecorded %llu\nnot_recorded %llu\nseq %llu\n",
          (unsigned long long)obs_job_ns(&tb, obs_ticks()), (long long)comm->clock_offset_ns, fr_capacity(comm),
          (unsigned long long)recorded, (unsigned long long)skipped, (unsigned long long)atomic_load(&comm->seq));
  fprintf(f, "# id seq func type op root count algo proto nch exec state status enqueued_ns started_ns ended_ns\n");
  for (int i = 0; i < n; i++) put_entry(f, &e[i], &tb);
  free(e);
  int bad = ferror(f);
  bad |= fclose(f) != 0;
  if (bad || rename(tmp, file) != 0) {
    WARN("flight recorder: writing %s failed: %s", file, strerror(errno));
    unlink(tmp);
    return CH_SYSTEM;
  }
  INFO(LOG_INIT, "rank %d: flight recorder (%d calls) written to %s (%s)", comm->rank, n, file, reason);
  if (path && len) snprintf(path, len, "%s", file);
  return CH_OK;
}

void fr_dump_first(struct ncclComm* comm, const char* reason) {
  if (comm->fr && !atomic_exchange(&comm->fr_dumped, 1)) (void)fr_dump(comm, reason, NULL, 0);
}
