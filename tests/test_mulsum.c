/* braid_allreduce_mulsum, braid_reduce_mulsum and braid_reduce_scatter_mulsum
 * on forked ranks, each rank with its own scalar: the result is
 * sum_r(scalar_r * x_r).
 *
 *  - integers (i8 to u64): random bits and scalars, bit-exact modulo
 *    2^bits, so a product done in a narrower or signed type shows;
 *  - f64: dyadic scalars and integer inputs, every product and sum exact,
 *    so bit-exact too;
 *  - f32: scalars 0.1 * (r + 1) and inputs k / 7, not exact. Each product
 *    is rounded once to f32 (t_r), and the n - 1 additions each add at
 *    most 2^-24 of the running sum, so |result - sum t_r| <= n * 2^-24 *
 *    sum |t_r|.
 * Also: in place and out of place (send never written), count 0 (nothing
 * written), the scalar read when the call is made even when the collective
 * runs later (queued behind another call, or inside a group). */
#include <check.h>
#include <inttypes.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"

typedef enum { ALLREDUCE, REDUCE, REDUCE_SCATTER } kind;
static const char *const kind_names[] = {"allreduce_mulsum", "reduce_mulsum", "reduce_scatter_mulsum"};

static const braid_dtype dtypes[] = {BRAID_F32, BRAID_F64, BRAID_I8,  BRAID_U8,
                                     BRAID_I32, BRAID_U32, BRAID_I64, BRAID_U64};
static const size_t counts[] = {0, 1, 5, 1000, 40013};

static uint64_t bits(int rank, size_t i, uint32_t seed)
{
    uint64_t x = (uint64_t)rank * 0x9E3779B97F4A7C15ull ^ (uint64_t)i * 0xBF58476D1CE4E5B9ull ^ seed;
    x ^= x >> 31;
    x *= 0x94D049BB133111EBull;
    return x ^ x >> 29;
}

static double f64_scalar(int rank)
{
    return (rank % 2 ? -1 : 1) * (2 * rank + 3) / 4.0;
}

/* Rank r's scalar, one element of t; integers: its low bytes. */
static void scalar_of(braid_dtype t, int rank, unsigned char out[8])
{
    if (t == BRAID_F32) {
        float s = 0.1f * (float)(rank + 1);
        memcpy(out, &s, 4);
    } else if (t == BRAID_F64) {
        double s = f64_scalar(rank);
        memcpy(out, &s, 8);
    } else {
        uint64_t s = 0x9E3779B97F4A7C15ull + (uint64_t)rank * 0x10001ull;
        memcpy(out, &s, 8); /* little endian: the first bytes are the low ones */
    }
}

static void store(braid_dtype t, void *buf, size_t i, int rank, uint32_t seed)
{
    size_t es = braid_dtype_size(t);
    if (t == BRAID_F32) {
        float v = (float)harness_value(rank, i, seed, -1000, 1000) / 7.0f;
        memcpy((char *)buf + i * 4, &v, 4);
    } else if (t == BRAID_F64) {
        double v = (double)harness_value(rank, i, seed, -1000000, 1000000);
        memcpy((char *)buf + i * 8, &v, 8);
    } else {
        uint64_t v = bits(rank, i, seed);
        memcpy((char *)buf + i * es, &v, es);
    }
}

