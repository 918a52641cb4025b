/* Device buffers, CUDA build: NCCL's stream semantics on top of braid.
 *
 * Every call on device memory goes to braid's own device path like any
 * braid call with a stream and a work handle (hmem.h, docs/CUDA.md):
 *
 *   - all-reduce and broadcast outside groups (nccl_dev_engine.c): the
 *     device-collective kernels where the group has them, else the device
 *     ring over device links, else staging;
 *   - the other collectives, PreMulSum and groups (nccl__exec_start with
 *     each op's stream): staged through pinned host memory in pieces whose
 *     copies overlap the network.
 *
 * The call returns once queued; each stream it names is held until the
 * results are in place; the work handle is kept (nccl_inflight.c) for
 * ncclCommGetAsyncError and ncclCommFinalize/Destroy. braid's executor
 * runs the communicator's calls in issue order, host calls included, so
 * nothing here waits for earlier device calls. On one rank a collective's
 * result is its input: one cudaMemcpyAsync on the caller's stream.
 *
 * A call that fails after it returned leaves its streams released (the
 * buffers are then undefined) and its code in ncclCommGetAsyncError, as
 * NCCL reports errors of work that ran after its call returned. CUDA
 * runtime: braid's (linked statically into libnccl.so.2 with the rest of
 * braid); the runtime shares the driver's primary context with the
 * program's own runtime. */
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cuda_runtime_api.h>

#include "braid_cuda.h"
#include "device_coll_group.h"
#include "hmem.h"
#include "nccl_internal.h"

ncclResult_t nccl__dev_check(const void *p, const char *what, const char *call)
{
    (void)p;
    (void)what;
    (void)call;
    return ncclSuccess; /* every kind of memory has a path here */
}

static ncclResult_t cuda_fail(cudaError_t err, const char *what, const char *call)
{
    (void)cudaGetLastError();
    return nccl__fail(err == cudaErrorMemoryAllocation ? ncclSystemError : ncclUnhandledCudaError,
                      "%s: %s failed: %s", call, what, cudaGetErrorString(err));
}

/* The device of the batch's first device buffer (as its call classified it). */
static int batch_device(const nccl_op *ops, int n)
{
    for (int i = 0; i < n; i++) {
        if (ops[i].send_mem.device_mem)
            return ops[i].send_mem.device;
        if (ops[i].recv_mem.device_mem)
            return ops[i].recv_mem.device;
    }
    return -1;
}

/* Whether every op of the batch, on one rank, leaves its input as its
 * result: the collectives without a pre-multiplied sum (AVG divides by 1). */
static int one_rank_copies(ncclComm_t comm, const nccl_op *ops, int n)
{
    if (comm->nranks != 1)
        return 0;
    for (int i = 0; i < n; i++)
        if (ops[i].kind == BRAID_COLL_SEND || ops[i].kind == BRAID_COLL_RECV || ops[i].pm.used)
            return 0;
    return 1;
}

/* One rank: each op is a copy on its own stream, queued now; in place,
 * nothing. Earlier device jobs of the communicator hold their streams, so
 * a copy on the same stream still runs after them. */
static ncclResult_t one_rank_submit(ncclComm_t comm, const nccl_op *ops, int n, const char *call)
{
    for (int i = 0; i < n; i++) {
        size_t bytes = nccl__op_recv_bytes(&ops[i], 0, 1);
        if (bytes == 0 || !ops[i].recv || (const void *)ops[i].recv == ops[i].send)
            continue;
        cudaError_t err = cudaMemcpyAsync(ops[i].recv, ops[i].send, bytes, cudaMemcpyDefault, ops[i].stream);
        if (err != cudaSuccess)
            return cuda_fail(err, "cudaMemcpyAsync (one rank)", call);
    }
    (void)comm;
    return ncclSuccess;
}

ncclResult_t nccl__dev_root_copy(const nccl_op *op)
{
    cudaError_t err =
        cudaMemcpyAsync(op->recv, op->send, op->count * braid_dtype_size(op->dtype), cudaMemcpyDefault, op->stream);
    return err == cudaSuccess ? ncclSuccess : cuda_fail(err, "cudaMemcpyAsync (broadcast root's input)", op->call);
}

