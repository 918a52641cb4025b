/* A rank's collective call refused by its argument checks: the peers'
 * matching call fails at once, naming the refusing rank, the call and the
 * reason, instead of timing out or reading "closed its connection" from a
 * rank that is alive; afterwards every rank's group reports that cause at
 * once. All-to-all, gather and scatter are covered like the other
 * collectives, and so are a send and a receive. Ranks are forked processes launched the torchrun way; each
 * writes what it saw to a pipe. The collective timeout is 20 s: a prompt failure
 * is one well under it. */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "braid.h"
#include "harness.h"

#define MAX_RANKS 4
#define DEADLINE_S 60
#define TEXT_MAX 1024
#define REFUSER 1
#define TIMEOUT_MS 20000

typedef enum {
    BAD_RECV_NULL,
    BAD_ROOT,
    BAD_OP,
    BAD_ALLTOALL_SEND,
    BAD_GATHER_SEND,
    BAD_SCATTER_ROOT_SEND,
    BAD_SEND_NULL, /* rank 1 sends NULL to rank 0, which receives from it */
    BAD_RECV_PEER, /* rank 0 sends to rank 1, which receives from rank 7 */
} bad_kind;

typedef struct {
    int status;      /* of the refused call and its peers' matching call */
    long elapsed_ms; /* that call's */
    int later;       /* status of the next call */
    long later_ms;
    char error[TEXT_MAX];
    char later_error[TEXT_MAX];
} rank_result;

static long now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1000L + ts.tv_nsec / 1000000;
}

/* The call under test: rank REFUSER passes the bad argument. buf holds
 * count floats, all two buffers of count floats per rank. */
static braid_status call(braid_pg *pg, int rank, bad_kind bad, float *buf, float *all, size_t count)
{
    int wrong = rank == REFUSER;
    switch (bad) {
    case BAD_RECV_NULL:
        return braid_allreduce(pg, buf, wrong ? NULL : buf, count, BRAID_F32, BRAID_SUM, NULL, NULL);
    case BAD_ROOT:
        return braid_broadcast(pg, buf, count, BRAID_F32, wrong ? 7 : 0, NULL, NULL);
    case BAD_OP:
        return braid_reduce(pg, buf, buf, count, BRAID_F32, wrong ? (braid_op)99 : BRAID_SUM, 0, NULL, NULL);
    case BAD_ALLTOALL_SEND:
        return braid_alltoall(pg, wrong ? NULL : all, all + count * MAX_RANKS, count, BRAID_F32, NULL, NULL);
    case BAD_GATHER_SEND: /* root 0; rank 1 has no block to give */
        return braid_gather(pg, wrong ? NULL : buf, all, count, BRAID_F32, 0, NULL, NULL);
    case BAD_SCATTER_ROOT_SEND: /* the root, rank 1, has nothing to deal out */
        return braid_scatter(pg, wrong ? NULL : all, buf, count, BRAID_F32, REFUSER, NULL, NULL);
    case BAD_SEND_NULL: /* ranks past 1 take no part */
        if (rank > REFUSER)
            return BRAID_OK;
        return wrong ? braid_send(pg, NULL, count, BRAID_F32, 0, NULL, NULL)
                     : braid_recv(pg, buf, count, BRAID_F32, REFUSER, NULL, NULL);
    case BAD_RECV_PEER:
        if (rank > REFUSER)
            return BRAID_OK;
        return wrong ? braid_recv(pg, buf, count, BRAID_F32, 7, NULL, NULL)
                     : braid_send(pg, buf, count, BRAID_F32, REFUSER, NULL, NULL);
    }
    return BRAID_ERR_INTERNAL;
}

static int rank_main(int rank, int world, int port, bad_kind bad, size_t count, int out_fd)
{
    setenv("BRAID_DEBUG", "WARN", 1);
    setenv("MASTER_ADDR", "127.0.0.1", 1);
    harness_setenv_int("MASTER_PORT", port);
    harness_setenv_int("RANK", rank);
    harness_setenv_int("WORLD_SIZE", world);
    harness_setenv_int("BRAID_TIMEOUT_MS", TIMEOUT_MS);
    char line[3 * TEXT_MAX];
    braid_pg *pg = NULL;
    braid_status st = braid_pg_init_env(&pg, NULL);
    if (st != BRAID_OK) {
        int n = snprintf(line, sizeof(line), "init %d %s", (int)st, braid_last_error());
        (void)!write(out_fd, line, (size_t)n);
        return 1;
    }
    float *buf = calloc(count, sizeof(float)), *all = calloc(2 * MAX_RANKS * count, sizeof(float));
    /* One good call first: the refusal must land after it, in order. */
    braid_status good = braid_allreduce(pg, buf, buf, count, BRAID_F32, BRAID_SUM, NULL, NULL);
    rank_result r = {0};
    long t0 = now_ms();
    r.status = (int)call(pg, rank, bad, buf, all, count);
    r.elapsed_ms = now_ms() - t0;
    snprintf(r.error, sizeof(r.error), "%s", r.status == BRAID_OK ? "" : braid_last_error());
    t0 = now_ms();
    r.later = (int)braid_allreduce(pg, buf, buf, count, BRAID_F32, BRAID_SUM, NULL, NULL);
    r.later_ms = now_ms() - t0;
    snprintf(r.later_error, sizeof(r.later_error), "%s", r.later == BRAID_OK ? "" : braid_last_error());
    int n = snprintf(line, sizeof(line), "%d %d %ld %d %ld|%s|%s|", (int)good, r.status, r.elapsed_ms, r.later,
                     r.later_ms, r.error, r.later_error);
    (void)!write(out_fd, line, (size_t)n);
    braid_pg_destroy(pg);
    free(buf);
    free(all);
    return 0;
}

