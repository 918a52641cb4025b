/* Reduce, all-gather, reduce-scatter, send/receive and groups on 1..8
 * loopback ranks, checked bit-exact against a serial reference. Inputs are
 * small integers, exact in every dtype, so the reference does not depend on
 * the reduction order (same scheme as test_collectives.c). A 4 KiB chunk
 * size makes even mid-sized counts span more chunks than the algorithms
 * keep in flight, so the pipelines' flow control is exercised too. */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"

static const braid_dtype all_dtypes[] = {BRAID_F32, BRAID_F64, BRAID_F16, BRAID_BF16,
                                         BRAID_I8,  BRAID_U8,  BRAID_I32, BRAID_I64};
static const braid_op all_ops[] = {BRAID_SUM, BRAID_PROD, BRAID_MIN, BRAID_MAX, BRAID_AVG};
static const size_t counts[] = {0, 1, 3, 7, 1000, 4099};
#define NELEM(a) (sizeof(a) / sizeof((a)[0]))

static void *alloc_or_die(size_t bytes)
{
    void *p = malloc(bytes ? bytes : 1);
    if (!p) {
        fprintf(stderr, "out of memory (%zu bytes)\n", bytes);
        exit(3);
    }
    return p;
}

/* ---- one case per collective ----------------------------------------- */

static int check_reduce(braid_pg *pg, braid_dtype t, braid_op op, size_t count, int root, int in_place, uint32_t seed)
{
    int rank = braid_pg_rank(pg), n = braid_pg_size(pg);
    size_t es = braid_dtype_size(t);
    unsigned char *send = alloc_or_die(count * es), *recv = alloc_or_die(count * es + 1), want[8];
    for (size_t i = 0; i < count; i++)
        harness_store(t, send, i, harness_input(rank, i, seed, t, op));
    memset(recv, 0xA5, count * es + 1);
    /* Non-roots pass NULL for recv, as NCCL allows. */
    void *out = rank == root ? (in_place ? send : recv) : NULL;
    if (braid_reduce(pg, send, out, count, t, op, root, NULL, NULL) != BRAID_OK)
        HARNESS_FAIL("rank %d: reduce(count=%zu dtype=%d op=%d root=%d) failed: %s", rank, count, t, op, root,
                     braid_last_error());
    if (rank == root) {
        if (!in_place && recv[count * es] != 0xA5)
            HARNESS_FAIL("rank %d: reduce wrote past the end of recv", rank);
        for (size_t i = 0; i < count; i++) {
            harness_expected(t, op, n, i, seed, want);
            if (memcmp((unsigned char *)out + i * es, want, es) != 0)
                HARNESS_FAIL("rank %d of %d: reduce dtype=%d op=%d count=%zu root=%d %s: element %zu is %g, want %g",
                             rank, n, t, op, count, root, in_place ? "in-place" : "out-of-place", i,
                             harness_load(t, out, i), harness_load(t, want, 0));
        }
    } else {
        for (size_t i = 0; i < count; i++)
            if (harness_load(t, send, i) != harness_input(rank, i, seed, t, op))
                HARNESS_FAIL("rank %d: reduce modified the send buffer of a non-root", rank);
    }
    free(send);
    free(recv);
    return 0;
}

