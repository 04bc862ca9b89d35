/* The device kernels (kernels.cu) as nvcc built them: a fatbin embedded in the library when the build
 * found nvcc (CHORUS_FATBIN_PATH), loaded into a context at run time by cudev.c. Without it the blob
 * is empty and device buffers go through host memory (staging/staging.c). */
#include <stddef.h>

#ifndef CHORUS_FATBIN_ARCHS
#define CHORUS_FATBIN_ARCHS "built elsewhere"
#endif

#ifdef CHORUS_FATBIN_PATH
/* .incbin keeps the build free of a bin2c step; the symbols stay inside the library. */
__asm__(".section .rodata\n"
        ".balign 64\n"
        ".globl chorus_fatbin\n.hidden chorus_fatbin\n"
        "chorus_fatbin:\n"
        ".incbin \"" CHORUS_FATBIN_PATH "\"\n"
        ".globl chorus_fatbin_end\n.hidden chorus_fatbin_end\n"
        "chorus_fatbin_end:\n"
        ".byte 0\n"
        ".previous\n");
extern const unsigned char chorus_fatbin[], chorus_fatbin_end[];
const void* cudev_fatbin(size_t* bytes) {
  *bytes = (size_t)(chorus_fatbin_end - chorus_fatbin);
  return chorus_fatbin;
}
const char* cudev_fatbin_archs(void) { return CHORUS_FATBIN_ARCHS; }
#else
const void* cudev_fatbin(size_t* bytes) {
  *bytes = 0;
  return NULL;
}
const char* cudev_fatbin_archs(void) { return "none: the build found no nvcc"; }
#endif
