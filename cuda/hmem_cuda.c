/* Device buffers in every call and group (src/calls/hmem.h), CUDA build:
 * submission and the job. The design and what blocks is in docs/CUDA.md;
 * in short:
 *
 *  - The entry point records an event `ready` on the caller's stream (a
 *    group's end, on each stream its calls named), so the job sees exactly
 *    the work the caller queued before the call.
 *  - The job runs on the group's executor, in issue order with every other
 *    collective. It waits for `ready` on braid's streams (non-blocking, so
 *    a blocked legacy default stream cannot hold them up), then stages its
 *    ops in pieces through the pinned pool (hmem_stage.c).
 *  - work == NULL: the call returns once the result is in device memory.
 *    work != NULL: the call returns at once; a gate on the caller's stream
 *    (cuda/cuda_gate.c: a one-thread kernel polling a mapped flag) holds
 *    that stream until the job has copied its result back (or failed, or
 *    was dropped unrun), so later kernels on the stream see the result
 *    without the caller waiting.
 *
 *  - All-reduces larger than one piece on device buffers (send and recv
 *    both device memory) do not stage whole pieces: they run the ring
 *    here (device ring, device_ring.c) with the reduction on the GPU. Chunks
 *    arrive in pinned slots, go up on h2d and are reduced by the fused
 *    kernel on a braid compute stream into recv; reduced chunks go down on
 *    d2h to be sent. Copies, kernels and transfers of different chunks
 *    overlap; the segmentation is the host ring's, so results are bit for
 *    bit those of a host call of the same size.
 *
 * Not a host function (cudaLaunchHostFunc): CUDA runs those of every
 * stream of the process on one callback thread, so a blocked one would
 * hold every other group's streams too (two ranks as threads of one
 * process deadlock). While a gate is held, the job makes no call that may
 * synchronize the device: kernels are loaded and the gate flags allocated
 * before the first gate (braid__cuda_gate_prepare), pinned buffers are
 * allocated by the submitting thread before the call's gates exist, and
 * freed only with the group (cudaHostAlloc and cudaFreeHost wait for busy
 * blocking streams). */
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cuda_runtime_api.h>

#include "pg_algo.h"
#include "braid_cuda.h"
#include "hmem.h"
#include "hmem_cuda.h"
#include "device_coll_group.h"
#include "log.h"
#include "status.h"
#include "transports/registry.h"

/* Per-job state, freed by braid__hmem_coll_release. */
struct braid_hmem_job {
    atomic_int released;      /* braid__hmem_coll_release ran */
    int device;
    int dring;                /* may run as the device ring (use_device_ring) */
    int nstreams;             /* the callers' distinct streams */
    cudaEvent_t *ready;       /* one per stream, recorded at submission */
    braid_cuda_gate *gates;   /* one per stream, armed when work != NULL */
    struct braid_hmem *owner; /* on owner->jobs while not released (under braid__hmem_mu) */
    struct braid_hmem_job *next;
};

/* Guards every group's staging-state creation and job list. */
pthread_mutex_t braid__hmem_mu = PTHREAD_MUTEX_INITIALIZER;

/* The last error's text without its status name, copied out of the
 * buffer the next braid__error writes: the cause inside a wider message. */
const char *braid__hmem_cause(void)
{
    static _Thread_local char why[256];
    const char *e = braid_last_error(), *colon = strstr(e, ": ");
    snprintf(why, sizeof(why), "%s", colon ? colon + 2 : e);
    return why;
}

braid_mem braid__mem_of(const void *p)
{
    int device = -1;
    if (braid__cuda_ptr_kind(p, &device) == BRAID_CUDA_PTR_HOST)
        return (braid_mem){0, 0};
    return (braid_mem){1, device};
}

/* ---- the job and its gate ----------------------------------------------- */

/* Lets the callers' streams go on (idempotent, no CUDA call). */
static void gate_open(struct braid_hmem_job *job)
{
    for (int i = 0; i < job->nstreams; i++)
        braid__cuda_gate_open(&job->gates[i]);
}

void braid__hmem_coll_done(braid_coll *coll)
{
    if (coll->hmem)
        gate_open(coll->hmem);
}

