/* Comparing kernel results with the CPU engine's, element by element:
 * equal bits, or both NaN where the definition leaves the payload open
 * (f32/f64 arithmetic; min/max must give the canonical NaN). Shared by the
 * kernel tests (test_cuda.c, test_device_coll.c). */
#ifndef BRAID_TEST_DTYPE_COMPARE_H
#define BRAID_TEST_DTYPE_COMPARE_H

#include <math.h>
#include <string.h>

#include "braid.h"

static inline int dtype_is_nan(braid_dtype t, const void *p)
{
    if (t == BRAID_F32) {
        float f;
        memcpy(&f, p, 4);
        return isnan(f);
    }
    if (t == BRAID_F64) {
        double d;
        memcpy(&d, p, 8);
        return isnan(d);
    }
    return 0;
}

/* Index of the first element of n that differs, or -1. */
static inline long dtype_first_difference(braid_dtype t, braid_op op, const void *got, const void *want, size_t n)
{
    size_t es = braid_dtype_size(t);
    int nan_free = (t == BRAID_F32 || t == BRAID_F64) && op != BRAID_MIN && op != BRAID_MAX;
    for (size_t i = 0; i < n; i++) {
        const char *g = (const char *)got + i * es, *w = (const char *)want + i * es;
        if (memcmp(g, w, es) != 0 && !(nan_free && dtype_is_nan(t, g) && dtype_is_nan(t, w)))
            return (long)i;
    }
    return -1;
}

#endif
