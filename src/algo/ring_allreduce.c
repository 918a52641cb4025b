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
 * The engine (braid__ring_pass) also runs over a subset of the group, over
 * a part of the steps (the reduce-scatter or the all-gather half alone) and
 * with fewer shards than ring members (segments past them are empty, and
 * every step skips them on both sides alike): the hierarchical all-reduce
 * (hier_allreduce.c) is built from such passes. A pass that starts at a
 * later step sends that step's segment from recv, where the previous pass
 * left it final, without gating. */
#include <string.h>

#include "algo.h"
#include "reduce/reduce.h"
#include "status.h"

#define RECV_SLOTS 4   /* reduce-scatter chunks in flight (staging buffers) */
#define SEND_WINDOW 8  /* sends posted ahead of completion */

/* Walks the (step, chunk) items of one direction in order. */
typedef struct {
    int step, steps;      /* current step, total steps */
    int shift;            /* segment = (rank - step - shift) mod n */
    size_t chunk;         /* chunk index in the current segment */
    size_t seg_start, seg_len, nchunks;
} cursor;

typedef struct {
    braid_algo_run *run;
    const braid_ring_pass *pass;
    int n, rank;              /* ring size and this rank's position in it */
    size_t elems_per_chunk, esize;
} ring;

static void cursor_load_step(const ring *g, cursor *c)
{
    const braid_ring_pass *p = g->pass;
    int seg = ((g->rank - c->step - c->shift) % g->n + g->n) % g->n;
    int shard = ((seg - p->shard_shift) % g->n + g->n) % g->n;
    c->seg_start = c->seg_len = 0;
    if (shard < p->nshards)
        braid__segment(p->count, p->nshards, shard, &c->seg_start, &c->seg_len);
    c->nchunks = (c->seg_len + g->elems_per_chunk - 1) / g->elems_per_chunk;
    c->chunk = 0;
}

/* Skip to the first step that has a chunk; leaves step == steps at the end. */
static void cursor_settle(const ring *g, cursor *c)
{
    while (c->step < c->steps && c->chunk >= c->nchunks) {
        c->step++;
        if (c->step < c->steps)
            cursor_load_step(g, c);
    }
}

static void cursor_init(const ring *g, cursor *c, int shift)
{
    c->step = g->pass->first_step;
    c->steps = g->pass->end_step;
    c->shift = shift;
    cursor_load_step(g, c);
    cursor_settle(g, c);
}

static void cursor_next(const ring *g, cursor *c)
{
    c->chunk++;
    cursor_settle(g, c);
}

static int cursor_done(const cursor *c)
{
    return c->step >= c->steps;
}

/* Element range [off, off+len) of the cursor's current chunk. */
static void cursor_range(const ring *g, const cursor *c, size_t *off, size_t *len)
{
    size_t first = c->chunk * g->elems_per_chunk;
    *off = c->seg_start + first;
    *len = c->seg_len - first < g->elems_per_chunk ? c->seg_len - first : g->elems_per_chunk;
}

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

/* The state of one pass between its set-up and its end: the links, the
 * fingerprint exchange, and the request windows of both directions, each
 * walked by cursors and counted by items posted and done. */
typedef struct {
    ring g;
    braid_conn *conns[2];
    int nconns, next, prev;
    braid_conn *to_next, *from_prev;
    const uint8_t *send;
    uint8_t *recv, *staging;
    size_t slot_bytes;
    uint8_t fp_mine[BRAID_FP_BYTES];
    braid_req fp_send_req;
    braid_fp_back back;
    int fp_sent, fp_checked, back_done;
    braid_req recv_reqs[RECV_SLOTS], send_reqs[SEND_WINDOW];
    cursor post_r, done_r, post_s;
    size_t n_posted_r, n_done_r, n_posted_s, n_done_s;
    size_t step0_sends;
} pass_state;

/* Call fingerprints go first on each link; the receive side checks the
 * previous rank's before touching any data. A later pass over links that
 * an earlier one of the same call checked skips them. */
