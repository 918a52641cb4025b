/* Datatypes, operators and PreMulSum.
 *
 * Every NCCL datatype but fp8 has a native braid dtype (fp8 is moved as
 * bytes and refused in reductions). Values outside NCCL's enums (and
 * PreMulSum misuse) are ncclInvalidArgument, as in NCCL.
 *
 * PreMulSum maps onto braid's BRAID_MULSUM: the op keeps the scalar, and
 * the call runs as braid_*_mulsum with it (nccl_exec.c). */
#include <stdlib.h>
#include <string.h>

#include "nccl_internal.h"
#include "reduce/elementwise.h"

static const char *dtype_name(ncclDataType_t t)
{
    static const char *const names[] = {"ncclInt8",   "ncclUint8",   "ncclInt32",   "ncclUint32",  "ncclInt64",
                                        "ncclUint64", "ncclFloat16", "ncclFloat32", "ncclFloat64", "ncclBfloat16",
                                        "ncclFloat8e4m3", "ncclFloat8e5m2"};
    return (unsigned)t < ncclNumTypes ? names[t] : "an invalid datatype";
}

static const char *op_name(ncclRedOp_t op)
{
    static const char *const names[] = {"ncclSum", "ncclProd", "ncclMax", "ncclMin", "ncclAvg"};
    return (unsigned)op < ncclNumOps ? names[op] : "a PreMulSum operator";
}

ncclResult_t nccl__map_dtype(ncclDataType_t t, int reducing, braid_dtype *out, const char *call)
{
    static const braid_dtype map[ncclNumTypes] = {
        [ncclInt8] = BRAID_I8,     [ncclUint8] = BRAID_U8,      [ncclInt32] = BRAID_I32,   [ncclUint32] = BRAID_U32,
        [ncclInt64] = BRAID_I64,   [ncclUint64] = BRAID_U64,    [ncclFloat16] = BRAID_F16, [ncclFloat32] = BRAID_F32,
        [ncclFloat64] = BRAID_F64, [ncclBfloat16] = BRAID_BF16,
        /* fp8 is moved as bytes; braid's engine has no fp8 arithmetic. */
        [ncclFloat8e4m3] = BRAID_U8, [ncclFloat8e5m2] = BRAID_U8,
    };
    if ((unsigned)t >= ncclNumTypes)
        return nccl__fail(ncclInvalidArgument, "%s: invalid datatype %d", call, (int)t);
    if (reducing && (t == ncclFloat8e4m3 || t == ncclFloat8e5m2))
        return nccl__fail(ncclInvalidUsage,
                          "%s: reductions on %s are not supported: braid's engine has no fp8 arithmetic (it moves "
                          "fp8 data in broadcast, gather, all-gather, all-to-all and send/receive)",
                          call, dtype_name(t));
    *out = map[t];
    return ncclSuccess;
}

ncclResult_t nccl__map_op(ncclComm_t comm, ncclRedOp_t op, ncclDataType_t t, braid_op *out, nccl_premul *premul,
                          const char *call)
{
    premul->used = 0;
    switch (op) {
    case ncclSum:
        *out = BRAID_SUM;
        return ncclSuccess;
    case ncclProd:
        *out = BRAID_PROD;
        return ncclSuccess;
    case ncclMax:
        *out = BRAID_MAX;
        return ncclSuccess;
    case ncclMin:
        *out = BRAID_MIN;
        return ncclSuccess;
    case ncclAvg:
        *out = BRAID_AVG;
        return ncclSuccess;
    default:
        break;
    }
    /* A copy: the table may grow (and move) while the call runs. */
    int idx = (int)op - (int)ncclNumOps, live;
    pthread_mutex_lock(&comm->mu);
    live = idx >= 0 && idx < comm->nredops && comm->redops[idx].used;
    if (live)
        *premul = comm->redops[idx];
    pthread_mutex_unlock(&comm->mu);
    if (!live)
        return nccl__fail(ncclInvalidArgument,
                          "%s: op %d is neither built in nor a live PreMulSum of this communicator", call, (int)op);
    if (premul->dtype != t) {
        ncclDataType_t made = premul->dtype;
        premul->used = 0;
        return nccl__fail(ncclInvalidArgument, "%s: PreMulSum op %d was made for %s, not %s", call, (int)op,
                          dtype_name(made), dtype_name(t));
    }
    if (premul->residence == ncclScalarDevice) {
        braid_dtype bt = BRAID_DTYPE_COUNT; /* set on success */
        ncclResult_t r = nccl__map_dtype(t, 0, &bt, call);
        if (r == ncclSuccess)
            r = nccl__read_scalar(premul->scalar, premul->scalar_ptr, braid_dtype_size(bt), call);
        if (r != ncclSuccess) {
            premul->used = 0;
            return r;
        }
    }
    *out = BRAID_MULSUM;
    return ncclSuccess;
}

