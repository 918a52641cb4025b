/* Rendezvous store suite: wire decoding, address helpers, and a real
 * server with forked clients, strays and wrong secrets on loopback. */
#include <check.h>
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "bootstrap/auth.h"
#include "bootstrap/sock.h"
#include "bootstrap/store.h"
#include "bootstrap/store_wire.h"
#include "clock.h"
#include "harness.h"

static const uint8_t secret[BRAID_SECRET_BYTES] = {9, 8, 7, 6, 5, 4, 3, 2, 1, 0, 1, 2, 3, 4, 5, 6};

typedef struct {
    braid_store_server *server;
    int port;
} server_t;

static server_t start_server(void)
{
    server_t s;
    int fd;
    ck_assert_int_eq(braid__sock_listen("127.0.0.1", 0, &fd, &s.port), BRAID_OK);
    ck_assert_int_gt(s.port, 0);
    ck_assert_int_eq(braid__store_server_start(fd, secret, &s.server), BRAID_OK);
    return s;
}

static braid_store *client(const server_t *s, int rank)
{
    braid_store *c = NULL;
    braid_status st = braid__store_connect("127.0.0.1", s->port, secret, rank, 5000, 0, &c);
    ck_assert_msg(st == BRAID_OK, "connect: %s", braid_last_error());
    return c;
}

/* Children are forked before the server thread exists and read its port
 * from a pipe: forking while another thread holds a lock (libcrypto's, the
 * allocator's) leaves the child a copy of the held lock, and it hangs. */
static int port_recv(int fd)
{
    int port;
    if (read(fd, &port, sizeof(port)) != (ssize_t)sizeof(port))
        _exit(99);
    return port;
}

static void port_send(int fd, int port, int copies)
{
    for (int i = 0; i < copies; i++)
        ck_assert_int_eq(write(fd, &port, sizeof(port)), (ssize_t)sizeof(port));
}

static int raw_connect(int port)
{
    braid_sockaddr a;
    int fd;
    if (braid__sock_resolve("127.0.0.1", port, &a) != BRAID_OK ||
        braid__sock_connect(&a, braid__now_ms() + 5000, "test", &fd) != BRAID_OK)
        return -1;
    return fd;
}

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

/* ---- wire and helpers ---------------------------------------------------- */

START_TEST(req_decode_ranges)
{
    uint8_t b[BRAID_STORE_REQ_BYTES + 1];
    braid_store_req r = {.op = BRAID_STORE_SET, .key_len = 5, .value_len = 10}, d;
    braid__store_req_encode(&r, b);
    ck_assert_int_eq(braid__store_req_decode(b, BRAID_STORE_REQ_BYTES, &d), BRAID_OK);
    ck_assert_int_eq(d.op, BRAID_STORE_SET);
    ck_assert_uint_eq(d.key_len, 5);
    ck_assert_uint_eq(d.value_len, 10);
    for (size_t len = 0; len < BRAID_STORE_REQ_BYTES; len++)
        ck_assert_int_eq(braid__store_req_decode(b, len, &d), BRAID_ERR_PEER);
    ck_assert_int_eq(braid__store_req_decode(b, sizeof(b), &d), BRAID_ERR_PEER);

    struct {
        braid_store_req r;
        braid_status want;
    } cases[] = {
        {{BRAID_STORE_SET, 0, 1, 0}, BRAID_ERR_PEER}, /* empty key */
        {{BRAID_STORE_SET, BRAID_STORE_KEY_MAX, 0, 0}, BRAID_OK},
        {{BRAID_STORE_SET, BRAID_STORE_KEY_MAX + 1, 0, 0}, BRAID_ERR_PEER},
        {{BRAID_STORE_SET, 1, BRAID_STORE_VALUE_MAX, 0}, BRAID_OK},
        {{BRAID_STORE_SET, 1, BRAID_STORE_VALUE_MAX + 1, 0}, BRAID_ERR_PEER},
        {{BRAID_STORE_SET, 1, UINT32_MAX, 0}, BRAID_ERR_PEER},
        {{BRAID_STORE_GET, 1, 0, 100}, BRAID_OK},
        {{BRAID_STORE_GET, 1, 1, 100}, BRAID_ERR_PEER}, /* GET with a value */
        {{BRAID_STORE_ADD, 1, 8, 0}, BRAID_OK},
        {{BRAID_STORE_ADD, 1, 7, 0}, BRAID_ERR_PEER},
        {{0, 1, 0, 0}, BRAID_ERR_PEER},
        {{BRAID_STORE_ADD + 1, 1, 0, 0}, BRAID_ERR_PEER},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        braid__store_req_encode(&cases[i].r, b);
        ck_assert_msg(braid__store_req_decode(b, BRAID_STORE_REQ_BYTES, &d) == cases[i].want, "case %zu", i);
    }
    braid__store_req_encode(&r, b);
    b[2] = 1; /* padding must be zero */
    ck_assert_int_eq(braid__store_req_decode(b, BRAID_STORE_REQ_BYTES, &d), BRAID_ERR_PEER);
}
END_TEST

