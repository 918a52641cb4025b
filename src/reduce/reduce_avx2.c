/* AVX2 + F16C reduce kernels for x86-64.
 *
 * Every kernel here must give the same bits as the scalar one built from
 * elementwise.h (tests/test_reduce.c checks all of them on random and edge
 * inputs). Where the obvious instruction differs from the definition the
 * code below corrects it:
 *  - vminps/vmaxps return the second operand on NaN and on +0/-0 ties; the
 *    definition wants a canonical NaN and -0 < +0, so min is
 *    min(a,b) | min(b,a) (max: AND) followed by a NaN blend;
 *  - vcvtps2ph rounds to nearest even like the definition but keeps NaN
 *    payloads, so NaN lanes are replaced by the canonical 0x7e00;
 *  - AVX2 has no 8-bit or 64-bit multiply: built from 16-bit and 32x32->64
 *    multiplies, which give the low bits of the product exactly;
 *  - integer AVG division has no vector instruction: those stay scalar.
 * AVG final steps divide (vdivps) rather than multiply by 1/n, because
 * x * (1/n) is not always x / n.
 *
 * The file is compiled for the baseline ISA; the functions get AVX2/F16C
 * through a target pragma, and reduce_cpu.c only installs them after
 * checking the CPU. No "fma" in the target: it would let the compiler fuse
 * a*b+c and change results.
 */
#include <stdint.h>

#include "reduce/elementwise.h"
#include "reduce/reduce_impl.h"
#include "reduce/unaligned.h"

#if (defined(__x86_64__) || defined(__i386__)) && (defined(__GNUC__) || defined(__clang__))

#include <immintrin.h>

#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("avx2,f16c"))), apply_to = function)
#else
#pragma GCC push_options
#pragma GCC target("avx2,f16c")
#endif

/* ---- load/store per dtype: elements per vector VW_<name> ---------------- */

#define AT BRAID_UA_AT
#define AT_MUT BRAID_UA_AT_MUT

#define VW_f32 8
#define VW_f64 4
#define VW_f16 8
#define VW_bf16 8
#define VW_i8 32
#define VW_u8 32
#define VW_i32 8
#define VW_i64 4
#define VW_u32 8
#define VW_u64 4

/* Loads and stores take untyped addresses: user buffers may have any
 * alignment, and only the unaligned intrinsics (and memcpy in
 * unaligned.h) touch them. */
static inline __m256 v_f32_load(const void *p) { return _mm256_loadu_ps(p); }
static inline void v_f32_store(void *p, __m256 v) { _mm256_storeu_ps(p, v); }
static inline __m256d v_f64_load(const void *p) { return _mm256_loadu_pd(p); }
static inline void v_f64_store(void *p, __m256d v) { _mm256_storeu_pd(p, v); }

#define INT_LOAD_STORE(name, T)                                                                \
    static inline __m256i v_##name##_load(const void *p) { return _mm256_loadu_si256(p); }     \
    static inline void v_##name##_store(void *p, __m256i v) { _mm256_storeu_si256(p, v); }
INT_LOAD_STORE(i8, int8_t)
INT_LOAD_STORE(u8, uint8_t)
INT_LOAD_STORE(i32, int32_t)
INT_LOAD_STORE(i64, int64_t)
INT_LOAD_STORE(u32, uint32_t)
INT_LOAD_STORE(u64, uint64_t)
#undef INT_LOAD_STORE

/* f16: vcvtph2ps is exact (and quiets a signalling NaN keeping its payload,
 * as braid__ew_f16_to_f32 does). */
static inline __m256 v_f16_load(const void *p)
{
    return _mm256_cvtph_ps(_mm_loadu_si128(p));
}

static inline __m128i f32_to_f16_vec(__m256 v)
{
    __m128i h = _mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m128i mag = _mm_and_si128(h, _mm_set1_epi16(0x7fff));
    __m128i nan = _mm_cmpgt_epi16(mag, _mm_set1_epi16(0x7c00)); /* signed compare: mag <= 0x7fff */
    return _mm_blendv_epi8(h, _mm_set1_epi16((short)BRAID_EW_F16_NAN), nan);
}

static inline void v_f16_store(void *p, __m256 v)
{
    _mm_storeu_si128(p, f32_to_f16_vec(v));
}

