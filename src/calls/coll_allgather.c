/* Entry point of all-gather: argument checks with the caller's view of the
 * buffers (send may be this rank's own block of recv: in place), then the
 * executor (or the open group, which braid__work_submit records into);
 * device buffers through the staging layer (hmem.h). */
#include "coll_check.h"
#include "hmem.h"
#include "pg.h"
#include "refuse.h"
#include "status.h"

static braid_status allgather_checked(braid_pg *pg, const void *send, void *recv, size_t sendcount, braid_dtype dtype,
                                       void *cuda_stream, braid_work **work)
{
    braid_coll c = {.kind = BRAID_COLL_ALLGATHER, .send = send, .recv = recv, .count = sendcount, .dtype = dtype,
                    .op = BRAID_SUM, .root = -1};
    BRAID_CHECK(braid__check_call(pg, "allgather", &c, NULL));
    braid__coll_classify(&c, NULL);
    return braid__hmem_submit(pg, &c, cuda_stream, work); /* host memory: braid__work_submit */
}

BRAID_API braid_status braid_allgather(braid_pg *pg, const void *send, void *recv, size_t sendcount, braid_dtype dtype,
                                       void *cuda_stream, braid_work **work)
{
    braid_status st = allgather_checked(pg, send, recv, sendcount, dtype, cuda_stream, work);
    braid_coll c = {.kind = BRAID_COLL_ALLGATHER, .send = send, .recv = recv, .count = sendcount, .dtype = dtype, .op = BRAID_SUM, .root = -1};
    return st == BRAID_ERR_INVALID_ARG ? braid__coll_refuse(pg, &c, st) : st;
}
