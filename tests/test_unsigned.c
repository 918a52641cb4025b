/* BRAID_U32 and BRAID_U64 through all-reduce, reduce and reduce-scatter on
 * forked ranks, bit-exact against a reference in uint64_t arithmetic.
 * Inputs cover the whole range: the top value less the rank (SUM wraps
 * for two ranks or more), values just above half the range (the sign bit
 * of the signed type: MIN, MAX and AVG go wrong if anything treats them as
 * signed), small values, and random bits (PROD wraps). */
#include <check.h>
#include <inttypes.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"

static const braid_dtype dtypes[] = {BRAID_U32, BRAID_U64};
static const braid_op ops[] = {BRAID_SUM, BRAID_PROD, BRAID_MIN, BRAID_MAX, BRAID_AVG};
static const size_t counts[] = {0, 1, 7, 64, 1001, 65537};

static uint64_t mask_of(braid_dtype t)
{
    return t == BRAID_U32 ? UINT32_MAX : UINT64_MAX;
}

static uint64_t input(braid_dtype t, int rank, size_t i, uint32_t seed)
{
    uint64_t mask = mask_of(t), half = mask / 2 + 1;
    switch (i % 5) {
    case 0: return mask - (uint64_t)rank;
    case 1: return half + (uint64_t)rank * 3;
    case 2: return (uint64_t)rank + 1;
    default: {
        uint64_t x = (uint64_t)rank * 0x9E3779B97F4A7C15ull ^ (uint64_t)i * 0xBF58476D1CE4E5B9ull ^ seed;
        x ^= x >> 31;
        x *= 0x94D049BB133111EBull;
        return (x ^ x >> 29) & mask;
    }
    }
}

static uint64_t expected(braid_dtype t, braid_op op, int n, size_t i, uint32_t seed)
{
    uint64_t mask = mask_of(t), acc = input(t, 0, i, seed);
    for (int r = 1; r < n; r++) {
        uint64_t v = input(t, r, i, seed);
        switch (op) {
        case BRAID_SUM:
        case BRAID_AVG: acc = (acc + v) & mask; break;
        case BRAID_PROD: acc = (acc * v) & mask; break;
        case BRAID_MIN: acc = v < acc ? v : acc; break;
        case BRAID_MAX: acc = v > acc ? v : acc; break;
        default: abort();
        }
    }
    return op == BRAID_AVG ? acc / (uint64_t)n : acc; /* the wrapped sum, divided once */
}

static void put(braid_dtype t, void *buf, size_t i, uint64_t v)
{
    if (t == BRAID_U32)
        ((uint32_t *)buf)[i] = (uint32_t)v;
    else
        ((uint64_t *)buf)[i] = v;
}

static uint64_t get(braid_dtype t, const void *buf, size_t i)
{
    return t == BRAID_U32 ? ((const uint32_t *)buf)[i] : ((const uint64_t *)buf)[i];
}

typedef enum { ALLREDUCE, REDUCE, REDUCE_SCATTER } kind;
static const char *const kind_names[] = {"allreduce", "reduce", "reduce_scatter"};

/* One call of kind on this rank, then its output checked; the input is
 * `total` elements (reduce-scatter: one block of count per rank). */
static int check_one(braid_pg *pg, kind k, braid_dtype t, braid_op op, size_t count, int in_place, uint32_t seed)
{
    int rank = braid_pg_rank(pg), n = braid_pg_size(pg), root = (int)(seed % (uint32_t)n);
    size_t es = braid_dtype_size(t), total = k == REDUCE_SCATTER ? count * (size_t)n : count;
    unsigned char *send = malloc(total * es + 1), *recv = malloc(total * es + 1);
    if (!send || !recv)
        HARNESS_FAIL("rank %d: out of memory", rank);
    for (size_t i = 0; i < total; i++)
        put(t, send, i, input(t, rank, i, seed));
    memset(recv, 0xA5, total * es + 1);
    unsigned char *out = in_place ? send : recv;
    size_t first = 0; /* the global index of out[0] */
    braid_status st;
    if (k == ALLREDUCE) {
        st = braid_allreduce(pg, send, out, count, t, op, NULL, NULL);
    } else if (k == REDUCE) {
        st = braid_reduce(pg, send, out, count, t, op, root, NULL, NULL);
    } else {
        first = (size_t)rank * count;
        if (in_place)
            out = send + first * es;
        st = braid_reduce_scatter(pg, send, out, count, t, op, NULL, NULL);
    }
    if (st != BRAID_OK)
        HARNESS_FAIL("rank %d: %s(%s, op %d, count %zu) failed: %s", rank, kind_names[k], t == BRAID_U32 ? "u32" : "u64",
                     op, count, braid_last_error());
    if (!in_place && recv[(k == REDUCE_SCATTER ? count : total) * es] != 0xA5)
        HARNESS_FAIL("rank %d: %s wrote past the end of recv", rank, kind_names[k]);
    int has_result = k != REDUCE || rank == root;
    for (size_t j = 0; has_result && j < count; j++) {
        uint64_t want = expected(t, op, n, first + j, seed), got = get(t, out, j);
        if (got != want)
            HARNESS_FAIL("rank %d of %d: %s %s op %d count %zu %s: element %zu is %#" PRIx64 ", want %#" PRIx64,
                         rank, n, kind_names[k], t == BRAID_U32 ? "u32" : "u64", op, count,
                         in_place ? "in place" : "out of place", first + j, got, want);
    }
    free(send);
    free(recv);
    return 0;
}

static int matrix_body(braid_pg *pg, void *arg)
{
    (void)arg;
    uint32_t seed = 11;
    for (int k = ALLREDUCE; k <= REDUCE_SCATTER; k++)
        for (size_t d = 0; d < sizeof(dtypes) / sizeof(dtypes[0]); d++)
            for (size_t o = 0; o < sizeof(ops) / sizeof(ops[0]); o++)
                for (size_t c = 0; c < sizeof(counts) / sizeof(counts[0]); c++)
                    for (int in_place = 0; in_place < 2; in_place++)
                        if (check_one(pg, (kind)k, dtypes[d], ops[o], counts[c], in_place, seed++))
                            return 1;
    return 0;
}

static const int rank_counts[] = {1, 2, 3, 4};
static const braid_algo algos[] = {BRAID_ALGO_AUTO, BRAID_ALGO_RING, BRAID_ALGO_RECURSIVE_DOUBLING};

START_TEST(test_matrix)
{
    int n = rank_counts[_i % 4];
    braid_config cfg = BRAID_CONFIG_INIT;
    cfg.algo = algos[_i / 4];
    cfg.timeout_ms = 60000;
    harness_result res;
    int failed = harness_run(n, matrix_body, NULL, &cfg, 120, &res);
    ck_assert_msg(failed == 0, "%d of %d ranks failed (algo %d, rank 0 exit %d)", failed, n, cfg.algo,
                  res.exit_code[0]);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("unsigned");
    TCase *tc = tcase_create("matrix");
    tcase_set_timeout(tc, 300);
    tcase_add_loop_test(tc, test_matrix, 0, 12);
    suite_add_tcase(s, tc);
    SRunner *sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? 1 : 0;
}