START_TEST(reply_decode_ranges)
{
    uint8_t b[BRAID_STORE_REPLY_BYTES];
    braid_store_reply r = {.code = BRAID_STORE_REPLY_TIMEOUT, .value_len = 0}, d;
    braid__store_reply_encode(&r, b);
    ck_assert_int_eq(braid__store_reply_decode(b, sizeof(b), &d), BRAID_OK);
    ck_assert_int_eq(d.code, BRAID_STORE_REPLY_TIMEOUT);
    ck_assert_int_eq(braid__store_reply_decode(b, sizeof(b) - 1, &d), BRAID_ERR_PEER);
    r.code = BRAID_STORE_REPLY_MAX + 1;
    braid__store_reply_encode(&r, b);
    ck_assert_int_eq(braid__store_reply_decode(b, sizeof(b), &d), BRAID_ERR_PEER);
    r.code = 0;
    r.value_len = BRAID_STORE_VALUE_MAX + 1;
    braid__store_reply_encode(&r, b);
    ck_assert_int_eq(braid__store_reply_decode(b, sizeof(b), &d), BRAID_ERR_PEER);
    uint8_t i64[8];
    braid__store_put_i64(i64, -1234567890123ll);
    ck_assert(braid__store_get_i64(i64) == -1234567890123ll);
}
END_TEST

START_TEST(addresses)
{
    braid_sockaddr a;
    char buf[BRAID_SOCK_ADDR_STR], ip[64];
    ck_assert_int_eq(braid__sock_addr_parse("127.0.0.1:5000", &a), BRAID_OK);
    braid__sock_addr_format(&a, buf, sizeof(buf));
    ck_assert_str_eq(buf, "127.0.0.1:5000");
    ck_assert_int_eq(braid__sock_addr_port(&a), 5000);
    ck_assert_int_eq(braid__sock_addr_parse("[::1]:80", &a), BRAID_OK);
    braid__sock_addr_format(&a, buf, sizeof(buf));
    ck_assert_str_eq(buf, "[::1]:80");
    ck_assert_int_eq(braid__sock_addr_host(&a, ip, sizeof(ip)), BRAID_OK);
    ck_assert_str_eq(ip, "::1");
    ck_assert_int_eq(braid__sock_addr_parse("[fd00::2]:65535", &a), BRAID_OK);
    static const char *const bad[] = {
        "",       ":80",   "127.0.0.1", "127.0.0.1:",   "127.0.0.1:65536", "127.0.0.1:-1", "127.0.0.1:8x",
        "::1:80", "[::1]", "[::1:80",   "localhost:80", "[]:80",           "1.2.3.4.5:80"};
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++)
        ck_assert_msg(braid__sock_addr_parse(bad[i], &a) == BRAID_ERR_INVALID_ARG, "'%s' accepted", bad[i]);
    ck_assert_int_eq(braid__sock_resolve("localhost", 1, &a), BRAID_OK);
    ck_assert_int_eq(braid__sock_resolve("[::1]", 1, &a), BRAID_OK);
    ck_assert_int_eq(braid__sock_resolve("127.0.0.1", 70000, &a), BRAID_ERR_INVALID_ARG);

    ck_assert_int_eq(braid__sock_ifname_ip("lo", ip, sizeof(ip)), BRAID_OK);
    ck_assert_str_eq(ip, "127.0.0.1");
    ck_assert_int_eq(braid__sock_ifname_ip("no-such-if0", ip, sizeof(ip)), BRAID_ERR_INVALID_ARG);
    ck_assert_ptr_nonnull(strstr(braid_last_error(), "no-such-if0"));
    braid__sock_default_ip(ip, sizeof(ip));
    ck_assert_int_eq(braid__sock_addr_parse("1.1.1.1:1", &a), BRAID_OK); /* sanity */
    char probe[96];
    snprintf(probe, sizeof(probe), "%s:1", ip);
    ck_assert_int_eq(braid__sock_addr_parse(probe, &a), BRAID_OK);
}
END_TEST

