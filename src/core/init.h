/* Communicator lifecycle internals shared by the API files. */
#ifndef CH_INIT_H
#define CH_INIT_H

#include "comm.h"

ch_status comm_alloc(struct ncclComm** out, int nranks, int rank, const ncclConfig_t* config);
void comm_free(struct ncclComm* comm);
/* Parse a user config (NULL = defaults) the NCCL way: size/magic/version checks, defaults, env. */
ch_status comm_parse_config(const ncclConfig_t* user, ncclConfig_t* out);
ch_status comm_split(struct ncclComm* parent, int color, int key, struct ncclComm** out, const ncclConfig_t* cfg);
/* The survivors (all but exclude[], valid and distinct) build a child; excluded ranks are not contacted. */
ch_status comm_shrink(struct ncclComm* parent, const int* exclude, int nexclude, struct ncclComm** out,
                      const ncclConfig_t* cfg);

#endif
