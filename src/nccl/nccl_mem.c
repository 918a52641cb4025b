/* Host memory and streams: telling device memory apart where the build
 * has no device path (nccl_dev_stub.c), waiting for a stream before a
 * host call reads its buffers, reading a device PreMulSum scalar, and the
 * calling thread's device. A CUDA program may call with host buffers and
 * real streams. All of it needs a look at the CUDA driver, which is only
 * used when the program has already loaded it (RTLD_NOLOAD): a process without libcuda.so.1 has no device memory
 * and no streams, and a CPU-only run never loads CUDA because of us. The
 * driver API (not the runtime) is used because nvcc links the runtime
 * statically by default, so libcudart may not exist as a library at all. */
#include <dlfcn.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "dl_loaded.h"
#include "nccl_internal.h"
#if defined(BRAID_HAVE_CUDA)
#include "braid_cuda.h"
#endif

#define CU_POINTER_ATTRIBUTE_MEMORY_TYPE 2
#define CU_POINTER_ATTRIBUTE_IS_MANAGED 8
#define CU_MEMORYTYPE_DEVICE 2

typedef int (*cu_pointer_get_attribute_fn)(void *data, int attribute, unsigned long long ptr);
typedef int (*cu_stream_synchronize_fn)(void *stream);
typedef int (*cu_memcpy_dtoh_fn)(void *dst, unsigned long long src, size_t bytes);
typedef int (*cu_get_error_string_fn)(int err, const char **str);
typedef int (*cu_ctx_get_device_fn)(int *device);

typedef struct {
    cu_pointer_get_attribute_fn pointer_get_attribute;
    cu_stream_synchronize_fn stream_synchronize;
    cu_memcpy_dtoh_fn memcpy_dtoh;
    cu_get_error_string_fn get_error_string;
    cu_ctx_get_device_fn ctx_get_device;
} cuda_driver;

/* The driver's entry points if the process has it loaded, else NULL. Not
 * cached while absent: the program may load CUDA after its first call. */
static const cuda_driver *driver(void)
{
    static cuda_driver d;
    static int loaded; /* set once, after d is filled */
    if (__atomic_load_n(&loaded, __ATOMIC_ACQUIRE))
        return &d;
    static braid_dl_probe driver_probe;
    void *h = braid__dl_if_loaded("libcuda.so.1", &driver_probe);
    if (!h)
        return NULL;
    cuda_driver f = {
        .pointer_get_attribute = (cu_pointer_get_attribute_fn)dlsym(h, "cuPointerGetAttribute"),
        .stream_synchronize = (cu_stream_synchronize_fn)dlsym(h, "cuStreamSynchronize"),
        .memcpy_dtoh = (cu_memcpy_dtoh_fn)dlsym(h, "cuMemcpyDtoH_v2"),
        .get_error_string = (cu_get_error_string_fn)dlsym(h, "cuGetErrorString"),
        .ctx_get_device = (cu_ctx_get_device_fn)dlsym(h, "cuCtxGetDevice"),
    };
    if (!f.pointer_get_attribute || !f.stream_synchronize || !f.memcpy_dtoh)
        return NULL;
    d = f; /* every thread that gets here stores the same values */
    __atomic_store_n(&loaded, 1, __ATOMIC_RELEASE);
    return &d;
}

static const char *cu_error(const cuda_driver *d, int err)
{
    const char *s = NULL;
    if (d->get_error_string && d->get_error_string(err, &s) == 0 && s)
        return s;
    return "unknown CUDA driver error";
}

/* 1 for memory only a device can read (managed memory is host-visible). */
static int is_device_only(const cuda_driver *d, const void *p)
{
    unsigned int type = 0;
    int managed = 0;
    if (!p || d->pointer_get_attribute(&type, CU_POINTER_ATTRIBUTE_MEMORY_TYPE, (uintptr_t)p) != 0)
        return 0; /* unknown to CUDA: ordinary host memory */
    if (type != CU_MEMORYTYPE_DEVICE)
        return 0;
    if (d->pointer_get_attribute(&managed, CU_POINTER_ATTRIBUTE_IS_MANAGED, (uintptr_t)p) == 0 && managed)
        return 0;
    return 1;
}

ncclResult_t nccl__check_host(const void *p, const char *what, const char *call)
{
    const cuda_driver *d = driver();
    if (d && is_device_only(d, p))
        return nccl__fail(ncclInvalidUsage,
                          "%s: %s %p is CUDA device memory, but this libnccl.so.2 (braid) was built without "
                          "CUDA and moves host memory only: pass host or managed buffers, or use a CUDA build",
                          call, what, p);
    return ncclSuccess;
}

ncclResult_t nccl__stream_sync(cudaStream_t stream, const char *call)
{
    if (!stream)
        return ncclSuccess;
#if defined(BRAID_HAVE_CUDA)
    /* A CUDA build has its own runtime: no need for the program's driver. */
    if (braid__cuda_available())
        return nccl__from_braid(braid__cuda_stream_sync((void *)stream), call);
#endif
    const cuda_driver *d = driver();
    if (!d)
        return nccl__fail(ncclInvalidArgument,
                          "%s: stream %p given, but this process has not loaded the CUDA driver: pass NULL", call,
                          (void *)stream);
    int err = d->stream_synchronize(stream);
    if (err != 0)
        return nccl__fail(ncclUnhandledCudaError, "%s: cuStreamSynchronize(%p) failed: %s (%d)", call, (void *)stream,
                          cu_error(d, err), err);
    return ncclSuccess;
}

/* Read a PreMulSum scalar, which NCCL allows to live in device memory. */
ncclResult_t nccl__read_scalar(void *dst, const void *src, size_t bytes, const char *call)
{
    const cuda_driver *d = driver();
    if (d && is_device_only(d, src)) {
        int err = d->memcpy_dtoh(dst, (uintptr_t)src, bytes);
        if (err != 0)
            return nccl__fail(ncclUnhandledCudaError, "%s: reading the device scalar %p failed: %s (%d)", call, src,
                              cu_error(d, err), err);
        return ncclSuccess;
    }
    memcpy(dst, src, bytes);
    return ncclSuccess;
}

int nccl__current_device(void)
{
    const cuda_driver *d = driver();
    int dev;
    if (d && d->ctx_get_device && d->ctx_get_device(&dev) == 0)
        return dev;
    return -1; /* no CUDA context on this thread */
}
