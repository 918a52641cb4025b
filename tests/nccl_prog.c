/* A trainer-style program written only against nccl.h: the parent makes
 * the unique id, forks N ranks, and each rank creates its communicator and
 * checks every collective bit-exact against a serial reference (inputs are
 * small integers, exact in every type). Host buffers, NULL streams.
 *
 * usage: nccl_prog [NRANKS...]   (default: 2 3 4) */
#include <nccl.h>

#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static int g_rank = -1;

#define CHECK(cmd)                                                                                                     \
    do {                                                                                                               \
        ncclResult_t r_ = (cmd);                                                                                       \
        if (r_ != ncclSuccess) {                                                                                       \
            fprintf(stderr, "rank %d: %s:%d: %s failed: %s: %s\n", g_rank, __FILE__, __LINE__, #cmd,                   \
                    ncclGetErrorString(r_), ncclGetLastError(NULL));                                                   \
            return 1;                                                                                                  \
        }                                                                                                              \
    } while (0)

#define FAIL(...)                                                                                                      \
    do {                                                                                                               \
        fprintf(stderr, "rank %d: ", g_rank);                                                                          \
        fprintf(stderr, __VA_ARGS__);                                                                                  \
        fputc('\n', stderr);                                                                                           \
        return 1;                                                                                                      \
    } while (0)

