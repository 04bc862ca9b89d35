/* The parameter table: each value is resolved once (environment, then config files, then default)
 * and cached. The fast path is one acquire load, so hot loops may call param_int freely.
 * This is the only file that reads the environment for the table, through NCCL's environment plugin
 * when NCCL_ENV_PLUGIN loads one (misc/env_plugin.c): its getEnv then takes the environment's place. */
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "env_plugin.h"
#include "log.h"
#include "param.h"

static const struct {
  const char* env;
  enum param_kind kind;
  int64_t default_int;
  const char* default_str;
  const char* help;
} table[PARAM_COUNT] = {
#define CH_PARAM_ROW(id, env, kind, di, ds, help) {env, kind, (int64_t)(di), ds, help},
    CH_PARAM_TABLE(CH_PARAM_ROW)
#undef CH_PARAM_ROW
};

struct slot {
  int loaded;         /* atomic; 1 once ival/sval/source are valid */
  int64_t ival;       /* atomic (relaxed) */
  const char* sval;   /* atomic (relaxed); never freed, see arena */
  const char* source; /* atomic (relaxed) */
};
static struct slot slots[PARAM_COUNT];
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;

/* Strings handed out by param_str may be held by callers across param_reset, so nothing is ever
 * freed: every allocation is chained here (which also keeps it reachable for leak checkers). */
struct arena_blk {
  struct arena_blk* next;
  char data[];
};
static struct arena_blk* arena;

static char* arena_strdup(const char* s) {
  size_t n = strlen(s) + 1;
  struct arena_blk* b = malloc(sizeof(*b) + n);
  if (!b) return NULL;
  memcpy(b->data, s, n);
  b->next = arena;
  arena = b;
  return b->data;
}

/* Config file entries, first file first; the first occurrence of a key wins. */
struct conf_entry {
  const char* key;
  const char* value;
  const char* path;
  struct conf_entry* next;
};
static struct conf_entry* conf_head;
static int conf_loaded;

static char* trim(char* s) {
  while (*s == ' ' || *s == '\t') s++;
  size_t n = strlen(s);
  while (n > 0 && (s[n - 1] == ' ' || s[n - 1] == '\t' || s[n - 1] == '\n' || s[n - 1] == '\r')) s[--n] = '\0';
  return s;
}

static void conf_read_file(const char* path) {
  FILE* f = fopen(path, "re");
  if (!f) return;
  const char* kept_path = arena_strdup(path);
  struct conf_entry** tail = &conf_head;
  while (*tail) tail = &(*tail)->next;
  char line[4096];
  while (kept_path && fgets(line, sizeof(line), f)) {
    char* l = trim(line);
    if (l[0] == '#' || l[0] == '\0') continue;
    char* eq = strchr(l, '=');
    if (!eq) continue;
    *eq = '\0';
    char* key = trim(l);
    char* value = trim(eq + 1);
    if (!key[0]) continue;
    /* The entry itself lives in the arena too (as a string-sized block). */
    struct arena_blk* b = malloc(sizeof(*b) + sizeof(struct conf_entry));
    if (!b) break;
    b->next = arena;
    arena = b;
    struct conf_entry* e = (struct conf_entry*)(void*)b->data;
    e->key = arena_strdup(key);
    e->value = arena_strdup(value);
    e->path = kept_path;
    e->next = NULL;
    if (!e->key || !e->value) break;
    *tail = e;
    tail = &e->next;
  }
  fclose(f);
}

/* Called with the lock held. */
static void conf_load(void) {
  if (conf_loaded) return;
  conf_loaded = 1;
  conf_head = NULL;
  const char* user = getenv("NCCL_CONF_FILE");
  if (user && user[0]) {
    conf_read_file(user);
  } else {
    const char* home = getenv("HOME");
    if (home && home[0]) {
      char path[4096];
      snprintf(path, sizeof(path), "%s/.nccl.conf", home);
      conf_read_file(path);
    }
  }
  conf_read_file("/etc/nccl.conf");
}

static const char* conf_lookup(const char* key, const char** path) {
  for (struct conf_entry* e = conf_head; e; e = e->next)
    if (strcmp(e->key, key) == 0) {
      *path = e->path;
      return e->value;
    }
  return NULL;
}

static int parse_int(const char* s, int64_t* out) {
  char* end;
  errno = 0;
  long long v = strtoll(s, &end, 0);
  if (end == s || errno == ERANGE) return -1;
  while (*end == ' ' || *end == '\t') end++;
  if (*end) return -1;
  *out = v;
  return 0;
}

/* NCCL's booleans: 1, T, TRUE or 0, F, FALSE, any case. */
static int parse_bool(const char* s, int64_t* out) {
  if (!strcmp(s, "1") || !strcasecmp(s, "T") || !strcasecmp(s, "TRUE")) *out = 1;
  else if (!strcmp(s, "0") || !strcasecmp(s, "F") || !strcasecmp(s, "FALSE")) *out = 0;
  else return -1;
  return 0;
}

/* What to log once the lock is released (logging reads parameters itself). */
struct pending_log {
  int bad_int;
  int announce;
  char text[512];
};

