/* Every name of Chorus's enums, written once: one X-macro list per enum, and small lookups over them.
 * Header-only and free of internal types, so that tools linking only the public library (tools/perf,
 * tools/calibrate.c) spell things as the library does. The internal enums are generated from these
 * lists where they are declared (FUNC_* and enum ch_algo in algo/algo.h, PROTO_* in
 * transport/transport.h), which pin each value with a static assert: values index tables and match
 * NCCL's, so a reordered row must fail the build, not renumber.
 *
 * Lookups by value return NULL outside the list (callers choose what to print instead); lookups by
 * name return the value, or -1 for a name not in the list. */
#ifndef CH_NAMES_H
#define CH_NAMES_H

#include <stddef.h>
#include <string.h>

#include "nccl.h"

/* Datatypes: X(ncclDataType_t, name in messages, nccl-tests name, bytes, is_float). */
#define CH_TYPE_LIST(X)                          \
  X(ncclInt8, "int8", "int8", 1, 0)              \
  X(ncclUint8, "uint8", "uint8", 1, 0)           \
  X(ncclInt32, "int32", "int32", 4, 0)           \
  X(ncclUint32, "uint32", "uint32", 4, 0)        \
  X(ncclInt64, "int64", "int64", 8, 0)           \
  X(ncclUint64, "uint64", "uint64", 8, 0)        \
  X(ncclFloat16, "float16", "half", 2, 1)        \
  X(ncclFloat32, "float32", "float", 4, 1)       \
  X(ncclFloat64, "float64", "double", 8, 1)      \
  X(ncclBfloat16, "bfloat16", "bfloat16", 2, 1)  \
  X(ncclFloat8e4m3, "fp8e4m3", "f8e4m3", 1, 1)   \
  X(ncclFloat8e5m2, "fp8e5m2", "f8e5m2", 1, 1)

/* Reduction ops: X(ncclRedOp_t, name in messages, nccl-tests name). The last row stands for every op
 * ncclRedOpCreatePreMulSum makes (ncclNumOps and up): one name for all of them, as nccl-tests and
 * the call descriptions (algo_call_text) count them. */
#define CH_OP_LIST(X)                  \
  X(ncclSum, "sum", "sum")             \
  X(ncclProd, "prod", "prod")          \
  X(ncclMax, "max", "max")             \
  X(ncclMin, "min", "min")             \
  X(ncclAvg, "avg", "avg")             \
  X(ncclNumOps, "premulsum", "mulsum")

/* Functions, in NCCL's ncclFunc_t numbering (Broadcast..Recv), then Chorus's own calls (AllToAllv:
 * RCCL's and NCCLX's call, which Chorus runs as sends and receives, api/alltoallv.c):
 * X(FUNC_ suffix, name in logs and NCCL_ALGO/NCCL_PROTO entries, name in call descriptions). The
 * API function is "nccl" followed by the name. The first five are the collectives whose
 * NCCL_ALGO/NCCL_PROTO entries may name them (TUNE_P2P). */
#define CH_FUNC_LIST(X)                                \
  X(BROADCAST, "Broadcast", "Broadcast")               \
  X(REDUCE, "Reduce", "Reduce")                        \
  X(ALLGATHER, "AllGather", "AllGather")               \
  X(REDUCESCATTER, "ReduceScatter", "ReduceScatter")   \
  X(ALLREDUCE, "AllReduce", "AllReduce")               \
  X(SENDRECV, "SendRecv", "Send/Recv")                 \
  X(SEND, "Send", "Send")                              \
  X(RECV, "Recv", "Recv")                              \
  X(ALLTOALL, "AlltoAll", "AlltoAll")                  \
  X(SCATTER, "Scatter", "Scatter")                     \
  X(GATHER, "Gather", "Gather")                        \
  X(ALLTOALLV, "AllToAllv", "AllToAllv")

/* Algorithms Chorus runs, in enum ch_algo order: X(ALGO_ suffix, name, NCCL's number or -1). Tree and
 * Ring keep NCCL's numbers; Exchange (two ranks), Direct (one host, peers' buffers read in place),
 * RecDbl (recursive doubling) and Rabenseifner are Chorus's. */
#define CH_ALGO_LIST(X)            \
  X(TREE, "Tree", 0)               \
  X(RING, "Ring", 1)               \
  X(EXCHANGE, "Exchange", -1)      \
  X(DIRECT, "Direct", -1)          \
  X(RECDBL, "RecDbl", -1)          \
  X(RABEN, "Rabenseifner", -1)     \
  X(OWNER, "Owner", -1)
