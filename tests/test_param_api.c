/* NCCL 2.30's parameter API (api/param.c) over the parameter table: every getter, with its key types
 * (NCCL's where NCCL registers the key: NCCL_DEBUG an enum, NCCL_DEBUG_SUBSYS a 64-bit mask; int64_t,
 * C strings and bools otherwise), type mismatches and unknown keys refused, values following the
 * environment, NCCL_PARAM_DUMP_ALL widening the listing, and many threads reading at once. */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <stdio.h>

#include "misc/param.h"
#include "runner.h"

static ncclParamHandle_t bind(const char* key) {
  ncclParamHandle_t h = NULL;
  if (ncclParamBind(&h, key) != ncclSuccess) rt_fail(__FILE__, __LINE__, "ncclParamBind(%s) failed", key);
  return h;
}

TEST(param_api, bind_and_unknown_keys) {
  ncclParamHandle_t h = NULL, h2 = NULL;
  NCCL_OK(ncclParamBind(&h, "CHORUS_TIMEOUT"));
  NCCL_OK(ncclParamBind(&h2, "CHORUS_TIMEOUT"));
  EXPECT(h != NULL && h == h2); /* the library's, one per key */
  EXPECT_EQ(ncclParamBind(&h, "NCCL_IB_HCA_NO_SUCH"), ncclInvalidArgument);
  EXPECT(strstr(ncclGetLastError(NULL), "NCCL_IB_HCA_NO_SUCH") != NULL);
  EXPECT_EQ(ncclParamBind(NULL, "CHORUS_TIMEOUT"), ncclInvalidArgument);
  EXPECT_EQ(ncclParamBind(&h, NULL), ncclInvalidArgument);
  /* A handle the library did not make is refused, not followed. */
  int64_t v;
  int junk;
  EXPECT_EQ(ncclParamGetI64((ncclParamHandle_t)(void*)&junk, &v), ncclInvalidArgument);
  EXPECT_EQ(ncclParamGetI64(NULL, &v), ncclInvalidArgument);
  EXPECT_EQ(ncclParamGetI64(bind("CHORUS_TIMEOUT"), NULL), ncclInvalidArgument);
}

TEST(param_api, integer_getters) {
  setenv("CHORUS_TIMEOUT", "77", 1);
  setenv("NCCL_DEBUG_SUBSYS", "INIT,NET", 1);
  param_reset();
  ncclParamHandle_t t = bind("CHORUS_TIMEOUT"), s = bind("NCCL_DEBUG_SUBSYS");
  int64_t i64 = 0;
  NCCL_OK(ncclParamGetI64(t, &i64));
  EXPECT_EQ(i64, 77);
  uint64_t u64 = 0;
  NCCL_OK(ncclParamGetU64(s, &u64));
  EXPECT_EQ(u64, 0x1 | 0x10); /* NCCL's INIT and NET bits */
  /* Every other width is a different type: refused, as NCCL refuses it, naming the key's type. */
  int8_t i8;
  int16_t i16;
  int32_t i32;
  uint8_t u8;
  uint16_t u16;
  uint32_t u32;
  EXPECT_EQ(ncclParamGetI8(t, &i8), ncclInvalidArgument);
  EXPECT_EQ(ncclParamGetI16(t, &i16), ncclInvalidArgument);
  EXPECT_EQ(ncclParamGetI32(t, &i32), ncclInvalidArgument);
  EXPECT(strstr(ncclGetLastError(NULL), "int64_t") != NULL);
  EXPECT_EQ(ncclParamGetU8(t, &u8), ncclInvalidArgument);
  EXPECT_EQ(ncclParamGetU16(t, &u16), ncclInvalidArgument);
  EXPECT_EQ(ncclParamGetU32(s, &u32), ncclInvalidArgument);
  EXPECT_EQ(ncclParamGetU64(t, &u64), ncclInvalidArgument);
  EXPECT_EQ(ncclParamGetI64(s, &i64), ncclInvalidArgument);
  /* NULL outputs */
  EXPECT_EQ(ncclParamGetI8(t, NULL), ncclInvalidArgument);
  EXPECT_EQ(ncclParamGetI16(t, NULL), ncclInvalidArgument);
  EXPECT_EQ(ncclParamGetI32(t, NULL), ncclInvalidArgument);
  EXPECT_EQ(ncclParamGetU8(t, NULL), ncclInvalidArgument);
  EXPECT_EQ(ncclParamGetU16(t, NULL), ncclInvalidArgument);
  EXPECT_EQ(ncclParamGetU32(t, NULL), ncclInvalidArgument);
  EXPECT_EQ(ncclParamGetU64(s, NULL), ncclInvalidArgument);
  /* Unset: the default */
  unsetenv("CHORUS_TIMEOUT");
  param_reset();
  NCCL_OK(ncclParamGetI64(t, &i64));
  EXPECT_EQ(i64, 1800);
}

