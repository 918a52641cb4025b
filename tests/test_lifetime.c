/* What braid.h promises about lifetimes and threads: a destroyed group's
 * handle is refused (BRAID_ERR_INVALID_ARG, never a use after free: run it
 * under ASan), destroying twice is refused, work handles outlive their
 * group, configuration values out of range are refused, the read-only
 * queries and braid_last_error may run on any thread while another thread
 * runs collectives on the same group. */
#include <check.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "braid.h"
#include "harness.h"

static braid_pg *one_rank_group(void)
{
    braid_unique_id_t id;
    ck_assert_int_eq(braid_unique_id(&id), BRAID_OK);
    braid_pg *pg;
    ck_assert_int_eq(braid_pg_init(&pg, 0, 1, &id, NULL), BRAID_OK);
    return pg;
}

static void assert_destroyed_error(braid_status st, const char *call)
{
    ck_assert_msg(st == BRAID_ERR_INVALID_ARG, "%s on a destroyed group returned %s", call,
                  braid_status_string(st));
    ck_assert_msg(strstr(braid_last_error(), "destroyed"), "%s: error text \"%s\" does not say destroyed", call,
                  braid_last_error());
}

START_TEST(test_use_after_destroy)
{
    braid_pg *pg = one_rank_group();
    float a[4] = {1, 2, 3, 4}, b[4];
    ck_assert_int_eq(braid_allreduce(pg, a, b, 4, BRAID_F32, BRAID_SUM, NULL, NULL), BRAID_OK);
    ck_assert_int_eq(braid_pg_destroy(pg), BRAID_OK);

    /* Every entry point that takes the stale handle refuses it. */
    assert_destroyed_error(braid_pg_destroy(pg), "braid_pg_destroy (twice)");
    assert_destroyed_error(braid_allreduce(pg, a, b, 4, BRAID_F32, BRAID_SUM, NULL, NULL), "braid_allreduce");
    assert_destroyed_error(braid_broadcast(pg, a, 4, BRAID_F32, 0, NULL, NULL), "braid_broadcast");
    assert_destroyed_error(braid_reduce(pg, a, b, 4, BRAID_F32, BRAID_SUM, 0, NULL, NULL), "braid_reduce");
    assert_destroyed_error(braid_allgather(pg, a, b, 1, BRAID_F32, NULL, NULL), "braid_allgather");
    assert_destroyed_error(braid_reduce_scatter(pg, a, b, 1, BRAID_F32, BRAID_SUM, NULL, NULL),
                           "braid_reduce_scatter");
    assert_destroyed_error(braid_send(pg, a, 4, BRAID_F32, 0, NULL, NULL), "braid_send");
    assert_destroyed_error(braid_recv(pg, b, 4, BRAID_F32, 0, NULL, NULL), "braid_recv");
    assert_destroyed_error(braid_group_start(pg), "braid_group_start");
    assert_destroyed_error(braid_group_end(pg, NULL), "braid_group_end");
    assert_destroyed_error(braid_pg_error(pg), "braid_pg_error");
    braid_pg *shrunk = NULL;
    assert_destroyed_error(braid_pg_shrink(pg, 1000, &shrunk), "braid_pg_shrink");
    ck_assert_ptr_null(shrunk);
    braid_bucketer *bk;
    assert_destroyed_error(braid_bucketer_create(&bk, pg, 0, 0), "braid_bucketer_create");
    ck_assert_int_eq(braid_pg_abort(pg), BRAID_ERR_INVALID_ARG); /* signal-safe: no text */
    ck_assert_int_eq(braid_pg_rank(pg), -1);
    ck_assert_int_eq(braid_pg_size(pg), -1);
    ck_assert_int_eq(braid_pg_local_rank(pg), -1);
    ck_assert_int_eq(braid_pg_local_size(pg), -1);

    /* Groups made afterwards are unaffected. */
    braid_pg *again = one_rank_group();
    ck_assert_ptr_ne(again, pg); /* the destroyed struct is kept, never reused */
    ck_assert_int_eq(braid_allreduce(again, a, b, 4, BRAID_F32, BRAID_SUM, NULL, NULL), BRAID_OK);
    ck_assert_mem_eq(a, b, sizeof(a));
    ck_assert_int_eq(braid_pg_destroy(again), BRAID_OK);
    ck_assert_int_eq(braid_pg_destroy(NULL), BRAID_OK);
}
END_TEST

/* Two threads destroy the same group at once: exactly one succeeds. */
static void *destroy_thread(void *arg)
{
    return (void *)(intptr_t)braid_pg_destroy(arg);
}

START_TEST(test_destroy_race)
{
    for (int i = 0; i < 20; i++) {
        braid_pg *pg = one_rank_group();
        pthread_t t;
        ck_assert_int_eq(pthread_create(&t, NULL, destroy_thread, pg), 0);
        braid_status mine = braid_pg_destroy(pg);
        void *theirs;
        pthread_join(t, &theirs);
        int ok = (mine == BRAID_OK) + ((braid_status)(intptr_t)theirs == BRAID_OK);
        int refused = (mine == BRAID_ERR_INVALID_ARG) + ((braid_status)(intptr_t)theirs == BRAID_ERR_INVALID_ARG);
        ck_assert_msg(ok == 1 && refused == 1, "round %d: destroy returned %s and %s", i,
                      braid_status_string(mine), braid_status_string((braid_status)(intptr_t)theirs));
    }
}
END_TEST

