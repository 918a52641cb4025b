/* Data path of one verbs connection (see verbs_engine.h). */
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "status.h"
#include "verbs_engine.h"

/* req->tp[] use: next chunk to post, chunk count, zero-copy flag (sent
 * queue), number of the request's last chunk (sent queue). */
#define TP_NEXT 0
#define TP_COUNT 1
#define TP_ZCOPY 2
#define TP_LAST_SEQ 3

#define HEAD_UNDECIDED 0
#define HEAD_STAGED 1
#define HEAD_ZCOPY 2

static void enqueue(braid_req **head, braid_req **tail, braid_req *req)
{
    req->next = NULL;
    if (*tail)
        (*tail)->next = req;
    else
        *head = req;
    *tail = req;
}

static braid_req *dequeue(braid_req **head, braid_req **tail)
{
    braid_req *req = *head;
    *head = req->next;
    if (!*head)
        *tail = NULL;
    req->next = NULL;
    return req;
}

braid_status braid__verbs_engine_init(braid_verbs_engine *e, const braid_verbs_engine_cfg *cfg,
                                      const braid_verbs_io *io)
{
    if (cfg->rx_slots < 1 || cfg->rx_slots > BRAID_VERBS_MAX_SLOTS || cfg->tx_slots < 1 ||
        cfg->tx_slots > BRAID_VERBS_MAX_SLOTS || cfg->tx_window < 1 || cfg->tx_window > cfg->tx_slots ||
        cfg->rx_slot_bytes < 1 || cfg->rx_slot_bytes > BRAID_VERBS_MAX_SLOT_BYTES || cfg->tx_slot_bytes < 1 ||
        cfg->tx_slot_bytes > BRAID_VERBS_MAX_SLOT_BYTES || !cfg->rx_ring || !cfg->tx_stage || !io->write_imm ||
        !io->send_imm)
        return braid__error(BRAID_ERR_INVALID_ARG,
                            "rank %d: verbs connection to peer %d: bad ring geometry (%u x %u receive, %u x %u send, "
                            "window %u)",
                            cfg->rank, cfg->peer, cfg->rx_slots, cfg->rx_slot_bytes, cfg->tx_slots, cfg->tx_slot_bytes,
                            cfg->tx_window);
    memset(e, 0, sizeof(*e));
    e->cfg = *cfg;
    e->io = *io;
    braid__verbs_tx_init(&e->tx, cfg->tx_window);
    braid__verbs_rx_init(&e->rx, cfg->rx_slots);
    return BRAID_OK;
}

static void release_tokens(braid_verbs_engine *e, int all)
{
    while (e->zc_count > 0) {
        uint32_t i = e->zc_first;
        if (!all && e->tx.completed <= e->zc[i].last_seq)
            break;
        e->io.zcopy_put(e->io.ctx, e->zc[i].token);
        e->zc_first = (i + 1) % BRAID_VERBS_MAX_SLOTS;
        e->zc_count--;
    }
}

void braid__verbs_engine_fini(braid_verbs_engine *e)
{
    release_tokens(e, 1);
    if (e->head_mode == HEAD_ZCOPY) {
        e->io.zcopy_put(e->io.ctx, e->head_token);
        e->head_mode = HEAD_UNDECIDED;
    }
    e->send_head = e->send_tail = e->sent_head = e->sent_tail = e->recv_head = e->recv_tail = NULL;
}

braid_status braid__verbs_engine_fail(braid_verbs_engine *e, braid_status status, const char *fmt, ...)
{
    if (e->error != BRAID_OK)
        return braid__verbs_engine_error(e); /* the first failure stands */
    char cause[256];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(cause, sizeof(cause), fmt, ap);
    va_end(ap);
    snprintf(e->error_text, sizeof(e->error_text), "rank %d: verbs connection to peer %d: %s", e->cfg.rank, e->cfg.peer,
             cause);
    e->error = status;
    /* Forget every request: after a failure their owners may unwind and
     * free them, and nothing here may look at them again. */
    e->send_head = e->send_tail = e->sent_head = e->sent_tail = e->recv_head = e->recv_tail = NULL;
    return braid__error(status, "%s", e->error_text);
}

braid_status braid__verbs_engine_error(const braid_verbs_engine *e)
{
    if (e->error == BRAID_OK)
        return BRAID_OK;
    return braid__error_quiet(e->error, "%s", e->error_text);
}

