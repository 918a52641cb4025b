/* Collectives and point-to-point: map NCCL's arguments onto braid's and
 * call it. Outside a group a call blocks until done (braid has no device
 * queue to enqueue on, and a host buffer is then ready when the call
 * returns); inside one it is recorded by the communicator's braid group and
 * runs at ncclGroupEnd. A CUDA stream, when given, is waited for first, so
 * host buffers see the work queued on it before the call. */
#include <stdlib.h>
#include <string.h>

#include "nccl_internal.h"

/* Checks every call makes before touching buffers. */
static ncclResult_t begin(ncclComm_t comm, cudaStream_t stream, const char *call)
{
    ncclResult_t r = nccl__comm_check(comm, call);
    if (r != ncclSuccess)
        return r;
    if (comm->finalized)
        return nccl__fail(ncclInvalidUsage, "%s: the communicator was finalized", call);
    if ((r = nccl__stream_sync(stream, call)) != ncclSuccess)
        return r;
    if (nccl__group_active())
        return nccl__group_join(comm);
    return ncclSuccess;
}

static ncclResult_t host_buffers(const void *a, const void *b, size_t count, const char *call)
{
    if (count == 0)
        return ncclSuccess;
    ncclResult_t r = a ? nccl__check_host(a, "sendbuff", call) : ncclSuccess;
    if (r == ncclSuccess && b && b != a)
        r = nccl__check_host(b, "recvbuff", call);
    return r;
}

/* A PreMulSum's scaled copy of count elements of src, kept until the
 * call (or its group) completes: *copy is freed by finish(). */
static ncclResult_t premul_copy(const nccl_premul *pm, braid_dtype t, const void *src, size_t count, void **copy,
                                const char *call)
{
    *copy = NULL;
    if (count == 0)
        return ncclSuccess;
    void *p = malloc(count * braid_dtype_size(t));
    if (!p)
        return nccl__fail(ncclSystemError, "%s: out of memory for the PreMulSum copy of %zu elements", call, count);
    if (nccl__group_active() && nccl__group_keep(p) != ncclSuccess) {
        free(p);
        return ncclSystemError;
    }
    nccl__premul_scale(pm, t, p, src, count);
    *copy = p;
    return ncclSuccess;
}

static ncclResult_t finish(braid_status st, void *copy, const char *call)
{
    if (!nccl__group_active())
        free(copy); /* inside a group, the group frees it */
    return nccl__from_braid(st, call);
}

/* Datatype and operator of a reduction, with PreMulSum resolved. */
static ncclResult_t reduction_args(ncclComm_t comm, ncclDataType_t datatype, ncclRedOp_t op, braid_dtype *bt,
                                   braid_op *bop, nccl_premul *pm, const char *call)
{
    ncclResult_t r = nccl__map_dtype(datatype, 1, op, bt, call);
    if (r == ncclSuccess)
        r = nccl__map_op(comm, op, datatype, bop, pm, call);
    return r;
}

static ncclResult_t do_all_reduce(const void *sendbuff, void *recvbuff, size_t count, ncclDataType_t datatype,
                                  ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream)
{
    const char *call = "ncclAllReduce";
    braid_dtype bt;
    braid_op bop;
    nccl_premul pm;
    ncclResult_t r = begin(comm, stream, call);
    if (r == ncclSuccess)
        r = reduction_args(comm, datatype, op, &bt, &bop, &pm, call);
    if (r == ncclSuccess)
        r = host_buffers(sendbuff, recvbuff, count, call);
    if (r != ncclSuccess)
        return r;
    if (pm.used && count) {
        if (!sendbuff || !recvbuff)
            return nccl__fail(ncclInvalidArgument, "%s: NULL buffer with count %zu", call, count);
        /* The output is the natural home of the scaled input. */
        nccl__premul_scale(&pm, bt, recvbuff, sendbuff, count);
        sendbuff = recvbuff;
    }
    return nccl__from_braid(braid_allreduce(comm->pg, sendbuff, recvbuff, count, bt, bop, NULL, NULL), call);
}

