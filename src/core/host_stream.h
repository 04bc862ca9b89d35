/* Host streams (core/host_stream.c): a thread per chorusStreamCreate stream runs the plans queued on it. */
#ifndef CH_CORE_HOST_STREAM_H
#define CH_CORE_HOST_STREAM_H

#include "../comm/work.h"
#include "plan.h"

/* Host streams (core/host_stream.c). */
int stream_is_ours(cudaStream_t s);
/* Queue a group's plans on s as one batch; CH_SYSTEM (out of memory): the caller runs them itself. */
ch_status stream_enqueue(cudaStream_t s, struct ch_plan** plans, int n);
/* The same with an executor's hooks, run by the stream's thread: before(arg, plans, n) ahead of the
 * plans, after(arg, status of the plans) behind them (either may be NULL). */
ch_status stream_enqueue_hook(cudaStream_t s, struct ch_plan** plans, int n, void (*before)(void*, struct ch_plan**, int),
                              void (*after)(void*, ch_status), void* arg);
/* The same, drawing the plans' tickets once the batch is made (never when it cannot be: nothing then
 * waits for a ticket that never runs): for plans handed on from a CUDA host function. */
ch_status stream_enqueue_tickets(cudaStream_t s, struct ch_plan** plans, int n,
                                 void (*before)(void*, struct ch_plan**, int), void (*after)(void*, ch_status), void* arg);
/* A batch made ahead (NULL: out of memory), so that queueing it cannot fail where nothing could be
 * done about it (a CUDA host function): stream_enqueue_batch queues it as stream_enqueue_hook would
 * (tickets: drawn as stream_enqueue_tickets does). The stream frees it once it ran, unless `keep`:
 * then its maker may queue it again once its `after` hook ran, and frees it (stream_batch_free). */
struct ch_batch;
struct ch_batch* stream_batch_new(int n, int keep);
void stream_batch_free(struct ch_batch* b);
void stream_enqueue_batch(cudaStream_t s, struct ch_batch* b, struct ch_plan** plans, int n,
                          void (*before)(void*, struct ch_plan**, int), void (*after)(void*, ch_status), void* arg,
                          int tickets);
/* Host streams for the library's own use (chorusStreamCreate/Destroy without the API checks). */
ch_status stream_create(cudaStream_t* s);
void stream_destroy(cudaStream_t s);
/* chorusStreamCreate's streams: whether s is one (else a WARN naming fn); wait for everything queued
 * and take the first error since the last sync; CH_IN_PROGRESS while anything is queued, else that error. */
int stream_valid(cudaStream_t s, const char* fn);
ch_status stream_sync(cudaStream_t s);
ch_status stream_query(cudaStream_t s);
/* Wait until nothing is queued or running on s. */
void stream_wait_idle(cudaStream_t s);
/* Wait until nothing of `comm` is queued or running anywhere (calls whose tickets are still to be
 * drawn in stream order included: comm->unticketed). */
ch_status comm_wait_idle(struct ncclComm* comm);
/* ncclCommAbort (its flag set): wait until nothing of comm is queued or running, as comm_wait_idle,
 * but take comm's batches that no stream has begun off their streams first (they may sit behind
 * another communicator's call, perhaps stuck): each such plan ends aborted when its ticket comes up,
 * here, instead of when its stream gets to it. */
void comm_wait_idle_aborting(struct ncclComm* comm);
/* A plan that never ran ends aborted: released and its completion published (its ticket is due). */
void plan_cancel(struct ch_plan* plan);

#endif
