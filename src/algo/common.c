/* Waiting, testing and call fingerprints shared by every algorithm. */
#include <inttypes.h>
#include <sched.h>
#include <stdio.h>
#include <string.h>

#include "algo.h"
#include "transports/checksum/checksum.h"
#include "clock.h"
#include "param.h"
#include "status.h"

/* Longest single block in the transport, so a stuck wait rechecks abort
 * even if the wake fd were missed. */
#define WAIT_SLICE_MS 10
/* Mixed transports: longest block in one transport while another's
 * connections wait unprogressed, and connections progressed per call. */
#define MIXED_BLOCK_MS 1
#define MIXED_GROUP_MAX 64

void braid__algo_run_init(braid_algo_run *run, const braid_algo_ctx *ctx, const braid_coll *coll)
{
    run->ctx = ctx;
    run->coll = coll;
    run->deadline_ms = braid__now_ms() + ctx->timeout_ms;
    run->name = braid__kind(coll->kind)->name;
    run->fp_in.posted = 0;
    run->spin_until_us = run->last_wait_us = 0;
}

/* A wait that starts more than this after the previous one returned
 * follows work done in between (a chunk reduced, a request posted): a new
 * idle spell, which spins again. */
#define MIXED_SPELL_GAP_US 20
/* Spin of an idle spell on mixed links: as long as the block it avoids. */
#define MIXED_SPIN_US (MIXED_BLOCK_MS * 1000)

/* Connections of several transports (shm to same-host peers, the network
 * to the rest): no transport can block on another's connections, so each
 * transport's share is progressed without blocking. Early in an idle spell
 * that is all (the caller retries at once, yielding the CPU in between);
 * after MIXED_SPIN_US the first transport blocks for at most MIXED_BLOCK_MS,
 * which bounds how late the others' data is seen. Without the spin, a ring
 * with one shm and one TCP neighbour saw each chunk up to a millisecond
 * late: 10-30 times slower than the same ring all on TCP. */
static braid_status wait_mixed(braid_algo_run *run, braid_conn **conns, int nconns, int wake_fd, int slice)
{
    int64_t now = braid__now_us();
    if (now - run->last_wait_us > MIXED_SPELL_GAP_US)
        run->spin_until_us = braid__spin_us() > 0 ? now + MIXED_SPIN_US : now;
    int spinning = now < run->spin_until_us;
    braid_conn *group[MIXED_GROUP_MAX];
    for (int i = 0; i < nconns; i++) {
        const braid_transport_ops *ops = conns[i]->ops;
        int seen = 0;
        for (int j = 0; j < i && !seen; j++)
            seen = conns[j]->ops == ops;
        if (seen || ops == conns[0]->ops)
            continue;
        int n = 0;
        for (int j = i; j < nconns; j++) {
            if (conns[j]->ops != ops)
                continue;
            group[n++] = conns[j];
            if (n == MIXED_GROUP_MAX) {
                BRAID_CHECK(ops->progress(group, n, -1, 0));
                n = 0;
            }
        }
        if (n)
            BRAID_CHECK(ops->progress(group, n, -1, 0));
    }
    const braid_transport_ops *first = conns[0]->ops;
    int n = 0;
    for (int j = 0; j < nconns; j++) {
        if (conns[j]->ops != first)
            continue;
        group[n++] = conns[j];
        if (n == MIXED_GROUP_MAX) {
            BRAID_CHECK(first->progress(group, n, -1, 0));
            n = 0;
        }
    }
    int block = slice < MIXED_BLOCK_MS ? slice : MIXED_BLOCK_MS;
    if (spinning) {
        block = 0;
        sched_yield();
    }
    braid_status st = n ? first->progress(group, n, wake_fd, block) : BRAID_OK;
    run->last_wait_us = braid__now_us();
    return st;
}

static braid_status algo_wait(braid_algo_run *run, braid_conn **conns, int nconns, int waiting_on);

/* A chunk failed its checksum on conn: say which call it belonged to and
 * where in the call's buffers it was going, on top of what the connection
 * found (rank, peer, message, expected and actual CRC, logged there). */
