/* -g 1: benchmark on CUDA device buffers, one GPU per rank.
 *
 * braid-bench stays a client of braid.h alone. libbraid links the CUDA
 * runtime statically and keeps it private, so the bench talks to the CUDA
 * driver (libcuda.so.1, which braid's runtime loads too) through dlopen:
 * it retains the device's primary context and makes it current, which is
 * the context the runtime inside braid uses for that device, so braid sees
 * the bench's allocations as device memory of the calling thread's current
 * device. No CUDA library is needed at build time, and a machine without a
 * driver or device gets a message, not a crash.
 *
 * Device choice: the rank's local rank (braid_pg_local_rank, i.e. its
 * index among the ranks on this host) modulo the number of visible devices,
 * so ranks may share a GPU. Buffers are filled and checked through host
 * copies: the pattern code of verify.c is unchanged. */
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench.h"

typedef int CUresult; /* CUDA_SUCCESS == 0 */
typedef int CUdevice;
typedef unsigned long long CUdeviceptr;
typedef struct CUctx_st *CUcontext;

static struct {
    CUresult (*init)(unsigned);
    CUresult (*device_get_count)(int *);
    CUresult (*device_get)(CUdevice *, int);
    CUresult (*device_get_name)(char *, int, CUdevice);
    CUresult (*primary_ctx_retain)(CUcontext *, CUdevice);
    CUresult (*ctx_set_current)(CUcontext);
    CUresult (*ctx_synchronize)(void);
    CUresult (*mem_alloc)(CUdeviceptr *, size_t);
    CUresult (*mem_free)(CUdeviceptr);
    CUresult (*memcpy_htod)(CUdeviceptr, const void *, size_t);
    CUresult (*memcpy_dtoh)(void *, CUdeviceptr, size_t);
    CUresult (*get_error_string)(CUresult, const char **);
} cu;

static char cu_why[256];

static const char *cu_err(CUresult e)
{
    const char *s = NULL;
    if (cu.get_error_string && cu.get_error_string(e, &s) == 0 && s)
        return s;
    return "unknown CUDA driver error";
}

static int load_driver(void)
{
    void *h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_GLOBAL);
    if (!h) {
        snprintf(cu_why, sizeof(cu_why), "no CUDA driver (libcuda.so.1: %s)", dlerror());
        return -1;
    }
#define SYM(field, name)                                                                                               \
    if (!(*(void **)&cu.field = dlsym(h, name))) {                                                                     \
        snprintf(cu_why, sizeof(cu_why), "the CUDA driver lacks %s", name);                                            \
        return -1;                                                                                                     \
    }
    SYM(init, "cuInit");
    SYM(device_get_count, "cuDeviceGetCount");
    SYM(device_get, "cuDeviceGet");
    SYM(device_get_name, "cuDeviceGetName");
    SYM(primary_ctx_retain, "cuDevicePrimaryCtxRetain");
    SYM(ctx_set_current, "cuCtxSetCurrent");
    SYM(ctx_synchronize, "cuCtxSynchronize");
    SYM(mem_alloc, "cuMemAlloc_v2");
    SYM(mem_free, "cuMemFree_v2");
    SYM(memcpy_htod, "cuMemcpyHtoD_v2");
    SYM(memcpy_dtoh, "cuMemcpyDtoH_v2");
    SYM(get_error_string, "cuGetErrorString");
#undef SYM
    return 0;
}

int bench_device_init(int local_rank, int *device, char *name, size_t name_len)
{
    if (load_driver() != 0)
        return -1;
    CUresult e = cu.init(0);
    int n = 0;
    if (e == 0)
        e = cu.device_get_count(&n);
    if (e != 0) {
        snprintf(cu_why, sizeof(cu_why), "no usable CUDA device: cuInit: %s", cu_err(e));
        return -1;
    }
    if (n <= 0) {
        snprintf(cu_why, sizeof(cu_why), "no CUDA device visible (check CUDA_VISIBLE_DEVICES)");
        return -1;
    }
    CUdevice dev;
    CUcontext ctx;
    int ordinal = local_rank % n;
    if ((e = cu.device_get(&dev, ordinal)) != 0 || (e = cu.primary_ctx_retain(&ctx, dev)) != 0 ||
        (e = cu.ctx_set_current(ctx)) != 0) {
        snprintf(cu_why, sizeof(cu_why), "cannot use CUDA device %d: %s", ordinal, cu_err(e));
        return -1;
    }
    if (name && name_len && cu.device_get_name(name, (int)name_len, dev) != 0)
        snprintf(name, name_len, "?");
    *device = ordinal;
    return 0;
}

const char *bench_device_error(void)
{
    return cu_why;
}

void *bench_device_alloc(size_t bytes)
{
    CUdeviceptr p = 0;
    CUresult e = cu.mem_alloc(&p, bytes ? bytes : 1);
    if (e != 0) {
        snprintf(cu_why, sizeof(cu_why), "cuMemAlloc of %zu bytes: %s", bytes, cu_err(e));
        return NULL;
    }
    return (void *)(uintptr_t)p;
}

void bench_device_free(void *p)
{
    if (p)
        (void)cu.mem_free((CUdeviceptr)(uintptr_t)p);
}

int bench_device_put(void *dst, const void *src, size_t bytes)
{
    CUresult e = bytes ? cu.memcpy_htod((CUdeviceptr)(uintptr_t)dst, src, bytes) : 0;
    if (e != 0) {
        snprintf(cu_why, sizeof(cu_why), "cuMemcpyHtoD of %zu bytes: %s", bytes, cu_err(e));
        return -1;
    }
    return 0;
}

int bench_device_get(void *dst, const void *src, size_t bytes)
{
    /* synchronous copies order after the legacy stream, where braid's
     * blocking calls with stream NULL have put their result */
    CUresult e = bytes ? cu.memcpy_dtoh(dst, (CUdeviceptr)(uintptr_t)src, bytes) : 0;
    if (e != 0) {
        snprintf(cu_why, sizeof(cu_why), "cuMemcpyDtoH of %zu bytes: %s", bytes, cu_err(e));
        return -1;
    }
    return 0;
}
