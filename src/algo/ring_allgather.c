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

#include "algo.h"
#include "status.h"

#define RECV_WINDOW 8 /* receives posted ahead of completion */
#define SEND_WINDOW 8 /* sends posted ahead of completion */

typedef struct {
    int n, rank;
    size_t count, esize, elems_per_chunk, chunks; /* chunks per block */
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

braid_status braid__ring_allgather(braid_algo_run *run)
{
    const braid_algo_ctx *ctx = run->ctx;
    const braid_coll *coll = run->coll;
    layout g = {.n = ctx->size, .rank = ctx->rank, .count = coll->count, .esize = braid_dtype_size(coll->dtype)};
    const uint8_t *send = coll->send;
    uint8_t *recv = coll->recv;
    uint8_t *own = recv + (size_t)g.rank * g.count * g.esize;
    /* In place means the input already is the own block. */
    int need_copy = g.count > 0 && (const uint8_t *)own != send;

    if (g.n == 1) {
        if (need_copy)
            memcpy(own, send, g.count * g.esize);
        return BRAID_OK;
    }
    g.elems_per_chunk = ctx->chunk_bytes / g.esize ? ctx->chunk_bytes / g.esize : 1;
    g.chunks = (g.count + g.elems_per_chunk - 1) / g.elems_per_chunk;
    size_t total = (size_t)(g.n - 1) * g.chunks;

    int next = (g.rank + 1) % g.n, prev = (g.rank + g.n - 1) % g.n;
    braid_conn *conns[2];
    BRAID_CHECK(braid__ctx_conn(ctx, next, &conns[0]));
    BRAID_CHECK(braid__ctx_conn(ctx, prev, &conns[1]));
    int nconns = conns[0] == conns[1] ? 1 : 2;

    braid_req recv_reqs[RECV_WINDOW], send_reqs[SEND_WINDOW];
    braid_ring_flow f = {.to_next = conns[0],
                         .from_prev = conns[nconns - 1],
                         .prev = prev,
                         .recv_reqs = recv_reqs,
                         .send_reqs = send_reqs,
                         .recv_window = RECV_WINDOW,
                         .send_window = SEND_WINDOW};
    BRAID_CHECK(braid__ring_flow_start(&f, coll));

    for (;;) {
        int moved = 0;
        while (f.posted_s < total && f.posted_s - f.done_s < SEND_WINDOW &&
               (f.posted_s < g.chunks || f.posted_s - g.chunks < f.done_r)) {
            int block;
            size_t off, len;
            item_range(&g, f.posted_s, 0, &block, &off, &len);
            const uint8_t *src =
                f.posted_s < g.chunks ? send + off * g.esize : recv + ((size_t)block * g.count + off) * g.esize;
            BRAID_CHECK(f.to_next->ops->isend(f.to_next, &send_reqs[f.posted_s % SEND_WINDOW], src, len * g.esize));
            f.posted_s++;
            moved = 1;
        }
        while (f.posted_r < total && f.posted_r - f.done_r < RECV_WINDOW) {
            int block;
            size_t off, len;
            item_range(&g, f.posted_r, 1, &block, &off, &len);
            uint8_t *dst = recv + ((size_t)block * g.count + off) * g.esize;
            BRAID_CHECK(
                f.from_prev->ops->irecv(f.from_prev, &recv_reqs[f.posted_r % RECV_WINDOW], dst, len * g.esize));
            f.posted_r++;
            moved = 1;
        }
        if (need_copy) {
            /* After the first sends are on their way: the copy overlaps them. */
            memcpy(own, send, g.count * g.esize);
            need_copy = 0;
        }
        BRAID_CHECK(braid__ring_flow_poll(run, &f, &moved));
        if (f.fp_sent && f.fp_checked && f.done_r == total && f.done_s == total)
            return BRAID_OK;
        if (!moved)
            BRAID_CHECK(braid__algo_wait(run, conns, nconns, f.done_r < total || !f.fp_checked ? prev : next));
    }
}
