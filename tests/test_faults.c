/* Fault suites with real processes: a rank killed mid-collective, a rank
 * that stops answering, abort from another thread, mismatched calls and
 * stray connections. Each asserts the error seen and the time it took. */
#include <arpa/inet.h>
#include <check.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "clock.h"
#include "harness.h"
#include "pg.h"

#define FAULT_TIMEOUT_MS 4000

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* Kill trials per run: BRAID_FAULT_TRIALS, default 20. scripts/fault-soak
 * runs many more (it runs this test case, "kill", alone). */
static int kill_trials(void)
{
    const char *env = getenv("BRAID_FAULT_TRIALS");
    int trials = env ? atoi(env) : 20;
    return trials > 0 ? trials : 20;
}

START_TEST(test_kill_random_rank)
{
    /* A random rank of 4 dies at a random moment of an all-reduce loop.
     * Every trial runs even after one fails, so a soak reports how many
     * failed; BRAID_FAULT_SEED repeats a run's choices. */
    const char *seed_env = getenv("BRAID_FAULT_SEED");
    unsigned seed = seed_env ? (unsigned)strtoul(seed_env, NULL, 0) : (unsigned)time(NULL) ^ (unsigned)getpid();
    braid_config cfg = BRAID_CONFIG_INIT;
    cfg.timeout_ms = FAULT_TIMEOUT_MS;
    int trials = kill_trials(), failures = 0;
    double worst = 0, total = 0;
    printf("kill -9: seed %u\n", seed);
    for (int t = 0; t < trials; t++) {
        harness_fault f = {.rank = (int)(rand_r(&seed) % 4), .after_ms = 20 + (int)(rand_r(&seed) % 400)};
        harness_result res;
        int failed = harness_run_faulty(4, harness_until_failure, NULL, &cfg, 30, &f, &res);
        const char *why = NULL;
        if (failed != 0)
            why = "a surviving rank failed its checks (see above)";
        else if (res.exit_code[f.rank] != -SIGKILL)
            why = "the victim was not killed by SIGKILL";
        else if (res.fault_to_end_s >= FAULT_TIMEOUT_MS / 1000.0 + 1.0)
            why = "detection took longer than the timeout + 1 s"; /* closed sockets are seen at once */
        if (why) {
            failures++;
            printf("kill -9: trial %d (kill rank %d at %d ms) FAILED after %.3f s: %s\n", t, f.rank, f.after_ms,
                   res.fault_to_end_s, why);
            fflush(stdout);
        }
        total += res.fault_to_end_s;
        if (res.fault_to_end_s > worst)
            worst = res.fault_to_end_s;
    }
    printf("kill -9: %d trials, %d failed, worst detection %.3f s, mean %.3f s\n", trials, failures, worst,
           total / trials);
    fflush(stdout);
    ck_assert_msg(failures == 0, "%d of %d kill -9 trials failed", failures, trials);
}
END_TEST

START_TEST(test_stopped_rank_times_out)
{
    /* SIGSTOP keeps the sockets open: only the timeout can end the wait. */
    braid_config cfg = BRAID_CONFIG_INIT;
    cfg.timeout_ms = 1500;
    harness_fault f = {.rank = 2, .after_ms = 300, .signal = SIGSTOP};
    harness_result res;
    double t0 = now_s();
    /* The stopped rank is killed by the harness deadline; survivors pass. */
    int failed = harness_run_faulty(3, harness_until_failure, NULL, &cfg, 8, &f, &res);
    ck_assert_int_eq(res.exit_code[0], 0);
    ck_assert_int_eq(res.exit_code[1], 0);
    ck_assert_int_eq(failed, 1); /* the stopped rank, killed at the deadline */
    ck_assert_double_lt(now_s() - t0, 9.5);
}
END_TEST

static void *abort_later(void *arg)
{
    usleep(300 * 1000);
    braid_pg_abort(arg);
    return NULL;
}

