/* Groups: calls between ncclGroupStart and ncclGroupEnd are collected per thread and launched
 * together, so send/recv pairs that would deadlock one by one progress concurrently. A call outside
 * a group is a group of one. Communicator inits inside a group run concurrently at ncclGroupEnd. */
#include <stdlib.h>
#include <string.h>

#include "../misc/log.h"
#include "enqueue.h"

#define MAX_GROUP_INITS 1024

static _Thread_local int depth;
static _Thread_local struct ch_task *task_head, *task_tail;
static _Thread_local ch_status group_error;
static _Thread_local struct ncclComm* inits[MAX_GROUP_INITS];
static _Thread_local int ninits;

int group_depth(void) { return depth; }

ch_status group_start(void) {
  depth++;
  return CH_OK;
}

ch_status group_defer_init(struct ncclComm* comm) {
  if (ninits == MAX_GROUP_INITS) {
    WARN("too many communicator inits in one group (max %d)", MAX_GROUP_INITS);
    return CH_INVALID_USAGE;
  }
  inits[ninits++] = comm;
  return CH_OK;
}

static void* init_thread_main(void* arg) {
  struct ncclComm* comm = arg;
  comm_init_job(comm);
  return NULL;
}

/* Blocking comms: run all inits concurrently and join. Nonblocking ones keep running in background. */
static ch_status run_inits(void) {
  ch_status res = CH_OK;
  int n = ninits;
  ninits = 0;
  if (n == 1 && inits[0]->blocking) return comm_init_job(inits[0]);
  for (int i = 0; i < n; i++) {
    if (pthread_create(&inits[i]->init_thread, NULL, init_thread_main, inits[i]) != 0) {
      WARN("cannot start an init thread: %s", strerror(errno));
      atomic_store(&inits[i]->init_state, ncclSystemError);
      res = CH_SYSTEM;
      continue;
    }
    inits[i]->init_thread_live = 1;
  }
  int any_nonblocking = 0;
  for (int i = 0; i < n; i++) {
    if (!inits[i]->init_thread_live) continue;
    if (!inits[i]->blocking) { any_nonblocking = 1; continue; }
    pthread_join(inits[i]->init_thread, NULL);
    inits[i]->init_thread_live = 0;
    int st = atomic_load(&inits[i]->init_state);
    if (st != ncclSuccess && res == CH_OK) res = (ch_status)st;
  }
  if (res == CH_OK && any_nonblocking) res = CH_IN_PROGRESS;
  return res;
}

ch_status enq_task(const struct ch_task* t) {
  struct ch_task* c = malloc(sizeof(*c));
  if (!c) {
    WARN("out of memory queueing a call");
    return CH_SYSTEM;
  }
  *c = *t;
  c->next = NULL;
  if (task_tail) task_tail->next = c; else task_head = c;
  task_tail = c;
  if (depth == 0) {
    depth = 1;
    return group_end();
  }
  return CH_OK;
}

static void free_tasks(struct ch_task* t) {
  while (t) {
    struct ch_task* n = t->next;
    free(t);
    t = n;
  }
}

/* Split the thread's task list by communicator (keeping call order) and launch each. */
static ch_status launch_tasks(void) {
  ch_status res = CH_OK;
  struct ch_task* all = task_head;
  task_head = task_tail = NULL;
  if (!all) return CH_OK;

  int ncomms = 0;
  struct ncclComm** comms = NULL;
  struct ch_task** lists = NULL;
  struct ch_plan** plans = NULL;
  char **need_send = NULL, **need_recv = NULL;
  int ntasks = 0;
  for (struct ch_task* t = all; t; t = t->next) ntasks++;
  comms = calloc((size_t)ntasks, sizeof(*comms));
  lists = calloc((size_t)ntasks, sizeof(*lists));
  plans = calloc((size_t)ntasks, sizeof(*plans));
  need_send = calloc((size_t)ntasks, sizeof(char*));
  need_recv = calloc((size_t)ntasks, sizeof(char*));
  if (!comms || !lists || !plans || !need_send || !need_recv) { res = CH_SYSTEM; goto out; }

  struct ch_task** tails = calloc((size_t)ntasks, sizeof(*tails));
  if (!tails) { res = CH_SYSTEM; goto out; }
  for (struct ch_task *t = all, *next; t; t = next) {
    next = t->next;
    t->next = NULL;
    int i = 0;
    while (i < ncomms && comms[i] != t->comm) i++;
    if (i == ncomms) comms[ncomms++] = t->comm;
    if (tails[i]) tails[i]->next = t; else lists[i] = t;
    tails[i] = t;
  }
  free(tails);
  all = NULL;

  for (int i = 0; i < ncomms; i++) {
    CHECK_GOTO(comm_ensure_ready(comms[i]), res, out);
    CHECK_GOTO(plan_build(comms[i], lists[i], &plans[i]), res, out);
    int n = comms[i]->nranks;
    need_send[i] = calloc((size_t)n + 1, 1);
    need_recv[i] = calloc((size_t)n + 1, 1);
    if (!need_send[i] || !need_recv[i]) { res = CH_SYSTEM; goto out; }
    for (int k = 0; k < plans[i]->nops; k++) {
      struct ch_op* op = &plans[i]->ops[k];
      if (op->func == FUNC_SEND) need_send[i][op->root] = 1;
      else if (op->func == FUNC_RECV) need_recv[i][op->root] = 1;
      else if (comms[i]->nranks > 1) need_send[i][n] = 1; /* rings */
    }
  }
  CHECK_GOTO(comm_connect(comms, ncomms, need_send, need_recv), res, out);

  /* Tickets keep each communicator's plans in call order across threads and streams. */
  for (int i = 0; i < ncomms; i++) plans[i]->ticket = atomic_fetch_add(&comms[i]->next_ticket, 1);

  cudaStream_t stream = lists[0]->stream;
  if (stream && stream_is_ours(stream)) {
    for (int i = 0; i < ncomms; i++) {
      CHECK_GOTO(stream_enqueue(lists[i]->stream, plans[i]), res, out);
      plans[i] = NULL;
    }
  } else {
    res = plan_exec(plans, ncomms);
  }
out:
  for (int i = 0; i < ntasks && lists; i++) free_tasks(lists[i]);
  free_tasks(all);
  for (int i = 0; i < ntasks && plans; i++) plan_free(plans[i]);
  for (int i = 0; i < ntasks && need_send; i++) free(need_send[i]);
  for (int i = 0; i < ntasks && need_recv; i++) free(need_recv[i]);
  free(need_send);
  free(need_recv);
  free(comms);
  free(lists);
  free(plans);
  return res;
}

ch_status group_end(void) {
  if (depth == 0) {
    WARN("ncclGroupEnd called without a matching ncclGroupStart");
    return CH_INVALID_USAGE;
  }
  if (--depth > 0) return CH_OK;
  ch_status res = group_error;
  group_error = CH_OK;
  if (res != CH_OK) {
    /* An earlier call in this group failed its checks: drop the whole group. */
    free_tasks(task_head);
    task_head = task_tail = NULL;
    ninits = 0;
    return res;
  }
  if (ninits) {
    res = run_inits();
    if (res != CH_OK && res != CH_IN_PROGRESS) {
      free_tasks(task_head);
      task_head = task_tail = NULL;
      return res;
    }
  }
  ch_status r2 = launch_tasks();
  return r2 != CH_OK ? r2 : res;
}

void group_set_error(ch_status s) {
  if (depth > 0 && group_error == CH_OK) group_error = s;
}
