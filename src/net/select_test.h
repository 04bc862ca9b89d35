/* Test hook for select.c: forget the network chosen (finalizing its context), so that the next
 * ch_net_get decides again from the current NCCL_NET / NCCL_NET_PLUGIN (after param_reset). Not
 * thread-safe against concurrent users of the chosen table: tests only. */
#ifndef CH_NET_SELECT_TEST_H
#define CH_NET_SELECT_TEST_H

void ch_net_reset_for_tests(void);

#endif
