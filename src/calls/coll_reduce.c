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
    braid_coll c = {.kind = BRAID_COLL_REDUCE, .send = send, .recv = recv, .count = count, .dtype = dtype,
                    .op = op, .root = root};
    BRAID_CHECK(braid__check_call(pg, "reduce", &c, scalar));
    if (pg->rank != root)
        c.recv = NULL; /* only the root's is written */
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
    braid_coll c = {.kind = BRAID_COLL_REDUCE_SCATTER, .send = send, .recv = recv, .count = recvcount,
                    .dtype = dtype, .op = op, .root = -1};
    BRAID_CHECK(braid__check_call(pg, "reduce_scatter", &c, scalar));
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