/* Checks element i of the result (at got) against the reference. */
static int check_elem(braid_dtype t, int n, size_t i, uint32_t seed, const void *got, char *why, size_t cap)
{
    unsigned char s[8];
    if (t == BRAID_F32) {
        double sum = 0, mag = 0;
        for (int r = 0; r < n; r++) {
            float sf;
            scalar_of(t, r, s);
            memcpy(&sf, s, 4);
            float term = sf * ((float)harness_value(r, i, seed, -1000, 1000) / 7.0f); /* rounded once */
            sum += term;
            mag += fabs(term);
        }
        float g;
        memcpy(&g, got, 4);
        if (fabs((double)g - sum) <= n * ldexp(mag, -24))
            return 0;
        snprintf(why, cap, "%.9g, want %.9g within %.3g", g, sum, n * ldexp(mag, -24));
        return 1;
    }
    if (t == BRAID_F64) {
        double sum = 0, g;
        for (int r = 0; r < n; r++)
            sum += f64_scalar(r) * (double)harness_value(r, i, seed, -1000000, 1000000);
        memcpy(&g, got, 8);
        if (memcmp(&g, &sum, 8) == 0)
            return 0;
        snprintf(why, cap, "%.17g, want %.17g", g, sum);
        return 1;
    }
    size_t es = braid_dtype_size(t);
    uint64_t sum = 0, g = 0;
    for (int r = 0; r < n; r++) {
        uint64_t sv = 0;
        scalar_of(t, r, s);
        memcpy(&sv, s, es);
        sum += sv * bits(r, i, seed);
    }
    memcpy(&g, got, es);
    uint64_t mask = es == 8 ? UINT64_MAX : (1ull << (8 * es)) - 1;
    if (g == (sum & mask))
        return 0;
    snprintf(why, cap, "%#" PRIx64 ", want %#" PRIx64, g, sum & mask);
    return 1;
}

static braid_status call(braid_pg *pg, kind k, const void *send, void *recv, size_t count, braid_dtype t,
                         const void *scalar, int root, braid_work **work)
{
    if (k == ALLREDUCE)
        return braid_allreduce_mulsum(pg, send, recv, count, t, scalar, NULL, work);
    if (k == REDUCE)
        return braid_reduce_mulsum(pg, send, recv, count, t, scalar, root, NULL, work);
    return braid_reduce_scatter_mulsum(pg, send, recv, count, t, scalar, NULL, work);
}

/* One call, then the output, what lies past it and the input checked. */
static int check_one(braid_pg *pg, kind k, braid_dtype t, size_t count, int in_place, uint32_t seed)
{
    int rank = braid_pg_rank(pg), n = braid_pg_size(pg), root = (int)(seed % (uint32_t)n);
    size_t es = braid_dtype_size(t), total = k == REDUCE_SCATTER ? count * (size_t)n : count;
    unsigned char *send = malloc(total * es + 1), *recv = malloc(total * es + 1), *orig = malloc(total * es + 1);
    unsigned char scalar[8];
    if (!send || !recv || !orig)
        HARNESS_FAIL("rank %d: out of memory", rank);
    for (size_t i = 0; i < total; i++)
        store(t, send, i, rank, seed);
    memcpy(orig, send, total * es);
    memset(recv, 0xA5, total * es + 1);
    scalar_of(t, rank, scalar);
    size_t first = k == REDUCE_SCATTER ? (size_t)rank * count : 0; /* global index of out[0] */
    unsigned char *out = !in_place ? recv : send + first * es;
    if (call(pg, k, send, out, count, t, scalar, root, NULL) != BRAID_OK)
        HARNESS_FAIL("rank %d: %s(dtype %d, count %zu) failed: %s", rank, kind_names[k], t, count, braid_last_error());
    const char *how = in_place ? "in place" : "out of place";
    int has_result = k != REDUCE || rank == root;
    /* recv past the result (all of it on a reduce's non-root) stays as set. */
    for (size_t b = has_result ? count * es : 0; !in_place && b <= total * es; b++)
        if (recv[b] != 0xA5)
            HARNESS_FAIL("rank %d: %s count %zu wrote recv byte %zu, past its result", rank, kind_names[k], count, b);
    char why[160];
    for (size_t j = 0; has_result && j < count; j++)
        if (check_elem(t, n, first + j, seed, out + j * es, why, sizeof(why)))
            HARNESS_FAIL("rank %d of %d: %s dtype %d count %zu %s: element %zu is %s", rank, n, kind_names[k], t,
                         count, how, first + j, why);
    /* send is never written, except where it is the output. */
    for (size_t i = 0; i < total; i++) {
        int is_out = in_place && has_result && i >= first && i < first + count;
        if (!is_out && memcmp(send + i * es, orig + i * es, es) != 0)
            HARNESS_FAIL("rank %d: %s %s wrote send element %zu", rank, kind_names[k], how, i);
    }
    free(send);
    free(recv);
    free(orig);
    return 0;
}

