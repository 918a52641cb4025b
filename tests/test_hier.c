/* Hierarchical all-reduce on forked ranks that BRAID_HOST_ID splits into
 * fake hosts: shared memory inside a host, TCP across. Results are checked
 * bit-exact against a serial reference (small integer inputs, exact in
 * every dtype, so the reference does not depend on the combine order;
 * integer sums and products wrap as the engine defines). Also the host
 * topology the algorithm derives, and the tuner's choices. */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "pg_algo.h"
#include "harness.h"

static const braid_dtype all_dtypes[] = {BRAID_F32, BRAID_F64, BRAID_F16, BRAID_BF16,
                                         BRAID_I8,  BRAID_U8,  BRAID_I32, BRAID_I64};
static const braid_op all_ops[] = {BRAID_SUM, BRAID_PROD, BRAID_MIN, BRAID_MAX, BRAID_AVG};
/* 0, 1, fewer than the ranks, odd, not divisible by any shard count, and
 * more than one 4 KiB chunk per shard. */
static const size_t small_counts[] = {0, 1, 3, 7, 1001, 4099, 65537};

/* Fake hosts: layout[r] is rank r's BRAID_HOST_ID. */
typedef struct {
    const char *name;
    int n;
    const char *hosts[8];
    int nhosts, min_local, max_local;
} layout;

static const layout layouts[] = {
    {"2x2", 4, {"a", "a", "b", "b"}, 2, 2, 2},
    {"2x2 interleaved", 4, {"a", "b", "a", "b"}, 2, 2, 2},
    {"3+1", 4, {"a", "a", "b", "a"}, 2, 1, 3},
    {"2+1", 3, {"b", "a", "a"}, 2, 1, 2},
    {"2+2+1", 5, {"a", "b", "c", "a", "b"}, 3, 1, 2},
};
static const layout one_host = {"1x4", 4, {"a", "a", "a", "a"}, 1, 4, 4};

static const layout *current;

static void set_host(int rank)
{
    setenv("BRAID_HOST_ID", current->hosts[rank], 1);
}

static int run_layout(const layout *l, harness_rank_fn fn, braid_algo algo, size_t chunk, int timeout_s)
{
    braid_config cfg = BRAID_CONFIG_INIT;
    cfg.algo = algo;
    cfg.chunk_bytes = chunk;
    cfg.timeout_ms = timeout_s * 1000;
    current = l;
    harness_rank_setup = set_host;
    harness_result res;
    int failed = harness_run(l->n, fn, (void *)l, &cfg, timeout_s, &res);
    harness_rank_setup = NULL;
    for (int r = 0; r < l->n; r++)
        if (res.exit_code[r] != 0)
            fprintf(stderr, "%s: rank %d exited %d\n", l->name, r, res.exit_code[r]);
    return failed;
}

/* ---- topology and tuner ------------------------------------------------ */

static int topo_body(braid_pg *pg, void *arg)
{
    const layout *l = arg;
    int rank = braid_pg_rank(pg);
    const braid_hier_topo *t = braid__pg_hier_topo(pg);
    if (!t)
        HARNESS_FAIL("rank %d: no topology", rank);
    if (t->nhosts != l->nhosts || t->min_local != l->min_local || t->max_local != l->max_local)
        HARNESS_FAIL("rank %d (%s): %d hosts, %d-%d ranks per host; want %d, %d-%d", rank, l->name, t->nhosts,
                     t->min_local, t->max_local, l->nhosts, l->min_local, l->max_local);
    /* This host's ranks: exactly those with our id, ascending, us among them. */
    int k = 0;
    for (int p = 0; p < l->n; p++) {
        if (strcmp(l->hosts[p], l->hosts[rank]) != 0)
            continue;
        if (k >= t->nlocal || t->local[k] != p)
            HARNESS_FAIL("rank %d (%s): local member %d is not rank %d", rank, l->name, k, p);
        if (p == rank && t->local_index != k)
            HARNESS_FAIL("rank %d (%s): local index %d, want %d", rank, l->name, t->local_index, k);
        k++;
    }
    if (k != t->nlocal)
        HARNESS_FAIL("rank %d (%s): %d local ranks, want %d", rank, l->name, t->nlocal, k);
    if (t->cross[t->host] != rank)
        HARNESS_FAIL("rank %d (%s): cross ring misses this rank", rank, l->name);
    /* Hosts in the order of their lowest rank: host 0 holds rank 0. */
    if (t->local_index < t->min_local && t->host == 0 && t->cross[0] != t->local[t->local_index])
        HARNESS_FAIL("rank %d (%s): host numbering", rank, l->name);
    /* One call before leaving: rank 0 serves the rendezvous store, which
     * the others may still be reading the end of set-up from. */
    return harness_check_allreduce(pg, BRAID_I64, BRAID_MAX, 5, 0, 4);
}

