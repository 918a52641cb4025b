/* Verbs connections: set-up over the TCP connection (started in connect()
 * and accept(), finished lazily: see verbs_conn.h), and teardown. */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "bootstrap/auth.h"
#include "clock.h"
#include "log.h"
#include "param.h"
#include "status.h"
#include "verbs.h"
#include "verbs_conn.h"
#include "verbs_qp.h"

#define DEFAULT_SLOTS 32
#define DEFAULT_SLOT_BYTES (128 * 1024)
#define DEFAULT_ZCOPY_BYTES (64 * 1024)
#define DRAIN_MAX_MS 2000 /* goodbye and in-flight chunks, at close */
#define FLUSH_MAX_MS 1000 /* flushed completions after ERR */
#define READY_BYTE 'R'
#define FAILED_BYTE 'F' /* instead of READY_BYTE: our queue pair did not reach RTS */

braid_status braid__verbs_conn_failed(braid_verbs_conn *c, braid_status st)
{
    if (c->base.error != BRAID_OK)
        return braid__verbs_conn_error(c);
    c->base.error = st;
    snprintf(c->error_text, sizeof(c->error_text), "%s", braid_last_error());
    /* Forget queued transfers: their owners may unwind now. */
    c->pre_head = c->pre_tail = NULL;
    if (c->eng_ready)
        braid__verbs_engine_abandon(&c->eng);
    return st;
}

braid_status braid__verbs_conn_error(const braid_verbs_conn *c)
{
    braid__error_set_text(c->error_text);
    return c->base.error;
}

/* ---- set-up, first half: connect() / accept() ----------------------------- */

static braid_status ring_geometry(int rank, uint32_t *nslots, uint32_t *slot_bytes)
{
    long long n = braid__param_int("BRAID_IB_SLOTS", DEFAULT_SLOTS);
    long long b = braid__param_int("BRAID_IB_SLOT_BYTES", DEFAULT_SLOT_BYTES);
    if (n < 1 || n > BRAID_VERBS_MAX_SLOTS)
        return braid__error(BRAID_ERR_INVALID_ARG, "rank %d: BRAID_IB_SLOTS=%lld must be in 1..%u", rank, n,
                            BRAID_VERBS_MAX_SLOTS);
    if (b < BRAID_VERBS_MIN_SLOT_BYTES || b > BRAID_VERBS_MAX_SLOT_BYTES)
        return braid__error(BRAID_ERR_INVALID_ARG, "rank %d: BRAID_IB_SLOT_BYTES=%lld must be in %u..%u", rank, b,
                            BRAID_VERBS_MIN_SLOT_BYTES, BRAID_VERBS_MAX_SLOT_BYTES);
    *nslots = (uint32_t)n;
    *slot_bytes = (uint32_t)b;
    return BRAID_OK;
}

static braid_status alloc_ring(braid_verbs_conn *c, size_t bytes, int access, void **ring, struct ibv_mr **mr,
                               const char *what)
{
    long page = sysconf(_SC_PAGESIZE);
    size_t pg = page > 0 ? (size_t)page : 4096;
    /* Whole pages: with ibv_fork_init a registration hides its pages from
     * forked children, which must not take a neighbour's heap with it. */
    bytes = (bytes + pg - 1) / pg * pg;
    if (posix_memalign(ring, pg, bytes) != 0) {
        *ring = NULL;
        return braid__error(BRAID_ERR_NO_MEMORY, "rank %d: peer %d: cannot allocate the %zu-byte %s", c->rank,
                            c->base.peer, bytes, what);
    }
    memset(*ring, 0, bytes);
    *mr = ibv_reg_mr(c->dev->pd, *ring, bytes, access);
    if (!*mr)
        return braid__error(BRAID_ERR_SYSTEM,
                            "rank %d: peer %d: cannot register the %zu-byte %s on %s: %m (locked-memory limit? "
                            "see ulimit -l)",
                            c->rank, c->base.peer, bytes, what, c->dev->name);
    return BRAID_OK;
}

