/* Shared-memory transport suite, what only shm has: two real processes
 * exchanging sizes around the ring's size and wrap, ring rewinds, wrong
 * secrets, peers killed mid-transfer or freeing their buffer, descriptor
 * and /dev/shm leaks, then 2- and 4-rank groups running all-reduce and
 * broadcast over it, alone and beside TCP. The contract every transport
 * keeps (sizes both ways, order, mismatches, a peer that leaves) is
 * tests/test_transport.c's. */
#include <check.h>
#include <dirent.h>
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <poll.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include "bootstrap/bootstrap.h"
#include "braid_transport.h"
#include "clock.h"
#include "harness.h"
#include "pg.h"
#include "transport_pair.h"
#include "transports/shm/shm.h"
#include "transports/shm/shm_conn.h"

static const braid_transport_ops *ops = &braid__shm_ops;

#define PG_TAG 0x0123456789abcdefull
#define MiB ((size_t)1 << 20)

static braid_transport_ctx make_ctx(int rank, int size, uint8_t key)
{
    braid_transport_ctx ctx;
    memset(&ctx, 0, sizeof(ctx));
    ctx.rank = rank;
    ctx.size = size;
    for (int i = 0; i < BRAID_SECRET_BYTES; i++)
        ctx.secret[i] = (uint8_t)(key + i);
    ctx.pg_tag = PG_TAG;
    ctx.timeout_ms = 10000;
    ctx.nsocks = 1;
    return ctx;
}

static int count_fds(void)
{
    DIR *d = opendir("/proc/self/fd");
    int n = 0;
    if (!d)
        return -1;
    while (readdir(d))
        n++;
    closedir(d);
    return n;
}

static int dev_shm_braid_entries(void)
{
    DIR *d = opendir("/dev/shm");
    int n = 0;
    if (!d)
        return 0;
    for (struct dirent *e; (e = readdir(d));)
        if (strstr(e->d_name, "braid"))
            n++;
    closedir(d);
    return n;
}

/* ---- a pair of processes ------------------------------------------------- */

typedef int (*side_fn)(braid_conn *conn, void *arg);

/* Children are forked before any braid thread exists and then read the
 * listener's address from a pipe (forking with another thread holding a
 * lock would leave the child a held copy). */
static void addr_recv(int fd, char addr[BRAID_ADDR_MAX])
{
    size_t got = 0;
    while (got < BRAID_ADDR_MAX) {
        ssize_t n = read(fd, addr + got, BRAID_ADDR_MAX - got);
        if (n <= 0 && !(n < 0 && errno == EINTR))
            _exit(99);
        if (n > 0)
            got += (size_t)n;
    }
    addr[BRAID_ADDR_MAX - 1] = '\0';
}

/* Rank 1 listens here; a forked rank 0 (with secret key child_key) dials
 * and runs dialer(); this process accepts and runs acceptor(). Returns
 * acceptor's result (20 when accept failed: *accept_st says why); the
 * dialer's exit code goes to *child_rc. */
static int run_pair_keyed(uint8_t child_key, side_fn dialer, side_fn acceptor, void *arg, int *child_rc,
                          braid_status *accept_st, int accept_ms)
{
    braid_transport_ctx c1 = make_ctx(1, 2, 0xa0);
    braid_listener *l;
    char addr[BRAID_ADDR_MAX] = {0};
    int pipefd[2];
    ck_assert_int_eq(pipe(pipefd), 0);
    pid_t pid = fork();
    ck_assert_int_ge(pid, 0);
    if (pid == 0) {
        close(pipefd[1]);
        addr_recv(pipefd[0], addr);
        braid_transport_ctx c0 = make_ctx(0, 2, child_key);
        braid_conn *conn;
        braid_status st = ops->connect(&c0, 1, addr, 5000, &conn);
        if (st != BRAID_OK)
            _exit(st == BRAID_ERR_AUTH ? 11 : 10);
        int rc = dialer(conn, arg);
        ops->close(conn);
        _exit(rc);
    }
    close(pipefd[0]);
    ck_assert_int_eq(ops->listen(&c1, &l, addr), BRAID_OK);
    ck_assert_int_eq(write(pipefd[1], addr, BRAID_ADDR_MAX), BRAID_ADDR_MAX);
    close(pipefd[1]);
    braid_conn *conn;
    braid_status st = ops->accept(l, 0, accept_ms, &conn);
    if (accept_st)
        *accept_st = st;
    int rc = 20;
    if (st == BRAID_OK) {
        rc = acceptor(conn, arg);
        ops->close(conn);
    }
    *child_rc = harness_wait_child(pid, 120);
    ops->close_listener(l);
    return rc;
}

