/* NVTX 3's injection protocol, the part Chorus needs. NVTX is header-only: every library that uses it
 * loads the tool itself, which is what this file does in its place. The tool (a shared object named
 * by NVTX_INJECTION64_PATH) exports InitializeInjectionNvtx2; we call it with our export-table getter,
 * and it writes the functions it implements into the slots of our callback tables. A slot it leaves
 * NULL is a call it does not take. The layouts below are NVTX's ABI (nvtxTypes.h), stable since 2018. */
#include <dlfcn.h>
#include <pthread.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "../misc/log.h"
#include "../misc/param.h"
#include "../cuda/cudrv.h"
#include "nvtx.h"

/* NVTX_OFF (nvtx.h): no tool, disabled, or the tool takes no ranges. NVTX_WAIT: a tool is named but
 * the process has not loaded CUDA (yet: each call looks again, cheaply, see cudrv_present). */
enum { NVTX_UNREAD = 0, NVTX_WAIT = 2, NVTX_ON = 3 };
_Atomic int nvtx_state; /* NVTX_ON is stored (release) after everything below is set */

typedef void (*nvtx_fn)(void);

/* nvtxEventAttributes_t of version 3 (48 bytes). */
struct nvtx_attr {
  uint16_t version, size;
  uint32_t category;
  int32_t color_type;
  uint32_t color;
  int32_t payload_type;
  int32_t reserved0;
  uint64_t payload;
  int32_t message_type;
  const void* message; /* char* text, or a registered string handle */
};
_Static_assert(sizeof(struct nvtx_attr) == 48 && offsetof(struct nvtx_attr, payload) == 24 &&
                   offsetof(struct nvtx_attr, message_type) == 32 && offsetof(struct nvtx_attr, message) == 40,
               "nvtxEventAttributes_t layout");
enum { NVTX_VERSION = 3, NVTX_MSG_ASCII = 1, NVTX_MSG_REGISTERED = 3 };

/* The export tables the tool asks for by id (1: callbacks, 3: version). */
struct nvtx_callbacks {
  size_t struct_size;
  int (*get_module_table)(int module, nvtx_fn*** out_table, unsigned* out_size);
};
struct nvtx_version_info {
  size_t struct_size;
  uint32_t version, reserved0;
  void (*set_injection_version)(uint32_t version);
};

/* Callback modules 1..6 (CORE, CUDA, OPENCL, CUDART, CORE2, SYNC) and their slot counts. A tool may
 * ask for any of them (CUPTI asks for all): those we never call get slots all the same. */
enum { MOD_CORE = 1, MOD_CORE2 = 5, NMODULES = 7, MAX_SLOTS = 16 };
static const unsigned mod_size[NMODULES] = {0, 16, 9, 15, 7, 16, 7};
enum { CORE_RANGE_PUSH_EX = 8, CORE_RANGE_PUSH_A = 9, CORE_RANGE_POP = 11 };
enum { CORE2_RANGE_PUSH_EX = 4, CORE2_RANGE_POP = 5, CORE2_REGISTER_STRING_A = 10, CORE2_CREATE_A = 12 };
/* What the tool writes, and the tables it gets: entry i points at slot i; entry 0 and entry `size`
 * stay NULL, as NVTX's, so a tool that reads past the end faults instead of writing somewhere. Written
 * only inside load(), before NVTX_ON. */
static nvtx_fn slots[NMODULES][MAX_SLOTS];
static nvtx_fn* tables[NMODULES][MAX_SLOTS + 1];

static int get_module_table(int module, nvtx_fn*** out_table, unsigned* out_size) {
  if (module < 1 || module >= NMODULES) return 0;
  if (out_table) *out_table = tables[module];
  if (out_size) *out_size = mod_size[module];
  return 1;
}
static void set_injection_version(uint32_t version) { (void)version; }
/* Not const, as NVTX's own: a tool that writes to them must not fault. */
static struct nvtx_callbacks callbacks = {sizeof(struct nvtx_callbacks), get_module_table};
static struct nvtx_version_info version_info = {sizeof(struct nvtx_version_info), NVTX_VERSION, 0,
                                                set_injection_version};
static const void* export_table(uint32_t id) {
  return id == 1 ? (const void*)&callbacks : id == 3 ? (const void*)&version_info : NULL;
}

/* How ranges are made, chosen once from what the tool filled in: in domain "NCCL" as NCCL does, else
 * (a tool of the global calls only) in the default domain, with the names as text. */
enum { MODE_DOMAIN, MODE_EX, MODE_A };
static int mode;
static void* domain;                        /* nvtxDomainHandle_t, NULL: the default domain */
static struct nvtx_attr attrs[NVTX_NCALLS]; /* one per range name; read by the tool, never changed */
static const char* names[NVTX_NCALLS];
static int (*domain_push)(void* domain, const struct nvtx_attr* a);
static int (*domain_pop)(void* domain);
static int (*push_ex)(const struct nvtx_attr* a);
static int (*push_a)(const char* message);
static int (*pop)(void);

static char* tool_path; /* NVTX_INJECTION64_PATH, copied at the first call */
static pthread_once_t decide_once = PTHREAD_ONCE_INIT, load_once = PTHREAD_ONCE_INIT;

#define SLOT(m, i, var) (*(void**)&(var) = (void*)slots[m][i])

