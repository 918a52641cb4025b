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
 *    here (device ring, below) with the reduction on the GPU. Chunks
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
#include "devlink.h"
#include "hmem.h"
#include "transports/cuda_ipc/cuda_ipc.h"
#include "log.h"
#include "status.h"
#include "transport.h"

/* Device ring windows: receives in flight (each owns a pinned and a
 * device slot until its data went up and, in the all-gather, was sent on)
 * and sends staged ahead of completion: the host ring's windows. */
#define DRING_RECV_SLOTS 4
#define DRING_SEND_SLOTS 8

/* Per-group staging state, made by the first device call. */
struct braid_hmem {
    int device;
    cudaStream_t d2h, h2d;
    cudaEvent_t down_done[2]; /* piece copied into pinned[b] */
    cudaEvent_t up_done[2];   /* pinned[b] copied back: the buffer is free */
    void *pinned[2];
    /* Device ring (all-reduce with the reduction on the GPU): a compute
     * stream, pinned receive and send slots, device copies of the receive
     * slots, and one event per slot for each stage. */
    cudaStream_t comp;
    size_t slot_bytes;
    void *rpin, *spin, *dslot;
    cudaEvent_t ev_h2d[DRING_RECV_SLOTS];  /* receive slot copied up */
    cudaEvent_t ev_kern[DRING_RECV_SLOTS]; /* the kernel reading dslot[s] finished */
    cudaEvent_t ev_d2h[DRING_SEND_SLOTS];  /* send slot filled */
    struct braid_hmem_job *jobs; /* submitted, not yet released (under init_mu) */
};

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

#define CUDA_CALL(call, what, rank)                                                            \
    do {                                                                                       \
        cudaError_t braid__ce = (call);                                                        \
        if (braid__ce != cudaSuccess) {                                                        \
            (void)cudaGetLastError();                                                          \
            return braid__error(BRAID_ERR_CUDA, "rank %d: cuda staging: %s failed: %s", (rank), \
                                (what), cudaGetErrorString(braid__ce));                        \
        }                                                                                      \
    } while (0)

/* The last error's text without its status name, copied out of the
 * buffer the next braid__error writes: the cause inside a wider message. */
static const char *cause_text(void)
{
    static _Thread_local char why[256];
    const char *e = braid_last_error(), *colon = strstr(e, ": ");
    snprintf(why, sizeof(why), "%s", colon ? colon + 2 : e);
    return why;
}

