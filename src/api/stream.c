/* Host streams (chorus.h): the public calls. The streams themselves are core/host_stream.c. */
#include "chorus.h"
#include "../misc/log.h"
#include "../core/host_stream.h"
#include "api.h"

CH_API(ncclResult_t, chorusStreamCreate, cudaStream_t* stream) {
  if (!stream) {
    WARN("chorusStreamCreate: stream is NULL");
    return ncclInvalidArgument;
  }
  return ch_to_nccl(stream_create(stream));
}

CH_API(ncclResult_t, chorusStreamSynchronize, cudaStream_t stream) {
  if (!stream_valid(stream, "chorusStreamSynchronize")) return ncclInvalidArgument;
  return ch_to_nccl(stream_sync(stream));
}

CH_API(ncclResult_t, chorusStreamQuery, cudaStream_t stream) {
  if (!stream_valid(stream, "chorusStreamQuery")) return ncclInvalidArgument;
  return ch_to_nccl(stream_query(stream));
}

CH_API(ncclResult_t, chorusStreamDestroy, cudaStream_t stream) {
  if (!stream_valid(stream, "chorusStreamDestroy")) return ncclInvalidArgument;
  stream_destroy(stream);
  return ncclSuccess;
}
