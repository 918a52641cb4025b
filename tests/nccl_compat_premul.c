/* PreMulSum through NVIDIA's nccl.h, each rank with its own scalar:
 * ncclAllReduce (in and out of place), ncclReduce and ncclReduceScatter
 * give sum_r(scalar_r * x_r).
 *  - ncclFloat32: scalars (r + 1) / 4 and small integer inputs, so every
 *    product and sum is exact and compared exactly;
 *  - ncclUint64, ncclUint32: scalars and inputs above 2^63 / 2^31,
 *    compared bit for bit modulo 2^64 / 2^32;
 *  - ncclScalarHostImmediate is read at creation (changing the variable
 *    afterwards changes nothing); ncclScalarDevice given host memory, which
 *    the shim reads on its CPU path, is read at each call;
 *  - after ncclRedOpDestroy the op is refused. */
#include <inttypes.h>
#include <stdint.h>
#include <stdlib.h>

#include "nccl_compat.h"

enum { C = 1031 };

static uint64_t bits(int rank, int i)
{
    uint64_t x = (uint64_t)rank * 0x9E3779B97F4A7C15ull ^ (uint64_t)i * 0xBF58476D1CE4E5B9ull;
    x ^= x >> 31;
    x *= 0x94D049BB133111EBull;
    return (x ^ x >> 29) | (i % 2 ? 1ull << 63 : 0); /* half of them above 2^63 */
}

static float f32_in(int r, int i)
{
    return (float)(i % 29 - 14 + 3 * r);
}

/* sum_r scale(r) * f32_in(r, i): exact, so any order gives these bits. */
static float f32_want(int n, int i, float (*scale)(int))
{
    float acc = 0;
    for (int r = 0; r < n; r++)
        acc += scale(r) * f32_in(r, i);
    return acc;
}

static float quarter(int r)
{
    return 0.25f * (float)(r + 1);
}

static float half(int r)
{
    return 0.5f * (float)(r + 2);
}

static int check_f32(const float *got, int n, float (*scale)(int), const char *what)
{
    for (int i = 0; i < C; i++)
        if (got[i] != f32_want(n, i, scale))
            FAIL("PreMulSum f32 %s: element %d is %g, want %g", what, i, got[i], f32_want(n, i, scale));
    return 0;
}

static int premul_f32(ncclComm_t comm, int rank, int n)
{
    float s = quarter(rank), x[C], y[C];
    ncclRedOp_t op;
    CHECK(ncclRedOpCreatePreMulSum(&op, &s, ncclFloat32, ncclScalarHostImmediate, comm));
    s = 1000.0f; /* read at creation: no effect */
    for (int i = 0; i < C; i++)
        x[i] = f32_in(rank, i);
    CHECK(ncclAllReduce(x, y, C, ncclFloat32, op, comm, NULL));
    if (check_f32(y, n, quarter, "all-reduce out of place"))
        return 1;
    for (int i = 0; i < C; i++)
        if (x[i] != f32_in(rank, i))
            FAIL("PreMulSum f32 all-reduce wrote its input at %d", i);
    CHECK(ncclAllReduce(x, x, C, ncclFloat32, op, comm, NULL));
    if (check_f32(x, n, quarter, "all-reduce in place"))
        return 1;
    for (int i = 0; i < C; i++)
        x[i] = f32_in(rank, i);
    CHECK(ncclReduce(x, y, C, ncclFloat32, op, n - 1, comm, NULL));
    if (rank == n - 1 && check_f32(y, n, quarter, "reduce"))
        return 1;
    CHECK(ncclRedOpDestroy(op, comm));
    EXPECT(ncclAllReduce(x, y, C, ncclFloat32, op, comm, NULL), ncclInvalidArgument, "neither built in");

    /* Device residence, here host memory: the value at each call counts. */
    float d = 1000.0f;
    CHECK(ncclRedOpCreatePreMulSum(&op, &d, ncclFloat32, ncclScalarDevice, comm));
    d = quarter(rank);
    CHECK(ncclAllReduce(x, y, C, ncclFloat32, op, comm, NULL));
    if (check_f32(y, n, quarter, "device scalar, first call"))
        return 1;
    d = half(rank);
    CHECK(ncclAllReduce(x, y, C, ncclFloat32, op, comm, NULL));
    if (check_f32(y, n, half, "device scalar, changed"))
        return 1;
    CHECK(ncclRedOpDestroy(op, comm));
    return 0;
}

