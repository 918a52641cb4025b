/* Ring reduce-scatter: the first half of the ring all-reduce on its own.
 *
 * send holds n blocks of `count` elements; rank r ends with the reduction
 * of block r over all ranks in recv. At step s (0..n-2) rank r sends block
 * (r - s - 1) mod n to rank r+1 and receives block (r - s - 2) mod n from
 * rank r-1, which it combines with its own input of that block; the last
 * step's block is r itself, combined with the final pass (AVG's division).
 *
 * Unlike the all-reduce, recv is one block, not the whole buffer, so the
 * running partial of each step is kept in recv itself: a chunk received at
 * step s is reduced into recv at its offset and forwarded from there at
 * step s+1. A chunk of recv is therefore rewritten only after the send
 * that reads the previous step's partial from it has completed. Receives
 * land in staging slots, freed as soon as they are reduced. Every wait is
 * on an earlier item, here or on a neighbour, so the pipeline cannot stall
 * on itself whatever the chunk count.
 *
 * In place (recv == send + r * count) the partials would overwrite the own
 * input of block r before its final use, so that block is stashed first. */
#include <string.h>

#include "pipeline.h"
#include "reduce/reduce.h"
#include "status.h"

#define RECV_SLOTS 8 /* chunks in flight into staging */

typedef struct {
    int n, rank;
    size_t count, esize, elems_per_chunk, chunks; /* chunks per block */
    size_t last_step_first;                       /* first item of the last step */
    const uint8_t *send, *own_block;
    uint8_t *recv, *staging;
    size_t slot_bytes;
} layout;

/* Item k is (step k / chunks, chunk k % chunks); the block it carries is
 * (rank - step - shift) mod n: shift 1 for sends, 2 for receives. */
static void item_range(const layout *g, size_t k, int shift, int *step, int *block, size_t *off, size_t *len)
{
    *step = (int)(k / g->chunks);
    *block = ((g->rank - *step - shift) % g->n + g->n) % g->n;
    *off = (k % g->chunks) * g->elems_per_chunk;
    *len = g->count - *off < g->elems_per_chunk ? g->count - *off : g->elems_per_chunk;
}

/* Step 0 sends the own input; later steps forward the partial that the
 * previous step's combine left in recv. */
static braid_status rs_send_item(braid_pipeline *p, size_t k, const void **buf, size_t *bytes)
{
    const layout *g = p->sched;
    int step, block;
    size_t off, len;
    item_range(g, k, 1, &step, &block, &off, &len);
    *bytes = len * g->esize;
    *buf = step == 0 ? g->send + ((size_t)block * g->count + off) * g->esize : g->recv + off * g->esize;
    return BRAID_OK;
}

static braid_status rs_recv_item(braid_pipeline *p, size_t k, void **buf, size_t *bytes)
{
    const layout *g = p->sched;
    int step, block;
    size_t off, len;
    item_range(g, k, 2, &step, &block, &off, &len);
    *bytes = len * g->esize;
    *buf = g->staging + (k % RECV_SLOTS) * g->slot_bytes;
    return BRAID_OK;
}

static braid_status rs_combine(braid_pipeline *p, size_t k)
{
    const layout *g = p->sched;
    const braid_coll *coll = p->run->coll;
    int step, block;
    size_t off, len;
    item_range(g, k, 2, &step, &block, &off, &len);
    const uint8_t *slot = g->staging + (k % RECV_SLOTS) * g->slot_bytes;
    const uint8_t *mine = (block == g->rank ? g->own_block : g->send + (size_t)block * g->count * g->esize) +
                          off * g->esize;
    uint8_t *dst = g->recv + off * g->esize;
    if (k >= g->last_step_first)
        braid__reduce_final(coll->dtype, coll->op, dst, mine, slot, len, g->n);
    else
        braid__reduce(coll->dtype, coll->op, dst, mine, slot, len);
    return BRAID_OK;
}

static const braid_pipeline_hooks rs_hooks = {
    .send_item = rs_send_item, .recv_item = rs_recv_item, .combine = rs_combine};

braid_status braid__ring_reduce_scatter(braid_algo_run *run)
{
    const braid_algo_ctx *ctx = run->ctx;
    const braid_coll *coll = run->coll;
    layout g = {.n = ctx->size, .rank = ctx->rank, .count = coll->count, .esize = braid_dtype_size(coll->dtype),
                .send = coll->send, .recv = coll->recv};
    size_t block_bytes = g.count * g.esize;

    if (g.n == 1) {
        if (block_bytes && g.recv != g.send)
            memmove(g.recv, g.send, block_bytes);
        braid__reduce_scale(coll->dtype, coll->op, g.recv, g.count, 1);
        return BRAID_OK;
    }
    g.elems_per_chunk = ctx->chunk_bytes / g.esize ? ctx->chunk_bytes / g.esize : 1;
    g.chunks = (g.count + g.elems_per_chunk - 1) / g.elems_per_chunk;
    g.last_step_first = (size_t)(g.n - 2) * g.chunks;
    size_t total = (size_t)(g.n - 1) * g.chunks;

    /* A slot never needs more than one block, whatever the chunk size. */
    g.slot_bytes = (g.elems_per_chunk < g.count ? g.elems_per_chunk : g.count) * g.esize;
    int in_place = block_bytes && g.recv == g.send + (size_t)g.rank * block_bytes;
    BRAID_CHECK(braid__ctx_scratch(ctx, RECV_SLOTS * g.slot_bytes + (in_place ? block_bytes : 0),
                                   (void **)&g.staging));
    g.own_block = g.send + (size_t)g.rank * block_bytes;
    if (in_place) {
        memcpy(g.staging + RECV_SLOTS * g.slot_bytes, g.own_block, block_bytes);
        g.own_block = g.staging + RECV_SLOTS * g.slot_bytes;
    }

    /* From step 1 on, a combine rewrites the recv chunk whose previous
     * partial the same item's send forwards: it waits for that send. */
    braid_pipeline p = {.run = run,
                        .hooks = &rs_hooks,
                        .sched = &g,
                        .next = (g.rank + 1) % g.n,
                        .prev = (g.rank + g.n - 1) % g.n,
                        .sends = total,
                        .recvs = total,
                        .send_lead = g.chunks,
                        .combine_lead = g.chunks,
                        .recv_slots = RECV_SLOTS,
                        .fp = 1};
    return braid__pipeline_run(&p);
}
