/* Group shrink with real processes: a rank of 4 kills itself with SIGKILL
 * in the middle of a small training loop (all-reduce of deterministic
 * gradients, weights updated from the sum); the three survivors see the
 * failure, shrink to a group of 3 and finish the loop. Their final weights
 * must be identical and equal to a serial reference that drops the dead
 * rank's gradients from the step it died in. Also: shrink of a healthy
 * group, a latecomer left out, a stopped lowest rank (a bounded error, not
 * a hang), and two failures in a row. */
#include <check.h>
#include <errno.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "bootstrap/sock.h"
#include "harness.h"
#include "pg_shrink.h"

#define RANKS 4
#define WEIGHTS 1000
#define STEPS 30
#define TIMEOUT_MS 4000

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* What each rank reports to the test process, in shared memory. */
typedef struct {
    int done;        /* 1 when the rank finished its body */
    int new_rank[2]; /* after the first and second shrink */
    int new_size[2];
    int resume_step[2]; /* first step run by the smaller group */
    double shrink_s[2]; /* failing call start to shrink return */
    float w[WEIGHTS];
} rank_report;

typedef struct {
    int victim[2];    /* rank killed (-1: none) and the step it dies at */
    int kill_step[2]; /* -1: killed by the harness at a random moment */
    int pace_us;      /* pause before each step */
    rank_report rep[RANKS];
} shared_state;

