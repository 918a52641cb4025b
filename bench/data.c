/* Where each collective's checked data goes (-c): which pattern fills
 * which part of a rank's buffers before the call, and what each part must
 * hold after it. The values come from verify.c; the layouts are nccl-tests'
 * (src/<coll>.cu InitData), in place included: the send data then sits in
 * the receive buffer, at the rank's block where the call has one. */
#include "bench.h"

static void *at(void *buf, size_t elems, size_t esize)
{
    return (char *)buf + elems * esize;
}

static const void *cat(const void *buf, size_t elems, size_t esize)
{
    return (const char *)buf + elems * esize;
}

/* The buffer the call reads from: in place, the receive buffer, at the
 * rank's block for the calls that send one block. */
static void *input_of(const bench_layout *l, void *send, void *recv, size_t esize)
{
    return l->in_place ? at(recv, l->k.send_ip * (size_t)l->rank, esize) : send;
}

/* Where the call leaves this rank's result. */
static const void *output_of(const bench_layout *l, const void *recv, size_t esize)
{
    return cat(recv, l->in_place ? l->k.recv_ip * (size_t)l->rank : 0, esize);
}

void bench_data_fill(const bench_layout *l, const bench_pattern *pat, void *send, void *recv)
{
    size_t es = braid_dtype_size(l->dtype), n = (size_t)l->nranks, b = l->k.param;
    void *in = input_of(l, send, recv, es);
    /* Junk first where the result goes, so a call that writes nothing
     * fails; then the input, which in place overlays its block. */
    switch (l->coll) {
    case BENCH_ALLREDUCE:
    case BENCH_REDUCE:
    case BENCH_REDUCE_SCATTER:
        if (!l->in_place)
            bench_pattern_fill_junk(pat, recv, (size_t)l->rank * l->k.recv_ip, l->k.recv);
        bench_pattern_fill_input(pat, in, 0, l->k.send);
        break;
    case BENCH_BROADCAST:
        /* One buffer: the root's send buffer out of place, else recv. */
        if (l->rank == l->root)
            bench_pattern_fill_source(pat, l->root, l->in_place ? recv : send, 0, b);
        else
            bench_pattern_fill_junk(pat, recv, 0, b);
        break;
    case BENCH_ALLGATHER:
    case BENCH_GATHER:
    case BENCH_HYPERCUBE:
        bench_pattern_fill_junk(pat, recv, 0, l->k.recv);
        bench_pattern_fill_source(pat, l->rank, in, 0, b);
        break;
    case BENCH_SCATTER:
        bench_pattern_fill_junk(pat, (void *)output_of(l, recv, es), 0, b);
        if (l->rank == l->root)
            bench_pattern_fill_source(pat, l->root, l->in_place ? recv : send, 0, b * n);
        break;
    case BENCH_ALLTOALL:
    case BENCH_ALLTOALLV:
    case BENCH_SENDRECV:
        if (!l->in_place)
            bench_pattern_fill_junk(pat, recv, 0, l->k.recv);
        bench_pattern_fill_source(pat, l->rank, in, 0, l->k.send);
        break;
    }
}

/* alltoallv: what rank r receives from each rank, laid end to end. */
static long long check_alltoallv(const bench_layout *l, const bench_pattern *pat, const void *recv, size_t es)
{
    size_t total = l->k.param * (size_t)l->nranks * es, got = 0;
    long long wrong = 0;
    for (int s = 0; s < l->nranks; s++) {
        size_t from = 0; /* where rank s's part for this rank starts in its send data */
        for (int k = 0; k < l->rank; k++)
            from += bench_alltoallv_bytes(s, k, l->nranks, total) / es;
        size_t n = bench_alltoallv_bytes(s, l->rank, l->nranks, total) / es;
        wrong += bench_pattern_check_source(pat, s, cat(recv, got, es), from, n);
        got += n;
    }
    return wrong;
}

long long bench_data_check(const bench_layout *l, const bench_pattern *pat, const void *send, const void *recv)
{
    size_t es = braid_dtype_size(l->dtype), b = l->k.param;
    const void *out = output_of(l, recv, es);
    long long wrong = 0;
    if (l->coll == BENCH_GATHER && l->rank != l->root)
        return 0; /* recv is only used on the root */
    switch (l->coll) {
    case BENCH_ALLREDUCE:
    case BENCH_REDUCE_SCATTER:
        return bench_pattern_check(pat, out, (size_t)l->rank * l->k.recv_ip, l->k.recv);
    case BENCH_REDUCE:
        /* recv is only written on the root. */
        return l->rank == l->root ? bench_pattern_check(pat, out, 0, b) : 0;
    case BENCH_BROADCAST:
        return bench_pattern_check_source(pat, l->root, l->rank == l->root && !l->in_place ? send : recv, 0, b);
    case BENCH_GATHER: /* the root holds what an all-gather leaves */
    case BENCH_ALLGATHER:
    case BENCH_HYPERCUBE:
        for (int p = 0; p < l->nranks; p++)
            wrong += bench_pattern_check_source(pat, p, cat(recv, (size_t)p * b, es), 0, b);
        return wrong;
    case BENCH_SCATTER:
        return bench_pattern_check_source(pat, l->root, out, (size_t)l->rank * b, b);
    case BENCH_ALLTOALL:
    case BENCH_ALLTOALLV:
    case BENCH_SENDRECV:
        break;
    }
    /* In place these run unchecked, as in nccl-tests: the data they read
     * is overwritten while they run. */
    if (l->in_place)
        return -1;
    if (l->coll == BENCH_SENDRECV)
        return bench_pattern_check_source(pat, (l->rank + l->nranks - 1) % l->nranks, recv, 0, b);
    if (l->coll == BENCH_ALLTOALLV)
        return check_alltoallv(l, pat, recv, es);
    for (int s = 0; s < l->nranks; s++)
        wrong += bench_pattern_check_source(pat, s, cat(recv, (size_t)s * b, es), (size_t)l->rank * b, b);
    return wrong;
}
