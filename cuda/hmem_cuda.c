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
 * before the first gate (braid__cuda_gate_prepare), and pinned buffers are
 * allocated once per group at their full size, never reallocated
 * (cudaHostAlloc and cudaFreeHost wait for busy blocking streams). */
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
#include "transport.h"

/* Per-job state, freed by braid__hmem_coll_release. */
struct braid_hmem_job {
    atomic_int released;      /* braid__hmem_coll_release ran */
    braid_cuda_gate gate;     /* armed on the caller's stream when work != NULL */
    int device;
    int dring;                /* may run as the device ring (use_device_ring) */
    cudaEvent_t ready;        /* recorded on the caller's stream at submission */
    struct braid_hmem *owner; /* on owner->jobs while not released (under init_mu) */
    struct braid_hmem_job *next;
};

/* Guards every group's staging-state creation and job list. */
static pthread_mutex_t init_mu = PTHREAD_MUTEX_INITIALIZER;

/* The last error's text without its status name, copied out of the
 * buffer the next braid__error writes: the cause inside a wider message. */
static const char *cause_text(void)
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

/* Lets the caller's stream go on (idempotent, no CUDA call). */
static void gate_open(struct braid_hmem_job *job)
{
    braid__cuda_gate_open(&job->gate);
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
    free(job);
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
    if (h->comp)
        (void)cudaStreamSynchronize(h->comp);
    if (h->rpin)
        (void)cudaFreeHost(h->rpin);
    if (h->spin)
        (void)cudaFreeHost(h->spin);
    if (h->dslot)
        (void)cudaFree(h->dslot);
    for (int i = 0; i < DRING_RECV_SLOTS; i++) {
        if (h->ev_h2d[i])
            (void)cudaEventDestroy(h->ev_h2d[i]);
        if (h->ev_kern[i])
            (void)cudaEventDestroy(h->ev_kern[i]);
    }
    for (int i = 0; i < DRING_SEND_SLOTS; i++)
        if (h->ev_d2h[i])
            (void)cudaEventDestroy(h->ev_d2h[i]);
    if (h->comp)
        (void)cudaStreamDestroy(h->comp);
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
    braid_status st = braid__cuda_gate_prepare();
    if (st != BRAID_OK) {
        free(h);
        return braid__error(st, "rank %d: cannot set up cuda staging on device %d: %s", pg->rank, device,
                            cause_text());
    }
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
    /* The device ring's slots, at the group's chunk size (fixed for its
     * life), allocated now: nothing here may be reallocated later (see the
     * top of the file). */
    h->slot_bytes = pg->chunk_bytes < 16 ? 16 : pg->chunk_bytes;
    if (err == cudaSuccess)
        err = cudaStreamCreateWithFlags(&h->comp, cudaStreamNonBlocking);
    if (err == cudaSuccess)
        err = cudaHostAlloc(&h->rpin, DRING_RECV_SLOTS * h->slot_bytes, cudaHostAllocDefault);
    if (err == cudaSuccess)
        err = cudaHostAlloc(&h->spin, DRING_SEND_SLOTS * h->slot_bytes, cudaHostAllocDefault);
    if (err == cudaSuccess)
        err = cudaMalloc(&h->dslot, DRING_RECV_SLOTS * h->slot_bytes);
    for (int i = 0; i < DRING_RECV_SLOTS && err == cudaSuccess; i++) {
        err = cudaEventCreateWithFlags(&h->ev_h2d[i], cudaEventDisableTiming);
        if (err == cudaSuccess)
            err = cudaEventCreateWithFlags(&h->ev_kern[i], cudaEventDisableTiming);
    }
    for (int i = 0; i < DRING_SEND_SLOTS && err == cudaSuccess; i++)
        err = cudaEventCreateWithFlags(&h->ev_d2h[i], cudaEventDisableTiming);
    if (err != cudaSuccess) {
        (void)cudaGetLastError();
        st = braid__error(err == cudaErrorMemoryAllocation ? BRAID_ERR_NO_MEMORY : BRAID_ERR_CUDA,
                          "rank %d: cannot set up cuda staging on device %d (2 x %u + %d x %zu pinned bytes, "
                          "%d x %zu device bytes, 3 streams): %s",
                          pg->rank, device, BRAID_HMEM_PIECE_BYTES, DRING_RECV_SLOTS + DRING_SEND_SLOTS,
                          h->slot_bytes, DRING_RECV_SLOTS, h->slot_bytes, cudaGetErrorString(err));
        state_free(h);
        return st;
    }
    *out = h;
    return BRAID_OK;
}

static braid_status state_get(braid_pg *pg, int device, const char *op);

