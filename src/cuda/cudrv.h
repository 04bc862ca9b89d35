/* The CUDA driver, found at run time and never linked: a process that does not use CUDA never loads
 * it, and a machine without it works as before. This layer classifies buffers, copies between host
 * and device memory (staging/staging.c moves device buffers through host memory), synchronises a CUDA
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
/* The asynchronous path (staging/staging.c): a call on device buffers is queued on its CUDA stream as
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
/* cuMemFreeHost and cuMemFree wait for the whole device: a thread that a stream may be waiting for
 * (one issuing calls, the GPU watcher) queues such frees here, and a thread of their own (reaper.c)
 * runs them in order. fn(a, b) runs there (on the caller's thread only if that thread cannot start). */
void cudrv_defer(void (*fn)(void* a, void* b), void* a, void* b);
void cudrv_host_free_later(void* p, void* ctx);
ch_status cudrv_copy_async(int to_host, void* host, void* dev, size_t bytes, void* stream, void* ctx);
/* A device-to-device copy on the stream (the copy engine), where the driver has it (cudrv_has_dtod). */
ch_status cudrv_copy_dtod(void* dst, const void* src, size_t bytes, void* stream, void* ctx);
int cudrv_has_dtod(void);
/* This thread may make calls that a capture in global mode forbids (allocations, CUDA IPC) while some
 * stream is being captured, as NCCL does: returns the mode to give back to cudrv_capture_restore. */
int cudrv_capture_relaxed(void);
void cudrv_capture_restore(int mode);
/* Queue fn(arg) on stream: it runs on a driver thread after the work queued before it, and must not
 * call CUDA. */
ch_status cudrv_host_fn(void* stream, void (*fn)(void*), void* arg, void* ctx);
/* Queue a wait: work queued on stream after it starts once the 32-bit word at device address dev is
 * at least value (cyclic comparison, as CU_STREAM_WAIT_VALUE_GEQ). */
ch_status cudrv_wait_geq(void* stream, void* dev, uint32_t value, void* ctx);

/* Work queued on `to` from now on waits for the work queued on `from` so far (an event), each stream
 * in its own context. */
ch_status cudrv_join(void* from, void* from_ctx, void* to, void* to_ctx);
/* Queue a write of value to the 32-bit word at device address dev (where the driver has it:
 * cudrv_has_write_u32). */
ch_status cudrv_write_u32(void* stream, void* dev, uint32_t value, void* ctx);
int cudrv_has_write_u32(void);
/* A stream of ctx of Chorus's own (non-blocking); CH_INTERNAL where the driver lacks cuStreamCreate. */
ch_status cudrv_stream_new(void** stream, void* ctx);
void cudrv_stream_free(void* stream, void* ctx);
/* An event of ctx (*ev), recorded on a stream, waited for by another; freed with cudrv_event_free. */
ch_status cudrv_event_new(void** ev, void* ctx);
ch_status cudrv_event_record(void* ev, void* stream, void* ctx);
ch_status cudrv_event_wait(void* stream, void* ev, void* ctx);
void cudrv_event_free(void* ev, void* ctx);

/* ncclMemAlloc's device side: the calling thread's current context (NULL: none, or no driver), and
 * device memory in it. */
void* cudrv_current_ctx(void);
ch_status cudrv_dev_alloc(void** p, size_t bytes);
ch_status cudrv_dev_free(void* p);

/* For cudev.c: an entry point of the loaded driver (NULL: none), a CUresult's text, and running in a
 * context (push returns the CUresult; NULL ctx: the current one, nothing pushed). */
void* cudrv_sym(const char* name);
const char* cudrv_errstr(int r);
int cudrv_push(void* ctx);
void cudrv_pop(void* ctx);
/* Run one driver call (an expression giving a CUresult) in ctx; a failure is said once, here, and
 * returns CH_SYSTEM from the calling function. Needs misc/log.h. */
#define CUDRV_IN_CTX(ctx, what, call)                         \
  do {                                                        \
    int r_ = cudrv_push(ctx);                                 \
    if (r_ == 0) {                                            \
      r_ = (call);                                            \
      cudrv_pop(ctx);                                         \
    }                                                         \
    if (r_ != 0) {                                            \
      WARN("%s failed: %s (%d)", what, cudrv_errstr(r_), r_); \
      return CH_SYSTEM;                                       \
    }                                                         \
  } while (0)

