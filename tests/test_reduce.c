/* CPU reduce engine: every dtype x op, on random and edge inputs, against
 * a reference written here independently of elementwise.h (f16/bf16 via
 * double arithmetic and nearbyint, integers via wider types), for both the
 * scalar and the AVX2 kernel sets, with aliasing, odd counts (vector tails)
 * and unaligned pointers. */
#include <check.h>
#include <fenv.h>
#include <float.h>
#include <inttypes.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "reduce/reduce.h"
#include "reduce/reduce_impl.h"

/* ---- independent reference -------------------------------------------------- */

static uint32_t f32_bits(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}
static float bits_f32(uint32_t u)
{
    float f;
    memcpy(&f, &u, 4);
    return f;
}
static uint64_t f64_bits(double d)
{
    uint64_t u;
    memcpy(&u, &d, 8);
    return u;
}
static double bits_f64(uint64_t u)
{
    double d;
    memcpy(&d, &u, 8);
    return d;
}

/* f16 value from its fields, by ldexp. NaN: quiet, payload kept (the
 * documented widening rule). */
static float ref_f16_to_f32(uint16_t h)
{
    int sign = h >> 15, exp = (h >> 10) & 31, man = h & 1023;
    if (exp == 31) {
        if (man == 0)
            return sign ? -INFINITY : INFINITY;
        return bits_f32(((uint32_t)sign << 31) | 0x7fc00000u | ((uint32_t)man << 13));
    }
    double v = exp == 0 ? ldexp(man, -24) : ldexp(1024 + man, exp - 25);
    return (float)(sign ? -v : v);
}

static float ref_bf16_to_f32(uint16_t h)
{
    uint32_t bits = (uint32_t)h << 16;
    if (isnan(bits_f32(bits)))
        bits |= 0x00400000u;
    return bits_f32(bits);
}

/* Round |v| to a multiple of the quantum at its binade (floor exponent
 * min_exp), ties to even, by nearbyint in double: v has at most 53 bits so
 * the quotient is exact. */
static double ref_round_quantum(double m, int min_exp, int man_bits)
{
    int e;
    frexp(m, &e);
    int ex = e - 1 < min_exp ? min_exp : e - 1;
    double q = ldexp(1.0, ex - man_bits);
    return nearbyint(m / q) * q;
}

static uint16_t ref_f32_to_f16(float f)
{
    if (isnan(f))
        return 0x7e00;
    uint16_t s = signbit(f) ? 0x8000 : 0;
    double m = fabs((double)f);
    if (isinf(m))
        return s | 0x7c00;
    double r = ref_round_quantum(m, -14, 10);
    if (r > 65504.0)
        return s | 0x7c00;
    if (r == 0)
        return s;
    int e;
    frexp(r, &e);
    if (e - 1 < -14)
        return s | (uint16_t)(r / ldexp(1.0, -24));
    return s | (uint16_t)((e - 1 + 15) << 10) | (uint16_t)(r / ldexp(1.0, e - 1 - 10) - 1024);
}

static uint16_t ref_f32_to_bf16(float f)
{
    if (isnan(f))
        return 0x7fc0;
    uint16_t s = signbit(f) ? 0x8000 : 0;
    double m = fabs((double)f);
    if (isinf(m))
        return s | 0x7f80;
    double r = ref_round_quantum(m, -126, 7);
    if (r > (double)bits_f32(0x7f7f0000u))
        return s | 0x7f80;
    return s | (uint16_t)(f32_bits((float)r) >> 16);
}

/* min/max: NaN -> canonical NaN, -0 below +0. */
static double ref_min(double a, double b, int *nan)
{
    *nan = isnan(a) || isnan(b);
    if (a == b)
        return signbit(a) ? a : b;
    return a < b ? a : b;
}
static double ref_max(double a, double b, int *nan)
{
    *nan = isnan(a) || isnan(b);
    if (a == b)
        return signbit(a) ? b : a;
    return a > b ? a : b;
}

/* f32 compute for f32/f16/bf16; 'final' applies AVG's division. */
static float ref_f32_op(braid_op op, float a, float b, int final, int nranks)
{
    int nan;
    float r;
    switch (op) {
    case BRAID_SUM:
    case BRAID_MULSUM:
    case BRAID_AVG:
        r = a + b;
        if (op == BRAID_AVG && final)
            r = r / (float)nranks;
        return r;
    case BRAID_PROD:
        return a * b;
    case BRAID_MIN:
        r = (float)ref_min(a, b, &nan);
        return nan ? bits_f32(0x7fc00000u) : r;
    case BRAID_MAX:
        r = (float)ref_max(a, b, &nan);
        return nan ? bits_f32(0x7fc00000u) : r;
    default:
        abort();
    }
}

static double ref_f64_op(braid_op op, double a, double b, int final, int nranks)
{
    int nan;
    double r;
    switch (op) {
    case BRAID_SUM:
    case BRAID_MULSUM:
    case BRAID_AVG:
        r = a + b;
        if (op == BRAID_AVG && final)
            r = r / (double)nranks;
        return r;
    case BRAID_PROD:
        return a * b;
    case BRAID_MIN:
        r = ref_min(a, b, &nan);
        return nan ? bits_f64(0x7ff8000000000000ull) : r;
    case BRAID_MAX:
        r = ref_max(a, b, &nan);
        return nan ? bits_f64(0x7ff8000000000000ull) : r;
    default:
        abort();
    }
}

/* Integers in __int128, reduced mod 2^bits to the signed/unsigned range. */
static __int128 wrap(__int128 v, int bits, int is_signed)
{
    unsigned __int128 m = ((unsigned __int128)1 << bits) - 1;
    unsigned __int128 u = (unsigned __int128)v & m;
    if (is_signed && (u >> (bits - 1)))
        return (__int128)u - ((__int128)1 << bits);
    return (__int128)u;
}

