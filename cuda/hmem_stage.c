/* Staging a job on device buffers through pinned host memory (hmem.h,
 * CUDA build): any collective, a send or a receive, or a group of them.
 *
 * Every op is cut into pieces of whole elements. Piece k of an op covers
 * elements [k * per, k * per + len) of each of its blocks (one block, or
 * one per rank for the side of an all-gather or reduce-scatter that holds
 * every rank's), so a piece is itself an op of the same kind on len
 * elements; blocks go down and up as one strided copy. The cut depends
 * only on what every rank of the op knows (kind, count, dtype, group
 * size), never on what else is in the job: a send grouped on one rank
 * meets its receive alone on the other piece for piece, and collectives
 * take the same pieces everywhere.
 *
 * A group runs as segments, in issue order: each collective alone (with
 * the sequence number the group gives it), each run of consecutive sends
 * and receives together, as braid runs groups (algo/dispatch.c). Every
 * rank cuts its group the same way, and a collective sees what an earlier
 * op of the group wrote, as on host buffers. Step k of a segment runs
 * piece k of each of its ops that has one, as one host call, in the pool
 * half k & 1, while piece k+1 is copied down into the other half on the
 * d2h stream and piece k-1 up from it on h2d: copies overlap the network.
 * Pieces are sized so that one op's piece needs at most
 * BRAID_HMEM_PIECE_BYTES of a half (sends and receives a quarter of that:
 * a run of many of them stays small); the submitter made the pool hold
 * the largest segment's step (braid__hmem_stage_need). */
#include <stdint.h>
#include <stdlib.h>

#include <cuda_runtime_api.h>

#include "pg_algo.h"
#include "hmem.h"
#include "hmem_cuda.h"

/* Sends and receives: a group exchanging with every peer holds one piece
 * per peer in each half. */
#define P2P_PIECE_BYTES (BRAID_HMEM_PIECE_BYTES / 4)
#define AREA_ALIGN 256

/* How one op is cut. */
typedef struct {
    braid_coll *op;
    size_t esize, per, npieces;
    int srows, rrows;   /* blocks of the send and recv sides (0: none here) */
    int shared;         /* send and recv are one area (in place on pinned) */
    int down, up;       /* the op's input goes down, its result comes up */
    size_t soff, roff;  /* the sides' offsets in a half */
} piece_plan;

static size_t align_up(size_t n)
{
    return (n + AREA_ALIGN - 1) / AREA_ALIGN * AREA_ALIGN;
}

static void plan_op(const braid_pg *pg, braid_coll *op, piece_plan *p)
{
    size_t n = (size_t)pg->size;
    *p = (piece_plan){.op = op, .esize = braid_dtype_size(op->dtype)};
    size_t budget = BRAID_HMEM_PIECE_BYTES, rows = 1;
    switch (op->kind) {
    case BRAID_COLL_ALLREDUCE:
        p->srows = p->rrows = p->shared = p->down = p->up = 1;
        break;
    case BRAID_COLL_BROADCAST: /* in place on recv: the root's goes down, the others' comes up */
        p->srows = p->rrows = p->shared = 1;
        p->down = op->root == pg->rank;
        p->up = !p->down;
        break;
    case BRAID_COLL_REDUCE:
        p->srows = p->down = 1;
        p->rrows = p->up = op->root == pg->rank;
        rows = 2;
        break;
    case BRAID_COLL_ALLGATHER:
        p->srows = p->down = p->up = 1;
        p->rrows = (int)n;
        rows = n + 1;
        break;
    case BRAID_COLL_REDUCE_SCATTER:
        p->srows = (int)n;
        p->rrows = p->down = p->up = 1;
        rows = n + 1;
        break;
    case BRAID_COLL_SEND:
        p->srows = p->down = 1;
        budget = P2P_PIECE_BYTES;
        break;
    case BRAID_COLL_RECV:
        p->rrows = p->up = 1;
        budget = P2P_PIECE_BYTES;
        break;
    default:
        return; /* nothing else reaches the executor with buffers */
    }
    p->per = budget / (p->esize * rows);
    if (p->per == 0)
        p->per = 1;
    p->npieces = op->count ? (op->count + p->per - 1) / p->per : 0;
}

