/* TCP transport suite: handshake messages, striping, and two real
 * processes on loopback exchanging data through the ops table, with
 * strays, wrong secrets, mismatches and killed peers. */
#include <check.h>
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "bootstrap/auth.h"
#include "bootstrap/sock.h"
#include "braid_transport.h"
#include "clock.h"
#include "transports/tcp/tcp.h"
#include "transports/tcp/tcp_conn.h"

static const braid_transport_ops *ops = &braid__tcp_ops;

#define PG_TAG 0x0123456789abcdefull

/* Address the test listeners bind (set per test; each test is a fork). */
static const char *bind_ip = "127.0.0.1";

static braid_transport_ctx make_ctx(int rank, int size, int nsocks)
{
    braid_transport_ctx ctx;
    memset(&ctx, 0, sizeof(ctx));
    ctx.rank = rank;
    ctx.size = size;
    for (int i = 0; i < BRAID_SECRET_BYTES; i++)
        ctx.secret[i] = (uint8_t)(0xa0 + i);
    ctx.pg_tag = PG_TAG;
    ctx.timeout_ms = 10000;
    ctx.nsocks = nsocks;
    snprintf(ctx.bind_ip, sizeof(ctx.bind_ip), "%s", bind_ip);
    return ctx;
}

static void fill(uint8_t *buf, size_t len, uint64_t seed)
{
    uint64_t x = seed * 0x9e3779b97f4a7c15ull + 1;
    for (size_t i = 0; i < len; i++) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        buf[i] = (uint8_t)x;
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

/* Wait for every request (all on one connection) with a deadline, using
 * test() and progress() the way the algorithms do. */
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

static braid_status send_blocking(braid_conn *c, const void *buf, size_t len)
{
    braid_req r;
    braid_status st = ops->isend(c, &r, buf, len);
    return st != BRAID_OK ? st : wait_all(&r, 1, 30000);
}

static braid_status recv_blocking(braid_conn *c, void *buf, size_t len)
{
    braid_req r;
    braid_status st = ops->irecv(c, &r, buf, len);
    return st != BRAID_OK ? st : wait_all(&r, 1, 30000);
}

/* ---- a pair of processes ------------------------------------------------- */

typedef int (*side_fn)(braid_conn *conn, void *arg);

static int wait_child(pid_t pid, int timeout_s)
{
    int64_t deadline = braid__now_ms() + timeout_s * 1000;
    for (;;) {
        int status;
        pid_t r = waitpid(pid, &status, WNOHANG);
        if (r == pid)
            return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
        if (braid__now_ms() > deadline) {
            kill(pid, SIGKILL);
            waitpid(pid, &status, 0);
            return 124;
        }
        usleep(2000);
    }
}

/* Children are forked before any braid thread exists and then read the
 * listener's address from a pipe: forking while another thread holds a
 * lock (libcrypto's, the allocator's) leaves the child a copy of the held
 * lock, and it hangs. */
static void addr_send(int fd, const char *addr, int copies)
{
    char buf[BRAID_ADDR_MAX] = {0};
    snprintf(buf, sizeof(buf), "%s", addr);
    for (int i = 0; i < copies; i++)
        ck_assert_int_eq(write(fd, buf, BRAID_ADDR_MAX), BRAID_ADDR_MAX);
}

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

/* Rank 1 listens here; a forked rank 0 connects and runs dialer(); this
 * process accepts and runs acceptor(). Returns acceptor's result; the
 * dialer's exit code goes to *child_rc. */
static int run_pair(int nsocks, side_fn dialer, side_fn acceptor, void *arg, int *child_rc)
{
    braid_transport_ctx c1 = make_ctx(1, 2, nsocks);
    braid_listener *l;
    char addr[BRAID_ADDR_MAX];
    int pipefd[2];
    ck_assert_int_eq(pipe(pipefd), 0);
    pid_t pid = fork();
    ck_assert_int_ge(pid, 0);
    if (pid == 0) {
        addr_recv(pipefd[0], addr);
        braid_transport_ctx c0 = make_ctx(0, 2, nsocks);
        braid_conn *conn;
        if (ops->connect(&c0, 1, addr, 10000, &conn) != BRAID_OK) {
            fprintf(stderr, "connect: %s\n", braid_last_error());
            _exit(10);
        }
        int rc = dialer(conn, arg);
        ops->close(conn);
        _exit(rc);
    }
    ck_assert_int_eq(ops->listen(&c1, &l, addr), BRAID_OK);
    addr_send(pipefd[1], addr, 1);
    braid_conn *conn;
    braid_status st = ops->accept(l, 0, 10000, &conn);
    int rc = 20;
    if (st == BRAID_OK) {
        rc = acceptor(conn, arg);
        ops->close(conn);
    } else {
        fprintf(stderr, "accept: %s\n", braid_last_error());
    }
    *child_rc = wait_child(pid, 60);
    ops->close_listener(l);
    return rc;
}

/* ---- wire units ---------------------------------------------------------- */

static braid_hello sample_hello(void)
{
    braid_hello h = {.version = BRAID_WIRE_VERSION,
                     .role = BRAID_ROLE_TCP_CONNECT,
                     .rank = 3,
                     .target = 7,
                     .pg_tag = PG_TAG,
                     .sock_index = 2,
                     .nsocks = 4};
    for (int i = 0; i < BRAID_NONCE_BYTES; i++)
        h.nonce[i] = (uint8_t)i;
    return h;
}

START_TEST(hello_roundtrip)
{
    braid_hello h = sample_hello(), d;
    uint8_t buf[BRAID_HELLO_BYTES];
    braid__hello_encode(&h, buf);
    ck_assert_int_eq(braid__hello_decode(buf, sizeof(buf), &d), BRAID_OK);
    ck_assert_int_eq(d.version, h.version);
    ck_assert_int_eq(d.role, h.role);
    ck_assert_int_eq(d.rank, 3);
    ck_assert_int_eq(d.target, 7);
    ck_assert(d.pg_tag == PG_TAG);
    ck_assert_int_eq(d.sock_index, 2);
    ck_assert_int_eq(d.nsocks, 4);
    ck_assert_mem_eq(d.nonce, h.nonce, BRAID_NONCE_BYTES);
    ck_assert_mem_eq(buf, "BRD1", 4);
}
END_TEST

START_TEST(hello_rejects_bad_input)
{
    braid_hello h = sample_hello(), d;
    uint8_t buf[BRAID_HELLO_BYTES + 8], bad[BRAID_HELLO_BYTES];
    braid__hello_encode(&h, buf);
    /* Every truncation, and oversized buffers. */
    for (size_t len = 0; len < BRAID_HELLO_BYTES; len++)
        ck_assert_int_eq(braid__hello_decode(buf, len, &d), BRAID_ERR_AUTH);
    ck_assert_int_eq(braid__hello_decode(buf, BRAID_HELLO_BYTES + 1, &d), BRAID_ERR_AUTH);
    ck_assert_int_eq(braid__hello_decode(buf, sizeof(buf), &d), BRAID_ERR_AUTH);
    ck_assert_int_eq(braid__hello_decode(NULL, BRAID_HELLO_BYTES, &d), BRAID_ERR_AUTH);
    /* Field by field. */
    memcpy(bad, buf, sizeof(bad));
    bad[0] = 'X';
    ck_assert_int_eq(braid__hello_decode(bad, sizeof(bad), &d), BRAID_ERR_AUTH);
    ck_assert_ptr_nonnull(strstr(braid_last_error(), "magic"));
    memcpy(bad, buf, sizeof(bad));
    bad[5] = BRAID_WIRE_VERSION + 1;
    ck_assert_int_eq(braid__hello_decode(bad, sizeof(bad), &d), BRAID_ERR_AUTH);
    ck_assert_ptr_nonnull(strstr(braid_last_error(), "version"));
    memcpy(bad, buf, sizeof(bad));
    bad[6] = 0;
    ck_assert_int_eq(braid__hello_decode(bad, sizeof(bad), &d), BRAID_ERR_AUTH);
    bad[6] = BRAID_ROLE_MAX + 1;
    ck_assert_int_eq(braid__hello_decode(bad, sizeof(bad), &d), BRAID_ERR_AUTH);
    memcpy(bad, buf, sizeof(bad));
    bad[7] = 1;
    ck_assert_int_eq(braid__hello_decode(bad, sizeof(bad), &d), BRAID_ERR_AUTH);
    memcpy(bad, buf, sizeof(bad));
    bad[8] = 0x80; /* negative rank */
    ck_assert_int_eq(braid__hello_decode(bad, sizeof(bad), &d), BRAID_ERR_AUTH);
    memcpy(bad, buf, sizeof(bad));
    memset(bad + 12, 0xff, 4); /* target -1: any */
    ck_assert_int_eq(braid__hello_decode(bad, sizeof(bad), &d), BRAID_OK);
    ck_assert_int_eq(d.target, -1);
    bad[15] = 0xfe; /* target -2 */
    ck_assert_int_eq(braid__hello_decode(bad, sizeof(bad), &d), BRAID_ERR_AUTH);
    /* Random garbage never decodes (the magic alone rules it out). */
    for (int i = 0; i < 1000; i++) {
        fill(bad, sizeof(bad), (uint64_t)i);
        ck_assert_int_eq(braid__hello_decode(bad, sizeof(bad), &d), BRAID_ERR_AUTH);
    }
}
END_TEST

START_TEST(mac_binds_secret_role_and_transcript)
{
    uint8_t secret[BRAID_SECRET_BYTES] = {1, 2, 3}, other[BRAID_SECRET_BYTES] = {1, 2, 4};
    uint8_t hi[BRAID_HELLO_BYTES], ha[BRAID_HELLO_BYTES], mac[BRAID_MAC_BYTES];
    braid_hello h = sample_hello();
    braid__hello_encode(&h, hi);
    h.role = BRAID_ROLE_TCP_ACCEPT;
    h.nonce[0] = 99;
    braid__hello_encode(&h, ha);
    ck_assert_int_eq(braid__auth_mac(secret, BRAID_ROLE_TCP_CONNECT, hi, ha, mac), BRAID_OK);
    ck_assert_int_eq(braid__auth_mac_check(secret, BRAID_ROLE_TCP_CONNECT, hi, ha, mac), BRAID_OK);
    ck_assert_int_eq(braid__auth_mac_check(other, BRAID_ROLE_TCP_CONNECT, hi, ha, mac), BRAID_ERR_AUTH);
    ck_assert_int_eq(braid__auth_mac_check(secret, BRAID_ROLE_TCP_ACCEPT, hi, ha, mac), BRAID_ERR_AUTH);
    ck_assert_int_eq(braid__auth_mac_check(secret, BRAID_ROLE_TCP_CONNECT, ha, hi, mac), BRAID_ERR_AUTH);
    mac[31] ^= 1;
    ck_assert_int_eq(braid__auth_mac_check(secret, BRAID_ROLE_TCP_CONNECT, hi, ha, mac), BRAID_ERR_AUTH);
}
END_TEST

START_TEST(result_decode)
{
    uint8_t b[BRAID_RESULT_BYTES + 1];
    uint32_t r;
    braid__auth_result_encode(BRAID_AUTH_REJECT_GROUP, b);
    ck_assert_int_eq(braid__auth_result_decode(b, BRAID_RESULT_BYTES, &r), BRAID_OK);
    ck_assert_int_eq(r, BRAID_AUTH_REJECT_GROUP);
    ck_assert_int_eq(braid__auth_result_decode(b, BRAID_RESULT_BYTES - 1, &r), BRAID_ERR_AUTH);
    ck_assert_int_eq(braid__auth_result_decode(b, BRAID_RESULT_BYTES + 1, &r), BRAID_ERR_AUTH);
    braid__auth_result_encode(BRAID_AUTH_REJECT_MAX + 1, b);
    ck_assert_int_eq(braid__auth_result_decode(b, BRAID_RESULT_BYTES, &r), BRAID_ERR_AUTH);
}
END_TEST

START_TEST(stripe_layout)
{
    static const size_t lens[] = {0, 1, 7, 4096, 65535, 65536, 65537, 1 << 20, (16 << 20) + 3, 100000007};
    for (int n = 1; n <= 8; n++) {
        for (size_t i = 0; i < sizeof(lens) / sizeof(lens[0]); i++) {
            size_t next = 0, used = 0;
            for (int k = 0; k < n; k++) {
                size_t off, len;
                braid__tcp_stripe(lens[i], n, k, &off, &len);
                if (len) {
                    ck_assert_uint_eq(off, next); /* contiguous, in socket order */
                    next = off + len;
                    used++;
                }
            }
            ck_assert_uint_eq(next, lens[i]);
            if (lens[i] < BRAID_TCP_STRIPE_MIN || n == 1)
                ck_assert_uint_le(used, 1);
            else
                ck_assert_uint_ge(used, (size_t)(n > 1 ? 2 : 1));
        }
    }
}
END_TEST

/* ---- data path ------------------------------------------------------------- */

static const size_t sizes[] = {0, 1, 7, 65535, 65536, 65537, 1 << 20, (16 << 20) + 3};
#define NSIZES (sizeof(sizes) / sizeof(sizes[0]))

static int echo_dialer(braid_conn *c, void *arg)
{
    (void)arg;
    for (size_t i = 0; i < NSIZES; i++) {
        uint8_t *b = malloc(sizes[i] + 1);
        fill(b, sizes[i], i);
        if (send_blocking(c, b, sizes[i]) != BRAID_OK)
            return 1;
        memset(b, 0, sizes[i]);
        if (recv_blocking(c, b, sizes[i]) != BRAID_OK || !check_fill(b, sizes[i], 1000 + i))
            return 2;
        free(b);
    }
    return 0;
}

static int echo_acceptor(braid_conn *c, void *arg)
{
    (void)arg;
    for (size_t i = 0; i < NSIZES; i++) {
        uint8_t *b = malloc(sizes[i] + 1);
        if (recv_blocking(c, b, sizes[i]) != BRAID_OK) {
            fprintf(stderr, "recv %zu: %s\n", sizes[i], braid_last_error());
            return 1;
        }
        if (!check_fill(b, sizes[i], i)) {
            fprintf(stderr, "size %zu: data differs\n", sizes[i]);
            return 2;
        }
        fill(b, sizes[i], 1000 + i);
        if (send_blocking(c, b, sizes[i]) != BRAID_OK)
            return 3;
        free(b);
    }
    return 0;
}

static const int nsocks_list[] = {1, 2, 4};

START_TEST(sizes_bit_exact)
{
    int child;
    ck_assert_int_eq(run_pair(nsocks_list[_i], echo_dialer, echo_acceptor, NULL, &child), 0);
    ck_assert_int_eq(child, 0);
}
END_TEST

#define BIDI_BYTES ((size_t)24 << 20)

/* Both sides send and receive a large message at the same time: with
 * non-blocking progress neither waits for the other to drain. */
static int bidi_side(braid_conn *c, void *arg)
{
    uint64_t me = (uint64_t)(uintptr_t)arg ^ (uint64_t)c->peer;
    uint8_t *out = malloc(BIDI_BYTES), *in = malloc(BIDI_BYTES);
    fill(out, BIDI_BYTES, 77 + me);
    braid_req r[2];
    if (ops->isend(c, &r[0], out, BIDI_BYTES) != BRAID_OK || ops->irecv(c, &r[1], in, BIDI_BYTES) != BRAID_OK)
        return 1;
    if (wait_all(r, 2, 30000) != BRAID_OK) {
        fprintf(stderr, "bidi: %s\n", braid_last_error());
        return 2;
    }
    int ok = check_fill(in, BIDI_BYTES, 77 + (me ^ 1));
    free(out);
    free(in);
    return ok ? 0 : 3;
}

START_TEST(bidirectional)
{
    int child;
    ck_assert_int_eq(run_pair(nsocks_list[_i], bidi_side, bidi_side, NULL, &child), 0);
    ck_assert_int_eq(child, 0);
}
END_TEST

#define MANY 2000

static size_t many_len(int i)
{
    return (size_t)((i * 7919) % 5 == 0 ? (i * 104729) % 300000 : (i * 131) % 3000);
}

static int many_dialer(braid_conn *c, void *arg)
{
    (void)arg;
    braid_req *r = calloc(MANY, sizeof(*r));
    uint8_t **b = calloc(MANY, sizeof(*b));
    for (int i = 0; i < MANY; i++) {
        b[i] = malloc(many_len(i) + 1);
        fill(b[i], many_len(i), (uint64_t)i);
        if (ops->isend(c, &r[i], b[i], many_len(i)) != BRAID_OK)
            return 1;
    }
    if (wait_all(r, MANY, 30000) != BRAID_OK)
        return 2;
    for (int i = 0; i < MANY; i++)
        free(b[i]);
    free(b);
    free(r);
    return 0;
}

static int many_acceptor(braid_conn *c, void *arg)
{
    (void)arg;
    braid_req *r = calloc(MANY, sizeof(*r));
    uint8_t **b = calloc(MANY, sizeof(*b));
    for (int i = 0; i < MANY; i++) {
        b[i] = malloc(many_len(i) + 1);
        if (ops->irecv(c, &r[i], b[i], many_len(i)) != BRAID_OK)
            return 1;
    }
    /* Completions come in posting order: no request is done before all
     * earlier ones are. */
    int64_t deadline = braid__now_ms() + 30000;
    int done_upto = 0;
    braid_conn *conn = c;
    while (done_upto < MANY && braid__now_ms() < deadline) {
        for (int i = done_upto; i < MANY; i++) {
            int d;
            if (ops->test(&r[i], &d) != BRAID_OK)
                return 2;
            if (d && i != done_upto) {
                fprintf(stderr, "request %d done before %d\n", i, done_upto);
                return 3;
            }
            if (!d)
                break;
            done_upto++;
        }
        if (ops->progress(&conn, 1, -1, 100) != BRAID_OK)
            return 4;
    }
    if (done_upto < MANY)
        return 5;
    for (int i = 0; i < MANY; i++) {
        if (r[i].moved != many_len(i) || !check_fill(b[i], many_len(i), (uint64_t)i)) {
            fprintf(stderr, "message %d differs\n", i);
            return 6;
        }
        free(b[i]);
    }
    free(b);
    free(r);
    return 0;
}

START_TEST(many_outstanding_in_order)
{
    int child;
    ck_assert_int_eq(run_pair(nsocks_list[_i], many_dialer, many_acceptor, NULL, &child), 0);
    ck_assert_int_eq(child, 0);
}
END_TEST

/* A length mismatch between the two sides is detected, not absorbed. */
static int mismatch_dialer(braid_conn *c, void *arg)
{
    (void)arg;
    uint8_t b[100] = {0};
    return send_blocking(c, b, sizeof(b)) == BRAID_OK ? 0 : 1;
}

static int mismatch_acceptor(braid_conn *c, void *arg)
{
    (void)arg;
    uint8_t b[200];
    braid_status st = recv_blocking(c, b, sizeof(b));
    if (st != BRAID_ERR_MISMATCH || !strstr(braid_last_error(), "peer 0")) {
        fprintf(stderr, "got %s: %s\n", braid_status_string(st), braid_last_error());
        return 1;
    }
    /* Sticky: the connection stays failed. */
    braid_req r;
    return ops->isend(c, &r, b, 1) == BRAID_ERR_MISMATCH ? 0 : 2;
}

START_TEST(length_mismatch)
{
    int child;
    ck_assert_int_eq(run_pair(2, mismatch_dialer, mismatch_acceptor, NULL, &child), 0);
    ck_assert_int_eq(child, 0);
}
END_TEST

/* Waiting for a late peer blocks in poll() instead of spinning. */
static int late_dialer(braid_conn *c, void *arg)
{
    (void)arg;
    usleep(800 * 1000);
    uint8_t b[64] = {1};
    return send_blocking(c, b, sizeof(b)) == BRAID_OK ? 0 : 1;
}

static double cpu_seconds(void)
{
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    return (double)ru.ru_utime.tv_sec + ru.ru_utime.tv_usec / 1e6 + ru.ru_stime.tv_sec + ru.ru_stime.tv_usec / 1e6;
}

static int late_acceptor(braid_conn *c, void *arg)
{
    (void)arg;
    uint8_t b[64];
    double cpu0 = cpu_seconds();
    if (recv_blocking(c, b, sizeof(b)) != BRAID_OK)
        return 1;
    double used = cpu_seconds() - cpu0;
    if (used > 0.2) {
        fprintf(stderr, "waiting 0.8 s cost %.3f s of CPU: spinning\n", used);
        return 2;
    }
    return b[0] == 1 ? 0 : 3;
}

START_TEST(idle_wait_does_not_spin)
{
    int child;
    ck_assert_int_eq(run_pair(nsocks_list[_i], late_dialer, late_acceptor, NULL, &child), 0);
    ck_assert_int_eq(child, 0);
}
END_TEST

/* ---- failures ----------------------------------------------------------------- */

#define KILL_BYTES ((size_t)256 << 20)

/* Dies (SIGKILL) part-way through sending a big message. */
static int dying_sender(braid_conn *c, void *arg)
{
    (void)arg;
    uint8_t *b = calloc(1, KILL_BYTES);
    braid_req r;
    if (!b || ops->isend(c, &r, b, KILL_BYTES) != BRAID_OK)
        return 1;
    while (r.moved < ((size_t)4 << 20)) {
        int d;
        if (ops->test(&r, &d) != BRAID_OK)
            return 2;
        ops->progress(&c, 1, -1, 10);
    }
    raise(SIGKILL);
    return 3;
}

static int receiver_sees_death(braid_conn *c, void *arg)
{
    (void)arg;
    uint8_t *b = malloc(KILL_BYTES);
    int64_t t0 = braid__now_ms();
    braid_status st = recv_blocking(c, b, KILL_BYTES);
    int64_t took = braid__now_ms() - t0;
    free(b);
    if (st != BRAID_ERR_PEER || !strstr(braid_last_error(), "peer 0") ||
        !strstr(braid_last_error(), "closed the connection during recv")) {
        fprintf(stderr, "got %s: %s\n", braid_status_string(st), braid_last_error());
        return 1;
    }
    return took < 5000 ? 0 : 2;
}

START_TEST(peer_killed_during_recv)
{
    int child;
    ck_assert_int_eq(run_pair(nsocks_list[_i], dying_sender, receiver_sees_death, NULL, &child), 0);
    ck_assert_int_eq(child, 128 + SIGKILL);
}
END_TEST

static int dying_receiver(braid_conn *c, void *arg)
{
    (void)c;
    (void)arg;
    usleep(200 * 1000);
    raise(SIGKILL);
    return 3;
}

static int sender_sees_death(braid_conn *c, void *arg)
{
    (void)arg;
    uint8_t *b = calloc(1, KILL_BYTES);
    int64_t t0 = braid__now_ms();
    braid_status st = send_blocking(c, b, KILL_BYTES);
    int64_t took = braid__now_ms() - t0;
    free(b);
    if (st != BRAID_ERR_PEER || !strstr(braid_last_error(), "peer 0")) {
        fprintf(stderr, "got %s: %s\n", braid_status_string(st), braid_last_error());
        return 1;
    }
    return took < 5000 ? 0 : 2;
}

START_TEST(peer_killed_during_send)
{
    int child;
    ck_assert_int_eq(run_pair(nsocks_list[_i], dying_receiver, sender_sees_death, NULL, &child), 0);
    ck_assert_int_eq(child, 128 + SIGKILL);
}
END_TEST

/* An idle connection whose peer closes is not an error until used: a
 * later send fails at once, a receive fails once buffered data ends. */
static int closer(braid_conn *c, void *arg)
{
    (void)arg;
    uint8_t b[10] = {5};
    return send_blocking(c, b, sizeof(b)) == BRAID_OK ? 0 : 1;
}

static int after_close(braid_conn *c, void *arg)
{
    (void)arg;
    usleep(300 * 1000); /* the peer has sent and closed */
    braid_conn *conn = c;
    for (int i = 0; i < 3; i++)
        if (ops->progress(&conn, 1, -1, 50) != BRAID_OK)
            return 1;
    uint8_t b[10];
    if (recv_blocking(c, b, sizeof(b)) != BRAID_OK || b[0] != 5)
        return 2; /* data sent before the close still arrives */
    braid_status st = recv_blocking(c, b, sizeof(b));
    return st == BRAID_ERR_PEER ? 0 : 3;
}

START_TEST(orderly_close)
{
    int child;
    ck_assert_int_eq(run_pair(2, closer, after_close, NULL, &child), 0);
    ck_assert_int_eq(child, 0);
}
END_TEST

/* ---- strays -------------------------------------------------------------------- */

static int raw_connect(const char *addr)
{
    braid_sockaddr a;
    int fd;
    if (braid__sock_addr_parse(addr, &a) != BRAID_OK ||
        braid__sock_connect(&a, braid__now_ms() + 5000, "test", &fd) != BRAID_OK)
        return -1;
    return fd;
}

/* Only a closed or reset socket counts: the peer dropped us. */
static int peer_dropped(int fd, int within_ms)
{
    char b[256];
    int64_t deadline = braid__now_ms() + within_ms;
    while (braid__now_ms() < deadline) {
        ssize_t n = recv(fd, b, sizeof(b), MSG_DONTWAIT);
        if (n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK))
            return 1;
        usleep(10000);
    }
    return 0;
}