/* Under BRAID_ALGO=auto: recursive doubling for small messages, hier for
 * large ones when the layout has several hosts and a host with two ranks. */
static int tuner_body(braid_pg *pg, void *arg)
{
    const layout *l = arg;
    int rank = braid_pg_rank(pg), n = braid_pg_size(pg);
    int multi = l->nhosts > 1 && l->max_local > 1;
    braid_algo big = braid__pg_allreduce_algo(pg, 4u << 20, BRAID_F32);
    braid_algo small = braid__pg_allreduce_algo(pg, 16, BRAID_F32);
    if (big != (multi ? BRAID_ALGO_HIER : BRAID_ALGO_RING))
        HARNESS_FAIL("rank %d (%s): tuner picked %d for 16 MiB", rank, l->name, (int)big);
    if (small != BRAID_ALGO_RECURSIVE_DOUBLING)
        HARNESS_FAIL("rank %d (%s): tuner picked %d for 64 bytes", rank, l->name, (int)small);
    size_t rd = braid__rd_max_bytes(n);
    if (braid__pg_allreduce_algo(pg, rd / 4 + 1, BRAID_F32) == BRAID_ALGO_RECURSIVE_DOUBLING)
        HARNESS_FAIL("rank %d (%s): recursive doubling above its limit %zu", rank, l->name, rd);
    /* The choice is used: a large auto all-reduce is exact too. */
    return harness_check_allreduce(pg, BRAID_I32, BRAID_SUM, (1u << 20) + 3, 0, 5);
}

/* BRAID_ALGO=hier where it cannot apply runs the ring. */
static int forced_fallback_body(braid_pg *pg, void *arg)
{
    (void)arg;
    int rank = braid_pg_rank(pg);
    if (braid__pg_allreduce_algo(pg, 1u << 20, BRAID_F32) != BRAID_ALGO_RING)
        HARNESS_FAIL("rank %d: forced hier on one host is not the ring", rank);
    return harness_check_allreduce(pg, BRAID_F32, BRAID_AVG, 100003, 1, 6);
}

/* Forced hier in a topology that allows it is used. */
static int forced_body(braid_pg *pg, void *arg)
{
    (void)arg;
    if (braid__pg_allreduce_algo(pg, 1, BRAID_I8) != BRAID_ALGO_HIER)
        HARNESS_FAIL("rank %d: forced hier not chosen", braid_pg_rank(pg));
    return harness_check_allreduce(pg, BRAID_I8, BRAID_SUM, 1, 1, 7); /* and one call before leaving, as above */
}

START_TEST(test_rd_threshold)
{
    /* n = 4 keeps the measured 64 KiB; more ranks allow more, odd group
     * sizes (fold rounds) less than the power of two below them. */
    ck_assert_uint_eq(braid__rd_max_bytes(1), 0);
    ck_assert_uint_eq(braid__rd_max_bytes(4), 64 * 1024);
    ck_assert_uint_lt(braid__rd_max_bytes(3), braid__rd_max_bytes(2));
    ck_assert_uint_lt(braid__rd_max_bytes(5), braid__rd_max_bytes(4));
    size_t prev = 0;
    for (int n = 2; n <= 1 << 16; n *= 2) {
        size_t b = braid__rd_max_bytes(n);
        ck_assert_msg(b >= prev, "threshold falls from %zu to %zu at n = %d", prev, b, n);
        ck_assert_uint_le(b, 4u << 20);
        prev = b;
    }
    ck_assert_uint_eq(braid__rd_max_bytes(1 << 16), 4u << 20);
}
END_TEST

