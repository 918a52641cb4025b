/* Verifiable data for braid-bench (-c 1).
 *
 * Like nccl-tests, every rank fills its input with values that depend on the
 * rank and the element index, chosen so that the reduction is exact in the
 * element type whatever order the algorithm adds them in: small integers
 * whose partial sums stay below the type's exact-integer limit, products of
 * at most a few 2s and -1s, and for avg a pattern whose sum is a multiple of
 * the group size, and for mulsum (whose per-rank scalar is nccl-tests':
 * 1 on even ranks, 2 on odd ones) sum values small enough that the doubled
 * ones stay exact. Results can then be compared for equality, so a single
 * misplaced chunk or a missing rank shows up in #wrong.
 *
 * Values repeat with a prime period, so the expected result is a table of
 * PERIOD entries built once (O(PERIOD * nranks)) rather than per element;
 * the period is prime so that chunk offsets, which are powers of two, never
 * line a misplaced chunk up with identical data. */
#include <stdlib.h>
#include <string.h>

#include "bench.h"

#define PERIOD 1031

struct bench_pattern {
    braid_dtype dtype;
    size_t esize;
    unsigned char *input;  /* reductions: this rank's input, PERIOD elements */
    unsigned char *expect; /* reductions: expected result, PERIOD elements */
    unsigned char *source; /* moves: every rank's data, nranks x PERIOD elements */
    unsigned char *junk;   /* differs from every expected value */
};

/* Well-mixed 32-bit hash of three words (splitmix64 finalizer). */
static uint32_t mix(uint32_t a, uint32_t b, uint32_t c)
{
    uint64_t x = (uint64_t)a * 0x9E3779B97F4A7C15ull;
    x ^= ((uint64_t)b + 1) * 0xC2B2AE3D27D4EB4Full;
    x ^= ((uint64_t)c + 7) * 0x165667B19E3779F9ull;
    x ^= x >> 30;
    x *= 0xBF58476D1CE4E5B9ull;
    x ^= x >> 27;
    x *= 0x94D049BB133111EBull;
    x ^= x >> 31;
    return (uint32_t)x;
}

/* Largest integer magnitude below which every integer is exact. */
static long long exact_limit(braid_dtype dtype)
{
    switch (dtype) {
    case BRAID_F16:
        return 2048;
    case BRAID_BF16:
        return 256;
    case BRAID_F32:
        return 1ll << 24;
    case BRAID_F64:
        return 1ll << 53;
    default:
        return 1ll << 62; /* integers wrap exactly: no limit */
    }
}

int bench_premul_scalar(int rank)
{
    return rank % 2 == 0 ? 1 : 2; /* nccl-tests' ncclVerifiablePremulScalar */
}

static long long clampll(long long v, long long lo, long long hi)
{
    return v < lo ? lo : (v > hi ? hi : v);
}

/* Input value of element j on rank r for an all-reduce with op. */
static long long allreduce_value(braid_dtype dtype, braid_op op, int r, int n, uint32_t j, uint32_t seed)
{
    int sgn = bench_type_is_signed(dtype);
    long long lim = exact_limit(dtype);
    uint32_t h = mix(j, (uint32_t)r, seed);
    switch (op) {
    case BRAID_SUM:
    case BRAID_MULSUM: {
        /* |partial sums| <= n * b <= lim (mulsum: each term at most doubled) */
        long long b = clampll(lim / n / (op == BRAID_MULSUM ? 2 : 1), 1, 4);
        long long v = (long long)(h % (uint32_t)(2 * b + 1));
        return sgn ? v - b : v;
    }
    case BRAID_PROD: {
        /* At most one factor 2 per rank, and only on the first kmax ranks,
         * so the product stays finite (half tops out at 65504). */
        int kmax = dtype == BRAID_F16 ? 14 : (dtype == BRAID_BF16 || dtype == BRAID_F32) ? 120 : n;
        uint32_t t = h % 4;
        if (t == 0 && r < kmax)
            return 2;
        if (t == 1 && sgn)
            return -1;
        return 1;
    }
    case BRAID_MIN:
    case BRAID_MAX: {
        long long v = (long long)(h % 11);
        return sgn ? v - 5 : v;
    }
    case BRAID_AVG: {
        /* base + a deviation that cancels within each pair of ranks, so the
         * sum is exactly n * base and avg is exact for floats and integers. */
        uint32_t hb = mix(j, 0xffffffffu, seed);
        int small = 4ll * n > lim; /* keep partial sums exact for big groups */
        long long base = small ? 1 : (sgn ? (long long)(hb % 5) - 2 : 2 + (long long)(hb % 3));
        if (small)
            return base;
        int pair = r / 2;
        long long dev = (long long)(mix(j, (uint32_t)pair + 0x10000u, seed) % 3);
        if (r % 2 == 0)
            return r + 1 < n ? base + dev : base;
        return base - dev;
    }
    default:
        return 0;
    }
}