/* bf16 widening is a shift. A signalling NaN loaded here stays signalling,
 * which is fine inside a combine (any NaN result is replaced by the
 * canonical one on store); the bf16 -> f32 cast quiets it explicitly. */
static inline __m256 v_bf16_load(const void *p)
{
    __m256i w = _mm256_cvtepu16_epi32(_mm_loadu_si128(p));
    return _mm256_castsi256_ps(_mm256_slli_epi32(w, 16));
}

static inline __m128i f32_to_bf16_vec(__m256 v)
{
    __m256i x = _mm256_castps_si256(v);
    __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(x, 16), _mm256_set1_epi32(1));
    __m256i r = _mm256_add_epi32(_mm256_add_epi32(x, _mm256_set1_epi32(0x7fff)), lsb);
    r = _mm256_srli_epi32(r, 16);
    __m256i nan = _mm256_castps_si256(_mm256_cmp_ps(v, v, _CMP_UNORD_Q));
    r = _mm256_blendv_epi8(r, _mm256_set1_epi32(BRAID_EW_BF16_NAN), nan);
    /* every lane is <= 0xffff, so the saturating pack is a plain narrow */
    return _mm_packus_epi32(_mm256_castsi256_si128(r), _mm256_extracti128_si256(r, 1));
}

static inline void v_bf16_store(void *p, __m256 v)
{
    _mm_storeu_si128(p, f32_to_bf16_vec(v));
}

/* ---- ops ------------------------------------------------------------------ */

static inline __m256 v_f32_sum(__m256 a, __m256 b) { return _mm256_add_ps(a, b); }
static inline __m256 v_f32_prod(__m256 a, __m256 b) { return _mm256_mul_ps(a, b); }
static inline __m256 v_f32_min(__m256 a, __m256 b)
{
    __m256 r = _mm256_or_ps(_mm256_min_ps(a, b), _mm256_min_ps(b, a));
    __m256 nan = _mm256_cmp_ps(a, b, _CMP_UNORD_Q);
    return _mm256_blendv_ps(r, _mm256_castsi256_ps(_mm256_set1_epi32((int)BRAID_EW_F32_NAN_BITS)), nan);
}
static inline __m256 v_f32_max(__m256 a, __m256 b)
{
    __m256 r = _mm256_and_ps(_mm256_max_ps(a, b), _mm256_max_ps(b, a));
    __m256 nan = _mm256_cmp_ps(a, b, _CMP_UNORD_Q);
    return _mm256_blendv_ps(r, _mm256_castsi256_ps(_mm256_set1_epi32((int)BRAID_EW_F32_NAN_BITS)), nan);
}
static inline __m256 v_f32_div(__m256 x, int n) { return _mm256_div_ps(x, _mm256_set1_ps((float)n)); }

static inline __m256d v_f64_sum(__m256d a, __m256d b) { return _mm256_add_pd(a, b); }
static inline __m256d v_f64_prod(__m256d a, __m256d b) { return _mm256_mul_pd(a, b); }
static inline __m256d v_f64_min(__m256d a, __m256d b)
{
    __m256d r = _mm256_or_pd(_mm256_min_pd(a, b), _mm256_min_pd(b, a));
    __m256d nan = _mm256_cmp_pd(a, b, _CMP_UNORD_Q);
    return _mm256_blendv_pd(r, _mm256_castsi256_pd(_mm256_set1_epi64x((long long)BRAID_EW_F64_NAN_BITS)), nan);
}
static inline __m256d v_f64_max(__m256d a, __m256d b)
{
    __m256d r = _mm256_and_pd(_mm256_max_pd(a, b), _mm256_max_pd(b, a));
    __m256d nan = _mm256_cmp_pd(a, b, _CMP_UNORD_Q);
    return _mm256_blendv_pd(r, _mm256_castsi256_pd(_mm256_set1_epi64x((long long)BRAID_EW_F64_NAN_BITS)), nan);
}
static inline __m256d v_f64_div(__m256d x, int n) { return _mm256_div_pd(x, _mm256_set1_pd((double)n)); }

