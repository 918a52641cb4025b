/* Device buffers, CUDA build: NCCL's stream semantics on top of braid.
 *
 * All-reduce and broadcast outside groups, the calls a trainer makes, go
 * to braid's own device path like any braid call with a stream and a work
 * handle (braid__hmem_submit, docs/CUDA.md): the device-collective kernels
 * where the group has them, else the device ring over device links, else
 * pinned staging in pieces whose copies overlap the network. The call
 * returns once queued; the caller's stream is held until the result is in
 * place; the work handle is kept (nccl_inflight.c) for
 * ncclCommGetAsyncError and ncclCommFinalize/Destroy.
 *
 * The other calls on device memory (the collectives braid's device path
 * has no form for, PreMulSum, groups) become a job on the communicator's
 * device worker, a thread that runs the jobs in issue order. At
 * submission, on each stream the batch names:
 *
 *   - an event `ready` is recorded: the job sees exactly the work queued
 *     on the stream before the call;
 *   - a gate is queued (braid__cuda_gate_arm, cuda/cuda_gate.c: a
 *     one-thread kernel polling a mapped flag) that holds the stream until
 *     the job is done with the buffers. Not a host function: CUDA runs
 *     those of every stream of the process on one callback thread, so one
 *     blocked gate would hold every other communicator's streams.
 *
 * The worker makes its own non-blocking stream wait for every `ready`,
 * copies the device inputs down into host memory, runs the batch there
 * with braid's host collectives (nccl__exec_start), copies the outputs
 * back up, waits for those copies, and opens the gate. Streams under graph
 * capture are refused there (the gate would not hold on replay).
 *
 * On one rank a collective's result is its input: one cudaMemcpyAsync on
 * the caller's stream (nothing in place), no job.
 *
 * Host calls, and engine calls, on the same communicator wait for the
 * worker to be idle first (nccl__dev_drain), so braid sees every call in
 * issue order.
 *
 * A job that fails still opens its gate (the buffers are then undefined)
 * and leaves its code in ncclCommGetAsyncError, as NCCL reports errors of
 * work that ran after its call returned. CUDA runtime: braid's (linked
 * statically into libnccl.so.2 with the rest of braid); the runtime
 * shares the driver's primary context with the program's own runtime. */
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cuda_runtime_api.h>

#include "braid_cuda.h"
#include "device_coll_group.h"
#include "hmem.h"
#include "nccl_internal.h"

/* A batch on the worker's queue. */
typedef struct nccl_job {
    struct nccl_job *next;
    nccl_op *ops;
    int n;
    int nstreams;
    cudaStream_t *streams; /* the distinct streams of ops */
    cudaEvent_t *ready;    /* one per stream, recorded at submission */
    braid_cuda_gate *gates; /* one per stream, opened when the job is done */
} nccl_job;

struct nccl_worker {
    ncclComm_t comm;
    int device;
    pthread_t thread;
    pthread_mutex_t mu;
    pthread_cond_t cv; /* a job queued, stop, or the queue ran empty */
    nccl_job *head, *tail;
    int busy; /* a job is running */
    int stop;
    cudaStream_t stream; /* the worker's own, non-blocking */
    char error[512];     /* text of the first failed job */
};

ncclResult_t nccl__dev_check(const void *p, const char *what, const char *call)
{
    (void)p;
    (void)what;
    (void)call;
    return ncclSuccess; /* every kind of memory has a path here */
}

/* ---- the job's end ---------------------------------------------------------- */

static void job_free(nccl_job *job)
{
    free(job->ops);
    free(job->streams);
    free(job->ready);
    free(job->gates);
    free(job);
}

/* Events released, streams let go (the gates need no CUDA call), job freed. */
static void job_done(nccl_job *job)
{
    for (int i = 0; i < job->nstreams; i++)
        if (job->ready[i])
            (void)cudaEventDestroy(job->ready[i]);
    (void)cudaGetLastError();
    for (int i = 0; i < job->nstreams; i++)
        braid__cuda_gate_open(&job->gates[i]);
    job_free(job);
}

/* ---- the worker ------------------------------------------------------------ */

/* Keep the first failure (the worker is its only writer: text first). */
static void worker_fail(nccl_worker *w, ncclResult_t r)
{
    if (atomic_load(&w->comm->async_error) != ncclSuccess)
        return;
    snprintf(w->error, sizeof(w->error), "%s", ncclGetLastError(NULL));
    atomic_store(&w->comm->async_error, (int)r);
}

static ncclResult_t cuda_fail(cudaError_t err, const char *what, const char *call)
{
    (void)cudaGetLastError();
    return nccl__fail(err == cudaErrorMemoryAllocation ? ncclSystemError : ncclUnhandledCudaError,
                      "%s: device worker: %s failed: %s", call, what, cudaGetErrorString(err));
}

