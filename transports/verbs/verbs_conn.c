/* Verbs connections: set-up over the TCP connection, posting work for the
 * engine, and teardown. */
#include <arpa/inet.h>
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
#define RECV_BATCH 32

/* ---- posting (the engine's io) ------------------------------------------- */

static int io_write_imm(void *ctx, uint32_t slot, const void *src, uint32_t lkey, uint32_t len, uint32_t imm,
                        uint64_t wr_id)
{
    braid_verbs_conn *c = ctx;
    if (c->qp_dead)
        return ENOTCONN;
    struct ibv_sge sge = {.addr = (uintptr_t)src, .length = len, .lkey = lkey};
    struct ibv_send_wr wr = {
        .wr_id = wr_id,
        .sg_list = len ? &sge : NULL,
        .num_sge = len ? 1 : 0,
        .opcode = IBV_WR_RDMA_WRITE_WITH_IMM,
        .send_flags = IBV_SEND_SIGNALED,
        .imm_data = htonl(imm),
    };
    wr.wr.rdma.remote_addr = c->remote_ring + (uint64_t)slot * c->remote_slot_bytes;
    wr.wr.rdma.rkey = c->remote_rkey;
    struct ibv_send_wr *bad;
    int err = ibv_post_send(c->qp, &wr, &bad);
    if (!err)
        c->outstanding++;
    return err;
}

static int io_send_imm(void *ctx, uint32_t imm, uint64_t wr_id)
{
    braid_verbs_conn *c = ctx;
    if (c->qp_dead)
        return ENOTCONN;
    struct ibv_send_wr wr = {
        .wr_id = wr_id,
        .opcode = IBV_WR_SEND_WITH_IMM,
        .send_flags = IBV_SEND_SIGNALED,
        .imm_data = htonl(imm),
    };
    struct ibv_send_wr *bad;
    int err = ibv_post_send(c->qp, &wr, &bad);
    if (!err)
        c->outstanding++;
    return err;
}

/* Zero copy is only taken from registrations the cache already has
 * (reg_mem) unless BRAID_IB_REGCACHE=1 allows registering on demand. */
static int io_zcopy_get(void *ctx, const void *buf, size_t len, uint32_t *lkey, void **token)
{
    braid_verbs_conn *c = ctx;
    braid_verbs_region *r;
    pthread_mutex_lock(&c->dev->mu);
    int err = braid_verbs_regcache_acquire(&c->dev->cache, buf, len, c->dev->implicit_reg, &r);
    pthread_mutex_unlock(&c->dev->mu);
    if (err)
        return err;
    *lkey = r->lkey;
    *token = r;
    return 0;
}

static void io_zcopy_put(void *ctx, void *token)
{
    braid_verbs_conn *c = ctx;
    pthread_mutex_lock(&c->dev->mu);
    braid_verbs_regcache_release(&c->dev->cache, token);
    pthread_mutex_unlock(&c->dev->mu);
}

int braid__verbs_post_recvs(braid_verbs_conn *c, uint32_t n)
{
    /* Receives carry no buffer: data arrives by RDMA write into the ring
     * and control messages are empty, so a receive is only a ticket for
     * one immediate. */
    struct ibv_recv_wr wrs[RECV_BATCH];
    while (n > 0) {
        uint32_t k = n < RECV_BATCH ? n : RECV_BATCH;
        for (uint32_t i = 0; i < k; i++)
            wrs[i] = (struct ibv_recv_wr){.wr_id = BRAID_VERBS_WR_ID(BRAID_VERBS_WR_RECV, 0),
                                          .next = i + 1 < k ? &wrs[i + 1] : NULL};
        struct ibv_recv_wr *bad = NULL;
        int err = ibv_post_recv(c->qp, wrs, &bad);
        if (err) {
            for (struct ibv_recv_wr *w = wrs; w != bad && w < wrs + k; w++)
                c->outstanding++;
            return err;
        }
        c->outstanding += k;
        n -= k;
    }
    return 0;
}

/* ---- set-up -------------------------------------------------------------- */

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

