/* The collectives braid-bench measures, one entry per nccl-tests program:
 * its names, how a size becomes element counts, how a time becomes algbw
 * and busbw (each as the program's src/<coll>.cu computes them), and the
 * braid calls that run it. alltoallv and hypercube are grouped sends and
 * receives, as nccl-tests runs them. */
#include <string.h>

#include "bench.h"

/* nccl-tests rounds the per-rank block down to 16 bytes' worth of elements. */
static size_t block_of(size_t count, size_t esize, int nranks)
{
    size_t mask = esize >= 16 ? 0 : 16 / esize - 1;
    return (count / (size_t)nranks) & ~mask;
}

static void counts_whole(size_t count, size_t esize, int nranks, bench_counts *k)
{
    (void)esize;
    (void)nranks;
    *k = (bench_counts){.send = count, .recv = count, .param = count};
}

/* One block sent, n received; in place, the send block is the rank's. */
static void counts_gathering(size_t count, size_t esize, int nranks, bench_counts *k)
{
    size_t b = block_of(count, esize, nranks);
    *k = (bench_counts){.send = b, .recv = b * (size_t)nranks, .param = b, .send_ip = b};
}

/* n blocks sent, one received; in place, the receive block is the rank's. */
static void counts_scattering(size_t count, size_t esize, int nranks, bench_counts *k)
{
    size_t b = block_of(count, esize, nranks);
    *k = (bench_counts){.send = b * (size_t)nranks, .recv = b, .param = b, .recv_ip = b};
}

static void counts_alltoall(size_t count, size_t esize, int nranks, bench_counts *k)
{
    size_t b = block_of(count, esize, nranks);
    *k = (bench_counts){.send = b * (size_t)nranks, .recv = b * (size_t)nranks, .param = b};
}

/* The most any rank sends or receives, for the buffers and the size column. */
static void counts_alltoallv(size_t count, size_t esize, int nranks, bench_counts *k)
{
    size_t b = block_of(count, esize, nranks);
    size_t most_send = 0, most_recv = 0;
    bench_alltoallv_most(b * (size_t)nranks * esize, esize, nranks, &most_send, &most_recv);
    /* With a traffic matrix the sizes are the matrix's: no count per peer. */
    *k = (bench_counts){.send = most_send, .recv = most_recv, .param = bench_alltoallv_from_matrix() ? 0 : b};
}

static const bench_coll_info colls[] = {
    {BENCH_ALLREDUCE, "allreduce", "all_reduce_perf", BENCH_TAKES_OP, counts_whole},
    {BENCH_BROADCAST, "broadcast", "broadcast_perf", BENCH_TAKES_ROOT, counts_whole},
    {BENCH_REDUCE, "reduce", "reduce_perf", BENCH_TAKES_OP | BENCH_TAKES_ROOT, counts_whole},
    {BENCH_ALLGATHER, "allgather", "all_gather_perf", 0, counts_gathering},
    {BENCH_REDUCE_SCATTER, "reduce_scatter", "reduce_scatter_perf", BENCH_TAKES_OP, counts_scattering},
    {BENCH_ALLTOALL, "alltoall", "alltoall_perf", BENCH_IN_PLACE_UNCHECKED, counts_alltoall},
    {BENCH_ALLTOALLV, "alltoallv", "alltoallv_perf", BENCH_IN_PLACE_UNCHECKED, counts_alltoallv},
    {BENCH_SENDRECV, "sendrecv", "sendrecv_perf", BENCH_IN_PLACE_UNCHECKED, counts_whole},
    {BENCH_GATHER, "gather", "gather_perf", BENCH_TAKES_ROOT, counts_gathering},
    {BENCH_SCATTER, "scatter", "scatter_perf", BENCH_TAKES_ROOT, counts_scattering},
    {BENCH_HYPERCUBE, "hypercube", "hypercube_perf", BENCH_POWER_OF_TWO, counts_gathering},
};

#define NCOLLS (sizeof(colls) / sizeof(colls[0]))

const bench_coll_info *bench_coll_get(bench_coll coll)
{
    for (size_t i = 0; i < NCOLLS; i++)
        if (colls[i].id == coll)
            return &colls[i];
    return &colls[0];
}

