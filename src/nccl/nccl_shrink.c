/* Fault tolerance: ncclCommRevoke and ncclCommShrink.
 *
 * Revoke stops the communicator: braid_pg_abort makes every call blocked
 * in it (and its device calls) return, and later calls are refused.
 * Shrink makes a new communicator of the ranks that stay, on braid's group
 * shrink (braid_pg_shrink): the survivors agree among themselves, so a
 * dead rank is simply absent, and ranks renumber densely in old order as
 * NCCL's do. NCCL names the ranks to leave out while braid finds them; the
 * two must agree, or the call fails rather than hand back a communicator
 * of another shape than the caller asked for. A live rank in the exclude
 * list is left out once braid's shrink stops waiting for it (half of
 * BRAID_TIMEOUT_MS); a dead one at once. */
#include <stdlib.h>

#include "nccl_internal.h"

NCCL_API ncclResult_t ncclCommRevoke(ncclComm_t comm, int revokeFlags)
{
    NCCL_ON_COMM(comm);
    const char *call = "ncclCommRevoke";
    if (!comm)
        return nccl__fail(ncclInvalidArgument, "%s: comm is NULL", call);
    if (revokeFlags != NCCL_REVOKE_DEFAULT)
        return nccl__fail(ncclInvalidArgument, "%s: revokeFlags must be NCCL_REVOKE_DEFAULT (0), not %d", call,
                          revokeFlags);
    /* Not nccl__comm_check: that would wait for a nonblocking call in
     * flight, which is what revoke is there to stop. */
    if (atomic_load(&comm->init_started))
        nccl__comm_settle(comm, 1);
    if (comm->init_result != ncclSuccess || !comm->pg)
        return nccl__comm_check(comm, call);
    if (nccl__group_active())
        return nccl__fail(ncclInvalidUsage, "%s: %s: not allowed inside a group", call, comm->label);
    if (atomic_exchange(&comm->revoked, 1))
        return ncclSuccess; /* already revoked */
    braid_pg_abort(comm->pg); /* every pending call returns */
    nccl__inflight_wait(comm);
    if (comm->pending)
        nccl__comm_settle(comm, 1);
    return ncclSuccess;
}

/* excludeRanksList: in range, no repeats, not the caller. */
static ncclResult_t check_excludes(ncclComm_t comm, const int *list, int count, int *below_me, const char *call)
{
    if (count < 0 || count >= comm->nranks)
        return nccl__fail(ncclInvalidArgument, "%s: %s: excludeRanksCount %d out of range [0, %d)", call, comm->label,
                          count, comm->nranks);
    if (count > 0 && !list)
        return nccl__fail(ncclInvalidArgument, "%s: excludeRanksList is NULL with excludeRanksCount %d", call, count);
    unsigned char *seen = calloc((size_t)comm->nranks, 1);
    if (!seen)
        return nccl__fail(ncclSystemError, "%s: out of memory", call);
    ncclResult_t r = ncclSuccess;
    *below_me = 0;
    for (int i = 0; i < count && r == ncclSuccess; i++) {
        int x = list[i];
        if (x < 0 || x >= comm->nranks)
            r = nccl__fail(ncclInvalidArgument, "%s: %s: excluded rank %d out of range", call, comm->label, x);
        else if (seen[x])
            r = nccl__fail(ncclInvalidArgument, "%s: %s: rank %d excluded twice", call, comm->label, x);
        else if (x == comm->rank)
            r = nccl__fail(ncclInvalidArgument, "%s: %s: a rank in excludeRanksList must not call ncclCommShrink",
                           call, comm->label);
        else {
            seen[x] = 1;
            *below_me += x < comm->rank;
        }
    }
    free(seen);
    return r;
}

static ncclResult_t shrink(ncclComm_t comm, int *exclude, int count, ncclComm_t *newcomm, ncclConfig_t *config,
                           int flags)
{
    const char *call = "ncclCommShrink";
    if (!comm)
        return nccl__fail(ncclInvalidArgument, "%s: comm is NULL", call);
    if (!newcomm)
        return nccl__fail(ncclInvalidArgument, "%s: newcomm is NULL", call);
    if (flags != NCCL_SHRINK_DEFAULT && flags != NCCL_SHRINK_ABORT)
        return nccl__fail(ncclInvalidArgument, "%s: shrinkFlags %d is neither NCCL_SHRINK_DEFAULT nor NCCL_SHRINK_ABORT",
                          call, flags);
    *newcomm = NULL;
    if (atomic_load(&comm->init_started))
        nccl__comm_settle(comm, 1); /* a nonblocking init still running */
    if (comm->init_result != ncclSuccess || !comm->pg)
        return nccl__comm_check(comm, call);
    if (nccl__group_active())
        return nccl__fail(ncclInvalidUsage, "%s: %s: not allowed inside a group", call, comm->label);
    int below_me = 0;
    ncclResult_t r = check_excludes(comm, exclude, count, &below_me, call);
    if (r != ncclSuccess)
        return r;
    nccl_comm_config probe; /* refuse a bad config before any rank commits */
    if (config && (r = nccl__config_read(config, &probe, call)) != ncclSuccess)
        return r;
    if (flags == NCCL_SHRINK_ABORT)
        braid_pg_abort(comm->pg);
    nccl__inflight_wait(comm);
    if (comm->pending)
        nccl__comm_settle(comm, 1);

    braid_pg *pg = NULL;
    braid_status st = braid_pg_shrink(comm->pg, -1, &pg);
    if (st != BRAID_OK)
        return nccl__from_braid(st, call);
    int want = comm->nranks - count, got = braid_pg_size(pg), newrank = braid_pg_rank(pg);
    if (got != want || newrank != comm->rank - below_me) {
        braid_pg_destroy(pg);
        return nccl__fail(ncclInvalidUsage,
                          "%s: %s: the surviving ranks formed a group of %d (this rank %d in it), but excluding %d "
                          "rank(s) leaves %d (this rank %d): a rank outside excludeRanksList is dead or did not "
                          "call ncclCommShrink, or an excluded rank did",
                          call, comm->label, got, newrank, count, want, comm->rank - below_me);
    }
    if ((r = nccl__comm_from_pg(pg, comm, config, newcomm, call)) != ncclSuccess)
        braid_pg_destroy(pg);
    return r;
}

NCCL_API ncclResult_t ncclCommShrink(ncclComm_t comm, int *excludeRanksList, int excludeRanksCount, ncclComm_t *newcomm,
                                     ncclConfig_t *config, int shrinkFlags)
{
    NCCL_ON_COMM(comm);
    ncclResult_t r = nccl__comm_enter(comm, "ncclCommShrink");
    if (r != ncclSuccess)
        return r;
    r = shrink(comm, excludeRanksList, excludeRanksCount, newcomm, config, shrinkFlags);
    nccl__comm_leave(comm);
    return r;
}
