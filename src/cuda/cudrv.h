/* The CUDA driver, found at run time and never linked: a process that does not use CUDA never loads
 * it, and a machine without it works as before. This layer classifies buffers, copies between host
 * and device memory (core/staging.c moves device buffers through host memory), synchronises a CUDA
 * stream, and describes the driver for chorus-info. */
#ifndef CHORUS_CUDA_CUDRV_H
#define CHORUS_CUDA_CUDRV_H

#include <stddef.h>
#include <stdint.h>

#include "../misc/status.h"

enum cu_mem { CU_MEM_HOST = 0, CU_MEM_DEVICE = 1, CU_MEM_MANAGED = 2 };

/* 1 if this process has the CUDA driver loaded (the application uses CUDA; CHORUS_CUDA_LIBRARY names
 * another library to look for). Never loads it. Cheap: a process without it looks again at most
 * once a second, since CUDA may be loaded after the communicator was made. */
int cudrv_present(void);
/* What p points to (CU_MEM_HOST when the driver is absent or does not know p); *dev: the device
 * ordinal of device or managed memory. */
enum cu_mem cudrv_classify(const void* p, int* dev);
/* Copy between host memory and device memory at dev (classified as device memory just before), in
 * the context that owns dev, whichever context the calling thread has. Synchronous. */
ch_status cudrv_copy_dtoh(void* dst, const void* dev, size_t bytes);
ch_status cudrv_copy_htod(void* dev, const void* src, size_t bytes);
/* Wait for the work queued on a CUDA stream (CH_OK when the driver is absent). */
ch_status cudrv_stream_sync(void* stream);
/* The asynchronous path (core/staging.c): a call on device buffers is queued on its CUDA stream as
 * copies to pinned host memory, a host function that tells Chorus the input is there, a wait for a
 * flag Chorus writes when the call is done, and copies back. Every function below runs in context ctx
 * (the buffers' own, from cudrv_ptr_ctx; pushed around the call and popped again), queues work on
 * `stream` and returns without waiting for it. */
/* 1 if the loaded driver has every entry point of the asynchronous path (CUDA 11.7 or newer). */
int cudrv_async_ok(void);
/* The context that owns device memory at p, or NULL. */
void* cudrv_ptr_ctx(const void* p);
/* Whether stream is being captured into a CUDA graph (*yes), or an error when the driver says so. */
ch_status cudrv_capturing(void* stream, void* ctx, int* yes);
/* Pinned host memory (portable; mapped: *dev gets its device address), or NULL with a WARN. */
void* cudrv_host_alloc(size_t bytes, void* ctx, int mapped, void** dev);
void cudrv_host_free(void* p, void* ctx);
ch_status cudrv_copy_async(int to_host, void* host, void* dev, size_t bytes, void* stream, void* ctx);
/* Queue fn(arg) on stream: it runs on a driver thread after the work queued before it, and must not
 * call CUDA. */
ch_status cudrv_host_fn(void* stream, void (*fn)(void*), void* arg, void* ctx);
/* Queue a wait: work queued on stream after it starts once the 32-bit word at device address dev is
 * at least value (cyclic comparison, as CU_STREAM_WAIT_VALUE_GEQ). */
ch_status cudrv_wait_geq(void* stream, void* dev, uint32_t value, void* ctx);

/* Work queued on `to` from now on waits for the work queued on `from` so far (an event), each stream
 * in its own context. */
ch_status cudrv_join(void* from, void* from_ctx, void* to, void* to_ctx);

/* ncclMemAlloc's device side: the calling thread's current context (NULL: none, or no driver), and
 * device memory in it. */
void* cudrv_current_ctx(void);
ch_status cudrv_dev_alloc(void** p, size_t bytes);
ch_status cudrv_dev_free(void* p);

/* Load the driver (chorus-info only) and describe it: 0 with its version and devices, else -1 with why. */
int cudrv_describe(char* out, size_t cap);

#endif
