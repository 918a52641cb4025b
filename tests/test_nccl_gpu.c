/* libnccl.so.2 as a CUDA trainer uses it: every collective and send/recv
 * on device buffers with a stream, results checked after
 * cudaStreamSynchronize. Inputs are copied up and results copied back
 * with cudaMemcpyAsync on the same stream, unsynchronized, right before
 * and after each call: the call must see the copy queued before it, and
 * the copy after it must see the result. Also groups on device buffers,
 * a host call after device calls, PreMulSum, ncclMemAlloc and the
 * reduction braid refuses.
 *
 * Built twice: against the CUDA runtime (nccl_gpu; skips with exit 77 and
 * the reason where there is no device) and, where braid is built without
 * CUDA, against tests/cuda_fake.c with the shim's sources compiled in
 * (nccl_gpu_fake), so the device path runs on machines without a GPU.
 * Ranks are forked processes, before any of them touches CUDA. */
#include <cuda_runtime_api.h>
#include <nccl.h>

#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "stack_dump.h"

static int g_rank = -1;

#ifdef BRAID_CUDA_FAKE
unsigned long cuda_fake_copies(void);           /* tests/cuda_fake.c */
unsigned long long cuda_fake_pageable_bytes(void); /* tests/cuda_fake.c */
unsigned long cuda_fake_pointer_queries(void);     /* tests/cuda_fake.c */
unsigned long cuda_fake_devcoll_launches(void); /* tests/cuda_fake_devcoll.c */
#endif

/* BRAID_DEVCOLL=1: all-reduce and broadcast outside groups run as
 * device-collective kernels (cuda/device_coll_group.h). */
static int devcoll_mode(void)
{
    const char *v = getenv("BRAID_DEVCOLL");
    return v && strcmp(v, "1") == 0;
}

#define FAIL(...)                                                                                                      \
    do {                                                                                                               \
        fprintf(stderr, "rank %d: ", g_rank);                                                                          \
        fprintf(stderr, __VA_ARGS__);                                                                                  \
        fputc('\n', stderr);                                                                                           \
        return 1;                                                                                                      \
    } while (0)