START_TEST(listen_variants)
{
    int fd, port;
    ck_assert_int_eq(braid__sock_listen("127.0.0.1", 0, &fd, &port), BRAID_OK);
    int fd2, port2;
    /* The same port again is taken. */
    ck_assert_int_ne(braid__sock_listen("127.0.0.1", port, &fd2, &port2), BRAID_OK);
    close(fd);
    ck_assert_int_eq(braid__sock_listen("::1", 0, &fd, &port), BRAID_OK);
    close(fd);
    ck_assert_int_eq(braid__sock_listen(NULL, 0, &fd, &port), BRAID_OK); /* every interface */
    /* A wildcard listener takes IPv4 loopback connections. */
    int c = raw_connect(port);
    ck_assert_int_ge(c, 0);
    close(c);
    close(fd);
    ck_assert_int_eq(braid__sock_listen("localhost", 0, &fd, &port), BRAID_OK);
    close(fd);
}
END_TEST

/* ---- server ----------------------------------------------------------------- */

START_TEST(set_get_add)
{
    server_t s = start_server();
    braid_store *c = client(&s, 0);
    char v[64];
    size_t len;
    ck_assert_int_eq(braid__store_set(c, "a", "hello", 6), BRAID_OK);
    ck_assert_int_eq(braid__store_get(c, "a", v, sizeof(v), &len, 1000), BRAID_OK);
    ck_assert_uint_eq(len, 6);
    ck_assert_str_eq(v, "hello");
    ck_assert_int_eq(braid__store_set(c, "a", "", 0), BRAID_OK); /* overwrite, empty */
    ck_assert_int_eq(braid__store_get(c, "a", v, sizeof(v), &len, 1000), BRAID_OK);
    ck_assert_uint_eq(len, 0);
    int64_t sum;
    ck_assert_int_eq(braid__store_add(c, "n", 5, &sum), BRAID_OK);
    ck_assert(sum == 5);
    ck_assert_int_eq(braid__store_add(c, "n", -7, &sum), BRAID_OK);
    ck_assert(sum == -2);
    ck_assert_int_eq(braid__store_get(c, "n", v, sizeof(v), &len, 1000), BRAID_OK);
    ck_assert_uint_eq(len, 8);
    /* ADD on a non-integer value, a value larger than the buffer, keys
     * out of range: errors, and the connection stays usable. */
    ck_assert_int_eq(braid__store_set(c, "s", "xyz", 3), BRAID_OK);
    ck_assert_int_eq(braid__store_add(c, "s", 1, &sum), BRAID_ERR_INVALID_ARG);
    ck_assert_int_eq(braid__store_get(c, "s", v, 2, &len, 1000), BRAID_ERR_INVALID_ARG);
    ck_assert_int_eq(braid__store_set(c, "", "x", 1), BRAID_ERR_INVALID_ARG);
    char longkey[BRAID_STORE_KEY_MAX + 2];
    memset(longkey, 'k', sizeof(longkey) - 1);
    longkey[sizeof(longkey) - 1] = '\0';
    ck_assert_int_eq(braid__store_set(c, longkey, "x", 1), BRAID_ERR_INVALID_ARG);
    longkey[BRAID_STORE_KEY_MAX] = '\0';
    ck_assert_int_eq(braid__store_set(c, longkey, "x", 1), BRAID_OK);
    ck_assert_int_eq(braid__store_set(c, "big", v, BRAID_STORE_VALUE_MAX + 1), BRAID_ERR_INVALID_ARG);
    uint8_t *big = malloc(BRAID_STORE_VALUE_MAX);
    for (size_t i = 0; i < BRAID_STORE_VALUE_MAX; i++)
        big[i] = (uint8_t)(i * 31);
    ck_assert_int_eq(braid__store_set(c, "big", big, BRAID_STORE_VALUE_MAX), BRAID_OK);
    uint8_t *back = malloc(BRAID_STORE_VALUE_MAX);
    ck_assert_int_eq(braid__store_get(c, "big", back, BRAID_STORE_VALUE_MAX, &len, 1000), BRAID_OK);
    ck_assert_uint_eq(len, BRAID_STORE_VALUE_MAX);
    ck_assert_mem_eq(big, back, BRAID_STORE_VALUE_MAX);
    free(big);
    free(back);
    ck_assert_int_eq(braid__store_get(c, "s", v, sizeof(v), &len, 1000), BRAID_OK);
    ck_assert_mem_eq(v, "xyz", 3);
    char ip[64];
    ck_assert_int_eq(braid__store_local_ip(c, ip, sizeof(ip)), BRAID_OK);
    ck_assert_str_eq(ip, "127.0.0.1");
    braid__store_close(c);
    braid__store_server_stop(s.server);
}
END_TEST