static void run(int world, bad_kind bad, size_t count, rank_result res[MAX_RANKS])
{
    int port = harness_free_port_pair();
    pid_t pids[MAX_RANKS];
    int pipes[MAX_RANKS][2];
    for (int r = 0; r < world; r++) {
        ck_assert_int_eq(pipe(pipes[r]), 0);
        fflush(NULL);
        pids[r] = fork();
        ck_assert_int_ge(pids[r], 0);
        if (pids[r] == 0) {
            alarm(DEADLINE_S);
            close(pipes[r][0]);
            _exit(rank_main(r, world, port, bad, count, pipes[r][1]));
        }
        close(pipes[r][1]);
    }
    for (int r = 0; r < world; r++) {
        char line[3 * TEXT_MAX + 1];
        ssize_t got = 0, n;
        while ((n = read(pipes[r][0], line + got, sizeof(line) - 1 - (size_t)got)) > 0)
            got += n;
        line[got > 0 ? got : 0] = '\0';
        close(pipes[r][0]);
        int status;
        ck_assert_int_eq(waitpid(pids[r], &status, 0), pids[r]);
        ck_assert_msg(WIFEXITED(status) && WEXITSTATUS(status) == 0, "rank %d: status %#x: %s", r, status, line);
        int good = -1, off = 0;
        ck_assert_msg(sscanf(line, "%d %d %ld %d %ld|%n", &good, &res[r].status, &res[r].elapsed_ms, &res[r].later,
                             &res[r].later_ms, &off) == 5,
                      "rank %d reported '%s'", r, line);
        ck_assert_msg(good == BRAID_OK, "rank %d: the good call before failed: %s", r, line);
        char *nl = strchr(line + off, '|');
        ck_assert_ptr_nonnull(nl);
        *nl = '\0';
        snprintf(res[r].error, sizeof(res[r].error), "%s", line + off);
        char *end = strchr(nl + 1, '|');
        if (end)
            *end = '\0';
        snprintf(res[r].later_error, sizeof(res[r].later_error), "%s", nl + 1);
        printf("rank %d: %d after %ld ms: %s\n  then %d after %ld ms: %s\n", r, res[r].status, res[r].elapsed_ms,
               res[r].error, res[r].later, res[r].later_ms, res[r].later_error);
        fflush(stdout);
    }
}

#define ASSERT_HAS(text, needle) \
    ck_assert_msg(strstr((text), (needle)) != NULL, "'%s' not in: %s", (needle), (text))

/* A broadcast's other ranks and a gather's non-root ones do not need rank
 * 1's data, and a send may fit in the link's buffers: their call may
 * finish; the next one names the refusal. Ranks outside a send and receive
 * pair make no call. */
static int may_finish(bad_kind bad, int rank)
{
    int p2p = bad == BAD_SEND_NULL || bad == BAD_RECV_PEER;
    return bad == BAD_ROOT || (bad == BAD_GATHER_SEND && rank != 0) || (p2p && rank > REFUSER) ||
           (bad == BAD_RECV_PEER && rank == 0);
}

/* Every peer names rank 1, the call and why, well within the timeout;
 * rank 1 gets its own argument error; the next call fails at once on
 * every rank with the same cause. */
