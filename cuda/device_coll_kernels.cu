/*
 * The kernels of device_coll.h: all-reduce (one-shot, two-shot) and
 * broadcast between same-host device ranks through IPC-mapped regions, one
 * kernel per (dtype, op) from the definitions of src/reduce/elementwise.h,
 * so a result has the bits of the CPU engine folding the ranks' inputs in
 * rank order.
 *
 * Every block is an independent pipeline over its own range and its own
 * segments (device_coll.h), meeting only the same block of the peers, so
 * no block ever waits for another block of its own grid: the kernels need
 * no co-residency guarantee.
 *
 * The host emulation (cuda/emu/) compiles this file as C++ and runs each
 * block's threads as host threads, blocks one after another; ranks are
 * processes sharing a mapping, so the whole protocol runs on any machine.
 */
#include <pthread.h>
#include <stdint.h>

#include <cuda_runtime.h>

extern "C" {
#include "status.h"
}
#include "braid_cuda.h"
#include "device_coll.h"
#include "reduce/elementwise.h"

#ifdef BRAID_CUDA_EMU_RUNTIME_H
#define DEVCOLL_EMU 1
#else
#define DEVCOLL_EMU 0
#endif

namespace {

typedef void (*kernel_fn)(braid_devcoll_args);

/* How the elements of one (dtype, op) load, fold, finish and premultiply. */
#define GEN_TRAITS(ENUM, name, T, C, OPENUM, op, cfn)                                          \
    struct tr_##name##_##op {                                                                  \
        typedef T type;                                                                        \
        typedef C ctype;                                                                       \
        static constexpr bool mulsum = BRAID_##OPENUM == BRAID_MULSUM;                         \
        static __device__ __forceinline__ C load(T x) { return braid__ew_##name##_load(x); }    \
        static __device__ __forceinline__ C combine(C x, C y) { return braid__ew_##name##_##cfn(x, y); } \
        static __device__ __forceinline__ T finish(C x, int n)                                 \
        {                                                                                      \
            (void)n;                                                                           \
            return braid__ew_##name##_store(BRAID_EW_FINISH_##op(name, x, n));                \
        }                                                                                      \
        static __device__ __forceinline__ T premul(T x, T s) { return braid__ew_##name##_premul(x, s); } \
    };
BRAID_EW_FOREACH_PAIR(GEN_TRAITS)
#undef GEN_TRAITS

__device__ __forceinline__ uint64_t now_ns()
{
#if DEVCOLL_EMU
    return braid_emu_now_ns();
#else
    uint64_t t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
#endif
}

/* A peer's 16 bytes, around L1: a segment is read again two chunks later
 * with new contents. */
__device__ __forceinline__ uint4 load_peer(const uint4 *p)
{
#if DEVCOLL_EMU
    const volatile unsigned *v = (const volatile unsigned *)p;
    return uint4{v[0], v[1], v[2], v[3]};
#else
    return __ldcg(p);
#endif
}

template <class T> __device__ __forceinline__ T load_peer_one(const T *p)
{
    return *(const volatile T *)p;
}

/* First block to give up says why; later ones keep it. */
__device__ void record_fault(const braid_devcoll_args &a, uint32_t code, int peer)
{
    if (atomicCAS((unsigned *)&a.fault->code, 0u, code) == 0u) {
        a.fault->peer = peer;
        a.fault->block = blockIdx.x;
        __threadfence_system();
    }
}

/* Block b meets block b of every peer. Thread 0 publishes the block's
 * stores (syncthreads, then a system fence that carries them), writes its
 * new count into each peer's arrive[b][rank] and waits for every peer's
 * count in its own signal. Returns nonzero, in every thread, when it gave
 * up (abort or timeout). *count is thread 0's barrier count. */
__device__ int block_barrier(const braid_devcoll_args &a, uint32_t *count)
{
    __shared__ int gave_up;
    __syncthreads();
    if (threadIdx.x == 0) {
        gave_up = 0;
        const unsigned b = blockIdx.x;
        const uint32_t want = ++*count;
        __threadfence_system();
        for (int p = 0; p < a.nranks; p++)
            if (p != a.rank)
                a.signal[p]->arrive[b][a.rank] = want;
        const braid_devcoll_signal *mine = a.signal[a.rank];
        uint64_t start = 0;
        for (int p = 0; p < a.nranks && !gave_up; p++) {
            if (p == a.rank)
                continue;
            for (unsigned spins = 1; (int32_t)(mine->arrive[b][p] - want) < 0; spins++) {
#if DEVCOLL_EMU
                braid_emu_pause();
#endif
                if ((spins & 255u) != 0)
                    continue;
                if (*a.abort) {
                    record_fault(a, BRAID_DEVCOLL_ABORTED, p);
                    gave_up = 1;
                    break;
                }
                uint64_t t = now_ns();
                if (start == 0)
                    start = t;
                else if (a.timeout_ns && t - start > a.timeout_ns) {
                    record_fault(a, BRAID_DEVCOLL_TIMED_OUT, p);
                    gave_up = 1;
                    break;
                }
            }
        }
        __threadfence_system();
    }
    __syncthreads();
    return gave_up;
}

template <class Tr> struct block_ops {
    typedef typename Tr::type T;
    typedef typename Tr::ctype C;
    static constexpr size_t V = 16 / sizeof(T); /* elements per 128-bit access */
    union vec {
        uint4 u;
        T e[V];
    };

    static __device__ T scalar_of(const braid_devcoll_args &a)
    {
        union {
            uint64_t u;
            T t;
        } s;
        s.u = a.scalar;
        return s.t;
    }

    /* dst[0, n) = src (MULSUM: premultiplied by this rank's scalar). dst is
     * a segment (aligned); vec says src is too. */
    static __device__ void stage(const braid_devcoll_args &a, T *dst, const T *src, size_t n, bool vec_ok)
    {
        const T s = scalar_of(a);
        size_t done = 0;
        if (vec_ok) {
            done = n / V * V;
            for (size_t g = threadIdx.x; g < n / V; g += blockDim.x) {
                vec x;
                x.u = ((const uint4 *)src)[g];
                if (Tr::mulsum)
                    for (size_t e = 0; e < V; e++)
                        x.e[e] = Tr::premul(x.e[e], s);
                ((uint4 *)dst)[g] = x.u;
            }
        }
        for (size_t i = done + threadIdx.x; i < n; i += blockDim.x)
            dst[i] = Tr::mulsum ? Tr::premul(src[i], s) : src[i];
    }

    /* dst[0, n) = finish(fold over k of peer k's segment at start), in rank
     * order. The peers' segments are aligned; vec says dst is too. */
    static __device__ void fold(const braid_devcoll_args &a, size_t seg_off, size_t start, size_t n, T *dst,
                                bool vec_ok)
    {
        size_t done = 0;
        if (vec_ok) {
            done = n / V * V;
            for (size_t g = threadIdx.x; g < n / V; g += blockDim.x) {
                vec x;
                C acc[V];
                x.u = load_peer((const uint4 *)((const T *)(a.data[0] + seg_off) + start) + g);
                for (size_t e = 0; e < V; e++)
                    acc[e] = Tr::load(x.e[e]);
#pragma unroll
                for (int k = 1; k < BRAID_DEVCOLL_MAX_RANKS; k++) {
                    if (k < a.nranks) {
                        x.u = load_peer((const uint4 *)((const T *)(a.data[k] + seg_off) + start) + g);
                        for (size_t e = 0; e < V; e++)
                            acc[e] = Tr::combine(acc[e], Tr::load(x.e[e]));
                    }
                }
                for (size_t e = 0; e < V; e++)
                    x.e[e] = Tr::finish(acc[e], a.nranks);
                ((uint4 *)dst)[g] = x.u;
            }
        }
        for (size_t i = done + threadIdx.x; i < n; i += blockDim.x) {
            C acc = Tr::load(load_peer_one((const T *)(a.data[0] + seg_off) + start + i));
#pragma unroll
            for (int k = 1; k < BRAID_DEVCOLL_MAX_RANKS; k++)
                if (k < a.nranks)
                    acc = Tr::combine(acc, Tr::load(load_peer_one((const T *)(a.data[k] + seg_off) + start + i)));
            dst[i] = Tr::finish(acc, a.nranks);
        }
    }

    /* dst[0, n) = a peer's segment from start; vec says dst is aligned. */
    static __device__ void copy_out(const T *src, T *dst, size_t n, bool vec_ok)
    {
        size_t done = 0;
        if (vec_ok) {
            done = n / V * V;
            for (size_t g = threadIdx.x; g < n / V; g += blockDim.x)
                ((uint4 *)dst)[g] = load_peer((const uint4 *)src + g);
        }
        for (size_t i = done + threadIdx.x; i < n; i += blockDim.x)
            dst[i] = load_peer_one(src + i);
    }

    /* One chunk of n elements at element off of the call, through slot
     * `slot` of segment b. Returns nonzero when a barrier gave up. */
    static __device__ int chunk(const braid_devcoll_args &a, size_t off, size_t n, uint32_t slot, uint32_t *count)
    {
        const size_t seg_off = ((size_t)blockIdx.x * 2 + slot) * a.seg_bytes;
        T *mine = (T *)(a.data[a.rank] + seg_off);
        const T *send = (const T *)a.send + off;
        T *recv = (T *)a.recv + off;
        const bool send_vec = (uintptr_t)a.send % 16 == 0, recv_vec = (uintptr_t)a.recv % 16 == 0;

        if (a.algo == BRAID_DEVCOLL_BROADCAST) {
            if (a.rank == a.root) {
                stage(a, mine, send, n, send_vec);
                if ((const void *)send != (void *)recv)
                    copy_out(send, recv, n, send_vec && recv_vec);
            }
            if (block_barrier(a, count))
                return 1;
            if (a.rank != a.root)
                copy_out((const T *)(a.data[a.root] + seg_off), recv, n, recv_vec);
            return 0;
        }

        stage(a, mine, send, n, send_vec);
        if (block_barrier(a, count))
            return 1;
        if (a.algo == BRAID_DEVCOLL_ONESHOT) {
            fold(a, seg_off, 0, n, recv, recv_vec);
            return 0;
        }
        /* two-shot: shard r (a whole number of 16-byte groups) is rank r's */
        const size_t per = ((n + a.nranks - 1) / a.nranks + V - 1) / V * V;
        const size_t lo = per * a.rank < n ? per * a.rank : n;
        const size_t hi = lo + per < n ? lo + per : n;
        fold(a, seg_off, lo, hi - lo, mine + lo, true);
        if (block_barrier(a, count))
            return 1;
        for (int p = 0; p < a.nranks; p++) {
            size_t plo = per * p < n ? per * p : n, phi = plo + per < n ? plo + per : n;
            copy_out((const T *)(a.data[p] + seg_off) + plo, recv + plo, phi - plo, recv_vec);
        }
        return 0;
    }

    /* Block b's range of the call, chunk by chunk; its counters are read
     * here and written back at the end, by this block only. */
    static __device__ void run(const braid_devcoll_args &a)
    {
        const size_t per_block = ((a.count + a.nblocks - 1) / a.nblocks + V - 1) / V * V;
        const size_t lo = per_block * blockIdx.x < a.count ? per_block * blockIdx.x : a.count;
        const size_t hi = lo + per_block < a.count ? lo + per_block : a.count;
        if (lo >= hi)
            return;
        size_t chunk_n = a.seg_bytes / sizeof(T);
        if (a.algo == BRAID_DEVCOLL_TWOSHOT)
            chunk_n = chunk_n / (a.nranks * V) * (a.nranks * V);

        braid_devcoll_signal *mine = a.signal[a.rank];
        uint32_t chunks = mine->chunks[blockIdx.x];
        uint32_t count = mine->barriers[blockIdx.x]; /* thread 0's is the one that counts */
        for (size_t off = lo; off < hi; off += chunk_n) {
            size_t n = hi - off < chunk_n ? hi - off : chunk_n;
            int gave_up = chunk(a, off, n, chunks & 1u, &count);
            chunks++;
            if (gave_up)
                break;
        }
        /* every thread read the counters before the first barrier */
        if (threadIdx.x == 0) {
            mine->chunks[blockIdx.x] = chunks;
            mine->barriers[blockIdx.x] = count;
        }
    }
};

template <class Tr> __global__ void k_devcoll(braid_devcoll_args a)
{
    block_ops<Tr>::run(a);
}

struct kernel_table {
    kernel_fn fn[BRAID_DTYPE_COUNT][BRAID_OP_COUNT] = {};
    kernel_table()
    {
#define ENTRY(ENUM, name, T, C, OPENUM, op, cfn) fn[BRAID_##ENUM][BRAID_##OPENUM] = k_devcoll<tr_##name##_##op>;
        BRAID_EW_FOREACH_PAIR(ENTRY)
#undef ENTRY
    }
};

const kernel_table table;

braid_status bad(const char *what)
{
    return braid__error(BRAID_ERR_INVALID_ARG, "device collective: %s", what);
}

braid_status check(const braid_devcoll_args *a)
{
    if (a == NULL)
        return bad("no arguments");
    if ((unsigned)a->dtype >= BRAID_DTYPE_COUNT || (unsigned)a->op >= BRAID_OP_COUNT)
        return braid__error(BRAID_ERR_INVALID_ARG, "device collective: invalid dtype %d or op %d", (int)a->dtype,
                            (int)a->op);
    if (a->algo != BRAID_DEVCOLL_ONESHOT && a->algo != BRAID_DEVCOLL_TWOSHOT && a->algo != BRAID_DEVCOLL_BROADCAST)
        return braid__error(BRAID_ERR_INVALID_ARG, "device collective: invalid algorithm %d", (int)a->algo);
    if (a->nranks < 1 || a->nranks > BRAID_DEVCOLL_MAX_RANKS || a->rank < 0 || a->rank >= a->nranks)
        return braid__error(BRAID_ERR_INVALID_ARG, "device collective: rank %d of %d (1..%d ranks)", a->rank,
                            a->nranks, BRAID_DEVCOLL_MAX_RANKS);
    if (a->algo == BRAID_DEVCOLL_BROADCAST && (a->root < 0 || a->root >= a->nranks))
        return braid__error(BRAID_ERR_INVALID_ARG, "device collective: root %d out of range [0, %d)", a->root,
                            a->nranks);
    if (a->nblocks < 1 || a->nblocks > BRAID_DEVCOLL_MAX_BLOCKS)
        return braid__error(BRAID_ERR_INVALID_ARG, "device collective: %d blocks (1..%d)", a->nblocks,
                            BRAID_DEVCOLL_MAX_BLOCKS);
    if (a->seg_bytes % 16 != 0 || a->seg_bytes < 16 * (size_t)a->nranks)
        return braid__error(BRAID_ERR_INVALID_ARG,
                            "device collective: segment of %zu bytes (a multiple of 16, at least 16 per rank)",
                            a->seg_bytes);
    if (a->count == 0)
        return BRAID_OK;
    if (a->send == NULL || a->recv == NULL)
        return bad("NULL send or recv buffer");
    if (a->abort == NULL || a->fault == NULL)
        return bad("no abort flag or fault record");
    for (int p = 0; p < a->nranks; p++)
        if (a->signal[p] == NULL || a->data[p] == NULL)
            return braid__error(BRAID_ERR_INVALID_ARG, "device collective: rank %d's region is not mapped", p);
    return BRAID_OK;
}

} // namespace

extern "C" size_t braid__devcoll_data_offset(void)
{
    return (sizeof(braid_devcoll_signal) + 255) / 256 * 256;
}

extern "C" size_t braid__devcoll_region_bytes(int nblocks, size_t seg_bytes)
{
    return braid__devcoll_data_offset() + (size_t)nblocks * 2 * seg_bytes;
}

/* One block per 256 KiB: a small call meets its peers once, through one
 * block, and a large one spreads over the SMs. */
extern "C" int braid__devcoll_blocks_for(size_t bytes, int max_blocks)
{
    size_t want = (bytes + (256u << 10) - 1) / (256u << 10);
    if (want > (size_t)max_blocks)
        want = (size_t)max_blocks;
    return want < 1 ? 1 : (int)want;
}

#if !DEVCOLL_EMU
/* cudaFuncGetAttributes loads a kernel under lazy loading. */
static braid_status load_all(void)
{
    for (int d = 0; d < BRAID_DTYPE_COUNT; d++)
        for (int o = 0; o < BRAID_OP_COUNT; o++) {
            cudaFuncAttributes attr;
            cudaError_t err = table.fn[d][o] ? cudaFuncGetAttributes(&attr, (const void *)table.fn[d][o]) : cudaSuccess;
            if (err != cudaSuccess) {
                (void)cudaGetLastError();
                return braid__error(BRAID_ERR_CUDA, "device collective: cannot load the kernel for dtype %d op %d: %s",
                                    d, o, cudaGetErrorString(err));
            }
        }
    return BRAID_OK;
}
#endif

extern "C" braid_status braid__cuda_devcoll_preload(void)
{
#if DEVCOLL_EMU
    return BRAID_OK; /* the emulation has no modules to load */
#else
    static braid_cuda_once once = BRAID_CUDA_ONCE_INIT;
    return braid__cuda_once_per_device(&once, load_all, "device collective");
#endif
}

extern "C" braid_status braid__cuda_devcoll(const braid_devcoll_args *a, void *stream)
{
    BRAID_CHECK(check(a));
    if (a->count == 0)
        return BRAID_OK;
    /* broadcast moves elements: any op's kernel of the dtype will do */
    kernel_fn fn = table.fn[a->dtype][a->algo == BRAID_DEVCOLL_BROADCAST ? BRAID_SUM : a->op];
    const unsigned threads = DEVCOLL_EMU ? 4 : 512;
    void *args[] = {(void *)a};
#if DEVCOLL_EMU
    cudaError_t err = braid_emu_launch_threaded(fn, dim3((unsigned)a->nblocks), dim3(threads), args);
#else
    cudaError_t err =
        cudaLaunchKernel((const void *)fn, dim3((unsigned)a->nblocks), dim3(threads), args, 0, (cudaStream_t)stream);
#endif
    (void)stream;
    if (err != cudaSuccess) {
        (void)cudaGetLastError();
        return braid__error(BRAID_ERR_CUDA, "device collective: rank %d: kernel launch (%zu elements) failed: %s",
                            a->rank, a->count, cudaGetErrorString(err));
    }
    return BRAID_OK;
}
