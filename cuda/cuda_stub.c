/* braid_cuda.h for builds without CUDA (-Dcuda=disabled, or no nvcc /
 * cudart_static found): no device, and every operation says so, so callers
 * need no #ifdefs. */
#include "braid_cuda.h"
#include "status.h"

#define NO_CUDA "braid was built without CUDA"

int braid__cuda_available(void)
{
    return 0;
}

int braid__cuda_device_nodes_present(void)
{
    return 0;
}

const char *braid__cuda_unavailable_reason(void)
{
    return NO_CUDA;
}

int braid__cuda_device_count(void)
{
    return 0;
}

int braid__cuda_sm_count(int device)
{
    (void)device;
    return 0;
}

int braid__cuda_context_seen(void)
{
    return 0;
}

braid_cuda_ptr_kind braid__cuda_ptr_kind(const void *p, int *device)
{
    (void)p;
    if (device)
        *device = -1;
    return BRAID_CUDA_PTR_HOST;
}

braid_status braid__cuda_reduce(braid_dtype dtype, braid_op op, void *dst, const void *const *srcs,
                                int nsrcs, size_t count, int nranks, void *stream)
{
    (void)dtype, (void)op, (void)dst, (void)srcs, (void)nsrcs, (void)count, (void)nranks, (void)stream;
    return braid__error(BRAID_ERR_UNSUPPORTED, "cuda reduce: " NO_CUDA);
}

braid_status braid__cuda_reduce_cast(braid_dtype dst_dtype, void *dst, braid_dtype src_dtype,
                                     braid_op op, const void *const *srcs, int nsrcs, size_t count,
                                     int nranks, void *stream)
{
    (void)dst_dtype, (void)dst, (void)src_dtype, (void)op, (void)srcs, (void)nsrcs, (void)count,
        (void)nranks, (void)stream;
    return braid__error(BRAID_ERR_UNSUPPORTED, "cuda reduce: " NO_CUDA);
}

braid_status braid__cuda_reduce_premul(braid_dtype dtype, void *dst, const void *const *srcs, int nsrcs,
                                       size_t count, double scale, void *stream)
{
    (void)dtype, (void)dst, (void)srcs, (void)nsrcs, (void)count, (void)scale, (void)stream;
    return braid__error(BRAID_ERR_UNSUPPORTED, "cuda premul: " NO_CUDA);
}

braid_status braid__cuda_malloc(void **p, size_t bytes)
{
    (void)p, (void)bytes;
    return braid__error(BRAID_ERR_UNSUPPORTED, "cuda malloc: " NO_CUDA);
}

void braid__cuda_free(void *p)
{
    (void)p;
}

braid_status braid__cuda_memcpy_async(void *dst, const void *src, size_t bytes, void *stream)
{
    (void)dst, (void)src, (void)bytes, (void)stream;
    return braid__error(BRAID_ERR_UNSUPPORTED, "cuda memcpy: " NO_CUDA);
}

braid_status braid__cuda_stream_sync(void *stream)
{
    (void)stream;
    return braid__error(BRAID_ERR_UNSUPPORTED, "cuda stream sync: " NO_CUDA);
}

braid_status braid__cuda_preload(void)
{
    return braid__error(BRAID_ERR_UNSUPPORTED, "cuda preload: " NO_CUDA);
}

braid_status braid__cuda_wait_flag(const volatile uint32_t *flag, uint32_t want, void *stream)
{
    (void)flag, (void)want, (void)stream;
    return braid__error(BRAID_ERR_UNSUPPORTED, "cuda gate: " NO_CUDA);
}
