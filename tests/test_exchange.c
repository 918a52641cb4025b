/* All-to-all, gather and scatter (src/calls/exchange.c) on 1..8 loopback ranks:
 * every dtype, counts from 0 to several chunks, every root, in and out of
 * place, blocking and with work handles, inside a caller's group, and the
 * usage errors. Each element encodes (source rank, destination block,
 * index), so a block that lands in the wrong place names itself. */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"

static const braid_dtype all_dtypes[] = {BRAID_F32, BRAID_F64, BRAID_F16, BRAID_BF16,
                                         BRAID_I8,  BRAID_U8,  BRAID_I32, BRAID_I64};
static const size_t counts[] = {0, 1, 7, 1000, 5003};
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

/* Element i of the block rank `src` holds for `dst`: exact in every dtype
 * (u8 and i8 keep it within [0, 100]). */
static double value(int src, int dst, size_t i, uint32_t seed)
{
    return (double)((src * 13 + dst * 7 + (int)(i % 23) + (int)seed) % 101);
}

static void fill(braid_dtype t, void *buf, int src, int dst, size_t count, uint32_t seed)
{
    for (size_t i = 0; i < count; i++)
        harness_store(t, buf, i, value(src, dst, i, seed));
}

static int check_block(braid_dtype t, const void *buf, int src, int dst, size_t count, uint32_t seed, const char *what,
                       int rank)
{
    for (size_t i = 0; i < count; i++)
        if (harness_load(t, buf, i) != value(src, dst, i, seed))
            HARNESS_FAIL("rank %d: %s dtype=%d count=%zu: block of rank %d for rank %d, element %zu is %g, want %g",
                         rank, what, t, count, src, dst, i, harness_load(t, buf, i), value(src, dst, i, seed));
    return 0;
}

/* Finish a call made with or without a handle. */
static braid_status finish(braid_status st, braid_work *w)
{
    if (st != BRAID_OK || !w)
        return st;
    st = braid_wait(w, -1);
    braid_work_free(w);
    return st;
}

static int check_alltoall(braid_pg *pg, braid_dtype t, size_t count, int async, uint32_t seed)
{
    int rank = braid_pg_rank(pg), n = braid_pg_size(pg);
    size_t es = braid_dtype_size(t), block = count * es;
    unsigned char *send = alloc_or_die(block * (size_t)n), *recv = alloc_or_die(block * (size_t)n + 1);
    for (int p = 0; p < n; p++)
        fill(t, send + (size_t)p * block, rank, p, count, seed);
    memset(recv, 0xA5, block * (size_t)n + 1);
    braid_work *w = NULL;
    braid_status st = braid_alltoall(pg, send, recv, count, t, NULL, async ? &w : NULL);
    st = finish(st, w);
    if (st != BRAID_OK)
        HARNESS_FAIL("rank %d: alltoall(count=%zu dtype=%d) failed: %s", rank, count, t, braid_last_error());
    if (recv[block * (size_t)n] != 0xA5)
        HARNESS_FAIL("rank %d: alltoall wrote past the end of recv", rank);
    for (int p = 0; p < n; p++)
        if (check_block(t, recv + (size_t)p * block, p, rank, count, seed, "alltoall", rank) ||
            check_block(t, send + (size_t)p * block, rank, p, count, seed, "alltoall's send", rank))
            return 1;
    free(send);
    free(recv);
    return 0;
}

/* Gather: on the root, block p comes from rank p (the root's own block is
 * its send, or already in place). */
static int check_gather(braid_pg *pg, braid_dtype t, size_t count, int root, int in_place, uint32_t seed)
{
    int rank = braid_pg_rank(pg), n = braid_pg_size(pg);
    size_t es = braid_dtype_size(t), block = count * es;
    unsigned char *mine = alloc_or_die(block), *recv = alloc_or_die(block * (size_t)n + 1);
    memset(recv, 0xA5, block * (size_t)n + 1);
    unsigned char *send = in_place && rank == root ? recv + (size_t)root * block : mine;
    fill(t, send, rank, root, count, seed);
    if (braid_gather(pg, send, rank == root ? recv : NULL, count, t, root, NULL, NULL) != BRAID_OK)
        HARNESS_FAIL("rank %d: gather(count=%zu dtype=%d root=%d) failed: %s", rank, count, t, root,
                     braid_last_error());
    if (rank == root) {
        if (recv[block * (size_t)n] != 0xA5)
            HARNESS_FAIL("rank %d: gather wrote past the end of recv", rank);
        for (int p = 0; p < n; p++)
            if (check_block(t, recv + (size_t)p * block, p, root, count, seed, "gather", rank))
                return 1;
    }
    free(mine);
    free(recv);
    return 0;
}

