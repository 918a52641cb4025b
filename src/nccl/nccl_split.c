/* ncclCommSplit: the members of the parent communicator all-gather their
 * (color, key), each color's members order themselves by key then parent
 * rank, and the new rank 0 hands its unique id to the others over the
 * parent before they all join, as NCCL's split does. */
#include <stdlib.h>

#include "nccl_internal.h"

typedef struct {
    int color, key, rank;
} split_entry;

static int split_order(const void *a, const void *b)
{
    const split_entry *x = a, *y = b;
    if (x->key != y->key)
        return x->key < y->key ? -1 : 1;
    return x->rank - y->rank;
}

static ncclResult_t comm_split(ncclComm_t comm, int color, int key, ncclComm_t *newcomm, ncclConfig_t *config)
{
    const char *call = "ncclCommSplit";
    ncclResult_t r = nccl__comm_check(comm, call);
    if (r != ncclSuccess)
        return r;
    if (!newcomm)
        return nccl__fail(ncclInvalidArgument, "%s: newcomm is NULL", call);
    if (color < 0 && color != NCCL_SPLIT_NOCOLOR)
        return nccl__fail(ncclInvalidArgument, "%s: color %d is negative and not NCCL_SPLIT_NOCOLOR", call, color);
    if (nccl__group_active())
        return nccl__fail(ncclInvalidUsage, "%s: braid does not split inside a group: call it outside", call);
    *newcomm = NULL;
    nccl__inflight_wait(comm); /* the split's exchange follows the device calls already enqueued */

    int n = comm->nranks, mine[2] = {color, key};
    int *all = malloc((size_t)n * 2 * sizeof(int));
    split_entry *members = malloc((size_t)n * sizeof(*members));
    if (!all || !members) {
        free(all);
        free(members);
        return nccl__fail(ncclSystemError, "%s: out of memory", call);
    }
    braid_status st = braid_allgather(comm->pg, mine, all, 2, BRAID_I32, NULL, NULL);
    if (st != BRAID_OK) {
        r = nccl__from_braid(st, call);
        goto out_free;
    }
    if (color == NCCL_SPLIT_NOCOLOR)
        goto out_free; /* not a member of any new communicator */

    int size = 0, newrank = -1;
    for (int i = 0; i < n; i++)
        if (all[2 * i] == color)
            members[size++] = (split_entry){all[2 * i], all[2 * i + 1], i};
    qsort(members, (size_t)size, sizeof(*members), split_order);
    for (int i = 0; i < size; i++)
        if (members[i].rank == comm->rank)
            newrank = i;

    /* The new rank 0 makes the id (its store listens in this process) and
     * hands it to the other members over the parent. */
    ncclUniqueId id;
    if (newrank == 0) {
        if ((r = ncclGetUniqueId(&id)) != ncclSuccess)
            goto out_free;
        st = braid_group_start(comm->pg);
        if (st == BRAID_OK) {
            for (int i = 1; i < size && st == BRAID_OK; i++)
                st = braid_send(comm->pg, &id, sizeof(id), BRAID_U8, members[i].rank, NULL, NULL);
            braid_status end = braid_group_end(comm->pg, NULL); /* also when recording failed */
            st = st != BRAID_OK ? st : end;
        }
    } else {
        st = braid_recv(comm->pg, &id, sizeof(id), BRAID_U8, members[0].rank, NULL, NULL);
    }
    if (st != BRAID_OK) {
        r = nccl__from_braid(st, call);
        goto out_free;
    }
    r = nccl__comm_init(newcomm, size, &id, 0, newrank, config, comm, call);
    if (r == ncclSuccess)
        (*newcomm)->cuda_dev = comm->cuda_dev;

out_free:
    free(all);
    free(members);
    return r;
}

NCCL_API ncclResult_t ncclCommSplit(ncclComm_t comm, int color, int key, ncclComm_t *newcomm, ncclConfig_t *config)
{
    NCCL_ON_COMM(comm);
    ncclResult_t r = nccl__comm_enter(comm, "ncclCommSplit");
    if (r != ncclSuccess)
        return r;
    r = comm_split(comm, color, key, newcomm, config);
    nccl__comm_leave(comm);
    return r;
}
