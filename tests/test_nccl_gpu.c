/* libnccl.so.2 inside a CUDA program: host buffers with real streams,
 * managed memory, a PreMulSum scalar in device memory, and device buffers,
 * which this build must refuse with a reason (never touch or corrupt).
 * Written against nccl.h plus the CUDA driver API, loaded with dlopen so
 * the test builds without a CUDA toolkit; exits 77 (skip) without a driver
 * or a device. Two ranks, forked before either touches CUDA. */
#include <nccl.h>

#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

typedef int CUresult;
typedef unsigned long long CUdeviceptr;
typedef void *CUcontext;

static struct {
    CUresult (*init)(unsigned);
    CUresult (*device_get_count)(int *);
    CUresult (*device_get)(int *, int);
    CUresult (*primary_ctx_retain)(CUcontext *, int);
    CUresult (*ctx_set_current)(CUcontext);
    CUresult (*stream_create)(cudaStream_t *, unsigned);
    CUresult (*mem_alloc)(CUdeviceptr *, size_t);
    CUresult (*mem_alloc_managed)(CUdeviceptr *, size_t, unsigned);
    CUresult (*memcpy_htod)(CUdeviceptr, const void *, size_t);
    CUresult (*mem_free)(CUdeviceptr);
} cu;

static const char *load_driver(void)
{
    static char why[256];
    void *h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_GLOBAL);
    if (!h) {
        snprintf(why, sizeof(why), "no CUDA driver: %s", dlerror());
        return why;
    }
#define SYM(field, name)                                                                                               \
    if (!(*(void **)&cu.field = dlsym(h, name))) {                                                                     \
        snprintf(why, sizeof(why), "CUDA driver lacks %s", name);                                                      \
        return why;                                                                                                    \
    }
    SYM(init, "cuInit");
    SYM(device_get_count, "cuDeviceGetCount");
    SYM(device_get, "cuDeviceGet");
    SYM(primary_ctx_retain, "cuDevicePrimaryCtxRetain");
    SYM(ctx_set_current, "cuCtxSetCurrent");
    SYM(stream_create, "cuStreamCreate");
    SYM(mem_alloc, "cuMemAlloc_v2");
    SYM(mem_alloc_managed, "cuMemAllocManaged");
    SYM(memcpy_htod, "cuMemcpyHtoD_v2");
    SYM(mem_free, "cuMemFree_v2");
#undef SYM
    int n = 0;
    if (cu.init(0) != 0 || cu.device_get_count(&n) != 0 || n == 0)
        return "no CUDA device";
    return NULL;
}

