/* Verbs transport end to end, on a machine with an RDMA device (a real HCA
 * or Soft-RoCE: see docs/TRANSPORTS.md). Two processes drive the ops table
 * directly (sizes around the slot size, many messages in flight, zero copy
 * from registered memory, mismatches, a peer that closes, a peer that
 * dies), then 2-4 forked ranks run all-reduce and broadcast through
 * braid_pg_init with the verbs transport, checked exactly against a serial
 * reference. Without a usable device the whole suite is skipped (exit 77)
 * with the probe's reason. */
#include <check.h>
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "braid.h"
#include "braid_transport.h"
#include "clock.h"
#include "harness.h"
#include "pg.h"
#include "transport.h"

#define SKIP 77

#ifndef BRAID_HAVE_VERBS
int main(void)
{
    printf("SKIP: this build has no verbs transport (libibverbs was not found)\n");
    return SKIP;
}
#else

static const braid_transport_ops *ops;

/* ---- helpers ------------------------------------------------------------- */

static braid_transport_ctx make_ctx(int rank, int size)
{
    braid_transport_ctx ctx;
    memset(&ctx, 0, sizeof(ctx));
    ctx.rank = rank;
    ctx.size = size;
    for (int i = 0; i < BRAID_SECRET_BYTES; i++)
        ctx.secret[i] = (uint8_t)(0x51 + i);
    ctx.pg_tag = 0x7e57ab1e5eedull;
    ctx.timeout_ms = 20000;
    ctx.nsocks = 1;
    snprintf(ctx.bind_ip, sizeof(ctx.bind_ip), "127.0.0.1");
    return ctx;
}

static void fill(uint8_t *buf, size_t len, uint64_t seed)
{
    uint64_t x = seed * 0x9e3779b97f4a7c15ull + 99;
    for (size_t i = 0; i < len; i++) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        buf[i] = (uint8_t)(x >> 32);
    }
}

static int check_fill(const uint8_t *buf, size_t len, uint64_t seed)
{
    uint8_t *want = malloc(len ? len : 1);
    if (!want)
        return 0;
    fill(want, len, seed);
    int ok = memcmp(want, buf, len) == 0;
    free(want);
    return ok;
}

static braid_status wait_all(braid_req *reqs, int n, int timeout_ms)
{
    int64_t deadline = braid__now_ms() + timeout_ms;
    braid_conn *conn = reqs[0].conn;
    for (;;) {
        int all = 1;
        for (int i = 0; i < n; i++) {
            int done;
            braid_status st = ops->test(&reqs[i], &done);
            if (st != BRAID_OK)
                return st;
            all &= done;
        }
        if (all)
            return BRAID_OK;
        if (braid__now_ms() > deadline)
            return BRAID_ERR_TIMEOUT;
        braid_status st = ops->progress(&conn, 1, -1, 100);
        if (st != BRAID_OK)
            return st;
    }
}

typedef int (*side_fn)(int rank, braid_conn *conn, void *arg);

static int wait_child(pid_t pid, int timeout_s)
{
    int64_t deadline = braid__now_ms() + timeout_s * 1000;
    for (;;) {
        int status;
        if (waitpid(pid, &status, WNOHANG) == pid)
            return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
        if (braid__now_ms() > deadline) {
            kill(pid, SIGKILL);
            waitpid(pid, &status, 0);
            return 124;
        }
        usleep(2000);
    }
}

/* Two fresh processes, forked before either touches the device: rank 1
 * listens and passes its address through a pipe, rank 0 dials it (the
 * lower rank dials, as in the process group). Each runs fn. */
