/* Pipelined chain reduce: root+1 -> root+2 -> ... -> root-1 -> root, the
 * chain broadcast run backwards with a combine at every hop. The first rank
 * of the chain sends its input; every other rank combines each received
 * chunk with its own input and passes the partial on, chunk by chunk, so
 * all links carry data at once and the time approaches size/bandwidth +
 * (n-1) * chunk latency. The root's combine is the final one (AVG divides
 * there, once) and writes the user's recv buffer; only the root touches
 * recv, which may be NULL elsewhere.
 *
 * Non-root ranks keep partials in staging slots (they have no output
 * buffer) and forward them from there: a slot is reused once the send
 * forwarding it has completed. The chain ends at the root, which never
 * waits on a send, so every wait is on a rank nearer the root and the
 * pipeline cannot stall on itself. */
#include <string.h>

#include "pipeline.h"
#include "reduce/reduce.h"
#include "status.h"

#define SLOTS BRAID_PIPE_WINDOW /* staging slots */

typedef struct {
    int n, is_root, is_first;
    size_t esize, count, epc; /* elements per chunk */
    const uint8_t *send;
    uint8_t *recv, *staging;
    size_t slot_bytes;
} chain;

static size_t chunk_range(const chain *c, size_t k, size_t *len)
{
    size_t off = k * c->epc;
    *len = c->count - off < c->epc ? c->count - off : c->epc;
    return off;
}

static uint8_t *slot_of(const chain *c, size_t k)
{
    return c->staging + (k % SLOTS) * c->slot_bytes;
}

/* The first rank sends its input, the others the partial in the slot. */
static braid_status cr_send_item(braid_pipeline *p, size_t k, const void **buf, size_t *bytes)
{
    const chain *c = p->sched;
    size_t len, off = chunk_range(c, k, &len);
    *bytes = len * c->esize;
    *buf = c->is_first ? c->send + off * c->esize : slot_of(c, k);
    return BRAID_OK;
}

static braid_status cr_recv_item(braid_pipeline *p, size_t k, void **buf, size_t *bytes)
{
    const chain *c = p->sched;
    size_t len;
    chunk_range(c, k, &len);
    *bytes = len * c->esize;
    *buf = slot_of(c, k);
    return BRAID_OK;
}

static braid_status cr_combine(braid_pipeline *p, size_t k)
{
    const chain *c = p->sched;
    const braid_coll *coll = p->run->coll;
    size_t len, off = chunk_range(c, k, &len);
    uint8_t *slot = slot_of(c, k);
    if (c->is_root)
        braid__reduce_final(coll->dtype, coll->op, c->recv + off * c->esize, c->send + off * c->esize, slot, len,
                            c->n);
    else
        braid__reduce(coll->dtype, coll->op, slot, c->send + off * c->esize, slot, len);
    return BRAID_OK;
}

static const braid_pipeline_hooks cr_hooks = {
    .send_item = cr_send_item, .recv_item = cr_recv_item, .combine = cr_combine};

braid_status braid__chain_reduce(braid_algo_run *run)
{
    const braid_algo_ctx *ctx = run->ctx;
    const braid_coll *coll = run->coll;
    int n = ctx->size, rank = ctx->rank;
    chain c = {.n = n, .esize = braid_dtype_size(coll->dtype), .count = coll->count, .send = coll->send,
               .recv = coll->recv};

    if (n == 1) {
        if (c.count && c.recv != c.send)
            memmove(c.recv, c.send, c.count * c.esize);
        braid__reduce_scale(coll->dtype, coll->op, c.recv, c.count, 1);
        return BRAID_OK;
    }

    /* pos 1 starts the chain, pos 0 is the root and ends it. */
    int pos = (rank - coll->root + n) % n;
    c.is_root = pos == 0;
    c.is_first = pos == 1;
    c.epc = ctx->chunk_bytes / c.esize ? ctx->chunk_bytes / c.esize : 1;
    size_t nchunks = (c.count + c.epc - 1) / c.epc;
    c.slot_bytes = (c.epc < c.count ? c.epc : c.count) * c.esize;
    if (!c.is_first)
        BRAID_CHECK(braid__ctx_scratch(ctx, SLOTS * c.slot_bytes, (void **)&c.staging));

    /* The first rank's input is its partial from the start. */
    braid_pipeline p = {.run = run,
                        .hooks = &cr_hooks,
                        .sched = &c,
                        .next = c.is_root ? -1 : (rank + 1) % n,
                        .prev = c.is_first ? -1 : (rank + n - 1) % n,
                        .sends = c.is_root ? 0 : nchunks,
                        .recvs = c.is_first ? 0 : nchunks,
                        .send_lead = c.is_first ? nchunks : 0,
                        .combine_lead = SIZE_MAX,
                        .recv_slots = SLOTS,
                        .slot_forwarded = !c.is_root,
                        .fp = 1};
    return braid__pipeline_run(&p);
}
