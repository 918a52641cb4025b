/* Internals of the CPU reduce engine: the kernel table that dispatch picks
 * once per process, and the hooks tests use to compare the kernel sets.
 * Not for use outside src/reduce/ and tests/test_reduce.c. */
#ifndef BRAID_REDUCE_IMPL_H
#define BRAID_REDUCE_IMPL_H

#include <stddef.h>

#include "braid.h"

/* dst[i] = a[i] op b[i] */
typedef void (*braid__combine_func_t)(void *dst, const void *a, const void *b, size_t count);
/* dst[i] = (a[i] + b[i]) / nranks: the last combine of an AVG */
typedef void (*braid__avg_final_func_t)(void *dst, const void *a, const void *b, size_t count,
                                        int nranks);
/* buf[i] /= nranks */
typedef void (*braid__scale_func_t)(void *buf, size_t count, int nranks);
/* dst[i] = src[i] * *scalar (MULSUM's first step) */
typedef void (*braid__premul_func_t)(void *dst, const void *src, size_t count, const void *scalar);
/* dst[i] = (dst type)src[i] */
typedef void (*braid__cast_func_t)(void *dst, const void *src, size_t count);

typedef struct braid__reduce_kernels {
    const char *isa;
    braid__combine_func_t combine[BRAID_DTYPE_COUNT][BRAID_OP_COUNT];
    braid__avg_final_func_t avg_final[BRAID_DTYPE_COUNT];
    braid__scale_func_t scale[BRAID_DTYPE_COUNT];
    braid__premul_func_t premul[BRAID_DTYPE_COUNT];
    /* [dst][src]; NULL where the pair is not a supported conversion */
    braid__cast_func_t cast[BRAID_DTYPE_COUNT][BRAID_DTYPE_COUNT];
} braid__reduce_kernels;

/* The portable kernels: plain loops over elementwise.h. Complete table. */
extern const braid__reduce_kernels braid__reduce_kernels_scalar;

/* Overwrite the entries of k that have an AVX2/F16C kernel and set k->isa.
 * Only call when the CPU has both (reduce_cpu.c checks). Returns 0 when
 * this build has no x86 vector kernels (k untouched). */
int braid__reduce_avx2_fill(braid__reduce_kernels *k);

/* Tests: force the scalar table (on != 0) or go back to the best one the
 * CPU supports (on == 0). Not thread-safe against concurrent reduces. */
void braid__reduce_force_scalar(int on);

/* Tests and benchmarks: 1 when the CPU and this build have AVX2+F16C kernels. */
int braid__reduce_has_avx2(void);

#endif