static __int128 ref_int_op(braid_op op, __int128 a, __int128 b, int bits, int is_signed, int final,
                           int nranks)
{
    switch (op) {
    case BRAID_SUM:
    case BRAID_MULSUM:
        return wrap(a + b, bits, is_signed);
    case BRAID_AVG: {
        __int128 s = wrap(a + b, bits, is_signed);
        return final ? s / nranks : s; /* C division truncates toward zero */
    }
    case BRAID_PROD:
        return wrap((__int128)((unsigned __int128)a * (unsigned __int128)b), bits, is_signed);
    case BRAID_MIN:
        return a < b ? a : b;
    case BRAID_MAX:
        return a > b ? a : b;
    default:
        abort();
    }
}

static size_t dsize(braid_dtype t)
{
    static const size_t sizes[BRAID_DTYPE_COUNT] = {4, 8, 2, 2, 1, 1, 4, 8, 4, 8};
    return sizes[t];
}

/* Element i of buf as raw bits. */
static uint64_t get_bits(braid_dtype t, const void *buf, size_t i)
{
    const unsigned char *p = (const unsigned char *)buf + i * dsize(t);
    uint64_t v = 0;
    memcpy(&v, p, dsize(t)); /* little-endian */
    return v;
}

static void put_bits(braid_dtype t, void *buf, size_t i, uint64_t v)
{
    memcpy((unsigned char *)buf + i * dsize(t), &v, dsize(t));
}

static __int128 int_value(braid_dtype t, uint64_t bits)
{
    switch (t) {
    case BRAID_I8: return (int8_t)bits;
    case BRAID_U8: return (uint8_t)bits;
    case BRAID_I32: return (int32_t)bits;
    case BRAID_I64: return (int64_t)bits;
    case BRAID_U32: return (uint32_t)bits;
    case BRAID_U64: return bits;
    default: abort();
    }
}

static int int_signed(braid_dtype t)
{
    return t != BRAID_U8 && t != BRAID_U32 && t != BRAID_U64;
}

static int int_width(braid_dtype t)
{
    return (int)dsize(t) * 8;
}

/* Reference result bits for one element. *nan_any: the result is a NaN
 * whose payload is not specified (f32/f64 sum/prod/avg). */
static uint64_t ref_elem(braid_dtype t, braid_op op, uint64_t a, uint64_t b, int final, int nranks,
                         int *nan_any)
{
    *nan_any = 0;
    switch (t) {
    case BRAID_F32: {
        float r = ref_f32_op(op, bits_f32((uint32_t)a), bits_f32((uint32_t)b), final, nranks);
        *nan_any = isnan(r) && op != BRAID_MIN && op != BRAID_MAX;
        return f32_bits(r);
    }
    case BRAID_F64: {
        double r = ref_f64_op(op, bits_f64(a), bits_f64(b), final, nranks);
        *nan_any = isnan(r) && op != BRAID_MIN && op != BRAID_MAX;
        return f64_bits(r);
    }
    case BRAID_F16:
        return ref_f32_to_f16(
            ref_f32_op(op, ref_f16_to_f32((uint16_t)a), ref_f16_to_f32((uint16_t)b), final, nranks));
    case BRAID_BF16:
        return ref_f32_to_bf16(
            ref_f32_op(op, ref_bf16_to_f32((uint16_t)a), ref_bf16_to_f32((uint16_t)b), final, nranks));
    default: {
        __int128 r = ref_int_op(op, int_value(t, a), int_value(t, b), int_width(t),
                                int_signed(t), final, nranks);
        uint64_t m = int_width(t) == 64 ? ~0ull : ((1ull << int_width(t)) - 1);
        return (uint64_t)r & m;
    }
    }
}

static uint64_t ref_scale(braid_dtype t, uint64_t x, int nranks, int *nan_any)
{
    *nan_any = 0;
    switch (t) {
    case BRAID_F32: {
        float r = bits_f32((uint32_t)x) / (float)nranks;
        *nan_any = isnan(r);
        return f32_bits(r);
    }
    case BRAID_F64: {
        double r = bits_f64(x) / (double)nranks;
        *nan_any = isnan(r);
        return f64_bits(r);
    }
    case BRAID_F16: return ref_f32_to_f16(ref_f16_to_f32((uint16_t)x) / (float)nranks);
    case BRAID_BF16: return ref_f32_to_bf16(ref_bf16_to_f32((uint16_t)x) / (float)nranks);
    default: {
        uint64_t m = int_width(t) == 64 ? ~0ull : ((1ull << int_width(t)) - 1);
        return (uint64_t)(int_value(t, x) / nranks) & m;
    }
    }
}

static int is_nan_bits(braid_dtype t, uint64_t v)
{
    if (t == BRAID_F32)
        return isnan(bits_f32((uint32_t)v));
    if (t == BRAID_F64)
        return isnan(bits_f64(v));
    return 0;
}

/* ---- inputs ----------------------------------------------------------------- */

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;
static uint64_t rnd(void)
{
    uint64_t x = rng_state;
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    return rng_state = x;
}

static const uint64_t edge_f32[] = {
    0x00000000, 0x80000000, 0x3f800000, 0xbf800000, 0x7f800000, 0xff800000, 0x7fc00000,
    0xffc00001, 0x7f800001, 0xff812345, 0x00000001, 0x80000001, 0x007fffff, 0x00800000,
    0x7f7fffff, 0xff7fffff, 0x33800000, 0x4b000000, 0x3f800001, 0x40000000, 0x00400000};
static const uint64_t edge_f64[] = {
    0, 0x8000000000000000ull, 0x3ff0000000000000ull, 0xbff0000000000000ull, 0x7ff0000000000000ull,
    0xfff0000000000000ull, 0x7ff8000000000000ull, 0xfff8000000000001ull, 0x7ff0000000000001ull,
    1, 0x800fffffffffffffull, 0x0010000000000000ull, 0x7fefffffffffffffull, 0xffefffffffffffffull,
    0x4340000000000000ull};
