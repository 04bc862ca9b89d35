/* ncclCommSplit and ncclCommShrink: the members agree over the parent's bootstrap and build the child's
 * bootstrap from a table of addresses, without any new root. Split exchanges over every parent rank;
 * shrink only among the survivors, so it works after excluded ranks have died. */
#include <stdlib.h>
#include <string.h>

#include "../misc/log.h"
#include "../misc/utils.h"
#include "init.h"

/* Shrink's exchange uses tags of its own (user and connection tags are smaller). */
#define TAG_SHRINK (1 << 29)

struct split_info {
  int32_t color, key, prank, pad;
  union sock_addr addr;
};

static int by_key(const void* a, const void* b) {
  const struct split_info *x = a, *y = b;
  if (x->key != y->key) return x->key < y->key ? -1 : 1;
  return x->prank < y->prank ? -1 : x->prank > y->prank;
}

/* Make the child of m members (parent ranks prank[], listen addresses addrs[], in child rank order);
 * this rank is child rank me and owns *lsock until it passes to the child's bootstrap. */
static ch_status build_child(struct ncclComm* parent, const int* prank, const union sock_addr* addrs, int m, int me,
                             uint64_t salt, struct sock* lsock, const ncclConfig_t* cfg, struct ncclComm** out) {
  for (int i = 0; i < m; i++) { /* from the wire: an address the child's bootstrap can use, or nothing */
    int fam = addrs[i].sa.sa_family;
    if ((fam != AF_INET && fam != AF_INET6) || sock_addr_port(&addrs[i]) == 0) {
      WARN("rank %d (parent rank %d) sent no usable listen address for the new communicator (family %d): not "
           "made", i, prank[i], fam);
      return CH_REMOTE;
    }
  }
  struct ncclComm* comm = NULL;
  ch_status res = comm_alloc(&comm, m, me, cfg);
  if (res != CH_OK) return res;
  comm->peers = calloc((size_t)m, sizeof(struct boot_rank_info));
  if (!comm->peers) { res = CH_SYSTEM; goto fail; }
  for (int i = 0; i < m; i++) {
    comm->peers[i] = parent->peers[prank[i]];
    comm->peers[i].rank = i;
    comm->peers[i].nranks = m;
    comm->peers[i].listen_addr = addrs[i];
  }
  uint64_t mix[3] = {parent->comm_hash, salt, (uint64_t)parent->nsplits};
  comm->comm_hash = ut_hash(mix, sizeof(mix), 0x5851f42d4c957f2dull);
  /* Until the child exists for the user, only the parent can be aborted: its flag stops the child's
   * init (the caller is inside a call on the parent, so the parent outlives this). */
  CHECK_GOTO(boot_init_from_table(me, m, boot_secret(parent->boot), addrs, lsock, &parent->abort_flag, &comm->boot),
             res, fail);
  lsock->fd = -1; /* owned by the child's bootstrap now */
  CHECK_GOTO(comm_init_job(comm), res, fail);
  boot_set_abort(comm->boot, &comm->abort_flag);
  *out = comm;
  return CH_OK;
fail:
  comm_free(comm);
  return res;
}

ch_status comm_split(struct ncclComm* parent, int color, int key, struct ncclComm** out, const ncclConfig_t* cfg) {
  ch_status res = CH_OK;
  int n = parent->nranks;
  struct sock lsock = {.fd = -1};
  struct split_info* all = calloc((size_t)n, sizeof(*all));
  int* prank = calloc((size_t)n, sizeof(*prank));
  union sock_addr* addrs = calloc((size_t)n, sizeof(*addrs));
  *out = NULL;
  if (!all || !prank || !addrs) { res = CH_SYSTEM; goto done; }
  CHECK_GOTO(boot_new_listener(parent->boot, &lsock), res, done);
  all[parent->rank] = (struct split_info){color, key, parent->rank, 0, lsock.addr};
  CHECK_GOTO(boot_allgather(parent->boot, all, sizeof(*all)), res, done);
  for (int r = 0; r < n; r++) all[r].prank = r; /* the slot says who sent it, not the wire */
  parent->nsplits++;
  if (color == NCCL_SPLIT_NOCOLOR) goto done;

  int m = 0;
  for (int r = 0; r < n; r++)
    if (all[r].color == color) all[m++] = all[r]; /* in place: m <= r */
  qsort(all, (size_t)m, sizeof(*all), by_key);
  int me = 0;
  while (all[me].prank != parent->rank) me++;
  for (int i = 0; i < m; i++) prank[i] = all[i].prank, addrs[i] = all[i].addr;
  CHECK_GOTO(build_child(parent, prank, addrs, m, me, (uint64_t)(uint32_t)color, &lsock, cfg, out), res, done);
  INFO(LOG_INIT, "split: parent rank %d color %d key %d -> rank %d of %d", parent->rank, color, key, me, m);
done:
  if (lsock.fd >= 0) sock_close(&lsock);
  free(all);
  free(prank);
  free(addrs);
  return res;
}

ch_status comm_shrink(struct ncclComm* parent, const int* exclude, int nexclude, struct ncclComm** out,
                      const ncclConfig_t* cfg) {
  ch_status res = CH_OK;
  int n = parent->nranks, m = 0, me = -1;
  struct sock lsock = {.fd = -1};
  char* gone = calloc((size_t)n, 1);
  int* prank = calloc((size_t)n, sizeof(*prank));
  union sock_addr* addrs = calloc((size_t)n, sizeof(*addrs));
  *out = NULL;
  if (!gone || !prank || !addrs) { res = CH_SYSTEM; goto done; }
  for (int i = 0; i < nexclude; i++) gone[exclude[i]] = 1; /* checked by the caller */
  for (int r = 0; r < n; r++)
    if (!gone[r]) {
      if (r == parent->rank) me = m;
      prank[m++] = r;
    }
  CHECK_GOTO(boot_new_listener(parent->boot, &lsock), res, done);
  addrs[me] = lsock.addr;
  /* Ring allgather among the survivors only, over the parent's rank-to-rank bootstrap: excluded
   * ranks (perhaps dead) are never contacted. */
  int tag = TAG_SHRINK + (parent->nsplits & 0xffff);
  for (int s = 0; s < m - 1; s++) {
    int send_slot = (me - s + m) % m, recv_slot = (me - s - 1 + 2 * m) % m;
    CHECK_GOTO(boot_send(parent->boot, prank[(me + 1) % m], tag, &addrs[send_slot], sizeof(addrs[0])), res, done);
    CHECK_GOTO(boot_recv(parent->boot, prank[(me + m - 1) % m], tag, &addrs[recv_slot], sizeof(addrs[0])), res, done);
  }
  parent->nsplits++;
  CHECK_GOTO(build_child(parent, prank, addrs, m, me, 0x5348524eull /* "SHRN" */, &lsock, cfg, out), res, done);
  INFO(LOG_INIT, "shrink: parent rank %d -> rank %d of %d (%d rank(s) excluded)", parent->rank, me, m, nexclude);
done:
  if (lsock.fd >= 0) sock_close(&lsock);
  free(gone);
  free(prank);
  free(addrs);
  return res;
}
