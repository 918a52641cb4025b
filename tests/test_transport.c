/* One transport suite, run over every transport: `test_transport NAME`
 * drives NAME's ops table with two ranks (sizes both ways at once, large
 * transfers in both directions, many requests completing in posting order,
 * mismatched lengths, a peer that closes, a peer that dies) and asserts
 * the same contract of each. test_tcp.c, test_shm.c and test_verbs.c keep
 * only what is particular to their transport.
 *
 * NAME is tcp (1, 2 and 4 sockets per peer), shm (reading in place with
 * process_vm_readv, and copying through the ring) or verbs: on a device
 * (test_transport; exit 77 without a usable one, or in a build without
 * libibverbs) and on tests/verbs_fake.c (test_transport_verbs, ranks as
 * threads), or cuda_ipc: on a GPU (exit 77 without one, or without CUDA)
 * and on tests/cuda_fake.c's stand-in runtime (test_transport_cuda_ipc_fake). */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "clock.h"
#include "status.h"
#include "transport_pair.h"
#include "transports/cuda_ipc/cuda_ipc.h"
#include "transports/shm/shm.h"
#include "transports/tcp/tcp.h"
#ifdef BRAID_HAVE_VERBS
#include "transports/verbs/verbs.h"
#endif
#ifdef BRAID_VERBS_FAKE
#include "verbs_fake.h"
#endif

#define SKIP 77

/* ---- the transports ----------------------------------------------------------- */

static void tcp_tune(braid_transport_ctx *ctx, int variant)
{
    static const int nsocks[] = {1, 2, 4};
    ctx->nsocks = nsocks[variant];
}

static void shm_tune(braid_transport_ctx *ctx, int variant)
{
    (void)ctx;
    setenv("BRAID_SHM_CMA", variant ? "0" : "1", 1);
}

typedef struct {
    const char *name;
    const braid_transport_ops *ops;
    int in_process;
    void (*tune)(braid_transport_ctx *ctx, int variant);
    int variants;
} transport_spec;

static const transport_spec specs[] = {
    {"tcp", &braid__tcp_ops, 0, tcp_tune, 3},
    {"shm", &braid__shm_ops, 0, shm_tune, 2},
#if defined(BRAID_VERBS_FAKE)
    {"verbs", &braid__verbs_ops, 1, NULL, 1}, /* ranks as threads: the stand-in is in-process */
#elif defined(BRAID_HAVE_VERBS)
    {"verbs", &braid__verbs_ops, 0, NULL, 1}, /* a real device; skipped where its probe fails */
#endif
    /* Host buffers, copied through the IPC-mapped ring (user buffers may
     * be host or device memory); ranks are processes, as CUDA opens no
     * IPC handle of the process's own. On a GPU, or on tests/cuda_fake.c
     * (test_transport_cuda_ipc_fake). */
    {"cuda_ipc", NULL, 0, NULL, 1},
};

static const transport_spec *spec;

/* Every variant in turn: _i of a loop test. */
static void run_variant(int variant, tp_side_fn fn, void *arg)
{
    tp = (tp_transport){.ops = spec->ops, .in_process = spec->in_process, .tune = spec->tune, .variant = variant};
    int rc0, rc1;
    tp_run_pair(fn, arg, &rc0, &rc1);
    ck_assert_msg(rc0 == 0 && rc1 == 0, "%s variant %d: rank 0 returned %d, rank 1 %d", spec->name, variant, rc0,
                  rc1);
#ifdef BRAID_VERBS_FAKE
    char desc[200];
    ck_assert_msg(verbs_fake_live(desc, sizeof(desc)) == 0, "verbs objects left: %s", desc);
#endif
}

/* A 4-byte exchange both ways: the connection is up on both sides after
 * it (some transports finish set-up on first use). */
