/*
 * Host emulation of the CUDA features reduce_kernels.cu uses, so its kernel
 * logic (head/128-bit body/tail split, multi-input folds, casts, premul,
 * argument checks) is tested on machines without a GPU: the test
 * 'cuda-emu' compiles reduce_kernels.cu as plain C++ with this directory
 * first on the include path and runs tests/test_cuda.c against it.
 *
 * Each launch runs every thread of the grid one after another. That is a
 * faithful model here because the kernels never communicate between
 * threads. What it cannot check: device code generation, __CUDA_ARCH__
 * branches of elementwise.h (the intrinsics there are one-liners), and
 * speed. Real-device runs of test_cuda cover those.
 */
#ifndef BRAID_CUDA_EMU_RUNTIME_H
#define BRAID_CUDA_EMU_RUNTIME_H

#include <stddef.h>
#include <stdint.h>

#define __global__
#define __host__
#define __device__
#define __forceinline__ inline

struct uint4 {
    unsigned x, y, z, w;
};
struct dim3 {
    unsigned x, y, z;
    dim3(unsigned a = 1, unsigned b = 1, unsigned c = 1) : x(a), y(b), z(c) {}
};
inline dim3 blockIdx, threadIdx, blockDim, gridDim;

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
/* the kernels' launcher passes (const void *)fn; kernel_fn is its type */
#define cudaLaunchKernel(fn, grid, block, args, shmem, stream)                                 \
    braid_emu_launch(reinterpret_cast<kernel_fn>(fn), grid, block, args)

#endif