static braid_status pass_fp_start(pass_state *r)
{
    braid_algo_run *run = r->g.run;
    const braid_ring_pass *pass = r->g.pass;
    r->fp_sent = r->fp_checked = !pass->fp;
    r->back_done = 1;
    if (pass->fp) {
        braid__fp_encode(run->coll, r->fp_mine);
        BRAID_CHECK(r->conns[0]->ops->isend(r->conns[0], &r->fp_send_req, r->fp_mine, sizeof(r->fp_mine)));
        BRAID_CHECK(braid__fp_recv(run, r->conns[r->nconns - 1], r->prev));
        if (!pass->members) { /* the flat ring, which a device ring may join */
            BRAID_CHECK(braid__fp_back_start(run, &r->back, r->fp_mine, r->prev, r->next));
            r->back_done = 0;
        }
    }
    return BRAID_OK;
}

/* Post sends whose data is final: step 0 from the input, later steps from
 * the chunk just received into the output. */
static inline braid_status pass_post_sends(pass_state *r, int *moved)
{
    const ring *g = &r->g;
    while (!cursor_done(&r->post_s) && r->n_posted_s - r->n_done_s < SEND_WINDOW &&
           (r->n_posted_s < r->step0_sends || r->n_posted_s - r->step0_sends < r->n_done_r)) {
        size_t off, len;
        cursor_range(g, &r->post_s, &off, &len);
        const uint8_t *src = (r->post_s.step == 0 ? r->send : r->recv) + off * g->esize;
        BRAID_CHECK(r->to_next->ops->isend(r->to_next, &r->send_reqs[r->n_posted_s % SEND_WINDOW], src,
                                           len * g->esize));
        r->n_posted_s++;
        cursor_next(g, &r->post_s);
        *moved = 1;
    }
    return BRAID_OK;
}

/* Post receives: reduce-scatter chunks into staging slots, all-gather
 * chunks straight into place. */
static inline braid_status pass_post_recvs(pass_state *r, int *moved)
{
    const ring *g = &r->g;
    while (!cursor_done(&r->post_r) && r->n_posted_r - r->n_done_r < RECV_SLOTS) {
        size_t off, len;
        cursor_range(g, &r->post_r, &off, &len);
        uint8_t *dst = r->post_r.step < g->n - 1 ? r->staging + (r->n_posted_r % RECV_SLOTS) * r->slot_bytes
                                                 : r->recv + off * g->esize;
        BRAID_CHECK(r->from_prev->ops->irecv(r->from_prev, &r->recv_reqs[r->n_posted_r % RECV_SLOTS], dst,
                                             len * g->esize));
        r->n_posted_r++;
        cursor_next(g, &r->post_r);
        *moved = 1;
    }
    return BRAID_OK;
}

/* Complete receives in order, once the previous rank's fingerprint is
 * checked; reduce-scatter chunks are reduced into the output (the
 * segment's last one with AVG's division). */
static inline braid_status pass_complete_recvs(pass_state *r, int *moved)
{
    const ring *g = &r->g;
    const braid_coll *coll = g->run->coll;
    const braid_ring_pass *pass = g->pass;
    int done;
    if (!r->fp_checked) {
        BRAID_CHECK(braid__fp_poll(g->run, &r->fp_checked));
        *moved |= r->fp_checked;
    }
    while (r->fp_checked && r->n_done_r < r->n_posted_r) {
        braid_req *req = &r->recv_reqs[r->n_done_r % RECV_SLOTS];
        BRAID_CHECK(braid__algo_test(g->run, req, &done));
        if (!done)
            break;
        if (r->done_r.step < g->n - 1) {
            size_t off, len;
            cursor_range(g, &r->done_r, &off, &len);
            const uint8_t *slot = r->staging + (r->n_done_r % RECV_SLOTS) * r->slot_bytes;
            uint8_t *dst = r->recv + off * g->esize;
            const uint8_t *mine = r->send + off * g->esize;
            if (r->done_r.step == g->n - 2 && pass->divisor)
                braid__reduce_final(coll->dtype, coll->op, dst, mine, slot, len, pass->divisor);
            else
                braid__reduce(coll->dtype, coll->op, dst, mine, slot, len);
        }
        r->n_done_r++;
        cursor_next(g, &r->done_r);
        *moved = 1;
    }
    return BRAID_OK;
}