ncclResult_t nccl__dev_submit(ncclComm_t comm, nccl_op *ops, int n)
{
    const char *call = n == 1 ? ops[0].call : "ncclGroupEnd";
    int device = batch_device(ops, n);
    if (device < 0)
        return nccl__fail(ncclInternalError, "%s: no device buffer in a device batch", call);
    /* braid runs device calls on the calling thread's device, so the
     * thread is on the buffers' for the length of the call, as NCCL's
     * enqueue is on the communicator's. */
    int cur = -1;
    cudaError_t err = cudaGetDevice(&cur);
    if (err == cudaSuccess && cur != device)
        err = cudaSetDevice(device);
    if (err != cudaSuccess)
        return cuda_fail(err, "cudaSetDevice", call);
    ncclResult_t r;
    if (nccl__engine_takes(ops, n)) {
        r = nccl__engine_submit(comm, &ops[0]);
    } else if (one_rank_copies(comm, ops, n)) {
        r = one_rank_submit(comm, ops, n, call);
    } else {
        braid_work *w = NULL;
        r = nccl__exec_start(comm, ops, n, &w);
        if (r == ncclSuccess)
            r = nccl__inflight_add(comm, w, call);
    }
    if (cur >= 0 && cur != device)
        (void)cudaSetDevice(cur);
    return r;
}

void nccl__dev_attach(ncclComm_t comm)
{
    int dev = comm->cuda_dev;
    if (dev < 0)
        return; /* no context at creation: a host-only program stays CUDA-free; braid decides lazily */
    int n = braid__cuda_device_count(); /* asks the driver; makes no context */
    if (n <= 0)
        return;
    /* ncclCommInitAll's default list names devices 0..ndev-1; with fewer
     * GPUs its communicators share them, as nccl-tests' -g N on one GPU. */
    if (cudaSetDevice(dev % n) != cudaSuccess) { /* makes the primary context (CUDA 12 on) */
        (void)cudaGetLastError();
        return;
    }
}

void nccl__dev_finish_kernels(ncclComm_t comm)
{
    if (comm->pg)
        braid__devcoll_flush(comm->pg);
    nccl__dev_poll_kernels(comm);
}

void nccl__dev_poll_kernels(ncclComm_t comm)
{
    char text[256];
    if (!comm->pg || atomic_load(&comm->async_error) != ncclSuccess ||
        !braid__devcoll_fault(comm->pg, text, sizeof(text)))
        return;
    pthread_mutex_lock(&comm->mu);
    int first = atomic_load(&comm->async_error) == ncclSuccess;
    if (first) {
        snprintf(comm->async_text, sizeof(comm->async_text), "%s", text);
        atomic_store(&comm->async_error, ncclRemoteError);
    }
    pthread_mutex_unlock(&comm->mu);
}

/* ---- ncclMemAlloc / ncclMemFree ----------------------------------------- */

/* Device memory on the calling thread's current device, as NCCL's; a
 * process without a usable CUDA device gets page-aligned host memory, so
 * that CPU-only programs written for NCCL keep working (NCCL itself would
 * fail there). */
NCCL_API ncclResult_t ncclMemAlloc(void **ptr, size_t size)
{
    if (!ptr)
        return nccl__fail(ncclInvalidArgument, "ncclMemAlloc: ptr is NULL");
    void *p = NULL;
    if (braid__cuda_available()) {
        cudaError_t err = cudaMalloc(&p, size ? size : 1);
        if (err != cudaSuccess) {
            (void)cudaGetLastError();
            return nccl__fail(err == cudaErrorMemoryAllocation ? ncclSystemError : ncclUnhandledCudaError,
                              "ncclMemAlloc: cudaMalloc(%zu) failed: %s", size, cudaGetErrorString(err));
        }
        *ptr = p;
        return ncclSuccess;
    }
    if (posix_memalign(&p, 4096, size ? size : 1) != 0)
        return nccl__fail(ncclSystemError, "ncclMemAlloc: cannot allocate %zu bytes of host memory", size);
    *ptr = p;
    return ncclSuccess;
}

NCCL_API ncclResult_t ncclMemFree(void *ptr)
{
    if (!ptr)
        return ncclSuccess;
    if (braid__mem_is_device(ptr)) {
        cudaError_t err = cudaFree(ptr);
        if (err != cudaSuccess) {
            (void)cudaGetLastError();
            return nccl__fail(ncclUnhandledCudaError, "ncclMemFree: cudaFree(%p) failed: %s", ptr,
                              cudaGetErrorString(err));
        }
        return ncclSuccess;
    }
    free(ptr);
    return ncclSuccess;
}
