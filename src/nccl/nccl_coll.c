/* Collectives and point-to-point: check NCCL's arguments, describe the
 * call as an nccl_op, and hand it on:
 *
 *  - inside a group, it is recorded and runs at the outermost ncclGroupEnd
 *    (nccl_group.c); nothing touches the buffers before that;
 *  - on CUDA device buffers, it goes to braid's device path (nccl_dev.c)
 *    with NCCL's stream semantics: ordered after the work already queued
 *    on `stream`, the stream waits for it, and the call returns once it
 *    is queued;
 *  - on host buffers, it runs now and returns when done (after the
 *    communicator's earlier calls, and after the work queued on `stream`).
 *
 * Argument errors are returned by the call itself, as in NCCL; what braid
 * cannot do is ncclInvalidUsage. */
#include "hmem.h"
#include "nccl_internal.h"

/* Checks every call makes. */
static ncclResult_t begin(ncclComm_t comm, const char *call)
{
    ncclResult_t r = nccl__comm_check(comm, call);
    if (r != ncclSuccess)
        return r;
    if (comm->finalized)
        return nccl__fail(ncclInvalidUsage, "%s: the communicator was finalized", call);
    if (atomic_load(&comm->revoked))
        return nccl__fail(ncclInvalidUsage,
                          "%s: %s: the communicator was revoked (ncclCommRevoke); only ncclCommShrink, "
                          "ncclCommDestroy and ncclCommAbort remain",
                          call, comm->label);
    return ncclSuccess;
}

/* NULL buffers and memory kinds: sets op->device. */
static ncclResult_t buffers(ncclComm_t comm, nccl_op *op)
{
    size_t sb = nccl__op_send_bytes(op, comm->rank, comm->nranks);
    size_t rb = nccl__op_recv_bytes(op, comm->rank, comm->nranks);
    if (sb && !op->send)
        return nccl__fail(ncclInvalidArgument, "%s: sendbuff is NULL with count %zu", op->call, op->count);
    if (rb && !op->recv)
        return nccl__fail(ncclInvalidArgument, "%s: recvbuff is NULL with count %zu", op->call, op->count);
    /* Checked here, as NCCL's other argument errors are, so the call fails
     * alone; braid would refuse it to the peers and break the group. */
    uintptr_t s = (uintptr_t)op->send, d = (uintptr_t)op->recv;
    if (op->kind == BRAID_COLL_ALLTOALL && sb && s < d + rb && d < s + sb)
        return nccl__fail(ncclInvalidArgument, "%s: sendbuff and recvbuff overlap: all-to-all has no in-place form",
                          op->call);
    ncclResult_t r = ncclSuccess;
    op->send_mem = op->recv_mem = (braid_mem){0, 0};
    if (sb) {
        if ((r = nccl__dev_check(op->send, "sendbuff", op->call)) != ncclSuccess)
            return r;
        op->send_mem = braid__mem_of(op->send);
    }
    if (rb && op->recv != op->send) {
        if ((r = nccl__dev_check(op->recv, "recvbuff", op->call)) != ncclSuccess)
            return r;
        op->recv_mem = braid__mem_of(op->recv);
    } else if (rb) {
        op->recv_mem = sb ? op->send_mem : braid__mem_of(op->recv); /* in place; send unread here */
    }
    op->device = op->send_mem.device_mem || op->recv_mem.device_mem;
    return ncclSuccess;
}

static ncclResult_t check_rank(ncclComm_t comm, int r, const char *what, const char *call)
{
    if (r < 0 || r >= comm->nranks)
        return nccl__fail(ncclInvalidArgument, "%s: %s %d out of range [0, %d)", call, what, r, comm->nranks);
    return ncclSuccess;
}

/* Record, enqueue or run a checked call. */
static ncclResult_t submit(ncclComm_t comm, nccl_op *op)
{
    if (nccl__group_active())
        return nccl__group_record(comm, op);
    if (op->device)
        return nccl__dev_submit(comm, op, 1);
    if (comm->conf.blocking)
        return nccl__exec_start(comm, op, 1, NULL);
    /* Nonblocking communicator: start the call and return ncclInProgress;
     * ncclCommGetAsyncError (or the next call) completes it. */
    braid_work *work = NULL;
    nccl_op started = *op;
    ncclResult_t r = nccl__exec_start(comm, &started, 1, &work);
    if (r != ncclSuccess || !work)
        return r;
    pthread_mutex_lock(&comm->mu);
    comm->pending = work;
    comm->pending_op = started;
    pthread_mutex_unlock(&comm->mu);
    return ncclInProgress;
}

/* The datatype, and for a reduction the operator (PreMulSum resolved). */
static ncclResult_t types(ncclComm_t comm, nccl_op *op, ncclDataType_t datatype, ncclRedOp_t redop, int reducing)
{
    op->pm.used = 0;
    op->op = BRAID_SUM;
    ncclResult_t r = nccl__map_dtype(datatype, reducing, &op->dtype, op->call);
    if (r == ncclSuccess && reducing)
        r = nccl__map_op(comm, redop, datatype, &op->op, &op->pm, op->call);
    return r;
}

static ncclResult_t run(ncclComm_t comm, nccl_op *op, ncclDataType_t datatype, ncclRedOp_t redop, int reducing)
{
    op->call = braid__kind(op->kind)->nccl_name;
    ncclResult_t r = nccl__comm_enter(comm, op->call);
    if (r != ncclSuccess)
        return r;
    r = begin(comm, op->call);
    if (r == ncclSuccess)
        r = types(comm, op, datatype, redop, reducing);
    const braid_kind_traits *t = braid__kind(op->kind);
    if (r == ncclSuccess && (t->has_root || t->p2p))
        r = check_rank(comm, op->root, t->p2p ? "peer" : "root", op->call);
    if (r == ncclSuccess)
        r = buffers(comm, op);
    if (r == ncclSuccess)
        r = submit(comm, op);
    nccl__comm_leave(comm);
    return r;
}

