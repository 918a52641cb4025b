/* CPU reduce engine. Elementwise semantics come from elementwise.h, which
 * the CUDA kernels share, so both paths give the same bits.
 *
 * Semantics (pinned by tests/test_reduce.c):
 *  - integers wrap (two's complement) on sum and prod; AVG divides the sum
 *    by the group size, truncating toward zero;
 *  - f16/bf16 are converted to f32, combined, and rounded back to nearest
 *    even once per operation;
 *  - min/max propagate NaN (either input NaN gives NaN), like torch.minimum;
 *  - MULSUM combines as SUM; braid__reduce_premul is its first step;
 *  - AVG is SUM in braid__reduce; braid__reduce_final divides by nranks in
 *    the same pass (f16/bf16: one rounding of the f32 quotient).
 */
#ifndef BRAID_REDUCE_H
#define BRAID_REDUCE_H

#include <stddef.h>

#include "braid.h"

/* dst[i] = a[i] op b[i]; dst may alias a or b (exactly, not partially).
 * count 0 touches no pointer. No alignment needed beyond the element's. */
void braid__reduce(braid_dtype dtype, braid_op op, void *dst, const void *a, const void *b, size_t count);

/* The last combine of a reduction: like braid__reduce, and for AVG the
 * result is divided by nranks in the same pass. */
void braid__reduce_final(braid_dtype dtype, braid_op op, void *dst, const void *a, const void *b,
                         size_t count, int nranks);

/* buf[i] /= nranks for AVG (used when a rank has nothing to combine,
 * e.g. a group of one); no-op for other ops. */
void braid__reduce_scale(braid_dtype dtype, braid_op op, void *buf, size_t count, int nranks);

/* dst[i] = src[i] * *scalar (one element of dtype, any alignment): the
 * per-rank multiply of MULSUM. dst may equal src; no other overlap. */
void braid__reduce_premul(braid_dtype dtype, void *dst, const void *src, size_t count, const void *scalar);

/* Convert count elements between float types, rounding to nearest even
 * once; used by gradient compression. Supported pairs: f32 <-> f16, bf16,
 * f64; f16 <-> bf16; any type to itself (a copy; dst may equal src).
 * f64 -> f16/bf16 is not (it would round twice): check with
 * braid__cast_supported(). Other than dst == src, no overlap. */
void braid__cast(braid_dtype dst_type, void *dst, braid_dtype src_type, const void *src, size_t count);

/* 1 when braid__cast handles (dst_type, src_type). */
int braid__cast_supported(braid_dtype dst_type, braid_dtype src_type);

/* Which kernel set is in use ("avx2+f16c" or "scalar"), for logs. */
const char *braid__reduce_isa(void);

#endif
