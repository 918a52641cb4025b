/* Start of a group: the store and every rank's arrival (pg_rendezvous.c). */
#ifndef BRAID_PG_RENDEZVOUS_H
#define BRAID_PG_RENDEZVOUS_H

#include "bootstrap/bootstrap.h"
#include "pg.h"

/* Rank 0 serves the store; every rank connects to it and waits, up to
 * pg->init_timeout_ms, until all ranks have. Rank 0 logs the missing ranks
 * while it waits (WARN) and fails naming them; the others then fail with
 * rank 0's text. Leaves pg->store open on success. */
braid_status braid__pg_rendezvous(braid_pg *pg, const braid_rendezvous *rv);

/* For a process whose launch variables make it no rank of the job
 * (rv->launch_error): reach the store, stating its rank and world size, so
 * that the store stops every member with the reason, then fail with
 * BRAID_ERR_INVALID_ARG saying what is wrong and whether the others know. */
braid_status braid__pg_report_launch_mistake(braid_pg *pg, const braid_rendezvous *rv);

#endif