braid_status braid__verbs_engine_isend(braid_verbs_engine *e, braid_req *req, const void *buf, size_t len)
{
    if (e->error != BRAID_OK)
        return braid__verbs_engine_error(e);
    if (e->peer_closed)
        return braid__verbs_engine_fail(e, BRAID_ERR_PEER, "peer closed the connection; cannot send %zu bytes", len);
    req->kind = BRAID_REQ_SEND;
    req->buf = (void *)buf;
    req->len = len;
    req->moved = 0;
    req->done = 0;
    req->tp[TP_NEXT] = 0;
    req->tp[TP_COUNT] = braid__verbs_chunk_count(len, e->cfg.tx_slot_bytes);
    req->tp[TP_ZCOPY] = 0;
    enqueue(&e->send_head, &e->send_tail, req);
    int moved;
    return braid__verbs_engine_advance(e, &moved);
}

braid_status braid__verbs_engine_irecv(braid_verbs_engine *e, braid_req *req, void *buf, size_t len)
{
    if (e->error != BRAID_OK)
        return braid__verbs_engine_error(e);
    req->kind = BRAID_REQ_RECV;
    req->buf = buf;
    req->len = len;
    req->moved = 0;
    req->done = 0;
    enqueue(&e->recv_head, &e->recv_tail, req);
    int moved;
    return braid__verbs_engine_advance(e, &moved);
}

braid_status braid__verbs_engine_on_send(braid_verbs_engine *e, uint64_t wr_id)
{
    if (e->error != BRAID_OK)
        return e->error;
    switch (BRAID_VERBS_WR_KIND(wr_id)) {
    case BRAID_VERBS_WR_DATA: {
        /* A send queue completes in order, so the id must be the oldest
         * outstanding chunk; anything else is a bookkeeping bug. */
        uint64_t want = e->tx.completed & ((1ull << 56) - 1);
        if ((wr_id & ((1ull << 56) - 1)) != want || braid__verbs_tx_complete(&e->tx) != BRAID_OK)
            return braid__verbs_engine_fail(e, BRAID_ERR_INTERNAL, "completion of chunk %llu, expected chunk %llu",
                                            (unsigned long long)(wr_id & ((1ull << 56) - 1)), (unsigned long long)want);
        return BRAID_OK;
    }
    case BRAID_VERBS_WR_CREDIT:
        if (e->ctrl_inflight == 0)
            return braid__verbs_engine_fail(e, BRAID_ERR_INTERNAL, "completion of a credit message never posted");
        e->ctrl_inflight--;
        return BRAID_OK;
    case BRAID_VERBS_WR_CLOSE:
        e->close_done = 1;
        return BRAID_OK;
    default:
        return braid__verbs_engine_fail(e, BRAID_ERR_INTERNAL, "send completion with unknown id 0x%llx",
                                        (unsigned long long)wr_id);
    }
}

braid_status braid__verbs_engine_on_recv(braid_verbs_engine *e, uint32_t imm, uint32_t byte_len, int is_write)
{
    if (e->error != BRAID_OK)
        return e->error;
    char why[160];
    braid_verbs_imm d;
    if (braid__verbs_imm_decode(imm, e->cfg.rx_slots, e->cfg.rx_slot_bytes, &d, why, sizeof(why)) != BRAID_OK)
        return braid__verbs_engine_fail(e, BRAID_ERR_PEER, "peer sent a bad message: %s", why);
    if (e->peer_closed)
        return braid__verbs_engine_fail(e, BRAID_ERR_PEER, "peer sent immediate 0x%08x after closing", imm);
    /* The opcode must match the kind: data only as a write into the ring,
     * control only as a send, so a confused peer cannot alias the two. */
    if ((d.kind == BRAID_VERBS_IMM_DATA) != (is_write != 0))
        return braid__verbs_engine_fail(e, BRAID_ERR_PEER, "peer sent immediate 0x%08x as %s", imm,
                                        is_write ? "an RDMA write" : "a send");
    switch (d.kind) {
    case BRAID_VERBS_IMM_DATA:
        if (byte_len != d.len)
            return braid__verbs_engine_fail(e, BRAID_ERR_PEER, "peer wrote %u bytes but announced %u", byte_len, d.len);
        if (braid__verbs_rx_arrive(&e->rx, d.slot, why, sizeof(why)) != BRAID_OK)
            return braid__verbs_engine_fail(e, BRAID_ERR_PEER, "peer broke the ring protocol: %s", why);
        e->rx_len[d.slot] = d.len;
        e->rx_last[d.slot] = (uint8_t)d.last;
        return BRAID_OK;
    case BRAID_VERBS_IMM_CREDIT:
        if (braid__verbs_tx_credit(&e->tx, d.credits) != BRAID_OK)
            return braid__verbs_engine_fail(e, BRAID_ERR_PEER,
                                            "peer returned %u credits with only %llu chunks outstanding", d.credits,
                                            (unsigned long long)(e->tx.posted - e->tx.credited));
        return BRAID_OK;
    case BRAID_VERBS_IMM_CLOSE:
        e->peer_closed = 1;
        return BRAID_OK;
    }
    return BRAID_OK;
}