START_TEST(test_topology)
{
    const layout *l = _i < (int)(sizeof(layouts) / sizeof(layouts[0])) ? &layouts[_i] : &one_host;
    ck_assert_int_eq(run_layout(l, topo_body, BRAID_ALGO_AUTO, 0, 60), 0);
}
END_TEST

START_TEST(test_tuner)
{
    const layout *l = _i < (int)(sizeof(layouts) / sizeof(layouts[0])) ? &layouts[_i] : &one_host;
    ck_assert_int_eq(run_layout(l, tuner_body, BRAID_ALGO_AUTO, 0, 120), 0);
}
END_TEST

START_TEST(test_forced)
{
    ck_assert_int_eq(run_layout(&layouts[0], forced_body, BRAID_ALGO_HIER, 0, 60), 0);
    ck_assert_int_eq(run_layout(&one_host, forced_fallback_body, BRAID_ALGO_HIER, 0, 60), 0);
}
END_TEST

/* Every dtype x op x small count, alternately in and out of place, with
 * 4 KiB chunks so shards span several pipeline chunks. */
static int matrix_body(braid_pg *pg, void *arg)
{
    (void)arg;
    if (braid__pg_allreduce_algo(pg, 1, BRAID_F32) != BRAID_ALGO_HIER)
        HARNESS_FAIL("rank %d: not running hier", braid_pg_rank(pg));
    if (braid_allreduce(pg, NULL, NULL, 0, BRAID_F32, BRAID_AVG, NULL, NULL) != BRAID_OK)
        HARNESS_FAIL("rank %d: empty all-reduce with NULL buffers: %s", braid_pg_rank(pg), braid_last_error());
    uint32_t seed = 11;
    for (size_t d = 0; d < sizeof(all_dtypes) / sizeof(all_dtypes[0]); d++)
        for (size_t o = 0; o < sizeof(all_ops) / sizeof(all_ops[0]); o++)
            for (size_t c = 0; c < sizeof(small_counts) / sizeof(small_counts[0]); c++)
                if (harness_check_allreduce(pg, all_dtypes[d], all_ops[o], small_counts[c], (int)((c + d) % 2), seed++))
                    return 1;
    return 0;
}

START_TEST(test_matrix)
{
    ck_assert_int_eq(run_layout(&layouts[_i], matrix_body, BRAID_ALGO_HIER, 4096, 240), 0);
}
END_TEST

/* A few MiB with the default chunk: several chunks in flight per shard. */
static int large_body(braid_pg *pg, void *arg)
{
    (void)arg;
    if (harness_check_allreduce(pg, BRAID_F32, BRAID_SUM, (3u << 20) / 4 + 5, 1, 21))
        return 1;
    if (harness_check_allreduce(pg, BRAID_I32, BRAID_AVG, (2u << 20) / 4 + 1, 0, 22))
        return 1;
    if (harness_check_allreduce(pg, BRAID_BF16, BRAID_MAX, (2u << 20) / 2 + 7, 0, 23))
        return 1;
    return harness_check_allreduce(pg, BRAID_U8, BRAID_SUM, (3u << 20) + 1, 1, 24);
}

START_TEST(test_large)
{
    ck_assert_int_eq(run_layout(&layouts[_i], large_body, BRAID_ALGO_HIER, 0, 240), 0);
}
END_TEST

/* Many calls back to back, async, with the three phases of consecutive
 * calls overlapping across ranks. */
