/* Small helpers shared by every layer: time, randomness, host identity, hashing. */
#ifndef CH_UTILS_H
#define CH_UTILS_H

#include <stddef.h>
#include <stdint.h>

#include "status.h"

uint64_t ut_now_ns(void);                 /* CLOCK_MONOTONIC */
ch_status ut_random(void* buf, size_t n); /* getrandom(2), falls back to /dev/urandom */
uint64_t ut_hash(const void* data, size_t n, uint64_t seed); /* FNV-1a 64 */
/* Host identity: NCCL_HOSTID if set, else hostname + boot id. Stable for the process. */
const char* ut_host_id(void);
uint64_t ut_host_hash(void);
/* A random 64-bit identity of this process, drawn on first use and again in a forked child. Unlike a
 * pid it is unique across PID namespaces (containers sharing a host), so it decides "same process". */
uint64_t ut_proc_nonce(void);
/* Inode of this process's PID namespace (0 if unknown): a pid means the same process only to a peer
 * in the same namespace. */
uint64_t ut_pid_ns(void);
const char* ut_hostname(void);
int ut_ncpus(void);
/* This thread's CPU affinity as a bit mask of CPUs 0 .. 64*nwords-1 (higher CPUs left out). */
void ut_cpu_mask(uint64_t* words, int nwords);
/* False once the process has exited, including a zombie not yet reaped by its parent. */
int ut_pid_alive(int pid);
/* Wait politely: spin for a while, then yield, then sleep. `iter` counts calls in this wait. */
void ut_backoff(uint64_t iter);

#define UT_MIN(a, b) ((a) < (b) ? (a) : (b))
#define UT_MAX(a, b) ((a) > (b) ? (a) : (b))
#define UT_STR_(x) #x
#define UT_STR(x) UT_STR_(x) /* a macro's value as a string literal */
#define UT_DIV_UP(a, b) (((a) + (b)-1) / (b))
#define UT_ALIGN_UP(a, b) (UT_DIV_UP(a, b) * (b))

/* Fork hooks, the one policy for every subsystem (misc/atfork.c): a subsystem registers its hooks
 * once, here, never with pthread_atfork itself. One pthread_atfork call installs a table whose rows run
 * as pthread_atfork runs its own: prepare hooks in reverse registration order (the last registered
 * locks first), parent and child hooks in registration order. A prepare hook takes the subsystem's
 * locks so that the child inherits none held by a thread it lacks; the child hook resets what belongs
 * to threads or descriptors of the parent, and unlocks. Any hook may be NULL. Any thread. */
void ut_atfork_register(void (*prepare)(void), void (*parent)(void), void (*child)(void));

/* Time units: clocks here count nanoseconds (ut_now_ns); settings count seconds, ms or us. */
#define UT_NS_PER_S 1000000000ull
#define UT_NS_PER_MS 1000000ull
#define UT_NS_PER_US 1000ull
#define UT_US_PER_S 1000000ull

/* One pause in a spin-wait: tells the core (and a hyperthread sibling) that this is a wait loop. */
static inline void ut_cpu_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  __asm__ __volatile__("yield" ::: "memory");
#else
  __asm__ __volatile__("" ::: "memory");
#endif
}

/* Appends "; " (unless buf is empty) and the formatted text to the string in buf of cap bytes, cut at
 * its size: a list of reasons built up as they are found. */
void ut_appendf(char* buf, size_t cap, const char* fmt, ...) __attribute__((format(printf, 3, 4)));

/* NCCL's names for a plugin library of kind K ("net", "profiler"): `value` as given, then
 * libnccl-K-<value>.so when value is a bare name (no '/', not lib*.so); empty: libnccl-K.so; "none" (any
 * case): nothing. Returns how many names it wrote (0-2). */
int ut_plugin_names(const char* kind, const char* value, char out[2][512]);
/* dlopen (RTLD_NOW | RTLD_LOCAL) the first of names[0..n) that loads: its handle, its index in *which;
 * NULL when none did, each failure's dlerror text in err[i]. */
void* ut_plugin_open(char names[2][512], int n, int* which, char err[2][256]);

#endif