/* A stretch of device memory staged in host memory while a job runs.
 * The ops' device ranges are merged where they overlap, so ops of one
 * group that share memory (in place, or one reading what an earlier one
 * wrote) share the host copy too and see each other's results, as they
 * would on the device. */
typedef struct {
    const char *lo, *hi; /* device range [lo, hi) */
    char *host;
    int input; /* some op reads from it: copy it down */
} region;

static int region_order(const void *a, const void *b)
{
    const region *x = a, *y = b;
    return x->lo < y->lo ? -1 : x->lo > y->lo;
}

static char *host_of(region *rs, int nr, const void *p)
{
    for (int i = 0; i < nr; i++)
        if ((const char *)p >= rs[i].lo && (const char *)p < rs[i].hi)
            return rs[i].host + ((const char *)p - rs[i].lo);
    return NULL;
}

static ncclResult_t run_job(nccl_worker *w, nccl_job *job)
{
    ncclComm_t comm = w->comm;
    const char *call = job->n == 1 ? job->ops[0].call : "ncclGroupEnd";
    if (!w->stream)
        return nccl__fail(ncclUnhandledCudaError, "%s: the device worker has no stream: %s", call, w->error);
    cudaError_t err = cudaSuccess;
    for (int i = 0; i < job->nstreams && err == cudaSuccess; i++)
        err = cudaStreamWaitEvent(w->stream, job->ready[i], 0);
    if (err != cudaSuccess)
        return cuda_fail(err, "cudaStreamWaitEvent", call);

    nccl_op *host = calloc((size_t)job->n, sizeof(*host));
    region *rs = calloc((size_t)job->n * 2, sizeof(*rs));
    if (!host || !rs) {
        free(host);
        free(rs);
        return nccl__fail(ncclSystemError, "%s: out of memory", call);
    }
    int nr = 0;
    for (int i = 0; i < job->n; i++) {
        const nccl_op *op = &job->ops[i];
        size_t sb = nccl__op_send_bytes(op, comm->rank, comm->nranks);
        size_t rb = nccl__op_recv_bytes(op, comm->rank, comm->nranks);
        if (sb && op->send_mem.device_mem)
            rs[nr++] = (region){(const char *)op->send, (const char *)op->send + sb, NULL, 1};
        if (rb && op->recv_mem.device_mem)
            rs[nr++] = (region){(const char *)op->recv, (const char *)op->recv + rb, NULL, 0};
    }
    qsort(rs, (size_t)nr, sizeof(*rs), region_order);
    int merged = 0;
    for (int i = 0; i < nr; i++) {
        if (merged && rs[i].lo < rs[merged - 1].hi) {
            region *m = &rs[merged - 1];
            m->hi = rs[i].hi > m->hi ? rs[i].hi : m->hi;
            m->input |= rs[i].input;
        } else {
            rs[merged++] = rs[i];
        }
    }
    nr = merged;

    /* Down: the ranges some op reads (output-only ranges are overwritten). */
    ncclResult_t r = ncclSuccess;
    for (int i = 0; i < nr && r == ncclSuccess; i++) {
        size_t len = (size_t)(rs[i].hi - rs[i].lo);
        if (!(rs[i].host = malloc(len)))
            r = nccl__fail(ncclSystemError, "%s: out of memory staging %zu bytes of device memory", call, len);
        else if (rs[i].input &&
                 (err = cudaMemcpyAsync(rs[i].host, rs[i].lo, len, cudaMemcpyDeviceToHost, w->stream)) != cudaSuccess)
            r = cuda_fail(err, "cudaMemcpyAsync (device to host)", call);
    }
    /* Whatever was queued must finish before the copies are read or freed. */
    err = cudaStreamSynchronize(w->stream);
    if (r == ncclSuccess && err != cudaSuccess)
        r = cuda_fail(err, "cudaStreamSynchronize", call);

    for (int i = 0; i < job->n; i++) {
        const nccl_op *op = &job->ops[i];
        host[i] = *op;
        host[i].stream = NULL; /* held by our gate: never wait for it here */
        host[i].device = 0;
        char *hs = op->send ? host_of(rs, nr, op->send) : NULL, *hr = op->recv ? host_of(rs, nr, op->recv) : NULL;
        if (hs && nccl__op_send_bytes(op, comm->rank, comm->nranks))
            host[i].send = hs;
        if (hr && nccl__op_recv_bytes(op, comm->rank, comm->nranks))
            host[i].recv = hr;
    }
    if (r == ncclSuccess)
        r = nccl__exec_start(comm, host, job->n, NULL);

    /* Up: every op's output range, from the shared copies. */
    for (int i = 0; i < job->n && r == ncclSuccess; i++) {
        const nccl_op *op = &job->ops[i];
        size_t rb = nccl__op_recv_bytes(op, comm->rank, comm->nranks);
        char *hr = rb && op->recv ? host_of(rs, nr, op->recv) : NULL;
        if (hr && (err = cudaMemcpyAsync(op->recv, hr, rb, cudaMemcpyHostToDevice, w->stream)) != cudaSuccess)
            r = cuda_fail(err, "cudaMemcpyAsync (host to device)", call);
    }
    err = cudaStreamSynchronize(w->stream);
    if (r == ncclSuccess && err != cudaSuccess)
        r = cuda_fail(err, "cudaStreamSynchronize", call);
    for (int i = 0; i < nr; i++)
        free(rs[i].host);
    free(rs);
    free(host);
    return r;
}