static const uint64_t edge_f16[] = {
    0x0000, 0x8000, 0x3c00, 0xbc00, 0x7c00, 0xfc00, 0x7e00, 0x7c01, 0xfe01, 0x7fff, 0x0001, 0x8001,
    0x03ff, 0x0400, 0x7bff, 0xfbff, 0x6800, 0x6801, 0x3800, 0x0002, 0x4c00, 0x4800, 0x3c01, 0x1400};
static const uint64_t edge_bf16[] = {
    0x0000, 0x8000, 0x3f80, 0xbf80, 0x7f80, 0xff80, 0x7fc0, 0x7f81, 0xffc1, 0x0001, 0x8001, 0x007f,
    0x0080, 0x7f7f, 0xff7f, 0x4380, 0x4381, 0x3f81, 0x3b80};
static const uint64_t edge_i8[] = {0, 1, 0xff, 0x80, 0x7f, 0x81, 0x7e, 2, 0xfe, 0x10};
static const uint64_t edge_i32[] = {0, 1, 0xffffffff, 0x80000000, 0x7fffffff, 0x80000001,
                                    0x7ffffffe, 2, 0xfffffffe, 0x10000};
static const uint64_t edge_i64[] = {0, 1, ~0ull, 0x8000000000000000ull, 0x7fffffffffffffffull,
                                    0x8000000000000001ull, 0x7ffffffffffffffeull, 2, ~1ull,
                                    0x100000000ull, 0xffffffffull};

#define NELEM(a) (sizeof(a) / sizeof((a)[0]))

static uint64_t edge_value(braid_dtype t)
{
    switch (t) {
    case BRAID_F32: return edge_f32[rnd() % NELEM(edge_f32)];
    case BRAID_F64: return edge_f64[rnd() % NELEM(edge_f64)];
    case BRAID_F16: return edge_f16[rnd() % NELEM(edge_f16)];
    case BRAID_BF16: return edge_bf16[rnd() % NELEM(edge_bf16)];
    case BRAID_I8:
    case BRAID_U8: return edge_i8[rnd() % NELEM(edge_i8)];
    case BRAID_I32:
    case BRAID_U32: return edge_i32[rnd() % NELEM(edge_i32)];
    case BRAID_I64:
    case BRAID_U64: return edge_i64[rnd() % NELEM(edge_i64)];
    default: abort();
    }
}

/* "Ordinary" values: floats with exponents near 0 so sums round often and
 * ties occur; integers small so products stay in range sometimes. */
static uint64_t plain_value(braid_dtype t)
{
    uint64_t r = rnd();
    switch (t) {
    case BRAID_F32: return (r & 0x807fffffu) | ((uint64_t)(120 + (r >> 40) % 16) << 23);
    case BRAID_F64: return (r & 0x800fffffffffffffull) | ((uint64_t)(1016 + (r >> 56) % 16) << 52);
    case BRAID_F16: return ((r & 0x83ffu) | ((uint64_t)(8 + (r >> 20) % 16) << 10)) & 0xffff;
    case BRAID_BF16: return ((r & 0x807fu) | ((uint64_t)(120 + (r >> 20) % 16) << 7)) & 0xffff;
    case BRAID_I8:
    case BRAID_U8: return r % 16;
    case BRAID_I32: return (uint64_t)(int64_t)((int32_t)(r % 2001) - 1000) & 0xffffffffu;
    case BRAID_I64: return (uint64_t)((int64_t)(r % 2000001) - 1000000);
    case BRAID_U32: return r % 2001;
    case BRAID_U64: return r % 2000001;
    default: abort();
    }
}

static void fill(braid_dtype t, void *buf, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        uint64_t v;
        switch (rnd() % 4) {
        case 0: v = edge_value(t); break;
        case 1: v = rnd(); break;
        default: v = plain_value(t); break;
        }
        put_bits(t, buf, i, v);
    }
}

/* ---- harness ---------------------------------------------------------------- */

static const char *const dtype_names[] = {"f32", "f64", "f16", "bf16", "i8", "u8", "i32", "i64", "u32", "u64"};
static const char *const op_names[] = {"sum", "prod", "min", "max", "avg", "mulsum"};

static const size_t counts[] = {0, 1, 2, 3, 7, 8, 9, 15, 16, 17, 31, 32, 33, 63, 64, 65, 100, 1000, 4097};

/* Buffers with room for an element offset, so pointers are only
 * element-aligned (not vector-aligned). */
static void *xmalloc(size_t n)
{
    void *p = malloc(n ? n : 1);
    ck_assert_ptr_nonnull(p);
    return p;
}

enum alias { ALIAS_NONE, ALIAS_A, ALIAS_B };

static void check_elem(braid_dtype t, braid_op op, size_t i, uint64_t a, uint64_t b, uint64_t got,
                       int final, int nranks, const char *what)
{
    int nan_any;
    uint64_t want = ref_elem(t, op, a, b, final, nranks, &nan_any);
    if (got == want || (nan_any && is_nan_bits(t, got)))
        return;
    ck_abort_msg("%s %s %s%s [%s] elem %zu: a=0x%" PRIx64 " b=0x%" PRIx64 " got 0x%" PRIx64
                 " want 0x%" PRIx64 " (nranks %d)",
                 what, dtype_names[t], op_names[op], final ? " final" : "", braid__reduce_isa(), i, a,
                 b, got, want, nranks);
}

