/* Pre-multiplied sum (BRAID_MULSUM, NCCL's PreMulSum): the public calls,
 * and the multiply that runs just before the collective's algorithm.
 *
 * The multiply happens when the collective runs, never when it is issued:
 * an earlier queued collective may still be writing recv, and a group
 * reads its buffers at braid_group_end. After it the collective is a plain
 * sum (MULSUM combines as SUM), but keeps op MULSUM on the wire so that a
 * rank calling braid_allreduce(SUM) against it is a clear mismatch. */
#include <stdlib.h>
#include <string.h>

#include "algo/algo.h"
#include "coll_check.h"
#include "hmem.h"
#include "pg.h"
#include "refuse.h"
#include "reduce/reduce.h"
#include "status.h"

void braid__mulsum_arm(braid_coll *c, const void *scalar)
{
    if (!scalar)
        return;
    c->premul = 1;
    memcpy(c->scalar, scalar, braid_dtype_size(c->dtype));
}

braid_status braid__mulsum_prepare(int rank, int size, braid_coll *coll, void **scratch)
{
    *scratch = NULL;
    if (!coll->premul)
        return BRAID_OK;
    coll->premul = 0;
    size_t esize = braid_dtype_size(coll->dtype);
    size_t n = coll->count;
    if (coll->kind == BRAID_COLL_REDUCE_SCATTER)
        n *= (size_t)size;
    if (n == 0)
        return BRAID_OK;
    if (coll->kind == BRAID_COLL_ALLREDUCE) {
        /* recv is the natural home of the scaled input; in place stays so. */
        braid__reduce_premul(coll->dtype, coll->recv, coll->send, n, coll->scalar);
        coll->send = coll->recv;
        return BRAID_OK;
    }
    /* Reduce (recv exists on the root only) and reduce-scatter (recv is one
     * block): a scaled copy of the whole input. */
    void *p = malloc(n * esize);
    if (!p)
        return braid__error(BRAID_ERR_NO_MEMORY, "rank %d: %s: out of memory for the %zu-byte scaled copy of the input",
                            rank, braid__kind(coll->kind)->name, n * esize);
    braid__reduce_premul(coll->dtype, p, coll->send, n, coll->scalar);
    coll->send = p;
    *scratch = p;
    return BRAID_OK;
}

static braid_status check_scalar(braid_pg *pg, const char *name, const void *scalar)
{
    BRAID_CHECK(braid__pg_check_handle(pg, name));
    if (!scalar)
        return braid__error(BRAID_ERR_INVALID_ARG, "rank %d: %s: scalar is NULL", pg->rank, name);
    return BRAID_OK;
}

/* A call its checks refuse is refused to the peers as well (refuse.h), as
 * the plain calls do: else they would wait for it until the timeout. */
static braid_status refused(braid_pg *pg, braid_status st, braid_coll_kind kind, const void *send, void *recv,
                            size_t count, braid_dtype dtype, int root)
{
    return braid__refuse_call(pg, st, kind, send, recv, count, dtype, BRAID_MULSUM, root);
}

static braid_status allreduce_checked(braid_pg *pg, const void *send, void *recv, size_t count, braid_dtype dtype,
                                      const void *scalar, void *cuda_stream, braid_work **work)
{
    const char *name = "allreduce_mulsum";
    BRAID_CHECK(check_scalar(pg, name, scalar));
    braid_mem mem[2] = {{0, 0}, {0, 0}};
    if (count > 0) {
        mem[0] = send ? braid__mem_known(send) : mem[0];
        mem[1] = !recv ? mem[1] : (const void *)recv == send ? mem[0] : braid__mem_known(recv);
    }
    return braid__allreduce_submit(pg, name, send, recv, count, dtype, BRAID_MULSUM, scalar, mem, cuda_stream, work);
}

BRAID_API braid_status braid_allreduce_mulsum(braid_pg *pg, const void *send, void *recv, size_t count,
                                              braid_dtype dtype, const void *scalar, void *cuda_stream,
                                              braid_work **work)
{
    braid_status st = allreduce_checked(pg, send, recv, count, dtype, scalar, cuda_stream, work);
    return refused(pg, st, BRAID_COLL_ALLREDUCE, send, recv, count, dtype, -1);
}

BRAID_API braid_status braid_reduce_mulsum(braid_pg *pg, const void *send, void *recv, size_t count,
                                           braid_dtype dtype, const void *scalar, int root, void *cuda_stream,
                                           braid_work **work)
{
    braid_status st = check_scalar(pg, "reduce_mulsum", scalar);
    if (st == BRAID_OK)
        st = braid__reduce_submit(pg, send, recv, count, dtype, BRAID_MULSUM, scalar, root, cuda_stream, work);
    return refused(pg, st, BRAID_COLL_REDUCE, send, recv, count, dtype, root);
}

BRAID_API braid_status braid_reduce_scatter_mulsum(braid_pg *pg, const void *send, void *recv, size_t recvcount,
                                                   braid_dtype dtype, const void *scalar, void *cuda_stream,
                                                   braid_work **work)
{
    braid_status st = check_scalar(pg, "reduce_scatter_mulsum", scalar);
    if (st == BRAID_OK)
        st = braid__reduce_scatter_submit(pg, send, recv, recvcount, dtype, BRAID_MULSUM, scalar, cuda_stream,
                                          work);
    return refused(pg, st, BRAID_COLL_REDUCE_SCATTER, send, recv, recvcount, dtype, -1);
}
