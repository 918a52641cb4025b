/* Multi-process all-reduce and broadcast on loopback, checked bit-exact
 * against a serial reference. Inputs are small integers, exact in every
 * dtype, so the reference does not depend on the reduction order; ranges
 * keep f16/bf16 sums exact and let integer sums and products wrap the way
 * the engine defines (two's complement). */
#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"

static const braid_dtype all_dtypes[] = {BRAID_F32, BRAID_F64, BRAID_F16, BRAID_BF16,
                                         BRAID_I8,  BRAID_U8,  BRAID_I32, BRAID_I64};
static const braid_op all_ops[] = {BRAID_SUM, BRAID_PROD, BRAID_MIN, BRAID_MAX, BRAID_AVG};
static const size_t small_counts[] = {0, 1, 3, 7, 64, 1000, 4099, 65537};

static int check_broadcast(braid_pg *pg, size_t bytes, int root, uint32_t seed)
{
    int rank = braid_pg_rank(pg);
    unsigned char *buf = malloc(bytes + 1);
    if (!buf)
        HARNESS_FAIL("rank %d: out of memory", rank);
    for (size_t i = 0; i < bytes; i++)
        buf[i] = rank == root ? (unsigned char)harness_value(root, i, seed, 0, 255) : 0;
    buf[bytes] = 0x5A;
    if (braid_broadcast(pg, buf, bytes, BRAID_U8, root, NULL, NULL) != BRAID_OK)
        HARNESS_FAIL("rank %d: broadcast(bytes=%zu root=%d) failed: %s", rank, bytes, root, braid_last_error());
    for (size_t i = 0; i < bytes; i++)
        if (buf[i] != (unsigned char)harness_value(root, i, seed, 0, 255))
            HARNESS_FAIL("rank %d: broadcast bytes=%zu root=%d: byte %zu wrong", rank, bytes, root, i);
    if (buf[bytes] != 0x5A)
        HARNESS_FAIL("rank %d: broadcast wrote past the buffer", rank);
    free(buf);
    return 0;
}

static int matrix_body(braid_pg *pg, void *arg)
{
    (void)arg;
    uint32_t seed = 1;
    for (size_t d = 0; d < sizeof(all_dtypes) / sizeof(all_dtypes[0]); d++)
        for (size_t o = 0; o < sizeof(all_ops) / sizeof(all_ops[0]); o++)
            for (size_t c = 0; c < sizeof(small_counts) / sizeof(small_counts[0]); c++)
                if (harness_check_allreduce(pg, all_dtypes[d], all_ops[o], small_counts[c], (int)(c % 2), seed++))
                    return 1;
    static const size_t bcast_sizes[] = {0, 1, 7, 1000, 65536, (1u << 20) + 3};
    for (size_t s = 0; s < sizeof(bcast_sizes) / sizeof(bcast_sizes[0]); s++)
        for (int root = 0; root < braid_pg_size(pg); root++)
            if (check_broadcast(pg, bcast_sizes[s], root, seed++))
                return 1;
    return 0;
}

static int large_body(braid_pg *pg, void *arg)
{
    (void)arg;
    /* 64 MiB of f32 in place and 1 MiB + odd out of place, plus i32. */
    if (harness_check_allreduce(pg, BRAID_F32, BRAID_SUM, 16u << 20, 1, 77))
        return 1;
    if (harness_check_allreduce(pg, BRAID_F32, BRAID_AVG, (1u << 18) + 13, 0, 78))
        return 1;
    if (harness_check_allreduce(pg, BRAID_I32, BRAID_MAX, (1u << 20) + 1, 0, 79))
        return 1;
    return check_broadcast(pg, 16u << 20, braid_pg_size(pg) - 1, 80);
}

