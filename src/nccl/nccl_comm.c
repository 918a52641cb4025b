/* Communicators: one braid process group each.
 *
 * ncclCommInitRank blocks until every rank has joined, as in NCCL. Inside
 * a group the join is deferred to ncclGroupEnd, which runs all of the
 * group's joins at once (one thread each): that is how one thread creates
 * several communicators of one clique (ncclCommInitAll is exactly that, as
 * in NCCL). ncclCommSplit (nccl_split.c) rendezvouses over the parent communicator. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "log.h"
#include "nccl_internal.h"

_Static_assert(sizeof(ncclUniqueId) == sizeof(braid_unique_id_t), "ncclUniqueId carries a braid unique id");

NCCL_API ncclResult_t ncclGetVersion(int *version)
{
    if (!version)
        return nccl__fail(ncclInvalidArgument, "ncclGetVersion: version is NULL");
    *version = NCCL_VERSION_CODE;
    return ncclSuccess;
}

NCCL_API ncclResult_t ncclGetUniqueId(ncclUniqueId *uniqueId)
{
    if (!uniqueId)
        return nccl__fail(ncclInvalidArgument, "ncclGetUniqueId: uniqueId is NULL");
    braid_unique_id_t id;
    braid_status st = braid_unique_id(&id);
    if (st != BRAID_OK)
        return nccl__from_braid(st, "ncclGetUniqueId");
    memcpy(uniqueId, &id, sizeof(id));
    return ncclSuccess;
}

static void comm_free(ncclComm_t comm)
{
    pthread_mutex_destroy(&comm->mu);
    pthread_mutex_destroy(&comm->inflight_mu);
    pthread_cond_destroy(&comm->settled);
    free(comm->ids);
    free(comm->redops);
    free(comm);
}

/* The configuration: braid's transport from netName, the blocking mode,
 * and the name that error texts carry. */
static ncclResult_t apply_config(ncclComm_t comm, const ncclConfig_t *config, const char *call)
{
    braid_config cfg = BRAID_CONFIG_INIT;
    comm->cfg = cfg;
    comm->transports[0] = '\0';
    ncclResult_t r = nccl__config_read(config, &comm->conf, call);
    if (r != ncclSuccess)
        return r;
    if (comm->conf.net[0]) {
        snprintf(comm->transports, sizeof(comm->transports), "%s", comm->conf.net);
        comm->cfg.transports = comm->transports;
    }
    return ncclSuccess;
}

/* "rank 1 of 4" or "rank 1 of 4 (commName)": how texts name comm. */
static void set_label(ncclComm_t comm)
{
    if (comm->conf.name[0])
        snprintf(comm->label, sizeof(comm->label), "rank %d of %d (%s)", comm->rank, comm->nranks, comm->conf.name);
    else
        snprintf(comm->label, sizeof(comm->label), "rank %d of %d", comm->rank, comm->nranks);
}

ncclResult_t nccl__comm_init_run(ncclComm_t comm)
{
    braid_pg *pg;
    int chosen = 0;
    nccl__dev_attach(comm); /* on this thread, which may be a deferred init's */
    if (comm->ids) {
        comm->init_result = nccl__scalable_pick(comm, &chosen);
        if (comm->init_result != ncclSuccess) {
            snprintf(comm->init_error, sizeof(comm->init_error), "%s", ncclGetLastError(NULL));
            return comm->init_result;
        }
        comm->id = comm->ids[chosen];
    }
    braid_status st = braid_pg_init(&pg, comm->rank, comm->nranks, (const braid_unique_id_t *)&comm->id, &comm->cfg);
    if (st != BRAID_OK) {
        char call[200];
        snprintf(call, sizeof(call), "%s: %s", comm->ids ? "ncclCommInitRankScalable" : "ncclCommInitRank",
                 comm->label);
        comm->init_result = nccl__from_braid(st, call);
        snprintf(comm->init_error, sizeof(comm->init_error), "%s", ncclGetLastError(NULL));
        return comm->init_result;
    }
    comm->pg = pg;
    comm->init_result = ncclSuccess;
    BRAID_INFO("%s: communicator created", comm->label);
    return ncclSuccess;
}

