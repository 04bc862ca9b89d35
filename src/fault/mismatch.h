/* Calls that differ across ranks, and lost peers (fault/mismatch.c). */
#ifndef CH_FAULT_MISMATCH_H
#define CH_FAULT_MISMATCH_H

#include "../comm/work.h"

/* Calls that differ across ranks (fault/mismatch.c): CH_INVALID_USAGE, logged once per rank, and every
 * connection of comm poisoned so that the other ranks fail the call too. mm_found: op's receive met a
 * step of another call; mm_poll: slow-path check of a waiting plan. */
ch_status mm_found(struct ncclComm* comm, const struct ch_op* op);
ch_status mm_poll(struct ncclComm* comm, struct ch_plan* pl);
/* Rank `lost` (-1: unknown) is dead or its link failed (logged by the caller): tell every rank. */
void mm_peer_lost(struct ncclComm* comm, int lost);
/* Publish the collective this rank starts (h), for local peers' slow-path checks. */
void mm_publish(struct ncclComm* comm, const struct xfer_hdr* h);

#endif