/* One call of braid__reduce or braid__reduce_final on n elements, checked. */
static void run_case(braid_dtype t, braid_op op, size_t n, enum alias alias, int final, int nranks,
                     size_t off)
{
    size_t es = dsize(t);
    unsigned char *abuf = xmalloc((n + 4) * es), *bbuf = xmalloc((n + 4) * es),
                  *dbuf = xmalloc((n + 4) * es);
    unsigned char *a = abuf + off * es, *b = bbuf + ((off + 1) % 4) * es, *d = dbuf + ((off + 3) % 4) * es;
    unsigned char *a0 = xmalloc(n * es), *b0 = xmalloc(n * es);
    fill(t, a, n);
    fill(t, b, n);
    memcpy(a0, a, n * es);
    memcpy(b0, b, n * es);
    void *dst = alias == ALIAS_A ? (void *)a : alias == ALIAS_B ? (void *)b : (void *)d;
    if (final)
        braid__reduce_final(t, op, dst, a, b, n, nranks);
    else
        braid__reduce(t, op, dst, a, b, n);
    for (size_t i = 0; i < n; i++)
        check_elem(t, op, i, get_bits(t, a0, i), get_bits(t, b0, i), get_bits(t, dst, i), final,
                   nranks, alias == ALIAS_A ? "dst==a" : alias == ALIAS_B ? "dst==b" : "reduce");
    if (alias != ALIAS_A)
        ck_assert_msg(memcmp(a, a0, n * es) == 0, "input a modified");
    if (alias != ALIAS_B)
        ck_assert_msg(memcmp(b, b0, n * es) == 0, "input b modified");
    free(abuf);
    free(bbuf);
    free(dbuf);
    free(a0);
    free(b0);
}

/* Loop index -> (dtype, op, isa): isa 0 scalar, 1 best (AVX2 when present). */
static void decode(int idx, braid_dtype *t, braid_op *op, int *isa)
{
    *isa = idx % 2;
    idx /= 2;
    *op = (braid_op)(idx % BRAID_OP_COUNT);
    *t = (braid_dtype)(idx / BRAID_OP_COUNT);
    braid__reduce_force_scalar(*isa == 0);
}
#define N_PAIRS_ISA (BRAID_DTYPE_COUNT * BRAID_OP_COUNT * 2)

START_TEST(test_combine_all)
{
    braid_dtype t;
    braid_op op;
    int isa;
    decode(_i, &t, &op, &isa);
    rng_state = 0x1234567ull + (uint64_t)_i * 7919;
    for (size_t c = 0; c < NELEM(counts); c++) {
        for (int alias = 0; alias < 3; alias++) {
            run_case(t, op, counts[c], (enum alias)alias, 0, 1, (c + alias) % 4);
            run_case(t, op, counts[c], (enum alias)alias, 1, 1 + (int)(c % 7), c % 4);
        }
    }
    run_case(t, op, 1000003, ALIAS_NONE, 0, 1, 1);
    run_case(t, op, 1000003, ALIAS_A, 1, 3, 3);
    /* group sizes for AVG: also beyond the range of the narrow types */
    const int nranks[] = {1, 2, 3, 7, 8, 127, 128, 255, 256, 1000, 65537};
    for (size_t k = 0; k < NELEM(nranks); k++)
        run_case(t, op, 333, ALIAS_NONE, 1, nranks[k], k % 4);
}
END_TEST

/* Scalar and vector kernels on the same inputs agree bit for bit (NaN
 * payloads of f32/f64 arithmetic aside, which are unspecified). */
START_TEST(test_scalar_vs_vector)
{
    braid_dtype t = (braid_dtype)(_i / BRAID_OP_COUNT);
    braid_op op = (braid_op)(_i % BRAID_OP_COUNT);
    if (!braid__reduce_has_avx2()) {
        fprintf(stderr, "no avx2+f16c on this cpu: vector kernels not compared\n");
        return;
    }
    size_t n = 100003, es = dsize(t);
    void *a = xmalloc(n * es), *b = xmalloc(n * es), *d0 = xmalloc(n * es), *d1 = xmalloc(n * es);
    rng_state = 0xabcdefull + (uint64_t)_i;
    fill(t, a, n);
    fill(t, b, n);
    for (int final = 0; final < 2; final++) {
        for (int scalar = 1; scalar >= 0; scalar--) {
            braid__reduce_force_scalar(scalar);
            if (final)
                braid__reduce_final(t, op, scalar ? d0 : d1, a, b, n, 5);
            else
                braid__reduce(t, op, scalar ? d0 : d1, a, b, n);
        }
        for (size_t i = 0; i < n; i++) {
            uint64_t x = get_bits(t, d0, i), y = get_bits(t, d1, i);
            int arith = op != BRAID_MIN && op != BRAID_MAX;
            if (x != y && !(arith && is_nan_bits(t, x) && is_nan_bits(t, y)))
                ck_abort_msg("%s %s elem %zu: scalar 0x%" PRIx64 " vector 0x%" PRIx64, dtype_names[t],
                             op_names[op], i, x, y);
        }
    }
    free(a);
    free(b);
    free(d0);
    free(d1);
}
END_TEST

