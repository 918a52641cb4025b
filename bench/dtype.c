/* Element types for braid-bench: nccl-tests' names and exact codecs.
 *
 * The benchmark links only the public API, so it carries its own half and
 * bfloat16 conversions (round to nearest even, like the library promises).
 * Verification compares decoded values, so these must be exact for every
 * value the patterns produce. */
#include <math.h>
#include <stdint.h>
#include <string.h>
#include <strings.h>

#include "bench.h"

static const char *const type_names[BRAID_DTYPE_COUNT] = {
    [BRAID_F32] = "float", [BRAID_F64] = "double", [BRAID_F16] = "half",  [BRAID_BF16] = "bfloat16",
    [BRAID_I8] = "int8",   [BRAID_U8] = "uint8",   [BRAID_I32] = "int32", [BRAID_I64] = "int64",
    [BRAID_U32] = "uint32", [BRAID_U64] = "uint64",
};

static const char *const op_names[BRAID_OP_COUNT] = {
    [BRAID_SUM] = "sum", [BRAID_PROD] = "prod", [BRAID_MIN] = "min", [BRAID_MAX] = "max", [BRAID_AVG] = "avg",
    [BRAID_MULSUM] = "mulsum",
};

/* Spellings people type besides nccl-tests' own. */
static const struct {
    const char *alias;
    braid_dtype dtype;
} type_aliases[] = {
    {"f32", BRAID_F32},  {"fp32", BRAID_F32},  {"float32", BRAID_F32}, {"f64", BRAID_F64},
    {"fp64", BRAID_F64}, {"float64", BRAID_F64}, {"f16", BRAID_F16},   {"fp16", BRAID_F16},
    {"float16", BRAID_F16}, {"bf16", BRAID_BF16}, {"i8", BRAID_I8},    {"u8", BRAID_U8},
    {"i32", BRAID_I32},  {"int", BRAID_I32},   {"i64", BRAID_I64},     {"char", BRAID_I8},
    {"u32", BRAID_U32},  {"u64", BRAID_U64},
};

const char *bench_type_name(braid_dtype dtype)
{
    return (unsigned)dtype < BRAID_DTYPE_COUNT ? type_names[dtype] : "?";
}

const char *bench_op_name(braid_op op)
{
    return (unsigned)op < BRAID_OP_COUNT ? op_names[op] : "?";
}

int bench_type_from_name(const char *name, braid_dtype *dtype)
{
    for (int t = 0; t < BRAID_DTYPE_COUNT; t++) {
        if (strcasecmp(name, type_names[t]) == 0) {
            *dtype = (braid_dtype)t;
            return 0;
        }
    }
    for (size_t i = 0; i < sizeof(type_aliases) / sizeof(type_aliases[0]); i++) {
        if (strcasecmp(name, type_aliases[i].alias) == 0) {
            *dtype = type_aliases[i].dtype;
            return 0;
        }
    }
    return -1;
}

int bench_op_from_name(const char *name, braid_op *op)
{
    for (int o = 0; o < BRAID_OP_COUNT; o++) {
        if (strcasecmp(name, op_names[o]) == 0) {
            *op = (braid_op)o;
            return 0;
        }
    }
    return -1;
}

int bench_type_is_float(braid_dtype dtype)
{
    return dtype == BRAID_F32 || dtype == BRAID_F64 || dtype == BRAID_F16 || dtype == BRAID_BF16;
}

int bench_type_is_signed(braid_dtype dtype)
{
    return dtype != BRAID_U8 && dtype != BRAID_U32 && dtype != BRAID_U64;
}

static uint16_t f32_to_f16(float f)
{
    uint32_t x;
    memcpy(&x, &f, sizeof(x));
    uint32_t sign = (x >> 16) & 0x8000u;
    uint32_t exp = (x >> 23) & 0xffu;
    uint32_t mant = x & 0x7fffffu;
    if (exp == 0xffu)
        return (uint16_t)(sign | 0x7c00u | (mant ? 0x200u : 0));
    int e = (int)exp - 127 + 15;
    if (e >= 31)
        return (uint16_t)(sign | 0x7c00u);
    if (e <= 0) {
        /* Subnormal half: shift the full 24-bit significand into place and
         * round the dropped bits to nearest even. */
        if (e < -10)
            return (uint16_t)sign;
        mant |= 0x800000u;
        int shift = 14 - e;
        uint32_t m = mant >> shift;
        uint32_t rem = mant & ((1u << shift) - 1);
        uint32_t halfway = 1u << (shift - 1);
        if (rem > halfway || (rem == halfway && (m & 1u)))
            m++;
        return (uint16_t)(sign | m);
    }
    uint32_t h = sign | ((uint32_t)e << 10) | (mant >> 13);
    uint32_t rem = mant & 0x1fffu;
    /* A carry out of the mantissa correctly bumps the exponent (to inf at
     * the top). */
    if (rem > 0x1000u || (rem == 0x1000u && (h & 1u)))
        h++;
    return (uint16_t)h;
}

