/* Refused calls: the notice to the peers and its reading (refuse.h). */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "algo/algo.h"
#include "clock.h"
#include "log.h"
#include "pg.h"
#include "refuse.h"
#include "status.h"

/* Longest the refusing rank spends handing the notice to its links. */
#define NOTICE_SEND_MS 2000
/* After a neighbour's close: how long to look for a waiting refusal. The
 * refusing rank sent it before any peer failed, so it has arrived. */
#define CASCADE_LOOK_MS 200

static int has_op(braid_coll_kind k)
{
    return k == BRAID_COLL_ALLREDUCE || k == BRAID_COLL_REDUCE || k == BRAID_COLL_REDUCE_SCATTER;
}

static int has_root(braid_coll_kind k)
{
    return k == BRAID_COLL_BROADCAST || k == BRAID_COLL_REDUCE;
}

/* The code of a refused call, found again from its arguments (the checks
 * at the entry points set only text). */
static void classify(const braid_pg *pg, const braid_coll *c, int *code, int *arg, uint64_t *value)
{
    size_t esize = braid_dtype_size(c->dtype);
    *arg = 0;
    *value = 0;
    if (esize == 0) {
        *code = BRAID_REFUSED_DTYPE;
        *value = (uint64_t)(unsigned)c->dtype;
    } else if (has_op(c->kind) && (unsigned)c->op >= BRAID_OP_COUNT) {
        *code = BRAID_REFUSED_OP;
        *value = (uint64_t)(unsigned)c->op;
    } else if (has_root(c->kind) && (c->root < 0 || c->root >= pg->size)) {
        *code = BRAID_REFUSED_ROOT;
        *value = (uint64_t)(int64_t)c->root;
    } else if (c->count > SIZE_MAX / esize / 2 / (size_t)pg->size) {
        *code = BRAID_REFUSED_COUNT;
        *value = c->count;
    } else if (c->count > 0 && (!c->send || (!c->recv && (c->kind != BRAID_COLL_REDUCE || c->root == pg->rank)))) {
        *code = BRAID_REFUSED_NULL_BUF;
        *arg = c->kind == BRAID_COLL_BROADCAST ? BRAID_REFUSED_BUF : !c->send ? BRAID_REFUSED_SEND : BRAID_REFUSED_RECV;
        *value = c->count;
    } else {
        *code = BRAID_REFUSED_OTHER;
    }
}

braid_status braid__coll_refuse(braid_pg *pg, const braid_coll *intended, braid_status st)
{
    if (st != BRAID_ERR_INVALID_ARG || braid__pg_check_handle_quiet(pg) != BRAID_OK || pg->size < 2 ||
        intended->kind == BRAID_COLL_SEND || intended->kind == BRAID_COLL_RECV || intended->kind == BRAID_COLL_GROUP ||
        atomic_load(&pg->aborted) || atomic_load(&pg->error) != BRAID_OK || braid__group_open_here(pg))
        return st;
    char text[512], detail[512];
    snprintf(text, sizeof(text), "%s", braid_last_error());
    snprintf(detail, sizeof(detail), "%s", braid__error_detail());
    braid_coll c = *intended;
    c.refused = detail;
    /* Blocking: the job runs in issue order, after this rank's earlier
     * calls, and is done with c before we return. */
    (void)braid__work_submit(pg, &c, NULL);
    braid__error_set_text(text);
    return st;
}

/* Wait for the listed requests, at most until deadline; errors of one
 * link (a peer gone) do not stop the others. */
static void drain(braid_pg *pg, braid_req *reqs, braid_conn **conns, int *pending, int n, int64_t deadline)
{
    for (;;) {
        int left = 0;
        for (int i = 0; i < n; i++) {
            int done = 0;
            if (!pending[i])
                continue;
            if (conns[i]->ops->test(&reqs[i], &done) != BRAID_OK || done)
                pending[i] = 0;
            else
                left++;
        }
        if (left == 0 || braid__now_ms() >= deadline || atomic_load(&pg->aborted))
            return;
        for (int i = 0; i < n; i++)
            if (pending[i] && conns[i]->ops->progress(&conns[i], 1, -1, 0) != BRAID_OK)
                pending[i] = 0;
        usleep(200);
    }
}

braid_status braid__refusal_run(braid_pg *pg, const braid_coll *coll)
{
    uint8_t fp[BRAID_FP_BYTES];
    int code, arg;
    uint64_t value;
    classify(pg, coll, &code, &arg, &value);
    braid__fp_encode(coll, fp);
    braid__fp_set_refused(fp, (uint8_t)code, (uint8_t)arg, value);
    size_t cap = (size_t)pg->size;
    braid_req *reqs = calloc(cap, sizeof(*reqs));
    braid_conn **conns = calloc(cap, sizeof(*conns));
    int *pending = calloc(cap, sizeof(*pending)), n = 0;
    for (int p = 0; reqs && conns && pending && p < pg->size; p++) {
        braid_conn *c = pg->conns[p];
        /* A link never made (groups above the eager mesh connect lazily):
         * that peer learns from a neighbour's close. */
        if (p == pg->rank || !c || c->ops->isend(c, &reqs[n], fp, sizeof(fp)) != BRAID_OK)
            continue;
        conns[n] = c;
        pending[n++] = 1;
    }
    drain(pg, reqs, conns, pending, n, braid__now_ms() + NOTICE_SEND_MS);
    free(reqs);
    free(conns);
    free(pending);
    /* Broken from here: the peers' matching calls fail, so the links are
     * out of step. Sticky, without closing the links, so a peer that has
     * not read the notice yet still can. */
    int expected = BRAID_OK;
    if (atomic_compare_exchange_strong(&pg->error, &expected, (int)BRAID_ERR_INVALID_ARG))
        snprintf(pg->error_text, sizeof(pg->error_text),
                 "rank %d refused braid_%s #%" PRIu64 " and told its peers, whose matching calls failed (its "
                 "error: %s): recreate the group",
                 pg->rank, braid__coll_name(coll->kind), coll->seq, coll->refused);
    BRAID_INFO("rank %d: told %d peers that it refused braid_%s #%" PRIu64, pg->rank, n, braid__coll_name(coll->kind),
               coll->seq);
    return BRAID_ERR_INVALID_ARG;
}