void braid__hmem_pg_prepare(braid_pg *pg)
{
    int device = -1;
    if (!braid__cuda_context_seen() || !braid__cuda_available())
        return; /* CPU-only processes stay CUDA-free */
    if (cudaGetDevice(&device) != cudaSuccess) {
        (void)cudaGetLastError();
        return;
    }
    if (state_get(pg, device, "braid_pg_init") != BRAID_OK)
        BRAID_INFO("rank %d: cuda staging not set up at group creation (retried at the first device call): %s",
                   pg->rank, braid_last_error());
    braid__error_clear();
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
 * readable by kernels. The job runs it only where the tuner picks the ring
 * for the whole call (braid__allreduce_algo, on the executor, as for a
 * host call): then a host rank in the same call runs the same ring. */
static int use_device_ring(const braid_coll *c, int both)
{
    size_t bytes = c->count * braid_dtype_size(c->dtype);
    return both && c->kind == BRAID_COLL_ALLREDUCE && bytes > BRAID_HMEM_PIECE_BYTES;
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
    BRAID_CHECK(braid__pg_check_usable(pg, braid__coll_name(coll->kind)));
    if (coll->recv != coll->send)
        BRAID_CHECK(braid__cuda_memcpy_async(coll->recv, coll->send, coll->count * braid_dtype_size(coll->dtype),
                                             stream));
    if (work)
        return braid__work_completed(pg, work);
    return braid__cuda_stream_sync(stream);
}

braid_status braid__hmem_submit(braid_pg *pg, const braid_coll *coll, void *cuda_stream, braid_work **work)
{
    const char *op = braid__coll_name(coll->kind);
    int device = -1, both = 0;
    int dev = coll->count > 0 ? buffer_device(coll, &device, &both) : 0;
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
    if (one_rank_copy(pg, coll))
        return one_rank_run(pg, coll, cuda_stream, work);
    if (!coll->refused && (coll->kind == BRAID_COLL_ALLREDUCE || coll->kind == BRAID_COLL_BROADCAST))
        BRAID_CHECK(braid__devcoll_agree(pg, device)); /* the group's first device call decides */
    if (braid__devcoll_takes(pg, coll, device))
        return braid__devcoll_run(pg, coll, cuda_stream, work); /* graph capture included */
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
    atomic_init(&job->released, 0);
    job->device = device;
    job->dring = use_device_ring(coll, both);
    braid_coll c = *coll;
    c.hmem = job;
    cudaError_t err = cudaEventCreateWithFlags(&job->ready, cudaEventDisableTiming);
    if (err == cudaSuccess)
        err = cudaEventRecord(job->ready, stream);
    if (err != cudaSuccess) {
        (void)cudaGetLastError();
        braid__hmem_coll_release(&c);
        return braid__error(BRAID_ERR_CUDA, "rank %d: %s: cannot order the call on the caller's stream: %s",
                            pg->rank, op, cudaGetErrorString(err));
    }
    /* The gate goes onto the stream before the job exists, so a job that
     * fails to queue still opens it (through the release). */
    braid_status gst = work ? braid__cuda_gate_arm(&job->gate, stream) : BRAID_OK;
    if (gst != BRAID_OK) {
        braid__hmem_coll_release(&c);
        return braid__error(gst, "rank %d: %s: cannot hold the caller's stream: %s", pg->rank, op, cause_text());
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
static braid_status stage(braid_pg *pg, braid_coll *coll)
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
    if (st == BRAID_OK) {
        /* Both kinds of job start after the work queued on the caller's
         * stream before the call. */
        cudaStream_t waiters[3] = {pg->hmem->d2h, pg->hmem->h2d, pg->hmem->comp};
        for (int i = 0; i < 3 && st == BRAID_OK; i++) {
            cudaError_t err = cudaStreamWaitEvent(waiters[i], job->ready, 0);
            if (err != cudaSuccess) {
                (void)cudaGetLastError();
                st = braid__error(BRAID_ERR_CUDA, "rank %d: cuda staging: cudaStreamWaitEvent failed: %s", pg->rank,
                                  cudaGetErrorString(err));
            }
        }
    }
    if (st == BRAID_OK) {
        int ring = job->dring && braid__pg_allreduce_algo(pg, coll->count, coll->dtype) == BRAID_ALGO_RING;
        st = ring ? braid__device_ring(pg, coll) : stage(pg, coll);
    }
    if (st != BRAID_OK && pg->hmem) {
        /* Leave no copy in flight into buffers the next job reuses. */
        (void)cudaStreamSynchronize(pg->hmem->d2h);
        (void)cudaStreamSynchronize(pg->hmem->h2d);
        (void)cudaStreamSynchronize(pg->hmem->comp);
        (void)cudaGetLastError();
        braid__pg_fail(pg, st); /* peers blocked on us fail now, not at their timeout */
    }
    if (job)
        gate_open(job);
    return st;
}