void braid__hmem_jobs_orphan(struct braid_hmem *h)
{
    pthread_mutex_lock(&braid__hmem_mu);
    for (struct braid_hmem_job *j = h->jobs; j; j = j->next) {
        gate_open(j);
        j->owner = NULL;
    }
    h->jobs = NULL;
    pthread_mutex_unlock(&braid__hmem_mu);
}

void braid__hmem_coll_release(braid_coll *coll)
{
    struct braid_hmem_job *job = coll->hmem;
    if (!job)
        return;
    coll->hmem = NULL;
    if (atomic_exchange(&job->released, 1))
        return;
    pthread_mutex_lock(&braid__hmem_mu);
    if (job->owner) {
        for (struct braid_hmem_job **p = &job->owner->jobs; *p; p = &(*p)->next)
            if (*p == job) {
                *p = job->next;
                break;
            }
        job->owner = NULL;
    }
    pthread_mutex_unlock(&braid__hmem_mu);
    /* A job dropped before it ran (group destroyed) still lets the caller's
     * stream go on: its buffers are left as they were. */
    gate_open(job);
    for (int i = 0; i < job->nstreams; i++) {
        cudaError_t err = job->ready[i] ? cudaEventDestroy(job->ready[i]) : cudaSuccess;
        if (err != cudaSuccess) {
            (void)cudaGetLastError();
            BRAID_WARN("cuda staging: cudaEventDestroy failed: %s", cudaGetErrorString(err));
        }
    }
    free(job->ready);
    free(job->gates);
    free(job);
}

/* ---- submission (caller's thread) ------------------------------------------ */

/* From the call record (classified at the entry): 1 when send or recv is
 * device (or managed) memory, with *device its device and *both set when
 * both are; 0 for host buffers; -1 when they are on different devices. */
static int buffer_device(const braid_coll *c, int *device, int *both)
{
    const braid_mem *s = &c->send_mem, *r = &c->recv_mem;
    *both = s->device_mem && r->device_mem;
    if (!s->device_mem && !r->device_mem)
        return 0;
    *device = s->device_mem ? s->device : r->device;
    if (*both && s->device != r->device)
        return -1; /* send and recv on different devices */
    return 1;
}

/* Whether a device call may run as the device ring rather than as staged
 * pieces: all-reduces above one piece (so that no rank can take it for a
 * one-piece call, which may mix host and device ranks) with both buffers
 * readable by kernels (a pre-multiplied sum stages: the ring's kernels do
 * not multiply). The job runs it only where the tuner picks the ring
 * for the whole call (braid__allreduce_algo, on the executor, as for a
 * host call): then a host rank in the same call runs the same ring. */
static int use_device_ring(const braid_coll *c, int both)
{
    size_t bytes = c->count * braid_dtype_size(c->dtype);
    return both && c->kind == BRAID_COLL_ALLREDUCE && !c->premul && bytes > BRAID_HMEM_PIECE_BYTES;
}

/* A group of one: the result is the input, so the call is one copy on the
 * caller's stream (none in place). MULSUM still multiplies: not here. */
static int one_rank_copy(const braid_pg *pg, const braid_coll *coll)
{
    return pg->size == 1 && !coll->refused && coll->op != BRAID_MULSUM &&
           (coll->kind == BRAID_COLL_ALLREDUCE || coll->kind == BRAID_COLL_BROADCAST);
}

static braid_status one_rank_run(braid_pg *pg, const braid_coll *coll, void *stream, braid_work **work)
{
    BRAID_CHECK(braid__pg_check_usable(pg, braid__kind(coll->kind)->name));
    if (coll->recv != coll->send)
        BRAID_CHECK(braid__cuda_memcpy_async(coll->recv, coll->send, coll->count * braid_dtype_size(coll->dtype),
                                             stream));
    if (work)
        return braid__work_completed(pg, work);
    return braid__cuda_stream_sync(stream);
}