TEST(param_api, strings_and_raw) {
  setenv("NCCL_ALGO", "Ring", 1);
  setenv("NCCL_DEBUG", "WARN", 1);
  setenv("NCCL_PARAM_DUMP_ALL", "true", 1);
  param_reset();
  ncclParamHandle_t a = bind("NCCL_ALGO"), d = bind("NCCL_DEBUG"), all = bind("NCCL_PARAM_DUMP_ALL"),
                    t = bind("CHORUS_TIMEOUT");
  const char* str = NULL;
  NCCL_OK(ncclParamGetStr(a, &str));
  EXPECT(str && !strcmp(str, "Ring"));
  EXPECT_EQ(ncclParamGetStr(t, &str), ncclInvalidArgument); /* an integer */
  EXPECT_EQ(ncclParamGetStr(d, &str), ncclInvalidArgument); /* NCCL's enum */
  EXPECT_EQ(ncclParamGetStr(a, NULL), ncclInvalidArgument);
  int64_t i64;
  EXPECT_EQ(ncclParamGetI64(a, &i64), ncclInvalidArgument);

  /* ncclParamGet: any type, as bytes */
  char buf[64];
  int len = -1;
  NCCL_OK(ncclParamGet(a, buf, sizeof(buf), &len));
  EXPECT_EQ(len, 5);
  EXPECT(!strcmp(buf, "Ring"));
  EXPECT_EQ(ncclParamGet(a, buf, 4, &len), ncclInvalidArgument); /* no room for the NUL */
  EXPECT_EQ(len, 0);
  int32_t level = 0;
  NCCL_OK(ncclParamGet(d, &level, sizeof(level), &len));
  EXPECT_EQ(len, 4);
  EXPECT_EQ(level, 2); /* NCCL_LOG_WARN */
  unsigned char b = 9;
  NCCL_OK(ncclParamGet(all, &b, 1, &len));
  EXPECT_EQ(len, 1);
  EXPECT_EQ(b, 1);
  int64_t tv = 0;
  NCCL_OK(ncclParamGet(t, &tv, sizeof(tv), &len));
  EXPECT_EQ(len, 8);
  EXPECT_EQ(tv, 1800);
  EXPECT_EQ(ncclParamGet(t, &tv, 4, &len), ncclInvalidArgument);
  EXPECT_EQ(ncclParamGet(t, NULL, 8, &len), ncclInvalidArgument);
  EXPECT_EQ(ncclParamGet(t, &tv, 8, NULL), ncclInvalidArgument);
  EXPECT_EQ(ncclParamGet(t, &tv, 0, &len), ncclInvalidArgument);
}