/* NCCL's algorithms Chorus does not run: NCCL_ALGO accepts them, nothing chooses them. In algorithm
 * masks they take the bits after Chorus's own (CH_NALGO + row). */
#define CH_ALGO_NCCL_ONLY_LIST(X)        \
  X(COLLNET_DIRECT, "CollNetDirect", 2)  \
  X(COLLNET_CHAIN, "CollNetChain", 3)    \
  X(NVLS, "NVLS", 4)                     \
  X(NVLS_TREE, "NVLSTree", 5)            \
  X(PAT, "PAT", 6)

/* Protocols, in NCCL's numbering: X(PROTO_ suffix, name). */
#define CH_PROTO_LIST(X) \
  X(LL, "LL")            \
  X(LL128, "LL128")      \
  X(SIMPLE, "Simple")

/* Row counts, and columns picked out of a row (one macro per width: no empty variadic arguments). */
#define CH_NAMES_COUNT_(...) +1
#define CH_NAMES_2OF2_(a, b) b,
#define CH_NAMES_2OF3_(a, b, c) b,
#define CH_NAMES_3OF3_(a, b, c) c,
#define CH_NAMES_AT_2OF3_(v, b, c) [v] = b,
#define CH_NAMES_AT_3OF3_(v, b, c) [v] = c,
#define CH_NAMES_AT_2OF5_(v, b, c, d, e) [v] = b,
#define CH_NAMES_AT_3OF5_(v, b, c, d, e) [v] = c,
#define CH_NAMES_AT_4OF5_(v, b, c, d, e) [v] = d,
#define CH_NAMES_AT_5OF5_(v, b, c, d, e) [v] = e,
enum {
  CH_NTYPES = 0 CH_TYPE_LIST(CH_NAMES_COUNT_),
  CH_NOPS = 0 CH_OP_LIST(CH_NAMES_COUNT_), /* built-in ops, then PreMulSum */
  CH_NFUNCS = 0 CH_FUNC_LIST(CH_NAMES_COUNT_),
  CH_NALGO = 0 CH_ALGO_LIST(CH_NAMES_COUNT_),
  CH_NALGO_NCCL_ONLY = 0 CH_ALGO_NCCL_ONLY_LIST(CH_NAMES_COUNT_),
  CH_NALGO_BITS = CH_NALGO + CH_NALGO_NCCL_ONLY,
  CH_NPROTOS = 0 CH_PROTO_LIST(CH_NAMES_COUNT_)
};

/* s[0, len) is name, ASCII letters compared without case when fold. */
static inline int ch_name_is(const char* s, size_t len, const char* name, int fold) {
  size_t i = 0;
  for (; i < len && name[i]; i++) {
    char a = s[i], b = name[i];
    if (fold && a >= 'A' && a <= 'Z') a = (char)(a - 'A' + 'a');
    if (fold && b >= 'A' && b <= 'Z') b = (char)(b - 'A' + 'a');
    if (a != b) return 0;
  }
  return i == len && !name[i];
}
/* Index of s[0, len) among names[0, n), or -1. */
static inline int ch_name_find(const char* const* names, int n, const char* s, size_t len, int fold) {
  for (int i = 0; i < n; i++)
    if (names[i] && ch_name_is(s, len, names[i], fold)) return i;
  return -1;
}
static inline const char* ch_name_at(const char* const* names, int n, int i) {
  return i >= 0 && i < n ? names[i] : NULL;
}

/* ---- datatypes ---- */
static inline const char* const* ch_type_names(void) {
  static const char* const n[ncclNumTypes] = {CH_TYPE_LIST(CH_NAMES_AT_2OF5_)};
  return n;
}
static inline const char* const* ch_type_test_names(void) {
  static const char* const n[ncclNumTypes] = {CH_TYPE_LIST(CH_NAMES_AT_3OF5_)};
  return n;
}
/* "float32": call descriptions and stall reports. */
static inline const char* ch_type_name(int t) { return ch_name_at(ch_type_names(), ncclNumTypes, t); }
/* "float": nccl-tests' spelling (its -d values and columns, Chorus's logs). */
static inline const char* ch_type_test_name(int t) { return ch_name_at(ch_type_test_names(), ncclNumTypes, t); }
/* The type an nccl-tests name spells, exactly (as nccl-tests' -d compares), or -1. */
static inline int ch_type_test_parse(const char* s) {
  return ch_name_find(ch_type_test_names(), ncclNumTypes, s, strlen(s), 0);
}
static inline int ch_type_bytes(int t) {
  static const unsigned char n[ncclNumTypes] = {CH_TYPE_LIST(CH_NAMES_AT_4OF5_)};
  return t >= 0 && t < ncclNumTypes ? n[t] : 0;
}
static inline int ch_type_is_float(int t) {
  static const unsigned char n[ncclNumTypes] = {CH_TYPE_LIST(CH_NAMES_AT_5OF5_)};
  return t >= 0 && t < ncclNumTypes && n[t];
}

