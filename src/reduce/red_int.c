/* Integer kernels. Sums, products and premul products use unsigned arithmetic, which wraps
 * (two's complement gives the same bits for the signed types, without signed-overflow UB), so the
 * signed and unsigned types share them; only max/min and division differ. */
#include "nccl.h"
#include "reduce_impl.h"

/* Multiply in at least `unsigned int` so that uint8_t operands do not promote to signed int. */
typedef unsigned int u8_mul_t;
typedef uint32_t u32_mul_t;
typedef uint64_t u64_mul_t;

/* Division by the (positive) divisor, truncating toward zero like C. The magnitude is divided in
 * unsigned arithmetic so that INT_MIN and divisors above INT_MAX need no special cases. */
#define RED_SDIV(T, U, a, dv) ((a) < 0 ? (T)(0 - (U)((0 - (U)(a)) / (dv))) : (T)((U)(a) / (dv)))

#define RED_INT_WRAP_OPS(U, W, V, ATTR)                                                           \
  RED_BIN_DEFINE(sum_##W##V, U, U, i, a + b, ATTR)                                                \
  RED_BIN_DEFINE(prod_##W##V, U, U, i, (U)((W##_mul_t)a * (W##_mul_t)b), ATTR)                    \
  RED_BIN_DEFINE(premul_##W##V, U, U, i, a + (U)((W##_mul_t)b * (W##_mul_t)s), ATTR)              \
  RED_UN_DEFINE(scale_##W##V, U, U, i, (W##_mul_t)a * (W##_mul_t)s, ATTR)

#define RED_INT_ORDER_OPS(T, W, V, ATTR)                                                          \
  RED_BIN_DEFINE(max_##W##V, T, T, i, a > b ? a : b, ATTR)                                        \
  RED_BIN_DEFINE(min_##W##V, T, T, i, a < b ? a : b, ATTR)

#define RED_INT_OPS(V, ATTR)                                                                      \
  RED_INT_WRAP_OPS(uint8_t, u8, V, ATTR)                                                          \
  RED_INT_WRAP_OPS(uint32_t, u32, V, ATTR)                                                        \
  RED_INT_WRAP_OPS(uint64_t, u64, V, ATTR)                                                        \
  RED_INT_ORDER_OPS(int8_t, i8, V, ATTR)                                                          \
  RED_INT_ORDER_OPS(uint8_t, u8, V, ATTR)                                                         \
  RED_INT_ORDER_OPS(int32_t, i32, V, ATTR)                                                        \
  RED_INT_ORDER_OPS(uint32_t, u32, V, ATTR)                                                       \
  RED_INT_ORDER_OPS(int64_t, i64, V, ATTR)                                                        \
  RED_INT_ORDER_OPS(uint64_t, u64, V, ATTR)

/* Division is not vectorised by anything (no SIMD integer divide); one variant is enough. */
RED_UN_DEFINE(div_i8, int8_t, uint64_t, i, RED_SDIV(int8_t, uint64_t, a, s), )
RED_UN_DEFINE(div_u8, uint8_t, uint64_t, i, a / s, )
RED_UN_DEFINE(div_i32, int32_t, uint64_t, i, RED_SDIV(int32_t, uint64_t, a, s), )
RED_UN_DEFINE(div_u32, uint32_t, uint64_t, i, a / s, )
RED_UN_DEFINE(div_i64, int64_t, uint64_t, i, RED_SDIV(int64_t, uint64_t, a, s), )
RED_UN_DEFINE(div_u64, uint64_t, uint64_t, i, a / s, )

RED_INT_OPS(_base, )
#if RED_NVARIANTS > 1
RED_INT_OPS(_avx2, RED_TARGET_AVX2)
#endif

#define RED_INT_TABLE(V)                                                                          \
  {                                                                                               \
    [ncclInt8] = {sum_u8##V, prod_u8##V, max_i8##V, min_i8##V, premul_u8##V},                     \
    [ncclUint8] = {sum_u8##V, prod_u8##V, max_u8##V, min_u8##V, premul_u8##V},                    \
    [ncclInt32] = {sum_u32##V, prod_u32##V, max_i32##V, min_i32##V, premul_u32##V},               \
    [ncclUint32] = {sum_u32##V, prod_u32##V, max_u32##V, min_u32##V, premul_u32##V},              \
    [ncclInt64] = {sum_u64##V, prod_u64##V, max_i64##V, min_i64##V, premul_u64##V},               \
    [ncclUint64] = {sum_u64##V, prod_u64##V, max_u64##V, min_u64##V, premul_u64##V},              \
  }
#define RED_INT_SCALE(V) {scale_u8##V, scale_u8##V, scale_u32##V, scale_u32##V, scale_u64##V, scale_u64##V}

static const red_bin_fn int_bin[RED_NVARIANTS][6][RED_NOPS] = {
    RED_INT_TABLE(_base),
#if RED_NVARIANTS > 1
    RED_INT_TABLE(_avx2),
#endif
};
static const red_un_fn int_scale[RED_NVARIANTS][6] = {
    RED_INT_SCALE(_base),
#if RED_NVARIANTS > 1
    RED_INT_SCALE(_avx2),
#endif
};
static const red_un_fn int_div[6] = {div_i8, div_u8, div_i32, div_u32, div_i64, div_u64};

red_bin_fn red_int_bin(int type, int op) {
  return type >= 0 && type < 6 && op >= 0 && op < RED_NOPS ? int_bin[red_simd_level()][type][op] : NULL;
}
red_un_fn red_int_scale(int type) { return type >= 0 && type < 6 ? int_scale[red_simd_level()][type] : NULL; }
red_un_fn red_int_div(int type) { return type >= 0 && type < 6 ? int_div[type] : NULL; }