/* f16/bf16 compute in f32: the same ops, only load/store differ. */
#define v_f16_sum v_f32_sum
#define v_f16_prod v_f32_prod
#define v_f16_min v_f32_min
#define v_f16_max v_f32_max
#define v_f16_div v_f32_div
#define v_bf16_sum v_f32_sum
#define v_bf16_prod v_f32_prod
#define v_bf16_min v_f32_min
#define v_bf16_max v_f32_max
#define v_bf16_div v_f32_div

/* Low 8 bits of each byte product: even bytes from a 16-bit multiply, odd
 * bytes from a 16-bit multiply of the bytes shifted down. Sign does not
 * matter for the low bits, so i8 and u8 share it. */
static inline __m256i mul_epi8_lo(__m256i a, __m256i b)
{
    __m256i even = _mm256_mullo_epi16(a, b);
    __m256i odd = _mm256_mullo_epi16(_mm256_srli_epi16(a, 8), _mm256_srli_epi16(b, 8));
    return _mm256_or_si256(_mm256_and_si256(even, _mm256_set1_epi16(0x00ff)), _mm256_slli_epi16(odd, 8));
}

/* Low 64 bits of a 64x64 product: lo*lo + ((lo*hi + hi*lo) << 32). */
static inline __m256i mul_epi64_lo(__m256i a, __m256i b)
{
    __m256i lo = _mm256_mul_epu32(a, b);
    __m256i c1 = _mm256_mul_epu32(a, _mm256_srli_epi64(b, 32));
    __m256i c2 = _mm256_mul_epu32(_mm256_srli_epi64(a, 32), b);
    return _mm256_add_epi64(lo, _mm256_slli_epi64(_mm256_add_epi64(c1, c2), 32));
}

static inline __m256i v_i8_sum(__m256i a, __m256i b) { return _mm256_add_epi8(a, b); }
static inline __m256i v_i8_prod(__m256i a, __m256i b) { return mul_epi8_lo(a, b); }
static inline __m256i v_i8_min(__m256i a, __m256i b) { return _mm256_min_epi8(a, b); }
static inline __m256i v_i8_max(__m256i a, __m256i b) { return _mm256_max_epi8(a, b); }
static inline __m256i v_u8_sum(__m256i a, __m256i b) { return _mm256_add_epi8(a, b); }
static inline __m256i v_u8_prod(__m256i a, __m256i b) { return mul_epi8_lo(a, b); }
static inline __m256i v_u8_min(__m256i a, __m256i b) { return _mm256_min_epu8(a, b); }
static inline __m256i v_u8_max(__m256i a, __m256i b) { return _mm256_max_epu8(a, b); }
static inline __m256i v_i32_sum(__m256i a, __m256i b) { return _mm256_add_epi32(a, b); }
static inline __m256i v_i32_prod(__m256i a, __m256i b) { return _mm256_mullo_epi32(a, b); }
static inline __m256i v_i32_min(__m256i a, __m256i b) { return _mm256_min_epi32(a, b); }
static inline __m256i v_i32_max(__m256i a, __m256i b) { return _mm256_max_epi32(a, b); }
static inline __m256i v_i64_sum(__m256i a, __m256i b) { return _mm256_add_epi64(a, b); }
static inline __m256i v_i64_prod(__m256i a, __m256i b) { return mul_epi64_lo(a, b); }
static inline __m256i v_i64_min(__m256i a, __m256i b)
{
    return _mm256_blendv_epi8(a, b, _mm256_cmpgt_epi64(a, b)); /* a > b: take b */
}
static inline __m256i v_i64_max(__m256i a, __m256i b)
{
    return _mm256_blendv_epi8(b, a, _mm256_cmpgt_epi64(a, b)); /* a > b: take a */
}

static inline __m256i v_u32_sum(__m256i a, __m256i b) { return _mm256_add_epi32(a, b); }
static inline __m256i v_u32_prod(__m256i a, __m256i b) { return _mm256_mullo_epi32(a, b); }
static inline __m256i v_u32_min(__m256i a, __m256i b) { return _mm256_min_epu32(a, b); }
static inline __m256i v_u32_max(__m256i a, __m256i b) { return _mm256_max_epu32(a, b); }
#define v_u64_sum v_i64_sum
#define v_u64_prod v_i64_prod
/* AVX2 compares 64-bit lanes as signed only: flipping the sign bit of both
 * operands turns the unsigned order into the signed one. */