static int check_reduce_scatter(braid_pg *pg, braid_dtype t, braid_op op, size_t count, int in_place, uint32_t seed)
{
    int rank = braid_pg_rank(pg), n = braid_pg_size(pg);
    size_t es = braid_dtype_size(t), total = count * (size_t)n;
    unsigned char *send = alloc_or_die(total * es), *recv = alloc_or_die(count * es + 1), want[8];
    for (size_t i = 0; i < total; i++)
        harness_store(t, send, i, harness_input(rank, i, seed, t, op));
    memset(recv, 0xA5, count * es + 1);
    unsigned char *out = in_place ? send + (size_t)rank * count * es : recv;
    if (braid_reduce_scatter(pg, send, out, count, t, op, NULL, NULL) != BRAID_OK)
        HARNESS_FAIL("rank %d: reduce_scatter(count=%zu dtype=%d op=%d) failed: %s", rank, count, t, op,
                     braid_last_error());
    if (!in_place && recv[count * es] != 0xA5)
        HARNESS_FAIL("rank %d: reduce_scatter wrote past the end of recv", rank);
    for (size_t j = 0; j < count; j++) {
        harness_expected(t, op, n, (size_t)rank * count + j, seed, want);
        if (memcmp(out + j * es, want, es) != 0)
            HARNESS_FAIL("rank %d of %d: reduce_scatter dtype=%d op=%d count=%zu %s: element %zu is %g, want %g", rank,
                         n, t, op, count, in_place ? "in-place" : "out-of-place", j, harness_load(t, out, j),
                         harness_load(t, want, 0));
    }
    /* Out of place, the input is untouched; in place, only block rank changes. */
    for (size_t i = 0; i < total; i++) {
        if (in_place && i / (count ? count : 1) == (size_t)rank)
            continue;
        if (harness_load(t, send, i) != harness_input(rank, i, seed, t, op))
            HARNESS_FAIL("rank %d: reduce_scatter modified send element %zu outside its own block", rank, i);
    }
    free(send);
    free(recv);
    return 0;
}

/* All-gather moves bytes; the value pattern names its source rank. */
static int check_allgather(braid_pg *pg, braid_dtype t, size_t count, int in_place, uint32_t seed)
{
    int rank = braid_pg_rank(pg), n = braid_pg_size(pg);
    size_t es = braid_dtype_size(t), total = count * (size_t)n;
    unsigned char *mine = alloc_or_die(count * es), *recv = alloc_or_die(total * es + 1);
    memset(recv, 0xA5, total * es + 1);
    unsigned char *send = in_place ? recv + (size_t)rank * count * es : mine;
    for (size_t i = 0; i < count; i++)
        harness_store(t, send, i, harness_input(rank, i, seed, t, BRAID_SUM));
    if (braid_allgather(pg, send, recv, count, t, NULL, NULL) != BRAID_OK)
        HARNESS_FAIL("rank %d: allgather(count=%zu dtype=%d) failed: %s", rank, count, t, braid_last_error());
    if (recv[total * es] != 0xA5)
        HARNESS_FAIL("rank %d: allgather wrote past the end of recv", rank);
    for (int r = 0; r < n; r++)
        for (size_t i = 0; i < count; i++)
            if (harness_load(t, recv, (size_t)r * count + i) != harness_input(r, i, seed, t, BRAID_SUM))
                HARNESS_FAIL("rank %d of %d: allgather dtype=%d count=%zu %s: block %d element %zu is %g, want %g",
                             rank, n, t, count, in_place ? "in-place" : "out-of-place", r, i,
                             harness_load(t, recv, (size_t)r * count + i), harness_input(r, i, seed, t, BRAID_SUM));
    free(mine);
    free(recv);
    return 0;
}

static int matrix_body(braid_pg *pg, void *arg)
{
    (void)arg;
    int n = braid_pg_size(pg);
    uint32_t seed = 1;
    for (size_t d = 0; d < NELEM(all_dtypes); d++) {
        for (size_t o = 0; o < NELEM(all_ops); o++)
            for (size_t c = 0; c < NELEM(counts); c++) {
                int in_place = (int)((c + o) % 2);
                if (check_reduce(pg, all_dtypes[d], all_ops[o], counts[c], (int)((c + d) % (size_t)n), in_place,
                                 seed++))
                    return 1;
                if (check_reduce_scatter(pg, all_dtypes[d], all_ops[o], counts[c], in_place, seed++))
                    return 1;
            }
        for (size_t c = 0; c < NELEM(counts); c++)
            if (check_allgather(pg, all_dtypes[d], counts[c], (int)(c % 2), seed++))
                return 1;
    }
    return 0;
}

