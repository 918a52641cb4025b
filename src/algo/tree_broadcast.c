/* Binomial-tree broadcast for small messages: ceil(log2(n)) hops from the
 * root to the farthest rank instead of the chain's n-1. Positions count
 * from the root; position v receives the whole message from v minus its
 * lowest set bit, then forwards it to v + 2^k for every 2^k below that bit,
 * farthest subtree first. */
#include "algo.h"
#include "status.h"

braid_status braid__tree_broadcast(braid_algo_run *run)
{
    const braid_algo_ctx *ctx = run->ctx;
    const braid_coll *coll = run->coll;
    int n = ctx->size, root = coll->root;
    int pos = (ctx->rank - root + n) % n;
    size_t bytes = coll->count * braid_dtype_size(coll->dtype);
    uint8_t *buf = coll->recv;

    int mask = 1;
    while (mask < n) {
        if (pos & mask) {
            int parent = (pos - mask + root) % n;
            /* Each link carries the call's fingerprint once, here and in
             * the sends below. */
            BRAID_CHECK(braid__algo_sendrecv(run, -1, NULL, 0, parent, buf, bytes, 1));
            break;
        }
        mask <<= 1;
    }
    for (mask >>= 1; mask > 0; mask >>= 1)
        if (pos + mask < n)
            BRAID_CHECK(braid__algo_sendrecv(run, (pos + mask + root) % n, buf, bytes, -1, NULL, 0, 1));
    return BRAID_OK;
}
