/* The rows that plug the upper layers into core: where a call can run (core/exec.h's executors) and
 * what the GPU path adds to a communicator's life. This file sees every layer that provides a row,
 * so core never includes them. */
#include "../core/exec.h"
#include "../core/host_stream.h"
#include "../gpu/gpu.h"
#include "../staging/staging.h"
#include "rma.h"

static ch_status kernel_finish(struct ch_task* t, int ok) {
  (void)ok;
  gpu_drop(t); /* a call that never launched still holds its description */
  return CH_OK;
}

static const struct ch_executor exec_host = {.name = "host"};
static const struct ch_executor exec_host_stream = {.name = "host stream", .launch = stream_launch};
static const struct ch_executor exec_stage = {.name = "CUDA staging", .launch = stage_launch, .finish = stage_out,
                                            .own_tickets = 1};
static const struct ch_executor exec_kernel = {.name = "CUDA kernel", .launch = gpu_launch, .finish = kernel_finish};

const struct ch_executor* const ch_executors[EXEC_COUNT] = {
    [EXEC_HOST] = &exec_host,
    [EXEC_HOST_STREAM] = &exec_host_stream,
    [EXEC_STAGE] = &exec_stage,
    [EXEC_KERNEL] = &exec_kernel,
};

static void gpu_failed(struct ncclComm* comm) {
  if (comm->gpu) gpu_unblock(comm->gpu); /* streams may wait for a peer that will not come */
}

static void comm_teardown(struct ncclComm* comm) {
  rma_release(comm); /* windows and signal blocks (api/window.c) */
  gpu_free(comm);
}

const struct ch_comm_hooks ch_comm_hooks = {
    .hello = gpu_hello_fill,
    .setup = gpu_setup,
    .failed = gpu_failed,
    .teardown = comm_teardown,
    .abort = stage_close,
    .quiesce = stage_drop,
    .release = stage_comm_free,
};
