/* See report_util.h. */
#include "report_util.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include "chorus.h"
#include "runner.h"

#define RU_TEXT 16384

struct ru_monitor {
  ncclComm_t comm;
  const char* want;
  atomic_int* done;
  pthread_t t;
  char* text;
};

static double secs(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + (double)t.tv_nsec / 1e9;
}

atomic_int* ru_flag_new(void) {
  atomic_int* f = mmap(NULL, sizeof(*f), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  ASSERT(f != MAP_FAILED);
  atomic_store(f, 0);
  return f;
}

void ru_flag_free(atomic_int* flag) { munmap(flag, sizeof(*flag)); }

void ru_flag_wait(atomic_int* flag) {
  for (double end = secs() + 20; !atomic_load(flag) && secs() < end;) usleep(10 * 1000);
}

static void* watch(void* arg) {
  struct ru_monitor* m = arg;
  for (double end = secs() + 15; secs() < end; usleep(20 * 1000))
    if (chorusCommStallReport(m->comm, m->text, RU_TEXT, NULL) != ncclSuccess || strstr(m->text, m->want)) break;
  atomic_store(m->done, 1);
  return NULL;
}

struct ru_monitor* ru_monitor_start(ncclComm_t comm, const char* want, atomic_int* done) {
  struct ru_monitor* m = calloc(1, sizeof(*m));
  ASSERT(m != NULL);
  m->text = calloc(1, RU_TEXT);
  ASSERT(m->text != NULL);
  m->comm = comm, m->want = want, m->done = done;
  ASSERT(pthread_create(&m->t, NULL, watch, m) == 0);
  return m;
}

char* ru_monitor_join(struct ru_monitor* m) {
  pthread_join(m->t, NULL);
  char* text = m->text;
  free(m);
  return text;
}
