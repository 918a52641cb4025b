/* Recursive-doubling all-reduce for small messages: log2(n) exchanges of
 * the whole buffer instead of the ring's 2(n-1) latency-bound steps.
 *
 * Non-power-of-two groups first fold: of the first 2*rem ranks (rem = n -
 * largest power of two), each even rank hands its data to the odd rank
 * after it and waits for the result at the end.
 *
 * Every combine puts the lower rank's operand first, so all ranks perform
 * the same operations on the same operands and end with identical bits. */
#include <string.h>

#include "algo.h"
#include "reduce/reduce.h"
#include "status.h"

/* Real rank of a participant of the power-of-two phase. */
static int real_rank(int vrank, int rem)
{
    return vrank < rem ? vrank * 2 + 1 : vrank + rem;
}

braid_status braid__rd_allreduce(braid_algo_run *run)
{
    const braid_algo_ctx *ctx = run->ctx;
    const braid_coll *coll = run->coll;
    int n = ctx->size, rank = ctx->rank;
    size_t esize = braid_dtype_size(coll->dtype), bytes = coll->count * esize;
    uint8_t *buf = coll->recv;
    /* Our operand: the send buffer until the first combine writes buf, so
     * out of place costs no extra copy. */
    const uint8_t *mine = coll->send;

    if (n == 1) {
        if (buf != mine && bytes)
            memmove(buf, mine, bytes);
        braid__reduce_scale(coll->dtype, coll->op, buf, coll->count, 1);
        return BRAID_OK;
    }
    uint8_t *theirs;
    BRAID_CHECK(braid__ctx_scratch(ctx, bytes ? bytes : 1, (void **)&theirs));

    int pof2 = 1;
    while (pof2 * 2 <= n)
        pof2 *= 2;
    int rem = n - pof2, vrank;

    if (rank < 2 * rem) {
        if (rank % 2 == 0) {
            /* Folded out: give our data away, get the result back. */
            BRAID_CHECK(braid__algo_sendrecv(run, rank + 1, mine, bytes, -1, NULL, 0, 1));
            return braid__algo_sendrecv(run, -1, NULL, 0, rank + 1, buf, bytes, 1);
        }
        BRAID_CHECK(braid__algo_sendrecv(run, -1, NULL, 0, rank - 1, theirs, bytes, 1));
        braid__reduce(coll->dtype, coll->op, buf, theirs, mine, coll->count);
        mine = buf;
        vrank = rank / 2;
    } else {
        vrank = rank - rem;
    }

    for (int mask = 1; mask < pof2; mask <<= 1) {
        int partner = real_rank(vrank ^ mask, rem);
        /* Fingerprints travel on every link exactly once: the fold links
         * above, and the first exchange here. */
        BRAID_CHECK(braid__algo_sendrecv(run, partner, mine, bytes, partner, theirs, bytes, mask == 1));
        const void *lo = partner < rank ? theirs : mine, *hi = partner < rank ? mine : theirs;
        if (mask * 2 == pof2)
            braid__reduce_final(coll->dtype, coll->op, buf, lo, hi, coll->count, n);
        else
            braid__reduce(coll->dtype, coll->op, buf, lo, hi, coll->count);
        mine = buf;
    }

    if (rank < 2 * rem) /* odd: hand the result back to the folded rank */
        BRAID_CHECK(braid__algo_sendrecv(run, rank - 1, buf, bytes, -1, NULL, 0, 1));
    return BRAID_OK;
}
