/* Ring all-reduce: reduce-scatter then all-gather around the ring, each
 * segment cut into chunks that flow through a pipeline, so that sending to
 * the next rank, receiving from the previous one and reducing all overlap.
 *
 * With n ranks the buffer is split into n segments. At step s (0..2n-3)
 * rank r sends segment (r - s) mod n to rank r+1 and receives segment
 * (r - s - 1) mod n from rank r-1. Steps 0..n-2 reduce the received chunk
 * into the local one (reduce-scatter; the last of them completes a segment
 * and applies AVG's division); steps n-1..2n-3 copy the finished segments
 * around (all-gather), received straight into the user's buffer.
 *
 * The chunk sent at step s >= 1 is the chunk received at step s-1, so the
 * sends are gated, in order, by the receives: send item k (k >= chunks of
 * step 0) may go once receive item k - chunks(step 0) is done.
 *
 * The pass (braid__ring_pass) is a schedule over the pipelined engine
 * (pipeline.h); the item order is ring_cursor.h's. It also runs over a subset of the group, over
 * a part of the steps (the reduce-scatter or the all-gather half alone) and
 * with fewer shards than ring members (segments past them are empty, and
 * every step skips them on both sides alike): the hierarchical all-reduce
 * (hier_allreduce.c) is built from such passes. A pass that starts at a
 * later step sends that step's segment from recv, where the previous pass
 * left it final, without gating. */
#include <string.h>

#include "pipeline.h"
#include "ring_cursor.h"
#include "reduce/reduce.h"
#include "status.h"

#define RECV_SLOTS 4 /* reduce-scatter chunks in flight (staging buffers) */

/* A ring of one: the input is the result (AVG still divides). */
static void copy_and_scale(const braid_coll *coll, const braid_ring_pass *p)
{
    size_t bytes = p->count * braid_dtype_size(coll->dtype);
    if (p->recv != p->send && bytes)
        memmove(p->recv, p->send, bytes);
    if (p->divisor)
        braid__reduce_scale(coll->dtype, coll->op, p->recv, p->count, p->divisor);
}

static int member(const braid_ring_pass *p, int i)
{
    return p->members ? p->members[i] : i;
}

braid_status braid__ring_allreduce(braid_algo_run *run)
{
    const braid_algo_ctx *ctx = run->ctx;
    const braid_coll *coll = run->coll;
    braid_ring_pass p = {.members = NULL,
                         .n = ctx->size,
                         .index = ctx->rank,
                         .send = coll->send,
                         .recv = coll->recv,
                         .count = coll->count,
                         .nshards = ctx->size,
                         .shard_shift = 0,
                         .first_step = 0,
                         .end_step = 2 * (ctx->size - 1),
                         .divisor = ctx->size,
                         .fp = 1};
    return braid__ring_pass(run, &p);
}

/* The pass as a schedule over the pipeline: cursors walk the items of
 * each hook in order. */
typedef struct {
    braid_ring_geom g;
    const braid_ring_pass *pass;
    const braid_coll *coll;
    size_t esize;
    const uint8_t *send;
    uint8_t *recv, *staging;
    size_t slot_bytes;
    braid_ring_cursor post_s, post_r, done_r;
} pass_sched;

/* Sends whose data is final: step 0 from the input, later steps from the
 * chunk just received into the output. */
static braid_status pass_send_item(braid_pipeline *p, size_t k, const void **buf, size_t *bytes)
{
    pass_sched *r = p->sched;
    size_t off, len;
    (void)k;
    braid__ring_cursor_range(&r->g, &r->post_s, &off, &len);
    *buf = (r->post_s.step == 0 ? r->send : r->recv) + off * r->esize;
    *bytes = len * r->esize;
    braid__ring_cursor_next(&r->g, &r->post_s);
    return BRAID_OK;
}

/* Reduce-scatter chunks land in staging slots, all-gather chunks straight
 * in place. */