static void *init_main(void *arg)
{
    nccl__comm_init_run(arg);
    return NULL;
}

/* Nonblocking init: runs on its own thread; nccl__comm_settle joins it. */
static void *init_async_main(void *arg)
{
    ncclComm_t comm = arg;
    nccl__comm_init_run(comm);
    if (comm->init_result != ncclSuccess)
        nccl__fail(comm->init_result, "%s", comm->init_error); /* for this thread's log */
    atomic_store(&comm->init_done, 1);
    return NULL;
}

/* Waits happen outside comm->mu, so that ncclCommGetAsyncError from a
 * watchdog thread never queues behind a running init or collective: the
 * init thread is joined only once it has finished, and the pending call
 * is claimed (settling) before it is waited for. */
ncclResult_t nccl__comm_settle(ncclComm_t comm, int wait)
{
    if (atomic_load(&comm->init_started) && !atomic_load(&comm->init_done)) {
        if (!wait)
            return ncclInProgress;
        struct timespec ms = {0, 1000000};
        while (!atomic_load(&comm->init_done))
            nanosleep(&ms, NULL);
    }
    pthread_mutex_lock(&comm->mu);
    if (atomic_load(&comm->init_started)) {
        pthread_join(comm->init_thread, NULL); /* finished: returns at once */
        atomic_store(&comm->init_started, 0);
    }
    if (comm->init_result != ncclSuccess) {
        ncclResult_t r = nccl__fail(comm->init_result == ncclInProgress ? ncclInvalidUsage : comm->init_result,
                                    "%s", comm->init_error);
        pthread_mutex_unlock(&comm->mu);
        return r;
    }
    /* A call another thread is settling: in progress until it is done. */
    while (comm->settling) {
        if (!wait) {
            pthread_mutex_unlock(&comm->mu);
            return ncclInProgress;
        }
        pthread_cond_wait(&comm->settled, &comm->mu);
    }
    braid_work *pending = comm->pending;
    if (!pending) {
        pthread_mutex_unlock(&comm->mu);
        return ncclSuccess;
    }
    int done = 1;
    if (!wait)
        braid_test(pending, &done);
    if (!done) {
        pthread_mutex_unlock(&comm->mu);
        return ncclInProgress;
    }
    nccl_op op = comm->pending_op;
    comm->settling = 1;
    pthread_mutex_unlock(&comm->mu);

    ncclResult_t r = nccl__exec_finish(pending, &op, 1);

    pthread_mutex_lock(&comm->mu);
    comm->pending = NULL;
    comm->settling = 0;
    int none = ncclSuccess;
    if (r != ncclSuccess && atomic_compare_exchange_strong(&comm->async_error, &none, (int)r))
        snprintf(comm->async_text, sizeof(comm->async_text), "%s", ncclGetLastError(NULL));
    pthread_cond_broadcast(&comm->settled);
    pthread_mutex_unlock(&comm->mu);
    return r;
}

ncclResult_t nccl__comm_init_run_all(ncclComm_t *comms, int n)
{
    if (n == 1)
        return nccl__comm_init_run(comms[0]);
    pthread_t *threads = calloc((size_t)n, sizeof(*threads));
    if (!threads)
        return nccl__fail(ncclSystemError, "ncclGroupEnd: out of memory for %d communicator inits", n);
    int started = 0;
    ncclResult_t r = ncclSuccess;
    for (; started < n; started++) {
        if (pthread_create(&threads[started], NULL, init_main, comms[started]) != 0) {
            r = nccl__fail(ncclSystemError, "ncclGroupEnd: cannot start a thread for communicator init %d of %d",
                           started, n);
            break;
        }
    }
    for (int i = 0; i < started; i++)
        pthread_join(threads[i], NULL);
    free(threads);
    for (int i = started; i < n; i++)
        comms[i]->init_result = r; /* never started: the clique cannot form */
    if (r != ncclSuccess)
        return r;
    for (int i = 0; i < n; i++)
        if (comms[i]->init_result != ncclSuccess)
            return nccl__fail(comms[i]->init_result, "%s", comms[i]->init_error);
    return ncclSuccess;
}