static braid_status create_queues(braid_verbs_conn *c)
{
    const struct ibv_device_attr *attr = &c->dev->attr;
    /* Sized for our own window; the window used is the smaller of both
     * rings, so it always fits (see BRAID_VERBS_SQ_DEPTH). */
    c->sq_depth = BRAID_VERBS_SQ_DEPTH(c->nslots);
    c->rq_depth = BRAID_VERBS_RQ_DEPTH(c->nslots, c->nslots);
    if ((int)c->rq_depth > attr->max_qp_wr || (int)c->sq_depth > attr->max_qp_wr ||
        (int)(c->sq_depth + c->rq_depth) > attr->max_cqe)
        return braid__error(BRAID_ERR_UNSUPPORTED,
                            "rank %d: peer %d: %s allows %d work requests per queue and %d completions; "
                            "lower BRAID_IB_SLOTS (%u)",
                            c->rank, c->base.peer, c->dev->name, attr->max_qp_wr, attr->max_cqe, c->nslots);
    c->chan = ibv_create_comp_channel(c->dev->ctx);
    if (!c->chan)
        return braid__error(BRAID_ERR_SYSTEM, "rank %d: peer %d: ibv_create_comp_channel: %m", c->rank, c->base.peer);
    int fl = fcntl(c->chan->fd, F_GETFL);
    if (fl < 0 || fcntl(c->chan->fd, F_SETFL, fl | O_NONBLOCK) < 0)
        return braid__error(BRAID_ERR_SYSTEM, "rank %d: peer %d: completion channel to non-blocking: %m", c->rank,
                            c->base.peer);
    c->cq = ibv_create_cq(c->dev->ctx, (int)(c->sq_depth + c->rq_depth), c, c->chan, 0);
    if (!c->cq)
        return braid__error(BRAID_ERR_SYSTEM, "rank %d: peer %d: ibv_create_cq (%u entries): %m", c->rank, c->base.peer,
                            c->sq_depth + c->rq_depth);
    BRAID_CHECK(braid__verbs_qp_create(c->dev, c->cq, c->sq_depth, c->rq_depth, c->rank, c->base.peer, &c->qp));
    /* Receives go in before RTR, so the peer's first write finds one. */
    int err = braid__verbs_post_recvs(c, c->rq_depth);
    if (err)
        return braid__error(BRAID_ERR_SYSTEM, "rank %d: peer %d: posting %u receives: %s", c->rank, c->base.peer,
                            c->rq_depth, strerror(err));
    return BRAID_OK;
}

static braid_status send_info(braid_verbs_conn *c, int64_t deadline)
{
    uint8_t rnd[3];
    BRAID_CHECK(braid__random_bytes(rnd, sizeof(rnd)));
    c->psn = (uint32_t)rnd[0] | (uint32_t)rnd[1] << 8 | (uint32_t)rnd[2] << 16;
    braid_verbs_dev *dev = c->dev;
    braid_verbs_info mine = {
        .link_layer = dev->link_layer == IBV_LINK_LAYER_ETHERNET ? BRAID_VERBS_LINK_ETH : BRAID_VERBS_LINK_IB,
        .mtu = (uint8_t)dev->mtu,
        .qpn = c->qp->qp_num,
        .psn = c->psn,
        .lid = dev->lid,
        .flags = dev->gid_index >= 0 ? BRAID_VERBS_INFO_GID_VALID : 0,
        .nslots = c->nslots,
        .slot_bytes = c->slot_bytes,
        .ring_addr = (uintptr_t)c->rx_ring,
        .ring_rkey = c->rx_mr->rkey,
        .rank = c->rank,
    };
    memcpy(mine.gid, dev->gid.raw, 16);
    braid__verbs_info_encode(&mine, c->hs_out);
    braid_conn *o = c->oob;
    BRAID_CHECK(o->ops->isend(o, &c->hs_send, c->hs_out, sizeof(c->hs_out)));
    BRAID_CHECK(o->ops->irecv(o, &c->hs_recv, c->hs_in, sizeof(c->hs_in)));
    /* Push it out now: 64 bytes fit any socket buffer, so this waits for
     * the kernel only, never for the peer's application. */
    for (;;) {
        int done;
        BRAID_CHECK(o->ops->test(&c->hs_send, &done));
        if (done)
            return BRAID_OK;
        int64_t left = deadline - braid__now_ms();
        if (left <= 0)
            return braid__error(BRAID_ERR_TIMEOUT, "rank %d: peer %d: cannot send the verbs set-up message", c->rank,
                                c->base.peer);
        BRAID_CHECK(o->ops->progress(&o, 1, -1, (int)(left < 100 ? left : 100)));
    }
}

static void destroy(braid_verbs_conn *c);

