/* Completion handling and waiting: polling the completion queue into the
 * engine, watching the TCP connection, and blocking progress on the
 * completion channels (never a busy spin: when nothing moves, progress()
 * sleeps in poll() on the channel fds and the owner's wake fd). */
#include <arpa/inet.h>
#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "clock.h"
#include "log.h"
#include "status.h"
#include "verbs.h"
#include "verbs_conn.h"

#define POLL_BATCH 32
#define POLL_STACK_FDS 64
/* The TCP end of a dead peer does not wake our poll(), so sleeps are cut
 * into slices and the TCP connection is looked at between them. */
#define WAIT_SLICE_MS 50
#define OOB_CHECK_MS 20
/* A peer's TCP end may overtake its goodbye, which travels on the RDMA
 * path: wait this long for the goodbye before calling it a death. */
#define OOB_GRACE_MS 200
/* A connection still in its handshake waits on TCP, whose fd we do not
 * poll: look again this often. */
#define HANDSHAKE_SLICE_MS 2

static braid_status poll_cq(braid_verbs_conn *c, int *moved)
{
    struct ibv_wc wc[POLL_BATCH];
    for (;;) {
        int n = ibv_poll_cq(c->cq, POLL_BATCH, wc);
        if (n < 0)
            return braid__verbs_engine_fail(&c->eng, BRAID_ERR_SYSTEM, "ibv_poll_cq failed (%d)", n);
        if (n == 0)
            return BRAID_OK;
        *moved = 1;
        c->outstanding -= n;
        uint32_t reposts = 0;
        for (int i = 0; i < n; i++) {
            const struct ibv_wc *w = &wc[i];
            braid_status st;
            if (w->status != IBV_WC_SUCCESS) {
                /* The first failure moves the QP to ERR; everything after
                 * it is flushed, so only the first says why. While closing
                 * it only means the peer went first. */
                c->qp_dead = 1;
                if (c->closing)
                    continue;
                char cause[160];
                snprintf(cause, sizeof(cause), "%s (status %d, vendor error 0x%x)", ibv_wc_status_str(w->status),
                         (int)w->status, w->vendor_err);
                st = braid__verbs_engine_on_error(&c->eng, w->wr_id, cause);
            } else if (BRAID_VERBS_WR_KIND(w->wr_id) == BRAID_VERBS_WR_RECV) {
                reposts++;
                if (!(w->wc_flags & IBV_WC_WITH_IMM))
                    st = braid__verbs_engine_fail(&c->eng, BRAID_ERR_PEER,
                                                  "peer sent a message without immediate data (opcode %d)",
                                                  (int)w->opcode);
                else
                    st = braid__verbs_engine_on_recv(&c->eng, ntohl(w->imm_data), w->byte_len,
                                                     w->opcode == IBV_WC_RECV_RDMA_WITH_IMM);
            } else {
                st = braid__verbs_engine_on_send(&c->eng, w->wr_id);
            }
            if (st != BRAID_OK)
                return st;
        }
        /* Each immediate used one receive: give it back at once, so the
         * queue always holds the full depth the credits assume. */
        if (reposts && !c->qp_dead) {
            int err = braid__verbs_post_recvs(c, reposts);
            if (err)
                return braid__verbs_engine_fail(&c->eng, BRAID_ERR_SYSTEM, "cannot repost %u receives: %s", reposts,
                                                strerror(err));
        }
        if (n < POLL_BATCH)
            return BRAID_OK;
    }
}

/* A peer that said goodbye is gone on purpose; one whose TCP connection
 * ended without it has died (or failed and torn everything down). */
static braid_status oob_check(braid_verbs_conn *c)
{
    if (c->eng.peer_closed)
        return BRAID_OK;
    int64_t now = braid__now_ms();
    if (!c->oob_gone_ms) {
        if (now < c->oob_next_check_ms)
            return BRAID_OK;
        c->oob_next_check_ms = now + OOB_CHECK_MS;
        int done = 0;
        braid_status st = c->oob->ops->test(&c->oob_watch, &done);
        if (st == BRAID_OK && !done)
            return BRAID_OK;
        c->oob_gone_ms = now; /* ended, or sent a byte it never should */
    }
    if (now - c->oob_gone_ms < OOB_GRACE_MS)
        return BRAID_OK;
    return braid__verbs_engine_fail(&c->eng, BRAID_ERR_PEER,
                                    "the peer's TCP connection ended without a verbs goodbye (the process died?)");
}

