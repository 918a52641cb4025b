/* ncclGroupStart/End: a thread-local group spanning communicators.
 *
 * Each communicator used inside the group gets a braid group (opened on
 * first use), so its calls are recorded by braid itself. The outermost
 * ncclGroupEnd first creates the communicators whose init was deferred,
 * then ends every braid group: one alone runs inline; several run
 * concurrently on their groups' progress threads and are waited for
 * together, since one thread driving several ranks of a clique would
 * otherwise wait on itself. */
#include <stdlib.h>

#include "nccl_internal.h"

typedef struct {
    void **items;
    int n, cap;
} ptr_list;

typedef struct {
    int depth;
    ptr_list comms; /* ncclComm_t with an open braid group, first use first */
    ptr_list inits; /* ncclComm_t whose init waits for the end */
    ptr_list frees; /* scratch to free when the group completes */
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

ncclResult_t nccl__group_join(ncclComm_t comm)
{
    for (int i = 0; i < tls.comms.n; i++)
        if (tls.comms.items[i] == comm)
            return ncclSuccess;
    /* The open group uses the communicator until ncclGroupEnd. */
    ncclResult_t r = nccl__comm_enter(comm, "ncclGroupStart");
    if (r != ncclSuccess)
        return r;
    braid_status st = braid_group_start(comm->pg);
    if (st != BRAID_OK) {
        nccl__comm_leave(comm);
        return nccl__from_braid(st, "ncclGroupStart");
    }
    if (list_push(&tls.comms, comm) != 0) {
        braid_group_end(comm->pg, NULL); /* empty: runs nothing */
        nccl__comm_leave(comm);
        return nccl__fail(ncclSystemError, "ncclGroupStart: out of memory");
    }
    return ncclSuccess;
}

ncclResult_t nccl__group_defer_init(ncclComm_t comm)
{
    if (list_push(&tls.inits, comm) != 0)
        return nccl__fail(ncclSystemError, "ncclCommInitRank: out of memory");
    return ncclSuccess;
}

ncclResult_t nccl__group_keep(void *p)
{
    if (list_push(&tls.frees, p) != 0)
        return nccl__fail(ncclSystemError, "ncclGroupEnd: out of memory");
    return ncclSuccess;
}

NCCL_API ncclResult_t ncclGroupStart(void)
{
    tls.depth++;
    return ncclSuccess;
}

/* End every communicator's braid group; returns the first failure. */
static ncclResult_t end_comms(void)
{
    int n = tls.comms.n;
    ncclResult_t r = ncclSuccess;
    if (n == 1) {
        ncclComm_t comm = tls.comms.items[0];
        return nccl__from_braid(braid_group_end(comm->pg, NULL), "ncclGroupEnd");
    }
    braid_work **works = calloc((size_t)n, sizeof(*works));
    if (!works) {
        /* Still end them all, one at a time, so none stays open. */
        r = nccl__fail(ncclSystemError, "ncclGroupEnd: out of memory for %d communicators", n);
        for (int i = 0; i < n; i++)
            braid_group_end(((ncclComm_t)tls.comms.items[i])->pg, NULL);
        return r;
    }
    for (int i = 0; i < n; i++) {
        braid_status st = braid_group_end(((ncclComm_t)tls.comms.items[i])->pg, &works[i]);
        if (st != BRAID_OK && r == ncclSuccess)
            r = nccl__from_braid(st, "ncclGroupEnd");
    }
    for (int i = 0; i < n; i++) {
        if (!works[i])
            continue;
        braid_status st = braid_wait(works[i], -1);
        if (st != BRAID_OK && r == ncclSuccess)
            r = nccl__from_braid(st, "ncclGroupEnd");
        braid_work_free(works[i]);
    }
    free(works);
    return r;
}

NCCL_API ncclResult_t ncclGroupEnd(void)
{
    if (tls.depth == 0)
        return nccl__fail(ncclInvalidUsage, "ncclGroupEnd without ncclGroupStart on this thread");
    if (--tls.depth > 0)
        return ncclSuccess;
    ncclResult_t r = ncclSuccess;
    if (tls.inits.n)
        r = nccl__comm_init_run_all((ncclComm_t *)tls.inits.items, tls.inits.n);
    if (tls.comms.n) {
        ncclResult_t e = end_comms();
        if (r == ncclSuccess)
            r = e;
    }
    for (int i = 0; i < tls.comms.n; i++)
        nccl__comm_leave(tls.comms.items[i]);
    for (int i = 0; i < tls.frees.n; i++)
        free(tls.frees.items[i]);
    list_clear(&tls.comms);
    list_clear(&tls.inits);
    list_clear(&tls.frees);
    return r;
}
