/* Settings that every rank of a communicator must share, compared once at init (agree.c). */
#ifndef CH_AGREE_H
#define CH_AGREE_H

#include "comm.h"

/* Exchange this rank's settings (after tune_init) and compare them with every rank's. On any
 * difference every rank returns CH_INVALID_USAGE, with one WARN per differing setting naming the
 * variable, the values and which ranks have which. */
ch_status comm_agree(struct ncclComm* comm);

#endif