static shared_state *shared_map(void)
{
    void *p = mmap(NULL, sizeof(shared_state), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    ck_assert(p != MAP_FAILED);
    memset(p, 0, sizeof(shared_state));
    return p;
}

/* Gradient of old rank r at step t: small integers (exact in f32 sums)
 * that also depend on the current weights, as real gradients do. */
static float grad(int r, int t, int i, float w)
{
    return (float)(harness_value(r, (size_t)i, (uint32_t)(1000 + t), -8, 8) + ((int64_t)w % 3));
}

static float initial_weight(int i)
{
    return (float)harness_value(0, (size_t)i, 7, -4, 4);
}

/* The serial reference: every rank alive takes part in a step, dead[r]
 * gives the first step rank r no longer contributes to (STEPS: never
 * dies). */
static void reference(const int dead_from[RANKS], float *w)
{
    for (int i = 0; i < WEIGHTS; i++)
        w[i] = initial_weight(i);
    for (int t = 0; t < STEPS; t++) {
        for (int i = 0; i < WEIGHTS; i++) {
            float sum = 0;
            for (int r = 0; r < RANKS; r++)
                if (t < dead_from[r])
                    sum += grad(r, t, i, w[i]);
            w[i] += sum;
        }
    }
}

/* The training loop. On a failed step: shrink, check the new group, agree
 * with the others on the step to resume from (a survivor may have finished
 * the step before the failure that another survivor did not: it rolls back
 * one step), and go on. */
static int train_body(braid_pg *pg, void *arg)
{
    shared_state *sh = arg;
    int me = braid_pg_rank(pg);
    rank_report *rep = &sh->rep[me];
    static float w[WEIGHTS], w_prev[WEIGHTS], g[WEIGHTS];
    for (int i = 0; i < WEIGHTS; i++)
        w[i] = w_prev[i] = initial_weight(i);
    braid_pg *cur = pg;
    int shrinks = 0, alive = RANKS, gone[RANKS] = {0};
    for (int step = 0; step < STEPS;) {
        for (int k = 0; k < 2; k++)
            if (sh->victim[k] == me && sh->kill_step[k] == step)
                raise(SIGKILL);
        if (sh->pace_us)
            usleep((useconds_t)sh->pace_us);
        for (int i = 0; i < WEIGHTS; i++)
            g[i] = grad(me, step, i, w[i]);
        double t0 = now_s();
        braid_status st = braid_allreduce(cur, g, g, WEIGHTS, BRAID_F32, BRAID_SUM, NULL, NULL);
        if (st == BRAID_OK) {
            memcpy(w_prev, w, sizeof(w));
            for (int i = 0; i < WEIGHTS; i++)
                w[i] += g[i];
            step++;
            continue;
        }
        if (st != BRAID_ERR_PEER && st != BRAID_ERR_TIMEOUT)
            HARNESS_FAIL("rank %d: step %d: unexpected %s: %s", me, step, braid_status_string(st), braid_last_error());
        if (shrinks == 2 || sh->victim[shrinks] < 0)
            HARNESS_FAIL("rank %d: step %d: failure without a victim: %s", me, step, braid_last_error());

        braid_pg *np = NULL;
        st = braid_pg_shrink(cur, -1, &np);
        double took = now_s() - t0;
        if (st != BRAID_OK)
            HARNESS_FAIL("rank %d: shrink after step %d failed: %s: %s", me, step, braid_status_string(st),
                         braid_last_error());
        gone[sh->victim[shrinks]] = 1;
        alive--;
        int want_rank = 0;
        for (int r = 0; r < me; r++)
            want_rank += !gone[r];
        if (braid_pg_size(np) != alive || braid_pg_rank(np) != want_rank)
            HARNESS_FAIL("rank %d: shrunk group: rank %d of %d, want %d of %d", me, braid_pg_rank(np),
                         braid_pg_size(np), want_rank, alive);
        int32_t lo = step, hi = step;
        if (braid_allreduce(np, &lo, &lo, 1, BRAID_I32, BRAID_MIN, NULL, NULL) != BRAID_OK ||
            braid_allreduce(np, &hi, &hi, 1, BRAID_I32, BRAID_MAX, NULL, NULL) != BRAID_OK)
            HARNESS_FAIL("rank %d: agreeing on the step in the shrunk group: %s", me, braid_last_error());
        if (hi - lo > 1)
            HARNESS_FAIL("rank %d: survivors are %d steps apart", me, hi - lo);
        if (step > lo) {
            memcpy(w, w_prev, sizeof(w));
            step = lo;
        }
        rep->new_rank[shrinks] = braid_pg_rank(np);
        rep->new_size[shrinks] = braid_pg_size(np);
        rep->resume_step[shrinks] = step;
        rep->shrink_s[shrinks] = took;
        /* The group before stays valid until destroyed; the harness
         * destroys the first one. */
        if (cur != pg)
            braid_pg_destroy(cur);
        cur = np;
        shrinks++;
    }
    memcpy(rep->w, w, sizeof(w));
    rep->done = 1;
    if (cur != pg)
        braid_pg_destroy(cur);
    return 0;
}

/* Run the loop with the given victims and check the survivors. A victim
 * with a step kills itself there; victim0 with step -1 is killed by the
 * harness kill_after_ms after every rank joined. */
static void run_training(int victim0, int step0, int victim1, int step1, int kill_after_ms)
{
    shared_state *sh = shared_map();
    sh->victim[0] = victim0;
    sh->kill_step[0] = step0;
    sh->victim[1] = victim1;
    sh->kill_step[1] = step1;
    sh->pace_us = step0 < 0 ? 10000 : 0;
    braid_config cfg = BRAID_CONFIG_INIT;
    cfg.timeout_ms = TIMEOUT_MS;
    /* The fault entry marks victim0's death as expected; a victim that
     * kills itself is never killed by the harness. Only one rank can be
     * named there, so a second victim is checked here. */
    harness_fault f = {.rank = victim0, .after_ms = step0 < 0 ? kill_after_ms : 1000 * 1000, .signal = SIGKILL};
    harness_result res;
    int failed = harness_run_faulty(RANKS, train_body, sh, &cfg, 60, &f, &res);
    int expected_failed = victim1 >= 0 && res.exit_code[victim1] == -SIGKILL ? 1 : 0;
    ck_assert_msg(failed == expected_failed, "%d ranks failed (victims %d, %d)", failed, victim0, victim1);
    ck_assert_int_eq(res.exit_code[victim0], -SIGKILL);
    if (victim1 >= 0)
        ck_assert_int_eq(res.exit_code[victim1], -SIGKILL);

    int nshrinks = victim1 >= 0 ? 2 : 1;
    int first = -1;
    for (int r = 0; r < RANKS; r++) {
        if (r == victim0 || r == victim1)
            continue;
        rank_report *rep = &sh->rep[r];
        ck_assert_msg(rep->done, "rank %d did not finish", r);
        if (first < 0)
            first = r;
        for (int k = 0; k < nshrinks; k++) {
            /* Detection (closed sockets) and shrink: far below the timeout. */
            ck_assert_msg(rep->shrink_s[k] < TIMEOUT_MS / 1000.0 + 1.0, "rank %d: shrink %d took %.2f s", r, k,
                          rep->shrink_s[k]);
            ck_assert_int_eq(rep->resume_step[k], sh->rep[first].resume_step[k]);
            ck_assert_int_eq(rep->new_size[k], RANKS - 1 - k);
            ck_assert_msg(sh->kill_step[k] < 0 || rep->resume_step[k] == sh->kill_step[k] ||
                              rep->resume_step[k] == sh->kill_step[k] - 1,
                          "rank %d: resumed at step %d, the victim died at %d", r, rep->resume_step[k],
                          sh->kill_step[k]);
            printf("victim %d at step %d: old rank %d -> rank %d of %d, resumed at %d, failed call + shrink %.3f s\n",
                   sh->victim[k], sh->kill_step[k], r, rep->new_rank[k], rep->new_size[k], rep->resume_step[k],
                   rep->shrink_s[k]);
        }
        ck_assert_msg(memcmp(rep->w, sh->rep[first].w, sizeof(rep->w)) == 0, "ranks %d and %d ended differently", first,
                      r);
    }
    int dead_from[RANKS] = {STEPS, STEPS, STEPS, STEPS};
    dead_from[victim0] = sh->rep[first].resume_step[0];
    if (victim1 >= 0)
        dead_from[victim1] = sh->rep[first].resume_step[1];
    static float want[WEIGHTS];
    reference(dead_from, want);
    for (int i = 0; i < WEIGHTS; i++)
        ck_assert_msg(sh->rep[first].w[i] == want[i], "weight %d: %g, reference %g", i, (double)sh->rep[first].w[i],
                      (double)want[i]);
    munmap(sh, sizeof(*sh));
}

static const int victims[] = {2, 0, 3};

START_TEST(test_kill_and_shrink)
{
    run_training(victims[_i], 11, -1, 0, 0);
}
END_TEST

START_TEST(test_kill_at_random_moment)
{
    /* The harness kills a random rank at a random moment (steps are paced
     * 10 ms apart, the kill comes 30 to 250 ms in): survivors may be one
     * step apart and agree where to resume. The victim contributed to
     * every step before that one, so the reference follows from it. */
    unsigned seed = (unsigned)time(NULL) ^ (unsigned)getpid();
    for (int t = 0; t < 3; t++)
        run_training((int)(rand_r(&seed) % RANKS), -1, -1, 0, 30 + (int)(rand_r(&seed) % 220));
}
END_TEST

START_TEST(test_two_failures)
{
    /* Rank 1 dies, the group shrinks to 3; then old rank 0 (new rank 0,
     * the coordinator of the first shrink) dies, and it shrinks to 2. */
    run_training(1, 8, 0, 19, 0);
}
END_TEST

/* ---- healthy group -------------------------------------------------------- */

static int healthy_body(braid_pg *pg, void *arg)
{
    (void)arg;
    int me = braid_pg_rank(pg), n = braid_pg_size(pg);
    braid_pg *np = NULL;
    double t0 = now_s();
    braid_status st = braid_pg_shrink(pg, -1, &np);
    if (st != BRAID_OK)
        HARNESS_FAIL("rank %d: shrink of a healthy group: %s: %s", me, braid_status_string(st), braid_last_error());
    if (now_s() - t0 > 2.0)
        HARNESS_FAIL("rank %d: shrink of a healthy group took %.2f s", me, now_s() - t0);
    if (braid_pg_size(np) != n || braid_pg_rank(np) != me)
        HARNESS_FAIL("rank %d: healthy shrink gave rank %d of %d", me, braid_pg_rank(np), braid_pg_size(np));
    /* Both groups work, side by side. */
    int32_t a[100], b[100];
    for (int i = 0; i < 100; i++)
        a[i] = b[i] = me + i;
    if (braid_allreduce(np, a, a, 100, BRAID_I32, BRAID_SUM, NULL, NULL) != BRAID_OK ||
        braid_allreduce(pg, b, b, 100, BRAID_I32, BRAID_SUM, NULL, NULL) != BRAID_OK)
        HARNESS_FAIL("rank %d: all-reduce after a healthy shrink: %s", me, braid_last_error());
    for (int i = 0; i < 100; i++)
        if (a[i] != n * (n - 1) / 2 + n * i || b[i] != a[i])
            HARNESS_FAIL("rank %d: wrong all-reduce result after a healthy shrink", me);
    braid_pg_destroy(np);
    return 0;
}

START_TEST(test_healthy_shrink)
{
    braid_config cfg = BRAID_CONFIG_INIT;
    cfg.timeout_ms = TIMEOUT_MS;
    ck_assert_int_eq(harness_run(RANKS, healthy_body, NULL, &cfg, 30, NULL), 0);
    ck_assert_int_eq(harness_run(1, healthy_body, NULL, &cfg, 30, NULL), 0);
}
END_TEST

/* ---- a latecomer ------------------------------------------------------------ */

/* Rank 3 calls shrink well after the coordinator's registration window
 * (half the timeout): the others go on as 3, rank 3 learns it was left
 * out. */
#define LATE_TIMEOUT_MS 2000

static int late_body(braid_pg *pg, void *arg)
{
    volatile int *late_done = arg;
    int me = braid_pg_rank(pg);
    braid_pg *np = NULL;
    if (me == 3) {
        usleep(LATE_TIMEOUT_MS * 9 / 10 * 1000);
        double t0 = now_s();
        braid_status st = braid_pg_shrink(pg, -1, &np);
        *late_done = 1;
        if (st != BRAID_ERR_TIMEOUT || !strstr(braid_last_error(), "left out"))
            HARNESS_FAIL("rank 3: late shrink returned %s (%s), want TIMEOUT, left out", braid_status_string(st),
                         braid_last_error());
        if (now_s() - t0 > 1.0)
            HARNESS_FAIL("rank 3: learning it was left out took %.2f s", now_s() - t0);
        return 0;
    }
    braid_status st = braid_pg_shrink(pg, -1, &np);
    if (st != BRAID_OK)
        HARNESS_FAIL("rank %d: shrink: %s", me, braid_last_error());
    if (braid_pg_size(np) != 3 || braid_pg_rank(np) != me)
        HARNESS_FAIL("rank %d: got rank %d of %d, want %d of 3", me, braid_pg_rank(np), braid_pg_size(np), me);
    float x = 1;
    if (braid_allreduce(np, &x, &x, 1, BRAID_F32, BRAID_SUM, NULL, NULL) != BRAID_OK || x != 3)
        HARNESS_FAIL("rank %d: all-reduce in the group of 3: %s", me, braid_last_error());
    braid_pg_destroy(np);
    /* Keep the old group (and the coordinator's decision) until rank 3
     * has read it. */
    for (int i = 0; i < 500 && !*late_done; i++)
        usleep(10 * 1000);
    return 0;
}

START_TEST(test_latecomer_left_out)
{
    volatile int *late_done = mmap(NULL, sizeof(int), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    ck_assert(late_done != MAP_FAILED);
    *late_done = 0;
    braid_config cfg = BRAID_CONFIG_INIT;
    cfg.timeout_ms = LATE_TIMEOUT_MS;
    ck_assert_int_eq(harness_run(RANKS, late_body, (void *)late_done, &cfg, 30, NULL), 0);
    munmap((void *)late_done, sizeof(int));
}
END_TEST

/* ---- a stopped lowest rank ---------------------------------------------------- */

/* Rank 0 is stopped, not dead: its sockets stay open, so nobody can tell
 * it will not come back. Shrink must give up with TIMEOUT naming rank 0
 * rather than hang or form a group without it. */
#define STOP_TIMEOUT_MS 1500

static int stopped_body(braid_pg *pg, void *arg)
{
    (void)arg;
    int me = braid_pg_rank(pg);
    float x[100] = {0};
    /* One call first: rank 0 serves the store, and a rank still finishing
     * init would otherwise time out against the stopped store instead. */
    braid_status st = braid_allreduce(pg, x, x, 100, BRAID_F32, BRAID_SUM, NULL, NULL);
    if (st != BRAID_OK)
        HARNESS_FAIL("rank %d: all-reduce before the stop: %s", me, braid_last_error());
    if (me == 0) {
        raise(SIGSTOP);
        return 0;
    }
    st = braid_allreduce(pg, x, x, 100, BRAID_F32, BRAID_SUM, NULL, NULL);
    if (st != BRAID_ERR_TIMEOUT && st != BRAID_ERR_PEER)
        HARNESS_FAIL("rank %d: all-reduce with rank 0 stopped: %s", me, braid_status_string(st));
    braid_pg *np = NULL;
    double t1 = now_s();
    st = braid_pg_shrink(pg, -1, &np);
    double took = now_s() - t1;
    if (st != BRAID_ERR_TIMEOUT || !strstr(braid_last_error(), "rank 0"))
        HARNESS_FAIL("rank %d: shrink with rank 0 stopped returned %s (%s), want TIMEOUT naming rank 0", me,
                     braid_status_string(st), braid_last_error());
    if (took > STOP_TIMEOUT_MS / 1000.0 + 1.0)
        HARNESS_FAIL("rank %d: shrink took %.2f s with a %d ms timeout", me, took, STOP_TIMEOUT_MS);
    return 0;
}

START_TEST(test_stopped_rank0_times_out)
{
    braid_config cfg = BRAID_CONFIG_INIT;
    cfg.timeout_ms = STOP_TIMEOUT_MS;
    harness_result res;
    /* Rank 0 stays stopped until the harness deadline kills it. */
    int failed = harness_run(3, stopped_body, NULL, &cfg, 8, &res);
    ck_assert_int_eq(res.exit_code[1], 0);
    ck_assert_int_eq(res.exit_code[2], 0);
    ck_assert_int_eq(failed, 1);
}
END_TEST

/* ---- a squatted shrink port ------------------------------------------------ */

/* Rank 0 dies; rank 1 starts a process that binds rank 0's freed shrink
 * port before either survivor calls shrink: a silent listener (_i == 0),
 * one that accepts and hangs up (_i == 1), or a relay that forwards every
 * connection to rank 1's live shrink store (_i == 2), whose proof of the
 * secret is genuine but names rank 1. None of them proves membership as
 * rank 0, so the survivors shrink to 2 anyway. */
#define SQUAT_TIMEOUT_MS 15000

typedef struct {
    int mode;    /* 0 silent, 1 accept and close, 2 relay to target */
    int ready;   /* 1: the squatter holds the port; -1: it could not bind */
    char addr[BRAID_SOCK_ADDR_STR];
    char target[BRAID_SOCK_ADDR_STR];
} squat_state;

/* Copy bytes both ways between a and b until either side closes. */
static void relay_pump(int a, int b)
{
    char buf[4096];
    for (;;) {
        struct pollfd p[2] = {{.fd = a, .events = POLLIN}, {.fd = b, .events = POLLIN}};
        if (poll(p, 2, -1) < 0)
            return;
        for (int i = 0; i < 2; i++) {
            if (!p[i].revents)
                continue;
            ssize_t n = read(p[i].fd, buf, sizeof(buf));
            if (n <= 0 || write(p[1 - i].fd, buf, (size_t)n) != n)
                return;
        }
    }
}

/* One relayed connection, in a child of its own. */
static void relay_one(int c, const char *target)
{
    if (fork() != 0) {
        close(c);
        return;
    }
    braid_sockaddr t;
    int fd = braid__sock_addr_parse(target, &t) == BRAID_OK ? socket(t.ss.ss_family, SOCK_STREAM, 0) : -1;
    if (fd >= 0 && connect(fd, (struct sockaddr *)&t.ss, t.len) == 0)
        relay_pump(c, fd);
    _exit(0);
}

static void squatter_main(squat_state *sq)
{
    braid_sockaddr a;
    if (braid__sock_addr_parse(sq->addr, &a) != BRAID_OK)
        _exit(2);
    int fd = socket(a.ss.ss_family, SOCK_STREAM | SOCK_CLOEXEC, 0), one = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    for (int i = 0; i < 500; i++) {
        if (bind(fd, (struct sockaddr *)&a.ss, a.len) == 0 && listen(fd, 64) == 0) {
            __atomic_store_n(&sq->ready, 1, __ATOMIC_SEQ_CST);
            for (;;) {
                if (sq->mode == 0) {
                    pause();
                } else {
                    int c = accept(fd, NULL, NULL);
                    if (c >= 0 && sq->mode == 2)
                        relay_one(c, sq->target);
                    else if (c >= 0)
                        close(c);
                }
            }
        }
        usleep(10000);
    }
    __atomic_store_n(&sq->ready, -1, __ATOMIC_SEQ_CST);
    _exit(3);
}

static int squat_body(braid_pg *pg, void *arg)
{
    squat_state *sq = arg;
    int me = braid_pg_rank(pg);
    float x = 1;
    if (braid_allreduce(pg, &x, &x, 1, BRAID_F32, BRAID_SUM, NULL, NULL) != BRAID_OK || x != 3)
        HARNESS_FAIL("rank %d: first all-reduce: %s", me, braid_last_error());
    if (me == 0)
        raise(SIGKILL);
    x = 1;
    if (braid_allreduce(pg, &x, &x, 1, BRAID_F32, BRAID_SUM, NULL, NULL) == BRAID_OK)
        HARNESS_FAIL("rank %d: all-reduce with rank 0 dead succeeded", me);
    pid_t squatter = -1;
    if (me == 1) {
        snprintf(sq->addr, sizeof(sq->addr), "%s", braid__shrink_addr(pg, 0));
        snprintf(sq->target, sizeof(sq->target), "%s", braid__shrink_addr(pg, 1));
        squatter = fork();
        if (squatter == 0) {
            setpgid(0, 0);
            signal(SIGCHLD, SIG_IGN); /* relayed connections' children reap themselves */
            squatter_main(sq);
        }
        if (squatter < 0)
            HARNESS_FAIL("rank 1: fork: %s", strerror(errno));
    }
    for (int i = 0; i < 1000 && __atomic_load_n(&sq->ready, __ATOMIC_SEQ_CST) == 0; i++)
        usleep(10000);
    if (__atomic_load_n(&sq->ready, __ATOMIC_SEQ_CST) != 1)
        HARNESS_FAIL("rank %d: the squatter could not take rank 0's port %s", me, sq->addr);
    braid_pg *np = NULL;
    double t0 = now_s();
    braid_status st = braid_pg_shrink(pg, -1, &np);
    double took = now_s() - t0;
    if (squatter > 0) {
        kill(-squatter, SIGKILL); /* the relay's children too */
        kill(squatter, SIGKILL);
        waitpid(squatter, NULL, 0);
    }
    if (st != BRAID_OK)
        HARNESS_FAIL("rank %d: shrink past a squatter: %s: %s", me, braid_status_string(st), braid_last_error());
    if (braid_pg_size(np) != 2 || braid_pg_rank(np) != me - 1)
        HARNESS_FAIL("rank %d: got rank %d of %d, want %d of 2", me, braid_pg_rank(np), braid_pg_size(np), me - 1);
    x = 1;
    if (braid_allreduce(np, &x, &x, 1, BRAID_F32, BRAID_SUM, NULL, NULL) != BRAID_OK || x != 2)
        HARNESS_FAIL("rank %d: all-reduce in the group of 2: %s", me, braid_last_error());
    printf("rank %d: shrink past squatter mode %d took %.0f ms\n", me, sq->mode, took * 1000);
    fflush(stdout); /* the rank leaves with _exit */
    if (took > SQUAT_TIMEOUT_MS / 1000.0)
        HARNESS_FAIL("rank %d: shrink took %.2f s", me, took);
    braid_pg_destroy(np);
    return 0;
}

START_TEST(test_squatted_port)
{
    squat_state *sq = mmap(NULL, sizeof(*sq), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    ck_assert(sq != MAP_FAILED);
    memset(sq, 0, sizeof(*sq));
    sq->mode = _i;
    braid_config cfg = BRAID_CONFIG_INIT;
    cfg.timeout_ms = SQUAT_TIMEOUT_MS;
    harness_result res;
    harness_run(3, squat_body, sq, &cfg, 60, &res);
    ck_assert_msg(res.exit_code[1] == 0 && res.exit_code[2] == 0, "survivors exited %d, %d", res.exit_code[1],
                  res.exit_code[2]);
    munmap(sq, sizeof(*sq));
}
END_TEST

int main(void)
{
    signal(SIGPIPE, SIG_IGN);
    Suite *s = suite_create("shrink");
    TCase *tc = tcase_create("shrink");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, test_healthy_shrink);
    tcase_add_loop_test(tc, test_kill_and_shrink, 0, (int)(sizeof(victims) / sizeof(victims[0])));
    tcase_add_test(tc, test_kill_at_random_moment);
    tcase_add_test(tc, test_two_failures);
    tcase_add_test(tc, test_latecomer_left_out);
    tcase_add_test(tc, test_stopped_rank0_times_out);
    tcase_add_loop_test(tc, test_squatted_port, 0, 3);
    suite_add_tcase(s, tc);
    SRunner *sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? 1 : 0;
}