/* Wrong secret, wrong group tag, wrong target rank: refused with AUTH on
 * this side; then the legit peer, promptly, and a duplicate of it. */
static int stray_child(const char *addr)
{
    braid_conn *conn;
    braid_transport_ctx bad = make_ctx(0, 3, 2);
    bad.secret[0] ^= 1;
    if (ops->connect(&bad, 1, addr, 3000, &conn) != BRAID_ERR_AUTH)
        return 1;
    bad = make_ctx(0, 3, 2);
    bad.pg_tag ^= 1;
    if (ops->connect(&bad, 1, addr, 3000, &conn) != BRAID_ERR_AUTH)
        return 2;
    bad = make_ctx(0, 3, 2);
    if (ops->connect(&bad, 2, addr, 3000, &conn) != BRAID_ERR_AUTH) /* rank 1 listens there */
        return 3;
    /* Now the legit peer, promptly, then a duplicate of it. */
    braid_transport_ctx good = make_ctx(0, 3, 2);
    int64_t t0 = braid__now_ms();
    if (ops->connect(&good, 1, addr, 3000, &conn) != BRAID_OK)
        return 4;
    if (braid__now_ms() - t0 > 1000)
        return 5;
    static uint8_t b[1 << 20];
    fill(b, sizeof(b), 9);
    if (send_blocking(conn, b, sizeof(b)) != BRAID_OK)
        return 6;
    braid_conn *dup;
    if (ops->connect(&good, 1, addr, 3000, &dup) != BRAID_ERR_AUTH || !strstr(braid_last_error(), "duplicate"))
        return 7;
    recv_blocking(conn, b, 1);
    ops->close(conn);
    return 0;
}

