/* The *_mulsum calls refused or mismatched, on forked ranks:
 *  - a NULL scalar, and op BRAID_MULSUM given to the plain calls (which
 *    have no scalar), are BRAID_ERR_INVALID_ARG naming the cause;
 *  - one rank's NULL scalar is refused to its peers too: their matching
 *    call fails at once naming that rank (src/calls/refuse.h), not at the
 *    timeout;
 *  - a rank calling a plain SUM while its peers call a *_mulsum function
 *    never gives a result: every rank fails fast, with BRAID_ERR_MISMATCH
 *    where it saw the other call's header and BRAID_ERR_PEER where it only
 *    saw the failing rank leave (a reduce's non-roots, which only send and
 *    get no result, may finish). */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "harness.h"

#define TIMEOUT_MS 20000
#define FAST_S 10.0 /* a failure well before the collective timeout */
#define EXIT_PEER 3 /* rank body: failed with BRAID_ERR_PEER as allowed */
#define EXIT_SENT 4 /* rank body: a reduce's non-root finished its part */

typedef enum { ALLREDUCE, REDUCE, REDUCE_SCATTER } kind;
static const char *const kind_names[] = {"allreduce", "reduce", "reduce_scatter"};

/* Rank `rank`'s call of kind: *_mulsum with scalar (NULL allowed), or with
 * plain set the plain call with op. */
static braid_status call(braid_pg *pg, kind k, int plain, braid_op op, const void *scalar, int32_t *buf)
{
    enum { C = 1000 };
    int n = braid_pg_size(pg);
    if (k == ALLREDUCE)
        return plain ? braid_allreduce(pg, buf, buf, C, BRAID_I32, op, NULL, NULL)
                     : braid_allreduce_mulsum(pg, buf, buf, C, BRAID_I32, scalar, NULL, NULL);
    if (k == REDUCE)
        return plain ? braid_reduce(pg, buf, buf, C, BRAID_I32, op, n - 1, NULL, NULL)
                     : braid_reduce_mulsum(pg, buf, buf, C, BRAID_I32, scalar, n - 1, NULL, NULL);
    return plain ? braid_reduce_scatter(pg, buf, buf + braid_pg_rank(pg) * C, C, BRAID_I32, op, NULL, NULL)
                 : braid_reduce_scatter_mulsum(pg, buf, buf + braid_pg_rank(pg) * C, C, BRAID_I32, scalar, NULL, NULL);
}

typedef struct {
    kind k;
    int plain; /* every rank: the plain call with op MULSUM */
    int odd;   /* rank 1 only: NULL scalar (refusal) or the plain SUM (mismatch) */
} case_arg;

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* Every rank makes the same bad call. */
static int invalid_body(braid_pg *pg, void *arg)
{
    const case_arg *a = arg;
    int rank = braid_pg_rank(pg);
    static int32_t buf[4 * 1000];
    braid_status st = call(pg, a->k, a->plain, BRAID_MULSUM, NULL, buf);
    const char *want = a->plain ? "_mulsum instead" : "scalar is NULL";
    if (st != BRAID_ERR_INVALID_ARG || !strstr(braid_last_error(), want))
        HARNESS_FAIL("rank %d: %s%s with no scalar: %s (%s), want BRAID_ERR_INVALID_ARG saying \"%s\"", rank,
                     kind_names[a->k], a->plain ? "(op MULSUM)" : "_mulsum", braid_status_string(st),
                     braid_last_error(), want);
    return 0;
}

/* Rank 1 passes a NULL scalar, the others a good one. */
static int one_null_body(braid_pg *pg, void *arg)
{
    const case_arg *a = arg;
    int rank = braid_pg_rank(pg);
    int32_t s = 2;
    static int32_t buf[4 * 1000];
    double t0 = now_s();
    braid_status st = call(pg, a->k, 0, BRAID_MULSUM, rank == 1 ? NULL : &s, buf);
    double dt = now_s() - t0;
    if (rank == 1 && st != BRAID_ERR_INVALID_ARG)
        HARNESS_FAIL("rank 1: %s_mulsum with a NULL scalar returned %s", kind_names[a->k], braid_status_string(st));
    /* A reduce's chain head only sends, and may finish before rank 1 leaves. */
    int may_finish = a->k == REDUCE && rank == 0 && st == BRAID_OK;
    if (rank != 1 && !may_finish && (st != BRAID_ERR_PEER || !strstr(braid_last_error(), "rank 1 refused")))
        HARNESS_FAIL("rank %d: %s_mulsum against rank 1's refused call: %s after %.1f s (%s), want BRAID_ERR_PEER "
                     "naming rank 1",
                     rank, kind_names[a->k], braid_status_string(st), dt, braid_last_error());
    if (dt > FAST_S)
        HARNESS_FAIL("rank %d: the refused call took %.1f s to fail", rank, dt);
    return 0;
}