static ncclResult_t do_reduce(const void *sendbuff, void *recvbuff, size_t count, ncclDataType_t datatype,
                              ncclRedOp_t op, int root, ncclComm_t comm, cudaStream_t stream)
{
    const char *call = "ncclReduce";
    braid_dtype bt;
    braid_op bop;
    nccl_premul pm;
    ncclResult_t r = begin(comm, stream, call);
    if (r == ncclSuccess)
        r = reduction_args(comm, datatype, op, &bt, &bop, &pm, call);
    if (r == ncclSuccess)
        r = host_buffers(sendbuff, comm->rank == root ? recvbuff : NULL, count, call);
    if (r != ncclSuccess)
        return r;
    void *copy = NULL;
    if (pm.used && sendbuff) {
        if ((r = premul_copy(&pm, bt, sendbuff, count, &copy, call)) != ncclSuccess)
            return r;
        sendbuff = copy ? copy : sendbuff;
    }
    return finish(braid_reduce(comm->pg, sendbuff, recvbuff, count, bt, bop, root, NULL, NULL), copy, call);
}

static ncclResult_t do_reduce_scatter(const void *sendbuff, void *recvbuff, size_t recvcount, ncclDataType_t datatype,
                                      ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream)
{
    const char *call = "ncclReduceScatter";
    braid_dtype bt;
    braid_op bop;
    nccl_premul pm;
    ncclResult_t r = begin(comm, stream, call);
    if (r == ncclSuccess)
        r = reduction_args(comm, datatype, op, &bt, &bop, &pm, call);
    if (r == ncclSuccess)
        r = host_buffers(sendbuff, recvbuff, recvcount, call);
    if (r != ncclSuccess)
        return r;
    void *copy = NULL;
    if (pm.used && sendbuff) {
        size_t total = recvcount * (size_t)comm->nranks;
        if ((r = premul_copy(&pm, bt, sendbuff, total, &copy, call)) != ncclSuccess)
            return r;
        /* In place stays in place: the scaled copy replaces the input, the
         * output is the caller's block of it. */
        sendbuff = copy ? copy : sendbuff;
    }
    return finish(braid_reduce_scatter(comm->pg, sendbuff, recvbuff, recvcount, bt, bop, NULL, NULL), copy, call);
}

static ncclResult_t do_all_gather(const void *sendbuff, void *recvbuff, size_t sendcount, ncclDataType_t datatype,
                                  ncclComm_t comm, cudaStream_t stream)
{
    const char *call = "ncclAllGather";
    braid_dtype bt;
    ncclResult_t r = begin(comm, stream, call);
    if (r == ncclSuccess)
        r = nccl__map_dtype(datatype, 0, ncclSum, &bt, call);
    if (r == ncclSuccess)
        r = host_buffers(sendbuff, recvbuff, sendcount, call);
    if (r != ncclSuccess)
        return r;
    return nccl__from_braid(braid_allgather(comm->pg, sendbuff, recvbuff, sendcount, bt, NULL, NULL), call);
}

static ncclResult_t do_broadcast(const void *sendbuff, void *recvbuff, size_t count, ncclDataType_t datatype, int root,
                                 ncclComm_t comm, cudaStream_t stream)
{
    const char *call = "ncclBroadcast";
    braid_dtype bt;
    ncclResult_t r = begin(comm, stream, call);
    if (r == ncclSuccess)
        r = nccl__map_dtype(datatype, 0, ncclSum, &bt, call);
    if (r == ncclSuccess)
        r = host_buffers(comm->rank == root ? sendbuff : NULL, recvbuff, count, call);
    if (r != ncclSuccess)
        return r;
    if (root < 0 || root >= comm->nranks)
        return nccl__fail(ncclInvalidArgument, "%s: root %d out of range [0, %d)", call, root, comm->nranks);
    /* braid broadcasts in place: the root's input goes to its output first. */
    if (comm->rank == root && count && sendbuff != recvbuff) {
        if (!sendbuff || !recvbuff)
            return nccl__fail(ncclInvalidArgument, "%s: NULL buffer with count %zu on the root", call, count);
        memmove(recvbuff, sendbuff, count * braid_dtype_size(bt));
    }
    return nccl__from_braid(braid_broadcast(comm->pg, recvbuff, count, bt, root, NULL, NULL), call);
}

static ncclResult_t do_send(const void *sendbuff, size_t count, ncclDataType_t datatype, int peer, ncclComm_t comm,
                            cudaStream_t stream)
{
    const char *call = "ncclSend";
    braid_dtype bt;
    ncclResult_t r = begin(comm, stream, call);
    if (r == ncclSuccess)
        r = nccl__map_dtype(datatype, 0, ncclSum, &bt, call);
    if (r == ncclSuccess)
        r = host_buffers(sendbuff, NULL, count, call);
    if (r != ncclSuccess)
        return r;
    return nccl__from_braid(braid_send(comm->pg, sendbuff, count, bt, peer, NULL, NULL), call);
}

