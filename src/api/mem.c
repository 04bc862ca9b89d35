/* NCCL API: memory (ncclMemAlloc, registration; the records are core/memreg.c) and custom reduction
 * operators. */
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "../misc/log.h"
#include "../misc/param.h"
#include "../cuda/cudrv.h"
#include "../core/init.h"
#include "../core/memreg.h"
#include "api.h"

CH_API(ncclResult_t, ncclMemAlloc, void** ptr, size_t size) {
  if (!ptr) {
    WARN("ncclMemAlloc: ptr is NULL");
    return ncclInvalidArgument;
  }
  *ptr = NULL;
  if (size == 0) return ncclSuccess;
  if (size > ((size_t)1 << 48)) {
    WARN("ncclMemAlloc: %zu bytes is more than any host has", size);
    return ncclInvalidArgument;
  }
  struct ch_block* b = malloc(sizeof(*b));
  if (!b) return ncclSystemError;
  int fd = -1;
  size_t seg = 0;
  void* p = NULL;
  /* nccl-tests built on CUDA's nccl.h expect device memory, host programs host memory: a thread with a
   * current CUDA context gets device memory (CHORUS_MEM_ALLOC_DEVICE overrides). */
  int64_t want = param_int(PARAM_MEM_ALLOC_DEVICE);
  int device = want == 1 || (want == -1 && cudrv_current_ctx() != NULL);
  if (device) {
    ch_status ds = cudrv_dev_alloc(&p, size);
    if (ds != CH_OK) { /* the cause is logged where it was seen */
      free(b);
      return ch_to_nccl(ds);
    }
  } else {
    p = memreg_alloc_shareable(size, &fd, &seg);
  }
  if (!p) {
    free(b);
    WARN("ncclMemAlloc: cannot allocate %zu bytes", size);
    return ncclSystemError;
  }
  *ptr = p;
  b->ptr = p;
  b->size = size;
  b->comm = NULL;
  b->fd = fd;
  b->device = device;
  b->seg = seg;
  b->token = 0;
  memreg_track(MEMREG_ALLOCS, b);
  return ncclSuccess;
}

CH_API(ncclResult_t, ncclMemFree, void* ptr) {
  if (!ptr) return ncclSuccess;
  struct ch_block* b = memreg_untrack(MEMREG_ALLOCS, ptr, 0);
  if (!b) {
    WARN("ncclMemFree: %p was not returned by ncclMemAlloc (or was already freed)", ptr);
    return ncclInvalidArgument;
  }
  if (b->device) {
    ch_status s = cudrv_dev_free(b->ptr);
    free(b);
    return ch_to_nccl(s);
  }
  if (b->fd >= 0) {
    tp_fd_withdraw(b->token); /* peers that mapped it keep their mappings; nobody new gets it */
    munmap(b->ptr, b->seg);
    close(b->fd);
  } else {
    free(b->ptr);
  }
  free(b);
  return ncclSuccess;
}

CH_API(ncclResult_t, ncclCommRegister, const ncclComm_t comm, void* buff, size_t size, void** handle) {
  ch_status s = comm_check(comm, "ncclCommRegister");
  if (s != CH_OK) return ch_to_nccl(s);
  if (!handle) {
    WARN("ncclCommRegister: handle is NULL");
    return ncclInvalidArgument;
  }
  if (!buff && size) {
    WARN("ncclCommRegister: buff is NULL with size %zu", size);
    return ncclInvalidArgument;
  }
  /* Host memory needs no pinning. What peers can reach is decided per call from ncclMemAlloc's
   * allocations (mem_describe); the handle records the range so that Deregister can check it. */
  struct ch_block* b = malloc(sizeof(*b));
  if (!b) return ncclSystemError;
  b->ptr = buff;
  b->size = size;
  b->comm = comm;
  b->fd = -1;
  b->device = 0;
  b->seg = 0;
  b->token = 0;
  memreg_track(MEMREG_REGS, b);
  *handle = b;
  return ncclSuccess;
}

