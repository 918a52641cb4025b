/* Device calls that braid's engine runs after their NCCL call returned
 * (nccl_dev.c hands them over with a work handle): kept here so that their
 * failures reach ncclCommGetAsyncError, and so that ncclCommFinalize and
 * ncclCommDestroy wait for them, as NCCL flushes its work there.
 *
 * Nothing here blocks under a lock: a watchdog thread polling
 * ncclCommGetAsyncError never waits behind a collective. */
#include <stdio.h>
#include <stdlib.h>

#include "nccl_internal.h"

struct nccl_inflight {
    braid_work *work;
    const char *call;
    struct nccl_inflight *next;
};

/* Keep the first failure of work that ran after its call returned. */
static void record_failure(ncclComm_t comm, braid_status st, const char *call)
{
    char text[sizeof(comm->async_text)];
    snprintf(text, sizeof(text), "%s: %s", call, braid_last_error());
    pthread_mutex_lock(&comm->mu);
    int none = ncclSuccess;
    if (atomic_compare_exchange_strong(&comm->async_error, &none, (int)nccl__result_of(st)))
        snprintf(comm->async_text, sizeof(comm->async_text), "%s", text);
    pthread_mutex_unlock(&comm->mu);
}

/* Unlink the finished entries (wait: all of them, waiting outside the
 * lock); return them as a list. */
static struct nccl_inflight *take(ncclComm_t comm, int all)
{
    struct nccl_inflight *done = NULL;
    pthread_mutex_lock(&comm->inflight_mu);
    for (struct nccl_inflight **p = &comm->inflight_works; *p;) {
        struct nccl_inflight *e = *p;
        int finished = 1;
        if (!all && (braid_test(e->work, &finished), !finished)) {
            p = &e->next;
            continue;
        }
        *p = e->next;
        e->next = done;
        done = e;
        comm->ninflight_works--;
    }
    pthread_mutex_unlock(&comm->inflight_mu);
    return done;
}

static void finish(ncclComm_t comm, struct nccl_inflight *list)
{
    while (list) {
        struct nccl_inflight *e = list;
        list = e->next;
        /* Until done: a long staged call may outlast one group timeout
         * while every piece of it keeps its own deadline. */
        braid_status st;
        int done = 0;
        do
            st = braid_wait(e->work, -1);
        while (st == BRAID_ERR_TIMEOUT && braid_test(e->work, &done) == BRAID_OK && !done);
        if (st != BRAID_OK)
            record_failure(comm, st, e->call);
        braid_work_free(e->work);
        free(e);
    }
}

void nccl__inflight_reap(ncclComm_t comm)
{
    finish(comm, take(comm, 0));
}

void nccl__inflight_wait(ncclComm_t comm)
{
    finish(comm, take(comm, 1));
}

ncclResult_t nccl__inflight_add(ncclComm_t comm, braid_work *work, const char *call)
{
    if (!work)
        return ncclSuccess;
    struct nccl_inflight *e = malloc(sizeof(*e));
    if (!e) {
        /* The call is queued already: wait for it rather than lose it. */
        braid_status st = braid_wait(work, -1);
        braid_work_free(work);
        return st == BRAID_OK ? ncclSuccess : nccl__from_braid(st, call);
    }
    *e = (struct nccl_inflight){work, call, NULL};
    pthread_mutex_lock(&comm->inflight_mu);
    e->next = comm->inflight_works;
    comm->inflight_works = e;
    int many = ++comm->ninflight_works > 64;
    pthread_mutex_unlock(&comm->inflight_mu);
    if (many) /* a program that never asks: keep the list short */
        nccl__inflight_reap(comm);
    return ncclSuccess;
}