int braid__mem_is_device(const void *p)
{
    return braid__cuda_ptr_kind(p, NULL) != BRAID_CUDA_PTR_HOST;
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

/* 1 when send or recv is device (or managed) memory, with *device its
 * device and *both set when both are; 0 for host buffers; -1 when they
 * are on different devices. */
static int buffer_device(const braid_coll *c, int *device, int *both)
{
    int d1 = -1, d2 = -1;
    braid_cuda_ptr_kind k1 = braid__cuda_ptr_kind(c->send, &d1);
    braid_cuda_ptr_kind k2 = c->recv == c->send ? k1 : braid__cuda_ptr_kind(c->recv, &d2);
    if (c->recv == c->send)
        d2 = d1;
    *both = k1 != BRAID_CUDA_PTR_HOST && k2 != BRAID_CUDA_PTR_HOST;
    if (k1 == BRAID_CUDA_PTR_HOST && k2 == BRAID_CUDA_PTR_HOST)
        return 0;
    *device = k1 != BRAID_CUDA_PTR_HOST ? d1 : d2;
    if (*both && d1 != d2)
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

/* ---- the device ring (executor) ---------------------------------------------
 * The host ring of src/algo/ring_allreduce.c (same segments, chunks, item
 * order and fingerprint, so it meets a host rank's ring on the wire), with
 * the data on the device:
 *
 *  receive item k (slot k % DRING_RECV_SLOTS): the transport fills
 *    rpin[slot]; then on h2d: wait for the kernel that last read
 *    dslot[slot], copy rpin -> dslot (reduce-scatter) or straight into
 *    recv (all-gather), record ev_h2d; on comp (reduce-scatter only): wait
 *    ev_h2d, run the fused kernel recv = op(send, dslot) (AVG's division in
 *    the segment's last one), record ev_kern. The pinned slot is free again
 *    once ev_h2d completed.
 *  send item j (slot j % DRING_SEND_SLOTS): step 0 sends input chunks,
 *    later steps the chunk of receive item j - step0, once its kernel ran
 *    (reduce-scatter) or it was copied into recv (all-gather): on d2h,
 *    wait for that, copy down into spin[slot], record ev_d2h, and post the
 *    send once ev_d2h completed. All-gather chunks are forwarded from the
 *    device, not from their pinned receive slot: a receive slot then never
 *    waits for a send, which would chain every rank's receives to its
 *    successor's and deadlock the ring once a segment has more chunks than
 *    the windows hold.
 *
 * A side whose connection moves device memory itself (a device link,
 * src/devlink.c, where the neighbour runs the device ring too; or a group
 * whose transport is cuda_ipc) skips its pinned slots: receives land in
 * dslot (reduce-scatter) or in recv (all-gather) and a slot is free once
 * the kernel that read it finished; sends go from send/recv once ev_d2h,
 * recorded on d2h after the producer, completed.
 *
 * Which connection each side uses is settled before any data moves
 * (pick_links): fingerprints go over the host links, forwards and, where
 * a device link exists, backwards, flagged as the device ring's; a side
 * takes its device link when the neighbour's flag says it runs the device
 * ring too and the link settles as usable, else the host link (a host
 * rank in the call, GPUs that cannot reach each other).
 *
 * Only the host waits on events (cudaEventQuery in the loop; a blocking
 * wait when nothing else can move), streams wait on each other through
 * events, so copies up, kernels, copies down and the network all overlap. */
typedef struct {
    int step, steps, shift;
    size_t chunk, seg_start, seg_len, nchunks;
} dcursor;

typedef struct {
    int n, rank;
    size_t count, epc; /* elements, elements per chunk */
} dring;

static void dcur_load(const dring *g, dcursor *c)
{
    int seg = ((g->rank - c->step - c->shift) % g->n + g->n) % g->n;
    braid__segment(g->count, g->n, seg, &c->seg_start, &c->seg_len);
    c->nchunks = (c->seg_len + g->epc - 1) / g->epc;
    c->chunk = 0;
}

static void dcur_settle(const dring *g, dcursor *c)
{
    while (c->step < c->steps && c->chunk >= c->nchunks) {
        c->step++;
        if (c->step < c->steps)
            dcur_load(g, c);
    }
}

static void dcur_init(const dring *g, dcursor *c, int shift)
{
    c->step = 0;
    c->steps = 2 * (g->n - 1);
    c->shift = shift;
    dcur_load(g, c);
    dcur_settle(g, c);
}

static void dcur_next(const dring *g, dcursor *c)
{
    c->chunk++;
    dcur_settle(g, c);
}

static int dcur_done(const dcursor *c)
{
    return c->step >= c->steps;
}

static void dcur_range(const dring *g, const dcursor *c, size_t *off, size_t *len)
{
    size_t first = c->chunk * g->epc;
    *off = c->seg_start + first;
    *len = c->seg_len - first < g->epc ? c->seg_len - first : g->epc;
}

/* Whether conn moves device memory itself (isend reads device memory,
 * irecv writes it, both complete only when the data has moved): the
 * cuda_ipc transport, whose copies are cudaMemcpyDefault on its own
 * stream. The device ring then skips the pinned slots on that side. In
 * the host stand-in runtime of tests/cuda_fake.c "device" memory is host
 * memory that every transport can move, and CUDA_FAKE_DIRECT=1 makes
 * every connection count, so that path runs without a GPU too. */
static int conn_takes_device_memory(const braid_conn *conn)
{
#ifdef BRAID_CUDA_FAKE
    const char *direct = getenv("CUDA_FAKE_DIRECT");
    if (direct && direct[0] == '1')
        return 1;
#endif
    const braid_transport_ops *ipc = braid__transport_get(BRAID_TRANSPORT_CUDA_IPC);
    return ipc && conn->ops == ipc;
}

/* Control messages still going out on the device links in use (see
 * braid__cuda_ipc_tx_pending): the ring ends only once they are out. */
static braid_status links_pending(braid_conn *to_next, braid_conn *host_next, braid_conn *from_prev,
                                  braid_conn *host_prev, int *pending)
{
    int n = 0, m = 0;
    if (to_next != host_next)
        BRAID_CHECK(braid__cuda_ipc_tx_pending(to_next, &n));
    if (from_prev != host_prev && from_prev != to_next)
        BRAID_CHECK(braid__cuda_ipc_tx_pending(from_prev, &m));
    *pending = n + m;
    return BRAID_OK;
}

/* The connections the device ring moves data on (see above), once the
 * fingerprints from prev (forwards) and next (backwards, with a device
 * link only) arrived and matched. */
static braid_status pick_links(braid_pg *pg, braid_algo_run *run, braid_fp_back *back, int next, int prev, braid_conn *host_next,
                               braid_conn *host_prev, braid_conn **to_next, braid_conn **from_prev)
{
    braid_conn *dl_next = braid__devlink(pg, next), *dl_prev = braid__devlink(pg, prev);
    int fp_checked = 0, back_done = 0;
    *to_next = host_next;
    *from_prev = host_prev;
    for (;;) {
        int moved = 0;
        if (!fp_checked) {
            BRAID_CHECK(braid__fp_poll(run, &fp_checked));
            moved |= fp_checked;
        }
        if (!back_done) {
            BRAID_CHECK(braid__fp_back_poll(run, back, &back_done));
            moved |= back_done;
        }
        /* The device links are progressed too: control messages of the
         * previous call may still be going out on them. */
        braid_conn *waits[4] = {host_next, host_prev};
        int nwaits = host_next == host_prev ? 1 : 2, settled_all = fp_checked && back_done;
        if (dl_next)
            waits[nwaits++] = dl_next;
        if (dl_prev && dl_prev != dl_next)
            waits[nwaits++] = dl_prev;
        if (settled_all) {
            /* Both fingerprints in: which neighbours run the device ring. */
            int use_next = dl_next && back->exchanged && braid__fp_dring(back->theirs);
            int use_prev = dl_prev && braid__fp_dring(run->fp_in.theirs);
            int settled, usable;
            if (use_next) {
                BRAID_CHECK(braid__devlink_settle(pg, next, &settled, &usable));
                settled_all &= settled;
                *to_next = settled && usable ? dl_next : host_next;
            }
            if (use_prev) {
                BRAID_CHECK(braid__devlink_settle(pg, prev, &settled, &usable));
                settled_all &= settled;
                *from_prev = settled && usable ? dl_prev : host_prev;
            }
        }
        if (settled_all)
            return BRAID_OK;
        if (!moved)
            BRAID_CHECK(braid__algo_wait(run, waits, nwaits, !fp_checked ? prev : next));
    }
}

/* 1 when ev completed, 0 when not yet; errors are returned. */
static braid_status event_done(braid_pg *pg, cudaEvent_t ev, int *done)
{
    cudaError_t err = cudaEventQuery(ev);
    if (err == cudaErrorNotReady) {
        *done = 0;
        return BRAID_OK;
    }
    CUDA_CALL(err, "cudaEventQuery", pg->rank);
    *done = 1;
    return BRAID_OK;
}

static braid_status device_ring(braid_pg *pg, braid_coll *coll)
{
    struct braid_hmem *h = pg->hmem;
    size_t es = braid_dtype_size(coll->dtype);
    const uint8_t *send = coll->send;
    uint8_t *recv = coll->recv;
    dring g = {.n = pg->size, .rank = pg->rank, .count = coll->count};
    g.epc = pg->chunk_bytes / es ? pg->chunk_bytes / es : 1;
    if (g.epc * es > h->slot_bytes)
        return braid__error(BRAID_ERR_INTERNAL, "rank %d: device ring chunk of %zu bytes exceeds its %zu-byte slots",
                            pg->rank, g.epc * es, h->slot_bytes);
    if (g.n == 1) {
        const void *src = send;
        BRAID_CHECK(braid__cuda_reduce(coll->dtype, coll->op, recv, &src, 1, coll->count, 1, h->comp));
        CUDA_CALL(cudaStreamSynchronize(h->comp), "cudaStreamSynchronize", pg->rank);
        return BRAID_OK;
    }

    braid_coll rc = *coll;
    rc.hmem = NULL;
    rc.algo = BRAID_ALGO_RING;
    braid_algo_ctx ctx;
    braid__pg_algo_ctx(pg, &ctx);
    braid_algo_run run;
    braid__algo_run_init(&run, &ctx, &rc);
    int next = (g.rank + 1) % g.n, prev = (g.rank + g.n - 1) % g.n;
    braid_conn *host_next, *host_prev;
    BRAID_CHECK(braid__pg_conn(pg, next, &host_next));
    BRAID_CHECK(braid__pg_conn(pg, prev, &host_prev));

    uint8_t fp_mine[BRAID_FP_BYTES];
    braid_req fp_send_req;
    braid_fp_back back;
    braid__fp_encode(&rc, fp_mine);
    braid__fp_set_dring(fp_mine);
    braid_status st = host_next->ops->isend(host_next, &fp_send_req, fp_mine, sizeof(fp_mine));
    if (st == BRAID_OK)
        st = braid__fp_recv(&run, host_prev, prev);
    if (st == BRAID_OK)
        st = braid__fp_back_start(&run, &back, fp_mine, prev, next);
    braid_conn *to_next = host_next, *from_prev = host_prev;
    if (st == BRAID_OK)
        st = pick_links(pg, &run, &back, next, prev, host_next, host_prev, &to_next, &from_prev);
    if (st != BRAID_OK)
        return braid__fp_explain(&run, st);
    int fp_sent = 0;
    /* Sides whose connection moves device memory: no pinned slot there. */
    int dsend = to_next != host_next || conn_takes_device_memory(to_next);
    int drecv = from_prev != host_prev || conn_takes_device_memory(from_prev);
    /* Waits cover the data links and the host links (the forward
     * fingerprint may still be going out; a failing peer closes both). */
    braid_conn *conns[4];
    int nconns = 0;
    braid_conn *all[4] = {to_next, from_prev, host_next, host_prev};
    for (int i = 0; i < 4; i++) {
        int seen = 0;
        for (int j = 0; j < nconns; j++)
            seen |= conns[j] == all[i];
        if (!seen)
            conns[nconns++] = all[i];
    }

    dcursor post_r, done_r, stage_s, post_s;
    dcur_init(&g, &post_r, 1);
    dcur_init(&g, &done_r, 1);
    dcur_init(&g, &stage_s, 0);
    dcur_init(&g, &post_s, 0);
    size_t step0 = stage_s.step == 0 ? stage_s.nchunks : 0;

    braid_req rreq[DRING_RECV_SLOTS], sreq[DRING_SEND_SLOTS];
    /* slot_busy[s]: the event that frees slot s (its copy up, or with a
     * direct receive the kernel reading the device slot), or NULL */
    cudaEvent_t slot_busy[DRING_RECV_SLOTS] = {0};
    const uint8_t *ssrc[DRING_SEND_SLOTS];
    size_t n_posted_r = 0, n_done_r = 0, n_staged_s = 0, n_posted_s = 0, n_done_s = 0;
    uint8_t *rpin = h->rpin, *spin = h->spin, *dslot = h->dslot;
    size_t sb = h->slot_bytes;

    for (;;) {
        int moved = 0, done;
        cudaEvent_t block_on = NULL; /* what to wait for when nothing moved */

        /* Stage sends: input chunks (step 0), reduced chunks and gathered
         * chunks go down to pinned send slots on d2h after whatever
         * produced them; with a direct connection only ev_d2h is recorded,
         * to tell the host when the chunk is final. */
        while (!dcur_done(&stage_s) && n_staged_s - n_done_s < DRING_SEND_SLOTS &&
               (n_staged_s < step0 || n_staged_s - step0 < n_done_r)) {
            size_t off, len, j = n_staged_s, s = j % DRING_SEND_SLOTS;
            dcur_range(&g, &stage_s, &off, &len);
            if (stage_s.step > 0) {
                /* the chunk of receive item j - step0: reduced by its
                 * kernel, or (all-gather) copied up into recv */
                size_t r = (j - step0) % DRING_RECV_SLOTS;
                cudaEvent_t after = stage_s.step < g.n ? h->ev_kern[r] : h->ev_h2d[r];
                CUDA_CALL(cudaStreamWaitEvent(h->d2h, after, 0), "cudaStreamWaitEvent", pg->rank);
            }
            const uint8_t *from = (stage_s.step == 0 ? send : recv) + off * es;
            if (dsend) {
                ssrc[s] = from; /* sent from where it is, once ev_d2h says it is final */
            } else {
                CUDA_CALL(cudaMemcpyAsync(spin + s * sb, from, len * es, cudaMemcpyDefault, h->d2h),
                          "cudaMemcpyAsync", pg->rank);
                ssrc[s] = spin + s * sb;
            }
            CUDA_CALL(cudaEventRecord(h->ev_d2h[s], h->d2h), "cudaEventRecord", pg->rank);
            n_staged_s++;
            dcur_next(&g, &stage_s);
            moved = 1;
        }
        /* Post staged sends, in order, once their data is ready. */
        while (n_posted_s < n_staged_s) {
            size_t off, len, s = n_posted_s % DRING_SEND_SLOTS;
            BRAID_CHECK(event_done(pg, h->ev_d2h[s], &done));
            if (!done) {
                block_on = h->ev_d2h[s];
                break;
            }
            dcur_range(&g, &post_s, &off, &len);
            BRAID_CHECK(braid__fp_explain(&run, to_next->ops->isend(to_next, &sreq[s], ssrc[s], len * es)));
            n_posted_s++;
            dcur_next(&g, &post_s);
            moved = 1;
        }
        /* Post receives into free slots. */
        while (!dcur_done(&post_r) && n_posted_r - n_done_r < DRING_RECV_SLOTS) {
            size_t off, len, k = n_posted_r, s = k % DRING_RECV_SLOTS;
            if (slot_busy[s]) {
                BRAID_CHECK(event_done(pg, slot_busy[s], &done));
                if (!done) {
                    if (!block_on)
                        block_on = slot_busy[s];
                    break;
                }
                slot_busy[s] = NULL;
            }
            dcur_range(&g, &post_r, &off, &len);
            /* direct: reduce-scatter chunks into the device slot, gathered
             * ones straight into place */
            uint8_t *into = !drecv ? rpin + s * sb : post_r.step < g.n - 1 ? dslot + s * sb : recv + off * es;
            BRAID_CHECK(braid__fp_explain(&run, from_prev->ops->irecv(from_prev, &rreq[s], into, len * es)));
            n_posted_r++;
            dcur_next(&g, &post_r);
            moved = 1;
        }

        /* Arrived chunks go up (unless the transport put them on the
         * device already); reduce-scatter chunks are reduced. The
         * fingerprints were checked by pick_links. */
        while (n_done_r < n_posted_r) {
            size_t off, len, k = n_done_r, s = k % DRING_RECV_SLOTS;
            BRAID_CHECK(braid__fp_explain(&run, braid__algo_test(&run, &rreq[s], &done)));
            if (!done)
                break;
            dcur_range(&g, &done_r, &off, &len);
            if (done_r.step < g.n - 1) {
                if (!drecv) {
                    CUDA_CALL(cudaStreamWaitEvent(h->h2d, h->ev_kern[s], 0), "cudaStreamWaitEvent", pg->rank);
                    CUDA_CALL(cudaMemcpyAsync(dslot + s * sb, rpin + s * sb, len * es, cudaMemcpyDefault, h->h2d),
                              "cudaMemcpyAsync", pg->rank);
                    CUDA_CALL(cudaEventRecord(h->ev_h2d[s], h->h2d), "cudaEventRecord", pg->rank);
                    CUDA_CALL(cudaStreamWaitEvent(h->comp, h->ev_h2d[s], 0), "cudaStreamWaitEvent", pg->rank);
                }
                const void *srcs[2] = {send + off * es, dslot + s * sb};
                int last = done_r.step == g.n - 2; /* the segment is complete: AVG divides */
                braid_op op = !last && coll->op == BRAID_AVG ? BRAID_SUM : coll->op;
                BRAID_CHECK(braid__cuda_reduce(coll->dtype, op, recv + off * es, srcs, 2, len, g.n, h->comp));
                CUDA_CALL(cudaEventRecord(h->ev_kern[s], h->comp), "cudaEventRecord", pg->rank);
                slot_busy[s] = drecv ? h->ev_kern[s] : h->ev_h2d[s];
            } else if (!drecv) {
                CUDA_CALL(cudaMemcpyAsync(recv + off * es, rpin + s * sb, len * es, cudaMemcpyDefault, h->h2d),
                          "cudaMemcpyAsync", pg->rank);
                CUDA_CALL(cudaEventRecord(h->ev_h2d[s], h->h2d), "cudaEventRecord", pg->rank);
                slot_busy[s] = h->ev_h2d[s];
            } else {
                /* already in place: a forwarding send needs no event */
                CUDA_CALL(cudaEventRecord(h->ev_h2d[s], h->h2d), "cudaEventRecord", pg->rank);
            }
            n_done_r++;
            dcur_next(&g, &done_r);
            moved = 1;
        }
        if (!fp_sent) {
            BRAID_CHECK(braid__fp_explain(&run, braid__algo_test(&run, &fp_send_req, &fp_sent)));
            moved |= fp_sent;
        }
        while (n_done_s < n_posted_s) {
            BRAID_CHECK(braid__fp_explain(&run, braid__algo_test(&run, &sreq[n_done_s % DRING_SEND_SLOTS], &done)));
            if (!done)
                break;
            n_done_s++;
            moved = 1;
        }

        int ctrl_pending = 0;
        if (fp_sent && dcur_done(&post_s) && dcur_done(&post_r) && n_done_r == n_posted_r && n_done_s == n_posted_s)
            BRAID_CHECK(braid__fp_explain(&run, links_pending(to_next, host_next, from_prev, host_prev, &ctrl_pending)));
        if (fp_sent && dcur_done(&post_s) && dcur_done(&post_r) && n_done_r == n_posted_r &&
            n_done_s == n_posted_s && !ctrl_pending) {
            /* Everything went up and every kernel ran: recv is final. */
            CUDA_CALL(cudaStreamSynchronize(h->h2d), "cudaStreamSynchronize", pg->rank);
            CUDA_CALL(cudaStreamSynchronize(h->comp), "cudaStreamSynchronize", pg->rank);
            CUDA_CALL(cudaStreamSynchronize(h->d2h), "cudaStreamSynchronize", pg->rank);
            return BRAID_OK;
        }
        if (!moved) {
            if (block_on) {
                /* Only a copy can unblock us: it finishes on its own. */
                CUDA_CALL(cudaEventSynchronize(block_on), "cudaEventSynchronize", pg->rank);
                continue;
            }
            st = braid__algo_wait(&run, conns, nconns, n_done_r < n_posted_r ? prev : next);
            if (st != BRAID_OK)
                return braid__fp_explain(&run, st);
        }
    }
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
        st = ring ? device_ring(pg, coll) : stage(pg, coll);
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