START_TEST(strays_do_not_disturb)
{
    braid_transport_ctx c1 = make_ctx(1, 3, 2);
    c1.timeout_ms = 1500; /* handshake limit for strays: 1.5 s */
    braid_listener *l;
    char addr[BRAID_ADDR_MAX];
    int gate[2];
    ck_assert_int_eq(pipe(gate), 0);
    pid_t pid = fork();
    ck_assert_int_ge(pid, 0);
    if (pid == 0) {
        addr_recv(gate[0], addr);
        _exit(stray_child(addr));
    }
    ck_assert_int_eq(ops->listen(&c1, &l, addr), BRAID_OK);

    /* Port scan, garbage, a half hello, and silent sockets, all left open
     * (the scan excepted) while the legit peer connects. */
    for (int i = 0; i < 20; i++) {
        int fd = raw_connect(addr);
        ck_assert_int_ge(fd, 0);
        close(fd);
    }
    int garbage = raw_connect(addr), half = raw_connect(addr), silent[8];
    ck_assert_int_ge(garbage, 0);
    ck_assert_int_ge(half, 0);
    uint8_t junk[300];
    fill(junk, sizeof(junk), 5);
    ck_assert_int_eq(send(garbage, junk, sizeof(junk), MSG_NOSIGNAL), (ssize_t)sizeof(junk));
    braid_hello h = sample_hello();
    uint8_t hb[BRAID_HELLO_BYTES];
    braid__hello_encode(&h, hb);
    ck_assert_int_eq(send(half, hb, 20, MSG_NOSIGNAL), 20);
    for (int i = 0; i < 8; i++) {
        silent[i] = raw_connect(addr);
        ck_assert_int_ge(silent[i], 0);
    }

    /* The child tries a wrong secret, group and rank, then connects. */
    addr_send(gate[1], addr, 1);
    braid_conn *conn;
    int64_t t0 = braid__now_ms();
    ck_assert_int_eq(ops->accept(l, 0, 5000, &conn), BRAID_OK);
    ck_assert_int_lt(braid__now_ms() - t0, 1500);
    static uint8_t b[1 << 20];
    ck_assert_int_eq(recv_blocking(conn, b, sizeof(b)), BRAID_OK);
    ck_assert(check_fill(b, sizeof(b), 9));

    /* Garbage is dropped at once; the half hello and the silent sockets
     * at the handshake limit. */
    ck_assert(peer_dropped(garbage, 500));
    ck_assert(peer_dropped(half, 3000));
    for (int i = 0; i < 8; i++)
        ck_assert(peer_dropped(silent[i], 3000));
    ck_assert_int_eq(send_blocking(conn, b, 1), BRAID_OK);
    ck_assert_int_eq(wait_child(pid, 20), 0);
    ops->close(conn);
    ops->close_listener(l);
    close(garbage);
    close(half);
    for (int i = 0; i < 8; i++)
        close(silent[i]);
}
END_TEST

