/* CUDA runtime queries behind braid_cuda.h: is there a usable device, how
 * many SMs, what kind of memory is this pointer. Plain C against the
 * runtime API; only the kernels need nvcc (reduce_kernels.cu).
 *
 * cudart is linked statically: the first runtime call dlopens the driver,
 * and on a machine without one it fails with an error code instead of the
 * process failing to load. That first call happens in probe(), once. */
#include <dlfcn.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <unistd.h>

#include <cuda_runtime_api.h>

#include "braid_cuda.h"
#include "dl_loaded.h"
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

int braid__cuda_device_nodes_present(void)
{
#ifdef BRAID_CUDA_FAKE
    return 1; /* the stand-in runtime of tests/cuda_fake.c has its one device */
#else
    return access("/dev/nvidiactl", F_OK) == 0;
#endif
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

/* Can device memory exist in this process yet? Device memory needs a
 * CUDA context, and a context needs the driver, so until some code has
 * loaded libcuda.so.1 (dlopen with RTLD_NOLOAD loads nothing) and made a
 * context (current on this thread, or a device's primary context active:
 * what the runtime API and the frameworks on it use), every pointer is host
 * memory and no CUDA call is needed. A CPU-only job therefore never loads
 * or initializes CUDA through braid, and pays one look at the loader's
 * object count (src/base/dl_loaded.c) and, once the driver is loaded, a few
 * driver queries per call until a context shows up; from then on the answer is cached. Not seen: memory of a
 * context made with cuCtxCreate on another thread and never current on
 * the calling one (runtime-API programs never have such contexts). */
typedef int (*cu_ctx_get_current_fn)(void **ctx);
typedef int (*cu_device_get_count_fn)(int *n);
typedef int (*cu_primary_ctx_get_state_fn)(int dev, unsigned *flags, int *active);

static int contexts_may_exist(void)
{
#ifdef BRAID_CUDA_FAKE
    int cuda_fake_context_exists(void); /* tests/cuda_fake.c: made by the first runtime call that needs one */
    return cuda_fake_context_exists();
#else
    static atomic_int seen;
    static cu_ctx_get_current_fn get_current;
    static cu_device_get_count_fn get_count;
    static cu_primary_ctx_get_state_fn primary_state;
    static atomic_int resolved;
    if (atomic_load_explicit(&seen, memory_order_acquire))
        return 1;
    static pthread_mutex_t resolve_mu = PTHREAD_MUTEX_INITIALIZER;
    if (!atomic_load_explicit(&resolved, memory_order_acquire)) {
        static braid_dl_probe driver_probe;
        void *h = braid__dl_if_loaded("libcuda.so.1", &driver_probe);
        if (!h)
            return 0; /* nobody loaded the driver: no context, no device memory */
        /* The handle is kept: the driver stays loaded for the process's
         * life anyway. */
        pthread_mutex_lock(&resolve_mu);
        if (!atomic_load_explicit(&resolved, memory_order_relaxed)) {
            *(void **)&get_current = dlsym(h, "cuCtxGetCurrent");
            *(void **)&get_count = dlsym(h, "cuDeviceGetCount");
            *(void **)&primary_state = dlsym(h, "cuDevicePrimaryCtxGetState");
            atomic_store_explicit(&resolved, 1, memory_order_release);
        }
        pthread_mutex_unlock(&resolve_mu);
    }
    if (!get_current || !get_count || !primary_state) {
        atomic_store(&seen, 1); /* an unexpected driver: ask cudart per pointer */
        return 1;
    }
    void *ctx = NULL;
    int n = 0, found = get_current(&ctx) == 0 && ctx != NULL;
    if (!found && get_count(&n) == 0) /* fails (not initialized) before anyone ran cuInit */
        for (int d = 0; d < n && !found; d++) {
            unsigned flags = 0;
            int active = 0;
            found = primary_state(d, &flags, &active) == 0 && active;
        }
    if (found)
        atomic_store_explicit(&seen, 1, memory_order_release);
    return found;
#endif
}

int braid__cuda_context_seen(void)
{
    return contexts_may_exist();
}

braid_cuda_ptr_kind braid__cuda_ptr_kind(const void *p, int *device)
{
    struct cudaPointerAttributes attr;
    if (device)
        *device = -1;
    if (p == NULL || !contexts_may_exist() || !braid__cuda_available())
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
