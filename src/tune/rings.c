/* Topology-aware rings. A job started with rank i on host i mod H numbers its ranks across hosts; a
 * ring in rank order would then cross a host boundary at every hop and carry each message over the
 * network 2(n-1) times per direction. Grouping every host's ranks together makes the ring cross each
 * host boundary once per direction, as NCCL's ring search does. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../misc/log.h"
#include "../misc/param.h"
#include "../comm/comm.h"
#include "topo.h"

enum topo_order topo_ring_order(void) {
  const char* s = param_str(PARAM_RING_ORDER);
  if (!s[0] || !strcmp(s, "hosts")) return TOPO_ORDER_HOSTS;
  if (!strcmp(s, "reverse")) return TOPO_ORDER_REVERSE;
  if (!strcmp(s, "interleave")) return TOPO_ORDER_INTERLEAVE;
  return TOPO_ORDER_INVALID;
}

void topo_ring_order_fill(int n, const uint64_t* host, enum topo_order how, int* order) {
  /* Hosts are visited in order of their lowest rank: for each rank not yet placed, place it and every
   * later rank of its host. O(n^2) on at most BOOT_MAX_RANKS ranks, once per communicator. */
  int k = 0;
  for (int r = 0; r < n; r++) {
    int seen = 0;
    for (int q = 0; q < r && !seen; q++) seen = host[q] == host[r];
    if (seen) continue;
    for (int q = r; q < n; q++)
      if (host[q] == host[r]) order[k++] = q;
  }
  if (how == TOPO_ORDER_REVERSE) {
    for (int i = 0; i < n / 2; i++) {
      int t = order[i];
      order[i] = order[n - 1 - i];
      order[n - 1 - i] = t;
    }
  } else if (how == TOPO_ORDER_INTERLEAVE && n > 2) { /* even positions, then odd ones */
    int* tmp = malloc(sizeof(int) * (size_t)n);
    if (!tmp) return; /* a test aid only: keep the host order */
    int j = 0;
    for (int i = 0; i < n; i += 2) tmp[j++] = order[i];
    for (int i = 1; i < n; i += 2) tmp[j++] = order[i];
    memcpy(order, tmp, sizeof(int) * (size_t)n);
    free(tmp);
  }
}

/* "0 3 | 1 4 | 2 5": ranks in ring order, a bar at each host boundary. */
static void ring_text(const int* order, int n, const uint64_t* host, char* buf, size_t len) {
  size_t o = 0;
  buf[0] = '\0';
  for (int i = 0; i < n && o + 16 < len; i++) {
    int w = snprintf(buf + o, len - o, "%s%d", i == 0 ? "" : host[order[i]] != host[order[i - 1]] ? " | " : " ",
                     order[i]);
    if (w < 0) return;
    o += (size_t)w;
  }
  if (o + 16 >= len) snprintf(buf + o, len - o, " ...");
}

ch_status comm_build_rings(struct ncclComm* comm) {
  int n = comm->nranks, me = comm->rank;
  enum topo_order how = topo_ring_order();
  if (how == TOPO_ORDER_INVALID) {
    WARN("CHORUS_RING_ORDER=\"%s\" is not one of: hosts (default), reverse, interleave", param_str(PARAM_RING_ORDER));
    return CH_INVALID_ARG;
  }
  uint64_t* host = malloc(sizeof(uint64_t) * (size_t)n);
  int* order = malloc(sizeof(int) * (size_t)n);
  if (!host || !order) {
    free(host);
    free(order);
    WARN("rank %d: out of memory building the rings", me);
    return CH_SYSTEM;
  }
  for (int r = 0; r < n; r++) host[r] = comm->peers[r].host_hash;
  topo_ring_order_fill(n, host, how, order);
  int pos = 0;
  while (order[pos] != me) pos++; /* order is a permutation of 0..n-1 */
  ch_status s = CH_OK;
  for (int c = 0; c < comm->nchannels && s == CH_OK; c++) {
    struct ch_channel* ch = &comm->channels[c];
    ch->id = c;
    ch->ring = malloc(sizeof(int) * (size_t)n);
    if (!ch->ring) {
      WARN("rank %d: out of memory building the rings", me);
      s = CH_SYSTEM;
      break;
    }
    memcpy(ch->ring, order, sizeof(int) * (size_t)n);
    ch->ring_index = pos;
    ch->prev = order[(pos + n - 1) % n];
    ch->next = order[(pos + 1) % n];
  }
  if (s == CH_OK && me == 0) {
    char text[1024];
    ring_text(order, n, host, text, sizeof(text));
    INFO(LOG_INIT, "comm %p: ring over %d host(s), %d channel(s) in the same order%s: %s", (void*)comm, comm->nnodes,
         comm->nchannels, how == TOPO_ORDER_HOSTS ? "" : " (CHORUS_RING_ORDER)", text);
  }
  free(host);
  free(order);
  return s;
}
