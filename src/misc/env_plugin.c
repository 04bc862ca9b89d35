/* NCCL's environment plugin (env_plugin.h). NCCL reads every variable through the plugin's getEnv once
 * NCCL_ENV_PLUGIN has loaded one; Chorus reads every parameter of its table so (misc/param.c), the
 * exceptions being the variables it reads as other programs define them (the launchers', TMPDIR,
 * NVTX_INJECTION64_PATH, CHORUS_SECRET, FI_PROVIDER) and the two that say where values come from
 * (NCCL_ENV_PLUGIN, NCCL_CONF_FILE). ncclEnvPlugin_v2 is tried first, then ncclEnvPlugin_v1, as NCCL
 * does. A plugin that does not load or init is reported, and values come from the environment.
 *
 * Logging reads parameters (NCCL_DEBUG*), and those come through the plugin: so while this thread is
 * inside the plugin (loading it, init, getEnv) every line it or the plugin makes waits (log_defer) and
 * is printed once the read that needed the plugin is over (param.c and log_init flush them). */
#include <dlfcn.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "env_abi.h"
#include "env_plugin.h"
#include "log.h"
#include "utils.h"

struct envp {
  void* dl;
  int version; /* 2 or 1 */
  const char* name;
  ncclResult_t (*finalize)(void);
  const char* (*get)(const char* name);
};

static pthread_mutex_t load_mu = PTHREAD_MUTEX_INITIALIZER; /* held while loading */
static int loaded;                                          /* atomic: envp_load has run (under load_mu) */
static pthread_mutex_t use_mu = PTHREAD_MUTEX_INITIALIZER;  /* around getEnv, and taking cur away */
static struct envp* cur;  /* under use_mu: the plugin values come from; NULL: the environment */
static struct envp lib;   /* cur's storage; written only while loading (under load_mu), before cur is set */
static __thread int busy; /* this thread is inside the plugin: its lines wait (log_defer) */
static pthread_once_t hooks_once = PTHREAD_ONCE_INIT;

/* The logger handed to a v2 plugin: its lines go where Chorus's go, or wait while this thread is
 * inside the plugin (its WARN and ABORT lines always print; INFO and TRACE as NCCL_DEBUG asks). */
static void envp_logger(ncclDebugLogLevel level, unsigned long flags, const char* file, int line, const char* fmt,
                        ...) {
  va_list ap;
  va_start(ap, fmt);
  int warn = level == NCCL_LOG_WARN || level == NCCL_LOG_ABORT;
  if (!busy) log_plugin_v("env plugin", LOG_TRACE, (int)level, flags, file, line, fmt, ap);
  else if (fmt && (warn || level == NCCL_LOG_INFO || level == NCCL_LOG_TRACE))
    log_defer_v(warn ? LOG_WARN : (int)level, warn ? (unsigned)LOG_ALL : (unsigned)flags, file ? file : "env plugin",
                line, fmt, ap);
  va_end(ap);
}

/* As NCCL: at exit, or never. Values come from the environment afterwards. The library stays mapped:
 * other exit handlers may still be running code of it or of its dependencies. */
static void envp_finalize(void) {
  pthread_mutex_lock(&use_mu); /* a getEnv in flight on another thread ends first */
  struct envp* p = cur;
  cur = NULL;
  pthread_mutex_unlock(&use_mu);
  if (!p || !p->finalize) return;
  ncclResult_t rc = p->finalize();
  if (rc != ncclSuccess) INFO(LOG_ENV, "env plugin %s: finalize returned %d", p->name, (int)rc);
}

/* Fork: a child must not inherit these locks held by a thread it lacks. A fork from inside the plugin
 * (its init or getEnv running a command) would wait for a lock its own thread holds: that one leaves
 * them as they are. */
static __thread int fork_locked;
static void at_prepare(void) {
  if (busy) return;
  pthread_mutex_lock(&load_mu);
  pthread_mutex_lock(&use_mu);
  fork_locked = 1;
}
static void at_release(void) {
  if (!fork_locked) return;
  fork_locked = 0;
  pthread_mutex_unlock(&use_mu);
  pthread_mutex_unlock(&load_mu);
}
static void register_hooks(void) {
  ut_atfork_register(at_prepare, at_release, at_release);
  atexit(envp_finalize);
}