/* A listener for rank 2 in a group of 3 keeps other ranks' connections
 * for later accept() calls, in any order, and times out cleanly. */
START_TEST(accept_any_order_and_timeout)
{
    braid_transport_ctx c2 = make_ctx(2, 3, 2);
    braid_listener *l;
    char addr[BRAID_ADDR_MAX];
    pid_t pids[2];
    int gate[2];
    ck_assert_int_eq(pipe(gate), 0);
    for (int r = 0; r < 2; r++) {
        pids[r] = fork();
        ck_assert_int_ge(pids[r], 0);
        if (pids[r] == 0) {
            addr_recv(gate[0], addr);
            braid_transport_ctx c = make_ctx(r, 3, 2);
            braid_conn *conn;
            if (ops->connect(&c, 2, addr, 5000, &conn) != BRAID_OK)
                _exit(1);
            uint8_t v = (uint8_t)(r + 40);
            if (send_blocking(conn, &v, 1) != BRAID_OK)
                _exit(2);
            recv_blocking(conn, &v, 1); /* until the listener closes */
            ops->close(conn);
            _exit(0);
        }
    }
    ck_assert_int_eq(ops->listen(&c2, &l, addr), BRAID_OK);
    addr_send(gate[1], addr, 2);
    for (int r = 1; r >= 0; r--) {
        braid_conn *conn;
        uint8_t v = 0;
        ck_assert_int_eq(ops->accept(l, r, 5000, &conn), BRAID_OK);
        ck_assert_int_eq(conn->peer, r);
        ck_assert_int_eq(recv_blocking(conn, &v, 1), BRAID_OK);
        ck_assert_int_eq(v, r + 40);
        ops->close(conn);
    }
    for (int r = 0; r < 2; r++)
        ck_assert_int_eq(wait_child(pids[r], 10), 0);
    braid_conn *conn;
    int64_t t0 = braid__now_ms();
    ck_assert_int_eq(ops->accept(l, 0, 300, &conn), BRAID_ERR_INVALID_ARG); /* already taken */
    ck_assert_int_eq(ops->accept(l, 2, 300, &conn), BRAID_ERR_TIMEOUT);
    ck_assert_int_lt(braid__now_ms() - t0, 1500);
    ck_assert_ptr_nonnull(strstr(braid_last_error(), "peer 2"));
    ops->close_listener(l);
}
END_TEST

