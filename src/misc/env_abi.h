/* NCCL's environment plugin ABI, versions 1 and 2 (NCCL 2.30 on), declared here so that a plugin built
 * for NCCL loads into Chorus unchanged. A plugin exports a data object named "ncclEnvPlugin_v2" (or
 * "ncclEnvPlugin_v1"); the host calls init once per process, then getEnv for every parameter it reads,
 * and finalize at exit. Layouts follow NCCL's src/include/plugin/env/env_v1.h and env_v2.h; the asserts
 * at the end pin them. misc/env_plugin.c is the host side; tests/env_stub is a plugin built from this
 * header. */
#ifndef CH_ENV_ABI_H
#define CH_ENV_ABI_H

#include <stddef.h>
#include <stdint.h>
#include <nccl.h>

#include "log_abi.h"

#ifdef __cplusplus
extern "C" {
#endif

/* init: the host's NCCL version (major, minor, patch, suffix such as "" or "+cuda12.8") and, from v2,
 * the logger the plugin may use. getEnv: the value of a variable, or NULL when unset; the string must
 * stay valid until the next getEnv of the same name or finalize. finalize may be NULL. */
typedef struct {
  const char* name;
  ncclResult_t (*init)(uint8_t ncclMajor, uint8_t ncclMinor, uint8_t ncclPatch, const char* suffix,
                       ncclDebugLogger_t logFunction);
  ncclResult_t (*finalize)(void);
  const char* (*getEnv)(const char* name);
} ncclEnv_v2_t;

/* v1: init has no logger; the rest as v2. */
typedef struct {
  const char* name;
  ncclResult_t (*init)(uint8_t ncclMajor, uint8_t ncclMinor, uint8_t ncclPatch, const char* suffix);
  ncclResult_t (*finalize)(void);
  const char* (*getEnv)(const char* name);
} ncclEnv_v1_t;

#ifdef __cplusplus
}
#endif

#if !defined(__cplusplus) && defined(__LP64__)
_Static_assert(offsetof(ncclEnv_v2_t, getEnv) == 24 && sizeof(ncclEnv_v2_t) == 32, "ncclEnv_v2_t is 4 pointers");
_Static_assert(offsetof(ncclEnv_v1_t, getEnv) == 24 && sizeof(ncclEnv_v1_t) == 32, "ncclEnv_v1_t is 4 pointers");
#endif

#endif
