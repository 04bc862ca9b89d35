/* A stand-in NVTX tool for tests/test_nvtx.c, loaded by the library through NVTX_INJECTION64_PATH as
 * Nsight Systems' would be. It appends one line per event to the file CHORUS_TEST_NVTX_OUT names, with
 * one write(2) to an O_APPEND descriptor each, so the lines of threads and forked ranks never mix:
 *   init PID                           InitializeInjectionNvtx2 was called (once per NVTX user)
 *   module PID M SIZE                  module M's table has SIZE slots, both NULL ends where expected
 *   domain PID NAME                    DomainCreateA
 *   string PID DOMAIN TEXT             DomainRegisterStringA
 *   push PID TID DOMAIN NAME DEPTH     a range opened; DOMAIN "-" is the default domain
 *   pop PID TID DOMAIN DEPTH           the innermost range of that thread closed
 *   bad PID WHAT                       a call the library should not make, or malformed attributes
 * CHORUS_TEST_NVTX_MODE picks what the tool takes: "full" (default: the domain calls, the global
 * ones, and a recording stand-in in every other slot of every module), "core" (the global calls
 * only), "none" (nothing, but accepts), "fail" (InitializeInjectionNvtx2 returns 0). The layouts are
 * NVTX's ABI, declared here as in src/api/nvtx.c: the NVTX headers are not on every build machine. */
#define _GNU_SOURCE
#include <fcntl.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

typedef void (*nvtx_fn)(void);
struct attr { /* nvtxEventAttributes_t, version 3 */
  uint16_t version, size;
  uint32_t category;
  int32_t color_type;
  uint32_t color;
  int32_t payload_type;
  int32_t reserved0;
  uint64_t payload;
  int32_t message_type;
  const void* message;
};
struct callbacks {
  size_t struct_size;
  int (*get_module_table)(int module, nvtx_fn*** out_table, unsigned* out_size);
};
struct version_info {
  size_t struct_size;
  uint32_t version, reserved0;
  void (*set_injection_version)(uint32_t version);
};

static void record(const char* fmt, ...) {
  const char* path = getenv("CHORUS_TEST_NVTX_OUT");
  if (!path || !*path) return;
  char line[512];
  va_list ap;
  va_start(ap, fmt);
  int n = vsnprintf(line, sizeof(line) - 1, fmt, ap);
  va_end(ap);
  if (n < 0) return;
  if (n > (int)sizeof(line) - 2) n = (int)sizeof(line) - 2;
  line[n++] = '\n';
  int fd = open(path, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0600);
  if (fd < 0) return;
  if (write(fd, line, (size_t)n) != n) { /* the test sees the line missing */
  }
  close(fd);
}

static long tid(void) { return (long)syscall(SYS_gettid); }
static _Thread_local int depth; /* ranges open on this thread */

/* Handles are the names, copied: a domain handle is its name, a registered string its text. */
static const char* dom_name(const void* d) { return d ? (const char*)d : "-"; }
static void* create_a(const char* name) {
  record("domain %d %s", (int)getpid(), name ? name : "(null)");
  return name ? strdup(name) : NULL;
}
static void* register_a(void* d, const char* text) {
  record("string %d %s %s", (int)getpid(), dom_name(d), text ? text : "(null)");
  return text ? strdup(text) : NULL;
}
static const char* message(const struct attr* a) {
  if (!a || a->version != 3 || a->size < sizeof(struct attr)) return NULL;
  if (a->message_type == 1 || a->message_type == 3) return (const char*)a->message;
  return NULL;
}
static int push(const void* d, const struct attr* a) {
  const char* m = message(a);
  if (!m)
    record("bad %d push attributes (version %d size %d type %d)", (int)getpid(), a ? a->version : -1, a ? a->size : -1,
           a ? a->message_type : -1);
  record("push %d %ld %s %s %d", (int)getpid(), tid(), dom_name(d), m ? m : "?", depth);
  return depth++;
}
static int pop(const void* d) {
  if (depth == 0) record("bad %d pop of no range", (int)getpid());
  else depth--;
  record("pop %d %ld %s %d", (int)getpid(), tid(), dom_name(d), depth);
  return depth;
}
static int domain_push_ex(void* d, const struct attr* a) { return push(d, a); }
static int domain_pop(void* d) { return pop(d); }
static int push_ex(const struct attr* a) { return push(NULL, a); }
static int push_a(const char* text) {
  struct attr a = {.version = 3, .size = sizeof(a), .message_type = 1, .message = text};
  return push(NULL, &a);
}
static int pop_global(void) { return pop(NULL); }
static void unexpected(void) { record("bad %d a slot the library should not call", (int)getpid()); }

static const unsigned sizes[7] = {0, 16, 9, 15, 7, 16, 7};

__attribute__((visibility("default"))) int InitializeInjectionNvtx2(const void* (*get)(uint32_t id)) {
  int pid = (int)getpid();
  record("init %d", pid);
  const char* mode = getenv("CHORUS_TEST_NVTX_MODE");
  if (!mode || !*mode) mode = "full";
  if (!strcmp(mode, "fail")) return 0;
  if (!strcmp(mode, "none")) return 1;
  const struct callbacks* cb = get(1);
  const struct version_info* vi = get(3);
  if (!cb || cb->struct_size < sizeof(*cb) || !cb->get_module_table) {
    record("bad %d no callbacks table", pid);
    return 0;
  }
  if (!vi || vi->struct_size < sizeof(*vi) || vi->version != 3 || !vi->set_injection_version)
    record("bad %d version table", pid);
  else vi->set_injection_version(3);
  if (get(0) || get(2) || get(4)) record("bad %d an export table for an unknown id", pid);
  if (cb->get_module_table(0, NULL, NULL) || cb->get_module_table(7, NULL, NULL)) record("bad %d module 0 or 7", pid);
  for (int m = 1; m <= 6; m++) {
    nvtx_fn** t = NULL;
    unsigned n = 0;
    if (!cb->get_module_table(m, &t, &n) || !t) {
      record("bad %d no table for module %d", pid, m);
      continue;
    }
    int ends = t[0] == NULL && n == sizes[m] && t[n] == NULL;
    for (unsigned i = 1; ends && i < n; i++) ends = t[i] != NULL;
    record("module %d %d %u%s", pid, m, n, ends ? "" : " malformed");
    if (!ends) continue;
    int core = m == 1, core2 = m == 5;
    if (!strcmp(mode, "core") && !core) continue;
    for (unsigned i = 1; i < n; i++) *t[i] = strcmp(mode, "core") ? unexpected : NULL;
    if (core) {
      *t[8] = (nvtx_fn)push_ex;
      *t[9] = (nvtx_fn)push_a;
      *t[11] = (nvtx_fn)pop_global;
    }
    if (core2 && !strcmp(mode, "full")) {
      *t[4] = (nvtx_fn)domain_push_ex;
      *t[5] = (nvtx_fn)domain_pop;
      *t[10] = (nvtx_fn)register_a;
      *t[12] = (nvtx_fn)create_a;
    }
  }
  return 1;
}