CH_API(ncclResult_t, ncclCommDeregister, const ncclComm_t comm, void* handle) {
  ch_status s = comm_check(comm, "ncclCommDeregister");
  if (s != CH_OK) return ch_to_nccl(s);
  struct ch_block* b = memreg_untrack(MEMREG_REGS, handle, 1);
  if (!b) {
    WARN("ncclCommDeregister: handle %p was not returned by ncclCommRegister (or was already deregistered)", handle);
    return ncclInvalidArgument;
  }
  if (b->comm != comm) {
    WARN("ncclCommDeregister: handle %p belongs to another communicator", handle);
    memreg_track(MEMREG_REGS, b);
    return ncclInvalidArgument;
  }
  free(b);
  return ncclSuccess;
}

static double scalar_as_double(const void* p, int type) {
  switch (type) {
    case ncclInt8: return *(const int8_t*)p;
    case ncclUint8: return *(const uint8_t*)p;
    case ncclInt32: return *(const int32_t*)p;
    case ncclUint32: return *(const uint32_t*)p;
    case ncclInt64: return (double)*(const int64_t*)p;
    case ncclUint64: return (double)*(const uint64_t*)p;
    case ncclFloat16: return red_half_to_float(*(const uint16_t*)p);
    case ncclFloat32: return *(const float*)p;
    case ncclFloat64: return *(const double*)p;
    case ncclBfloat16: return red_bf16_to_float(*(const uint16_t*)p);
    case ncclFloat8e4m3: return red_e4m3_to_float(*(const uint8_t*)p);
    case ncclFloat8e5m2: return red_e5m2_to_float(*(const uint8_t*)p);
  }
  return 0;
}

static int64_t scalar_as_int(const void* p, int type) {
  switch (type) {
    case ncclInt8: return *(const int8_t*)p;
    case ncclUint8: return *(const uint8_t*)p;
    case ncclInt32: return *(const int32_t*)p;
    case ncclUint32: return *(const uint32_t*)p;
    case ncclInt64: return *(const int64_t*)p;
    case ncclUint64: return (int64_t)*(const uint64_t*)p;
  }
  return 0;
}

static ncclResult_t redop_create(ncclRedOp_t* op, void* scalar, ncclDataType_t datatype,
                                 ncclScalarResidence_t residence, ncclComm_t comm) {
  if (!op || !scalar) {
    WARN("ncclRedOpCreatePreMulSum: %s is NULL", op ? "scalar" : "op");
    return ncclInvalidArgument;
  }
  if (datatype < 0 || datatype >= ncclNumTypes) {
    WARN("ncclRedOpCreatePreMulSum: invalid datatype %d", (int)datatype);
    return ncclInvalidArgument;
  }
  if (residence != ncclScalarHostImmediate && residence != ncclScalarDevice) {
    WARN("ncclRedOpCreatePreMulSum: invalid residence %d", (int)residence);
    return ncclInvalidArgument;
  }
  /* HostImmediate is read now; Device ("pointer") is also read now (documented difference from NCCL,
   * which dereferences it when each collective runs): the value must be valid at creation. A pointer to
   * CUDA device memory (PyTorch's tensor factors) is copied to the host first, not dereferenced. */
  char dev_scalar[8];
  if (residence == ncclScalarDevice && cudrv_classify(scalar, NULL) == CU_MEM_DEVICE) {
    if (cudrv_copy_dtoh(dev_scalar, scalar, red_type_size(datatype)) != CH_OK) return ncclUnhandledCudaError;
    scalar = dev_scalar;
  }
  for (int i = 0; i < CH_MAX_REDOPS; i++) {
    struct ch_redop_slot* slot = &comm->redops[i];
    if (slot->used) continue;
    slot->used = 1;
    slot->red = (struct red_op){.kind = RED_PREMULSUM, .type = datatype,
                                .scalar_f = scalar_as_double(scalar, datatype),
                                .scalar_i = scalar_as_int(scalar, datatype)};
    *op = (ncclRedOp_t)(ncclNumOps + i);
    return ncclSuccess;
  }
  WARN("ncclRedOpCreatePreMulSum: too many custom operators alive on this communicator (max %d)", CH_MAX_REDOPS);
  return ncclInvalidUsage;
}

