/* TCP transport suite, what only TCP has: handshake messages, striping,
 * IPv6, idle waits, peers killed mid-transfer, strays and wrong secrets on
 * the listener. The contract every transport keeps (sizes, order,
 * mismatches, a peer that leaves) is tests/test_transport.c's. */
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
#include "harness.h"
#include "transport_pair.h"
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

/* ---- a pair of processes ------------------------------------------------- */

typedef int (*side_fn)(braid_conn *conn, void *arg);

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
/* The forked dialer of the pair running now (read by the acceptor). */
static pid_t dialer_pid;

static int run_pair(int nsocks, side_fn dialer, side_fn acceptor, void *arg, int *child_rc)
{
    braid_transport_ctx c1 = make_ctx(1, 2, nsocks);
    braid_listener *l;
    char addr[BRAID_ADDR_MAX];
    int pipefd[2];
    ck_assert_int_eq(pipe(pipefd), 0);
    pid_t pid = fork();
    dialer_pid = pid;
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
    *child_rc = harness_wait_child(pid, 60);
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
    bad[7] = 0x80; /* a flag this build does not know */
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
        tp_fill(bad, sizeof(bad), (uint64_t)i);
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
        tp_fill(b, sizes[i], i);
        if (tp_send(c, b, sizes[i]) != BRAID_OK)
            return 1;
        memset(b, 0, sizes[i]);
        if (tp_recv(c, b, sizes[i]) != BRAID_OK || !tp_check_fill(b, sizes[i], 1000 + i))
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
        if (tp_recv(c, b, sizes[i]) != BRAID_OK) {
            fprintf(stderr, "recv %zu: %s\n", sizes[i], braid_last_error());
            return 1;
        }
        if (!tp_check_fill(b, sizes[i], i)) {
            fprintf(stderr, "size %zu: data differs\n", sizes[i]);
            return 2;
        }
        tp_fill(b, sizes[i], 1000 + i);
        if (tp_send(c, b, sizes[i]) != BRAID_OK)
            return 3;
        free(b);
    }
    return 0;
}

static const int nsocks_list[] = {1, 2, 4};

/* Waiting for a late peer blocks in poll() instead of spinning. */
static int late_dialer(braid_conn *c, void *arg)
{
    (void)arg;
    usleep(800 * 1000);
    uint8_t b[64] = {1};
    return tp_send(c, b, sizeof(b)) == BRAID_OK ? 0 : 1;
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
    if (tp_recv(c, b, sizeof(b)) != BRAID_OK)
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

/* Sends a big message until the receiver kills it (SIGKILL) part-way. */
static int dying_sender(braid_conn *c, void *arg)
{
    (void)arg;
    uint8_t *b = calloc(1, KILL_BYTES);
    if (!b)
        return 1;
    tp_send(c, b, KILL_BYTES);
    return 3; /* not killed: the receiver never got 4 MiB */
}

/* Kills the sender once 4 MiB of its message have arrived, so it dies
 * mid-transfer whatever the speed (a sender that killed itself could have
 * pushed the whole message through one progress call), then must see the
 * death within 5 s. */
static int receiver_sees_death(braid_conn *c, void *arg)
{
    (void)arg;
    uint8_t *b = malloc(KILL_BYTES);
    braid_req r;
    if (!b || ops->irecv(c, &r, b, KILL_BYTES) != BRAID_OK)
        return 3;
    while (r.moved < ((size_t)4 << 20)) {
        int d;
        if (ops->test(&r, &d) != BRAID_OK || d)
            return 4;
        ops->progress(&c, 1, -1, 10);
    }
    kill(dialer_pid, SIGKILL);
    int64_t t0 = braid__now_ms();
    braid_status st = tp_wait_all(&r, 1, 30000);
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
    braid_status st = tp_send(c, b, KILL_BYTES);
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
    return tp_send(c, b, sizeof(b)) == BRAID_OK ? 0 : 1;
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
    if (tp_recv(c, b, sizeof(b)) != BRAID_OK || b[0] != 5)
        return 2; /* data sent before the close still arrives */
    braid_status st = tp_recv(c, b, sizeof(b));
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
    tp_fill(b, sizeof(b), 9);
    if (tp_send(conn, b, sizeof(b)) != BRAID_OK)
        return 6;
    braid_conn *dup;
    if (ops->connect(&good, 1, addr, 3000, &dup) != BRAID_ERR_AUTH || !strstr(braid_last_error(), "duplicate"))
        return 7;
    tp_recv(conn, b, 1);
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
    tp_fill(junk, sizeof(junk), 5);
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
    ck_assert_int_eq(tp_recv(conn, b, sizeof(b)), BRAID_OK);
    ck_assert(tp_check_fill(b, sizeof(b), 9));

    /* Garbage is dropped at once; the half hello and the silent sockets
     * at the handshake limit. */
    ck_assert(peer_dropped(garbage, 500));
    ck_assert(peer_dropped(half, 3000));
    for (int i = 0; i < 8; i++)
        ck_assert(peer_dropped(silent[i], 3000));
    ck_assert_int_eq(tp_send(conn, b, 1), BRAID_OK);
    ck_assert_int_eq(harness_wait_child(pid, 20), 0);
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
            if (tp_send(conn, &v, 1) != BRAID_OK)
                _exit(2);
            tp_recv(conn, &v, 1); /* until the listener closes */
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
        ck_assert_int_eq(tp_recv(conn, &v, 1), BRAID_OK);
        ck_assert_int_eq(v, r + 40);
        ops->close(conn);
    }
    for (int r = 0; r < 2; r++)
        ck_assert_int_eq(harness_wait_child(pids[r], 10), 0);
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
    if (tp_wait_all(r, 2, 5000) != BRAID_OK)
        return 2;
    uint8_t z;
    tp_recv(c, &z, 1);
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
    return tp_send(c, &x, 1) == BRAID_OK ? 0 : 12;
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
    tcase_add_loop_test(data, idle_wait_does_not_spin, 0, 3);
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
    tp.ops = ops;             /* the shared helpers (transport_pair.h) drive tcp */
    SRunner *sr = srunner_create(tcp_suite());
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