static int async_body(braid_pg *pg, void *arg)
{
    (void)arg;
    enum { K = 6, N = 30011 };
    int rank = braid_pg_rank(pg), n = braid_pg_size(pg);
    static int32_t bufs[K][N];
    braid_work *w[K];
    for (int k = 0; k < K; k++) {
        for (int i = 0; i < N; i++)
            bufs[k][i] = rank * 1000 + k + i;
        if (braid_allreduce(pg, bufs[k], bufs[k], N, BRAID_I32, BRAID_SUM, NULL, &w[k]) != BRAID_OK)
            HARNESS_FAIL("rank %d: async allreduce %d: %s", rank, k, braid_last_error());
    }
    for (int k = 0; k < K; k++) {
        if (braid_wait(w[k], -1) != BRAID_OK)
            HARNESS_FAIL("rank %d: wait %d: %s", rank, k, braid_last_error());
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

START_TEST(test_async)
{
    ck_assert_int_eq(run_layout(&layouts[_i], async_body, BRAID_ALGO_HIER, 4096, 120), 0);
}
END_TEST

/* A call that does not match on one rank fails on every rank with the
 * mismatch of both calls, well within the group timeout, whichever pass
 * sees it first. */
static int mismatch_body(braid_pg *pg, void *arg)
{
    (void)arg;
    int rank = braid_pg_rank(pg);
    static int32_t buf[100001];
    size_t count = rank == 3 ? 100001 : 100000;
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    braid_status st = braid_allreduce(pg, buf, buf, count, BRAID_I32, BRAID_SUM, NULL, NULL);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    double s = (double)(t1.tv_sec - t0.tv_sec) + (double)(t1.tv_nsec - t0.tv_nsec) * 1e-9;
    if (st == BRAID_OK)
        HARNESS_FAIL("rank %d: mismatched all-reduce succeeded", rank);
    if (st != BRAID_ERR_MISMATCH || !strstr(braid_last_error(), "count=100001") ||
        !strstr(braid_last_error(), "count=100000"))
        HARNESS_FAIL("rank %d: mismatched all-reduce returned %s, not the mismatch of both calls: %s", rank,
                     braid_status_string(st), braid_last_error());
    if (s > 4.0)
        HARNESS_FAIL("rank %d: mismatch took %.1f s to fail", rank, s);
    return 0;
}

START_TEST(test_mismatch)
{
    ck_assert_int_eq(run_layout(&layouts[0], mismatch_body, BRAID_ALGO_HIER, 0, 8), 0);
}
END_TEST

/* A rank killed in the middle of the loop: every survivor, whichever pass
 * it is in, fails within the timeout plus a margin. Every rank in turn. */
START_TEST(test_kill)
{
    braid_config cfg = BRAID_CONFIG_INIT;
    cfg.algo = BRAID_ALGO_HIER;
    cfg.timeout_ms = 3000;
    current = &layouts[0];
    harness_rank_setup = set_host;
    harness_fault f = {.rank = _i, .after_ms = 150 + 70 * _i};
    harness_result res;
    int failed = harness_run_faulty(4, harness_until_failure, NULL, &cfg, 30, &f, &res);
    harness_rank_setup = NULL;
    ck_assert_msg(failed == 0, "%d survivors did not fail cleanly after rank %d was killed", failed, _i);
    ck_assert_msg(res.fault_to_end_s < 3.0 + 2.0, "survivors took %.2f s after the kill", res.fault_to_end_s);
}
END_TEST

static Suite *hier_suite(void)
{
    Suite *s = suite_create("hier");
    int nl = (int)(sizeof(layouts) / sizeof(layouts[0]));
    TCase *tc = tcase_create("tuner");
    tcase_set_timeout(tc, 600);
    tcase_add_test(tc, test_rd_threshold);
    tcase_add_loop_test(tc, test_topology, 0, nl + 1);
    tcase_add_loop_test(tc, test_tuner, 0, nl + 1);
    tcase_add_test(tc, test_forced);
    suite_add_tcase(s, tc);
    tc = tcase_create("allreduce");
    tcase_set_timeout(tc, 300);
    tcase_add_loop_test(tc, test_matrix, 0, nl);
    tcase_add_loop_test(tc, test_large, 0, nl);
    tcase_add_loop_test(tc, test_async, 0, nl);
    tcase_add_test(tc, test_mismatch);
    suite_add_tcase(s, tc);
    tc = tcase_create("faults");
    tcase_set_timeout(tc, 120);
    tcase_add_loop_test(tc, test_kill, 0, 4);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    SRunner *sr = srunner_create(hier_suite());
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
