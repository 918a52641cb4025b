/* Tuner and dispatch: picks an algorithm per call, runs it, and turns a
 * failure into a broken group so that every rank fails fast; and the cost
 * model the tuner's choices rest on (braid__estimate_us), per kind of
 * call, so that a new kind's schedule and cost are written in one place. */
#include <stdlib.h>

#include "algo.h"
#include "log.h"
#include "status.h"

/* Recursive doubling against the ring (docs/COLLECTIVES.md, "Choosing an
 * all-reduce algorithm"). With a per-message latency a, a per-byte
 * transfer cost b and a per-byte combine cost taken equal to b, on n ranks
 * and B bytes:
 *   recursive doubling: R rounds of (a + 2bB), R = log2(n), plus 2 for the
 *                       fold when n is not a power of two;
 *   ring:               2(n-1) a + 3 (n-1)/n b B  (two transfers and one
 *                       combine of each element's (n-1)/n share).
 * Recursive doubling wins up to B* = (a/b) (2(n-1) - R) / (2R - 3(n-1)/n).
 * RD_LATENCY_BYTES is a/b, set so that n = 4 keeps the 64 KiB crossover
 * measured on loopback before; RD_MAX_CAP bounds B* for large groups,
 * where recursive doubling's unpipelined full-buffer rounds stop paying. */
#define RD_LATENCY_BYTES (28 * 1024)
#define RD_MAX_CAP BRAID_RD_MAX_CAP /* src/calls/pg_algo.c checks it against the device staging piece */

/* Smallest message for which the tuner takes the hierarchical all-reduce
 * on a multi-host group (above recursive doubling's range in any case):
 * below it the three phases' extra latency steps outweigh what sharing the
 * inter-host links saves. Measured with two namespaces of two ranks
 * (docs/COLLECTIVES.md): hier is level with recursive doubling at 64-128
 * KiB and ahead from 256 KiB, and ahead of the flat ring at every size. */
#define HIER_MIN_BYTES (64 * 1024)

/* Largest broadcast sent whole down a binomial tree (log2(n) hops) rather
 * than pipelined along the chain (n-1 hops, each a chunk): below it the
 * hop count, not the bandwidth, sets the time. */
#define TREE_BCAST_MAX_BYTES (64 * 1024)

/* algo_logged bits above the all-reduce algorithms': the broadcast's. */
#define LOGGED_BCAST_TREE (1u << 16)
#define LOGGED_BCAST_CHAIN (1u << 17)
_Static_assert(BRAID_ALGO_COUNT <= 16, "the all-reduce algorithms' bits stay below the broadcast's");

/* Logs each broadcast algorithm's first use in the group at INFO. */
static void log_broadcast(const braid_algo_ctx *ctx, unsigned bit, const char *name, size_t bytes)
{
    if (*ctx->algo_logged & bit)
        return;
    *ctx->algo_logged |= bit;
    BRAID_INFO("rank %d: broadcast algorithm %s (first used for %zu bytes, %d ranks)", ctx->rank, name, bytes,
               ctx->size);
}

/* Small broadcasts to more than two ranks go down a tree, the rest along a
 * pipelined chain. */
static int tree_broadcast(int size, const braid_coll *c)
{
    return size > 2 && c->count * braid_dtype_size(c->dtype) <= TREE_BCAST_MAX_BYTES;
}

static braid_status run_broadcast(const braid_algo_ctx *ctx, braid_algo_run *run)
{
    size_t bytes = run->coll->count * braid_dtype_size(run->coll->dtype);
    if (tree_broadcast(ctx->size, run->coll)) {
        log_broadcast(ctx, LOGGED_BCAST_TREE, "tree", bytes);
        return braid__tree_broadcast(run);
    }
    log_broadcast(ctx, LOGGED_BCAST_CHAIN, "pipelined chain", bytes);
    return braid__chain_broadcast(run);
}

size_t braid__rd_max_bytes(int n)
{
    if (n < 2)
        return 0;
    int rounds = 0;
    while ((2 << rounds) <= n)
        rounds++;
    if (n & (n - 1))
        rounds += 2;
    double num = 2.0 * (n - 1) - rounds, den = 2.0 * rounds - 3.0 * (n - 1) / n;
    if (num <= 0)
        return 0;
    double b = den <= 0 ? RD_MAX_CAP : RD_LATENCY_BYTES * num / den;
    return b >= RD_MAX_CAP ? RD_MAX_CAP : (size_t)b;
}

/* Several hosts and more than one rank on one of them: otherwise the
 * hierarchical all-reduce is the flat ring with extra steps. */
static int hier_fits(const braid_hier_topo *t)
{
    return t && t->nhosts > 1 && t->max_local > 1;
}

braid_algo braid__allreduce_algo(const braid_algo_ctx *ctx, size_t count, braid_dtype dtype)
{
    size_t bytes = count * braid_dtype_size(dtype);
    if (ctx->algo == BRAID_ALGO_HIER)
        return hier_fits(braid__hier_topo(ctx)) ? BRAID_ALGO_HIER : BRAID_ALGO_RING;
    if (ctx->algo != BRAID_ALGO_AUTO)
        return ctx->algo;
    if (bytes <= braid__rd_max_bytes(ctx->size))
        return BRAID_ALGO_RECURSIVE_DOUBLING;
    if (bytes >= HIER_MIN_BYTES && hier_fits(braid__hier_topo(ctx)))
        return BRAID_ALGO_HIER;
    return BRAID_ALGO_RING;
}

static const char *algo_name(braid_algo a)
{
    switch (a) {
    case BRAID_ALGO_RING: return "ring";
    case BRAID_ALGO_RECURSIVE_DOUBLING: return "rd";
    case BRAID_ALGO_HIER: return "hier";
    default: return "?";
    }
}

