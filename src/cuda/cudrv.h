/* The CUDA driver, found at run time and never linked: a process that does not use CUDA never loads
 * it, and a machine without it works as before. This layer classifies buffers, copies between host
 * and device memory (core/staging.c moves device buffers through host memory), synchronises a CUDA
 * stream, and describes the driver for chorus-info. */
#ifndef CHORUS_CUDA_CUDRV_H
#define CHORUS_CUDA_CUDRV_H

#include <stddef.h>

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
/* Load the driver (chorus-info only) and describe it: 0 with its version and devices, else -1 with why. */
int cudrv_describe(char* out, size_t cap);

#endif