static int check_scatter(braid_pg *pg, braid_dtype t, size_t count, int root, int in_place, uint32_t seed)
{
    int rank = braid_pg_rank(pg), n = braid_pg_size(pg);
    size_t es = braid_dtype_size(t), block = count * es;
    unsigned char *send = alloc_or_die(block * (size_t)n), *mine = alloc_or_die(block + 1);
    if (rank == root)
        for (int p = 0; p < n; p++)
            fill(t, send + (size_t)p * block, root, p, count, seed);
    memset(mine, 0xA5, block + 1);
    unsigned char *recv = in_place && rank == root ? send + (size_t)root * block : mine;
    if (braid_scatter(pg, rank == root ? send : NULL, recv, count, t, root, NULL, NULL) != BRAID_OK)
        HARNESS_FAIL("rank %d: scatter(count=%zu dtype=%d root=%d) failed: %s", rank, count, t, root,
                     braid_last_error());
    if (recv == mine && mine[block] != 0xA5)
        HARNESS_FAIL("rank %d: scatter wrote past the end of recv", rank);
    if (check_block(t, recv, root, rank, count, seed, "scatter", rank))
        return 1;
    free(send);
    free(mine);
    return 0;
}

static int matrix_body(braid_pg *pg, void *arg)
{
    (void)arg;
    int n = braid_pg_size(pg);
    uint32_t seed = 1;
    for (size_t d = 0; d < NELEM(all_dtypes); d++) {
        for (size_t c = 0; c < NELEM(counts); c++, seed++) {
            braid_dtype t = all_dtypes[d];
            if (check_alltoall(pg, t, counts[c], (int)(seed & 1), seed))
                return 1;
            /* Every root for the small counts, one root (rotating) for the large ones. */
            for (int root = 0; root < n; root++) {
                if (counts[c] > 7 && root != (int)(seed % (uint32_t)n))
                    continue;
                for (int in_place = 0; in_place < 2; in_place++)
                    if (check_gather(pg, t, counts[c], root, in_place, seed) ||
                        check_scatter(pg, t, counts[c], root, in_place, seed))
                        return 1;
            }
        }
    }
    return 0;
}

/* The three inside one caller's group, with an all-reduce between them:
 * the group runs them in issue order as one job. */
static int group_body(braid_pg *pg, void *arg)
{
    (void)arg;
    int rank = braid_pg_rank(pg), n = braid_pg_size(pg);
    size_t count = 333, block = count * sizeof(int32_t);
    int32_t *a2a_send = alloc_or_die(block * (size_t)n), *a2a_recv = alloc_or_die(block * (size_t)n);
    int32_t *gat = alloc_or_die(block * (size_t)n), *sca = alloc_or_die(block * (size_t)n);
    int32_t *mine = alloc_or_die(block), *part = alloc_or_die(block), sum = rank + 1;
    for (int p = 0; p < n; p++) {
        fill(BRAID_I32, (char *)a2a_send + (size_t)p * block, rank, p, count, 5);
        fill(BRAID_I32, (char *)sca + (size_t)p * block, n - 1, p, count, 6);
    }
    fill(BRAID_I32, mine, rank, 0, count, 7);
    braid_work *w = NULL;
    braid_status st = braid_group_start(pg);
    if (st == BRAID_OK)
        st = braid_alltoall(pg, a2a_send, a2a_recv, count, BRAID_I32, NULL, NULL);
    if (st == BRAID_OK)
        st = braid_allreduce(pg, &sum, &sum, 1, BRAID_I32, BRAID_SUM, NULL, NULL);
    if (st == BRAID_OK)
        st = braid_gather(pg, mine, gat, count, BRAID_I32, 0, NULL, NULL);
    if (st == BRAID_OK)
        st = braid_scatter(pg, sca, part, count, BRAID_I32, n - 1, NULL, NULL);
    braid_status end = braid_group_end(pg, &w);
    st = finish(st != BRAID_OK ? st : end, w);
    if (st != BRAID_OK)
        HARNESS_FAIL("rank %d: group of alltoall, allreduce, gather, scatter failed: %s", rank, braid_last_error());
    if (sum != n * (n + 1) / 2)
        HARNESS_FAIL("rank %d: all-reduce inside the group gave %d, want %d", rank, sum, n * (n + 1) / 2);
    for (int p = 0; p < n; p++) {
        if (check_block(BRAID_I32, (char *)a2a_recv + (size_t)p * block, p, rank, count, 5, "grouped alltoall", rank))
            return 1;
        if (rank == 0 && check_block(BRAID_I32, (char *)gat + (size_t)p * block, p, 0, count, 7, "grouped gather", rank))
            return 1;
    }
    if (check_block(BRAID_I32, part, n - 1, rank, count, 6, "grouped scatter", rank))
        return 1;
    free(a2a_send);
    free(a2a_recv);
    free(gat);
    free(sca);
    free(mine);
    free(part);
    return 0;
}