/* Rank 0 waits for a collective rank 1 never joins; another thread aborts. */
static int abort_body(braid_pg *pg, void *arg)
{
    (void)arg;
    if (braid_pg_rank(pg) == 1) {
        usleep(1500 * 1000);
        return 0;
    }
    pthread_t t;
    pthread_create(&t, NULL, abort_later, pg);
    float x[1000];
    double t0 = now_s();
    braid_status st = braid_allreduce(pg, x, x, 1000, BRAID_F32, BRAID_SUM, NULL, NULL);
    double took = now_s() - t0;
    pthread_join(t, NULL);
    if (st != BRAID_ERR_ABORTED)
        HARNESS_FAIL("rank 0: got %s, want BRAID_ERR_ABORTED: %s", braid_status_string(st), braid_last_error());
    if (took > 1.0)
        HARNESS_FAIL("rank 0: abort took %.2f s", took);
    braid_work *w;
    if (braid_allreduce(pg, x, x, 1000, BRAID_F32, BRAID_SUM, NULL, &w) == BRAID_OK) {
        st = braid_wait(w, 1000);
        braid_work_free(w);
        if (st != BRAID_ERR_ABORTED)
            HARNESS_FAIL("rank 0: async call after abort: %s", braid_status_string(st));
    }
    return 0;
}

START_TEST(test_abort_wakes_waiter)
{
    braid_config cfg = BRAID_CONFIG_INIT;
    cfg.timeout_ms = 20000;
    int failed = harness_run(2, abort_body, NULL, &cfg, 20, NULL);
    ck_assert_int_eq(failed, 0);
}
END_TEST

/* Rank 1 calls with a different count: every rank must report the
 * mismatch showing both calls (the ranks that found it, and the others
 * from their notice), and nobody may hang or corrupt memory. */
static int mismatch_body(braid_pg *pg, void *arg)
{
    (void)arg;
    int rank = braid_pg_rank(pg);
    size_t count = rank == 1 ? 3000 : 5000;
    float *buf = calloc(6000, sizeof(float));
    int64_t t0 = braid__now_ms();
    braid_status st = braid_allreduce(pg, buf, buf, count, BRAID_F32, BRAID_SUM, NULL, NULL);
    printf("rank %d: mismatched all-reduce returned %s after %lld ms: %s\n", rank, braid_status_string(st),
           (long long)(braid__now_ms() - t0), braid_last_error());
    fflush(stdout); /* the rank leaves with _exit */
    free(buf);
    if (st == BRAID_OK)
        HARNESS_FAIL("rank %d: mismatched all-reduce succeeded", rank);
    if (st == BRAID_ERR_MISMATCH) {
        if (!strstr(braid_last_error(), "count=3000") || !strstr(braid_last_error(), "count=5000"))
            HARNESS_FAIL("rank %d: mismatch text lacks both calls: %s", rank, braid_last_error());
        return 0;
    }
    HARNESS_FAIL("rank %d: got %s, not the mismatch: %s", rank, braid_status_string(st), braid_last_error());
}

/* Rank 1 calls with another dtype and op: the text names both by name
 * (f32, sum), as a user writes them, not by enum number. */
static int mismatch_type_body(braid_pg *pg, void *arg)
{
    (void)arg;
    int rank = braid_pg_rank(pg);
    double *buf = calloc(1000, sizeof(double));
    braid_status st = rank == 1 ? braid_allreduce(pg, buf, buf, 1000, BRAID_F64, BRAID_MAX, NULL, NULL)
                                : braid_allreduce(pg, buf, buf, 1000, BRAID_F32, BRAID_SUM, NULL, NULL);
    free(buf);
    if (st == BRAID_OK)
        HARNESS_FAIL("rank %d: mismatched all-reduce succeeded", rank);
    if (st == BRAID_ERR_MISMATCH) {
        if (!strstr(braid_last_error(), "allreduce(count=1000, f32, sum)") ||
            !strstr(braid_last_error(), "allreduce(count=1000, f64, max)"))
            HARNESS_FAIL("rank %d: mismatch text lacks the named calls: %s", rank, braid_last_error());
        return 0;
    }
    HARNESS_FAIL("rank %d: got %s, not the mismatch: %s", rank, braid_status_string(st), braid_last_error());
}