/* Send out and receive in (len bytes each) over the TCP connection. */
static braid_status oob_exchange(braid_verbs_conn *c, const void *out, void *in, size_t len, int64_t deadline,
                                 const char *what)
{
    braid_conn *o = c->oob;
    braid_req s, r;
    BRAID_CHECK(o->ops->isend(o, &s, out, len));
    BRAID_CHECK(o->ops->irecv(o, &r, in, len));
    int sent = 0, got = 0;
    for (;;) {
        if (!sent)
            BRAID_CHECK(o->ops->test(&s, &sent));
        if (!got)
            BRAID_CHECK(o->ops->test(&r, &got));
        if (sent && got)
            return BRAID_OK;
        int64_t left = deadline - braid__now_ms();
        if (left <= 0)
            return braid__error(BRAID_ERR_TIMEOUT, "rank %d: peer %d sent no verbs %s before the connect timeout",
                                c->rank, c->base.peer, what);
        BRAID_CHECK(o->ops->progress(&o, 1, -1, (int)(left < 1000 ? left : 1000)));
    }
}

static braid_status alloc_ring(braid_verbs_conn *c, size_t bytes, int access, void **ring, struct ibv_mr **mr,
                               const char *what)
{
    long page = sysconf(_SC_PAGESIZE);
    if (posix_memalign(ring, page > 0 ? (size_t)page : 4096, bytes) != 0) {
        *ring = NULL;
        return braid__error(BRAID_ERR_NO_MEMORY, "rank %d: peer %d: cannot allocate the %zu-byte %s", c->rank,
                            c->base.peer, bytes, what);
    }
    memset(*ring, 0, bytes);
    *mr = ibv_reg_mr(c->dev->pd, *ring, bytes, access);
    if (!*mr)
        return braid__error(BRAID_ERR_SYSTEM, "rank %d: peer %d: cannot register the %zu-byte %s on %s: %m "
                            "(locked-memory limit? see ulimit -l)",
                            c->rank, c->base.peer, bytes, what, c->dev->name);
    return BRAID_OK;
}

static void destroy(braid_verbs_conn *c);

static braid_status create_queues(braid_verbs_conn *c, uint32_t nslots)
{
    const struct ibv_device_attr *attr = &c->dev->attr;
    /* Sized for our own window; the window used is the smaller of both
     * rings, so it always fits (see BRAID_VERBS_SQ_DEPTH). */
    c->sq_depth = BRAID_VERBS_SQ_DEPTH(nslots);
    c->rq_depth = BRAID_VERBS_RQ_DEPTH(nslots, nslots);
    if ((int)c->rq_depth > attr->max_qp_wr || (int)(c->sq_depth + c->rq_depth) > attr->max_cqe)
        return braid__error(BRAID_ERR_UNSUPPORTED,
                            "rank %d: peer %d: %s allows %d work requests per queue and %d completions; "
                            "lower BRAID_IB_SLOTS (%u)",
                            c->rank, c->base.peer, c->dev->name, attr->max_qp_wr, attr->max_cqe, nslots);
    c->chan = ibv_create_comp_channel(c->dev->ctx);
    if (!c->chan)
        return braid__error(BRAID_ERR_SYSTEM, "rank %d: peer %d: ibv_create_comp_channel: %m", c->rank,
                            c->base.peer);
    int fl = fcntl(c->chan->fd, F_GETFL);
    if (fl < 0 || fcntl(c->chan->fd, F_SETFL, fl | O_NONBLOCK) < 0)
        return braid__error(BRAID_ERR_SYSTEM, "rank %d: peer %d: completion channel to non-blocking: %m", c->rank,
                            c->base.peer);
    c->cq = ibv_create_cq(c->dev->ctx, (int)(c->sq_depth + c->rq_depth), c, c->chan, 0);
    if (!c->cq)
        return braid__error(BRAID_ERR_SYSTEM, "rank %d: peer %d: ibv_create_cq (%u entries): %m", c->rank,
                            c->base.peer, c->sq_depth + c->rq_depth);
    BRAID_CHECK(braid__verbs_qp_create(c->dev, c->cq, c->sq_depth, c->rq_depth, c->rank, c->base.peer, &c->qp));
    int err = braid__verbs_post_recvs(c, c->rq_depth);
    if (err)
        return braid__error(BRAID_ERR_SYSTEM, "rank %d: peer %d: posting %u receives: %s", c->rank, c->base.peer,
                            c->rq_depth, strerror(err));
    return BRAID_OK;
}

