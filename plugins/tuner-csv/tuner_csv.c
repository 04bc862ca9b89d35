/* Example tuner plugin (NCCL's tuner ABI v6 and v5): rules from the CSV file named by
 * NCCL_TUNER_CONFIG_FILE, one per line,
 *   collective,minbytes,maxbytes,algorithm,protocol[,channels[,nNodes[,nRanks[,numPipeOps[,regBuff]]]]]
 * (-1 = any; '#' starts a comment). The first rule matching a call makes its algorithm/protocol
 * entry cost 0, so it wins wherever the library can run it; channels >= 0 sets the channel count.
 * Names are case-insensitive: broadcast, reduce, allgather, reducescatter, allreduce; tree, ring,
 * collnet_direct, collnet_chain, nvls, nvls_tree, pat; ll, ll128, simple. */
#include <ctype.h>
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "plugin_abi.h"

#define EXPORT __attribute__((visibility("default")))
#define MAX_RULES 256

struct rule {
  int coll, algo, proto, channels, nnodes, nranks, pipe_ops, reg_buff;
  long long min_bytes, max_bytes; /* max -1: no bound */
  int line;
};

struct ctx {
  size_t nranks, nnodes;
  ncclDebugLogger_t log;
  int nrules;
  struct rule rules[MAX_RULES];
};

#define LOG(c, level, ...) \
  do {                     \
    if ((c)->log) (c)->log(level, 0x40 /* NCCL_TUNING */, __FILE__, __LINE__, __VA_ARGS__); \
  } while (0)

static int lookup(const char* s, const char* const* names, int n) {
  for (int i = 0; i < n; i++)
    if (strcasecmp(s, names[i]) == 0) return i;
  return -1;
}

static const char* const colls[] = {"broadcast", "reduce", "allgather", "reducescatter", "allreduce"};
static const char* const algos[] = {"tree", "ring", "collnet_direct", "collnet_chain", "nvls", "nvls_tree", "pat"};
static const char* const algos2[] = {"tree", "ring", "collnetdirect", "collnetchain", "nvls", "nvlstree", "pat"};
static const char* const protos[] = {"ll", "ll128", "simple"};

static char* trim(char* s) {
  while (isspace((unsigned char)*s)) s++;
  char* e = s + strlen(s);
  while (e > s && isspace((unsigned char)e[-1])) *--e = 0;
  return s;
}

static int parse_int(const char* s, long long* out) {
  char* end;
  errno = 0;
  long long v = strtoll(s, &end, 10);
  if (errno || end == s || *trim(end) || v < -1) return -1;
  *out = v;
  return 0;
}

/* One line into r; 0 ok, 1 blank/comment, -1 malformed (why set). */
static int parse_line(char* text, struct rule* r, const char** why) {
  char* hash = strchr(text, '#');
  if (hash) *hash = 0;
  char* s = trim(text);
  if (!*s) return 1;
  char* field[10];
  int n = 0;
  for (char* p = s;;) {
    if (n == 10) return *why = "more than 10 fields", -1;
    char* comma = strchr(p, ',');
    if (comma) *comma = 0;
    field[n++] = trim(p);
    if (!comma) break;
    p = comma + 1;
  }
  if (n < 5) {
    *why = "fewer than 5 fields (collective,minbytes,maxbytes,algorithm,protocol)";
    return -1;
  }
  if ((r->coll = lookup(field[0], colls, 5)) < 0) return *why = "unknown collective", -1;
  if ((r->algo = lookup(field[3], algos, 7)) < 0 && (r->algo = lookup(field[3], algos2, 7)) < 0)
    return *why = "unknown algorithm", -1;
  if ((r->proto = lookup(field[4], protos, 3)) < 0) return *why = "unknown protocol", -1;
  long long v[7] = {-1, -1, -1, -1, -1, -1, -1}; /* min, max, channels, nNodes, nRanks, numPipeOps, regBuff */
  int idx[7] = {1, 2, 5, 6, 7, 8, 9};
  for (int i = 0; i < 7; i++)
    if (idx[i] < n && parse_int(field[idx[i]], &v[i]) != 0) return *why = "a number field is not an integer >= -1", -1;
  for (int i = 2; i < 7; i++) /* int fields: a bigger number must not wrap into a small one */
    if (v[i] > INT_MAX) return *why = "a number field is larger than an int", -1;
  if (v[0] < 0) v[0] = 0;
  if (v[1] >= 0 && v[1] < v[0]) return *why = "maxbytes is below minbytes", -1;
  r->min_bytes = v[0], r->max_bytes = v[1];
  r->channels = (int)v[2], r->nnodes = (int)v[3], r->nranks = (int)v[4], r->pipe_ops = (int)v[5], r->reg_buff = (int)v[6];
  return 0;
}

