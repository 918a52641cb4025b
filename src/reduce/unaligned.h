/* Element access at any alignment for the CPU kernels. Buffers come from
 * users (a float array may start at an odd address inside a byte buffer),
 * and dereferencing a misaligned T * is undefined behaviour even where the
 * CPU does not mind. memcpy of one element compiles to one plain load or
 * store, so the aligned case costs nothing. */
#ifndef BRAID_REDUCE_UNALIGNED_H
#define BRAID_REDUCE_UNALIGNED_H

#include <stddef.h>
#include <string.h>

#include "reduce/elementwise.h"

/* Address of element i of type T in a byte-addressed buffer. */
#define BRAID_UA_AT(p, i, T) ((const unsigned char *)(p) + (size_t)(i) * sizeof(T))
#define BRAID_UA_AT_MUT(p, i, T) ((unsigned char *)(p) + (size_t)(i) * sizeof(T))

#define BRAID_UA_GEN(ENUM, name, T, C)                                                         \
    static inline T braid__ld_##name(const void *p, size_t i)                                  \
    {                                                                                          \
        T v;                                                                                   \
        memcpy(&v, BRAID_UA_AT(p, i, T), sizeof(T));                                           \
        return v;                                                                              \
    }                                                                                          \
    static inline void braid__st_##name(void *p, size_t i, T v)                                \
    {                                                                                          \
        memcpy(BRAID_UA_AT_MUT(p, i, T), &v, sizeof(T));                                       \
    }
BRAID_EW_FOREACH_DTYPE(BRAID_UA_GEN)
#undef BRAID_UA_GEN

#endif