static void finish_sends(braid_verbs_engine *e, int *moved);

braid_status braid__verbs_engine_on_error(braid_verbs_engine *e, uint64_t wr_id, const char *cause)
{
    if (e->error != BRAID_OK)
        return e->error;
    /* After the peer's goodbye its queue pair may be gone, so a late
     * credit failing is no loss; a zero-copy send still waiting for its
     * completion, though, can now never finish. Sends whose completions
     * came in this same batch are finished first, so they do not count. */
    if (e->peer_closed) {
        int moved;
        finish_sends(e, &moved);
        if (!e->sent_head)
            return BRAID_OK;
    }
    static const char *const kinds[] = {"RDMA write", "credit message", "close message", "receive"};
    return braid__verbs_engine_fail(e, BRAID_ERR_PEER, "%s failed: %s", kinds[BRAID_VERBS_WR_KIND(wr_id) & 3], cause);
}

/* Copy arrived chunks into the oldest receives. */
static braid_status match_recvs(braid_verbs_engine *e, int *moved)
{
    while (e->recv_head && e->rx.consumed < e->rx.arrived) {
        braid_req *req = e->recv_head;
        uint32_t slot = braid__verbs_rx_next_slot(&e->rx);
        uint32_t len = e->rx_len[slot];
        int last = e->rx_last[slot];
        if (len > req->len - req->moved)
            return braid__verbs_engine_fail(e, BRAID_ERR_MISMATCH,
                                            "peer sent a message longer than the %zu bytes this rank receives "
                                            "(ranks disagree on the transfer)",
                                            req->len);
        if (len)
            memcpy((uint8_t *)req->buf + req->moved, e->cfg.rx_ring + (size_t)slot * e->cfg.rx_slot_bytes, len);
        req->moved += len;
        braid__verbs_rx_consume(&e->rx);
        *moved = 1;
        if (!last)
            continue;
        if (req->moved != req->len)
            return braid__verbs_engine_fail(e, BRAID_ERR_MISMATCH,
                                            "peer sent a %zu-byte message but this rank receives %zu bytes "
                                            "(ranks disagree on the transfer)",
                                            req->moved, req->len);
        dequeue(&e->recv_head, &e->recv_tail);
        req->done = 1;
    }
    return BRAID_OK;
}

static braid_status return_credits(braid_verbs_engine *e, int *moved)
{
    /* A peer that said goodbye neither needs nor may still accept them. */
    if (e->peer_closed || e->ctrl_inflight >= BRAID_VERBS_CTRL_MAX)
        return BRAID_OK;
    uint32_t n = braid__verbs_rx_credits_due(&e->rx);
    if (n == 0)
        return BRAID_OK;
    int err = e->io.send_imm(e->io.ctx, braid__verbs_imm_credit(n), BRAID_VERBS_WR_ID(BRAID_VERBS_WR_CREDIT, 0));
    if (err)
        return braid__verbs_engine_fail(e, BRAID_ERR_SYSTEM, "cannot post a credit message: %s", strerror(err));
    braid__verbs_rx_returned(&e->rx, n);
    e->ctrl_inflight++;
    *moved = 1;
    return BRAID_OK;
}

/* Zero copy or staging for the head send, decided once per request. */
static void decide_head(braid_verbs_engine *e, braid_req *req)
{
    e->head_mode = HEAD_STAGED;
    if (e->io.zcopy_get && e->cfg.zcopy_min && req->len >= e->cfg.zcopy_min &&
        e->io.zcopy_get(e->io.ctx, req->buf, req->len, &e->head_lkey, &e->head_token) == 0)
        e->head_mode = HEAD_ZCOPY;
}

