/* Ring order from the host identities exchanged at init (NCCL's ring search, for one NIC per host). */
#ifndef CH_TOPO_H
#define CH_TOPO_H

#include "../misc/status.h"

struct ncclComm;

/* CHORUS_RING_ORDER (a testing aid): how ring positions are permuted after grouping by host. */
enum topo_order { TOPO_ORDER_HOSTS = 0, TOPO_ORDER_REVERSE = 1, TOPO_ORDER_INTERLEAVE = 2, TOPO_ORDER_INVALID = -1 };
enum topo_order topo_ring_order(void);

/* order[i] = rank at ring position i for n ranks whose host identities are host[r]: the ranks of one
 * host are contiguous, hosts in order of their lowest rank, ranks of a host by rank; then permuted by
 * `how`. Pure: every rank computes the same order from the same table. */
void topo_ring_order_fill(int n, const uint64_t* host, enum topo_order how, int* order);

/* Fill comm->channels[0..nchannels).ring / ring_index / prev / next (all channels share one order:
 * with one interface per host a second order would only add host crossings) and log the ring once. */
ch_status comm_build_rings(struct ncclComm* comm);

/* tune/trees.c. NCCL's binary tree over n nodes: parent and children of node r (-1: none). */
void topo_btree(int n, int r, int* up, int* d0, int* d1);
/* Tree t (0 or 1) of the double binary tree. */
void topo_dtree(int n, int r, int t, int* up, int* d0, int* d1);
/* Fill comm->trees / ntrees (hosts as nodes, unless CHORUS_TREE_PER_RANK). */
ch_status comm_build_trees(struct ncclComm* comm);

#endif
