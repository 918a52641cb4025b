/* Pipelined chain reduce: root+1 -> root+2 -> ... -> root-1 -> root, the
 * chain broadcast run backwards with a combine at every hop. The first rank
 * of the chain sends its input; every other rank combines each received
 * chunk with its own input and passes the partial on, chunk by chunk, so
 * all links carry data at once and the time approaches size/bandwidth +
 * (n-1) * chunk latency. The root's combine is the final one (AVG divides
 * there, once) and writes the user's recv buffer; only the root touches
 * recv, which may be NULL elsewhere.
 *
 * Non-root ranks keep partials in staging slots (they have no output
 * buffer); a slot is reused once the send forwarding it has completed.
 * The chain ends at the root, which never waits on a send, so every wait
 * is on a rank nearer the root and the pipeline cannot stall on itself. */
#include <string.h>

#include "algo.h"
#include "reduce/reduce.h"
#include "status.h"

/* Chunks in flight per direction: staging slots, and sends posted ahead
 * of completion (a forwarding rank's sends each hold a slot). */
#define SLOTS 8

braid_status braid__chain_reduce(braid_algo_run *run)
{
    const braid_algo_ctx *ctx = run->ctx;
    const braid_coll *coll = run->coll;
    int n = ctx->size, rank = ctx->rank;
    size_t esize = braid_dtype_size(coll->dtype), count = coll->count;
    const uint8_t *send = coll->send;
    uint8_t *recv = coll->recv;

    if (n == 1) {
        if (count && (const uint8_t *)recv != send)
            memmove(recv, send, count * esize);
        braid__reduce_scale(coll->dtype, coll->op, recv, count, 1);
        return BRAID_OK;
    }

    /* pos 1 starts the chain, pos 0 is the root and ends it. */
    int pos = (rank - coll->root + n) % n;
    int is_root = pos == 0, is_first = pos == 1;
    int next = (rank + 1) % n, prev = (rank + n - 1) % n;
    braid_conn *conns[2] = {NULL, NULL}, *to_next = NULL, *from_prev = NULL;
    int nconns = 0;
    if (!is_root) {
        BRAID_CHECK(braid__ctx_conn(ctx, next, &to_next));
        conns[nconns++] = to_next;
    }
    if (!is_first) {
        BRAID_CHECK(braid__ctx_conn(ctx, prev, &from_prev));
        if (from_prev != to_next)
            conns[nconns++] = from_prev;
    }

    size_t epc = ctx->chunk_bytes / esize ? ctx->chunk_bytes / esize : 1;
    size_t nchunks = (count + epc - 1) / epc;
    size_t slot_bytes = (epc < count ? epc : count) * esize;
    uint8_t *staging = NULL;
    if (!is_first)
        BRAID_CHECK(braid__ctx_scratch(ctx, SLOTS * slot_bytes, (void **)&staging));

    uint8_t fp_mine[BRAID_FP_BYTES], fp_theirs[BRAID_FP_BYTES];
    braid_req fp_send_req, fp_recv_req;
    int fp_sent = is_root, fp_checked = is_first;
    braid__fp_encode(coll, fp_mine);
    if (!is_root)
        BRAID_CHECK(to_next->ops->isend(to_next, &fp_send_req, fp_mine, sizeof(fp_mine)));
    if (!is_first)
        BRAID_CHECK(from_prev->ops->irecv(from_prev, &fp_recv_req, fp_theirs, sizeof(fp_theirs)));

    braid_req recv_reqs[SLOTS], send_reqs[SLOTS];
    /* The first rank "has reduced" its whole input from the start. */
    size_t posted_r = is_first ? nchunks : 0, done_r = posted_r, reduced = posted_r;
    size_t posted_s = 0, done_s = 0, total_s = is_root ? 0 : nchunks;

    for (;;) {
        int moved = 0, done;
        while (posted_s < total_s && posted_s < reduced && posted_s - done_s < SLOTS) {
            size_t off = posted_s * epc, len = count - off < epc ? count - off : epc;
            const uint8_t *src = is_first ? send + off * esize : staging + (posted_s % SLOTS) * slot_bytes;
            BRAID_CHECK(to_next->ops->isend(to_next, &send_reqs[posted_s % SLOTS], src, len * esize));
            posted_s++;
            moved = 1;
        }
        /* A slot is free once its chunk is reduced (root) or forwarded. */
        while (posted_r < nchunks && posted_r - (is_root ? reduced : done_s) < SLOTS) {
            size_t off = posted_r * epc, len = count - off < epc ? count - off : epc;
            uint8_t *slot = staging + (posted_r % SLOTS) * slot_bytes;
            BRAID_CHECK(from_prev->ops->irecv(from_prev, &recv_reqs[posted_r % SLOTS], slot, len * esize));
            posted_r++;
            moved = 1;
        }
        if (!fp_checked) {
            BRAID_CHECK(braid__algo_test(run, &fp_recv_req, &done));
            if (done) {
                BRAID_CHECK(braid__fp_check(run, prev, fp_theirs));
                fp_checked = moved = 1;
            }
        }
        while (fp_checked && done_r < posted_r) {
            BRAID_CHECK(braid__algo_test(run, &recv_reqs[done_r % SLOTS], &done));
            if (!done)
                break;
            done_r++;
            moved = 1;
        }
        while (reduced < done_r) {
            size_t off = reduced * epc, len = count - off < epc ? count - off : epc;
            uint8_t *slot = staging + (reduced % SLOTS) * slot_bytes;
            if (is_root)
                braid__reduce_final(coll->dtype, coll->op, recv + off * esize, send + off * esize, slot, len, n);
            else
                braid__reduce(coll->dtype, coll->op, slot, send + off * esize, slot, len);
            reduced++;
            moved = 1;
        }
        if (!fp_sent) {
            BRAID_CHECK(braid__algo_test(run, &fp_send_req, &fp_sent));
            moved |= fp_sent;
        }
        while (done_s < posted_s) {
            BRAID_CHECK(braid__algo_test(run, &send_reqs[done_s % SLOTS], &done));
            if (!done)
                break;
            done_s++;
            moved = 1;
        }
        if (fp_sent && fp_checked && reduced == nchunks && done_s == total_s)
            return BRAID_OK;
        if (!moved)
            BRAID_CHECK(braid__algo_wait(run, conns, nconns, done_r < nchunks || !fp_checked ? prev : next));
    }
}