static ncclResult_t csv_init(void** context, uint64_t comm_id, size_t nranks, size_t nnodes, ncclDebugLogger_t log,
                             ncclNvlDomainInfo_v6_t* dom, ncclTunerConstants_v6_t* consts) {
  (void)comm_id, (void)dom, (void)consts;
  struct ctx* c = calloc(1, sizeof(*c));
  if (!c) return ncclSystemError;
  c->nranks = nranks, c->nnodes = nnodes, c->log = log;
  *context = c;
  const char* path = getenv("NCCL_TUNER_CONFIG_FILE");
  if (!path || !*path) {
    LOG(c, NCCL_LOG_INFO, "tuner-csv: NCCL_TUNER_CONFIG_FILE is not set; no rules");
    return ncclSuccess;
  }
  FILE* f = fopen(path, "r");
  if (!f) {
    LOG(c, NCCL_LOG_WARN, "tuner-csv: cannot open NCCL_TUNER_CONFIG_FILE=%s: %s; no rules", path, strerror(errno));
    return ncclSuccess;
  }
  char line[512];
  for (int no = 1; fgets(line, sizeof(line), f); no++) {
    const char* why = NULL;
    struct rule r;
    if (!strchr(line, '\n') && !feof(f)) { /* longer than the buffer: skip the rest, never parse it as a line */
      int ch;
      while ((ch = fgetc(f)) != EOF && ch != '\n') {}
      LOG(c, NCCL_LOG_WARN, "tuner-csv: %s line %d ignored: longer than %zu characters", path, no, sizeof(line) - 2);
      continue;
    }
    int rc = parse_line(line, &r, &why);
    if (rc == 1) continue;
    if (rc < 0) {
      LOG(c, NCCL_LOG_WARN, "tuner-csv: %s line %d ignored: %s", path, no, why);
      continue;
    }
    if (c->nrules == MAX_RULES) {
      LOG(c, NCCL_LOG_WARN, "tuner-csv: %s: more than %d rules; the rest are ignored", path, MAX_RULES);
      break;
    }
    r.line = no;
    c->rules[c->nrules++] = r;
  }
  fclose(f);
  LOG(c, NCCL_LOG_INFO, "tuner-csv: %d rule(s) from %s for %zu ranks on %zu node(s)", c->nrules, path, nranks, nnodes);
  return ncclSuccess;
}

static ncclResult_t csv_get_coll_info(void* context, ncclFunc_t coll, size_t nbytes, int pipe_ops, float** cost_table,
                                      int num_algo, int num_proto, int reg_buff, int* nchannels) {
  struct ctx* c = context;
  float* table = (float*)(void*)cost_table; /* float[num_algo][num_proto] */
  for (int i = 0; i < c->nrules; i++) {
    const struct rule* r = &c->rules[i];
    if (r->coll != (int)coll || (long long)nbytes < r->min_bytes) continue;
    if (r->max_bytes >= 0 && (long long)nbytes > r->max_bytes) continue;
    if ((r->nranks >= 0 && (size_t)r->nranks != c->nranks) || (r->nnodes >= 0 && (size_t)r->nnodes != c->nnodes)) continue;
    if ((r->pipe_ops >= 0 && r->pipe_ops != pipe_ops) || (r->reg_buff >= 0 && r->reg_buff != reg_buff)) continue;
    if (r->algo >= num_algo || r->proto >= num_proto) continue;
    float* e = &table[r->algo * num_proto + r->proto];
    if (*e == (float)NCCL_ALGO_PROTO_IGNORE) {
      LOG(c, NCCL_LOG_INFO, "tuner-csv: rule of line %d: %s/%s is not available for %s %zu bytes", r->line,
          algos[r->algo], protos[r->proto], colls[r->coll], nbytes);
      continue; /* the next matching rule may apply */
    }
    *e = 0.0f;
    if (r->channels >= 0) *nchannels = r->channels;
    LOG(c, NCCL_LOG_INFO, "tuner-csv: %s %zu bytes: rule of line %d -> %s/%s", colls[r->coll], nbytes, r->line,
        algos[r->algo], protos[r->proto]);
    return ncclSuccess;
  }
  return ncclSuccess;
}

static ncclResult_t csv_finalize(void* context) {
  free(context);
  return ncclSuccess;
}

EXPORT const ncclTuner_v6_t ncclTunerPlugin_v6 = {"csv", csv_init, csv_get_coll_info, csv_finalize, NULL};
EXPORT const ncclTuner_v5_t ncclTunerPlugin_v5 = {"csv", csv_init, csv_get_coll_info, csv_finalize};
