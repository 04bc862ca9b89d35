/* Slot formats of the LL and LL128 protocols (Simple slots are raw bytes). */
#ifndef CH_PROTO_H
#define CH_PROTO_H

#include <stddef.h>
#include <stdint.h>

#define LL_LINE_BYTES 16
#define LL_LINE_DATA 8
#define LL128_LINE_BYTES 128
#define LL128_LINE_DATA 120

/* Write `bytes` of data into slot lines stamped with `flag`. */
void proto_pack(int proto, char* slot, const char* data, size_t bytes, uint64_t flag);
/* Copy the data of a ready slot out. */
void proto_unpack(int proto, const char* slot, char* data, size_t bytes);
/* Has the whole slot (bytes of data) been written with `flag`? */
int proto_flag_ready(int proto, const char* slot, size_t bytes, uint64_t flag);

#endif