static braid_status exchange_info(braid_verbs_conn *c, uint32_t nslots, uint32_t slot_bytes, int64_t deadline,
                                  braid_verbs_info *remote, uint32_t *psn)
{
    uint8_t rnd[4];
    BRAID_CHECK(braid__random_bytes(rnd, sizeof(rnd)));
    *psn = ((uint32_t)rnd[0] | (uint32_t)rnd[1] << 8 | (uint32_t)rnd[2] << 16) & 0xFFFFFFu;
    braid_verbs_dev *dev = c->dev;
    braid_verbs_info mine = {
        .link_layer = dev->link_layer == IBV_LINK_LAYER_ETHERNET ? BRAID_VERBS_LINK_ETH : BRAID_VERBS_LINK_IB,
        .mtu = (uint8_t)dev->mtu,
        .qpn = c->qp->qp_num,
        .psn = *psn,
        .lid = dev->lid,
        .flags = dev->gid_index >= 0 ? BRAID_VERBS_INFO_GID_VALID : 0,
        .nslots = nslots,
        .slot_bytes = slot_bytes,
        .ring_addr = (uintptr_t)c->rx_ring,
        .ring_rkey = c->rx_mr->rkey,
        .rank = c->rank,
    };
    memcpy(mine.gid, dev->gid.raw, 16);
    uint8_t out[BRAID_VERBS_INFO_BYTES], in[BRAID_VERBS_INFO_BYTES];
    braid_verbs_info_encode(&mine, out);
    BRAID_CHECK(oob_exchange(c, out, in, sizeof(in), deadline, "set-up message"));
    char why[160];
    if (braid_verbs_info_decode(in, sizeof(in), remote, why, sizeof(why)) != BRAID_OK)
        return braid__error(BRAID_ERR_PEER, "rank %d: peer %d sent a bad verbs set-up message: %s", c->rank,
                            c->base.peer, why);
    if (remote->rank != c->base.peer)
        return braid__error(BRAID_ERR_PEER, "rank %d: the verbs set-up message from peer %d names rank %d", c->rank,
                            c->base.peer, (int)remote->rank);
    if (remote->link_layer != mine.link_layer)
        return braid__error(BRAID_ERR_PEER, "rank %d: peer %d is on %s, this rank on %s: no path between them",
                            c->rank, c->base.peer, remote->link_layer == BRAID_VERBS_LINK_ETH ? "RoCE" : "InfiniBand",
                            mine.link_layer == BRAID_VERBS_LINK_ETH ? "RoCE" : "InfiniBand");
    return BRAID_OK;
}