static int run_pair(side_fn dialer, side_fn acceptor, void *arg, int *child_rc)
{
    return run_pair_keyed(0xa0, dialer, acceptor, arg, child_rc, NULL, 10000);
}

/* ---- sizes --------------------------------------------------------------- */

/* Around the header, the 4 MiB ring and its wrap, up to 64 MiB. */
static const size_t sizes[] = {0,
                               1,
                               7,
                               8,
                               4095,
                               65537,
                               BRAID_SHM_RING_BYTES - BRAID_SHM_HDR_BYTES,
                               BRAID_SHM_RING_BYTES,
                               BRAID_SHM_RING_BYTES + 1,
                               (16 * MiB) + 3,
                               64 * MiB};
#define NSIZES (sizeof(sizes) / sizeof(sizes[0]))

/* Dialer sends each size, acceptor checks it and answers with another
 * pattern of the same size, which the dialer checks. */
static int echo_dialer(braid_conn *c, void *arg)
{
    (void)arg;
    uint8_t *buf = malloc(64 * MiB);
    if (!buf)
        return 2;
    for (size_t i = 0; i < NSIZES; i++) {
        tp_fill(buf, sizes[i], i);
        if (tp_send(c, buf, sizes[i]) != BRAID_OK)
            return 3;
        memset(buf, 0, sizes[i]);
        if (tp_recv(c, buf, sizes[i]) != BRAID_OK)
            return 4;
        if (!tp_check_fill(buf, sizes[i], 1000 + i))
            return 5;
    }
    free(buf);
    return 0;
}

static int echo_acceptor(braid_conn *c, void *arg)
{
    (void)arg;
    uint8_t *buf = malloc(64 * MiB);
    if (!buf)
        return 2;
    for (size_t i = 0; i < NSIZES; i++) {
        memset(buf, 0xee, sizes[i]);
        if (tp_recv(c, buf, sizes[i]) != BRAID_OK)
            return 3;
        if (!tp_check_fill(buf, sizes[i], i))
            return 4;
        tp_fill(buf, sizes[i], 1000 + i);
        if (tp_send(c, buf, sizes[i]) != BRAID_OK)
            return 5;
    }
    free(buf);
    return 0;
}

/* Loop tests run twice: _i == 0 reads large messages in place, 1 copies
 * them through the ring (the fallback where process_vm_readv is denied). */
static void set_copy_mode(int i)
{
    setenv("BRAID_SHM_CMA", i ? "0" : "1", 1);
}

START_TEST(ring_edges)
{
    int child;
    set_copy_mode(_i);
    ck_assert_int_eq(run_pair(echo_dialer, echo_acceptor, NULL, &child), 0);
    ck_assert_int_eq(child, 0);
}
END_TEST

/* Ping-pong of mixed sizes: the sender rewinds to the ring's start (a skip
 * header) between many of them, with and without data still in the ring. */
static const size_t rewind_sizes[] = {40, 4096, 33000, 70000, 1, 131071, 200000, 8, 65536};
#define NREWIND 300

