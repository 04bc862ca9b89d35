/* What may cross the bootstrap instead of addresses and descriptors: random 64-bit tokens.
 *
 * Local registry: memory that threads of this process share (a local FIFO, the thread clique) is
 * published under a token; a peer thread that presents the token gets the pointer and a reference.
 * A token that this process never published (a forged handle) finds nothing. Descriptors for other
 * processes go through fdpass.c. */
#include <pthread.h>
#include <stdlib.h>
#include <unistd.h>

#include "../misc/utils.h"
#include "transport.h"

uint64_t tp_fresh_token(void) {
  uint64_t t = 0;
  while (t == 0)
    if (ut_random(&t, sizeof(t)) != CH_OK) t = ut_hash(&t, sizeof(t), ut_now_ns() ^ (uint64_t)getpid());
  return t;
}

/* ------------------------------------------------------------------ local registry ---- */

/* Entries are few (FIFOs between publish and connect, cliques during init): a list under one lock,
 * taken only at connection setup. */
struct local_ent {
  uint64_t token;
  void* mem;
  _Atomic int* refs;
  struct local_ent* next;
};
static pthread_mutex_t local_mu = PTHREAD_MUTEX_INITIALIZER;
static struct local_ent* local_list; /* local_mu */
static pthread_once_t hooks_once = PTHREAD_ONCE_INIT;
/* A fork child must not inherit the lock held by a thread that does not exist there. */
static void at_prepare(void) { pthread_mutex_lock(&local_mu); }
static void at_parent(void) { pthread_mutex_unlock(&local_mu); }
static void install_fork_hooks(void) { ut_atfork_register(at_prepare, at_parent, at_parent); }

uint64_t tp_local_publish(void* mem, _Atomic int* refs) {
  pthread_once(&hooks_once, install_fork_hooks);
  struct local_ent* e = malloc(sizeof(*e));
  if (!e) return 0;
  e->token = tp_fresh_token();
  e->mem = mem;
  e->refs = refs;
  pthread_mutex_lock(&local_mu);
  e->next = local_list;
  local_list = e;
  pthread_mutex_unlock(&local_mu);
  return e->token;
}

void* tp_local_lookup(uint64_t token, int take) {
  void* mem = NULL;
  pthread_mutex_lock(&local_mu);
  for (struct local_ent** p = &local_list; *p; p = &(*p)->next) {
    struct local_ent* e = *p;
    if (e->token != token) continue;
    mem = e->mem;
    atomic_fetch_add(e->refs, 1); /* under the lock: the publisher cannot free it in between */
    if (take) {
      *p = e->next;
      free(e);
    }
    break;
  }
  pthread_mutex_unlock(&local_mu);
  return mem;
}

void tp_local_withdraw(uint64_t token) {
  if (!token) return;
  pthread_mutex_lock(&local_mu);
  for (struct local_ent** p = &local_list; *p; p = &(*p)->next) {
    if ((*p)->token != token) continue;
    struct local_ent* e = *p;
    *p = e->next;
    free(e);
    break;
  }
  pthread_mutex_unlock(&local_mu);
}