START_TEST(test_scale)
{
    braid_dtype t = (braid_dtype)(_i / 2);
    braid__reduce_force_scalar(_i % 2 == 0);
    const int nranks[] = {1, 2, 3, 5, 8, 100, 256, 1000};
    rng_state = 0x5151ull + (uint64_t)_i;
    for (size_t c = 0; c < NELEM(counts); c++) {
        size_t n = counts[c], es = dsize(t);
        unsigned char *buf = xmalloc((n + 1) * es), *orig = xmalloc(n * es + 1);
        unsigned char *p = buf + (c % 2) * es;
        int nr = nranks[c % NELEM(nranks)];
        fill(t, p, n);
        memcpy(orig, p, n * es);
        /* other ops leave the buffer alone */
        braid__reduce_scale(t, BRAID_SUM, p, n, nr);
        braid__reduce_scale(t, BRAID_MAX, p, n, nr);
        ck_assert(memcmp(p, orig, n * es) == 0);
        braid__reduce_scale(t, BRAID_AVG, p, n, nr);
        for (size_t i = 0; i < n; i++) {
            int nan_any;
            uint64_t want = ref_scale(t, get_bits(t, orig, i), nr, &nan_any);
            uint64_t got = get_bits(t, p, i);
            if (got != want && !(nan_any && is_nan_bits(t, got)))
                ck_abort_msg("scale %s [%s] elem %zu of %zu: x=0x%" PRIx64 " /%d got 0x%" PRIx64
                             " want 0x%" PRIx64,
                             dtype_names[t], braid__reduce_isa(), i, n, get_bits(t, orig, i), nr, got,
                             want);
        }
        free(buf);
        free(orig);
    }
}
END_TEST

/* ---- fixed vectors: rounding ties, overflow, subnormals --------------------- */

struct vec16 {
    braid_dtype t;
    braid_op op;
    uint16_t a, b, want;
    int nranks; /* 0: braid__reduce; else braid__reduce_final */
};

static const struct vec16 vectors16[] = {
    {BRAID_F16, BRAID_SUM, 0x3c00, 0x3c00, 0x4000, 0},  /* 1 + 1 = 2 */
    {BRAID_F16, BRAID_SUM, 0x6800, 0x3c00, 0x6800, 0},  /* 2048 + 1 = 2049: tie -> 2048 (even) */
    {BRAID_F16, BRAID_SUM, 0x6801, 0x3c00, 0x6802, 0},  /* 2050 + 1 = 2051: tie -> 2052 (even) */
    {BRAID_F16, BRAID_SUM, 0x7bff, 0x4800, 0x7bff, 0},  /* 65504 + 8 = 65512 -> 65504 */
    {BRAID_F16, BRAID_SUM, 0x7bff, 0x4c00, 0x7c00, 0},  /* 65504 + 16 = 65520: tie -> inf */
    {BRAID_F16, BRAID_SUM, 0xfbff, 0xcc00, 0xfc00, 0},  /* -65520 -> -inf */
    {BRAID_F16, BRAID_SUM, 0x0001, 0x0001, 0x0002, 0},  /* subnormals add exactly */
    {BRAID_F16, BRAID_SUM, 0x03ff, 0x0001, 0x0400, 0},  /* into the smallest normal */
    {BRAID_F16, BRAID_SUM, 0x8000, 0x8000, 0x8000, 0},  /* -0 + -0 = -0 */
    {BRAID_F16, BRAID_SUM, 0x8000, 0x0000, 0x0000, 0},  /* -0 + 0 = +0 */
    {BRAID_F16, BRAID_SUM, 0x7c00, 0xfc00, 0x7e00, 0},  /* inf - inf = canonical NaN */
    {BRAID_F16, BRAID_SUM, 0xfe01, 0x3c00, 0x7e00, 0},  /* NaN payload and sign dropped */
    {BRAID_F16, BRAID_PROD, 0x0001, 0x3800, 0x0000, 0}, /* 2^-24 * 0.5 = 2^-25: tie -> 0 */
    {BRAID_F16, BRAID_PROD, 0x0003, 0x3800, 0x0002, 0}, /* 1.5 * 2^-24: tie -> 2 * 2^-24 */
    {BRAID_F16, BRAID_PROD, 0x0005, 0x3800, 0x0002, 0}, /* 2.5 * 2^-24: tie -> 2 * 2^-24 */
    {BRAID_F16, BRAID_MIN, 0x0000, 0x8000, 0x8000, 0},  /* min(+0, -0) = -0 */
    {BRAID_F16, BRAID_MIN, 0x8000, 0x0000, 0x8000, 0},
    {BRAID_F16, BRAID_MAX, 0x8000, 0x0000, 0x0000, 0},  /* max(-0, +0) = +0 */
    {BRAID_F16, BRAID_MAX, 0x0000, 0x8000, 0x0000, 0},
    {BRAID_F16, BRAID_MIN, 0x7e00, 0x3c00, 0x7e00, 0},  /* NaN propagates */
    {BRAID_F16, BRAID_MAX, 0x3c00, 0x7c01, 0x7e00, 0},  /* signalling NaN too */
    {BRAID_F16, BRAID_AVG, 0x3c00, 0x4000, 0x3c00, 3},  /* (1 + 2) / 3 = 1 */
    {BRAID_F16, BRAID_AVG, 0x3c00, 0x3c00, 0x3555, 6},  /* 2 / 6 -> 0.33325195 */
    {BRAID_F16, BRAID_AVG, 0x7bff, 0x7bff, 0x7bff, 2},  /* f32 sum does not overflow before the divide */
    {BRAID_BF16, BRAID_SUM, 0x4380, 0x3f80, 0x4380, 0}, /* 256 + 1 = 257: tie -> 256 */
    {BRAID_BF16, BRAID_SUM, 0x4381, 0x3f80, 0x4382, 0}, /* 258 + 1 = 259: tie -> 260 */
    {BRAID_BF16, BRAID_SUM, 0x7f7f, 0x7f7f, 0x7f80, 0}, /* max + max = inf */
    {BRAID_BF16, BRAID_SUM, 0x0001, 0x0001, 0x0002, 0}, /* subnormals */
    {BRAID_BF16, BRAID_SUM, 0x7f80, 0xff80, 0x7fc0, 0}, /* inf - inf = canonical NaN */
    {BRAID_BF16, BRAID_MIN, 0x0000, 0x8000, 0x8000, 0},
    {BRAID_BF16, BRAID_MAX, 0xffc1, 0x3f80, 0x7fc0, 0},
    {BRAID_BF16, BRAID_AVG, 0x3f80, 0x4000, 0x3f80, 3},
};