TEST(param_api, by_key_and_listing) {
  setenv("NCCL_BUFFSIZE", "1048576", 1);
  setenv("NCCL_PARAM_DUMP_ALL", "F", 1);
  param_reset();
  const char* v = NULL;
  int n = -1;
  NCCL_OK(ncclParamGetParameter("NCCL_BUFFSIZE", &v, &n));
  EXPECT(v && !strcmp(v, "1048576"));
  EXPECT_EQ(n, 7);
  NCCL_OK(ncclParamGetParameter("NCCL_PARAM_DUMP_ALL", &v, &n));
  EXPECT(!strcmp(v, "FALSE"));
  NCCL_OK(ncclParamGetParameter("NCCL_ALGO", &v, &n)); /* unset string: empty */
  EXPECT_EQ(n, 0);
  EXPECT_EQ(ncclParamGetParameter("NO_SUCH", &v, &n), ncclInvalidArgument);
  EXPECT(v == NULL && n == 0);
  EXPECT_EQ(ncclParamGetParameter(NULL, &v, &n), ncclInvalidArgument);
  EXPECT_EQ(ncclParamGetParameter("NCCL_ALGO", NULL, &n), ncclInvalidArgument);
  EXPECT_EQ(ncclParamGetParameter("NCCL_ALGO", &v, NULL), ncclInvalidArgument);

  /* The listing: documented keys only, then with NCCL_PARAM_DUMP_ALL every row. */
  const char** keys = NULL;
  int nkeys = 0;
  NCCL_OK(ncclParamGetAllParameterKeys(&keys, &nkeys));
  int found_debug = 0, found_aid = 0;
  for (int i = 0; i < nkeys; i++) {
    found_debug |= !strcmp(keys[i], "NCCL_DEBUG");
    found_aid |= !strcmp(keys[i], "CHORUS_CLOCK_SKEW_US"); /* a testing aid */
    ncclParamHandle_t h;
    if (ncclParamBind(&h, keys[i]) != ncclSuccess) rt_fail(__FILE__, __LINE__, "listed %s does not bind", keys[i]);
  }
  EXPECT(found_debug && !found_aid);
  EXPECT(nkeys < PARAM_COUNT);
  setenv("NCCL_PARAM_DUMP_ALL", "TRUE", 1);
  param_reset();
  NCCL_OK(ncclParamGetAllParameterKeys(&keys, &nkeys));
  EXPECT_EQ(nkeys, PARAM_COUNT);
  EXPECT_EQ(ncclParamGetAllParameterKeys(NULL, &nkeys), ncclInvalidArgument);
  EXPECT_EQ(ncclParamGetAllParameterKeys(&keys, NULL), ncclInvalidArgument);
  /* NCCL's own bool grammar: a bad value falls back to the default */
  setenv("NCCL_PARAM_DUMP_ALL", "yes", 1);
  param_reset();
  NCCL_OK(ncclParamGetAllParameterKeys(&keys, &nkeys));
  EXPECT(nkeys < PARAM_COUNT);
}

/* The dump goes to stdout: one entry per listed key with its type, value and source. */
TEST(param_api, dump_all) {
  setenv("NCCL_PROTO", "Simple", 1);
  param_reset();
  fflush(stdout);
  char path[] = "/tmp/chorus-param-dump-XXXXXX";
  int fd = mkstemp(path);
  ASSERT(fd >= 0);
  int saved = dup(1);
  dup2(fd, 1);
  ncclParamDumpAll();
  fflush(stdout);
  dup2(saved, 1);
  close(saved);
  char text[1 << 16];
  ssize_t n = pread(fd, text, sizeof(text) - 1, 0);
  close(fd);
  unlink(path);
  ASSERT(n > 0);
  text[n] = '\0';
  EXPECT(strstr(text, "NCCL_PROTO (const char*)") != NULL);
  EXPECT(strstr(text, "value Simple, from environment") != NULL);
  EXPECT(strstr(text, "CHORUS_TIMEOUT (int64_t)") != NULL);
  EXPECT(strstr(text, "NCCL_DEBUG_SUBSYS (uint64_t)") != NULL);
  EXPECT(strstr(text, "CHORUS_CLOCK_SKEW_US") == NULL);
}

static void* reader(void* arg) {
  (void)arg;
  for (int i = 0; i < 2000; i++) {
    ncclParamHandle_t h;
    int64_t v;
    const char* s;
    int n;
    const char** keys;
    if (ncclParamBind(&h, "CHORUS_SPIN_COUNT") != ncclSuccess || ncclParamGetI64(h, &v) != ncclSuccess || v != 5)
      return (void*)1;
    if (ncclParamGetParameter("CHORUS_SPIN_COUNT", &s, &n) != ncclSuccess || strcmp(s, "5") != 0) return (void*)1;
    if (ncclParamGetAllParameterKeys(&keys, &n) != ncclSuccess || n < 10) return (void*)1;
  }
  return NULL;
}

TEST(param_api, threads) {
  setenv("CHORUS_SPIN_COUNT", "5", 1);
  param_reset();
  pthread_t th[4];
  for (int i = 0; i < 4; i++) ASSERT(pthread_create(&th[i], NULL, reader, NULL) == 0);
  for (int i = 0; i < 4; i++) {
    void* r;
    pthread_join(th[i], &r);
    EXPECT(r == NULL);
  }
}
