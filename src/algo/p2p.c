/* Point-to-point sends and receives, a batch of them progressed together.
 *
 * Matching is NCCL's: between two ranks, the k-th send one posts to the
 * other matches the k-th receive the other posts from it. The transport
 * keeps each direction of a connection in posting order, so posting the
 * messages in call order is the matching. Every message is preceded by a
 * fingerprint carrying its dtype, count and per-pair message number; the
 * receiver checks it against its own call before posting the data receive,
 * so a count or dtype mismatch (or a collective meeting a send) fails with
 * both calls named and nothing written into the caller's buffer. Receives
 * from one peer are therefore chained: the next fingerprint receive is
 * posted when the previous message has landed.
 *
 * Messages to and from the rank itself pair up in order within the batch
 * and are plain copies. */
#include <stdlib.h>
#include <string.h>

#include "algo.h"
#include "status.h"

enum { MSG_CHAINED, MSG_FP, MSG_DATA, MSG_DONE };

typedef struct {
    const braid_coll *op;
    braid_conn *conn;
    braid_coll fp; /* the message's fingerprint: kind, dtype, count, seq */
    uint8_t fp_mine[BRAID_FP_BYTES], fp_theirs[BRAID_FP_BYTES];
    braid_req fp_req, data_req;
    int state;
    int fp_done; /* sends: fingerprint handed to the transport */
    int next;    /* receives: next receive from the same peer, or -1 */
} p2p_msg;

static size_t msg_bytes(const braid_coll *op)
{
    return op->count * braid_dtype_size(op->dtype);
}

static int is_self(int rank, const braid_coll *op)
{
    return op->peer == rank;
}

/* Index of the first op at or after i that is `kind` to or from this rank
 * itself, or nops. */
static int next_self(int rank, const braid_coll *ops, int nops, int i, braid_coll_kind kind)
{
    while (i < nops && !(ops[i].kind == kind && is_self(rank, &ops[i])))
        i++;
    return i;
}

braid_status braid__p2p_check_self(int rank, const braid_coll *ops, int nops)
{
    int s = next_self(rank, ops, nops, 0, BRAID_COLL_SEND), r = next_self(rank, ops, nops, 0, BRAID_COLL_RECV);
    for (int k = 0; s < nops || r < nops; k++) {
        if (s == nops || r == nops)
            return braid__error(BRAID_ERR_INVALID_ARG, "rank %d: %s to itself #%d has no matching %s in the same group",
                                rank, s < nops ? "send" : "recv", k, s < nops ? "recv" : "send");
        if (ops[s].count != ops[r].count || ops[s].dtype != ops[r].dtype)
            return braid__error(BRAID_ERR_INVALID_ARG,
                                "rank %d: send to itself #%d (count=%zu, %s) does not match its recv (count=%zu, %s)",
                                rank, k, ops[s].count, braid__dtype_name(ops[s].dtype), ops[r].count,
                                braid__dtype_name(ops[r].dtype));
        s = next_self(rank, ops, nops, s + 1, BRAID_COLL_SEND);
        r = next_self(rank, ops, nops, r + 1, BRAID_COLL_RECV);
    }
    return BRAID_OK;
}

static void copy_self(int rank, const braid_coll *ops, int nops)
{
    int s = next_self(rank, ops, nops, 0, BRAID_COLL_SEND), r = next_self(rank, ops, nops, 0, BRAID_COLL_RECV);
    for (; s < nops && r < nops;
         s = next_self(rank, ops, nops, s + 1, BRAID_COLL_SEND), r = next_self(rank, ops, nops, r + 1, BRAID_COLL_RECV))
        if (msg_bytes(&ops[s]) && ops[r].recv != ops[s].send)
            memmove(ops[r].recv, ops[s].send, msg_bytes(&ops[s]));
}

/* The run as seen from one message, so that waits and fingerprint checks
 * name the message ("recv #3 ... peer 2") rather than the batch. */
static braid_algo_run msg_run(const braid_algo_run *run, const p2p_msg *m)
{
    braid_algo_run sub = *run;
    sub.coll = &m->fp;
    sub.name = braid__kind(m->fp.kind)->name;
    return sub;
}

static braid_status post_fp_recv(p2p_msg *m)
{
    m->state = MSG_FP;
    return m->conn->ops->irecv(m->conn, &m->fp_req, m->fp_theirs, sizeof(m->fp_theirs));
}

/* Advance message i without blocking; *moved when anything happened. */
static braid_status progress_msg(const braid_algo_run *run, p2p_msg *msgs, int i, int *moved)
{
    p2p_msg *m = &msgs[i];
    braid_algo_run sub = msg_run(run, m);
    int done;
    size_t bytes = msg_bytes(m->op);
    if (m->op->kind == BRAID_COLL_SEND) {
        if (!m->fp_done) {
            BRAID_CHECK(braid__algo_test(&sub, &m->fp_req, &m->fp_done));
            if (!m->fp_done)
                return BRAID_OK;
            *moved = 1;
        }
        if (bytes) {
            BRAID_CHECK(braid__algo_test(&sub, &m->data_req, &done));
            if (!done)
                return BRAID_OK;
        }
        m->state = MSG_DONE;
        *moved = 1;
        return BRAID_OK;
    }
    if (m->state == MSG_FP) {
        BRAID_CHECK(braid__algo_test(&sub, &m->fp_req, &done));
        if (!done)
            return BRAID_OK;
        *moved = 1;
        BRAID_CHECK(braid__fp_check(&sub, m->op->peer, m->fp_theirs));
        m->state = MSG_DATA;
        if (bytes)
            BRAID_CHECK(m->conn->ops->irecv(m->conn, &m->data_req, m->op->recv, bytes));
    }
    if (m->state == MSG_DATA) {
        if (bytes) {
            BRAID_CHECK(braid__algo_test(&sub, &m->data_req, &done));
            if (!done)
                return BRAID_OK;
        }
        m->state = MSG_DONE;
        *moved = 1;
        if (m->next >= 0)
            BRAID_CHECK(post_fp_recv(&msgs[m->next]));
    }
    return BRAID_OK;
}