braid_status braid__verbs_conn_setup(const braid_transport_ctx *ctx, int peer, braid_conn *oob, int64_t deadline,
                                     braid_conn **out)
{
    braid_verbs_conn *c = calloc(1, sizeof(*c));
    if (!c) {
        oob->ops->close(oob);
        return braid__error(BRAID_ERR_NO_MEMORY, "rank %d: out of memory for the verbs connection to peer %d",
                            ctx->rank, peer);
    }
    c->base.ops = &braid__verbs_ops;
    c->base.peer = peer;
    c->base.error = BRAID_OK;
    c->rank = ctx->rank;
    c->timeout_ms = ctx->timeout_ms;
    c->oob = oob; /* closed by destroy() from here on */
    c->hs = BRAID_VERBS_HS_INFO;

    braid_status st;
    BRAID_CHECK_GOTO(braid__verbs_dev_acquire(c->rank, &c->dev), st, err_destroy);
    BRAID_CHECK_GOTO(ring_geometry(c->rank, &c->nslots, &c->slot_bytes), st, err_destroy);
    BRAID_CHECK_GOTO(alloc_ring(c, (size_t)c->nslots * c->slot_bytes, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE,
                                &c->rx_ring, &c->rx_mr, "receive ring"),
                     st, err_destroy);
    BRAID_CHECK_GOTO(create_queues(c), st, err_destroy);
    BRAID_CHECK_GOTO(send_info(c, deadline), st, err_destroy);
    *out = &c->base;
    return BRAID_OK;

err_destroy:
    destroy(c);
    return st;
}

/* ---- set-up, second half: on first use ------------------------------------ */

static braid_status check_info(braid_verbs_conn *c, braid_verbs_info *remote)
{
    char why[160];
    if (braid__verbs_info_decode(c->hs_in, sizeof(c->hs_in), remote, why, sizeof(why)) != BRAID_OK)
        return braid__error(BRAID_ERR_PEER, "rank %d: peer %d sent a bad verbs set-up message: %s", c->rank,
                            c->base.peer, why);
    if (remote->rank != c->base.peer)
        return braid__error(BRAID_ERR_PEER, "rank %d: the verbs set-up message from peer %d names rank %d", c->rank,
                            c->base.peer, (int)remote->rank);
    uint8_t mine = c->dev->link_layer == IBV_LINK_LAYER_ETHERNET ? BRAID_VERBS_LINK_ETH : BRAID_VERBS_LINK_IB;
    if (remote->link_layer != mine)
        return braid__error(BRAID_ERR_PEER, "rank %d: peer %d is on %s, this rank on %s: no path between them", c->rank,
                            c->base.peer, remote->link_layer == BRAID_VERBS_LINK_ETH ? "RoCE" : "InfiniBand",
                            mine == BRAID_VERBS_LINK_ETH ? "RoCE" : "InfiniBand");
    return BRAID_OK;
}

size_t braid__verbs_conn_pinned_bytes(void)
{
    long long n = braid__param_int("BRAID_IB_SLOTS", DEFAULT_SLOTS);
    long long b = braid__param_int("BRAID_IB_SLOT_BYTES", DEFAULT_SLOT_BYTES);
    if (n < 1 || n > BRAID_VERBS_MAX_SLOTS)
        n = DEFAULT_SLOTS; /* connect() reports the bad setting */
    if (b < BRAID_VERBS_MIN_SLOT_BYTES || b > BRAID_VERBS_MAX_SLOT_BYTES)
        b = DEFAULT_SLOT_BYTES;
    return 2 * (size_t)n * (size_t)b; /* receive ring + send staging ring (the peer's geometry, same settings) */
}

