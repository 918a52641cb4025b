/* Per-message CRC32C (BRAID_CHECKSUM, braid_config.checksum): the CRC32C
 * function on known vectors (hardware and table paths), the wrapper on one
 * connection (round trips; hand-made trailers with a wrong CRC or message
 * number), bit-exact
 * collectives with checksums on over TCP and shared memory, a bit flipped
 * in flight (test hook BRAID_TEST_CORRUPT_CHUNK) failing the group on every
 * rank fast with the CRC named, and ranks that disagree on the setting
 * failing at init. */
#include <check.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "bootstrap/bootstrap.h"
#include "transports/checksum/checksum.h"
#include "crc32c.h"
#include "harness.h"
#include "pg.h"
#include "transports/tcp/tcp_conn.h"

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* ---- the CRC32C function ---------------------------------------------- */

/* RFC 3720 (iSCSI) appendix B.4 and the common check value. */
static void check_vectors(braid_crc32c_func_t f, const char *name)
{
    uint8_t b[32];
    ck_assert_msg(f(0, "123456789", 9) == 0xE3069283u, "%s: \"123456789\"", name);
    ck_assert_msg(f(0, "", 0) == 0, "%s: empty", name);
    memset(b, 0, sizeof(b));
    ck_assert_msg(f(0, b, 32) == 0x8A9136AAu, "%s: 32 zeros", name);
    memset(b, 0xff, sizeof(b));
    ck_assert_msg(f(0, b, 32) == 0x62A8AB43u, "%s: 32 x 0xff", name);
    for (int i = 0; i < 32; i++)
        b[i] = (uint8_t)i;
    ck_assert_msg(f(0, b, 32) == 0x46DD794Eu, "%s: ascending", name);
    for (int i = 0; i < 32; i++)
        b[i] = (uint8_t)(31 - i);
    ck_assert_msg(f(0, b, 32) == 0x113FDB5Cu, "%s: descending", name);
}

START_TEST(test_crc_vectors_table)
{
    check_vectors(braid__crc32c_sw, "table");
}
END_TEST

START_TEST(test_crc_vectors_hw)
{
    braid_crc32c_func_t hw = braid__crc32c_hw();
    if (!hw) {
        printf("crc32c: no hardware implementation on this CPU; table path only\n");
        return;
    }
    check_vectors(hw, "sse4.2");
    ck_assert_str_eq(braid__crc32c_impl(), "sse4.2");
}
END_TEST

/* Every length and alignment around the hardware path's edges (8-byte
 * words, three-stream blocks of 3 x 4096 bytes) agrees with the table
 * path, and CRCs chain: crc(a || b) == crc(crc(a), b). */
START_TEST(test_crc_agree_and_chain)
{
    enum { MAX = 3 * 3 * 4096 + 300 };
    uint8_t *buf = malloc(MAX + 8);
    ck_assert_ptr_nonnull(buf);
    unsigned seed = 12345;
    for (size_t i = 0; i < MAX + 8; i++)
        buf[i] = (uint8_t)rand_r(&seed);
    braid_crc32c_func_t hw = braid__crc32c_hw();
    static const size_t lens[] = {0, 1, 7, 8, 9, 63, 4095, 4096, 12287, 12288, 12289, 12295, 24576, 24583, 36863, MAX};
    for (size_t a = 0; a < 8; a++) {
        for (size_t k = 0; k < sizeof(lens) / sizeof(lens[0]); k++) {
            size_t len = lens[k];
            uint32_t sw = braid__crc32c_sw(0, buf + a, len);
            if (hw)
                ck_assert_msg(hw(0, buf + a, len) == sw, "hw != table at align %zu len %zu", a, len);
            ck_assert_uint_eq(braid__crc32c(0, buf + a, len), sw);
            size_t cut = len / 3;
            ck_assert_uint_eq(braid__crc32c(braid__crc32c(0, buf + a, cut), buf + a + cut, len - cut), sw);
            ck_assert_uint_eq(braid__crc32c_sw(braid__crc32c_sw(0, buf + a, cut), buf + a + cut, len - cut), sw);
        }
    }
    /* One flipped bit anywhere changes the CRC. */
    uint32_t base = braid__crc32c(0, buf, MAX);
    for (size_t i = 0; i < MAX; i += 997) {
        buf[i] ^= 0x04;
        ck_assert_uint_ne(braid__crc32c(0, buf, MAX), base);
        buf[i] ^= 0x04;
    }
    free(buf);
}
END_TEST

