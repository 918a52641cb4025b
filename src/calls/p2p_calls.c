/* Entry points of send and receive: argument checks, then the executor (or
 * the open group, which braid__work_submit records into, where a send to
 * oneself meets its matching receive). A call refused outside a group is
 * told to the peers, as a refused collective is (refuse.h). */
#include "coll_check.h"
#include "hmem.h"
#include "pg.h"
#include "refuse.h"
#include "status.h"

static braid_status check_p2p(braid_pg *pg, const char *name, const braid_coll *c, int peer)
{
    BRAID_CHECK(braid__check_call(pg, name, c, NULL));
    /* A message to oneself only completes against its partner in a group. */
    if (peer == pg->rank && !braid__group_open_here(pg))
        return braid__error(BRAID_ERR_INVALID_ARG,
                            "rank %d: %s with itself outside a group would never complete: pair it with a %s "
                            "between braid_group_start and braid_group_end",
                            pg->rank, name, name[0] == 's' ? "recv" : "send");
    return BRAID_OK;
}

/* Checked, then queued (device buffers through the staging layer,
 * hmem.h); refused, the partner (maybe blocked on this call) learns why. */
braid_status braid__p2p_submit(braid_pg *pg, braid_coll_kind kind, const void *buf, size_t count, braid_dtype dtype,
                               int peer, const braid_mem *mem, void *cuda_stream, braid_work **work)
{
    int send = kind == BRAID_COLL_SEND;
    braid_coll c = {.kind = kind,
                    .send = send ? buf : NULL,
                    .recv = send ? NULL : (void *)buf,
                    .count = count,
                    .dtype = dtype,
                    .op = BRAID_SUM,
                    .root = -1,
                    .peer = peer};
    braid_status st = check_p2p(pg, send ? "send" : "recv", &c, peer);
    if (st != BRAID_OK)
        return braid__coll_refuse(pg, &c, st);
    braid_mem m[2] = {{0, 0}, {0, 0}};
    if (mem)
        m[send ? 0 : 1] = *mem;
    braid__coll_classify(&c, mem ? m : NULL);
    return braid__hmem_submit(pg, &c, cuda_stream, work);
}

BRAID_API braid_status braid_send(braid_pg *pg, const void *buf, size_t count, braid_dtype dtype, int peer,
                                  void *cuda_stream, braid_work **work)
{
    return braid__p2p_submit(pg, BRAID_COLL_SEND, buf, count, dtype, peer, NULL, cuda_stream, work);
}

BRAID_API braid_status braid_recv(braid_pg *pg, void *buf, size_t count, braid_dtype dtype, int peer, void *cuda_stream,
                                  braid_work **work)
{
    return braid__p2p_submit(pg, BRAID_COLL_RECV, buf, count, dtype, peer, NULL, cuda_stream, work);
}
