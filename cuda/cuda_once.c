/* braid__cuda_once_per_device (braid_cuda.h): the kernels' per-device
 * loading, shared by reduce_kernels.cu and device_coll_kernels.cu. A file
 * of its own, so that programs linking braid's kernels with the host
 * emulation of cuda_device.c (cuda/emu/) get nothing else from here. */
#include <cuda_runtime_api.h>

#include "braid_cuda.h"
#include "status.h"

braid_status braid__cuda_once_per_device(braid_cuda_once *once, braid_status (*load)(void), const char *what)
{
    int dev = 0;
    if (cudaGetDevice(&dev) != cudaSuccess || dev < 0 || dev >= (int)sizeof(once->done)) {
        (void)cudaGetLastError();
        return braid__error(BRAID_ERR_CUDA, "%s: no current device to load the kernels on", what);
    }
    pthread_mutex_lock(&once->mu);
    braid_status st = once->done[dev] ? BRAID_OK : load();
    once->done[dev] = st == BRAID_OK;
    pthread_mutex_unlock(&once->mu);
    return st;
}