START_TEST(connect_refused_times_out)
{
    /* A port that nobody listens on: retries, then a timeout naming it. */
    int fd, port;
    ck_assert_int_eq(braid__sock_listen("127.0.0.1", 0, &fd, &port), BRAID_OK);
    close(fd);
    char addr[64];
    snprintf(addr, sizeof(addr), "127.0.0.1:%d", port);
    braid_transport_ctx c = make_ctx(0, 2, 1);
    braid_conn *conn;
    int64_t t0 = braid__now_ms();
    ck_assert_int_eq(ops->connect(&c, 1, addr, 400, &conn), BRAID_ERR_TIMEOUT);
    ck_assert_int_lt(braid__now_ms() - t0, 1500);
    ck_assert_ptr_nonnull(strstr(braid_last_error(), addr));
    ck_assert_int_eq(ops->connect(&c, 1, "not-an-address", 400, &conn), BRAID_ERR_INVALID_ARG);
}
END_TEST

START_TEST(ipv6_loopback)
{
    int fd, port;
    if (braid__sock_listen("::1", 0, &fd, &port) != BRAID_OK)
        return; /* no IPv6 on this host */
    close(fd);
    bind_ip = "::1";
    int child;
    ck_assert_int_eq(run_pair(2, echo_dialer, echo_acceptor, NULL, &child), 0);
    ck_assert_int_eq(child, 0);
}
END_TEST