static uint64_t u64_scalar(int r)
{
    return 0x8000000000000001ull + 2ull * (uint64_t)r;
}

static uint32_t u32_scalar(int r, uint32_t base)
{
    return base - (uint32_t)r;
}

/* u64, immediate scalar: all-reduce, then reduce-scatter of n blocks. */
static int premul_u64(ncclComm_t comm, int rank, int n)
{
    uint64_t s = u64_scalar(rank), *x = malloc((size_t)n * C * 8), y[C];
    if (!x)
        FAIL("out of memory");
    ncclRedOp_t op;
    CHECK(ncclRedOpCreatePreMulSum(&op, &s, ncclUint64, ncclScalarHostImmediate, comm));
    for (int i = 0; i < n * C; i++)
        x[i] = bits(rank, i);
    CHECK(ncclAllReduce(x, y, C, ncclUint64, op, comm, NULL));
    for (int i = 0; i < C; i++) {
        uint64_t want = 0;
        for (int r = 0; r < n; r++)
            want += u64_scalar(r) * bits(r, i);
        if (y[i] != want)
            FAIL("PreMulSum u64 all-reduce element %d is %#" PRIx64 ", want %#" PRIx64, i, y[i], want);
    }
    CHECK(ncclReduceScatter(x, y, C, ncclUint64, op, comm, NULL));
    for (int i = 0; i < C; i++) {
        uint64_t want = 0;
        for (int r = 0; r < n; r++)
            want += u64_scalar(r) * bits(r, rank * C + i);
        if (y[i] != want)
            FAIL("PreMulSum u64 reduce-scatter element %d is %#" PRIx64 ", want %#" PRIx64, i, y[i], want);
    }
    CHECK(ncclRedOpDestroy(op, comm));
    EXPECT(ncclRedOpDestroy(op, comm), ncclInvalidArgument, "not a live operator");
    free(x);
    return 0;
}

/* u32, device residence on host memory: two calls, two scalars. */
static int premul_u32(ncclComm_t comm, int rank, int n)
{
    static const uint32_t bases[2] = {0xFFFFFFF0u, 0x80000003u};
    uint32_t s = 0, x[C], y[C];
    ncclRedOp_t op;
    CHECK(ncclRedOpCreatePreMulSum(&op, &s, ncclUint32, ncclScalarDevice, comm));
    for (int i = 0; i < C; i++)
        x[i] = (uint32_t)bits(rank, i) | 0x80000000u;
    for (int k = 0; k < 2; k++) {
        s = u32_scalar(rank, bases[k]);
        CHECK(ncclAllReduce(x, y, C, ncclUint32, op, comm, NULL));
        for (int i = 0; i < C; i++) {
            uint32_t want = 0;
            for (int r = 0; r < n; r++)
                want += u32_scalar(r, bases[k]) * ((uint32_t)bits(r, i) | 0x80000000u);
            if (y[i] != want)
                FAIL("PreMulSum u32 all-reduce (scalar base %#x) element %d is %#x, want %#x", bases[k], i, y[i],
                     want);
        }
    }
    CHECK(ncclRedOpDestroy(op, comm));
    return 0;
}

int test_premulsum(ncclComm_t comm, int rank, int n)
{
    return premul_f32(comm, rank, n) || premul_u64(comm, rank, n) || premul_u32(comm, rank, n);
}
