/* Groups (core/group.c): every checked call joins the calling thread's group; ncclGroupEnd launches it. */
#ifndef CH_CORE_GROUP_H
#define CH_CORE_GROUP_H

#include "../comm/work.h"

/* Group layer (group.c). Every API call goes through enq_task. */
ch_status enq_task(struct ch_task* t);
int group_depth(void);
/* Which outermost group of this thread is open (or was last): a number that grows at each one. */
uint64_t group_epoch(void);
ch_status group_start(void);
ch_status group_end(void);
/* Close the group without launching anything; estimate its time in microseconds. */
ch_status group_simulate_end(float* estimated_us);
/* Inside a group: queue a call once the outermost group has launched, as a group of its own
 * (fn(arg, 1)), or let it go (fn(arg, 0): the group failed or was simulated); fn frees arg. For a call
 * whose input a kernel of the group writes (a split reduction's AllGather, staging/staging.c): a group
 * copies every input before any of its plans runs. */
ch_status group_after(ch_status (*fn)(void* arg, int run), void* arg);
/* Remember that a call inside the current group failed its checks (the group then fails). */
void group_set_error(ch_status s);
/* Defer a communicator init to the end of the current group. */
ch_status group_defer_init(struct ncclComm* comm);
/* Is comm's init deferred to the end of this thread's current group? */
int group_init_pending(const struct ncclComm* comm);

#endif
