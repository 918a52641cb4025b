/* TCP data-path framing (transports/tcp): the stripe layout, and the
 * receive side parsing a byte stream of length headers and payloads.
 *
 * The parser has no separate pure function: it is the receive path of a
 * connection, so the target wraps one end of socketpairs in a real
 * braid_tcp_conn and writes the fuzz input into the other end.
 *
 *   mode 0 (raw): input bytes are the stream on socket 0; receives of
 *     fuzz-chosen lengths are posted. A reference parser decides the one
 *     correct outcome (all received with these bytes, BRAID_ERR_MISMATCH
 *     at the first wrong header, or BRAID_ERR_PEER where the stream
 *     ends early) and the connection must agree.
 *   mode 1 (round trip): the same messages sent through a second
 *     connection over 1..3 sockets (striped when large) arrive intact.
 *
 * Stripe invariants: the non-empty parts of every message are contiguous,
 * in socket order, cover it exactly and start on the stripe alignment;
 * small messages go whole on socket 0. */
#include <poll.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "fuzz_common.h"
#include "transports/tcp/tcp_conn.h"

#define MAX_MSGS 4
#define MAX_SOCKS 3
#define BIG_MSG (3 * BRAID_TCP_STRIPE_MIN)

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc;
    (void)argv;
    fuzz_quiet();
    return 0;
}

static void check_stripes(size_t len, int nsocks)
{
    size_t next = 0;
    for (int k = 0; k < nsocks; k++) {
        size_t off, n;
        braid__tcp_stripe(len, nsocks, k, &off, &n);
        if (nsocks == 1 || len < BRAID_TCP_STRIPE_MIN)
            FUZZ_ASSERT(k == 0 ? n == len : n == 0);
        if (n == 0)
            continue; /* an empty part has no place */
        FUZZ_ASSERT(off == next && off + n <= len);
        if (k > 0)
            FUZZ_ASSERT(off % BRAID_TCP_STRIPE_ALIGN == 0);
        next = off + n;
    }
    FUZZ_ASSERT(next == len);
}

static uint64_t be64(const uint8_t *p)
{
    uint64_t v = 0;
    for (int i = 0; i < 8; i++)
        v = v << 8 | p[i];
    return v;
}

/* What a correct receiver of stream[0..n) makes of receives lens[0..m). */
static braid_status model(const uint8_t *stream, size_t n, const size_t *lens, int m, int *ndone)
{
    size_t pos = 0;
    *ndone = 0;
    for (int i = 0; i < m; i++) {
        if (n - pos < BRAID_TCP_HDR_BYTES)
            return BRAID_ERR_PEER;
        if (be64(stream + pos) != (uint64_t)lens[i])
            return BRAID_ERR_MISMATCH;
        pos += BRAID_TCP_HDR_BYTES;
        if (n - pos < lens[i])
            return BRAID_ERR_PEER;
        pos += lens[i];
        (*ndone)++;
    }
    return BRAID_OK;
}

static int make_pairs(int nsocks, int *a, int *b)
{
    for (int k = 0; k < nsocks; k++) {
        int sv[2];
        if (socketpair(AF_UNIX, SOCK_STREAM, 0, sv) != 0) {
            for (int j = 0; j < k; j++) {
                close(a[j]);
                close(b[j]);
            }
            return -1;
        }
        a[k] = sv[0];
        b[k] = sv[1];
    }
    return 0;
}

/* Progress conns until every request is done or one fails; bounded, so a
 * stuck state machine shows up as a failed invariant, not a hang. */
static braid_status drive(braid_conn **conns, int nconns, braid_req *reqs, int nreqs)
{
    for (int spin = 0; spin < 100000; spin++) {
        int all = 1;
        for (int i = 0; i < nreqs; i++) {
            int done = 0;
            braid_status st = braid__tcp_test(&reqs[i], &done);
            if (st != BRAID_OK)
                return st;
            all &= done;
        }
        if (all)
            return BRAID_OK;
        braid_status st = braid__tcp_progress(conns, nconns, -1, 50);
        if (st != BRAID_OK)
            return st;
    }
    FUZZ_ASSERT(!"connection neither finished nor failed");
    return BRAID_ERR_INTERNAL;
}

