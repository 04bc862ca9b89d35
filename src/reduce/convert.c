/* Scalar conversions between fp32 and the 16- and 8-bit float formats (bodies in reduce_impl.h so
 * that the kernels inline them).
 *
 * Narrowing conversions round to nearest, ties to even, using integer arithmetic on the fp32 bit
 * pattern (independent of the FPU rounding mode and of FTZ/DAZ), with exact subnormal results.
 * Special values:
 *  - half (IEEE binary16) and bf16: results past the largest finite value (after rounding) are
 *    +-Inf; Inf stays Inf.
 *  - e5m2 (OCP FP8 E5M2, bias 15, has Inf): like half; past 57344 (after rounding) gives Inf.
 *  - e4m3 (OCP FP8 E4M3FN, bias 7, max 448, no Inf, NaN = S.1111.111): saturating, like CUDA's
 *    __NV_SATFINITE conversion NCCL relies on: finite values that round past 448, and +-Inf, give
 *    +-448. The midpoint 464 between 448 and the would-be 480 ties to even (448) anyway.
 *  - NaN input gives a quiet NaN of the same sign; half, bf16 and e5m2 keep the top payload bits
 *    (what F16C's vcvtps2ph does); e4m3 has one NaN per sign.
 * Widening conversions are exact and keep NaN payloads. */
#include "reduce.h"
#include "reduce_impl.h"

float red_half_to_float(uint16_t h) { return red_cv_half_to_float(h); }
uint16_t red_float_to_half(float f) { return red_cv_float_to_half(f); }
float red_bf16_to_float(uint16_t h) { return red_cv_bf16_to_float(h); }
uint16_t red_float_to_bf16(float f) { return red_cv_float_to_bf16(f); }
float red_e4m3_to_float(uint8_t v) { return red_cv_e4m3_to_float(v); }
uint8_t red_float_to_e4m3(float f) { return red_cv_float_to_e4m3(f); }
float red_e5m2_to_float(uint8_t v) { return red_cv_e5m2_to_float(v); }
uint8_t red_float_to_e5m2(float f) { return red_cv_float_to_e5m2(f); }
