/* Device all-reduce and broadcast of the NCCL shim on braid's own device
 * path (CUDA build; nccl_dev.c decides which calls come here). */
#include "coll_check.h"
#include "nccl_internal.h"

/* Whether the batch is an all-reduce or a broadcast outside a group, which
 * braid takes with its buffers classified already (braid__hmem_submit:
 * the device-collective kernels where the group has them, else the device
 * ring, else pinned staging in pieces whose copies overlap the network).
 * The rest goes through nccl__exec_start. */
int nccl__engine_takes(const nccl_op *ops, int n)
{
    return n == 1 && !ops[0].pm.used && (ops[0].kind == BRAID_COLL_ALLREDUCE || ops[0].kind == BRAID_COLL_BROADCAST);
}

/* Hand op to braid with a work handle, on the calling thread's device
 * (nccl__dev_submit made it the buffers'): the call returns once it is
 * queued, and op->stream is held (by a gate, or by the kernel itself)
 * until the result is in place. */
ncclResult_t nccl__engine_submit(ncclComm_t comm, const nccl_op *op)
{
    braid_work *w = NULL;
    braid_status st = BRAID_OK;
    ncclResult_t r = ncclSuccess;
    if (op->kind == BRAID_COLL_ALLREDUCE) {
        braid_mem mem[2] = {op->send_mem, op->recv_mem};
        st = braid__allreduce_classified(comm->pg, op->send, op->recv, op->count, op->dtype, op->op, mem, op->stream,
                                         &w);
    } else {
        /* braid broadcasts in place: the root's input goes to its output
         * first, on the caller's stream, so braid's call is ordered after it. */
        if (comm->rank == op->root && op->count && (const void *)op->recv != op->send)
            r = nccl__dev_root_copy(op);
        braid_mem mem[2] = {op->recv_mem, op->recv_mem}; /* in place on recv */
        if (r == ncclSuccess)
            st = braid__broadcast_classified(comm->pg, op->recv, op->count, op->dtype, op->root, mem, op->stream, &w);
    }
    if (r != ncclSuccess)
        return r;
    if (st != BRAID_OK)
        return nccl__from_braid(st, op->call);
    return nccl__inflight_add(comm, w, op->call);
}