static ncclResult_t redop_destroy(ncclRedOp_t op, ncclComm_t comm) {
  int i = (int)op - ncclNumOps;
  if (i < 0 || i >= CH_MAX_REDOPS || !comm->redops[i].used) {
    WARN("ncclRedOpDestroy: op %d was not created by ncclRedOpCreatePreMulSum on this communicator", (int)op);
    return ncclInvalidArgument;
  }
  comm->redops[i].used = 0;
  return ncclSuccess;
}

/* Both touch comm->redops: counted in comm->users so a concurrent ncclCommAbort waits for them. */
CH_API(ncclResult_t, ncclRedOpCreatePreMulSum, ncclRedOp_t* op, void* scalar, ncclDataType_t datatype,
       ncclScalarResidence_t residence, ncclComm_t comm) {
  struct comm_guard g;
  ch_status s = comm_check(comm, "ncclRedOpCreatePreMulSum");
  if (s == CH_OK) s = comm_enter(comm, &g);
  if (s != CH_OK) return ch_to_nccl(s);
  ncclResult_t r = redop_create(op, scalar, datatype, residence, comm);
  comm_leave(&g);
  return r;
}

CH_API(ncclResult_t, ncclRedOpDestroy, ncclRedOp_t op, ncclComm_t comm) {
  struct comm_guard g;
  ch_status s = comm_check(comm, "ncclRedOpDestroy");
  if (s == CH_OK) s = comm_enter(comm, &g);
  if (s != CH_OK) return ch_to_nccl(s);
  ncclResult_t r = redop_destroy(op, comm);
  comm_leave(&g);
  return r;
}

ch_status api_red_op(struct ncclComm* comm, int op, int type, struct red_op* out) {
  memset(out, 0, sizeof(*out));
  out->type = type;
  switch (op) {
    case ncclSum: out->kind = RED_SUM; return CH_OK;
    case ncclProd: out->kind = RED_PROD; return CH_OK;
    case ncclMax: out->kind = RED_MAX; return CH_OK;
    case ncclMin: out->kind = RED_MIN; return CH_OK;
    case ncclAvg:
      /* EXACT: the exact sum divided by nranks, rounded once (reduce/repro.c); NCCL's avg premultiplies
       * by 1/nranks, which ORDER keeps. */
      if (red_type_is_float(type) && comm->repro == CH_REPRO_EXACT && comm->nranks > 1) {
        out->kind = RED_SUMPOSTDIV;
        out->divisor = (uint64_t)comm->nranks;
      } else if (red_type_is_float(type)) {
        out->kind = RED_PREMULSUM;
        out->scalar_f = 1.0 / comm->nranks;
      } else {
        out->kind = RED_SUMPOSTDIV;
        out->divisor = (uint64_t)comm->nranks;
      }
      return CH_OK;
  }
  int i = op - ncclNumOps;
  if (i >= 0 && i < CH_MAX_REDOPS && comm->redops[i].used) {
    if (comm->redops[i].red.type != type) {
      WARN("reduction op %d was created for datatype %d but used with datatype %d", op, comm->redops[i].red.type,
           type);
      return CH_INVALID_ARG;
    }
    *out = comm->redops[i].red;
    return CH_OK;
  }
  WARN("invalid reduction op %d (valid: ncclSum..ncclAvg, or one made by ncclRedOpCreatePreMulSum)", op);
  return CH_INVALID_ARG;
}
