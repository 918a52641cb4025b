/* Per-message CRC32C between ranks.
 *
 * The wrapper sits between the algorithms and any transport, so that every
 * transport carrying host memory gets the same protection and the
 * algorithms stay unchanged: they post, test and progress the wrapper
 * exactly as they would the transport's own connection.
 *
 * Wire format: each message of len bytes is sent as two transfers of the
 * inner connection, the payload itself (no copy) and right behind it an
 * 8-byte trailer, little endian:
 *     u32 crc32c(payload)   u32 message number on this link and direction
 * The sender computes the CRC when it posts the send, so the payload is
 * final by then (the transport contract already forbids changing it while
 * the send is pending). The receiver recomputes it when both transfers
 * have arrived and reports the message done only when the two agree: a
 * reduce or a forward never sees unverified bytes. A mismatch fails the
 * connection with BRAID_ERR_CORRUPT (sticky, like any transport error); the
 * algorithm then fails the group, which closes every connection, so the
 * other ranks see BRAID_ERR_PEER at once instead of waiting for a timeout.
 * The message number catches a lost, repeated or reordered message, which
 * would otherwise pass if the bytes happened to match.
 *
 * Requests: the caller's braid_req is the wrapper's; each one borrows a
 * slot holding the two inner requests, from a per-connection pool that
 * grows in blocks (never moves: the inner transport links its requests by
 * address) and is freed on close. Slots sit in per-direction FIFOs in
 * posting order, and complete in that order, as the transport contract
 * requires. */
#include <inttypes.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bootstrap/store.h"
#include "transports/checksum/checksum.h"
#include "crc32c.h"
#include "fault_inject.h"
#include "log.h"
#include "status.h"
#include "transports/registry.h"
#include "bytes.h"

#define SLOTS_PER_BLOCK 32
#define PROGRESS_STACK_CONNS 64

typedef struct ck_slot {
    braid_req data;    /* payload, on the inner connection */
    braid_req trailer; /* the 8 bytes behind it */
    uint8_t wire[BRAID_CHECKSUM_TRAILER_BYTES];
    uint32_t crc;         /* send: what went out; recv: unused */
    uint64_t msg;         /* message number on this link and direction */
    braid_req *outer;     /* the caller's request */
    struct ck_slot *next; /* FIFO or free list */
} ck_slot;

typedef struct ck_block {
    struct ck_block *next;
    ck_slot slots[SLOTS_PER_BLOCK];
} ck_block;

typedef struct {
    ck_slot *head, *tail;
    uint64_t posted; /* messages posted so far: the next one's number */
} ck_fifo;

typedef struct {
    braid_conn base; /* first: braid_conn * downcasts to this */
    braid_conn *inner;
    int rank;
    ck_fifo send, recv;
    ck_slot *free_slots;
    ck_block *blocks;
    char error_text[512];       /* of the sticky BRAID_ERR_CORRUPT */
    braid_checksum_fault fault; /* what failed, when error is BRAID_ERR_CORRUPT */
    long long corrupt_at;       /* test hook: flip a bit of this received message (0: never) */
} ck_conn;

static ck_conn *ck_of(braid_conn *conn)
{
    return (ck_conn *)conn; /* base is the first member */
}

/* Test hook, BRAID_TEST_CORRUPT_CHUNK=K (braid__fault_corrupt_chunk_at):
 * the K-th non-empty message this process receives (counted over all its
 * checksummed connections, from 1) gets one bit flipped after the
 * transport delivered it and before it is verified, standing in for
 * corruption on the way. The counter is process-wide so that a test can
 * aim at "some data message" without knowing which link carries it. */
static atomic_llong corrupt_seen;

static braid_status sticky(const ck_conn *c)
{
    braid__error_set_text(c->error_text);
    return c->base.error;
}