/* The plugin value names, initialised; NULL after saying why (deferred lines). */
static struct envp* open_plugin(const char* value) {
  char cand[2][512], err[2][256] = {"", ""};
  if (strlen(value) >= sizeof(cand[0])) {
    log_defer(LOG_WARN, LOG_ALL, __FILE__, __LINE__,
              "NCCL_ENV_PLUGIN is longer than %zu characters; parameters are read from the environment",
              sizeof(cand[0]) - 1);
    return NULL;
  }
  int n = ut_plugin_names("env", value, cand), k = 0;
  if (n == 0) return NULL; /* "none" */
  void* dl = ut_plugin_open(cand, n, &k, err);
  if (!dl) {
    if (!*value) /* the default name: its absence is normal */
      log_defer(LOG_INFO, LOG_INIT | LOG_ENV, __FILE__, __LINE__, "no env plugin (%s: %s)", cand[0], err[0]);
    else if (n == 2)
      log_defer(LOG_WARN, LOG_ALL, __FILE__, __LINE__,
                "NCCL_ENV_PLUGIN=%s: could not load %s (%s) nor %s (%s); parameters are read from the environment",
                value, cand[0], err[0], cand[1], err[1]);
    else
      log_defer(LOG_WARN, LOG_ALL, __FILE__, __LINE__,
                "NCCL_ENV_PLUGIN=%s: could not load %s (%s); parameters are read from the environment", value, cand[0],
                err[0]);
    return NULL;
  }
  const ncclEnv_v2_t* v2 = dlsym(dl, "ncclEnvPlugin_v2");
  const ncclEnv_v1_t* v1 = v2 ? NULL : dlsym(dl, "ncclEnvPlugin_v1");
  /* v1 and v2 tables have the same members in the same places; only init's arguments differ. */
  const ncclEnv_v1_t* t = v2 ? (const ncclEnv_v1_t*)(const void*)v2 : v1;
  const char* missing = !t ? NULL : !t->name ? "name" : !t->init ? "init" : !t->getEnv ? "getEnv" : NULL;
  if (!t || missing) {
    log_defer(LOG_WARN, LOG_ALL, __FILE__, __LINE__,
              "NCCL_ENV_PLUGIN=%s: %s %s%s; parameters are read from the environment", value, cand[k],
              t ? "has a NULL " : "exports neither ncclEnvPlugin_v2 nor ncclEnvPlugin_v1", t ? missing : "");
    dlclose(dl);
    return NULL;
  }
  ncclResult_t rc = v2 ? v2->init(NCCL_MAJOR, NCCL_MINOR, NCCL_PATCH, NCCL_SUFFIX, envp_logger)
                       : v1->init(NCCL_MAJOR, NCCL_MINOR, NCCL_PATCH, NCCL_SUFFIX);
  if (rc != ncclSuccess) { /* NCCL's documented rule: its own (the environment) takes over */
    log_defer(LOG_WARN, LOG_ALL, __FILE__, __LINE__,
              "env plugin %s (%s): init returned %d; parameters are read from the environment", t->name, cand[k],
              (int)rc);
    return NULL; /* left loaded: its init may have started what unloading would break */
  }
  lib = (struct envp){.dl = dl, .version = v2 ? 2 : 1, .name = t->name, .finalize = t->finalize, .get = t->getEnv};
  log_defer(LOG_INFO, LOG_INIT | LOG_ENV, __FILE__, __LINE__,
            "env plugin %s (ncclEnvPlugin_v%d) loaded from %s; parameters are read through it", lib.name, lib.version,
            cand[k]);
  return &lib;
}

void envp_load(const char* value) {
  if (__atomic_load_n(&loaded, __ATOMIC_ACQUIRE)) return;
  pthread_mutex_lock(&load_mu);
  if (!loaded) {
    busy++;
    struct envp* p = open_plugin(value ? value : "");
    busy--;
    if (p) {
      pthread_once(&hooks_once, register_hooks);
      pthread_mutex_lock(&use_mu);
      cur = p;
      pthread_mutex_unlock(&use_mu);
    }
    __atomic_store_n(&loaded, 1, __ATOMIC_RELEASE);
  }
  pthread_mutex_unlock(&load_mu);
}

int envp_loaded(void) { return __atomic_load_n(&loaded, __ATOMIC_ACQUIRE); }

const char* envp_getenv(const char* name, const char** source) {
  pthread_mutex_lock(&use_mu);
  const char* v;
  if (cur) {
    busy++;
    v = cur->get(name);
    busy--;
    *source = "env plugin";
  } else {
    v = getenv(name);
    *source = "environment";
  }
  pthread_mutex_unlock(&use_mu);
  return v;
}

void envp_reset_for_tests(void) {
  pthread_mutex_lock(&load_mu);
  envp_finalize();
  if (lib.dl) dlclose(lib.dl);
  memset(&lib, 0, sizeof(lib));
  __atomic_store_n(&loaded, 0, __ATOMIC_RELEASE);
  pthread_mutex_unlock(&load_mu);
}
