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
/* The same for a wave of a group run in waves (core/group.c): when the cap is still exceeded, wait
 * up to wait_ns for the previous wave's peers to reach their side of it, so that they can be
 * released (past that, or on an abort, it goes on over the cap: memory, not correctness). */
int pool_before_wave(struct ncclComm* comm, const struct ch_plan* pl, uint64_t wait_ns);
/* How many of the peers marked in need_send/need_recv ([0, nranks): plan_needs) the pool holds. */
int pool_count(const struct ncclComm* comm, const char* need_send, const char* need_recv);
/* After a successful comm_connect: reserve the group's messages on the connections it made. */
void pool_after_connect(struct ncclComm* comm);

/* ncclCommSuspend (core/suspend.c), the comm idle: close every pooled connection whose messages both
 * ends have reserved alike, and give back those the peer closed. Returns how many peers were let go;
 * an unbalanced one (a send that fit its FIFO, its receive not yet called) stays live. */
int pool_release_idle(struct ncclComm* comm);

/* Per-peer FIFO sizes for n ranks (CHORUS_P2P_MEM over the peers, scaled down from at most 832 KiB
 * alike in every protocol to at least 8 slots of 4 KiB each: the same on every rank), and the pool's
 * cap: max_peers (ncclConfig_t.maxP2pPeers after NCCL_P2P_MAX_PEERS; <= 0 or NCCL_CONFIG_UNDEF_INT:
 * unset), else CHORUS_P2P_PEERS, else what CHORUS_P2P_MEM holds; at most n. */
void pool_sizes(const struct tp_sizes* ring, int n, int max_peers, struct tp_sizes* out, int* cap);

#endif