/* 1 if the tool takes ranges: then the mode, the domain and every name's attributes are set. */
static int setup(void) {
  void* (*create_a)(const char* name);
  void* (*register_a)(void* domain, const char* text);
  SLOT(MOD_CORE2, CORE2_RANGE_PUSH_EX, domain_push);
  SLOT(MOD_CORE2, CORE2_RANGE_POP, domain_pop);
  SLOT(MOD_CORE2, CORE2_CREATE_A, create_a);
  SLOT(MOD_CORE2, CORE2_REGISTER_STRING_A, register_a);
  SLOT(MOD_CORE, CORE_RANGE_PUSH_EX, push_ex);
  SLOT(MOD_CORE, CORE_RANGE_PUSH_A, push_a);
  SLOT(MOD_CORE, CORE_RANGE_POP, pop);
  if (domain_push && domain_pop) mode = MODE_DOMAIN;
  else if (push_ex && pop) mode = MODE_EX;
  else if (push_a && pop) mode = MODE_A;
  else return 0;
  if (mode == MODE_DOMAIN && create_a) domain = create_a("NCCL");
  static const char* calls[] = {
#define NVTX_CALL_NAME_(id, name) name,
      NVTX_CALL_LIST(NVTX_CALL_NAME_)
#undef NVTX_CALL_NAME_
  };
  _Static_assert(sizeof(calls) / sizeof(calls[0]) == NVTX_NCALLS - FUNC_COUNT, "one name per call");
  int registered = 0;
  for (int id = 0; id < NVTX_NCALLS; id++) {
    names[id] = id < FUNC_COUNT ? algo_fname(id) : calls[id - FUNC_COUNT];
    struct nvtx_attr* a = &attrs[id];
    a->version = NVTX_VERSION, a->size = sizeof(*a);
    a->message_type = NVTX_MSG_ASCII, a->message = names[id];
    /* Registered strings, as NCCL's: the tool copies and hashes each name once, not at every call. */
    void* h = mode == MODE_DOMAIN && register_a ? register_a(domain, names[id]) : NULL;
    if (h) a->message_type = NVTX_MSG_REGISTERED, a->message = h, registered++;
  }
  INFO(LOG_INIT, "NVTX: ranges for the tool %s, in %s, named by %s", tool_path,
       mode == MODE_DOMAIN ? (domain ? "domain NCCL" : "the default domain (the tool makes no domains)")
                           : "the default domain (the tool takes no domain calls)",
       registered ? "registered strings" : "text");
  return 1;
}

static void load(void) {
  for (int m = 1; m < NMODULES; m++)
    for (unsigned i = 1; i < mod_size[m]; i++) tables[m][i] = &slots[m][i];
  int on = 0;
  void* h = dlopen(tool_path, RTLD_LAZY); /* as NVTX: not RTLD_GLOBAL, the tool's symbols stay its own */
  if (!h) {
    WARN("NVTX: cannot load the tool NVTX_INJECTION64_PATH=%s: %s; calls go on without NVTX ranges (unset the "
         "variable, or NCCL_NVTX_DISABLE=1)",
         tool_path, dlerror());
  } else {
    int (*init)(const void* (*get)(uint32_t id));
    dlerror();
    *(void**)&init = dlsym(h, "InitializeInjectionNvtx2");
    if (!init) {
      WARN("NVTX: the tool NVTX_INJECTION64_PATH=%s is not an NVTX 3 injection library (%s); calls go on without "
           "NVTX ranges",
           tool_path, dlerror());
    } else if (!init(export_table)) {
      INFO(LOG_INIT, "NVTX: the tool %s declined (InitializeInjectionNvtx2 returned 0): no ranges", tool_path);
    } else if (!(on = setup())) {
      INFO(LOG_INIT, "NVTX: the tool %s takes no ranges (it filled no push and pop): none made", tool_path);
    }
    if (!on) {
      memset(slots, 0, sizeof(slots)); /* nothing may call into a library we close */
      dlclose(h);
    }
  }
  atomic_store_explicit(&nvtx_state, on ? NVTX_ON : NVTX_OFF, memory_order_release);
}

static void decide(void) {
  /* NVTX's own variable, read from the environment as NVTX reads it (not a Chorus tunable). */
  const char* path = getenv("NVTX_INJECTION64_PATH");
  int s = NVTX_OFF;
  if (path && *path && param_int(PARAM_NVTX_DISABLE) != 0)
    INFO(LOG_INIT, "NVTX: NCCL_NVTX_DISABLE is set: no ranges for the tool %s", path);
  else if (path && *path && (tool_path = strdup(path))) s = NVTX_WAIT;
  atomic_store_explicit(&nvtx_state, s, memory_order_release);
}

int nvtx_push(int id) {
  int s = atomic_load_explicit(&nvtx_state, memory_order_acquire);
  if (s == NVTX_UNREAD) {
    pthread_once(&decide_once, decide);
    s = atomic_load_explicit(&nvtx_state, memory_order_acquire);
  }
  if (s == NVTX_WAIT) {
    if (!cudrv_present()) return 0; /* ranges are for the CUDA path: a host-only process makes none */
    pthread_once(&load_once, load);
    s = atomic_load_explicit(&nvtx_state, memory_order_acquire);
  }
  if (s != NVTX_ON || id < 0 || id >= NVTX_NCALLS) return 0;
  /* The tool's return value (the nesting level, or < 0 if it does not track) changes nothing here:
   * the pop is owed either way, as NCCL's scoped ranges pop. */
  if (mode == MODE_DOMAIN) domain_push(domain, &attrs[id]);
  else if (mode == MODE_EX) push_ex(&attrs[id]);
  else push_a(names[id]);
  return 1;
}

void nvtx_pop(void) {
  if (mode == MODE_DOMAIN) domain_pop(domain);
  else pop();
}
