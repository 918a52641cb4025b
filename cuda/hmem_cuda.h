/* The CUDA build's per-group staging state, shared by the memory-staging
 * layer (hmem_cuda.c, which makes and frees it) and the device ring
 * (device_ring.c, which runs on it). Internal to cuda/. */
#ifndef BRAID_HMEM_CUDA_H
#define BRAID_HMEM_CUDA_H

#include <pthread.h>

#include <cuda_runtime_api.h>

#include "pg.h"
#include "status.h"

/* Device ring windows: receives in flight (each owns a pinned and a
 * device slot until its data went up and, in the all-gather, was sent on)
 * and sends staged ahead of completion: the host ring's windows. */
#define DRING_RECV_SLOTS 4
#define DRING_SEND_SLOTS 8

/* A pool the group outgrew: kept until the group goes (a job may still
 * run on it). */
struct braid_hmem_retired {
    void *half[2];
    struct braid_hmem_retired *next;
};

/* Per-group staging state, made by the first device call. */
struct braid_hmem {
    int device;
    cudaStream_t d2h, h2d;
    cudaEvent_t down_done[2]; /* a step's inputs copied into pool[b] */
    cudaEvent_t up_done[2];   /* a step's results copied out of pool[b]: the half is free */
    /* Staging pool, two halves of pool_bytes pinned bytes (under init_mu):
     * grown by the submitting thread, never in place (hmem_cuda.c). */
    void *pool[2];
    size_t pool_bytes;
    struct braid_hmem_retired *retired;
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

/* Guards every group's staging-state creation, pool and job list. */
extern pthread_mutex_t braid__hmem_mu;

/* The group's staging state for device, made on first use (hmem_state.c).
 * One device per group: its streams and pinned buffers belong to it. */
braid_status braid__hmem_state_get(braid_pg *pg, int device, const char *op);

/* Make each pool half hold need bytes (hmem_state.c): by the submitting
 * thread, before the call's gates exist (cudaHostAlloc may wait for busy
 * blocking streams). A job running meanwhile keeps the pool it started
 * with: the old one is retired, not freed, until the group goes. */
braid_status braid__hmem_pool_reserve(braid_pg *pg, size_t need);

/* Group teardown: open the gates of the jobs not yet released and forget
 * them (hmem_cuda.c). */
void braid__hmem_jobs_orphan(struct braid_hmem *h);

/* The last error's text without its status name (a cause inside a wider
 * message). */
const char *braid__hmem_cause(void);

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

/* Bytes of each pool half that staging coll (one op, or a group) needs
 * (hmem_stage.c). */
braid_status braid__hmem_stage_need(const braid_pg *pg, braid_coll *coll, size_t *bytes);

/* Run coll (one op, or a group) staged in pieces through the pool's two
 * halves of pool_bytes each, on the executor, after the caller's streams
 * were waited for; the results are in device memory when it returns
 * BRAID_OK (hmem_stage.c). */
braid_status braid__hmem_stage(braid_pg *pg, braid_coll *coll, void *const pool[2], size_t pool_bytes);

#endif
