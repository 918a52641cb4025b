/*
 * The one elementwise definition of every (dtype, op) pair.
 *
 * Both the CPU engine (src/reduce/) and the CUDA kernels (cuda/) compile this
 * header, so tests on the CPU pin the exact bits the GPU must produce. For
 * that reason every conversion is written with integer bit operations
 * instead of compiler or hardware intrinsics, whose rounding and NaN rules
 * differ between x86, F16C and CUDA's cuda_fp16.h.
 *
 * Semantics:
 *  - integers wrap (two's complement); arithmetic is done in the unsigned
 *    type of the same width so overflow is never undefined behaviour;
 *  - f16/bf16 are widened to f32 (exact), combined in f32, and rounded back
 *    once, to nearest even; an f16/bf16 NaN result is always the canonical
 *    quiet NaN (0x7e00 / 0x7fc0), because the NaN an f32 add produces on x86
 *    (first operand's payload) and on a GPU (0x7fffffff) differ;
 *  - f32/f64 sum and prod are the IEEE operations; a NaN result keeps
 *    whatever payload the hardware gives (only "is NaN" is specified);
 *  - min/max propagate NaN (result is the canonical quiet NaN of the type)
 *    and order -0 below +0, so they are commutative bit for bit;
 *  - AVG combines like SUM; its final step divides by nranks: floats in
 *    their compute type (f32 for f16/bf16, then one rounding), integers
 *    truncating toward zero.
 *
 * Layout: per-dtype primitives (load to the compute type, store back,
 * combine in the compute type, divide), then X-macros that generate the
 * public elementwise functions
 *     T    braid__ew_<dtype>_<op>(T a, T b)
 *     T    braid__ew_<dtype>_<op>_final(T a, T b, int nranks)
 *     T    braid__ew_<dtype>_scale(T x, int nranks)    (x / nranks)
 * and let kernel files generate one loop per pair from the same lists.
 */
#ifndef BRAID_REDUCE_ELEMENTWISE_H
#define BRAID_REDUCE_ELEMENTWISE_H

#include <stdint.h>
#include <string.h> /* memcpy: host code, including nvcc's host pass */

#ifdef __CUDACC__
#define BRAID_EW_FN static __host__ __device__ __forceinline__
#else
#define BRAID_EW_FN static inline
#endif

/* ---- bit casts --------------------------------------------------------
 * memcpy is the defined way to reinterpret in C; on the device the
 * intrinsics say the same thing without relying on memcpy lowering. */

BRAID_EW_FN uint32_t braid__ew_f32_to_bits(float f)
{
#ifdef __CUDA_ARCH__
    return __float_as_uint(f);
#else
    uint32_t u;
    memcpy(&u, &f, sizeof(u));
    return u;
#endif
}

BRAID_EW_FN float braid__ew_bits_to_f32(uint32_t u)
{
#ifdef __CUDA_ARCH__
    return __uint_as_float(u);
#else
    float f;
    memcpy(&f, &u, sizeof(f));
    return f;
#endif
}

BRAID_EW_FN uint64_t braid__ew_f64_to_bits(double d)
{
#ifdef __CUDA_ARCH__
    return (uint64_t)__double_as_longlong(d);
#else
    uint64_t u;
    memcpy(&u, &d, sizeof(u));
    return u;
#endif
}

BRAID_EW_FN double braid__ew_bits_to_f64(uint64_t u)
{
#ifdef __CUDA_ARCH__
    return __longlong_as_double((long long)u);
#else
    double d;
    memcpy(&d, &u, sizeof(d));
    return d;
#endif
}

BRAID_EW_FN int braid__ew_clz32(uint32_t x) /* x != 0 */
{
#ifdef __CUDA_ARCH__
    return __clz((int)x);
#else
    return __builtin_clz(x);
#endif
}

#define BRAID_EW_F16_NAN ((uint16_t)0x7e00)
#define BRAID_EW_BF16_NAN ((uint16_t)0x7fc0)
#define BRAID_EW_F32_NAN_BITS 0x7fc00000u
#define BRAID_EW_F64_NAN_BITS 0x7ff8000000000000ull

