/* Device buffers in braid_allreduce / braid_broadcast (src/hmem.h), CUDA
 * build. The design and what blocks is in docs/CUDA.md; in short:
 *
 *  - The entry point records an event `ready` on the caller's stream, so
 *    the job sees exactly the work the caller queued before the call.
 *  - The job runs on the group's executor, in issue order with every other
 *    collective. It waits for `ready` on two braid streams (non-blocking,
 *    so a blocked legacy default stream cannot hold them up), copies piece
 *    k+1 down (d2h stream) and piece k-1 back (h2d stream) while the host
 *    algorithm runs on piece k in the other pinned buffer.
 *  - work == NULL: the call returns once the result is in device memory.
 *    work != NULL: the call returns at once; a host function queued on the
 *    caller's stream (cudaLaunchHostFunc) holds that stream until the job
 *    has copied its result back (or failed, or was dropped unrun), so later
 *    kernels on the stream see the result without the caller waiting.
 *
 * The host function only waits on a condition variable and never calls
 * CUDA (which host functions must not do); whatever CUDA teardown a job
 * needs is done on the job's side. Pinned buffers are allocated once per
 * group at their full size, never reallocated: cudaFreeHost may synchronize
 * the device, which would deadlock against a caller stream held by our own
 * host function. */
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include <cuda_runtime_api.h>

#include "algo/algo.h"
#include "braid_cuda.h"
#include "hmem.h"
#include "log.h"
#include "status.h"

/* Per-group staging state, made by the first device call. */
struct braid_hmem {
    int device;
    cudaStream_t d2h, h2d;
    cudaEvent_t down_done[2]; /* piece copied into pinned[b] */
    cudaEvent_t up_done[2];   /* pinned[b] copied back: the buffer is free */
    void *pinned[2];
    struct braid_hmem_job *jobs; /* submitted, not yet released (under init_mu) */
};

/* Per-job state shared by the job and the host function on the caller's
 * stream; whichever lets go last frees it. */
struct braid_hmem_job {
    atomic_int refs;
    atomic_int released;      /* braid__hmem_coll_release ran */
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int open;                 /* the caller's stream may go on */
    int device;
    cudaEvent_t ready;        /* recorded on the caller's stream at submission */
    struct braid_hmem *owner; /* on owner->jobs while not released (under init_mu) */
    struct braid_hmem_job *next;
};

/* Guards every group's staging-state creation and job list. */
static pthread_mutex_t init_mu = PTHREAD_MUTEX_INITIALIZER;

#define CUDA_CALL(call, what, rank)                                                            \
    do {                                                                                       \
        cudaError_t braid__ce = (call);                                                        \
        if (braid__ce != cudaSuccess) {                                                        \
            (void)cudaGetLastError();                                                          \
            return braid__error(BRAID_ERR_CUDA, "rank %d: cuda staging: %s failed: %s", (rank), \
                                (what), cudaGetErrorString(braid__ce));                        \
        }                                                                                      \
    } while (0)

int braid__mem_is_device(const void *p)
{
    return braid__cuda_ptr_kind(p, NULL) != BRAID_CUDA_PTR_HOST;
}

/* ---- the job and its gate ----------------------------------------------- */

static void job_unref(struct braid_hmem_job *job)
{
    if (atomic_fetch_sub(&job->refs, 1) == 1) {
        pthread_mutex_destroy(&job->mu);
        pthread_cond_destroy(&job->cv);
        free(job);
    }
}

static void gate_open(struct braid_hmem_job *job)
{
    pthread_mutex_lock(&job->mu);
    job->open = 1;
    pthread_cond_broadcast(&job->cv);
    pthread_mutex_unlock(&job->mu);
}

/* Runs on CUDA's callback thread, in the caller's stream: holds the stream
 * until the job is done with the caller's buffers. No CUDA calls here. */
static void CUDART_CB gate_wait(void *arg)
{
    struct braid_hmem_job *job = arg;
    pthread_mutex_lock(&job->mu);
    while (!job->open)
        pthread_cond_wait(&job->cv, &job->mu);
    pthread_mutex_unlock(&job->mu);
    job_unref(job);
}

