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
#include "algo/coll.h"
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

/* One checked call, as recorded: run at once or at ncclGroupEnd, on host
 * memory or on braid's device path. Buffers are the caller's until it runs. */
typedef struct {
    braid_coll_kind kind; /* ALLREDUCE ... RECV, ALLTOALL, GATHER, SCATTER */
    const char *call; /* "ncclAllReduce" ... */
    const void *send; /* NULL where the call reads nothing */
    void *recv;       /* NULL where the call writes nothing */
    size_t count;     /* NCCL's count: per rank for all-gather, reduce-scatter, all-to-all, gather, scatter */
    braid_dtype dtype;
    braid_op op;
    nccl_premul pm;   /* pm.used: op is BRAID_MULSUM with pm.scalar */
    int root;         /* root, or peer of a send/receive */
    cudaStream_t stream;
    braid_mem send_mem, recv_mem; /* classified once, at the call (buffers() in nccl_coll.c) */
    int device;       /* 1: send or recv is CUDA device (or managed) memory */
} nccl_op;

/* What braid takes from an ncclConfig_t (nccl_config.c). */
typedef struct {
    int blocking;        /* 1 unless the config said 0 */
    char net[16];        /* braid transport list ("tcp", "verbs"), "" for automatic */
    char name[128];      /* commName, "" when none */
} nccl_comm_config;

struct ncclComm {
    braid_pg *pg; /* NULL until init completes (deferred in a group) */
    int rank, nranks, cuda_dev;
    ncclResult_t init_result; /* ncclInProgress while a deferred init waits for ncclGroupEnd */
    char init_error[512];
    ncclUniqueId id; /* for a deferred init */
    ncclUniqueId *ids; /* ncclCommInitRankScalable: nids ids to choose from (nccl_scalable.c), else NULL */
    int nids;
    braid_config cfg;
    char transports[16]; /* cfg.transports points here */
    nccl_comm_config conf;
    char label[160]; /* "rank 2 of 4 (commName)" in error texts */
    int finalized;
    atomic_int revoked; /* ncclCommRevoke: only destroy, abort and shrink remain */

    /* Nonblocking init (config blocking = 0): runs on init_thread, which
     * sets init_done; init_result is ncclInProgress until joined. */
    pthread_t init_thread;
    atomic_int init_started, init_done;

    /* Nonblocking host call in flight: returned ncclInProgress, completed
     * by ncclCommGetAsyncError or the next call. Guarded by mu. */
    braid_work *pending;
    nccl_op pending_op;
    int settling;            /* a thread waits for pending outside mu */
    pthread_cond_t settled;  /* settling went back to 0 */
    char async_text[512]; /* text of the first such call's failure */
    /* Calls (and open groups) using pg right now; ncclCommAbort, which may
     * come from a watchdog thread, aborts pg and waits for them to leave
     * before freeing it. */
    atomic_int inflight;
    atomic_int aborting;

    pthread_mutex_t mu; /* guards redops */
    nccl_premul *redops;
    int nredops;

    /* Device calls braid runs after they returned (nccl_inflight.c), under
     * inflight_mu. */
    pthread_mutex_t inflight_mu;
    struct nccl_inflight *inflight_works;
    int ninflight_works;
    /* First failure of work that ran after its call returned (device
     * calls): ncclCommGetAsyncError reports it. */
    atomic_int async_error;
};

/* ---- errors (nccl_error.c) ---- */

/* The communicator a public call is on, for the length of the call: every
 * failure text set meanwhile carries its commName (config.commName), so
 * that a program with several communicators can tell whose call failed.
 * Scopes nest (a call made from another restores the outer one). */
typedef struct nccl_scope {
    struct nccl_scope *prev;
    char name[128]; /* commName, "" when none */
} nccl_scope;
void nccl__scope_enter(nccl_scope *s, const struct ncclComm *comm);
void nccl__scope_leave(nccl_scope *s);
#define NCCL_ON_COMM(comm)                                                                                             \
    nccl_scope nccl__scope_ __attribute__((cleanup(nccl__scope_leave)));                                               \
    nccl__scope_enter(&nccl__scope_, (comm))

/* Set this thread's ncclGetLastError text, print it when NCCL_DEBUG asks
 * for warnings, and return code. */
