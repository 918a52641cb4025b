/* Argument checks shared by the collective entry points outside the
 * all-reduce and broadcast paths (collectives_extra.c, exchange.c). Each
 * returns BRAID_OK or sets the error text (rank, call, cause). */
#ifndef BRAID_COLL_CHECK_H
#define BRAID_COLL_CHECK_H

#include <stddef.h>

#include "braid.h"

/* 1 when [a, a+alen) and [b, b+blen) share a byte. */
int braid__overlap(const void *a, size_t alen, const void *b, size_t blen);

/* pg, dtype, count overflow (per_rank: the larger buffer holds one
 * count-sized block per rank) and no CUDA stream. */
braid_status braid__check_common(braid_pg *pg, const char *name, size_t count, int per_rank, braid_dtype dtype,
                                 void *cuda_stream);

/* p is not CUDA device memory (these collectives run on host memory). */
braid_status braid__check_host(const braid_pg *pg, const char *name, const char *what, const void *p, size_t count);

/* p is not NULL when count > 0. */
braid_status braid__check_ptr(const braid_pg *pg, const char *name, const char *what, const void *p, size_t count);

#endif