static void *worker_main(void *arg)
{
    nccl_worker *w = arg;
    cudaError_t err = cudaSetDevice(w->device);
    if (err == cudaSuccess)
        err = cudaStreamCreateWithFlags(&w->stream, cudaStreamNonBlocking);
    if (err != cudaSuccess) {
        w->stream = NULL;
        (void)cudaGetLastError();
        snprintf(w->error, sizeof(w->error), "cannot create a stream on device %d: %s", w->device,
                 cudaGetErrorString(err));
    }
    pthread_mutex_lock(&w->mu);
    for (;;) {
        while (!w->head && !w->stop)
            pthread_cond_wait(&w->cv, &w->mu);
        nccl_job *job = w->head;
        if (!job)
            break; /* stop, and the queue is empty */
        w->head = job->next;
        if (!w->head)
            w->tail = NULL;
        w->busy = 1;
        pthread_mutex_unlock(&w->mu);
        ncclResult_t r = run_job(w, job);
        if (r != ncclSuccess)
            worker_fail(w, r);
        job_done(job);
        pthread_mutex_lock(&w->mu);
        w->busy = 0;
        pthread_cond_broadcast(&w->cv);
    }
    pthread_mutex_unlock(&w->mu);
    if (w->stream)
        (void)cudaStreamDestroy(w->stream);
    (void)cudaGetLastError();
    return NULL;
}