static void run_pair(side_fn fn, void *arg, int *rc0, int *rc1)
{
    int p[2];
    ck_assert_int_eq(pipe(p), 0);
    pid_t pid1 = fork();
    ck_assert_int_ge(pid1, 0);
    if (pid1 == 0) {
        close(p[0]);
        braid_transport_ctx ctx = make_ctx(1, 2);
        braid_listener *l;
        char addr[BRAID_ADDR_MAX];
        if (ops->listen(&ctx, &l, addr) != BRAID_OK) {
            fprintf(stderr, "rank 1: listen: %s\n", braid_last_error());
            _exit(10);
        }
        if (write(p[1], addr, sizeof(addr)) != (ssize_t)sizeof(addr))
            _exit(11);
        braid_conn *conn;
        if (ops->accept(l, 0, 20000, &conn) != BRAID_OK) {
            fprintf(stderr, "rank 1: accept: %s\n", braid_last_error());
            _exit(12);
        }
        int rc = fn(1, conn, arg);
        ops->close(conn);
        ops->close_listener(l);
        _exit(rc);
    }
    close(p[1]);
    pid_t pid0 = fork();
    ck_assert_int_ge(pid0, 0);
    if (pid0 == 0) {
        char addr[BRAID_ADDR_MAX];
        if (read(p[0], addr, sizeof(addr)) != (ssize_t)sizeof(addr))
            _exit(11);
        braid_transport_ctx ctx = make_ctx(0, 2);
        braid_conn *conn;
        if (ops->connect(&ctx, 1, addr, 20000, &conn) != BRAID_OK) {
            fprintf(stderr, "rank 0: connect: %s\n", braid_last_error());
            _exit(12);
        }
        int rc = fn(0, conn, arg);
        ops->close(conn);
        _exit(rc);
    }
    close(p[0]);
    *rc0 = wait_child(pid0, 120);
    *rc1 = wait_child(pid1, 120);
}

#define FAIL(...)                                                                                  \
    do {                                                                                           \
        fprintf(stderr, __VA_ARGS__);                                                              \
        fputc('\n', stderr);                                                                       \
        return 1;                                                                                  \
    } while (0)

/* ---- ops level ----------------------------------------------------------- */

/* Both ranks send every size to each other at once; sizes straddle the
 * 128 KiB default slot and exceed the 32-slot window. */
static const size_t pair_sizes[] = {0, 1, 40, 4095, 4096, 131071, 131072, 131073, 1 << 20, (5 << 20) + 17, 0, 3};
#define NPAIR (sizeof(pair_sizes) / sizeof(pair_sizes[0]))

static int side_sizes(int rank, braid_conn *c, void *arg)
{
    (void)arg;
    uint8_t *sbuf[NPAIR], *rbuf[NPAIR];
    braid_req reqs[2 * NPAIR];
    for (size_t i = 0; i < NPAIR; i++) {
        sbuf[i] = malloc(pair_sizes[i] + 1);
        rbuf[i] = malloc(pair_sizes[i] + 1);
        if (!sbuf[i] || !rbuf[i])
            FAIL("rank %d: out of memory", rank);
        fill(sbuf[i], pair_sizes[i], (uint64_t)rank * 100 + i);
        if (ops->irecv(c, &reqs[NPAIR + i], rbuf[i], pair_sizes[i]) != BRAID_OK)
            FAIL("rank %d: irecv %zu: %s", rank, i, braid_last_error());
    }
    for (size_t i = 0; i < NPAIR; i++)
        if (ops->isend(c, &reqs[i], sbuf[i], pair_sizes[i]) != BRAID_OK)
            FAIL("rank %d: isend %zu: %s", rank, i, braid_last_error());
    if (wait_all(reqs, 2 * NPAIR, 60000) != BRAID_OK)
        FAIL("rank %d: transfers: %s", rank, braid_last_error());
    for (size_t i = 0; i < NPAIR; i++) {
        if (!check_fill(rbuf[i], pair_sizes[i], (uint64_t)(1 - rank) * 100 + i))
            FAIL("rank %d: message %zu (%zu bytes) corrupted", rank, i, pair_sizes[i]);
        free(sbuf[i]);
        free(rbuf[i]);
    }
    return 0;
}

START_TEST(pair_sizes_both_ways)
{
    int rc0, rc1;
    run_pair(side_sizes, NULL, &rc0, &rc1);
    ck_assert_int_eq(rc0, 0);
    ck_assert_int_eq(rc1, 0);
}
END_TEST

/* A ping-pong of 2000 small messages: the credit path under latency. */
static int side_pingpong(int rank, braid_conn *c, void *arg)
{
    (void)arg;
    uint32_t v = 0;
    for (uint32_t i = 0; i < 2000; i++) {
        braid_req r;
        if (rank == 0) {
            v = i;
            if (ops->isend(c, &r, &v, sizeof(v)) != BRAID_OK || wait_all(&r, 1, 20000) != BRAID_OK)
                FAIL("rank 0: send %u: %s", i, braid_last_error());
            if (ops->irecv(c, &r, &v, sizeof(v)) != BRAID_OK || wait_all(&r, 1, 20000) != BRAID_OK)
                FAIL("rank 0: recv %u: %s", i, braid_last_error());
            if (v != i + 1)
                FAIL("rank 0: got %u, expected %u", v, i + 1);
        } else {
            if (ops->irecv(c, &r, &v, sizeof(v)) != BRAID_OK || wait_all(&r, 1, 20000) != BRAID_OK)
                FAIL("rank 1: recv %u: %s", i, braid_last_error());
            v++;
            if (ops->isend(c, &r, &v, sizeof(v)) != BRAID_OK || wait_all(&r, 1, 20000) != BRAID_OK)
                FAIL("rank 1: send %u: %s", i, braid_last_error());
        }
    }
    return 0;
}