/* ---- entry points: the communicator is marked in use while a call runs,
 * so that ncclCommAbort from another thread waits for it (nccl_comm.c). */

NCCL_API ncclResult_t ncclAllReduce(const void *sendbuff, void *recvbuff, size_t count, ncclDataType_t datatype,
                                    ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream)
{
    NCCL_ON_COMM(comm);
    nccl_op o = {.kind = BRAID_COLL_ALLREDUCE, .send = sendbuff, .recv = recvbuff,
                 .count = count, .root = -1, .stream = stream};
    return run(comm, &o, datatype, op, 1);
}

NCCL_API ncclResult_t ncclReduce(const void *sendbuff, void *recvbuff, size_t count, ncclDataType_t datatype,
                                 ncclRedOp_t op, int root, ncclComm_t comm, cudaStream_t stream)
{
    NCCL_ON_COMM(comm);
    nccl_op o = {.kind = BRAID_COLL_REDUCE, .send = sendbuff, .recv = recvbuff, .count = count,
                 .root = root, .stream = stream};
    return run(comm, &o, datatype, op, 1);
}

NCCL_API ncclResult_t ncclReduceScatter(const void *sendbuff, void *recvbuff, size_t recvcount, ncclDataType_t datatype,
                                        ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream)
{
    NCCL_ON_COMM(comm);
    nccl_op o = {.kind = BRAID_COLL_REDUCE_SCATTER, .send = sendbuff, .recv = recvbuff,
                 .count = recvcount, .root = -1, .stream = stream};
    return run(comm, &o, datatype, op, 1);
}

NCCL_API ncclResult_t ncclAllGather(const void *sendbuff, void *recvbuff, size_t sendcount, ncclDataType_t datatype,
                                    ncclComm_t comm, cudaStream_t stream)
{
    NCCL_ON_COMM(comm);
    nccl_op o = {.kind = BRAID_COLL_ALLGATHER, .send = sendbuff, .recv = recvbuff,
                 .count = sendcount, .root = -1, .stream = stream};
    return run(comm, &o, datatype, ncclSum, 0);
}

NCCL_API ncclResult_t ncclBroadcast(const void *sendbuff, void *recvbuff, size_t count, ncclDataType_t datatype,
                                    int root, ncclComm_t comm, cudaStream_t stream)
{
    NCCL_ON_COMM(comm);
    nccl_op o = {.kind = BRAID_COLL_BROADCAST, .send = sendbuff, .recv = recvbuff,
                 .count = count, .root = root, .stream = stream};
    return run(comm, &o, datatype, ncclSum, 0);
}

NCCL_API ncclResult_t ncclAlltoAll(const void *sendbuff, void *recvbuff, size_t count, ncclDataType_t datatype,
                                   ncclComm_t comm, cudaStream_t stream)
{
    NCCL_ON_COMM(comm);
    nccl_op o = {.kind = BRAID_COLL_ALLTOALL, .send = sendbuff, .recv = recvbuff,
                 .count = count, .root = -1, .stream = stream};
    return run(comm, &o, datatype, ncclSum, 0);
}

NCCL_API ncclResult_t ncclGather(const void *sendbuff, void *recvbuff, size_t count, ncclDataType_t datatype, int root,
                                 ncclComm_t comm, cudaStream_t stream)
{
    NCCL_ON_COMM(comm);
    nccl_op o = {.kind = BRAID_COLL_GATHER, .send = sendbuff, .recv = recvbuff, .count = count,
                 .root = root, .stream = stream};
    return run(comm, &o, datatype, ncclSum, 0);
}

NCCL_API ncclResult_t ncclScatter(const void *sendbuff, void *recvbuff, size_t count, ncclDataType_t datatype, int root,
                                  ncclComm_t comm, cudaStream_t stream)
{
    NCCL_ON_COMM(comm);
    nccl_op o = {.kind = BRAID_COLL_SCATTER, .send = sendbuff, .recv = recvbuff, .count = count,
                 .root = root, .stream = stream};
    return run(comm, &o, datatype, ncclSum, 0);
}

NCCL_API ncclResult_t ncclSend(const void *sendbuff, size_t count, ncclDataType_t datatype, int peer, ncclComm_t comm,
                               cudaStream_t stream)
{
    NCCL_ON_COMM(comm);
    nccl_op o = {.kind = BRAID_COLL_SEND, .send = sendbuff, .count = count, .root = peer,
                 .stream = stream};
    return run(comm, &o, datatype, ncclSum, 0);
}

NCCL_API ncclResult_t ncclRecv(void *recvbuff, size_t count, ncclDataType_t datatype, int peer, ncclComm_t comm,
                               cudaStream_t stream)
{
    NCCL_ON_COMM(comm);
    nccl_op o = {.kind = BRAID_COLL_RECV, .recv = recvbuff, .count = count, .root = peer,
                 .stream = stream};
    return run(comm, &o, datatype, ncclSum, 0);
}

NCCL_API ncclResult_t ncclBcast(void *buff, size_t count, ncclDataType_t datatype, int root, ncclComm_t comm,
                                cudaStream_t stream)
{
    NCCL_ON_COMM(comm);
    return ncclBroadcast(buff, buff, count, datatype, root, comm, stream);
}