#define CU(call)                                                                                                       \
    do {                                                                                                               \
        cudaError_t e_ = (call);                                                                                       \
        if (e_ != cudaSuccess)                                                                                         \
            FAIL("%s:%d: %s failed: %s", __FILE__, __LINE__, #call, cudaGetErrorString(e_));                           \
    } while (0)

#define NC(call)                                                                                                       \
    do {                                                                                                               \
        ncclResult_t r_ = (call);                                                                                      \
        if (r_ != ncclSuccess)                                                                                         \
            FAIL("%s:%d: %s failed: %s: %s", __FILE__, __LINE__, #call, ncclGetErrorString(r_),                        \
                 ncclGetLastError(NULL));                                                                              \
    } while (0)

enum { COUNT = (1 << 16) + 3 };

typedef struct {
    int rank, n;
    ncclComm_t comm;
    cudaStream_t s;
    int32_t *h;       /* host copy of a result, n * COUNT elements */
    int32_t *up[6];   /* sources of uploads still in flight (async copies read them later) */
    int nup;          /* next free up[]: reset once the stream is synchronized */
    int32_t *d0, *d1; /* device, n * COUNT elements each */
} ctx;

static int32_t *upload_buffer(ctx *c)
{
    if (c->nup == 6) {
        cudaStreamSynchronize(c->s);
        c->nup = 0;
    }
    return c->up[c->nup++];
}

static int32_t in_val(int rank, size_t i)
{
    return rank * 7 + (int32_t)(i % 101) - 50;
}

/* Fill d with the rank's input (elements [0, count)) by an async copy. */
static int put(ctx *c, int32_t *d, size_t count, int rank_of)
{
    int32_t *u = upload_buffer(c);
    for (size_t i = 0; i < count; i++)
        u[i] = in_val(rank_of, i);
    CU(cudaMemcpyAsync(d, u, count * 4, cudaMemcpyHostToDevice, c->s));
    return 0;
}

/* Poison the output then copy back after the call; check after a sync. */
static int fetch(ctx *c, const int32_t *d, size_t count)
{
    memset(c->h, 0x5A, count * 4);
    CU(cudaMemcpyAsync(c->h, d, count * 4, cudaMemcpyDeviceToHost, c->s));
    CU(cudaStreamSynchronize(c->s));
    c->nup = 0;
    return 0;
}

/* Bytes moved between device and pageable host memory so far: counted by
 * the stand-in only (a GPU run has no such counter, and passes). */
static unsigned long long pageable_bytes(void)
{
#ifdef BRAID_CUDA_FAKE
    return cuda_fake_pageable_bytes();
#else
    return 0;
#endif
}

/* Device calls go through braid's device path: pinned staging pieces, the
 * device ring or kernels, never a pageable host copy. Waits for the call
 * first, so every copy its job made is counted. */
static int no_pageable(ctx *c, unsigned long long before, const char *call)
{
    CU(cudaStreamSynchronize(c->s));
    unsigned long long moved = pageable_bytes() - before;
    if (moved)
        FAIL("%s moved %llu bytes through pageable host memory", call, moved);
    return 0;
}

static int32_t sum_val(int n, size_t i)
{
    int32_t s = 0;
    for (int r = 0; r < n; r++)
        s += in_val(r, i);
    return s;
}

static int test_allreduce(ctx *c)
{
    /* Out of place, sum. */
    if (put(c, c->d0, COUNT, c->rank))
        return 1;
#ifdef BRAID_CUDA_FAKE
    unsigned long kernels = cuda_fake_devcoll_launches();
#endif
    unsigned long long before = pageable_bytes();
    NC(ncclAllReduce(c->d0, c->d1, COUNT, ncclInt32, ncclSum, c->comm, c->s));
    if (no_pageable(c, before, "ncclAllReduce") || fetch(c, c->d1, COUNT))
        return 1;
#ifdef BRAID_CUDA_FAKE
    if (devcoll_mode() && c->n > 1 && cuda_fake_devcoll_launches() == kernels)
        FAIL("BRAID_DEVCOLL=1 but ncclAllReduce did not run as a device-collective kernel");
#endif
    for (size_t i = 0; i < COUNT; i++)
        if (c->h[i] != sum_val(c->n, i))
            FAIL("device all-reduce element %zu is %d, want %d", i, c->h[i], sum_val(c->n, i));
    /* In place, max, float. */
    float *hf = (float *)upload_buffer(c);
    for (size_t i = 0; i < COUNT; i++)
        hf[i] = (float)((int)(i % 13) * (c->rank + 1));
    CU(cudaMemcpyAsync(c->d0, hf, COUNT * 4, cudaMemcpyHostToDevice, c->s));
    hf = (float *)c->h;
    NC(ncclAllReduce(c->d0, c->d0, COUNT, ncclFloat32, ncclMax, c->comm, c->s));
    if (fetch(c, c->d0, COUNT))
        return 1;
    for (size_t i = 0; i < COUNT; i++)
        if (hf[i] != (float)((int)(i % 13) * c->n))
            FAIL("device in-place max element %zu is %g", i, hf[i]);
    return 0;
}

/* Device d gets a pattern no result has. */
static int poison(ctx *c, int32_t *d, size_t count)
{
    int32_t *u = upload_buffer(c);
    for (size_t i = 0; i < count; i++)
        u[i] = 0x5A5A5A5A;
    CU(cudaMemcpyAsync(d, u, count * 4, cudaMemcpyHostToDevice, c->s));
    return 0;
}

static int test_reduce_broadcast(ctx *c)
{
    int root = c->n - 1;
    if (put(c, c->d0, COUNT, c->rank) || poison(c, c->d1, COUNT))
        return 1;
    NC(ncclReduce(c->d0, c->d1, COUNT, ncclInt32, ncclSum, root, c->comm, c->s));
    if (fetch(c, c->d1, COUNT))
        return 1;
    for (size_t i = 0; i < COUNT; i++) {
        int32_t want = c->rank == root ? sum_val(c->n, i) : 0x5A5A5A5A;
        if (c->h[i] != want)
            FAIL("device reduce element %zu is %d, want %d", i, c->h[i], want);
    }
    /* Broadcast out of place from rank 0, then in place from the last. */
    if (put(c, c->d0, COUNT, c->rank) || poison(c, c->d1, COUNT))
        return 1;
    unsigned long long before = pageable_bytes();
    NC(ncclBroadcast(c->d0, c->d1, COUNT, ncclInt32, 0, c->comm, c->s));
    if (no_pageable(c, before, "ncclBroadcast") || fetch(c, c->d1, COUNT))
        return 1;
    for (size_t i = 0; i < COUNT; i++)
        if (c->h[i] != in_val(0, i))
            FAIL("device broadcast element %zu is %d", i, c->h[i]);
    if (put(c, c->d0, COUNT, c->rank))
        return 1;
    NC(ncclBcast(c->d0, COUNT, ncclInt32, root, c->comm, c->s));
    if (fetch(c, c->d0, COUNT))
        return 1;
    for (size_t i = 0; i < COUNT; i++)
        if (c->h[i] != in_val(root, i))
            FAIL("device in-place broadcast element %zu is %d", i, c->h[i]);
    return 0;
}

static int test_gather_scatter(ctx *c)
{
    size_t n = (size_t)c->n;
    /* All-gather, out of place and in place (own block of the output). */
    if (put(c, c->d0, COUNT, c->rank) || poison(c, c->d1, n * COUNT))
        return 1;
    unsigned long long before = pageable_bytes();
#ifdef BRAID_CUDA_FAKE
    unsigned long queries = cuda_fake_pointer_queries();
#endif
    NC(ncclAllGather(c->d0, c->d1, COUNT, ncclInt32, c->comm, c->s));
#ifdef BRAID_CUDA_FAKE
    /* Each buffer classified once, at the call: braid takes the shim's answers. */
    if (cuda_fake_pointer_queries() - queries != 2)
        FAIL("ncclAllGather classified its two buffers with %lu pointer queries",
             cuda_fake_pointer_queries() - queries);
#endif
    if (no_pageable(c, before, "ncclAllGather") || fetch(c, c->d1, n * COUNT))
        return 1;
    for (size_t r = 0; r < n; r++)
        for (size_t i = 0; i < COUNT; i++)
            if (c->h[r * COUNT + i] != in_val((int)r, i))
                FAIL("device all-gather block %zu element %zu is %d", r, i, c->h[r * COUNT + i]);
    int32_t *own = c->d1 + (size_t)c->rank * COUNT;
    if (poison(c, c->d1, n * COUNT) || put(c, own, COUNT, c->rank))
        return 1;
    NC(ncclAllGather(own, c->d1, COUNT, ncclInt32, c->comm, c->s));
    if (fetch(c, c->d1, n * COUNT))
        return 1;
    for (size_t r = 0; r < n; r++)
        for (size_t i = 0; i < COUNT; i++)
            if (c->h[r * COUNT + i] != in_val((int)r, i))
                FAIL("device in-place all-gather block %zu element %zu is %d", r, i, c->h[r * COUNT + i]);

    /* Reduce-scatter: the input is n blocks; block b of rank r holds
     * in_val(r + b, i). Out of place, then in place. */
    for (int pass = 0; pass < 2; pass++) {
        int32_t *u = upload_buffer(c);
        for (size_t b = 0; b < n; b++)
            for (size_t i = 0; i < COUNT; i++)
                u[b * COUNT + i] = in_val(c->rank + (int)b, i);
        CU(cudaMemcpyAsync(c->d0, u, n * COUNT * 4, cudaMemcpyHostToDevice, c->s));
        int32_t *out = pass ? c->d0 + (size_t)c->rank * COUNT : c->d1;
        before = pageable_bytes();
        NC(ncclReduceScatter(c->d0, out, COUNT, ncclInt32, ncclSum, c->comm, c->s));
        if (no_pageable(c, before, "ncclReduceScatter") || fetch(c, out, COUNT))
            return 1;
        for (size_t i = 0; i < COUNT; i++) {
            int32_t want = 0;
            for (int r = 0; r < c->n; r++)
                want += in_val(r + c->rank, i);
            if (c->h[i] != want)
                FAIL("device reduce-scatter (%s) element %zu is %d, want %d", pass ? "in place" : "out of place", i,
                     c->h[i], want);
        }
    }
    return 0;
}

/* Send and receive on device buffers: a ring in both directions in one
 * group, sends posted before the receives. */
static int test_send_recv(ctx *c)
{
    int next = (c->rank + 1) % c->n, prev = (c->rank + c->n - 1) % c->n;
    int32_t *to_next = c->d0, *to_prev = c->d0 + COUNT, *from_prev = c->d1, *from_next = c->d1 + COUNT;
    if (put(c, to_next, COUNT, c->rank) || put(c, to_prev, COUNT, c->rank + 1000) ||
        poison(c, from_prev, COUNT) || poison(c, from_next, COUNT))
        return 1;
    unsigned long long before = pageable_bytes();
    NC(ncclGroupStart());
    NC(ncclSend(to_next, COUNT, ncclInt32, next, c->comm, c->s));
    NC(ncclSend(to_prev, COUNT, ncclInt32, prev, c->comm, c->s));
    NC(ncclRecv(from_prev, COUNT, ncclInt32, prev, c->comm, c->s));
    NC(ncclRecv(from_next, COUNT, ncclInt32, next, c->comm, c->s));
    NC(ncclGroupEnd());
    if (no_pageable(c, before, "grouped ncclSend/ncclRecv") || fetch(c, c->d1, 2 * COUNT))
        return 1;
    for (size_t i = 0; i < COUNT; i++)
        if (c->h[i] != in_val(prev, i) || c->h[COUNT + i] != in_val(next + 1000, i))
            FAIL("device ring exchange element %zu: %d %d", i, c->h[i], c->h[COUNT + i]);
    /* Outside a group, to a neighbour in rank order (0 sends first). */
    if (c->n == 2) {
        if (c->rank == 0) {
            if (put(c, c->d0, COUNT, 0))
                return 1;
            NC(ncclSend(c->d0, COUNT, ncclInt32, 1, c->comm, c->s));
        } else {
            if (poison(c, c->d1, COUNT))
                return 1;
            NC(ncclRecv(c->d1, COUNT, ncclInt32, 0, c->comm, c->s));
            if (fetch(c, c->d1, COUNT))
                return 1;
            for (size_t i = 0; i < COUNT; i++)
                if (c->h[i] != in_val(0, i))
                    FAIL("device send/recv element %zu is %d", i, c->h[i]);
        }
        CU(cudaStreamSynchronize(c->s));
    }
    return 0;
}

/* Collectives on two streams in one group, a host call after device
 * calls (it must see them), PreMulSum, ncclMemAlloc, a refused op. */
static int test_mixed(ctx *c)
{
    cudaStream_t s2;
    CU(cudaStreamCreate(&s2));
    int32_t *g = c->d1;
    if (put(c, c->d0, COUNT, c->rank) || poison(c, g, (size_t)c->n * COUNT))
        return 1;
    CU(cudaStreamSynchronize(c->s));
    unsigned long long before = pageable_bytes();
    NC(ncclGroupStart());
    NC(ncclAllReduce(c->d0, c->d0, COUNT, ncclInt32, ncclSum, c->comm, c->s));
    NC(ncclAllGather(c->d0, g, COUNT, ncclInt32, c->comm, s2)); /* after the all-reduce, in the group's order */
    NC(ncclGroupEnd());
    CU(cudaStreamSynchronize(s2));
    if (no_pageable(c, before, "a group of device collectives") || fetch(c, g, (size_t)c->n * COUNT))
        return 1;
    for (int r = 0; r < c->n; r++)
        for (size_t i = 0; i < COUNT; i++)
            if (c->h[(size_t)r * COUNT + i] != sum_val(c->n, i))
                FAIL("grouped device all-gather block %d element %zu is %d", r, i, c->h[(size_t)r * COUNT + i]);
    CU(cudaStreamDestroy(s2));

    /* A broadcast out of place in a group reads its input when the group
     * runs: the sum the all-reduce before it wrote. */
    if (put(c, c->d0, COUNT, c->rank) || poison(c, g, COUNT))
        return 1;
    NC(ncclGroupStart());
    NC(ncclAllReduce(c->d0, c->d0, COUNT, ncclInt32, ncclSum, c->comm, c->s));
    NC(ncclBroadcast(c->d0, g, COUNT, ncclInt32, 0, c->comm, c->s));
    NC(ncclGroupEnd());
    if (fetch(c, g, COUNT))
        return 1;
    for (size_t i = 0; i < COUNT; i++)
        if (c->h[i] != sum_val(c->n, i))
            FAIL("grouped device broadcast after an all-reduce: element %zu is %d, want %d", i, c->h[i],
                 sum_val(c->n, i));

    /* Device all-reduce, then a host all-reduce with a NULL stream: the
     * host call runs after it (braid sees the calls in issue order). */
    if (put(c, c->d0, COUNT, c->rank))
        return 1;
    NC(ncclAllReduce(c->d0, c->d0, COUNT, ncclInt32, ncclSum, c->comm, c->s));
    int32_t host[16];
    for (int i = 0; i < 16; i++)
        host[i] = c->rank;
    NC(ncclAllReduce(host, host, 16, ncclInt32, ncclSum, c->comm, NULL));
    for (int i = 0; i < 16; i++)
        if (host[i] != c->n * (c->n - 1) / 2)
            FAIL("host all-reduce after a device one: element %d is %d", i, host[i]);
    if (fetch(c, c->d0, COUNT))
        return 1;
    for (size_t i = 0; i < COUNT; i++)
        if (c->h[i] != sum_val(c->n, i))
            FAIL("device all-reduce before a host one: element %zu is %d", i, c->h[i]);

    /* Host buffers on a stream: the call waits for the work queued on it
     * (here a copy into the host buffer) before reading them. */
    int32_t *hb = upload_buffer(c);
    if (put(c, c->d0, COUNT, c->rank))
        return 1;
    NC(ncclAllReduce(c->d0, c->d0, COUNT, ncclInt32, ncclSum, c->comm, c->s));
    CU(cudaMemcpyAsync(hb, c->d0, COUNT * 4, cudaMemcpyDeviceToHost, c->s));
    NC(ncclAllReduce(hb, hb, COUNT, ncclInt32, ncclSum, c->comm, c->s));
    for (size_t i = 0; i < COUNT; i++)
        if (hb[i] != c->n * sum_val(c->n, i))
            FAIL("host all-reduce on a stream: element %zu is %d, want %d", i, hb[i], c->n * sum_val(c->n, i));
    CU(cudaStreamSynchronize(c->s));
    c->nup = 0;

    /* PreMulSum with a device scalar, on device buffers. */
    int32_t *dk;
    int32_t three = 3;
    CU(cudaMalloc((void **)&dk, sizeof(three)));
    CU(cudaMemcpy(dk, &three, sizeof(three), cudaMemcpyHostToDevice));
    ncclRedOp_t pm;
    NC(ncclRedOpCreatePreMulSum(&pm, dk, ncclInt32, ncclScalarDevice, c->comm));
    if (put(c, c->d0, COUNT, c->rank))
        return 1;
    before = pageable_bytes();
    NC(ncclAllReduce(c->d0, c->d1, COUNT, ncclInt32, pm, c->comm, c->s));
    if (no_pageable(c, before, "PreMulSum ncclAllReduce") || fetch(c, c->d1, COUNT))
        return 1;
    for (size_t i = 0; i < COUNT; i++)
        if (c->h[i] != 3 * sum_val(c->n, i))
            FAIL("device PreMulSum element %zu is %d", i, c->h[i]);
    NC(ncclRedOpDestroy(pm, c->comm));
    CU(cudaFree(dk));

    /* ncclMemAlloc: device memory, usable as a buffer. */
    void *mem;
    NC(ncclMemAlloc(&mem, COUNT * 4));
    struct cudaPointerAttributes attr;
    CU(cudaPointerGetAttributes(&attr, mem));
    if (attr.type != cudaMemoryTypeDevice)
        FAIL("ncclMemAlloc returned memory of type %d, not device memory", (int)attr.type);
    if (put(c, mem, COUNT, c->rank))
        return 1;
    NC(ncclAllReduce(mem, mem, COUNT, ncclInt32, ncclSum, c->comm, c->s));
    if (fetch(c, mem, COUNT))
        return 1;
    for (size_t i = 0; i < COUNT; i++)
        if (c->h[i] != sum_val(c->n, i))
            FAIL("all-reduce on ncclMemAlloc memory: element %zu is %d", i, c->h[i]);
    NC(ncclMemFree(mem));

    /* What braid cannot do is refused at the call, on device buffers too. */
    ncclResult_t r = ncclAllReduce(c->d0, c->d0, COUNT, ncclFloat8e4m3, ncclSum, c->comm, c->s);
    if (r != ncclInvalidUsage || !strstr(ncclGetLastError(NULL), "fp8"))
        FAIL("fp8 sum on device buffers gave %s: %s", ncclGetErrorString(r), ncclGetLastError(NULL));
    /* Unsigned max compares as unsigned: a negative int32 input is the largest. */
    if (put(c, c->d0, COUNT, c->rank))
        return 1;
    NC(ncclAllReduce(c->d0, c->d0, COUNT, ncclUint32, ncclMax, c->comm, c->s));
    if (fetch(c, c->d0, COUNT))
        return 1;
    for (size_t i = 0; i < COUNT; i++) {
        uint32_t want = 0;
        for (int p = 0; p < c->n; p++)
            want = (uint32_t)in_val(p, i) > want ? (uint32_t)in_val(p, i) : want;
        if ((uint32_t)c->h[i] != want)
            FAIL("u32 max on device buffers: element %zu is %u, want %u", i, (uint32_t)c->h[i], want);
    }
    ncclResult_t async;
    NC(ncclCommGetAsyncError(c->comm, &async));
    if (async != ncclSuccess)
        FAIL("async error %s: %s", ncclGetErrorString(async), ncclGetLastError(NULL));
    return 0;
}

/* CUDA graph capture: a staged call is refused at the call (its gate
 * would be baked into the graph and pass at once on replay, and its
 * copies are not captured), and so is an all-reduce where device
 * collectives are off. With them on, the all-reduce is captured as one
 * kernel, and the graph, replayed, gives the sum (on a GPU: the stand-in
 * records work under capture but does not replay graphs). */
static int test_capture(ctx *c)
{
    if (put(c, c->d0, COUNT, c->rank))
        return 1;
    CU(cudaStreamSynchronize(c->s));
    c->nup = 0;
    cudaGraph_t g = NULL;
    CU(cudaStreamBeginCapture(c->s, cudaStreamCaptureModeRelaxed));
    ncclResult_t gather = ncclAllGather(c->d0, c->d1, COUNT, ncclInt32, c->comm, c->s), reduce = ncclSuccess;
    int replay = 0;
#ifndef BRAID_CUDA_FAKE
    replay = devcoll_mode();
#endif
    if (!devcoll_mode() || replay)
        reduce = ncclAllReduce(c->d0, c->d1, COUNT, ncclInt32, ncclSum, c->comm, c->s);
    cudaError_t end = cudaStreamEndCapture(c->s, &g);
    if (gather != ncclInvalidUsage)
        FAIL("ncclAllGather on a capturing stream returned %s, want ncclInvalidUsage", ncclGetErrorString(gather));
    if (!devcoll_mode() && reduce == ncclSuccess)
        FAIL("ncclAllReduce on a capturing stream without device collectives was accepted");
    if (end != cudaSuccess)
        FAIL("the capture ended with %s: a refused call touched the stream", cudaGetErrorString(end));
#ifndef BRAID_CUDA_FAKE
    if (replay) {
        if (reduce != ncclSuccess)
            FAIL("captured ncclAllReduce failed: %s", ncclGetLastError(NULL));
        cudaGraphExec_t exec;
        CU(cudaGraphInstantiate(&exec, g, 0));
        for (int k = 0; k < 2; k++) { /* a replay reuses the region's counters: twice */
            if (poison(c, c->d1, COUNT))
                return 1;
            CU(cudaGraphLaunch(exec, c->s));
            if (fetch(c, c->d1, COUNT))
                return 1;
            for (size_t i = 0; i < COUNT; i++)
                if (c->h[i] != sum_val(c->n, i))
                    FAIL("replayed all-reduce %d element %zu is %d, want %d", k, i, c->h[i], sum_val(c->n, i));
        }
        CU(cudaGraphExecDestroy(exec));
    }
#endif
    CU(cudaGraphDestroy(g));
    return 0;
}

static int rank_main(int rank, int n, ncclUniqueId id)
{
    g_rank = rank;
    int ndev = 0;
    CU(cudaGetDeviceCount(&ndev));
    CU(cudaSetDevice(rank % ndev));
    ctx c = {.rank = rank, .n = n};
    CU(cudaStreamCreate(&c.s));
    c.h = malloc((size_t)n * COUNT * 4);
    for (int i = 0; i < 6; i++)
        if (!(c.up[i] = malloc((size_t)n * COUNT * 4)))
            c.h = NULL;
    if (!c.h)
        FAIL("out of host memory");
    CU(cudaMalloc((void **)&c.d0, (size_t)n * COUNT * 4));
    CU(cudaMalloc((void **)&c.d1, (size_t)n * COUNT * 4));
    NC(ncclCommInitRank(&c.comm, n, id, rank));
    if (test_allreduce(&c) || test_reduce_broadcast(&c) || test_gather_scatter(&c) || test_send_recv(&c) ||
        test_mixed(&c) || test_capture(&c))
        return 1;
    NC(ncclCommFinalize(c.comm));
    NC(ncclCommDestroy(c.comm));
    CU(cudaStreamSynchronize(c.s));
    CU(cudaStreamDestroy(c.s));
    CU(cudaFree(c.d0));
    CU(cudaFree(c.d1));
    for (int i = 0; i < 6; i++)
        free(c.up[i]);
    free(c.h);
    return 0;
}

static double now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

/* Failures after the call returned. Rank 0 enqueues a device receive that
 * never matches: (1) its peer exits, so the operation fails on the worker:
 * the stream is still released and ncclCommGetAsyncError reports it;
 * (2) the peer stays, and ncclCommAbort ends the operation promptly and
 * releases the stream. */
/* A fault case's rank: device 0, a stream, a device buffer of COUNT
 * int32, the communicator. */
static int fault_setup(int rank, int n, ncclUniqueId id, cudaStream_t *s, int32_t **d, ncclComm_t *comm)
{
    g_rank = rank;
    CU(cudaSetDevice(0));
    CU(cudaStreamCreate(s));
    CU(cudaMalloc((void **)d, COUNT * 4));
    NC(ncclCommInitRank(comm, n, id, rank));
    return 0;
}

static int fault_main(int rank, int n, ncclUniqueId id, int peer_exits)
{
    cudaStream_t s;
    int32_t *d;
    ncclComm_t comm;
    if (fault_setup(rank, n, id, &s, &d, &comm))
        return 1;
    int32_t one = 1, sum = 0;
    NC(ncclAllReduce(&one, &sum, 1, ncclInt32, ncclSum, comm, NULL)); /* everyone connected */
    if (rank != 0) {
        if (peer_exits)
            _exit(0); /* dies with rank 0's receive pending */
        struct timespec s2 = {2, 0};
        nanosleep(&s2, NULL); /* never sends */
        NC(ncclCommDestroy(comm));
        return 0;
    }
    double t0 = now();
    NC(ncclRecv(d, COUNT, ncclInt32, 1, comm, s));
    if (now() - t0 > 1.0)
        FAIL("a device receive blocked the caller for %.1f s", now() - t0);
    if (peer_exits) {
        CU(cudaStreamSynchronize(s));
        ncclResult_t async = ncclSuccess;
        NC(ncclCommGetAsyncError(comm, &async));
        if (async == ncclSuccess)
            FAIL("the failed device receive left no asynchronous error");
        if (!strstr(ncclGetLastError(NULL), "ncclRecv"))
            FAIL("asynchronous error text \"%s\" does not name the call", ncclGetLastError(NULL));
        if (ncclCommFinalize(comm) == ncclSuccess)
            FAIL("ncclCommFinalize hid the asynchronous error");
        NC(ncclCommAbort(comm));
    } else {
        struct timespec ms200 = {0, 200 * 1000 * 1000};
        nanosleep(&ms200, NULL);
        NC(ncclCommAbort(comm));
        CU(cudaStreamSynchronize(s));
    }
    if (now() - t0 > 10.0)
        FAIL("the failed device receive took %.1f s to release its stream", now() - t0);
    CU(cudaStreamDestroy(s));
    CU(cudaFree(d));
    return 0;
}

/* BRAID_DEVCOLL=1: rank 1 exits between two all-reduces. Rank 0's second
 * call returns at once; its kernel gives up within the timeout and
 * ncclCommGetAsyncError reports it, naming rank 1. Where rank 0 has already
 * seen the exit when it makes the call (it was descheduled, say), the call
 * itself fails at once with the same error. */
static int devcoll_fault_main(int rank, int n, ncclUniqueId id)
{
    setenv("BRAID_TIMEOUT_MS", "2000", 1);
    cudaStream_t s;
    int32_t *d;
    ncclComm_t comm;
    if (fault_setup(rank, n, id, &s, &d, &comm))
        return 1;
    NC(ncclAllReduce(d, d, COUNT, ncclInt32, ncclSum, comm, s));
    CU(cudaStreamSynchronize(s));
    if (rank != 0)
        _exit(0);
    double t0 = now();
    ncclResult_t second = ncclAllReduce(d, d, COUNT, ncclInt32, ncclSum, comm, s);
    if (now() - t0 > 1.0)
        FAIL("a device all-reduce blocked the caller for %.1f s", now() - t0);
    if (second == ncclSuccess) {
        CU(cudaStreamSynchronize(s));
        if (now() - t0 > 10.0)
            FAIL("the kernel took %.1f s to give up against a 2 s timeout", now() - t0);
        NC(ncclCommGetAsyncError(comm, &second));
    }
    if (second != ncclRemoteError)
        FAIL("error %d after the peer died, want ncclRemoteError", (int)second);
    if (!strstr(ncclGetLastError(NULL), "rank 1"))
        FAIL("error text \"%s\" does not name rank 1", ncclGetLastError(NULL));
    NC(ncclCommAbort(comm));
    CU(cudaStreamDestroy(s));
    CU(cudaFree(d));
    return 0;
}

/* ncclCommInitAll: three ranks in one process, driven from one thread with
 * a group, each on its own stream and device buffers (one device worker
 * per communicator, running concurrently). */
static int init_all_main(void)
{
    g_rank = 0;
    enum { ND = 3 };
    ncclComm_t comms[ND];
    cudaStream_t s[ND];
    int32_t *d[ND], *h[ND];
    NC(ncclCommInitAll(comms, ND, NULL));
    CU(cudaSetDevice(0));
    for (int k = 0; k < ND; k++) {
        CU(cudaStreamCreate(&s[k]));
        CU(cudaMalloc((void **)&d[k], COUNT * 4));
        if (!(h[k] = malloc(COUNT * 4)))
            FAIL("out of host memory");
        for (size_t i = 0; i < COUNT; i++)
            h[k][i] = in_val(k, i);
        CU(cudaMemcpyAsync(d[k], h[k], COUNT * 4, cudaMemcpyHostToDevice, s[k]));
    }
    NC(ncclGroupStart());
    for (int k = 0; k < ND; k++)
        NC(ncclAllReduce(d[k], d[k], COUNT, ncclInt32, ncclSum, comms[k], s[k]));
    NC(ncclGroupEnd());
    for (int k = 0; k < ND; k++) {
        CU(cudaStreamSynchronize(s[k])); /* the upload has run: h[k] is free again */
        CU(cudaMemcpyAsync(h[k], d[k], COUNT * 4, cudaMemcpyDeviceToHost, s[k]));
        CU(cudaStreamSynchronize(s[k]));
        for (size_t i = 0; i < COUNT; i++)
            if (h[k][i] != sum_val(ND, i))
                FAIL("ncclCommInitAll device all-reduce comm %d element %zu is %d", k, i, h[k][i]);
    }
    for (int k = 0; k < ND; k++) {
        NC(ncclCommDestroy(comms[k]));
        CU(cudaStreamDestroy(s[k]));
        CU(cudaFree(d[k]));
        free(h[k]);
    }
    return 0;
}

/* Ranks as threads of one process, one communicator each, as nccl-tests
 * -t N runs them on one GPU: calls queued on each thread's own stream
 * (blocking) without synchronizing in between, then checked. CUDA runs
 * every host function of a process on one callback thread, so a stream
 * gate that blocks there would hold the other rank's stream. */
enum { TH_RANKS = 2, TH_CALLS = 4 };

typedef struct {
    int rank;
    ncclUniqueId id;
    int failed;
} th_arg;

static int thread_rank(th_arg *a)
{
    int rank = a->rank;
    ncclComm_t comm;
    cudaStream_t s;
    int32_t *d[TH_CALLS], *h[TH_CALLS];
    CU(cudaSetDevice(0));
    NC(ncclCommInitRank(&comm, TH_RANKS, a->id, rank));
    CU(cudaStreamCreate(&s));
    for (int k = 0; k < TH_CALLS; k++) {
        if (!(h[k] = malloc(COUNT * 4)))
            FAIL("out of host memory");
        for (size_t i = 0; i < COUNT; i++)
            h[k][i] = in_val(rank, i) + k;
        CU(cudaMalloc((void **)&d[k], COUNT * 4));
        CU(cudaMemcpyAsync(d[k], h[k], COUNT * 4, cudaMemcpyHostToDevice, s));
    }
    for (int k = 0; k < TH_CALLS; k++) {
        if (k % 2)
            NC(ncclBroadcast(d[k], d[k], COUNT, ncclInt32, k % TH_RANKS, comm, s));
        else
            NC(ncclAllReduce(d[k], d[k], COUNT, ncclInt32, ncclSum, comm, s));
    }
    for (int k = 0; k < TH_CALLS; k++)
        CU(cudaMemcpyAsync(h[k], d[k], COUNT * 4, cudaMemcpyDeviceToHost, s));
    CU(cudaStreamSynchronize(s));
    for (int k = 0; k < TH_CALLS; k++)
        for (size_t i = 0; i < COUNT; i++) {
            int32_t want = k % 2 ? in_val(k % TH_RANKS, i) + k : sum_val(TH_RANKS, i) + TH_RANKS * k;
            if (h[k][i] != want)
                FAIL("thread rank %d: call %d element %zu is %d, want %d", rank, k, i, h[k][i], want);
        }
    NC(ncclCommDestroy(comm));
    CU(cudaStreamDestroy(s));
    for (int k = 0; k < TH_CALLS; k++) {
        CU(cudaFree(d[k]));
        free(h[k]);
    }
    return 0;
}

static void *thread_main(void *p)
{
    th_arg *a = p;
    a->failed = thread_rank(a);
    return NULL;
}

static int threads_main(void)
{
    g_rank = 0;
    ncclUniqueId id;
    NC(ncclGetUniqueId(&id));
    th_arg a[TH_RANKS];
    pthread_t t[TH_RANKS];
    for (int r = 0; r < TH_RANKS; r++) {
        a[r] = (th_arg){.rank = r, .id = id};
        if (pthread_create(&t[r], NULL, thread_main, &a[r]) != 0)
            FAIL("cannot start thread %d", r);
    }
    int failed = 0;
    for (int r = 0; r < TH_RANKS; r++) {
        pthread_join(t[r], NULL);
        failed |= a[r].failed;
    }
    return failed;
}

/* One rank: a collective on device buffers is a copy on the caller's
 * stream (nothing in place), ordered like any other work there. */
static int one_rank_main(void)
{
    g_rank = 0;
    ncclUniqueId id;
    ncclComm_t comm;
    cudaStream_t s;
    int32_t *d0, *d1, *h = malloc(COUNT * 4), *want = malloc(COUNT * 4);
    if (!h || !want)
        FAIL("out of host memory");
    CU(cudaSetDevice(0));
    NC(ncclGetUniqueId(&id));
    NC(ncclCommInitRank(&comm, 1, id, 0));
    CU(cudaStreamCreate(&s));
    CU(cudaMalloc((void **)&d0, COUNT * 4));
    CU(cudaMalloc((void **)&d1, COUNT * 4));
    for (size_t i = 0; i < COUNT; i++)
        want[i] = in_val(0, i);
    CU(cudaMemcpyAsync(d0, want, COUNT * 4, cudaMemcpyHostToDevice, s));
#ifdef BRAID_CUDA_FAKE
    unsigned long copies = cuda_fake_copies();
#endif
    NC(ncclAllReduce(d0, d1, COUNT, ncclInt32, ncclSum, comm, s));
    NC(ncclAllReduce(d1, d1, COUNT, ncclInt32, ncclAvg, comm, s));
    NC(ncclAllGather(d1, d0, COUNT, ncclInt32, comm, s));
#ifdef BRAID_CUDA_FAKE
    if (cuda_fake_copies() - copies != 2)
        FAIL("one-rank collectives made %lu copies, want 2 (out of place, in place, out of place)",
             cuda_fake_copies() - copies);
#endif
    CU(cudaMemcpyAsync(h, d0, COUNT * 4, cudaMemcpyDeviceToHost, s));
    CU(cudaStreamSynchronize(s));
    if (memcmp(h, want, COUNT * 4) != 0)
        FAIL("one-rank device collectives changed the data");
    NC(ncclCommDestroy(comm));
    CU(cudaStreamDestroy(s));
    CU(cudaFree(d0));
    CU(cudaFree(d1));
    free(h);
    free(want);
    return 0;
}

static int run_job(int n, int fault)
{
    ncclUniqueId id;
    if (ncclGetUniqueId(&id) != ncclSuccess) {
        fprintf(stderr, "ncclGetUniqueId: %s\n", ncclGetLastError(NULL));
        return 1;
    }
    pid_t pids[8];
    for (int r = 0; r < n; r++) {
        fflush(NULL);
        if ((pids[r] = fork()) == 0) {
            int rc = fault < 0    ? rank_main(r, n, id)
                     : fault == 2 ? devcoll_fault_main(r, n, id)
                                  : fault_main(r, n, id, fault);
            fflush(NULL);
            _exit(rc);
        }
    }
    int failed = 0;
    for (int r = 0; r < n; r++) {
        char what[64];
        snprintf(what, sizeof(what), "%d ranks: rank %d", n, r);
        int rc = stack_dump_wait(pids[r], 120, what);
        if (rc != 0) {
            fprintf(stderr, "%s failed (%s %d)\n", what, rc == 124 ? "killed after 120 s:" : "exit", rc);
            failed = 1;
        }
    }
    printf("%d ranks%s: %s\n", n,
           fault < 0    ? ""
           : fault == 2 ? ", peer exits between device-collective kernels"
           : fault      ? ", peer exits during a device receive"
                        : ", abort during a device receive",
           failed ? "FAILED" : "ok");
    return failed;
}

int main(void)
{
    /* Probe in a child: CUDA must not be initialised in a process that forks. */
    fflush(NULL);
    pid_t probe = fork();
    if (probe == 0) {
        int ndev = 0;
        cudaError_t e = cudaGetDeviceCount(&ndev);
        if (e != cudaSuccess || ndev == 0) {
            printf("skipping: no CUDA device: %s\n", e != cudaSuccess ? cudaGetErrorString(e) : "0 devices");
            fflush(NULL);
            _exit(77);
        }
        _exit(0);
    }
    int status;
    waitpid(probe, &status, 0);
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
        return WIFEXITED(status) && WEXITSTATUS(status) == 77 ? 77 : 1;
    int failed = run_job(2, -1);
    failed |= run_job(3, -1);
    failed |= run_job(2, 1);
    failed |= run_job(2, 0);
    if (devcoll_mode())
        failed |= run_job(2, 2);
    failed |= stack_dump_run_case(init_all_main, "ncclCommInitAll(3) on device buffers from one thread", 120);
    failed |= stack_dump_run_case(threads_main, "2 ranks as threads of one process", 120);
    failed |= stack_dump_run_case(one_rank_main, "1 rank: copies on the caller's stream", 60);
    return failed;
}
