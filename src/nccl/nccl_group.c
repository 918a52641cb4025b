/* ncclGroupStart/End: a thread-local group spanning communicators.
 *
 * Calls inside a group are checked and recorded per communicator; nothing
 * runs and no buffer is touched until the outermost ncclGroupEnd (groups
 * nest by depth). That end first creates the communicators whose init was
 * deferred, then runs each communicator's calls as one batch
 * (nccl__exec_start: collectives in order, then every send and receive
 * together): a batch with device buffers goes to braid's device path and
 * completes on its streams; host batches of several
 * communicators are started together and waited for together, since one
 * thread driving several ranks of a clique would otherwise wait on
 * itself.
 *
 * A communicator is marked in use (nccl__comm_enter) from its first
 * recorded call to the end, so an abort from another thread waits for the
 * group; ncclCommAbort from this thread drops its calls instead, and
 * ncclCommDestroy from this thread is refused while calls are recorded
 * (nccl__group_forget). */
#include <stdlib.h>
#include <string.h>

#include "algo/algo.h"
#include "nccl_internal.h"

typedef struct {
    void **items;
    int n, cap;
} ptr_list;

/* One communicator's recorded calls. */
typedef struct {
    ncclComm_t comm;
    nccl_op *ops;
    int n, cap;
    int device; /* some call is on device memory */
} comm_batch;

typedef struct {
    int depth;
    comm_batch *batches; /* first use first */
    int nbatches, capbatches;
    ptr_list inits; /* ncclComm_t whose init waits for the end */
} group_state;

static _Thread_local group_state tls;

static int list_push(ptr_list *l, void *p)
{
    if (l->n == l->cap) {
        int cap = l->cap ? 2 * l->cap : 8;
        void **items = realloc(l->items, (size_t)cap * sizeof(*items));
        if (!items)
            return -1;
        l->items = items;
        l->cap = cap;
    }
    l->items[l->n++] = p;
    return 0;
}

static void list_clear(ptr_list *l)
{
    free(l->items);
    *l = (ptr_list){0};
}

int nccl__group_active(void)
{
    return tls.depth > 0;
}

static comm_batch *batch_of(ncclComm_t comm)
{
    for (int i = 0; i < tls.nbatches; i++)
        if (tls.batches[i].comm == comm)
            return &tls.batches[i];
    return NULL;
}

ncclResult_t nccl__group_record(ncclComm_t comm, const nccl_op *op)
{
    comm_batch *b = batch_of(comm);
    if (!b) {
        if (tls.nbatches == tls.capbatches) {
            int cap = tls.capbatches ? 2 * tls.capbatches : 4;
            comm_batch *grown = realloc(tls.batches, (size_t)cap * sizeof(*grown));
            if (!grown)
                return nccl__fail(ncclSystemError, "%s: out of memory recording the group", op->call);
            tls.batches = grown;
            tls.capbatches = cap;
        }
        /* The group uses the communicator until ncclGroupEnd. */
        ncclResult_t r = nccl__comm_enter(comm, op->call);
        if (r != ncclSuccess)
            return r;
        b = &tls.batches[tls.nbatches++];
        *b = (comm_batch){.comm = comm};
    }
    if (b->n == b->cap) {
        int cap = b->cap ? 2 * b->cap : 8;
        nccl_op *grown = realloc(b->ops, (size_t)cap * sizeof(*grown));
        if (!grown)
            return nccl__fail(ncclSystemError, "%s: out of memory recording the group", op->call);
        b->ops = grown;
        b->cap = cap;
    }
    b->ops[b->n++] = *op;
    b->device |= op->device;
    return ncclSuccess;
}

static void batch_drop(int i)
{
    comm_batch *b = &tls.batches[i];
    nccl__comm_leave(b->comm);
    free(b->ops);
    memmove(b, b + 1, (size_t)(tls.nbatches - i - 1) * sizeof(*b));
    tls.nbatches--;
}

ncclResult_t nccl__group_forget(ncclComm_t comm, int abort, const char *call)
{
    comm_batch *b = batch_of(comm);
    if (!b)
        return ncclSuccess;
    if (!abort)
        return nccl__fail(ncclInvalidUsage,
                          "%s inside a group that recorded %d call(s) on this communicator: they run at "
                          "ncclGroupEnd; destroy it after that, or ncclCommAbort it (drops them)",
                          call, b->n);
    batch_drop((int)(b - tls.batches));
    return ncclSuccess;
}

ncclResult_t nccl__group_defer_init(ncclComm_t comm)
{
    if (list_push(&tls.inits, comm) != 0)
        return nccl__fail(ncclSystemError, "ncclCommInitRank: out of memory");
    return ncclSuccess;
}

NCCL_API ncclResult_t ncclGroupStart(void)
{
    tls.depth++;
    return ncclSuccess;
}