/* Expect a specific failure whose text mentions `needle`. */
#define EXPECT_FAIL(cmd, code, needle)                                                                                 \
    do {                                                                                                               \
        ncclResult_t r_ = (cmd);                                                                                       \
        if (r_ != (code))                                                                                              \
            FAIL("%s returned %s, want %s", #cmd, ncclGetErrorString(r_), ncclGetErrorString(code));                   \
        if (!strstr(ncclGetLastError(NULL), (needle)))                                                                 \
            FAIL("%s: error text \"%s\" lacks \"%s\"", #cmd, ncclGetLastError(NULL), (needle));                        \
    } while (0)

/* ---- element encoding: small integers, exact in every type ---- */

static size_t type_size(ncclDataType_t t)
{
    switch (t) {
    case ncclInt8:
    case ncclUint8:
        return 1;
    case ncclFloat16:
    case ncclBfloat16:
        return 2;
    case ncclInt32:
    case ncclUint32:
    case ncclFloat32:
        return 4;
    default:
        return 8;
    }
}

/* |v| <= 2048 is exact in f16. */
static uint16_t int_to_half(int v)
{
    if (v == 0)
        return 0;
    uint16_t sign = v < 0 ? 0x8000 : 0;
    unsigned a = (unsigned)(v < 0 ? -v : v);
    int e = 31 - __builtin_clz(a);
    unsigned man = (a << (10 - e)) & 0x3ff;
    return (uint16_t)(sign | (unsigned)(e + 15) << 10 | man);
}

static void store(ncclDataType_t t, void *buf, size_t i, long long v)
{
    switch (t) {
    case ncclInt8:
        ((int8_t *)buf)[i] = (int8_t)v;
        break;
    case ncclUint8:
        ((uint8_t *)buf)[i] = (uint8_t)v;
        break;
    case ncclInt32:
        ((int32_t *)buf)[i] = (int32_t)v;
        break;
    case ncclUint32:
        ((uint32_t *)buf)[i] = (uint32_t)v;
        break;
    case ncclInt64:
        ((int64_t *)buf)[i] = v;
        break;
    case ncclUint64:
        ((uint64_t *)buf)[i] = (uint64_t)v;
        break;
    case ncclFloat16:
        ((uint16_t *)buf)[i] = int_to_half((int)v);
        break;
    case ncclFloat32:
        ((float *)buf)[i] = (float)v;
        break;
    case ncclFloat64:
        ((double *)buf)[i] = (double)v;
        break;
    case ncclBfloat16: {
        float f = (float)v;
        uint32_t u;
        memcpy(&u, &f, 4);
        ((uint16_t *)buf)[i] = (uint16_t)(u >> 16); /* exact: small integers */
        break;
    }
    default:
        abort();
    }
}

static int is_unsigned(ncclDataType_t t)
{
    return t == ncclUint8 || t == ncclUint32 || t == ncclUint64;
}

/* Input element i of rank r for op: products avoid 0 (so no signed zeros)
 * and unsigned types stay non-negative; averages are n times an integer so
 * that the mean is exact in every type. */
static long long input(int r, size_t i, ncclRedOp_t op, ncclDataType_t t, int n)
{
    long long h = (long long)((r * 7919 + (long long)i * 104729 + (long long)op * 31) % 1000003);
    if (op == ncclProd) {
        static const int vals[] = {1, 2, -1, -2};
        return is_unsigned(t) ? 1 + h % 2 : vals[h % 4];
    }
    long long v = is_unsigned(t) ? h % 9 : h % 9 - 4;
    return op == ncclAvg ? v * n : v;
}

/* The reduction of element i over n ranks, as a wide integer. Integer
 * types wrap when stored; the magnitudes here never overflow a float. */
static long long reference(ncclRedOp_t op, ncclDataType_t t, int n, size_t i)
{
    long long acc = input(0, i, op, t, n);
    for (int r = 1; r < n; r++) {
        long long v = input(r, i, op, t, n);
        switch (op) {
        case ncclSum:
        case ncclAvg:
            acc += v;
            break;
        case ncclProd:
            acc *= v;
            break;
        case ncclMax:
            acc = v > acc ? v : acc;
            break;
        case ncclMin:
            acc = v < acc ? v : acc;
            break;
        default:
            abort();
        }
    }
    return op == ncclAvg ? acc / n : acc;
}

static int check_elem(ncclDataType_t t, const void *buf, size_t i, long long want, const char *what)
{
    unsigned char w[8];
    store(t, w, 0, want);
    size_t es = type_size(t);
    if (memcmp((const unsigned char *)buf + i * es, w, es) != 0)
        FAIL("%s: type %d element %zu differs from the reference %lld", what, (int)t, i, want);
    return 0;
}

static void *xmalloc(size_t bytes)
{
    void *p = malloc(bytes ? bytes : 1);
    if (!p) {
        fprintf(stderr, "out of memory\n");
        exit(3);
    }
    return p;
}

/* ---- the collectives ---- */

static const ncclDataType_t types[] = {ncclInt8,   ncclUint8,   ncclInt32,   ncclUint32,  ncclInt64,
                                       ncclUint64, ncclFloat16, ncclFloat32, ncclFloat64, ncclBfloat16};
static const ncclRedOp_t ops[] = {ncclSum, ncclProd, ncclMax, ncclMin, ncclAvg};
#define NELEM(a) (sizeof(a) / sizeof((a)[0]))

static int test_allreduce(ncclComm_t comm, int rank, int n)
{
    static const size_t counts[] = {0, 1, 17, 4099};
    for (size_t ti = 0; ti < NELEM(types); ti++)
        for (size_t oi = 0; oi < NELEM(ops); oi++)
            for (size_t ci = 0; ci < NELEM(counts); ci++) {
                ncclDataType_t t = types[ti];
                ncclRedOp_t op = ops[oi];
                size_t count = counts[ci], es = type_size(t);
                unsigned char *send = xmalloc(count * es), *recv = xmalloc(count * es);
                for (size_t i = 0; i < count; i++)
                    store(t, send, i, input(rank, i, op, t, n));
                int in_place = (int)(ci % 2);
                void *out = in_place ? (void *)send : (void *)recv;
                /* every type and op, ncclUint32/64 max, min and avg included (native u32/u64) */
                CHECK(ncclAllReduce(send, out, count, t, op, comm, NULL));
                for (size_t i = 0; i < count; i++)
                    if (check_elem(t, out, i, reference(op, t, n, i), "ncclAllReduce"))
                        return 1;
                free(send);
                free(recv);
            }
    /* A large float sum, with exact partial sums. */
    size_t big = (1u << 20) + 3;
    float *a = xmalloc(big * 4);
    for (size_t i = 0; i < big; i++)
        a[i] = (float)(rank + (int)(i % 5));
    CHECK(ncclAllReduce(a, a, big, ncclFloat, ncclSum, comm, NULL));
    for (size_t i = 0; i < big; i++)
        if (a[i] != (float)(n * (n - 1) / 2 + n * (int)(i % 5)))
            FAIL("large ncclAllReduce element %zu is %g", i, a[i]);
    free(a);
    return 0;
}

static int test_reduce(ncclComm_t comm, int rank, int n)
{
    for (int root = 0; root < n; root++)
        for (size_t ti = 0; ti < NELEM(types); ti += 3) {
            ncclDataType_t t = types[ti];
            ncclRedOp_t op = ops[(ti + (size_t)root) % NELEM(ops)];
            size_t count = 3001, es = type_size(t);
            unsigned char *send = xmalloc(count * es), *recv = xmalloc(count * es);
            for (size_t i = 0; i < count; i++)
                store(t, send, i, input(rank, i, op, t, n));
            /* recvbuff may be NULL except on the root. */
            CHECK(ncclReduce(send, rank == root ? recv : NULL, count, t, op, root, comm, NULL));
            if (rank == root)
                for (size_t i = 0; i < count; i++)
                    if (check_elem(t, recv, i, reference(op, t, n, i), "ncclReduce"))
                        return 1;
            free(send);
            free(recv);
        }
    return 0;
}

static int test_broadcast(ncclComm_t comm, int rank, int n)
{
    size_t count = 100003;
    int32_t *send = xmalloc(count * 4), *recv = xmalloc(count * 4);
    for (int root = 0; root < n; root++) {
        for (size_t i = 0; i < count; i++) {
            send[i] = rank == root ? (int32_t)(root * 1000 + (int)i) : -1;
            recv[i] = -2;
        }
        CHECK(ncclBroadcast(send, recv, count, ncclInt32, root, comm, NULL));
        for (size_t i = 0; i < count; i++)
            if (recv[i] != root * 1000 + (int)i)
                FAIL("ncclBroadcast root %d element %zu is %d", root, i, recv[i]);
        CHECK(ncclBcast(send, count, ncclInt32, root, comm, NULL));
        for (size_t i = 0; i < count; i++)
            if (send[i] != root * 1000 + (int)i)
                FAIL("ncclBcast root %d element %zu is %d", root, i, send[i]);
    }
    free(send);
    free(recv);
    return 0;
}

static int test_allgather_reduce_scatter(ncclComm_t comm, int rank, int n)
{
    static const size_t counts[] = {0, 1, 1001, 65537};
    for (size_t ci = 0; ci < NELEM(counts); ci++) {
        size_t count = counts[ci];
        int in_place = (int)(ci % 2);
        /* all-gather: block r is rank r's input */
        double *all = xmalloc(count * (size_t)n * 8), *mine = xmalloc(count * 8);
        double *src = in_place ? all + (size_t)rank * count : mine;
        for (size_t i = 0; i < count; i++)
            src[i] = (double)(rank * 100000 + (int)i);
        CHECK(ncclAllGather(src, all, count, ncclDouble, comm, NULL));
        for (int r = 0; r < n; r++)
            for (size_t i = 0; i < count; i++)
                if (all[(size_t)r * count + i] != (double)(r * 100000 + (int)i))
                    FAIL("ncclAllGather count %zu block %d element %zu is %g", count, r, i, all[(size_t)r * count + i]);
        free(all);
        free(mine);
        /* reduce-scatter: rank r gets block r of the sum */
        for (size_t ti = 0; ti < NELEM(types); ti++) {
            ncclDataType_t t = types[ti];
            ncclRedOp_t op = ops[(ti + ci) % NELEM(ops)];
            size_t es = type_size(t), total = count * (size_t)n;
            unsigned char *send = xmalloc(total * es), *recv = xmalloc(count * es);
            for (size_t i = 0; i < total; i++)
                store(t, send, i, input(rank, i, op, t, n));
            unsigned char *out = in_place ? send + (size_t)rank * count * es : recv;
            CHECK(ncclReduceScatter(send, out, count, t, op, comm, NULL));
            for (size_t i = 0; i < count; i++)
                if (check_elem(t, out, i, reference(op, t, n, (size_t)rank * count + i), "ncclReduceScatter"))
                    return 1;
            free(send);
            free(recv);
        }
    }
    return 0;
}

/* Ring exchange in a group (both directions at once) and an all-to-all. */
static int test_send_recv(ncclComm_t comm, int rank, int n)
{
    size_t count = (1u << 19) + 1;
    int next = (rank + 1) % n, prev = (rank + n - 1) % n;
    int64_t *to_next = xmalloc(count * 8), *to_prev = xmalloc(count * 8);
    int64_t *from_prev = xmalloc(count * 8), *from_next = xmalloc(count * 8);
    for (size_t i = 0; i < count; i++) {
        to_next[i] = rank * 10000000LL + (long long)i;
        to_prev[i] = -(rank * 10000000LL + (long long)i);
    }
    CHECK(ncclGroupStart());
    CHECK(ncclSend(to_next, count, ncclInt64, next, comm, NULL));
    CHECK(ncclSend(to_prev, count, ncclInt64, prev, comm, NULL));
    CHECK(ncclRecv(from_prev, count, ncclInt64, prev, comm, NULL));
    CHECK(ncclRecv(from_next, count, ncclInt64, next, comm, NULL));
    CHECK(ncclGroupEnd());
    for (size_t i = 0; i < count; i++)
        if (from_prev[i] != prev * 10000000LL + (long long)i || from_next[i] != -(next * 10000000LL + (long long)i))
            FAIL("ring exchange element %zu wrong", i);
    free(to_next);
    free(to_prev);
    free(from_prev);
    free(from_next);

    size_t c = 777;
    float *out = xmalloc((size_t)n * c * 4), *in = xmalloc((size_t)n * c * 4);
    for (int p = 0; p < n; p++)
        for (size_t i = 0; i < c; i++)
            out[(size_t)p * c + i] = (float)(rank * 1000 + p * 10 + (int)(i % 7));
    CHECK(ncclGroupStart());
    for (int p = 0; p < n; p++) {
        CHECK(ncclSend(out + (size_t)p * c, c, ncclFloat, p, comm, NULL));
        CHECK(ncclRecv(in + (size_t)p * c, c, ncclFloat, p, comm, NULL));
    }
    CHECK(ncclGroupEnd());
    for (int p = 0; p < n; p++)
        for (size_t i = 0; i < c; i++)
            if (in[(size_t)p * c + i] != (float)(p * 1000 + rank * 10 + (int)(i % 7)))
                FAIL("all-to-all from %d element %zu is %g", p, i, in[(size_t)p * c + i]);
    free(out);
    free(in);
    return 0;
}

static int test_premulsum(ncclComm_t comm, int rank, int n)
{
    /* Host-immediate f32 scalar 0.5 (changing it after creation has no
     * effect), device-residence i32 scalar read at each call. */
    float half = 0.5f;
    ncclRedOp_t op_f;
    CHECK(ncclRedOpCreatePreMulSum(&op_f, &half, ncclFloat32, ncclScalarHostImmediate, comm));
    half = 100.0f;
    int32_t k = 3;
    ncclRedOp_t op_i;
    CHECK(ncclRedOpCreatePreMulSum(&op_i, &k, ncclInt32, ncclScalarDevice, comm));
    if ((int)op_f < (int)ncclNumOps || (int)op_i < (int)ncclNumOps || op_f == op_i)
        FAIL("PreMulSum ops %d and %d are not distinct dynamic ops", (int)op_f, (int)op_i);
    enum { C = 5000 };
    float f[C], fo[C];
    int32_t v[C * 8], vo[C];
    for (int i = 0; i < C; i++)
        f[i] = (float)(2 * (rank + i % 3));
    CHECK(ncclAllReduce(f, fo, C, ncclFloat32, op_f, comm, NULL));
    for (int i = 0; i < C; i++)
        if (fo[i] != (float)(n * (n - 1) / 2 + n * (i % 3)))
            FAIL("PreMulSum(0.5) all-reduce element %d is %g", i, fo[i]);
    k = 5; /* device residence: read when the collective runs */
    for (int i = 0; i < C * n; i++)
        v[i] = rank - i % 4;
    CHECK(ncclReduceScatter(v, vo, C, ncclInt32, op_i, comm, NULL));
    for (int i = 0; i < C; i++) {
        int gi = rank * C + i;
        if (vo[i] != 5 * (n * (n - 1) / 2 - n * (gi % 4)))
            FAIL("PreMulSum(5) reduce-scatter element %d is %d", i, vo[i]);
    }
    CHECK(ncclReduce(f, fo, C, ncclFloat32, op_f, n - 1, comm, NULL));
    if (rank == n - 1)
        for (int i = 0; i < C; i++)
            if (fo[i] != (float)(n * (n - 1) / 2 + n * (i % 3)))
                FAIL("PreMulSum reduce element %d is %g", i, fo[i]);
    EXPECT_FAIL(ncclAllReduce(v, vo, C, ncclFloat32, op_i, comm, NULL), ncclInvalidArgument, "made for ncclInt32");
    CHECK(ncclRedOpDestroy(op_f, comm));
    CHECK(ncclRedOpDestroy(op_i, comm));
    EXPECT_FAIL(ncclAllReduce(f, fo, C, ncclFloat32, op_f, comm, NULL), ncclInvalidArgument, "neither built in");
    return 0;
}

/* Several collectives in one group complete together, in order. */
static int test_grouped_collectives(ncclComm_t comm, int rank, int n)
{
    enum { C = 3000 };
    int32_t a[C], b[C], g[C * 8];
    for (int i = 0; i < C; i++)
        a[i] = b[i] = rank + i;
    CHECK(ncclGroupStart());
    CHECK(ncclAllReduce(a, a, C, ncclInt32, ncclSum, comm, NULL));
    CHECK(ncclGroupStart()); /* nesting */
    CHECK(ncclAllGather(b, g, C, ncclInt32, comm, NULL));
    CHECK(ncclGroupEnd());
    CHECK(ncclAllReduce(b, b, C, ncclInt32, ncclMax, comm, NULL));
    CHECK(ncclGroupEnd());
    for (int i = 0; i < C; i++) {
        if (a[i] != n * (n - 1) / 2 + n * i || b[i] != n - 1 + i)
            FAIL("grouped all-reduce element %d: %d %d", i, a[i], b[i]);
        for (int r = 0; r < n; r++)
            if (g[r * C + i] != r + i)
                FAIL("grouped all-gather block %d element %d is %d", r, i, g[r * C + i]);
    }
    return 0;
}

/* Group semantics: calls are recorded and run at the outermost
 * ncclGroupEnd. Both sides post a large send before the matching receive
 * (blocking sends would deadlock), collectives and point-to-point calls
 * mix, and buffers are read at ncclGroupEnd, not when recorded. */
static int test_group_semantics(ncclComm_t comm, int rank, int n)
{
    size_t count = (size_t)2 << 20; /* 16 MiB of int64 each way */
    int peer = rank ^ 1;
    if (peer < n) {
        int64_t *out = xmalloc(count * 8), *in = xmalloc(count * 8);
        for (size_t i = 0; i < count; i++) {
            out[i] = rank * 1000000000LL + (long long)i;
            in[i] = -1;
        }
        CHECK(ncclGroupStart());
        CHECK(ncclSend(out, count, ncclInt64, peer, comm, NULL));
        CHECK(ncclRecv(in, count, ncclInt64, peer, comm, NULL));
        CHECK(ncclGroupEnd());
        for (size_t i = 0; i < count; i++)
            if (in[i] != peer * 1000000000LL + (long long)i)
                FAIL("send-before-receive exchange element %zu is %lld", i, (long long)in[i]);
        free(out);
        free(in);
    }

    /* Send, all-reduce, receive, all-gather, broadcast in one group, with
     * a large ring exchange split around the collectives (run in issue
     * order, every rank would block in its send before the all-reduce). */
    enum { C = 4099, RC = 1 << 20 };
    int next = (rank + 1) % n, prev = (rank + n - 1) % n;
    int32_t *ring_out = xmalloc(RC * 4), *ring_in = xmalloc(RC * 4), *a = xmalloc(C * 4);
    int32_t *g = xmalloc((size_t)n * C * 4), *bc = xmalloc(C * 4);
    for (int i = 0; i < RC; i++)
        ring_out[i] = rank * 10000000 + i;
    for (int i = 0; i < C; i++) {
        a[i] = -7; /* overwritten before ncclGroupEnd: the group must read the new values */
        bc[i] = rank == n - 1 ? 3 * i : -1;
    }
    CHECK(ncclGroupStart());
    CHECK(ncclSend(ring_out, RC, ncclInt32, next, comm, NULL));
    CHECK(ncclAllReduce(a, a, C, ncclInt32, ncclSum, comm, NULL));
    CHECK(ncclRecv(ring_in, RC, ncclInt32, prev, comm, NULL));
    CHECK(ncclGroupStart());
    CHECK(ncclAllGather(a + 0, g, C, ncclInt32, comm, NULL)); /* runs after the all-reduce: reads its result */
    CHECK(ncclGroupEnd());
    CHECK(ncclBroadcast(bc, bc, C, ncclInt32, n - 1, comm, NULL));
    for (int i = 0; i < C; i++)
        a[i] = rank + i;
    CHECK(ncclGroupEnd());
    for (int i = 0; i < RC; i++)
        if (ring_in[i] != prev * 10000000 + i)
            FAIL("grouped ring element %d is %d", i, ring_in[i]);
    for (int i = 0; i < C; i++) {
        int32_t sum = n * (n - 1) / 2 + n * i;
        if (a[i] != sum)
            FAIL("grouped all-reduce element %d is %d, want %d (read at ncclGroupEnd)", i, a[i], sum);
        for (int r = 0; r < n; r++)
            if (g[(size_t)r * C + i] != sum)
                FAIL("grouped all-gather block %d element %d is %d", r, i, g[(size_t)r * C + i]);
        if (bc[i] != 3 * i)
            FAIL("grouped broadcast element %d is %d", i, bc[i]);
    }
    free(ring_out);
    free(ring_in);
    free(a);
    free(g);
    free(bc);

    /* A PreMulSum input is scaled when the group runs, not when recorded. */
    float two = 2.0f, f[64], fo[64];
    ncclRedOp_t pm;
    CHECK(ncclRedOpCreatePreMulSum(&pm, &two, ncclFloat32, ncclScalarHostImmediate, comm));
    for (int i = 0; i < 64; i++)
        f[i] = fo[i] = -1.0f;
    CHECK(ncclGroupStart());
    CHECK(ncclAllReduce(f, fo, 64, ncclFloat32, pm, comm, NULL));
    for (int i = 0; i < 64; i++)
        if (f[i] != -1.0f || fo[i] != -1.0f)
            FAIL("a recorded PreMulSum touched its buffers before ncclGroupEnd");
    for (int i = 0; i < 64; i++)
        f[i] = (float)(rank + i);
    CHECK(ncclGroupEnd());
    for (int i = 0; i < 64; i++)
        if (fo[i] != (float)(n * (n - 1) + 2 * n * i))
            FAIL("grouped PreMulSum element %d is %g", i, fo[i]);
    CHECK(ncclRedOpDestroy(pm, comm));

    /* Destroy and abort inside an open group (NCCL: the group holds its
     * communicators): destroy is refused while calls of the communicator
     * are recorded, abort drops them; neither blocks. A communicator with
     * nothing recorded is destroyed at once. */
    ncclComm_t sub, idle;
    CHECK(ncclCommSplit(comm, 0, rank, &sub, NULL));
    CHECK(ncclCommSplit(comm, 0, rank, &idle, NULL));
    int32_t x[8], y[8];
    for (int i = 0; i < 8; i++)
        x[i] = y[i] = rank;
    /* Every rank is done joining `idle` before any destroys it. */
    CHECK(ncclAllReduce(x, y, 1, ncclInt32, ncclSum, idle, NULL));
    y[0] = rank;
    CHECK(ncclGroupStart());
    CHECK(ncclAllReduce(x, x, 8, ncclInt32, ncclSum, sub, NULL));
    CHECK(ncclAllReduce(y, y, 8, ncclInt32, ncclSum, comm, NULL));
    EXPECT_FAIL(ncclCommDestroy(sub), ncclInvalidUsage, "inside a group");
    CHECK(ncclCommDestroy(idle));
    CHECK(ncclCommAbort(sub));
    CHECK(ncclGroupEnd());
    for (int i = 0; i < 8; i++) {
        if (x[i] != rank)
            FAIL("a call dropped by ncclCommAbort ran: %d", x[i]);
        if (y[i] != n * (n - 1) / 2)
            FAIL("the group's other all-reduce element %d is %d", i, y[i]);
    }
    return 0;
}

static int test_split(ncclComm_t comm, int rank, int n)
{
    ncclComm_t sub;
    int color = rank == n - 1 && n > 2 ? NCCL_SPLIT_NOCOLOR : rank % 2;
    CHECK(ncclCommSplit(comm, color, -rank, &sub, NULL)); /* key -rank: reversed order */
    if (color == NCCL_SPLIT_NOCOLOR) {
        if (sub != NULL)
            FAIL("NCCL_SPLIT_NOCOLOR got a communicator");
        return 0;
    }
    int members = 0, my_index = 0;
    for (int r = 0; r < n; r++)
        if (r % 2 == color && !(r == n - 1 && n > 2)) {
            members++;
            if (r > rank)
                my_index++;
        }
    int count, urank;
    CHECK(ncclCommCount(sub, &count));
    CHECK(ncclCommUserRank(sub, &urank));
    if (count != members || urank != my_index)
        FAIL("split comm: count %d rank %d, want %d %d", count, urank, members, my_index);
    int32_t x = rank, sum = 0, want = 0;
    for (int r = 0; r < n; r++)
        if (r % 2 == color && !(r == n - 1 && n > 2))
            want += r;
    CHECK(ncclAllReduce(&x, &sum, 1, ncclInt32, ncclSum, sub, NULL));
    if (sum != want)
        FAIL("split all-reduce: %d, want %d", sum, want);
    CHECK(ncclCommDestroy(sub));
    return 0;
}

static int test_errors(ncclComm_t comm, int rank, int n)
{
    int32_t buf[16] = {0};
    EXPECT_FAIL(ncclAllReduce(buf, buf, 4, (ncclDataType_t)42, ncclSum, comm, NULL), ncclInvalidArgument,
                "invalid datatype");
    /* A valid NCCL call braid cannot do: ncclInvalidUsage; bad values:
     * ncclInvalidArgument, as in NCCL. */
    EXPECT_FAIL(ncclAllReduce(buf, buf, 4, ncclInt32, (ncclRedOp_t)-1, comm, NULL), ncclInvalidArgument,
                "neither built in");
    EXPECT_FAIL(ncclAllGather(buf, buf, 1, ncclNumTypes, comm, NULL), ncclInvalidArgument, "invalid datatype");
    EXPECT_FAIL(ncclAllReduce(NULL, buf, 4, ncclInt32, ncclSum, comm, NULL), ncclInvalidArgument, "NULL");
    EXPECT_FAIL(ncclRecv(buf, 4, ncclInt32, -1, comm, NULL), ncclInvalidArgument, "peer");
    EXPECT_FAIL(ncclAllReduce(buf, buf, 4, ncclInt32, (ncclRedOp_t)77, comm, NULL), ncclInvalidArgument,
                "neither built in");
    EXPECT_FAIL(ncclBroadcast(buf, buf, 4, ncclInt32, n, comm, NULL), ncclInvalidArgument, "root");
    EXPECT_FAIL(ncclSend(buf, 4, ncclInt32, n + 3, comm, NULL), ncclInvalidArgument, "peer");
    EXPECT_FAIL(ncclGroupEnd(), ncclInvalidUsage, "without ncclGroupStart");
    EXPECT_FAIL(ncclAllReduce(buf, buf, 4, ncclInt32, ncclSum, NULL, NULL), ncclInvalidArgument, "comm is NULL");
    ncclConfig_t bad = NCCL_CONFIG_INITIALIZER;
    bad.magic = 0;
    ncclComm_t c2;
    ncclUniqueId id;
    memset(&id, 0, sizeof(id));
    EXPECT_FAIL(ncclCommInitRankConfig(&c2, 2, id, 0, &bad), ncclInvalidArgument, "NCCL_CONFIG_INITIALIZER");
    ncclResult_t async;
    CHECK(ncclCommGetAsyncError(comm, &async));
    if (async != ncclSuccess)
        FAIL("usage errors broke the communicator: %s", ncclGetErrorString(async));
    (void)rank;
    return 0;
}

static int rank_main(int rank, int n, ncclUniqueId id)
{
    g_rank = rank;
    ncclComm_t comm;
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 1; /* nonblocking comms (ncclInProgress) are tested in nccl_compat.c */
    config.commName = "nccl_prog";
    if (rank % 2)
        CHECK(ncclCommInitRankConfig(&comm, n, id, rank, &config));
    else
        CHECK(ncclCommInitRank(&comm, n, id, rank));
    ncclResult_t state = ncclInProgress;
    while (state == ncclInProgress)
        CHECK(ncclCommGetAsyncError(comm, &state));
    CHECK(state);
    int count, urank, dev;
    CHECK(ncclCommCount(comm, &count));
    CHECK(ncclCommUserRank(comm, &urank));
    CHECK(ncclCommCuDevice(comm, &dev));
    if (count != n || urank != rank)
        FAIL("count %d rank %d, want %d %d", count, urank, n, rank);
    void *mem;
    CHECK(ncclMemAlloc(&mem, 12345)); /* device memory where CUDA has a device: not touched here */
    void *handle;
    CHECK(ncclCommRegister(comm, mem, 12345, &handle));
    CHECK(ncclCommDeregister(comm, handle));
    CHECK(ncclMemFree(mem));

    if (test_allreduce(comm, rank, n) || test_reduce(comm, rank, n) || test_broadcast(comm, rank, n) ||
        test_allgather_reduce_scatter(comm, rank, n) || test_send_recv(comm, rank, n) ||
        test_premulsum(comm, rank, n) || test_grouped_collectives(comm, rank, n) ||
        test_group_semantics(comm, rank, n) || test_split(comm, rank, n) ||
        test_errors(comm, rank, n))
        return 1;
    CHECK(ncclCommFinalize(comm));
    EXPECT_FAIL(ncclAllReduce(&count, &count, 1, ncclInt32, ncclSum, comm, NULL), ncclInvalidUsage, "finalized");
    CHECK(ncclCommDestroy(comm));
    return 0;
}

/* A watchdog thread aborts the communicator while the main thread waits
 * in a receive that will never match (the PyTorch pattern): the receive
 * returns an error promptly, and nothing crashes. */
static void *watchdog_main(void *arg)
{
    struct timespec ms200 = {0, 200 * 1000 * 1000};
    nanosleep(&ms200, NULL);
    ncclCommAbort(*(ncclComm_t *)arg);
    return NULL;
}

static int abort_main(int rank, int n, ncclUniqueId id)
{
    g_rank = rank;
    ncclComm_t comm;
    CHECK(ncclCommInitRank(&comm, n, id, rank));
    if (rank != 0) {
        struct timespec s1 = {1, 0};
        nanosleep(&s1, NULL); /* never sends */
        CHECK(ncclCommDestroy(comm));
        return 0;
    }
    pthread_t watchdog;
    if (pthread_create(&watchdog, NULL, watchdog_main, &comm) != 0)
        FAIL("cannot start the watchdog thread");
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    int32_t buf[16];
    ncclResult_t r = ncclRecv(buf, 16, ncclInt32, 1, comm, NULL);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    pthread_join(watchdog, NULL); /* comm is gone from here on */
    double s = (double)(t1.tv_sec - t0.tv_sec) + (double)(t1.tv_nsec - t0.tv_nsec) * 1e-9;
    if (r == ncclSuccess)
        FAIL("a receive on an aborted communicator succeeded");
    if (s > 5.0)
        FAIL("the aborted receive took %.1f s to return", s);
    return 0;
}

/* ncclCommInitAll: every rank of a clique in this one process, driven
 * from one thread with group calls. */
static int init_all_main(int ndev)
{
    g_rank = 0;
    ncclComm_t comms[8];
    CHECK(ncclCommInitAll(comms, ndev, NULL));
    enum { C = 10001 };
    static float bufs[8][C];
    for (int d = 0; d < ndev; d++)
        for (int i = 0; i < C; i++)
            bufs[d][i] = (float)(d + i % 11);
    CHECK(ncclGroupStart());
    for (int d = 0; d < ndev; d++)
        CHECK(ncclAllReduce(bufs[d], bufs[d], C, ncclFloat, ncclSum, comms[d], NULL));
    CHECK(ncclGroupEnd());
    for (int d = 0; d < ndev; d++) {
        int dev;
        CHECK(ncclCommCuDevice(comms[d], &dev));
        if (dev != d)
            FAIL("ncclCommInitAll comm %d reports device %d", d, dev);
        for (int i = 0; i < C; i++)
            if (bufs[d][i] != (float)(ndev * (ndev - 1) / 2 + ndev * (i % 11)))
                FAIL("ncclCommInitAll all-reduce comm %d element %d is %g", d, i, bufs[d][i]);
        CHECK(ncclCommDestroy(comms[d]));
    }
    return 0;
}

static int run_job(int n, int (*fn)(int, int, ncclUniqueId))
{
    ncclUniqueId id;
    if (ncclGetUniqueId(&id) != ncclSuccess) {
        fprintf(stderr, "ncclGetUniqueId: %s\n", ncclGetLastError(NULL));
        return 1;
    }
    pid_t pids[64];
    for (int r = 0; r < n; r++) {
        fflush(NULL);
        pids[r] = fork();
        if (pids[r] == 0) {
            int rc = fn(r, n, id);
            fflush(NULL); /* _exit does not flush stdio */
            _exit(rc);
        }
    }
    int failed = 0;
    for (int r = 0; r < n; r++) {
        int status;
        waitpid(pids[r], &status, 0);
        if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
            fprintf(stderr, "%d ranks: rank %d failed (status %d)\n", n, r, status);
            failed = 1;
        }
    }
    return failed;
}

int main(int argc, char **argv)
{
    int version;
    if (ncclGetVersion(&version) != ncclSuccess || version != NCCL_VERSION_CODE) {
        fprintf(stderr, "ncclGetVersion says %d, header says %d\n", version, NCCL_VERSION_CODE);
        return 1;
    }
    int failed = 0;
    static const char *const defaults[] = {"2", "3", "4"};
    int njobs = argc > 1 ? argc - 1 : 3;
    for (int j = 0; j < njobs; j++) {
        int n = atoi(argc > 1 ? argv[j + 1] : defaults[j]);
        if (n < 1 || n > 64) {
            fprintf(stderr, "bad rank count %s\n", argv[j + 1]);
            return 2;
        }
        int f = run_job(n, rank_main);
        printf("%d ranks: %s\n", n, f ? "FAILED" : "ok");
        failed |= f;
    }
    int f = run_job(2, abort_main);
    printf("ncclCommAbort from a watchdog thread: %s\n", f ? "FAILED" : "ok");
    failed |= f;
    fflush(NULL);
    pid_t p = fork();
    if (p == 0)
        _exit(init_all_main(3));
    int status;
    waitpid(p, &status, 0);
    f = !WIFEXITED(status) || WEXITSTATUS(status) != 0;
    printf("ncclCommInitAll(3): %s\n", f ? "FAILED" : "ok");
    return failed || f;
}