/* ---- f16 <-> f32 -------------------------------------------------------- */

/* Exact widening. A signalling NaN comes back quiet with its payload, as
 * F16C's vcvtph2ps does, so the scalar and vector casts agree. */
BRAID_EW_FN float braid__ew_f16_to_f32(uint16_t h)
{
#ifdef __CUDA_ARCH__
    /* Widening a finite value is exact, so the GPU's own conversion gives
     * the bits below in one instruction; inf and NaN keep the rule below. */
    if ((h & 0x7c00u) != 0x7c00u) {
        float out;
        asm("cvt.f32.f16 %0, %1;" : "=f"(out) : "h"(h));
        return out;
    }
#endif
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t exp = (h >> 10) & 0x1fu;
    uint32_t man = h & 0x3ffu;
    uint32_t bits;

    if (exp == 0x1f) { /* inf or NaN */
        bits = sign | 0x7f800000u | (man << 13) | (man ? 0x00400000u : 0);
    } else if (exp != 0) { /* normal: rebias 15 -> 127 */
        bits = sign | ((exp + 112u) << 23) | (man << 13);
    } else if (man == 0) { /* signed zero */
        bits = sign;
    } else { /* subnormal man * 2^-24: normalise so the leading 1 is implicit */
        int lead = 31 - braid__ew_clz32(man); /* bit index of the leading 1, 0..9 */
        man = (man << (10 - lead)) & 0x3ffu;
        bits = sign | ((uint32_t)(103 + lead) << 23) | (man << 13);
    }
    return braid__ew_bits_to_f32(bits);
}

/* Round to nearest even, overflow to inf, gradual underflow. */
BRAID_EW_FN uint16_t braid__ew_f32_to_f16(float f)
{
    uint32_t x = braid__ew_f32_to_bits(f);
    uint32_t sign = (x >> 16) & 0x8000u;
    uint32_t ax = x & 0x7fffffffu;

    if (ax > 0x7f800000u)
        return BRAID_EW_F16_NAN;
#ifdef __CUDA_ARCH__
    {
        /* IEEE round to nearest even with gradual underflow and overflow to
         * inf: the rule below, in one instruction, for everything but NaN. */
        uint16_t out;
        asm("cvt.rn.f16.f32 %0, %1;" : "=h"(out) : "f"(f));
        return out;
    }
#endif
    if (ax >= 0x477ff000u) /* >= 65520 = halfway between 65504 and 2^16: ties go to even = inf */
        return (uint16_t)(sign | 0x7c00u);
    if (ax >= 0x38800000u) { /* result is a normal f16 (>= 2^-14) */
        uint32_t r = ax - 0x38000000u; /* exponent rebias 127 -> 15 */
        r += 0xfffu + ((r >> 13) & 1u);
        return (uint16_t)(sign | (r >> 13));
    }
    if (ax <= 0x33000000u) /* <= 2^-25, half the smallest subnormal: ties to even 0 */
        return (uint16_t)sign;
    /* Subnormal result: round(value * 2^24) with the f32 significand. */
    {
        uint32_t exp = ax >> 23; /* 102..112 */
        uint32_t man = (ax & 0x7fffffu) | 0x800000u;
        uint32_t shift = 126u - exp; /* 14..24 */
        uint32_t q = man >> shift;
        uint32_t rem = man & ((1u << shift) - 1u);
        uint32_t half = 1u << (shift - 1u);
        q += (rem > half || (rem == half && (q & 1u))) ? 1u : 0u;
        return (uint16_t)(sign | q); /* q == 0x400 is the smallest normal: still right */
    }
}

/* ---- bf16 <-> f32 ------------------------------------------------------- */

BRAID_EW_FN float braid__ew_bf16_to_f32(uint16_t h)
{
    uint32_t bits = (uint32_t)h << 16;
    if ((bits & 0x7fffffffu) > 0x7f800000u)
        bits |= 0x00400000u; /* quiet a signalling NaN, as the f16 path does */
    return braid__ew_bits_to_f32(bits);
}