ncclResult_t nccl__fail(ncclResult_t code, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* Translate a braid failure: its text becomes the last error, prefixed
 * with the NCCL call it came from. */
ncclResult_t nccl__from_braid(braid_status st, const char *call);

/* NCCL code for a braid status. */
ncclResult_t nccl__result_of(braid_status st);

/* ---- configuration (nccl_config.c) ---- */

/* Read config (NULL: defaults) the way NCCL 2.28 does: `size` bytes of it
 * at most, the fields that existed at its `version`, magic checked, every
 * field range-checked. Fails with ncclInvalidArgument (text set). */
ncclResult_t nccl__config_read(const ncclConfig_t *config, nccl_comm_config *out, const char *call);

/* ---- communicators (nccl_comm.c) ---- */

/* Finish a nonblocking init and a nonblocking call still in flight on
 * comm; returns the first failure (text set), ncclSuccess when none. With
 * wait = 0, ncclInProgress while either is still running. */
ncclResult_t nccl__comm_settle(ncclComm_t comm, int wait);

/* The device the calling thread's CUDA context is on, or -1 (nccl_mem.c). */
int nccl__current_device(void);

/* NULL comm, pending or failed init: the code to return (text set). */
ncclResult_t nccl__comm_check(ncclComm_t comm, const char *call);

/* Mark comm in use by a call; fails (text set) if comm is NULL or being
 * aborted. Every successful enter is paired with one leave. */
ncclResult_t nccl__comm_enter(ncclComm_t comm, const char *call);
void nccl__comm_leave(ncclComm_t comm);

/* Make a communicator and join it (deferred to ncclGroupEnd inside a
 * group): nids ids as ncclCommInitRankScalable takes them, configuration
 * from config, else from inherit (a split's parent), else defaults. */
ncclResult_t nccl__comm_init(ncclComm_t *out, int nranks, const ncclUniqueId *id, int nids, int rank,
                             const ncclConfig_t *config, const struct ncclComm *inherit, const char *call);

/* Wrap pg (which it then owns) in a new communicator: configuration from
 * config, or parent's when NULL (ncclCommShrink). */
ncclResult_t nccl__comm_from_pg(braid_pg *pg, ncclComm_t parent, const ncclConfig_t *config, ncclComm_t *out,
                                const char *call);

/* ncclCommInitRankScalable: the index of comm->ids the ranks meet at
 * (nccl_scalable.c); ncclRemoteError (text names each id and why) when
 * none can be used. */
ncclResult_t nccl__scalable_pick(ncclComm_t comm, int *chosen);

/* Run a deferred init now (group end); returns its result. */
ncclResult_t nccl__comm_init_run(ncclComm_t comm);

/* Run several deferred inits at once, one thread each, since each blocks
 * until all ranks of its clique have joined. First failure wins. */
ncclResult_t nccl__comm_init_run_all(ncclComm_t *comms, int n);

/* ---- groups (nccl_group.c) ---- */

/* braid's estimate, in microseconds, of how long op takes on comm
 * (ncclGroupSimulateEnd). */
double nccl__op_estimate_us(ncclComm_t comm, const nccl_op *op);

/* 1 while this thread is inside ncclGroupStart/End. */
int nccl__group_active(void);

/* Inside a group: record op (checked) for comm; it runs at the outermost
 * ncclGroupEnd. */
ncclResult_t nccl__group_record(ncclComm_t comm, const nccl_op *op);

/* ncclCommDestroy/ncclCommAbort/ncclCommFinalize of a communicator inside
 * this thread's open group. ncclSuccess when the group recorded nothing on
 * it. Else abort: drop its recorded calls and release it from the group
 * (ncclSuccess); not abort: ncclInvalidUsage (text set), group unchanged. */
ncclResult_t nccl__group_forget(ncclComm_t comm, int abort, const char *call);

/* Inside a group: init of comm deferred to ncclGroupEnd. */
ncclResult_t nccl__group_defer_init(ncclComm_t comm);

/* ---- running calls on host memory (nccl_exec.c) ---- */

/* Bytes op reads from send and writes to recv on this rank (0 for a
 * buffer the call does not use here). */
size_t nccl__op_send_bytes(const nccl_op *op, int rank, int nranks);
size_t nccl__op_recv_bytes(const nccl_op *op, int rank, int nranks);

/* Start ops on comm: one call alone as it is, several as one braid group
 * with the collectives in issue order, then every send and receive
 * progressed together, as NCCL schedules a group. Ops on device buffers
 * run on their streams (braid's device path). work == NULL blocks; else
 * *work is the handle (NULL when nothing was started) and
 * nccl__exec_finish must follow (or, for device ops, nccl__inflight_add). */
ncclResult_t nccl__exec_start(ncclComm_t comm, nccl_op *ops, int n, braid_work **work);

/* Wait for work (may be NULL). */
ncclResult_t nccl__exec_finish(braid_work *work, nccl_op *ops, int n);

/* ---- device buffers (nccl_dev.c; nccl_dev_stub.c without CUDA) ---- */

/* Fail with ncclInvalidUsage when p is device memory this build cannot
 * move (built without CUDA); ncclSuccess otherwise. */
ncclResult_t nccl__dev_check(const void *p, const char *what, const char *call);

/* Hand ops (n >= 1, at least one on device memory) to braid's device
 * path: ordered after the work queued on each op's stream before this
 * call, and each of those streams waits for them. Returns once queued;
 * the work handle is kept (nccl_inflight.c). */
ncclResult_t nccl__dev_submit(ncclComm_t comm, nccl_op *ops, int n);

/* A device broadcast's root with its input apart from its output: copy it
 * there on the op's stream (braid broadcasts in place), ordered before
 * braid's call. */
ncclResult_t nccl__dev_root_copy(const nccl_op *op);

/* braid's own device path (nccl_dev_engine.c): whether it takes the batch
 * (an all-reduce or broadcast outside a group), and hand the one op to it
 * on the calling thread's device; returns once queued. */
int nccl__engine_takes(const nccl_op *ops, int n);
ncclResult_t nccl__engine_submit(ncclComm_t comm, const nccl_op *op);

/* A device-collective kernel that gave up (BRAID_DEVCOLL=1) becomes the
 * communicator's asynchronous error (ncclRemoteError), once. */
void nccl__dev_poll_kernels(ncclComm_t comm);

/* Wait for comm's device-collective kernels to end, then poll them
 * (ncclCommFinalize: their calls completed when queued). */
void nccl__dev_finish_kernels(ncclComm_t comm);

/* Before comm's group is made, on the thread that makes it: make comm's
 * device current (comm->cuda_dev: the creating thread's context's device,
 * or ncclCommInitAll's devlist entry), which makes its primary context, as
 * NCCL binds a communicator to a device at init. braid then sets up its
 * device state (pinned staging) at group creation, before any stream of
 * the group can be held, and a deferred init runs on that device. Nothing
 * without CUDA, a device, or a device for comm (a thread with no context:
 * host-only programs stay CUDA-free, and braid decides at the first device
 * call). */
void nccl__dev_attach(ncclComm_t comm);

/* ---- device calls in flight on braid's engine (nccl_inflight.c) ---- */

/* Keep work (may be NULL: nothing to keep), the handle of a device call
 * that returned before completing. */
ncclResult_t nccl__inflight_add(ncclComm_t comm, braid_work *work, const char *call);

/* Free the finished ones; the first failure becomes comm's async error. */
void nccl__inflight_reap(ncclComm_t comm);

/* Wait for every one (finalize, destroy, split, shrink), then as reap. */
void nccl__inflight_wait(ncclComm_t comm);

/* ---- memory and streams (nccl_mem.c) ---- */

/* Fail with ncclInvalidUsage when p is CUDA device memory: used where
 * this build has no device path (driver probe, no CUDA in the build). */
ncclResult_t nccl__check_host(const void *p, const char *what, const char *call);

/* Order a host-memory operation after the work queued on stream: wait for
 * it (NULL: nothing to wait for). */
ncclResult_t nccl__stream_sync(cudaStream_t stream, const char *call);

/* Copy a PreMulSum scalar of `bytes` from host or device memory. */
ncclResult_t nccl__read_scalar(void *dst, const void *src, size_t bytes, const char *call);

/* ---- operators and types (nccl_redop.c) ---- */

/* Map a datatype; `reducing`: fp8 is ncclInvalidUsage (braid moves it as
 * bytes but has no fp8 arithmetic); an invalid datatype is
 * ncclInvalidArgument. */
ncclResult_t nccl__map_dtype(ncclDataType_t t, int reducing, braid_dtype *out, const char *call);

/* A built-in op, or a PreMulSum of comm: then premul gets a copy of it
 * (used = 1, scalar read now) and *out is BRAID_MULSUM; else premul->used = 0. */
ncclResult_t nccl__map_op(ncclComm_t comm, ncclRedOp_t op, ncclDataType_t t, braid_op *out, nccl_premul *premul,
                          const char *call);


#endif
