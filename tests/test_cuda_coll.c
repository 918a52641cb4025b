/* All-reduce and broadcast on CUDA device buffers across forked ranks
 * (several ranks may share one GPU: rank r uses device r % devices).
 * Each result is compared bit for bit with the same call on host buffers
 * holding the same data, run through braid's CPU path in the same rank:
 * the CPU reference. Inputs are small integers, exact in every dtype, so
 * the comparison does not depend on how the staging splits the buffer.
 *
 * Covers: every dtype x op, odd counts, in place and out of place, one
 * staging piece and several (src/calls/hmem.h; above one piece all-reduce runs
 * as the device ring with kernels), a host rank in a device ring, blocking calls, work handles
 * with the caller's stream ordered both ways (an unsynchronized copy in
 * before the call, a copy out after it), the legacy default stream, a
 * call on an aborted group (fails, and does not hold the caller's stream),
 * every other collective, send/recv and groups of them on device buffers
 * (kinds_*: against the same calls on host buffers, with no byte through
 * pageable memory on the stand-in), and the bucketer on device gradients.
 *
 * Exits 77 (meson: skipped) with braid__cuda_unavailable_reason() when the
 * build has no CUDA or the machine no usable device. CUDA does not survive
 * fork, so the parent never touches it: a throwaway child probes. */
#include <check.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "braid_cuda.h"
#include "harness.h"
#include "hmem.h"

#ifdef BRAID_HAVE_CUDA
#include <cuda_runtime_api.h>

/* BRAID_DEVCOLL=1: device all-reduces and broadcasts run as kernels over
 * mapped regions (cuda/device_coll_group.h), where every rank must pass
 * device memory: the cases that mix host and device ranks, or test the
 * device links, are left out. */
static int devcoll_mode(void)
{
    const char *v = getenv("BRAID_DEVCOLL");
    return v && strcmp(v, "1") == 0;
}

#ifdef BRAID_CUDA_FAKE
#include "devlink.h"
#include "pg.h"
unsigned long cuda_fake_kernel_launches(void); /* tests/cuda_fake.c */
unsigned long cuda_fake_devcoll_launches(void); /* tests/cuda_fake_devcoll.c */
unsigned long cuda_fake_copies(void);           /* tests/cuda_fake.c */
unsigned long long cuda_fake_d2h_bytes(void);   /* tests/cuda_fake.c */
unsigned long long cuda_fake_pageable_bytes(void); /* tests/cuda_fake.c */
#endif

static const braid_dtype all_dtypes[] = {BRAID_F32, BRAID_F64, BRAID_F16, BRAID_BF16,
                                         BRAID_I8,  BRAID_U8,  BRAID_I32, BRAID_I64};
static const braid_op all_ops[] = {BRAID_SUM, BRAID_PROD, BRAID_MIN, BRAID_MAX, BRAID_AVG};

#define CU(call)                                                                               \
    do {                                                                                       \
        cudaError_t e_ = (call);                                                               \
        if (e_ != cudaSuccess)                                                                 \
            HARNESS_FAIL("rank %d: %s: %s", rank, #call, cudaGetErrorString(e_));              \
    } while (0)

static int pick_device(int rank)
{
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess || n <= 0)
        HARNESS_FAIL("rank %d: no CUDA device in the rank", rank);
    CU(cudaSetDevice(rank % n));
    return 0;
}

static double input(int rank, size_t i, uint32_t seed, braid_dtype t, braid_op op)
{
    int lo = -8, hi = 8;
    if (op == BRAID_PROD)
        lo = t == BRAID_U8 ? 0 : -2, hi = 2;
    else if (t == BRAID_U8)
        lo = 0, hi = 20;
    return (double)harness_value(rank, i, seed, lo, hi);
}

/* How a case uses the stream. */
typedef enum {
    MODE_BLOCKING,   /* own stream, work NULL */
    MODE_ASYNC,      /* own stream, work handle; copies in/out queued on the stream unsynchronized */
    MODE_LEGACY,     /* stream NULL (legacy default), work handle */
} mode;