static inline __m256i u64_gt(__m256i a, __m256i b)
{
    __m256i bias = _mm256_set1_epi64x((long long)0x8000000000000000ull);
    return _mm256_cmpgt_epi64(_mm256_xor_si256(a, bias), _mm256_xor_si256(b, bias));
}
static inline __m256i v_u64_min(__m256i a, __m256i b)
{
    return _mm256_blendv_epi8(a, b, u64_gt(a, b)); /* a > b: take b */
}
static inline __m256i v_u64_max(__m256i a, __m256i b)
{
    return _mm256_blendv_epi8(b, a, u64_gt(a, b)); /* a > b: take a */
}

/* AVG and MULSUM combine like SUM (AVG's division is the final step,
 * MULSUM's multiply came before the collective). */
#define v_f32_avg v_f32_sum
#define v_f64_avg v_f64_sum
#define v_f16_avg v_f16_sum
#define v_bf16_avg v_bf16_sum
#define v_i8_avg v_i8_sum
#define v_u8_avg v_u8_sum
#define v_i32_avg v_i32_sum
#define v_i64_avg v_i64_sum
#define v_u32_avg v_u32_sum
#define v_u64_avg v_u64_sum
#define v_f32_mulsum v_f32_sum
#define v_f64_mulsum v_f64_sum
#define v_f16_mulsum v_f16_sum
#define v_bf16_mulsum v_bf16_sum
#define v_i8_mulsum v_i8_sum
#define v_u8_mulsum v_u8_sum
#define v_i32_mulsum v_i32_sum
#define v_i64_mulsum v_i64_sum
#define v_u32_mulsum v_u32_sum
#define v_u64_mulsum v_u64_sum

/* ---- kernels --------------------------------------------------------------
 * Whole vectors first, then the scalar definition for the tail. Two vectors
 * per iteration keep two independent load/op/store chains in flight. dst
 * may alias a or b exactly: each vector is loaded before it is stored. */

