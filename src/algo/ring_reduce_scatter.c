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

#include "reduce/reduce.h"
#include "ring_cursor.h"
#include "status.h"

#define RECV_SLOTS 8 /* chunks in flight into staging */

typedef struct {
    braid_block_ring b;
    size_t last_step_first; /* first item of the last step */
    const uint8_t *send, *own_block;
    uint8_t *recv, *staging;
    size_t slot_bytes;
} layout;

/* Sends carry block (rank - step - 1) mod n, receives (rank - step - 2). */
#define SEND_SHIFT 1
#define RECV_SHIFT 2

/* Step 0 sends the own input; later steps forward the partial that the
 * previous step's combine left in recv. */
static braid_status rs_send_item(braid_pipeline *p, size_t k, const void **buf, size_t *bytes)
{
    const layout *g = p->sched;
    size_t es = g->b.esize, off, len;
    int step, block;
    braid__block_ring_item(&g->b, k, SEND_SHIFT, &step, &block, &off, &len);
    *bytes = len * es;
    *buf = step == 0 ? g->send + ((size_t)block * g->b.count + off) * es : g->recv + off * es;
    return BRAID_OK;
}

static braid_status rs_recv_item(braid_pipeline *p, size_t k, void **buf, size_t *bytes)
{
    const layout *g = p->sched;
    int step, block;
    size_t off, len;
    braid__block_ring_item(&g->b, k, RECV_SHIFT, &step, &block, &off, &len);
    *bytes = len * g->b.esize;
    *buf = g->staging + (k % RECV_SLOTS) * g->slot_bytes;
    return BRAID_OK;
}

static braid_status rs_combine(braid_pipeline *p, size_t k)
{
    const layout *g = p->sched;
    const braid_coll *coll = p->run->coll;
    size_t es = g->b.esize, off, len;
    int step, block;
    braid__block_ring_item(&g->b, k, RECV_SHIFT, &step, &block, &off, &len);
    const uint8_t *slot = g->staging + (k % RECV_SLOTS) * g->slot_bytes;
    const uint8_t *mine = (block == g->b.rank ? g->own_block : g->send + (size_t)block * g->b.count * es) + off * es;
    uint8_t *dst = g->recv + off * es;
    if (k >= g->last_step_first)
        braid__reduce_final(coll->dtype, coll->op, dst, mine, slot, len, g->b.n);
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
    size_t count = coll->count, esize = braid_dtype_size(coll->dtype), block_bytes = count * esize;
    layout g = {.send = coll->send, .recv = coll->recv};

    if (ctx->size == 1) {
        if (block_bytes && g.recv != g.send)
            memmove(g.recv, g.send, block_bytes);
        braid__reduce_scale(coll->dtype, coll->op, g.recv, count, 1);
        return BRAID_OK;
    }
    braid__block_ring_init(&g.b, ctx, count, esize);
    g.last_step_first = (size_t)(g.b.n - 2) * g.b.chunks;

    /* A slot never needs more than one block, whatever the chunk size. */
    g.slot_bytes = (g.b.elems_per_chunk < count ? g.b.elems_per_chunk : count) * esize;
    int in_place = block_bytes && g.recv == g.send + (size_t)ctx->rank * block_bytes;
    BRAID_CHECK(braid__ctx_scratch(ctx, RECV_SLOTS * g.slot_bytes + (in_place ? block_bytes : 0),
                                   (void **)&g.staging));
    g.own_block = g.send + (size_t)ctx->rank * block_bytes;
    if (in_place) {
        memcpy(g.staging + RECV_SLOTS * g.slot_bytes, g.own_block, block_bytes);
        g.own_block = g.staging + RECV_SLOTS * g.slot_bytes;
    }

    /* From step 1 on, a combine rewrites the recv chunk whose previous
     * partial the same item's send forwards: it waits for that send. */
    braid_pipeline p = {.run = run,
                        .hooks = &rs_hooks,
                        .sched = &g,
                        .combine_lead = g.b.chunks,
                        .recv_slots = RECV_SLOTS,
                        .fp = 1};
    braid__block_ring_pipeline(&g.b, &p);
    return braid__pipeline_run(&p);
}
