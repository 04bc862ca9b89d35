/* Connections between ranks, made when a plan first needs them (core/connect.c). */
#ifndef CH_CORE_CONNECT_H
#define CH_CORE_CONNECT_H

#include "../comm/comm.h"
#include "init.h"

/* Connect what the next plans need and is not connected yet, for several communicators at once
 * (one thread may drive many ranks). need_send[i][p] / need_recv[i][p] flag peers p of comms[i] for
 * sends and receives, need_send[i][nranks] asks for the rings, and need_*[i][nranks + 1 + p] flags p
 * as a peer of RecDbl, Rabenseifner or Tree (comm_apeer): 2 * nranks + 1 flags each. Two phases (all receivers publish their FIFOs, then all
 * senders attach), so no order of peers can deadlock. */
ch_status comm_connect(struct ncclComm** comms, int ncomms, char** need_send, char** need_recv);
/* Test hook: the next `count` connection setups of comm fail at this rank's receiving
 * (CONNECT_FAULT_RECV) or sending (CONNECT_FAULT_SEND) end with `status`, as a failed allocation would. */
enum { CONNECT_FAULT_RECV = 1, CONNECT_FAULT_SEND = 2 };
void comm_connect_inject_fault(struct ncclComm* comm, int where, int count, ch_status status);
/* Free every connection. */
void comm_free_connections(struct ncclComm* comm);

#endif