/* Two small messages arrive; the first test() completes both. A
 * progress() right after must not block on the completion the caller has
 * not looked at yet (the algorithms test one request, then wait). */
static int two_small(braid_conn *c, void *arg)
{
    (void)arg;
    uint8_t a[16] = {1}, b[16] = {2};
    braid_req r[2];
    if (ops->isend(c, &r[0], a, sizeof(a)) != BRAID_OK || ops->isend(c, &r[1], b, sizeof(b)) != BRAID_OK)
        return 1;
    if (wait_all(r, 2, 5000) != BRAID_OK)
        return 2;
    uint8_t z;
    recv_blocking(c, &z, 1);
    return 0;
}

static int unseen_completion(braid_conn *c, void *arg)
{
    (void)arg;
    uint8_t a[16], b[16];
    braid_req r[2];
    if (ops->irecv(c, &r[0], a, sizeof(a)) != BRAID_OK || ops->irecv(c, &r[1], b, sizeof(b)) != BRAID_OK)
        return 1;
    usleep(200 * 1000); /* both have arrived */
    int d0, d1;
    if (ops->test(&r[1], &d1) != BRAID_OK || !d1)
        return 2;
    int64_t t0 = braid__now_ms();
    if (ops->progress(&c, 1, -1, 2000) != BRAID_OK)
        return 3;
    if (braid__now_ms() - t0 > 100) {
        fprintf(stderr, "progress blocked on an unseen completion\n");
        return 4;
    }
    if (ops->test(&r[0], &d0) != BRAID_OK || !d0 || a[0] != 1 || b[0] != 2)
        return 5;
    /* Nothing new now: progress blocks until its timeout. */
    braid_req extra;
    uint8_t x;
    if (ops->irecv(c, &extra, &x, 1) != BRAID_OK)
        return 6;
    t0 = braid__now_ms();
    if (ops->progress(&c, 1, -1, 300) != BRAID_OK)
        return 7;
    int64_t took = braid__now_ms() - t0;
    if (took < 250 || took > 1000) {
        fprintf(stderr, "progress timeout of 300 ms took %lld ms\n", (long long)took);
        return 8;
    }
    /* The wake fd cuts a wait short. */
    int ev[2];
    if (pipe(ev) != 0 || write(ev[1], "w", 1) != 1)
        return 9;
    t0 = braid__now_ms();
    if (ops->progress(&c, 1, ev[0], 5000) != BRAID_OK)
        return 10;
    if (braid__now_ms() - t0 > 100)
        return 11;
    close(ev[0]);
    close(ev[1]);
    return send_blocking(c, &x, 1) == BRAID_OK ? 0 : 12;
}