START_TEST(test_vectors16)
{
    braid__reduce_force_scalar(_i == 0);
    for (size_t k = 0; k < NELEM(vectors16); k++) {
        const struct vec16 *v = &vectors16[k];
        /* 37 copies: the vector body and the scalar tail both see it */
        uint16_t a[37], b[37], d[37];
        for (int i = 0; i < 37; i++) {
            a[i] = v->a;
            b[i] = v->b;
        }
        if (v->nranks)
            braid__reduce_final(v->t, v->op, d, a, b, 37, v->nranks);
        else
            braid__reduce(v->t, v->op, d, a, b, 37);
        for (int i = 0; i < 37; i++)
            ck_assert_msg(d[i] == v->want, "vector %zu (%s %s 0x%04x 0x%04x) [%s] elem %d: got 0x%04x want 0x%04x",
                          k, dtype_names[v->t], op_names[v->op], v->a, v->b, braid__reduce_isa(), i, d[i],
                          v->want);
        /* the reference agrees with the table, too */
        int nan_any;
        ck_assert_uint_eq(ref_elem(v->t, v->op, v->a, v->b, v->nranks != 0, v->nranks, &nan_any), v->want);
    }
}
END_TEST

START_TEST(test_int_vectors)
{
    braid__reduce_force_scalar(_i == 0);
    int8_t a8[40], b8[40], d8[40];
    int32_t a32[40], b32[40], d32[40];
    int64_t a64[40], b64[40], d64[40];
    uint8_t au[40], bu[40], du[40];
    for (int i = 0; i < 40; i++) {
        a8[i] = 127;
        b8[i] = 1;
        a32[i] = INT32_MAX;
        b32[i] = 1;
        a64[i] = INT64_MAX;
        b64[i] = 1;
        au[i] = 255;
        bu[i] = 2;
    }
    braid__reduce(BRAID_I8, BRAID_SUM, d8, a8, b8, 40);
    braid__reduce(BRAID_I32, BRAID_SUM, d32, a32, b32, 40);
    braid__reduce(BRAID_I64, BRAID_SUM, d64, a64, b64, 40);
    braid__reduce(BRAID_U8, BRAID_SUM, du, au, bu, 40);
    for (int i = 0; i < 40; i++) {
        ck_assert_int_eq(d8[i], INT8_MIN);
        ck_assert_int_eq(d32[i], INT32_MIN);
        ck_assert(d64[i] == INT64_MIN);
        ck_assert_uint_eq(du[i], 1);
    }
    braid__reduce(BRAID_U8, BRAID_PROD, du, au, au, 40); /* 255 * 255 = 65025 = 0xfe01 */
    braid__reduce(BRAID_I64, BRAID_PROD, d64, a64, a64, 40); /* (2^63-1)^2 mod 2^64 = 1 */
    for (int i = 0; i < 40; i++) {
        ck_assert_uint_eq(du[i], 0x01);
        ck_assert(d64[i] == 1);
    }
    /* AVG truncates toward zero: (-7 + 0) / 2 = -3, and u8 255+255 wraps first */
    for (int i = 0; i < 40; i++) {
        a32[i] = -7;
        b32[i] = 0;
        au[i] = 255;
    }
    braid__reduce_final(BRAID_I32, BRAID_AVG, d32, a32, b32, 40, 2);
    braid__reduce_final(BRAID_U8, BRAID_AVG, du, au, au, 40, 2);
    for (int i = 0; i < 40; i++) {
        ck_assert_int_eq(d32[i], -3);
        ck_assert_uint_eq(du[i], 127); /* (510 mod 256) / 2 = 254 / 2 */
    }
}
END_TEST

START_TEST(test_count_zero)
{
    braid__reduce_force_scalar(_i == 0);
    for (int t = 0; t < BRAID_DTYPE_COUNT; t++)
        for (int op = 0; op < BRAID_OP_COUNT; op++) {
            braid__reduce((braid_dtype)t, (braid_op)op, NULL, NULL, NULL, 0);
            braid__reduce_final((braid_dtype)t, (braid_op)op, NULL, NULL, NULL, 0, 4);
            braid__reduce_scale((braid_dtype)t, (braid_op)op, NULL, 0, 4);
        }
    braid__cast(BRAID_F16, NULL, BRAID_F32, NULL, 0);
}
END_TEST

/* ---- conversions -------------------------------------------------------------- */

static void check_f32_to_half(braid_dtype t, const float *src, size_t n)
{
    uint16_t *d = xmalloc(n * 2 + 2);
    uint16_t *dd = d + 1; /* unaligned by one element */
    braid__cast(t, dd, BRAID_F32, src, n);
    for (size_t i = 0; i < n; i++) {
        uint16_t want = t == BRAID_F16 ? ref_f32_to_f16(src[i]) : ref_f32_to_bf16(src[i]);
        if (dd[i] != want)
            ck_abort_msg("cast f32 0x%08x -> %s [%s]: got 0x%04x want 0x%04x", f32_bits(src[i]),
                         dtype_names[t], braid__reduce_isa(), dd[i], want);
    }
    free(d);
}

/* Every f32 exponent and top mantissa bits, with the low (rounded-off)
 * bits set to exact, just-below-tie, tie, just-above-tie and random. */
