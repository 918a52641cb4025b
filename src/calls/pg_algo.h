/* The one bridge from a process group to the algorithms (pg_algo.c): it
 * fills the narrow context they run on, and offers the group-level entry
 * points the rest of the library calls. */
#ifndef BRAID_PG_ALGO_H
#define BRAID_PG_ALGO_H

#include "algo/algo.h"
#include "pg.h"

/* Fill ctx from pg; ctx points into pg, valid while pg lives. */
void braid__pg_algo_ctx(braid_pg *pg, braid_algo_ctx *ctx);

/* The tuner's all-reduce choice and the host topology, for a group. */
braid_algo braid__pg_allreduce_algo(braid_pg *pg, size_t count, braid_dtype dtype);
const braid_hier_topo *braid__pg_hier_topo(braid_pg *pg);

#endif
