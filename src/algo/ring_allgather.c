/* Ring all-gather: the second half of the ring all-reduce on its own.
 *
 * recv holds n blocks of `count` elements, block b from rank b. At step s
 * (0..n-2) rank r sends block (r - s) mod n to rank r+1 and receives block
 * (r - s - 1) mod n from rank r-1, straight into its place in recv: no
 * staging and no copy beyond the rank's own block.
 *
 * Blocks are cut into chunks that flow through a pipeline. The chunk sent
 * at step s >= 1 is the chunk received at step s-1, so the sends are gated,
 * in order, by the receives: send item k (k >= chunks per block) may go once
 * receive item k - chunks is done. Step 0 sends from the caller's send
 * buffer, so the copy of the own block into recv overlaps the transfers. */
#include <string.h>

#include "ring_cursor.h"
#include "status.h"

typedef struct {
    braid_block_ring b;
    const uint8_t *send;
    uint8_t *recv, *own;
} layout;

/* Block b sits at b * count in recv. */
static uint8_t *block_at(const layout *g, int block, size_t off)
{
    return g->recv + ((size_t)block * g->b.count + off) * g->b.esize;
}

static braid_status ag_send_item(braid_pipeline *p, size_t k, const void **buf, size_t *bytes)
{
    const layout *g = p->sched;
    int step, block;
    size_t off, len;
    braid__block_ring_item(&g->b, k, 0, &step, &block, &off, &len);
    *bytes = len * g->b.esize;
    *buf = step == 0 ? g->send + off * g->b.esize : block_at(g, block, off);
    return BRAID_OK;
}

static braid_status ag_recv_item(braid_pipeline *p, size_t k, void **buf, size_t *bytes)
{
    const layout *g = p->sched;
    int step, block;
    size_t off, len;
    braid__block_ring_item(&g->b, k, 1, &step, &block, &off, &len);
    *bytes = len * g->b.esize;
    *buf = block_at(g, block, off);
    return BRAID_OK;
}

/* The own block's copy into recv, after the first sends are on their way,
 * so that it overlaps them. */
static void ag_copy_own(braid_pipeline *p)
{
    const layout *g = p->sched;
    memcpy(g->own, g->send, g->b.count * g->b.esize);
}

static const braid_pipeline_hooks ag_hooks = {.send_item = ag_send_item, .recv_item = ag_recv_item};
static const braid_pipeline_hooks ag_hooks_copy = {
    .send_item = ag_send_item, .recv_item = ag_recv_item, .started = ag_copy_own};

braid_status braid__ring_allgather(braid_algo_run *run)
{
    const braid_algo_ctx *ctx = run->ctx;
    const braid_coll *coll = run->coll;
    size_t count = coll->count, esize = braid_dtype_size(coll->dtype);
    layout g = {.send = coll->send, .recv = coll->recv};
    g.own = g.recv + (size_t)ctx->rank * count * esize;
    /* In place means the input already is the own block. */
    int need_copy = count > 0 && (const uint8_t *)g.own != g.send;

    if (ctx->size == 1) {
        if (need_copy)
            memcpy(g.own, g.send, count * esize);
        return BRAID_OK;
    }
    braid__block_ring_init(&g.b, ctx, count, esize);
    braid_pipeline p = {.run = run,
                        .hooks = need_copy ? &ag_hooks_copy : &ag_hooks,
                        .sched = &g,
                        .recv_slots = BRAID_PIPE_WINDOW,
                        .fp = 1};
    braid__block_ring_pipeline(&g.b, &p);
    return braid__pipeline_run(&p);
}
