/* The CUDA build's per-group staging state, shared by the memory-staging
 * layer (hmem_cuda.c, which makes and frees it) and the device ring
 * (device_ring.c, which runs on it). Internal to cuda/. */
#ifndef BRAID_HMEM_CUDA_H
#define BRAID_HMEM_CUDA_H

#include <cuda_runtime_api.h>

#include "pg.h"
#include "status.h"

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

/* Return BRAID_ERR_CUDA from the calling function when a CUDA call fails. */
#define CUDA_CALL(call, what, rank)                                                            \
    do {                                                                                       \
        cudaError_t braid__ce = (call);                                                        \
        if (braid__ce != cudaSuccess) {                                                        \
            (void)cudaGetLastError();                                                          \
            return braid__error(BRAID_ERR_CUDA, "rank %d: cuda staging: %s failed: %s", (rank), \
                                (what), cudaGetErrorString(braid__ce));                        \
        }                                                                                      \
    } while (0)

/* All-reduce of device buffers as the device ring (device_ring.c), on the
 * group's executor, with pg->hmem made; the result is in coll->recv when
 * it returns BRAID_OK. */
braid_status braid__device_ring(braid_pg *pg, braid_coll *coll);

#endif