/* Several outstanding collectives complete in issue order with right results. */
static int async_body(braid_pg *pg, void *arg)
{
    (void)arg;
    enum { K = 6, N = 10007 };
    int rank = braid_pg_rank(pg), n = braid_pg_size(pg);
    static int32_t bufs[K][N];
    braid_work *w[K];
    for (int k = 0; k < K; k++) {
        for (int i = 0; i < N; i++)
            bufs[k][i] = rank * 1000 + k + i;
        if (braid_allreduce(pg, bufs[k], bufs[k], N, BRAID_I32, BRAID_SUM, NULL, &w[k]) != BRAID_OK)
            HARNESS_FAIL("rank %d: async allreduce %d: %s", rank, k, braid_last_error());
    }
    for (int k = K - 1; k >= 0; k--) {
        if (braid_wait(w[k], -1) != BRAID_OK)
            HARNESS_FAIL("rank %d: wait %d: %s", rank, k, braid_last_error());
        int done = 0;
        if (braid_test(w[k], &done) != BRAID_OK || !done)
            HARNESS_FAIL("rank %d: test after wait says not done", rank);
        braid_work_free(w[k]);
    }
    for (int k = 0; k < K; k++)
        for (int i = 0; i < N; i++) {
            int32_t want = 1000 * n * (n - 1) / 2 + n * (k + i);
            if (bufs[k][i] != want)
                HARNESS_FAIL("rank %d: async %d element %d = %d, want %d", rank, k, i, bufs[k][i], want);
        }
    return 0;
}

static void run_or_fail(int n, harness_rank_fn fn, braid_algo algo, int timeout_s)
{
    braid_config cfg = BRAID_CONFIG_INIT;
    cfg.algo = algo;
    cfg.timeout_ms = timeout_s * 1000;
    harness_result res;
    int failed = harness_run(n, fn, NULL, &cfg, timeout_s, &res);
    ck_assert_msg(failed == 0, "%d of %d ranks failed (rank 0 exit %d)", failed, n, res.exit_code[0]);
}

static const int rank_counts[] = {1, 2, 3, 4, 8};

START_TEST(test_matrix_auto)
{
    run_or_fail(rank_counts[_i], matrix_body, BRAID_ALGO_AUTO, 120);
}
END_TEST

START_TEST(test_matrix_ring)
{
    run_or_fail(rank_counts[_i], matrix_body, BRAID_ALGO_RING, 120);
}
END_TEST

START_TEST(test_matrix_rd)
{
    run_or_fail(rank_counts[_i], matrix_body, BRAID_ALGO_RECURSIVE_DOUBLING, 120);
}
END_TEST

START_TEST(test_large)
{
    run_or_fail(rank_counts[_i], large_body, BRAID_ALGO_AUTO, 240);
}
END_TEST

START_TEST(test_async)
{
    run_or_fail(rank_counts[_i], async_body, BRAID_ALGO_AUTO, 60);
}
END_TEST

START_TEST(test_many_ranks)
{
    /* Group sizes up to 64: odd and power-of-two, small and mid counts. */
    static const int sizes[] = {5, 16, 33, 64};
    run_or_fail(sizes[_i], async_body, BRAID_ALGO_AUTO, 120);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("collectives");
    int nrc = (int)(sizeof(rank_counts) / sizeof(rank_counts[0]));
    TCase *tc = tcase_create("matrix");
    tcase_set_timeout(tc, 300);
    tcase_add_loop_test(tc, test_matrix_auto, 0, nrc);
    tcase_add_loop_test(tc, test_matrix_ring, 1, nrc);
    tcase_add_loop_test(tc, test_matrix_rd, 1, nrc);
    tcase_add_loop_test(tc, test_async, 1, nrc);
    tcase_add_loop_test(tc, test_many_ranks, 0, 4);
    suite_add_tcase(s, tc);
    TCase *big = tcase_create("large");
    tcase_set_timeout(big, 300);
    tcase_add_loop_test(big, test_large, 1, nrc);
    suite_add_tcase(s, big);
    SRunner *sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? 1 : 0;
}