static void run_raw(const uint8_t *stream, size_t n, const size_t *lens, int m)
{
    int a[1], b[1];
    if (make_pairs(1, a, b) != 0)
        return;
    /* The whole input fits the socket buffer (-max_len keeps it small),
     * then the writer closes: the receiver sees exactly these bytes. */
    size_t off = 0;
    while (off < n) {
        ssize_t w = send(b[0], stream + off, n - off, MSG_DONTWAIT | MSG_NOSIGNAL);
        if (w <= 0)
            break;
        off += (size_t)w;
    }
    close(b[0]);
    braid_tcp_conn *c = NULL;
    FUZZ_ASSERT(braid__tcp_conn_create(0, 1, 1, a, "fuzz", &c) == BRAID_OK);
    uint8_t *bufs[MAX_MSGS] = {0};
    braid_req reqs[MAX_MSGS];
    for (int i = 0; i < m; i++) {
        bufs[i] = malloc(lens[i] ? lens[i] : 1);
        FUZZ_ASSERT(bufs[i]);
        FUZZ_ASSERT(braid__tcp_irecv(&c->base, &reqs[i], bufs[i], lens[i]) == BRAID_OK);
    }
    braid_conn *conns[1] = {&c->base};
    braid_status got = drive(conns, 1, reqs, m);
    int want_done = 0;
    braid_status want = model(stream, off, lens, m, &want_done);
    FUZZ_ASSERT(got == want);
    size_t pos = 0;
    for (int i = 0; i < want_done; i++) {
        pos += BRAID_TCP_HDR_BYTES;
        FUZZ_ASSERT(reqs[i].done && memcmp(bufs[i], stream + pos, lens[i]) == 0);
        pos += lens[i];
    }
    if (got != BRAID_OK) {
        /* Sticky: later calls fail the same way, at once. */
        braid_req again;
        uint8_t one;
        FUZZ_ASSERT(braid__tcp_irecv(&c->base, &again, &one, 1) == got);
    }
    braid__tcp_close(&c->base);
    for (int i = 0; i < m; i++)
        free(bufs[i]);
}

static void run_roundtrip(const uint8_t *seed, size_t n, const size_t *lens, int m, int nsocks)
{
    int a[MAX_SOCKS], b[MAX_SOCKS];
    if (make_pairs(nsocks, a, b) != 0)
        return;
    braid_tcp_conn *tx = NULL, *rx = NULL;
    FUZZ_ASSERT(braid__tcp_conn_create(0, 1, nsocks, a, "fuzz-tx", &tx) == BRAID_OK);
    FUZZ_ASSERT(braid__tcp_conn_create(1, 0, nsocks, b, "fuzz-rx", &rx) == BRAID_OK);
    uint8_t *src[MAX_MSGS] = {0}, *dst[MAX_MSGS] = {0};
    braid_req reqs[2 * MAX_MSGS];
    for (int i = 0; i < m; i++) {
        src[i] = malloc(lens[i] ? lens[i] : 1);
        dst[i] = calloc(1, lens[i] ? lens[i] : 1);
        FUZZ_ASSERT(src[i] && dst[i]);
        for (size_t j = 0; j < lens[i]; j++)
            src[i][j] = n ? (uint8_t)(seed[j % n] + j / n + (size_t)i) : (uint8_t)j;
        FUZZ_ASSERT(braid__tcp_isend(&tx->base, &reqs[2 * i], src[i], lens[i]) == BRAID_OK);
        FUZZ_ASSERT(braid__tcp_irecv(&rx->base, &reqs[2 * i + 1], dst[i], lens[i]) == BRAID_OK);
    }
    braid_conn *conns[2] = {&tx->base, &rx->base};
    FUZZ_ASSERT(drive(conns, 2, reqs, 2 * m) == BRAID_OK);
    for (int i = 0; i < m; i++) {
        FUZZ_ASSERT(reqs[2 * i + 1].moved == lens[i]);
        FUZZ_ASSERT(memcmp(src[i], dst[i], lens[i]) == 0);
        free(src[i]);
        free(dst[i]);
    }
    braid__tcp_close(&tx->base);
    braid__tcp_close(&rx->base);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 2)
        return 0;
    int mode = data[0] & 1, nsocks = 1 + (data[0] >> 1) % MAX_SOCKS, m = 1 + (data[0] >> 3) % MAX_MSGS;
    data++;
    size--;
    size_t lens[MAX_MSGS];
    for (int i = 0; i < m; i++) {
        /* Two bytes per length; the top bit of the first asks for a large,
         * striped message in round-trip mode. */
        uint32_t v = size >= 2 ? (uint32_t)data[0] << 8 | data[1] : 0;
        if (size >= 2) {
            data += 2;
            size -= 2;
        }
        lens[i] = mode == 1 && (v & 0x8000) ? BRAID_TCP_STRIPE_MIN + (size_t)(v & 0x7fff) * 5 : v & 0x7fff;
        if (lens[i] > BIG_MSG)
            lens[i] = BIG_MSG;
        check_stripes(lens[i], nsocks);
        check_stripes((size_t)v * 997, nsocks);
    }
    if (mode == 0) {
        /* Short raw streams only: the receive buffers stay small. */
        for (int i = 0; i < m; i++)
            lens[i] %= 4096;
        run_raw(data, size, lens, m);
    } else {
        run_roundtrip(data, size, lens, m, nsocks);
    }
    return 0;
}