static braid_status refuse_capture(braid_pg *pg, cudaStream_t stream, const char *op)
{
    enum cudaStreamCaptureStatus cap = cudaStreamCaptureStatusNone;
    CUDA_CALL(cudaStreamIsCapturing(stream, &cap), "cudaStreamIsCapturing", pg->rank);
    if (cap != cudaStreamCaptureStatusNone)
        return braid__error(BRAID_ERR_UNSUPPORTED,
                            "rank %d: %s on a stream under CUDA graph capture is not supported (only an all-reduce or "
                            "a broadcast outside a group, where device collectives are on, is captured)",
                            pg->rank, op);
    return BRAID_OK;
}

/* Order the job after the work queued so far on each caller stream (an
 * event each) and, for work != NULL, hold each stream until the job is
 * done (a gate each). On the streams' device. */
static braid_status job_order(braid_pg *pg, struct braid_hmem_job *job, const cudaStream_t *streams, int work,
                              const char *op)
{
    for (int i = 0; i < job->nstreams; i++) {
        cudaError_t err = cudaEventCreateWithFlags(&job->ready[i], cudaEventDisableTiming);
        if (err == cudaSuccess)
            err = cudaEventRecord(job->ready[i], streams[i]);
        if (err != cudaSuccess) {
            (void)cudaGetLastError();
            return braid__error(BRAID_ERR_CUDA, "rank %d: %s: cannot order the call on the caller's stream: %s",
                                pg->rank, op, cudaGetErrorString(err));
        }
    }
    for (int i = 0; work && i < job->nstreams; i++) {
        braid_status gst = braid__cuda_gate_arm(&job->gates[i], streams[i]);
        if (gst != BRAID_OK)
            return braid__error(gst, "rank %d: %s: cannot hold the caller's stream: %s", pg->rank, op, braid__hmem_cause());
    }
    return BRAID_OK;
}

/* Queue c (owned: released on failure) as a staging job on device, after
 * the work on streams[0..ns). */
static braid_status queue_job(braid_pg *pg, braid_coll *c, const cudaStream_t *streams, int ns, int device, int dring,
                              braid_work **work)
{
    const char *op = braid__coll_job_name(c);
    size_t need = 0;
    braid_status st = BRAID_OK;
    for (int i = 0; i < ns && st == BRAID_OK; i++)
        st = refuse_capture(pg, streams[i], op);
    if (st == BRAID_OK)
        st = braid__hmem_state_get(pg, device, op);
    if (st == BRAID_OK)
        st = braid__hmem_stage_need(pg, c, &need);
    if (st == BRAID_OK)
        st = braid__hmem_pool_reserve(pg, need);
    struct braid_hmem_job *job = st == BRAID_OK ? calloc(1, sizeof(*job)) : NULL;
    if (st == BRAID_OK && job) {
        job->ready = calloc((size_t)ns, sizeof(*job->ready));
        job->gates = calloc((size_t)ns, sizeof(*job->gates));
    }
    if (st == BRAID_OK && (!job || !job->ready || !job->gates)) {
        if (job) {
            free(job->ready);
            free(job->gates);
            free(job);
        }
        st = braid__error(BRAID_ERR_NO_MEMORY, "rank %d: out of memory for a cuda staging job", pg->rank);
    }
    if (st != BRAID_OK) {
        braid__coll_release(c);
        return st;
    }
    atomic_init(&job->released, 0);
    job->device = device;
    job->dring = dring;
    job->nstreams = ns;
    c->hmem = job;
    /* A job that fails to queue still opens the gates armed (the release). */
    st = job_order(pg, job, streams, work != NULL, op);
    if (st != BRAID_OK) {
        braid__coll_release(c);
        return st;
    }
    pthread_mutex_lock(&braid__hmem_mu);
    job->owner = pg->hmem;
    job->next = pg->hmem->jobs;
    pg->hmem->jobs = job;
    pthread_mutex_unlock(&braid__hmem_mu);
    return braid__work_submit(pg, c, work); /* owns the job from here */
}

/* A group's job (braid_group_end; owned): staged where an op has device
 * buffers, after every stream its ops named, else the CPU path. */