const bench_coll_info *bench_coll_find(const char *name)
{
    /* Also nccl-tests' program names without _perf, and a few spellings. */
    static const struct {
        const char *alias;
        bench_coll coll;
    } aliases[] = {{"all_reduce", BENCH_ALLREDUCE}, {"bcast", BENCH_BROADCAST},
                   {"all_gather", BENCH_ALLGATHER}, {"reducescatter", BENCH_REDUCE_SCATTER},
                   {"all_to_all", BENCH_ALLTOALL}};
    for (size_t i = 0; i < NCOLLS; i++) {
        size_t n = strlen(colls[i].perf) - strlen("_perf");
        if (strcmp(name, colls[i].name) == 0 || strcmp(name, colls[i].perf) == 0 ||
            (strncmp(name, colls[i].perf, n) == 0 && name[n] == '\0'))
            return &colls[i];
    }
    for (size_t i = 0; i < sizeof(aliases) / sizeof(aliases[0]); i++)
        if (strcmp(name, aliases[i].alias) == 0)
            return bench_coll_get(aliases[i].coll);
    return NULL;
}

const char *bench_coll_names(void)
{
    return "allreduce broadcast reduce allgather reduce_scatter alltoall alltoallv sendrecv gather scatter "
           "hypercube";
}

void bench_coll_bw(bench_coll coll, size_t param, size_t esize, double sec, int nranks, double *algbw,
                   double *busbw)
{
    double n = nranks, bytes = (double)param * (double)esize, ring = (n - 1) / n;
    double alg, bus_factor = 1;
    switch (coll) {
    case BENCH_ALLREDUCE:
        alg = bytes;
        bus_factor = 2 * ring;
        break;
    case BENCH_ALLGATHER:
    case BENCH_REDUCE_SCATTER:
    case BENCH_ALLTOALL:
    case BENCH_GATHER:
    case BENCH_SCATTER:
        alg = bytes * n;
        bus_factor = ring;
        break;
    case BENCH_ALLTOALLV: {
        /* The busiest rank's bytes, as nccl-tests' AlltoAllvGetBw. */
        size_t most_send = 0, most_recv = 0;
        bench_alltoallv_most(param * (size_t)nranks * esize, esize, nranks, &most_send, &most_recv);
        alg = (double)(most_send > most_recv ? most_send : most_recv) * (double)esize;
        bus_factor = ring;
        break;
    }
    case BENCH_HYPERCUBE:
        alg = bytes * (n - 1);
        break;
    default: /* broadcast, reduce, sendrecv */
        alg = bytes;
        break;
    }
    *algbw = sec > 0 ? alg / 1e9 / sec : 0.0;
    *busbw = *algbw * bus_factor;
}

static braid_status p2p(const bench_call *c, const void *send, size_t nsend, int to, void *recv, size_t nrecv,
                        int from)
{
    braid_status st = BRAID_OK;
    if (nsend)
        st = braid_send(c->pg, send, nsend, c->dtype, to, NULL, NULL);
    if (st == BRAID_OK && nrecv)
        st = braid_recv(c->pg, recv, nrecv, c->dtype, from, NULL, NULL);
    return st;
}

/* Close a group opened for one step; on an earlier failure only close it. */
static braid_status group_end(braid_pg *pg, braid_status st, braid_work **work)
{
    braid_status end = braid_group_end(pg, st == BRAID_OK ? work : NULL);
    return st != BRAID_OK ? st : end;
}

static braid_status alltoall_grouped(const bench_call *c, braid_work **work)
{
    size_t block = c->count * braid_dtype_size(c->dtype);
    braid_status st = braid_group_start(c->pg);
    for (int r = 0; r < c->nranks && st == BRAID_OK; r++)
        st = p2p(c, (const char *)c->send + (size_t)r * block, c->count, r, (char *)c->recv + (size_t)r * block,
                 c->count, r);
    return group_end(c->pg, st, work);
}

static braid_status alltoallv(const bench_call *c, braid_work **work)
{
    size_t esize = braid_dtype_size(c->dtype), total = c->count * (size_t)c->nranks * esize;
    const char *send = c->send;
    char *recv = c->recv;
    braid_status st = braid_group_start(c->pg);
    for (int r = 0; r < c->nranks && st == BRAID_OK; r++) {
        size_t ns = bench_alltoallv_bytes(c->rank, r, c->nranks, total) / esize;
        size_t nr = bench_alltoallv_bytes(r, c->rank, c->nranks, total) / esize;
        st = p2p(c, send, ns, r, recv, nr, r);
        send += ns * esize;
        recv += nr * esize;
    }
    return group_end(c->pg, st, work);
}

