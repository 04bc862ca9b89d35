/* Device buffers in CUDA stream order, staged through host memory (staging/staging.c). */
#ifndef CH_GPU_STAGING_H
#define CH_GPU_STAGING_H

#include "../comm/work.h"

/* staging/staging.c: t's touched buffers are CUDA device memory (or, hostmem, host memory of a piece
 * whose one side is strided: t->stride). stage_in points t at host copies and copies the input there
 * (at launch, in stream order, or now); stage_out (when t's group has run) copies the result back if
 * ok, and frees. */
ch_status stage_in(struct ch_task* t, int needs_send, int needs_recv, int hostmem, const char* fn);
ch_status stage_out(struct ch_task* t, int ok);
/* Elements per piece where t (checked) runs as pieces, each a call of its own, else 0: an AllReduce,
 * Reduce, Broadcast, AllGather or ReduceScatter larger than the communicator's stage_piece (set at
 * init where device buffers are staged), whatever its buffers, so that every rank makes the same
 * calls. An AllGather's or ReduceScatter's piece takes a slice of every rank's block (t->stride). */
size_t stage_pieces(const struct ch_task* t);
/* How t (a checked AllReduce, Reduce or ReduceScatter, or a piece of one) reduces where device buffers
 * are staged, alike on every rank: on the CPU, on every GPU after gathering the inputs, or on each
 * rank's GPU for its block after an AlltoAll (then gathered back). api/route.c queues the data
 * movement (t->gpu_reduce). */
enum { STAGE_RED_CPU = 0, STAGE_RED_GATHER, STAGE_RED_SPLIT };
int stage_reduce_way(const struct ch_task* t);
/* A group whose calls were all staged asynchronously: queue copies, host functions and waits on the
 * CUDA streams and the plans on comm's bridge stream. 1: done (plans taken), 0: run it as before. */
struct ch_plan;
int stage_launch(struct ch_plan** plans, struct ch_task** lists, int n, ch_status* res);
/* ncclCommAbort: calls whose tickets their streams were to draw are dropped when the streams get there
 * (their streams go on), so that the abort waits for no stream. */
void stage_close(struct ncclComm* comm);
/* A revoke or shrink (ncclCommRevoke, NCCL_SHRINK_ABORT): the same for the calls queued so far only. */
void stage_drop(struct ncclComm* comm);
/* comm_free: the bridge stream and the pinned memory. */
void stage_comm_free(struct ncclComm* comm);

#endif
