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

#include "pipeline.h"
#include "status.h"

typedef struct {
    int n, rank;
    size_t count, esize, elems_per_chunk, chunks; /* chunks per block */
    const uint8_t *send;
    uint8_t *recv, *own;
} layout;

/* Block and element range of item k (step k / chunks, chunk k % chunks)
 * for a direction whose block at step s is (rank - s - shift) mod n. */
static void item_range(const layout *g, size_t k, int shift, int *block, size_t *off, size_t *len)
{
    int step = (int)(k / g->chunks);
    size_t c = k % g->chunks;
    *block = ((g->rank - step - shift) % g->n + g->n) % g->n;
    *off = c * g->elems_per_chunk;
    *len = g->count - *off < g->elems_per_chunk ? g->count - *off : g->elems_per_chunk;
}

static braid_status ag_send_item(braid_pipeline *p, size_t k, const void **buf, size_t *bytes)
{
    const layout *g = p->sched;
    int block;
    size_t off, len;
    item_range(g, k, 0, &block, &off, &len);
    *bytes = len * g->esize;
    *buf = k < g->chunks ? g->send + off * g->esize : g->recv + ((size_t)block * g->count + off) * g->esize;
    return BRAID_OK;
}

static braid_status ag_recv_item(braid_pipeline *p, size_t k, void **buf, size_t *bytes)
{
    const layout *g = p->sched;
    int block;
    size_t off, len;
    item_range(g, k, 1, &block, &off, &len);
    *bytes = len * g->esize;
    *buf = g->recv + ((size_t)block * g->count + off) * g->esize;
    return BRAID_OK;
}

/* The own block's copy into recv, after the first sends are on their way,
 * so that it overlaps them. */
static void ag_copy_own(braid_pipeline *p)
{
    const layout *g = p->sched;
    memcpy(g->own, g->send, g->count * g->esize);
}

static const braid_pipeline_hooks ag_hooks = {.send_item = ag_send_item, .recv_item = ag_recv_item};
static const braid_pipeline_hooks ag_hooks_copy = {
    .send_item = ag_send_item, .recv_item = ag_recv_item, .started = ag_copy_own};

braid_status braid__ring_allgather(braid_algo_run *run)
{
    const braid_algo_ctx *ctx = run->ctx;
    const braid_coll *coll = run->coll;
    layout g = {.n = ctx->size, .rank = ctx->rank, .count = coll->count, .esize = braid_dtype_size(coll->dtype),
                .send = coll->send, .recv = coll->recv};
    g.own = g.recv + (size_t)g.rank * g.count * g.esize;
    /* In place means the input already is the own block. */
    int need_copy = g.count > 0 && (const uint8_t *)g.own != g.send;

    if (g.n == 1) {
        if (need_copy)
            memcpy(g.own, g.send, g.count * g.esize);
        return BRAID_OK;
    }
    g.elems_per_chunk = ctx->chunk_bytes / g.esize ? ctx->chunk_bytes / g.esize : 1;
    g.chunks = (g.count + g.elems_per_chunk - 1) / g.elems_per_chunk;
    size_t total = (size_t)(g.n - 1) * g.chunks;

    braid_pipeline p = {.run = run,
                        .hooks = need_copy ? &ag_hooks_copy : &ag_hooks,
                        .sched = &g,
                        .next = (g.rank + 1) % g.n,
                        .prev = (g.rank + g.n - 1) % g.n,
                        .sends = total,
                        .recvs = total,
                        .send_lead = g.chunks,
                        .recv_slots = BRAID_PIPE_WINDOW,
                        .fp = 1};
    return braid__pipeline_run(&p);
}