BRAID_EW_FN uint16_t braid__ew_f32_to_bf16(float f)
{
    uint32_t x = braid__ew_f32_to_bits(f);
    if ((x & 0x7fffffffu) > 0x7f800000u)
        return BRAID_EW_BF16_NAN;
    /* Same exponent range as f32: rounding the top 16 bits is the whole job;
     * a carry out of the significand bumps the exponent (up to inf). */
    return (uint16_t)((x + 0x7fffu + ((x >> 16) & 1u)) >> 16);
}

/* ---- float min/max --------------------------------------------------------
 * NaN in, canonical NaN out. Equal operands are either identical or +0/-0:
 * OR of the bits picks -0 for min, AND picks +0 for max. The AVX2 kernels
 * build the same thing from vminps(a,b) | vminps(b,a). */

BRAID_EW_FN float braid__ew_fmin32(float a, float b)
{
    if (a != a || b != b)
        return braid__ew_bits_to_f32(BRAID_EW_F32_NAN_BITS);
    if (a < b)
        return a;
    if (b < a)
        return b;
    return braid__ew_bits_to_f32(braid__ew_f32_to_bits(a) | braid__ew_f32_to_bits(b));
}

BRAID_EW_FN float braid__ew_fmax32(float a, float b)
{
    if (a != a || b != b)
        return braid__ew_bits_to_f32(BRAID_EW_F32_NAN_BITS);
    if (a > b)
        return a;
    if (b > a)
        return b;
    return braid__ew_bits_to_f32(braid__ew_f32_to_bits(a) & braid__ew_f32_to_bits(b));
}

BRAID_EW_FN double braid__ew_fmin64(double a, double b)
{
    if (a != a || b != b)
        return braid__ew_bits_to_f64(BRAID_EW_F64_NAN_BITS);
    if (a < b)
        return a;
    if (b < a)
        return b;
    return braid__ew_bits_to_f64(braid__ew_f64_to_bits(a) | braid__ew_f64_to_bits(b));
}

BRAID_EW_FN double braid__ew_fmax64(double a, double b)
{
    if (a != a || b != b)
        return braid__ew_bits_to_f64(BRAID_EW_F64_NAN_BITS);
    if (a > b)
        return a;
    if (b > a)
        return b;
    return braid__ew_bits_to_f64(braid__ew_f64_to_bits(a) & braid__ew_f64_to_bits(b));
}

/* ---- per-dtype primitives ------------------------------------------------
 * For dtype d with storage type T and compute type C:
 *   C    braid__ew_d_load(T)     widen (exact)
 *   T    braid__ew_d_store(C)    narrow (f16/bf16: round once)
 *   C    braid__ew_d_c{sum,prod,min,max}(C, C)
 *   C    braid__ew_d_cdiv(C, int nranks)                                   */

#define BRAID_EW_FLOAT_PRIMS(name, T, C, ld, st, fmin, fmax)                                   \
    BRAID_EW_FN C braid__ew_##name##_load(T x) { return ld(x); }                               \
    BRAID_EW_FN T braid__ew_##name##_store(C x) { return st(x); }                              \
    BRAID_EW_FN C braid__ew_##name##_csum(C a, C b) { return a + b; }                          \
    BRAID_EW_FN C braid__ew_##name##_cprod(C a, C b) { return a * b; }                         \
    BRAID_EW_FN C braid__ew_##name##_cmin(C a, C b) { return fmin(a, b); }                     \
    BRAID_EW_FN C braid__ew_##name##_cmax(C a, C b) { return fmax(a, b); }                     \
    BRAID_EW_FN C braid__ew_##name##_cdiv(C x, int n) { return x / (C)n; }

#define BRAID_EW_IDENTITY(x) (x)
BRAID_EW_FLOAT_PRIMS(f32, float, float, BRAID_EW_IDENTITY, BRAID_EW_IDENTITY, braid__ew_fmin32,
                     braid__ew_fmax32)
BRAID_EW_FLOAT_PRIMS(f64, double, double, BRAID_EW_IDENTITY, BRAID_EW_IDENTITY, braid__ew_fmin64,
                     braid__ew_fmax64)
BRAID_EW_FLOAT_PRIMS(f16, uint16_t, float, braid__ew_f16_to_f32, braid__ew_f32_to_f16,
                     braid__ew_fmin32, braid__ew_fmax32)
