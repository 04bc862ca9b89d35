/* A plugin kind loaded once per process (the tuner, the profiler): NCCL's rule, one library of a kind
 * per process, shared by every communicator that names the same value. */
#ifndef CH_PLUGIN_H
#define CH_PLUGIN_H

#include <pthread.h>

/* One kind's process-wide state. The caller holds mu around plugin_once_get and plugin_once_forget,
 * and around its own reference counts. */
struct plugin_once {
  const char* env;  /* "NCCL_TUNER_PLUGIN" */
  const char* kind; /* "tuner" */
  pthread_mutex_t mu;
  void* lib;        /* under mu: the kind's record of the loaded library (NULL: none) */
  char value[512];  /* under mu: the value lib was loaded for */
  char path[512];   /* under mu: what dlopen accepted for it */
  char failed[512]; /* under mu: the last value that did not load (failed_valid) */
  int failed_valid;
};
#define PLUGIN_ONCE_INIT(env_, kind_) \
  { .env = (env_), .kind = (kind_), .mu = PTHREAD_MUTEX_INITIALIZER }

/* The record for `value` (under o->mu): the loaded one when it was loaded for this value; NULL after a
 * WARN when another value's is loaded; else load(value, path) once, and a failure is remembered so that
 * the same value is neither retried nor reported again. load fills path with what it opened. */
void* plugin_once_get(struct plugin_once* o, const char* value, void* (*load)(const char* value, char path[512]));
/* lib is going (its last reference): a later get loads afresh (under o->mu). */
void plugin_once_forget(struct plugin_once* o, void* lib);
/* dlopen the first of cand[0..n) (ut_plugin_names) that loads, its index in *k; NULL after saying why:
 * INFO under subsys when value is empty (the default name: its absence is normal), else a WARN. */
void* plugin_open_logged(const struct plugin_once* o, unsigned subsys, const char* value, char cand[2][512], int n,
                         int* k);

#endif
