/* The per-peer connections of send/recv, AlltoAll, Gather and Scatter, kept under a per-rank budget
 * (core/pool.c). */
#ifndef CH_CORE_POOL_H
#define CH_CORE_POOL_H

#include "../comm/comm.h"
#include "../comm/work.h"

/* Before comm_connect, for the set-0 peers a group's plan sends to and receives from: give back
 * connections the peer has closed, reserve this group's messages on the live ones (a connection found
 * closed is dropped, so comm_connect re-makes it) and close least recently used idle ones while the
 * live peers and the new ones exceed the cap. Returns whether some needed connection is missing. */
struct ch_plan;
int pool_before_connect(struct ncclComm* comm, const struct ch_plan* pl);
/* After a successful comm_connect: reserve the group's messages on the connections it made. */
void pool_after_connect(struct ncclComm* comm);

#endif