/* Every root, and sizes well past the staging (many chunks per block). */
static int large_body(braid_pg *pg, void *arg)
{
    (void)arg;
    int n = braid_pg_size(pg);
    for (int root = 0; root < n; root++)
        if (check_reduce(pg, BRAID_F32, BRAID_SUM, 100003, root, root % 2, 10 + (uint32_t)root))
            return 1;
    if (check_reduce(pg, BRAID_BF16, BRAID_AVG, (1u << 20) + 5, n - 1, 0, 40))
        return 1;
    if (check_reduce_scatter(pg, BRAID_F32, BRAID_SUM, (1u << 18) + 3, 0, 41))
        return 1;
    if (check_reduce_scatter(pg, BRAID_I32, BRAID_MAX, (1u << 18) + 1, 1, 42))
        return 1;
    if (check_reduce_scatter(pg, BRAID_F16, BRAID_AVG, 99991, 1, 43))
        return 1;
    if (check_allgather(pg, BRAID_F64, (1u << 17) + 7, 0, 44))
        return 1;
    return check_allgather(pg, BRAID_U8, (1u << 20) + 1, 1, 45);
}

/* ---- point-to-point and groups ------------------------------------- */

static double msg_value(int from, int to, int k, size_t i)
{
    return (double)harness_value(from * 64 + to, i, 1000 + (uint32_t)k, -100, 100);
}

static void fill_msg(int32_t *buf, size_t count, int from, int to, int k)
{
    for (size_t i = 0; i < count; i++)
        buf[i] = (int32_t)msg_value(from, to, k, i);
}

static int check_msg(const int32_t *buf, size_t count, int from, int to, int k, const char *what)
{
    for (size_t i = 0; i < count; i++)
        if (buf[i] != (int32_t)msg_value(from, to, k, i))
            HARNESS_FAIL("rank %d: %s: message %d from rank %d, element %zu is %d, want %d", to, what, k, from, i,
                         buf[i], (int32_t)msg_value(from, to, k, i));
    return 0;
}

/* Ring exchange inside a group: send to both neighbours and receive from
 * both, large enough that blocking sends would deadlock; then two
 * messages to the same peer in one group match in order. */
static int ring_exchange_body(braid_pg *pg, void *arg)
{
    (void)arg;
    int rank = braid_pg_rank(pg), n = braid_pg_size(pg);
    int next = (rank + 1) % n, prev = (rank + n - 1) % n;
    static const size_t sizes[] = {0, 1, 1001, (1u << 20) + 3};
    for (size_t s = 0; s < NELEM(sizes); s++) {
        size_t count = sizes[s];
        int32_t *to_next = alloc_or_die(count * 4), *to_prev = alloc_or_die(count * 4);
        int32_t *from_prev = alloc_or_die(count * 4), *from_next = alloc_or_die(count * 4);
        fill_msg(to_next, count, rank, next, (int)s);
        fill_msg(to_prev, count, rank, prev, (int)s + 100);
        if (braid_group_start(pg) != BRAID_OK)
            HARNESS_FAIL("rank %d: group_start: %s", rank, braid_last_error());
        /* Receives first on odd ranks, sends first on even: order inside a
         * group must not matter. */
        braid_status st = BRAID_OK;
        if (rank % 2) {
            st = st ? st : braid_recv(pg, from_prev, count, BRAID_I32, prev, NULL, NULL);
            st = st ? st : braid_recv(pg, from_next, count, BRAID_I32, next, NULL, NULL);
        }
        st = st ? st : braid_send(pg, to_next, count, BRAID_I32, next, NULL, NULL);
        st = st ? st : braid_send(pg, to_prev, count, BRAID_I32, prev, NULL, NULL);
        if (rank % 2 == 0) {
            st = st ? st : braid_recv(pg, from_prev, count, BRAID_I32, prev, NULL, NULL);
            st = st ? st : braid_recv(pg, from_next, count, BRAID_I32, next, NULL, NULL);
        }
        if (st != BRAID_OK)
            HARNESS_FAIL("rank %d: recording send/recv: %s", rank, braid_last_error());
        if (braid_group_end(pg, NULL) != BRAID_OK)
            HARNESS_FAIL("rank %d: ring exchange of %zu elements: %s", rank, count, braid_last_error());
        /* With two ranks next == prev: the two messages match in order. */
        if (check_msg(from_prev, count, prev, rank, (int)s, "ring exchange") ||
            check_msg(from_next, count, next, rank, (int)s + 100, "ring exchange"))
            return 1;
        free(to_next);
        free(to_prev);
        free(from_prev);
        free(from_next);
    }
    return 0;
}

