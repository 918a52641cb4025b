/* The item order of the rings: a ring all-reduce's, shared by the host
 * pass (ring_allreduce.c) and the device ring (cuda/device_ring.c), which
 * must agree chunk for chunk to meet on the wire; and the block rings'
 * (ring_allgather.c, ring_reduce_scatter.c), below.
 *
 * With n ranks the buffer is split into n segments. At step s rank r sends
 * segment (r - s) mod n and receives segment (r - s - 1) mod n; each
 * segment is cut into chunks, and a direction's items are its (step,
 * chunk) pairs in order, steps with an empty segment skipped. */
#ifndef BRAID_ALGO_RING_CURSOR_H
#define BRAID_ALGO_RING_CURSOR_H

#include <stddef.h>

#include "pipeline.h"

typedef struct {
    int n, rank;            /* ring size and this rank's position in it */
    size_t count;           /* elements in the whole buffer */
    size_t elems_per_chunk;
    /* count is cut into nshards even shards; ring segment b carries shard
     * (b - shard_shift) mod n, empty when that is >= nshards. */
    int nshards, shard_shift;
} braid_ring_geom;

/* Walks the (step, chunk) items of one direction in order. */
typedef struct {
    int step, steps;        /* current step, end step */
    int shift;              /* segment = (rank - step - shift) mod n: 0 sends, 1 receives */
    size_t chunk;           /* chunk index in the current segment */
    size_t seg_start, seg_len, nchunks;
} braid_ring_cursor;

/* Cursor over steps [first_step, end_step), at its first item. */
void braid__ring_cursor_init(const braid_ring_geom *g, braid_ring_cursor *c, int first_step, int end_step, int shift);
void braid__ring_cursor_next(const braid_ring_geom *g, braid_ring_cursor *c);
/* Items from the cursor's position to its end. */
size_t braid__ring_cursor_items(const braid_ring_geom *g, braid_ring_cursor c);

static inline int braid__ring_cursor_done(const braid_ring_cursor *c)
{
    return c->step >= c->steps;
}

/* Element range [off, off+len) of the cursor's current chunk. */
static inline void braid__ring_cursor_range(const braid_ring_geom *g, const braid_ring_cursor *c, size_t *off,
                                            size_t *len)
{
    size_t first = c->chunk * g->elems_per_chunk;
    *off = c->seg_start + first;
    *len = c->seg_len - first < g->elems_per_chunk ? c->seg_len - first : g->elems_per_chunk;
}

/* The item order of the block rings (all-gather, reduce-scatter): n
 * blocks of count elements, n - 1 steps, every block cut into the same
 * chunks. Item k is (step k / chunks, chunk k % chunks), and carries block
 * (rank - step - shift) mod n, shift set by the schedule per direction. */
typedef struct {
    int n, rank;
    size_t count, esize, elems_per_chunk, chunks; /* chunks per block */
} braid_block_ring;

static inline void braid__block_ring_init(braid_block_ring *b, const braid_algo_ctx *ctx, size_t count, size_t esize)
{
    b->n = ctx->size;
    b->rank = ctx->rank;
    b->count = count;
    b->esize = esize;
    b->elems_per_chunk = ctx->chunk_bytes / esize ? ctx->chunk_bytes / esize : 1;
    b->chunks = (count + b->elems_per_chunk - 1) / b->elems_per_chunk;
}

/* Step, block and element range [off, off+len) of item k. */
static inline void braid__block_ring_item(const braid_block_ring *b, size_t k, int shift, int *step, int *block,
                                          size_t *off, size_t *len)
{
    *step = (int)(k / b->chunks);
    *block = ((b->rank - *step - shift) % b->n + b->n) % b->n;
    *off = (k % b->chunks) * b->elems_per_chunk;
    *len = b->count - *off < b->elems_per_chunk ? b->count - *off : b->elems_per_chunk;
}

/* The pipeline's ring: neighbours, (n - 1) * chunks items each way, and
 * step 0's sends (the rank's own data) ungated. */
static inline void braid__block_ring_pipeline(const braid_block_ring *b, braid_pipeline *p)
{
    p->next = (b->rank + 1) % b->n;
    p->prev = (b->rank + b->n - 1) % b->n;
    p->sends = p->recvs = (size_t)(b->n - 1) * b->chunks;
    p->send_lead = b->chunks;
}

#endif
