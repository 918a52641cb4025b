/* Entry points of reduce, all-gather, reduce-scatter, send and receive:
 * argument checks with the caller's view of the buffers, then the executor
 * (or the open group, which braid__work_submit records into). */
#include <stdint.h>

#include "coll_check.h"
#include "refuse.h"
#include "hmem.h"
#include "pg.h"
#include "status.h"

int braid__overlap(const void *a, size_t alen, const void *b, size_t blen)
{
    return alen && blen && (const char *)a < (const char *)b + blen && (const char *)b < (const char *)a + alen;
}

/* Checks every entry point shares. per_rank: the larger buffer holds one
 * count-sized block per rank, and its size must not overflow either. */
braid_status braid__check_common(braid_pg *pg, const char *name, size_t count, int per_rank, braid_dtype dtype,
                                 void *cuda_stream)
{
    BRAID_CHECK(braid__pg_check_handle(pg, name));
    size_t blocks = per_rank ? (size_t)pg->size : 1;
    size_t esize = braid_dtype_size(dtype);
    if (esize == 0)
        return braid__error(BRAID_ERR_INVALID_ARG, "rank %d: %s: invalid dtype %d", pg->rank, name, (int)dtype);
    if (count > SIZE_MAX / esize / 2 / blocks)
        return braid__error(BRAID_ERR_INVALID_ARG, "rank %d: %s: count %zu overflows", pg->rank, name, count);
    if (cuda_stream)
        return braid__error(BRAID_ERR_UNSUPPORTED,
                            "rank %d: %s: takes no CUDA stream (only allreduce and broadcast run on CUDA streams)",
                            pg->rank, name);
    return BRAID_OK;
}

/* These collectives run on host memory only: the CPU algorithms read and
 * write the buffers directly, which would fault on CUDA device memory.
 * Device buffers are refused up front (braid__mem_is_device makes no CUDA
 * call in a process that has no CUDA context). */
braid_status braid__check_host(const braid_pg *pg, const char *name, const char *what, const void *p, size_t count)
{
    if (count > 0 && p && braid__mem_is_device(p))
        return braid__error(BRAID_ERR_UNSUPPORTED,
                            "rank %d: %s: %s is CUDA device memory, which %s does not take (only allreduce and "
                            "broadcast do): copy it to host memory first",
                            pg->rank, name, what, name);
    return BRAID_OK;
}

braid_status braid__check_op(const braid_pg *pg, const char *name, braid_op op, const void *scalar)
{
    if ((unsigned)op >= BRAID_OP_COUNT)
        return braid__error(BRAID_ERR_INVALID_ARG, "rank %d: %s: invalid op %d", pg->rank, name, (int)op);
    if (op == BRAID_MULSUM && !scalar)
        return braid__error(BRAID_ERR_INVALID_ARG,
                            "rank %d: %s: op BRAID_MULSUM needs each rank's scalar: call %s_mulsum instead",
                            pg->rank, name, name);
    if (op != BRAID_MULSUM && scalar)
        return braid__error(BRAID_ERR_INVALID_ARG, "rank %d: %s: a scalar only goes with op BRAID_MULSUM", pg->rank,
                            name);
    return BRAID_OK;
}

braid_status braid__check_ptr(const braid_pg *pg, const char *name, const char *what, const void *p, size_t count)
{
    if (count > 0 && !p)
        return braid__error(BRAID_ERR_INVALID_ARG, "rank %d: %s: %s is NULL with count %zu", pg->rank, name, what,
                            count);
    return BRAID_OK;
}

static braid_status reduce_checked(braid_pg *pg, const void *send, void *recv, size_t count, braid_dtype dtype,
                                    braid_op op, int root, void *cuda_stream, braid_work **work)
{
    return braid__reduce_submit(pg, send, recv, count, dtype, op, NULL, root, cuda_stream, work);
}