/* Everyone sends a distinct message to everyone (itself included) in one
 * group: non-neighbour connections are made on the fly, and the send to
 * itself pairs with the receive from itself. */
static int alltoall_body(braid_pg *pg, void *arg)
{
    (void)arg;
    int rank = braid_pg_rank(pg), n = braid_pg_size(pg);
    enum { COUNT = 5003 };
    int32_t *out = alloc_or_die((size_t)n * COUNT * 4), *in = alloc_or_die((size_t)n * COUNT * 4);
    for (int round = 0; round < 2; round++) {
        for (int p = 0; p < n; p++)
            fill_msg(out + (size_t)p * COUNT, COUNT, rank, p, round);
        memset(in, 0, (size_t)n * COUNT * 4);
        if (braid_group_start(pg) != BRAID_OK)
            HARNESS_FAIL("rank %d: group_start: %s", rank, braid_last_error());
        for (int k = 0; k < n; k++) {
            int p = (rank + k) % n; /* stagger the peers */
            if (braid_send(pg, out + (size_t)p * COUNT, COUNT, BRAID_I32, p, NULL, NULL) != BRAID_OK ||
                braid_recv(pg, in + (size_t)p * COUNT, COUNT, BRAID_I32, p, NULL, NULL) != BRAID_OK)
                HARNESS_FAIL("rank %d: recording all-to-all: %s", rank, braid_last_error());
        }
        braid_work *w;
        if (braid_group_end(pg, &w) != BRAID_OK || braid_wait(w, -1) != BRAID_OK)
            HARNESS_FAIL("rank %d: all-to-all round %d: %s", rank, round, braid_last_error());
        braid_work_free(w);
        for (int p = 0; p < n; p++)
            if (check_msg(in + (size_t)p * COUNT, COUNT, p, rank, round, "all-to-all"))
                return 1;
    }
    free(out);
    free(in);
    return 0;
}

/* Plain blocking sends and receives (pairs ordered so they cannot
 * deadlock), async ones with handles, and several messages in flight
 * between one pair matching in call order. */
static int plain_p2p_body(braid_pg *pg, void *arg)
{
    (void)arg;
    int rank = braid_pg_rank(pg), n = braid_pg_size(pg);
    if (n < 2)
        return 0;
    enum { COUNT = 70001, K = 4 };
    int32_t *buf = alloc_or_die(COUNT * 4);
    int partner = rank ^ 1;
    if (partner < n) {
        for (int k = 0; k < K; k++) {
            int sender = (rank + k) % 2 == 0;
            if (sender) {
                fill_msg(buf, COUNT, rank, partner, k);
                if (braid_send(pg, buf, COUNT, BRAID_I32, partner, NULL, NULL) != BRAID_OK)
                    HARNESS_FAIL("rank %d: send %d: %s", rank, k, braid_last_error());
            } else {
                if (braid_recv(pg, buf, COUNT, BRAID_I32, partner, NULL, NULL) != BRAID_OK)
                    HARNESS_FAIL("rank %d: recv %d: %s", rank, k, braid_last_error());
                if (check_msg(buf, COUNT, partner, rank, k, "blocking recv"))
                    return 1;
            }
        }
    }
    /* Async: rank 0 posts K sends to the last rank before it posts K receives. */
    int last = n - 1;
    if (rank == 0 || rank == last) {
        int32_t *bufs[K];
        braid_work *w[K];
        for (int k = 0; k < K; k++) {
            bufs[k] = alloc_or_die(COUNT * 4);
            braid_status st;
            if (rank == 0) {
                fill_msg(bufs[k], COUNT, 0, last, 10 + k);
                st = braid_send(pg, bufs[k], COUNT, BRAID_I32, last, NULL, &w[k]);
            } else {
                st = braid_recv(pg, bufs[k], COUNT, BRAID_I32, 0, NULL, &w[k]);
            }
            if (st != BRAID_OK)
                HARNESS_FAIL("rank %d: async p2p %d: %s", rank, k, braid_last_error());
        }
        for (int k = K - 1; k >= 0; k--) {
            if (braid_wait(w[k], -1) != BRAID_OK)
                HARNESS_FAIL("rank %d: wait on p2p %d: %s", rank, k, braid_last_error());
            braid_work_free(w[k]);
            if (rank == last && check_msg(bufs[k], COUNT, 0, last, 10 + k, "async recv"))
                return 1;
            free(bufs[k]);
        }
    }
    /* Sends and receives take no sequence number: the ranks that did none
     * above still agree with the others on the next collective. */
    int32_t one = 1, sum = 0;
    if (braid_allreduce(pg, &one, &sum, 1, BRAID_I32, BRAID_SUM, NULL, NULL) != BRAID_OK || sum != n)
        HARNESS_FAIL("rank %d: all-reduce after p2p: %s (sum %d)", rank, braid_last_error(), sum);
    free(buf);
    return 0;
}