START_TEST(progress_blocking_rules)
{
    int child;
    ck_assert_int_eq(run_pair(1, two_small, unseen_completion, NULL, &child), 0);
    ck_assert_int_eq(child, 0);
}
END_TEST

START_TEST(probe_and_table)
{
    char why[64] = "x";
    ck_assert_int_eq(ops->probe(why, sizeof(why)), BRAID_OK);
    ck_assert_str_eq(ops->name, "tcp");
    ck_assert(BRAID_TRANSPORT_HAS(ops, close));
    ck_assert(BRAID_TRANSPORT_HAS(ops, progress));
}
END_TEST

static Suite *tcp_suite(void)
{
    Suite *s = suite_create("tcp");
    TCase *wire = tcase_create("wire");
    tcase_add_test(wire, hello_roundtrip);
    tcase_add_test(wire, hello_rejects_bad_input);
    tcase_add_test(wire, mac_binds_secret_role_and_transcript);
    tcase_add_test(wire, result_decode);
    tcase_add_test(wire, stripe_layout);
    tcase_add_test(wire, probe_and_table);
    suite_add_tcase(s, wire);

    TCase *data = tcase_create("data");
    tcase_set_timeout(data, 60);
    tcase_add_loop_test(data, sizes_bit_exact, 0, 3);
    tcase_add_loop_test(data, bidirectional, 0, 3);
    tcase_add_loop_test(data, many_outstanding_in_order, 0, 3);
    tcase_add_loop_test(data, idle_wait_does_not_spin, 0, 3);
    tcase_add_test(data, length_mismatch);
    tcase_add_test(data, ipv6_loopback);
    tcase_add_test(data, progress_blocking_rules);
    suite_add_tcase(s, data);

    TCase *fault = tcase_create("faults");
    tcase_set_timeout(fault, 60);
    tcase_add_loop_test(fault, peer_killed_during_recv, 0, 3);
    tcase_add_loop_test(fault, peer_killed_during_send, 0, 3);
    tcase_add_test(fault, orderly_close);
    tcase_add_test(fault, strays_do_not_disturb);
    tcase_add_test(fault, accept_any_order_and_timeout);
    tcase_add_test(fault, connect_refused_times_out);
    suite_add_tcase(s, fault);
    return s;
}

int main(void)
{
    signal(SIGPIPE, SIG_IGN); /* raw test sockets; braid itself uses MSG_NOSIGNAL */
    SRunner *sr = srunner_create(tcp_suite());
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