static braid_status corrupt_context(braid_algo_run *run, const braid_conn *conn, braid_status st)
{
    braid_checksum_fault f;
    if (st != BRAID_ERR_CORRUPT || !conn || !braid__checksum_fault(conn, &f))
        return st;
    const braid_coll *c = run->coll;
    size_t esize = braid_dtype_size(c->dtype), bytes = c->count * esize;
    const uint8_t *b = f.buf, *recv = c->recv;
    char where[96];
    if (recv && b >= recv && b < recv + bytes)
        snprintf(where, sizeof(where), "chunk at byte offset %zu of the result buffer", (size_t)(b - recv));
    else if (b == run->fp_in.theirs)
        snprintf(where, sizeof(where), "call fingerprint");
    else if (f.len == BRAID_FP_BYTES) /* some algorithms keep the fingerprint they receive locally */
        snprintf(where, sizeof(where), "call fingerprint or a chunk received into staging");
    else
        snprintf(where, sizeof(where), "chunk received into staging");
    if (f.order)
        return braid__error_quiet(st,
                                  "rank %d: %s #%" PRIu64 ": data from peer %d out of order: expected message #%" PRIu64
                                  " (%zu bytes, %s), its trailer names #%" PRIu32,
                                  f.rank, run->name, c->seq, f.peer, f.msg, f.len, where, f.actual);
    return braid__error_quiet(st,
                              "rank %d: %s #%" PRIu64 ": checksum mismatch on data from peer %d, message #%" PRIu64
                              " (%zu bytes, %s): crc32c expected 0x%08" PRIx32 " (sender), actual 0x%08" PRIx32
                              " (received)",
                              f.rank, run->name, c->seq, f.peer, f.msg, f.len, where, f.expected, f.actual);
}

braid_status braid__algo_wait(braid_algo_run *run, braid_conn **conns, int nconns, int waiting_on)
{
    braid_status st = algo_wait(run, conns, nconns, waiting_on);
    for (int i = 0; st == BRAID_ERR_CORRUPT && i < nconns; i++)
        if (conns[i]->error == BRAID_ERR_CORRUPT)
            return corrupt_context(run, conns[i], st);
    return st;
}

static braid_status algo_wait(braid_algo_run *run, braid_conn **conns, int nconns, int waiting_on)
{
    const braid_algo_ctx *ctx = run->ctx;
    if (atomic_load(ctx->aborted))
        return braid__error(BRAID_ERR_ABORTED, "rank %d: %s #%" PRIu64 " aborted by braid_pg_abort", ctx->rank,
                            run->name, run->coll->seq);
    int64_t left = run->deadline_ms - braid__now_ms();
    if (left <= 0)
        return braid__error(BRAID_ERR_TIMEOUT,
                            "rank %d: %s #%" PRIu64 " timed out after %d ms waiting for peer %d", ctx->rank,
                            run->name, run->coll->seq, ctx->timeout_ms, waiting_on);
    int slice = left < WAIT_SLICE_MS ? (int)left : WAIT_SLICE_MS;
    for (int i = 1; i < nconns; i++)
        if (conns[i]->ops != conns[0]->ops)
            return wait_mixed(run, conns, nconns, ctx->wake_fd, slice);
    braid_status st = conns[0]->ops->progress(conns, nconns, ctx->wake_fd, slice);
    if (st != BRAID_OK)
        return st;
    return BRAID_OK;
}

braid_status braid__algo_test(braid_algo_run *run, braid_req *req, int *done)
{
    braid_status st = req->conn->ops->test(req, done);
    return st == BRAID_ERR_CORRUPT ? corrupt_context(run, req->conn, st) : st;
}

/* Wire layout (little endian): magic u32, kind u8, op u8, dtype u8,
 * flags u8 (bit 0: the device ring; not compared), root i32, count u64,
 * seq u64, zero padding to 40 bytes. */
#define FP_MAGIC 0x50464442u /* "BDFP" */