/* One all-reduce on device buffers vs the host path; 0 when equal. */
static int check_allreduce(braid_pg *pg, braid_dtype t, braid_op op, size_t count, int in_place, mode m,
                           uint32_t seed)
{
    int rank = braid_pg_rank(pg);
    size_t es = braid_dtype_size(t), bytes = count * es;
    unsigned char *host = malloc(bytes + 1), *ref = malloc(bytes + 1), *out = malloc(bytes + 1);
    if (!host || !ref || !out)
        HARNESS_FAIL("rank %d: out of memory", rank);
    for (size_t i = 0; i < count; i++)
        harness_store(t, host, i, input(rank, i, seed, t, op));
    memcpy(ref, host, bytes);
    if (braid_allreduce(pg, ref, ref, count, t, op, NULL, NULL) != BRAID_OK)
        HARNESS_FAIL("rank %d: host reference allreduce: %s", rank, braid_last_error());

    void *dsend = NULL, *drecv = NULL;
    cudaStream_t s = NULL;
    CU(cudaMalloc(&dsend, bytes + 1));
    if (!braid__mem_is_device(dsend))
        HARNESS_FAIL("rank %d: cudaMalloc'd memory not seen as device memory", rank);
    drecv = dsend;
    if (!in_place)
        CU(cudaMalloc(&drecv, bytes + 1));
    if (m != MODE_LEGACY)
        CU(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    CU(cudaMemset(drecv, 0xA5, bytes + 1));
    CU(cudaDeviceSynchronize());
    /* Not synchronized: the call must see this copy through the stream. */
    CU(cudaMemcpyAsync(dsend, host, bytes, cudaMemcpyHostToDevice, s));
    braid_work *w = NULL;
    if (braid_allreduce(pg, dsend, drecv, count, t, op, s, m == MODE_BLOCKING ? NULL : &w) != BRAID_OK)
        HARNESS_FAIL("rank %d: device allreduce(count=%zu dtype=%d op=%d): %s", rank, count, t, op,
                     braid_last_error());
    /* Queued behind the call on the same stream: must see the result. */
    CU(cudaMemcpyAsync(out, drecv, bytes + 1, cudaMemcpyDeviceToHost, s));
    CU(cudaStreamSynchronize(s));
    if (w) {
        if (braid_wait(w, -1) != BRAID_OK)
            HARNESS_FAIL("rank %d: wait: %s", rank, braid_last_error());
        braid_work_free(w);
    }
    for (size_t i = 0; i < count; i++)
        if (memcmp(out + i * es, ref + i * es, es) != 0)
            HARNESS_FAIL("rank %d of %d: device allreduce dtype=%d op=%d count=%zu %s mode=%d: element %zu is %g, "
                         "host path gives %g",
                         rank, braid_pg_size(pg), t, op, count, in_place ? "in-place" : "out-of-place", (int)m, i,
                         harness_load(t, out, i), harness_load(t, ref, i));
    if (out[bytes] != 0xA5)
        HARNESS_FAIL("rank %d: device allreduce wrote past the end of recv", rank);
    if (s)
        CU(cudaStreamDestroy(s));
    if (!in_place)
        CU(cudaFree(drecv));
    CU(cudaFree(dsend));
    free(host);
    free(ref);
    free(out);
    return 0;
}

static int check_broadcast(braid_pg *pg, size_t bytes, int root, mode m, uint32_t seed)
{
    int rank = braid_pg_rank(pg);
    unsigned char *host = malloc(bytes + 1), *out = malloc(bytes + 1);
    if (!host || !out)
        HARNESS_FAIL("rank %d: out of memory", rank);
    for (size_t i = 0; i < bytes; i++)
        host[i] = rank == root ? (unsigned char)harness_value(root, i, seed, 0, 255) : 0;
    void *d = NULL;
    cudaStream_t s = NULL;
    CU(cudaMalloc(&d, bytes + 1));
    if (m != MODE_LEGACY)
        CU(cudaStreamCreate(&s));
    CU(cudaMemset(d, 0x5A, bytes + 1));
    CU(cudaDeviceSynchronize());
    CU(cudaMemcpyAsync(d, host, bytes, cudaMemcpyHostToDevice, s));
    braid_work *w = NULL;
    if (braid_broadcast(pg, d, bytes, BRAID_U8, root, s, m == MODE_BLOCKING ? NULL : &w) != BRAID_OK)
        HARNESS_FAIL("rank %d: device broadcast(bytes=%zu root=%d): %s", rank, bytes, root, braid_last_error());
    CU(cudaMemcpyAsync(out, d, bytes + 1, cudaMemcpyDeviceToHost, s));
    CU(cudaStreamSynchronize(s));
    if (w) {
        if (braid_wait(w, -1) != BRAID_OK)
            HARNESS_FAIL("rank %d: wait: %s", rank, braid_last_error());
        braid_work_free(w);
    }
    for (size_t i = 0; i < bytes; i++)
        if (out[i] != (unsigned char)harness_value(root, i, seed, 0, 255))
            HARNESS_FAIL("rank %d: device broadcast bytes=%zu root=%d mode=%d: byte %zu is %u, want %u", rank, bytes,
                         root, (int)m, i, out[i], (unsigned)(unsigned char)harness_value(root, i, seed, 0, 255));
    if (out[bytes] != 0x5A)
        HARNESS_FAIL("rank %d: device broadcast wrote past the buffer", rank);
    if (s)
        CU(cudaStreamDestroy(s));
    CU(cudaFree(d));
    free(host);
    free(out);
    return 0;
}

static int matrix_body(braid_pg *pg, void *arg)
{
    (void)arg;
    if (pick_device(braid_pg_rank(pg)))
        return 1;
    static const size_t counts[] = {1, 7, 1000, 65537};
    uint32_t seed = 1;
    for (size_t d = 0; d < sizeof(all_dtypes) / sizeof(all_dtypes[0]); d++)
        for (size_t o = 0; o < sizeof(all_ops) / sizeof(all_ops[0]); o++)
            for (size_t c = 0; c < sizeof(counts) / sizeof(counts[0]); c++)
                if (check_allreduce(pg, all_dtypes[d], all_ops[o], counts[c], (int)(c % 2), (mode)((d + c) % 3),
                                    seed++))
                    return 1;
    for (int root = 0; root < braid_pg_size(pg); root++)
        if (check_broadcast(pg, 1000 + (size_t)root, root, (mode)(root % 3), seed++))
            return 1;
#ifdef BRAID_CUDA_FAKE
    if (devcoll_mode() && cuda_fake_devcoll_launches() == 0)
        HARNESS_FAIL("rank %d: BRAID_DEVCOLL=1 but no device collective kernel ran", braid_pg_rank(pg));
#endif
    return 0;
}

/* Several staging pieces, an odd tail, and both buffers of the double
 * buffer reused more than once. */
static int pieces_body(braid_pg *pg, void *arg)
{
    (void)arg;
    if (pick_device(braid_pg_rank(pg)))
        return 1;
    size_t f32_piece = BRAID_HMEM_PIECE_BYTES / 4;
#ifdef BRAID_CUDA_FAKE
    unsigned long launches = cuda_fake_kernel_launches(), copies = cuda_fake_copies();
#endif
    if (check_allreduce(pg, BRAID_F32, BRAID_SUM, 5 * f32_piece + 13, 1, MODE_ASYNC, 101))
        return 1;
#ifdef BRAID_CUDA_FAKE
    /* Above one piece the reduction runs in kernels (the device ring):
     * every rank reduces n - 1 chunks of each of its segments at least. */
    if (braid_pg_size(pg) == 1) {
        /* A group of one, in place: no kernel, no copy but the test's own
         * two (inputs up, result down). */
        if (cuda_fake_kernel_launches() != launches || cuda_fake_copies() - copies != 2)
            HARNESS_FAIL("rank 0: 1-rank in-place allreduce: %lu kernels and %lu copies, want 0 and 2",
                         cuda_fake_kernel_launches() - launches, cuda_fake_copies() - copies);
    } else if (devcoll_mode()) {
        if (cuda_fake_devcoll_launches() == 0)
            HARNESS_FAIL("rank %d: BRAID_DEVCOLL=1 but the call did not run as a device collective",
                         braid_pg_rank(pg));
    } else if (cuda_fake_kernel_launches() - launches <
               (braid_pg_size(pg) > 1 ? (unsigned long)braid_pg_size(pg) - 1 : 1))
        HARNESS_FAIL("rank %d: device allreduce above one piece launched %lu kernels", braid_pg_rank(pg),
                     cuda_fake_kernel_launches() - launches);
#endif
    if (check_allreduce(pg, BRAID_F32, BRAID_AVG, 3 * f32_piece + 1, 0, MODE_BLOCKING, 102))
        return 1;
    if (check_allreduce(pg, BRAID_BF16, BRAID_MAX, 4 * (f32_piece * 2), 0, MODE_LEGACY, 103))
        return 1;
    if (check_allreduce(pg, BRAID_I64, BRAID_SUM, 2 * (f32_piece / 2) + 7, 1, MODE_ASYNC, 104))
        return 1;
    if (check_broadcast(pg, 5 * (size_t)BRAID_HMEM_PIECE_BYTES + 3, braid_pg_size(pg) - 1, MODE_ASYNC, 105))
        return 1;
    return check_broadcast(pg, 3 * (size_t)BRAID_HMEM_PIECE_BYTES, 0, MODE_BLOCKING, 106);
}

#ifdef BRAID_CUDA_FAKE
/* Whether the device link to peer settled as usable (-1: no link). Call
 * between collectives, after a device ring with peer as neighbour. */
static int link_usable(braid_pg *pg, int peer)
{
    if (!braid__devlink(pg, peer))
        return -1;
    int settled = 0, usable = 0;
    braid_status st = braid__devlink_settle(pg, peer, &settled, &usable);
    if (st != BRAID_OK || !settled) {
        fprintf(stderr, "rank %d: device link to rank %d: %s\n", braid_pg_rank(pg), peer,
                st != BRAID_OK ? braid_last_error() : "not settled");
        return -2;
    }
    return usable;
}

#endif

/* Above one piece a device all-reduce is one ring collective, the host
 * path's: a rank with host buffers can join the same call. Rank 0 uses
 * host memory, the others device memory (in place and not). */
static int mixed_body(braid_pg *pg, void *arg)
{
    (void)arg;
    int rank = braid_pg_rank(pg), n = braid_pg_size(pg);
    if (pick_device(rank))
        return 1;
    size_t count = 3 * (BRAID_HMEM_PIECE_BYTES / 4) + 5, bytes = count * 4;
    float *host = malloc(bytes), *out = malloc(bytes);
    if (!host || !out)
        HARNESS_FAIL("rank %d: out of memory", rank);
    for (size_t i = 0; i < count; i++)
        host[i] = (float)harness_value(rank, i, 77, -100, 100);
    if (rank == 0) {
        if (braid_allreduce(pg, host, out, count, BRAID_F32, BRAID_SUM, NULL, NULL) != BRAID_OK)
            HARNESS_FAIL("rank %d: host allreduce next to device ranks: %s", rank, braid_last_error());
    } else {
        void *ds = NULL, *dr = NULL;
        CU(cudaMalloc(&ds, bytes));
        dr = ds;
        if (rank % 2 == 0)
            CU(cudaMalloc(&dr, bytes));
        CU(cudaMemcpy(ds, host, bytes, cudaMemcpyHostToDevice));
        if (braid_allreduce(pg, ds, dr, count, BRAID_F32, BRAID_SUM, NULL, NULL) != BRAID_OK)
            HARNESS_FAIL("rank %d: device allreduce next to a host rank: %s", rank, braid_last_error());
#ifdef BRAID_CUDA_FAKE
        /* Ranks 1 and 2 both run the device ring: their link carried it. */
        int other = rank == 1 ? 2 : 1;
        if (n == 3 && braid__devlink(pg, other) && link_usable(pg, other) != 1)
            HARNESS_FAIL("rank %d: device link to rank %d not used next to a host rank", rank, other);
#endif
        CU(cudaMemcpy(out, dr, bytes, cudaMemcpyDeviceToHost));
        if (dr != ds)
            CU(cudaFree(dr));
        CU(cudaFree(ds));
    }
    for (size_t i = 0; i < count; i++) {
        float want = 0;
        for (int r = 0; r < n; r++)
            want += (float)harness_value(r, i, 77, -100, 100);
        if (out[i] != want)
            HARNESS_FAIL("rank %d: mixed host/device allreduce element %zu is %g, want %g", rank, i, out[i], want);
    }
    free(host);
    free(out);
    return 0;
}

#ifdef BRAID_CUDA_FAKE
/* Whether the group makes device links (BRAID_TRANSPORT unset or naming
 * cuda_ipc next to other transports). */
static int links_offered(void)
{
    const char *want = getenv("BRAID_TRANSPORT");
    return !want || (strstr(want, "cuda_ipc") && strchr(want, ','));
}

/* Device links where the GPUs cannot all reach each other: ranks 0-2 see
 * one GPU, rank 3 another it cannot reach (a bus id the others do not
 * see). The ring 0-1-2-3 then moves data over cuda_ipc between 0-1 and
 * 1-2 and over the host links for 2-3 and 3-0, both ends of every pair
 * agreeing; results stay exact. With BRAID_TRANSPORT naming no cuda_ipc
 * there are no links at all. */
static int links_body(braid_pg *pg, void *arg)
{
    (void)arg;
    int rank = braid_pg_rank(pg), n = braid_pg_size(pg);
    if (rank == n - 1)
        setenv("CUDA_FAKE_BUS_ID", "0000:02:00.0", 1);
    if (pick_device(rank))
        return 1;
    size_t f32_piece = BRAID_HMEM_PIECE_BYTES / 4;
    for (int k = 0; k < 2; k++)
        if (check_allreduce(pg, BRAID_F32, k ? BRAID_AVG : BRAID_SUM, 2 * f32_piece + 3 + (size_t)k, k, MODE_ASYNC,
                            300 + (uint32_t)k))
            return 1;
    int links = links_offered();
    int next = (rank + 1) % n, prev = (rank + n - 1) % n;
    int peers[2] = {next, prev};
    for (int i = 0; i < 2; i++) {
        int p = peers[i];
        int expect = !links ? -1 : (p == n - 1 || rank == n - 1) ? 0 : 1;
        int got = link_usable(pg, p);
        if (got != expect)
            HARNESS_FAIL("rank %d: device link to rank %d is %d, want %d (-1 none, 0 unusable, 1 used)", rank, p, got,
                         expect);
    }
    return check_allreduce(pg, BRAID_I32, BRAID_MAX, 5, 0, MODE_BLOCKING, 302); /* nobody leaves before the checks */
}

/* A rank whose device has no IPC event support still answers its
 * neighbours' set-up (with no slots): both its links settle as unusable
 * and the ring runs over the host links. */
static int noipc_body(braid_pg *pg, void *arg)
{
    (void)arg;
    int rank = braid_pg_rank(pg), n = braid_pg_size(pg);
    if (rank == 1)
        setenv("CUDA_FAKE_NO_IPC", "1", 1);
    if (pick_device(rank))
        return 1;
    if (check_allreduce(pg, BRAID_I32, BRAID_SUM, 3 * (BRAID_HMEM_PIECE_BYTES / 4) + 1, 0, MODE_BLOCKING, 310))
        return 1;
    int next = (rank + 1) % n, prev = (rank + n - 1) % n;
    int peers[2] = {next, prev};
    for (int i = 0; i < 2; i++) {
        int expect = !links_offered() ? -1 : rank == 1 || peers[i] == 1 ? 0 : 1;
        if (link_usable(pg, peers[i]) != expect)
            HARNESS_FAIL("rank %d: device link to rank %d is %d, want %d", rank, peers[i],
                         link_usable(pg, peers[i]), expect);
    }
    return check_allreduce(pg, BRAID_I32, BRAID_MAX, 5, 0, MODE_BLOCKING, 311);
}
#endif

/* Several outstanding device calls on one stream, results in order. */
static int queue_body(braid_pg *pg, void *arg)
{
    (void)arg;
    int rank = braid_pg_rank(pg), n = braid_pg_size(pg);
    if (pick_device(rank))
        return 1;
    enum { K = 4, N = (1 << 20) + 5 };
    int32_t *host = malloc(sizeof(int32_t) * N);
    void *d[K];
    braid_work *w[K];
    cudaStream_t s;
    if (!host)
        HARNESS_FAIL("rank %d: out of memory", rank);
    CU(cudaStreamCreate(&s));
    for (int k = 0; k < K; k++) {
        for (int i = 0; i < N; i++)
            host[i] = rank * 1000 + k + i;
        CU(cudaMalloc(&d[k], sizeof(int32_t) * N));
        CU(cudaMemcpy(d[k], host, sizeof(int32_t) * N, cudaMemcpyHostToDevice));
    }
    for (int k = 0; k < K; k++)
        if (braid_allreduce(pg, d[k], d[k], N, BRAID_I32, BRAID_SUM, s, &w[k]) != BRAID_OK)
            HARNESS_FAIL("rank %d: async device allreduce %d: %s", rank, k, braid_last_error());
    CU(cudaStreamSynchronize(s));
    for (int k = 0; k < K; k++) {
        CU(cudaMemcpy(host, d[k], sizeof(int32_t) * N, cudaMemcpyDeviceToHost));
        for (int i = 0; i < N; i++) {
            int32_t want = 1000 * n * (n - 1) / 2 + n * (k + i);
            if (host[i] != want)
                HARNESS_FAIL("rank %d: queued device allreduce %d element %d = %d, want %d", rank, k, i, host[i],
                             want);
        }
        if (braid_wait(w[k], -1) != BRAID_OK)
            HARNESS_FAIL("rank %d: wait %d: %s", rank, k, braid_last_error());
        braid_work_free(w[k]);
        CU(cudaFree(d[k]));
    }
    CU(cudaStreamDestroy(s));
    free(host);
    return 0;
}

/* ---- every collective, send/recv and groups on device buffers ---------- */

/* One call of a kind: send and recv are the case's two buffers (the same
 * one for an in-place case), c its count, on stream with work handle w. */
typedef braid_status (*kind_fn)(braid_pg *pg, int32_t *send, int32_t *recv, size_t c, void *stream, braid_work **w);

static braid_status k_reduce(braid_pg *pg, int32_t *s, int32_t *r, size_t c, void *st, braid_work **w)
{
    return braid_reduce(pg, s, r, c, BRAID_I32, BRAID_SUM, 1 % braid_pg_size(pg), st, w);
}
static braid_status k_reduce_ip(braid_pg *pg, int32_t *b, int32_t *r, size_t c, void *st, braid_work **w)
{
    (void)r;
    return braid_reduce(pg, b, b, c, BRAID_I32, BRAID_MAX, 0, st, w);
}
static braid_status k_allgather(braid_pg *pg, int32_t *s, int32_t *r, size_t c, void *st, braid_work **w)
{
    return braid_allgather(pg, s, r, c, BRAID_I32, st, w);
}
static braid_status k_allgather_ip(braid_pg *pg, int32_t *b, int32_t *r, size_t c, void *st, braid_work **w)
{
    (void)r;
    return braid_allgather(pg, b + (size_t)braid_pg_rank(pg) * c, b, c, BRAID_I32, st, w);
}
static braid_status k_rs(braid_pg *pg, int32_t *s, int32_t *r, size_t c, void *st, braid_work **w)
{
    return braid_reduce_scatter(pg, s, r, c, BRAID_I32, BRAID_MAX, st, w);
}
static braid_status k_rs_ip(braid_pg *pg, int32_t *b, int32_t *r, size_t c, void *st, braid_work **w)
{
    (void)r;
    return braid_reduce_scatter(pg, b, b + (size_t)braid_pg_rank(pg) * c, c, BRAID_I32, BRAID_SUM, st, w);
}
static braid_status k_rs_mulsum(braid_pg *pg, int32_t *s, int32_t *r, size_t c, void *st, braid_work **w)
{
    int32_t scalar = braid_pg_rank(pg) + 2;
    return braid_reduce_scatter_mulsum(pg, s, r, c, BRAID_I32, &scalar, st, w);
}
static braid_status k_alltoall(braid_pg *pg, int32_t *s, int32_t *r, size_t c, void *st, braid_work **w)
{
    return braid_alltoall(pg, s, r, c, BRAID_I32, st, w);
}
static braid_status k_gather(braid_pg *pg, int32_t *s, int32_t *r, size_t c, void *st, braid_work **w)
{
    return braid_gather(pg, s, r, c, BRAID_I32, 0, st, w);
}
static braid_status k_scatter(braid_pg *pg, int32_t *s, int32_t *r, size_t c, void *st, braid_work **w)
{
    return braid_scatter(pg, s, r, c, BRAID_I32, braid_pg_size(pg) - 1, st, w);
}
/* Both ways round the ring in one group, sends first. */
static braid_status k_ring(braid_pg *pg, int32_t *s, int32_t *r, size_t c, void *st, braid_work **w)
{
    int rank = braid_pg_rank(pg), n = braid_pg_size(pg), next = (rank + 1) % n, prev = (rank + n - 1) % n;
    braid_status e = braid_group_start(pg);
    if (e == BRAID_OK)
        e = braid_send(pg, s, c, BRAID_I32, next, st, NULL);
    if (e == BRAID_OK)
        e = braid_send(pg, s + c, c, BRAID_I32, prev, st, NULL);
    if (e == BRAID_OK)
        e = braid_recv(pg, r, c, BRAID_I32, prev, st, NULL);
    if (e == BRAID_OK)
        e = braid_recv(pg, r + c, c, BRAID_I32, next, st, NULL);
    braid_status end = braid_group_end(pg, w);
    return e != BRAID_OK ? e : end;
}
/* Collectives of several kinds in one group, with a second stream. */
static braid_status k_group(braid_pg *pg, int32_t *s, int32_t *r, size_t c, void *st, braid_work **w)
{
    static cudaStream_t st2;
    if (!st2 && cudaStreamCreateWithFlags(&st2, cudaStreamNonBlocking) != cudaSuccess)
        return BRAID_ERR_CUDA;
    int device = braid__mem_is_device(s);
    braid_status e = braid_group_start(pg);
    if (e == BRAID_OK)
        e = braid_allreduce(pg, s, r, c, BRAID_I32, BRAID_SUM, st, NULL);
    if (e == BRAID_OK)
        e = braid_allgather(pg, s + c, r + c, c, BRAID_I32, device ? (void *)st2 : st, NULL);
    if (e == BRAID_OK)
        e = braid_broadcast(pg, s + 2 * c, c, BRAID_I32, 0, st, NULL);
    braid_status end = braid_group_end(pg, w);
    if (device && cudaStreamSynchronize(st2) != cudaSuccess)
        return BRAID_ERR_CUDA;
    return e != BRAID_OK ? e : end;
}

typedef struct {
    const char *name;
    kind_fn fn;
    int in_place; /* one buffer: send is recv */
} kind_case;

static const kind_case kind_cases[] = {
    {"reduce", k_reduce, 0},       {"reduce in place", k_reduce_ip, 1},
    {"allgather", k_allgather, 0}, {"allgather in place", k_allgather_ip, 1},
    {"reduce_scatter", k_rs, 0},   {"reduce_scatter in place", k_rs_ip, 1},
    {"reduce_scatter_mulsum", k_rs_mulsum, 0},
    {"alltoall", k_alltoall, 0},   {"gather", k_gather, 0},
    {"scatter", k_scatter, 0},     {"send/recv ring group", k_ring, 0},
    {"group of collectives", k_group, 0},
};

static int32_t kind_input(int rank, size_t i)
{
    return (int32_t)((rank * 7919 + i * 31) % 2001) - 1000;
}

/* The case on host buffers (braid's CPU path: the reference), then on
 * device buffers; both start from the same contents and must end equal
 * over the whole of both buffers. */
static int check_kind(braid_pg *pg, const kind_case *k, size_t c, int async)
{
    int rank = braid_pg_rank(pg), n = braid_pg_size(pg);
    size_t elems = (size_t)(n + 2) * c, bytes = elems * sizeof(int32_t);
    int32_t *hs = malloc(bytes), *hr = malloc(bytes), *in = NULL, *out = NULL;
    if (!hs || !hr)
        HARNESS_FAIL("rank %d: out of memory", rank);
    CU(cudaMallocHost((void **)&in, 2 * bytes)); /* pinned: pageable copies are braid's alone */
    CU(cudaMallocHost((void **)&out, 2 * bytes));
    for (size_t i = 0; i < elems; i++) {
        hs[i] = kind_input(rank, i);
        hr[i] = k->in_place ? hs[i] : -7;
    }
    memcpy(in, hs, bytes);
    memcpy(in + elems, hr, bytes);
    if (k->fn(pg, hs, k->in_place ? hs : hr, c, NULL, NULL) != BRAID_OK)
        HARNESS_FAIL("rank %d: host %s (count %zu): %s", rank, k->name, c, braid_last_error());

    int32_t *ds, *dr;
    cudaStream_t st;
    CU(cudaMalloc((void **)&ds, bytes));
    CU(cudaMalloc((void **)&dr, bytes));
    CU(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
    /* Not synchronized: the call must see these copies through the stream. */
    CU(cudaMemcpyAsync(ds, in, bytes, cudaMemcpyHostToDevice, st));
    CU(cudaMemcpyAsync(dr, in + elems, bytes, cudaMemcpyHostToDevice, st));
#ifdef BRAID_CUDA_FAKE
    unsigned long long before = cuda_fake_pageable_bytes();
#endif
    braid_work *w = NULL;
    if (k->fn(pg, ds, k->in_place ? ds : dr, c, st, async ? &w : NULL) != BRAID_OK)
        HARNESS_FAIL("rank %d: device %s (count %zu): %s", rank, k->name, c, braid_last_error());
    /* Queued behind the call on the same stream: must see the results. */
    CU(cudaMemcpyAsync(out, ds, bytes, cudaMemcpyDeviceToHost, st));
    CU(cudaMemcpyAsync(out + elems, dr, bytes, cudaMemcpyDeviceToHost, st));
    CU(cudaStreamSynchronize(st));
    if (w) {
        if (braid_wait(w, -1) != BRAID_OK)
            HARNESS_FAIL("rank %d: wait for %s: %s", rank, k->name, braid_last_error());
        braid_work_free(w);
    }
#ifdef BRAID_CUDA_FAKE
    if (cuda_fake_pageable_bytes() != before)
        HARNESS_FAIL("rank %d: device %s moved %llu bytes through pageable host memory", rank, k->name,
                     cuda_fake_pageable_bytes() - before);
#endif
    for (size_t i = 0; i < 2 * elems; i++) {
        int32_t want = i < elems ? hs[i] : k->in_place ? hs[i - elems] : hr[i - elems];
        if (k->in_place && i >= elems)
            break; /* one buffer: its copy in dr is untouched input */
        if (out[i] != want)
            HARNESS_FAIL("rank %d of %d: device %s (count %zu, %s) %s element %zu is %d, host path gives %d", rank, n,
                         k->name, c, async ? "work handle" : "blocking", i < elems ? "send" : "recv",
                         i % elems, out[i], want);
    }
    CU(cudaStreamDestroy(st));
    CU(cudaFree(ds));
    CU(cudaFree(dr));
    CU(cudaFreeHost(in));
    CU(cudaFreeHost(out));
    free(hs);
    free(hr);
    return 0;
}

/* Every kind on device buffers, one piece and several (sends and receives
 * cut at 1 MiB, the all-gather's and reduce-scatter's all-ranks side at
 * 4 MiB), blocking and with a work handle, against the CPU path. */
static int kinds_body(braid_pg *pg, void *arg)
{
    (void)arg;
    int rank = braid_pg_rank(pg);
    if (pick_device(rank))
        return 1;
    const size_t counts[] = {1001, 600011};
    for (size_t ci = 0; ci < 2; ci++)
        for (size_t i = 0; i < sizeof(kind_cases) / sizeof(kind_cases[0]); i++)
            if (check_kind(pg, &kind_cases[i], counts[ci], (int)((i + ci) & 1)))
                return 1;
    return check_allreduce(pg, BRAID_I32, BRAID_SUM, 1000, 0, MODE_BLOCKING, 300);
}

/* Sends and receives matched as NCCL matches them, per peer in issue
 * order whatever the grouping on either side: rank 0 sends two device
 * buffers to rank 1 in one group (several pieces each), rank 1 receives
 * them with two calls; a zero-count send and a host send larger than a
 * piece inside rank 0's device group meet rank 1's all-host group. */
static int order_body(braid_pg *pg, void *arg)
{
    (void)arg;
    int rank = braid_pg_rank(pg);
    if (pick_device(rank))
        return 1;
    enum { A = 700001, B = 300007, BIG = 3000017 };
    int32_t *h = malloc(sizeof(int32_t) * (A + B)), *big = malloc(sizeof(int32_t) * BIG), *d;
    if (!h || !big)
        HARNESS_FAIL("rank %d: out of memory", rank);
    CU(cudaMalloc((void **)&d, sizeof(int32_t) * (A + B)));
    cudaStream_t st;
    CU(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
    for (size_t i = 0; i < A + B; i++)
        h[i] = rank ? -1 : kind_input(7, i);
    for (size_t i = 0; i < BIG; i++)
        big[i] = rank ? -1 : kind_input(9, i);
    CU(cudaMemcpy(d, h, sizeof(int32_t) * (A + B), cudaMemcpyHostToDevice));
    braid_status e = BRAID_OK;
    if (rank == 0) {
        e = braid_group_start(pg);
        if (e == BRAID_OK)
            e = braid_send(pg, d, A, BRAID_I32, 1, st, NULL);
        if (e == BRAID_OK)
            e = braid_send(pg, d + A, B, BRAID_I32, 1, st, NULL);
        braid_status end = braid_group_end(pg, NULL);
        e = e != BRAID_OK ? e : end;
        if (e == BRAID_OK && (e = braid_group_start(pg)) == BRAID_OK) {
            e = braid_send(pg, d, 0, BRAID_I32, 1, st, NULL);
            if (e == BRAID_OK)
                e = braid_send(pg, d, 1000, BRAID_I32, 1, st, NULL);
            if (e == BRAID_OK)
                e = braid_send(pg, big, BIG, BRAID_I32, 1, NULL, NULL);
            end = braid_group_end(pg, NULL);
            e = e != BRAID_OK ? e : end;
        }
    } else if (rank == 1) {
        e = braid_recv(pg, d, A, BRAID_I32, 0, st, NULL);
        if (e == BRAID_OK)
            e = braid_recv(pg, d + A, B, BRAID_I32, 0, st, NULL);
        if (e == BRAID_OK && (e = braid_group_start(pg)) == BRAID_OK) {
            e = braid_recv(pg, h, 0, BRAID_I32, 0, NULL, NULL);
            if (e == BRAID_OK)
                e = braid_recv(pg, h, 1000, BRAID_I32, 0, NULL, NULL);
            if (e == BRAID_OK)
                e = braid_recv(pg, big, BIG, BRAID_I32, 0, NULL, NULL);
            braid_status end = braid_group_end(pg, NULL);
            e = e != BRAID_OK ? e : end;
        }
    }
    if (e != BRAID_OK)
        HARNESS_FAIL("rank %d: sends and receives: %s", rank, braid_last_error());
    if (rank == 1) {
        for (size_t i = 0; i < 1000; i++)
            if (h[i] != kind_input(7, i))
                HARNESS_FAIL("rank 1: host receive after a zero-count one: element %zu is %d", i, h[i]);
        for (size_t i = 0; i < BIG; i++)
            if (big[i] != kind_input(9, i))
                HARNESS_FAIL("rank 1: large host receive element %zu is %d", i, big[i]);
        CU(cudaMemcpy(h, d, sizeof(int32_t) * (A + B), cudaMemcpyDeviceToHost));
        for (size_t i = 0; i < A + B; i++)
            if (h[i] != kind_input(7, i))
                HARNESS_FAIL("rank 1: %s device receive element %zu is %d, want %d", i < A ? "first" : "second",
                             i < A ? i : i - A, h[i], kind_input(7, i));
    }
    CU(cudaStreamDestroy(st));
    CU(cudaFree(d));
    free(h);
    free(big);
    return 0;
}

/* The DDP bucketer with gradients in device memory (and one on the host):
 * copied into the flat buffers and back with CUDA copies, averaged. Also
 * with f16 compression, which casts through host memory. */
static int bucketer_body(braid_pg *pg, void *arg)
{
    (void)arg;
    int rank = braid_pg_rank(pg), n = braid_pg_size(pg);
    if (pick_device(rank))
        return 1;
    enum { P = 4 };
    static const size_t counts[P] = {1000, 7, 3000, 129};
    for (int compress = 0; compress < 2; compress++) {
        braid_bucketer *b = NULL;
        void *grad[P];
        float *host[P];
        int id[P];
        if (braid_bucketer_create(&b, pg, 8192, 1024) != BRAID_OK)
            HARNESS_FAIL("rank %d: bucketer_create: %s", rank, braid_last_error());
        if (compress && braid_bucketer_set_compression(b, BRAID_F16) != BRAID_OK)
            HARNESS_FAIL("rank %d: set_compression: %s", rank, braid_last_error());
        for (int k = 0; k < P; k++) {
            host[k] = malloc(counts[k] * sizeof(float));
            if (!host[k])
                HARNESS_FAIL("rank %d: out of memory", rank);
            for (size_t i = 0; i < counts[k]; i++)
                host[k][i] = (float)(n * harness_value(rank, i, 400 + (uint32_t)k, -8, 8));
            if (k == 1) {
                grad[k] = host[k]; /* a host gradient among device ones */
            } else {
                CU(cudaMalloc(&grad[k], counts[k] * sizeof(float)));
                CU(cudaMemcpy(grad[k], host[k], counts[k] * sizeof(float), cudaMemcpyHostToDevice));
            }
            if (braid_bucketer_add(b, grad[k], counts[k], BRAID_F32, &id[k]) != BRAID_OK)
                HARNESS_FAIL("rank %d: bucketer_add: %s", rank, braid_last_error());
        }
#ifdef BRAID_CUDA_FAKE
        unsigned long long down = cuda_fake_d2h_bytes();
#endif
        for (int k = P - 1; k >= 0; k--)
            if (braid_bucketer_ready(b, id[k]) != BRAID_OK)
                HARNESS_FAIL("rank %d: bucketer_ready(%d): %s", rank, k, braid_last_error());
        if (braid_bucketer_finish(b) != BRAID_OK)
            HARNESS_FAIL("rank %d: bucketer_finish: %s", rank, braid_last_error());
#ifdef BRAID_CUDA_FAKE
        /* Uncompressed buckets of device gradients stay on the device: with
         * the device collectives no byte goes down to the host but the
         * host gradient's share (param 1, in a bucket of its own or first
         * in it). */
        if (!compress && devcoll_mode() && cuda_fake_d2h_bytes() - down > counts[1] * sizeof(float))
            HARNESS_FAIL("rank %d: bucketer on device gradients copied %llu bytes to the host", rank,
                         cuda_fake_d2h_bytes() - down);
#endif
        for (int k = 0; k < P; k++) {
            float *out = host[k];
            if (k != 1)
                CU(cudaMemcpy(out, grad[k], counts[k] * sizeof(float), cudaMemcpyDeviceToHost));
            for (size_t i = 0; i < counts[k]; i++) {
                /* multiples of n: grad / n (the compressed wire's
                 * pre-scaling) and the average are small integers, exact
                 * in f32 and f16 however they are computed */
                float sum = 0;
                for (int r = 0; r < n; r++)
                    sum += (float)(n * harness_value(r, i, 400 + (uint32_t)k, -8, 8));
                float want = sum / (float)n;
                if (out[i] != want)
                    HARNESS_FAIL("rank %d: bucketer (%s) param %d element %zu is %g, want %g", rank,
                                 compress ? "f16 wire" : "f32", k, i, out[i], want);
            }
            if (k != 1)
                CU(cudaFree(grad[k]));
            free(host[k]);
        }
        braid_bucketer_destroy(b);
    }
    return 0;
}

/* A device call on an aborted group fails without holding the stream. */
static int abort_body(braid_pg *pg, void *arg)
{
    (void)arg;
    int rank = braid_pg_rank(pg);
    if (pick_device(rank))
        return 1;
    void *d;
    cudaStream_t s;
    CU(cudaMalloc(&d, 4096));
    CU(cudaStreamCreate(&s));
    braid_pg_abort(pg);
    braid_work *w = NULL;
    braid_status st = braid_allreduce(pg, d, d, 1024, BRAID_F32, BRAID_SUM, s, &w);
    if (st == BRAID_OK) {
        CU(cudaStreamSynchronize(s)); /* hangs if the failed job kept the stream */
        st = braid_wait(w, -1);
        braid_work_free(w);
    }
    if (st != BRAID_ERR_ABORTED)
        HARNESS_FAIL("rank %d: device allreduce on an aborted group: %s, want BRAID_ERR_ABORTED", rank,
                     braid_status_string(st));
    CU(cudaStreamDestroy(s));
    CU(cudaFree(d));
    return 0;
}

/* Ranks as threads of one process, as nccl-tests -t N runs them: each
 * thread its own group, stream (blocking: cudaStreamCreate) and queued
 * work-handle calls. CUDA runs the host functions of all streams of a
 * process on one callback thread, so a stream gate that blocks there
 * holds the other rank's stream and the job both wait for. */
enum { THR_RANKS = 2, THR_CALLS = 3, THR_N = 3 * (BRAID_HMEM_PIECE_BYTES / 4) / 2 + 7 };

typedef struct {
    int rank;
    braid_unique_id_t id;
    int failed;
} thr_arg;

static int thread_rank(thr_arg *a)
{
    int rank = a->rank;
    braid_pg *pg = NULL;
    CU(cudaSetDevice(0));
    if (braid_pg_init(&pg, rank, THR_RANKS, &a->id, NULL) != BRAID_OK)
        HARNESS_FAIL("rank %d: pg_init: %s", rank, braid_last_error());
    cudaStream_t s;
    CU(cudaStreamCreate(&s));
    /* Small (staged) and large (device ring) calls alternate. */
    size_t counts[THR_CALLS] = {1000, THR_N, 5};
    int32_t *host[THR_CALLS];
    void *d[THR_CALLS];
    braid_work *w[THR_CALLS];
    for (int k = 0; k < THR_CALLS; k++) {
        if (!(host[k] = malloc(sizeof(int32_t) * counts[k])))
            HARNESS_FAIL("rank %d: out of memory", rank);
        for (size_t i = 0; i < counts[k]; i++)
            host[k][i] = rank * 1000 + k + (int32_t)i;
        CU(cudaMalloc(&d[k], sizeof(int32_t) * counts[k]));
        CU(cudaMemcpyAsync(d[k], host[k], sizeof(int32_t) * counts[k], cudaMemcpyHostToDevice, s));
    }
    for (int k = 0; k < THR_CALLS; k++)
        if (braid_allreduce(pg, d[k], d[k], counts[k], BRAID_I32, BRAID_SUM, s, &w[k]) != BRAID_OK)
            HARNESS_FAIL("rank %d: device allreduce %d from a thread: %s", rank, k, braid_last_error());
    for (int k = 0; k < THR_CALLS; k++)
        CU(cudaMemcpyAsync(host[k], d[k], sizeof(int32_t) * counts[k], cudaMemcpyDeviceToHost, s));
    CU(cudaStreamSynchronize(s));
    for (int k = 0; k < THR_CALLS; k++) {
        for (size_t i = 0; i < counts[k]; i++) {
            int32_t want = 1000 * THR_RANKS * (THR_RANKS - 1) / 2 + THR_RANKS * (k + (int32_t)i);
            if (host[k][i] != want)
                HARNESS_FAIL("rank %d (thread): device allreduce %d element %zu = %d, want %d", rank, k, i,
                             host[k][i], want);
        }
        if (braid_wait(w[k], -1) != BRAID_OK)
            HARNESS_FAIL("rank %d: wait %d: %s", rank, k, braid_last_error());
        braid_work_free(w[k]);
        CU(cudaFree(d[k]));
        free(host[k]);
    }
    CU(cudaStreamDestroy(s));
    if (braid_pg_destroy(pg) != BRAID_OK)
        HARNESS_FAIL("rank %d: pg_destroy: %s", rank, braid_last_error());
    return 0;
}

static void *thread_main(void *p)
{
    thr_arg *a = p;
    a->failed = thread_rank(a);
    return NULL;
}

/* Two groups, ranks as threads (BRAID_DEVCOLL=1): rank 0 issues an f32
 * all-reduce on group 0 and then an f64 one on group 1, rank 1 the other
 * way round, each on a stream of its own and with work handles, so both
 * return at once; every group still sees one order. Rank 1's first kernel
 * is a kernel the process has not launched yet while rank 0's spins for
 * it: under lazy loading that launch would wait for the spinning kernel,
 * unless braid loaded every device-collective kernel beforehand. */
typedef struct {
    int rank;
    braid_unique_id_t id[2];
    int failed;
} crossed_arg;

static int crossed_rank(crossed_arg *a)
{
    enum { N = 1000 };
    int rank = a->rank; /* for CU() */
    braid_pg *pg[2] = {NULL, NULL};
    cudaStream_t s[2];
    void *d[2];
    braid_work *w[2];
    double host[N];
    CU(cudaSetDevice(0));
    for (int g = 0; g < 2; g++) {
        if (braid_pg_init(&pg[g], a->rank, 2, &a->id[g], NULL) != BRAID_OK)
            HARNESS_FAIL("rank %d: pg_init %d: %s", a->rank, g, braid_last_error());
        CU(cudaStreamCreateWithFlags(&s[g], cudaStreamNonBlocking));
        CU(cudaMalloc(&d[g], sizeof(host)));
    }
    for (int g = 0; g < 2; g++) { /* group 0: f32, group 1: f64; value rank + g + i % 7 */
        for (int i = 0; i < N; i++) {
            if (g == 0)
                ((float *)host)[i] = (float)(a->rank + g + i % 7);
            else
                host[i] = a->rank + g + i % 7;
        }
        CU(cudaMemcpy(d[g], host, sizeof(host), cudaMemcpyHostToDevice));
    }
    for (int k = 0; k < 2; k++) {
        int g = a->rank == 0 ? k : 1 - k;
        if (braid_allreduce(pg[g], d[g], d[g], N, g == 0 ? BRAID_F32 : BRAID_F64, BRAID_SUM, s[g], &w[g]) != BRAID_OK)
            HARNESS_FAIL("rank %d: device allreduce on group %d: %s", a->rank, g, braid_last_error());
    }
    for (int g = 0; g < 2; g++) {
        CU(cudaStreamSynchronize(s[g]));
        CU(cudaMemcpy(host, d[g], sizeof(host), cudaMemcpyDeviceToHost));
        for (int i = 0; i < N; i++) {
            double got = g == 0 ? (double)((float *)host)[i] : host[i], want = 1 + 2 * (g + i % 7);
            if (got != want)
                HARNESS_FAIL("rank %d: group %d element %d = %g, want %g", a->rank, g, i, got, want);
        }
        if (braid_wait(w[g], -1) != BRAID_OK)
            HARNESS_FAIL("rank %d: wait on group %d: %s", a->rank, g, braid_last_error());
        braid_work_free(w[g]);
    }
#ifdef BRAID_CUDA_FAKE
    if (cuda_fake_devcoll_launches() == 0)
        HARNESS_FAIL("rank %d: BRAID_DEVCOLL=1 but no device collective kernel ran", a->rank);
#endif
    for (int g = 0; g < 2; g++) {
        CU(cudaStreamDestroy(s[g]));
        CU(cudaFree(d[g]));
        if (braid_pg_destroy(pg[g]) != BRAID_OK)
            HARNESS_FAIL("rank %d: pg_destroy %d: %s", a->rank, g, braid_last_error());
    }
    return 0;
}

static void *crossed_main(void *p)
{
    crossed_arg *a = p;
    a->failed = crossed_rank(a);
    return NULL;
}

static int crossed_body(braid_pg *pg, void *arg)
{
    (void)arg;
    if (pick_device(braid_pg_rank(pg)))
        return 1;
    crossed_arg a[2];
    pthread_t t[2];
    braid_unique_id_t id[2];
    for (int g = 0; g < 2; g++)
        if (braid_unique_id(&id[g]) != BRAID_OK)
            HARNESS_FAIL("unique_id: %s", braid_last_error());
    for (int r = 0; r < 2; r++) {
        a[r] = (crossed_arg){.rank = r, .id = {id[0], id[1]}};
        if (pthread_create(&t[r], NULL, crossed_main, &a[r]) != 0)
            HARNESS_FAIL("cannot start rank thread %d", r);
    }
    int failed = 0;
    for (int r = 0; r < 2; r++) {
        pthread_join(t[r], NULL);
        failed |= a[r].failed;
    }
    return failed;
}

/* Runs in one forked process (the harness's rank 0 of 1, for its time
 * limit); its own group is THR_RANKS threads. */
static int threads_body(braid_pg *pg, void *arg)
{
    (void)arg;
    int rank = braid_pg_rank(pg);
    if (pick_device(rank))
        return 1;
    thr_arg a[THR_RANKS];
    pthread_t t[THR_RANKS];
    braid_unique_id_t id;
    if (braid_unique_id(&id) != BRAID_OK)
        HARNESS_FAIL("unique_id: %s", braid_last_error());
    for (int r = 0; r < THR_RANKS; r++) {
        a[r] = (thr_arg){.rank = r, .id = id};
        if (pthread_create(&t[r], NULL, thread_main, &a[r]) != 0)
            HARNESS_FAIL("cannot start rank thread %d", r);
    }
    int failed = 0;
    for (int r = 0; r < THR_RANKS; r++) {
        pthread_join(t[r], NULL);
        failed |= a[r].failed;
    }
    return failed;
}

/* Rank 2 leaves the device collectives: it exits (dead), or stays alive
 * and never calls again (idle). The others' next call fails and names it:
 * at once when it died (a watchdog waits on each peer process, and sets
 * the kernels' abort flag), within the group's timeout when it idles. */
enum { DEAD_TIMEOUT_MS = 60000, IDLE_TIMEOUT_MS = 3000 };
static int devcoll_leaver_body(braid_pg *pg, void *arg)
{
    int dies = *(const int *)arg;
    int rank = braid_pg_rank(pg);
    if (pick_device(rank))
        return 1;
    if (check_allreduce(pg, BRAID_F32, BRAID_SUM, 4099, 0, MODE_BLOCKING, 7))
        return 1;
    if (rank == 2 && dies)
        _exit(0);
    if (rank == 2) {
        sleep(3 * IDLE_TIMEOUT_MS / 1000 + 2);
        return 0;
    }
    void *d;
    cudaStream_t s;
    CU(cudaMalloc(&d, 4096 * 4));
    CU(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    braid_status st = braid_allreduce(pg, d, d, 4096, BRAID_F32, BRAID_SUM, s, NULL);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    double secs = (double)(t1.tv_sec - t0.tv_sec) + (double)(t1.tv_nsec - t0.tv_nsec) / 1e9;
    braid_status want = dies ? BRAID_ERR_PEER : BRAID_ERR_TIMEOUT;
    if (st != want)
        HARNESS_FAIL("rank %d: allreduce with rank 2 %s: %s, want %s", rank, dies ? "dead" : "idle",
                     braid_status_string(st), braid_status_string(want));
    if (!strstr(braid_last_error(), dies ? "rank 2's process exited" : "waiting for rank 2"))
        HARNESS_FAIL("rank %d: the error does not name rank 2 %s: %s", rank, dies ? "as exited" : "",
                     braid_last_error());
    double limit = dies ? 5.0 : 3.0 * IDLE_TIMEOUT_MS / 1000;
    if (secs > limit)
        HARNESS_FAIL("rank %d: took %.1f s to fail (limit %.0f s)", rank, secs, limit);
    if (!dies)
        sleep(2); /* the other survivor times out too before this process exits (and would be seen to) */
    /* The group is broken; the stream is not held. */
    if (braid_allreduce(pg, d, d, 16, BRAID_F32, BRAID_SUM, s, NULL) == BRAID_OK)
        HARNESS_FAIL("rank %d: a call on the broken group succeeded", rank);
    CU(cudaStreamSynchronize(s));
    CU(cudaStreamDestroy(s));
    CU(cudaFree(d));
    return 0;
}

static void run_ranks(int n, harness_rank_fn fn, int timeout_s);

#ifdef BRAID_CUDA_FAKE
/* Two pretend hosts: device kernels cannot reach a region on another host,
 * so the group decides "off" when it forms, even though no rank had a
 * context then, and its device calls take the other paths. */
static void hosts_setup(int rank)
{
    setenv("BRAID_HOST_ID", rank == 0 ? "host-a" : "host-b", 1);
}

static int hosts_body(braid_pg *pg, void *arg)
{
    (void)arg;
    int rank = braid_pg_rank(pg);
    if (!pg->devcoll_agreed || pg->devcoll)
        HARNESS_FAIL("rank %d: a group across hosts left device collectives undecided at init", rank);
    if (pick_device(rank))
        return 1;
    unsigned long launches = cuda_fake_devcoll_launches();
    if (check_allreduce(pg, BRAID_F32, BRAID_SUM, 4099, 0, MODE_BLOCKING, 7))
        return 1;
    if (cuda_fake_devcoll_launches() != launches)
        HARNESS_FAIL("rank %d: a device-collective kernel ran across hosts", rank);
    return 0;
}

START_TEST(hosts_2)
{
    harness_rank_setup = hosts_setup;
    run_ranks(2, hosts_body, 120);
    harness_rank_setup = NULL;
}
END_TEST
#endif

static void run_leaver(int dies)
{
    braid_config cfg = BRAID_CONFIG_INIT;
    cfg.timeout_ms = dies ? DEAD_TIMEOUT_MS : IDLE_TIMEOUT_MS;
    harness_result r;
    int failed = harness_run(3, devcoll_leaver_body, &dies, &cfg, 120, &r);
    ck_assert_msg(failed == 0, "%d of 3 ranks failed", failed);
}

START_TEST(devcoll_dead_3) { run_leaver(1); }
END_TEST
START_TEST(devcoll_idle_3) { run_leaver(0); }
END_TEST

static void run_ranks(int n, harness_rank_fn fn, int timeout_s)
{
    harness_result r;
    int failed = harness_run(n, fn, NULL, NULL, timeout_s, &r);
    ck_assert_msg(failed == 0, "%d of %d ranks failed", failed, n);
}

START_TEST(matrix_2) { run_ranks(2, matrix_body, 300); }
END_TEST
START_TEST(matrix_3) { run_ranks(3, matrix_body, 300); }
END_TEST
START_TEST(pieces_1) { run_ranks(1, pieces_body, 300); }
END_TEST
START_TEST(pieces_2) { run_ranks(2, pieces_body, 300); }
END_TEST
START_TEST(pieces_4) { run_ranks(4, pieces_body, 300); }
END_TEST
START_TEST(mixed_3) { run_ranks(3, mixed_body, 300); }
END_TEST
START_TEST(queue_3) { run_ranks(3, queue_body, 300); }
END_TEST
START_TEST(threads_2) { run_ranks(1, threads_body, 120); }
END_TEST
START_TEST(crossed_2) { run_ranks(1, crossed_body, 120); }
END_TEST
START_TEST(abort_2) { run_ranks(2, abort_body, 120); }
END_TEST
START_TEST(kinds_2) { run_ranks(2, kinds_body, 300); }
END_TEST
START_TEST(kinds_3) { run_ranks(3, kinds_body, 300); }
END_TEST
START_TEST(order_2) { run_ranks(2, order_body, 120); }
END_TEST
START_TEST(bucketer_3) { run_ranks(3, bucketer_body, 120); }
END_TEST
#ifdef BRAID_CUDA_FAKE
START_TEST(links_4) { run_ranks(4, links_body, 300); }
END_TEST
START_TEST(noipc_3) { run_ranks(3, noipc_body, 300); }
END_TEST
#endif
#endif /* BRAID_HAVE_CUDA */

/* Availability, probed in a child so the parent never initializes CUDA
 * (the ranks are forked from it). Returns 1 when usable, else 0 with the
 * reason in why. */
static int probe_cuda(char *why, size_t cap)
{
    int fds[2];
    if (pipe(fds) != 0) {
        snprintf(why, cap, "pipe failed");
        return 0;
    }
    pid_t pid = fork();
    if (pid == 0) {
        close(fds[0]);
        int ok = braid__cuda_available();
        const char *reason = ok ? "" : braid__cuda_unavailable_reason();
        ssize_t w = write(fds[1], reason, strlen(reason));
        (void)w;
        _exit(ok ? 0 : 1);
    }
    close(fds[1]);
    ssize_t len = pid > 0 ? read(fds[0], why, cap - 1) : -1;
    why[len > 0 ? len : 0] = '\0';
    close(fds[0]);
    int status = 0;
    if (pid < 0 || waitpid(pid, &status, 0) < 0) {
        snprintf(why, cap, "fork failed");
        return 0;
    }
    if (!WIFEXITED(status) && why[0] == '\0')
        snprintf(why, cap, "the probe crashed");
    return WIFEXITED(status) && WEXITSTATUS(status) == 0;
}

int main(void)
{
    char why[512];
    if (!probe_cuda(why, sizeof(why))) {
        printf("SKIP: no CUDA device: %s\n", why);
        return 77;
    }
#ifdef BRAID_HAVE_CUDA
    Suite *s = suite_create("cuda_coll");
    /* One case per test, so CK_RUN_CASE=pieces_4 runs just that one. */
    const struct {
        const char *name;
        const TTest *test;
    } cases[] = {{"matrix_2", matrix_2}, {"matrix_3", matrix_3}, {"pieces_1", pieces_1}, {"pieces_2", pieces_2}, {"pieces_4", pieces_4},
                 {"mixed_3", mixed_3},   {"queue_3", queue_3},   {"threads_2", threads_2},   {"abort_2", abort_2},
                 {"kinds_2", kinds_2},   {"kinds_3", kinds_3},   {"order_2", order_2}, {"bucketer_3", bucketer_3},
#ifdef BRAID_CUDA_FAKE
                 {"links_4", links_4},   {"noipc_3", noipc_3},
#endif
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        if (devcoll_mode() && (strcmp(cases[i].name, "mixed_3") == 0 || strcmp(cases[i].name, "links_4") == 0 ||
                               strcmp(cases[i].name, "noipc_3") == 0))
            continue;
        TCase *tc = tcase_create(cases[i].name);
        tcase_set_timeout(tc, 600);
        tcase_add_test(tc, cases[i].test);
        suite_add_tcase(s, tc);
    }
    if (devcoll_mode()) {
        TCase *tc = tcase_create("devcoll_dead_3");
        tcase_set_timeout(tc, 600);
        tcase_add_test(tc, devcoll_dead_3);
        suite_add_tcase(s, tc);
        tc = tcase_create("devcoll_idle_3");
        tcase_set_timeout(tc, 600);
        tcase_add_test(tc, devcoll_idle_3);
        suite_add_tcase(s, tc);
#ifdef BRAID_CUDA_FAKE
        tc = tcase_create("hosts_2");
        tcase_set_timeout(tc, 600);
        tcase_add_test(tc, hosts_2);
        suite_add_tcase(s, tc);
#endif
        tc = tcase_create("crossed_2");
        tcase_set_timeout(tc, 600);
        tcase_add_test(tc, crossed_2);
        suite_add_tcase(s, tc);
    }
    SRunner *sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? 1 : 0;
#else
    printf("SKIP: CUDA device found but the test was built without BRAID_HAVE_CUDA\n");
    return 77;
#endif
}
