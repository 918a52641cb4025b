/* Portable reduce kernels: one plain loop per (dtype, op), generated from
 * elementwise.h's lists. These define the reference behaviour and are the
 * fallback on CPUs without AVX2/F16C; the vector kernels must match them
 * bit for bit (tests/test_reduce.c compares both). */
#include <stdint.h>
#include <string.h>

#include "reduce/elementwise.h"
#include "reduce/reduce_impl.h"
#include "reduce/unaligned.h"

/* dst may alias a or b exactly: each element is read before it is written,
 * so no restrict qualifiers here. Buffers may have any alignment, so every
 * element goes through unaligned.h's loads and stores. */
#define GEN_COMBINE(ENUM, name, T, C, OPENUM, op, combine)                                     \
    static void combine_##name##_##op(void *dst, const void *a, const void *b, size_t count)  \
    {                                                                                          \
        for (size_t i = 0; i < count; i++)                                                     \
            braid__st_##name(dst, i, braid__ew_##name##_##op(braid__ld_##name(a, i),            \
                                                             braid__ld_##name(b, i)));          \
    }
BRAID_EW_FOREACH_PAIR(GEN_COMBINE)
#undef GEN_COMBINE

#define GEN_DTYPE_FUNCS(ENUM, name, T, C)                                                      \
    static void avg_final_##name(void *dst, const void *a, const void *b, size_t count,       \
                                 int nranks)                                                   \
    {                                                                                          \
        for (size_t i = 0; i < count; i++)                                                     \
            braid__st_##name(dst, i, braid__ew_##name##_avg_final(braid__ld_##name(a, i),       \
                                                                  braid__ld_##name(b, i), nranks)); \
    }                                                                                          \
    static void scale_##name(void *buf, size_t count, int nranks)                              \
    {                                                                                          \
        for (size_t i = 0; i < count; i++)                                                     \
            braid__st_##name(buf, i, braid__ew_##name##_scale(braid__ld_##name(buf, i), nranks)); \
    }                                                                                          \
    static void premul_##name(void *dst, const void *src, size_t count, const void *scalar)    \
    {                                                                                          \
        T s = braid__ld_##name(scalar, 0);                                                     \
        for (size_t i = 0; i < count; i++)                                                     \
            braid__st_##name(dst, i, braid__ew_##name##_premul(braid__ld_##name(src, i), s));   \
    }
BRAID_EW_FOREACH_DTYPE(GEN_DTYPE_FUNCS)
#undef GEN_DTYPE_FUNCS

/* Casts between the float types. f64 only pairs with f32: f64 -> f16 via
 * f32 would round twice, so it is left unsupported rather than subtly off. */
#define GEN_CAST(dname, DT, sname, ST, expr)                                                   \
    static void cast_##dname##_##sname(void *dst, const void *src, size_t count)               \
    {                                                                                          \
        for (size_t i = 0; i < count; i++) {                                                   \
            ST v = braid__ld_##sname(src, i);                                                  \
            braid__st_##dname(dst, i, (expr));                                                 \
        }                                                                                      \
    }
GEN_CAST(f16, uint16_t, f32, float, braid__ew_f32_to_f16(v))
GEN_CAST(bf16, uint16_t, f32, float, braid__ew_f32_to_bf16(v))
GEN_CAST(f32, float, f16, uint16_t, braid__ew_f16_to_f32(v))
GEN_CAST(f32, float, bf16, uint16_t, braid__ew_bf16_to_f32(v))
/* Widening is exact, so each of these rounds once. */
GEN_CAST(f16, uint16_t, bf16, uint16_t, braid__ew_f32_to_f16(braid__ew_bf16_to_f32(v)))
GEN_CAST(bf16, uint16_t, f16, uint16_t, braid__ew_f32_to_bf16(braid__ew_f16_to_f32(v)))
GEN_CAST(f64, double, f32, float, (double)v)
GEN_CAST(f32, float, f64, double, (float)v)
#undef GEN_CAST

/* Same type: a copy. memmove, since callers may pass dst == src. */
static void cast_same_1(void *dst, const void *src, size_t count)
{
    memmove(dst, src, count);
}
static void cast_same_2(void *dst, const void *src, size_t count)
{
    memmove(dst, src, count * 2);
}
static void cast_same_4(void *dst, const void *src, size_t count)
{
    memmove(dst, src, count * 4);
}
static void cast_same_8(void *dst, const void *src, size_t count)
{
    memmove(dst, src, count * 8);
}

#define PAIR_ENTRY(ENUM, name, T, C, OPENUM, op, cfn)                                          \
    [BRAID_##ENUM][BRAID_##OPENUM] = combine_##name##_##op,
#define AVG_ENTRY(ENUM, name, T, C) [BRAID_##ENUM] = avg_final_##name,
#define SCALE_ENTRY(ENUM, name, T, C) [BRAID_##ENUM] = scale_##name,
#define PREMUL_ENTRY(ENUM, name, T, C) [BRAID_##ENUM] = premul_##name,

const braid__reduce_kernels braid__reduce_kernels_scalar = {
    .isa = "scalar",
    .combine = {BRAID_EW_FOREACH_PAIR(PAIR_ENTRY)},
    .avg_final = {BRAID_EW_FOREACH_DTYPE(AVG_ENTRY)},
    .scale = {BRAID_EW_FOREACH_DTYPE(SCALE_ENTRY)},
    .premul = {BRAID_EW_FOREACH_DTYPE(PREMUL_ENTRY)},
    .cast =
        {
            [BRAID_F32] = {[BRAID_F32] = cast_same_4, [BRAID_F16] = cast_f32_f16,
                           [BRAID_BF16] = cast_f32_bf16, [BRAID_F64] = cast_f32_f64},
            [BRAID_F16] = {[BRAID_F16] = cast_same_2, [BRAID_F32] = cast_f16_f32,
                           [BRAID_BF16] = cast_f16_bf16},
            [BRAID_BF16] = {[BRAID_BF16] = cast_same_2, [BRAID_F32] = cast_bf16_f32,
                            [BRAID_F16] = cast_bf16_f16},
            [BRAID_F64] = {[BRAID_F64] = cast_same_8, [BRAID_F32] = cast_f64_f32},
            [BRAID_I8] = {[BRAID_I8] = cast_same_1},
            [BRAID_U8] = {[BRAID_U8] = cast_same_1},
            [BRAID_I32] = {[BRAID_I32] = cast_same_4},
            [BRAID_I64] = {[BRAID_I64] = cast_same_8},
            [BRAID_U32] = {[BRAID_U32] = cast_same_4},
            [BRAID_U64] = {[BRAID_U64] = cast_same_8},
        },
};