/* comm's worker, started on first use; on `device` for its life. */
static ncclResult_t worker_get(ncclComm_t comm, int device, const char *call, nccl_worker **out)
{
    ncclResult_t r = ncclSuccess;
    pthread_mutex_lock(&comm->mu);
    nccl_worker *w = comm->worker;
    if (w && w->device != device) {
        r = nccl__fail(ncclInvalidUsage,
                       "%s: buffers on device %d, but this communicator's device calls run on device %d: use "
                       "one device per communicator, as NCCL does",
                       call, device, w->device);
    } else if (!w) {
        w = calloc(1, sizeof(*w));
        if (!w) {
            r = nccl__fail(ncclSystemError, "%s: out of memory", call);
        } else {
            w->comm = comm;
            w->device = device;
            pthread_mutex_init(&w->mu, NULL);
            pthread_cond_init(&w->cv, NULL);
            if (pthread_create(&w->thread, NULL, worker_main, w) != 0) {
                pthread_mutex_destroy(&w->mu);
                pthread_cond_destroy(&w->cv);
                free(w);
                w = NULL;
                r = nccl__fail(ncclSystemError, "%s: cannot start the device worker thread", call);
            } else {
                comm->worker = w;
            }
        }
    }
    pthread_mutex_unlock(&comm->mu);
    *out = w;
    return r;
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
        if (ops[i].kind == NCCL_OP_SEND || ops[i].kind == NCCL_OP_RECV || ops[i].pm.used)
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

/* The worker cannot run under graph capture: its gate would be baked into
 * the graph and pass at once on replay, and its copies would not be
 * captured. Say so, as CUDA would fail the capture otherwise. */
static ncclResult_t refuse_capture(const nccl_op *ops, int n, const char *call)
{
    for (int i = 0; i < n; i++) {
        enum cudaStreamCaptureStatus cap = cudaStreamCaptureStatusNone;
        cudaError_t err = cudaStreamIsCapturing(ops[i].stream, &cap);
        if (err != cudaSuccess)
            return cuda_fail(err, "cudaStreamIsCapturing", call);
        if (cap != cudaStreamCaptureStatusNone)
            return nccl__fail(ncclInvalidUsage,
                              "%s: %s on a stream under CUDA graph capture: braid captures only all-reduce and "
                              "broadcast outside groups, and only where device collectives are on (BRAID_DEVCOLL=1)",
                              call, ops[i].call);
    }
    return ncclSuccess;
}

ncclResult_t nccl__dev_submit(ncclComm_t comm, const nccl_op *ops, int n)
{
    const char *call = n == 1 ? ops[0].call : "ncclGroupEnd";
    int device = batch_device(ops, n);
    if (device < 0)
        return nccl__fail(ncclInternalError, "%s: no device buffer in a device batch", call);
    if (nccl__engine_takes(ops, n))
        return nccl__engine_submit(comm, &ops[0], device);
    if (one_rank_copies(comm, ops, n))
        return one_rank_submit(comm, ops, n, call);
    ncclResult_t r = refuse_capture(ops, n, call);
    if (r != ncclSuccess)
        return r;
    nccl_worker *w;
    r = worker_get(comm, device, call, &w);
    if (r != ncclSuccess)
        return r;

    nccl_job *job = calloc(1, sizeof(*job));
    if (!job)
        return nccl__fail(ncclSystemError, "%s: out of memory", call);
    job->ops = malloc((size_t)n * sizeof(*job->ops));
    job->streams = malloc((size_t)n * sizeof(*job->streams));
    job->ready = calloc((size_t)n, sizeof(*job->ready));
    job->gates = calloc((size_t)n, sizeof(*job->gates));
    if (!job->ops || !job->streams || !job->ready || !job->gates) {
        job_free(job);
        return nccl__fail(ncclSystemError, "%s: out of memory", call);
    }
    memcpy(job->ops, ops, (size_t)n * sizeof(*ops));
    job->n = n;
    for (int i = 0; i < n; i++) {
        int seen = 0;
        for (int k = 0; k < job->nstreams; k++)
            seen |= job->streams[k] == ops[i].stream;
        if (!seen)
            job->streams[job->nstreams++] = ops[i].stream;
    }

    /* Events and gates belong to the streams' device. */
    int cur = -1;
    cudaError_t err = cudaGetDevice(&cur);
    if (err == cudaSuccess && cur != device)
        err = cudaSetDevice(device);
    for (int i = 0; i < job->nstreams && err == cudaSuccess; i++) {
        err = cudaEventCreateWithFlags(&job->ready[i], cudaEventDisableTiming);
        if (err == cudaSuccess)
            err = cudaEventRecord(job->ready[i], job->streams[i]);
    }
    braid_status gst = BRAID_OK;
    for (int i = 0; i < job->nstreams && err == cudaSuccess && gst == BRAID_OK; i++)
        gst = braid__cuda_gate_arm(&job->gates[i], job->streams[i]);
    if (cur >= 0 && cur != device)
        (void)cudaSetDevice(cur);
    if (err != cudaSuccess || gst != BRAID_OK) {
        if (err != cudaSuccess)
            r = cuda_fail(err, "ordering the call on its stream", call);
        else
            r = nccl__fail(ncclUnhandledCudaError, "%s: cannot hold the caller's stream: %s", call,
                           braid_last_error());
        job_done(job); /* opens any gate already queued */
        return r;
    }

    pthread_mutex_lock(&w->mu);
    if (w->tail)
        w->tail->next = job;
    else
        w->head = job;
    w->tail = job;
    pthread_cond_broadcast(&w->cv);
    pthread_mutex_unlock(&w->mu);
    return ncclSuccess;
}

void nccl__dev_drain(ncclComm_t comm)
{
    pthread_mutex_lock(&comm->mu);
    nccl_worker *w = comm->worker;
    pthread_mutex_unlock(&comm->mu);
    if (!w)
        return;
    pthread_mutex_lock(&w->mu);
    while (w->head || w->busy)
        pthread_cond_wait(&w->cv, &w->mu);
    pthread_mutex_unlock(&w->mu);
    /* The worker's errors reach this thread's ncclGetLastError through
     * the call that reports them (ncclCommGetAsyncError, ncclCommFinalize). */
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

void nccl__dev_stop(ncclComm_t comm)
{
    pthread_mutex_lock(&comm->mu);
    nccl_worker *w = comm->worker;
    comm->worker = NULL;
    pthread_mutex_unlock(&comm->mu);
    if (!w)
        return;
    /* Jobs still queued run (after an abort they fail at once) so that
     * every gate opens before the communicator goes. */
    pthread_mutex_lock(&w->mu);
    w->stop = 1;
    pthread_cond_broadcast(&w->cv);
    pthread_mutex_unlock(&w->mu);
    pthread_join(w->thread, NULL);
    pthread_mutex_destroy(&w->mu);
    pthread_cond_destroy(&w->cv);
    free(w);
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

const char *nccl__dev_error(ncclComm_t comm)
{
    pthread_mutex_lock(&comm->mu);
    nccl_worker *w = comm->worker;
    const char *e = w && w->error[0] ? w->error : NULL;
    pthread_mutex_unlock(&comm->mu);
    return e;
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
