/* Hierarchical all-reduce for groups spread over several hosts: the bulk of
 * the data crosses hosts once per local rank, in parallel, instead of
 * around one ring that alternates between shared memory and the network.
 *
 * With H hosts and S = the fewest ranks on any host, the buffer is cut into
 * S shards (braid__segment). Three passes of the ring engine (ring_allreduce.c)
 * follow:
 *
 *  1. reduce-scatter over this host's ranks (shared memory where the local
 *     transport serves them): the host's j-th rank ends with the host's
 *     partial of shard j. Ranks at positions >= S get empty segments; they
 *     forward the others' partials and end with nothing of their own.
 *  2. for every j < S, a ring all-reduce of shard j over the j-th rank of
 *     every host (hosts ordered by their lowest rank): S independent rings,
 *     so all local ranks use the inter-host links at once. Its last
 *     reduce-scatter combine is the only one that applies AVG's division,
 *     by the whole group's size.
 *  3. all-gather over this host's ranks, in the ring positions that pass 1
 *     left the shards in.
 *
 * Every combine before the last one is the op itself (AVG combines as SUM),
 * and the last one is braid__reduce_final on the complete partial pair, as
 * in the flat ring: integer results and float results of exactly
 * representable data are bit-identical to it (only the order of the
 * combines differs). Hosts with different rank counts are handled (S is the
 * smallest host's count); any grouping of ranks gives correct results, the
 * topology only decides the speed.
 *
 * Passes 1 and 2 exchange call fingerprints on their links; pass 3 reuses
 * pass 1's links and skips them. No pass waits on a later one of another
 * rank, so the phases cannot deadlock: pass 2's rings need only pass 1 to
 * have finished on their members. */
#include <stdlib.h>
#include <string.h>

#include "algo.h"
#include "log.h"
#include "status.h"

typedef struct {
    uint64_t hash;
    int rank;
} host_entry;

static int entry_cmp(const void *a, const void *b)
{
    const host_entry *x = a, *y = b;
    if (x->hash != y->hash)
        return x->hash < y->hash ? -1 : 1;
    return (x->rank > y->rank) - (x->rank < y->rank);
}

/* Sort (host hash, rank) pairs: each host is then a run of ranks in
 * ascending order, whose first rank names it. */
static braid_hier_topo *topo_build(const braid_algo_ctx *ctx)
{
    int n = ctx->size;
    host_entry *e = malloc((size_t)n * sizeof(*e));
    int *host_no = malloc((size_t)n * sizeof(*host_no)); /* by leader rank; -1 elsewhere */
    braid_hier_topo *t = NULL;
    if (!e || !host_no)
        goto out_free;
    for (int p = 0; p < n; p++) {
        e[p].hash = ctx->host_hash[p];
        e[p].rank = p;
        host_no[p] = -1;
    }
    qsort(e, (size_t)n, sizeof(*e), entry_cmp);

    int nhosts = 0, min_local = n, max_local = 0, my_start = 0, my_len = 0;
    for (int i = 0; i < n;) {
        int j = i;
        while (j < n && e[j].hash == e[i].hash)
            j++;
        host_no[e[i].rank] = -2; /* a host's lowest rank: numbered below, in rank order */
        nhosts++;
        min_local = j - i < min_local ? j - i : min_local;
        max_local = j - i > max_local ? j - i : max_local;
        for (int k = i; k < j; k++)
            if (e[k].rank == ctx->rank) {
                my_start = i;
                my_len = j - i;
            }
        i = j;
    }
    t = malloc(sizeof(*t) + (size_t)(my_len + nhosts) * sizeof(int));
    if (!t)
        goto out_free;
    t->nhosts = nhosts;
    t->min_local = min_local;
    t->max_local = max_local;
    t->nlocal = my_len;
    t->local = (int *)(t + 1);
    t->cross = t->local + my_len;
    t->local_index = 0;
    for (int k = 0; k < my_len; k++) {
        t->local[k] = e[my_start + k].rank;
        if (t->local[k] == ctx->rank)
            t->local_index = k;
    }
    int h = 0;
    for (int p = 0; p < n; p++)
        if (host_no[p] == -2)
            host_no[p] = h++;
    t->host = host_no[t->local[0]];
    for (int i = 0; i < n;) {
        int j = i;
        while (j < n && e[j].hash == e[i].hash)
            j++;
        t->cross[host_no[e[i].rank]] = t->local_index < j - i ? e[i + t->local_index].rank : -1;
        i = j;
    }
out_free:
    free(e);
    free(host_no);
    return t;
}

const braid_hier_topo *braid__hier_topo(const braid_algo_ctx *ctx)
{
    if (!*ctx->hier_topo && ctx->host_hash) {
        *ctx->hier_topo = topo_build(ctx);
        if (!*ctx->hier_topo)
            BRAID_WARN("rank %d: out of memory for the host topology: flat algorithms only", ctx->rank);
    }
    return *ctx->hier_topo;
}

braid_status braid__hier_allreduce(braid_algo_run *run)
{
    const braid_algo_ctx *ctx = run->ctx;
    const braid_coll *coll = run->coll;
    const braid_hier_topo *t = braid__hier_topo(ctx);
    if (!t || t->nhosts < 2 || t->max_local < 2) /* the tuner does not pick it there */
        return braid__ring_allreduce(run);

    int m = t->nlocal, shards = t->min_local;
    size_t esize = braid_dtype_size(coll->dtype);

    /* 1: this host's partial of shard j lands on local position j. */
    braid_ring_pass local = {.members = t->local,
                             .n = m,
                             .index = t->local_index,
                             .send = coll->send,
                             .recv = coll->recv,
                             .count = coll->count,
                             .nshards = shards,
                             .shard_shift = 1,
                             .first_step = 0,
                             .end_step = m - 1,
                             .divisor = 0,
                             .fp = 1};
    BRAID_CHECK(braid__ring_pass(run, &local));

    /* 2: shard j across hosts, in place in recv. */
    if (t->local_index < shards) {
        size_t start, len;
        braid__segment(coll->count, shards, t->local_index, &start, &len);
        uint8_t *shard = len ? (uint8_t *)coll->recv + start * esize : coll->recv; /* recv may be NULL at 0 */
        braid_ring_pass cross = {.members = t->cross,
                                 .n = t->nhosts,
                                 .index = t->host,
                                 .send = shard,
                                 .recv = shard,
                                 .count = len,
                                 .nshards = t->nhosts,
                                 .shard_shift = 0,
                                 .first_step = 0,
                                 .end_step = 2 * (t->nhosts - 1),
                                 .divisor = ctx->size,
                                 .fp = 1};
        BRAID_CHECK(braid__ring_pass(run, &cross));
    }

    /* 3: every finished shard to every local rank. */
    local.send = coll->recv;
    local.first_step = m - 1;
    local.end_step = 2 * (m - 1);
    local.fp = 0;
    return braid__ring_pass(run, &local);
}