static int usage_errors_body(braid_pg *pg, void *arg)
{
    (void)arg;
    int rank = braid_pg_rank(pg), n = braid_pg_size(pg);
    int32_t buf[64] = {0};
    struct {
        braid_status got;
        const char *needle;
    } cases[] = {
        {braid_alltoall(pg, buf, buf, 1, BRAID_I32, NULL, NULL), "no in-place form"},
        {braid_alltoall(pg, NULL, buf, 1, BRAID_I32, NULL, NULL), "send is NULL"},
        {braid_gather(pg, buf, buf, 1, BRAID_I32, n, NULL, NULL), "out of range"},
        {braid_scatter(pg, buf, buf, 1, BRAID_I32, -1, NULL, NULL), "out of range"},
        {braid_scatter(pg, buf, NULL, 1, BRAID_I32, 0, NULL, NULL), "recv is NULL"},
        {braid_gather(pg, buf, buf, 1, (braid_dtype)99, 0, NULL, NULL), "invalid dtype"},
    };
    for (size_t i = 0; i < NELEM(cases); i++) {
        if (cases[i].got != BRAID_ERR_INVALID_ARG)
            HARNESS_FAIL("rank %d: usage error case %zu returned %s", rank, i, braid_status_string(cases[i].got));
    }
    /* Text of the last one: each refusal still names its own cause. */
    if (!strstr(braid_last_error(), "invalid dtype") || !strstr(braid_last_error(), "gather"))
        HARNESS_FAIL("rank %d: error text lacks the call and cause: %s", rank, braid_last_error());
    /* A refused call is told to the peers and breaks the group, as for the
     * other collectives (docs/RELIABILITY.md); a group of one stays usable. */
    braid_status st = braid_alltoall(pg, buf, buf + 32, 1, BRAID_I32, NULL, NULL);
    if (n == 1) {
        if (st != BRAID_OK || braid_pg_error(pg) != BRAID_OK)
            HARNESS_FAIL("rank %d: alltoall of one rank after usage errors: %s", rank, braid_last_error());
        return 0;
    }
    if (st == BRAID_OK || !strstr(braid_last_error(), "recreate the group"))
        HARNESS_FAIL("rank %d: alltoall after a refused alltoall: %s", rank, braid_last_error());
    if (braid_pg_error(pg) == BRAID_OK)
        HARNESS_FAIL("rank %d: a refused alltoall left the group unbroken", rank);
    return 0;
}

/* Ranks that disagree on the count: the p2p fingerprints turn it into
 * BRAID_ERR_MISMATCH on the ranks that see it, not a hang or overrun. */
static int mismatch_body(braid_pg *pg, void *arg)
{
    (void)arg;
    int rank = braid_pg_rank(pg);
    int32_t send[2 * 300] = {0}, recv[2 * 300];
    size_t count = rank == 1 ? 300 : 200;
    braid_status st = braid_alltoall(pg, send, recv, count, BRAID_I32, NULL, NULL);
    if (st == BRAID_OK)
        HARNESS_FAIL("rank %d: mismatched alltoall succeeded", rank);
    if (st != BRAID_ERR_MISMATCH && st != BRAID_ERR_PEER)
        HARNESS_FAIL("rank %d: mismatched alltoall returned %s: %s", rank, braid_status_string(st),
                     braid_last_error());
    return 0;
}

static void run_or_fail(int n, harness_rank_fn fn, size_t chunk_bytes, int timeout_s)
{
    braid_config cfg = BRAID_CONFIG_INIT;
    cfg.chunk_bytes = chunk_bytes;
    cfg.timeout_ms = timeout_s * 1000;
    harness_result res;
    int failed = harness_run(n, fn, NULL, &cfg, timeout_s, &res);
    ck_assert_msg(failed == 0, "%d of %d ranks failed (rank 0 exit %d)", failed, n, res.exit_code[0]);
}

static const int rank_counts[] = {1, 2, 3, 4, 5, 8};
#define NRANKS ((int)NELEM(rank_counts))

START_TEST(test_matrix)
{
    run_or_fail(rank_counts[_i], matrix_body, 4096, 240);
}
END_TEST

START_TEST(test_group)
{
    run_or_fail(rank_counts[_i], group_body, 0, 120);
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
    ck_assert_int_eq(harness_run(2, mismatch_body, NULL, &cfg, 30, &res), 0);
    ck_assert_double_lt(res.seconds, 20.0); /* detected, not hung */
}
END_TEST

int main(void)
{
    Suite *s = suite_create("exchange");
    TCase *tc = tcase_create("matrix");
    tcase_set_timeout(tc, 300);
    tcase_add_loop_test(tc, test_matrix, 0, NRANKS);
    tcase_add_loop_test(tc, test_group, 0, NRANKS);
    suite_add_tcase(s, tc);
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