#define GEN_COMBINE(ENUM, name, T, C, OPENUM, op, combine)                                     \
    static void vcombine_##name##_##op(void *dst, const void *a, const void *b, size_t count) \
    {                                                                                          \
        size_t i = 0;                                                                          \
        for (; i + 2 * VW_##name <= count; i += 2 * VW_##name) {                               \
            v_##name##_store(AT_MUT(dst, i, T), v_##name##_##op(v_##name##_load(AT(a, i, T)),  \
                                                                v_##name##_load(AT(b, i, T)))); \
            v_##name##_store(AT_MUT(dst, i + VW_##name, T),                                    \
                             v_##name##_##op(v_##name##_load(AT(a, i + VW_##name, T)),         \
                                             v_##name##_load(AT(b, i + VW_##name, T))));       \
        }                                                                                      \
        for (; i + VW_##name <= count; i += VW_##name)                                         \
            v_##name##_store(AT_MUT(dst, i, T), v_##name##_##op(v_##name##_load(AT(a, i, T)),  \
                                                                v_##name##_load(AT(b, i, T)))); \
        for (; i < count; i++)                                                                 \
            braid__st_##name(dst, i, braid__ew_##name##_##op(braid__ld_##name(a, i),            \
                                                             braid__ld_##name(b, i)));          \
    }
BRAID_EW_FOREACH_PAIR(GEN_COMBINE)
#undef GEN_COMBINE

/* Float AVG final step and in-place scale. */
#define FLOAT_DTYPES(X)                                                                        \
    X(F32, f32, float)                                                                         \
    X(F64, f64, double)                                                                        \
    X(F16, f16, uint16_t)                                                                      \
    X(BF16, bf16, uint16_t)

#define GEN_AVG(ENUM, name, T)                                                                 \
    static void vavg_final_##name(void *dst, const void *a, const void *b, size_t count,      \
                                  int nranks)                                                  \
    {                                                                                          \
        size_t i = 0;                                                                          \
        for (; i + VW_##name <= count; i += VW_##name)                                         \
            v_##name##_store(AT_MUT(dst, i, T),                                                \
                             v_##name##_div(v_##name##_sum(v_##name##_load(AT(a, i, T)),       \
                                                           v_##name##_load(AT(b, i, T))),      \
                                            nranks));                                          \
        for (; i < count; i++)                                                                 \
            braid__st_##name(dst, i, braid__ew_##name##_avg_final(braid__ld_##name(a, i),       \
                                                                  braid__ld_##name(b, i), nranks)); \
    }                                                                                          \
    static void vscale_##name(void *buf, size_t count, int nranks)                             \
    {                                                                                          \
        size_t i = 0;                                                                          \
        for (; i + VW_##name <= count; i += VW_##name)                                         \
            v_##name##_store(AT_MUT(buf, i, T), v_##name##_div(v_##name##_load(AT(buf, i, T)), nranks)); \
        for (; i < count; i++)                                                                 \
            braid__st_##name(buf, i, braid__ew_##name##_scale(braid__ld_##name(buf, i), nranks)); \
    }
FLOAT_DTYPES(GEN_AVG)
#undef GEN_AVG

/* ---- casts (gradient compression) ------------------------------------------ */

static void vcast_f16_f32(void *dst, const void *src, size_t count)
{
    size_t i = 0;
    for (; i + 8 <= count; i += 8)
        v_f16_store(AT_MUT(dst, i, uint16_t), v_f32_load(AT(src, i, float)));
    for (; i < count; i++)
        braid__st_f16(dst, i, braid__ew_f32_to_f16(braid__ld_f32(src, i)));
}

static void vcast_f32_f16(void *dst, const void *src, size_t count)
{
    size_t i = 0;
    for (; i + 8 <= count; i += 8)
        v_f32_store(AT_MUT(dst, i, float), v_f16_load(AT(src, i, uint16_t)));
    for (; i < count; i++)
        braid__st_f32(dst, i, braid__ew_f16_to_f32(braid__ld_f16(src, i)));
}

static void vcast_bf16_f32(void *dst, const void *src, size_t count)
{
    size_t i = 0;
    for (; i + 8 <= count; i += 8)
        v_bf16_store(AT_MUT(dst, i, uint16_t), v_f32_load(AT(src, i, float)));
    for (; i < count; i++)
        braid__st_bf16(dst, i, braid__ew_f32_to_bf16(braid__ld_f32(src, i)));
}

/* Widening with the definition's NaN rule: a signalling NaN comes back
 * quiet (bit 22 set), payload kept. */
static void vcast_f32_bf16(void *dst, const void *src, size_t count)
{
    size_t i = 0;
    for (; i + 8 <= count; i += 8) {
        __m256 v = v_bf16_load(AT(src, i, uint16_t));
        __m256 nan = _mm256_cmp_ps(v, v, _CMP_UNORD_Q);
        __m256 quiet = _mm256_and_ps(nan, _mm256_castsi256_ps(_mm256_set1_epi32(0x00400000)));
        v_f32_store(AT_MUT(dst, i, float), _mm256_or_ps(v, quiet));
    }
    for (; i < count; i++)
        braid__st_f32(dst, i, braid__ew_bf16_to_f32(braid__ld_bf16(src, i)));
}

#if defined(__clang__)
#pragma clang attribute pop
#else
#pragma GCC pop_options
#endif

int braid__reduce_avx2_fill(braid__reduce_kernels *k)
{
#define PAIR_ENTRY(ENUM, name, T, C, OPENUM, op, cfn)                                          \
    k->combine[BRAID_##ENUM][BRAID_##OPENUM] = vcombine_##name##_##op;
    BRAID_EW_FOREACH_PAIR(PAIR_ENTRY)
#undef PAIR_ENTRY
#define AVG_ENTRY(ENUM, name, T)                                                               \
    k->avg_final[BRAID_##ENUM] = vavg_final_##name;                                            \
    k->scale[BRAID_##ENUM] = vscale_##name;
    FLOAT_DTYPES(AVG_ENTRY)
#undef AVG_ENTRY
    k->cast[BRAID_F16][BRAID_F32] = vcast_f16_f32;
    k->cast[BRAID_F32][BRAID_F16] = vcast_f32_f16;
    k->cast[BRAID_BF16][BRAID_F32] = vcast_bf16_f32;
    k->cast[BRAID_F32][BRAID_BF16] = vcast_f32_bf16;
    k->isa = "avx2+f16c";
    return 1;
}

#else /* not x86 */

int braid__reduce_avx2_fill(braid__reduce_kernels *k)
{
    (void)k;
    return 0;
}

#endif
