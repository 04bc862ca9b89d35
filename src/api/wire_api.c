/* Compressed wire formats at the API (docs/WIRE.md): the communicator's format, a call's own through
 * NCCL 2.31's vendor options, and whether a call uses one. The data path is proto/prims.c, the
 * encodings reduce/wire.c; tune/choose.c picks an algorithm that carries the format. */
#include <stdatomic.h>

#include "chorus.h"
#include "../misc/log.h"
#include "../misc/param.h"
#include "../comm/work.h"
#include "../reduce/reduce.h"
#include "../reduce/wire.h"
#include "../tune/tune.h"
#include "../core/init.h"
#include "api.h"

static int wire_func(int f) {
  return f == FUNC_ALLREDUCE || f == FUNC_REDUCESCATTER || f == FUNC_ALLGATHER || f == FUNC_BROADCAST ||
         f == FUNC_REDUCE;
}

/* The call's own format from its ext list: 1 and *out if one is there, 0 if none, -1 (WARNed) if bad. The
 * list is the caller's: walked at most 64 entries deep, so a cycle cannot hang us. */
static int ext_format(const ncclCollConfig_t* cfg, const char* fn, int* out) {
  int found = 0, k = 0;
  for (const ncclConfigExt_t* e = cfg ? cfg->ext : NULL; e; e = e->next) {
    if (++k > 64) {
      WARN("%s: ncclCollConfig_t.ext has more than 64 entries (a cycle?)", fn);
      return -1;
    }
    if (e->key.vendorId != CHORUS_CONFIG_EXT_VENDOR) continue; /* another vendor's: not ours to read */
    if (e->key.optionId != CHORUS_COLL_OPT_WIRE_FORMAT) {
      WARN("%s: ncclCollConfig_t.ext has Chorus option %d, which is not one (CHORUS_COLL_OPT_WIRE_FORMAT = %d)", fn,
           e->key.optionId, CHORUS_COLL_OPT_WIRE_FORMAT);
      return -1;
    }
    int v = e->val.i;
    if ((v & ~(0xff | WIRE_FORCE)) || WIRE_FMT(v) >= WIRE_COUNT) {
      WARN("%s: wire format %d (ncclCollConfig_t.ext CHORUS_COLL_OPT_WIRE_FORMAT) is not a chorusWireFormat_t "
           "(0..%d, | chorusWireForce)", fn, v, WIRE_COUNT - 1);
      return -1;
    }
    *out = WIRE_FMT(v) ? v : 0, found = 1;
  }
  return found;
}

static void note_once(struct ncclComm* comm, int bit, const char* what, const char* fn, int type, int fmt) {
  if (atomic_fetch_or(&comm->wire_noted, bit) & bit) return;
  INFO(LOG_COLL, "%s: wire format %s not used for %s: %s (told once per communicator)", fn, wire_name(fmt),
       red_type_name(type), what);
}

ch_status api_wire_for_call(struct ncclComm* comm, struct ch_task* t, const ncclCollConfig_t* cfg, const char* fn) {
  int req = atomic_load_explicit(&comm->wire, memory_order_relaxed), own = 0;
  int got = ext_format(cfg, fn, &own);
  if (got < 0) return CH_INVALID_ARG;
  if (got) req = own;
  t->wire = 0;
  if (!req || !wire_func(t->func) || comm->nranks == 1) return CH_OK;
  if (got && tune_repro_level(comm, t->func, t->type)) {
    WARN("%s: wire format %s asked for a call under a reproducible level (rank %d): compressed hops round "
         "partial results by placement, so the result could not be reproducible", fn, wire_name(req), comm->rank);
    return CH_INVALID_USAGE;
  }
  if (!wire_applies(req, t->type)) {
    note_once(comm, 1, "formats apply to float32, and to bfloat16 with the 8-bit ones; other types travel exact", fn,
              t->type, req);
    return CH_OK;
  }
  if (!comm->wire_all && !comm->tune_net) return CH_OK; /* no network hop to compress */
  /* The link: the cost model's (calibrated, or its default: loopback TCP), or the slowest interface a
   * rank reported where that is slower (a 1 GbE NIC says 1000 Mbit/s; virtual links say nothing). */
  double link = comm->model->net_bw;
  if (comm->wire_link_mbs > 0 && comm->wire_link_mbs < link) link = comm->wire_link_mbs;
  if (!(req & WIRE_FORCE) && link > (double)param_int(PARAM_WIRE_MAX_LINK_MBS)) {
    note_once(comm, 4, "the link (the cost model's net_bw, or the slowest NIC's speed) is faster than "
              "CHORUS_WIRE_MAX_LINK_MBS; a trailing ! (chorusWireForce) uses it anyway", fn, t->type, req);
    return CH_OK;
  }
  t->wire = WIRE_FMT(req);
  return CH_OK;
}

CH_API(ncclResult_t, chorusCommSetWireFormat, ncclComm_t comm, const char* format) {
  ch_status s = comm_check(comm, "chorusCommSetWireFormat");
  if (s != CH_OK) return ch_to_nccl(s);
  int w = wire_parse(format);
  if (w < 0) {
    WARN("chorusCommSetWireFormat: \"%.64s\" is not one of off, bf16, fp16, fp8e4m3, fp8e5m2, mx8 (a trailing ! "
         "forces it)", format);
    return ncclInvalidArgument;
  }
  if (w && comm->repro) {
    WARN("chorusCommSetWireFormat: communicator %p (rank %d) has a reproducible level; a compressed format "
         "cannot be reproducible", (void*)comm, comm->rank);
    return ncclInvalidUsage;
  }
  atomic_store(&comm->wire, w);
  INFO(LOG_INIT, "comm %p rank %d: wire format %s%s", (void*)comm, comm->rank, wire_name(w),
       w & WIRE_FORCE ? " (forced)" : "");
  return ncclSuccess;
}
