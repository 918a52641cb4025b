/* The bucketer's state, shared by bucket.c (layout, launch, public API) and
 * bucket_layout_check.c (the cross-rank layout check). Internal to those. */
#ifndef BRAID_BUCKET_INT_H
#define BRAID_BUCKET_INT_H

#include <string.h>

#include "bucket.h"
#include "status.h"

#define TEXT_MAX 1024

typedef struct {
    void *grad;
    size_t count;
    braid_dtype dtype;
    int bucket;    /* -1 until the layout is formed */
    size_t offset; /* element offset in the bucket's flat buffer */
    int marked;    /* ready() was called for it in this step */
} param_slot;

typedef struct {
    braid_dtype dtype;
    braid_dtype wire_dtype;
    size_t count;
    size_t bytes;
    int nparams;
    int cap_params;
    int *param_ids;
    size_t *offsets;
    void *flat;  /* count elements of wire_dtype */
    void *dflat; /* the same in device memory, made at the first step that needs it */
    int placed;    /* on_device decided (at the first ready of the first step) */
    int on_device; /* the gradients go through dflat: most of the bucket's bytes are device memory */
    int pending; /* params not yet marked in this step */
    int launched;
    braid_work *work; /* NULL when launched without communication */
} bucket;

struct braid_bucketer {
    braid_pg *pg;
    size_t bucket_bytes;
    size_t first_bucket_bytes;
    braid_dtype wire_dtype; /* BRAID_F32: no compression */
    param_slot *params;
    int nparams, cap_params;
    bucket *buckets;
    int nbuckets;
    int built;
    /* A failed build (layouts differ across ranks) is final: retrying would
     * run the cross-rank check again, alone, and hang. */
    braid_status build_status;
    char build_text[TEXT_MAX];
    int next_launch; /* lowest bucket index not yet launched */
    unsigned long long step;
    /* First failure of this step (a launch that failed): later ready()
     * calls and finish() report it. */
    braid_status step_status;
    char step_text[TEXT_MAX];
};

static inline int rank_of(const braid_bucketer *b)
{
    return braid_pg_rank(b->pg);
}

/* Every rank must form the same buckets, or their all-reduces would pair
 * up wrongly: all-gather a summary of the layout and fail with
 * BRAID_ERR_MISMATCH, naming both layouts, when ranks differ. */
braid_status braid__bucketer_check_layout(braid_bucketer *b);

#endif