#define CU(call)                                                                                                       \
    do {                                                                                                               \
        CUresult e_ = (call);                                                                                          \
        if (e_ != 0) {                                                                                                 \
            fprintf(stderr, "rank %d: %s failed: CUDA error %d\n", rank, #call, e_);                                   \
            return 1;                                                                                                  \
        }                                                                                                              \
    } while (0)

#define NC(call)                                                                                                       \
    do {                                                                                                               \
        ncclResult_t r_ = (call);                                                                                      \
        if (r_ != ncclSuccess) {                                                                                       \
            fprintf(stderr, "rank %d: %s failed: %s: %s\n", rank, #call, ncclGetErrorString(r_),                       \
                    ncclGetLastError(NULL));                                                                           \
            return 1;                                                                                                  \
        }                                                                                                              \
    } while (0)

enum { COUNT = 1 << 16 };

static int check_sum(const float *buf, int n, const char *what, int rank)
{
    for (int i = 0; i < COUNT; i++)
        if (buf[i] != (float)(n * (n - 1) / 2 + n * (i % 13))) {
            fprintf(stderr, "rank %d: %s element %d is %g\n", rank, what, i, buf[i]);
            return 1;
        }
    return 0;
}

static int rank_main(int rank, int n, ncclUniqueId id)
{
    const char *why = load_driver();
    if (why) {
        fprintf(stderr, "rank %d: %s\n", rank, why);
        return 1;
    }
    int dev;
    CUcontext ctx;
    cudaStream_t stream;
    CU(cu.device_get(&dev, 0));
    CU(cu.primary_ctx_retain(&ctx, dev));
    CU(cu.ctx_set_current(ctx));
    CU(cu.stream_create(&stream, 0));

    ncclComm_t comm;
    NC(ncclCommInitRank(&comm, n, id, rank));
    int cudev;
    NC(ncclCommCuDevice(comm, &cudev));
    if (cudev != 0) {
        fprintf(stderr, "rank %d: ncclCommCuDevice = %d, want 0\n", rank, cudev);
        return 1;
    }

    /* Host buffers on a real stream. */
    float *host = malloc(COUNT * sizeof(float));
    for (int i = 0; i < COUNT; i++)
        host[i] = (float)(rank + i % 13);
    NC(ncclAllReduce(host, host, COUNT, ncclFloat, ncclSum, comm, stream));
    if (check_sum(host, n, "host buffer on a stream", rank))
        return 1;

    /* Managed memory is host-visible: it works. */
    CUdeviceptr managed;
    CU(cu.mem_alloc_managed(&managed, COUNT * sizeof(float), 1 /* CU_MEM_ATTACH_GLOBAL */));
    float *m = (float *)(uintptr_t)managed;
    for (int i = 0; i < COUNT; i++)
        m[i] = (float)(rank + i % 13);
    NC(ncclAllReduce(m, m, COUNT, ncclFloat, ncclSum, comm, stream));
    if (check_sum(m, n, "managed buffer", rank))
        return 1;

    /* A PreMulSum scalar in device memory is read with the driver. */
    CUdeviceptr dscalar;
    float two = 2.0f;
    CU(cu.mem_alloc(&dscalar, sizeof(float)));
    CU(cu.memcpy_htod(dscalar, &two, sizeof(two)));
    ncclRedOp_t premul;
    NC(ncclRedOpCreatePreMulSum(&premul, (void *)(uintptr_t)dscalar, ncclFloat, ncclScalarDevice, comm));
    for (int i = 0; i < COUNT; i++)
        host[i] = (float)(rank + i % 13) / 2.0f;
    NC(ncclAllReduce(host, host, COUNT, ncclFloat, premul, comm, NULL));
    if (check_sum(host, n, "PreMulSum with a device scalar", rank))
        return 1;
    NC(ncclRedOpDestroy(premul, comm));

    /* Device buffers: refused with a reason, on every rank alike, and the
     * communicator stays usable. */
    CUdeviceptr dbuf;
    CU(cu.mem_alloc(&dbuf, COUNT * sizeof(float)));
    ncclResult_t r =
        ncclAllReduce((void *)(uintptr_t)dbuf, (void *)(uintptr_t)dbuf, COUNT, ncclFloat, ncclSum, comm, stream);
    if (r != ncclInvalidUsage || !strstr(ncclGetLastError(NULL), "device memory")) {
        fprintf(stderr, "rank %d: device buffer gave %s: %s\n", rank, ncclGetErrorString(r), ncclGetLastError(NULL));
        return 1;
    }
    for (int i = 0; i < COUNT; i++)
        host[i] = (float)(rank + i % 13);
    NC(ncclAllReduce(host, host, COUNT, ncclFloat, ncclSum, comm, NULL));
    if (check_sum(host, n, "host buffer after the refusal", rank))
        return 1;

    cu.mem_free(dbuf);
    cu.mem_free(dscalar);
    cu.mem_free(managed);
    free(host);
    NC(ncclCommDestroy(comm));
    return 0;
}

int main(void)
{
    /* Probe in a child: CUDA must not be initialised in a process that forks. */
    fflush(NULL);
    pid_t probe = fork();
    if (probe == 0) {
        const char *why = load_driver();
        if (why) {
            printf("skipping: %s\n", why);
            _exit(77);
        }
        _exit(0);
    }
    int status;
    waitpid(probe, &status, 0);
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
        return WIFEXITED(status) && WEXITSTATUS(status) == 77 ? 77 : 1;

    enum { N = 2 };
    ncclUniqueId id;
    if (ncclGetUniqueId(&id) != ncclSuccess) {
        fprintf(stderr, "ncclGetUniqueId: %s\n", ncclGetLastError(NULL));
        return 1;
    }
    pid_t pids[N];
    for (int r = 0; r < N; r++) {
        fflush(NULL);
        if ((pids[r] = fork()) == 0)
            _exit(rank_main(r, N, id));
    }
    int failed = 0;
    for (int r = 0; r < N; r++) {
        waitpid(pids[r], &status, 0);
        failed |= !WIFEXITED(status) || WEXITSTATUS(status) != 0;
    }
    puts(failed ? "FAILED" : "ok");
    return failed;
}