static braid_status group_submit(braid_pg *pg, const braid_coll *group, braid_work **work)
{
    braid_coll c = *group;
    int device = -1, ns = 0;
    cudaStream_t *streams = calloc((size_t)(c.nops ? c.nops : 1), sizeof(*streams));
    braid_status st = streams ? BRAID_OK
                              : braid__error(BRAID_ERR_NO_MEMORY, "rank %d: out of memory for a group's streams", pg->rank);
    for (int i = 0; i < c.nops && st == BRAID_OK; i++) {
        const braid_coll *op = &c.ops[i];
        int d = -1, both = 0, dev = op->count > 0 ? buffer_device(op, &d, &both) : 0;
        if (dev < 0 || (dev && device >= 0 && d != device))
            st = braid__error(BRAID_ERR_INVALID_ARG, "rank %d: %s: a group's buffers are on more than one CUDA device",
                              pg->rank, braid__coll_job_name(&c));
        if (st != BRAID_OK || !dev)
            continue;
        device = d;
        int seen = 0;
        for (int k = 0; k < ns; k++)
            seen |= streams[k] == (cudaStream_t)op->stream;
        if (!seen)
            streams[ns++] = (cudaStream_t)op->stream;
    }
    if (st != BRAID_OK)
        braid__coll_release(&c);
    else if (device < 0)
        st = braid__work_submit(pg, &c, work); /* host buffers only: the CPU path */
    else {
        int cur = -1;
        if (cudaGetDevice(&cur) != cudaSuccess || (cur != device && cudaSetDevice(device) != cudaSuccess)) {
            (void)cudaGetLastError();
            braid__coll_release(&c);
            st = braid__error(BRAID_ERR_CUDA, "rank %d: %s: cannot make device %d current", pg->rank,
                              braid__coll_job_name(&c), device);
        } else {
            st = queue_job(pg, &c, streams, ns, device, 0, work);
            if (cur >= 0 && cur != device)
                (void)cudaSetDevice(cur);
        }
    }
    free(streams);
    return st;
}

/* Host buffers with a stream: the stream's earlier work (say a copy into
 * these buffers) must be finished before they are read. */
static braid_status host_stream_wait(braid_pg *pg, const char *op, void *cuda_stream)
{
    if (!braid__cuda_available())
        return braid__error(BRAID_ERR_UNSUPPORTED, "rank %d: %s: a CUDA stream was given but %s", pg->rank, op,
                            braid__cuda_unavailable_reason());
    return braid__cuda_stream_sync(cuda_stream);
}

/* Device buffers must be on the calling thread's current device. */
static braid_status on_current_device(braid_pg *pg, const char *op, int device)
{
    int cur = -1;
    CUDA_CALL(cudaGetDevice(&cur), "cudaGetDevice", pg->rank);
    if (cur != device)
        return braid__error(BRAID_ERR_INVALID_ARG,
                            "rank %d: %s: buffers are on device %d but the calling thread's current device is %d "
                            "(cudaSetDevice first)",
                            pg->rank, op, device, cur);
    return BRAID_OK;
}

/* A call inside the calling thread's open group is recorded with its
 * stream; braid_group_end queues the group (group_submit). */
static braid_status group_record(braid_pg *pg, const braid_coll *coll, int dev, int device, void *cuda_stream,
                                 braid_work **work)
{
    const char *op = braid__kind(coll->kind)->name;
    if (!dev && cuda_stream && coll->count > 0) /* nothing to read: no wait */
        BRAID_CHECK(host_stream_wait(pg, op, cuda_stream));
    if (dev)
        BRAID_CHECK(on_current_device(pg, op, device));
    braid_coll c = *coll;
    c.stream = dev ? cuda_stream : NULL;
    return braid__work_submit(pg, &c, work); /* recorded */
}

