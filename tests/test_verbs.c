/* Verbs transport end to end. Built twice:
 *  - test_verbs, against libibverbs, for a machine with an RDMA device (a
 *    real HCA or Soft-RoCE: see docs/TRANSPORTS.md); without a usable
 *    device the suite is skipped (exit 77) with the probe's reason;
 *  - test_verbs_fake (BRAID_VERBS_FAKE), against tests/verbs_fake.c, an
 *    in-process stand-in for the device that checks the hardware's rules,
 *    so the transport's device, queue-pair, completion and teardown code
 *    runs everywhere.
 * Both drive the ops table with two ranks (ping-pong, zero copy from
 * registered memory, the wake fd) and 2-4 ranks through braid_pg_init
 * with the verbs transport (all-reduce and broadcast, exact results); the
 * contract every transport keeps (sizes both ways, order, mismatches, a
 * peer that leaves) is tests/test_transport.c's, run over verbs too. The fake build also checks
 * the group's agreement on verbs (a rank whose port is DOWN, a low
 * RLIMIT_MEMLOCK: every rank falls back to TCP, one log line says why) and
 * a queue pair that cannot reach RTR. With hardware, ranks are
 * processes; with the fake, ranks are threads of one process (an RDMA
 * write there is a memcpy) and failures are injected. */
#include <check.h>
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/wait.h>
#include <unistd.h>

#include "braid.h"
#include "braid_transport.h"
#include "clock.h"
#include "harness.h"
#include "pg.h"
#include "status.h"
#include "transport_pair.h"
#include "transports/registry.h"
#ifdef BRAID_HAVE_VERBS
#include "transports/verbs/verbs_conn.h"
#endif
#ifdef BRAID_VERBS_FAKE
#include <infiniband/verbs.h>

#include <linux/capability.h>
#include <sys/resource.h>
#include <sys/syscall.h>

#include "verbs_fake.h"
#endif

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

typedef int (*side_fn)(int rank, braid_conn *conn, void *arg);

/* A 4-byte exchange both ways: the connection is up on both sides after
 * it (set-up finishes on first use). */
static braid_status sync_pair(braid_conn *c, int rank)
{
    uint32_t out = (uint32_t)rank, in = 0;
    braid_req r[2];
    braid_status st = ops->isend(c, &r[0], &out, sizeof(out));
    if (st == BRAID_OK)
        st = ops->irecv(c, &r[1], &in, sizeof(in));
    if (st == BRAID_OK)
        st = tp_wait_all(r, 2, 20000);
    if (st == BRAID_OK && in != (uint32_t)(1 - rank))
        st = braid__error(BRAID_ERR_INTERNAL, "rank %d: sync got %u", rank, in);
    return st;
}

#ifndef BRAID_VERBS_FAKE
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
    *rc0 = harness_wait_child(pid0, 120);
    *rc1 = harness_wait_child(pid1, 120);
}
#else
/* The fake connects queue pairs of one process only: rank 0 dials from a
 * thread, rank 1 accepts on this one. Afterwards every verbs object must
 * be gone. */
typedef struct {
    side_fn fn;
    void *arg;
    char addr[BRAID_ADDR_MAX];
    int rc;
} dialer;

static void *dial_main(void *p)
{
    dialer *d = p;
    braid_transport_ctx ctx = make_ctx(0, 2);
    braid_conn *conn;
    if (ops->connect(&ctx, 1, d->addr, 20000, &conn) != BRAID_OK) {
        fprintf(stderr, "rank 0: connect: %s\n", braid_last_error());
        d->rc = 12;
        return NULL;
    }
    d->rc = d->fn(0, conn, d->arg);
    ops->close(conn);
    return NULL;
}

static void check_no_leaks(void)
{
    char desc[200];
    ck_assert_msg(verbs_fake_live(desc, sizeof(desc)) == 0, "verbs objects left: %s", desc);
}

