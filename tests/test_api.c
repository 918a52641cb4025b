/* Argument validation and status reporting of the public API, and the
 * deadlines of braid_wait on a work handle that cannot complete. */
#include <check.h>
#include <stdint.h>
#include <stdlib.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "braid.h"
#include "harness.h"

START_TEST(test_status_strings)
{
    ck_assert_str_eq(braid_status_string(BRAID_OK), "BRAID_OK");
    ck_assert_str_eq(braid_status_string(BRAID_ERR_PEER), "BRAID_ERR_PEER");
    ck_assert_str_eq(braid_status_string((braid_status)999), "BRAID_ERR_UNKNOWN");
    for (int s = 0; s < BRAID_STATUS_COUNT; s++)
        ck_assert_ptr_nonnull(strstr(braid_status_string((braid_status)s), "BRAID_"));
}
END_TEST

START_TEST(test_dtype_sizes)
{
    ck_assert_uint_eq(braid_dtype_size(BRAID_F32), 4);
    ck_assert_uint_eq(braid_dtype_size(BRAID_F64), 8);
    ck_assert_uint_eq(braid_dtype_size(BRAID_F16), 2);
    ck_assert_uint_eq(braid_dtype_size(BRAID_BF16), 2);
    ck_assert_uint_eq(braid_dtype_size(BRAID_I8), 1);
    ck_assert_uint_eq(braid_dtype_size(BRAID_U8), 1);
    ck_assert_uint_eq(braid_dtype_size(BRAID_I32), 4);
    ck_assert_uint_eq(braid_dtype_size(BRAID_I64), 8);
    ck_assert_uint_eq(braid_dtype_size((braid_dtype)42), 0);
}
END_TEST

START_TEST(test_init_args)
{
    braid_unique_id_t id;
    braid_pg *pg = (braid_pg *)0x1;
    ck_assert_int_eq(braid_unique_id(NULL), BRAID_ERR_INVALID_ARG);
    ck_assert_int_eq(braid_unique_id(&id), BRAID_OK);
    ck_assert_int_eq(braid_pg_init(NULL, 0, 1, &id, NULL), BRAID_ERR_INVALID_ARG);
    ck_assert_int_eq(braid_pg_init(&pg, 0, 1, NULL, NULL), BRAID_ERR_INVALID_ARG);
    ck_assert_int_eq(braid_pg_init(&pg, 1, 1, &id, NULL), BRAID_ERR_INVALID_ARG);
    ck_assert_ptr_nonnull(strstr(braid_last_error(), "rank 1 / size 1"));
    ck_assert_int_eq(braid_pg_init(&pg, -1, 4, &id, NULL), BRAID_ERR_INVALID_ARG);
    ck_assert_int_eq(braid_pg_init(&pg, 0, 0, &id, NULL), BRAID_ERR_INVALID_ARG);
    ck_assert_ptr_eq(pg, (braid_pg *)0x1); /* outputs untouched on failure */

    braid_unique_id_t garbage;
    memset(&garbage, 0x41, sizeof(garbage));
    ck_assert_int_eq(braid_pg_init(&pg, 0, 1, &garbage, NULL), BRAID_ERR_INVALID_ARG);
    ck_assert_ptr_nonnull(strstr(braid_last_error(), "unique id"));

    braid_config bad = BRAID_CONFIG_INIT;
    bad.size = 3;
    ck_assert_int_eq(braid_pg_init(&pg, 0, 1, &id, &bad), BRAID_ERR_INVALID_ARG);
    braid_config badsocks = BRAID_CONFIG_INIT;
    badsocks.nsocks = 1000;
    ck_assert_int_eq(braid_pg_init(&pg, 0, 1, &id, &badsocks), BRAID_ERR_INVALID_ARG);
    ck_assert_ptr_nonnull(strstr(braid_last_error(), "nsocks"));
}
END_TEST

START_TEST(test_env_init_errors)
{
    unsetenv("RANK");
    unsetenv("WORLD_SIZE");
    unsetenv("OMPI_COMM_WORLD_RANK");
    unsetenv("OMPI_COMM_WORLD_SIZE");
    unsetenv("PMI_RANK");
    unsetenv("PMI_SIZE");
    unsetenv("SLURM_PROCID");
    unsetenv("SLURM_NTASKS");
    braid_pg *pg;
    ck_assert_int_eq(braid_pg_init_env(&pg, NULL), BRAID_ERR_INVALID_ARG);
    ck_assert_ptr_nonnull(strstr(braid_last_error(), "torchrun"));
    setenv("RANK", "4", 1);
    setenv("WORLD_SIZE", "4", 1);
    ck_assert_int_eq(braid_pg_init_env(&pg, NULL), BRAID_ERR_INVALID_ARG);
    ck_assert_ptr_nonnull(strstr(braid_last_error(), "RANK=4"));
    setenv("RANK", "0", 1);
    unsetenv("MASTER_ADDR");
    ck_assert_int_eq(braid_pg_init_env(&pg, NULL), BRAID_ERR_INVALID_ARG);
    ck_assert_ptr_nonnull(strstr(braid_last_error(), "MASTER_ADDR"));
    setenv("MASTER_ADDR", "127.0.0.1", 1);
    setenv("BRAID_JOB_SECRET", "xyz", 1);
    ck_assert_int_eq(braid_pg_init_env(&pg, NULL), BRAID_ERR_INVALID_ARG);
    ck_assert_ptr_nonnull(strstr(braid_last_error(), "BRAID_JOB_SECRET"));
}
END_TEST