/* Their set-up message is in: staging ring, engine, RTR, RTS. */
static braid_status connect_qp(braid_verbs_conn *c)
{
    braid_verbs_info remote;
    BRAID_CHECK(check_info(c, &remote));
    uint32_t window = remote.nslots < c->nslots ? remote.nslots : c->nslots;
    BRAID_CHECK(alloc_ring(c, (size_t)window * remote.slot_bytes, IBV_ACCESS_LOCAL_WRITE, &c->tx_stage, &c->tx_mr,
                           "send staging ring"));
    c->remote_ring = remote.ring_addr;
    c->remote_rkey = remote.ring_rkey;
    c->remote_slot_bytes = remote.slot_bytes;
    long long zmin = braid__param_int("BRAID_IB_ZCOPY_BYTES", DEFAULT_ZCOPY_BYTES);
    braid_verbs_engine_cfg ec = {
        .rank = c->rank,
        .peer = c->base.peer,
        .rx_ring = c->rx_ring,
        .rx_slots = c->nslots,
        .rx_slot_bytes = c->slot_bytes,
        .tx_slots = remote.nslots,
        .tx_slot_bytes = remote.slot_bytes,
        .tx_window = window,
        .tx_stage = c->tx_stage,
        .tx_stage_lkey = c->tx_mr->lkey,
        .zcopy_min = zmin > 0 ? (size_t)zmin : 0,
    };
    braid_verbs_io io;
    braid__verbs_conn_io(c, &io);
    BRAID_CHECK(braid__verbs_engine_init(&c->eng, &ec, &io));
    c->eng_ready = 1;
    BRAID_CHECK(braid__verbs_qp_connect(c->qp, c->dev, &remote, c->psn, c->rank, c->base.peer));
    BRAID_INFO("rank %d: verbs connection to peer %d on %s port %u: qpn %u -> %u, mtu %u, window %u x %u bytes "
               "(receive ring %u x %u)",
               c->rank, c->base.peer, c->dev->name, c->dev->port, c->qp->qp_num, remote.qpn,
               braid__verbs_mtu_bytes((uint8_t)c->dev->mtu < remote.mtu ? (uint8_t)c->dev->mtu : remote.mtu), window,
               remote.slot_bytes, c->nslots, c->slot_bytes);
    return BRAID_OK;
}

/* Hand the transfers posted during set-up to the engine, in order. */
static braid_status release_waiting(braid_verbs_conn *c)
{
    while (c->pre_head) {
        braid_req *req = c->pre_head;
        c->pre_head = req->next;
        if (!c->pre_head)
            c->pre_tail = NULL;
        braid_status st = req->kind == BRAID_REQ_SEND ? braid__verbs_engine_isend(&c->eng, req, req->buf, req->len)
                                                      : braid__verbs_engine_irecv(&c->eng, req, req->buf, req->len);
        if (st != BRAID_OK)
            return st;
    }
    return BRAID_OK;
}

braid_status braid__verbs_conn_handshake(braid_verbs_conn *c, int *moved)
{
    braid_conn *o = c->oob;
    braid_status st;
    int done;
    if (c->hs == BRAID_VERBS_HS_INFO) {
        BRAID_CHECK_GOTO(o->ops->test(&c->hs_recv, &done), st, err_failed);
        if (!done)
            return BRAID_OK;
        st = connect_qp(c);
        if (st != BRAID_OK) {
            /* Tell the peer instead of leaving it waiting for our ready
             * byte: both ends fail the connection, and so the group. */
            c->ready_out = FAILED_BYTE;
            if (o->ops->isend(o, &c->ready_send, &c->ready_out, 1) == BRAID_OK)
                (void)o->ops->test(&c->ready_send, &done);
            goto err_failed;
        }
        /* Our queue pair can receive now; say so. Neither side writes
         * before hearing this from the other. */
        c->ready_out = READY_BYTE;
        BRAID_CHECK_GOTO(o->ops->isend(o, &c->ready_send, &c->ready_out, 1), st, err_failed);
        BRAID_CHECK_GOTO(o->ops->irecv(o, &c->ready_recv, &c->ready_in, 1), st, err_failed);
        BRAID_CHECK_GOTO(o->ops->test(&c->ready_send, &done), st, err_failed);
        c->hs = BRAID_VERBS_HS_READY;
        *moved = 1;
    }
    if (c->hs == BRAID_VERBS_HS_READY) {
        BRAID_CHECK_GOTO(o->ops->test(&c->ready_recv, &done), st, err_failed);
        if (!done)
            return BRAID_OK;
        if (c->ready_in == FAILED_BYTE) {
            st = braid__error(BRAID_ERR_PEER,
                              "rank %d: peer %d could not connect its verbs queue pair to ours (its error names the "
                              "ibv status); the group cannot use verbs between us",
                              c->rank, c->base.peer);
            goto err_failed;
        }
        if (c->ready_in != READY_BYTE) {
            st = braid__error(BRAID_ERR_PEER, "rank %d: peer %d sent 0x%02x instead of the verbs ready message",
                              c->rank, c->base.peer, c->ready_in);
            goto err_failed;
        }
        BRAID_CHECK_GOTO(o->ops->irecv(o, &c->oob_watch, &c->oob_byte, 1), st, err_failed);
        c->hs = BRAID_VERBS_HS_UP;
        *moved = 1;
        BRAID_CHECK_GOTO(release_waiting(c), st, err_failed);
    }
    return BRAID_OK;

err_failed:
    return braid__verbs_conn_failed(c, st);
}