static const char *const buffer_names[] = {"?", "send", "recv", "buf"};

/* The peer's words, from fields checked here: nothing of the wire is
 * printed as text. */
static braid_status refused_error(braid_pg *pg, const braid_coll *coll, int peer, const uint8_t *fp)
{
    uint64_t seq, value;
    int kind, code, arg;
    char why[128];
    if (!braid__fp_refused(fp, &seq, &kind, &code, &arg, &value) || kind < BRAID_COLL_ALLREDUCE ||
        kind > BRAID_COLL_REDUCE_SCATTER)
        return braid__error(BRAID_ERR_PEER, "rank %d: %s #%" PRIu64 ": peer %d sent a malformed refusal", pg->rank,
                            braid__coll_name(coll->kind), coll->seq, peer);
    switch (code) {
    case BRAID_REFUSED_NULL_BUF:
        snprintf(why, sizeof(why), "%s is NULL with count %" PRIu64,
                 arg >= BRAID_REFUSED_SEND && arg <= BRAID_REFUSED_BUF ? buffer_names[arg] : "a buffer", value);
        break;
    case BRAID_REFUSED_DTYPE:
        snprintf(why, sizeof(why), "invalid dtype %" PRIu64, value);
        break;
    case BRAID_REFUSED_OP:
        snprintf(why, sizeof(why), "invalid op %" PRIu64, value);
        break;
    case BRAID_REFUSED_ROOT:
        snprintf(why, sizeof(why), "root %" PRId64 " out of range [0, %d)", (int64_t)value, pg->size);
        break;
    case BRAID_REFUSED_COUNT:
        snprintf(why, sizeof(why), "count %" PRIu64 " overflows", value);
        break;
    default:
        snprintf(why, sizeof(why), "invalid arguments (rank %d's own error says which)", peer);
        break;
    }
    return braid__error(BRAID_ERR_PEER, "rank %d: %s #%" PRIu64 " failed: rank %d refused braid_%s: %s", pg->rank,
                        braid__coll_name(coll->kind), coll->seq, peer, braid__coll_name((braid_coll_kind)kind), why);
}

braid_status braid__refusal_explain(braid_pg *pg, const braid_coll *coll, int refused_by, const uint8_t *fp,
                                    braid_status st)
{
    if (st == BRAID_OK)
        return st;
    if (refused_by >= 0 && refused_by < pg->size && refused_by != pg->rank && fp)
        return refused_error(pg, coll, refused_by, fp);
    if (st != BRAID_ERR_PEER || pg->size < 3)
        return st;
    /* A neighbour failed first. A refusal of this call may wait unread on
     * a link this rank had no reason to read in it. */
    size_t cap = (size_t)pg->size;
    uint8_t(*fps)[BRAID_FP_BYTES] = calloc(cap, sizeof(*fps));
    braid_req *reqs = calloc(cap, sizeof(*reqs));
    braid_conn **conns = calloc(cap, sizeof(*conns));
    int *peer_of = calloc(cap, sizeof(*peer_of)), *pending = calloc(cap, sizeof(*pending)), n = 0;
    for (int p = 0; fps && reqs && conns && peer_of && pending && p < pg->size; p++) {
        braid_conn *c = pg->conns[p];
        if (p == pg->rank || !c || c->ops->irecv(c, &reqs[n], fps[n], BRAID_FP_BYTES) != BRAID_OK)
            continue;
        conns[n] = c;
        peer_of[n] = p;
        pending[n++] = 1;
    }
    int64_t deadline = braid__now_ms() + CASCADE_LOOK_MS;
    int found = -1;
    while (found < 0) {
        int left = 0;
        for (int i = 0; i < n && found < 0; i++) {
            int done = 0;
            if (!pending[i])
                continue;
            if (conns[i]->ops->test(&reqs[i], &done) != BRAID_OK) {
                pending[i] = 0;
            } else if (!done) {
                left++;
            } else {
                pending[i] = 0;
                uint64_t seq, value;
                int kind, code, arg;
                if (braid__fp_refused(fps[i], &seq, &kind, &code, &arg, &value) && seq == coll->seq)
                    found = i;
            }
        }
        if (found >= 0 || left == 0 || braid__now_ms() >= deadline)
            break;
        for (int i = 0; i < n; i++)
            if (pending[i] && conns[i]->ops->progress(&conns[i], 1, -1, 0) != BRAID_OK)
                pending[i] = 0;
        usleep(500);
    }
    if (found >= 0)
        st = refused_error(pg, coll, peer_of[found], fps[found]);
    /* The group breaks after this and its links close, abandoning the
     * receives posted here. */
    free(fps);
    free(reqs);
    free(conns);
    free(peer_of);
    free(pending);
    return st;
}