static void load_locked(enum param_id id, struct pending_log* pl) {
  struct slot* s = &slots[id];
  const char* env = table[id].env;
  const char *source = "default", *from = "environment";
  /* where values come from is read from the environment itself (and NCCL_ENV_PLUGIN from config files) */
  const char* v = id == PARAM_ENV_PLUGIN || id == PARAM_CONF_FILE ? getenv(env) : envp_getenv(env, &from);
  if (v) { /* set, even empty: a config file does not override it (NCCL applies them with setenv(.., 0)) */
    if (v[0]) source = from;
    else v = NULL; /* empty: the default, as unset */
  } else if (id != PARAM_CONF_FILE) {
    conf_load();
    const char* path = NULL;
    v = conf_lookup(env, &path);
    if (v && v[0]) source = path;
    else v = NULL;
  } else {
    v = NULL;
  }

  int64_t ival = table[id].default_int;
  const char* sval = table[id].default_str;
  if (v) {
    if (table[id].kind != P_STR) {
      if ((table[id].kind == P_BOOL ? parse_bool(v, &ival) : parse_int(v, &ival)) != 0) {
        pl->bad_int = 1;
        snprintf(pl->text, sizeof(pl->text), "Invalid value \"%s\" for %s (from %s); using default %lld", v, env,
                 source, (long long)table[id].default_int);
        ival = table[id].default_int;
        source = "default";
      } else {
        pl->announce = 1;
        snprintf(pl->text, sizeof(pl->text), "%s set by %s%s to %lld.", env,
                 source[0] == '/' ? "config file " : "", source, (long long)ival);
      }
    } else {
      const char* copy = arena_strdup(v);
      if (copy) sval = copy;
      pl->announce = 1;
      snprintf(pl->text, sizeof(pl->text), "%s set by %s%s to %s.", env, source[0] == '/' ? "config file " : "",
               source, sval);
    }
  }
  __atomic_store_n(&s->ival, ival, __ATOMIC_RELAXED);
  __atomic_store_n(&s->sval, sval, __ATOMIC_RELAXED);
  __atomic_store_n(&s->source, source, __ATOMIC_RELAXED);
  __atomic_store_n(&s->loaded, 1, __ATOMIC_RELEASE);
}

/* The environment plugin first, once per process (NCCL loads it before reading any variable): named by
 * NCCL_ENV_PLUGIN, from the environment or the config files. Nothing is logged until it is loaded: its
 * lines wait (log_defer) because logging reads parameters, which would come through it. */
static void env_plugin_first(void) {
  if (envp_loaded()) return;
  struct pending_log pl = {0};
  pthread_mutex_lock(&lock);
  if (!slots[PARAM_ENV_PLUGIN].loaded) load_locked(PARAM_ENV_PLUGIN, &pl);
  const char* value = __atomic_load_n(&slots[PARAM_ENV_PLUGIN].sval, __ATOMIC_RELAXED); /* in the arena: kept */
  pthread_mutex_unlock(&lock);
  if (pl.announce) log_defer(LOG_INFO, LOG_ENV, __FILE__, __LINE__, "%s", pl.text); /* a string: never bad */
  envp_load(value ? value : "");
}

static void ensure_loaded(enum param_id id) {
  if (__atomic_load_n(&slots[id].loaded, __ATOMIC_ACQUIRE)) return;
  if (id != PARAM_ENV_PLUGIN && id != PARAM_CONF_FILE) env_plugin_first();
  struct pending_log pl = {0};
  pthread_mutex_lock(&lock);
  if (!slots[id].loaded) load_locked(id, &pl);
  pthread_mutex_unlock(&lock);
  if (pl.bad_int) WARN("%s", pl.text);
  else if (pl.announce) INFO(LOG_ENV, "%s", pl.text);
  log_flush_deferred(); /* the plugin's lines, and its loading's */
}

int64_t param_int(enum param_id id) {
  if ((unsigned)id >= PARAM_COUNT) return 0;
  ensure_loaded(id);
  if (table[id].kind == P_STR) return 0;
  return __atomic_load_n(&slots[id].ival, __ATOMIC_RELAXED);
}

const char* param_str(enum param_id id) {
  if ((unsigned)id >= PARAM_COUNT) return "";
  ensure_loaded(id);
  if (table[id].kind != P_STR) return "";
  const char* s = __atomic_load_n(&slots[id].sval, __ATOMIC_RELAXED);
  return s ? s : "";
}

int param_is_set(enum param_id id) {
  if ((unsigned)id >= PARAM_COUNT) return 0;
  ensure_loaded(id);
  return strcmp(__atomic_load_n(&slots[id].source, __ATOMIC_RELAXED), "default") != 0;
}

void param_describe(enum param_id id, struct param_info* out) {
  memset(out, 0, sizeof(*out));
  if ((unsigned)id >= PARAM_COUNT) return;
  ensure_loaded(id);
  out->env = table[id].env;
  out->kind = table[id].kind;
  out->default_int = table[id].default_int;
  out->default_str = table[id].default_str;
  out->help = table[id].help;
  out->source = __atomic_load_n(&slots[id].source, __ATOMIC_RELAXED);
  out->published = strncmp(table[id].help, "testing aid", 11) != 0;
}

const char* param_name(enum param_id id) { return (unsigned)id < PARAM_COUNT ? table[id].env : NULL; }

int param_find(const char* env) {
  for (int i = 0; i < PARAM_COUNT; i++)
    if (!strcmp(table[i].env, env)) return i;
  return -1;
}

void param_reset(void) {
  pthread_mutex_lock(&lock);
  for (int i = 0; i < PARAM_COUNT; i++) __atomic_store_n(&slots[i].loaded, 0, __ATOMIC_RELEASE);
  conf_loaded = 0; /* old entries stay in the arena */
  pthread_mutex_unlock(&lock);
  log_reset(); /* the log configuration is derived from parameters too */
}
