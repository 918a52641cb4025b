/* Group set-up shared by pg.c (create, destroy and the public entry
 * points), pg_config.c, pg_join.c and build_line.c. Internal to those. */
#ifndef BRAID_PG_INT_H
#define BRAID_PG_INT_H

#include "braid.h"
#include "pg.h"
#include "pg_rendezvous.h"

/* Settle the group's timeouts, socket count, chunk size, algorithm and
 * checksum from cfg (NULL: none), then BRAID_* variables, then defaults. */
braid_status braid__pg_apply_config(braid_pg *pg, const braid_config *cfg);

/* Join the group described by rv: everything from the configuration to
 * the connected peers and the executor thread. On failure the caller
 * releases pg. */
braid_status braid__pg_join(braid_pg *pg, const braid_rendezvous *rv, const braid_config *cfg);

/* Log, once per process at INFO, which braid this is and what CUDA there is
 * (build_line.c). */
void braid__log_build_line(int rank);

#endif