START_TEST(pair_pingpong)
{
    int rc0, rc1;
    run_pair(side_pingpong, NULL, &rc0, &rc1);
    ck_assert_int_eq(rc0, 0);
    ck_assert_int_eq(rc1, 0);
}
END_TEST

/* Sends from memory registered with reg_mem() go zero-copy; the data must
 * be the same, and dereg_mem() must leave later staged sends intact. */
static int side_zero_copy(int rank, braid_conn *c, void *arg)
{
    (void)arg;
    const size_t len = 8u << 20;
    uint8_t *buf = malloc(len);
    if (!buf)
        FAIL("rank %d: out of memory", rank);
    if (rank == 0) {
        fill(buf, len, 42);
        void *h;
        if (!BRAID_TRANSPORT_HAS(ops, reg_mem) || ops->reg_mem(c, buf, len, &h) != BRAID_OK)
            FAIL("rank 0: reg_mem: %s", braid_last_error());
        braid_req r[3];
        if (ops->isend(c, &r[0], buf, len / 2) != BRAID_OK || ops->isend(c, &r[1], buf + len / 2, len / 2) != BRAID_OK)
            FAIL("rank 0: isend: %s", braid_last_error());
        if (wait_all(r, 2, 30000) != BRAID_OK)
            FAIL("rank 0: zero-copy sends: %s", braid_last_error());
        if (ops->dereg_mem(c, h) != BRAID_OK)
            FAIL("rank 0: dereg_mem: %s", braid_last_error());
        fill(buf, len, 43);
        if (ops->isend(c, &r[2], buf, len) != BRAID_OK || wait_all(&r[2], 1, 30000) != BRAID_OK)
            FAIL("rank 0: staged send: %s", braid_last_error());
    } else {
        braid_req r[2];
        if (ops->irecv(c, &r[0], buf, len / 2) != BRAID_OK || ops->irecv(c, &r[1], buf + len / 2, len / 2) != BRAID_OK)
            FAIL("rank 1: irecv: %s", braid_last_error());
        if (wait_all(r, 2, 30000) != BRAID_OK)
            FAIL("rank 1: receives: %s", braid_last_error());
        if (!check_fill(buf, len, 42))
            FAIL("rank 1: zero-copy data corrupted");
        if (ops->irecv(c, &r[0], buf, len) != BRAID_OK || wait_all(r, 1, 30000) != BRAID_OK)
            FAIL("rank 1: receive: %s", braid_last_error());
        if (!check_fill(buf, len, 43))
            FAIL("rank 1: staged data corrupted");
    }
    free(buf);
    return 0;
}

START_TEST(pair_zero_copy)
{
    int rc0, rc1;
    run_pair(side_zero_copy, NULL, &rc0, &rc1);
    ck_assert_int_eq(rc0, 0);
    ck_assert_int_eq(rc1, 0);
}
END_TEST

static int side_mismatch(int rank, braid_conn *c, void *arg)
{
    (void)arg;
    uint8_t buf[300] = {0};
    braid_req r;
    if (rank == 0) {
        if (ops->isend(c, &r, buf, 300) != BRAID_OK || wait_all(&r, 1, 20000) != BRAID_OK)
            FAIL("rank 0: send: %s", braid_last_error());
        usleep(200 * 1000); /* let rank 1 see the data before our goodbye */
        return 0;
    }
    if (ops->irecv(c, &r, buf, 100) != BRAID_OK)
        FAIL("rank 1: irecv: %s", braid_last_error());
    braid_status st = wait_all(&r, 1, 20000);
    if (st != BRAID_ERR_MISMATCH || !strstr(braid_last_error(), "peer 0"))
        FAIL("rank 1: expected a mismatch naming peer 0, got %s: %s", braid_status_string(st), braid_last_error());
    return 0;
}

START_TEST(pair_mismatch)
{
    int rc0, rc1;
    run_pair(side_mismatch, NULL, &rc0, &rc1);
    ck_assert_int_eq(rc0, 0);
    ck_assert_int_eq(rc1, 0);
}
END_TEST

/* arg: 0 = rank 0 closes cleanly, 1 = rank 0 dies without closing. Rank 1
 * must fail its pending receive fast, naming the peer. */
