/* Shared internals of braid's NCCL shim (libnccl.so.2). The shim is a thin
 * translation layer over braid.h: handles, argument mapping, NCCL's group
 * and error conventions. Every failure leaves a sentence in this thread's
 * ncclGetLastError text and returns an NCCL code; nothing unsupported is
 * silently approximated. */
#ifndef BRAID_NCCL_INTERNAL_H
#define BRAID_NCCL_INTERNAL_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>

#include "braid.h"
#include "nccl.h"

#if defined(__GNUC__)
#define NCCL_API __attribute__((visibility("default")))
#else
#define NCCL_API
#endif

/* A PreMulSum operator (ncclRedOpCreatePreMulSum), per communicator. */
typedef struct {
    int used;
    ncclDataType_t dtype;
    ncclScalarResidence_t residence;
    const void *scalar_ptr;  /* ncclScalarDevice: read at each call */
    unsigned char scalar[8]; /* ncclScalarHostImmediate: read at creation */
} nccl_premul;

struct ncclComm {
    braid_pg *pg; /* NULL until init completes (deferred in a group) */
    int rank, nranks, cuda_dev;
    ncclResult_t init_result; /* ncclInProgress while a deferred init waits for ncclGroupEnd */
    char init_error[512];
    ncclUniqueId id; /* for a deferred init */
    braid_config cfg;
    char transports[16]; /* cfg.transports points here */
    int finalized;
    /* Calls (and open groups) using pg right now; ncclCommAbort, which may
     * come from a watchdog thread, aborts pg and waits for them to leave
     * before freeing it. */
    atomic_int inflight;
    atomic_int aborting;

    pthread_mutex_t mu; /* guards redops */
    nccl_premul *redops;
    int nredops;
};

/* ---- errors (nccl_error.c) ---- */

/* Set this thread's ncclGetLastError text, print it when NCCL_DEBUG asks
 * for warnings, and return code. */
ncclResult_t nccl__fail(ncclResult_t code, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* Translate a braid failure: its text becomes the last error, prefixed
 * with the NCCL call it came from. */
ncclResult_t nccl__from_braid(braid_status st, const char *call);

/* NCCL code for a braid status. */
ncclResult_t nccl__result_of(braid_status st);

/* ---- communicators (nccl_comm.c) ---- */

/* The device the calling thread's CUDA context is on, or -1 (nccl_mem.c). */
int nccl__current_device(void);

/* NULL comm, pending or failed init: the code to return (text set). */
ncclResult_t nccl__comm_check(ncclComm_t comm, const char *call);

/* Mark comm in use by a call; fails (text set) if comm is NULL or being
 * aborted. Every successful enter is paired with one leave. */
ncclResult_t nccl__comm_enter(ncclComm_t comm, const char *call);
void nccl__comm_leave(ncclComm_t comm);

/* Run a deferred init now (group end); returns its result. */
ncclResult_t nccl__comm_init_run(ncclComm_t comm);

/* Run several deferred inits at once, one thread each, since each blocks
 * until all ranks of its clique have joined. First failure wins. */
ncclResult_t nccl__comm_init_run_all(ncclComm_t *comms, int n);

/* ---- groups (nccl_group.c) ---- */

/* 1 while this thread is inside ncclGroupStart/End. */
int nccl__group_active(void);

/* Inside a group: make sure comm's braid group is open (first use). */
ncclResult_t nccl__group_join(ncclComm_t comm);

/* Inside a group: init of comm deferred to ncclGroupEnd. */
ncclResult_t nccl__group_defer_init(ncclComm_t comm);

/* Inside a group: free p (scratch a recorded call reads) when the group
 * completes. On failure p is the caller's to free. */
ncclResult_t nccl__group_keep(void *p);

/* ---- memory and streams (nccl_mem.c) ---- */

/* Fail with ncclInvalidUsage when p is CUDA device memory: this build
 * moves host memory only. */
ncclResult_t nccl__check_host(const void *p, const char *what, const char *call);

/* Order a host-memory operation after the work queued on stream: wait for
 * it (NULL: nothing to wait for). */
ncclResult_t nccl__stream_sync(cudaStream_t stream, const char *call);

/* Copy a PreMulSum scalar of `bytes` from host or device memory. */
ncclResult_t nccl__read_scalar(void *dst, const void *src, size_t bytes, const char *call);

/* ---- operators and types (nccl_redop.c) ---- */

/* Map a datatype; `reducing` with op: unsigned 32/64-bit types reduce
 * only where two's complement gives the same bits (sum, prod, pre-mul sum). */
ncclResult_t nccl__map_dtype(ncclDataType_t t, int reducing, ncclRedOp_t op, braid_dtype *out, const char *call);

/* A built-in op, or a PreMulSum of comm: then premul gets a copy of it
 * (used = 1, scalar read now) and *out is SUM; else premul->used = 0. */
ncclResult_t nccl__map_op(ncclComm_t comm, ncclRedOp_t op, ncclDataType_t t, braid_op *out, nccl_premul *premul,
                          const char *call);

/* dst[i] = src[i] * scalar in dtype t, rounded once (dst may equal src). */
void nccl__premul_scale(const nccl_premul *pm, braid_dtype t, void *dst, const void *src, size_t count);

#endif