START_TEST(test_cast_f32_to_half)
{
    braid_dtype t = _i / 2 ? BRAID_BF16 : BRAID_F16;
    braid__reduce_force_scalar(_i % 2 == 0);
    int lowbits = t == BRAID_F16 ? 13 : 16;
    uint32_t half = 1u << (lowbits - 1);
    const uint32_t lows[] = {0, half - 1, half, half + 1, (1u << lowbits) - 1};
    size_t chunk = 1 << 16;
    float *src = xmalloc((chunk + 1) * sizeof(float));
    rng_state = 0x77ull + (uint64_t)_i;
    for (uint64_t top = 0; top < (1ull << (32 - lowbits)); top += chunk / 8) {
        size_t n = 0;
        for (uint64_t h = top; h < top + chunk / 8 && h < (1ull << (32 - lowbits)); h++) {
            for (size_t k = 0; k < NELEM(lows); k++)
                src[n++] = bits_f32((uint32_t)(h << lowbits) | lows[k]);
            src[n++] = bits_f32((uint32_t)(h << lowbits) | (uint32_t)(rnd() & ((1u << lowbits) - 1)));
            src[n++] = bits_f32((uint32_t)rnd());
            src[n++] = bits_f32((uint32_t)(h << lowbits) | (uint32_t)(rnd() & ((1u << lowbits) - 1)));
        }
        check_f32_to_half(t, src, n);
    }
    /* named values */
    const struct { float f; uint16_t h; } f16v[] = {
        {1.0f, 0x3c00}, {-2.0f, 0xc000}, {65504.0f, 0x7bff}, {65519.996f, 0x7bff}, {65520.0f, 0x7c00},
        {2049.0f, 0x6800}, {2051.0f, 0x6802}, {0x1p-24f, 0x0001}, {0x1p-25f, 0x0000},
        {0x1.000002p-25f, 0x0001}, {0x1.8p-24f, 0x0002}, {0x1p-14f, 0x0400}, {-0.0f, 0x8000},
        {INFINITY, 0x7c00}, {-INFINITY, 0xfc00}, {NAN, 0x7e00}, {0x1.ffcp-15f, 0x0400},
    };
    if (t == BRAID_F16) {
        for (size_t k = 0; k < NELEM(f16v); k++) {
            uint16_t h[9];
            float s[9];
            for (int i = 0; i < 9; i++)
                s[i] = f16v[k].f;
            braid__cast(BRAID_F16, h, BRAID_F32, s, 9);
            for (int i = 0; i < 9; i++)
                ck_assert_msg(h[i] == f16v[k].h, "%a -> 0x%04x, want 0x%04x", (double)f16v[k].f, h[i],
                              f16v[k].h);
        }
    }
    free(src);
}
END_TEST

/* All 65536 f16/bf16 values widen exactly (NaN: quieted, payload kept). */
START_TEST(test_cast_half_to_f32)
{
    braid_dtype t = _i / 2 ? BRAID_BF16 : BRAID_F16;
    braid__reduce_force_scalar(_i % 2 == 0);
    uint16_t *src = xmalloc(65537 * 2);
    float *dst = xmalloc(65537 * 4);
    for (uint32_t h = 0; h < 65536; h++)
        src[h + 1] = (uint16_t)h;
    braid__cast(BRAID_F32, dst + 1, t, src + 1, 65536);
    for (uint32_t h = 0; h < 65536; h++) {
        float want = t == BRAID_F16 ? ref_f16_to_f32((uint16_t)h) : ref_bf16_to_f32((uint16_t)h);
        ck_assert_msg(f32_bits(dst[h + 1]) == f32_bits(want), "%s 0x%04x -> 0x%08x, want 0x%08x [%s]",
                      dtype_names[t], h, f32_bits(dst[h + 1]), f32_bits(want), braid__reduce_isa());
    }
    ck_assert(f32_bits(ref_f16_to_f32(0x3c00)) == 0x3f800000);
    ck_assert(ref_f16_to_f32(0x7bff) == 65504.0f);
    ck_assert(ref_f16_to_f32(0x0001) == 0x1p-24f);
    /* f16 <-> bf16 round once through the exact f32 value */
    uint16_t *back = xmalloc(65537 * 2);
    braid_dtype other = t == BRAID_F16 ? BRAID_BF16 : BRAID_F16;
    braid__cast(other, back + 1, t, src + 1, 65536);
    for (uint32_t h = 0; h < 65536; h++) {
        float v = t == BRAID_F16 ? ref_f16_to_f32((uint16_t)h) : ref_bf16_to_f32((uint16_t)h);
        uint16_t want = other == BRAID_F16 ? ref_f32_to_f16(v) : ref_f32_to_bf16(v);
        ck_assert_msg(back[h + 1] == want, "%s 0x%04x -> %s 0x%04x, want 0x%04x", dtype_names[t], h,
                      dtype_names[other], back[h + 1], want);
    }
    free(src);
    free(dst);
    free(back);
}
END_TEST

START_TEST(test_cast_misc)
{
    braid__reduce_force_scalar(_i == 0);
    double d[33];
    float f[33], f2[33];
    for (int i = 0; i < 33; i++)
        f[i] = bits_f32((uint32_t)rnd());
    braid__cast(BRAID_F64, d, BRAID_F32, f, 33);
    braid__cast(BRAID_F32, f2, BRAID_F64, d, 33);
    for (int i = 0; i < 33; i++) {
        ck_assert(isnan(f[i]) ? isnan(d[i]) : d[i] == (double)f[i]);
        ck_assert(isnan(f[i]) ? isnan(f2[i]) : f32_bits(f2[i]) == f32_bits(f[i]));
    }
    /* same type is a copy, in place allowed */
    braid__cast(BRAID_F32, f2, BRAID_F32, f, 33);
    ck_assert(memcmp(f2, f, sizeof(f)) == 0);
    braid__cast(BRAID_F32, f2, BRAID_F32, f2, 33);
    ck_assert(memcmp(f2, f, sizeof(f)) == 0);
    ck_assert(braid__cast_supported(BRAID_F16, BRAID_F32));
    ck_assert(braid__cast_supported(BRAID_I32, BRAID_I32));
    ck_assert(!braid__cast_supported(BRAID_F16, BRAID_F64));
    ck_assert(!braid__cast_supported(BRAID_I32, BRAID_F32));
}
END_TEST

