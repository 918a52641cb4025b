/* Walking a ring all-reduce's items (ring_cursor.h). */
#include "ring_cursor.h"

#include "algo.h"

static void load_step(const braid_ring_geom *g, braid_ring_cursor *c)
{
    int seg = ((g->rank - c->step - c->shift) % g->n + g->n) % g->n;
    int shard = ((seg - g->shard_shift) % g->n + g->n) % g->n;
    c->seg_start = c->seg_len = 0;
    if (shard < g->nshards)
        braid__segment(g->count, g->nshards, shard, &c->seg_start, &c->seg_len);
    c->nchunks = (c->seg_len + g->elems_per_chunk - 1) / g->elems_per_chunk;
    c->chunk = 0;
}

/* Skip to the first step that has a chunk; leaves step == steps at the end. */
static void settle(const braid_ring_geom *g, braid_ring_cursor *c)
{
    while (c->step < c->steps && c->chunk >= c->nchunks) {
        c->step++;
        if (c->step < c->steps)
            load_step(g, c);
    }
}

void braid__ring_cursor_init(const braid_ring_geom *g, braid_ring_cursor *c, int first_step, int end_step, int shift)
{
    c->step = first_step;
    c->steps = end_step;
    c->shift = shift;
    c->seg_start = c->seg_len = c->nchunks = c->chunk = 0;
    if (c->step < c->steps)
        load_step(g, c);
    settle(g, c);
}

void braid__ring_cursor_next(const braid_ring_geom *g, braid_ring_cursor *c)
{
    c->chunk++;
    settle(g, c);
}

size_t braid__ring_cursor_items(const braid_ring_geom *g, braid_ring_cursor c)
{
    size_t items = 0;
    while (!braid__ring_cursor_done(&c)) {
        items += c.nchunks - c.chunk;
        c.chunk = c.nchunks;
        settle(g, &c);
    }
    return items;
}