static braid_status ck_fail(ck_conn *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

static braid_status ck_fail(ck_conn *c, const char *fmt, ...)
{
    char text[448];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(text, sizeof(text), fmt, ap);
    va_end(ap);
    braid__error(BRAID_ERR_CORRUPT, "rank %d: peer %d: %s", c->rank, c->base.peer, text);
    snprintf(c->error_text, sizeof(c->error_text), "%s", braid_last_error());
    c->base.error = BRAID_ERR_CORRUPT;
    return BRAID_ERR_CORRUPT;
}

static ck_slot *slot_get(ck_conn *c)
{
    if (!c->free_slots) {
        ck_block *b = calloc(1, sizeof(*b));
        if (!b)
            return NULL;
        b->next = c->blocks;
        c->blocks = b;
        for (int i = 0; i < SLOTS_PER_BLOCK; i++) {
            b->slots[i].next = c->free_slots;
            c->free_slots = &b->slots[i];
        }
    }
    ck_slot *s = c->free_slots;
    c->free_slots = s->next;
    s->next = NULL;
    return s;
}

static void slot_put(ck_conn *c, ck_slot *s)
{
    s->next = c->free_slots;
    c->free_slots = s;
}

static void fifo_push(ck_fifo *f, ck_slot *s)
{
    s->msg = f->posted++;
    if (f->tail)
        f->tail->next = s;
    else
        f->head = s;
    f->tail = s;
}

static braid_status reap(ck_conn *c);

/* An inner post failed. Transports may progress the connection while
 * posting (shm does), so messages may have completed just before the
 * failure: complete them too, as progress() would (a fingerprint that
 * arrived lets the algorithm explain the failure). A corruption found
 * among them wins over the transport's error. */
static braid_status post_failed(ck_conn *c, braid_status st)
{
    braid_status r = reap(c);
    return r == BRAID_ERR_CORRUPT ? r : st;
}

static braid_status post(ck_conn *c, braid_req *req, braid_req_kind kind, void *buf, size_t len)
{
    if (c->base.error != BRAID_OK)
        return sticky(c);
    if (!req || (len && !buf))
        return braid__error(BRAID_ERR_INVALID_ARG, "rank %d: %s to peer %d with a NULL %s", c->rank,
                            kind == BRAID_REQ_SEND ? "send" : "receive", c->base.peer, req ? "buffer" : "request");
    ck_slot *s = slot_get(c);
    if (!s)
        return braid__error(BRAID_ERR_NO_MEMORY, "rank %d: out of memory for checksum state of peer %d", c->rank,
                            c->base.peer);
    memset(req, 0, sizeof(*req));
    req->conn = &c->base;
    req->kind = kind;
    req->buf = buf;
    req->len = len;
    req->tp[0] = (uint64_t)(uintptr_t)s;
    s->outer = req;
    braid_conn *in = c->inner;
    braid_status st;
    ck_fifo *f = kind == BRAID_REQ_SEND ? &c->send : &c->recv;
    if (kind == BRAID_REQ_SEND) {
        s->crc = braid__crc32c(0, buf, len);
        braid__put_le32(s->wire, s->crc);
        braid__put_le32(s->wire + 4, (uint32_t)f->posted);
        /* Posted back to back: nothing can come between them on the link.
         * After a failed post the connection has failed; the slot stays
         * out of the free list (the transport may still link it) until
         * close. */
        st = in->ops->isend(in, &s->data, buf, len);
        if (st != BRAID_OK)
            return post_failed(c, st);
        fifo_push(f, s);
        st = in->ops->isend(in, &s->trailer, s->wire, sizeof(s->wire));
        return st == BRAID_OK ? BRAID_OK : post_failed(c, st);
    }
    st = in->ops->irecv(in, &s->data, buf, len);
    if (st != BRAID_OK)
        return post_failed(c, st);
    fifo_push(f, s);
    st = in->ops->irecv(in, &s->trailer, s->wire, sizeof(s->wire));
    return st == BRAID_OK ? BRAID_OK : post_failed(c, st);
}

static braid_status ck_isend(braid_conn *conn, braid_req *req, const void *buf, size_t len)
{
    return post(ck_of(conn), req, BRAID_REQ_SEND, (void *)buf, len);
}

static braid_status ck_irecv(braid_conn *conn, braid_req *req, void *buf, size_t len)
{
    return post(ck_of(conn), req, BRAID_REQ_RECV, buf, len);
}

/* Whether an inner request has finished. Every transport marks requests
 * done in its progress engine, which the callers of reap() have just run,
 * so the flag is current and no further (costly) test() is needed. */
static int inner_done(const braid_req *r)
{
    return r->done;
}

/* The received message in slot s has fully arrived: check it. */
static braid_status verify(ck_conn *c, ck_slot *s)
{
    braid_req *o = s->outer;
    long long at = c->corrupt_at;
    if (at > 0 && o->len > 0 && atomic_fetch_add(&corrupt_seen, 1) + 1 == at) {
        ((uint8_t *)o->buf)[o->len / 2] ^= 0x10;
        BRAID_WARN("rank %d: test hook flipped a bit of message #%" PRIu64 " from peer %d (%zu bytes)", c->rank, s->msg,
                   c->base.peer, o->len);
    }
    uint32_t want = braid__get_le32(s->wire), msg = braid__get_le32(s->wire + 4);
    c->fault = (braid_checksum_fault){.rank = c->rank,
                                      .peer = c->base.peer,
                                      .msg = s->msg,
                                      .buf = o->buf,
                                      .len = o->len,
                                      .expected = (uint32_t)s->msg,
                                      .actual = msg,
                                      .order = 1};
    if (msg != (uint32_t)s->msg)
        return ck_fail(c,
                       "message order broken: expected message #%" PRIu64 " (%zu bytes) but its trailer says #%" PRIu32,
                       s->msg, o->len, msg);
    uint32_t got = braid__crc32c(0, o->buf, o->len);
    c->fault.expected = want;
    c->fault.actual = got;
    c->fault.order = 0;
    if (got != want)
        return ck_fail(c,
                       "checksum mismatch on message #%" PRIu64 " (%zu bytes): crc32c expected 0x%08" PRIx32
                       " (computed by the sender), actual 0x%08" PRIx32 " (of the bytes received)",
                       s->msg, o->len, want, got);
    return BRAID_OK;
}

/* Complete, in order, the messages whose payload and trailer both
 * finished; received ones only once they verify. */
static braid_status reap(ck_conn *c)
{
    for (int dir = 0; dir < 2; dir++) {
        ck_fifo *f = dir == 0 ? &c->send : &c->recv;
        while (f->head && c->base.error == BRAID_OK) {
            ck_slot *s = f->head;
            if (!inner_done(&s->data) || !inner_done(&s->trailer))
                break;
            if (dir == 1)
                BRAID_CHECK(verify(c, s));
            f->head = s->next;
            if (!f->head)
                f->tail = NULL;
            braid_req *o = s->outer;
            slot_put(c, s);
            o->moved = o->len;
            o->done = 1; /* last touch: the caller may reuse o from here on */
        }
    }
    return c->base.error == BRAID_OK ? BRAID_OK : sticky(c);
}

static braid_status ck_test(braid_req *req, int *done)
{
    if (req->done) {
        *done = 1;
        return BRAID_OK;
    }
    ck_conn *c = ck_of(req->conn);
    *done = 0;
    if (c->base.error != BRAID_OK)
        return sticky(c);
    ck_slot *s = (ck_slot *)(uintptr_t)req->tp[0];
    int d = 0;
    /* Testing the trailer progresses the inner connection; it completes
     * after the payload, which it follows. */
    braid_status st = c->inner->ops->test(&s->trailer, &d);
    braid_status rst = reap(c);
    *done = req->done;
    if (req->done)
        return BRAID_OK;
    return rst != BRAID_OK ? rst : st;
}

static braid_status ck_progress(braid_conn **conns, int nconns, int wake_fd, int timeout_ms)
{
    braid_conn *stack[PROGRESS_STACK_CONNS] = {NULL}, **inner = stack;
    if (nconns > PROGRESS_STACK_CONNS) {
        inner = malloc((size_t)nconns * sizeof(*inner));
        if (!inner)
            return braid__error(BRAID_ERR_NO_MEMORY, "out of memory progressing %d connections", nconns);
    }
    /* Corruption already found: report it without blocking. */
    braid_status st = BRAID_OK;
    for (int i = 0; i < nconns && st == BRAID_OK; i++)
        if (conns[i]->error != BRAID_OK)
            st = sticky(ck_of(conns[i]));
    if (st == BRAID_OK) {
        for (int i = 0; i < nconns; i++)
            inner[i] = ck_of(conns[i])->inner;
        st = inner[0]->ops->progress(inner, nconns, wake_fd, timeout_ms);
        /* Even after a transport failure, complete what arrived before it,
         * as the transports themselves do. */
        for (int i = 0; i < nconns; i++) {
            braid_status r = reap(ck_of(conns[i]));
            if (r != BRAID_OK && st == BRAID_OK)
                st = r;
        }
    }
    if (inner != stack)
        free(inner);
    return st;
}

static braid_status ck_reg_mem(braid_conn *conn, void *buf, size_t len, void **handle)
{
    braid_conn *in = ck_of(conn)->inner;
    if (BRAID_TRANSPORT_HAS(in->ops, reg_mem))
        return in->ops->reg_mem(in, buf, len, handle);
    *handle = NULL;
    return BRAID_OK;
}

static braid_status ck_dereg_mem(braid_conn *conn, void *handle)
{
    braid_conn *in = ck_of(conn)->inner;
    if (BRAID_TRANSPORT_HAS(in->ops, dereg_mem))
        return in->ops->dereg_mem(in, handle);
    return BRAID_OK;
}

static void ck_close(braid_conn *conn)
{
    ck_conn *c = ck_of(conn);
    /* Pending requests are abandoned with the inner connection, which may
     * still reference the slots: close it before freeing them. */
    c->inner->ops->close(c->inner);
    while (c->blocks) {
        ck_block *b = c->blocks;
        c->blocks = b->next;
        free(b);
    }
    free(c);
}

/* One table per inner transport, so that braid__algo_wait, which groups
 * connections by their ops table, still never hands one transport's
 * progress() another transport's connections. */
#define CK_OPS(transport_name)                                                                                         \
    {                                                                                                                  \
        .size = sizeof(braid_transport_ops), .name = transport_name "+crc32c", .reg_mem = ck_reg_mem,                  \
        .dereg_mem = ck_dereg_mem, .isend = ck_isend, .irecv = ck_irecv, .test = ck_test, .progress = ck_progress,     \
        .close = ck_close,                                                                                             \
    }

static const braid_transport_ops ck_ops[BRAID_TRANSPORT_ID_COUNT] = {
    [BRAID_TRANSPORT_TCP] = CK_OPS("tcp"),
    [BRAID_TRANSPORT_VERBS] = CK_OPS("verbs"),
    [BRAID_TRANSPORT_SHM] = CK_OPS("shm"),
};

int braid__checksum_fault(const braid_conn *conn, braid_checksum_fault *f)
{
    if (!braid__checksum_is_wrapper(conn) || conn->error != BRAID_ERR_CORRUPT)
        return 0;
    *f = ((const ck_conn *)conn)->fault;
    return 1;
}

int braid__checksum_is_wrapper(const braid_conn *conn)
{
    return conn->ops >= &ck_ops[0] && conn->ops < &ck_ops[BRAID_TRANSPORT_ID_COUNT];
}

braid_status braid__checksum_wrap(int rank, braid_conn **conn)
{
    braid_conn *in = *conn;
    int id = -1;
    for (int i = 0; i < BRAID_TRANSPORT_ID_COUNT; i++)
        if (braid__transport_get((braid_transport_id)i) == in->ops)
            id = i;
    /* CUDA IPC moves device memory, which the CPU cannot read: such a pair
     * stays unchecked (both ends decide alike, as they share the transport). */
    if (id == BRAID_TRANSPORT_CUDA_IPC) {
        BRAID_INFO("rank %d: checksums do not cover the cuda_ipc connection to peer %d", rank, in->peer);
        return BRAID_OK;
    }
    if (id < 0 || !ck_ops[id].isend)
        return braid__error(BRAID_ERR_INTERNAL, "rank %d: checksum: connection to peer %d has an unknown transport",
                            rank, in->peer);
    ck_conn *c = calloc(1, sizeof(*c));
    if (!c)
        return braid__error(BRAID_ERR_NO_MEMORY, "rank %d: out of memory for checksum state of peer %d", rank,
                            in->peer);
    c->base.ops = &ck_ops[id];
    c->base.peer = in->peer;
    c->base.error = BRAID_OK;
    c->inner = in;
    c->rank = rank;
    c->corrupt_at = braid__fault_corrupt_chunk_at();
    *conn = &c->base;
    return BRAID_OK;
}

#define AGREE_KEY "checksum/ranks"

braid_status braid__checksum_announce(struct braid_store *store, int on)
{
    int64_t total;
    return braid__store_add(store, AGREE_KEY, on ? 1 : 0, &total);
}

braid_status braid__checksum_count(struct braid_store *store, int64_t *on_ranks)
{
    return braid__store_add(store, AGREE_KEY, 0, on_ranks);
}

braid_status braid__checksum_agree(struct braid_store *store, int rank, int size, int on, int64_t on_ranks,
                                   int timeout_ms)
{
    if (on_ranks == 0 || on_ranks == size) {
        if (on)
            BRAID_INFO("rank %d: every message between ranks carries a CRC32C (%s)", rank, braid__crc32c_impl());
        return BRAID_OK;
    }
    /* Every rank fails here. Rank 0's store goes with it, while others may
     * still wait for the barrier's answer: the others say when they are
     * past it, and rank 0 waits for that (best effort) before failing. */
    int64_t left;
    char v[4];
    size_t len;
    if (rank != 0 && braid__store_add(store, AGREE_KEY "/left", 1, &left) == BRAID_OK && left == size - 1)
        (void)braid__store_set(store, AGREE_KEY "/gone", "1", 1);
    if (rank == 0)
        (void)braid__store_get(store, AGREE_KEY "/gone", v, sizeof(v), &len, timeout_ms);
    return braid__error(BRAID_ERR_MISMATCH,
                        "rank %d: checksums are %s here but on in %" PRId64 " of %d ranks: set BRAID_CHECKSUM "
                        "(or braid_config.checksum) alike on every rank",
                        rank, on ? "on" : "off", on_ranks, size);
}
