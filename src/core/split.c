/* ncclCommSplit: members agree over the parent's bootstrap and build the child's bootstrap from a
 * table of addresses, without any new root. */
#include <stdlib.h>
#include <string.h>

#include "../misc/log.h"
#include "../misc/utils.h"
#include "init.h"

struct split_info {
  int32_t color, key, prank, pad;
  union sock_addr addr;
};

static int by_key(const void* a, const void* b) {
  const struct split_info *x = a, *y = b;
  if (x->key != y->key) return x->key < y->key ? -1 : 1;
  return x->prank < y->prank ? -1 : x->prank > y->prank;
}

ch_status comm_split(struct ncclComm* parent, int color, int key, struct ncclComm** out, const ncclConfig_t* cfg) {
  ch_status res = CH_OK;
  int n = parent->nranks;
  struct sock lsock = {.fd = -1};
  struct split_info* all = calloc((size_t)n, sizeof(*all));
  struct split_info* members = calloc((size_t)n, sizeof(*members));
  union sock_addr* addrs = calloc((size_t)n, sizeof(*addrs));
  struct ncclComm* comm = NULL;
  *out = NULL;
  if (!all || !members || !addrs) { res = CH_SYSTEM; goto fail; }
  CHECK_GOTO(boot_new_listener(parent->boot, &lsock), res, fail);
  all[parent->rank] = (struct split_info){color, key, parent->rank, 0, lsock.addr};
  CHECK_GOTO(boot_allgather(parent->boot, all, sizeof(*all)), res, fail);
  int split_id = parent->nsplits++;
  if (color == NCCL_SPLIT_NOCOLOR) goto done;

  int m = 0;
  for (int r = 0; r < n; r++)
    if (all[r].color == color) members[m++] = all[r];
  qsort(members, (size_t)m, sizeof(*members), by_key);
  int me = 0;
  while (members[me].prank != parent->rank) me++;
  for (int i = 0; i < m; i++) addrs[i] = members[i].addr;

  CHECK_GOTO(comm_alloc(&comm, m, me, cfg), res, fail);
  comm->peers = calloc((size_t)m, sizeof(struct boot_rank_info));
  if (!comm->peers) { res = CH_SYSTEM; goto fail; }
  for (int i = 0; i < m; i++) {
    comm->peers[i] = parent->peers[members[i].prank];
    comm->peers[i].rank = i;
    comm->peers[i].nranks = m;
    comm->peers[i].listen_addr = addrs[i];
  }
  uint64_t mix[3] = {parent->comm_hash, (uint64_t)(uint32_t)color, (uint64_t)split_id};
  comm->comm_hash = ut_hash(mix, sizeof(mix), 0x5851f42d4c957f2dull);
  /* Until the child exists for the user, only the parent can be aborted: its flag stops the child's
   * init (the caller is inside ncclCommSplit on the parent, so the parent outlives this). */
  CHECK_GOTO(boot_init_from_table(me, m, boot_secret(parent->boot), addrs, &lsock, &parent->abort_flag, &comm->boot),
             res, fail);
  lsock.fd = -1; /* owned by the child's bootstrap now */
  CHECK_GOTO(comm_init_job(comm), res, fail);
  boot_set_abort(comm->boot, &comm->abort_flag);
  INFO(LOG_INIT, "split: parent rank %d color %d key %d -> rank %d of %d", parent->rank, color, key, me, m);
  *out = comm;
  comm = NULL;
done:
  if (lsock.fd >= 0) sock_close(&lsock);
  free(all);
  free(members);
  free(addrs);
  return res;
fail:
  if (comm) comm_free(comm);
  goto done;
}