/* Out-of-range configuration fields are refused, not taken as defaults. */
START_TEST(test_config_ranges)
{
    braid_unique_id_t id;
    ck_assert_int_eq(braid_unique_id(&id), BRAID_OK);
    braid_pg *pg = (braid_pg *)0x1;
    struct {
        const char *field;
        braid_config cfg;
    } bad[] = {
        {"timeout_ms", BRAID_CONFIG_INIT},
        {"nsocks", BRAID_CONFIG_INIT},
        {"nsocks", BRAID_CONFIG_INIT},
        {"checksum", BRAID_CONFIG_INIT},
        {"algo", BRAID_CONFIG_INIT},
    };
    bad[0].cfg.timeout_ms = -5;
    bad[1].cfg.nsocks = -1;
    bad[2].cfg.nsocks = 17;
    bad[3].cfg.checksum = 2;
    bad[4].cfg.algo = (braid_algo)-1;
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        ck_assert_int_eq(braid_pg_init(&pg, 0, 1, &id, &bad[i].cfg), BRAID_ERR_INVALID_ARG);
        ck_assert_msg(strstr(braid_last_error(), bad[i].field), "case %zu: \"%s\" does not name %s", i,
                      braid_last_error(), bad[i].field);
    }
    ck_assert_ptr_eq(pg, (braid_pg *)0x1);
}
END_TEST

/* A work handle stays valid after its group is destroyed: its wait
 * returns the final status (the pending all-reduce is aborted, or failed
 * by the peer leaving first), then it is freed. */
static int work_outlives_body(braid_pg *pg, void *arg)
{
    (void)arg;
    if (braid_pg_rank(pg) == 1)
        return 0; /* never joins the all-reduce; the harness destroys its group */
    static float buf[1024];
    braid_work *w;
    if (braid_allreduce(pg, buf, buf, 1024, BRAID_F32, BRAID_SUM, NULL, &w) != BRAID_OK)
        HARNESS_FAIL("rank 0: allreduce: %s", braid_last_error());
    usleep(50000);
    if (braid_pg_destroy(pg) != BRAID_OK)
        HARNESS_FAIL("rank 0: destroy: %s", braid_last_error());
    braid_status st = braid_wait(w, 10000);
    if (st != BRAID_ERR_ABORTED && st != BRAID_ERR_PEER)
        HARNESS_FAIL("rank 0: wait after destroy returned %s: %s", braid_status_string(st), braid_last_error());
    int done = 0;
    if (braid_test(w, &done) != st || !done)
        HARNESS_FAIL("rank 0: test after destroy disagrees with wait");
    braid_work_free(w);
    return 0;
}

START_TEST(test_work_outlives_group)
{
    braid_config cfg = BRAID_CONFIG_INIT;
    cfg.timeout_ms = 20000;
    harness_result res;
    /* The harness destroys rank 0's group again after the body: refused. */
    int failed = harness_run(2, work_outlives_body, NULL, &cfg, 60, &res);
    ck_assert_msg(failed == 0, "%d ranks failed (exit codes %d %d)", failed, res.exit_code[0], res.exit_code[1]);
}
END_TEST

/* Queries on other threads while collectives run: rank, size, error and
 * each thread's own braid_last_error. */
typedef struct {
    braid_pg *pg;
    atomic_int stop;
    int bad;
} query_arg;

static void *query_thread(void *argp)
{
    query_arg *q = argp;
    /* This thread's own error text is unaffected by the collectives. */
    braid_allreduce(NULL, NULL, NULL, 0, BRAID_F32, BRAID_SUM, NULL, NULL);
    char mine[256];
    snprintf(mine, sizeof(mine), "%s", braid_last_error());
    while (!atomic_load(&q->stop)) {
        if (braid_pg_size(q->pg) != 2 || braid_pg_rank(q->pg) < 0 || braid_pg_error(q->pg) != BRAID_OK ||
            strcmp(braid_last_error(), mine) != 0)
            q->bad++;
        sched_yield(); /* leave the CPU to the ranks on a small machine */
    }
    return NULL;
}

static int queries_body(braid_pg *pg, void *arg)
{
    (void)arg;
    query_arg q = {.pg = pg};
    atomic_init(&q.stop, 0);
    pthread_t t[2];
    for (int i = 0; i < 2; i++)
        if (pthread_create(&t[i], NULL, query_thread, &q) != 0)
            HARNESS_FAIL("rank %d: pthread_create", braid_pg_rank(pg));
    int rc = 0;
    for (int i = 0; i < 100 && rc == 0; i++)
        rc = harness_check_allreduce(pg, BRAID_F32, BRAID_SUM, 1000 + (size_t)i, i & 1, (uint32_t)i);
    atomic_store(&q.stop, 1);
    for (int i = 0; i < 2; i++)
        pthread_join(t[i], NULL);
    if (q.bad)
        HARNESS_FAIL("rank %d: %d wrong answers from queries on other threads", braid_pg_rank(pg), q.bad);
    return rc;
}

START_TEST(test_queries_from_threads)
{
    braid_config cfg = BRAID_CONFIG_INIT;
    cfg.timeout_ms = 60000;
    harness_result res;
    int failed = harness_run(2, queries_body, NULL, &cfg, 120, &res);
    ck_assert_msg(failed == 0, "%d ranks failed (exit codes %d %d)", failed, res.exit_code[0], res.exit_code[1]);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("lifetime");
    TCase *tc = tcase_create("lifetime");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, test_use_after_destroy);
    tcase_add_test(tc, test_destroy_race);
    tcase_add_test(tc, test_config_ranges);
    tcase_add_test(tc, test_work_outlives_group);
    tcase_add_test(tc, test_queries_from_threads);
    suite_add_tcase(s, tc);
    SRunner *sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? 1 : 0;
}