static void run_pair(side_fn fn, void *arg, int *rc0, int *rc1)
{
    braid_transport_ctx ctx = make_ctx(1, 2);
    braid_listener *l;
    dialer d = {.fn = fn, .arg = arg, .rc = -1};
    ck_assert_msg(ops->listen(&ctx, &l, d.addr) == BRAID_OK, "listen: %s", braid_last_error());
    pthread_t t;
    ck_assert_int_eq(pthread_create(&t, NULL, dial_main, &d), 0);
    braid_conn *conn;
    *rc1 = 12;
    if (ops->accept(l, 0, 20000, &conn) == BRAID_OK) {
        *rc1 = fn(1, conn, arg);
        ops->close(conn);
    } else {
        fprintf(stderr, "rank 1: accept: %s\n", braid_last_error());
    }
    pthread_join(t, NULL);
    ops->close_listener(l);
    *rc0 = d.rc;
    check_no_leaks();
}
#endif

#define FAIL(...)                                                                                                      \
    do {                                                                                                               \
        fprintf(stderr, __VA_ARGS__);                                                                                  \
        fputc('\n', stderr);                                                                                           \
        return 1;                                                                                                      \
    } while (0)

/* ---- ops level ----------------------------------------------------------- */

/* A ping-pong of 2000 small messages: the credit path under latency. */
static int side_pingpong(int rank, braid_conn *c, void *arg)
{
    (void)arg;
    uint32_t v = 0;
    for (uint32_t i = 0; i < 2000; i++) {
        braid_req r;
        if (rank == 0) {
            v = i;
            if (ops->isend(c, &r, &v, sizeof(v)) != BRAID_OK || tp_wait_all(&r, 1, 20000) != BRAID_OK)
                FAIL("rank 0: send %u: %s", i, braid_last_error());
            if (ops->irecv(c, &r, &v, sizeof(v)) != BRAID_OK || tp_wait_all(&r, 1, 20000) != BRAID_OK)
                FAIL("rank 0: recv %u: %s", i, braid_last_error());
            if (v != i + 1)
                FAIL("rank 0: got %u, expected %u", v, i + 1);
        } else {
            if (ops->irecv(c, &r, &v, sizeof(v)) != BRAID_OK || tp_wait_all(&r, 1, 20000) != BRAID_OK)
                FAIL("rank 1: recv %u: %s", i, braid_last_error());
            v++;
            if (ops->isend(c, &r, &v, sizeof(v)) != BRAID_OK || tp_wait_all(&r, 1, 20000) != BRAID_OK)
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

/* Registration-cache hits of the device behind c (white box: the only
 * sign that a send went zero-copy). */
static uint64_t cache_hits(braid_conn *c)
{
    braid_verbs_dev *dev = braid__verbs_conn_of(c)->dev;
    pthread_mutex_lock(&dev->mu);
    uint64_t hits = dev->cache.stats.hits;
    pthread_mutex_unlock(&dev->mu);
    return hits;
}

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
        tp_fill(buf, len, 42);
        void *h;
        if (!BRAID_TRANSPORT_HAS(ops, reg_mem) || ops->reg_mem(c, buf, len, &h) != BRAID_OK)
            FAIL("rank 0: reg_mem: %s", braid_last_error());
        braid_req r[3];
        uint64_t hits = cache_hits(c);
        if (ops->isend(c, &r[0], buf, len / 2) != BRAID_OK || ops->isend(c, &r[1], buf + len / 2, len / 2) != BRAID_OK)
            FAIL("rank 0: isend: %s", braid_last_error());
        if (tp_wait_all(r, 2, 30000) != BRAID_OK)
            FAIL("rank 0: zero-copy sends: %s", braid_last_error());
        if (cache_hits(c) != hits + 2)
            FAIL("rank 0: %llu registration hits for two sends from registered memory",
                 (unsigned long long)(cache_hits(c) - hits));
        if (ops->dereg_mem(c, h) != BRAID_OK)
            FAIL("rank 0: dereg_mem: %s", braid_last_error());
        tp_fill(buf, len, 43);
        hits = cache_hits(c);
        if (ops->isend(c, &r[2], buf, len) != BRAID_OK || tp_wait_all(&r[2], 1, 30000) != BRAID_OK)
            FAIL("rank 0: staged send: %s", braid_last_error());
        if (cache_hits(c) != hits && !getenv("BRAID_IB_REGCACHE"))
            FAIL("rank 0: a send from deregistered memory still went zero-copy");
    } else {
        braid_req r[2];
        if (ops->irecv(c, &r[0], buf, len / 2) != BRAID_OK || ops->irecv(c, &r[1], buf + len / 2, len / 2) != BRAID_OK)
            FAIL("rank 1: irecv: %s", braid_last_error());
        if (tp_wait_all(r, 2, 30000) != BRAID_OK)
            FAIL("rank 1: receives: %s", braid_last_error());
        if (!tp_check_fill(buf, len, 42))
            FAIL("rank 1: zero-copy data corrupted");
        if (ops->irecv(c, &r[0], buf, len) != BRAID_OK || tp_wait_all(r, 1, 30000) != BRAID_OK)
            FAIL("rank 1: receive: %s", braid_last_error());
        if (!tp_check_fill(buf, len, 43))
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

/* progress() must hand control back as soon as the owner's wake fd is
 * readable, even with nothing to do on the connection. */
static int side_wake(int rank, braid_conn *c, void *arg)
{
    (void)arg;
    if (sync_pair(c, rank) != BRAID_OK)
        FAIL("rank %d: sync: %s", rank, braid_last_error());
    if (rank == 0) { /* stay until rank 1 is done */
        if (sync_pair(c, rank) != BRAID_OK)
            FAIL("rank 0: final sync: %s", braid_last_error());
        return 0;
    }
    int fd = eventfd(0, EFD_CLOEXEC);
    uint64_t one = 1;
    if (fd < 0 || write(fd, &one, sizeof(one)) != (ssize_t)sizeof(one))
        FAIL("rank 1: eventfd: %s", strerror(errno));
    int64_t t0 = braid__now_ms();
    braid_status st = ops->progress(&c, 1, fd, 5000);
    int64_t took = braid__now_ms() - t0;
    close(fd);
    if (st != BRAID_OK || took > 1000)
        FAIL("rank 1: progress with a readable wake fd: %s after %lld ms", braid_status_string(st), (long long)took);
    if (sync_pair(c, rank) != BRAID_OK)
        FAIL("rank 1: final sync: %s", braid_last_error());
    return 0;
}

START_TEST(pair_wake_fd)
{
    int rc0, rc1;
    run_pair(side_wake, NULL, &rc0, &rc1);
    ck_assert_int_eq(rc0, 0);
    ck_assert_int_eq(rc1, 0);
}
END_TEST

#ifdef BRAID_VERBS_FAKE
static void expect_probe(braid_status want, const char *needle)
{
    char why[512] = "";
    braid_status st = ops->probe(why, sizeof(why));
    ck_assert_msg(st == want && (!needle || strstr(why, needle)), "probe gave %s '%s', expected %s '%s'",
                  braid_status_string(st), why, braid_status_string(want), needle ? needle : "");
}

START_TEST(fake_probe_reasons)
{
    setenv("FAKE_VERBS_DEVICES", "0", 1);
    expect_probe(BRAID_ERR_UNSUPPORTED, "no RDMA devices found");
    unsetenv("FAKE_VERBS_DEVICES");
    setenv("FAKE_VERBS_PORT_STATE", "DOWN", 1);
    expect_probe(BRAID_ERR_UNSUPPORTED, "port 1 of fake0 is DOWN");
    unsetenv("FAKE_VERBS_PORT_STATE");
    setenv("BRAID_IB_HCA", "fake0:2", 1);
    expect_probe(BRAID_ERR_UNSUPPORTED, "fake0 has no port 2 (it has 1)");
    setenv("BRAID_IB_HCA", "mlx5_9,fake0:1", 1);
    expect_probe(BRAID_OK, NULL);
    unsetenv("BRAID_IB_HCA");
    setenv("BRAID_IB_GID_INDEX", "3", 1);
    expect_probe(BRAID_ERR_UNSUPPORTED, "BRAID_IB_GID_INDEX=3 is not a valid GID of fake0 port 1");
    setenv("BRAID_IB_GID_INDEX", "2", 1);
    expect_probe(BRAID_OK, NULL);
    unsetenv("BRAID_IB_GID_INDEX");
    const char *link = getenv("FAKE_VERBS_LINK");
    setenv("FAKE_VERBS_LINK", "IB", 1);
    setenv("FAKE_VERBS_LID", "0", 1);
    expect_probe(BRAID_ERR_UNSUPPORTED, "port 1 of fake0 has no LID (is a subnet manager running?)");
    unsetenv("FAKE_VERBS_LID");
    expect_probe(BRAID_OK, NULL);
    if (link)
        setenv("FAKE_VERBS_LINK", link, 1);
    else
        unsetenv("FAKE_VERBS_LINK");
    check_no_leaks();
}
END_TEST

/* A failed work completion fails rank 0's connection with the hardware's
 * reason; rank 1 hears of it without a goodbye. */
static int side_error(int rank, braid_conn *c, void *arg)
{
    (void)arg;
    uint8_t buf[1000] = {0};
    braid_req r;
    braid_status st;
    if (sync_pair(c, rank) != BRAID_OK)
        FAIL("rank %d: sync: %s", rank, braid_last_error());
    if (rank == 0) {
        verbs_fake_fail_next_write(IBV_WC_RETRY_EXC_ERR);
        if (ops->isend(c, &r, buf, sizeof(buf)) != BRAID_OK)
            FAIL("rank 0: isend: %s", braid_last_error());
        int64_t deadline = braid__now_ms() + 5000;
        st = BRAID_OK;
        while (st == BRAID_OK && braid__now_ms() < deadline)
            st = ops->progress(&c, 1, -1, 50);
        if (st != BRAID_ERR_PEER || !strstr(braid_last_error(), "rank 0: verbs connection to peer 1") ||
            !strstr(braid_last_error(), "transport retry counter exceeded"))
            FAIL("rank 0: expected the failed write, got %s: %s", braid_status_string(st), braid_last_error());
        if (ops->isend(c, &r, buf, 1) != BRAID_ERR_PEER || !strstr(braid_last_error(), "retry counter"))
            FAIL("rank 0: the failure is not sticky: %s", braid_last_error());
        return 0;
    }
    if (ops->irecv(c, &r, buf, sizeof(buf)) != BRAID_OK)
        FAIL("rank 1: irecv: %s", braid_last_error());
    st = tp_wait_all(&r, 1, 10000);
    /* Either its TCP end closes without a goodbye, or a credit we still
     * owed it hits its queue pair in ERR: both are the peer's loss. */
    if (st != BRAID_ERR_PEER || !strstr(braid_last_error(), "rank 1: verbs connection to peer 0") ||
        (!strstr(braid_last_error(), "without a verbs goodbye") && !strstr(braid_last_error(), "retry counter")))
        FAIL("rank 1: expected the peer's loss, got %s: %s", braid_status_string(st), braid_last_error());
    return 0;
}

/* Rank 0's queue pair cannot reach RTR: it fails with the peer and the
 * status, and tells rank 1, which fails too instead of waiting. */
static int side_rtr_fail(int rank, braid_conn *c, void *arg)
{
    (void)arg;
    if (rank == 0)
        verbs_fake_thread_fail_rtr(ETIMEDOUT);
    braid_status st = sync_pair(c, rank);
    const char *e = braid_last_error();
    if (rank == 0 && (st == BRAID_OK || !strstr(e, "peer 1: queue pair to RTR") || !strstr(e, strerror(ETIMEDOUT))))
        FAIL("rank 0: expected the RTR failure, got %s: %s", braid_status_string(st), e);
    if (rank == 1 && (st != BRAID_ERR_PEER || !strstr(e, "peer 0 could not connect its verbs queue pair")))
        FAIL("rank 1: expected the peer's set-up failure, got %s: %s", braid_status_string(st), e);
    return 0;
}

START_TEST(fake_rtr_failure)
{
    int rc0, rc1;
    run_pair(side_rtr_fail, NULL, &rc0, &rc1);
    ck_assert_int_eq(rc0, 0);
    ck_assert_int_eq(rc1, 0);
}
END_TEST

START_TEST(fake_error_completion)
{
    int rc0, rc1;
    run_pair(side_error, NULL, &rc0, &rc1);
    ck_assert_int_eq(rc0, 0);
    ck_assert_int_eq(rc1, 0);
}
END_TEST
#endif

/* ---- through the process group ------------------------------------------- */

#ifdef BRAID_VERBS_FAKE
/* Ranks as threads of this process (see run_pair). */
typedef struct {
    int rank, n;
    const braid_unique_id_t *id;
    const braid_config *cfg;
    harness_rank_fn fn;
    void *arg;
    int rc;
} rank_thread;

/* The rank whose thread sees the fake port DOWN (-1: none), and each
 * rank's init error text. */
static int down_rank = -1;
static char init_error[8][512];

static void *rank_main(void *p)
{
    rank_thread *r = p;
    braid_pg *pg;
    verbs_fake_thread_port_down(r->rank == down_rank);
    init_error[r->rank][0] = '\0';
    if (braid_pg_init(&pg, r->rank, r->n, r->id, r->cfg) != BRAID_OK) {
        snprintf(init_error[r->rank], sizeof(init_error[r->rank]), "%s", braid_last_error());
        fprintf(stderr, "rank %d: init failed: %s\n", r->rank, braid_last_error());
        r->rc = 10;
        return NULL;
    }
    r->rc = r->fn(pg, r->arg);
    braid_pg_destroy(pg);
    return NULL;
}

static int run_group(int n, harness_rank_fn fn, void *arg, const braid_config *cfg)
{
    braid_unique_id_t id;
    ck_assert_int_eq(braid_unique_id(&id), BRAID_OK);
    rank_thread r[8];
    pthread_t t[8];
    ck_assert_int_le(n, 8);
    for (int i = 0; i < n; i++) {
        r[i] = (rank_thread){.rank = i, .n = n, .id = &id, .cfg = cfg, .fn = fn, .arg = arg, .rc = -1};
        ck_assert_int_eq(pthread_create(&t[i], NULL, rank_main, &r[i]), 0);
    }
    int failures = 0;
    for (int i = 0; i < n; i++) {
        pthread_join(t[i], NULL);
        failures += r[i].rc != 0;
    }
    check_no_leaks();
    return failures;
}
#else
static int run_group(int n, harness_rank_fn fn, void *arg, const braid_config *cfg)
{
    harness_result res;
    return harness_run(n, fn, arg, cfg, 120, &res);
}
#endif

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

static int allreduce_exact(braid_pg *pg, const coll_case *cc);

static int rank_allreduce(braid_pg *pg, void *arg)
{
    const coll_case *cc = arg;
    int rank = braid_pg_rank(pg);
    if (!rank_uses_verbs(pg))
        HARNESS_FAIL("rank %d: transport is %s, not verbs", rank, pg->transport ? pg->transport->name : "none");
    return allreduce_exact(pg, cc);
}

/* An all-reduce whose every element must come out exact. */
static int allreduce_exact(braid_pg *pg, const coll_case *cc)
{
    int rank = braid_pg_rank(pg), n = braid_pg_size(pg);
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
        tp_fill(buf, cc->count, cc->seed);
    else
        memset(buf, 0, cc->count);
    if (braid_broadcast(pg, buf, cc->count, BRAID_U8, cc->root, NULL, NULL) != BRAID_OK)
        HARNESS_FAIL("rank %d: broadcast of %zu from %d: %s", rank, cc->count, cc->root, braid_last_error());
    if (!tp_check_fill(buf, cc->count, cc->seed))
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
        ck_assert_msg(run_group(n, rank_allreduce, &cc, &cfg) == 0, "allreduce %zu on %d ranks", cc.count, n);
        cc.dtype = BRAID_I32;
        cc.op = BRAID_MAX;
        ck_assert_msg(run_group(n, rank_allreduce, &cc, &cfg) == 0, "max %zu on %d ranks", cc.count, n);
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
            ck_assert_msg(run_group(n, rank_broadcast, &cc, &cfg) == 0, "broadcast %zu from %d of %d", cc.count, root,
                          n);
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
    ck_assert_int_eq(run_group(2, rank_allreduce, &cc, &cfg), 0);
}
END_TEST

#ifdef BRAID_VERBS_FAKE
/* ---- group agreement on verbs (docs/TRANSPORTS.md) ------------------------ */

typedef struct {
    coll_case cc;
    const char *transport; /* every rank's group transport must be this */
} agree_case;

static int rank_agree(braid_pg *pg, void *arg)
{
    const agree_case *ac = arg;
    const char *got = pg->transport ? pg->transport->name : "none";
    if (strcmp(got, ac->transport) != 0)
        HARNESS_FAIL("rank %d: transport is %s, expected %s", braid_pg_rank(pg), got, ac->transport);
    return allreduce_exact(pg, &ac->cc);
}

/* Log INFO lines of this (forked) test process into a fresh file; the
 * level is read at the first log line, which comes after this. */
static char log_path[128];

static void log_to_file(void)
{
    snprintf(log_path, sizeof(log_path), "/tmp/braid-test-verbs-%d.log", (int)getpid());
    unlink(log_path);
    setenv("BRAID_DEBUG", "INFO", 1);
    setenv("BRAID_DEBUG_FILE", log_path, 1);
}

/* Lines of the log containing needle; the first one into line. */
static int log_lines(const char *needle, char *line, size_t cap)
{
    FILE *f = fopen(log_path, "r");
    char buf[2048];
    int n = 0;
    if (line)
        line[0] = '\0';
    if (!f)
        return 0;
    while (fgets(buf, sizeof(buf), f)) {
        if (!strstr(buf, needle))
            continue;
        if (n++ == 0 && line)
            snprintf(line, cap, "%s", buf);
    }
    fclose(f);
    return n;
}

/* Every rank's probe passes: verbs is the group's transport on every rank,
 * automatically or from a list, and nothing is logged as disabled. */
START_TEST(agree_all_ok)
{
    log_to_file();
    unsetenv("BRAID_TRANSPORT");
    down_rank = -1;
    agree_case ac = {.cc = {.count = 65537, .dtype = BRAID_F32, .op = BRAID_SUM, .seed = 21}, .transport = "verbs"};
    braid_config cfg = verbs_cfg();
    cfg.transports = "verbs,tcp";
    ck_assert_int_eq(run_group(3, rank_agree, &ac, &cfg), 0);
    cfg.transports = NULL;
    ck_assert_int_eq(run_group(3, rank_agree, &ac, &cfg), 0);
    ck_assert_int_eq(log_lines("disabled:", NULL, 0), 0);
    unlink(log_path);
}
END_TEST

/* One rank's port is DOWN: every rank falls back to TCP, results stay
 * exact, and exactly one line says which rank and why. Forced alone, verbs
 * fails every rank's init with that reason. */
START_TEST(agree_one_rank_down)
{
    int n = 3 + _i, bad = _i ? 3 : 1; /* 3 ranks with rank 1 down, 4 with rank 3 */
    char want_line[128], line[2048];
    log_to_file();
    unsetenv("BRAID_TRANSPORT");
    down_rank = bad;
    agree_case ac = {.cc = {.count = (1 << 20) + 3, .dtype = BRAID_F32, .op = BRAID_SUM, .seed = 5},
                     .transport = "tcp"};
    braid_config cfg = verbs_cfg();
    cfg.transports = "verbs,tcp";
    ck_assert_int_eq(run_group(n, rank_agree, &ac, &cfg), 0);
    snprintf(want_line, sizeof(want_line), "verbs disabled: rank %d: port 1 of fake0 is DOWN; using tcp", bad);
    ck_assert_msg(log_lines("disabled:", line, sizeof(line)) == 1 && strstr(line, want_line),
                  "expected one line with '%s', got %d, first '%s'", want_line, log_lines("disabled:", NULL, 0), line);
    ck_assert_int_eq(log_lines("unusable", NULL, 0), 0); /* no per-rank lines besides */

    /* automatic selection: TCP as the group transport (same-host pairs
     * take shm, as without verbs) */
    cfg.transports = NULL;
    ac.cc.dtype = BRAID_I32;
    ac.cc.op = BRAID_MAX;
    ck_assert_int_eq(run_group(n, rank_agree, &ac, &cfg), 0);
    ck_assert_int_eq(log_lines("disabled:", NULL, 0), 2);

    /* forced: no rank starts, each says who and why */
    cfg.transports = "verbs";
    ck_assert_int_eq(run_group(n, rank_agree, &ac, &cfg), n);
    snprintf(want_line, sizeof(want_line), "rank %d: port 1 of fake0 is DOWN", bad);
    for (int r = 0; r < n; r++)
        ck_assert_msg(strstr(init_error[r], want_line) && strstr(init_error[r], "'verbs'"), "rank %d: %s", r,
                      init_error[r]);
    down_rank = -1;
    unlink(log_path);
}
END_TEST

/* Drop CAP_IPC_LOCK from this thread (and the threads it creates next), so
 * RLIMIT_MEMLOCK applies even to root. */
static void drop_ipc_lock(void)
{
    struct __user_cap_header_struct hdr = {.version = _LINUX_CAPABILITY_VERSION_3, .pid = 0};
    struct __user_cap_data_struct data[_LINUX_CAPABILITY_U32S_3];
    ck_assert_int_eq(syscall(SYS_capget, &hdr, data), 0);
    data[CAP_IPC_LOCK / 32].effective &= ~(1u << (CAP_IPC_LOCK % 32));
    ck_assert_int_eq(syscall(SYS_capset, &hdr, data), 0);
}

/* A memlock limit below one connection's rings: the probe refuses with the
 * limit and the need, and the group falls back to TCP. */
START_TEST(agree_memlock)
{
    char line[2048];
    log_to_file();
    unsetenv("BRAID_TRANSPORT");
    down_rank = -1;
    drop_ipc_lock();
    struct rlimit rl;
    ck_assert_int_eq(getrlimit(RLIMIT_MEMLOCK, &rl), 0);
    rl.rlim_cur = 64 * 1024;
    ck_assert_int_eq(setrlimit(RLIMIT_MEMLOCK, &rl), 0);
    expect_probe(BRAID_ERR_UNSUPPORTED, "RLIMIT_MEMLOCK is 64 KiB, need 8192 KiB per connection");
    expect_probe(BRAID_ERR_UNSUPPORTED, "raise ulimit -l");
    agree_case ac = {.cc = {.count = 4099, .dtype = BRAID_F64, .op = BRAID_SUM, .seed = 8}, .transport = "tcp"};
    braid_config cfg = verbs_cfg();
    cfg.transports = "verbs,tcp";
    ck_assert_int_eq(run_group(2, rank_agree, &ac, &cfg), 0);
    ck_assert_msg(log_lines("disabled:", line, sizeof(line)) == 1 &&
                      strstr(line, "verbs disabled: rank 0: RLIMIT_MEMLOCK is 64 KiB") &&
                      strstr(line, "(and 1 more rank); using tcp"),
                  "log line: '%s'", line);
    /* smaller rings fit: 2 x 4 slots x 4 KiB = 32 KiB */
    setenv("BRAID_IB_SLOTS", "4", 1);
    setenv("BRAID_IB_SLOT_BYTES", "4096", 1);
    expect_probe(BRAID_OK, NULL);
    unsetenv("BRAID_IB_SLOTS");
    unsetenv("BRAID_IB_SLOT_BYTES");
    unlink(log_path);
}
END_TEST
#endif

static Suite *verbs_suite(void)
{
    Suite *s = suite_create("verbs");
    TCase *pair = tcase_create("ops");
    tcase_add_test(pair, probe_reasons);
    tcase_add_test(pair, pair_wake_fd);
#ifdef BRAID_VERBS_FAKE
    tcase_add_test(pair, fake_probe_reasons);
    tcase_add_test(pair, fake_error_completion);
    tcase_add_test(pair, fake_rtr_failure);
#endif
    tcase_add_test(pair, pair_pingpong);
    tcase_add_test(pair, pair_zero_copy);
    tcase_set_timeout(pair, 180);
    suite_add_tcase(s, pair);

    TCase *pg = tcase_create("process_group");
    tcase_add_loop_test(pg, pg_allreduce, 0, 3);
    tcase_add_loop_test(pg, pg_broadcast, 0, 3);
    tcase_add_test(pg, pg_auto_selects_verbs);
#ifdef BRAID_VERBS_FAKE
    tcase_add_test(pg, agree_all_ok);
    tcase_add_loop_test(pg, agree_one_rank_down, 0, 2);
    tcase_add_test(pg, agree_memlock);
#endif
    tcase_set_timeout(pg, 600);
    suite_add_tcase(s, pg);
    return s;
}

int main(void)
{
    ops = braid__transport_get(BRAID_TRANSPORT_VERBS);
    tp.ops = ops; /* the shared helpers (transport_pair.h) drive verbs */
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
