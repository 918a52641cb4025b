/* Entry points of reduce and reduce-scatter: argument checks with the
 * caller's view of the buffers, then the executor (or the open group,
 * which braid__work_submit records into). The *_submit halves are shared
 * with the MULSUM calls (mulsum.c), which pass their scalar. */
#include "coll_check.h"
#include "hmem.h"
#include "pg.h"
#include "refuse.h"
#include "status.h"

static braid_status reduce_checked(braid_pg *pg, const void *send, void *recv, size_t count, braid_dtype dtype,
                                    braid_op op, int root, void *cuda_stream, braid_work **work)
{
    return braid__reduce_submit(pg, send, recv, count, dtype, op, NULL, root, cuda_stream, work);
}

braid_status braid__reduce_submit(braid_pg *pg, const void *send, void *recv, size_t count, braid_dtype dtype,
                                  braid_op op, const void *scalar, int root, void *cuda_stream, braid_work **work)
{
    BRAID_CHECK(braid__check_common(pg, "reduce", count, 0, dtype));
    BRAID_CHECK(braid__check_op(pg, "reduce", op, scalar));
    if (root < 0 || root >= pg->size)
        return braid__error(BRAID_ERR_INVALID_ARG, "rank %d: reduce: root %d out of range [0, %d)", pg->rank, root,
                            pg->size);
    BRAID_CHECK(braid__check_ptr(pg, "reduce", "send", send, count));
    size_t bytes = count * braid_dtype_size(dtype);
    if (pg->rank == root) {
        BRAID_CHECK(braid__check_ptr(pg, "reduce", "recv on the root", recv, count));
        if (send != recv && braid__overlap(send, bytes, recv, bytes))
            return braid__error(BRAID_ERR_INVALID_ARG, "rank %d: reduce: send and recv overlap without being equal",
                                pg->rank);
    }
    braid_coll c = {.kind = BRAID_COLL_REDUCE,
                    .send = send,
                    .recv = pg->rank == root ? recv : NULL,
                    .count = count,
                    .dtype = dtype,
                    .op = op,
                    .root = root};
    braid__coll_classify(&c, NULL);
    braid__mulsum_arm(&c, scalar);
    return braid__hmem_submit(pg, &c, cuda_stream, work); /* host memory: braid__work_submit */
}

static braid_status reduce_scatter_checked(braid_pg *pg, const void *send, void *recv, size_t recvcount,
                                            braid_dtype dtype, braid_op op, void *cuda_stream, braid_work **work)
{
    return braid__reduce_scatter_submit(pg, send, recv, recvcount, dtype, op, NULL, cuda_stream, work);
}

braid_status braid__reduce_scatter_submit(braid_pg *pg, const void *send, void *recv, size_t recvcount,
                                          braid_dtype dtype, braid_op op, const void *scalar, void *cuda_stream,
                                          braid_work **work)
{
    BRAID_CHECK(braid__check_common(pg, "reduce_scatter", recvcount, 1, dtype));
    BRAID_CHECK(braid__check_op(pg, "reduce_scatter", op, scalar));
    BRAID_CHECK(braid__check_ptr(pg, "reduce_scatter", "send", send, recvcount));
    BRAID_CHECK(braid__check_ptr(pg, "reduce_scatter", "recv", recv, recvcount));
    size_t bytes = recvcount * braid_dtype_size(dtype);
    const char *own = (const char *)send + (size_t)pg->rank * bytes;
    if ((const char *)recv != own && braid__overlap(recv, bytes, send, bytes * (size_t)pg->size))
        return braid__error(BRAID_ERR_INVALID_ARG,
                            "rank %d: reduce_scatter: recv overlaps send without being its block %d (in place)",
                            pg->rank, pg->rank);
    braid_coll c = {.kind = BRAID_COLL_REDUCE_SCATTER,
                    .send = send,
                    .recv = recv,
                    .count = recvcount,
                    .dtype = dtype,
                    .op = op,
                    .root = -1};
    braid__coll_classify(&c, NULL);
    braid__mulsum_arm(&c, scalar);
    return braid__hmem_submit(pg, &c, cuda_stream, work); /* host memory: braid__work_submit */
}

BRAID_API braid_status braid_reduce(braid_pg *pg, const void *send, void *recv, size_t count, braid_dtype dtype,
                                    braid_op op, int root, void *cuda_stream, braid_work **work)
{
    braid_status st = reduce_checked(pg, send, recv, count, dtype, op, root, cuda_stream, work);
    braid_coll c = {.kind = BRAID_COLL_REDUCE, .send = send, .recv = recv, .count = count, .dtype = dtype, .op = op, .root = root};
    return st == BRAID_ERR_INVALID_ARG ? braid__coll_refuse(pg, &c, st) : st;
}

BRAID_API braid_status braid_reduce_scatter(braid_pg *pg, const void *send, void *recv, size_t recvcount,
                                            braid_dtype dtype, braid_op op, void *cuda_stream, braid_work **work)
{
    braid_status st = reduce_scatter_checked(pg, send, recv, recvcount, dtype, op, cuda_stream, work);
    braid_coll c = {.kind = BRAID_COLL_REDUCE_SCATTER, .send = send, .recv = recv, .count = recvcount, .dtype = dtype, .op = op, .root = -1};
    return st == BRAID_ERR_INVALID_ARG ? braid__coll_refuse(pg, &c, st) : st;
}
