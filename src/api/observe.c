/* What Chorus shows of a communicator (observe/): counters, their Prometheus text, and a flight
 * recorder dump on request. Queries, as chorusCommStallReport: any thread may ask while another is in
 * a call on comm (comm_try_enter: counted in `users`), and beside ncclCommAbort. */
#include <stdlib.h>
#include <string.h>

#include "chorus.h"
#include "../misc/log.h"
#include "../observe/observe.h"
#include "../core/init.h"
#include "api.h"

/* Enter comm as a query whose result goes to out (named what; what NULL: nothing to check): 1 with *r
 * ncclSuccess when comm is initialized; else 0 (or 1 with *r set, the caller leaving) and a WARN naming fn. */
static int enter_query(ncclComm_t comm, const char* fn, const void* out, const char* what, struct comm_guard* g,
                       ncclResult_t* r) {
  if (what && !out) {
    WARN("%s: %s is NULL", fn, what);
    *r = ncclInvalidArgument;
    return 0;
  }
  ch_status s = comm_check(comm, fn);
  *r = ch_to_nccl(s);
  if (s != CH_OK) return 0;
  if (!comm_try_enter(comm, g)) {
    WARN("%s: communicator %p is being aborted, revoked or destroyed by another thread", fn, (void*)comm);
    *r = ncclInvalidUsage;
    return 0;
  }
  int st = atomic_load(&comm->init_state);
  *r = st == ncclInProgress ? ncclInProgress : st != ncclSuccess ? ch_to_nccl(comm_ensure_ready(comm)) : ncclSuccess;
  return 1;
}

CH_API(ncclResult_t, chorusCommGetCounters, ncclComm_t comm, chorusCounters_t* counters) {
  static const char fn[] = "chorusCommGetCounters";
  struct comm_guard g;
  ncclResult_t r;
  if (!enter_query(comm, fn, counters, "counters", &g, &r)) return r;
  if (r == ncclSuccess) {
    struct obs_ctr c;
    obs_counters(comm, &c);
    memset(counters, 0, sizeof(*counters));
    counters->calls = c.calls, counters->bytes = c.bytes, counters->waitNs = c.wait_ns, counters->errors = c.errors;
  }
  comm_leave(&g);
  return r;
}

CH_API(ncclResult_t, chorusCommGetMemory, ncclComm_t comm, chorusMemory_t* mem) {
  static const char fn[] = "chorusCommGetMemory";
  struct comm_guard g;
  ncclResult_t r;
  if (!enter_query(comm, fn, mem, "mem", &g, &r)) return r;
  if (r == ncclSuccess && (mem->size < sizeof(size_t) + sizeof(uint64_t) || mem->size > (1u << 20))) {
    WARN("%s: mem->size is %zu; set it to sizeof(chorusMemory_t) (%zu)", fn, mem->size, sizeof(chorusMemory_t));
    r = ncclInvalidArgument;
  } else if (r == ncclSuccess) {
    struct obs_mem m;
    struct obs_proc_mem p;
    obs_comm_memory(comm, &m);
    obs_proc_memory(&p);
    chorusMemory_t all = {sizeof(all), m.p2p_peers, m.p2p_peers_max, m.p2p_cap, m.p2p_fifo, m.p2p_recv_bytes,
                          m.p2p_send_bytes, m.p2p_released, m.p2p_made, m.ring_bytes, p.shmem, p.priv,
                          p.pinned, p.fds, p.threads, m.suspend_bytes, m.persist_bytes, m.suspended,
                          m.net_resident, m.net_trimmed};
    size_t n = mem->size < sizeof(all) ? mem->size : sizeof(all);
    memcpy((char*)mem + sizeof(size_t), (char*)&all + sizeof(size_t), n - sizeof(size_t));
  }
  comm_leave(&g);
  return r;
}

CH_API(ncclResult_t, chorusCommGetPeerCounters, ncclComm_t comm, int peer, chorusPeerCounters_t* counters) {
  static const char fn[] = "chorusCommGetPeerCounters";
  struct comm_guard g;
  ncclResult_t r;
  if (!enter_query(comm, fn, counters, "counters", &g, &r)) return r;
  if (r == ncclSuccess && (peer < 0 || peer >= comm->nranks)) {
    WARN("%s: peer %d is not a rank of this %d-rank communicator", fn, peer, comm->nranks);
    r = ncclInvalidArgument;
  } else if (r == ncclSuccess) {
    struct obs_peer_ctr c;
    obs_peer_counters(comm, peer, &c);
    memset(counters, 0, sizeof(*counters));
    counters->bytesSent = c.sent, counters->bytesReceived = c.received, counters->waitNs = c.wait_ns;
    counters->bytesPut = c.put_bytes, counters->signalsSent = c.signals;
  }
  comm_leave(&g);
  return r;
}

CH_API(ncclResult_t, chorusCommMetrics, ncclComm_t comm, char* text, size_t len, size_t* needed) {
  static const char fn[] = "chorusCommMetrics";
  if (!text && len > 0) {
    WARN("%s: text is NULL with len %zu", fn, len);
    return ncclInvalidArgument;
  }
  struct comm_guard g;
  ncclResult_t r;
  if (!enter_query(comm, fn, text ? (const void*)text : (const void*)needed, "text and needed", &g, &r)) return r;
  if (r == ncclSuccess) {
    size_t n = obs_prometheus(&comm, 1, text, len);
    if (len > 0 && n >= len) text[len - 1] = '\0';
    if (needed) *needed = n;
  }
  comm_leave(&g);
  return r;
}

CH_API(ncclResult_t, chorusCommDumpFlightRecorder, ncclComm_t comm, char* path, size_t len) {
  static const char fn[] = "chorusCommDumpFlightRecorder";
  if (!path && len > 0) {
    WARN("%s: path is NULL with len %zu", fn, len);
    return ncclInvalidArgument;
  }
  struct comm_guard g;
  ncclResult_t r;
  if (!enter_query(comm, fn, NULL, NULL, &g, &r)) return r; /* path may be NULL (len 0): no name wanted */
  if (r == ncclSuccess && !comm->fr) {
    WARN("%s: the flight recorder is off (CHORUS_FLIGHT_RECORDER=0)", fn);
    r = ncclInvalidUsage;
  } else if (r == ncclSuccess) {
    r = ch_to_nccl(fr_dump(comm, "request", path, len));
  }
  comm_leave(&g);
  return r;
}