/* Value of element j of source rank src's data, for the collectives that
 * move data: within [-100, 100] (signed) or [0, 200], exact in every dtype. */
static long long source_value(braid_dtype dtype, int src, uint32_t j, uint32_t seed)
{
    long long v = (long long)(mix(j, (uint32_t)src, seed) % 201);
    return bench_type_is_signed(dtype) ? v - 100 : v;
}

/* Wrap a 64-bit two's-complement value to the width of dtype, signed or
 * not, the way arithmetic in that type would. */
static int64_t wrap_int(braid_dtype dtype, uint64_t bits)
{
    switch (dtype) {
    case BRAID_I8:
        return (int8_t)(uint8_t)bits;
    case BRAID_U8:
        return (uint8_t)bits;
    case BRAID_I32:
        return (int32_t)(uint32_t)bits;
    case BRAID_U32:
        return (uint32_t)bits;
    default:
        return (int64_t)bits;
    }
}

/* Expected integer result: SUM and PROD are exact modulo 2^bits in any
 * order, AVG divides the wrapped sum (truncating, as braid.h specifies). */
static uint64_t expected_int(braid_dtype dtype, braid_op op, const long long *vals, int n)
{
    uint64_t acc = op == BRAID_MULSUM ? (uint64_t)vals[0] * (uint64_t)bench_premul_scalar(0) : (uint64_t)vals[0];
    long long mn = vals[0], mx = vals[0];
    for (int r = 1; r < n; r++) {
        if (op == BRAID_PROD)
            acc *= (uint64_t)vals[r];
        else if (op == BRAID_MULSUM)
            acc += (uint64_t)vals[r] * (uint64_t)bench_premul_scalar(r);
        else
            acc += (uint64_t)vals[r];
        mn = vals[r] < mn ? vals[r] : mn;
        mx = vals[r] > mx ? vals[r] : mx;
    }
    switch (op) {
    case BRAID_MIN:
        return (uint64_t)mn;
    case BRAID_MAX:
        return (uint64_t)mx;
    case BRAID_AVG:
        if (dtype == BRAID_U64)
            return acc / (uint64_t)n;
        return (uint64_t)(wrap_int(dtype, acc) / n);
    default:
        return acc;
    }
}

static double expected_float(braid_op op, const long long *vals, int n)
{
    double acc = (double)vals[0], mn = acc, mx = acc;
    if (op == BRAID_MULSUM)
        acc *= bench_premul_scalar(0);
    for (int r = 1; r < n; r++) {
        double v = (double)vals[r];
        if (op == BRAID_MULSUM)
            acc += v * bench_premul_scalar(r);
        else
            acc = op == BRAID_PROD ? acc * v : acc + v;
        mn = v < mn ? v : mn;
        mx = v > mx ? v : mx;
    }
    switch (op) {
    case BRAID_MIN:
        return mn;
    case BRAID_MAX:
        return mx;
    case BRAID_AVG:
        return acc / n; /* exact: the pattern's sum is a multiple of n */
    default:
        return acc;
    }
}

/* The tables of a reduction: this rank's input, the result, and junk that
 * differs from the result element by element. */
static void reduction_tables(bench_pattern *pat, braid_op op, int rank, int nranks, uint32_t seed, long long *vals)
{
    int is_float = bench_type_is_float(pat->dtype);
    for (uint32_t j = 0; j < PERIOD; j++) {
        unsigned char *in = pat->input + j * pat->esize;
        unsigned char *ex = pat->expect + j * pat->esize;
        unsigned char *jk = pat->junk + j * pat->esize;
        for (int r = 0; r < nranks; r++)
            vals[r] = allreduce_value(pat->dtype, op, r, nranks, j, seed);
        bench_encode(pat->dtype, (double)vals[rank], in);
        if (is_float) {
            double e = expected_float(op, vals, nranks);
            bench_encode(pat->dtype, e, ex);
            /* -e-3 never rounds back to e, and -inf differs from inf. */
            bench_encode(pat->dtype, -e - 3, jk);
        } else {
            uint64_t e = expected_int(pat->dtype, op, vals, nranks);
            bench_encode_bits(pat->dtype, e, ex);
            bench_encode_bits(pat->dtype, ~e - 2, jk); /* -e-3: odd offset, never e mod 2^k */
        }
    }
}

/* The tables of a data movement: every rank's data, and junk outside
 * their range (117 or 233: exact in every dtype, bfloat16's 8 bits too). */