/* Collectives recorded in a group run in issue order with sends between
 * them; rank 0 groups what the others call one by one. */
static int mixed_group_body(braid_pg *pg, void *arg)
{
    (void)arg;
    int rank = braid_pg_rank(pg), n = braid_pg_size(pg);
    int next = (rank + 1) % n, prev = (rank + n - 1) % n;
    enum { COUNT = 3001 };
    int32_t a[COUNT], b[COUNT], gathered[8 * 16], mine[16], to_next[COUNT], from_prev[COUNT];
    for (int i = 0; i < COUNT; i++) {
        a[i] = rank + i;
        b[i] = rank * 2 - i;
    }
    for (int i = 0; i < 16; i++)
        mine[i] = rank * 100 + i;
    fill_msg(to_next, COUNT, rank, next, 7);
    int grouped = rank == 0;
    if (grouped && braid_group_start(pg) != BRAID_OK)
        HARNESS_FAIL("rank %d: group_start: %s", rank, braid_last_error());
    braid_status st = braid_allreduce(pg, a, a, COUNT, BRAID_I32, BRAID_SUM, NULL, NULL);
    if (st == BRAID_OK && grouped && braid_group_start(pg) != BRAID_OK) /* nested */
        st = BRAID_ERR_INTERNAL;
    st = st ? st : braid_allgather(pg, mine, gathered, 16, BRAID_I32, NULL, NULL);
    if (st == BRAID_OK && grouped)
        st = braid_group_end(pg, NULL); /* inner end: nothing runs yet */
    st = st ? st : braid_reduce(pg, b, b, COUNT, BRAID_I32, BRAID_MIN, n - 1, NULL, NULL);
    if (st != BRAID_OK)
        HARNESS_FAIL("rank %d: collectives (grouped %d): %s", rank, grouped, braid_last_error());
    if (!grouped && braid_group_start(pg) != BRAID_OK)
        HARNESS_FAIL("rank %d: group_start: %s", rank, braid_last_error());
    if (braid_send(pg, to_next, COUNT, BRAID_I32, next, NULL, NULL) != BRAID_OK ||
        braid_recv(pg, from_prev, COUNT, BRAID_I32, prev, NULL, NULL) != BRAID_OK)
        HARNESS_FAIL("rank %d: recording send/recv: %s", rank, braid_last_error());
    if (braid_group_end(pg, NULL) != BRAID_OK)
        HARNESS_FAIL("rank %d: group end: %s", rank, braid_last_error());
    for (int i = 0; i < COUNT; i++)
        if (a[i] != n * (n - 1) / 2 + n * i)
            HARNESS_FAIL("rank %d: grouped all-reduce element %d = %d", rank, i, a[i]);
    for (int r = 0; r < n; r++)
        for (int i = 0; i < 16; i++)
            if (gathered[r * 16 + i] != r * 100 + i)
                HARNESS_FAIL("rank %d: grouped all-gather block %d element %d = %d", rank, r, i, gathered[r * 16 + i]);
    if (rank == n - 1)
        for (int i = 0; i < COUNT; i++)
            if (b[i] != -i)
                HARNESS_FAIL("rank %d: grouped reduce element %d = %d, want %d", rank, i, b[i], -i);
    return check_msg(from_prev, COUNT, prev, rank, 7, "mixed group");
}