/* ---- teardown ------------------------------------------------------------ */

static void wait_a_little(braid_verbs_conn *c, int ms)
{
    int moved = 0;
    if (braid__verbs_conn_arm(c, &moved) != BRAID_OK || moved)
        return;
    struct pollfd p = {.fd = c->chan->fd, .events = POLLIN};
    if (poll(&p, 1, ms) > 0)
        braid__verbs_conn_ack_events(c);
}

/* Count the completions of everything still posted after ERR, so that no
 * work request refers to memory we are about to free. */
static void flush(braid_verbs_conn *c)
{
    braid__verbs_qp_to_error(c->qp);
    int64_t deadline = braid__now_ms() + FLUSH_MAX_MS;
    while (c->outstanding > 0 && braid__now_ms() < deadline) {
        struct ibv_wc wc[32];
        int n = ibv_poll_cq(c->cq, 32, wc);
        if (n < 0)
            break;
        c->outstanding -= n;
        if (n == 0)
            usleep(200);
    }
    if (c->outstanding > 0)
        BRAID_WARN("rank %d: verbs connection to peer %d: %lld work requests did not flush within %d ms", c->rank,
                   c->base.peer, (long long)c->outstanding, FLUSH_MAX_MS);
}

static void destroy(braid_verbs_conn *c)
{
    c->pre_head = c->pre_tail = NULL;
    if (c->qp)
        flush(c);
    if (c->eng_ready)
        braid__verbs_engine_fini(&c->eng);
    if (c->qp && ibv_destroy_qp(c->qp) != 0)
        BRAID_WARN("rank %d: peer %d: ibv_destroy_qp: %m", c->rank, c->base.peer);
    if (c->cq) {
        braid__verbs_conn_ack_events(c);
        if (ibv_destroy_cq(c->cq) != 0)
            BRAID_WARN("rank %d: peer %d: ibv_destroy_cq: %m", c->rank, c->base.peer);
    }
    if (c->chan && ibv_destroy_comp_channel(c->chan) != 0)
        BRAID_WARN("rank %d: peer %d: ibv_destroy_comp_channel: %m", c->rank, c->base.peer);
    if (c->tx_mr)
        ibv_dereg_mr(c->tx_mr);
    if (c->rx_mr)
        ibv_dereg_mr(c->rx_mr);
    free(c->tx_stage);
    free(c->rx_ring);
    if (c->oob)
        c->oob->ops->close(c->oob); /* abandons the set-up and watch requests, which live in c */
    if (c->dev)
        braid__verbs_dev_release(c->dev);
    free(c);
}

void braid__verbs_conn_close(braid_conn *conn)
{
    if (!conn)
        return;
    braid_verbs_conn *c = braid__verbs_conn_of(conn);
    c->closing = 1;
    c->pre_head = c->pre_tail = NULL;
    /* Only a connection that is up can say goodbye: before that the peer
     * may not be able to receive it. It sees our TCP end instead. */
    if (c->hs == BRAID_VERBS_HS_UP && c->base.error == BRAID_OK) {
        braid__verbs_engine_abandon(&c->eng);
        int moved;
        /* A goodbye may already be waiting: then the peer needs none back. */
        if (braid__verbs_conn_pass(c, &moved) == BRAID_OK && !c->qp_dead && !c->oob_gone_ms &&
            braid__verbs_engine_close(&c->eng)) {
            /* Our goodbye follows every chunk we posted; once it completes
             * the peer has them all, even if it reads them after we are
             * gone. A peer whose TCP end closed will never ack it. */
            int limit = c->timeout_ms > 0 && c->timeout_ms < DRAIN_MAX_MS ? c->timeout_ms : DRAIN_MAX_MS;
            int64_t deadline = braid__now_ms() + limit;
            while (!braid__verbs_engine_drained(&c->eng) && !c->qp_dead && !c->oob_gone_ms &&
                   braid__now_ms() < deadline) {
                if (braid__verbs_conn_pass(c, &moved) != BRAID_OK)
                    break;
                if (!moved)
                    wait_a_little(c, 10);
            }
        }
    }
    destroy(c);
}