static braid_status post_sends(braid_verbs_engine *e, int *moved)
{
    const uint32_t slot_bytes = e->cfg.tx_slot_bytes;
    while (e->send_head) {
        braid_req *req = e->send_head;
        while (req->tp[TP_NEXT] < req->tp[TP_COUNT] && braid__verbs_tx_can_post(&e->tx)) {
            if (e->head_mode == HEAD_UNDECIDED)
                decide_head(e, req);
            size_t off;
            uint32_t clen;
            int last;
            braid__verbs_chunk_at(req->len, slot_bytes, req->tp[TP_NEXT], &off, &clen, &last);
            uint64_t seq = e->tx.posted;
            const uint8_t *src = (const uint8_t *)req->buf + off;
            uint32_t lkey = e->head_lkey;
            if (e->head_mode == HEAD_STAGED) {
                /* Staging slot seq % window was last used by chunk
                 * seq - window, which can_post() says has completed. */
                uint8_t *stage = e->cfg.tx_stage + (size_t)(seq % e->cfg.tx_window) * slot_bytes;
                if (clen)
                    memcpy(stage, src, clen);
                src = stage;
                lkey = e->cfg.tx_stage_lkey;
            }
            uint32_t slot = (uint32_t)(seq % e->cfg.tx_slots);
            int err = e->io.write_imm(e->io.ctx, slot, src, lkey, clen, braid__verbs_imm_data(slot, clen, last),
                                      BRAID_VERBS_WR_ID(BRAID_VERBS_WR_DATA, seq));
            if (err)
                return braid__verbs_engine_fail(e, BRAID_ERR_SYSTEM, "cannot post an RDMA write: %s", strerror(err));
            braid__verbs_tx_post(&e->tx);
            req->moved += clen;
            req->tp[TP_NEXT]++;
            *moved = 1;
        }
        if (req->tp[TP_NEXT] < req->tp[TP_COUNT])
            break; /* window full */
        dequeue(&e->send_head, &e->send_tail);
        req->tp[TP_LAST_SEQ] = e->tx.posted - 1;
        req->tp[TP_ZCOPY] = e->head_mode == HEAD_ZCOPY;
        if (e->head_mode == HEAD_ZCOPY) {
            uint32_t i = (e->zc_first + e->zc_count) % BRAID_VERBS_MAX_SLOTS;
            e->zc[i].last_seq = req->tp[TP_LAST_SEQ];
            e->zc[i].token = e->head_token;
            e->zc_count++;
        }
        e->head_mode = HEAD_UNDECIDED;
        enqueue(&e->sent_head, &e->sent_tail, req);
    }
    return BRAID_OK;
}

/* Sends finish in posting order: a staged one as soon as its bytes are
 * copied out, a zero-copy one when its last chunk has completed (the user
 * buffer is read by the hardware until then). */
static void finish_sends(braid_verbs_engine *e, int *moved)
{
    while (e->sent_head) {
        braid_req *req = e->sent_head;
        if (req->tp[TP_ZCOPY] && e->tx.completed <= req->tp[TP_LAST_SEQ])
            break;
        dequeue(&e->sent_head, &e->sent_tail);
        req->done = 1;
        *moved = 1;
    }
    release_tokens(e, 0);
}

braid_status braid__verbs_engine_advance(braid_verbs_engine *e, int *moved)
{
    *moved = 0;
    if (e->error != BRAID_OK)
        return braid__verbs_engine_error(e);
    BRAID_CHECK(match_recvs(e, moved));
    BRAID_CHECK(return_credits(e, moved));
    BRAID_CHECK(post_sends(e, moved));
    finish_sends(e, moved);
    if (e->peer_closed) {
        /* Everything the peer sent before its goodbye has been seen, so a
         * receive that nothing arrived for can never finish. */
        if (e->send_head)
            return braid__verbs_engine_fail(e, BRAID_ERR_PEER,
                                            "peer closed the connection with %zu bytes of a send pending",
                                            e->send_head->len - e->send_head->moved);
        if (e->recv_head && e->rx.consumed == e->rx.arrived)
            return braid__verbs_engine_fail(e, BRAID_ERR_PEER,
                                            "peer closed the connection while a %zu-byte receive was pending",
                                            e->recv_head->len);
    }
    return BRAID_OK;
}

void braid__verbs_engine_abandon(braid_verbs_engine *e)
{
    if (e->head_mode == HEAD_ZCOPY) {
        /* Some chunks of the head send may be posted from its buffer: keep
         * the registration until they complete, like a finished send's. */
        uint32_t i = (e->zc_first + e->zc_count) % BRAID_VERBS_MAX_SLOTS;
        e->zc[i].last_seq = e->tx.posted ? e->tx.posted - 1 : 0;
        e->zc[i].token = e->head_token;
        e->zc_count++;
    }
    e->head_mode = HEAD_UNDECIDED;
    e->send_head = e->send_tail = e->sent_head = e->sent_tail = e->recv_head = e->recv_tail = NULL;
}

int braid__verbs_engine_close(braid_verbs_engine *e)
{
    if (e->error != BRAID_OK || e->peer_closed || e->close_posted)
        return 0;
    if (e->io.send_imm(e->io.ctx, braid__verbs_imm_close(), BRAID_VERBS_WR_ID(BRAID_VERBS_WR_CLOSE, 0)) != 0)
        return 0;
    e->close_posted = 1;
    return 1;
}

int braid__verbs_engine_drained(const braid_verbs_engine *e)
{
    return e->tx.completed == e->tx.posted && e->ctrl_inflight == 0 && (!e->close_posted || e->close_done);
}
