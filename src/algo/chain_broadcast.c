/* Pipelined chain broadcast: root -> root+1 -> ... -> root-1. Every rank
 * but the root receives each chunk straight into the user's buffer and
 * forwards it as soon as it lands, so all links carry data at once and the
 * time approaches size/bandwidth + (n-1) * chunk latency. */
#include "algo.h"
#include "status.h"

#define WINDOW 8 /* chunks posted ahead in each direction */

braid_status braid__chain_broadcast(braid_algo_run *run)
{
    const braid_algo_ctx *ctx = run->ctx;
    const braid_coll *coll = run->coll;
    int n = ctx->size, rank = ctx->rank;
    if (n == 1)
        return BRAID_OK;

    int pos = (rank - coll->root + n) % n; /* distance from the root along the chain */
    int next = (rank + 1) % n, prev = (rank + n - 1) % n;
    int has_prev = pos > 0, has_next = pos < n - 1;
    braid_conn *conns[2] = {NULL, NULL}, *to_next = NULL, *from_prev = NULL;
    int nconns = 0;
    if (has_next) {
        BRAID_CHECK(braid__ctx_conn(ctx, next, &to_next));
        conns[nconns++] = to_next;
    }
    if (has_prev) {
        BRAID_CHECK(braid__ctx_conn(ctx, prev, &from_prev));
        if (from_prev != to_next)
            conns[nconns++] = from_prev;
    }

    size_t bytes = coll->count * braid_dtype_size(coll->dtype);
    size_t chunk = ctx->chunk_bytes ? ctx->chunk_bytes : bytes;
    size_t nchunks = bytes ? (bytes + chunk - 1) / chunk : 0;
    uint8_t *buf = coll->recv;

    uint8_t fp_mine[BRAID_FP_BYTES];
    braid_req fp_send_req;
    int fp_sent = !has_next, fp_checked = !has_prev;
    braid__fp_encode(coll, fp_mine);
    if (has_next)
        BRAID_CHECK(to_next->ops->isend(to_next, &fp_send_req, fp_mine, sizeof(fp_mine)));
    if (has_prev)
        BRAID_CHECK(braid__fp_recv(run, from_prev, prev));

    braid_req recv_reqs[WINDOW], send_reqs[WINDOW];
    /* The root "has received" everything from the start. */
    size_t posted_r = has_prev ? 0 : nchunks, done_r = posted_r, posted_s = 0, done_s = 0;
    size_t total_r = nchunks, total_s = has_next ? nchunks : 0;

    for (;;) {
        int moved = 0, done;
        while (posted_s < total_s && posted_s < done_r && posted_s - done_s < WINDOW) {
            size_t off = posted_s * chunk, len = bytes - off < chunk ? bytes - off : chunk;
            BRAID_CHECK(to_next->ops->isend(to_next, &send_reqs[posted_s % WINDOW], buf + off, len));
            posted_s++;
            moved = 1;
        }
        while (posted_r < total_r && posted_r - done_r < WINDOW) {
            size_t off = posted_r * chunk, len = bytes - off < chunk ? bytes - off : chunk;
            BRAID_CHECK(from_prev->ops->irecv(from_prev, &recv_reqs[posted_r % WINDOW], buf + off, len));
            posted_r++;
            moved = 1;
        }
        if (!fp_checked) {
            BRAID_CHECK(braid__fp_poll(run, &fp_checked));
            moved |= fp_checked;
        }
        while (fp_checked && done_r < posted_r) {
            BRAID_CHECK(braid__algo_test(run, &recv_reqs[done_r % WINDOW], &done));
            if (!done)
                break;
            done_r++;
            moved = 1;
        }
        if (!fp_sent) {
            BRAID_CHECK(braid__algo_test(run, &fp_send_req, &fp_sent));
            moved |= fp_sent;
        }
        while (done_s < posted_s) {
            BRAID_CHECK(braid__algo_test(run, &send_reqs[done_s % WINDOW], &done));
            if (!done)
                break;
            done_s++;
            moved = 1;
        }
        if (fp_sent && fp_checked && done_r == total_r && done_s == total_s)
            return BRAID_OK;
        if (!moved) {
            braid_status st = braid__algo_wait(run, conns, nconns, done_r < total_r || !fp_checked ? prev : next);
            if (st != BRAID_OK)
                return st;
        }
    }
}