/* Connections to every peer of the batch: first those this rank dials,
 * then those it accepts, so that no rank waits in accept() for a peer that
 * is itself waiting in accept() before dialling. */
static braid_status connect_peers(const braid_algo_ctx *ctx, p2p_msg *msgs, int nops, braid_conn **conns, int *nconns)
{
    for (int pass = 0; pass < 2; pass++)
        for (int i = 0; i < nops; i++) {
            int peer = msgs[i].op->peer;
            if (peer == ctx->rank || (pass == 0) != (ctx->rank < peer))
                continue;
            BRAID_CHECK(braid__ctx_conn(ctx, peer, &msgs[i].conn));
        }
    *nconns = 0;
    for (int i = 0; i < nops; i++) {
        if (!msgs[i].conn)
            continue;
        int seen = 0;
        for (int j = 0; j < *nconns && !seen; j++)
            seen = conns[j] == msgs[i].conn;
        if (!seen)
            conns[(*nconns)++] = msgs[i].conn;
    }
    return BRAID_OK;
}

/* Post every send (fingerprint, then data) and the first receive from
 * each peer; later receives from a peer wait on the one before. */
static braid_status post_all(const braid_algo_ctx *ctx, p2p_msg *msgs, int nops, int *last_recv)
{
    for (int i = 0; i < nops; i++) {
        p2p_msg *m = &msgs[i];
        const braid_coll *op = m->op;
        m->next = -1;
        if (is_self(ctx->rank, op)) {
            m->state = MSG_DONE;
            continue;
        }
        int peer = op->peer, is_send = op->kind == BRAID_COLL_SEND;
        m->fp = (braid_coll){.kind = op->kind,
                             .count = op->count,
                             .dtype = op->dtype,
                             .root = -1,
                             .peer = peer,
                             .seq = (*ctx->p2p_seq)[2 * peer + (is_send ? 0 : 1)]++};
        if (is_send) {
            braid__fp_encode(&m->fp, m->fp_mine);
            BRAID_CHECK(braid__conn_isend(m->conn, &m->fp_req, m->fp_mine, sizeof(m->fp_mine)));
            if (msg_bytes(op))
                BRAID_CHECK(braid__conn_isend(m->conn, &m->data_req, op->send, msg_bytes(op)));
            m->state = MSG_DATA;
        } else if (last_recv[peer] >= 0) {
            msgs[last_recv[peer]].next = i;
            m->state = MSG_CHAINED;
        } else {
            BRAID_CHECK(post_fp_recv(m));
        }
        if (!is_send)
            last_recv[peer] = i;
    }
    return BRAID_OK;
}

braid_status braid__p2p_run(braid_algo_run *run, const braid_coll *ops, int nops)
{
    const braid_algo_ctx *ctx = run->ctx;
    braid_status st = braid__p2p_check_self(ctx->rank, ops, nops);
    if (st != BRAID_OK)
        return st;
    copy_self(ctx->rank, ops, nops);
    if (nops == 0)
        return BRAID_OK;
    if (!*ctx->p2p_seq) {
        *ctx->p2p_seq = calloc(2 * (size_t)ctx->size, sizeof(**ctx->p2p_seq));
        if (!*ctx->p2p_seq)
            return braid__error(BRAID_ERR_NO_MEMORY, "rank %d: out of memory for message counters", ctx->rank);
    }
    p2p_msg *msgs = calloc((size_t)nops, sizeof(*msgs));
    braid_conn **conns = calloc((size_t)nops, sizeof(*conns));
    int *last_recv = malloc((size_t)ctx->size * sizeof(*last_recv));
    if (!msgs || !conns || !last_recv) {
        st = braid__error(BRAID_ERR_NO_MEMORY, "rank %d: out of memory for %d sends/receives", ctx->rank, nops);
        goto out_free;
    }
    for (int i = 0; i < nops; i++)
        msgs[i].op = &ops[i];
    for (int p = 0; p < ctx->size; p++)
        last_recv[p] = -1;

    int nconns;
    BRAID_CHECK_GOTO(connect_peers(ctx, msgs, nops, conns, &nconns), st, out_free);
    BRAID_CHECK_GOTO(post_all(ctx, msgs, nops, last_recv), st, out_free);

    for (;;) {
        int moved = 0, pending = -1;
        for (int i = 0; i < nops; i++) {
            if (msgs[i].state == MSG_DONE || msgs[i].state == MSG_CHAINED)
                continue;
            BRAID_CHECK_GOTO(progress_msg(run, msgs, i, &moved), st, out_free);
            if (msgs[i].state != MSG_DONE && pending < 0)
                pending = i;
        }
        if (pending < 0) {
            /* A chained receive only starts when the one before it ends,
             * which the loop above has seen: nothing is left. */
            st = BRAID_OK;
            break;
        }
        if (!moved) {
            braid_algo_run sub = msg_run(run, &msgs[pending]);
            BRAID_CHECK_GOTO(braid__algo_wait(&sub, conns, nconns, msgs[pending].op->peer), st, out_free);
        }
    }

out_free:
    /* On failure the transport may still hold requests inside msgs; the
     * dispatcher closes every connection before anything progresses them. */
    free(last_recv);
    free(conns);
    free(msgs);
    return st;
}