static float f16_to_f32(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t exp = (h >> 10) & 0x1fu;
    uint32_t mant = h & 0x3ffu;
    uint32_t x;
    if (exp == 0) {
        if (mant == 0) {
            x = sign;
        } else {
            /* Renormalize a subnormal half into a normal float. */
            int e = 127 - 15 + 1;
            while (!(mant & 0x400u)) {
                mant <<= 1;
                e--;
            }
            x = sign | ((uint32_t)e << 23) | ((mant & 0x3ffu) << 13);
        }
    } else if (exp == 31) {
        x = sign | 0x7f800000u | (mant << 13);
    } else {
        x = sign | ((exp + 112) << 23) | (mant << 13);
    }
    float f;
    memcpy(&f, &x, sizeof(f));
    return f;
}

static uint16_t f32_to_bf16(float f)
{
    uint32_t x;
    memcpy(&x, &f, sizeof(x));
    if ((x & 0x7fffffffu) > 0x7f800000u)
        return (uint16_t)((x >> 16) | 0x40u); /* quiet NaN */
    x += 0x7fffu + ((x >> 16) & 1u);
    return (uint16_t)(x >> 16);
}

static float bf16_to_f32(uint16_t b)
{
    uint32_t x = (uint32_t)b << 16;
    float f;
    memcpy(&f, &x, sizeof(f));
    return f;
}

/* Integer values are taken modulo 2^64 first, so wrapping matches what
 * two's-complement arithmetic in the element type produces. */
static uint64_t to_u64_wrap(double value)
{
    if (value < 0)
        return (uint64_t)0 - (uint64_t)(-value);
    return (uint64_t)value;
}

void bench_encode(braid_dtype dtype, double value, void *dst)
{
    switch (dtype) {
    case BRAID_F32: {
        float f = (float)value;
        memcpy(dst, &f, sizeof(f));
        break;
    }
    case BRAID_F64:
        memcpy(dst, &value, sizeof(value));
        break;
    case BRAID_F16: {
        /* Every pattern value is exact in float, so the double rounding
         * through float cannot differ from a direct conversion. */
        uint16_t h = f32_to_f16((float)value);
        memcpy(dst, &h, sizeof(h));
        break;
    }
    case BRAID_BF16: {
        uint16_t b = f32_to_bf16((float)value);
        memcpy(dst, &b, sizeof(b));
        break;
    }
    case BRAID_I8:
    case BRAID_U8: {
        uint8_t v = (uint8_t)to_u64_wrap(value);
        memcpy(dst, &v, sizeof(v));
        break;
    }
    case BRAID_I32:
    case BRAID_U32: {
        uint32_t v = (uint32_t)to_u64_wrap(value);
        memcpy(dst, &v, sizeof(v));
        break;
    }
    case BRAID_I64:
    case BRAID_U64: {
        uint64_t v = to_u64_wrap(value);
        memcpy(dst, &v, sizeof(v));
        break;
    }
    default:
        break;
    }
}

void bench_encode_bits(braid_dtype dtype, uint64_t bits, void *dst)
{
    switch (dtype) {
    case BRAID_I8:
    case BRAID_U8: {
        uint8_t v = (uint8_t)bits;
        memcpy(dst, &v, sizeof(v));
        break;
    }
    case BRAID_I32:
    case BRAID_U32: {
        uint32_t v = (uint32_t)bits;
        memcpy(dst, &v, sizeof(v));
        break;
    }
    case BRAID_I64:
    case BRAID_U64:
        memcpy(dst, &bits, sizeof(bits));
        break;
    default:
        break;
    }
}

double bench_decode(braid_dtype dtype, const void *src)
{
    switch (dtype) {
    case BRAID_F32: {
        float f;
        memcpy(&f, src, sizeof(f));
        return f;
    }
    case BRAID_F64: {
        double d;
        memcpy(&d, src, sizeof(d));
        return d;
    }
    case BRAID_F16: {
        uint16_t h;
        memcpy(&h, src, sizeof(h));
        return f16_to_f32(h);
    }
    case BRAID_BF16: {
        uint16_t b;
        memcpy(&b, src, sizeof(b));
        return bf16_to_f32(b);
    }
    case BRAID_I8: {
        int8_t v;
        memcpy(&v, src, sizeof(v));
        return v;
    }
    case BRAID_U8: {
        uint8_t v;
        memcpy(&v, src, sizeof(v));
        return v;
    }
    case BRAID_I32: {
        int32_t v;
        memcpy(&v, src, sizeof(v));
        return v;
    }
    case BRAID_I64: {
        int64_t v;
        memcpy(&v, src, sizeof(v));
        return (double)v;
    }
    case BRAID_U32: {
        uint32_t v;
        memcpy(&v, src, sizeof(v));
        return v;
    }
    case BRAID_U64: {
        uint64_t v;
        memcpy(&v, src, sizeof(v));
        return (double)v;
    }
    default:
        return NAN;
    }
}