START_TEST(ipv6_store)
{
    int fd, port;
    if (braid__sock_listen("::1", 0, &fd, &port) != BRAID_OK)
        return; /* no IPv6 on this host */
    braid_store_server *srv;
    ck_assert_int_eq(braid__store_server_start(fd, secret, &srv), BRAID_OK);
    braid_store *c;
    ck_assert_int_eq(braid__store_connect("::1", port, secret, 0, 2000, 0, &c), BRAID_OK);
    ck_assert_int_eq(braid__store_set(c, "k", "v6", 2), BRAID_OK);
    char ip[64];
    ck_assert_int_eq(braid__store_local_ip(c, ip, sizeof(ip)), BRAID_OK);
    ck_assert_str_eq(ip, "::1");
    braid__store_close(c);
    ck_assert_int_eq(braid__store_connect("[::1]", port, secret, 0, 2000, 0, &c), BRAID_OK);
    braid__store_close(c);
    braid__store_server_stop(srv);
}
END_TEST

START_TEST(get_timeout)
{
    server_t s = start_server();
    braid_store *c = client(&s, 0);
    char v[8];
    size_t len;
    int64_t t0 = braid__now_ms();
    ck_assert_int_eq(braid__store_get(c, "missing", v, sizeof(v), &len, 300), BRAID_ERR_TIMEOUT);
    int64_t took = braid__now_ms() - t0;
    ck_assert_int_ge(took, 250);
    ck_assert_int_lt(took, 1500);
    ck_assert_ptr_nonnull(strstr(braid_last_error(), "missing"));
    ck_assert_int_eq(braid__store_get(c, "missing", v, sizeof(v), &len, 0), BRAID_ERR_TIMEOUT);
    /* Still in step afterwards. */
    ck_assert_int_eq(braid__store_set(c, "missing", "1", 1), BRAID_OK);
    ck_assert_int_eq(braid__store_get(c, "missing", v, sizeof(v), &len, 0), BRAID_OK);
    braid__store_close(c);
    braid__store_server_stop(s.server);
}
END_TEST

