/* Running checked calls (nccl_op) on braid: host buffers as they are,
 * device buffers on the op's stream (braid's device path, hmem.h).
 *
 * Work on the caller's buffers happens here, when the call runs, never
 * when it is recorded: a broadcast root's input is copied to its output
 * just before braid sees it (and braid multiplies a PreMulSum input when
 * the collective runs), so a group reads its buffers at ncclGroupEnd as
 * NCCL's would.
 *
 * Several calls run as one braid group: the collectives first, in issue
 * order, then every send and receive in one run that braid progresses
 * together. NCCL schedules a group the same way (collectives, then the
 * point-to-point operations), so a send placed before the matching
 * receive on both sides, with or without collectives in between, cannot
 * deadlock, and ranks agree on the collectives' order. */
#include <stdlib.h>
#include <string.h>

#include "coll_check.h"
#include "nccl_internal.h"

size_t nccl__op_send_bytes(const nccl_op *op, int rank, int nranks)
{
    size_t blocks = braid__blocks_on(braid__kind(op->kind)->send_blocks, rank, op->root, nranks);
    return blocks * op->count * braid_dtype_size(op->dtype);
}

size_t nccl__op_recv_bytes(const nccl_op *op, int rank, int nranks)
{
    size_t blocks = braid__blocks_on(braid__kind(op->kind)->recv_blocks, rank, op->root, nranks);
    return blocks * op->count * braid_dtype_size(op->dtype);
}

/* Work on the buffers that must precede braid's call. */
static void prepare(ncclComm_t comm, nccl_op *op)
{
    /* braid broadcasts host buffers in place: the root's input goes to its
     * output first (device ops are staged from send: issue()). */
    if (op->kind != BRAID_COLL_BROADCAST || op->device || comm->rank != op->root || !op->count || op->send == op->recv)
        return;
    memmove(op->recv, op->send, op->count * braid_dtype_size(op->dtype));
}

/* The call on braid; device ops on their stream (NULL for host ops, whose
 * stream exec_start waited for). */
static braid_status issue(ncclComm_t comm, const nccl_op *op)
{
    braid_pg *pg = comm->pg;
    void *st = op->device ? (void *)op->stream : NULL;
    switch (op->kind) {
    case BRAID_COLL_ALLREDUCE:
        if (op->pm.used)
            return braid_allreduce_mulsum(pg, op->send, op->recv, op->count, op->dtype, op->pm.scalar, st, NULL);
        return braid_allreduce(pg, op->send, op->recv, op->count, op->dtype, op->op, st, NULL);
    case BRAID_COLL_REDUCE:
        if (op->pm.used)
            return braid_reduce_mulsum(pg, op->send, op->recv, op->count, op->dtype, op->pm.scalar, op->root, st,
                                       NULL);
        return braid_reduce(pg, op->send, op->recv, op->count, op->dtype, op->op, op->root, st, NULL);
    case BRAID_COLL_REDUCE_SCATTER:
        if (op->pm.used)
            return braid_reduce_scatter_mulsum(pg, op->send, op->recv, op->count, op->dtype, op->pm.scalar, st,
                                               NULL);
        return braid_reduce_scatter(pg, op->send, op->recv, op->count, op->dtype, op->op, st, NULL);
    case BRAID_COLL_ALLGATHER:
        return braid_allgather(pg, op->send, op->recv, op->count, op->dtype, st, NULL);
    case BRAID_COLL_BROADCAST:
        if (op->device) /* always inside exec_start's group */
            return braid__broadcast_from(pg, op->send, op->recv, op->count, op->dtype, op->root, st);
        return braid_broadcast(pg, op->recv, op->count, op->dtype, op->root, st, NULL);
    case BRAID_COLL_SEND:
        return braid_send(pg, op->send, op->count, op->dtype, op->root, st, NULL);
    case BRAID_COLL_RECV:
        return braid_recv(pg, op->recv, op->count, op->dtype, op->root, st, NULL);
    case BRAID_COLL_ALLTOALL:
        return braid_alltoall(pg, op->send, op->recv, op->count, op->dtype, st, NULL);
    case BRAID_COLL_GATHER:
        return braid_gather(pg, op->send, op->recv, op->count, op->dtype, op->root, st, NULL);
    case BRAID_COLL_SCATTER:
        return braid_scatter(pg, op->send, op->recv, op->count, op->dtype, op->root, st, NULL);
    default:
        break; /* the shim records no other kind */
    }
    return BRAID_ERR_INTERNAL;
}

/* issue(), with braid's entry taking the memory kinds the call classified
 * (buffers() in nccl_coll.c) rather than asking again. */
static braid_status issue_classified(ncclComm_t comm, const nccl_op *op)
{
    /* Only the buffers the call reads or writes on this rank were classified. */
    const void *send = nccl__op_send_bytes(op, comm->rank, comm->nranks) ? op->send : NULL;
    const void *recv = nccl__op_recv_bytes(op, comm->rank, comm->nranks) ? op->recv : NULL;
    braid__mem_hint(send, op->send_mem, recv, op->recv_mem);
    braid_status st = issue(comm, op);
    braid__mem_hint_clear();
    return st;
}

ncclResult_t nccl__exec_start(ncclComm_t comm, nccl_op *ops, int n, braid_work **work)
{
    NCCL_ON_COMM(comm); /* group ends run here: name the communicator whose call failed */
    if (work)
        *work = NULL;
    if (n <= 0)
        return ncclSuccess;
    ncclResult_t r = ncclSuccess;
    /* Host buffers on a stream: its earlier work (a copy into them, say)
     * must be finished before braid reads them. */
    for (int i = 0; i < n && r == ncclSuccess; i++)
        if (ops[i].stream && !ops[i].device)
            r = nccl__stream_sync(ops[i].stream, ops[i].call);
    if (r != ncclSuccess)
        return r;
    for (int i = 0; i < n; i++)
        prepare(comm, &ops[i]);
    if (n == 1 && !work && !ops[0].device)
        return nccl__from_braid(issue_classified(comm, &ops[0]), ops[0].call);
    const char *call = n == 1 ? ops[0].call : "ncclGroupEnd";
    braid_status st = braid_group_start(comm->pg);
    if (st != BRAID_OK)
        return nccl__from_braid(st, call);
    for (int pass = 0; pass < 2 && st == BRAID_OK; pass++)
        for (int i = 0; i < n && st == BRAID_OK; i++)
            if (braid__kind(ops[i].kind)->p2p == pass && (st = issue_classified(comm, &ops[i])) != BRAID_OK)
                r = nccl__from_braid(st, ops[i].call);
    /* Also when recording failed: the group must not stay open. */
    braid_status end = braid_group_end(comm->pg, work);
    if (r == ncclSuccess && end != BRAID_OK)
        r = nccl__from_braid(end, call);
    if (r != ncclSuccess && work && *work) {
        braid_wait(*work, -1);
        braid_work_free(*work);
        *work = NULL;
    }
    return r;
}

ncclResult_t nccl__exec_finish(braid_work *work, nccl_op *ops, int n)
{
    ncclResult_t r = ncclSuccess;
    if (work) {
        braid_status st = braid_wait(work, -1);
        if (st != BRAID_OK)
            r = nccl__from_braid(st, n == 1 ? ops[0].call : "ncclGroupEnd");
        braid_work_free(work);
    }
    return r;
}