/* ---- reduction ops (index ncclNumOps: every PreMulSum op) ---- */
static inline const char* const* ch_op_names(void) {
  static const char* const n[CH_NOPS] = {CH_OP_LIST(CH_NAMES_AT_2OF3_)};
  return n;
}
static inline const char* const* ch_op_test_names(void) {
  static const char* const n[CH_NOPS] = {CH_OP_LIST(CH_NAMES_AT_3OF3_)};
  return n;
}
/* "sum", ..., "premulsum" for any op from ncclNumOps on; NULL for a negative one. */
static inline const char* ch_op_name(int op) {
  return op < 0 ? NULL : ch_op_names()[op < ncclNumOps ? op : ncclNumOps];
}
/* nccl-tests' spelling of op index i (0..ncclNumOps; ncclNumOps: "mulsum"). */
static inline const char* ch_op_test_name(int i) { return ch_name_at(ch_op_test_names(), CH_NOPS, i); }
static inline int ch_op_test_parse(const char* s) {
  return ch_name_find(ch_op_test_names(), CH_NOPS, s, strlen(s), 0);
}

/* ---- functions ---- */
static inline const char* const* ch_func_names(void) {
  static const char* const n[CH_NFUNCS] = {CH_FUNC_LIST(CH_NAMES_2OF3_)};
  return n;
}
/* "AllReduce": logs, NCCL_ALGO/NCCL_PROTO entries. */
static inline const char* ch_func_name(int f) { return ch_name_at(ch_func_names(), CH_NFUNCS, f); }
/* "ncclAllReduce": the API function. */
static inline const char* ch_func_api_name(int f) {
#define CH_NAMES_API_(id, name, text) "nccl" name,
  static const char* const n[CH_NFUNCS] = {CH_FUNC_LIST(CH_NAMES_API_)};
#undef CH_NAMES_API_
  return ch_name_at(n, CH_NFUNCS, f);
}
/* "Send/Recv": call descriptions ("Send/Recv(8 x float32)"). */
static inline const char* ch_func_text(int f) {
  static const char* const n[CH_NFUNCS] = {CH_FUNC_LIST(CH_NAMES_3OF3_)};
  return ch_name_at(n, CH_NFUNCS, f);
}
/* The function s[0, len) names, case-insensitive, or -1. */
static inline int ch_func_parse(const char* s, size_t len) {
  return ch_name_find(ch_func_names(), CH_NFUNCS, s, len, 1);
}

/* ---- algorithms: mask bits 0..CH_NALGO-1 are Chorus's, then NCCL's others ---- */
static inline const char* const* ch_algo_names(void) {
  static const char* const n[CH_NALGO_BITS] = {CH_ALGO_LIST(CH_NAMES_2OF3_) CH_ALGO_NCCL_ONLY_LIST(CH_NAMES_2OF3_)};
  return n;
}
/* "Tree", ..., "PAT": as NCCL_ALGO and the TUNING log spell them. */
static inline const char* ch_algo_name(int bit) { return ch_name_at(ch_algo_names(), CH_NALGO_BITS, bit); }
/* NCCL's number of the algorithm of that bit (its NCCL_ALGO_*), or -1 when NCCL has no such algorithm. */
static inline int ch_algo_nccl_id(int bit) {
  static const signed char n[CH_NALGO_BITS] = {CH_ALGO_LIST(CH_NAMES_3OF3_) CH_ALGO_NCCL_ONLY_LIST(CH_NAMES_3OF3_)};
  return bit >= 0 && bit < CH_NALGO_BITS ? n[bit] : -1;
}
/* The bit of the algorithm s[0, len) names, case-insensitive, or -1. */
static inline int ch_algo_parse(const char* s, size_t len) {
  return ch_name_find(ch_algo_names(), CH_NALGO_BITS, s, len, 1);
}

/* ---- protocols ---- */
static inline const char* const* ch_proto_names(void) {
  static const char* const n[CH_NPROTOS] = {CH_PROTO_LIST(CH_NAMES_2OF2_)};
  return n;
}
static inline const char* ch_proto_name(int p) { return ch_name_at(ch_proto_names(), CH_NPROTOS, p); }
static inline int ch_proto_parse(const char* s, size_t len) {
  return ch_name_find(ch_proto_names(), CH_NPROTOS, s, len, 1);
}

#endif