static int rewind_side(braid_conn *c, void *arg)
{
    (void)arg;
    int me = c->peer == 1 ? 0 : 1;
    uint8_t *out = malloc(2 * 200000), *in = malloc(200000);
    if (!out || !in)
        return 2;
    for (int i = 0; i < NREWIND; i++) {
        size_t len = rewind_sizes[i % (sizeof(rewind_sizes) / sizeof(rewind_sizes[0]))];
        braid_req reqs[3];
        tp_fill(out, len, (uint64_t)(me * 1000 + i));
        tp_fill(out + 200000, 40, (uint64_t)(me * 1000 + i + 7)); /* a second message right behind */
        if (ops->isend(c, &reqs[0], out, len) != BRAID_OK || ops->isend(c, &reqs[1], out + 200000, 40) != BRAID_OK ||
            ops->irecv(c, &reqs[2], in, len) != BRAID_OK || tp_wait_all(reqs + 2, 1, 30000) != BRAID_OK ||
            !tp_check_fill(in, len, (uint64_t)((1 - me) * 1000 + i)) || ops->irecv(c, &reqs[2], in, 40) != BRAID_OK ||
            tp_wait_all(reqs, 3, 30000) != BRAID_OK || !tp_check_fill(in, 40, (uint64_t)((1 - me) * 1000 + i + 7)))
            return 3;
    }
    free(out);
    free(in);
    return 0;
}

START_TEST(ring_rewinds)
{
    int child;
    set_copy_mode(_i);
    ck_assert_int_eq(run_pair(rewind_side, rewind_side, NULL, &child), 0);
    ck_assert_int_eq(child, 0);
}
END_TEST

static int never(braid_conn *c, void *arg)
{
    (void)c;
    (void)arg;
    return 30;
}

/* A dialler with another secret is refused and never handed out. */
START_TEST(wrong_secret)
{
    int child;
    braid_status st;
    ck_assert_int_eq(run_pair_keyed(0x11, never, never, NULL, &child, &st, 1500), 20);
    ck_assert_int_eq(st, BRAID_ERR_TIMEOUT);
    ck_assert_int_eq(child, 11);
}
END_TEST

/* The dying side takes part in the first of the survivor's two 64 MiB
 * transfers, then is killed. In place (CMA) the first transfer may well
 * finish before the kill, so the survivor's second one is what must fail:
 * it can only end through the death being noticed. */
#define DEATH_MSG_BYTES (64 * MiB)

static int die_mid_send(braid_conn *c, void *arg)
{
    (void)arg;
    uint8_t *buf = calloc(1, DEATH_MSG_BYTES);
    braid_req r;
    if (!buf || ops->isend(c, &r, buf, DEATH_MSG_BYTES) != BRAID_OK)
        return 3;
    usleep(100000);
    raise(SIGKILL);
    return 4;
}

static int die_mid_recv(braid_conn *c, void *arg)
{
    (void)arg;
    uint8_t *buf = malloc(DEATH_MSG_BYTES);
    braid_req r;
    if (!buf || ops->irecv(c, &r, buf, DEATH_MSG_BYTES) != BRAID_OK)
        return 3;
    for (int i = 0; i < 3; i++)
        ops->progress(&c, 1, -1, 20);
    raise(SIGKILL);
    return 4;
}

/* The survivor's wait ends with BRAID_ERR_PEER naming the peer, quickly. */
static int expect_peer_error(braid_conn *c, void *arg)
{
    int sending = *(int *)arg;
    uint8_t *buf = calloc(1, DEATH_MSG_BYTES);
    if (!buf)
        return 2;
    braid_req r[2];
    for (int i = 0; i < 2; i++) {
        braid_status st = sending ? ops->isend(c, &r[i], buf, DEATH_MSG_BYTES)
                                  : ops->irecv(c, &r[i], buf, DEATH_MSG_BYTES);
        if (st != BRAID_OK)
            return 3;
    }
    int64_t t0 = braid__now_ms();
    braid_status st = tp_wait_all(r, 2, 20000);
    int64_t took = braid__now_ms() - t0;
    free(buf);
    if (st != BRAID_ERR_PEER) {
        fprintf(stderr, "expected BRAID_ERR_PEER, got %s\n", braid_status_string(st));
        return 4;
    }
    if (!strstr(braid_last_error(), "peer 0"))
        return 5;
    return took < 3000 ? 0 : 6;
}