static int side_peer_gone(int rank, braid_conn *c, void *arg)
{
    int die = *(int *)arg;
    if (rank == 0) {
        usleep(100 * 1000);
        if (die)
            _exit(0); /* the kernel tears down the QP and the TCP socket */
        return 0;     /* run_pair closes the connection */
    }
    uint8_t buf[64];
    braid_req r;
    if (ops->irecv(c, &r, buf, sizeof(buf)) != BRAID_OK)
        FAIL("rank 1: irecv: %s", braid_last_error());
    int64_t t0 = braid__now_ms();
    braid_status st = wait_all(&r, 1, 20000);
    int64_t took = braid__now_ms() - t0;
    if (st != BRAID_ERR_PEER || !strstr(braid_last_error(), "peer 0"))
        FAIL("rank 1: expected BRAID_ERR_PEER naming peer 0, got %s: %s", braid_status_string(st),
             braid_last_error());
    if (took > 5000)
        FAIL("rank 1: took %lld ms to notice", (long long)took);
    return 0;
}

START_TEST(pair_peer_closes)
{
    int rc0, rc1, die = 0;
    run_pair(side_peer_gone, &die, &rc0, &rc1);
    ck_assert_int_eq(rc0, 0);
    ck_assert_int_eq(rc1, 0);
}
END_TEST

START_TEST(pair_peer_dies)
{
    int rc0, rc1, die = 1;
    run_pair(side_peer_gone, &die, &rc0, &rc1);
    ck_assert_int_eq(rc0, 0);
    ck_assert_int_eq(rc1, 0);
}
END_TEST

START_TEST(probe_reasons)
{
    char why[512];
    setenv("BRAID_IB_HCA", "no_such_hca0", 1);
    ck_assert_int_ne(ops->probe(why, sizeof(why)), BRAID_OK);
    ck_assert_msg(strstr(why, "no_such_hca0") && strstr(why, "not found"), "%s", why);
    setenv("BRAID_IB_HCA", "x:0", 1);
    ck_assert_int_ne(ops->probe(why, sizeof(why)), BRAID_OK);
    ck_assert_msg(strstr(why, "BRAID_IB_HCA"), "%s", why);
    unsetenv("BRAID_IB_HCA");
    ck_assert_int_eq(ops->probe(why, sizeof(why)), BRAID_OK);
}
END_TEST

/* ---- through the process group ------------------------------------------- */

typedef struct {
    size_t count;
    braid_dtype dtype;
    braid_op op;
    int root;
    uint32_t seed;
} coll_case;

static int rank_uses_verbs(braid_pg *pg)
{
    return pg->transport && strcmp(pg->transport->name, "verbs") == 0;
}

static int rank_allreduce(braid_pg *pg, void *arg)
{
    const coll_case *cc = arg;
    int rank = braid_pg_rank(pg), n = braid_pg_size(pg);
    if (!rank_uses_verbs(pg))
        HARNESS_FAIL("rank %d: transport is %s, not verbs", rank, pg->transport ? pg->transport->name : "none");
    size_t es = braid_dtype_size(cc->dtype);
    void *buf = malloc(cc->count * es + 1);
    if (!buf)
        HARNESS_FAIL("rank %d: out of memory", rank);
    for (size_t i = 0; i < cc->count; i++)
        harness_store(cc->dtype, buf, i, (double)harness_value(rank, i, cc->seed, -8, 8));
    if (braid_allreduce(pg, buf, buf, cc->count, cc->dtype, cc->op, NULL, NULL) != BRAID_OK)
        HARNESS_FAIL("rank %d: allreduce of %zu: %s", rank, cc->count, braid_last_error());
    for (size_t i = 0; i < cc->count; i++) {
        double want = (double)harness_value(0, i, cc->seed, -8, 8);
        for (int r = 1; r < n; r++) {
            double v = (double)harness_value(r, i, cc->seed, -8, 8);
            want = cc->op == BRAID_MAX ? (v > want ? v : want) : want + v;
        }
        double got = harness_load(cc->dtype, buf, i);
        if (got != want)
            HARNESS_FAIL("rank %d: allreduce of %zu: element %zu is %g, expected %g", rank, cc->count, i, got, want);
    }
    free(buf);
    return 0;
}