/* Lay the ops' areas out in a half; returns the half's size. */
static size_t plan_layout(piece_plan *plans, int n)
{
    size_t off = 0;
    for (int i = 0; i < n; i++) {
        piece_plan *p = &plans[i];
        if (!p->npieces)
            continue;
        size_t piece = p->per * p->esize;
        p->soff = off;
        off += align_up(piece * (size_t)p->srows);
        p->roff = p->shared ? p->soff : off;
        if (!p->shared)
            off += align_up(piece * (size_t)p->rrows);
    }
    return off;
}

static int is_p2p(const braid_coll *op)
{
    return op->kind == BRAID_COLL_SEND || op->kind == BRAID_COLL_RECV;
}

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
    if (!is_p2p(&coll->ops[i])) {
        sg->group = NULL;
        sg->one = coll->ops[i];
        sg->one.seq = (*seq)++; /* as run_group numbers the group's collectives */
        sg->ops = &sg->one;
        sg->n = 1;
        *next = i + 1;
        return 1;
    }
    int j = i;
    while (j < coll->nops && is_p2p(&coll->ops[j]))
        j++;
    *sg = (segment){.group = coll, .ops = &coll->ops[i], .n = j - i};
    *next = j;
    return 1;
}

braid_status braid__hmem_stage_need(const braid_pg *pg, braid_coll *coll, size_t *bytes)
{
    int n = coll->kind == BRAID_COLL_GROUP ? coll->nops : 1, next = 0;
    piece_plan *plans = calloc((size_t)(n ? n : 1), sizeof(*plans));
    if (!plans)
        return braid__error(BRAID_ERR_NO_MEMORY, "rank %d: out of memory planning a staged call", pg->rank);
    uint64_t seq = coll->seq;
    segment sg;
    *bytes = 0;
    while (next_segment(coll, &next, &seq, &sg)) {
        for (int i = 0; i < sg.n; i++)
            plan_op(pg, &sg.ops[i], &plans[i]);
        size_t need = plan_layout(plans, sg.n);
        *bytes = need > *bytes ? need : *bytes;
    }
    free(plans);
    return BRAID_OK;
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

static size_t piece_len(const piece_plan *p, size_t k)
{
    size_t off = k * p->per;
    return p->op->count - off < p->per ? p->op->count - off : p->per;
}

/* Piece k's inputs into half `pin`, on d2h; returns whether any copy was queued. */
static braid_status down(braid_pg *pg, piece_plan *plans, int n, size_t k, char *pin, int *queued)
{
    cudaStream_t s = pg->hmem->d2h;
    *queued = 0;
    for (int i = 0; i < n; i++) {
        piece_plan *p = &plans[i];
        if (k >= p->npieces || !p->down)
            continue;
        size_t len = piece_len(p, k), w = len * p->esize, block = p->op->count * p->esize;
        const char *src = (const char *)p->op->send + k * p->per * p->esize;
        BRAID_CHECK(copy_blocks(pg, pin + p->soff, w, src, block, w, p->srows, s));
        *queued = 1;
    }
    return BRAID_OK;
}

/* Piece k's results out of half `pin`, on h2d. */
static braid_status up(braid_pg *pg, piece_plan *plans, int n, size_t k, const char *pin, int *queued)
{
    cudaStream_t s = pg->hmem->h2d;
    *queued = 0;
    for (int i = 0; i < n; i++) {
        piece_plan *p = &plans[i];
        if (k >= p->npieces || !p->up)
            continue;
        size_t len = piece_len(p, k), w = len * p->esize, block = p->op->count * p->esize;
        char *dst = (char *)p->op->recv + k * p->per * p->esize;
        BRAID_CHECK(copy_blocks(pg, dst, block, pin + p->roff, w, w, p->rrows, s));
        *queued = 1;
    }
    return BRAID_OK;
}

/* Step k as one host call on half `pin` (pieces: room for the segment's). */
static braid_status run_step(braid_pg *pg, const segment *sg, piece_plan *plans, int n, size_t k, char *pin,
                             braid_coll *pieces)
{
    int m = 0;
    for (int i = 0; i < n; i++) {
        piece_plan *p = &plans[i];
        if (k >= p->npieces)
            continue;
        braid_coll c = *p->op;
        c.hmem = NULL;
        c.stream = NULL;
        c.count = piece_len(p, k);
        c.send = p->srows ? pin + p->soff : NULL;
        c.recv = p->rrows ? pin + p->roff : NULL;
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

static braid_status stage_steps(braid_pg *pg, const segment *sg, piece_plan *plans, int n, void *const pool[2],
                                braid_coll *pieces)
{
    struct braid_hmem *h = pg->hmem;
    size_t steps = 0;
    for (int i = 0; i < n; i++)
        steps = plans[i].npieces > steps ? plans[i].npieces : steps;
    int down_queued[2] = {0, 0}, up_queued[2] = {0, 0};
    if (steps > 0) {
        BRAID_CHECK(down(pg, plans, n, 0, pool[0], &down_queued[0]));
        CUDA_CALL(cudaEventRecord(h->down_done[0], h->d2h), "cudaEventRecord", pg->rank);
    }
    for (size_t k = 0; k < steps; k++) {
        int b = (int)(k & 1), nb = b ^ 1;
        if (k + 1 < steps) {
            /* Half nb is written again only once its last up copies finished. */
            if (up_queued[nb])
                CUDA_CALL(cudaStreamWaitEvent(h->d2h, h->up_done[nb], 0), "cudaStreamWaitEvent", pg->rank);
            BRAID_CHECK(down(pg, plans, n, k + 1, pool[nb], &down_queued[nb]));
            CUDA_CALL(cudaEventRecord(h->down_done[nb], h->d2h), "cudaEventRecord", pg->rank);
        }
        /* The host reads half b once its inputs are down and writes it once
         * the results of step k - 2 have gone up from it. */
        if (down_queued[b])
            BRAID_CHECK(event_sync(pg, h->down_done[b]));
        if (up_queued[b])
            BRAID_CHECK(event_sync(pg, h->up_done[b]));
        BRAID_CHECK(run_step(pg, sg, plans, n, k, pool[b], pieces));
        BRAID_CHECK(up(pg, plans, n, k, pool[b], &up_queued[b]));
        CUDA_CALL(cudaEventRecord(h->up_done[b], h->h2d), "cudaEventRecord", pg->rank);
    }
    CUDA_CALL(cudaStreamSynchronize(h->h2d), "cudaStreamSynchronize", pg->rank);
    return BRAID_OK;
}

braid_status braid__hmem_stage(braid_pg *pg, braid_coll *coll, void *const pool[2], size_t pool_bytes)
{
    int n = coll->kind == BRAID_COLL_GROUP ? coll->nops : 1, next = 0;
    piece_plan *plans = calloc((size_t)(n ? n : 1), sizeof(*plans));
    braid_coll *pieces = calloc((size_t)(n ? n : 1), sizeof(*pieces));
    braid_status st = BRAID_OK;
    if (!plans || !pieces)
        st = braid__error(BRAID_ERR_NO_MEMORY, "rank %d: out of memory staging %s", pg->rank,
                          braid__coll_job_name(coll));
    uint64_t seq = coll->seq;
    segment sg;
    while (st == BRAID_OK && next_segment(coll, &next, &seq, &sg)) {
        for (int i = 0; i < sg.n; i++)
            plan_op(pg, &sg.ops[i], &plans[i]);
        size_t need = plan_layout(plans, sg.n);
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
