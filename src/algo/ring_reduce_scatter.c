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

#include "algo.h"
#include "reduce/reduce.h"
#include "status.h"

#define RECV_SLOTS 8  /* chunks in flight into staging */
#define SEND_WINDOW 8 /* sends posted ahead of completion */

typedef struct {
    int n, rank;
    size_t count, esize, elems_per_chunk, chunks; /* chunks per block */
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

braid_status braid__ring_reduce_scatter(braid_algo_run *run)
{
    const braid_algo_ctx *ctx = run->ctx;
    const braid_coll *coll = run->coll;
    layout g = {.n = ctx->size, .rank = ctx->rank, .count = coll->count, .esize = braid_dtype_size(coll->dtype)};
    const uint8_t *send = coll->send;
    uint8_t *recv = coll->recv;
    size_t block_bytes = g.count * g.esize;

    if (g.n == 1) {
        if (block_bytes && (const uint8_t *)recv != send)
            memmove(recv, send, block_bytes);
        braid__reduce_scale(coll->dtype, coll->op, recv, g.count, 1);
        return BRAID_OK;
    }
    g.elems_per_chunk = ctx->chunk_bytes / g.esize ? ctx->chunk_bytes / g.esize : 1;
    g.chunks = (g.count + g.elems_per_chunk - 1) / g.elems_per_chunk;
    size_t total = (size_t)(g.n - 1) * g.chunks, last_step_first = (size_t)(g.n - 2) * g.chunks;

    int next = (g.rank + 1) % g.n, prev = (g.rank + g.n - 1) % g.n;
    braid_conn *conns[2];
    BRAID_CHECK(braid__ctx_conn(ctx, next, &conns[0]));
    BRAID_CHECK(braid__ctx_conn(ctx, prev, &conns[1]));
    int nconns = conns[0] == conns[1] ? 1 : 2;

    /* A slot never needs more than one block, whatever the chunk size. */
    size_t slot_bytes = (g.elems_per_chunk < g.count ? g.elems_per_chunk : g.count) * g.esize;
    int in_place = block_bytes && (const uint8_t *)recv == send + (size_t)g.rank * block_bytes;
    uint8_t *staging;
    BRAID_CHECK(braid__ctx_scratch(ctx, RECV_SLOTS * slot_bytes + (in_place ? block_bytes : 0), (void **)&staging));
    const uint8_t *own_block = send + (size_t)g.rank * block_bytes;
    if (in_place) {
        memcpy(staging + RECV_SLOTS * slot_bytes, own_block, block_bytes);
        own_block = staging + RECV_SLOTS * slot_bytes;
    }

    braid_req recv_reqs[RECV_SLOTS], send_reqs[SEND_WINDOW];
    braid_ring_flow f = {.to_next = conns[0],
                         .from_prev = conns[nconns - 1],
                         .prev = prev,
                         .recv_reqs = recv_reqs,
                         .send_reqs = send_reqs,
                         .recv_window = RECV_SLOTS,
                         .send_window = SEND_WINDOW};
    BRAID_CHECK(braid__ring_flow_start(&f, coll));
    size_t reduced = 0;

    for (;;) {
        int moved = 0, step, block;
        size_t off, len;

        /* Step 0 sends the own input; later steps forward the partial that
         * the previous step's reduce left in recv. */
        while (f.posted_s < total && f.posted_s - f.done_s < SEND_WINDOW &&
               (f.posted_s < g.chunks || f.posted_s - g.chunks < reduced)) {
            item_range(&g, f.posted_s, 1, &step, &block, &off, &len);
            const uint8_t *src = step == 0 ? send + ((size_t)block * g.count + off) * g.esize : recv + off * g.esize;
            BRAID_CHECK(f.to_next->ops->isend(f.to_next, &send_reqs[f.posted_s % SEND_WINDOW], src, len * g.esize));
            f.posted_s++;
            moved = 1;
        }
        while (f.posted_r < total && f.posted_r - reduced < RECV_SLOTS) {
            item_range(&g, f.posted_r, 2, &step, &block, &off, &len);
            uint8_t *slot = staging + (f.posted_r % RECV_SLOTS) * slot_bytes;
            BRAID_CHECK(
                f.from_prev->ops->irecv(f.from_prev, &recv_reqs[f.posted_r % RECV_SLOTS], slot, len * g.esize));
            f.posted_r++;
            moved = 1;
        }
        BRAID_CHECK(braid__ring_flow_poll(run, &f, &moved));
        /* Reduce in order. From step 1 on, the recv chunk being written
         * still holds the previous partial until its forwarding send is done. */
        while (reduced < f.done_r && (reduced < g.chunks || reduced < f.done_s)) {
            item_range(&g, reduced, 2, &step, &block, &off, &len);
            const uint8_t *slot = staging + (reduced % RECV_SLOTS) * slot_bytes;
            const uint8_t *mine = (block == g.rank ? own_block : send + (size_t)block * block_bytes) + off * g.esize;
            uint8_t *dst = recv + off * g.esize;
            if (reduced >= last_step_first)
                braid__reduce_final(coll->dtype, coll->op, dst, mine, slot, len, g.n);
            else
                braid__reduce(coll->dtype, coll->op, dst, mine, slot, len);
            reduced++;
            moved = 1;
        }

        if (f.fp_sent && f.fp_checked && reduced == total && f.done_s == total)
            return BRAID_OK;
        if (!moved)
            BRAID_CHECK(braid__algo_wait(run, conns, nconns, f.done_r < total || !f.fp_checked ? prev : next));
    }
}
