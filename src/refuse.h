/* Refused calls. A rank whose collective call fails its argument checks
 * (a NULL buffer, a bad count, dtype, op or root) tells its peers, so
 * that their matching call fails at once naming the rank, the call and
 * the reason ("rank 1 refused braid_allreduce: recv is NULL with count
 * 4"), instead of waiting out the timeout or reading "closed its
 * connection" from a rank that is alive. docs/RELIABILITY.md, "Refused
 * calls", gives the rules.
 *
 * The notice travels on the group's own (authenticated) links, where the
 * peers expect the call's fingerprint: the call's fingerprint with the
 * refused flag and a reason code, the argument it concerns and one value
 * in its spare bytes (algo/common.c). Nothing follows it, so a peer's
 * receives already posted behind the fingerprint take nothing of it, and
 * the receiver builds the text itself from validated fields: the refusing
 * rank's words are never printed. */
#ifndef BRAID_REFUSE_H
#define BRAID_REFUSE_H

#include <stdint.h>

#include "braid.h"

struct braid_coll; /* pg.h */

/* Reason codes on the wire (one byte). */
typedef enum {
    BRAID_REFUSED_OTHER = 1,    /* a check without a code (overlap, device memory...) */
    BRAID_REFUSED_NULL_BUF = 2, /* arg: which buffer; value: the count */
    BRAID_REFUSED_DTYPE = 3,    /* value: the dtype */
    BRAID_REFUSED_OP = 4,       /* value: the op */
    BRAID_REFUSED_ROOT = 5,     /* value: the root */
    BRAID_REFUSED_COUNT = 6,    /* value: the count (overflows) */
    BRAID_REFUSED_MAX = BRAID_REFUSED_COUNT
} braid_refused_code;

/* Which buffer a NULL_BUF code names. */
enum { BRAID_REFUSED_SEND = 1, BRAID_REFUSED_RECV = 2, BRAID_REFUSED_BUF = 3 };

/* At a public entry point, after its argument checks failed with st and
 * set the error text. For BRAID_ERR_INVALID_ARG on a usable group of
 * several ranks, outside an open braid_group: queue a refusal job behind
 * this rank's earlier calls (it takes the call's sequence number, as the
 * peers' matching call does), which sends the notice to every connected
 * peer and breaks the group with the reason (the peers' calls fail, so
 * it cannot go on). Returns st with the caller's error text unchanged. */
braid_status braid__coll_refuse(braid_pg *pg, const struct braid_coll *intended, braid_status st);

/* Executor side (dispatch): run a refusal job (coll->refused set). */
braid_status braid__refusal_run(braid_pg *pg, const struct braid_coll *coll);

/* Peer side, when call coll failed with st. refused_by >= 0: that peer's
 * fingerprint (fp) carried the refused flag; name it. Otherwise, when a
 * peer closed (st BRAID_ERR_PEER: a neighbour that failed first), look
 * briefly on every link for a refusal of this call waiting unread, so
 * ranks that never read from the refusing rank in this call still name
 * it. Returns st, or BRAID_ERR_PEER with the refusal's text. */
braid_status braid__refusal_explain(braid_pg *pg, const struct braid_coll *coll, int refused_by, const uint8_t *fp,
                                    braid_status st);

#endif
