/* Shared bits of the fuzz targets: a hard invariant check that also holds
 * in builds with NDEBUG, and a quiet library. */
#ifndef BRAID_FUZZ_COMMON_H
#define BRAID_FUZZ_COMMON_H

#include <stdio.h>
#include <stdlib.h>

/* abort() so libFuzzer records the input as a crash. */
#define FUZZ_ASSERT(cond)                                                                                              \
    do {                                                                                                               \
        if (!(cond)) {                                                                                                 \
            fprintf(stderr, "%s:%d: invariant failed: %s\n", __FILE__, __LINE__, #cond);                               \
            abort();                                                                                                   \
        }                                                                                                              \
    } while (0)

/* Decoders report errors through braid__error(), which logs; keep the
 * fuzzer's output readable. */
static inline void fuzz_quiet(void)
{
    setenv("BRAID_DEBUG", "NONE", 1);
}

#endif