braid_status braid__verbs_conn_pass(braid_verbs_conn *c, int *moved)
{
    braid_status st;
    int m = 0;
    if (c->base.error != BRAID_OK)
        return braid__verbs_conn_error(c);
    if (c->hs != BRAID_VERBS_HS_UP) {
        BRAID_CHECK(braid__verbs_conn_handshake(c, moved));
        if (c->hs != BRAID_VERBS_HS_UP)
            return BRAID_OK;
    }
    BRAID_CHECK_GOTO(poll_cq(c, moved), st, err_failed);
    BRAID_CHECK_GOTO(braid__verbs_engine_advance(&c->eng, &m), st, err_failed);
    *moved |= m;
    BRAID_CHECK_GOTO(oob_check(c), st, err_failed);
    return BRAID_OK;

err_failed:
    return braid__verbs_conn_failed(c, st);
}

braid_status braid__verbs_conn_arm(braid_verbs_conn *c, int *moved)
{
    if (c->hs != BRAID_VERBS_HS_UP)
        return braid__verbs_conn_pass(c, moved);
    int err = ibv_req_notify_cq(c->cq, 0);
    if (err) {
        braid__error(BRAID_ERR_SYSTEM, "rank %d: verbs connection to peer %d: ibv_req_notify_cq: %s", c->rank,
                     c->base.peer, strerror(err));
        return braid__verbs_conn_failed(c, BRAID_ERR_SYSTEM);
    }
    return braid__verbs_conn_pass(c, moved);
}

void braid__verbs_conn_ack_events(braid_verbs_conn *c)
{
    struct ibv_cq *cq;
    void *ctx;
    /* The channel fd is non-blocking: this stops at EAGAIN. */
    while (ibv_get_cq_event(c->chan, &cq, &ctx) == 0)
        ibv_ack_cq_events(cq, 1);
}

braid_status braid__verbs_test(braid_req *req, int *done)
{
    if (req->done) {
        *done = 1;
        return BRAID_OK;
    }
    braid_verbs_conn *c = braid__verbs_conn_of(req->conn);
    int moved = 0;
    braid_status st = braid__verbs_conn_pass(c, &moved);
    *done = req->done;
    return req->done ? BRAID_OK : st;
}

braid_status braid__verbs_progress(braid_conn **conns, int nconns, int wake_fd, int timeout_ms)
{
    int64_t deadline = timeout_ms < 0 ? INT64_MAX : braid__now_ms() + timeout_ms;
    struct pollfd stack_fds[POLL_STACK_FDS];
    struct pollfd *fds = stack_fds;
    if (nconns + 1 > POLL_STACK_FDS) {
        fds = malloc((size_t)(nconns + 1) * sizeof(*fds));
        if (!fds)
            return braid__error(BRAID_ERR_NO_MEMORY, "out of memory for %d pollfds", nconns + 1);
    }
    braid_status st = BRAID_OK;
    for (;;) {
        int moved = 0;
        for (int i = 0; i < nconns; i++)
            BRAID_CHECK_GOTO(braid__verbs_conn_pass(braid__verbs_conn_of(conns[i]), &moved), st, out);
        if (moved || timeout_ms == 0)
            goto out;
        for (int i = 0; i < nconns; i++)
            BRAID_CHECK_GOTO(braid__verbs_conn_arm(braid__verbs_conn_of(conns[i]), &moved), st, out);
        if (moved)
            goto out;
        int64_t left = deadline - braid__now_ms();
        if (left <= 0)
            goto out;
        int slice = WAIT_SLICE_MS;
        for (int i = 0; i < nconns; i++)
            if (braid__verbs_conn_of(conns[i])->hs != BRAID_VERBS_HS_UP)
                slice = HANDSHAKE_SLICE_MS;
        int n = 0;
        for (int i = 0; i < nconns; i++)
            fds[n++] = (struct pollfd){.fd = braid__verbs_conn_of(conns[i])->chan->fd, .events = POLLIN};
        if (wake_fd >= 0)
            fds[n++] = (struct pollfd){.fd = wake_fd, .events = POLLIN};
        int rc = poll(fds, (nfds_t)n, left < slice ? (int)left : slice);
        if (rc < 0 && errno != EINTR) {
            st = braid__error(BRAID_ERR_SYSTEM, "poll on %d completion channels: %m", nconns);
            goto out;
        }
        if (rc <= 0)
            continue;
        for (int i = 0; i < nconns; i++)
            if (fds[i].revents)
                braid__verbs_conn_ack_events(braid__verbs_conn_of(conns[i]));
        if (wake_fd >= 0 && fds[nconns].revents)
            goto out; /* the owner wants control back; it drains wake_fd */
    }
out:
    if (fds != stack_fds)
        free(fds);
    return st;
}