BRAID_EW_FLOAT_PRIMS(bf16, uint16_t, float, braid__ew_bf16_to_f32, braid__ew_f32_to_bf16,
                     braid__ew_fmin32, braid__ew_fmax32)

/* Integers: sum/prod through the unsigned type U (wraps, never UB; the
 * conversion back to a signed type is modulo 2^N on every compiler braid
 * supports). Division is on the signed value, truncating toward zero. */
#define BRAID_EW_INT_PRIMS(name, T, U)                                                         \
    BRAID_EW_FN T braid__ew_##name##_load(T x) { return x; }                                   \
    BRAID_EW_FN T braid__ew_##name##_store(T x) { return x; }                                  \
    BRAID_EW_FN T braid__ew_##name##_csum(T a, T b) { return (T)(U)((U)a + (U)b); }            \
    BRAID_EW_FN T braid__ew_##name##_cprod(T a, T b) { return (T)(U)((U)a * (U)b); }           \
    BRAID_EW_FN T braid__ew_##name##_cmin(T a, T b) { return b < a ? b : a; }                  \
    BRAID_EW_FN T braid__ew_##name##_cmax(T a, T b) { return b > a ? b : a; }                  \
    BRAID_EW_FN T braid__ew_##name##_cdiv(T x, int n) { return (T)(x / n); }

/* u8/i8 operands promote to int (255*255 fits, so no signed overflow);
 * uint32_t/uint64_t arithmetic stays unsigned. cdiv divides after the usual
 * conversions (int for the narrow types, int64_t for i64), never in the
 * narrow type itself: n = 256 must not become 0. */
BRAID_EW_INT_PRIMS(i8, int8_t, uint8_t)
BRAID_EW_INT_PRIMS(u8, uint8_t, uint8_t)
BRAID_EW_INT_PRIMS(i32, int32_t, uint32_t)
BRAID_EW_INT_PRIMS(i64, int64_t, uint64_t)
BRAID_EW_INT_PRIMS(u32, uint32_t, uint32_t)
BRAID_EW_INT_PRIMS(u64, uint64_t, uint64_t)
#undef BRAID_EW_INT_PRIMS

/* ---- the lists ------------------------------------------------------------
 * X(ENUM, name, storage type, compute type). ENUM pastes onto BRAID_. */
#define BRAID_EW_FOREACH_DTYPE(X)                                                              \
    X(F32, f32, float, float)                                                                  \
    X(F64, f64, double, double)                                                                \
    X(F16, f16, uint16_t, float)                                                               \
    X(BF16, bf16, uint16_t, float)                                                             \
    X(I8, i8, int8_t, int8_t)                                                                  \
    X(U8, u8, uint8_t, uint8_t)                                                                \
    X(I32, i32, int32_t, int32_t)                                                              \
    X(I64, i64, int64_t, int64_t)                                                              \
    X(U32, u32, uint32_t, uint32_t)                                                            \
    X(U64, u64, uint64_t, uint64_t)

/* X(..., OPENUM, op, combine): the trailing arguments of a dtype entry come
 * first so one X can receive the whole (dtype, op) pair. AVG combines with
 * csum; only its final step differs. MULSUM combines with csum too: its
 * inputs were multiplied by each rank's scalar before the collective
 * (braid__ew_<dtype>_premul). */
#define BRAID_EW_FOREACH_OP(X, ...)                                                            \
    X(__VA_ARGS__, SUM, sum, csum)                                                             \
    X(__VA_ARGS__, PROD, prod, cprod)                                                          \
    X(__VA_ARGS__, MIN, min, cmin)                                                             \
    X(__VA_ARGS__, MAX, max, cmax)                                                             \
    X(__VA_ARGS__, AVG, avg, csum)                                                             \
    X(__VA_ARGS__, MULSUM, mulsum, csum)

/* The finishing step of op on a compute value x: identity except AVG. */
#define BRAID_EW_FINISH_sum(name, x, n) (x)
#define BRAID_EW_FINISH_prod(name, x, n) (x)
#define BRAID_EW_FINISH_min(name, x, n) (x)
#define BRAID_EW_FINISH_max(name, x, n) (x)
#define BRAID_EW_FINISH_avg(name, x, n) braid__ew_##name##_cdiv((x), (n))
#define BRAID_EW_FINISH_mulsum(name, x, n) (x)

