/* Time estimates from the tuner's cost model (dispatch.c): a message costs
 * a latency a plus b per byte, and each algorithm is counted in those
 * steps. ncclGroupSimulateEnd reports these. The constants are this
 * machine class's loopback numbers (docs/PERFORMANCE.md): a 4 KiB
 * all-reduce on two ranks takes 9-10 us, and large messages move at about
 * 3 GB/s per link; combining costs about as much per byte as moving. */
#include "algo.h"

#define EST_LATENCY_US 10.0
#define EST_US_PER_BYTE (1.0 / 3000.0) /* 3 GB/s = 3000 bytes per microsecond */

static int log2_ceil(int n)
{
    int r = 0;
    while ((1 << r) < n)
        r++;
    return r;
}

double braid__estimate_us(const braid_pg *pg, braid_coll_kind kind, size_t bytes)
{
    int n = braid_pg_size(pg);
    double a = EST_LATENCY_US, b = EST_US_PER_BYTE, B = (double)bytes, steps = n - 1;
    if (n < 2)
        return braid__kind(kind)->p2p ? a + b * B : b * B; /* a local copy at most */
    switch (kind) {
    case BRAID_COLL_ALLREDUCE:
        if (bytes <= braid__rd_max_bytes(n)) {
            int rounds = log2_ceil(n) + ((n & (n - 1)) ? 2 : 0);
            return rounds * (a + 2 * b * B);
        }
        return 2 * steps * a + 3 * steps / n * b * B;
    case BRAID_COLL_BROADCAST:
        if (n > 2 && bytes <= 64 * 1024)
            return log2_ceil(n) * (a + b * B); /* binomial tree */
        return steps * a + b * B;              /* pipelined chain */
    case BRAID_COLL_REDUCE:
        return steps * a + 2 * b * B; /* pipelined chain, move and combine */
    case BRAID_COLL_ALLGATHER:     /* B: one rank's block */
        return steps * (a + b * B);
    case BRAID_COLL_REDUCE_SCATTER: /* B: one rank's block */
        return steps * (a + 2 * b * B);
    case BRAID_COLL_ALLTOALL: /* B: one block; all links busy at once */
        return a + steps * b * B;
    case BRAID_COLL_GATHER:
    case BRAID_COLL_SCATTER: /* the root's link carries n-1 blocks */
        return a + steps * b * B;
    case BRAID_COLL_SEND:
    case BRAID_COLL_RECV:
        return a + b * B;
    case BRAID_COLL_GROUP:
        break; /* its calls are estimated one by one */
    }
    return 0;
}