static int rank_broadcast(braid_pg *pg, void *arg)
{
    const coll_case *cc = arg;
    int rank = braid_pg_rank(pg);
    uint8_t *buf = malloc(cc->count + 1);
    if (!buf)
        HARNESS_FAIL("rank %d: out of memory", rank);
    if (rank == cc->root)
        fill(buf, cc->count, cc->seed);
    else
        memset(buf, 0, cc->count);
    if (braid_broadcast(pg, buf, cc->count, BRAID_U8, cc->root, NULL, NULL) != BRAID_OK)
        HARNESS_FAIL("rank %d: broadcast of %zu from %d: %s", rank, cc->count, cc->root, braid_last_error());
    if (!check_fill(buf, cc->count, cc->seed))
        HARNESS_FAIL("rank %d: broadcast of %zu from %d: wrong data", rank, cc->count, cc->root);
    free(buf);
    return 0;
}

static braid_config verbs_cfg(void)
{
    braid_config cfg = BRAID_CONFIG_INIT;
    cfg.transports = "verbs";
    cfg.timeout_ms = 60000;
    return cfg;
}

static const size_t coll_counts[] = {0, 1, 7, 1000, 65537, (1 << 20) + 3};

START_TEST(pg_allreduce)
{
    int n = 2 + _i; /* 2, 3, 4 ranks */
    braid_config cfg = verbs_cfg();
    for (size_t k = 0; k < sizeof(coll_counts) / sizeof(coll_counts[0]); k++) {
        coll_case cc = {.count = coll_counts[k], .dtype = BRAID_F32, .op = BRAID_SUM, .seed = (uint32_t)k + 1};
        harness_result res;
        ck_assert_msg(harness_run(n, rank_allreduce, &cc, &cfg, 120, &res) == 0, "allreduce %zu on %d ranks",
                      cc.count, n);
        cc.dtype = BRAID_I32;
        cc.op = BRAID_MAX;
        ck_assert_msg(harness_run(n, rank_allreduce, &cc, &cfg, 120, &res) == 0, "max %zu on %d ranks", cc.count, n);
    }
}
END_TEST

START_TEST(pg_broadcast)
{
    int n = 2 + _i;
    braid_config cfg = verbs_cfg();
    const size_t sizes[] = {0, 1, 4097, (3 << 20) + 1};
    for (int root = 0; root < n; root++) {
        for (size_t k = 0; k < sizeof(sizes) / sizeof(sizes[0]); k++) {
            coll_case cc = {.count = sizes[k], .root = root, .seed = (uint32_t)(root * 10 + k)};
            harness_result res;
            ck_assert_msg(harness_run(n, rank_broadcast, &cc, &cfg, 120, &res) == 0, "broadcast %zu from %d of %d",
                          cc.count, root, n);
        }
    }
}
END_TEST

/* With no BRAID_TRANSPORT at all, a working device is preferred to TCP. */
START_TEST(pg_auto_selects_verbs)
{
    unsetenv("BRAID_TRANSPORT");
    braid_config cfg = BRAID_CONFIG_INIT;
    coll_case cc = {.count = 4099, .dtype = BRAID_F32, .op = BRAID_SUM, .seed = 9};
    harness_result res;
    ck_assert_int_eq(harness_run(2, rank_allreduce, &cc, &cfg, 120, &res), 0);
}
END_TEST

static Suite *verbs_suite(void)
{
    Suite *s = suite_create("verbs");
    TCase *pair = tcase_create("ops");
    tcase_add_test(pair, probe_reasons);
    tcase_add_test(pair, pair_sizes_both_ways);
    tcase_add_test(pair, pair_pingpong);
    tcase_add_test(pair, pair_zero_copy);
    tcase_add_test(pair, pair_mismatch);
    tcase_add_test(pair, pair_peer_closes);
    tcase_add_test(pair, pair_peer_dies);
    tcase_set_timeout(pair, 180);
    suite_add_tcase(s, pair);

    TCase *pg = tcase_create("process_group");
    tcase_add_loop_test(pg, pg_allreduce, 0, 3);
    tcase_add_loop_test(pg, pg_broadcast, 0, 3);
    tcase_add_test(pg, pg_auto_selects_verbs);
    tcase_set_timeout(pg, 600);
    suite_add_tcase(s, pg);
    return s;
}

int main(void)
{
    ops = braid__transport_get(BRAID_TRANSPORT_VERBS);
    char why[512] = "";
    if (!ops || ops->probe(why, sizeof(why)) != BRAID_OK) {
        printf("SKIP: verbs transport unusable here: %s\n", why);
        return SKIP;
    }
    SRunner *sr = srunner_create(verbs_suite());
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? 1 : 0;
}
#endif /* BRAID_HAVE_VERBS */
