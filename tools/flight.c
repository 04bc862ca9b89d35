/* chorus-info --flight DIR: reads every rank's flight recorder dump in DIR (chorus-fr-<comm>-r<rank>.txt,
 * docs/OBSERVE.md) and says what happened job-wide, per communicator: the first collective on which the
 * ranks' calls differ, the ranks that never entered a call the others are in (and what they were doing
 * instead), and which rank arrived last at each call, the one the others waited for. Times are the
 * job's clock (rank 0's, aligned at init), so ranks on different hosts compare. */
#include <dirent.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../src/bootstrap/bootstrap.h"
#include "flight.h"

#define NAME 24
struct call {
  uint64_t id, seq, count, t_enq, t_start, t_end;
  uint64_t tag; /* ncclCollConfig_t.userProfilerTag (17th column; absent in older dumps: 0) */
  int root, nch;
  char func[NAME], type[NAME], op[NAME], algo[NAME], proto[NAME], exec[NAME], state[NAME], status[NAME];
};

struct dump {
  int rank, nranks, pid;
  char host[64], reason[32], name[64]; /* name: ncclConfig_t.commName, "" if none */
  uint64_t seq, recorded, dumped;
  struct call* c;
  int n;
};

struct job {
  uint64_t hash;
  int nranks;
  struct dump** by_rank; /* [nranks], NULL: no file */
  struct job* next;
};

static int read_dump(const char* path, uint64_t* hash, struct dump* d) {
  FILE* f = fopen(path, "r");
  if (!f) return -1;
  char line[512];
  int cap = 0, ok = 0;
  memset(d, 0, sizeof(*d));
  d->rank = d->nranks = -1;
  while (fgets(line, sizeof(line), f)) {
    if (line[0] == '#') {
      ok |= strncmp(line, "# chorus flight recorder 1", 26) == 0;
      continue;
    }
    if (!ok) break;
    char key[32], val[128];
    struct call c;
    memset(&c, 0, sizeof(c));
    int used = 0;
    if (sscanf(line, "%" SCNu64 " %" SCNu64 " %23s %23s %23s %d %" SCNu64 " %23s %23s %d %23s %23s %23s %" SCNu64
                     " %" SCNu64 " %" SCNu64 "%n",
               &c.id, &c.seq, c.func, c.type, c.op, &c.root, &c.count, c.algo, c.proto, &c.nch, c.exec, c.state,
               c.status, &c.t_enq, &c.t_start, &c.t_end, &used) == 16) {
      if (sscanf(line + used, " %" SCNx64, &c.tag) != 1) c.tag = 0;
      if (d->n == cap) {
        cap = cap ? 2 * cap : 256;
        struct call* p = realloc(d->c, sizeof(*p) * (size_t)cap);
        if (!p) break;
        d->c = p;
      }
      d->c[d->n++] = c;
      continue;
    }
    if (!strncmp(line, "name ", 5)) { /* the communicator's name: the rest of the line, spaces and all */
      snprintf(d->name, sizeof(d->name), "%.63s", line + 5);
      d->name[strcspn(d->name, "\n")] = '\0';
      continue;
    }
    if (sscanf(line, "%31s %127s", key, val) != 2) continue;
    if (!strcmp(key, "comm")) *hash = strtoull(val, NULL, 16);
    else if (!strcmp(key, "rank")) d->rank = atoi(val);
    else if (!strcmp(key, "nranks")) d->nranks = atoi(val);
    else if (!strcmp(key, "pid")) d->pid = atoi(val);
    else if (!strcmp(key, "host")) snprintf(d->host, sizeof(d->host), "%.63s", val);
    else if (!strcmp(key, "reason")) snprintf(d->reason, sizeof(d->reason), "%.31s", val);
    else if (!strcmp(key, "seq")) d->seq = strtoull(val, NULL, 10);
    else if (!strcmp(key, "recorded")) d->recorded = strtoull(val, NULL, 10);
    else if (!strcmp(key, "dumped_ns")) d->dumped = strtoull(val, NULL, 10);
  }
  fclose(f);
  if (!ok || d->rank < 0 || d->nranks <= 0 || d->rank >= d->nranks || d->nranks > (1 << 20)) {
    free(d->c);
    return -1;
  }
  return 0;
}

static int is_coll(const struct call* c) { return c->seq > 0; }
static int entered(const struct call* c) { return strcmp(c->state, "queued") != 0; }
static int finished(const struct call* c) { return !strcmp(c->state, "done") || !strcmp(c->state, "launched"); }

static const struct call* by_seq(const struct dump* d, uint64_t seq) {
  for (int i = d->n - 1; i >= 0; i--) /* seqs rise with ids: search from the end, where reports look */
    if (d->c[i].seq == seq) return &d->c[i];
  return NULL;
}