static int sync_pair(braid_conn *c, int rank)
{
    uint32_t out = (uint32_t)rank, in = 99;
    braid_req r[2];
    if (tp.ops->isend(c, &r[0], &out, sizeof(out)) != BRAID_OK || tp.ops->irecv(c, &r[1], &in, sizeof(in)) != BRAID_OK ||
        tp_wait_all(r, 2, 20000) != BRAID_OK)
        TP_FAIL("rank %d: sync: %s", rank, braid_last_error());
    if (in != (uint32_t)(1 - rank))
        TP_FAIL("rank %d: sync got %u", rank, in);
    return 0;
}

/* ---- data ------------------------------------------------------------------------ */

/* Both ranks send every size to each other at once, receives posted
 * first; sizes straddle ring slots, windows and stripes. */
static const size_t sizes[] = {0, 1, 40, 4095, 4096, 65537, 131071, 131072, 131073, 1 << 20, (5 << 20) + 17, 0, 3};
#define NSIZES (sizeof(sizes) / sizeof(sizes[0]))

static int side_sizes(int rank, braid_conn *c, void *arg)
{
    (void)arg;
    uint8_t *sbuf[NSIZES], *rbuf[NSIZES];
    braid_req reqs[2 * NSIZES];
    for (size_t i = 0; i < NSIZES; i++) {
        sbuf[i] = malloc(sizes[i] + 1);
        rbuf[i] = malloc(sizes[i] + 1);
        if (!sbuf[i] || !rbuf[i])
            TP_FAIL("rank %d: out of memory", rank);
        tp_fill(sbuf[i], sizes[i], (uint64_t)rank * 100 + i);
        if (tp.ops->irecv(c, &reqs[NSIZES + i], rbuf[i], sizes[i]) != BRAID_OK)
            TP_FAIL("rank %d: irecv %zu: %s", rank, i, braid_last_error());
    }
    for (size_t i = 0; i < NSIZES; i++)
        if (tp.ops->isend(c, &reqs[i], sbuf[i], sizes[i]) != BRAID_OK)
            TP_FAIL("rank %d: isend %zu: %s", rank, i, braid_last_error());
    if (tp_wait_all(reqs, 2 * NSIZES, 60000) != BRAID_OK)
        TP_FAIL("rank %d: transfers: %s", rank, braid_last_error());
    for (size_t i = 0; i < NSIZES; i++) {
        if (reqs[NSIZES + i].moved != sizes[i] || !tp_check_fill(rbuf[i], sizes[i], (uint64_t)(1 - rank) * 100 + i))
            TP_FAIL("rank %d: message %zu (%zu bytes) corrupted", rank, i, sizes[i]);
        free(sbuf[i]);
        free(rbuf[i]);
    }
    return 0;
}

START_TEST(sizes_both_ways)
{
    run_variant(_i, side_sizes, NULL);
}
END_TEST

#define BIG ((size_t)24 << 20)

/* Both sides send and receive a large message at the same time: with
 * non-blocking progress neither waits for the other to drain. */
static int side_big(int rank, braid_conn *c, void *arg)
{
    (void)arg;
    uint8_t *out = malloc(BIG), *in = malloc(BIG);
    if (!out || !in)
        TP_FAIL("rank %d: out of memory", rank);
    tp_fill(out, BIG, 77 + (uint64_t)rank);
    braid_req r[2];
    if (tp.ops->isend(c, &r[0], out, BIG) != BRAID_OK || tp.ops->irecv(c, &r[1], in, BIG) != BRAID_OK)
        TP_FAIL("rank %d: post: %s", rank, braid_last_error());
    if (tp_wait_all(r, 2, 60000) != BRAID_OK)
        TP_FAIL("rank %d: transfers: %s", rank, braid_last_error());
    int ok = tp_check_fill(in, BIG, 77 + (uint64_t)(1 - rank));
    free(out);
    free(in);
    return ok ? 0 : 3;
}

START_TEST(large_both_ways)
{
    run_variant(_i, side_big, NULL);
}
END_TEST