static ncclResult_t do_recv(void *recvbuff, size_t count, ncclDataType_t datatype, int peer, ncclComm_t comm,
                            cudaStream_t stream)
{
    const char *call = "ncclRecv";
    braid_dtype bt;
    ncclResult_t r = begin(comm, stream, call);
    if (r == ncclSuccess)
        r = nccl__map_dtype(datatype, 0, ncclSum, &bt, call);
    if (r == ncclSuccess)
        r = host_buffers(NULL, recvbuff, count, call);
    if (r != ncclSuccess)
        return r;
    return nccl__from_braid(braid_recv(comm->pg, recvbuff, count, bt, peer, NULL, NULL), call);
}

/* ---- entry points: the communicator is marked in use while a call runs,
 * so that ncclCommAbort from another thread waits for it (nccl_comm.c). */

NCCL_API ncclResult_t ncclAllReduce(const void *sendbuff, void *recvbuff, size_t count, ncclDataType_t datatype,
                                    ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream)
{
    ncclResult_t r = nccl__comm_enter(comm, "ncclAllReduce");
    if (r != ncclSuccess)
        return r;
    r = do_all_reduce(sendbuff, recvbuff, count, datatype, op, comm, stream);
    nccl__comm_leave(comm);
    return r;
}

NCCL_API ncclResult_t ncclReduce(const void *sendbuff, void *recvbuff, size_t count, ncclDataType_t datatype,
                                 ncclRedOp_t op, int root, ncclComm_t comm, cudaStream_t stream)
{
    ncclResult_t r = nccl__comm_enter(comm, "ncclReduce");
    if (r != ncclSuccess)
        return r;
    r = do_reduce(sendbuff, recvbuff, count, datatype, op, root, comm, stream);
    nccl__comm_leave(comm);
    return r;
}

NCCL_API ncclResult_t ncclReduceScatter(const void *sendbuff, void *recvbuff, size_t recvcount, ncclDataType_t datatype,
                                        ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream)
{
    ncclResult_t r = nccl__comm_enter(comm, "ncclReduceScatter");
    if (r != ncclSuccess)
        return r;
    r = do_reduce_scatter(sendbuff, recvbuff, recvcount, datatype, op, comm, stream);
    nccl__comm_leave(comm);
    return r;
}

NCCL_API ncclResult_t ncclAllGather(const void *sendbuff, void *recvbuff, size_t sendcount, ncclDataType_t datatype,
                                    ncclComm_t comm, cudaStream_t stream)
{
    ncclResult_t r = nccl__comm_enter(comm, "ncclAllGather");
    if (r != ncclSuccess)
        return r;
    r = do_all_gather(sendbuff, recvbuff, sendcount, datatype, comm, stream);
    nccl__comm_leave(comm);
    return r;
}

NCCL_API ncclResult_t ncclBroadcast(const void *sendbuff, void *recvbuff, size_t count, ncclDataType_t datatype,
                                    int root, ncclComm_t comm, cudaStream_t stream)
{
    ncclResult_t r = nccl__comm_enter(comm, "ncclBroadcast");
    if (r != ncclSuccess)
        return r;
    r = do_broadcast(sendbuff, recvbuff, count, datatype, root, comm, stream);
    nccl__comm_leave(comm);
    return r;
}

NCCL_API ncclResult_t ncclSend(const void *sendbuff, size_t count, ncclDataType_t datatype, int peer, ncclComm_t comm,
                               cudaStream_t stream)
{
    ncclResult_t r = nccl__comm_enter(comm, "ncclSend");
    if (r != ncclSuccess)
        return r;
    r = do_send(sendbuff, count, datatype, peer, comm, stream);
    nccl__comm_leave(comm);
    return r;
}

NCCL_API ncclResult_t ncclRecv(void *recvbuff, size_t count, ncclDataType_t datatype, int peer, ncclComm_t comm,
                               cudaStream_t stream)
{
    ncclResult_t r = nccl__comm_enter(comm, "ncclRecv");
    if (r != ncclSuccess)
        return r;
    r = do_recv(recvbuff, count, datatype, peer, comm, stream);
    nccl__comm_leave(comm);
    return r;
}

NCCL_API ncclResult_t ncclBcast(void *buff, size_t count, ncclDataType_t datatype, int root, ncclComm_t comm,
                                cudaStream_t stream)
{
    return ncclBroadcast(buff, buff, count, datatype, root, comm, stream);
}