/* ---- errors ----------------------------------------------------------- */

static int expect_invalid(braid_status st, int rank, const char *what, const char *needle)
{
    if (st != BRAID_ERR_INVALID_ARG)
        HARNESS_FAIL("rank %d: %s returned %s, want BRAID_ERR_INVALID_ARG", rank, what, braid_status_string(st));
    if (!strstr(braid_last_error(), needle))
        HARNESS_FAIL("rank %d: %s: message \"%s\" lacks \"%s\"", rank, what, braid_last_error(), needle);
    return 0;
}

/* Usage errors fail locally with a reason and leave the group usable. */
static int usage_errors_body(braid_pg *pg, void *arg)
{
    (void)arg;
    int rank = braid_pg_rank(pg), n = braid_pg_size(pg);
    int32_t buf[64] = {0}, big[64 * 8] = {0};
    braid_work *w = NULL;
    if (expect_invalid(braid_group_end(pg, NULL), rank, "group_end alone", "without braid_group_start"))
        return 1;
    if (braid_group_start(pg) != BRAID_OK)
        HARNESS_FAIL("rank %d: group_start: %s", rank, braid_last_error());
    if (expect_invalid(braid_allreduce(pg, buf, buf, 4, BRAID_I32, BRAID_SUM, NULL, &w), rank, "handle inside a group",
                       "work = NULL"))
        return 1;
    if (braid_send(pg, buf, 4, BRAID_I32, rank, NULL, NULL) != BRAID_OK)
        HARNESS_FAIL("rank %d: recording a send to self: %s", rank, braid_last_error());
    if (expect_invalid(braid_group_end(pg, NULL), rank, "unpaired self send", "no matching recv"))
        return 1;
    /* Group usage errors stay local: the group is usable. */
    int32_t one = 1, sum = 0;
    if (braid_allreduce(pg, &one, &sum, 1, BRAID_I32, BRAID_SUM, NULL, NULL) != BRAID_OK || sum != n)
        HARNESS_FAIL("rank %d: all-reduce after usage errors: %s (sum %d)", rank, braid_last_error(), sum);
    if (braid_pg_error(pg) != BRAID_OK)
        HARNESS_FAIL("rank %d: usage errors broke the group", rank);
    /* A refused send, receive or collective is told to the peers and
     * breaks the group (docs/RELIABILITY.md); each refusal still names its
     * own cause. */
    if (expect_invalid(braid_send(pg, buf, 4, BRAID_I32, n, NULL, NULL), rank, "send peer n", "peer") ||
        expect_invalid(braid_recv(pg, NULL, 4, BRAID_I32, 0, NULL, NULL), rank, "recv NULL", "NULL") ||
        expect_invalid(braid_send(pg, buf, 4, BRAID_I32, rank, NULL, NULL), rank, "send to self", "itself") ||
        expect_invalid(braid_reduce(pg, buf, buf, 4, BRAID_I32, BRAID_SUM, n, NULL, NULL), rank, "reduce root n",
                       "root") ||
        expect_invalid(braid_reduce(pg, buf, buf, 4, (braid_dtype)99, BRAID_SUM, 0, NULL, NULL), rank, "reduce dtype",
                       "dtype") ||
        expect_invalid(braid_reduce_scatter(pg, big, big + 1, 4, BRAID_I32, BRAID_SUM, NULL, NULL), rank,
                       "reduce_scatter overlap", "overlap") ||
        expect_invalid(braid_allgather(pg, big + 3, big, 4, BRAID_I32, NULL, NULL), rank, "allgather overlap",
                       "overlap") ||
        /* Each rank its own root: every rank refuses, for the same cause. */
        expect_invalid(braid_gather(pg, big + 1, big, 4, BRAID_I32, rank, NULL, NULL), rank, "gather overlap",
                       "send overlaps recv without being its block") ||
        expect_invalid(braid_scatter(pg, big, big + 2, 4, BRAID_I32, rank, NULL, NULL), rank, "scatter overlap",
                       "recv overlaps send without being its block") ||
        expect_invalid(braid_reduce(pg, big, big + 1, 4, BRAID_I32, BRAID_SUM, rank, NULL, NULL), rank,
                       "reduce overlap", "send and recv overlap without being equal") ||
        expect_invalid(braid_allreduce(pg, big + 1, big, 4, BRAID_I32, BRAID_SUM, NULL, NULL), rank,
                       "allreduce overlap", "send and recv overlap without being equal") ||
        expect_invalid(braid_reduce(pg, buf, NULL, 4, BRAID_I32, BRAID_SUM, rank, NULL, NULL), rank,
                       "reduce NULL recv", "recv on the root is NULL") ||
        expect_invalid(braid_broadcast(pg, NULL, 4, BRAID_I32, 0, NULL, NULL), rank, "broadcast NULL", "buf is NULL") ||
        expect_invalid(braid_reduce_scatter(pg, big, buf, 4, BRAID_I32, (braid_op)77, NULL, NULL), rank,
                       "reduce_scatter op", "invalid op 77"))
        return 1;
    braid_status st = braid_allreduce(pg, &one, &sum, 1, BRAID_I32, BRAID_SUM, NULL, NULL);
    if (n == 1) { /* nobody to tell: a group of one stays usable */
        if (st != BRAID_OK || sum != 1 || braid_pg_error(pg) != BRAID_OK)
            HARNESS_FAIL("rank %d: all-reduce of one rank after refusals: %s", rank, braid_last_error());
        return 0;
    }
    if (st == BRAID_OK || !strstr(braid_last_error(), "recreate the group"))
        HARNESS_FAIL("rank %d: all-reduce after a refused collective: %s", rank, braid_last_error());
    if (braid_pg_error(pg) == BRAID_OK)
        HARNESS_FAIL("rank %d: a refused collective left the group unbroken", rank);
    return 0;
}

