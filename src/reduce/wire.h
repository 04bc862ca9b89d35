/* Wire formats: how a compressed hop carries float32 or bfloat16 data (issue 48; docs/WIRE.md).
 *
 *   bf16, fp16        2 bytes per value, round to nearest even (fp16 overflows to Inf)
 *   fp8e4m3, fp8e5m2  1 byte per value (e4m3 saturates to +-448, Inf gives 448; e5m2 overflows to Inf)
 *   mx8               OCP MX-style: groups of 32 values share a power-of-two scale (one byte, E8M0),
 *                     each value one e4m3 byte; 33 bytes per 32 values
 *
 * Every encoder rounds to nearest even. decode(encode(decode(w))) == decode(w) for every format: a value
 * that has been through a hop passes any later hop unchanged, which is what lets every rank of an
 * AllReduce end with the same bits (proto/prims.c). Layout: values in order; mx8 in groups of
 * [scale][32 values], the last group shorter. wire_bytes(f, t, n) is also the byte offset of value n
 * whenever n is a multiple of 32. */
#ifndef CH_WIRE_H
#define CH_WIRE_H

#include <stddef.h>
#include <stdint.h>

enum { WIRE_OFF = 0, WIRE_BF16 = 1, WIRE_FP16 = 2, WIRE_E4M3 = 3, WIRE_E5M2 = 4, WIRE_MX8 = 5, WIRE_COUNT };
#define WIRE_FORCE 0x100 /* "bf16!": compress even where the model says the link outruns the conversion */
#define WIRE_FMT(v) ((v) & 0xff)
#define WIRE_GROUP 32 /* mx8 values per scale */

const char* wire_name(int fmt); /* "off", "bf16", ...; "?" */
/* "off" | "bf16" | "fp16" | "fp8e4m3" | "fp8e5m2" | "mx8", any case, an optional trailing "!" (WIRE_FORCE);
 * NULL or "" is off. -1 if it does not parse. */
int wire_parse(const char* s);
/* Whether fmt compresses data of this ncclDataType_t (float32: every format; bfloat16: the 8-bit ones). */
int wire_applies(int fmt, int type);
size_t wire_bytes(int fmt, int type, size_t n);
/* n values of type (float32 or bfloat16) to and from the wire. Any n; buffers must not overlap. */
void wire_encode(int fmt, int type, void* wire, const void* src, size_t n);
void wire_decode(int fmt, int type, void* dst, const void* wire, size_t n);
/* x <- decode(encode(x)) in place: the value a hop would deliver. */
void wire_round(int fmt, int type, void* x, size_t n);
/* Error of one rounding of a finite x within the format's range, in a group whose largest magnitude is
 * amax (mx8; the others: take amax = 0): |round(x) - x| <= rel * |x| + grp * amax + tiny, tiny being
 * half the spacing of the format's subnormals (docs/WIRE.md). */
void wire_error(int fmt, double* rel, double* grp, double* tiny);

#endif