static braid_status sendrecv(const bench_call *c, braid_work **work)
{
    braid_status st = braid_group_start(c->pg);
    if (st == BRAID_OK)
        st = p2p(c, c->send, c->count, (c->rank + 1) % c->nranks, c->recv, c->count,
                 (c->rank + c->nranks - 1) % c->nranks);
    return group_end(c->pg, st, work);
}

/* nccl-tests' hypercube all-gather: the own block into place, then at step
 * k an exchange of 2^k blocks with the rank that differs in bit k. The
 * copy is a send to itself, so it works on device memory too. Steps run
 * in order (a group's calls do), so only the last step's handle is kept. */
static braid_status hypercube(const bench_call *c, braid_work **work)
{
    size_t block = c->count * braid_dtype_size(c->dtype);
    char *recv = c->recv;
    char *own = recv + (size_t)c->rank * block;
    braid_status st = BRAID_OK;
    if (work)
        *work = NULL; /* one rank in place: nothing to wait for */
    if ((const void *)own != c->send) {
        st = braid_group_start(c->pg);
        if (st == BRAID_OK)
            st = p2p(c, c->send, c->count, c->rank, own, c->count, c->rank);
        st = group_end(c->pg, st, c->nranks == 1 ? work : NULL);
    }
    for (int mask = 1; mask < c->nranks && st == BRAID_OK; mask <<= 1) {
        int from = c->rank & ~(mask - 1), to = from ^ mask, peer = c->rank ^ mask;
        st = braid_group_start(c->pg);
        if (st == BRAID_OK)
            st = p2p(c, recv + (size_t)from * block, c->count * (size_t)mask, peer, recv + (size_t)to * block,
                     c->count * (size_t)mask, peer);
        st = group_end(c->pg, st, mask << 1 >= c->nranks ? work : NULL);
    }
    return st;
}

braid_status bench_coll_issue(const bench_call *c, braid_work **work)
{
    unsigned char s[8]; /* mulsum's scalar: nccl-tests' for this rank */
    int mulsum = c->op == BRAID_MULSUM;
    if (mulsum)
        bench_encode(c->dtype, bench_premul_scalar(c->rank), s);
    switch (c->coll) {
    case BENCH_ALLREDUCE:
        return mulsum ? braid_allreduce_mulsum(c->pg, c->send, c->recv, c->count, c->dtype, s, NULL, work)
                      : braid_allreduce(c->pg, c->send, c->recv, c->count, c->dtype, c->op, NULL, work);
    case BENCH_BROADCAST:
        /* One buffer: the root's send, the others' receive. */
        return braid_broadcast(c->pg, c->rank == c->root ? (void *)c->send : c->recv, c->count, c->dtype, c->root,
                               NULL, work);
    case BENCH_REDUCE:
        return mulsum ? braid_reduce_mulsum(c->pg, c->send, c->recv, c->count, c->dtype, s, c->root, NULL, work)
                      : braid_reduce(c->pg, c->send, c->recv, c->count, c->dtype, c->op, c->root, NULL, work);
    case BENCH_ALLGATHER:
        return braid_allgather(c->pg, c->send, c->recv, c->count, c->dtype, NULL, work);
    case BENCH_REDUCE_SCATTER:
        return mulsum ? braid_reduce_scatter_mulsum(c->pg, c->send, c->recv, c->count, c->dtype, s, NULL, work)
                      : braid_reduce_scatter(c->pg, c->send, c->recv, c->count, c->dtype, c->op, NULL, work);
    case BENCH_ALLTOALL:
        /* braid_alltoall has no in-place form; in place, nccl-tests' own
         * fallback (grouped sends and receives) moves the same bytes. */
        return c->send == (const void *)c->recv ? alltoall_grouped(c, work)
                                                : braid_alltoall(c->pg, c->send, c->recv, c->count, c->dtype, NULL,
                                                                 work);
    case BENCH_ALLTOALLV:
        return alltoallv(c, work);
    case BENCH_SENDRECV:
        return sendrecv(c, work);
    case BENCH_GATHER:
        return braid_gather(c->pg, c->send, c->recv, c->count, c->dtype, c->root, NULL, work);
    case BENCH_SCATTER:
        return braid_scatter(c->pg, c->send, c->recv, c->count, c->dtype, c->root, NULL, work);
    case BENCH_HYPERCUBE:
        return hypercube(c, work);
    }
    return BRAID_ERR_INVALID_ARG;
}