void braid__hmem_coll_release(braid_coll *coll)
{
    struct braid_hmem_job *job = coll->hmem;
    if (!job)
        return;
    coll->hmem = NULL;
    if (atomic_exchange(&job->released, 1))
        return;
    pthread_mutex_lock(&init_mu);
    if (job->owner) {
        for (struct braid_hmem_job **p = &job->owner->jobs; *p; p = &(*p)->next)
            if (*p == job) {
                *p = job->next;
                break;
            }
        job->owner = NULL;
    }
    pthread_mutex_unlock(&init_mu);
    /* A job dropped before it ran (group destroyed) still lets the caller's
     * stream go on: its buffers are left as they were. */
    gate_open(job);
    if (job->ready) {
        cudaError_t err = cudaEventDestroy(job->ready);
        if (err != cudaSuccess) {
            (void)cudaGetLastError();
            BRAID_WARN("cuda staging: cudaEventDestroy failed: %s", cudaGetErrorString(err));
        }
    }
    job_unref(job);
}

/* ---- per-group state ------------------------------------------------------ */

static void state_free(struct braid_hmem *h)
{
    int cur = -1;
    if (cudaGetDevice(&cur) != cudaSuccess || cur != h->device)
        (void)cudaSetDevice(h->device);
    /* Nothing may still be copying into memory we free. */
    if (h->d2h)
        (void)cudaStreamSynchronize(h->d2h);
    if (h->h2d)
        (void)cudaStreamSynchronize(h->h2d);
    for (int b = 0; b < 2; b++) {
        if (h->pinned[b])
            (void)cudaFreeHost(h->pinned[b]);
        if (h->down_done[b])
            (void)cudaEventDestroy(h->down_done[b]);
        if (h->up_done[b])
            (void)cudaEventDestroy(h->up_done[b]);
    }
    if (h->d2h)
        (void)cudaStreamDestroy(h->d2h);
    if (h->h2d)
        (void)cudaStreamDestroy(h->h2d);
    (void)cudaGetLastError();
    if (cur >= 0 && cur != h->device)
        (void)cudaSetDevice(cur);
    free(h);
}

static braid_status state_create(braid_pg *pg, int device, struct braid_hmem **out)
{
    struct braid_hmem *h = calloc(1, sizeof(*h));
    if (!h)
        return braid__error(BRAID_ERR_NO_MEMORY, "rank %d: out of memory for cuda staging state", pg->rank);
    h->device = device;
    braid_status st = BRAID_OK;
    cudaError_t err = cudaStreamCreateWithFlags(&h->d2h, cudaStreamNonBlocking);
    if (err == cudaSuccess)
        err = cudaStreamCreateWithFlags(&h->h2d, cudaStreamNonBlocking);
    for (int b = 0; b < 2 && err == cudaSuccess; b++) {
        err = cudaEventCreateWithFlags(&h->down_done[b], cudaEventDisableTiming);
        if (err == cudaSuccess)
            err = cudaEventCreateWithFlags(&h->up_done[b], cudaEventDisableTiming);
        if (err == cudaSuccess)
            err = cudaHostAlloc(&h->pinned[b], BRAID_HMEM_PIECE_BYTES, cudaHostAllocDefault);
    }
    if (err != cudaSuccess) {
        (void)cudaGetLastError();
        st = braid__error(err == cudaErrorMemoryAllocation ? BRAID_ERR_NO_MEMORY : BRAID_ERR_CUDA,
                          "rank %d: cannot set up cuda staging on device %d (2 x %u pinned bytes, 2 streams): %s",
                          pg->rank, device, BRAID_HMEM_PIECE_BYTES, cudaGetErrorString(err));
        state_free(h);
        return st;
    }
    *out = h;
    return BRAID_OK;
}

void braid__hmem_pg_release(braid_pg *pg)
{
    if (pg->hmem) {
        /* Jobs that never ran are released only when their work handle is
         * freed; their callers' streams must not wait for that. */
        pthread_mutex_lock(&init_mu);
        for (struct braid_hmem_job *j = pg->hmem->jobs; j; j = j->next) {
            gate_open(j);
            j->owner = NULL;
        }
        pg->hmem->jobs = NULL;
        pthread_mutex_unlock(&init_mu);
        state_free(pg->hmem);
        pg->hmem = NULL;
    }
}

/* The group's staging state for device, made on first use. One device per
 * group: its streams and pinned buffers belong to that device. */
static braid_status state_get(braid_pg *pg, int device, const char *op)
{
    braid_status st = BRAID_OK;
    pthread_mutex_lock(&init_mu);
    if (!pg->hmem)
        st = state_create(pg, device, &pg->hmem);
    else if (pg->hmem->device != device)
        st = braid__error(BRAID_ERR_UNSUPPORTED,
                          "rank %d: %s on device %d, but this group already stages through device %d: "
                          "use one device per process group",
                          pg->rank, op, device, pg->hmem->device);
    pthread_mutex_unlock(&init_mu);
    return st;
}