#define MANY 2000

static size_t many_len(int i)
{
    return (size_t)((i * 7919) % 5 == 0 ? (i * 104729) % 300000 : (i * 131) % 3000);
}

/* Rank 0 posts MANY sends of mixed sizes at once; rank 1's receives
 * complete in posting order, each with its own bytes. */
static int side_many(int rank, braid_conn *c, void *arg)
{
    (void)arg;
    braid_req *r = calloc(MANY, sizeof(*r));
    uint8_t **b = calloc(MANY, sizeof(*b));
    if (!r || !b)
        TP_FAIL("rank %d: out of memory", rank);
    for (int i = 0; i < MANY; i++) {
        if (!(b[i] = malloc(many_len(i) + 1)))
            TP_FAIL("rank %d: out of memory", rank);
        if (rank == 0)
            tp_fill(b[i], many_len(i), (uint64_t)i);
        braid_status st = rank == 0 ? tp.ops->isend(c, &r[i], b[i], many_len(i))
                                    : tp.ops->irecv(c, &r[i], b[i], many_len(i));
        if (st != BRAID_OK)
            TP_FAIL("rank %d: post %d: %s", rank, i, braid_last_error());
    }
    int64_t deadline = braid__now_ms() + 60000;
    int done_upto = 0;
    braid_conn *conn = c;
    while (done_upto < MANY && braid__now_ms() < deadline) {
        for (int i = done_upto; i < MANY; i++) {
            int d;
            if (tp.ops->test(&r[i], &d) != BRAID_OK)
                TP_FAIL("rank %d: request %d: %s", rank, i, braid_last_error());
            if (d && i != done_upto && rank == 1)
                TP_FAIL("rank 1: request %d done before %d", i, done_upto);
            if (!d)
                break;
            done_upto++;
        }
        if (tp.ops->progress(&conn, 1, -1, 100) != BRAID_OK)
            TP_FAIL("rank %d: progress: %s", rank, braid_last_error());
    }
    if (done_upto < MANY)
        TP_FAIL("rank %d: %d of %d requests done", rank, done_upto, MANY);
    for (int i = 0; i < MANY; i++) {
        if (rank == 1 && (r[i].moved != many_len(i) || !tp_check_fill(b[i], many_len(i), (uint64_t)i)))
            TP_FAIL("rank 1: message %d differs", i);
        free(b[i]);
    }
    free(b);
    free(r);
    return 0;
}

START_TEST(many_in_order)
{
    run_variant(_i, side_many, NULL);
}
END_TEST

/* ---- failures ------------------------------------------------------------------- */

/* A message of the wrong length (shorter: arg 0, longer: arg 1) fails the
 * receive with BRAID_ERR_MISMATCH naming the peer, and stays failed. The
 * send completes, or, on a transport whose sends complete only once the
 * receiver has taken them (cuda_ipc), fails naming the receiver. */
static int side_mismatch(int rank, braid_conn *c, void *arg)
{
    size_t sent = *(int *)arg ? 300 : 100, posted = 200;
    uint8_t buf[300] = {0};
    if (rank == 0) {
        braid_status st = tp_send(c, buf, sent);
        if (st != BRAID_OK && !strstr(braid_last_error(), "peer 1"))
            TP_FAIL("rank 0: send: %s", braid_last_error());
        usleep(200 * 1000); /* let rank 1 see the data before the goodbye */
        return 0;
    }
    braid_status st = tp_recv(c, buf, posted);
    if (st != BRAID_ERR_MISMATCH || !strstr(braid_last_error(), "peer 0"))
        TP_FAIL("rank 1: %zu bytes into %zu: want a mismatch naming peer 0, got %s: %s", sent, posted,
                braid_status_string(st), braid_last_error());
    braid_req r;
    st = tp.ops->irecv(c, &r, buf, 1);
    if (st == BRAID_OK)
        st = tp_wait_all(&r, 1, 5000);
    if (st != BRAID_ERR_MISMATCH)
        TP_FAIL("rank 1: a receive after the mismatch: %s, want the mismatch again", braid_status_string(st));
    return 0;
}