static void shape(const struct call* c, char* s, size_t n) {
  if (!strcmp(c->op, "-")) snprintf(s, n, "%s %s count %" PRIu64 "%s", c->func, c->type, c->count, "");
  else snprintf(s, n, "%s %s %s count %" PRIu64, c->func, c->type, c->op, c->count);
  if (c->root >= 0 && (!strcmp(c->func, "Broadcast") || !strcmp(c->func, "Reduce")))
    snprintf(s + strlen(s), n - strlen(s), " root %d", c->root);
}

/* shape and, where the caller gave one, its userProfilerTag: shown, not compared (a tag is the
 * profiler's business, and ranks may tag their calls differently). */
static void shown(const struct call* c, char* s, size_t n) {
  shape(c, s, n);
  if (c->tag) snprintf(s + strlen(s), n - strlen(s), " tag 0x%" PRIx64, c->tag);
}

static void describe(const struct job* j, FILE* out) {
  int n = j->nranks, have = 0;
  unsigned char* flags = calloc((size_t)n, 1);
  char list[256];
  if (!flags) return;
  for (int r = 0; r < n; r++) flags[r] = j->by_rank[r] != NULL, have += flags[r];
  const char* name = "";
  for (int r = 0; r < n && !name[0]; r++)
    if (j->by_rank[r]) name = j->by_rank[r]->name;
  fprintf(out, "comm %016" PRIx64 "%s%s%s: %d ranks, dumps from %d", j->hash, name[0] ? " \"" : "", name,
          name[0] ? "\"" : "", n, have);
  if (have < n) {
    boot_format_ranks(flags, n, 0, list, sizeof(list));
    fprintf(out, " (none from ranks %s: dead, unreachable, or CHORUS_FLIGHT_RECORDER=0 there)", list);
  }
  fprintf(out, "\n");
  uint64_t lo = UINT64_MAX, hi = 0; /* collective numbers every dump may speak of */
  for (int r = 0; r < n; r++) {
    const struct dump* d = j->by_rank[r];
    if (!d) continue;
    fprintf(out, "  rank %d (%s pid %d): dumped on %s; %" PRIu64 " calls recorded, last collective #%" PRIu64 "\n", r,
           d->host, d->pid, d->reason, d->recorded, d->seq);
    for (int i = 0; i < d->n; i++)
      if (is_coll(&d->c[i])) lo = d->c[i].seq < lo ? d->c[i].seq : lo, hi = d->c[i].seq > hi ? d->c[i].seq : hi;
  }
  if (hi == 0) {
    fprintf(out, "  no collective recorded\n");
    free(flags);
    return;
  }
  /* 1. The first collective whose shape differs between ranks that both recorded it. */
  for (uint64_t s = lo; s <= hi; s++) {
    const struct call* ref = NULL;
    char a[160], b[160];
    int differs = 0;
    for (int r = 0; r < n; r++) {
      const struct call* c = j->by_rank[r] ? by_seq(j->by_rank[r], s) : NULL;
      if (!c) continue;
      if (!ref) {
        ref = c;
        shape(c, a, sizeof(a));
      }
      shape(c, b, sizeof(b));
      differs |= strcmp(a, b) != 0;
    }
    if (!differs) continue;
    fprintf(out, "  DIVERGED at collective #%" PRIu64 ":\n", s);
    for (int r = 0; r < n; r++) {
      const struct call* c = j->by_rank[r] ? by_seq(j->by_rank[r], s) : NULL;
      if (!c) continue;
      shown(c, b, sizeof(b));
      fprintf(out, "    rank %d: %s (%s)\n", r, b, c->state);
    }
    break;
  }
  /* 2. Ranks behind: the latest collective some rank entered, and who did not. */
  uint64_t top = 0;
  for (int r = 0; r < n; r++)
    for (int i = 0; j->by_rank[r] && i < j->by_rank[r]->n; i++) {
      const struct call* c = &j->by_rank[r]->c[i];
      if (is_coll(c) && entered(c) && c->seq > top) top = c->seq;
    }
  const struct call* topc = NULL;
  for (int r = 0; r < n && !topc; r++) topc = j->by_rank[r] ? by_seq(j->by_rank[r], top) : NULL;
  int behind = 0, stuck = 0;
  for (int r = 0; r < n; r++) {
    const struct dump* d = j->by_rank[r];
    if (!d) continue;
    const struct call* c = by_seq(d, top);
    flags[r] = c && entered(c) ? (finished(c) ? 1 : 2) : 3;
    behind += flags[r] == 3, stuck += flags[r] == 2;
  }
  if (topc && (behind || stuck)) {
    char sh[160];
    shown(topc, sh, sizeof(sh));
    fprintf(out, "  latest collective: #%" PRIu64 " %s\n", top, sh);
    if (stuck) {
      boot_format_ranks(flags, n, 2, list, sizeof(list));
      fprintf(out, "    in it, not finished: ranks %s\n", list);
    }
    if (behind) {
      boot_format_ranks(flags, n, 3, list, sizeof(list));
      fprintf(out, "    NEVER ENTERED by ranks %s:\n", list);
      for (int r = 0; r < n; r++) {
        const struct dump* d = j->by_rank[r];
        if (!d || flags[r] != 3) continue;
        const struct call* last = NULL;
        for (int i = 0; i < d->n; i++)
          if (is_coll(&d->c[i]) && entered(&d->c[i])) last = &d->c[i];
        const struct call* open = NULL; /* a send, receive or other call it is in */
        for (int i = d->n - 1; i >= 0 && !open; i--)
          if (entered(&d->c[i]) && !finished(&d->c[i]) && strcmp(d->c[i].state, "failed")) open = &d->c[i];
        fprintf(out, "      rank %d: last entered #%" PRIu64 " (%s)", r, last ? last->seq : 0, last ? last->state : "-");
        if (open) fprintf(out, "; in %s with peer %d, %s", open->func, open->root, open->state);
        else fprintf(out, "; not in any call when dumped (busy outside the library?)");
        fprintf(out, "\n");
      }
    }
  } else if (topc) {
    fprintf(out, "  every rank with a dump finished collective #%" PRIu64 ", the latest\n", top);
  }
  /* 3. Who arrived last: per call, the rank whose start was latest (the one the others waited for). */
  int* last_count = calloc((size_t)n, sizeof(int));
  double* late_sum = calloc((size_t)n, sizeof(double));
  int ncalls = 0;
  for (uint64_t s = lo; s <= hi && last_count && late_sum; s++) {
    uint64_t first = UINT64_MAX, latest = 0;
    int who = -1, k = 0;
    for (int r = 0; r < n; r++) {
      const struct call* c = j->by_rank[r] ? by_seq(j->by_rank[r], s) : NULL;
      if (!c || !c->t_start) continue;
      k++;
      if (c->t_start < first) first = c->t_start;
      if (c->t_start >= latest) latest = c->t_start, who = r;
    }
    if (k < 2 || k < have) continue; /* only calls every dumping rank started */
    ncalls++;
    last_count[who]++;
    late_sum[who] += (double)(latest - first) / 1e3;
  }
  if (ncalls) {
    int worst = 0;
    for (int r = 1; r < n; r++) worst = last_count[r] > last_count[worst] ? r : worst;
    fprintf(out, "  last to arrive, over %d collectives every dumping rank started:\n", ncalls);
    for (int r = 0; r < n; r++)
      if (last_count[r])
        fprintf(out, "    rank %d: %d times (%.0f%%), on average %.1f us after the first%s\n", r, last_count[r],
               100.0 * last_count[r] / ncalls, late_sum[r] / last_count[r], r == worst ? "  <- slowest" : "");
  }
  free(last_count);
  free(late_sum);
  free(flags);
}

