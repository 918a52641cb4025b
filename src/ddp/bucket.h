/* DDP bucketer internals that tests inspect: the bucket layout is what
 * decides which all-reduces run and in what order, so the suite checks it
 * directly instead of inferring it from timing. */
#ifndef BRAID_BUCKET_H
#define BRAID_BUCKET_H

#include <stddef.h>

#include "braid.h"

/* One bucket as laid out in its flat buffer. */
typedef struct {
    braid_dtype dtype;      /* dtype of every gradient in the bucket */
    braid_dtype wire_dtype; /* dtype of the flat buffer and the all-reduce */
    size_t count;           /* elements in the flat buffer */
    size_t bytes;           /* count * size of dtype (the size counted against the cap) */
    int nparams;
    const int *param_ids;  /* in flat-buffer order (reverse registration order) */
    const size_t *offsets; /* element offset of each param in the flat buffer */
} braid__bucket_info;

/* Form the buckets now (normally done by the first ready()); afterwards no
 * more params can be added. Idempotent. */
braid_status braid__bucketer_build(braid_bucketer *b);

/* Layout of bucket k (0 <= k < bucket count). Pointers stay valid until
 * the bucketer is destroyed. */
braid_status braid__bucketer_bucket_info(const braid_bucketer *b, int k, braid__bucket_info *info);

#endif