NCCL_API ncclResult_t ncclRedOpCreatePreMulSum(ncclRedOp_t *op, void *scalar, ncclDataType_t datatype,
                                               ncclScalarResidence_t residence, ncclComm_t comm)
{
    NCCL_ON_COMM(comm);
    const char *call = "ncclRedOpCreatePreMulSum";
    ncclResult_t r = nccl__comm_check(comm, call);
    if (r != ncclSuccess)
        return r;
    if (!op || !scalar)
        return nccl__fail(ncclInvalidArgument, "%s: %s is NULL", call, !op ? "op" : "scalar");
    if (residence != ncclScalarDevice && residence != ncclScalarHostImmediate)
        return nccl__fail(ncclInvalidArgument, "%s: invalid residence %d", call, (int)residence);
    braid_dtype bt = BRAID_DTYPE_COUNT; /* set on success */
    if ((r = nccl__map_dtype(datatype, 1, &bt, call)) != ncclSuccess)
        return r;
    nccl_premul pm = {.used = 1, .dtype = datatype, .residence = residence, .scalar_ptr = scalar};
    if (residence == ncclScalarHostImmediate)
        memcpy(pm.scalar, scalar, braid_dtype_size(bt));

    pthread_mutex_lock(&comm->mu);
    int idx = 0;
    while (idx < comm->nredops && comm->redops[idx].used)
        idx++;
    if (idx == comm->nredops) {
        if ((long long)idx + ncclNumOps >= (long long)ncclMaxRedOp) {
            pthread_mutex_unlock(&comm->mu);
            return nccl__fail(ncclInvalidUsage, "%s: too many live operators", call);
        }
        nccl_premul *grown = realloc(comm->redops, (size_t)(idx + 1) * sizeof(*grown));
        if (!grown) {
            pthread_mutex_unlock(&comm->mu);
            return nccl__fail(ncclSystemError, "%s: out of memory", call);
        }
        comm->redops = grown;
        comm->nredops = idx + 1;
    }
    comm->redops[idx] = pm;
    pthread_mutex_unlock(&comm->mu);
    *op = (ncclRedOp_t)(ncclNumOps + idx);
    return ncclSuccess;
}

NCCL_API ncclResult_t ncclRedOpDestroy(ncclRedOp_t op, ncclComm_t comm)
{
    NCCL_ON_COMM(comm);
    const char *call = "ncclRedOpDestroy";
    ncclResult_t r = nccl__comm_check(comm, call);
    if (r != ncclSuccess)
        return r;
    if ((int)op < (int)ncclNumOps)
        return nccl__fail(ncclInvalidArgument, "%s: %s is built in and cannot be destroyed", call, op_name(op));
    int idx = (int)op - (int)ncclNumOps;
    pthread_mutex_lock(&comm->mu);
    int live = idx < comm->nredops && comm->redops[idx].used;
    if (live)
        comm->redops[idx].used = 0;
    pthread_mutex_unlock(&comm->mu);
    if (!live)
        return nccl__fail(ncclInvalidArgument, "%s: op %d is not a live operator of this communicator", call, (int)op);
    return ncclSuccess;
}
