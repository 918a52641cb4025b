/*
 * Host emulation of the CUDA features reduce_kernels.cu uses, so its kernel
 * logic (head/128-bit body/tail split, multi-input folds, casts, premul,
 * argument checks) is tested on machines without a GPU: the test
 * 'cuda-emu' compiles reduce_kernels.cu as plain C++ with this directory
 * first on the include path and runs tests/test_cuda.c against it.
 *
 * cudaLaunchKernel runs every thread of the grid one after another. That
 * is a faithful model for the reduce kernels, whose threads never
 * communicate. The device collectives (device_coll_kernels.cu) do: their
 * threads meet at __syncthreads and their blocks wait for other processes'
 * blocks. braid_emu_launch_threaded runs them with one host thread per
 * device thread of a block (a pthread barrier is __syncthreads; __shared__
 * is a static, shared by the block's threads) and the blocks one after
 * another, which is enough because no block waits for another block of its
 * own grid. What the emulation cannot check: device code generation,
 * __CUDA_ARCH__ branches of elementwise.h (the intrinsics there are
 * one-liners), the GPU's memory model and speed. Real-device runs of
 * test_cuda cover those.
 */
#ifndef BRAID_CUDA_EMU_RUNTIME_H
#define BRAID_CUDA_EMU_RUNTIME_H

#include <pthread.h>
#include <sched.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <time.h>

#define __global__
#define __host__
#define __device__
#define __forceinline__ inline
#define __shared__ static

struct uint4 {
    unsigned x, y, z, w;
};
struct dim3 {
    unsigned x, y, z;
    dim3(unsigned a = 1, unsigned b = 1, unsigned c = 1) : x(a), y(b), z(c) {}
};
inline thread_local dim3 blockIdx, threadIdx, blockDim, gridDim;
inline thread_local pthread_barrier_t *braid_emu_block_barrier;

inline void __syncthreads()
{
    pthread_barrier_wait(braid_emu_block_barrier);
}
inline void __threadfence_system()
{
    __atomic_thread_fence(__ATOMIC_SEQ_CST);
}
inline unsigned atomicCAS(unsigned *p, unsigned expected, unsigned desired)
{
    __atomic_compare_exchange_n(p, &expected, desired, false, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST);
    return expected;
}
inline uint64_t braid_emu_now_ns()
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}
/* A spinning device thread lets the other ranks' processes run. */
inline void braid_emu_pause()
{
    sched_yield();
}

typedef int cudaError_t;
enum { cudaSuccess = 0 };
typedef void *cudaStream_t;
inline const char *cudaGetErrorString(cudaError_t) { return "emulated cuda error"; }
inline cudaError_t cudaGetLastError() { return cudaSuccess; }
inline cudaError_t cudaGetDevice(int *d)
{
    *d = 0;
    return cudaSuccess;
}

template <class P> cudaError_t braid_emu_launch(void (*fn)(P), dim3 grid, dim3 block, void **args)
{
    P p = *(P *)args[0];
    gridDim = grid;
    blockDim = block;
    for (unsigned b = 0; b < grid.x; b++)
        for (unsigned t = 0; t < block.x; t++) {
            blockIdx = dim3(b);
            threadIdx = dim3(t);
            fn(p);
        }
    return cudaSuccess;
}
template <class P> struct braid_emu_thread {
    void (*fn)(P);
    P p;
    dim3 grid, block, bidx, tidx;
    pthread_barrier_t *barrier;
};

template <class P> void *braid_emu_thread_main(void *arg)
{
    braid_emu_thread<P> *t = (braid_emu_thread<P> *)arg;
    gridDim = t->grid;
    blockDim = t->block;
    blockIdx = t->bidx;
    threadIdx = t->tidx;
    braid_emu_block_barrier = t->barrier;
    t->fn(t->p);
    return nullptr;
}

/* Blocks in turn, each block's threads at once (see the top). */
template <class P> cudaError_t braid_emu_launch_threaded(void (*fn)(P), dim3 grid, dim3 block, void **args)
{
    enum { MAX_THREADS = 64 };
    if (block.x > MAX_THREADS)
        return 1;
    for (unsigned b = 0; b < grid.x; b++) {
        pthread_barrier_t barrier;
        pthread_barrier_init(&barrier, nullptr, block.x);
        braid_emu_thread<P> ts[MAX_THREADS];
        pthread_t ids[MAX_THREADS];
        for (unsigned t = 0; t < block.x; t++) {
            ts[t] = {fn, *(P *)args[0], grid, block, dim3(b), dim3(t), &barrier};
            if (pthread_create(&ids[t], nullptr, braid_emu_thread_main<P>, &ts[t]) != 0)
                abort(); /* the threads made so far wait at the barrier for ever */
        }
        for (unsigned t = 0; t < block.x; t++)
            pthread_join(ids[t], nullptr);
        pthread_barrier_destroy(&barrier);
    }
    return cudaSuccess;
}

/* the kernels' launcher passes (const void *)fn; kernel_fn is its type */
#define cudaLaunchKernel(fn, grid, block, args, shmem, stream)                                 \
    braid_emu_launch(reinterpret_cast<kernel_fn>(fn), grid, block, args)

#endif