/* _i: ring or recursive doubling (bit 0), counts or dtype and op (bit 1). */
START_TEST(test_mismatched_calls)
{
    braid_config cfg = BRAID_CONFIG_INIT;
    cfg.timeout_ms = 5000;
    cfg.algo = _i % 2 == 0 ? BRAID_ALGO_RING : BRAID_ALGO_RECURSIVE_DOUBLING;
    harness_result res;
    int failed = harness_run(4, _i < 2 ? mismatch_body : mismatch_type_body, NULL, &cfg, 20, &res);
    ck_assert_int_eq(failed, 0);
    ck_assert_double_lt(res.seconds, 5.0);
}
END_TEST

/* While the group works, a stranger pesters every listener: a port scan,
 * garbage, a silent half-open connection. Results must stay exact. */
static void pester(const char *addr)
{
    char host[64];
    snprintf(host, sizeof(host), "%s", addr);
    char *colon = strrchr(host, ':');
    if (!colon)
        return;
    *colon = '\0';
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)atoi(colon + 1))};
    inet_pton(AF_INET, host, &sa.sin_addr);
    static const char garbage[] = "GET / HTTP/1.0\r\n\r\n\x00\xff\xff\xff\xff garbage";
    for (int kind = 0; kind < 3; kind++) {
        int fd = socket(AF_INET, SOCK_STREAM, 0);
        if (fd < 0)
            continue;
        if (connect(fd, (struct sockaddr *)&sa, sizeof(sa)) == 0) {
            if (kind == 1) {
                ssize_t w = write(fd, garbage, sizeof(garbage));
                (void)w;
            }
            if (kind == 2)
                continue; /* left open and silent on purpose until exit */
        }
        close(fd);
    }
}

static int stray_body(braid_pg *pg, void *arg)
{
    (void)arg;
    int rank = braid_pg_rank(pg), n = braid_pg_size(pg);
    if (rank == 0)
        for (int p = 0; p < n; p++)
            pester(pg->addr[p][braid__transport_id_of(pg->transport)]);
    enum { N = 100003 };
    static int32_t buf[N];
    for (int iter = 0; iter < 20; iter++) {
        for (int i = 0; i < N; i++)
            buf[i] = rank + i + iter;
        if (rank == 0 && iter == 10)
            for (int p = 0; p < n; p++)
                pester(pg->addr[p][braid__transport_id_of(pg->transport)]);
        if (braid_allreduce(pg, buf, buf, N, BRAID_I32, BRAID_SUM, NULL, NULL) != BRAID_OK)
            HARNESS_FAIL("rank %d: allreduce with strays around: %s", rank, braid_last_error());
        for (int i = 0; i < N; i++)
            if (buf[i] != n * (n - 1) / 2 + n * (i + iter))
                HARNESS_FAIL("rank %d: wrong result with strays around", rank);
    }
    return 0;
}

START_TEST(test_stray_connections)
{
    braid_config cfg = BRAID_CONFIG_INIT;
    cfg.timeout_ms = 20000;
    ck_assert_int_eq(harness_run(3, stray_body, NULL, &cfg, 60, NULL), 0);
}
END_TEST

int main(void)
{
    signal(SIGPIPE, SIG_IGN);
    Suite *s = suite_create("faults");
    /* Its own case, so scripts/fault-soak can run it alone (CK_RUN_CASE=kill);
     * a trial takes about a second, at most 30 s (the harness deadline). */
    TCase *kill = tcase_create("kill");
    int trials = kill_trials();
    tcase_set_timeout(kill, trials > 100 ? 6.0 * trials : 600);
    tcase_add_test(kill, test_kill_random_rank);
    suite_add_tcase(s, kill);
    TCase *tc = tcase_create("faults");
    tcase_set_timeout(tc, 600);
    tcase_add_test(tc, test_stopped_rank_times_out);
    tcase_add_test(tc, test_abort_wakes_waiter);
    tcase_add_loop_test(tc, test_mismatched_calls, 0, 4);
    tcase_add_test(tc, test_stray_connections);
    suite_add_tcase(s, tc);
    SRunner *sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? 1 : 0;
}
