/* NCCL 2.30's parameter API, served from the one parameter table (misc/param.h): every row is a key,
 * named by its variable (NCCL_DEBUG, CHORUS_TIMEOUT), with NCCL's type where NCCL registers the key and
 * otherwise the type NCCL's own environment settings have: integers are 64-bit signed, strings are C
 * strings, booleans are one byte. A typed getter accepts only a key of exactly its type, as NCCL's do.
 *
 * Thread safety: values come from param_int/param_str (cached under the table's lock); the strings and
 * tables handed out are either the table's own (never freed) or this thread's buffers, which stay valid
 * until the same call is made again on the same thread, as NCCL promises. */
#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include "../misc/log.h"
#include "../misc/param.h"
#include "api.h"

/* NCCL's type ids (src/include/param/common.h), as its ncclParamGet* compare them. */
enum ptype { T_I8 = 1, T_I16, T_I32, T_I64, T_U8, T_U16, T_U32, T_U64, T_BOOL, T_CSTR, T_RAW };

static const char* const type_names[] = {"?",        "int8_t",  "int16_t",     "int32_t",
                                         "int64_t",  "uint8_t", "uint16_t",    "uint32_t",
                                         "uint64_t", "bool",    "const char*", "ncclDebugLogLevel"};

/* A handle is the address of a row's entry here; nothing in it is read (its index is the row). */
struct ncclParamHandle {
  char unused;
};
static struct ncclParamHandle handles[PARAM_COUNT];

static enum ptype type_of(enum param_id id) {
  /* NCCL registers these two with types of their own: the level as its enum, the subsystems as a mask */
  if (id == PARAM_DEBUG) return T_RAW;
  if (id == PARAM_DEBUG_SUBSYS) return T_U64;
  struct param_info pi;
  param_describe(id, &pi);
  return pi.kind == P_STR ? T_CSTR : pi.kind == P_BOOL ? T_BOOL : T_I64;
}

/* The row behind h, or -1 with a WARN naming fn when h is not a handle of ours. */
static int row_of(ncclParamHandle_t h, const char* fn) {
  if (!h) {
    WARN("%s: the handle is NULL (bind one with ncclParamBind)", fn);
    return -1;
  }
  uintptr_t p = (uintptr_t)h, lo = (uintptr_t)&handles[0], hi = (uintptr_t)&handles[PARAM_COUNT];
  if (p < lo || p >= hi) {
    WARN("%s: handle %p was not made by ncclParamBind", fn, (void*)h);
    return -1;
  }
  return (int)(h - handles);
}

/* The value's bytes as NCCL lays them out for its type. */
static int raw_value(enum param_id id, enum ptype t, unsigned char* buf, size_t cap, size_t* len) {
  union {
    int64_t i64;
    uint64_t u64;
    int32_t i32;
    unsigned char b;
  } v;
  const void* src = &v;
  size_t n;
  switch (t) {
    case T_RAW: v.i32 = log_parse_level(param_str(id)), n = sizeof(v.i32); break;
    case T_U64: v.u64 = log_parse_subsys(param_str(id)), n = sizeof(v.u64); break;
    case T_BOOL: v.b = param_int(id) != 0, n = 1; break;
    case T_CSTR: src = param_str(id), n = strlen(param_str(id)) + 1; break;
    default: v.i64 = param_int(id), n = sizeof(v.i64); break;
  }
  if (n > cap) return -1;
  memcpy(buf, src, n);
  *len = n;
  return 0;
}

/* The value as text: the string itself, an integer in decimal, a boolean as TRUE or FALSE (NCCL's). */
static const char* text_value(enum param_id id, enum ptype t, char* buf, size_t cap) {
  switch (t) {
    case T_CSTR:
    case T_RAW:
    case T_U64: return param_str(id); /* the level and subsystems as set, in the table's storage */
    case T_BOOL: return param_int(id) ? "TRUE" : "FALSE";
    default: snprintf(buf, cap, "%" PRId64, param_int(id)); return buf;
  }
}

CH_API(ncclResult_t, ncclParamBind, ncclParamHandle_t* out, const char* key) {
  if (!out || !key) {
    WARN("ncclParamBind: %s is NULL", out ? "key" : "out");
    return ncclInvalidArgument;
  }
  int id = param_find(key);
  if (id < 0) {
    WARN("ncclParamBind: \"%.128s\" is not a parameter of Chorus (chorus-info lists them)", key);
    return ncclInvalidArgument;
  }
  *out = &handles[id];
  return ncclSuccess;
}

/* One typed getter: h must name a key of exactly type t. */
static ncclResult_t get_typed(ncclParamHandle_t h, void* out, size_t size, enum ptype t, const char* fn) {
  int id = row_of(h, fn);
  if (id < 0) return ncclInvalidArgument;
  if (!out) {
    WARN("%s: out is NULL", fn);
    return ncclInvalidArgument;
  }
  enum ptype have = type_of((enum param_id)id);
  if (have != t) {
    WARN("%s: %s is of type %s, not %s (ncclParamGet%s reads it)", fn, param_name((enum param_id)id), type_names[have],
         type_names[t],
         have == T_CSTR  ? "Str"
         : have == T_I64 ? "I64"
         : have == T_U64 ? "U64"
                         : "");
    return ncclInvalidArgument;
  }
  unsigned char buf[8];
  size_t len;
  if (raw_value((enum param_id)id, t, buf, sizeof(buf), &len) != 0 || len != size) return ncclInternalError;
  memcpy(out, buf, size);
  return ncclSuccess;
}