/* Rank 0 calls reduce-scatter where the others call all-gather: every rank
 * fails, those that compare the two calls with both named. */
static int mismatch_body(braid_pg *pg, void *arg)
{
    (void)arg;
    int rank = braid_pg_rank(pg), n = braid_pg_size(pg);
    int32_t *a = calloc((size_t)n * 1000, 4), *b = calloc((size_t)n * 1000, 4);
    braid_status st = rank == 0 ? braid_reduce_scatter(pg, a, b, 1000, BRAID_I32, BRAID_SUM, NULL, NULL)
                                : braid_allgather(pg, a, b, 1000, BRAID_I32, NULL, NULL);
    free(a);
    free(b);
    if (st == BRAID_OK)
        HARNESS_FAIL("rank %d: mismatched collectives succeeded", rank);
    if (st == BRAID_ERR_MISMATCH) {
        if (!strstr(braid_last_error(), "reduce_scatter(") || !strstr(braid_last_error(), "allgather("))
            HARNESS_FAIL("rank %d: mismatch text lacks both calls: %s", rank, braid_last_error());
        return 0;
    }
    if (st == BRAID_ERR_PEER)
        return 0;
    HARNESS_FAIL("rank %d: got %s: %s", rank, braid_status_string(st), braid_last_error());
}

/* A receive of a different count than was sent fails on the receiver with
 * both calls named, before any data lands in its buffer. */
static int p2p_mismatch_body(braid_pg *pg, void *arg)
{
    (void)arg;
    int rank = braid_pg_rank(pg);
    int32_t buf[300];
    for (int i = 0; i < 300; i++)
        buf[i] = -1;
    if (rank == 0) {
        int32_t data[200] = {0};
        braid_send(pg, data, 200, BRAID_I32, 1, NULL, NULL); /* may complete: the data fits in buffers */
        return 0;
    }
    if (rank != 1)
        return 0;
    braid_status st = braid_recv(pg, buf, 300, BRAID_I32, 0, NULL, NULL);
    if (st != BRAID_ERR_MISMATCH)
        HARNESS_FAIL("rank 1: mismatched recv returned %s: %s", braid_status_string(st), braid_last_error());
    if (!strstr(braid_last_error(), "count=300") || !strstr(braid_last_error(), "count=200"))
        HARNESS_FAIL("rank 1: mismatch text lacks both counts: %s", braid_last_error());
    for (int i = 0; i < 300; i++)
        if (buf[i] != -1)
            HARNESS_FAIL("rank 1: mismatched recv wrote element %d", i);
    return 0;
}

