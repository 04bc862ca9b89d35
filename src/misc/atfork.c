/* The process's one pthread_atfork registration (utils.h, ut_atfork_register): every subsystem's fork
 * hooks are rows of one table, run in pthread_atfork's own order. */
#include <pthread.h>

#include "utils.h"

#define UT_ATFORK_MAX 16 /* nine subsystems register today */

struct hooks {
  void (*prepare)(void), (*parent)(void), (*child)(void);
};
/* Rows are appended under mu and never removed. mu is held from the prepare hooks to the parent's or
 * child's, as glibc holds its own lock across fork, so no row appears half-way through one. */
static struct hooks rows[UT_ATFORK_MAX];
static int nrows;
static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_once_t once = PTHREAD_ONCE_INIT;

static void run_prepare(void) {
  pthread_mutex_lock(&mu);
  for (int i = nrows - 1; i >= 0; i--)
    if (rows[i].prepare) rows[i].prepare();
}
static void run_parent(void) {
  for (int i = 0; i < nrows; i++)
    if (rows[i].parent) rows[i].parent();
  pthread_mutex_unlock(&mu);
}
static void run_child(void) {
  for (int i = 0; i < nrows; i++)
    if (rows[i].child) rows[i].child();
  pthread_mutex_unlock(&mu); /* taken by this (the forking) thread in run_prepare */
}
static void install(void) { pthread_atfork(run_prepare, run_parent, run_child); }

void ut_atfork_register(void (*prepare)(void), void (*parent)(void), void (*child)(void)) {
  pthread_once(&once, install);
  pthread_mutex_lock(&mu);
  int full = nrows == UT_ATFORK_MAX;
  if (!full) rows[nrows++] = (struct hooks){prepare, parent, child};
  pthread_mutex_unlock(&mu);
  if (full) pthread_atfork(prepare, parent, child); /* a row more than planned: still run, in glibc's order */
}