static braid_status pass_recv_item(braid_pipeline *p, size_t k, void **buf, size_t *bytes)
{
    pass_sched *r = p->sched;
    size_t off, len;
    braid__ring_cursor_range(&r->g, &r->post_r, &off, &len);
    *buf = r->post_r.step < r->g.n - 1 ? r->staging + (k % RECV_SLOTS) * r->slot_bytes : r->recv + off * r->esize;
    *bytes = len * r->esize;
    braid__ring_cursor_next(&r->g, &r->post_r);
    return BRAID_OK;
}

/* Reduce-scatter chunks are reduced into the output (the segment's last
 * one with AVG's division). */
static braid_status pass_combine(braid_pipeline *p, size_t k)
{
    pass_sched *r = p->sched;
    if (r->done_r.step < r->g.n - 1) {
        const braid_coll *coll = r->coll;
        size_t off, len;
        braid__ring_cursor_range(&r->g, &r->done_r, &off, &len);
        const uint8_t *slot = r->staging + (k % RECV_SLOTS) * r->slot_bytes;
        uint8_t *dst = r->recv + off * r->esize;
        const uint8_t *mine = r->send + off * r->esize;
        if (r->done_r.step == r->g.n - 2 && r->pass->divisor)
            braid__reduce_final(coll->dtype, coll->op, dst, mine, slot, len, r->pass->divisor);
        else
            braid__reduce(coll->dtype, coll->op, dst, mine, slot, len);
    }
    braid__ring_cursor_next(&r->g, &r->done_r);
    return BRAID_OK;
}

static const braid_pipeline_hooks pass_hooks = {
    .send_item = pass_send_item, .recv_item = pass_recv_item, .combine = pass_combine};

braid_status braid__ring_pass(braid_algo_run *run, const braid_ring_pass *pass)
{
    const braid_algo_ctx *ctx = run->ctx;
    const braid_coll *coll = run->coll;
    if (pass->n == 1) {
        copy_and_scale(coll, pass);
        return BRAID_OK;
    }
    size_t esize = braid_dtype_size(coll->dtype);
    pass_sched r = {.g = {.n = pass->n,
                          .rank = pass->index,
                          .count = pass->count,
                          .elems_per_chunk = ctx->chunk_bytes / esize ? ctx->chunk_bytes / esize : 1,
                          .nshards = pass->nshards,
                          .shard_shift = pass->shard_shift},
                    .pass = pass,
                    .coll = coll,
                    .esize = esize,
                    .send = pass->send,
                    .recv = pass->recv};
    int n = pass->n, i = pass->index;
    r.slot_bytes = r.g.elems_per_chunk * esize;
    BRAID_CHECK(braid__ctx_scratch(ctx, RECV_SLOTS * r.slot_bytes, (void **)&r.staging));

    braid__ring_cursor_init(&r.g, &r.post_r, pass->first_step, pass->end_step, 1);
    braid__ring_cursor_init(&r.g, &r.post_s, pass->first_step, pass->end_step, 0);
    r.done_r = r.post_r;
    braid_pipeline p = {.run = run,
                        .hooks = &pass_hooks,
                        .sched = &r,
                        .next = member(pass, (i + 1) % n),
                        .prev = member(pass, (i + n - 1) % n),
                        .sends = braid__ring_cursor_items(&r.g, r.post_s),
                        .recvs = braid__ring_cursor_items(&r.g, r.post_r),
                        /* A pass that starts at a later step sends that
                         * step's segment from recv, final already. */
                        .send_lead = r.post_s.step == pass->first_step ? r.post_s.nchunks : 0,
                        .combine_lead = SIZE_MAX,
                        .recv_slots = RECV_SLOTS,
                        .fp = pass->fp,
                        /* the flat ring, which a device ring may join */
                        .fp_back = !pass->members};
    return braid__pipeline_run(&p);
}