static void put_u32(uint8_t *p, uint32_t v)
{
    for (int i = 0; i < 4; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

static void put_u64(uint8_t *p, uint64_t v)
{
    for (int i = 0; i < 8; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

static uint32_t get_u32(const uint8_t *p)
{
    uint32_t v = 0;
    for (int i = 0; i < 4; i++)
        v |= (uint32_t)p[i] << (8 * i);
    return v;
}

static uint64_t get_u64(const uint8_t *p)
{
    uint64_t v = 0;
    for (int i = 0; i < 8; i++)
        v |= (uint64_t)p[i] << (8 * i);
    return v;
}

typedef struct {
    uint32_t magic;
    int kind, op, dtype, root;
    uint64_t count, seq;
} fingerprint;

static void fp_encode_fields(const fingerprint *f, uint8_t out[BRAID_FP_BYTES])
{
    memset(out, 0, BRAID_FP_BYTES);
    put_u32(out, f->magic);
    out[4] = (uint8_t)f->kind;
    out[5] = (uint8_t)f->op;
    out[6] = (uint8_t)f->dtype;
    put_u32(out + 8, (uint32_t)f->root);
    put_u64(out + 12, f->count);
    put_u64(out + 20, f->seq);
}

static void fp_decode(const uint8_t in[BRAID_FP_BYTES], fingerprint *f)
{
    f->magic = get_u32(in);
    f->kind = in[4];
    f->op = in[5];
    f->dtype = in[6];
    f->root = (int)get_u32(in + 8);
    f->count = get_u64(in + 12);
    f->seq = get_u64(in + 20);
}

static void fp_from_coll(const braid_coll *c, fingerprint *f)
{
    f->magic = FP_MAGIC;
    /* A message's send and its receive carry one wire kind, so that they
     * match each other and nothing else. */
    f->kind = c->kind == BRAID_COLL_RECV ? (int)BRAID_COLL_SEND : (int)c->kind;
    /* Broadcast has no op or dtype beyond its byte count, but the dtype is
     * still compared so count means the same thing on both sides. */
    const braid_kind_traits *t = braid__kind(c->kind);
    f->op = t->has_op ? (int)c->op : 0;
    f->dtype = (int)c->dtype;
    f->root = t->has_root ? c->root : -1;
    f->count = c->count;
    f->seq = c->seq;
}

void braid__fp_encode(const braid_coll *coll, uint8_t out[BRAID_FP_BYTES])
{
    fingerprint f;
    fp_from_coll(coll, &f);
    fp_encode_fields(&f, out);
}

static void fp_describe(const fingerprint *f, char *buf, size_t cap)
{
    /* Only what the call has: a broadcast's op and a reduce-less call's
     * root mean nothing and would only distract. */
    const braid_kind_traits *t = braid__kind(f->kind);
    char op[24] = "", root[24] = "";
    if (t->has_op)
        snprintf(op, sizeof(op), ", %s", braid__op_name((braid_op)f->op));
    if (t->has_root)
        snprintf(root, sizeof(root), ", root=%d", f->root);
    snprintf(buf, cap, "#%" PRIu64 " %s(count=%" PRIu64 ", %s%s%s)", f->seq,
             f->kind == BRAID_COLL_SEND ? "send/recv" : t->name, f->count,
             braid__dtype_name((braid_dtype)f->dtype), op, root);
}

int braid__fp_describe(const uint8_t fp[BRAID_FP_BYTES], char *buf, size_t cap)
{
    fingerprint f;
    fp_decode(fp, &f);
    const braid_kind_traits *t = braid__kind(f.kind);
    if (f.magic != FP_MAGIC || !braid__kind_valid(f.kind) || f.kind == BRAID_COLL_RECV || t->exchange ||
        f.kind == BRAID_COLL_GROUP || braid_dtype_size((braid_dtype)f.dtype) == 0 ||
        (t->has_op && (unsigned)f.op >= BRAID_OP_COUNT))
        return 0;
    fp_describe(&f, buf, cap);
    return 1;
}

#define FP_FLAGS_BYTE 7
#define FP_FLAG_DRING 1u

void braid__fp_set_dring(uint8_t fp[BRAID_FP_BYTES])
{
    fp[FP_FLAGS_BYTE] |= FP_FLAG_DRING;
}

int braid__fp_dring(const uint8_t fp[BRAID_FP_BYTES])
{
    return (fp[FP_FLAGS_BYTE] & FP_FLAG_DRING) != 0;
}

braid_status braid__fp_back_start(braid_algo_run *run, braid_fp_back *b, const uint8_t mine[BRAID_FP_BYTES], int prev,
                                  int next)
{
    const braid_algo_ctx *ctx = run->ctx;
    memset(b, 0, sizeof(*b));
    b->next = next;
    if (ctx->has_devlink(ctx->owner, prev)) {
        braid_conn *c;
        BRAID_CHECK(braid__ctx_conn(ctx, prev, &c));
        BRAID_CHECK(braid__conn_isend(c, &b->send_req, mine, BRAID_FP_BYTES));
        b->sending = 1;
    }
    if (ctx->has_devlink(ctx->owner, next)) {
        braid_conn *c;
        BRAID_CHECK(braid__ctx_conn(ctx, next, &c));
        BRAID_CHECK(c->ops->irecv(c, &b->recv_req, b->theirs, BRAID_FP_BYTES));
        b->receiving = 1;
    }
    return BRAID_OK;
}

braid_status braid__fp_back_poll(braid_algo_run *run, braid_fp_back *b, int *done)
{
    int d;
    if (b->sending) {
        BRAID_CHECK(braid__algo_test(run, &b->send_req, &d));
        b->sending = !d;
    }
    if (b->receiving) {
        BRAID_CHECK(braid__algo_test(run, &b->recv_req, &d));
        if (d) {
            b->receiving = 0;
            BRAID_CHECK(braid__fp_check(run, b->next, b->theirs));
            b->exchanged = 1;
        }
    }
    *done = !b->sending && !b->receiving;
    return BRAID_OK;
}

braid_status braid__fp_check(braid_algo_run *run, int peer, const uint8_t theirs[BRAID_FP_BYTES])
{
    fingerprint mine, other;
    fp_from_coll(run->coll, &mine);
    fp_decode(theirs, &other);
    if (other.magic != FP_MAGIC)
        return braid__error(BRAID_ERR_PEER, "rank %d: %s #%" PRIu64 ": peer %d sent a malformed call header",
                            run->ctx->rank, run->name, run->coll->seq, peer);
    if (mine.kind == other.kind && mine.op == other.op && mine.dtype == other.dtype &&
        mine.root == other.root && mine.count == other.count && mine.seq == other.seq)
        return BRAID_OK;
    char a[160], b[160];
    fp_describe(&mine, a, sizeof(a));
    fp_describe(&other, b, sizeof(b));
    braid_mismatch_seen *seen = run->ctx->mismatch;
    if (seen && !seen->found) {
        seen->found = 1;
        seen->peer = peer;
        fp_encode_fields(&mine, seen->mine);
        memcpy(seen->theirs, theirs, BRAID_FP_BYTES);
    }
    return braid__error(BRAID_ERR_MISMATCH, "rank %d called %s but peer %d called %s", run->ctx->rank, a, peer, b);
}

braid_status braid__algo_sendrecv(braid_algo_run *run, int send_peer, const void *sbuf, size_t slen,
                                  int recv_peer, void *rbuf, size_t rlen, int fp)
{
    const braid_algo_ctx *ctx = run->ctx;
    braid_conn *sc = NULL, *rc = NULL, *conns[2];
    int nconns = 0;
    if (send_peer >= 0) {
        BRAID_CHECK(braid__ctx_conn(ctx, send_peer, &sc));
        conns[nconns++] = sc;
    }
    if (recv_peer >= 0) {
        BRAID_CHECK(braid__ctx_conn(ctx, recv_peer, &rc));
        if (rc != sc)
            conns[nconns++] = rc;
    }
    if (nconns == 0)
        return BRAID_OK;

    uint8_t fp_mine[BRAID_FP_BYTES];
    braid_req reqs[3];
    int nreq = 0, fp_checked = !(fp && rc);
    if (fp) {
        braid__fp_encode(run->coll, fp_mine);
        if (sc)
            BRAID_CHECK(braid__conn_isend(sc, &reqs[nreq++], fp_mine, sizeof(fp_mine)));
        if (rc)
            BRAID_CHECK(braid__fp_recv(run, rc, recv_peer));
    }
    if (sc)
        BRAID_CHECK(braid__conn_isend(sc, &reqs[nreq++], sbuf, slen));
    if (rc)
        BRAID_CHECK(rc->ops->irecv(rc, &reqs[nreq++], rbuf, rlen));

    int done_mask = 0, all = (1 << nreq) - 1;
    while (done_mask != all || !fp_checked) {
        int moved = 0;
        if (!fp_checked) {
            BRAID_CHECK(braid__fp_poll(run, &fp_checked));
            moved |= fp_checked;
        }
        for (int i = 0; i < nreq; i++) {
            if (done_mask & (1 << i))
                continue;
            int done = 0;
            BRAID_CHECK(braid__algo_test(run, &reqs[i], &done));
            if (!done)
                continue;
            done_mask |= 1 << i;
            moved = 1;
        }
        if (!moved && (done_mask != all || !fp_checked))
            BRAID_CHECK(braid__algo_wait(run, conns, nconns, recv_peer >= 0 ? recv_peer : send_peer));
    }
    return BRAID_OK;
}

braid_status braid__fp_recv(braid_algo_run *run, braid_conn *conn, int peer)
{
    run->fp_in.peer = peer;
    run->fp_in.posted = 1;
    return conn->ops->irecv(conn, &run->fp_in.req, run->fp_in.theirs, BRAID_FP_BYTES);
}

braid_status braid__fp_poll(braid_algo_run *run, int *checked)
{
    int done = 0;
    BRAID_CHECK(braid__algo_test(run, &run->fp_in.req, &done));
    if (done) {
        run->fp_in.posted = 0;
        BRAID_CHECK(braid__fp_check(run, run->fp_in.peer, run->fp_in.theirs));
    }
    *checked = done;
    return BRAID_OK;
}

braid_status braid__fp_explain(braid_algo_run *run, braid_status st)
{
    if (st == BRAID_OK || !run->fp_in.posted || !run->fp_in.req.done)
        return st;
    run->fp_in.posted = 0;
    return braid__fp_check(run, run->fp_in.peer, run->fp_in.theirs) == BRAID_ERR_MISMATCH ? BRAID_ERR_MISMATCH : st;
}
