/* float and double kernels; the fp32 ones also serve the 16- and 8-bit float types on the portable
 * path (red_lowp.c). PREMULSUM computes a + b*s as a separate multiply and add: neither x86-64
 * variant is compiled with FMA, so results do not depend on the CPU the library runs on. (Where FMA
 * is baseline, e.g. AArch64, GCC's default -ffp-contract=fast in gnu11 mode may fuse them.) */
#include "nccl.h"
#include "reduce_impl.h"

#define RED_FLOAT_OPS(V, ATTR)                                                                    \
  RED_BIN_DEFINE(sum_f32##V, float, float, f, a + b, ATTR)                                        \
  RED_BIN_DEFINE(prod_f32##V, float, float, f, a * b, ATTR)                                       \
  RED_BIN_DEFINE(max_f32##V, float, float, f, RED_FMAX(a, b), ATTR)                               \
  RED_BIN_DEFINE(min_f32##V, float, float, f, RED_FMIN(a, b), ATTR)                               \
  RED_BIN_DEFINE(premul_f32##V, float, float, f, a + b * s, ATTR)                                 \
  RED_UN_DEFINE(scale_f32##V, float, float, f, a * s, ATTR)                                       \
  RED_UN_DEFINE(div_f32##V, float, float, f, a / s, ATTR)                                         \
  RED_BIN_DEFINE(sum_f64##V, double, double, d, a + b, ATTR)                                      \
  RED_BIN_DEFINE(prod_f64##V, double, double, d, a * b, ATTR)                                     \
  RED_BIN_DEFINE(max_f64##V, double, double, d, RED_FMAX(a, b), ATTR)                             \
  RED_BIN_DEFINE(min_f64##V, double, double, d, RED_FMIN(a, b), ATTR)                             \
  RED_BIN_DEFINE(premul_f64##V, double, double, d, a + b * s, ATTR)                               \
  RED_UN_DEFINE(scale_f64##V, double, double, d, a * s, ATTR)                                     \
  RED_UN_DEFINE(div_f64##V, double, double, d, a / s, ATTR)

#define RED_FLOAT_TABLES(V)                                                                       \
  {{{sum_f32##V, prod_f32##V, max_f32##V, min_f32##V, premul_f32##V}, scale_f32##V, div_f32##V},  \
   {{sum_f64##V, prod_f64##V, max_f64##V, min_f64##V, premul_f64##V}, scale_f64##V, div_f64##V}}

RED_FLOAT_OPS(_base, )
#if RED_NVARIANTS > 1
RED_FLOAT_OPS(_avx2, RED_TARGET_AVX2)
#endif

/* [variant][0: fp32, 1: fp64]: the five binary operators, then scale and div. */
static const struct {
  red_bin_fn bin[RED_NOPS];
  red_un_fn scale, div;
} float_fns[RED_NVARIANTS][2] = {
    RED_FLOAT_TABLES(_base),
#if RED_NVARIANTS > 1
    RED_FLOAT_TABLES(_avx2),
#endif
};

/* type: ncclFloat64 gets the double kernels, anything else the fp32 ones (the low-precision path). */
static int idx(int type) { return type == ncclFloat64; }

red_bin_fn red_float_bin(int type, int op) {
  if (op < 0 || op >= RED_NOPS) return NULL;
  return float_fns[red_simd_level()][idx(type)].bin[op];
}
red_un_fn red_float_scale(int type) { return float_fns[red_simd_level()][idx(type)].scale; }
red_un_fn red_float_div(int type) { return float_fns[red_simd_level()][idx(type)].div; }
