/* Group shrink (pg_shrink.c): the hooks the process group calls, and the
 * group constructor pg.c lends to it. docs/RELIABILITY.md, "Group shrink",
 * describes the agreement. */
#ifndef BRAID_PG_SHRINK_H
#define BRAID_PG_SHRINK_H

#include "bootstrap/bootstrap.h"
#include "pg.h"

/* During braid_pg_init, once the store and pg->ctx.bind_ip are up: keep a
 * copy of cfg (the shrunk group is made alike), open this rank's shrink
 * socket and exchange every rank's shrink address through the store. */
braid_status braid__shrink_prepare(braid_pg *pg, const braid_config *cfg);

/* Close the shrink socket and free what braid__shrink_prepare made (group
 * destruction; safe on a group where it never ran). */
void braid__shrink_release(braid_pg *pg);

/* Rank p's shrink socket address ("ip:port"), NULL when unknown; for
 * diagnostics and the tests that squat it. */
const char *braid__shrink_addr(const braid_pg *pg, int p);

/* Notices between members outside the data links (src/calls/refuse.h), through
 * the store every rank serves on its shrink socket, authenticated with
 * the group's secret. Send: set key = value in every other rank's store,
 * within budget_ms in all (a rank that cannot be reached is skipped);
 * returns how many took it. Wait: read key from this rank's own store,
 * waiting at most wait_ms for it to appear. */
int braid__shrink_notice_send(braid_pg *pg, const char *key, const void *value, size_t len, int budget_ms);
braid_status braid__shrink_notice_wait(braid_pg *pg, const char *key, void *value, size_t cap, size_t *len,
                                       int wait_ms);

/* Make a group from a rendezvous (pg.c): what braid_pg_init does after
 * decoding the unique id. */
braid_status braid__pg_create(braid_pg **pg, int rank, int size, const braid_rendezvous *rv, const braid_config *cfg);

#endif