ncclResult_t nccl__comm_init(ncclComm_t *out, int nranks, const ncclUniqueId *id, int nids, int rank,
                             const ncclConfig_t *config, const struct ncclComm *inherit, const char *call)
{
    if (!out)
        return nccl__fail(ncclInvalidArgument, "%s: comm is NULL", call);
    if (nranks < 1 || rank < 0 || rank >= nranks)
        return nccl__fail(ncclInvalidArgument, "%s: rank %d / nranks %d out of range", call, rank, nranks);
    ncclComm_t comm = calloc(1, sizeof(*comm));
    if (!comm)
        return nccl__fail(ncclSystemError, "%s: out of memory", call);
    pthread_mutex_init(&comm->mu, NULL);
    pthread_mutex_init(&comm->inflight_mu, NULL);
    pthread_cond_init(&comm->settled, NULL);
    comm->rank = rank;
    comm->nranks = nranks;
    comm->cuda_dev = nccl__current_device();
    comm->id = *id;
    if (nids > 0) { /* ncclCommInitRankScalable */
        comm->ids = malloc((size_t)nids * sizeof(*id));
        if (!comm->ids) {
            comm_free(comm);
            return nccl__fail(ncclSystemError, "%s: out of memory for %d unique ids", call, nids);
        }
        memcpy(comm->ids, id, (size_t)nids * sizeof(*id));
        comm->nids = nids;
    }
    ncclResult_t r = apply_config(comm, config, call);
    if (r == ncclSuccess && !config && inherit) {
        comm->cfg = inherit->cfg;
        comm->conf = inherit->conf;
        if (inherit->cfg.transports) {
            snprintf(comm->transports, sizeof(comm->transports), "%s", inherit->cfg.transports);
            comm->cfg.transports = comm->transports;
        }
    }
    if (r != ncclSuccess) {
        comm_free(comm);
        return r;
    }
    set_label(comm);
    if (nccl__group_active()) {
        comm->init_result = ncclInProgress;
        snprintf(comm->init_error, sizeof(comm->init_error), "%s: communicator of rank %d is created at ncclGroupEnd",
                 call, rank);
        if ((r = nccl__group_defer_init(comm)) != ncclSuccess) {
            comm_free(comm);
            return r;
        }
        *out = comm;
        return ncclSuccess;
    }
    if (!comm->conf.blocking) {
        /* NCCL's nonblocking init: return at once; ncclCommGetAsyncError
         * says ncclInProgress until the ranks have joined. */
        comm->init_result = ncclInProgress;
        snprintf(comm->init_error, sizeof(comm->init_error), "%s: %s: the communicator is still being created",
                 call, comm->label);
        atomic_store(&comm->init_started, 1);
        if (pthread_create(&comm->init_thread, NULL, init_async_main, comm) != 0) {
            comm_free(comm);
            return nccl__fail(ncclSystemError, "%s: %s: cannot start the init thread", call, comm->label);
        }
        *out = comm;
        return ncclInProgress;
    }
    if ((r = nccl__comm_init_run(comm)) != ncclSuccess) {
        comm_free(comm);
        return r;
    }
    *out = comm;
    return ncclSuccess;
}

NCCL_API ncclResult_t ncclCommInitRankConfig(ncclComm_t *comm, int nranks, ncclUniqueId commId, int rank,
                                             ncclConfig_t *config)
{
    return nccl__comm_init(comm, nranks, &commId, 0, rank, config, NULL, "ncclCommInitRankConfig");
}

NCCL_API ncclResult_t ncclCommInitRank(ncclComm_t *comm, int nranks, ncclUniqueId commId, int rank)
{
    return nccl__comm_init(comm, nranks, &commId, 0, rank, NULL, NULL, "ncclCommInitRank");
}