/* A group of one through the environment path, and every collective
 * argument check on a live group. */
START_TEST(test_collective_args)
{
    setenv("RANK", "0", 1);
    setenv("WORLD_SIZE", "1", 1);
    setenv("MASTER_ADDR", "127.0.0.1", 1);
    setenv("MASTER_PORT", "0", 1);
    unsetenv("BRAID_JOB_SECRET");
    braid_unique_id_t id;
    ck_assert_int_eq(braid_unique_id(&id), BRAID_OK);
    braid_pg *pg;
    ck_assert_int_eq(braid_pg_init(&pg, 0, 1, &id, NULL), BRAID_OK);
    ck_assert_int_eq(braid_pg_rank(pg), 0);
    ck_assert_int_eq(braid_pg_size(pg), 1);
    float a[8] = {1, 2, 3, 4, 5, 6, 7, 8}, b[8];
    ck_assert_int_eq(braid_allreduce(NULL, a, b, 8, BRAID_F32, BRAID_SUM, NULL, NULL), BRAID_ERR_INVALID_ARG);
    ck_assert_int_eq(braid_allreduce(pg, NULL, b, 8, BRAID_F32, BRAID_SUM, NULL, NULL), BRAID_ERR_INVALID_ARG);
    ck_assert_int_eq(braid_allreduce(pg, a, NULL, 8, BRAID_F32, BRAID_SUM, NULL, NULL), BRAID_ERR_INVALID_ARG);
    ck_assert_int_eq(braid_allreduce(pg, a, b, 8, (braid_dtype)99, BRAID_SUM, NULL, NULL), BRAID_ERR_INVALID_ARG);
    ck_assert_ptr_nonnull(strstr(braid_last_error(), "dtype"));
    ck_assert_int_eq(braid_allreduce(pg, a, b, 8, BRAID_F32, (braid_op)99, NULL, NULL), BRAID_ERR_INVALID_ARG);
    ck_assert_ptr_nonnull(strstr(braid_last_error(), "op"));
    ck_assert_int_eq(braid_allreduce(pg, a, b, SIZE_MAX / 2, BRAID_F32, BRAID_SUM, NULL, NULL), BRAID_ERR_INVALID_ARG);
    ck_assert_ptr_nonnull(strstr(braid_last_error(), "overflow"));
    ck_assert_int_eq(braid_allreduce(pg, a, a + 1, 4, BRAID_F32, BRAID_SUM, NULL, NULL), BRAID_ERR_INVALID_ARG);
    ck_assert_int_eq(braid_broadcast(pg, a, 8, BRAID_F32, 1, NULL, NULL), BRAID_ERR_INVALID_ARG);
    ck_assert_ptr_nonnull(strstr(braid_last_error(), "root 1"));
    ck_assert_int_eq(braid_broadcast(pg, a, 8, BRAID_F32, -1, NULL, NULL), BRAID_ERR_INVALID_ARG);
    ck_assert_int_eq(braid_wait(NULL, 0), BRAID_ERR_INVALID_ARG);
    ck_assert_int_eq(braid_test(NULL, NULL), BRAID_ERR_INVALID_ARG);
    /* NULL buffers are fine with count 0. */
    ck_assert_int_eq(braid_allreduce(pg, NULL, NULL, 0, BRAID_F32, BRAID_SUM, NULL, NULL), BRAID_OK);

    /* The group still works after rejected calls: size-1 AVG is identity. */
    ck_assert_int_eq(braid_allreduce(pg, a, b, 8, BRAID_F32, BRAID_AVG, NULL, NULL), BRAID_OK);
    ck_assert_mem_eq(a, b, sizeof(a));
    braid_work *w;
    ck_assert_int_eq(braid_allreduce(pg, a, a, 8, BRAID_F32, BRAID_SUM, NULL, &w), BRAID_OK);
    ck_assert_int_eq(braid_wait(w, 10000), BRAID_OK);
    braid_work_free(w);
    ck_assert_float_eq(a[7], 8.0f);
    ck_assert_int_eq(braid_pg_error(pg), BRAID_OK);

    /* After abort every call fails with ABORTED. */
    ck_assert_int_eq(braid_pg_abort(pg), BRAID_OK);
    ck_assert_int_eq(braid_allreduce(pg, a, b, 8, BRAID_F32, BRAID_SUM, NULL, NULL), BRAID_ERR_ABORTED);
    ck_assert_int_eq(braid_pg_error(pg), BRAID_ERR_ABORTED);
    ck_assert_int_eq(braid_pg_destroy(pg), BRAID_OK);
}
END_TEST