START_TEST(test_isa_name)
{
    braid__reduce_force_scalar(1);
    ck_assert_str_eq(braid__reduce_isa(), "scalar");
    braid__reduce_force_scalar(0);
    if (braid__reduce_has_avx2())
        ck_assert_str_eq(braid__reduce_isa(), "avx2+f16c");
    else
        ck_assert_str_eq(braid__reduce_isa(), "scalar");
    fprintf(stderr, "reduce kernels on this cpu: %s\n", braid__reduce_isa());
}
END_TEST

/* Buffers at odd byte addresses (a float at address 1 mod 4): every kernel
 * gives the same bits as on aligned copies of the same data, and under
 * UBSan (the sanitizer build halts on any report) no load or store is
 * misaligned. _i: 0 scalar kernels, 1 the best the CPU has. */
START_TEST(test_misaligned)
{
    braid__reduce_force_scalar(_i == 0);
    const size_t ns[] = {1, 7, 37, 1000};
    for (int t = 0; t < BRAID_DTYPE_COUNT; t++) {
        size_t es = dsize((braid_dtype)t);
        for (size_t k = 0; k < NELEM(ns); k++) {
            size_t n = ns[k], bytes = n * es;
            /* dst room for twice the bytes: a cast may widen (f32 -> f64) */
            unsigned char *raw = xmalloc(4 * bytes + 16), *al = xmalloc(4 * bytes + 16);
            unsigned char *a = raw + 1, *b = a + bytes + 1, *d = b + bytes + 1; /* odd offsets */
            unsigned char *aa = al, *ab = al + bytes, *ad = al + 2 * bytes; /* malloc-aligned */
            rng_state = 0x5eedull + (uint64_t)(t * 16 + (int)k);
            fill((braid_dtype)t, aa, n);
            fill((braid_dtype)t, ab, n);
            for (int op = 0; op < BRAID_OP_COUNT; op++) {
                for (int final = 0; final < 2; final++) {
                    memcpy(a, aa, bytes);
                    memcpy(b, ab, bytes);
                    if (final) {
                        braid__reduce_final((braid_dtype)t, (braid_op)op, ad, aa, ab, n, 3);
                        braid__reduce_final((braid_dtype)t, (braid_op)op, d, a, b, n, 3);
                    } else {
                        braid__reduce((braid_dtype)t, (braid_op)op, ad, aa, ab, n);
                        braid__reduce((braid_dtype)t, (braid_op)op, d, a, b, n);
                    }
                    ck_assert_msg(memcmp(d, ad, bytes) == 0, "%s %s%s n=%zu [%s]: misaligned result differs",
                                  dtype_names[t], op_names[op], final ? " final" : "", n, braid__reduce_isa());
                    /* in place, dst == a */
                    braid__reduce((braid_dtype)t, (braid_op)op, a, a, b, n);
                    braid__reduce((braid_dtype)t, (braid_op)op, ad, aa, ab, n);
                    ck_assert_msg(memcmp(a, ad, bytes) == 0, "%s %s n=%zu [%s]: misaligned in-place differs",
                                  dtype_names[t], op_names[op], n, braid__reduce_isa());
                }
                memcpy(d, aa, bytes);
                memcpy(ad, aa, bytes);
                braid__reduce_scale((braid_dtype)t, (braid_op)op, d, n, 7);
                braid__reduce_scale((braid_dtype)t, (braid_op)op, ad, n, 7);
                ck_assert_msg(memcmp(d, ad, bytes) == 0, "%s %s scale n=%zu: misaligned differs", dtype_names[t],
                              op_names[op], n);
            }
            /* casts between every supported pair */
            for (int u = 0; u < BRAID_DTYPE_COUNT; u++) {
                if (!braid__cast_supported((braid_dtype)u, (braid_dtype)t))
                    continue;
                memcpy(a, aa, bytes);
                braid__cast((braid_dtype)u, ad, (braid_dtype)t, aa, n);
                braid__cast((braid_dtype)u, d, (braid_dtype)t, a, n);
                ck_assert_msg(memcmp(d, ad, n * dsize((braid_dtype)u)) == 0, "cast %s -> %s n=%zu: misaligned differs",
                              dtype_names[t], dtype_names[u], n);
            }
            free(raw);
            free(al);
        }
    }
}
END_TEST

static Suite *reduce_suite(void)
{
    Suite *s = suite_create("reduce");
    TCase *tc = tcase_create("combine");
    tcase_set_timeout(tc, 120);
    tcase_add_loop_test(tc, test_combine_all, 0, N_PAIRS_ISA);
    tcase_add_loop_test(tc, test_scalar_vs_vector, 0, BRAID_DTYPE_COUNT * BRAID_OP_COUNT);
    tcase_add_loop_test(tc, test_scale, 0, BRAID_DTYPE_COUNT * 2);
    tcase_add_loop_test(tc, test_vectors16, 0, 2);
    tcase_add_loop_test(tc, test_int_vectors, 0, 2);
    tcase_add_loop_test(tc, test_count_zero, 0, 2);
    tcase_add_test(tc, test_isa_name);
    tcase_add_loop_test(tc, test_misaligned, 0, 2);
    suite_add_tcase(s, tc);

    TCase *cast = tcase_create("cast");
    tcase_set_timeout(cast, 120);
    tcase_add_loop_test(cast, test_cast_f32_to_half, 0, 4);
    tcase_add_loop_test(cast, test_cast_half_to_f32, 0, 4);
    tcase_add_loop_test(cast, test_cast_misc, 0, 2);
    suite_add_tcase(s, cast);
    return s;
}

int main(void)
{
    /* the reference relies on nearbyint ties-to-even */
    fesetround(FE_TONEAREST);
    SRunner *sr = srunner_create(reduce_suite());
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