ncclResult_t nccl__comm_from_pg(braid_pg *pg, ncclComm_t parent, const ncclConfig_t *config, ncclComm_t *out,
                                const char *call)
{
    ncclComm_t comm = calloc(1, sizeof(*comm));
    if (!comm)
        return nccl__fail(ncclSystemError, "%s: out of memory", call);
    pthread_mutex_init(&comm->mu, NULL);
    pthread_mutex_init(&comm->inflight_mu, NULL);
    pthread_cond_init(&comm->settled, NULL);
    comm->rank = braid_pg_rank(pg);
    comm->nranks = braid_pg_size(pg);
    comm->cuda_dev = parent->cuda_dev;
    ncclResult_t r = config ? apply_config(comm, config, call) : ncclSuccess;
    if (r != ncclSuccess) {
        comm_free(comm);
        return r;
    }
    if (!config) {
        comm->cfg = parent->cfg;
        comm->conf = parent->conf;
        snprintf(comm->transports, sizeof(comm->transports), "%s", parent->transports);
        comm->cfg.transports = parent->cfg.transports ? comm->transports : NULL;
    }
    set_label(comm);
    comm->pg = pg;
    comm->init_result = ncclSuccess;
    *out = comm;
    return ncclSuccess;
}

/* NCCL spreads its bootstrap over several roots; braid has one store, so
 * the ranks meet at the first id whose store runs (nccl_scalable.c). */
NCCL_API ncclResult_t ncclCommInitRankScalable(ncclComm_t *newcomm, int nranks, int myrank, int nId,
                                               ncclUniqueId *commIds, ncclConfig_t *config)
{
    const char *call = "ncclCommInitRankScalable";
    if (nId < 1 || nId > nranks)
        return nccl__fail(ncclInvalidArgument, "%s: nId %d out of range [1, nranks %d]", call, nId, nranks);
    if (!commIds)
        return nccl__fail(ncclInvalidArgument, "%s: commIds is NULL", call);
    return nccl__comm_init(newcomm, nranks, commIds, nId, myrank, config, NULL, call);
}

NCCL_API ncclResult_t ncclCommInitAll(ncclComm_t *comm, int ndev, const int *devlist)
{
    if (!comm || ndev < 1)
        return nccl__fail(ncclInvalidArgument, "ncclCommInitAll: %s", !comm ? "comm is NULL" : "ndev must be >= 1");
    ncclUniqueId id;
    ncclResult_t r = ncclGetUniqueId(&id);
    if (r != ncclSuccess)
        return r;
    for (int i = 0; i < ndev; i++)
        comm[i] = NULL;
    ncclGroupStart();
    for (int i = 0; i < ndev && r == ncclSuccess; i++)
        if ((r = ncclCommInitRank(&comm[i], ndev, id, i)) == ncclSuccess)
            comm[i]->cuda_dev = devlist ? devlist[i] : i; /* its init (at the group's end) runs there */
    ncclResult_t end = ncclGroupEnd();
    if (r == ncclSuccess)
        r = end;
    for (int i = 0; i < ndev; i++) {
        if (r != ncclSuccess && comm[i]) {
            ncclCommDestroy(comm[i]);
            comm[i] = NULL;
        }
    }
    return r;
}

ncclResult_t nccl__comm_check(ncclComm_t comm, const char *call)
{
    if (!comm)
        return nccl__fail(ncclInvalidArgument, "%s: comm is NULL", call);
    /* Nonblocking communicator: its init and last call finish first. */
    if (!comm->conf.blocking) {
        ncclResult_t r = nccl__comm_settle(comm, 1);
        if (r != ncclSuccess)
            return r;
    }
    if (comm->init_result == ncclInProgress)
        return nccl__fail(ncclInvalidUsage, "%s: the communicator is created at ncclGroupEnd; use it after that", call);
    if (comm->init_result != ncclSuccess)
        return nccl__fail(ncclInvalidUsage, "%s: the communicator failed to initialise: %s", call, comm->init_error);
    return ncclSuccess;
}