/* ---- work handles: deadlines ---------------------------------------- */

#define WAIT_GROUP_TIMEOUT_MS 1500
/* Scheduling slack on a loaded 2-core box; braid_wait(-1) itself allows
 * the collective 1000 ms of grace after its own deadline. */
#define WAIT_SLACK_MS 700

static double ms_since(const struct timespec *t0)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)(t.tv_sec - t0->tv_sec) * 1e3 + (double)(t.tv_nsec - t0->tv_nsec) / 1e6;
}

/* Rank 1 is alive but never joins the all-reduce, so rank 0's can never
 * complete. Explicit waits time out after their own timeout, counted from
 * each call; the default wait (-1) ends with BRAID_ERR_TIMEOUT within the
 * group timeout of the collective's start, however many waits came before
 * it (they must not re-arm its deadline). */
static int never_joined_body(braid_pg *pg, void *arg)
{
    (void)arg;
    int rank = braid_pg_rank(pg);
    if (rank == 1) {
        /* Keep the connection open until rank 0 has given up. */
        struct timespec ts = {.tv_sec = (WAIT_GROUP_TIMEOUT_MS + 2 * WAIT_SLACK_MS + 1000) / 1000 + 1};
        nanosleep(&ts, NULL);
        return 0;
    }
    float buf[64] = {0};
    braid_work *w;
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    if (braid_allreduce(pg, buf, buf, 64, BRAID_F32, BRAID_SUM, NULL, &w) != BRAID_OK)
        HARNESS_FAIL("rank 0: allreduce: %s", braid_last_error());
    int done = -1;
    if (braid_test(w, &done) != BRAID_OK || done)
        HARNESS_FAIL("rank 0: braid_test says the lonely all-reduce is done (%d): %s", done, braid_last_error());
    for (int i = 0; i < 2; i++) {
        clock_gettime(CLOCK_MONOTONIC, &t1);
        braid_status st = braid_wait(w, 300);
        double ms = ms_since(&t1);
        if (st != BRAID_ERR_TIMEOUT)
            HARNESS_FAIL("rank 0: braid_wait(300) #%d gave %s '%s', want BRAID_ERR_TIMEOUT", i,
                         braid_status_string(st), braid_last_error());
        if (ms < 295 || ms > 300 + WAIT_SLACK_MS)
            HARNESS_FAIL("rank 0: braid_wait(300) #%d returned after %.0f ms", i, ms);
        if (!strstr(braid_last_error(), "not done after 300 ms"))
            HARNESS_FAIL("rank 0: braid_wait(300) message '%s'", braid_last_error());
    }
    braid_status st = braid_wait(w, -1);
    double total = ms_since(&t0);
    fprintf(stderr, "never joined: braid_wait(-1) -> %s after %.0f ms in all: %s\n", braid_status_string(st), total,
            braid_last_error());
    if (st != BRAID_ERR_TIMEOUT)
        HARNESS_FAIL("rank 0: braid_wait(-1) gave %s '%s', want BRAID_ERR_TIMEOUT", braid_status_string(st),
                     braid_last_error());
    if (total > WAIT_GROUP_TIMEOUT_MS + 1000 + WAIT_SLACK_MS)
        HARNESS_FAIL("rank 0: braid_wait(-1) returned %.0f ms after the all-reduce was issued (group timeout %d ms)",
                     total, WAIT_GROUP_TIMEOUT_MS);
    if (total < WAIT_GROUP_TIMEOUT_MS - 50)
        HARNESS_FAIL("rank 0: braid_wait(-1) gave up after %.0f ms, before the group timeout of %d ms", total,
                     WAIT_GROUP_TIMEOUT_MS);
    /* Done now: further waits return the same result at once. */
    clock_gettime(CLOCK_MONOTONIC, &t1);
    if (braid_wait(w, 0) != BRAID_ERR_TIMEOUT || braid_test(w, &done) != BRAID_ERR_TIMEOUT || !done ||
        ms_since(&t1) > 100)
        HARNESS_FAIL("rank 0: the finished handle does not report its timeout at once");
    braid_work_free(w);
    return 0;
}

START_TEST(test_wait_never_joined)
{
    braid_config cfg = BRAID_CONFIG_INIT;
    cfg.timeout_ms = WAIT_GROUP_TIMEOUT_MS;
    harness_result res;
    int failed = harness_run(2, never_joined_body, NULL, &cfg, 30, &res);
    ck_assert_msg(failed == 0, "%d ranks failed (exit codes %d %d)", failed, res.exit_code[0], res.exit_code[1]);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("api");
    TCase *tc = tcase_create("args");
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, test_status_strings);
    tcase_add_test(tc, test_dtype_sizes);
    tcase_add_test(tc, test_init_args);
    tcase_add_test(tc, test_env_init_errors);
    tcase_add_test(tc, test_collective_args);
    suite_add_tcase(s, tc);
    TCase *work = tcase_create("work");
    tcase_set_timeout(work, 60);
    tcase_add_test(work, test_wait_never_joined);
    suite_add_tcase(s, work);
    SRunner *sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? 1 : 0;
}