static void check(int world, bad_kind bad, size_t count, const char *refused)
{
    rank_result res[MAX_RANKS];
    run(world, bad, count, res);
    for (int r = 0; r < world; r++) {
        if (r == REFUSER) {
            ck_assert_msg(res[r].status == BRAID_ERR_INVALID_ARG, "rank %d: %d: %s", r, res[r].status, res[r].error);
        } else if (res[r].status != BRAID_OK || !may_finish(bad, r)) {
            ck_assert_msg(res[r].status == BRAID_ERR_PEER, "rank %d: %d: %s", r, res[r].status, res[r].error);
            ASSERT_HAS(res[r].error, refused);
            ck_assert_msg(strstr(res[r].error, "closed its") == NULL, "rank %d: %s", r, res[r].error);
        }
        /* Prompt: a tenth of the timeout, with room for a loaded machine. */
        ck_assert_msg(res[r].elapsed_ms < TIMEOUT_MS / 10, "rank %d failed after %ld ms", r, res[r].elapsed_ms);
        ck_assert_msg(res[r].later != BRAID_OK, "rank %d: the next call succeeded", r);
        /* Failed before: the group's sticky error; finished before: this call's. */
        if (res[r].status != BRAID_OK)
            ASSERT_HAS(res[r].later_error, "broken by an earlier error");
        ASSERT_HAS(res[r].later_error, r == REFUSER ? "rank 1 refused braid_" : refused);
        ck_assert_msg(strstr(res[r].later_error, "closed its") == NULL, "rank %d: %s", r, res[r].later_error);
        ck_assert_msg(res[r].later_ms < 1000, "rank %d: next call failed after %ld ms", r, res[r].later_ms);
    }
}

START_TEST(test_null_recv_two) { check(2, BAD_RECV_NULL, 4, "rank 1 refused braid_allreduce #1: recv is NULL with count 4"); }
END_TEST

/* Four ranks, recursive doubling: ranks that never read from rank 1 in
 * the call learn it from the notice waiting on their link. */
START_TEST(test_null_recv_four) { check(4, BAD_RECV_NULL, 4, "rank 1 refused braid_allreduce #1: recv is NULL with count 4"); }
END_TEST

/* Four ranks, the ring (1 Mi floats): data already moving when it fails. */
START_TEST(test_null_recv_ring)
{
    check(4, BAD_RECV_NULL, 1 << 20, "rank 1 refused braid_allreduce #1: recv is NULL with count 1048576");
}
END_TEST

START_TEST(test_bad_root) { check(3, BAD_ROOT, 16, "rank 1 refused braid_broadcast #1: root 7 out of range [0, 3)"); }
END_TEST

START_TEST(test_bad_op) { check(3, BAD_OP, 16, "rank 1 refused braid_reduce #1: invalid op 99"); }
END_TEST

/* All-to-all, gather and scatter run as groups of sends and receives; a
 * refusal reaches the peers all the same, naming the public call. */
START_TEST(test_alltoall_send_null)
{
    check(4, BAD_ALLTOALL_SEND, 4, "rank 1 refused braid_alltoall #1: send is NULL with count 4");
}
END_TEST

/* Three ranks, 256 Ki floats a block: data already moving when it fails. */
START_TEST(test_alltoall_send_null_large)
{
    check(3, BAD_ALLTOALL_SEND, 1 << 18, "rank 1 refused braid_alltoall #1: send is NULL with count 262144");
}
END_TEST

START_TEST(test_gather_send_null)
{
    check(3, BAD_GATHER_SEND, 16, "rank 1 refused braid_gather #1: send is NULL with count 16");
}
END_TEST

/* The root's send is the one only it needs: the peers' recv fails. */
START_TEST(test_scatter_root_send_null)
{
    check(4, BAD_SCATTER_ROOT_SEND, 16, "rank 1 refused braid_scatter #1: send is NULL with count 16");
}
END_TEST

/* A send or receive is refused like a collective: its partner's matching
 * call fails at once, naming the rank, the call and the reason. */
START_TEST(test_send_null) { check(2, BAD_SEND_NULL, 4, "rank 1 refused braid_send: buf is NULL with count 4"); }
END_TEST

/* Rank 2 makes no call: it learns the cause from its next all-reduce. */
START_TEST(test_send_null_three)
{
    check(3, BAD_SEND_NULL, 4, "rank 1 refused braid_send: buf is NULL with count 4");
}
END_TEST

/* 4 MiB: rank 0's send blocks on the link until rank 1's refusal ends it. */
START_TEST(test_recv_bad_peer)
{
    check(2, BAD_RECV_PEER, 1 << 20, "rank 1 refused braid_recv: peer 7 out of range [0, 2)");
}
END_TEST

int main(void)
{
    Suite *s = suite_create("refused");
    TCase *tc = tcase_create("refused");
    tcase_set_timeout(tc, DEADLINE_S + 10);
    tcase_add_test(tc, test_null_recv_two);
    tcase_add_test(tc, test_null_recv_four);
    tcase_add_test(tc, test_null_recv_ring);
    tcase_add_test(tc, test_bad_root);
    tcase_add_test(tc, test_bad_op);
    tcase_add_test(tc, test_alltoall_send_null);
    tcase_add_test(tc, test_alltoall_send_null_large);
    tcase_add_test(tc, test_gather_send_null);
    tcase_add_test(tc, test_scatter_root_send_null);
    tcase_add_test(tc, test_send_null);
    tcase_add_test(tc, test_send_null_three);
    tcase_add_test(tc, test_recv_bad_peer);
    suite_add_tcase(s, tc);
    SRunner *sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? 1 : 0;
}