static int matrix_body(braid_pg *pg, void *arg)
{
    (void)arg;
    uint32_t seed = 5;
    for (int k = ALLREDUCE; k <= REDUCE_SCATTER; k++)
        for (size_t d = 0; d < sizeof(dtypes) / sizeof(dtypes[0]); d++)
            for (size_t c = 0; c < sizeof(counts) / sizeof(counts[0]); c++)
                for (int in_place = 0; in_place < 2; in_place++)
                    if (check_one(pg, (kind)k, dtypes[d], counts[c], in_place, seed++))
                        return 1;
    return 0;
}

/* The scalar is read at the call: changed before the collective runs
 * (queued behind a large all-reduce, or recorded in a group), the value
 * at the call still counts. Result: sum_r (r + 2) * 3 = 3 * (n(n-1)/2 + 2n). */
static int scalar_at_call_body(braid_pg *pg, void *arg)
{
    (void)arg;
    enum { BIG = 1 << 22 };
    int rank = braid_pg_rank(pg), n = braid_pg_size(pg);
    int64_t want = 3 * ((int64_t)n * (n - 1) / 2 + 2 * n);
    static int32_t big[BIG];
    for (int late = 0; late < 2; late++) {
        int64_t x[3] = {3, 3, 3}, s = rank + 2;
        braid_work *w[2] = {NULL, NULL};
        if (late) {
            if (braid_group_start(pg) != BRAID_OK)
                HARNESS_FAIL("rank %d: group_start: %s", rank, braid_last_error());
        } else if (braid_allreduce(pg, big, big, BIG, BRAID_I32, BRAID_SUM, NULL, &w[0]) != BRAID_OK) {
            HARNESS_FAIL("rank %d: allreduce: %s", rank, braid_last_error());
        }
        if (braid_allreduce_mulsum(pg, x, x, 3, BRAID_I64, &s, NULL, late ? NULL : &w[1]) != BRAID_OK)
            HARNESS_FAIL("rank %d: allreduce_mulsum: %s", rank, braid_last_error());
        s = -1000;
        if (late && braid_group_end(pg, NULL) != BRAID_OK)
            HARNESS_FAIL("rank %d: group_end: %s", rank, braid_last_error());
        for (int i = 0; i < 2; i++) {
            if (w[i] && braid_wait(w[i], -1) != BRAID_OK)
                HARNESS_FAIL("rank %d: wait: %s", rank, braid_last_error());
            braid_work_free(w[i]);
        }
        for (int i = 0; i < 3; i++)
            if (x[i] != want)
                HARNESS_FAIL("rank %d of %d: %s: element %d is %" PRId64 ", want %" PRId64, rank, n,
                             late ? "in a group" : "queued", i, x[i], want);
    }
    return 0;
}

static const int rank_counts[] = {1, 2, 3, 4};

static void run_or_fail(int n, harness_rank_fn fn, braid_algo algo)
{
    braid_config cfg = BRAID_CONFIG_INIT;
    cfg.algo = algo;
    cfg.timeout_ms = 60000;
    harness_result res;
    int failed = harness_run(n, fn, NULL, &cfg, 120, &res);
    ck_assert_msg(failed == 0, "%d of %d ranks failed (algo %d, rank 0 exit %d)", failed, n, algo, res.exit_code[0]);
}

START_TEST(test_matrix)
{
    static const braid_algo algos[] = {BRAID_ALGO_AUTO, BRAID_ALGO_RING, BRAID_ALGO_RECURSIVE_DOUBLING};
    run_or_fail(rank_counts[_i % 4], matrix_body, algos[_i / 4]);
}
END_TEST

START_TEST(test_scalar_at_call)
{
    run_or_fail(rank_counts[_i], scalar_at_call_body, BRAID_ALGO_AUTO);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("mulsum");
    TCase *tc = tcase_create("results");
    tcase_set_timeout(tc, 300);
    tcase_add_loop_test(tc, test_matrix, 0, 12);
    tcase_add_loop_test(tc, test_scalar_at_call, 0, 4);
    suite_add_tcase(s, tc);
    SRunner *sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? 1 : 0;
}
