/* chorus-net-harness's two halves (net_harness.c: output, loading the plugin, setup and main;
 * net_harness_peers.c: what the receiver and the sender do). One process runs one role at a time;
 * every global here is that process's own (the harness forks before either role starts). */
#ifndef CHORUS_NET_HARNESS_H
#define CHORUS_NET_HARNESS_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "../src/net/net_abi.h"

#define INFLIGHT 8                  /* messages in flight per direction, as NCCL_STEPS */
#define MAX_MSG (4u << 20)          /* largest message of the size list */
#define SLOT (MAX_MSG + 4096)       /* a message's slot: room for the receive's slack and the canary */
#define SLACK 64                    /* odd receives are posted this much larger than the send */
#define CANARY 0xEE
#define GSLOT (64u << 10)           /* a grouped receive's slot */
#define GMAX 8                      /* largest n of a grouped receive tried */
#define GROUNDS 4
#define TAG 1                       /* NCCL: the sender's rank */
#define GTAG 100
#define STEP_TIMEOUT_S 30           /* connect/accept/pipe waits give up after this long */

#define NSIZES 13
extern const size_t sizes[NSIZES];

extern const char* role;          /* "send", "recv" or "main", in every line */
extern const char* volatile g_step; /* the step a watchdog or a crash names */
extern int nfail, npass, nwarn;
extern pid_t child_pid, parent_pid;
extern int child_status;           /* the receiver's wait status once reaped (-1 before) */
extern ncclNet_v12_t net;         /* the plugin's table, adapted to v12 */
extern int version;
extern void* ctx;
extern int dev;
extern ncclNetProperties_v12_t props;
extern int c2p[2];                /* the receiver's pipe to the sender (the handle, then "done") */
extern uint8_t* buf[2];           /* [0] messages, [1] grouped receives: shared host memory */
extern size_t buflen[2];
extern void* mh[2];

void line(const char* what, const char* fmt, ...) __attribute__((format(printf, 2, 3)));
#define PASS(...) line("PASS", __VA_ARGS__)
#define FAIL(...) line("FAIL", __VA_ARGS__)
void step(const char* name);
double now_s(void);
uint8_t pat(size_t size, int idx, size_t j);
void fill(uint8_t* p, size_t size, int idx);
long check(const uint8_t* p, size_t size, int idx);
int peer_alive(void);
int io_full(int fd, void* buf, size_t n, int rd);
int wait_req(void* req, int* sz, const char* what);
int setup(int print);
void finalize(void);
int register_buffers(void* comm, const char* what);
void deregister(void* comm);
size_t max_size(void);

void receiver(void); /* net_harness_peers.c */
void sender(void);

#endif
