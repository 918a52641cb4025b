/* CUDA runtime queries behind braid_cuda.h: is there a usable device, how
 * many SMs, what kind of memory is this pointer. Plain C against the
 * runtime API; only the kernels need nvcc (reduce_kernels.cu).
 *
 * cudart is linked statically: the first runtime call dlopens the driver,
 * and on a machine without one it fails with an error code instead of the
 * process failing to load. That first call happens in probe(), once. */
#include <pthread.h>
#include <stdio.h>

#include <cuda_runtime_api.h>

#include "braid_cuda.h"
#include "log.h"
#include "status.h"

#define MAX_DEVICES 64

static pthread_once_t probe_once = PTHREAD_ONCE_INIT;
static int device_count;
static char unavailable_reason[256];
static int sm_counts[MAX_DEVICES]; /* 0: not read yet */

static void probe(void)
{
    int n = 0;
    cudaError_t err = cudaGetDeviceCount(&n);
    if (err != cudaSuccess) {
        /* With no driver installed this reads "CUDA driver version is
         * insufficient for CUDA runtime version": say what it means. */
        snprintf(unavailable_reason, sizeof(unavailable_reason),
                 "no usable CUDA driver or device: cudaGetDeviceCount: %s (%s)", cudaGetErrorString(err),
                 cudaGetErrorName(err));
        (void)cudaGetLastError(); /* do not leave it for the next caller */
        n = 0;
    } else if (n == 0) {
        snprintf(unavailable_reason, sizeof(unavailable_reason),
                 "no CUDA device visible (check CUDA_VISIBLE_DEVICES)");
    }
    device_count = n;
    if (n == 0)
        BRAID_INFO("cuda: %s", unavailable_reason);
    else
        BRAID_INFO("cuda: %d device(s)", n);
}

int braid__cuda_available(void)
{
    pthread_once(&probe_once, probe);
    return device_count > 0;
}

const char *braid__cuda_unavailable_reason(void)
{
    pthread_once(&probe_once, probe);
    return device_count > 0 ? "" : unavailable_reason;
}

int braid__cuda_device_count(void)
{
    pthread_once(&probe_once, probe);
    return device_count;
}

int braid__cuda_sm_count(int device)
{
    if (!braid__cuda_available() || device < 0 || device >= MAX_DEVICES)
        return 0;
    /* Racing first readers store the same value; atomics keep it defined. */
    int n = __atomic_load_n(&sm_counts[device], __ATOMIC_RELAXED);
    if (n > 0)
        return n;
    if (cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, device) != cudaSuccess || n <= 0) {
        (void)cudaGetLastError();
        return 0;
    }
    __atomic_store_n(&sm_counts[device], n, __ATOMIC_RELAXED);
    return n;
}

braid_cuda_ptr_kind braid__cuda_ptr_kind(const void *p, int *device)
{
    struct cudaPointerAttributes attr;
    if (device)
        *device = -1;
    if (p == NULL || !braid__cuda_available())
        return BRAID_CUDA_PTR_HOST;
    if (cudaPointerGetAttributes(&attr, p) != cudaSuccess) {
        (void)cudaGetLastError(); /* an unknown pointer is host memory */
        return BRAID_CUDA_PTR_HOST;
    }
    switch (attr.type) {
    case cudaMemoryTypeDevice:
        if (device)
            *device = attr.device;
        return BRAID_CUDA_PTR_DEVICE;
    case cudaMemoryTypeManaged:
        if (device)
            *device = attr.device;
        return BRAID_CUDA_PTR_MANAGED;
    default:
        return BRAID_CUDA_PTR_HOST;
    }
}

braid_status braid__cuda_memcpy_async(void *dst, const void *src, size_t bytes, void *stream)
{
    if (bytes == 0)
        return BRAID_OK;
    if (!braid__cuda_available())
        return braid__error(BRAID_ERR_UNSUPPORTED, "cuda: memcpy: %s", unavailable_reason);
    cudaError_t err = cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, (cudaStream_t)stream);
    if (err != cudaSuccess) {
        (void)cudaGetLastError();
        return braid__error(BRAID_ERR_CUDA, "cuda: cudaMemcpyAsync of %zu bytes failed: %s", bytes,
                            cudaGetErrorString(err));
    }
    return BRAID_OK;
}

braid_status braid__cuda_stream_sync(void *stream)
{
    if (!braid__cuda_available())
        return braid__error(BRAID_ERR_UNSUPPORTED, "cuda: stream sync: %s", unavailable_reason);
    cudaError_t err = cudaStreamSynchronize((cudaStream_t)stream);
    if (err != cudaSuccess) {
        (void)cudaGetLastError();
        return braid__error(BRAID_ERR_CUDA, "cuda: cudaStreamSynchronize failed: %s", cudaGetErrorString(err));
    }
    return BRAID_OK;
}

braid_status braid__cuda_malloc(void **p, size_t bytes)
{
    void *mem = NULL;
    if (!braid__cuda_available())
        return braid__error(BRAID_ERR_UNSUPPORTED, "cuda: malloc: %s", unavailable_reason);
    cudaError_t err = cudaMalloc(&mem, bytes ? bytes : 1);
    if (err != cudaSuccess) {
        (void)cudaGetLastError();
        return braid__error(err == cudaErrorMemoryAllocation ? BRAID_ERR_NO_MEMORY : BRAID_ERR_CUDA,
                            "cuda: cudaMalloc of %zu bytes failed: %s", bytes, cudaGetErrorString(err));
    }
    *p = mem;
    return BRAID_OK;
}

void braid__cuda_free(void *p)
{
    if (p == NULL)
        return;
    cudaError_t err = cudaFree(p);
    if (err != cudaSuccess) {
        (void)cudaGetLastError();
        BRAID_WARN("cuda: cudaFree(%p) failed: %s", p, cudaGetErrorString(err));
    }
}