#define NCLIENTS 8
#define ADDS 50

/* Forked ranks: each waits for the others' keys (parked GETs answered by
 * later SETs) and bumps a shared counter. */
START_TEST(many_clients)
{
    server_t s;
    pid_t pids[NCLIENTS];
    int gate[2];
    ck_assert_int_eq(pipe(gate), 0);
    for (int r = 0; r < NCLIENTS; r++) {
        pids[r] = fork();
        ck_assert_int_ge(pids[r], 0);
        if (pids[r] == 0) {
            s.port = port_recv(gate[0]);
            braid_store *c;
            if (braid__store_connect("127.0.0.1", s.port, secret, r, 5000, 0, &c) != BRAID_OK) {
                fprintf(stderr, "rank %d: %s\n", r, braid_last_error());
                _exit(1);
            }
            usleep((useconds_t)(r * 20000)); /* staggered: early GETs must park */
            char key[32], v[32];
            snprintf(key, sizeof(key), "addr/%d", r);
            snprintf(v, sizeof(v), "value-%d", r);
            if (braid__store_set(c, key, v, strlen(v) + 1) != BRAID_OK) {
                fprintf(stderr, "rank %d: %s\n", r, braid_last_error());
                _exit(2);
            }
            for (int p = 0; p < NCLIENTS; p++) {
                char got[32], want[32];
                size_t len;
                snprintf(key, sizeof(key), "addr/%d", p);
                snprintf(want, sizeof(want), "value-%d", p);
                braid_status st = braid__store_get(c, key, got, sizeof(got), &len, 5000);
                if (st != BRAID_OK || len != strlen(want) + 1 || strcmp(got, want) != 0) {
                    fprintf(stderr, "rank %d: get %s: %s\n", r, key, st ? braid_last_error() : "wrong value");
                    _exit(3);
                }
            }
            for (int i = 0; i < ADDS; i++) {
                int64_t sum;
                if (braid__store_add(c, "count", 1, &sum) != BRAID_OK || sum < 1 || sum > NCLIENTS * ADDS)
                    _exit(4);
            }
            braid__store_close(c);
            _exit(0);
        }
    }
    s = start_server();
    port_send(gate[1], s.port, NCLIENTS);
    for (int r = 0; r < NCLIENTS; r++)
        ck_assert_int_eq(harness_wait_child(pids[r], 20), 0);
    braid_store *c = client(&s, 0);
    int64_t sum;
    ck_assert_int_eq(braid__store_add(c, "count", 0, &sum), BRAID_OK);
    ck_assert(sum == NCLIENTS * ADDS);
    braid__store_close(c);
    braid__store_server_stop(s.server);
}
END_TEST

START_TEST(wrong_secret_rejected)
{
    server_t s = start_server();
    uint8_t other[BRAID_SECRET_BYTES];
    memcpy(other, secret, sizeof(other));
    other[15] ^= 0x80;
    braid_store *c;
    ck_assert_int_eq(braid__store_connect("127.0.0.1", s.port, other, 1, 2000, 0, &c), BRAID_ERR_AUTH);
    ck_assert_ptr_nonnull(strstr(braid_last_error(), "127.0.0.1"));
    /* An initiator that speaks as a tcp peer to the store is refused too. */
    int fd = raw_connect(s.port);
    ck_assert_int_ge(fd, 0);
    braid_hello self = {.role = BRAID_ROLE_TCP_CONNECT, .rank = 1, .target = 0}, peer;
    uint32_t result;
    ck_assert_int_ne(braid__auth_initiate(fd, secret, &self, BRAID_ROLE_STORE_SERVER, braid__now_ms() + 2000, "test",
                                          &peer, &result),
                     BRAID_OK);
    close(fd);
    /* The store still serves legitimate clients. */
    braid_store *good = client(&s, 1);
    ck_assert_int_eq(braid__store_set(good, "k", "v", 1), BRAID_OK);
    braid__store_close(good);
    braid__store_server_stop(s.server);
}
END_TEST

