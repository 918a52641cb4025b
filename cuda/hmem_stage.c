/* Staging a job on device buffers through pinned host memory (hmem.h,
 * CUDA build): any collective, a send or a receive, or a group of them.
 *
 * A group runs as segments, in issue order: each collective alone (with
 * the sequence number the group gives it), each run of consecutive sends
 * and receives together, as braid runs groups (algo/dispatch.c). Every
 * rank cuts its group the same way, and a collective sees what an earlier
 * op of the group wrote, as on host buffers.
 *
 * hmem_plan.c cuts each op into pieces (a piece is a call of the same
 * kind on fewer elements) and lays out their areas in a pool half. Step k
 * of a segment runs the pieces that fall on it as one host call in half
 * k & 1, while the next step's inputs are copied down into the other half
 * on the d2h stream and the previous step's results up from it on h2d:
 * copies overlap the network. Ops on host buffers run whole on their own
 * buffers, as a host call would. */
#include <stdint.h>
#include <stdlib.h>

#include <cuda_runtime_api.h>

#include "pg_algo.h"
#include "hmem.h"
#include "hmem_cuda.h"
#include "hmem_plan.h"

/* A segment of a job: ops[0..n) staged together; run as a group like
 * `group` (its ops replaced), or alone where group is NULL. */
typedef struct {
    const braid_coll *group;
    braid_coll *ops;
    int n;
    braid_coll one; /* a group's collective, with its sequence number */
} segment;

/* The segment of coll starting at op *next (0 first); 0 when none is left. */
static int next_segment(braid_coll *coll, int *next, uint64_t *seq, segment *sg)
{
    int i = *next;
    if (coll->kind != BRAID_COLL_GROUP) {
        if (i > 0)
            return 0;
        *sg = (segment){.group = NULL, .ops = coll, .n = 1};
        *next = 1;
        return 1;
    }
    if (i >= coll->nops)
        return 0;
    if (!braid__kind(coll->ops[i].kind)->p2p) {
        sg->group = NULL;
        sg->one = coll->ops[i];
        sg->one.seq = (*seq)++; /* as run_group numbers the group's collectives */
        sg->ops = &sg->one;
        sg->n = 1;
        *next = i + 1;
        return 1;
    }
    int j = i;
    while (j < coll->nops && braid__kind(coll->ops[j].kind)->p2p)
        j++;
    *sg = (segment){.group = coll, .ops = &coll->ops[i], .n = j - i};
    *next = j;
    return 1;
}

/* Plan segment sg into plans; the half bytes it needs. */
static size_t plan_segment(const braid_pg *pg, const segment *sg, braid_piece_plan *plans)
{
    for (int i = 0; i < sg->n; i++)
        braid__plan_op(pg->rank, pg->size, &sg->ops[i], &plans[i]);
    return braid__plan_layout(plans, sg->n);
}

braid_status braid__hmem_stage_need(const braid_pg *pg, braid_coll *coll, size_t *bytes)
{
    int n = coll->kind == BRAID_COLL_GROUP ? coll->nops : 1, next = 0;
    braid_piece_plan *plans = calloc((size_t)(n ? n : 1), sizeof(*plans));
    if (!plans)
        return braid__error(BRAID_ERR_NO_MEMORY, "rank %d: out of memory planning a staged call", pg->rank);
    uint64_t seq = coll->seq;
    segment sg;
    *bytes = 0;
    while (next_segment(coll, &next, &seq, &sg)) {
        size_t need = plan_segment(pg, &sg, plans);
        *bytes = need > *bytes ? need : *bytes;
    }
    free(plans);
    return *bytes == (size_t)-1 ? braid__error(BRAID_ERR_NO_MEMORY, "rank %d: out of memory planning a staged call",
                                               pg->rank)
                                : BRAID_OK;
}

/* Largest pitch cudaMemcpy2DAsync takes (cudaDevAttrMaxPitch on current
 * GPUs); wider blocks go row by row. */
#define MAX_PITCH ((size_t)INT32_MAX)

/* rows blocks of width bytes, pitch apart at their source and destination. */
static braid_status copy_blocks(braid_pg *pg, void *dst, size_t dpitch, const void *src, size_t spitch, size_t width,
                                int rows, cudaStream_t s)
{
    if (rows > 1 && dpitch <= MAX_PITCH && spitch <= MAX_PITCH) {
        CUDA_CALL(cudaMemcpy2DAsync(dst, dpitch, src, spitch, width, (size_t)rows, cudaMemcpyDefault, s),
                  "cudaMemcpy2DAsync", pg->rank);
        return BRAID_OK;
    }
    for (int r = 0; r < rows; r++)
        CUDA_CALL(cudaMemcpyAsync((char *)dst + (size_t)r * dpitch, (const char *)src + (size_t)r * spitch, width,
                                  cudaMemcpyDefault, s),
                  "cudaMemcpyAsync", pg->rank);
    return BRAID_OK;
}

/* Piece k's inputs into half `pin` (down, on d2h) or its results out of
 * it (up, on h2d); *queued: a copy was queued. */