/* Complete the fingerprint sends and the data sends, in order. */
static inline braid_status pass_complete_sends(pass_state *r, int *moved)
{
    braid_algo_run *run = r->g.run;
    int done;
    if (!r->fp_sent) {
        BRAID_CHECK(braid__algo_test(run, &r->fp_send_req, &r->fp_sent));
        *moved |= r->fp_sent;
    }
    if (!r->back_done) {
        BRAID_CHECK(braid__fp_back_poll(run, &r->back, &r->back_done));
        *moved |= r->back_done;
    }
    while (r->n_done_s < r->n_posted_s) {
        BRAID_CHECK(braid__algo_test(run, &r->send_reqs[r->n_done_s % SEND_WINDOW], &done));
        if (!done)
            break;
        r->n_done_s++;
        *moved = 1;
    }
    return BRAID_OK;
}

static inline int pass_finished(const pass_state *r)
{
    return r->fp_sent && r->fp_checked && r->back_done && cursor_done(&r->post_s) && cursor_done(&r->post_r) &&
           r->n_done_r == r->n_posted_r && r->n_done_s == r->n_posted_s;
}

braid_status braid__ring_pass(braid_algo_run *run, const braid_ring_pass *pass)
{
    const braid_algo_ctx *ctx = run->ctx;
    const braid_coll *coll = run->coll;
    pass_state r = {.g = {.run = run, .pass = pass, .n = pass->n, .rank = pass->index,
                         .esize = braid_dtype_size(coll->dtype)}};
    ring *g = &r.g;

    if (g->n == 1) {
        copy_and_scale(coll, pass);
        return BRAID_OK;
    }
    g->elems_per_chunk = ctx->chunk_bytes / g->esize;
    if (g->elems_per_chunk == 0)
        g->elems_per_chunk = 1;

    r.next = member(pass, (g->rank + 1) % g->n);
    r.prev = member(pass, (g->rank + g->n - 1) % g->n);
    BRAID_CHECK(braid__ctx_conn(ctx, r.next, &r.conns[0]));
    BRAID_CHECK(braid__ctx_conn(ctx, r.prev, &r.conns[1]));
    r.nconns = r.conns[0] == r.conns[1] ? 1 : 2;

    r.slot_bytes = g->elems_per_chunk * g->esize;
    BRAID_CHECK(braid__ctx_scratch(ctx, RECV_SLOTS * r.slot_bytes, (void **)&r.staging));
    r.send = pass->send;
    r.recv = pass->recv;
    BRAID_CHECK(pass_fp_start(&r));

    cursor_init(g, &r.post_r, 1);
    cursor_init(g, &r.done_r, 1);
    cursor_init(g, &r.post_s, 0);
    r.step0_sends = r.post_s.step == pass->first_step ? r.post_s.nchunks : 0;
    r.to_next = r.conns[0];
    r.from_prev = r.conns[r.nconns - 1];

    for (;;) {
        int moved = 0;
        BRAID_CHECK(pass_post_sends(&r, &moved));
        BRAID_CHECK(pass_post_recvs(&r, &moved));
        BRAID_CHECK(pass_complete_recvs(&r, &moved));
        BRAID_CHECK(pass_complete_sends(&r, &moved));
        if (pass_finished(&r))
            return BRAID_OK;
        if (!moved)
            BRAID_CHECK(braid__algo_wait(run, r.conns, r.nconns,
                                         r.n_done_r < r.n_posted_r || !r.fp_checked ? r.prev : r.next));
    }
}