START_TEST(strays_do_not_disturb)
{
    braid__store_handshake_ms = 700;
    server_t s = start_server();
    for (int i = 0; i < 20; i++) { /* port scan */
        int fd = raw_connect(s.port);
        ck_assert_int_ge(fd, 0);
        close(fd);
    }
    int garbage = raw_connect(s.port), half = raw_connect(s.port), silent[8];
    ck_assert_int_ge(garbage, 0);
    ck_assert_int_ge(half, 0);
    uint8_t junk[200];
    for (size_t i = 0; i < sizeof(junk); i++)
        junk[i] = (uint8_t)(i * 7 + 1);
    ck_assert_int_eq(send(garbage, junk, sizeof(junk), MSG_NOSIGNAL), (ssize_t)sizeof(junk));
    braid_hello h = {.version = BRAID_WIRE_VERSION, .role = BRAID_ROLE_STORE_CLIENT, .rank = 3};
    uint8_t hb[BRAID_HELLO_BYTES];
    braid__hello_encode(&h, hb);
    ck_assert_int_eq(send(half, hb, 30, MSG_NOSIGNAL), 30);
    for (int i = 0; i < 8; i++) {
        silent[i] = raw_connect(s.port);
        ck_assert_int_ge(silent[i], 0);
    }
    /* A legitimate client is served at once meanwhile. */
    int64_t t0 = braid__now_ms();
    braid_store *c = client(&s, 2);
    ck_assert_int_eq(braid__store_set(c, "k", "v", 1), BRAID_OK);
    char v[4];
    size_t len;
    ck_assert_int_eq(braid__store_get(c, "k", v, sizeof(v), &len, 1000), BRAID_OK);
    ck_assert_int_lt(braid__now_ms() - t0, 300);
    /* Garbage goes at once, the rest at the handshake limit. */
    ck_assert(peer_dropped(garbage, 300));
    ck_assert(peer_dropped(half, 2000));
    for (int i = 0; i < 8; i++)
        ck_assert(peer_dropped(silent[i], 2000));
    ck_assert_int_eq(braid__store_get(c, "k", v, sizeof(v), &len, 1000), BRAID_OK);
    braid__store_close(c);
    close(garbage);
    close(half);
    for (int i = 0; i < 8; i++)
        close(silent[i]);
    braid__store_server_stop(s.server);
}
END_TEST

/* An authenticated client that sends an out-of-range request is dropped;
 * others carry on. */
START_TEST(malformed_request_dropped)
{
    server_t s = start_server();
    int fd = raw_connect(s.port);
    ck_assert_int_ge(fd, 0);
    braid_hello self = {.role = BRAID_ROLE_STORE_CLIENT, .rank = 1, .target = 0}, peer;
    uint32_t result;
    ck_assert_int_eq(braid__auth_initiate(fd, secret, &self, BRAID_ROLE_STORE_SERVER, braid__now_ms() + 2000, "test",
                                          &peer, &result),
                     BRAID_OK);
    ck_assert_int_eq(result, BRAID_AUTH_ACCEPTED);
    uint8_t hdr[BRAID_STORE_REQ_BYTES] = {BRAID_STORE_SET, 0, 0, 0, 0xff, 0xff, 0xff, 0xff, 0, 0, 0, 1};
    ck_assert_int_eq(send(fd, hdr, sizeof(hdr), MSG_NOSIGNAL), (ssize_t)sizeof(hdr));
    ck_assert(peer_dropped(fd, 1000));
    close(fd);
    braid_store *c = client(&s, 2);
    ck_assert_int_eq(braid__store_set(c, "k", "v", 1), BRAID_OK);
    braid__store_close(c);
    braid__store_server_stop(s.server);
}
END_TEST