START_TEST(peer_killed)
{
    int child, sending = _i & 1; /* 0: the peer dies sending, we receive; 1: the reverse */
    set_copy_mode(_i >> 1);
    int fds_before = count_fds();
    int rc = run_pair(sending ? die_mid_recv : die_mid_send, expect_peer_error, &sending, &child);
    ck_assert_int_eq(rc, 0);
    ck_assert_int_eq(child, 128 + SIGKILL);
    ck_assert_int_eq(count_fds(), fds_before);
    ck_assert_int_eq(dev_shm_braid_entries(), 0);
}
END_TEST

/* A sender whose buffer is gone while the receiver reads it in place:
 * _i == 0: the sender failed first (closed its connection, as a failing
 * group does before its call returns) and then freed the buffer: the read's
 * EFAULT is the peer's failure, BRAID_ERR_PEER naming it (the CI flake of
 * group_rank_killed). _i == 1: the buffer is freed while the sender is
 * still connected, a bug rather than a failure: BRAID_ERR_SYSTEM that says
 * so. Pipes order the steps, so the outcome does not depend on timing. */
typedef struct {
    int close_first;
    int freed[2];   /* sender -> receiver: the buffer is gone */
    int checked[2]; /* receiver -> sender: the receive failed as expected */
    int in_place;   /* sender -> test, through the exit code */
} freed_arg;

#define FREED_BYTES (2 * MiB)

static int wait_byte(int fd)
{
    struct pollfd p = {.fd = fd, .events = POLLIN};
    uint8_t b;
    return poll(&p, 1, 30000) == 1 && read(fd, &b, 1) == 1 ? 0 : -1;
}

