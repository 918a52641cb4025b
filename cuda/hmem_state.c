/* The per-group staging state of the CUDA build (struct braid_hmem,
 * hmem_cuda.h): made at group creation or by the first device call, its
 * pinned pool grown by submitting threads, freed with the group. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>

#include <cuda_runtime_api.h>

#include "braid_cuda.h"
#include "hmem.h"
#include "hmem_cuda.h"
#include "log.h"
#include "status.h"

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
    while (h->retired) {
        struct braid_hmem_retired *r = h->retired;
        h->retired = r->next;
        for (int b = 0; b < 2; b++)
            if (r->half[b])
                (void)cudaFreeHost(r->half[b]);
        free(r);
    }
    for (int b = 0; b < 2; b++) {
        if (h->pool[b])
            (void)cudaFreeHost(h->pool[b]);
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
                            braid__hmem_cause());
    }
    cudaError_t err = cudaStreamCreateWithFlags(&h->d2h, cudaStreamNonBlocking);
    if (err == cudaSuccess)
        err = cudaStreamCreateWithFlags(&h->h2d, cudaStreamNonBlocking);
    for (int b = 0; b < 2 && err == cudaSuccess; b++) {
        err = cudaEventCreateWithFlags(&h->down_done[b], cudaEventDisableTiming);
        if (err == cudaSuccess)
            err = cudaEventCreateWithFlags(&h->up_done[b], cudaEventDisableTiming);
        if (err == cudaSuccess)
            err = cudaHostAlloc(&h->pool[b], BRAID_HMEM_PIECE_BYTES, cudaHostAllocDefault);
    }
    h->pool_bytes = BRAID_HMEM_PIECE_BYTES;
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

void braid__hmem_pg_prepare(braid_pg *pg)
{
    int device = -1;
    if (!braid__cuda_context_seen() || !braid__cuda_available())
        return; /* CPU-only processes stay CUDA-free */
    if (cudaGetDevice(&device) != cudaSuccess) {
        (void)cudaGetLastError();
        return;
    }
    if (braid__hmem_state_get(pg, device, "braid_pg_init") != BRAID_OK)
        BRAID_INFO("rank %d: cuda staging not set up at group creation (retried at the first device call): %s",
                   pg->rank, braid_last_error());
    braid__error_clear();
}

void braid__hmem_pg_release(braid_pg *pg)
{
    if (pg->hmem) {
        /* Jobs that never ran are released only when their work handle is
         * freed; their callers' streams must not wait for that. */
        braid__hmem_jobs_orphan(pg->hmem);
        state_free(pg->hmem);
        pg->hmem = NULL;
    }
}

/* The group's staging state for device, made on first use. One device per
 * group: its streams and pinned buffers belong to that device. */
braid_status braid__hmem_state_get(braid_pg *pg, int device, const char *op)
{
    braid_status st = BRAID_OK;
    pthread_mutex_lock(&braid__hmem_mu);
    if (!pg->hmem)
        st = state_create(pg, device, &pg->hmem);
    else if (pg->hmem->device != device)
        st = braid__error(BRAID_ERR_UNSUPPORTED,
                          "rank %d: %s on device %d, but this group already stages through device %d: "
                          "use one device per process group",
                          pg->rank, op, device, pg->hmem->device);
    pthread_mutex_unlock(&braid__hmem_mu);
    return st;
}

/* Grown to twice its size at least, so a group outgrows few pools. */
braid_status braid__hmem_pool_reserve(braid_pg *pg, size_t need)
{
    struct braid_hmem *h = pg->hmem;
    pthread_mutex_lock(&braid__hmem_mu);
    size_t have = h->pool_bytes;
    pthread_mutex_unlock(&braid__hmem_mu);
    if (need <= have)
        return BRAID_OK;
    size_t bytes = need > 2 * have ? need : 2 * have;
    struct braid_hmem_retired *old = calloc(1, sizeof(*old));
    if (!old)
        return braid__error(BRAID_ERR_NO_MEMORY, "rank %d: out of memory growing the cuda staging pool", pg->rank);
    void *half[2] = {NULL, NULL};
    cudaError_t err = cudaHostAlloc(&half[0], bytes, cudaHostAllocDefault);
    if (err == cudaSuccess)
        err = cudaHostAlloc(&half[1], bytes, cudaHostAllocDefault);
    if (err != cudaSuccess) {
        (void)cudaGetLastError();
        if (half[0])
            (void)cudaFreeHost(half[0]);
        free(old);
        return braid__error(BRAID_ERR_NO_MEMORY, "rank %d: cannot grow the cuda staging pool to 2 x %zu pinned bytes: %s",
                            pg->rank, bytes, cudaGetErrorString(err));
    }
    pthread_mutex_lock(&braid__hmem_mu);
    if (h->pool_bytes >= need) { /* another thread grew it meanwhile */
        old->half[0] = half[0];
        old->half[1] = half[1];
    } else {
        old->half[0] = h->pool[0];
        old->half[1] = h->pool[1];
        h->pool[0] = half[0];
        h->pool[1] = half[1];
        h->pool_bytes = bytes;
    }
    old->next = h->retired;
    h->retired = old;
    pthread_mutex_unlock(&braid__hmem_mu);
    return BRAID_OK;
}