/* Every (dtype, op) pair: X(ENUM, name, T, C, OPENUM, op, combine). */
#define BRAID_EW_FOREACH_PAIR_DTYPE_(ENUM, name, T, C, X) BRAID_EW_FOREACH_OP(X, ENUM, name, T, C)
#define BRAID_EW_FOREACH_PAIR(X)                                                               \
    BRAID_EW_FOREACH_PAIR_DTYPE_(F32, f32, float, float, X)                                    \
    BRAID_EW_FOREACH_PAIR_DTYPE_(F64, f64, double, double, X)                                  \
    BRAID_EW_FOREACH_PAIR_DTYPE_(F16, f16, uint16_t, float, X)                                 \
    BRAID_EW_FOREACH_PAIR_DTYPE_(BF16, bf16, uint16_t, float, X)                               \
    BRAID_EW_FOREACH_PAIR_DTYPE_(I8, i8, int8_t, int8_t, X)                                    \
    BRAID_EW_FOREACH_PAIR_DTYPE_(U8, u8, uint8_t, uint8_t, X)                                  \
    BRAID_EW_FOREACH_PAIR_DTYPE_(I32, i32, int32_t, int32_t, X)                                \
    BRAID_EW_FOREACH_PAIR_DTYPE_(I64, i64, int64_t, int64_t, X)                                \
    BRAID_EW_FOREACH_PAIR_DTYPE_(U32, u32, uint32_t, uint32_t, X)                              \
    BRAID_EW_FOREACH_PAIR_DTYPE_(U64, u64, uint64_t, uint64_t, X)

/* ---- generated elementwise functions ------------------------------------ */

#define BRAID_EW_GEN_PAIR(ENUM, name, T, C, OPENUM, op, combine)                               \
    BRAID_EW_FN T braid__ew_##name##_##op(T a, T b)                                            \
    {                                                                                          \
        return braid__ew_##name##_store(                                                       \
            braid__ew_##name##_##combine(braid__ew_##name##_load(a), braid__ew_##name##_load(b))); \
    }                                                                                          \
    BRAID_EW_FN T braid__ew_##name##_##op##_final(T a, T b, int nranks)                        \
    {                                                                                          \
        C r = braid__ew_##name##_##combine(braid__ew_##name##_load(a), braid__ew_##name##_load(b)); \
        (void)nranks;                                                                          \
        return braid__ew_##name##_store(BRAID_EW_FINISH_##op(name, r, nranks));                \
    }
BRAID_EW_FOREACH_PAIR(BRAID_EW_GEN_PAIR)
#undef BRAID_EW_GEN_PAIR

#define BRAID_EW_GEN_SCALE(ENUM, name, T, C)                                                   \
    BRAID_EW_FN T braid__ew_##name##_scale(T x, int nranks)                                    \
    {                                                                                          \
        return braid__ew_##name##_store(braid__ew_##name##_cdiv(braid__ew_##name##_load(x), nranks)); \
    }
BRAID_EW_FOREACH_DTYPE(BRAID_EW_GEN_SCALE)
#undef BRAID_EW_GEN_SCALE

/* MULSUM's first step: x * s in the compute type, stored back (f16/bf16:
 * the f32 product of two halves is exact, so it is rounded once;
 * integers wrap through the unsigned type). */
#define BRAID_EW_GEN_PREMUL(ENUM, name, T, C)                                                  \
    BRAID_EW_FN T braid__ew_##name##_premul(T x, T s)                                          \
    {                                                                                          \
        return braid__ew_##name##_store(                                                       \
            braid__ew_##name##_cprod(braid__ew_##name##_load(x), braid__ew_##name##_load(s))); \
    }
BRAID_EW_FOREACH_DTYPE(BRAID_EW_GEN_PREMUL)
#undef BRAID_EW_GEN_PREMUL

#endif /* BRAID_REDUCE_ELEMENTWISE_H */