START_TEST(length_mismatch)
{
    int longer = _i;
    run_variant(0, side_mismatch, &longer);
}
END_TEST

/* Rank 0 closes its end (arg 0) or its process dies without closing
 * (arg 1): rank 1's pending receive fails within 5 s, naming peer 0. */
static int side_peer_gone(int rank, braid_conn *c, void *arg)
{
    int die = *(int *)arg;
    if (sync_pair(c, rank) != 0)
        return 1;
    if (rank == 0) {
        usleep(100 * 1000);
        if (die)
            _exit(0); /* the kernel closes what the transport held */
        return 0;     /* the pair runner closes the connection */
    }
    uint8_t buf[64];
    braid_req r;
    if (tp.ops->irecv(c, &r, buf, sizeof(buf)) != BRAID_OK)
        TP_FAIL("rank 1: irecv: %s", braid_last_error());
    int64_t t0 = braid__now_ms();
    braid_status st = tp_wait_all(&r, 1, 20000);
    int64_t took = braid__now_ms() - t0;
    if (st != BRAID_ERR_PEER || !strstr(braid_last_error(), "peer 0"))
        TP_FAIL("rank 1: want BRAID_ERR_PEER naming peer 0, got %s: %s", braid_status_string(st), braid_last_error());
    if (took > 5000)
        TP_FAIL("rank 1: took %lld ms to notice", (long long)took);
    return 0;
}

START_TEST(peer_closes)
{
    int die = 0;
    run_variant(0, side_peer_gone, &die);
}
END_TEST

START_TEST(peer_dies)
{
    int die = 1;
    run_variant(0, side_peer_gone, &die);
}
END_TEST

static Suite *transport_suite(void)
{
    Suite *s = suite_create(spec->name);
    TCase *data = tcase_create("data");
    tcase_set_timeout(data, 300);
    tcase_add_loop_test(data, sizes_both_ways, 0, spec->variants);
    tcase_add_loop_test(data, large_both_ways, 0, spec->variants);
    tcase_add_loop_test(data, many_in_order, 0, spec->variants);
    suite_add_tcase(s, data);
    TCase *fail = tcase_create("failures");
    tcase_set_timeout(fail, 120);
    tcase_add_loop_test(fail, length_mismatch, 0, 2);
    tcase_add_test(fail, peer_closes);
    if (!spec->in_process) /* a thread cannot die alone */
        tcase_add_test(fail, peer_dies);
    suite_add_tcase(s, fail);
    return s;
}

int main(int argc, char **argv)
{
    const char *name = argc > 1 ? argv[1] : "";
    static transport_spec found;
    for (size_t i = 0; i < sizeof(specs) / sizeof(specs[0]); i++)
        if (!strcmp(specs[i].name, name)) {
            found = specs[i];
            spec = &found;
        }
    if (spec && !spec->ops)
        found.ops = braid__cuda_ipc_transport(); /* NULL in a build without CUDA */
    if (spec && !spec->ops) {
        printf("SKIP: this build has no %s transport (built without CUDA)\n", name);
        return SKIP;
    }
    if (!spec) {
        if (!strcmp(name, "verbs")) {
            printf("SKIP: this build has no verbs transport (libibverbs was not found)\n");
            return SKIP;
        }
        fprintf(stderr, "usage: test_transport tcp|shm|verbs|cuda_ipc\n");
        return 2;
    }
    char why[512] = "";
    if (spec->ops->probe(why, sizeof(why)) != BRAID_OK) {
        printf("SKIP: transport %s unusable here: %s\n", spec->name, why);
        return SKIP;
    }
    SRunner *sr = srunner_create(transport_suite());
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? 1 : 0;
}