int flight_report(const char* dir, FILE* out) {
  DIR* dh = opendir(dir);
  if (!dh) {
    fprintf(stderr, "chorus-info: cannot open %s\n", dir);
    return 2;
  }
  struct job* jobs = NULL;
  int files = 0;
  struct dirent* de;
  while ((de = readdir(dh))) {
    size_t l = strlen(de->d_name);
    if (strncmp(de->d_name, "chorus-fr-", 10) || l < 5 || strcmp(de->d_name + l - 4, ".txt")) continue;
    char path[4096];
    snprintf(path, sizeof(path), "%s/%s", dir, de->d_name);
    uint64_t hash = 0;
    struct dump* d = malloc(sizeof(*d));
    if (!d || read_dump(path, &hash, d) != 0) {
      fprintf(stderr, "chorus-info: %s is not a flight recorder dump; skipped\n", path);
      free(d);
      continue;
    }
    struct job* j = jobs;
    while (j && !(j->hash == hash && j->nranks == d->nranks)) j = j->next;
    if (!j) {
      j = calloc(1, sizeof(*j));
      if (!j || !(j->by_rank = calloc((size_t)d->nranks, sizeof(*j->by_rank)))) {
        free(j), free(d->c), free(d);
        continue;
      }
      j->hash = hash, j->nranks = d->nranks, j->next = jobs;
      jobs = j;
    }
    if (j->by_rank[d->rank]) free(j->by_rank[d->rank]->c), free(j->by_rank[d->rank]);
    j->by_rank[d->rank] = d;
    files++;
  }
  closedir(dh);
  if (!files) {
    fprintf(out, "no flight recorder dumps (chorus-fr-*.txt) in %s\n", dir);
    return 1;
  }
  for (struct job* j = jobs; j; j = j->next) describe(j, out);
  while (jobs) {
    struct job* j = jobs;
    jobs = j->next;
    for (int r = 0; r < j->nranks; r++)
      if (j->by_rank[r]) free(j->by_rank[r]->c), free(j->by_rank[r]);
    free(j->by_rank);
    free(j);
  }
  return 0;
}
