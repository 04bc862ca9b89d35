/* NCCL's environment plugin (NCCL_ENV_PLUGIN; ABI in env_abi.h; env_plugin.c): loaded once per process,
 * before the first parameter other than NCCL_ENV_PLUGIN and NCCL_CONF_FILE is read (misc/param.c), and
 * from then on the source of every parameter's value in the environment's place. */
#ifndef CH_ENV_PLUGIN_H
#define CH_ENV_PLUGIN_H

/* Load the plugin value names (NCCL's names: "" libnccl-env.so if present, "none" nothing, a path or
 * library name, or X for libnccl-env-X.so), once per process: later calls return at once, and a call
 * during the first waits for it. It reads no parameter and logs only through log_defer (logging reads
 * parameters, which would come through the plugin). */
void envp_load(const char* value);
/* 1 once envp_load has run, whether or not a plugin loaded (an acquire load). */
int envp_loaded(void);
/* The value of the variable name: the plugin's getEnv when one is loaded (*source "env plugin"), else
 * getenv's (*source "environment"); NULL when unset. Called under param.c's lock, which makes the
 * plugin's calls one at a time; the caller copies the value before the next call for the same name. */
const char* envp_getenv(const char* name, const char** source);
/* Testing aid: finalize the plugin and forget it, so that the next parameter read loads
 * NCCL_ENV_PLUGIN afresh (call param_reset too). Not safe against concurrent parameter reads. */
void envp_reset_for_tests(void);

#endif