/* Stopping with clients connected and a GET parked frees everything and
 * the waiting client fails instead of hanging. */
START_TEST(stop_with_parked_get)
{
    int gate[2];
    ck_assert_int_eq(pipe(gate), 0);
    pid_t pid = fork();
    ck_assert_int_ge(pid, 0);
    if (pid == 0) {
        braid_store *c;
        if (braid__store_connect("127.0.0.1", port_recv(gate[0]), secret, 1, 5000, 0, &c) != BRAID_OK)
            _exit(1);
        char v[4];
        size_t len;
        braid_status st = braid__store_get(c, "never", v, sizeof(v), &len, 20000);
        braid__store_close(c);
        _exit(st == BRAID_ERR_PEER ? 0 : 2);
    }
    server_t s = start_server();
    port_send(gate[1], s.port, 1);
    braid_store *idle = client(&s, 2);
    usleep(300 * 1000);
    braid__store_server_stop(s.server);
    ck_assert_int_eq(harness_wait_child(pid, 10), 0);
    char v[4];
    size_t len;
    ck_assert_int_ne(braid__store_get(idle, "x", v, sizeof(v), &len, 100), BRAID_OK);
    braid__store_close(idle);
}
END_TEST

START_TEST(connect_waits_for_late_server)
{
    /* Reserve a port, free it, and start the server there only later. */
    int fd, port;
    ck_assert_int_eq(braid__sock_listen("127.0.0.1", 0, &fd, &port), BRAID_OK);
    close(fd);
    pid_t pid = fork();
    ck_assert_int_ge(pid, 0);
    if (pid == 0) {
        braid_store *c;
        if (braid__store_connect("127.0.0.1", port, secret, 1, 5000, 0, &c) != BRAID_OK)
            _exit(1);
        int ok = braid__store_set(c, "late", "1", 1) == BRAID_OK;
        braid__store_close(c);
        _exit(ok ? 0 : 2);
    }
    usleep(400 * 1000);
    braid_store_server *srv;
    ck_assert_int_eq(braid__sock_listen("127.0.0.1", port, &fd, &port), BRAID_OK);
    ck_assert_int_eq(braid__store_server_start(fd, secret, &srv), BRAID_OK);
    ck_assert_int_eq(harness_wait_child(pid, 10), 0);
    braid__store_server_stop(srv);

    braid_store *c;
    int64_t t0 = braid__now_ms();
    ck_assert_int_eq(braid__store_connect("127.0.0.1", port, secret, 1, 300, 0, &c), BRAID_ERR_TIMEOUT);
    ck_assert_int_lt(braid__now_ms() - t0, 1500);
}
END_TEST

static Suite *store_suite(void)
{
    Suite *s = suite_create("store");
    TCase *wire = tcase_create("wire");
    tcase_add_test(wire, req_decode_ranges);
    tcase_add_test(wire, reply_decode_ranges);
    tcase_add_test(wire, addresses);
    tcase_add_test(wire, listen_variants);
    suite_add_tcase(s, wire);

    TCase *srv = tcase_create("server");
    tcase_set_timeout(srv, 30);
    tcase_add_test(srv, set_get_add);
    tcase_add_test(srv, get_timeout);
    tcase_add_test(srv, ipv6_store);
    tcase_add_test(srv, many_clients);
    tcase_add_test(srv, wrong_secret_rejected);
    tcase_add_test(srv, strays_do_not_disturb);
    tcase_add_test(srv, malformed_request_dropped);
    tcase_add_test(srv, stop_with_parked_get);
    tcase_add_test(srv, connect_waits_for_late_server);
    suite_add_tcase(s, srv);
    return s;
}

int main(void)
{
    signal(SIGPIPE, SIG_IGN);
    SRunner *sr = srunner_create(store_suite());
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