#define TYPED_GETTER(suffix, ctype, t)                                          \
  CH_API(ncclResult_t, ncclParamGet##suffix, ncclParamHandle_t h, ctype* out) { \
    return get_typed(h, out, sizeof(ctype), t, "ncclParamGet" #suffix);         \
  }
TYPED_GETTER(I8, int8_t, T_I8)
TYPED_GETTER(I16, int16_t, T_I16)
TYPED_GETTER(I32, int32_t, T_I32)
TYPED_GETTER(I64, int64_t, T_I64)
TYPED_GETTER(U8, uint8_t, T_U8)
TYPED_GETTER(U16, uint16_t, T_U16)
TYPED_GETTER(U32, uint32_t, T_U32)
TYPED_GETTER(U64, uint64_t, T_U64)
#undef TYPED_GETTER

CH_API(ncclResult_t, ncclParamGetStr, ncclParamHandle_t h, const char** out) {
  int id = row_of(h, "ncclParamGetStr");
  if (id < 0) return ncclInvalidArgument;
  if (!out) {
    WARN("ncclParamGetStr: out is NULL");
    return ncclInvalidArgument;
  }
  enum ptype have = type_of((enum param_id)id);
  if (have != T_CSTR) {
    WARN("ncclParamGetStr: %s is of type %s, not a string (ncclParamGetParameter gives any key as text)",
         param_name((enum param_id)id), type_names[have]);
    return ncclInvalidArgument;
  }
  *out = param_str((enum param_id)id); /* the table's storage: never freed */
  return ncclSuccess;
}

CH_API(ncclResult_t, ncclParamGet, ncclParamHandle_t h, void* out, int maxLen, int* len) {
  int id = row_of(h, "ncclParamGet");
  if (id < 0) return ncclInvalidArgument;
  if (!out || !len || maxLen <= 0) {
    WARN("ncclParamGet: %s", !out ? "out is NULL" : !len ? "len is NULL" : "maxLen must be > 0");
    return ncclInvalidArgument;
  }
  enum ptype t = type_of((enum param_id)id);
  size_t n = 0;
  /* Written straight into the caller's buffer when it fits; NCCL leaves *len 0 when it does not. */
  if (raw_value((enum param_id)id, t, out, (size_t)maxLen, &n) != 0) {
    *len = 0;
    WARN("ncclParamGet: %s's value (%s) does not fit in %d bytes", param_name((enum param_id)id), type_names[t],
         maxLen);
    return ncclInvalidArgument;
  }
  *len = (int)n;
  return ncclSuccess;
}

CH_API(ncclResult_t, ncclParamGetParameter, const char* key, const char** value, int* valueLen) {
  if (!key || !value || !valueLen) {
    WARN("ncclParamGetParameter: %s is NULL", !key ? "key" : !value ? "value" : "valueLen");
    return ncclInvalidArgument;
  }
  int id = param_find(key);
  if (id < 0) {
    *value = NULL;
    *valueLen = 0;
    WARN("ncclParamGetParameter: \"%.128s\" is not a parameter of Chorus (chorus-info lists them)", key);
    return ncclInvalidArgument;
  }
  static _Thread_local char buf[32];
  const char* v = text_value((enum param_id)id, type_of((enum param_id)id), buf, sizeof(buf));
  *value = v;
  *valueLen = (int)strlen(v);
  return ncclSuccess;
}

CH_API(ncclResult_t, ncclParamGetAllParameterKeys, const char*** table, int* tableLen) {
  if (!table || !tableLen) {
    WARN("ncclParamGetAllParameterKeys: %s is NULL", !table ? "table" : "tableLen");
    return ncclInvalidArgument;
  }
  static _Thread_local const char* keys[PARAM_COUNT];
  int all = param_int(PARAM_PARAM_DUMP_ALL) != 0, n = 0;
  for (int i = 0; i < PARAM_COUNT; i++) {
    struct param_info pi;
    param_describe((enum param_id)i, &pi);
    if (all || pi.published) keys[n++] = pi.env; /* string literals of the table */
  }
  *table = keys;
  *tableLen = n;
  return ncclSuccess;
}

CH_API(void, ncclParamDumpAll, void) {
  int all = param_int(PARAM_PARAM_DUMP_ALL) != 0;
  printf("Chorus parameters (%s; NCCL_PARAM_DUMP_ALL=%s)\n", all ? "all" : "documented ones", all ? "TRUE" : "FALSE");
  for (int i = 0; i < PARAM_COUNT; i++) {
    struct param_info pi;
    param_describe((enum param_id)i, &pi);
    if (!all && !pi.published) continue;
    enum ptype t = type_of((enum param_id)i);
    char buf[32], def[32];
    const char* v = text_value((enum param_id)i, t, buf, sizeof(buf));
    if (pi.kind == P_STR) snprintf(def, sizeof(def), "%s", pi.default_str);
    else if (pi.kind == P_BOOL) snprintf(def, sizeof(def), "%s", pi.default_int ? "TRUE" : "FALSE");
    else snprintf(def, sizeof(def), "%" PRId64, pi.default_int);
    printf("%s (%s)%s: %s\n    value %s, from %s, default %s\n", pi.env, type_names[t],
           pi.published ? "" : " [testing aid]", pi.help, v[0] ? v : "(unset)", pi.source, def[0] ? def : "(unset)");
  }
  fflush(stdout);
}