static braid_status copy_step(braid_pg *pg, braid_piece_plan *plans, int n, size_t k, char *pin, int down, int *queued)
{
    cudaStream_t s = down ? pg->hmem->d2h : pg->hmem->h2d;
    *queued = 0;
    for (int i = 0; i < n; i++) {
        braid_piece_plan *p = &plans[i];
        size_t off, len;
        if (p->whole || !(down ? p->down : p->up) || !braid__plan_piece(p, k, &off, &len) || len == 0)
            continue;
        size_t w = len * p->esize, block = p->op->count * p->esize, at = off * p->esize;
        if (down)
            BRAID_CHECK(copy_blocks(pg, pin + p->soff, w, (const char *)p->op->send + at, block, w, p->srows, s));
        else
            BRAID_CHECK(copy_blocks(pg, (char *)p->op->recv + at, block, pin + p->roff, w, w, p->rrows, s));
        *queued = 1;
    }
    return BRAID_OK;
}

/* Step k as one host call on half `pin` (pieces: room for the segment's). */
static braid_status run_step(braid_pg *pg, const segment *sg, braid_piece_plan *plans, int n, size_t k, char *pin,
                             braid_coll *pieces)
{
    int m = 0;
    for (int i = 0; i < n; i++) {
        braid_piece_plan *p = &plans[i];
        size_t off, len;
        if (!braid__plan_piece(p, k, &off, &len))
            continue;
        braid_coll c = *p->op;
        c.hmem = NULL;
        c.stream = NULL;
        if (!p->whole) { /* a whole op runs on its own buffers */
            c.count = len;
            c.send = p->srows ? pin + p->soff : NULL;
            c.recv = p->rrows ? pin + p->roff : NULL;
        }
        pieces[m++] = c;
    }
    if (!sg->group)
        return braid__coll_run(pg, &pieces[0]);
    braid_coll g = *sg->group;
    g.hmem = NULL;
    g.ops = pieces;
    g.nops = m;
    return braid__coll_run(pg, &g);
}

static braid_status event_sync(braid_pg *pg, cudaEvent_t e)
{
    CUDA_CALL(cudaEventSynchronize(e), "cudaEventSynchronize", pg->rank);
    return BRAID_OK;
}

static braid_status stage_steps(braid_pg *pg, const segment *sg, braid_piece_plan *plans, int n, void *const pool[2],
                                braid_coll *pieces)
{
    struct braid_hmem *h = pg->hmem;
    size_t steps = braid__plan_steps(plans, n);
    int down_queued[2] = {0, 0}, up_queued[2] = {0, 0};
    if (steps > 0) {
        BRAID_CHECK(copy_step(pg, plans, n, 0, pool[0], 1, &down_queued[0]));
        CUDA_CALL(cudaEventRecord(h->down_done[0], h->d2h), "cudaEventRecord", pg->rank);
    }
    for (size_t k = 0; k < steps; k++) {
        int b = (int)(k & 1), nb = b ^ 1;
        if (k + 1 < steps) {
            /* Half nb is written again only once its last up copies finished. */
            if (up_queued[nb])
                CUDA_CALL(cudaStreamWaitEvent(h->d2h, h->up_done[nb], 0), "cudaStreamWaitEvent", pg->rank);
            BRAID_CHECK(copy_step(pg, plans, n, k + 1, pool[nb], 1, &down_queued[nb]));
            CUDA_CALL(cudaEventRecord(h->down_done[nb], h->d2h), "cudaEventRecord", pg->rank);
        }
        /* The host reads half b once its inputs are down and writes it once
         * the results of step k - 2 have gone up from it. */
        if (down_queued[b])
            BRAID_CHECK(event_sync(pg, h->down_done[b]));
        if (up_queued[b])
            BRAID_CHECK(event_sync(pg, h->up_done[b]));
        BRAID_CHECK(run_step(pg, sg, plans, n, k, pool[b], pieces));
        BRAID_CHECK(copy_step(pg, plans, n, k, pool[b], 0, &up_queued[b]));
        CUDA_CALL(cudaEventRecord(h->up_done[b], h->h2d), "cudaEventRecord", pg->rank);
    }
    CUDA_CALL(cudaStreamSynchronize(h->h2d), "cudaStreamSynchronize", pg->rank);
    return BRAID_OK;
}

braid_status braid__hmem_stage(braid_pg *pg, braid_coll *coll, void *const pool[2], size_t pool_bytes)
{
    int n = coll->kind == BRAID_COLL_GROUP ? coll->nops : 1, next = 0;
    braid_piece_plan *plans = calloc((size_t)(n ? n : 1), sizeof(*plans));
    braid_coll *pieces = calloc((size_t)(n ? n : 1), sizeof(*pieces));
    braid_status st = BRAID_OK;
    if (!plans || !pieces)
        st = braid__error(BRAID_ERR_NO_MEMORY, "rank %d: out of memory staging %s", pg->rank,
                          braid__coll_job_name(coll));
    uint64_t seq = coll->seq;
    segment sg;
    while (st == BRAID_OK && next_segment(coll, &next, &seq, &sg)) {
        size_t need = plan_segment(pg, &sg, plans);
        if (need > pool_bytes)
            st = braid__error(BRAID_ERR_INTERNAL, "rank %d: %s needs %zu staging bytes, the pool holds %zu", pg->rank,
                              braid__coll_job_name(coll), need, pool_bytes);
        else
            st = stage_steps(pg, &sg, plans, sg.n, pool, pieces);
    }
    free(plans);
    free(pieces);
    return st;
}
