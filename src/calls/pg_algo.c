/* Where a process group meets the algorithms: the context they see is
 * filled here and nowhere else, and braid__coll_run enters them. */
#include "pg_algo.h"

#include "coll_check.h"
#include "devlink.h"
#include "hmem.h"
#include "refuse.h"

/* Device all-reduces above one staging piece run the device ring where the
 * host path would run the ring (cuda/device_ring.c), so recursive doubling
 * must never reach past a piece. */
_Static_assert(BRAID_RD_MAX_CAP <= BRAID_HMEM_PIECE_BYTES, "recursive doubling's range must stay within one piece");

static braid_status ctx_conn(void *owner, int peer, braid_conn **conn)
{
    return braid__pg_conn(owner, peer, conn);
}

static braid_status ctx_scratch(void *owner, size_t bytes, void **buf)
{
    return braid__pg_scratch(owner, bytes, buf);
}

static int ctx_has_devlink(void *owner, int peer)
{
    return braid__devlink(owner, peer) != NULL;
}

static braid_status ctx_prepare(void *owner, braid_coll *coll, void **scratch)
{
    const braid_pg *pg = owner;
    return braid__mulsum_prepare(pg->rank, pg->size, coll, scratch);
}

void braid__pg_algo_ctx(braid_pg *pg, braid_algo_ctx *ctx)
{
    *ctx = (braid_algo_ctx){.rank = pg->rank,
                            .size = pg->size,
                            .chunk_bytes = pg->chunk_bytes,
                            .timeout_ms = pg->timeout_ms,
                            .algo = pg->algo,
                            .wake_fd = pg->wake_fd,
                            .aborted = &pg->aborted,
                            .host_hash = pg->host_hash,
                            .hier_topo = &pg->hier_topo,
                            .algo_logged = &pg->algo_logged,
                            .p2p_seq = &pg->p2p_seq,
                            .owner = pg,
                            .conn = ctx_conn,
                            .scratch = ctx_scratch,
                            .has_devlink = ctx_has_devlink,
                            .prepare = ctx_prepare};
}

braid_algo braid__pg_allreduce_algo(braid_pg *pg, size_t count, braid_dtype dtype)
{
    braid_algo_ctx ctx;
    braid__pg_algo_ctx(pg, &ctx);
    return braid__allreduce_algo(&ctx, count, dtype);
}

const braid_hier_topo *braid__pg_hier_topo(braid_pg *pg)
{
    braid_algo_ctx ctx;
    braid__pg_algo_ctx(pg, &ctx);
    return braid__hier_topo(&ctx);
}

braid_status braid__coll_run(braid_pg *pg, braid_coll *coll)
{
    if (coll->refused) /* this rank refused the call: tell the peers */
        return braid__refusal_run(pg, coll);
    if (coll->hmem) /* device buffers: staged pieces come back here as host calls */
        return braid__hmem_coll_run(pg, coll);
    braid_status st = braid__pg_check_usable(pg, braid__coll_job_name(coll));
    if (st != BRAID_OK)
        return st;
    braid_algo_ctx ctx;
    braid_mismatch_seen seen = {0};
    braid__pg_algo_ctx(pg, &ctx);
    ctx.mismatch = &seen;
    st = braid__algo_coll_run(&ctx, coll);
    /* Both calls of a mismatch go to every rank, and a peer's failure may
     * be its refusal of the call or its mismatch: say so (src/calls/refuse.c)
     * before the group breaks, so that later calls name the cause too. */
    if (st == BRAID_ERR_MISMATCH)
        braid__mismatch_tell(pg, &seen);
    st = braid__refusal_explain(pg, coll, st);
    if (st != BRAID_OK)
        braid__pg_fail(pg, st); /* every rank fails fast: close the links */
    return st;
}