NCCL_API ncclResult_t ncclCommFinalize(ncclComm_t comm)
{
    NCCL_ON_COMM(comm);
    ncclResult_t r = nccl__comm_check(comm, "ncclCommFinalize");
    if (r != ncclSuccess)
        return r;
    if (nccl__group_active() && nccl__group_forget(comm, 0, "ncclCommFinalize") != ncclSuccess)
        return ncclInvalidUsage;
    /* Host calls completed before they returned; device calls are flushed
     * here (their streams are released as they complete). */
    nccl__inflight_wait(comm);
    nccl__dev_finish_kernels(comm);
    comm->finalized = 1;
    ncclResult_t async = (ncclResult_t)atomic_load(&comm->async_error);
    if (async != ncclSuccess) {
        const char *text = comm->async_text[0] ? comm->async_text : "(no detail)";
        return nccl__fail(async, "ncclCommFinalize: an earlier call on device buffers failed: %s", text);
    }
    return ncclSuccess;
}

ncclResult_t nccl__comm_enter(ncclComm_t comm, const char *call)
{
    if (!comm)
        return nccl__fail(ncclInvalidArgument, "%s: comm is NULL", call);
    /* Count first, then look: an abort that raced past us waits for us. */
    atomic_fetch_add(&comm->inflight, 1);
    if (atomic_load(&comm->aborting)) {
        atomic_fetch_sub(&comm->inflight, 1);
        return nccl__fail(ncclInvalidUsage, "%s: the communicator is being aborted", call);
    }
    return ncclSuccess;
}

void nccl__comm_leave(ncclComm_t comm)
{
    atomic_fetch_sub(&comm->inflight, 1);
}

/* Stop new calls, make the running ones return (braid_pg_abort reaches
 * every blocked wait), and wait for them to leave. */
static void quiesce(ncclComm_t comm, int abort)
{
    atomic_store(&comm->aborting, 1);
    if (abort && comm->pg)
        braid_pg_abort(comm->pg);
    struct timespec ms = {0, 1000000};
    while (atomic_load(&comm->inflight) > 0)
        nanosleep(&ms, NULL);
}

static ncclResult_t comm_release(ncclComm_t comm, int abort, const char *call)
{
    if (!comm)
        return ncclSuccess;
    /* A nonblocking init is waited for (it ends at the latest at braid's
     * timeout); its failure leaves nothing to release but comm itself. */
    if (atomic_load(&comm->init_started))
        nccl__comm_settle(comm, 1);
    if (comm->init_result == ncclInProgress)
        return nccl__fail(ncclInvalidUsage, "%s: the communicator is still to be created at ncclGroupEnd", call);
    /* Inside this thread's open group: abort drops the calls recorded on
     * comm, destroy is refused while there are any (as the group holds
     * comm until ncclGroupEnd, waiting for it here would never end). */
    if (nccl__group_active()) {
        ncclResult_t r = nccl__group_forget(comm, abort, call);
        if (r != ncclSuccess)
            return r;
    }
    /* Destroy lets the device calls already enqueued finish; abort makes
     * them fail at once (braid_pg_abort in quiesce). */
    if (!abort)
        nccl__inflight_wait(comm);
    quiesce(comm, abort);
    nccl__inflight_wait(comm); /* aborted above on abort: they end at once */
    if (comm->pending)
        nccl__comm_settle(comm, 1); /* a nonblocking call; aborted above on abort */
    if (comm->pg)
        braid_pg_destroy(comm->pg);
    comm_free(comm);
    return ncclSuccess;
}

NCCL_API ncclResult_t ncclCommDestroy(ncclComm_t comm)
{
    NCCL_ON_COMM(comm);
    return comm_release(comm, 0, "ncclCommDestroy");
}

