/* Definition helper for exported API functions: each gets default visibility and a p-prefixed alias
 * (NCCL's profiling interposition names). Status mapping to ncclResult_t happens only here. */
#ifndef CH_API_H
#define CH_API_H

#include "nccl.h"
#include "../misc/status.h"

struct ncclComm;
struct red_op;

#define CH_API(ret, name, ...)                                                               \
  __attribute__((visibility("default"))) ret p##name(__VA_ARGS__) __attribute__((alias(#name))); \
  __attribute__((visibility("default"))) ret name(__VA_ARGS__)

/* A NULL argument of a public call: a WARN naming it, then ncclInvalidArgument (needs misc/log.h). */
#define ARG_NONNULL(p, fn)                                 \
  do {                                                     \
    if (!(p)) {                                            \
      WARN("%s: argument %s is NULL", fn, #p);             \
      return ncclInvalidArgument;                          \
    }                                                      \
  } while (0)

/* ch_status values equal ncclResult_t, except the internal CH_ABORTED: an aborted call is an expected
 * outcome of the caller's own ncclCommAbort, reported as invalid usage of an aborted communicator. */
static inline ncclResult_t ch_to_nccl(ch_status s) { return s == CH_ABORTED ? ncclInvalidUsage : (ncclResult_t)s; }

/* ncclCommInitRankConfig's work (api/comm.c), for ncclCommGrow: fn names the call in WARNs. */
ncclResult_t api_init_rank(ncclComm_t* newcomm, int nranks, const ncclUniqueId* id, int rank,
                           const ncclConfig_t* user_cfg, const char* fn);

/* Build the reduction for (op, type) on comm (api/mem.c); CH_INVALID_ARG with a WARN if op is not valid. */
ch_status api_red_op(struct ncclComm* comm, int op, int type, struct red_op* out);

/* Route a checked call (api/route.c): place it on its executor and queue it, whole or in pieces; a
 * failure is also the group's error. */
struct ch_task;
ch_status route_call(struct ch_task* t, const char* fn, int needs_send, int needs_recv);
/* The wire format t may use (t->wire; wire_api.c): the call's own (cfg's ext list) or comm's, where it
 * applies; a bad option or one under a reproducible level is refused with a WARN. */
ch_status api_wire_for_call(struct ncclComm* comm, struct ch_task* t, const ncclCollConfig_t* cfg, const char* fn);

/* api/config.c. A user's ncclConfig_t from any NCCL header 2.14..2.31 (NULL = defaults), read field by
 * field as its size and version allow, checked (a WARN naming the bad field), then NCCL's variables
 * applied: out is in this header's layout. */
ch_status comm_parse_config(const ncclConfig_t* user, ncclConfig_t* out);
/* INFO lines naming the fields that are set but have no effect in Chorus. */
void comm_config_report(const ncclConfig_t* cfg, int rank);
/* A per-call config (NULL = none), checked for fn; out holds its values or the defaults. */
ch_status coll_parse_config(const ncclCollConfig_t* user, const char* fn, ncclCollConfig_t* out);
/* A call's task t (comm checked and entered by the caller) checked under the API call fn's name, then
 * routed (api/coll.c); a failure is also the group's error. */
ch_status api_queue(struct ch_task* t, const ncclCollConfig_t* cfg, const char* fn);
/* A collective (FUNC_*) as its nccl* call makes it (api/coll.c), with cfg (checked by
 * coll_parse_config; NULL: the plain call): its algSelection and userProfilerTag go into the task. */
ncclResult_t api_submit(int func, const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t type,
                        ncclRedOp_t op, int root, ncclComm_t comm, cudaStream_t stream, const ncclCollConfig_t* cfg);

#endif