/* ---- submission (caller's thread) ------------------------------------------ */

static int buffer_device(const braid_coll *c, int *device)
{
    int d1 = -1, d2 = -1;
    braid_cuda_ptr_kind k1 = braid__cuda_ptr_kind(c->send, &d1);
    braid_cuda_ptr_kind k2 = c->recv == c->send ? k1 : braid__cuda_ptr_kind(c->recv, &d2);
    if (c->recv == c->send)
        d2 = d1;
    if (k1 == BRAID_CUDA_PTR_HOST && k2 == BRAID_CUDA_PTR_HOST)
        return 0;
    *device = k1 != BRAID_CUDA_PTR_HOST ? d1 : d2;
    if (k1 != BRAID_CUDA_PTR_HOST && k2 != BRAID_CUDA_PTR_HOST && d1 != d2)
        return -1; /* send and recv on different devices */
    return 1;
}

braid_status braid__hmem_submit(braid_pg *pg, const braid_coll *coll, void *cuda_stream, braid_work **work)
{
    const char *op = braid__coll_name(coll->kind);
    int device = -1;
    int dev = coll->count > 0 ? buffer_device(coll, &device) : 0;
    if (dev < 0)
        return braid__error(BRAID_ERR_INVALID_ARG, "rank %d: %s: send and recv are on different CUDA devices",
                            pg->rank, op);
    if (!dev) {
        if (!cuda_stream)
            return braid__work_submit(pg, coll, work); /* the CPU path, untouched */
        /* Host buffers with a stream: the stream's earlier work (say a copy
         * into these buffers) must be finished before we read them. */
        if (!braid__cuda_available())
            return braid__error(BRAID_ERR_UNSUPPORTED, "rank %d: %s: a CUDA stream was given but %s", pg->rank,
                                op, braid__cuda_unavailable_reason());
        BRAID_CHECK(braid__cuda_stream_sync(cuda_stream));
        return braid__work_submit(pg, coll, work);
    }

    if (braid__group_open_here(pg))
        return braid__error(BRAID_ERR_UNSUPPORTED,
                            "rank %d: %s on device memory inside braid_group_start/end is not supported", pg->rank, op);
    int cur = -1;
    CUDA_CALL(cudaGetDevice(&cur), "cudaGetDevice", pg->rank);
    if (cur != device)
        return braid__error(BRAID_ERR_INVALID_ARG,
                            "rank %d: %s: buffers are on device %d but the calling thread's current device is %d "
                            "(cudaSetDevice first)",
                            pg->rank, op, device, cur);
    cudaStream_t stream = (cudaStream_t)cuda_stream;
    enum cudaStreamCaptureStatus cap = cudaStreamCaptureStatusNone;
    CUDA_CALL(cudaStreamIsCapturing(stream, &cap), "cudaStreamIsCapturing", pg->rank);
    if (cap != cudaStreamCaptureStatusNone)
        return braid__error(BRAID_ERR_UNSUPPORTED, "rank %d: %s on a stream under CUDA graph capture is not supported",
                            pg->rank, op);
    BRAID_CHECK(state_get(pg, device, op));

    struct braid_hmem_job *job = calloc(1, sizeof(*job));
    if (!job)
        return braid__error(BRAID_ERR_NO_MEMORY, "rank %d: out of memory for a cuda staging job", pg->rank);
    pthread_mutex_init(&job->mu, NULL);
    pthread_cond_init(&job->cv, NULL);
    atomic_init(&job->released, 0);
    atomic_init(&job->refs, 1);
    job->device = device;
    braid_coll c = *coll;
    c.hmem = job;
    cudaError_t err = cudaEventCreateWithFlags(&job->ready, cudaEventDisableTiming);
    if (err == cudaSuccess)
        err = cudaEventRecord(job->ready, stream);
    if (err == cudaSuccess && work) {
        /* The gate goes onto the stream before the job exists, so a job
         * that fails to queue still opens it (through the release). */
        atomic_fetch_add(&job->refs, 1);
        err = cudaLaunchHostFunc(stream, gate_wait, job);
        if (err != cudaSuccess)
            atomic_fetch_sub(&job->refs, 1);
    }
    if (err != cudaSuccess) {
        (void)cudaGetLastError();
        braid__hmem_coll_release(&c);
        return braid__error(BRAID_ERR_CUDA, "rank %d: %s: cannot order the call on the caller's stream: %s",
                            pg->rank, op, cudaGetErrorString(err));
    }
    pthread_mutex_lock(&init_mu);
    job->owner = pg->hmem;
    job->next = pg->hmem->jobs;
    pg->hmem->jobs = job;
    pthread_mutex_unlock(&init_mu);
    return braid__work_submit(pg, &c, work); /* owns the job from here */
}