/* ---- the device path (cudev.c): kernels and memory shared by ranks on one GPU ---- */
typedef struct { char bytes[64]; } cudev_ipc_handle; /* CUipcMemHandle */
/* The embedded kernels (kernels_blob.c): the fatbin (NULL, 0: none) and what it was built for. */
const void* cudev_fatbin(size_t* bytes);
const char* cudev_fatbin_archs(void);
/* 1 if the library carries device kernels and the driver has every entry point the path needs. */
int cudev_ok(void);
/* The device kernel for ncclDataType_t `type` (or DEV_STAGE: the stage kernel), loaded into ctx on
 * first use; NULL (WARNed) if not. */
void* cudev_kernel(void* ctx, int type);
/* CHORUS_CUDA_UNROLL, clamped to what the kernel takes (1..4): the direct path's and staging's. */
int cudev_unroll(void);
/* Device memory in ctx for the device path's own use (cuMemAlloc / cuMemFree; NULL is nothing). */
ch_status cudev_dev_alloc(void* ctx, size_t bytes, void** dev);
ch_status cudev_dev_free(void* ctx, void* dev);
/* Queue the kernel on stream with grid gx x gy of 512 threads; args: a struct dev_args (devjob.h), or
 * a struct dev_stage_args for the stage kernel. */
ch_status cudev_launch(void* fn, unsigned gx, unsigned gy, void* stream, void* ctx, const void* args);
/* Queue stream memory operations in order, in one driver call: a write of `value` to the 32-bit word
 * at device address dev, or a wait until that word is at least `value` (cyclic, as
 * CU_STREAM_WAIT_VALUE_GEQ). */
struct cudev_memop { void* dev; uint32_t value; int wait; };
#define CUDEV_MAX_MEMOPS 40 /* a write and a wait per rank, and two more */
ch_status cudev_memops(void* stream, const struct cudev_memop* ops, int n, void* ctx);
/* In one driver call: the context owning device address p (NULL for cuMemCreate memory, which has
 * none), its device's ordinal, and the allocation holding it (base, size and the driver's buffer id,
 * unique per allocation). 0, or the CUresult (-1: not device memory). */
int cudev_describe(const void* p, void** ctx, int* ordinal, uintptr_t* base, size_t* size, uint64_t* id);
/* Legacy CUDA IPC of a cuMemAlloc allocation (base), and its import in another process. */
ch_status cudev_ipc_get(uintptr_t base, void* ctx, cudev_ipc_handle* h);
/* Quiet: returns the CUresult (0: opened), for the caller to say which peer's memory failed. */
int cudev_ipc_open(const cudev_ipc_handle* h, void* ctx, uintptr_t* base);
/* A small allocation of ctx made once per process and shared through CUDA IPC (*id, *h): a peer
 * process opens it at init to learn whether CUDA IPC works between the two (it may not in a
 * sandbox). 0: none could be made. */
int cudev_probe(void* ctx, uint64_t* id, cudev_ipc_handle* h);
void cudev_ipc_close(uintptr_t base, void* ctx);
/* A stream of ctx that does not wait for the legacy stream (gpu/copier.c), and its end. */
ch_status cudev_stream_new(void** s, void* ctx);
void cudev_stream_free(void* s, void* ctx);
/* Pin host memory p (shared with other processes) and map it for the device: *dev its device address. */
ch_status cudev_host_register(void* p, size_t bytes, void* ctx, void** dev);
void cudev_host_unregister(void* p, void* ctx);
/* The primary context of device `ordinal` (retained; NULL if none). */
void* cudev_device_ctx(int ordinal);
/* The device of ctx: UUID and multiprocessor count. */
ch_status cudev_device(void* ctx, unsigned char uuid[16], int* sms, int* ordinal);

/* Load the driver (chorus-info only) and describe it: 0 with its version and devices, else -1 with why. */
int cudrv_describe(char* out, size_t cap);

#endif