NCCL_API ncclResult_t ncclCommAbort(ncclComm_t comm)
{
    NCCL_ON_COMM(comm);
    return comm_release(comm, 1, "ncclCommAbort");
}

NCCL_API ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t *asyncError)
{
    NCCL_ON_COMM(comm);
    if (!comm || !asyncError)
        return nccl__fail(ncclInvalidArgument, "ncclCommGetAsyncError: %s is NULL", !comm ? "comm" : "asyncError");
    /* Nonblocking init or call still running: ncclInProgress, as NCCL. */
    if (!comm->conf.blocking && nccl__comm_settle(comm, 0) == ncclInProgress) {
        *asyncError = ncclInProgress;
        return ncclSuccess;
    }
    if (comm->init_result != ncclSuccess) {
        *asyncError = comm->init_result;
        return ncclSuccess;
    }
    nccl__inflight_reap(comm); /* first: a failed call names itself */
    nccl__dev_poll_kernels(comm);
    ncclResult_t async = (ncclResult_t)atomic_load(&comm->async_error);
    if (async != ncclSuccess) {
        const char *text = comm->async_text[0] ? comm->async_text : "a call that returned before completing failed";
        nccl__fail(async, "%s", text); /* for ncclGetLastError */
        *asyncError = async;
        return ncclSuccess;
    }
    /* A revoked communicator is quiescent once revoke returned. */
    if (atomic_load(&comm->revoked)) {
        *asyncError = ncclSuccess;
        return ncclSuccess;
    }
    *asyncError = nccl__result_of(braid_pg_error(comm->pg));
    return ncclSuccess;
}

NCCL_API ncclResult_t ncclCommCount(const ncclComm_t comm, int *count)
{
    NCCL_ON_COMM(comm);
    if (!comm || !count)
        return nccl__fail(ncclInvalidArgument, "ncclCommCount: %s is NULL", !comm ? "comm" : "count");
    *count = comm->nranks;
    return ncclSuccess;
}

NCCL_API ncclResult_t ncclCommCuDevice(const ncclComm_t comm, int *device)
{
    NCCL_ON_COMM(comm);
    if (!comm || !device)
        return nccl__fail(ncclInvalidArgument, "ncclCommCuDevice: %s is NULL", !comm ? "comm" : "device");
    *device = comm->cuda_dev;
    return ncclSuccess;
}

NCCL_API ncclResult_t ncclCommUserRank(const ncclComm_t comm, int *rank)
{
    NCCL_ON_COMM(comm);
    if (!comm || !rank)
        return nccl__fail(ncclInvalidArgument, "ncclCommUserRank: %s is NULL", !comm ? "comm" : "rank");
    *rank = comm->rank;
    return ncclSuccess;
}

/* Registration lets NCCL map buffers for its GPU transports; braid's host
 * path needs none, so the handle only remembers what was registered. */
typedef struct {
    ncclComm_t comm;
    void *buff;
    size_t size;
} nccl_reg;

NCCL_API ncclResult_t ncclCommRegister(const ncclComm_t comm, void *buff, size_t size, void **handle)
{
    NCCL_ON_COMM(comm);
    ncclResult_t r = nccl__comm_check(comm, "ncclCommRegister");
    if (r != ncclSuccess)
        return r;
    if (!handle)
        return nccl__fail(ncclInvalidArgument, "ncclCommRegister: handle is NULL");
    nccl_reg *reg = malloc(sizeof(*reg));
    if (!reg)
        return nccl__fail(ncclSystemError, "ncclCommRegister: out of memory");
    *reg = (nccl_reg){comm, buff, size};
    *handle = reg;
    return ncclSuccess;
}

NCCL_API ncclResult_t ncclCommDeregister(const ncclComm_t comm, void *handle)
{
    NCCL_ON_COMM(comm);
    nccl_reg *reg = handle;
    if (!reg || reg->comm != comm)
        return nccl__fail(ncclInvalidArgument, "ncclCommDeregister: handle was not registered on this communicator");
    free(reg);
    return ncclSuccess;
}