static int free_mid_send(braid_conn *c, void *arg)
{
    freed_arg *a = arg;
    uint8_t one = 1;
    /* One byte each way: both sides have tried single-copy reads. */
    if (tp_send(c, &one, 1) != BRAID_OK || tp_recv(c, &one, 1) != BRAID_OK)
        return 3;
    uint8_t *buf = mmap(NULL, FREED_BYTES, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (buf == MAP_FAILED)
        return 2;
    tp_fill(buf, FREED_BYTES, 9);
    braid_req r;
    if (ops->isend(c, &r, buf, FREED_BYTES) != BRAID_OK)
        return 4;
    int in_place = r.tp[2] != 0; /* REQ_CMA: the header carries our address */
    if (a->close_first) {
        braid_shm_conn *sc = braid__shm_conn_of(c);
        close(sc->sock);
        sc->sock = -1; /* the harness's close of the connection skips it */
    }
    munmap(buf, FREED_BYTES);
    if (write(a->freed[1], &one, 1) != 1 || wait_byte(a->checked[0]) != 0)
        return 5;
    return in_place ? 0 : 77;
}

static int read_freed(braid_conn *c, void *arg)
{
    freed_arg *a = arg;
    uint8_t one = 1;
    if (tp_recv(c, &one, 1) != BRAID_OK || tp_send(c, &one, 1) != BRAID_OK)
        return 3;
    if (wait_byte(a->freed[0]) != 0)
        return 4;
    uint8_t *buf = malloc(FREED_BYTES);
    if (!buf)
        return 2;
    braid_req r;
    braid_status st = ops->irecv(c, &r, buf, FREED_BYTES);
    if (st == BRAID_OK)
        st = tp_wait_all(&r, 1, 20000);
    free(buf);
    int rc = 0;
    braid_status want = a->close_first ? BRAID_ERR_PEER : BRAID_ERR_SYSTEM;
    const char *text = a->close_first ? "peer 0 failed" : "still connected";
    if (st != want || !strstr(braid_last_error(), text)) {
        fprintf(stderr, "read_freed: want %s with \"%s\", got %s: %s\n", braid_status_string(want), text,
                braid_status_string(st), braid_last_error());
        rc = 6;
    }
    if (write(a->checked[1], &one, 1) != 1)
        return 5;
    return rc;
}

START_TEST(peer_freed_buffer)
{
    set_copy_mode(0);
    freed_arg a = {.close_first = _i == 0};
    ck_assert_int_eq(pipe(a.freed), 0);
    ck_assert_int_eq(pipe(a.checked), 0);
    int child;
    int rc = run_pair(free_mid_send, read_freed, &a, &child);
    for (int i = 0; i < 2; i++) {
        close(a.freed[i]);
        close(a.checked[i]);
    }
    if (child == 77) {
        /* The sender copied through the ring: this host denies
         * process_vm_readv, so there is no in-place read to fail. */
        fprintf(stderr, "peer_freed_buffer: single-copy reads unavailable here, nothing to check\n");
        return;
    }
    ck_assert_int_eq(child, 0);
    ck_assert_int_eq(rc, 0);
}
END_TEST

/* Connections and listeners give back every descriptor and leave no
 * named shared memory behind. */
static int small_echo(braid_conn *c, void *arg)
{
    (void)arg;
    uint8_t b[64];
    tp_fill(b, sizeof(b), 5);
    if (c->peer == 1)
        return tp_send(c, b, sizeof(b)) == BRAID_OK && tp_recv(c, b, sizeof(b)) == BRAID_OK ? 0 : 3;
    return tp_recv(c, b, sizeof(b)) == BRAID_OK && tp_send(c, b, sizeof(b)) == BRAID_OK ? 0 : 3;
}

START_TEST(no_leaks)
{
    int before = count_fds(), child;
    for (int i = 0; i < 3; i++) {
        ck_assert_int_eq(run_pair(small_echo, small_echo, NULL, &child), 0);
        ck_assert_int_eq(child, 0);
    }
    ck_assert_int_eq(count_fds(), before);
    ck_assert_int_eq(dev_shm_braid_entries(), 0);
}
END_TEST

START_TEST(probe_ok)
{
    char why[128];
    ck_assert_int_eq(ops->probe(why, sizeof(why)), BRAID_OK);
}
END_TEST

/* ---- groups over shm ----------------------------------------------------- */

typedef struct {
    size_t count;
} group_arg;

static int check_shm_conns(braid_pg *pg)
{
    for (int p = 0; p < pg->size; p++)
        if (p != pg->rank && (!pg->conns[p] || strcmp(pg->conns[p]->ops->name, "shm") != 0))
            HARNESS_FAIL("rank %d: connection to peer %d is %s, not shm", pg->rank, p,
                         pg->conns[p] ? pg->conns[p]->ops->name : "missing");
    return 0;
}

static int group_body(braid_pg *pg, void *argp)
{
    const group_arg *a = argp;
    int rank = braid_pg_rank(pg), n = braid_pg_size(pg);
    if (check_shm_conns(pg))
        return 1;
    float *buf = malloc((a->count ? a->count : 1) * sizeof(float));
    if (!buf)
        HARNESS_FAIL("rank %d: out of memory", rank);
    for (uint32_t seed = 1; seed <= 2; seed++) {
        for (size_t i = 0; i < a->count; i++)
            buf[i] = (float)harness_value(rank, i, seed, -100, 100);
        braid_status st = braid_allreduce(pg, buf, buf, a->count, BRAID_F32, BRAID_SUM, NULL, NULL);
        if (st != BRAID_OK)
            HARNESS_FAIL("rank %d: allreduce: %s", rank, braid_last_error());
        for (size_t i = 0; i < a->count; i++) {
            double want = 0;
            for (int r = 0; r < n; r++)
                want += (double)harness_value(r, i, seed, -100, 100);
            if (buf[i] != (float)want)
                HARNESS_FAIL("rank %d: allreduce[%zu] = %g, want %g", rank, i, buf[i], want);
        }
        int root = (int)seed % n;
        for (size_t i = 0; i < a->count; i++)
            buf[i] = rank == root ? (float)harness_value(root, i, seed + 7, -1000, 1000) : -1.0f;
        st = braid_broadcast(pg, buf, a->count, BRAID_F32, root, NULL, NULL);
        if (st != BRAID_OK)
            HARNESS_FAIL("rank %d: broadcast: %s", rank, braid_last_error());
        for (size_t i = 0; i < a->count; i++)
            if (buf[i] != (float)harness_value(root, i, seed + 7, -1000, 1000))
                HARNESS_FAIL("rank %d: broadcast[%zu] = %g", rank, i, buf[i]);
    }
    free(buf);
    return 0;
}

static const size_t group_counts[] = {0, 1, 1000, 262147, 4 * 1024 * 1024};
#define NGROUP_COUNTS (sizeof(group_counts) / sizeof(group_counts[0]))

START_TEST(group_collectives)
{
    int nranks = _i & 1 ? 4 : 2;
    set_copy_mode(_i >> 1);
    braid_config cfg = BRAID_CONFIG_INIT;
    cfg.transports = "shm";
    cfg.timeout_ms = 60000;
    for (size_t k = 0; k < NGROUP_COUNTS; k++) {
        group_arg a = {.count = group_counts[k]};
        harness_result res;
        int failed = harness_run(nranks, group_body, &a, &cfg, 120, &res);
        ck_assert_msg(failed == 0, "%d of %d ranks failed at count %zu", failed, nranks, a.count);
    }
    ck_assert_int_eq(dev_shm_braid_entries(), 0);
}
END_TEST

/* A rank killed in the middle of all-reduces: every survivor fails with an
 * error instead of hanging. */
static int loop_body(braid_pg *pg, void *argp)
{
    (void)argp;
    size_t count = 1 << 20;
    float *buf = calloc(count, sizeof(float));
    if (!buf)
        return 1;
    for (int i = 0; i < 100000; i++) {
        braid_status st = braid_allreduce(pg, buf, buf, count, BRAID_F32, BRAID_SUM, NULL, NULL);
        if (st != BRAID_OK) {
            free(buf);
            return st == BRAID_ERR_PEER || st == BRAID_ERR_ABORTED ? 0 : 1;
        }
    }
    free(buf);
    return 1;
}

START_TEST(group_rank_killed)
{
    braid_config cfg = BRAID_CONFIG_INIT;
    cfg.transports = "shm";
    cfg.timeout_ms = 60000;
    harness_fault fault = {.rank = 2, .after_ms = 300, .signal = SIGKILL};
    harness_result res;
    int failed = harness_run_faulty(4, loop_body, NULL, &cfg, 60, &fault, &res);
    ck_assert_msg(failed == 0, "%d survivors did not fail cleanly", failed);
    ck_assert_msg(res.fault_to_end_s < 5.0, "survivors took %.1f s to notice", res.fault_to_end_s);
    ck_assert_int_eq(dev_shm_braid_entries(), 0);
}
END_TEST

/* Two pretend hosts of two ranks (BRAID_HOST_ID): 0-1 and 2-3 share
 * memory, 1-2 and 3-0 talk TCP, so every ring step waits on a connection
 * of each transport at once. */
static int mixed_rank(braid_pg *pg)
{
    int rank = pg->rank;
    for (int p = 0; p < pg->size; p++) {
        if (p == rank)
            continue;
        const char *want = p / 2 == rank / 2 ? "shm" : "tcp";
        if (!pg->conns[p] || strcmp(pg->conns[p]->ops->name, want) != 0)
            HARNESS_FAIL("rank %d: peer %d uses %s, want %s", rank, p,
                         pg->conns[p] ? pg->conns[p]->ops->name : "nothing", want);
        const char *named = braid_pg_peer_transport(pg, p);
        if (!named || strcmp(named, want) != 0)
            HARNESS_FAIL("rank %d: braid_pg_peer_transport(%d) = %s, want %s", rank, p, named ? named : "NULL", want);
    }
    for (size_t k = 0; k < NGROUP_COUNTS; k++) {
        group_arg a = {.count = group_counts[k]};
        /* group_body insists on shm everywhere: run its collectives part. */
        float *buf = malloc((a.count ? a.count : 1) * sizeof(float));
        if (!buf)
            return 1;
        for (size_t i = 0; i < a.count; i++)
            buf[i] = (float)harness_value(rank, i, 3, -100, 100);
        if (braid_allreduce(pg, buf, buf, a.count, BRAID_F32, BRAID_SUM, NULL, NULL) != BRAID_OK)
            HARNESS_FAIL("rank %d: allreduce: %s", rank, braid_last_error());
        for (size_t i = 0; i < a.count; i++) {
            double want = 0;
            for (int r = 0; r < pg->size; r++)
                want += (double)harness_value(r, i, 3, -100, 100);
            if (buf[i] != (float)want)
                HARNESS_FAIL("rank %d: allreduce[%zu] = %g, want %g", rank, i, buf[i], want);
        }
        for (size_t i = 0; i < a.count; i++)
            buf[i] = rank == 3 ? (float)harness_value(3, i, 4, -1000, 1000) : 0.0f;
        if (braid_broadcast(pg, buf, a.count, BRAID_F32, 3, NULL, NULL) != BRAID_OK)
            HARNESS_FAIL("rank %d: broadcast: %s", rank, braid_last_error());
        for (size_t i = 0; i < a.count; i++)
            if (buf[i] != (float)harness_value(3, i, 4, -1000, 1000))
                HARNESS_FAIL("rank %d: broadcast[%zu] = %g", rank, i, buf[i]);
        free(buf);
    }
    return 0;
}

START_TEST(group_mixed_transports)
{
    const int n = 4;
    braid_unique_id_t id;
    ck_assert_int_eq(braid_unique_id(&id), BRAID_OK);
    braid_config cfg = BRAID_CONFIG_INIT;
    cfg.transports = _i == 0 ? "shm,tcp" : NULL; /* explicit, and the automatic choice */
    cfg.timeout_ms = 60000;
    pid_t pids[4];
    for (int r = 0; r < n; r++) {
        fflush(NULL);
        pids[r] = fork();
        ck_assert_int_ge(pids[r], 0);
        if (pids[r] == 0) {
            setenv("BRAID_HOST_ID", r < 2 ? "host-a" : "host-b", 1);
            if (!cfg.transports)
                unsetenv("BRAID_TRANSPORT");
            braid_pg *pg;
            if (braid_pg_init(&pg, r, n, &id, &cfg) != BRAID_OK) {
                fprintf(stderr, "rank %d: init: %s\n", r, braid_last_error());
                _exit(10);
            }
            int rc = mixed_rank(pg);
            braid_pg_destroy(pg);
            _exit(rc);
        }
    }
    braid_rendezvous rv;
    if (braid__unique_id_decode(&id, &rv) == BRAID_OK)
        braid__prebound_release(rv.port);
    for (int r = 0; r < n; r++)
        ck_assert_msg(harness_wait_child(pids[r], 180) == 0, "rank %d failed", r);
}
END_TEST

static Suite *shm_suite(void)
{
    Suite *s = suite_create("shm");
    TCase *data = tcase_create("data");
    tcase_set_timeout(data, 120);
    tcase_add_test(data, probe_ok);
    tcase_add_loop_test(data, ring_edges, 0, 2);
    tcase_add_loop_test(data, ring_rewinds, 0, 2);
    tcase_add_test(data, wrong_secret);
    tcase_add_test(data, no_leaks);
    suite_add_tcase(s, data);
    TCase *fault = tcase_create("fault");
    tcase_set_timeout(fault, 60);
    tcase_add_loop_test(fault, peer_killed, 0, 4);
    tcase_add_loop_test(fault, peer_freed_buffer, 0, 2);
    suite_add_tcase(s, fault);
    TCase *group = tcase_create("group");
    tcase_set_timeout(group, 600);
    tcase_add_loop_test(group, group_collectives, 0, 4);
    tcase_add_test(group, group_rank_killed);
    tcase_add_loop_test(group, group_mixed_transports, 0, 2);
    suite_add_tcase(s, group);
    return s;
}

int main(void)
{
    char why[256] = "";
    if (braid__shm_ops.probe(why, sizeof(why)) != BRAID_OK) {
        printf("skipped: shared-memory transport unusable here: %s\n", why);
        return 77;
    }
    tp.ops = ops; /* the shared helpers (transport_pair.h) drive shm */
    SRunner *sr = srunner_create(shm_suite());
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? 1 : 0;
}