/* ---- the wrapper on one connection ----------------------------------- */

/* A TCP connection pair over a socketpair (no handshake needed): tx stays
 * a plain connection, so a test can write any trailer it likes; rx is
 * wrapped, unless wrap_tx asks for both. */
static void make_pair(braid_conn **tx, braid_conn **rx, int wrap_tx)
{
    int sv[2];
    ck_assert_int_eq(socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
    braid_tcp_conn *a, *b;
    ck_assert_int_eq(braid__tcp_conn_create(0, 1, 1, &sv[0], "test-tx", &a), BRAID_OK);
    ck_assert_int_eq(braid__tcp_conn_create(1, 0, 1, &sv[1], "test-rx", &b), BRAID_OK);
    *tx = &a->base;
    *rx = &b->base;
    ck_assert_int_eq(braid__checksum_wrap(1, rx), BRAID_OK);
    ck_assert(braid__checksum_is_wrapper(*rx));
    ck_assert_str_eq((*rx)->ops->name, "tcp+crc32c");
    if (wrap_tx)
        ck_assert_int_eq(braid__checksum_wrap(0, tx), BRAID_OK);
}

/* Test and progress reqs until all are done or one fails. */
static braid_status drive(braid_conn *tx, braid_conn *rx, braid_req *reqs, int n)
{
    braid_conn *conns[2] = {tx, rx};
    for (int spin = 0; spin < 2000; spin++) {
        int all = 1;
        for (int i = 0; i < n; i++) {
            int done = 0;
            braid_status st = reqs[i].conn->ops->test(&reqs[i], &done);
            if (st != BRAID_OK)
                return st;
            all &= done;
        }
        if (all)
            return BRAID_OK;
        /* One ops table per call: the two ends may differ (plain, wrapped). */
        braid_status st = tx->ops->progress(&conns[0], 1, -1, 1);
        if (st == BRAID_OK)
            st = rx->ops->progress(&conns[1], 1, -1, 1);
        if (st != BRAID_OK)
            return st;
    }
    return BRAID_ERR_TIMEOUT;
}

static void put32(uint8_t *p, uint32_t v)
{
    for (int i = 0; i < 4; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

/* Messages of many sizes, 0 included, both ways wrapped: all arrive
 * intact and in order, requests complete, and are reusable. */
START_TEST(test_wrapper_roundtrip)
{
    braid_conn *tx, *rx;
    make_pair(&tx, &rx, 1);
    enum { M = 12 };
    static const size_t lens[M] = {0, 1, 7, 8, 40, 4096, 65536, 65537, 200000, 3, 0, 1 << 20};
    uint8_t *src[M], *dst[M];
    braid_req reqs[2 * M];
    for (int round = 0; round < 2; round++) {
        for (int i = 0; i < M; i++) {
            src[i] = malloc(lens[i] + 1);
            dst[i] = calloc(1, lens[i] + 1);
            ck_assert(src[i] && dst[i]);
            for (size_t j = 0; j < lens[i]; j++)
                src[i][j] = (uint8_t)(j * 31 + (size_t)i + (size_t)round);
            ck_assert_int_eq(tx->ops->isend(tx, &reqs[2 * i], src[i], lens[i]), BRAID_OK);
            ck_assert_int_eq(rx->ops->irecv(rx, &reqs[2 * i + 1], dst[i], lens[i]), BRAID_OK);
        }
        ck_assert_int_eq(drive(tx, rx, reqs, 2 * M), BRAID_OK);
        for (int i = 0; i < M; i++) {
            ck_assert_uint_eq(reqs[2 * i + 1].moved, lens[i]);
            ck_assert_msg(memcmp(src[i], dst[i], lens[i]) == 0, "message %d differs", i);
            free(src[i]);
            free(dst[i]);
        }
    }
    tx->ops->close(tx);
    rx->ops->close(rx);
}
END_TEST

/* A plain sender writes payload + trailer by hand: a right trailer is
 * accepted; a wrong CRC or a wrong message number is BRAID_ERR_CORRUPT,
 * the message is never reported done, and the error sticks. */
START_TEST(test_wrapper_rejects_bad_trailer)
{
    static const char *const kinds[] = {"good", "bad crc", "bad number"};
    for (int kind = 0; kind < 3; kind++) {
        braid_conn *tx, *rx;
        make_pair(&tx, &rx, 0);
        uint8_t payload[1000], got[1000], trailer[8];
        for (size_t i = 0; i < sizeof(payload); i++)
            payload[i] = (uint8_t)(i ^ 0x5a);
        uint32_t crc = braid__crc32c(0, payload, sizeof(payload));
        put32(trailer, kind == 1 ? crc ^ 0x00010000u : crc);
        put32(trailer + 4, kind == 2 ? 7 : 0);
        braid_req r[3];
        ck_assert_int_eq(tx->ops->isend(tx, &r[0], payload, sizeof(payload)), BRAID_OK);
        ck_assert_int_eq(tx->ops->isend(tx, &r[1], trailer, sizeof(trailer)), BRAID_OK);
        ck_assert_int_eq(rx->ops->irecv(rx, &r[2], got, sizeof(got)), BRAID_OK);
        braid_status st = drive(tx, rx, r, 3);
        if (kind == 0) {
            ck_assert_int_eq(st, BRAID_OK);
            ck_assert(memcmp(payload, got, sizeof(got)) == 0);
        } else {
            ck_assert_msg(st == BRAID_ERR_CORRUPT, "%s: got %s", kinds[kind], braid_status_string(st));
            ck_assert_int_eq(r[2].done, 0);
            const char *e = braid_last_error();
            ck_assert_msg(strstr(e, "rank 1: peer 0:") != NULL, "%s", e);
            if (kind == 1) {
                char want[96];
                snprintf(want, sizeof(want), "crc32c expected 0x%08x", crc ^ 0x00010000u);
                ck_assert_msg(strstr(e, "checksum mismatch on message #0 (1000 bytes)") && strstr(e, want), "%s", e);
            } else {
                ck_assert_msg(strstr(e, "message order broken") != NULL, "%s", e);
            }
            braid_checksum_fault f;
            ck_assert(braid__checksum_fault(rx, &f));
            ck_assert_int_eq(f.order, kind == 2);
            ck_assert_uint_eq(f.len, sizeof(got));
            ck_assert_ptr_eq(f.buf, got);
            /* Sticky: later posts and tests fail the same way. */
            braid_req again;
            ck_assert_int_eq(rx->ops->irecv(rx, &again, got, 10), BRAID_ERR_CORRUPT);
            int done = 1;
            ck_assert_int_eq(rx->ops->test(&r[2], &done), BRAID_ERR_CORRUPT);
            ck_assert_int_eq(done, 0);
        }
        tx->ops->close(tx);
        rx->ops->close(rx);
    }
}
END_TEST

/* ---- bit-exact collectives with checksums on ------------------------- */

static const char *const transports[] = {"tcp", "shm"};

typedef struct {
    const char *transport;
} exact_arg;

/* Every connection is a checksumming one over the expected transport
 * (NULL: tcp to other "hosts", shm on this one). */
static int check_wrapped(braid_pg *pg, const char *transport)
{
    for (int p = 0; p < pg->size; p++) {
        if (p == pg->rank)
            continue;
        char want[32];
        snprintf(want, sizeof(want), "%s+crc32c",
                 transport                                     ? transport
                 : pg->host_hash[p] == pg->host_hash[pg->rank] ? "shm"
                                                               : "tcp");
        if (!pg->conns[p] || strcmp(pg->conns[p]->ops->name, want) != 0)
            HARNESS_FAIL("rank %d: connection to peer %d is %s, want %s", pg->rank, p,
                         pg->conns[p] ? pg->conns[p]->ops->name : "(none)", want);
    }
    return 0;
}

static int exact_body(braid_pg *pg, void *arg)
{
    const exact_arg *a = arg;
    int rank = braid_pg_rank(pg), n = braid_pg_size(pg);
    if (check_wrapped(pg, a->transport))
        return 1;
    static const size_t counts[] = {0, 1, 3, 1000, 4099, 65537, 300001};
    for (size_t k = 0; k < sizeof(counts) / sizeof(counts[0]); k++) {
        size_t count = counts[k];
        int32_t *ibuf = malloc((count + 1) * sizeof(int32_t));
        float *fsend = malloc((count + 1) * sizeof(float)), *frecv = malloc((count + 1) * sizeof(float));
        uint8_t *bbuf = malloc(count + 1);
        if (!ibuf || !fsend || !frecv || !bbuf)
            HARNESS_FAIL("rank %d: out of memory", rank);
        for (size_t i = 0; i < count; i++) {
            ibuf[i] = (int32_t)harness_value(rank, i, 7, -1000, 1000);
            fsend[i] = (float)harness_value(rank, i, 9, -8, 8);
            bbuf[i] = rank == 1 % n ? (uint8_t)harness_value(1, i, 3, 0, 255) : 0;
        }
        braid_status st = braid_allreduce(pg, ibuf, ibuf, count, BRAID_I32, BRAID_SUM, NULL, NULL);
        if (st != BRAID_OK)
            HARNESS_FAIL("rank %d: i32 allreduce count %zu: %s", rank, count, braid_last_error());
        st = braid_allreduce(pg, fsend, frecv, count, BRAID_F32, BRAID_MAX, NULL, NULL);
        if (st != BRAID_OK)
            HARNESS_FAIL("rank %d: f32 allreduce count %zu: %s", rank, count, braid_last_error());
        st = braid_broadcast(pg, bbuf, count, BRAID_U8, 1 % n, NULL, NULL);
        if (st != BRAID_OK)
            HARNESS_FAIL("rank %d: broadcast count %zu: %s", rank, count, braid_last_error());
        for (size_t i = 0; i < count; i++) {
            int64_t isum = 0;
            double fmax = -1e30;
            for (int r = 0; r < n; r++) {
                isum += harness_value(r, i, 7, -1000, 1000);
                double v = (double)harness_value(r, i, 9, -8, 8);
                fmax = v > fmax ? v : fmax;
            }
            if (ibuf[i] != (int32_t)isum)
                HARNESS_FAIL("rank %d: i32 sum count %zu: element %zu is %d, want %lld", rank, count, i, ibuf[i],
                             (long long)isum);
            if (frecv[i] != (float)fmax)
                HARNESS_FAIL("rank %d: f32 max count %zu: element %zu is %g, want %g", rank, count, i, frecv[i], fmax);
            if (bbuf[i] != (uint8_t)harness_value(1, i, 3, 0, 255))
                HARNESS_FAIL("rank %d: broadcast count %zu: byte %zu wrong", rank, count, i);
        }
        free(ibuf);
        free(fsend);
        free(frecv);
        free(bbuf);
    }
    return 0;
}

/* Loop: transports x {2, 3, 4} ranks x {ring, recursive doubling}. */
START_TEST(test_exact_with_checksums)
{
    int t = _i / 6, n = 2 + (_i / 2) % 3;
    exact_arg a = {.transport = transports[t]};
    braid_config cfg = BRAID_CONFIG_INIT;
    cfg.timeout_ms = 30000;
    cfg.transports = transports[t];
    cfg.chunk_bytes = 16384; /* many chunks per segment */
    cfg.checksum = 1;
    cfg.algo = _i % 2 ? BRAID_ALGO_RECURSIVE_DOUBLING : BRAID_ALGO_RING;
    ck_assert_int_eq(harness_run(n, exact_body, &a, &cfg, 120, NULL), 0);
}
END_TEST

/* The environment variable alone turns checksums on. */
static void env_on(int rank)
{
    (void)rank;
    setenv("BRAID_CHECKSUM", "1", 1);
}

START_TEST(test_exact_env)
{
    exact_arg a = {.transport = "tcp"};
    braid_config cfg = BRAID_CONFIG_INIT;
    cfg.timeout_ms = 30000;
    cfg.transports = "tcp";
    harness_rank_setup = env_on;
    int failed = harness_run(3, exact_body, &a, &cfg, 120, NULL);
    harness_rank_setup = NULL;
    ck_assert_int_eq(failed, 0);
}
END_TEST

/* Two fake hosts of two ranks: same-host pairs on shm, the others on TCP,
 * so one ring mixes both kinds of checksummed connection. */
static void two_hosts(int rank)
{
    setenv("BRAID_HOST_ID", rank < 2 ? "crc-host-a" : "crc-host-b", 1);
}

START_TEST(test_exact_mixed_transports)
{
    exact_arg a = {.transport = NULL};
    braid_config cfg = BRAID_CONFIG_INIT;
    cfg.timeout_ms = 30000;
    cfg.chunk_bytes = 16384;
    cfg.checksum = 1;
    cfg.algo = BRAID_ALGO_RING;
    harness_rank_setup = two_hosts;
    int failed = harness_run(4, exact_body, &a, &cfg, 120, NULL);
    harness_rank_setup = NULL;
    ck_assert_int_eq(failed, 0);
}
END_TEST

/* ---- corruption on the way ------------------------------------------- */

#define CORRUPT_RANK 1
static int corrupt_at;

static void corrupt_setup(int rank)
{
    char v[16];
    snprintf(v, sizeof(v), "%d", corrupt_at);
    if (rank == CORRUPT_RANK)
        setenv("BRAID_TEST_CORRUPT_CHUNK", v, 1);
    else
        unsetenv("BRAID_TEST_CORRUPT_CHUNK");
}

/* All-reduces until one fails. The rank whose received message had a bit
 * flipped must report BRAID_ERR_CORRUPT naming itself, the sending peer,
 * the call and both CRCs; every other rank must fail too (its connections
 * to the failed rank close), well before the 20 s timeout. */
static int corrupt_body(braid_pg *pg, void *arg)
{
    (void)arg;
    int rank = braid_pg_rank(pg), n = braid_pg_size(pg);
    enum { N = 50000 };
    static float buf[N];
    for (int iter = 0; iter < 50; iter++) {
        for (int i = 0; i < N; i++)
            buf[i] = (float)(i % 7);
        double t0 = now_s();
        braid_status st = braid_allreduce(pg, buf, buf, N, BRAID_F32, BRAID_SUM, NULL, NULL);
        double took = now_s() - t0;
        if (st == BRAID_OK) {
            for (int i = 0; i < N; i++)
                if (buf[i] != (float)(n * (i % 7)))
                    HARNESS_FAIL("rank %d: iteration %d: element %d is %g: corrupted data was used", rank, iter, i,
                                 buf[i]);
            continue;
        }
        const char *e = braid_last_error();
        if (took > 5.0)
            HARNESS_FAIL("rank %d: failure took %.2f s (timeout 20 s): %s", rank, took, e);
        if (rank == CORRUPT_RANK) {
            char me[32], from[32];
            snprintf(me, sizeof(me), "rank %d:", rank);
            snprintf(from, sizeof(from), "peer %d", (rank + n - 1) % n);
            if (st != BRAID_ERR_CORRUPT || !strstr(e, me) || !strstr(e, from) || !strstr(e, "allreduce #") ||
                !strstr(e, "checksum mismatch") || !strstr(e, "crc32c expected 0x") || !strstr(e, "actual 0x") ||
                !strstr(e, "message #"))
                HARNESS_FAIL("rank %d: got %s, want BRAID_ERR_CORRUPT naming rank, peer, call and CRCs: %s", rank,
                             braid_status_string(st), e);
        } else if (st != BRAID_ERR_PEER && st != BRAID_ERR_CORRUPT) {
            HARNESS_FAIL("rank %d: got %s, want BRAID_ERR_PEER: %s", rank, braid_status_string(st), e);
        }
        if (braid_pg_error(pg) != st)
            HARNESS_FAIL("rank %d: group error %s, want sticky %s", rank, braid_status_string(braid_pg_error(pg)),
                         braid_status_string(st));
        fprintf(stderr, "rank %d: %s after %.3f s: %s\n", rank, braid_status_string(st), took, e);
        return 0;
    }
    HARNESS_FAIL("rank %d: no failure seen (corrupted message %d never came?)", rank, corrupt_at);
}

/* Loop: transports x flipped message 1 (the call fingerprint), 2 (the
 * first data chunk), 40 (a later one; reduce-scatter or all-gather). */
START_TEST(test_corrupt_chunk_fails_group)
{
    static const int at[] = {1, 2, 40};
    int t = _i / 3;
    corrupt_at = at[_i % 3];
    braid_config cfg = BRAID_CONFIG_INIT;
    cfg.timeout_ms = 20000;
    cfg.transports = transports[t];
    cfg.chunk_bytes = 8192;
    cfg.algo = BRAID_ALGO_RING;
    cfg.checksum = 1;
    harness_rank_setup = corrupt_setup;
    harness_result res;
    int failed = harness_run(4, corrupt_body, NULL, &cfg, 60, &res);
    harness_rank_setup = NULL;
    ck_assert_msg(failed == 0, "%s, message %d: %d ranks failed", transports[t], corrupt_at, failed);
    ck_assert_double_lt(res.seconds, 20.0);
}
END_TEST

/* ---- disagreement -------------------------------------------------------- */

/* Rank 1 has checksums off, the others on: every rank's init must fail
 * with BRAID_ERR_MISMATCH saying so, and none may hang. */
START_TEST(test_mixed_setting_fails_init)
{
    enum { N = 3 };
    braid_unique_id_t id;
    ck_assert_int_eq(braid_unique_id(&id), BRAID_OK);
    pid_t pids[N];
    double t0 = now_s();
    for (int r = 0; r < N; r++) {
        fflush(NULL);
        pids[r] = fork();
        ck_assert_int_ge(pids[r], 0);
        if (pids[r] == 0) {
            alarm(30);
            braid_config cfg = BRAID_CONFIG_INIT;
            cfg.timeout_ms = 10000;
            cfg.checksum = r == 1 ? -1 : 1;
            braid_pg *pg;
            braid_status st = braid_pg_init(&pg, r, N, &id, &cfg);
            if (st == BRAID_OK) {
                fprintf(stderr, "rank %d: init succeeded in a mixed group\n", r);
                braid_pg_destroy(pg);
                _exit(1);
            }
            /* The store handshake compares the setting: both values, both ranks. */
            if (st != BRAID_ERR_MISMATCH || !strstr(braid_last_error(), "BRAID_CHECKSUM differs") ||
                !strstr(braid_last_error(), "off at rank 1") || !strstr(braid_last_error(), "on at rank 0")) {
                fprintf(stderr, "rank %d: got %s: %s\n", r, braid_status_string(st), braid_last_error());
                _exit(2);
            }
            _exit(0);
        }
    }
    braid_rendezvous rv;
    if (braid__unique_id_decode(&id, &rv) == BRAID_OK)
        braid__prebound_release(rv.port);
    for (int r = 0; r < N; r++) {
        int status;
        ck_assert_int_eq(waitpid(pids[r], &status, 0), pids[r]);
        ck_assert_msg(WIFEXITED(status) && WEXITSTATUS(status) == 0, "rank %d: status 0x%x", r, status);
    }
    ck_assert_double_lt(now_s() - t0, 10.0); /* told at init, not by a timeout */
}
END_TEST

int main(void)
{
    signal(SIGPIPE, SIG_IGN);
    Suite *s = suite_create("checksum");
    TCase *crc = tcase_create("crc32c");
    tcase_add_test(crc, test_crc_vectors_table);
    tcase_add_test(crc, test_crc_vectors_hw);
    tcase_add_test(crc, test_crc_agree_and_chain);
    suite_add_tcase(s, crc);
    TCase *wrap = tcase_create("wrapper");
    tcase_set_timeout(wrap, 60);
    tcase_add_test(wrap, test_wrapper_roundtrip);
    tcase_add_test(wrap, test_wrapper_rejects_bad_trailer);
    suite_add_tcase(s, wrap);
    TCase *group = tcase_create("group");
    tcase_set_timeout(group, 300);
    tcase_add_loop_test(group, test_exact_with_checksums, 0, 12);
    tcase_add_test(group, test_exact_env);
    tcase_add_test(group, test_exact_mixed_transports);
    tcase_add_loop_test(group, test_corrupt_chunk_fails_group, 0, 6);
    tcase_add_test(group, test_mixed_setting_fails_init);
    suite_add_tcase(s, group);
    SRunner *sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? 1 : 0;
}
