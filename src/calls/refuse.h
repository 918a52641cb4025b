/* Refused calls. A rank whose call (any collective, send or receive; not a
 * call inside braid_group_start/end) fails its argument checks (a NULL
 * buffer, a bad count, dtype, op, root or peer) tells its peers, so that their matching call fails at once naming
 * the rank, the call and the reason ("rank 1 refused braid_allreduce:
 * recv is NULL with count 4"), instead of waiting out the timeout or
 * reading "closed its connection" from a rank that is alive.
 * docs/RELIABILITY.md, "Refused calls", gives the rules.
 *
 * The notice does not travel on the data links, where a peer may expect
 * data of any length at that point of the call, but through the store
 * each rank serves on its shrink socket (pg_shrink.h), authenticated with
 * the group's secret: a fixed 36-byte record (magic, rank, call kind,
 * reason code, argument, sequence number, group tag, one value), which
 * the receiver validates field by field and turns into words itself; the
 * refusing rank's text is never printed by a peer. The refusing rank then
 * closes its links, as any failing rank does, so peers blocked on it fail
 * at once; a peer whose call fails because a peer closed reads its own
 * store for a notice of that call before it reports the close. */
#ifndef BRAID_REFUSE_H
#define BRAID_REFUSE_H

#include "braid.h"
#include "algo/algo_ctx.h"
#include "algo/coll.h"

/* At a public entry point, after its argument checks failed with st and
 * set the error text. For BRAID_ERR_INVALID_ARG on a usable group of
 * several ranks, outside an open braid_group: queue a refusal job behind
 * this rank's earlier calls (it takes the call's sequence number, as the
 * peers' matching call does), which sends the notice and breaks the group
 * with the reason (the peers' calls fail, so it cannot go on). Returns st
 * with the caller's error text unchanged. */
braid_status braid__coll_refuse(braid_pg *pg, const struct braid_coll *intended, braid_status st);

/* braid__coll_refuse of the call given by its arguments when st is
 * BRAID_ERR_INVALID_ARG; else st. */
braid_status braid__refuse_call(braid_pg *pg, braid_status st, braid_coll_kind kind, const void *send, void *recv,
                                size_t count, braid_dtype dtype, braid_op op, int root);

/* Executor side (dispatch): run a refusal job (coll->refused set). */
braid_status braid__refusal_run(braid_pg *pg, const struct braid_coll *coll);

/* This rank's call and peer m->peer's differ (BRAID_ERR_MISMATCH): leave
 * both calls in every peer's store, as a refusal is, so that their calls
 * fail naming both (BRAID_ERR_MISMATCH) instead of reading the links'
 * close. Keeps the caller's error text. */
void braid__mismatch_tell(braid_pg *pg, const braid_mismatch_seen *m);

/* Peer side, when call coll failed with st: after BRAID_ERR_PEER (a peer
 * closed), a notice that a rank refused this call or an earlier one
 * replaces the error with one naming that rank, its call and the reason
 * (BRAID_ERR_PEER). */
braid_status braid__refusal_explain(braid_pg *pg, const struct braid_coll *coll, braid_status st);

#endif