/* ---- the job (executor) ----------------------------------------------------- */

static braid_status copy(braid_pg *pg, void *dst, const void *src, size_t bytes, cudaStream_t s, cudaEvent_t done)
{
    CUDA_CALL(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, s), "cudaMemcpyAsync", pg->rank);
    CUDA_CALL(cudaEventRecord(done, s), "cudaEventRecord", pg->rank);
    return BRAID_OK;
}

/* Piece k uses pinned[k & 1]. Down copies run on d2h, up copies on h2d;
 * a buffer is written again only after its previous up copy finished
 * (up_done), and read by the host only after its down copy finished. */
static braid_status stage(braid_pg *pg, braid_coll *coll, struct braid_hmem_job *job)
{
    struct braid_hmem *h = pg->hmem;
    size_t esize = braid_dtype_size(coll->dtype);
    size_t per = braid__hmem_piece_elems(esize);
    size_t n = braid__hmem_piece_count(coll->count, esize);
    int bcast = coll->kind == BRAID_COLL_BROADCAST;
    int down = !bcast || coll->root == pg->rank; /* the broadcast root's data goes out... */
    int up = !bcast || coll->root != pg->rank;   /* ...and only the others' comes back */
    const char *src = coll->send;
    char *dst = coll->recv;

    CUDA_CALL(cudaStreamWaitEvent(h->d2h, job->ready, 0), "cudaStreamWaitEvent", pg->rank);
    CUDA_CALL(cudaStreamWaitEvent(h->h2d, job->ready, 0), "cudaStreamWaitEvent", pg->rank);
    if (down)
        BRAID_CHECK(copy(pg, h->pinned[0], src, (n > 1 ? per : coll->count) * esize, h->d2h, h->down_done[0]));
    for (size_t k = 0; k < n; k++) {
        int b = (int)(k & 1);
        size_t off = k * per, len = coll->count - off < per ? coll->count - off : per;
        if (down && k + 1 < n) {
            int nb = b ^ 1;
            size_t noff = off + per, nlen = coll->count - noff < per ? coll->count - noff : per;
            if (up && k >= 1)
                CUDA_CALL(cudaStreamWaitEvent(h->d2h, h->up_done[nb], 0), "cudaStreamWaitEvent", pg->rank);
            BRAID_CHECK(copy(pg, h->pinned[nb], src + noff * esize, nlen * esize, h->d2h, h->down_done[nb]));
        }
        if (down)
            CUDA_CALL(cudaEventSynchronize(h->down_done[b]), "cudaEventSynchronize", pg->rank);
        else if (k >= 2)
            CUDA_CALL(cudaEventSynchronize(h->up_done[b]), "cudaEventSynchronize", pg->rank);

        braid_coll piece = *coll;
        piece.hmem = NULL;
        piece.send = piece.recv = h->pinned[b];
        piece.count = len;
        BRAID_CHECK(braid__coll_run(pg, &piece));

        if (up)
            BRAID_CHECK(copy(pg, dst + off * esize, h->pinned[b], len * esize, h->h2d, h->up_done[b]));
    }
    CUDA_CALL(cudaStreamSynchronize(h->h2d), "cudaStreamSynchronize", pg->rank);
    return BRAID_OK;
}

braid_status braid__hmem_coll_run(braid_pg *pg, braid_coll *coll)
{
    struct braid_hmem_job *job = coll->hmem;
    braid_status st = braid__pg_check_usable(pg, braid__coll_name(coll->kind));
    if (st != BRAID_OK) {
        if (job)
            gate_open(job);
        return st;
    }
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
    if (st == BRAID_OK)
        st = stage(pg, coll, job);
    if (st != BRAID_OK && pg->hmem) {
        /* Leave no copy in flight into buffers the next job reuses. */
        (void)cudaStreamSynchronize(pg->hmem->d2h);
        (void)cudaStreamSynchronize(pg->hmem->h2d);
        (void)cudaGetLastError();
        braid__pg_fail(pg, st); /* peers blocked on us fail now, not at their timeout */
    }
    if (job)
        gate_open(job);
    return st;
}