braid_status braid__verbs_conn_setup(const braid_transport_ctx *ctx, int peer, braid_conn *oob,
                                     int64_t deadline, braid_conn **out)
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

    braid_status st;
    uint32_t nslots = 0, slot_bytes = 0, psn = 0;
    braid_verbs_info remote;
    BRAID_CHECK_GOTO(braid__verbs_dev_acquire(c->rank, &c->dev), st, err_destroy);
    BRAID_CHECK_GOTO(ring_geometry(c->rank, &nslots, &slot_bytes), st, err_destroy);
    BRAID_CHECK_GOTO(alloc_ring(c, (size_t)nslots * slot_bytes, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE,
                                &c->rx_ring, &c->rx_mr, "receive ring"),
                     st, err_destroy);
    BRAID_CHECK_GOTO(create_queues(c, nslots), st, err_destroy);
    BRAID_CHECK_GOTO(exchange_info(c, nslots, slot_bytes, deadline, &remote, &psn), st, err_destroy);

    uint32_t window = remote.nslots < nslots ? remote.nslots : nslots;
    BRAID_CHECK_GOTO(alloc_ring(c, (size_t)window * remote.slot_bytes, IBV_ACCESS_LOCAL_WRITE, &c->tx_stage,
                                &c->tx_mr, "send staging ring"),
                     st, err_destroy);
    c->remote_ring = remote.ring_addr;
    c->remote_rkey = remote.ring_rkey;
    c->remote_slot_bytes = remote.slot_bytes;
    long long zmin = braid__param_int("BRAID_IB_ZCOPY_BYTES", DEFAULT_ZCOPY_BYTES);
    braid_verbs_engine_cfg ec = {
        .rank = c->rank,
        .peer = peer,
        .rx_ring = c->rx_ring,
        .rx_slots = nslots,
        .rx_slot_bytes = slot_bytes,
        .tx_slots = remote.nslots,
        .tx_slot_bytes = remote.slot_bytes,
        .tx_window = window,
        .tx_stage = c->tx_stage,
        .tx_stage_lkey = c->tx_mr->lkey,
        .zcopy_min = zmin > 0 ? (size_t)zmin : 0,
    };
    braid_verbs_io io = {.ctx = c, .write_imm = io_write_imm, .send_imm = io_send_imm, .zcopy_get = io_zcopy_get,
                         .zcopy_put = io_zcopy_put};
    BRAID_CHECK_GOTO(braid_verbs_engine_init(&c->eng, &ec, &io), st, err_destroy);
    c->eng_ready = 1;
    BRAID_CHECK_GOTO(braid__verbs_qp_connect(c->qp, c->dev, &remote, psn, c->rank, peer), st, err_destroy);

    /* Neither side may write before the other's queue pair can receive
     * (RTR): a last byte each way says so. */
    uint8_t ready = 'R', theirs = 0;
    BRAID_CHECK_GOTO(oob_exchange(c, &ready, &theirs, 1, deadline, "ready message"), st, err_destroy);
    if (theirs != 'R') {
        st = braid__error(BRAID_ERR_PEER, "rank %d: peer %d sent 0x%02x instead of the verbs ready message", c->rank,
                          peer, theirs);
        goto err_destroy;
    }
    /* From here the TCP connection only watches for the peer's end. */
    BRAID_CHECK_GOTO(oob->ops->irecv(oob, &c->oob_watch, &c->oob_byte, 1), st, err_destroy);

    BRAID_INFO("rank %d: verbs connection to peer %d on %s port %u: qpn %u -> %u, mtu %u, window %u x %u bytes "
               "(receive ring %u x %u)",
               c->rank, peer, c->dev->name, c->dev->port, c->qp->qp_num, remote.qpn,
               braid_verbs_mtu_bytes((uint8_t)c->dev->mtu < remote.mtu ? (uint8_t)c->dev->mtu : remote.mtu),
               window, remote.slot_bytes, nslots, slot_bytes);
    *out = &c->base;
    return BRAID_OK;

err_destroy:
    destroy(c);
    return st;
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
    c->draining = 1;
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
    if (c->qp)
        flush(c);
    if (c->eng_ready)
        braid_verbs_engine_fini(&c->eng);
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
        c->oob->ops->close(c->oob); /* abandons oob_watch, which lives in c */
    if (c->dev)
        braid__verbs_dev_release(c->dev);
    free(c);
}

void braid__verbs_conn_close(braid_conn *conn)
{
    if (!conn)
        return;
    braid_verbs_conn *c = braid_verbs_conn_of(conn);
    int moved;
    if (c->eng_ready)
        braid_verbs_engine_abandon(&c->eng);
    /* A goodbye may already be waiting: then the peer needs none back. */
    if (braid__verbs_conn_pass(c, &moved) == BRAID_OK && braid_verbs_engine_close(&c->eng)) {
        /* Our goodbye follows every chunk we posted; once it completes the
         * peer has them all, even if it reads them after we are gone. */
        int limit = c->timeout_ms > 0 && c->timeout_ms < DRAIN_MAX_MS ? c->timeout_ms : DRAIN_MAX_MS;
        int64_t deadline = braid__now_ms() + limit;
        while (!braid_verbs_engine_drained(&c->eng) && !c->qp_dead && braid__now_ms() < deadline) {
            if (braid__verbs_conn_pass(c, &moved) != BRAID_OK || c->oob_gone_ms)
                break;
            if (!moved)
                wait_a_little(c, 10);
        }
    }
    destroy(c);
}