/* ---- runner ----------------------------------------------------------- */

static void run_or_fail(int n, harness_rank_fn fn, size_t chunk_bytes, int timeout_s)
{
    braid_config cfg = BRAID_CONFIG_INIT;
    cfg.chunk_bytes = chunk_bytes;
    cfg.timeout_ms = timeout_s * 1000;
    harness_result res;
    int failed = harness_run(n, fn, NULL, &cfg, timeout_s, &res);
    ck_assert_msg(failed == 0, "%d of %d ranks failed (rank 0 exit %d)", failed, n, res.exit_code[0]);
}

static const int rank_counts[] = {1, 2, 3, 4, 8};
#define NRANKS ((int)NELEM(rank_counts))

START_TEST(test_matrix)
{
    run_or_fail(rank_counts[_i], matrix_body, 4096, 240);
}
END_TEST

START_TEST(test_large_small_chunks)
{
    run_or_fail(rank_counts[_i], large_body, 4096, 240);
}
END_TEST

START_TEST(test_large_default_chunks)
{
    run_or_fail(rank_counts[_i], large_body, 0, 240);
}
END_TEST

START_TEST(test_ring_exchange)
{
    run_or_fail(rank_counts[_i], ring_exchange_body, 0, 120);
}
END_TEST

START_TEST(test_alltoall)
{
    run_or_fail(rank_counts[_i], alltoall_body, 0, 120);
}
END_TEST

START_TEST(test_plain_p2p)
{
    run_or_fail(rank_counts[_i], plain_p2p_body, 0, 120);
}
END_TEST

START_TEST(test_mixed_group)
{
    run_or_fail(rank_counts[_i], mixed_group_body, 4096, 120);
}
END_TEST

START_TEST(test_usage_errors)
{
    run_or_fail(rank_counts[_i], usage_errors_body, 0, 60);
}
END_TEST

START_TEST(test_mismatch)
{
    braid_config cfg = BRAID_CONFIG_INIT;
    cfg.timeout_ms = 5000;
    harness_result res;
    ck_assert_int_eq(harness_run(4, mismatch_body, NULL, &cfg, 20, &res), 0);
    ck_assert_double_lt(res.seconds, 5.0); /* detected, not timed out */
    ck_assert_int_eq(harness_run(2, p2p_mismatch_body, NULL, &cfg, 20, &res), 0);
    ck_assert_double_lt(res.seconds, 5.0);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("collectives_extra");
    TCase *tc = tcase_create("matrix");
    tcase_set_timeout(tc, 300);
    tcase_add_loop_test(tc, test_matrix, 0, NRANKS);
    suite_add_tcase(s, tc);
    TCase *big = tcase_create("large");
    tcase_set_timeout(big, 300);
    tcase_add_loop_test(big, test_large_small_chunks, 1, NRANKS);
    tcase_add_loop_test(big, test_large_default_chunks, 1, 4);
    suite_add_tcase(s, big);
    TCase *p2p = tcase_create("p2p");
    tcase_set_timeout(p2p, 180);
    tcase_add_loop_test(p2p, test_ring_exchange, 0, NRANKS);
    tcase_add_loop_test(p2p, test_alltoall, 0, NRANKS);
    tcase_add_loop_test(p2p, test_plain_p2p, 1, NRANKS);
    tcase_add_loop_test(p2p, test_mixed_group, 0, NRANKS);
    suite_add_tcase(s, p2p);
    TCase *err = tcase_create("errors");
    tcase_set_timeout(err, 120);
    tcase_add_loop_test(err, test_usage_errors, 0, NRANKS);
    tcase_add_test(err, test_mismatch);
    suite_add_tcase(s, err);
    SRunner *sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? 1 : 0;
}
