/* Tuner and dispatch: picks an algorithm per call, runs it, and turns a
 * failure into a broken group so that every rank fails fast. */
#include "algo.h"
#include "hmem.h"
#include "status.h"

/* Below this size all-reduce is latency-bound and recursive doubling's
 * log2(n) rounds beat the ring's 2(n-1) steps (see docs/PERFORMANCE.md). */
#define RD_MAX_BYTES (64 * 1024)

static braid_algo tune_allreduce(const braid_pg *pg, const braid_coll *coll)
{
    if (pg->algo != BRAID_ALGO_AUTO)
        return pg->algo;
    size_t bytes = coll->count * braid_dtype_size(coll->dtype);
    return bytes <= RD_MAX_BYTES ? BRAID_ALGO_RECURSIVE_DOUBLING : BRAID_ALGO_RING;
}

static int is_p2p(const braid_coll *c)
{
    return c->kind == BRAID_COLL_SEND || c->kind == BRAID_COLL_RECV;
}

static braid_status run_algo(braid_pg *pg, braid_coll *coll, braid_algo_run *run)
{
    switch (coll->kind) {
    case BRAID_COLL_BROADCAST: return braid__chain_broadcast(run);
    case BRAID_COLL_REDUCE: return braid__chain_reduce(run);
    case BRAID_COLL_ALLGATHER: return braid__ring_allgather(run);
    case BRAID_COLL_REDUCE_SCATTER: return braid__ring_reduce_scatter(run);
    case BRAID_COLL_SEND:
    case BRAID_COLL_RECV: return braid__p2p_run(run, coll, 1);
    case BRAID_COLL_ALLREDUCE:
        coll->algo = tune_allreduce(pg, coll);
        return coll->algo == BRAID_ALGO_RECURSIVE_DOUBLING ? braid__rd_allreduce(run) : braid__ring_allreduce(run);
    case BRAID_COLL_GROUP: break;
    }
    return braid__error(BRAID_ERR_INTERNAL, "rank %d: job of unknown kind %d", pg->rank, (int)coll->kind);
}

static braid_status run_one(braid_pg *pg, braid_coll *coll)
{
    braid_algo_run run;
    braid__algo_run_init(&run, pg, coll);
    return braid__fp_explain(&run, run_algo(pg, coll, &run));
}

/* A group runs in issue order; each run of consecutive sends and receives
 * progresses as one batch, so exchanges with several peers cannot wait on
 * each other. Its collectives take the job's sequence numbers in order. */
static braid_status run_group(braid_pg *pg, braid_coll *group)
{
    uint64_t seq = group->seq;
    for (int i = 0; i < group->nops;) {
        braid_coll *op = &group->ops[i];
        if (!is_p2p(op)) {
            op->seq = seq++;
            BRAID_CHECK(run_one(pg, op));
            i++;
            continue;
        }
        int n = 1;
        while (i + n < group->nops && is_p2p(&group->ops[i + n]))
            n++;
        braid_algo_run run;
        braid__algo_run_init(&run, pg, op);
        BRAID_CHECK(braid__p2p_run(&run, op, n));
        i += n;
    }
    return BRAID_OK;
}

braid_status braid__coll_run(braid_pg *pg, braid_coll *coll)
{
    if (coll->hmem) /* device buffers: staged pieces come back here as host calls */
        return braid__hmem_coll_run(pg, coll);
    braid_status st = braid__pg_check_usable(pg, braid__coll_name(coll->kind));
    if (st != BRAID_OK)
        return st;
    st = coll->kind == BRAID_COLL_GROUP ? run_group(pg, coll) : run_one(pg, coll);
    if (st != BRAID_OK)
        braid__pg_fail(pg, st);
    return st;
}