const char *braid__coll_algo_name(const braid_coll *c, int size)
{
    if (c->hmem)
        return "staged"; /* device buffers: host pieces through pinned memory, or the device ring */
    switch (c->kind) {
    case BRAID_COLL_ALLREDUCE: return c->algo == BRAID_ALGO_AUTO ? "-" : algo_name(c->algo);
    case BRAID_COLL_BROADCAST: return tree_broadcast(size, c) ? "tree" : "chain";
    case BRAID_COLL_REDUCE: return "chain";
    case BRAID_COLL_ALLGATHER:
    case BRAID_COLL_REDUCE_SCATTER: return "ring";
    case BRAID_COLL_SEND:
    case BRAID_COLL_RECV: return "p2p";
    default: return "group";
    }
}

/* Logs each algorithm's first use in the group at INFO, with the topology
 * for the hierarchical one, and a forced one that the topology overrides. */
static void log_choice(const braid_algo_ctx *ctx, const braid_coll *coll, braid_algo algo)
{
    if (*ctx->algo_logged & (1u << algo))
        return;
    *ctx->algo_logged |= 1u << algo;
    size_t bytes = coll->count * braid_dtype_size(coll->dtype);
    const braid_hier_topo *t = braid__hier_topo(ctx);
    if (ctx->algo == BRAID_ALGO_HIER && algo != BRAID_ALGO_HIER)
        BRAID_WARN("rank %d: BRAID_ALGO=hier needs several hosts and more than one rank on one of them; this "
                   "group has %d host(s) and at most %d rank(s) per host: using %s",
                   ctx->rank, t ? t->nhosts : 1, t ? t->max_local : ctx->size, algo_name(algo));
    if (algo == BRAID_ALGO_HIER)
        BRAID_INFO("rank %d: allreduce algorithm hier (first used for %zu bytes): %d hosts, %d-%d ranks per "
                   "host, local position %d of %d",
                   ctx->rank, bytes, t->nhosts, t->min_local, t->max_local, t->local_index, t->nlocal);
    else
        BRAID_INFO("rank %d: allreduce algorithm %s (first used for %zu bytes, %d ranks)", ctx->rank, algo_name(algo),
                   bytes, ctx->size);
}

static braid_status run_algo(const braid_algo_ctx *ctx, braid_coll *coll, braid_algo_run *run)
{
    switch (coll->kind) {
    case BRAID_COLL_BROADCAST: return run_broadcast(ctx, run);
    case BRAID_COLL_REDUCE: return braid__chain_reduce(run);
    case BRAID_COLL_ALLGATHER: return braid__ring_allgather(run);
    case BRAID_COLL_REDUCE_SCATTER: return braid__ring_reduce_scatter(run);
    case BRAID_COLL_SEND:
    case BRAID_COLL_RECV: return braid__p2p_run(run, coll, 1);
    case BRAID_COLL_ALLREDUCE:
        coll->algo = braid__allreduce_algo(ctx, coll->count, coll->dtype);
        log_choice(ctx, coll, coll->algo);
        switch (coll->algo) {
        case BRAID_ALGO_RECURSIVE_DOUBLING: return braid__rd_allreduce(run);
        case BRAID_ALGO_HIER: return braid__hier_allreduce(run);
        default: return braid__ring_allreduce(run);
        }
    case BRAID_COLL_GROUP:
    case BRAID_COLL_ALLTOALL: /* run as groups; a refusal never gets here */
    case BRAID_COLL_GATHER:
    case BRAID_COLL_SCATTER: break;
    }
    return braid__error(BRAID_ERR_INTERNAL, "rank %d: job of unknown kind %d", ctx->rank, (int)coll->kind);
}

static braid_status run_one(const braid_algo_ctx *ctx, braid_coll *coll)
{
    void *scratch = NULL;
    if (ctx->prepare)
        BRAID_CHECK(ctx->prepare(ctx->owner, coll, &scratch));
    braid_algo_run run;
    braid__algo_run_init(&run, ctx, coll);
    braid_status st = braid__fp_explain(&run, run_algo(ctx, coll, &run));
    free(scratch);
    return st;
}

/* A group runs in issue order; each run of consecutive sends and receives
 * progresses as one batch, so exchanges with several peers cannot wait on
 * each other. Its collectives take the job's sequence numbers in order. */
static braid_status run_group(const braid_algo_ctx *ctx, braid_coll *group)
{
    uint64_t seq = group->seq;
    for (int i = 0; i < group->nops;) {
        braid_coll *op = &group->ops[i];
        if (!braid__kind(op->kind)->p2p) {
            op->seq = seq++;
            BRAID_CHECK(run_one(ctx, op));
            i++;
            continue;
        }
        int n = 1;
        while (i + n < group->nops && braid__kind(group->ops[i + n].kind)->p2p)
            n++;
        braid_algo_run run;
        braid__algo_run_init(&run, ctx, op);
        BRAID_CHECK(braid__p2p_run(&run, op, n));
        i += n;
    }
    return BRAID_OK;
}

braid_status braid__algo_coll_run(const braid_algo_ctx *ctx, braid_coll *coll)
{
    return coll->kind == BRAID_COLL_GROUP ? run_group(ctx, coll) : run_one(ctx, coll);
}

/* ---- cost model ---------------------------------------------------------- */

/* Time estimates from the tuner's cost model (dispatch.c): a message costs
 * a latency a plus b per byte, and each algorithm is counted in those
 * steps. ncclGroupSimulateEnd reports these. The constants are this
 * machine class's loopback numbers (docs/PERFORMANCE.md): a 4 KiB
 * all-reduce on two ranks takes 9-10 us, and large messages move at about
 * 3 GB/s per link; combining costs about as much per byte as moving. */
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