/* Run every communicator's batch; returns the first failure. */
static ncclResult_t run_batches(void)
{
    int n = tls.nbatches;
    ncclResult_t r = ncclSuccess, e;
    if (n <= 0)
        return r;
    /* Device batches first: they only enqueue. */
    for (int i = 0; i < n; i++) {
        comm_batch *b = &tls.batches[i];
        if (b->device && (e = nccl__dev_submit(b->comm, b->ops, b->n)) != ncclSuccess && r == ncclSuccess)
            r = e;
    }
    int nhost = 0;
    for (int i = 0; i < n; i++)
        nhost += !tls.batches[i].device;
    if (nhost == 1) {
        for (int i = 0; i < n; i++) {
            comm_batch *b = &tls.batches[i];
            if (b->device)
                continue;
            if ((e = nccl__exec_start(b->comm, b->ops, b->n, NULL)) != ncclSuccess && r == ncclSuccess)
                r = e;
        }
        return r;
    }
    braid_work **works = calloc((size_t)n, sizeof(*works));
    if (!works && nhost)
        return nccl__fail(ncclSystemError, "ncclGroupEnd: out of memory for %d communicators", n);
    int *started = calloc((size_t)n, sizeof(*started));
    if (!started && nhost) {
        free(works);
        return nccl__fail(ncclSystemError, "ncclGroupEnd: out of memory for %d communicators", n);
    }
    for (int i = 0; i < n; i++) {
        comm_batch *b = &tls.batches[i];
        if (b->device)
            continue;
        e = nccl__exec_start(b->comm, b->ops, b->n, &works[i]);
        started[i] = e == ncclSuccess;
        if (e != ncclSuccess && r == ncclSuccess)
            r = e;
    }
    for (int i = 0; i < n; i++) {
        if (!started || !started[i])
            continue;
        comm_batch *b = &tls.batches[i];
        if ((e = nccl__exec_finish(works[i], b->ops, b->n)) != ncclSuccess && r == ncclSuccess)
            r = e;
    }
    free(works);
    free(started);
    return r;
}

double nccl__op_estimate_us(ncclComm_t comm, const nccl_op *op)
{
    return braid__estimate_us(comm->pg, op->kind, op->count * braid_dtype_size(op->dtype));
}

/* Microseconds the recorded batches would take: each communicator's calls
 * one after another, communicators side by side (their ranks progress
 * together at the end), so the slowest communicator's sum. */
static double estimate_batches(void)
{
    double worst = 0;
    for (int i = 0; i < tls.nbatches; i++) {
        comm_batch *b = &tls.batches[i];
        double sum = 0;
        for (int k = 0; k < b->n; k++)
            sum += nccl__op_estimate_us(b->comm, &b->ops[k]);
        if (sum > worst)
            worst = sum;
    }
    return worst;
}

/* The outermost end: deferred inits, then the batches run (simulate = 0)
 * or are only estimated (*estimate_us), and the group state is reset. */
static ncclResult_t group_finish(int simulate, double *estimate_us)
{
    ncclResult_t r = ncclSuccess;
    if (tls.inits.n)
        r = nccl__comm_init_run_all((ncclComm_t *)tls.inits.items, tls.inits.n);
    if (tls.nbatches && simulate) {
        *estimate_us = estimate_batches();
    } else if (tls.nbatches) {
        ncclResult_t e = run_batches();
        if (r == ncclSuccess)
            r = e;
    }
    while (tls.nbatches)
        batch_drop(tls.nbatches - 1);
    free(tls.batches);
    tls.batches = NULL;
    tls.capbatches = 0;
    list_clear(&tls.inits);
    return r;
}

NCCL_API ncclResult_t ncclGroupEnd(void)
{
    if (tls.depth == 0)
        return nccl__fail(ncclInvalidUsage, "ncclGroupEnd without ncclGroupStart on this thread");
    if (--tls.depth > 0)
        return ncclSuccess;
    double unused = 0;
    return group_finish(0, &unused);
}

#define SIM_INFO_MAGIC 0x74685283u

/* NCCL's simulated end: the group closes as at ncclGroupEnd, but its calls
 * are dropped unrun and simInfo gets their estimated time. simInfo is read
 * like ncclConfig_t: at most `size` bytes, magic checked. */
NCCL_API ncclResult_t ncclGroupSimulateEnd(ncclSimInfo_t *simInfo)
{
    const char *call = "ncclGroupSimulateEnd";
    ncclSimInfo_t info = NCCL_SIM_INFO_INITIALIZER;
    if (simInfo) {
        size_t size;
        memcpy(&size, simInfo, sizeof(size));
        if (size > sizeof(info))
            size = sizeof(info);
        info.magic = 0;
        memcpy(&info, simInfo, size);
        if (info.magic != SIM_INFO_MAGIC)
            return nccl__fail(ncclInvalidArgument,
                              "%s: simInfo was not initialised with NCCL_SIM_INFO_INITIALIZER (magic 0x%x)", call,
                              info.magic);
    }
    if (tls.depth == 0)
        return nccl__fail(ncclInvalidUsage, "%s without ncclGroupStart on this thread", call);
    if (--tls.depth > 0)
        return ncclSuccess;
    double us = 0;
    ncclResult_t r = group_finish(1, &us);
    if (r == ncclSuccess && simInfo)
        simInfo->estimatedTime = (float)us;
    return r;
}