braid_status braid__hmem_submit(braid_pg *pg, const braid_coll *coll, void *cuda_stream, braid_work **work)
{
    if (coll->kind == BRAID_COLL_GROUP)
        return group_submit(pg, coll, work);
    const char *op = braid__kind(coll->kind)->name;
    int device = -1, both = 0;
    int dev = coll->count > 0 ? buffer_device(coll, &device, &both) : 0;
    if (dev < 0)
        return braid__error(BRAID_ERR_INVALID_ARG, "rank %d: %s: send and recv are on different CUDA devices",
                            pg->rank, op);
    if (braid__group_open_here(pg))
        return group_record(pg, coll, dev, device, cuda_stream, work);
    if (!dev) {
        if (cuda_stream) /* the CPU path, untouched, without a stream */
            BRAID_CHECK(host_stream_wait(pg, op, cuda_stream));
        return braid__work_submit(pg, coll, work);
    }
    BRAID_CHECK(on_current_device(pg, op, device));
    if (one_rank_copy(pg, coll))
        return one_rank_run(pg, coll, cuda_stream, work);
    if (!coll->refused && (coll->kind == BRAID_COLL_ALLREDUCE || coll->kind == BRAID_COLL_BROADCAST))
        BRAID_CHECK(braid__devcoll_agree(pg, device)); /* the group's first device call decides */
    if (braid__devcoll_takes(pg, coll, device))
        return braid__devcoll_run(pg, coll, cuda_stream, work); /* graph capture included */
    braid_coll c = *coll;
    cudaStream_t stream = (cudaStream_t)cuda_stream;
    return queue_job(pg, &c, &stream, 1, device, use_device_ring(coll, both), work);
}

/* ---- the job (executor) ----------------------------------------------------- */

braid_status braid__hmem_coll_run(braid_pg *pg, braid_coll *coll)
{
    struct braid_hmem_job *job = coll->hmem;
    braid_status st = braid__pg_check_usable(pg, braid__coll_job_name(coll));
    if (st != BRAID_OK)
        return st; /* the gates open once the handle is done (braid__hmem_coll_done) or the job released */
    if (!job || !pg->hmem)
        st = braid__error(BRAID_ERR_INTERNAL, "rank %d: cuda staging job without its state", pg->rank);
    if (st == BRAID_OK) {
        cudaError_t err = cudaSetDevice(job->device);
        if (err != cudaSuccess) {
            (void)cudaGetLastError();
            st = braid__error(BRAID_ERR_CUDA, "rank %d: cudaSetDevice(%d) failed: %s", pg->rank, job->device,
                              cudaGetErrorString(err));
        }
    }
    /* Every kind of job starts after the work queued on the callers'
     * streams before the call. */
    cudaStream_t waiters[3] = {pg->hmem ? pg->hmem->d2h : NULL, pg->hmem ? pg->hmem->h2d : NULL,
                               pg->hmem ? pg->hmem->comp : NULL};
    for (int s = 0; st == BRAID_OK && s < job->nstreams; s++)
        for (int i = 0; i < 3 && st == BRAID_OK; i++) {
            cudaError_t err = cudaStreamWaitEvent(waiters[i], job->ready[s], 0);
            if (err != cudaSuccess) {
                (void)cudaGetLastError();
                st = braid__error(BRAID_ERR_CUDA, "rank %d: cuda staging: cudaStreamWaitEvent failed: %s", pg->rank,
                                  cudaGetErrorString(err));
            }
        }
    if (st == BRAID_OK && job->dring && coll->kind == BRAID_COLL_ALLREDUCE &&
        braid__pg_allreduce_algo(pg, coll->count, coll->dtype) == BRAID_ALGO_RING) {
        st = braid__device_ring(pg, coll);
    } else if (st == BRAID_OK) {
        pthread_mutex_lock(&braid__hmem_mu); /* the pool as it is now: a later growth retires it, never frees it */
        void *pool[2] = {pg->hmem->pool[0], pg->hmem->pool[1]};
        size_t pool_bytes = pg->hmem->pool_bytes;
        pthread_mutex_unlock(&braid__hmem_mu);
        st = braid__hmem_stage(pg, coll, pool, pool_bytes);
    }
    if (st != BRAID_OK && pg->hmem) {
        /* Leave no copy in flight into buffers the next job reuses. */
        (void)cudaStreamSynchronize(pg->hmem->d2h);
        (void)cudaStreamSynchronize(pg->hmem->h2d);
        (void)cudaStreamSynchronize(pg->hmem->comp);
        (void)cudaGetLastError();
        braid__pg_fail(pg, st); /* peers blocked on us fail now, not at their timeout */
    }
    return st; /* the gates open once the handle is done (braid__hmem_coll_done) or the job released */
}
