/* Plugin kinds loaded once per process (plugin.h). */
#include <stdio.h>
#include <string.h>

#include "log.h"
#include "plugin.h"
#include "utils.h"

void* plugin_once_get(struct plugin_once* o, const char* value, void* (*load)(const char* value, char path[512])) {
  if (o->lib && strcmp(o->value, value) == 0) return o->lib;
  if (o->lib) {
    WARN("%s=%s: this process already uses %s plugin %s (%s=%s); this communicator goes without one", o->env, value,
         o->kind, o->path, o->env, o->value);
    return NULL;
  }
  if (o->failed_valid && strcmp(o->failed, value) == 0) return NULL;
  char path[512] = "";
  o->lib = load(value, path);
  if (o->lib) {
    snprintf(o->value, sizeof(o->value), "%.511s", value);
    snprintf(o->path, sizeof(o->path), "%.511s", path);
  } else {
    snprintf(o->failed, sizeof(o->failed), "%s", value), o->failed_valid = 1;
  }
  return o->lib;
}

void plugin_once_forget(struct plugin_once* o, void* lib) {
  if (o->lib == lib) o->lib = NULL;
}

void* plugin_open_logged(const struct plugin_once* o, unsigned subsys, const char* value, char cand[2][512], int n,
                         int* k) {
  char err[2][256] = {"", ""};
  void* dl = ut_plugin_open(cand, n, k, err);
  if (dl) return dl;
  if (!*value) /* the default name: its absence is normal */
    INFO(subsys, "no %s plugin (%s: %s)", o->kind, cand[0], err[0]);
  else if (n == 2)
    WARN("%s=%s: could not load %s (%s) nor %s (%s); continuing without a %s plugin", o->env, value, cand[0], err[0],
         cand[1], err[1], o->kind);
  else WARN("%s=%s: could not load %s (%s); continuing without a %s plugin", o->env, value, cand[0], err[0], o->kind);
  return NULL;
}