braid_status braid__reduce_submit(braid_pg *pg, const void *send, void *recv, size_t count, braid_dtype dtype,
                                  braid_op op, const void *scalar, int root, void *cuda_stream, braid_work **work)
{
    BRAID_CHECK(braid__check_common(pg, "reduce", count, 0, dtype, cuda_stream));
    BRAID_CHECK(braid__check_op(pg, "reduce", op, scalar));
    if (root < 0 || root >= pg->size)
        return braid__error(BRAID_ERR_INVALID_ARG, "rank %d: reduce: root %d out of range [0, %d)", pg->rank, root,
                            pg->size);
    BRAID_CHECK(braid__check_ptr(pg, "reduce", "send", send, count));
    BRAID_CHECK(braid__check_host(pg, "reduce", "send", send, count));
    size_t bytes = count * braid_dtype_size(dtype);
    if (pg->rank == root) {
        BRAID_CHECK(braid__check_ptr(pg, "reduce", "recv on the root", recv, count));
        BRAID_CHECK(braid__check_host(pg, "reduce", "recv", recv, count));
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
    braid__mulsum_arm(&c, scalar);
    return braid__work_submit(pg, &c, work);
}

static braid_status allgather_checked(braid_pg *pg, const void *send, void *recv, size_t sendcount, braid_dtype dtype,
                                       void *cuda_stream, braid_work **work)
{
    BRAID_CHECK(braid__check_common(pg, "allgather", sendcount, 1, dtype, cuda_stream));
    BRAID_CHECK(braid__check_ptr(pg, "allgather", "send", send, sendcount));
    BRAID_CHECK(braid__check_ptr(pg, "allgather", "recv", recv, sendcount));
    BRAID_CHECK(braid__check_host(pg, "allgather", "send", send, sendcount));
    BRAID_CHECK(braid__check_host(pg, "allgather", "recv", recv, sendcount));
    size_t bytes = sendcount * braid_dtype_size(dtype);
    const char *own = (const char *)recv + (size_t)pg->rank * bytes;
    if (send != own && braid__overlap(send, bytes, recv, bytes * (size_t)pg->size))
        return braid__error(BRAID_ERR_INVALID_ARG,
                            "rank %d: allgather: send overlaps recv without being its block %d (in place)", pg->rank,
                            pg->rank);
    braid_coll c = {.kind = BRAID_COLL_ALLGATHER,
                    .send = send,
                    .recv = recv,
                    .count = sendcount,
                    .dtype = dtype,
                    .op = BRAID_SUM,
                    .root = -1};
    return braid__work_submit(pg, &c, work);
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
    BRAID_CHECK(braid__check_common(pg, "reduce_scatter", recvcount, 1, dtype, cuda_stream));
    BRAID_CHECK(braid__check_op(pg, "reduce_scatter", op, scalar));
    BRAID_CHECK(braid__check_ptr(pg, "reduce_scatter", "send", send, recvcount));
    BRAID_CHECK(braid__check_ptr(pg, "reduce_scatter", "recv", recv, recvcount));
    BRAID_CHECK(braid__check_host(pg, "reduce_scatter", "send", send, recvcount));
    BRAID_CHECK(braid__check_host(pg, "reduce_scatter", "recv", recv, recvcount));
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
    braid__mulsum_arm(&c, scalar);
    return braid__work_submit(pg, &c, work);
}

static braid_status check_p2p(braid_pg *pg, const char *name, const void *buf, size_t count, braid_dtype dtype,
                              int peer, void *cuda_stream)
{
    BRAID_CHECK(braid__check_common(pg, name, count, 0, dtype, cuda_stream));
    BRAID_CHECK(braid__check_ptr(pg, name, "buf", buf, count));
    BRAID_CHECK(braid__check_host(pg, name, "buf", buf, count));
    if (peer < 0 || peer >= pg->size)
        return braid__error(BRAID_ERR_INVALID_ARG, "rank %d: %s: peer %d out of range [0, %d)", pg->rank, name, peer,
                            pg->size);
    /* A message to oneself only completes against its partner in a group. */
    if (peer == pg->rank && !braid__group_open_here(pg))
        return braid__error(BRAID_ERR_INVALID_ARG,
                            "rank %d: %s with itself outside a group would never complete: pair it with a %s "
                            "between braid_group_start and braid_group_end",
                            pg->rank, name, name[0] == 's' ? "recv" : "send");
    return BRAID_OK;
}

BRAID_API braid_status braid_send(braid_pg *pg, const void *buf, size_t count, braid_dtype dtype, int peer,
                                  void *cuda_stream, braid_work **work)
{
    BRAID_CHECK(check_p2p(pg, "send", buf, count, dtype, peer, cuda_stream));
    braid_coll c = {.kind = BRAID_COLL_SEND,
                    .send = buf,
                    .count = count,
                    .dtype = dtype,
                    .op = BRAID_SUM,
                    .root = -1,
                    .peer = peer};
    return braid__work_submit(pg, &c, work);
}

BRAID_API braid_status braid_recv(braid_pg *pg, void *buf, size_t count, braid_dtype dtype, int peer, void *cuda_stream,
                                  braid_work **work)
{
    BRAID_CHECK(check_p2p(pg, "recv", buf, count, dtype, peer, cuda_stream));
    braid_coll c = {.kind = BRAID_COLL_RECV,
                    .recv = buf,
                    .count = count,
                    .dtype = dtype,
                    .op = BRAID_SUM,
                    .root = -1,
                    .peer = peer};
    return braid__work_submit(pg, &c, work);
}

BRAID_API braid_status braid_reduce(braid_pg *pg, const void *send, void *recv, size_t count, braid_dtype dtype,
                                    braid_op op, int root, void *cuda_stream, braid_work **work)
{
    braid_status st = reduce_checked(pg, send, recv, count, dtype, op, root, cuda_stream, work);
    braid_coll c = {.kind = BRAID_COLL_REDUCE, .send = send, .recv = recv, .count = count, .dtype = dtype, .op = op, .root = root};
    return st == BRAID_ERR_INVALID_ARG ? braid__coll_refuse(pg, &c, st) : st;
}

BRAID_API braid_status braid_allgather(braid_pg *pg, const void *send, void *recv, size_t sendcount, braid_dtype dtype,
                                       void *cuda_stream, braid_work **work)
{
    braid_status st = allgather_checked(pg, send, recv, sendcount, dtype, cuda_stream, work);
    braid_coll c = {.kind = BRAID_COLL_ALLGATHER, .send = send, .recv = recv, .count = sendcount, .dtype = dtype, .op = BRAID_SUM, .root = -1};
    return st == BRAID_ERR_INVALID_ARG ? braid__coll_refuse(pg, &c, st) : st;
}

BRAID_API braid_status braid_reduce_scatter(braid_pg *pg, const void *send, void *recv, size_t recvcount,
                                            braid_dtype dtype, braid_op op, void *cuda_stream, braid_work **work)
{
    braid_status st = reduce_scatter_checked(pg, send, recv, recvcount, dtype, op, cuda_stream, work);
    braid_coll c = {.kind = BRAID_COLL_REDUCE_SCATTER, .send = send, .recv = recv, .count = recvcount, .dtype = dtype, .op = op, .root = -1};
    return st == BRAID_ERR_INVALID_ARG ? braid__coll_refuse(pg, &c, st) : st;
}