/* Rank 1 calls the plain collective with SUM, the others the *_mulsum one. */
static int mismatch_body(braid_pg *pg, void *arg)
{
    const case_arg *a = arg;
    int rank = braid_pg_rank(pg);
    int32_t s = 2;
    static int32_t buf[4 * 1000];
    braid_status st = call(pg, a->k, rank == 1, BRAID_SUM, &s, buf);
    if (st == BRAID_ERR_MISMATCH && strstr(braid_last_error(), "mulsum"))
        return 0;
    if (st == BRAID_ERR_PEER)
        return EXIT_PEER;
    if (st == BRAID_OK && a->k == REDUCE && rank != braid_pg_size(pg) - 1)
        return EXIT_SENT; /* a non-root only sends: no result to be wrong */
    HARNESS_FAIL("rank %d: %s, mulsum against sum: %s (%s), want BRAID_ERR_MISMATCH naming mulsum or "
                 "BRAID_ERR_PEER",
                 rank, kind_names[a->k], braid_status_string(st), braid_last_error());
}

static harness_result run(int n, harness_rank_fn fn, const case_arg *a)
{
    braid_config cfg = BRAID_CONFIG_INIT;
    cfg.timeout_ms = TIMEOUT_MS;
    harness_result res;
    harness_run(n, fn, (void *)a, &cfg, 60, &res);
    return res;
}

/* _i: kind (3) x plain (2) x 1 or 2 ranks. */
START_TEST(test_invalid)
{
    case_arg a = {.k = (kind)(_i % 3), .plain = _i / 3 % 2};
    int n = 1 + _i / 6;
    harness_result res = run(n, invalid_body, &a);
    for (int r = 0; r < n; r++)
        ck_assert_msg(res.exit_code[r] == 0, "%s: rank %d of %d exit %d", kind_names[a.k], r, n, res.exit_code[r]);
}
END_TEST

START_TEST(test_one_null)
{
    case_arg a = {.k = (kind)_i};
    harness_result res = run(3, one_null_body, &a);
    for (int r = 0; r < 3; r++)
        ck_assert_msg(res.exit_code[r] == 0, "%s: rank %d exit %d", kind_names[a.k], r, res.exit_code[r]);
}
END_TEST

/* _i: kind (3) x 2 or 3 ranks. */
START_TEST(test_mismatch)
{
    case_arg a = {.k = (kind)(_i % 3)};
    int n = 2 + _i / 3, mismatches = 0;
    harness_result res = run(n, mismatch_body, &a);
    for (int r = 0; r < n; r++) {
        int code = res.exit_code[r];
        ck_assert_msg(code == 0 || code == EXIT_PEER || (code == EXIT_SENT && a.k == REDUCE && r != n - 1),
                      "%s: rank %d of %d exit %d", kind_names[a.k], r, n, code);
        mismatches += res.exit_code[r] == 0;
    }
    ck_assert_msg(mismatches > 0, "%s on %d ranks: no rank reported BRAID_ERR_MISMATCH", kind_names[a.k], n);
    ck_assert_msg(res.seconds < FAST_S, "%s on %d ranks: took %.1f s", kind_names[a.k], n, res.seconds);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("mulsum_errors");
    TCase *tc = tcase_create("errors");
    tcase_set_timeout(tc, 120);
    tcase_add_loop_test(tc, test_invalid, 0, 12);
    tcase_add_loop_test(tc, test_one_null, 0, 3);
    tcase_add_loop_test(tc, test_mismatch, 0, 6);
    suite_add_tcase(s, tc);
    SRunner *sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? 1 : 0;
}
