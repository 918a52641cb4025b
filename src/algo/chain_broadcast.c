/* Pipelined chain broadcast: root -> root+1 -> ... -> root-1. Every rank
 * but the root receives each chunk straight into the user's buffer and
 * forwards it as soon as it lands, so all links carry data at once and the
 * time approaches size/bandwidth + (n-1) * chunk latency. */
#include "pipeline.h"
#include "status.h"

typedef struct {
    uint8_t *buf;
    size_t bytes, chunk;
} chain;

static void *chunk_of(const chain *c, size_t k, size_t *bytes)
{
    size_t off = k * c->chunk;
    *bytes = c->bytes - off < c->chunk ? c->bytes - off : c->chunk;
    return c->buf + off;
}

static braid_status bc_send_item(braid_pipeline *p, size_t k, const void **buf, size_t *bytes)
{
    *buf = chunk_of(p->sched, k, bytes);
    return BRAID_OK;
}

static braid_status bc_recv_item(braid_pipeline *p, size_t k, void **buf, size_t *bytes)
{
    *buf = chunk_of(p->sched, k, bytes);
    return BRAID_OK;
}

static const braid_pipeline_hooks bc_hooks = {.send_item = bc_send_item, .recv_item = bc_recv_item};

braid_status braid__chain_broadcast(braid_algo_run *run)
{
    const braid_algo_ctx *ctx = run->ctx;
    const braid_coll *coll = run->coll;
    int n = ctx->size, rank = ctx->rank;
    if (n == 1)
        return BRAID_OK;

    int pos = (rank - coll->root + n) % n; /* distance from the root along the chain */
    int has_prev = pos > 0, has_next = pos < n - 1;
    chain c = {.buf = coll->recv, .bytes = coll->count * braid_dtype_size(coll->dtype)};
    c.chunk = ctx->chunk_bytes ? ctx->chunk_bytes : c.bytes;
    size_t nchunks = c.bytes ? (c.bytes + c.chunk - 1) / c.chunk : 0;

    /* Every rank forwards what it received; the root holds it all from the start. */
    braid_pipeline p = {.run = run,
                        .hooks = &bc_hooks,
                        .sched = &c,
                        .next = has_next ? (rank + 1) % n : -1,
                        .prev = has_prev ? (rank + n - 1) % n : -1,
                        .sends = has_next ? nchunks : 0,
                        .recvs = has_prev ? nchunks : 0,
                        .send_lead = has_prev ? 0 : nchunks,
                        .recv_slots = BRAID_PIPE_WINDOW,
                        .fp = 1};
    return braid__pipeline_run(&p);
}