static void source_tables(bench_pattern *pat, int nranks, uint32_t seed)
{
    double junk = bench_type_is_signed(pat->dtype) ? 117 : 233;
    for (int r = 0; r < nranks; r++)
        for (uint32_t j = 0; j < PERIOD; j++)
            bench_encode(pat->dtype, (double)source_value(pat->dtype, r, j, seed),
                         pat->source + ((size_t)r * PERIOD + j) * pat->esize);
    for (uint32_t j = 0; j < PERIOD; j++)
        bench_encode(pat->dtype, junk, pat->junk + j * pat->esize);
}

int bench_pattern_create(bench_pattern **out, int reduction, braid_dtype dtype, braid_op op, int rank, int nranks,
                         uint32_t seed)
{
    bench_pattern *pat = calloc(1, sizeof(*pat));
    long long *vals = calloc((size_t)nranks, sizeof(*vals));
    if (!pat || !vals)
        goto err_free;
    pat->dtype = dtype;
    pat->esize = braid_dtype_size(dtype);
    pat->junk = malloc(PERIOD * pat->esize);
    if (!pat->junk)
        goto err_free;
    if (reduction) {
        pat->input = malloc(PERIOD * pat->esize);
        pat->expect = malloc(PERIOD * pat->esize);
        if (!pat->input || !pat->expect)
            goto err_free;
        reduction_tables(pat, op, rank, nranks, seed, vals);
    } else {
        pat->source = malloc((size_t)nranks * PERIOD * pat->esize);
        if (!pat->source)
            goto err_free;
        source_tables(pat, nranks, seed);
    }
    free(vals);
    *out = pat;
    return 0;

err_free:
    free(vals);
    bench_pattern_destroy(pat);
    return -1;
}

void bench_pattern_destroy(bench_pattern *pat)
{
    if (!pat)
        return;
    free(pat->input);
    free(pat->expect);
    free(pat->source);
    free(pat->junk);
    free(pat);
}

/* Copy elements [start, start + count) of a periodic table to buf. */
static void fill_repeat(const unsigned char *table, size_t esize, size_t start, void *buf, size_t count)
{
    unsigned char *dst = buf;
    size_t at = start % PERIOD;
    for (size_t i = 0; i < count;) {
        size_t n = PERIOD - at < count - i ? PERIOD - at : count - i;
        memcpy(dst + i * esize, table + at * esize, n * esize);
        i += n;
        at = 0;
    }
}

void bench_pattern_fill_input(const bench_pattern *pat, void *buf, size_t start, size_t count)
{
    fill_repeat(pat->input, pat->esize, start, buf, count);
}

void bench_pattern_fill_source(const bench_pattern *pat, int src, void *buf, size_t start, size_t count)
{
    fill_repeat(pat->source + (size_t)src * PERIOD * pat->esize, pat->esize, start, buf, count);
}

void bench_pattern_fill_junk(const bench_pattern *pat, void *buf, size_t start, size_t count)
{
    fill_repeat(pat->junk, pat->esize, start, buf, count);
}

/* Elements of buf that differ from elements [start, start + count) of a
 * periodic table. */
static long long check_repeat(const bench_pattern *pat, const unsigned char *table, const void *buf, size_t start,
                              size_t count)
{
    const unsigned char *got = buf;
    long long wrong = 0;
    int is_float = bench_type_is_float(pat->dtype);
    size_t at = start % PERIOD;
    for (size_t i = 0; i < count;) {
        size_t n = PERIOD - at < count - i ? PERIOD - at : count - i;
        const unsigned char *blk = got + i * pat->esize;
        const unsigned char *exp = table + at * pat->esize;
        /* Fast path: the whole stretch matches bit for bit. */
        if (memcmp(blk, exp, n * pat->esize) != 0) {
            for (size_t k = 0; k < n; k++) {
                const unsigned char *g = blk + k * pat->esize;
                const unsigned char *e = exp + k * pat->esize;
                if (is_float) {
                    /* Compare values, so +0 and -0 both pass. */
                    if (bench_decode(pat->dtype, g) != bench_decode(pat->dtype, e))
                        wrong++;
                } else if (memcmp(g, e, pat->esize) != 0) {
                    wrong++;
                }
            }
        }
        i += n;
        at = 0;
    }
    return wrong;
}

long long bench_pattern_check(const bench_pattern *pat, const void *buf, size_t start, size_t count)
{
    return check_repeat(pat, pat->expect, buf, start, count);
}

long long bench_pattern_check_source(const bench_pattern *pat, int src, const void *buf, size_t start, size_t count)
{
    return check_repeat(pat, pat->source + (size_t)src * PERIOD * pat->esize, buf, start, count);
}
